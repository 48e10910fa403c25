"""status --hosts against hostile remotes: a fake ssh (GPUTOP_SSH) answers as a host we do not control.

A remote's warnings, process names, GPU names and ssh's stderr are its own text: escape sequences in them
are shown as \\x1b, never written raw to the terminal; JSON keeps the exact value; odd shapes do not crash."""

from __future__ import annotations

import json
import sys

from tests.conftest import run_gputop, run_on_pty

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
    import os

    fake = tmp_path / "fake_ssh_stream.py"
    fake.write_text(FAKE_SSH_STREAM)
    env = {**os.environ, "GPUTOP_SSH": f"{sys.executable} {fake}"}
    rc, shown = _on_a_terminal([sys.executable, "-m", "gputop", "--remote", "evil", "status"], env)
    assert rc == 3, shown  # the remote's exit status is ours
    for raw in ("\x1b", "\x07", "\x9b"):
        assert raw not in shown, f"a raw control character {raw!r} reached the terminal: {shown!r}"
    assert "H100\\x1b]0;owned\\x07\tok" in shown and "disk \\x1b[2J\\x9b31m full\\x0d" in shown, repr(shown)
    # a pipe gets the remote's bytes unchanged (JSON for a program)
    import subprocess

    r = subprocess.run([sys.executable, "-m", "gputop", "--remote", "evil", "status"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert "\x1b]0;owned\x07" in r.stdout
