"""Review of issue 11: a worker that a tree member starts in its SIGTERM handler, just before it exits.
The executor promises that anything the tree starts during the grace is stopped and killed with it: the
worker is reparented away (to init or a subreaper), so it is found by the tree's session and process
group (gputop.actions.plan.joiners), not by a walk down the tree."""

from __future__ import annotations

import sys
import time

import psutil

from tests.conftest import run_gputop, wait_gone
from tests.functional.actions_helpers import records, unique
from tests.functional.test_reap_safety import find, running

PY = sys.executable
# On SIGTERM: start a worker in the tree's session and, at the same moment, a bystander in a session of
# its own (setsid), then exit at once.
RESPAWN = ("import os,signal,subprocess,sys,time\n"
           "def term(*a):\n"
           "    subprocess.Popen([sys.executable,'-c','import time; time.sleep(600)',sys.argv[-1]+'-new'])\n"
           "    if len(sys.argv) > 2:\n"
           "        subprocess.Popen(['setsid',sys.executable,'-c','import time; time.sleep(600)',sys.argv[1]])\n"
           "    os._exit(0)\n"
           "signal.signal(signal.SIGTERM, term)\n"
           "print('ready', flush=True)\n"
           "time.sleep(600)\n")


def _with_last_arg(arg: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if (p.info["cmdline"] or [""])[-1:] == [arg] and running(p.pid):
            out.append(p.pid)
    return out


def _start(procs, scenario, tmp_path, m: str, *extra: str) -> int:
    script = tmp_path / "respawn.py"
    script.write_text(RESPAWN)
    procs.spawn(["setsid", "sh", "-c", f"{PY} {script} {' '.join(extra)} {m} & exit 0"]).wait(10)
    [holder] = find(m)
    procs.pids.append(holder)
    scenario(holders=[{"pid": holder, "gpu": 0, "memory": "1GiB"}])
    time.sleep(0.5)
    return holder


def test_a_worker_started_on_sigterm_by_an_exiting_member_is_not_left_running(procs, scenario, cfg, tmp_path):
    m = unique("gtrev-esc")
    holder = _start(procs, scenario, tmp_path, m)
    out = run_gputop("reap", "--apply", "--grace", "2")
    assert wait_gone(holder)
    time.sleep(0.3)
    new = _with_last_arg(f"{m}-new")
    procs.pids.extend(new)
    assert not new, f"the reap said {out.stdout.strip()!r} (exit {out.returncode}) while the worker {new} runs on"
    assert out.returncode == 0, out.stdout + out.stderr
    _check_record(holder, m)


def _check_record(holder: int, m: str) -> None:
    """The audit record names the worker among the members, as started during the reap; when it was found
    by session (its member had exited before the next scan: the usual case), it says so."""
    [rec] = records(action="reap", pid=holder)
    assert rec["ok"] and rec["outcome"] == "reaped", rec
    d = rec["details"]
    [worker] = [x["pid"] for x in d["members"] if (x["cmdline"] or [""])[-1] == f"{m}-new"]
    assert worker in set(d["joined_by_session"]) | set(d["started_during_reap"]), d
    if worker in d["joined_by_session"]:
        assert any(worker in s["pids"] and "joined" in (s.get("note") or "") for s in rec["signals"]), rec


def test_a_process_started_at_the_same_moment_in_another_session_survives(procs, scenario, cfg, tmp_path):
    m, by = unique("gtrev-esc"), unique("gtrev-by")
    holder = _start(procs, scenario, tmp_path, m, by)
    # and one more, started by the test during the grace in a dead session of its own
    other = unique("gtrev-by2")
    import subprocess

    reap = subprocess.Popen([PY, "-m", "gputop", "reap", "--apply", "--grace", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    procs.spawn(["setsid", "sh", "-c", f"{PY} -c 'import time; time.sleep(600)' {other} & exit 0"]).wait(10)
    stdout, stderr = reap.communicate(timeout=60)
    assert wait_gone(holder)
    time.sleep(0.3)
    new, setsid_child, bystander = _with_last_arg(f"{m}-new"), _with_last_arg(by), _with_last_arg(other)
    procs.pids.extend(new + setsid_child + bystander)
    assert not new and reap.returncode == 0, stdout + stderr
    # The test's own process in a dead session of its own never descended from the tree: it always survives.
    assert len(bystander) == 1, f"a bystander in another session was killed: {stdout}"
    # The member's setsid child is the tree's own: caught before its setsid() (still in the tree's session and
    # group, so an orphan of this tree then) it is stopped and killed with the tree; once in its own session it
    # is a live session leader and is left alone. Either way the record must say which.
    if not setsid_child:
        [rec] = records(action="reap", pid=holder)
        d = rec["details"]
        # A child caught between its fork and its exec still shows the member's own command line (last arg m).
        caught = [x["pid"] for x in d["members"] if x["pid"] != holder and (x["cmdline"] or [""])[-1] in (by, m)]
        assert caught and set(caught) <= set(d["joined_by_session"]) | set(d["started_during_reap"]), d


def test_the_watchdog_reaps_through_the_same_executor(procs, scenario, cfg, tmp_path):
    m = unique("gtrev-esc")
    holder = _start(procs, scenario, tmp_path, m)
    out = run_gputop("reap", "--watch", "--apply", "--grace", "0", "--interval", "0.2", "--count", "2", "--json")
    assert wait_gone(holder)
    time.sleep(0.3)
    new = _with_last_arg(f"{m}-new")
    procs.pids.extend(new)
    assert not new, f"the watchdog left the worker {new} running: {out.stdout}"
    _check_record(holder, m)
