"""A process name is its owner's text: in the guard's journal, its notifications and `guard status` it
cannot choose a priority, start a line, add a mail header or reach the terminal raw.

journald reads a "<N>" prefix at the start of each stderr line as the entry's priority; a name such as
"x\\n<0>pwn" used to give the line after the newline priority 0 (emergency), and the same newline made
the e-mail header raise, which lost the hit."""

from __future__ import annotations

import email
import io
import re
import subprocess
import sys
import time

from gputop.guard import notify, state
from gputop.guard.daemon import LOG_ERR, JournalStream, prefixed
from tests.conftest import _default_sighup, run_gputop, run_on_pty
from tests.functional.guard_helpers import SmtpSink
from tests.functional.test_guard_engine import named, wait_comm


def named_as_other_user(procs, name: str):
    """A real process of a second, unprivileged user, which named itself ``name`` (prctl PR_SET_NAME)."""
    import shutil

    import pytest

    from tests.functional.actions_helpers import _unprivileged

    user = _unprivileged() if shutil.which("setpriv") else None
    if user is None:
        pytest.skip("needs setpriv and an unprivileged user (root can create one with useradd)")
    code = f"import ctypes,time;ctypes.CDLL(None).prctl(15,{name!r}.encode(),0,0,0);time.sleep(600)"
    p = procs.spawn(["setpriv", "--reuid", user[0], "--regid", user[1], "--clear-groups",
                     sys.executable, "-c", code])
    wait_comm(p.pid, name)
    return p, user[0]

EVIL = "x\n<0>pwn\x1b[2J"  # 12 bytes: fits comm (15)
PRIORITY = re.compile(r"<([0-7])>")

POLICY = """\
rules:
  - name: watch-pwn
    conditions:
      - {type: process_name, operator: contains, value: pwn}
    action: notify
    notify: [log, admin@node.test]
"""


def _priorities(journal: str) -> list[int]:
    """The priority journald gives each line; AssertionError for a line gputop did not prefix."""
    out = []
    for line in journal.splitlines():
        m = PRIORITY.match(line)
        assert m, f"a journal line without gputop's prefix: {line!r}"
        out.append(int(m.group(1)))
    return out


def _poll(fn, timeout=40.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_hostile_process_name_gets_no_priority_no_line_no_header_and_the_hit_is_kept(
        procs, scenario, tmp_path, isolated_dirs, monkeypatch):
    sink = SmtpSink()
    try:
        victim, other = named_as_other_user(procs, EVIL)
        bystander = named(procs, "bystander")
        scenario(holders=[{"pid": p.pid, "gpu": 0, "memory": "1GiB", "sm": 50} for p in (victim, bystander)])
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY)
        cfg = tmp_path / "config.yaml"
        cfg.write_text(f"guard:\n  smtp:\n    host: 127.0.0.1\n    port: {sink.port}\n    from: g@node.test\n")
        monkeypatch.setenv("GPUTOP_CONFIG", str(cfg))
        journal = tmp_path / "journal"
        with open(journal, "w") as log:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "gputop", "guard", "run", "--interval", "0.3", "--enforce",
                 "--policy-file", str(policy)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_default_sighup)
        try:
            hit = _poll(lambda: next((h for h in state.recent_hits(20) if h.get("rule") == "watch-pwn"), None),
                        what="the hit in the guard state")
            _poll(lambda: "notify admin@node.test" in journal.read_text(), what="the hit in the journal")
        finally:
            daemon.terminate()
            daemon.wait(30)
        # the hit is recorded, with both notifications delivered
        assert hit["pid"] == victim.pid and hit["target"] == EVIL and hit["user"] == other
        results = {n["target"]: n for n in hit["notify"]}
        assert results["log"]["ok"] and results["admin@node.test"]["ok"], hit["notify"]
        # the journal: every line has exactly gputop's priority, none is 0, the name is one escaped line
        text = journal.read_text()
        prios = _priorities(text)
        assert 0 not in prios and set(prios) <= {3, 4, 5, 6}, text
        assert "\x1b" not in text
        hit_lines = [ln for ln in text.splitlines() if "[watch-pwn]" in ln]
        assert hit_lines and all(ln.startswith("<4>gputop guard: [watch-pwn] ") for ln in hit_lines), text
        assert all("x\\x0a<0>pwn\\x1b[2J" in ln for ln in hit_lines), hit_lines
        log_lines = [ln for ln in text.splitlines() if "[gputop guard]" in ln]  # the "log" notify target
        assert log_lines and all(ln.startswith("<4>gputop guard: [gputop guard] ") for ln in log_lines), text
        assert all("x\\x0a<0>pwn\\x1b[2J" in ln for ln in log_lines), log_lines
        # the mail: one Subject header, escaped; no header injected by the name
        (mail,) = sink.messages
        msg = email.message_from_bytes(mail["data"])
        assert "x\\x0a<0>pwn\\x1b[2J" in msg["Subject"] and "\n" not in msg["Subject"].replace("\n ", "")
        assert sorted(k.lower() for k in msg.keys()) == sorted(
            ["subject", "from", "to", "content-type", "content-transfer-encoding", "mime-version"]), msg.keys()
        # guard status shows the hit, escaped, on one line
        r = run_gputop("guard", "status")
        assert r.returncode == 0, r.stderr
        assert "\x1b" not in r.stdout
        (line,) = [ln for ln in r.stdout.splitlines() if "watch-pwn  pid" in ln]
        assert f"pid {victim.pid} (x\\x0a<0>pwn\\x1b[2J, " in line
        assert bystander.poll() is None and victim.poll() is None  # notify never kills
    finally:
        sink.close()


def test_guard_status_on_a_terminal_shows_no_raw_escape(tmp_path, isolated_dirs):
    """The state files are the guard's, but the names in them are the processes' owners'."""
    hostile = "\x1b]0;owned\x07\x1b[2J\x9b31m"
    state.append_hit({"time": time.time(), "rule": "r" + hostile, "pid": 4242, "target": "t" + hostile,
                      "user": "u" + hostile, "dry_run": True, "action": "kill", "outcome": "o" + hostile,
                      "message": "m\n<0>" + hostile})
    rc, shown, _ = run_on_pty([sys.executable, "-m", "gputop", "guard", "status"])
    assert rc == 0, shown
    for raw in ("\x1b", "\x07", "\x9b"):
        assert raw not in shown, f"raw {raw!r} reached the terminal: {shown!r}"
    assert "m\\x0a<0>\\x1b]0;owned\\x07" in shown and "pid 4242 (t\\x1b]0;owned" in shown


def test_journal_stream_prefixes_every_line_once():
    out = io.StringIO()
    j = JournalStream(out)
    j.write("gputop guard: [r] kill done: pid 5 (a\n<0>b\r\x1b[2J)\n  notify log: logged\n")
    j.write("<0>my own priority\n")
    j.write("partial ")
    j.write("line\n")
    assert out.getvalue().splitlines() == [
        "<4>gputop guard: [r] kill done: pid 5 (a\\x0a<0>b\\x0d\\x1b[2J)",
        "<4>  notify log: logged",
        "<4><0>my own priority",
        "<4>partial line",
    ]
    assert prefixed("policy bad:\n  line 3: x\x1b\n", LOG_ERR) == (
        "<3>gputop guard: policy bad:\n<3>gputop guard:   line 3: x\\x1b\n")


def test_notify_never_raises_and_escapes_the_subject():
    """A target that fails in any way is a failed result; the caller then records the hit."""
    from gputop.core.config import Config

    cfg = Config(extra={"guard": {"smtp": {"host": "127.0.0.1", "port": "not-a-port"}}})
    out = io.StringIO()
    res = notify.send(["log", "bad\naddress@x", "a@b"], "rule hit: x\n<0>pwn", {"pid": 1}, cfg, log=out)
    assert [r["target"] for r in res] == ["log", "bad\naddress@x", "a@b"]
    assert res[0]["ok"] and out.getvalue() == "gputop guard: rule hit: x\\x0a<0>pwn\n"
    assert not res[1]["ok"] and not res[2]["ok"]
    assert all("\n" not in r["outcome"] for r in res), res


def test_test_policies_shows_a_hostile_name_without_raw_escapes(procs, scenario, tmp_path):
    victim = named(procs, "pwn\x1b]0;x\x07")
    scenario(holders=[{"pid": victim.pid, "gpu": 0, "memory": "1GiB", "sm": 50}])
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    rc, shown, _ = run_on_pty([sys.executable, "-m", "gputop", "guard", "--test-policies",
                               "--policy-file", str(policy)])
    assert rc == 0, shown
    assert "\x1b" not in shown and "\x07" not in shown, repr(shown)
    assert f"pid {victim.pid} (pwn\\x1b]0;x\\x07" in shown, shown
