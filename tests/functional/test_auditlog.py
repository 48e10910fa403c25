"""The audit log: fsynced JSON lines, never skipped silently, and 'gputop log'."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time

import pytest

from gputop import actions
from gputop.core import auditlog
from gputop.core.config import Config
from gputop.util.errors import EXIT_USAGE
from tests.conftest import run_gputop, wait_gone
from tests.functional.actions_helpers import alive, records, write_config


def test_append_read_roundtrip_and_since(tmp_path):
    p = tmp_path / "sub" / "audit.jsonl"
    auditlog.append({"at": 100.0, "action": "kill", "outcome": "refused"}, path=p)
    auditlog.append({"at": 200.0, "action": "reap", "outcome": "reaped"}, path=p)
    lines = p.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(x) for x in lines)
    assert oct(p.stat().st_mode & 0o777) == "0o600"
    recs = auditlog.read(path=p)
    assert [r["action"] for r in recs] == ["kill", "reap"]
    assert recs[0]["time"].startswith("1970-01-01T00:01:40")
    assert [r["action"] for r in auditlog.read(since=150, path=p)] == ["reap"]
    with open(p, "a") as f:
        f.write('{"cut short by a cra\n')
    assert auditlog.read(path=p)[-1] == {"corrupt": True, "line": 3, "text": '{"cut short by a cra'}
    assert auditlog.read(path=tmp_path / "missing.jsonl") == []


def test_path_from_config_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUTOP_AUDIT_LOG", str(tmp_path / "env.jsonl"))
    assert auditlog.log_path() == tmp_path / "env.jsonl"
    assert auditlog.log_path(Config(audit_log=str(tmp_path / "cfg.jsonl"))) == tmp_path / "cfg.jsonl"
    monkeypatch.delenv("GPUTOP_AUDIT_LOG")
    assert auditlog.log_path() == Config().audit_log_path()
    assert str(auditlog.log_path()).startswith(os.environ["GPUTOP_STATE_DIR"])


def test_concurrent_appends_never_interleave(tmp_path):
    p = tmp_path / "audit.jsonl"

    def writer(n):
        for i in range(50):
            auditlog.append({"at": time.time(), "writer": n, "i": i, "pad": "x" * 500}, path=p)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    recs = auditlog.read(path=p)
    assert len(recs) == 200 and not any(r.get("corrupt") for r in recs)


def test_unwritable_log_is_loud_never_silent(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    bad = blocker / "audit.jsonl"
    with pytest.raises(auditlog.AuditLogError) as e:
        auditlog.append({"action": "kill", "outcome": "refused", "target": {"pid": 42}}, path=bad)
    assert "NOT recorded" in str(e.value) and "pid=42" in str(e.value)
    assert "WARNING" in capsys.readouterr().err
    assert auditlog.check_writable(path=bad) is not None


def test_action_with_unwritable_log_warns_on_stderr_and_in_result(procs, scenario, tmp_path, monkeypatch):
    write_config(tmp_path / "c.yaml", monkeypatch)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("GPUTOP_AUDIT_LOG", str(blocker / "audit.jsonl"))
    scenario(holders=[])
    r = run_gputop("kill", "--pid", "1")
    assert r.returncode == 5
    assert "WARNING" in r.stderr and "could not be written" in r.stderr
    res = actions.kill_process(1, expected_start=None, face="api", require_holder=False)
    assert "could not be written" in res.details["audit_error"]


def test_log_command_table_json_since(procs, scenario, tmp_path, monkeypatch):
    write_config(tmp_path / "c.yaml", monkeypatch)
    holder = procs.sleeper("gt-logged")
    scenario(holders=[{"pid": holder.pid, "gpu": 0, "memory": "1GiB"}])
    old = time.time() - 7200
    auditlog.append({"at": old, "face": "guard", "action": "kill", "outcome": "killed",
                     "target": {"pid": 7, "name": "ancient"}, "signals": [], "message": "two hours ago",
                     "reason": "rule max-runtime"})
    assert run_gputop("kill", "--pid", str(holder.pid), "--dry-run").returncode == 0
    assert run_gputop("kill", "--pid", "1").returncode == 5
    r = run_gputop("log")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["TIME", "FACE/USER", "ACTION"] and len(lines) == 4
    assert "[rule max-runtime]" in lines[1] and "guard/" in lines[1]
    assert f"pid {holder.pid} (gt-logged)" in lines[2] and "dry-run" in lines[2]
    assert "refused" in lines[3] and "pid 1" in lines[3]
    r = run_gputop("log", "--json", "--since", "10m")
    recs = json.loads(r.stdout)
    assert [x["outcome"] for x in recs] == ["dry-run", "refused"]
    since = dt.datetime.fromtimestamp(old + 60).isoformat(timespec="seconds")
    assert len(json.loads(run_gputop("log", "--json", "--since", since).stdout)) == 2
    assert len(json.loads(run_gputop("log", "--json", "--limit", "1").stdout)) == 1
    r = run_gputop("log", "--since", "yesterday-ish")
    assert r.returncode == EXIT_USAGE and "--since" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert alive(holder.pid)


def test_empty_log_says_where_it_looked():
    r = run_gputop("log")
    assert r.returncode == 0 and "no audit records" in r.stdout and "audit.jsonl" in r.stdout
    assert records() == []


# ---- gputop log: your own log when the node trail has not got your latest action ------------------

def _old_node_trail() -> str:
    node = os.environ["GPUTOP_NODE_AUDIT_LOG"]
    os.makedirs(os.path.dirname(node), exist_ok=True)
    old = time.time() - 86400
    rec = {"at": old, "time": "x", "host": "n", "face": "guard", "action": "guard-start", "outcome": "ok",
           "actor": {"user": "root", "uid": 0}, "peer": {"uid": 0, "user": "root"}, "received": "2026-01-01"}
    with open(node, "w") as f:
        f.write(json.dumps(rec) + "\n")
    return node


def test_log_shows_your_own_action_when_the_guard_is_not_running(procs, scenario):
    node = _old_node_trail()  # readable (we are root), but the guard that writes it is not running
    victim = procs.sleeper("gt-log-victim")
    bystander = procs.sleeper("gt-log-bystander")
    scenario(holders=[{"pid": victim.pid, "gpu": 0, "memory": "1GiB"}])
    k = run_gputop("kill", "--pid", str(victim.pid))
    assert k.returncode == 0, k.stderr + k.stdout
    assert wait_gone(victim.pid) and bystander.poll() is None
    r = run_gputop("log")
    assert r.returncode == 0, r.stderr
    assert f"pid {victim.pid}" in r.stdout and "guard-start" not in r.stdout, r.stdout
    assert "has not got your latest action" in r.stderr and "your own log" in r.stderr, r.stderr
    n = run_gputop("log", "--node")  # the node trail is still there for whoever asks for it
    assert "guard-start" in n.stdout and f"pid {victim.pid}" not in n.stdout
    assert node in n.stderr or n.stderr == ""


def test_log_shows_the_node_trail_when_it_has_your_latest_action(scenario):
    node = _old_node_trail()
    from gputop.core import auditlog

    own = auditlog.log_path()
    own.parent.mkdir(parents=True, exist_ok=True)
    mine = {"at": time.time(), "time": "t", "host": "h", "face": "cli", "action": "kill", "outcome": "terminated",
            "target": {"pid": 4242, "name": "x"}}
    own.write_text(json.dumps(mine) + "\n")
    with open(node, "a") as f:  # the service took it (it adds its stamps)
        f.write(json.dumps({**mine, "peer": {"uid": 0, "user": "root"}, "received": "2026-01-02"}) + "\n")
    r = run_gputop("log")
    assert r.returncode == 0 and "guard-start" in r.stdout and "pid 4242" in r.stdout, r.stdout
    assert "node audit trail" in r.stderr and "has not got" not in r.stderr, r.stderr
