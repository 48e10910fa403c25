"""gputop kill against real processes on simulated GPUs: outcomes, refusals, audit lines, bystanders."""

from __future__ import annotations

import json
import os
import pwd
import sys
import time

import pytest

from gputop import actions
from gputop.util.errors import EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_PERMISSION, EXIT_REFUSED, EXIT_USAGE
from tests.conftest import run_gputop, wait_gone
from tests.functional.actions_helpers import (
    OtherUser, alive, check_common, check_target, ident, records, spawn_ignoring_term, write_config,
)


def test_kill_holder_reports_memory_released_and_bystander_survives(procs, scenario, cfg):
    holder = procs.sleeper("gt-holder")
    bystander = procs.sleeper("gt-bystander")
    scenario(holders=[{"pid": holder.pid, "gpu": 1, "memory": "3GiB"}])
    who = ident(holder.pid)
    r = run_gputop("kill", "--pid", str(holder.pid), "--json")
    assert r.returncode == 0, r.stderr + r.stdout
    res = json.loads(r.stdout)["results"][0]
    assert res["outcome"] == "terminated" and res["ok"] and res["memory_released"] is True
    assert res["gpu"] == 1
    assert wait_gone(holder.pid, 5)
    assert alive(bystander.pid)
    [rec] = records(pid=holder.pid)
    check_common(rec, action="kill", outcome="terminated")
    check_target(rec, who, gpus=[1])
    assert [s["signal"] for s in rec["signals"]] == ["SIGTERM"]
    assert abs(rec["signals"][0]["at"] - time.time()) < 60
    assert rec["memory_released"] is True


def test_holder_ignoring_term_lives_without_force_and_dies_with_force(procs, scenario, cfg):
    holder = spawn_ignoring_term(procs)
    bystander = procs.sleeper("gt-bystander")
    scenario(holders=[{"pid": holder.pid, "gpu": 0, "memory": "1GiB"}])
    who = ident(holder.pid)
    t0 = time.monotonic()
    r = run_gputop("kill", "--pid", str(holder.pid), "--timeout", "0.5")
    assert r.returncode == EXIT_FAILURE
    assert "still alive" in (r.stdout + r.stderr) and "--force" in (r.stdout + r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and not r.stdout.strip()  # one line, on stderr
    assert alive(holder.pid)
    r = run_gputop("kill", "--pid", str(holder.pid), "--timeout", "0.3", "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "killed" in (r.stdout + r.stderr) and "memory was released" in (r.stdout + r.stderr)
    assert wait_gone(holder.pid, 5)
    assert time.monotonic() - t0 < 15
    assert alive(bystander.pid)
    first, second = records(pid=holder.pid)
    check_common(first, action="kill", outcome="still-alive")
    check_target(first, who, gpus=[0])
    assert [s["signal"] for s in first["signals"]] == ["SIGTERM"]
    assert first["exit_code"] == EXIT_FAILURE
    check_common(second, action="kill", outcome="killed")
    assert [s["signal"] for s in second["signals"]] == ["SIGTERM", "SIGKILL"]
    assert second["signals"][0]["at"] <= second["signals"][1]["at"]
    assert second["force"] is True


def test_pid_reuse_is_refused_by_the_identity_check(procs, scenario, cfg):
    holder = procs.sleeper("gt-reused")
    scenario(holders=[{"pid": holder.pid, "gpu": 0, "memory": "1GiB"}])
    who = ident(holder.pid)
    seen = round(holder_start := who["start"], 2) - 30.0  # the process the user saw started earlier
    res = actions.kill_process(holder.pid, expected_start=seen, face="tui")
    assert not res.ok and res.outcome == "identity-changed" and res.exit_code == EXIT_REFUSED
    assert "reused" in res.message
    r = run_gputop("kill", "--pid", str(holder.pid), "--start-time", f"{seen:.2f}")
    assert r.returncode == EXIT_REFUSED and "different process" in r.stderr + r.stdout
    time.sleep(0.2)
    assert alive(holder.pid)
    recs = records(pid=holder.pid)
    assert [x["outcome"] for x in recs] == ["identity-changed", "identity-changed"]
    assert recs[0]["face"] == "tui" and recs[1]["face"] == "cli"
    assert recs[0]["signals"] == []
    assert recs[0]["details"]["found_start_time"] == pytest.approx(holder_start, abs=0.05)
    # The right identity goes through.
    res = actions.kill_process(holder.pid, expected_start=round(holder_start, 2), face="api", timeout=3)
    assert res.ok and res.outcome == "terminated"


def test_non_holder_needs_override(procs, scenario, cfg):
    holder = procs.sleeper("gt-holder")
    plain = procs.sleeper("gt-plain")
    scenario(holders=[{"pid": holder.pid, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("kill", "--pid", str(plain.pid))
    assert r.returncode == EXIT_REFUSED
    assert "holds no GPU" in (r.stdout + r.stderr) and "--any-process" in (r.stdout + r.stderr)
    assert alive(plain.pid)
    [rec] = records(pid=plain.pid)
    check_common(rec, action="kill", outcome="refused")
    assert rec["details"]["rule"] == "not-holder"
    r = run_gputop("kill", "--pid", str(plain.pid), "--any-process", "--json")
    assert r.returncode == 0
    res = json.loads(r.stdout)["results"][0]
    assert res["outcome"] == "terminated" and res["memory_released"] is None
    assert wait_gone(plain.pid, 5)
    assert alive(holder.pid)


def test_refuses_pid_1(scenario, cfg):
    scenario(holders=[{"pid": 1, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("kill", "--pid", "1", "--force")
    assert r.returncode == EXIT_REFUSED and "pid 1" in (r.stdout + r.stderr)
    [rec] = records(pid=1)
    check_common(rec, action="kill", outcome="refused")
    assert rec["details"]["rule"] == "pid1" and rec["signals"] == []


def _kernel_thread() -> int | None:
    for d in os.listdir("/proc"):
        if not d.isdigit() or d in ("1", "2"):
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[6]) & 0x00200000:  # PF_KTHREAD in the flags field
            return int(d)
    return None


def test_refuses_a_kernel_thread(scenario, cfg):
    kt = _kernel_thread()
    if kt is None:
        pytest.skip("no kernel thread is visible here (a PID namespace hides them)")
    scenario(holders=[{"pid": kt, "gpu": 0, "memory": "1GiB"}])
    res = actions.kill_process(kt, expected_start=None, face="guard", force=True, timeout=0.2)
    assert res.outcome == "refused" and res.details["rule"] == "kthread" and "kernel thread" in res.message
    r = run_gputop("kill", "--pid", str(kt), "--any-process", "--signal", "KILL")
    assert r.returncode == EXIT_REFUSED and "kernel thread" in (r.stdout + r.stderr)
    assert [(x["details"]["rule"], x["signals"]) for x in records(pid=kt)] == [("kthread", [])] * 2


@pytest.mark.xdist_group("pid-reuse")  # rewinds the node's PID counter: one such test at a time
def test_pid_reused_after_the_checks_is_never_signalled(procs, scenario, cfg):
    from gputop.core.config import load_config
    from gputop.core.sampler import Sampler
    from tests.functional.actions_helpers import SwapAfterSample, spawn_at_pid

    holder = procs.sleeper("gt-old")
    scenario(holders=[{"pid": holder.pid, "gpu": 0, "memory": "1GiB"}])

    def swap():
        holder.kill()
        holder.wait()  # our child: reaped now, so the PID is free
        return spawn_at_pid(procs, holder.pid, [sys.executable, "-c", "import time; time.sleep(600)  # gt-new"])

    sampler = SwapAfterSample(Sampler.open(config=load_config()), swap)
    try:
        res = actions.kill_process(holder.pid, expected_start=None, face="cli", force=True, timeout=1,
                                   sampler=sampler)
    finally:
        sampler._s.close()
    new = sampler.swapped
    assert new is not None and new.pid == holder.pid
    time.sleep(0.2)
    assert alive(new.pid), "the process that reused the PID was killed"
    assert not res.ok and res.outcome == "identity-changed", res.message
    [rec] = records(pid=holder.pid)
    assert rec["outcome"] == "identity-changed" and rec["signals"] == []


def test_refuses_own_ancestors(procs, scenario, cfg):
    # The gputop subprocess's parent is this pytest process; it is also named as a GPU holder.
    me = os.getpid()
    scenario(holders=[{"pid": me, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("kill", "--pid", str(me), "--force", "--signal", "KILL")
    assert r.returncode == EXIT_REFUSED and "ancestor" in (r.stdout + r.stderr)
    [rec] = records(pid=me)
    check_common(rec, action="kill", outcome="refused")
    assert rec["details"]["rule"] == "ancestor"
    # gputop itself, through the API
    res = actions.kill_process(me, expected_start=None, face="mcp", require_holder=False)
    assert res.outcome == "refused" and res.details["rule"] == "self"


def test_refuses_protected_chain_unless_explicitly_allowed(procs, scenario, tmp_path, monkeypatch):
    write_config(tmp_path / "c.yaml", monkeypatch, protect_cmdline=["gt-guardian"])  # a word in an argument
    parent = procs.spawn("sleep 600 & wait; : gt-guardian")
    deadline = time.time() + 5
    while not (kids := [c for c in __import__("psutil").Process(parent.pid).children()]) and time.time() < deadline:
        time.sleep(0.02)
    worker = kids[0].pid
    bystander = procs.sleeper("gt-bystander")
    scenario(holders=[{"pid": worker, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("kill", "--pid", str(worker), "--force")
    assert r.returncode == EXIT_REFUSED
    assert "protected" in (r.stdout + r.stderr) and "gt-guardian" in (r.stdout + r.stderr) and "--allow-protected" in (r.stdout + r.stderr)
    assert alive(worker)
    [rec] = records(pid=worker)
    assert rec["details"]["rule"] == "protected" and rec["signals"] == []
    r = run_gputop("kill", "--pid", str(worker), "--allow-protected")
    assert r.returncode == 0, r.stdout
    assert wait_gone(worker, 5)
    assert alive(bystander.pid)


def test_unknown_holder_is_never_signalled(procs, scenario, cfg):
    ghost = procs.sleeper("gt-ghost")
    # The vendor reports a PID this namespace "cannot see": the verdict is unknown.
    scenario(holders=[{"pid": ghost.pid, "gpu": 0, "memory": "1GiB", "visible": False}])
    res = actions.kill_process(ghost.pid, expected_start=None, face="cli", force=True, allow_protected=True)
    assert res.outcome == "refused" and res.details["rule"] == "unknown" and res.exit_code == EXIT_REFUSED
    assert alive(ghost.pid)


def test_dry_run_sends_nothing(procs, scenario, cfg):
    holder = procs.sleeper("gt-holder")
    scenario(holders=[{"pid": holder.pid, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("kill", "--pid", str(holder.pid), "--dry-run", "--force")
    assert r.returncode == 0 and "would send SIGTERM" in (r.stdout + r.stderr)
    time.sleep(0.2)
    assert alive(holder.pid)
    [rec] = records(pid=holder.pid)
    assert rec["outcome"] == "dry-run" and rec["dry_run"] is True and rec["signals"] == []


def test_bad_input_and_not_found(procs, scenario, cfg):
    gone = procs.sleeper("gt-gone")
    scenario(holders=[{"pid": gone.pid, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("kill", "--pid", str(gone.pid), "--signal", "NOPE")
    assert r.returncode == EXIT_USAGE and "unknown signal" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_gputop("kill")
    assert r.returncode == EXIT_USAGE and "--pid" in r.stderr
    r = run_gputop("kill", "--pid", "5", "--gpu", "0")
    assert r.returncode == EXIT_USAGE
    r = run_gputop("kill", "--timeout", "soon", "--pid", "5")
    assert r.returncode == EXIT_USAGE and "--timeout" in r.stderr
    gone.kill()
    gone.wait()
    r = run_gputop("kill", "--pid", str(gone.pid))
    assert r.returncode == EXIT_NOT_FOUND and "no process" in (r.stdout + r.stderr)
    assert records(pid=gone.pid)[-1]["outcome"] == "not-found"
    r = run_gputop("kill", "--gpu", "7")
    assert r.returncode == EXIT_NOT_FOUND and "no GPU 7" in r.stderr


def test_stopped_holder_is_continued_so_it_can_terminate(procs, scenario, cfg):
    holder = procs.sleeper("gt-stopped")
    os.kill(holder.pid, 19)  # SIGSTOP
    scenario(holders=[{"pid": holder.pid, "gpu": 0, "memory": "1GiB"}])
    res = actions.kill_process(holder.pid, expected_start=None, face="cli", timeout=3)
    assert res.ok and res.outcome == "terminated", res.message
    [rec] = records(pid=holder.pid)
    assert [s["signal"] for s in rec["signals"]] == ["SIGTERM", "SIGCONT"]


def test_batch_selectors_preview_then_act_in_parallel(procs, scenario, cfg):
    a = spawn_ignoring_term(procs, "gt-batch-a")
    b = spawn_ignoring_term(procs, "gt-batch-b")
    c = spawn_ignoring_term(procs, "gt-batch-c")
    other = procs.sleeper("gt-other-gpu")
    scenario(holders=[{"pid": a.pid, "gpu": 0, "memory": "1GiB"}, {"pid": b.pid, "gpu": 0, "memory": "2GiB"},
                      {"pid": c.pid, "gpu": 0, "memory": "2GiB"}, {"pid": other.pid, "gpu": 1, "memory": "1GiB"}])
    user = pwd.getpwuid(os.geteuid()).pw_name
    # Preview: nothing is signalled.
    r = run_gputop("kill", "--gpu", "0", "--user", user, "--name", "gt-batch-[ab]", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["preview"] is True and sorted(t["pid"] for t in out["targets"]) == sorted([a.pid, b.pid])
    r = run_gputop("kill", "--gpu", "0", "--name", "gt-batch-[ab]")
    assert r.returncode == 0 and "--yes" in (r.stdout + r.stderr) and str(a.pid) in (r.stdout + r.stderr) and str(c.pid) not in (r.stdout + r.stderr)
    assert records() == []
    # Act: two targets that ignore SIGTERM, 1 s timeout each; in parallel that is ~1 s, not ~2 s.
    t0 = time.monotonic()
    r = run_gputop("kill", "--gpu", "0", "--user", user, "--name", "gt-batch-[ab]", "--yes", "--force",
                   "--timeout", "1", "--json")
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    res = {x["pid"]: x for x in json.loads(r.stdout)["results"]}
    assert set(res) == {a.pid, b.pid}
    assert all(x["outcome"] == "killed" and x["memory_released"] is True for x in res.values())
    assert wait_gone(a.pid, 5) and wait_gone(b.pid, 5)
    sigkills = [rec["signals"][1]["at"] for rec in records(action="kill")]
    assert len(sigkills) == 2 and abs(sigkills[0] - sigkills[1]) < 0.8  # not one timeout after the other
    assert elapsed < 8
    # Bystanders: the non-matching holder on the same GPU and the holder on another GPU.
    assert alive(c.pid) and alive(other.pid)
    r = run_gputop("kill", "--name", "nothing-matches-this")
    assert r.returncode == EXIT_NOT_FOUND and "no GPU holder matches" in (r.stdout + r.stderr)


def test_other_users_process_without_permission(procs, monkeypatch, request):
    other = OtherUser.make(monkeypatch, request)
    holder = procs.sleeper("gt-root-job")
    other.holders([{"pid": holder.pid, "gpu": 0, "memory": "1GiB"}])
    r = other.run("kill", "--pid", str(holder.pid), "--force")
    assert r.returncode == EXIT_PERMISSION, r.stdout + r.stderr
    assert "no permission" in (r.stdout + r.stderr) and "root" in (r.stdout + r.stderr)
    assert alive(holder.pid)
    [rec] = other.records()
    assert rec["outcome"] == "permission-denied" and rec["actor"]["user"] == other.name
    assert rec["target"]["pid"] == holder.pid and rec["target"]["user"] == pwd.getpwuid(os.geteuid()).pw_name


def test_interrupted_kill_is_in_the_audit_log(procs, scenario, cfg):
    import signal as _signal
    import threading

    holder = spawn_ignoring_term(procs, "gt-intr-kill")
    scenario(holders=[{"pid": holder.pid, "gpu": 0, "memory": "1GiB"}])
    timer = threading.Timer(0.5, os.kill, (os.getpid(), _signal.SIGINT))  # a real Ctrl-C while it waits
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            actions.kill_process(holder.pid, expected_start=None, face="cli", timeout=10)
    finally:
        timer.cancel()
    assert alive(holder.pid)
    [rec] = records(pid=holder.pid)
    check_common(rec, action="kill", outcome="interrupted")
    assert rec["ok"] is False and [s["signal"] for s in rec["signals"]] == ["SIGTERM"]
