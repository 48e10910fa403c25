"""Issue 32, the CLI's rough edges: interval floors, Ctrl-C on the watchdog, config errors that name the
line and key, files that are not UTF-8, --remote after the subcommand, and which audit log `gputop log`
shows when the guard is not running."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from gputop.util.errors import EXIT_OK, EXIT_USAGE
from tests.conftest import _default_sighup, run_gputop, wait_gone
from tests.functional.test_cli_errors import one_line


# ---- intervals: negative or under the floor (0.1 s) is refused, with the floor named ---------------

@pytest.mark.parametrize("argv,says", [
    (["--interval", "-1", "status"], "--interval must not be negative (got -1)"),
    (["--interval", "0.05", "status"], "--interval 0.05 is under the floor of 0.1 s"),
    (["--interval", "nan", "status"], "--interval must be a number of seconds"),
    (["--interval", "0", "status", "--json"], "--interval 0 is under the floor of 0.1 s"),
    (["guard", "run", "--interval", "0.01"], "--interval 0.01 is under the floor of 0.1 s"),
    (["guard", "run", "--interval", "-1"], "--interval: bad duration '-1'"),
    (["reap", "--watch", "--interval", "0.01"], "--interval 0.01 is under the floor of 0.1 s"),
])
def test_an_interval_under_the_floor_is_refused(argv, says, scenario):
    scenario()
    one_line(run_gputop(*argv), EXIT_USAGE, says)


def test_the_floor_itself_is_accepted(scenario):
    scenario()
    assert run_gputop("--interval", "0.1", "status", "--json").returncode == EXIT_OK


def test_a_bad_guard_interval_in_the_config_names_the_key(scenario, tmp_path):
    scenario()
    cfg = tmp_path / "c.yaml"
    cfg.write_text("guard:\n  interval: 0.01\n")
    one_line(run_gputop("--config", str(cfg), "guard", "run"), EXIT_USAGE, "guard.interval 0.01 is under the floor")


# ---- Ctrl-C on reap --watch: 130; SIGTERM (a service stop) stays a clean 0 -----------------------

@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_ctrl_c_on_the_watchdog_exits_130(scenario, sig, code):
    scenario()
    p = subprocess.Popen([sys.executable, "-m", "gputop", "reap", "--watch", "--interval", "0.2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sighup)
    try:
        first = p.stdout.readline()  # the banner: the watchdog is in its loop
        assert first.startswith("watchdog:"), first
        time.sleep(0.3)
        p.send_signal(sig)
        assert p.wait(30) == code, p.stderr.read()
        assert "Traceback" not in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# ---- config: the line and the key of a bad value; a file that is not UTF-8 ------------------------

@pytest.mark.parametrize("text,line,key", [
    ("reap: {grace: sixty}\n", 1, "reap.grace"),
    ("interval: 2\nreap:\n  interval: 30\n  grace: sixty\n", 4, "reap.grace"),
    ("kill_timeout: soon\n", 1, "kill_timeout"),
    ("max_chain: many\n", 1, "max_chain"),
])
def test_a_bad_config_value_names_the_line_and_the_key(tmp_path, scenario, text, line, key):
    scenario()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    err = one_line(run_gputop("--config", str(cfg), "status"), EXIT_USAGE, f"{cfg} line {line}: {key}")
    assert "sixty" in err or "soon" in err or "many" in err


def test_a_config_that_is_not_utf8_says_so_without_a_chmod_hint(tmp_path, scenario):
    scenario()
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"# caf\xe9\nprotect: [x]\n")
    cfg.chmod(0o644)
    err = one_line(run_gputop("--config", str(cfg), "status"), EXIT_USAGE, "is not UTF-8", "line 1", "0xe9")
    assert "chmod" not in err


def test_a_scenario_and_a_policy_that_are_not_utf8_say_so(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"gpus: []\n# \xff\n")
    err = one_line(run_gputop("--scenario", str(bad), "status"), EXIT_USAGE, "is not UTF-8", "line 2")
    assert "syntax" not in err
    one_line(run_gputop("guard", "--policy-file", str(bad)), EXIT_USAGE, "is not UTF-8", "line 2")


# ---- --remote after the subcommand ----------------------------------------------------------------

def test_remote_after_the_subcommand_runs_it_there(tmp_path):
    seen = tmp_path / "argv.json"
    fake = tmp_path / "ssh"  # stands in for ssh: records what it was asked to run
    fake.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(seen)!r}, 'w'))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    for argv in (["status", "--remote", "node07", "--json"], ["status", "--json", "--remote=node07"]):
        r = run_gputop(*argv, env={"GPUTOP_SSH": str(fake)})
        assert r.returncode == 0, r.stderr
        got = json.loads(seen.read_text())
        assert "node07" in got and got[-2:] == ["status", "--json"] or " ".join(got).endswith("status --json"), got
        assert "--remote" not in " ".join(got), got


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
    victim = procs.sleeper("gt-rough-victim")
    bystander = procs.sleeper("gt-rough-bystander")
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
