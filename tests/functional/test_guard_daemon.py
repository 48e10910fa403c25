"""`gputop guard` as a user runs it: the CLI in subprocesses, and a real `gputop guard run` daemon with a
short interval, enforcing on real processes that hold simulated GPUs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gputop.core import auditlog
from gputop.util.errors import EXIT_USAGE
from gputop.guard import state
from gputop.guard.policy import PolicyError
from tests.conftest import ROOT, _default_sighup, run_gputop, wait_gone
from tests.functional.test_guard_engine import named

BRIEF = ROOT / "examples" / "policy.yaml"
KILL_VICTIMS = """\
rules:
  - name: kill-victims
    conditions:
      - {type: process_name, operator: "==", value: victim}
    action: kill
    force: true
    timeout: 2s
"""
BAD = """\
rules:
  - name: kill-victims
    conditions:
      - {type: process_name, operator: "=~", value: bystander}
    action: kill
"""


def holders(*ps):
    return [{"pid": p.pid, "gpu": 0, "memory": "1GiB", "sm": 50} for p in ps]


def poll(fn, timeout: float = 20.0, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_running_guard_keeps_enforcing_its_last_valid_policy(procs, scenario, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(KILL_VICTIMS)
    bystander = named(procs, "bystander")
    v1 = named(procs, "victim")
    scenario(holders=holders(bystander, v1), gpus=1)
    log = open(tmp_path / "guard.log", "w+")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gputop", "guard", "run", "--interval", "0.3", "--enforce",
         "--policy-file", str(policy)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_default_sighup)
    try:
        assert wait_gone(v1.pid, 30), "the guard did not kill the first victim"
        poll(lambda: state.status()["daemon"]["alive"], what="the daemon status file")
        # an invalid policy is written over the file: reported, and the old one stays in force
        policy.write_text(BAD)
        err = poll(lambda: state.status()["last_error"], what="the policy error in the state")
        assert f"{policy} line 4: rule 'kill-victims': condition 1: unknown operator '=~'" in err
        v2 = named(procs, "victim")
        scenario(holders=holders(bystander, v2), gpus=1)
        assert wait_gone(v2.pid, 30), "the guard stopped enforcing after a bad policy file"
        assert bystander.poll() is None
        st = state.status()
        assert st["policy_valid"] is False and st["daemon"]["rules"] == ["kill-victims"]
        # another face switches the mode: the daemon notices within an interval
        state.set_mode("dry-run", face="tui")
        poll(lambda: state.daemon_status().get("mode") == "dry-run", what="the daemon to see dry-run")
        v3 = named(procs, "victim")
        scenario(holders=holders(bystander, v3), gpus=1)
        hit = poll(lambda: next((h for h in state.recent_hits() if h["pid"] == v3.pid), None),
                   what="a dry-run hit for the third victim")
        assert hit["dry_run"] is True and hit["outcome"] == "dry-run" and hit["rule"] == "kill-victims"
        time.sleep(0.5)
        assert v3.poll() is None and bystander.poll() is None
        # a fixed policy is picked up again
        policy.write_text(KILL_VICTIMS.replace("timeout: 2s", "timeout: 3s"))
        poll(lambda: state.status()["last_error"] is None, what="the error to clear")
    finally:
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(20)
    log.seek(0)
    out = log.read()
    assert rc == 0, out
    assert "is invalid; still enforcing the last valid policy" in out
    assert "mode enforce -> dry-run (set by tui)" in out
    recs = auditlog.read()
    assert any(r.get("action") == "guard-policy" and r.get("outcome") == "rejected" for r in recs)
    kills = [r for r in recs if r.get("action") == "kill" and r.get("face") == "guard"]
    assert {r["target"]["pid"] for r in kills if r["outcome"] in ("terminated", "killed")} == {v1.pid, v2.pid}


def test_invalid_policy_at_startup_exits_2_everywhere(scenario, tmp_path):
    scenario(holders=[], gpus=1)
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    for args in (["guard", "--policy-file", str(bad)],
                 ["guard", "--test-policies", "--policy-file", str(bad)],
                 ["guard", "run", "--interval", "0.2", "--policy-file", str(bad)]):
        r = run_gputop(*args)
        assert r.returncode == EXIT_USAGE, (args, r.stderr)
        assert f"{bad} line 4: rule 'kill-victims': condition 1: unknown operator '=~'" in r.stderr
    # a policy installed earlier and then broken: 'guard run' refuses to start on it
    good = tmp_path / "good.yaml"
    good.write_text(KILL_VICTIMS)
    assert run_gputop("guard", "--policy-file", str(good)).returncode == 0
    good.write_text(BAD)
    r = run_gputop("guard", "run", "--interval", "0.2")
    assert r.returncode == EXIT_USAGE and "unknown operator '=~'" in r.stderr
    assert state.status()["last_error"]


def test_mode_commands_status_and_test_policies(procs, scenario):
    xmrig = procs.sleeper(name="xmrig")
    from tests.functional.test_guard_engine import wait_comm

    wait_comm(xmrig.pid, "xmrig")
    scenario(holders=[{"pid": xmrig.pid, "gpu": 0, "memory": "300MiB", "sm": 99}], gpus=1)
    r = run_gputop("guard", "--policy-file", str(BRIEF), "--enable")
    assert r.returncode == 0 and "guard mode: off -> dry-run" in r.stdout  # enabling defaults to dry-run
    assert "no guard daemon is running" in r.stderr
    assert state.get_mode() == "dry-run"
    r = run_gputop("guard", "--enforce")
    assert r.returncode == 0 and state.get_mode() == "enforce"
    r = run_gputop("guard", "status", "--json")
    st = json.loads(r.stdout)
    assert st["mode"] == "enforce" and st["policy_valid"] is True and st["daemon"]["alive"] is False
    assert st["policy_file"] == str(BRIEF.resolve()) and st["rules"] == ["block-crypto-miners", "limit-user-memory"]
    r = run_gputop("guard", "--test-policies")
    assert r.returncode == 0, r.stderr
    assert f"pid {xmrig.pid} (xmrig, user " in r.stdout
    assert "not yet: conditions are true now but must hold continuously (gpu_utilization for 5m)" in r.stdout
    assert "gpu_utilization 99% (process SM%) > 95: true; held for 0s of the 5m required: not yet" in r.stdout
    assert xmrig.poll() is None  # --test-policies changes nothing
    r = run_gputop("guard", "--disable")
    assert r.returncode == 0 and state.get_mode() == "off"
    modes = [(x["previous"], x["mode"]) for x in auditlog.read() if x.get("action") == "guard-mode"]
    assert modes == [("off", "dry-run"), ("dry-run", "enforce"), ("enforce", "off")]
    assert os.path.exists(state.state_path())


def test_a_second_daemon_is_refused(scenario, tmp_path):
    from gputop.util.errors import EXIT_REFUSED

    scenario(holders=[], gpus=1)
    policy = tmp_path / "policy.yaml"
    policy.write_text(KILL_VICTIMS)
    first = subprocess.Popen([sys.executable, "-m", "gputop", "guard", "run", "--interval", "0.3",
                              "--policy-file", str(policy)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, preexec_fn=_default_sighup)
    try:
        poll(lambda: state.daemon_status().get("alive"), what="the first daemon")
        r = run_gputop("guard", "run", "--interval", "0.3", "--enforce")
        assert state.get_mode() == "off"  # the refused daemon changed nothing
        assert r.returncode == EXIT_REFUSED and "already running" in r.stderr
        assert f"(pid {first.pid})" in r.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(20) == 0


def test_a_policy_file_that_crashes_the_yaml_reader_is_rejected_and_the_old_policy_kept(scenario, tmp_path):
    import io

    from gputop.guard.daemon import GuardDaemon
    from tests.functional.guard_helpers import Clock, sampler_for

    policy = tmp_path / "policy.yaml"
    policy.write_text(KILL_VICTIMS)
    path = scenario(holders=[], gpus=1)
    out = io.StringIO()
    d = GuardDaemon(sampler_for(path, Clock()), str(policy), interval=0.1, out=out)
    d.tick()
    for bad in ("rules: \x00\n", "a: &a [*a]\n"):  # YAML reader error; a recursive alias
        policy.write_text(bad)
        os.utime(policy, ns=(time.time_ns(), time.time_ns() + 10**9))  # a new mtime even on a coarse clock
        d.tick()  # must not raise: a running guard keeps going
        assert [r.name for r in d.policy.rules] == ["kill-victims"]
        assert d.last_error and state.status()["last_error"]
    assert out.getvalue().count("still enforcing the last valid policy") == 2
    # ... and at start-up it is a clear error (exit 2 from 'guard run'), not a traceback
    with pytest.raises(PolicyError, match="cannot load the policy|nesting too deep|recursive alias"):
        GuardDaemon(sampler_for(path, Clock()), str(policy), interval=0.1, out=out)


def _lines_with(out: str, text: str) -> list[str]:
    return [ln for ln in out.splitlines() if text in ln]


def test_sighup_reloads_a_good_policy_keeps_the_last_valid_one_on_a_bad_one_and_keeps_running(
        procs, scenario, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(KILL_VICTIMS)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("kill_timeout: 3\n")
    bystander = named(procs, "bystander")
    scenario(holders=holders(bystander), gpus=1)
    log = open(tmp_path / "guard.log", "w+")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gputop", "--config", str(cfg), "guard", "run", "--interval", "0.3", "--enforce",
         "--policy-file", str(policy)],
        stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=_default_sighup)
    try:
        poll(lambda: state.daemon_status().get("alive"), what="the daemon")
        # a good new policy, with the same size and mtime as before: only SIGHUP makes the daemon look
        st = os.stat(policy)
        policy.write_text(KILL_VICTIMS.replace("victims", "victimz"))
        os.utime(policy, ns=(st.st_atime_ns, st.st_mtime_ns))
        daemon.send_signal(signal.SIGHUP)
        poll(lambda: state.daemon_status().get("rules") == ["kill-victimz"], what="the reloaded policy")
        # a bad policy and a bad config: both reported, the last valid ones kept, the daemon runs on
        policy.write_text(BAD)
        cfg.write_text("kill_timeout: [\n")
        daemon.send_signal(signal.SIGHUP)
        poll(lambda: state.status()["last_error"], what="the policy error")
        time.sleep(0.7)
        assert daemon.poll() is None, "SIGHUP ended the daemon"
        assert state.daemon_status()["rules"] == ["kill-victimz"]
        v = named(procs, "victim")
        scenario(holders=holders(bystander, v), gpus=1)
        policy.write_text(KILL_VICTIMS)  # enforcement still works after the bad reload
        daemon.send_signal(signal.SIGHUP)
        assert wait_gone(v.pid, 30), "the guard stopped enforcing after SIGHUP"
        assert bystander.poll() is None
        # the victim can be gone a moment before the daemon writes its hit line: wait for the line, then stop it
        poll(lambda: "[kill-victims] kill" in (tmp_path / "guard.log").read_text(), what="the kill's log line")
    finally:
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(20)
    log.seek(0)
    out = log.read()
    assert rc == 0, out
    assert _lines_with(out, "config reload failed, keeping the last valid config")
    # every daemon line carries a syslog priority for journald; errors and hits are at warning or worse
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert lines and all(ln[:3] in ("<3>", "<4>", "<5>", "<6>") for ln in lines), out
    assert all(ln.startswith("<3>") for ln in _lines_with(out, "config reload failed"))
    assert all(ln.startswith("<3>") for ln in _lines_with(out, "still enforcing the last valid policy"))
    assert all(ln.startswith("<4>") for ln in _lines_with(out, "[kill-victims] kill"))
    assert _lines_with(out, "[kill-victims] kill")
    assert all(ln.startswith("<6>") for ln in _lines_with(out, "running (pid"))
