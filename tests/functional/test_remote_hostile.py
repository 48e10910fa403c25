"""status --hosts against hostile remotes: a fake ssh (GPUTOP_SSH) answers as a host we do not control.

A remote's warnings, process names, GPU names and ssh's stderr are its own text: escape sequences in them
are shown as \\x1b, never written raw to the terminal; JSON keeps the exact value; odd shapes do not crash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import run_gputop, run_gputop_measured, run_on_pty
from tests.functional.sshd_helper import VENV_GPUTOP, start_sshd, why_no_sshd

ESC_TITLE = "\x1b]0;owned\x07"
ESC_CLEAR = "\x1b[2J"
C1 = "\x9b31m"

ANSWER = {
    "host": "evil" + ESC_TITLE, "at": 1.0, "version": "9",
    "gpu": {"gpus": [{"index": 0, "name": "H100" + ESC_CLEAR, "utilization_gpu": "lots", "memory_used": [1],
                      "memory_total": 8e9, "temperature_c": None, "power_w": 300}, "junk"]},
    "holders": [{"pid": 4242, "user": "eve" + C1, "ctx": "C", "gpus": [0], "gpu_memory": "x",
                 "verdict": {"kind": "orphan" + ESC_CLEAR}, "cmdline": ["python", "train.py" + ESC_TITLE],
                 "host": "spoofed"}],
    "roots": [],
    "warnings": ["disk full" + ESC_CLEAR + ESC_TITLE, {"nested": ESC_CLEAR}],
}

FAKE_SSH = f"""import json, sys
host = [a for a in sys.argv[1:] if not a.startswith('-')][-2]
if host == 'evil':
    print({json.dumps(json.dumps(ANSWER))})
    sys.exit(0)
sys.stderr.write('Permission denied \\x1b]0;pwned\\x07 (publickey)\\x1b[2J\\n')
sys.exit(255)
"""


def _env(tmp_path):
    fake = tmp_path / "fake_ssh.py"
    fake.write_text(FAKE_SSH)
    return {"GPUTOP_SSH": f"{sys.executable} {fake}"}


def test_hostile_remote_text_is_made_visible_in_the_table(tmp_path):
    r = run_gputop("status", "--hosts", "evil,bad", "--timeout", "20", env=_env(tmp_path))
    out = r.stdout + r.stderr
    assert r.returncode == 6, out
    for raw in ("\x1b", "\x07", "\x9b"):
        assert raw not in out, f"a raw control character {raw!r} reached the terminal:\n{out!r}"
    assert "warning: evil: disk full\\x1b[2J\\x1b]0;owned\\x07" in r.stdout
    assert "bad: authentication failed: Permission denied \\x1b]0;pwned\\x07 (publickey)\\x1b[2J" in r.stdout
    assert "H100\\x1b[2J" in r.stdout and "eve\\x9b31m" in r.stdout and "train.py\\x1b]0;owned" in r.stdout
    assert "not objects; dropped" in r.stdout  # the "junk" GPU row


def test_hostile_remote_json_keeps_exact_values_and_the_asked_host(tmp_path):
    r = run_gputop("status", "--hosts", "evil", "--json", "--timeout", "20", env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["warnings"][0] == {"host": "evil", "message": "disk full" + ESC_CLEAR + ESC_TITLE}
    [h] = data["holders"]
    assert h["host"] == "evil" and h["user"] == "eve" + C1  # the remote cannot name another host
    assert "\x1b" not in r.stdout  # JSON escapes control characters itself


FAKE_SSH_STREAM = """import sys
sys.stdout.write('GPU 0  H100\\x1b]0;owned\\x07\\tok\\n')
sys.stdout.flush()
sys.stderr.write('warning: disk \\x1b[2J\\x9b31m full\\r\\n')
sys.exit(3)
"""


def _on_a_terminal(argv, env) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pty; (exit status, what the terminal got)."""
    rc, out, _ = run_on_pty(argv, env)
    return rc, out


def test_remote_subcommand_output_at_a_terminal_is_made_visible(tmp_path):
    fake = tmp_path / "fake_ssh_stream.py"
    fake.write_text(FAKE_SSH_STREAM)
    env = {**os.environ, "GPUTOP_SSH": f"{sys.executable} {fake}"}
    rc, shown = _on_a_terminal([sys.executable, "-m", "gputop", "--remote", "evil", "status"], env)
    assert rc == 3, shown  # the remote's exit status is ours
    for raw in ("\x1b", "\x07", "\x9b"):
        assert raw not in shown, f"a raw control character {raw!r} reached the terminal: {shown!r}"
    assert "H100\\x1b]0;owned\\x07\tok" in shown and "disk \\x1b[2J\\x9b31m full\\x0d" in shown, repr(shown)
    # a pipe gets the remote's bytes unchanged (JSON for a program)
    r = subprocess.run([sys.executable, "-m", "gputop", "--remote", "evil", "status"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert "\x1b]0;owned\x07" in r.stdout


# ---- hostile answers over a real sshd: not UTF-8, nested too deeply, too big, never ending -----------

_no_sshd = why_no_sshd()
needs_sshd = pytest.mark.skipif(_no_sshd is not None, reason=f"no sshd: {_no_sshd}")

# The remote "gputop": each host alias sets GPUTOP_FAKE_ANSWER over ssh (SetEnv, sshd AcceptEnv GPUTOP_*);
# "good" runs the real gputop on a simulated scenario.
FAKE_GPUTOP = f"""import os, sys, time
kind = os.environ.get("GPUTOP_FAKE_ANSWER", "good")
out = sys.stdout.buffer
if kind == "good":
    os.execv({str(VENV_GPUTOP)!r}, [{str(VENV_GPUTOP)!r}] + sys.argv[1:])
elif kind == "notutf8":
    out.write(b'{{"host": "n\\xff\\xfe", "holders": []}}')
elif kind == "deep":
    out.write(b"[" * 200000 + b"]" * 200000)
elif kind == "deepish":  # under Python's recursion limit, over gputop's nesting bound
    out.write(b'{{"host": "d", "warnings": ' + b"[" * 900 + b"]" * 900 + b"}}")
elif kind == "big":  # valid JSON, but 6 MiB
    out.write(b'{{"host": "b", "warnings": ["' + b"x" * (6 << 20) + b'"]}}')
elif kind == "endless":
    out.write(b'{{"holders": [')
    chunk = b'"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",' * 32768
    while True:
        out.write(chunk)
elif kind == "trickle":  # never ends, never gets big
    while True:
        out.write(b" ")
        out.flush()
        time.sleep(0.2)
"""

KINDS = ("notutf8", "deep", "deepish", "big", "endless", "trickle")


@pytest.fixture(scope="module")
def hostile_sshd(tmp_path_factory):
    server = start_sshd(tmp_path_factory.mktemp("ssh"))
    yield server
    server.stop()


@pytest.fixture
def hostile_hosts(hostile_sshd, scenario, procs, isolated_dirs, tmp_path):
    worker = procs.sleeper("rgood")
    path = scenario(holders=[{"pid": worker.pid, "gpu": 0, "memory": "1GiB", "sm": 50}])
    d = hostile_sshd.dir
    cfg = tmp_path / "ssh_config"
    cfg.write_text("".join(f"""\
Host {kind}
  HostName 127.0.0.1
  Port {hostile_sshd.port}
  User root
  IdentityFile {d}/user_key
  UserKnownHostsFile {d}/known_hosts
  GlobalKnownHostsFile /dev/null
  IdentitiesOnly yes
  IdentityAgent none
  LogLevel ERROR
  SetEnv GPUTOP_FAKE_ANSWER={kind}
""" for kind in ("good",) + KINDS))
    fake = tmp_path / "fake_gputop.py"
    fake.write_text(FAKE_GPUTOP)
    os.chmod(tmp_path, 0o755)
    cmd = (f"env GPUTOP_SCENARIO={path} GPUTOP_STATE_DIR={isolated_dirs / 'remote-state'} "
           f"{sys.executable} {fake}")
    return {"env": {"GPUTOP_SSH": f"ssh -F {cfg}", "GPUTOP_REMOTE_CMD": cmd}, "worker": worker}


@needs_sshd
def test_hostile_answers_are_failed_rows_and_the_good_host_is_kept(hostile_hosts):
    hosts = ",".join(("good",) + KINDS)
    # --timeout 8: the trickling host is cut at the deadline (twice here); the good host answers in ~1-2 s.
    r = run_gputop("status", "--hosts", hosts, "--json", "--timeout", "8", env=hostile_hosts["env"], timeout=120)
    assert r.returncode == 6, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    data = json.loads(r.stdout)
    by = {h["host"]: h for h in data["hosts"]}
    assert by["good"]["ok"] is True
    assert hostile_hosts["worker"].pid in {h["pid"] for h in data["holders"] if h["host"] == "good"}
    errors = {k: by[k]["error"] for k in KINDS}
    assert errors["notutf8"] == {"kind": "bad output",
                                 "message": "the answer is not UTF-8 (byte 0xff at offset 11)"}
    assert errors["deep"]["kind"] == "bad output" and "nested too deeply" in errors["deep"]["message"]
    assert errors["deepish"]["kind"] == "bad output" and "nested too deeply" in errors["deepish"]["message"]
    assert errors["big"]["kind"] == "bad output" and "larger than 4 MiB" in errors["big"]["message"]
    assert errors["endless"]["kind"] == "bad output" and "larger than 4 MiB" in errors["endless"]["message"]
    assert errors["trickle"]["kind"] == "timed out", errors["trickle"]
    for e in errors.values():
        assert "\n" not in e["message"] and len(e["message"]) < 200, e
    # The table: one line per failed host, the good host's rows kept.
    r = run_gputop("status", "--hosts", hosts, "--timeout", "8", env=hostile_hosts["env"], timeout=120)
    assert r.returncode == 6 and "Traceback" not in r.stderr, r.stderr
    assert f"1/{1 + len(KINDS)} host(s) answered" in r.stdout
    for kind in KINDS:
        assert sum(ln.startswith(f"{kind}: ") for ln in r.stdout.splitlines()) == 1, r.stdout
    assert any(ln.startswith("good") and str(hostile_hosts["worker"].pid) in ln for ln in r.stdout.splitlines())


@needs_sshd
def test_an_endless_answer_costs_bounded_memory_and_time(hostile_hosts, tmp_path):
    """The unbounded client grew to 2 GiB in 10 s on this answer; capped, it stops reading at 4 MiB."""
    rc, out, err, peak_mib, took = run_gputop_measured(
        ["status", "--hosts", "endless,good", "--json", "--timeout", "30"], hostile_hosts["env"], tmp_path)
    print(f"\nendless answer: client peak RSS {peak_mib:.0f} MiB, {took:.1f} s")
    assert rc == 6, err
    data = json.loads(out)
    assert [h["ok"] for h in data["hosts"]] == [False, True]
    assert peak_mib < 120, f"peak RSS {peak_mib:.0f} MiB"
    assert took < 30, f"the cap should stop reading long before the deadline ({took:.1f}s)"


FAKE_SSH_EDGES = """import json, os, sys, time
host = [a for a in sys.argv[1:] if not a.startswith('-')][-2]
if host == 'errflood':  # endless stderr, no answer
    line = b'Permission denied ' * 4096 + b'\\n'
    while True:
        os.write(2, line)
elif host == 'lingers':  # a whole answer, then stdout closed, but ssh never exits
    sys.stdout.write('{"host": "l"}')
    sys.stdout.close()
    os.close(1)
    time.sleep(600)
elif host == 'large':  # 3 MiB of valid JSON: under the cap, accepted
    sys.stdout.write(json.dumps({"host": "big", "warnings": ["w" * (3 << 20)]}))
"""


def test_endless_stderr_and_a_lingering_ssh_are_bounded_and_a_large_answer_under_the_cap_is_kept(tmp_path):
    fake = tmp_path / "fake_ssh_edges.py"
    fake.write_text(FAKE_SSH_EDGES)
    rc, out, err, peak_mib, took = run_gputop_measured(
        ["status", "--hosts", "errflood,lingers,large", "--json", "--timeout", "6"],
        {"GPUTOP_SSH": f"{sys.executable} {fake}"}, tmp_path)
    assert rc == 6 and "Traceback" not in err, err
    by = {h["host"]: h for h in json.loads(out)["hosts"]}
    assert by["errflood"]["error"]["kind"] == "timed out"
    assert by["lingers"]["error"]["kind"] == "timed out"
    assert by["large"]["ok"] is True
    assert peak_mib < 150, f"peak RSS {peak_mib:.0f} MiB"
    assert took < 40
