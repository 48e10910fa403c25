"""The audit logs under stress: a full disk, 40 writers at once, rotation, odd records, one warning, and
the node trail that records the uid the kernel gives (a second real user, created by the test)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gputop.core import auditlog
from tests.conftest import ROOT, _default_sighup, run_gputop, unique_name, wait_gone
from tests.functional.audit_helpers import as_user, make_user

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts a tmpfs / creates a user)")


def _fill(d: Path) -> list[Path]:
    """Fill the file system of ``d`` with 4 KiB files until it is full."""
    out = []
    for i in range(10000):
        f = d / f"filler{i}"
        try:
            with open(f, "wb") as fh:
                fh.write(b"x" * 4096)
        except OSError:
            f.unlink(missing_ok=True)
            return out
        out.append(f)
    raise AssertionError("the tmpfs never filled up")


@ROOT_ONLY
def test_a_full_disk_never_leaves_a_partial_line_and_no_record_is_lost_once_space_returns(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        log = mnt / "audit.jsonl"
        auditlog.append({"at": 1.0, "action": "kill", "outcome": "killed", "n": 1}, path=log)
        fillers = _fill(mnt)
        fillers.pop().unlink()  # one page free: a 10 KiB record is written short
        with pytest.raises(auditlog.AuditLogError, match="NOT recorded"):
            auditlog.append({"at": 2.0, "action": "kill", "outcome": "killed", "n": 2, "pad": "y" * 10000},
                            path=log)
        assert log.read_bytes().endswith(b"\n"), "a partial line was left in the log"
        for f in fillers:
            f.unlink()
        auditlog.append({"at": 3.0, "action": "kill", "outcome": "killed", "n": 3}, path=log)
        recs = auditlog.read(path=log)
        assert [r.get("n") for r in recs] == [1, 3] and not any(r.get("corrupt") for r in recs)
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_a_log_cut_short_by_a_crash_gets_a_new_line_before_the_next_record(tmp_path):
    log = tmp_path / "audit.jsonl"
    auditlog.append({"at": 1.0, "action": "kill", "n": 1}, path=log)
    with open(log, "a") as f:
        f.write('{"at": 2.0, "action": "ki')  # a writer died mid-line
    auditlog.append({"at": 3.0, "action": "kill", "n": 3}, path=log)
    recs = auditlog.read(path=log)
    assert [r.get("n") for r in recs if not r.get("corrupt")] == [1, 3]
    assert [r["line"] for r in recs if r.get("corrupt")] == [2]


WRITER = """
import sys
from gputop.core import auditlog
for i in range(5):
    auditlog.append({"at": float(i), "writer": int(sys.argv[2]), "i": i, "pad": "x" * 3000}, path=sys.argv[1])
"""


def test_forty_concurrent_writers_keep_whole_lines_across_rotation(tmp_path, monkeypatch):
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("GPUTOP_AUDIT_MAX_BYTES", str(200_000))  # 600 kB written: rotates 2-3 times meanwhile
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(log), str(n)], cwd=ROOT) for n in range(40)]
    assert all(p.wait(120) == 0 for p in procs)
    recs = auditlog.read(path=log)
    assert not any(r.get("corrupt") for r in recs)
    assert sorted((r["writer"], r["i"]) for r in recs) == [(w, i) for w in range(40) for i in range(5)]
    for n in range(40):  # each writer's records in the order it wrote them
        assert [r["i"] for r in recs if r["writer"] == n] == list(range(5))
    assert log.with_name("audit.jsonl.1").exists()


def test_the_log_rotates_by_size_and_keeps_five_files(tmp_path, monkeypatch):
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("GPUTOP_AUDIT_MAX_BYTES", "4096")
    for i in range(60):
        auditlog.append({"at": float(i), "i": i, "pad": "z" * 500}, path=log)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["audit.jsonl"] + [f"audit.jsonl.{n}" for n in range(1, 6)]
    assert all(p.stat().st_size <= 4096 for p in tmp_path.iterdir())
    got = [r["i"] for r in auditlog.read(path=log)]
    assert got == list(range(got[0], 60)) and got[0] > 0  # newest kept in order, the oldest dropped
    assert oct(log.with_name("audit.jsonl.3").stat().st_mode & 0o777) == "0o600"


ODD = [
    '{"at": 1e300, "action": "kill", "outcome": "killed"}',
    '{"at": NaN, "action": "kill", "outcome": "killed"}',
    '{"at": 5, "actor": "mallory", "target": [1, 2], "action": "kill", "outcome": "killed", "signals": "x"}',
    '{"at": 5, "action": {"a": 1}, "message": ["m"], "face": 7, "outcome": null}',
    '{"a":' * 2000 + "1" + "}" * 2000,
    '{"at": 6, "action": "kill\\u001b[31m", "outcome": "killed", "message": "evil\\u001b]0;x\\u0007"}',
    '[1, 2, 3]',
]


def test_log_shows_odd_records_as_bad_records_and_goes_on(tmp_path, monkeypatch):
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("GPUTOP_AUDIT_LOG", str(log))
    auditlog.append({"at": time.time(), "action": "kill", "outcome": "killed", "message": "first good"})
    with open(log, "a") as f:
        f.write("\n".join(ODD) + "\n")
    auditlog.append({"at": time.time(), "action": "reap", "outcome": "reaped", "message": "last good"})
    r = run_gputop("log", "--mine")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert "first good" in r.stdout and "last good" in r.stdout
    assert r.stdout.count("bad record") >= 4
    assert "\x1b" not in r.stdout and "\\x1b" in r.stdout  # control characters escaped, never raw
    r = run_gputop("log", "--mine", "--json")
    assert r.returncode == 0 and len(json.loads(r.stdout)) == len(ODD) + 2


def test_an_audit_log_failure_is_printed_once(procs, scenario, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("GPUTOP_AUDIT_LOG", str(blocker / "audit.jsonl"))
    victim = procs.sleeper("gt15-victim")
    scenario(holders=[{"pid": victim.pid, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("kill", "--pid", str(victim.pid), "--force")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("could not be written") == 1, r.stderr


# ---- the node trail --------------------------------------------------------------------------

def test_node_server_stamps_the_kernels_uid_and_cuts_oversized_records(tmp_path, monkeypatch):
    """(Was: ...and_refuses_oversized_records. Issue 25: a record over 64 KiB is now cut down, not refused,
    and the rate limit applies to users, never to root's or the guard's own records.)"""
    sock, log = tmp_path / "run" / "audit.sock", tmp_path / "log" / "audit.jsonl"
    monkeypatch.setenv("GPUTOP_AUDIT_SOCKET", str(sock))
    srv = auditlog.NodeAuditServer(sock, log, rate=5).start()
    try:
        own = tmp_path / "mine.jsonl"
        monkeypatch.setenv("GPUTOP_AUDIT_LOG", str(own))
        auditlog.append({"at": 1.0, "action": "kill", "outcome": "killed", "actor": {"user": "root", "uid": 0},
                         "peer": {"uid": 0, "user": "forged"}})
        (rec,) = auditlog.read(path=log)
        assert rec["peer"]["uid"] == os.getuid() and rec["peer"]["pid"] == os.getpid()
        assert rec["peer"]["user"] != "forged"
        assert auditlog.read(path=own)[0]["action"] == "kill"  # your own log has it too
        # over the socket, as another process sends it: stamped by SO_PEERCRED, cut down, not refused
        big = json.dumps({"action": "kill", "outcome": "killed", "message": "m" * 100_000}).encode()
        assert auditlog._connect_send(sock, big, 5.0).startswith(b"ok")
        line = log.read_bytes().splitlines()[-1]
        rec = json.loads(line)
        assert len(line) < auditlog.MAX_RECORD and rec["truncated"] is True and rec["peer"]["uid"] == os.getuid()
        assert rec["action"] == "kill" and rec["message"].startswith("mmm")
        cut = re.search(r"…\[truncated (\d+) bytes\]$", rec["message"])
        assert cut and len(rec["message"]) - len(cut.group(0)) + int(cut.group(1)) == 100_000
        huge = b'{"action": "x", "m": "' + b"y" * (auditlog.MAX_READ + 10) + b'"}'
        assert auditlog._connect_send(sock, huge, 10.0).startswith(b"ok")
        rec = auditlog.read(path=log)[-1]
        assert rec["action"] == "bad-record" and "more than" in rec["message"]
        # a user (any uid but root's and the server's) is rate-limited, in a file of its own
        peer = {"uid": 4242, "gid": 4242, "pid": 1, "user": "4242"}
        answers = [srv.handle(peer, b'{"action": "spam"}') for _ in range(7)]
        assert answers == ["ok"] * 5 + ["error: rate limited"] * 2
        srv._window[4242][0] -= 11  # the 10 s window ends
        assert srv.handle(peer, b'{"action": "spam"}') == "ok"
        users = auditlog.read(path=auditlog.user_log_path(log, 4242))
        assert [r["action"] for r in users] == ["spam"] * 5 + ["audit-dropped", "spam"]
        assert users[5]["message"].startswith("2 record(s) from uid 4242 dropped")
        assert not any(r.get("action") in ("spam", "audit-dropped") for r in auditlog.read(path=log))
        assert [r["action"] for r in auditlog.read_node(path=log)][-8:] == (
            ["bad-record"] + ["spam"] * 5 + ["audit-dropped", "spam"])
        for _ in range(20):  # root is never rate-limited
            assert srv.handle({"uid": 0, "gid": 0, "pid": 1, "user": "root"}, b'{"action": "r"}') == "ok"
        assert oct(log.stat().st_mode & 0o777) == "0o640"
        assert oct(sock.stat().st_mode & 0o777) == "0o666"
        assert oct(auditlog.private_socket_path(sock).stat().st_mode & 0o777) == "0o600"
    finally:
        srv.close()
    assert not sock.exists() and not auditlog.private_socket_path(sock).exists()


USER = unique_name("gti15a")


@pytest.fixture
def second_user():
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to create a second user")
    with make_user(USER) as pw:
        yield pw


def test_a_second_users_kill_is_in_the_node_trail_with_that_uid(second_user, tmp_path):
    shared = Path(tempfile.mkdtemp(prefix="gti15-"))
    shared.chmod(0o755)
    try:
        _second_user_kill(second_user, shared, tmp_path)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _second_user_kill(pw, shared: Path, tmp_path: Path):
    home = shared / "home"
    home.mkdir()
    os.chown(home, pw.pw_uid, pw.pw_gid)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(ROOT),
           "GPUTOP_AUDIT_SOCKET": str(shared / "run" / "audit.sock"),
           "GPUTOP_NODE_AUDIT_LOG": str(shared / "log" / "audit.jsonl"),
           "GPUTOP_SYSTEM_CONFIG": str(shared / "none.yaml"), "GPUTOP_BACKEND": "simulated"}
    victim = as_user(pw, ["sleep", "300"], env, preexec_fn=_default_sighup)
    try:
        _killas_user(pw, env, victim, shared, tmp_path)
    finally:
        if victim.poll() is None:
            victim.kill()
        victim.wait(10)


def _killas_user(pw, env: dict, victim, shared: Path, tmp_path: Path):
    import yaml

    scn = shared / "scenario.yaml"
    scn.write_text(yaml.safe_dump({"gpus": [{"name": "Sim"}], "holders": [
        {"pid": victim.pid, "gpu": 0, "memory": "1GiB"}]}))
    policy = tmp_path / "policy.yaml"
    policy.write_text("rules:\n  - name: none\n    conditions:\n      - {type: process_name, operator: '==', "
                      "value: nothing-at-all}\n    action: log\n")
    guard_env = {**env, "HOME": str(tmp_path), "GPUTOP_STATE_DIR": str(tmp_path / "state"),
                 "GPUTOP_SCENARIO": str(scn)}
    daemon = subprocess.Popen([sys.executable, "-m", "gputop", "guard", "run", "--interval", "0.5",
                               "--policy-file", str(policy)], env=guard_env, cwd=ROOT,
                              stderr=subprocess.PIPE, text=True, preexec_fn=_default_sighup)
    try:
        deadline = time.time() + 30
        while not (shared / "run" / "audit.sock").exists():
            assert time.time() < deadline and daemon.poll() is None, "the guard did not serve the node trail"
            time.sleep(0.1)
        k = as_user(pw, [sys.executable, "-m", "gputop", "--scenario", str(scn), "kill", "--pid",
                          str(victim.pid), "--force"], env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True)
        out, err = k.communicate(timeout=60)
        assert k.returncode == 0, err
        assert wait_gone(victim.pid, 10)
        # the user cannot edit or erase the node trail
        w = as_user(pw, [sys.executable, "-c", f"open({env['GPUTOP_NODE_AUDIT_LOG']!r}, 'a')"], env,
                     stderr=subprocess.PIPE)
        assert w.wait(30) != 0
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, derr = daemon.communicate(timeout=30)
    recs = auditlog.read_node(path=env["GPUTOP_NODE_AUDIT_LOG"])  # the user's records are in its own file
    kills = [r for r in recs if r.get("action") == "kill" and (r.get("target") or {}).get("pid") == victim.pid]
    assert kills, (recs, derr)
    assert kills[0]["peer"]["uid"] == pw.pw_uid and kills[0]["peer"]["user"] == USER
    assert kills[0]["outcome"] in ("terminated", "killed")
    assert any(r.get("action") == "guard-start" and r["peer"]["uid"] == 0 for r in recs)
    # an admin reads it with 'gputop log --node'
    r = run_gputop("log", "--node", env={"GPUTOP_NODE_AUDIT_LOG": env["GPUTOP_NODE_AUDIT_LOG"]})
    assert r.returncode == 0 and f"cli/{USER}" in r.stdout, r.stdout + r.stderr
