"""gputop reap against real orphaned process trees (setsid sh -c 'job & exit') on simulated GPUs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from gputop import actions
from gputop.core.config import load_config
from gputop.util.errors import EXIT_PERMISSION, EXIT_REFUSED
from gputop.core.sampler import Sampler
from tests.conftest import _default_sighup, run_gputop, wait_gone
from tests.functional.actions_helpers import (
    OtherUser, alive, check_common, ident, orphan_python, records, unique, with_marker, write_config,
)

PY = sys.executable


def retry_loop(procs, marker: str, supervisor: bool = False) -> tuple[int, int]:
    """An orphaned bash retry loop: its session leader (sh) has exited. Returns (loop pid, worker pid).

    ``supervisor``: the loop survives SIGTERM (a trap), so it respawns the worker when the worker dies,
    which is what the SIGSTOP-first reap must defeat.
    """
    marker = unique(marker)
    trap = "trap : TERM; " if supervisor else ""
    inner = (f'bash -c "{trap}while true; do {PY} -c \'import time; time.sleep(600)  # {marker}-worker\'; '
             f'done; : {marker}-loop"')
    procs.spawn(["setsid", "sh", "-c", f"{inner} & exit 0"]).wait(30)
    deadline = time.time() + 30  # only bounds a failure: under four workers on two cores a start took > 10 s
    while time.time() < deadline:
        loops = with_marker(f"{marker}-loop")
        workers = [p for p in with_marker(f"{marker}-worker") if p not in loops]
        if loops and workers:
            procs.pids.extend(loops + workers)
            return loops[0], workers[0]
        time.sleep(0.05)
    raise TimeoutError("retry loop did not start")


def test_preview_lists_each_tree_and_signals_nothing(procs, scenario, cfg):
    loop, worker = retry_loop(procs, "gt-prev")
    scenario(holders=[{"pid": worker, "gpu": 1, "memory": "6GiB"}])
    r = run_gputop("reap", "--json")
    assert r.returncode == 0, r.stderr
    [tree] = json.loads(r.stdout)["trees"]
    assert tree["root"]["pid"] == loop and tree["root"]["name"] == "bash"
    assert [m["pid"] for m in tree["members"]] == [loop, worker]
    assert tree["holders"] == [worker] and tree["gpus"] == [1] and tree["gpu_memory"] == 6 * 2**30
    assert "session leader" in tree["reason"] and ("init" in tree["reason"] or "subreaper" in tree["reason"])
    r = run_gputop("reap")
    assert r.returncode == 0
    assert f"root {loop} (bash" in (r.stdout + r.stderr) and f"member {worker:>7}  ppid {loop:>7}" in (r.stdout + r.stderr)
    assert "why: session leader" in (r.stdout + r.stderr) and "6.0GiB" in (r.stdout + r.stderr) and "--apply" in (r.stdout + r.stderr)
    assert alive(loop) and alive(worker)
    assert records() == []


@pytest.mark.parametrize("supervisor", [False, True], ids=["plain-loop", "loop-survives-sigterm"])
def test_apply_reaps_retry_loop_and_no_new_worker_survives(procs, scenario, cfg, supervisor):
    marker = unique(f"gt-reap-{int(supervisor)}")
    loop, worker = retry_loop(procs, marker, supervisor=supervisor)
    innocent = procs.sleeper("gt-innocent")  # same user, not in the tree
    innocent_orphan = orphan_python(procs, "gt-innocent-orphan")  # an orphan too, but holds no GPU
    scenario(holders=[{"pid": worker, "gpu": 0, "memory": "2GiB"}])
    root_ident = ident(loop)
    t0 = time.monotonic()
    r = run_gputop("reap", "--apply", "--grace", "1", "--json")
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    [res] = json.loads(r.stdout)["results"]
    assert res["outcome"] == "reaped" and res["memory_released"] is True
    assert wait_gone(loop, 5) and wait_gone(worker, 5)
    time.sleep(0.5)  # a respawned worker would show up here
    assert with_marker(marker) == []
    assert alive(innocent.pid) and alive(innocent_orphan)
    assert elapsed < 60  # bounded (grace 1 s, then SIGKILL), not a wait-for-ever; 20 s was missed on a loaded machine
    [rec] = records(action="reap")
    check_common(rec, action="reap", outcome="reaped")
    assert rec["target"]["pid"] == loop and rec["target"]["cmdline"] == root_ident["cmdline"]
    assert rec["target"]["gpus"] == [0]
    sigs = [s["signal"] for s in rec["signals"]]
    assert sigs[0] == "SIGSTOP" and set(rec["signals"][0]["pids"]) >= {loop, worker}
    assert sigs.index("SIGTERM") < sigs.index("SIGCONT")
    if supervisor:
        # The loop ignored SIGTERM: it had to be killed, and nothing it started outlived it.
        assert "SIGKILL" in sigs and rec["details"]["sigkill"] is True
        # A worker it started after SIGTERM was stopped at once, so the loop could not churn through more.
        assert 1 <= len(rec["details"]["started_during_reap"]) <= 2
    members = {m["pid"] for m in rec["details"]["members"]}
    assert {loop, worker} <= members and innocent.pid not in members and innocent_orphan not in members


def test_apply_with_root_refuses_a_tree_that_is_not_an_orphan(procs, scenario, cfg):
    holder = procs.sleeper("gt-attached")  # its session (this test run) is alive
    scenario(holders=[{"pid": holder.pid, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("reap", "--apply", "--root", str(holder.pid))
    assert r.returncode == EXIT_REFUSED and "not the root of an orphan tree" in (r.stdout + r.stderr)
    time.sleep(0.2)
    assert alive(holder.pid)
    [rec] = records(pid=holder.pid)
    check_common(rec, action="reap", outcome="refused")
    assert rec["details"]["rule"] == "not-orphan" and rec["signals"] == []
    r = run_gputop("reap", "--apply", "--root", "1")
    assert r.returncode == EXIT_REFUSED and "pid 1" in (r.stdout + r.stderr)


def test_protected_and_unknown_trees_are_never_touched(procs, scenario, tmp_path, monkeypatch):
    write_config(tmp_path / "c.yaml", monkeypatch, protect_cmdline=["gt-keepme"])  # its marker is in an argument
    kept = orphan_python(procs, "gt-keepme")
    ghost = orphan_python(procs, "gt-ghost")
    scenario(holders=[{"pid": kept, "gpu": 0, "memory": "1GiB"},
                      {"pid": ghost, "gpu": 1, "memory": "1GiB", "visible": False}])
    r = run_gputop("reap", "--json")
    out = json.loads(r.stdout)
    assert out["trees"] == []
    assert {s["pid"]: s["verdict"] for s in out["skipped"]} == {kept: "protected"}
    r = run_gputop("reap", "--apply")
    assert r.returncode == 0 and "nothing to reap" in (r.stdout + r.stderr)
    r = run_gputop("reap", "--apply", "--root", str(kept))
    assert r.returncode == EXIT_REFUSED and "protected" in (r.stdout + r.stderr)
    r = run_gputop("reap", "--apply", "--root", str(ghost))
    assert r.returncode == EXIT_REFUSED and "unknown" in (r.stdout + r.stderr)
    time.sleep(0.2)
    assert alive(kept) and alive(ghost)
    assert [x["details"]["rule"] for x in records(action="reap")] == ["protected", "unknown"]


def test_identity_change_refused(procs, scenario, cfg):
    loop, worker = retry_loop(procs, "gt-ident")
    scenario(holders=[{"pid": worker, "gpu": 0, "memory": "1GiB"}])
    res = actions.reap_tree(loop, expected_start=ident(loop)["start"] - 50, face="guard", grace=0.5,
                            reason="rule orphan-reaper")
    assert res.outcome == "identity-changed" and res.exit_code == EXIT_REFUSED
    assert alive(loop) and alive(worker)
    [rec] = records(action="reap")
    assert rec["face"] == "guard" and rec["reason"] == "rule orphan-reaper"


def test_watchdog_reaps_only_after_grace_with_fake_clock(procs, scenario, cfg):
    loop, worker = retry_loop(procs, "gt-dog")
    innocent = procs.sleeper("gt-innocent")
    scenario(holders=[{"pid": worker, "gpu": 0, "memory": "1GiB"}])
    now = [1000.0]
    events = []
    sampler = Sampler.open(config=load_config())
    try:
        actions.run_watch(sampler, apply=True, interval=5, grace=12, kill_grace=1, clock=lambda: now[0],
                          sleep=lambda s: now.__setitem__(0, now[0] + s), on_event=events.append, iterations=3)
        assert [e["event"] for e in events] == ["pending"] * 3  # ages 0, 5, 10: within the grace
        assert alive(loop) and alive(worker) and records() == []
        events.clear()
        dog = actions.Watchdog(sampler, apply=True, grace=12, kill_grace=1)
        assert [e["event"] for e in dog.scan(1.0)] == ["pending"]  # first seen at t=1
        assert [e["event"] for e in dog.scan(12.5)] == ["pending"]  # 11.5 s: still within the grace
        assert alive(loop) and alive(worker)
        evs = dog.scan(20.0)  # 19 s > 12 s
    finally:
        sampler.close()
    assert [e["event"] for e in evs] == ["reaped"]
    assert wait_gone(loop, 5) and wait_gone(worker, 5) and alive(innocent.pid)
    [rec] = records(action="reap")
    assert rec["outcome"] == "reaped" and rec["reason"].startswith("watchdog: orphaned for")


def test_watch_cli_logs_without_apply_and_reaps_with_it(procs, scenario, cfg):
    marker = unique("gt-watch")
    loop, worker = retry_loop(procs, marker)
    innocent = procs.sleeper("gt-innocent")
    scenario(holders=[{"pid": worker, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("reap", "--watch", "--interval", "0.2", "--grace", "0.3", "--count", "5")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("would-reap") == 1 and "logging (no --apply)" in (r.stdout + r.stderr)
    assert alive(loop) and alive(worker)
    [dry] = records(action="reap")
    assert dry["outcome"] == "dry-run" and dry["reason"].startswith("watchdog")
    r = run_gputop("reap", "--watch", "--apply", "--interval", "0.2", "--grace", "0.3", "--count", "6", "--json")
    assert r.returncode == 0, r.stderr
    evs = [json.loads(x) for x in (r.stdout + r.stderr).splitlines()]
    assert evs[0]["event"] == "pending" and evs[0]["root"] == loop
    assert any(e["event"] == "reaped" and e["result"]["ok"] for e in evs)
    assert wait_gone(loop, 5) and wait_gone(worker, 5)
    assert with_marker(marker) == [] and alive(innocent.pid)


def test_brief_orphan_is_never_touched(procs, scenario, cfg):
    loop, worker = retry_loop(procs, "gt-brief")
    scenario(holders=[{"pid": worker, "gpu": 0, "memory": "1GiB"}])
    sampler = Sampler.open(config=load_config())
    try:
        dog = actions.Watchdog(sampler, apply=True, grace=10, kill_grace=1)
        assert [e["event"] for e in dog.scan(0.0)] == ["pending"]
        # The job finishes on its own before the grace is over ...
        for pid in (loop, worker):
            os.kill(pid, 9)
        assert wait_gone(loop, 5) and wait_gone(worker, 5)
        assert dog.scan(5.0) == [] and dog.first_seen == {}
        # ... and a new orphan tree that appears later starts its own grace from zero.
        loop2, worker2 = retry_loop(procs, "gt-brief2")
        scenario(holders=[{"pid": worker2, "gpu": 0, "memory": "1GiB"}])
        assert [e["event"] for e in dog.scan(11.0)] == ["pending"]
        assert alive(loop2) and alive(worker2)
    finally:
        sampler.close()
    assert records() == []


def _mixed_tree(procs, other, marker: str) -> tuple[int, int]:
    """An orphaned tree whose root (bash) is root's, with a worker that belongs to ``other``."""
    sp = " ".join(other.setpriv())
    inner = (f'bash -c "{sp} {PY} -c \'import time; time.sleep(600)  # {marker}-w\'; '
             f': {marker}-loop"')
    procs.spawn(["setsid", "sh", "-c", f"{inner} & exit 0"]).wait(10)
    deadline = time.time() + 10
    while time.time() < deadline and not (with_marker(f"{marker}-loop") and
                                          [p for p in with_marker(f"{marker}-w") if p not in with_marker(f"{marker}-loop")]):
        time.sleep(0.05)
    [loop] = with_marker(f"{marker}-loop")
    [worker] = [p for p in with_marker(f"{marker}-w") if p != loop]
    procs.pids.extend([loop, worker])
    return loop, worker


def test_other_user_cannot_reap_and_the_tree_is_not_left_stopped(procs, monkeypatch, request):
    other = OtherUser.make(monkeypatch, request)
    # An orphaned tree of root's: the other user may signal none of it, so nothing may be killed, and
    # nothing may be left stopped.
    loop, worker = retry_loop(procs, "gt-perm")
    other.holders([{"pid": worker, "gpu": 0, "memory": "1GiB"}])
    r = other.run("reap", "--apply", "--grace", "0.5")
    assert r.returncode == EXIT_PERMISSION, r.stdout + r.stderr
    assert "no permission" in (r.stdout + r.stderr) and str(loop) in (r.stdout + r.stderr)
    time.sleep(0.2)
    assert alive(loop) and alive(worker)
    for pid in (loop, worker):
        assert psutil.Process(pid).status() != psutil.STATUS_STOPPED
    [rec] = other.records()
    assert rec["outcome"] == "permission-denied" and rec["actor"]["user"] == other.name
    assert "SIGKILL" not in [s["signal"] for s in rec["signals"]]


def test_root_does_not_reap_a_tree_with_another_users_process_in_it(procs, scenario, cfg, monkeypatch, request):
    other = OtherUser.make(monkeypatch, request)
    write_config(cfg, monkeypatch)  # OtherUser.make pointed GPUTOP_CONFIG at its own copy
    marker = unique("gt-mixed")
    loop, worker = _mixed_tree(procs, other, marker)
    scenario(holders=[{"pid": worker, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("reap", "--apply", "--grace", "0.5")  # as root: it could signal both
    assert r.returncode == EXIT_REFUSED, r.stdout + r.stderr
    assert f"pid {worker}" in (r.stdout + r.stderr) and f"belongs to user {other.name}" in (r.stdout + r.stderr)
    time.sleep(0.2)
    assert alive(loop) and alive(worker)
    assert psutil.Process(worker).status() != psutil.STATUS_STOPPED
    [rec] = records(action="reap")
    check_common(rec, action="reap", outcome="refused")
    assert rec["details"]["rule"] == "other-user" and rec["signals"] == []


_SUBREAPER = """\
import ctypes, os, signal, subprocess, sys, time
signal.signal(signal.SIGHUP, signal.SIG_DFL)
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans below come here, reaped at once
ctypes.CDLL(None).prctl(15, b"tini", 0, 0, 0)  # named as the container init it stands for (a known subreaper)
subprocess.Popen(["setsid", "sh", "-c", sys.argv[1] + " & exit 0"])
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.02)
"""


@pytest.mark.xdist_group("pid-reuse")  # rewinds the node's PID counter: one such test at a time
def test_root_pid_reused_between_check_and_scan_never_takes_the_new_process(procs, scenario, cfg):
    from tests.functional.actions_helpers import SwapAfterSample, gone_and_reaped, spawn_at_pid

    marker = unique("gt-reuse")
    # An orphan tree under a subreaper that reaps at once, so the root's PID is free as soon as it dies.
    procs.spawn([PY, "-c", _SUBREAPER, f"bash -c \"{PY} -c 'import time; time.sleep(600)  # {marker}-w'; "
                                       f": {marker}-loop\""])

    def find(pred):
        out = []
        for pid in with_marker(marker):
            try:
                if pred(psutil.Process(pid).cmdline()):
                    out.append(pid)
            except psutil.Error:
                pass
        return out

    deadline = time.time() + 10
    while time.time() < deadline:
        loops = find(lambda c: c[0] == "bash")
        workers = find(lambda c: c[0] == PY and len(c) == 3 and f"{marker}-w" in c[2])
        if len(loops) == 1 and len(workers) == 1 and psutil.Process(workers[0]).ppid() == loops[0]:
            break  # (bash's fork for the worker, before its exec, is briefly a second "bash")
        time.sleep(0.05)
    assert len(loops) == 1 and len(workers) == 1, [psutil.Process(p).cmdline() for p in loops + workers]
    [loop], [worker] = loops, workers
    scenario(holders=[{"pid": worker, "gpu": 0, "memory": "1GiB"}])
    start = ident(loop)["start"]

    def swap():
        for pid in (loop, worker):
            os.kill(pid, 9)
        assert gone_and_reaped(loop) and gone_and_reaped(worker)
        # The PID comes back as an innocent process with a child of its own.
        return spawn_at_pid(procs, loop, ["sh", "-c", f"sleep 600 & wait; : {marker}-innocent"])

    sampler = SwapAfterSample(Sampler.open(config=load_config()), swap)
    try:
        assert [t.pid for t in actions.orphan_trees(sampler._s.sample())] == [loop]
        res = actions.reap_tree(loop, expected_start=start, face="cli", grace=0.5, sampler=sampler)
    finally:
        sampler._s.close()
    innocent = sampler.swapped
    assert innocent is not None and innocent.pid == loop
    time.sleep(0.2)
    assert alive(innocent.pid) and psutil.Process(innocent.pid).status() != psutil.STATUS_STOPPED
    kids = psutil.Process(innocent.pid).children()
    assert kids and all(k.status() != psutil.STATUS_STOPPED for k in kids)
    assert not res.ok and res.outcome == "identity-changed", res.message
    [rec] = records(action="reap")
    assert rec["outcome"] == "identity-changed" and rec["signals"] == []


def _interrupt_after(seconds: float):
    """A real Ctrl-C (SIGINT to this process) after ``seconds``: KeyboardInterrupt in the main thread."""
    import signal
    import threading

    t = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    t.start()
    return t


def test_interrupted_reap_leaves_nothing_stopped_and_is_in_the_audit_log(procs, scenario, cfg):
    marker = unique("gt-intr")
    loop, worker = retry_loop(procs, marker, supervisor=True)  # survives SIGTERM: the reap waits the grace
    innocent = procs.sleeper("gt-innocent")
    scenario(holders=[{"pid": worker, "gpu": 0, "memory": "1GiB"}])
    timer = _interrupt_after(0.6)
    try:
        with pytest.raises(KeyboardInterrupt):
            actions.reap_tree(loop, expected_start=ident(loop)["start"], face="cli", grace=10)
    finally:
        timer.cancel()
    time.sleep(0.3)
    assert alive(loop) and psutil.Process(loop).status() != psutil.STATUS_STOPPED
    for pid in with_marker(f"{marker}-worker"):
        if pid != loop and alive(pid):
            assert psutil.Process(pid).status() != psutil.STATUS_STOPPED
    assert alive(innocent.pid)
    [rec] = records(action="reap")
    check_common(rec, action="reap", outcome="interrupted")
    assert rec["ok"] is False and rec["target"]["pid"] == loop
    sigs = [s["signal"] for s in rec["signals"]]
    assert sigs[0] == "SIGSTOP" and "SIGTERM" in sigs and sigs[-1] == "SIGCONT"
    assert "KeyboardInterrupt" in rec["details"]["error"]


def test_a_protected_process_anywhere_in_the_tree_keeps_the_tree(procs, scenario, tmp_path, monkeypatch):
    from tests.functional.names_helpers import program

    # The protected process is the holder's sibling, not on the holder's ancestor chain: only the check
    # of every tree member finds it.
    write_config(tmp_path / "c.yaml", monkeypatch, protect=["^gtkeepsib$"])
    marker = unique("gt-sib")
    script = tmp_path / "tree.sh"
    script.write_text(f"{PY} -c 'import time; time.sleep(600)  # {marker}-w' &\n"
                      f"{program('gtkeepsib')} '# {marker}-s' &\nwait\n")  # called so: its names agree (issue 25)
    procs.spawn(["setsid", "sh", "-c", f"bash {script} & exit 0"]).wait(10)
    deadline = time.time() + 10
    while time.time() < deadline:
        found = {p: psutil.Process(p) for p in with_marker(marker)}
        workers = [p for p, x in found.items() if f"{marker}-w" in " ".join(x.cmdline()) and x.name() != "bash"]
        sibs = [p for p, x in found.items() if x.name() == "gtkeepsib"]
        if workers and sibs:
            break
        time.sleep(0.05)
    [worker], [sib] = workers, sibs
    root = psutil.Process(worker).ppid()
    procs.pids.extend([root, worker, sib])
    scenario(holders=[{"pid": worker, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("reap", "--json")
    [tree] = json.loads(r.stdout)["trees"]
    assert tree["root"]["pid"] == root  # the holder itself is an orphan
    # The preview is the plan, and it says that apply will refuse, and why.
    assert tree["refusal"]["rule"] == "protected" and f"pid {sib}" in tree["refusal"]["message"]
    assert [(e["pid"], e["rule"], e["blocks"]) for e in tree["left_alone"]] == [(sib, "protected", True)]
    assert "apply will refuse this tree (protected): " in run_gputop("reap").stdout
    r = run_gputop("reap", "--apply", "--root", str(root), "--grace", "0.5")
    assert r.returncode == EXIT_REFUSED and f"pid {sib}" in (r.stdout + r.stderr) and "protect" in (r.stdout + r.stderr), r.stdout
    time.sleep(0.2)
    assert alive(root) and alive(worker) and alive(sib)
    [rec] = records(action="reap")
    assert rec["details"]["rule"] == "protected" and rec["signals"] == []


@pytest.mark.parametrize("nohup_protects", [True, False])
def test_a_nohup_detached_member_anywhere_in_the_tree_keeps_the_tree(procs, scenario, tmp_path, monkeypatch,
                                                                     nohup_protects):
    write_config(tmp_path / "c.yaml", monkeypatch, nohup_protects=nohup_protects)
    holder = procs.orphan('sh -c "sleep 731 & nohup sleep 732 >/dev/null 2>&1 & wait"', "sleep 731")
    sibling = procs.wait_for("sleep 732")
    root = psutil.Process(holder).ppid()
    scenario([{"pid": holder, "gpu": 0, "memory": "2GiB"}])
    r = run_gputop("reap", "--apply", "--root", str(root), "--grace", "0.5")
    if nohup_protects:
        assert r.returncode == EXIT_REFUSED and "detached with nohup" in r.stderr, r
        assert alive(holder) and alive(sibling) and alive(root)
        assert psutil.Process(holder).status() != psutil.STATUS_STOPPED  # refused before any SIGSTOP
    else:
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert wait_gone(holder) and wait_gone(sibling) and wait_gone(root)


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
