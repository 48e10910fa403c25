"""Review of issue 11: members that change session while a reap runs, and children of a process that
called setsid after forking them. Real processes; the simulated backend names the GPU holders."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from gputop import actions
from gputop.actions.executor import Executor
from gputop.core.config import load_config
from tests.conftest import run_gputop, wait_gone
from tests.functional.actions_helpers import unique
from tests.functional.test_reap_safety import find, running

PY = sys.executable
SLEEP = "import time; time.sleep(600)"
# A process that starts a child (still in its session), then calls setsid when told to (SIGUSR1).
LATE_SETSID = ("import os,signal,subprocess,sys,time; "
               "subprocess.Popen([sys.executable,'-c','import time; time.sleep(600)',sys.argv[2]+'-k']); "
               "signal.signal(signal.SIGUSR1, lambda *a: (os.setsid(), open(sys.argv[1],'w').write('x'))); "
               "time.sleep(600)")


def tree(procs, tmp_path, flag: Path) -> dict[str, int]:
    """An orphan root (bash) with a holder h1 and a launcher m (with its child k), all in the dead session."""
    m = unique("gtrev-set")
    script = tmp_path / "tree.sh"
    script.write_text(f"{PY} -c '{SLEEP}' {m}-h1 &\n{PY} -c \"{LATE_SETSID}\" {flag} {m} {m}-m &\nwait\n")
    procs.spawn(["setsid", "sh", "-c", f"bash {script} & exit 0"]).wait(10)
    ids = {"h1": find(f"{m}-h1")[0], "m": find(f"{m}-m")[0], "k": find(f"{m}-k")[0]}
    ids["root"] = psutil.Process(ids["h1"]).ppid()
    procs.pids.extend(ids.values())
    assert psutil.Process(ids["m"]).ppid() == ids["root"] and psutil.Process(ids["k"]).ppid() == ids["m"]
    return ids


def setsid_now(pid: int, flag: Path) -> None:
    os.kill(pid, signal.SIGUSR1)
    deadline = time.time() + 10
    while not flag.exists() and time.time() < deadline:
        time.sleep(0.01)
    assert os.getsid(pid) == pid


def test_a_member_that_calls_setsid_after_the_plan_is_not_signalled(procs, scenario, cfg, tmp_path, monkeypatch):
    flag = tmp_path / "setsid-done"
    ids = tree(procs, tmp_path, flag)
    scenario(holders=[{"pid": ids["h1"], "gpu": 0, "memory": "1GiB"}])
    [t] = actions.orphan_trees(__import__("gputop.core.sampler", fromlist=["Sampler"]).Sampler.open().sample())
    assert {m.pid for m in t.members} == {ids["root"], ids["h1"], ids["m"], ids["k"]}  # the plan, before

    freeze = Executor.freeze
    calls = []

    def late_setsid_then_freeze(self, first):
        if not calls:  # between the plan and the first SIGSTOP, the launcher starts its own session
            setsid_now(ids["m"], flag)
        calls.append(first)
        return freeze(self, first)

    monkeypatch.setattr(Executor, "freeze", late_setsid_then_freeze)
    res = actions.reap_tree(ids["root"], expected_start=t.root.start_time, face="cli", grace=1.0,
                            config=load_config())
    assert res.ok, res.message
    assert wait_gone(ids["h1"]) and wait_gone(ids["root"])
    time.sleep(0.3)
    for k in ("m", "k"):  # the new session and what is under it live on, and run (not left stopped)
        assert running(ids[k]) and psutil.Process(ids[k]).status() != psutil.STATUS_STOPPED, k
    assert ids["m"] in res.details["released"] and ids["k"] in res.details["released"]


def test_the_child_of_a_live_process_that_called_setsid_is_not_an_orphan(procs, scenario, cfg, tmp_path):
    """k is the child of m, which is alive; m ran setsid after starting k, so k keeps the old, dead session.
    k's parent is the live process that started it, not a subreaper that adopted it: k was never
    reparented, so it is no orphan, and a reap must not take it (it belongs to m's live job)."""
    flag = tmp_path / "setsid-done"
    ids = tree(procs, tmp_path, flag)
    setsid_now(ids["m"], flag)
    scenario(holders=[{"pid": ids["k"], "gpu": 0, "memory": "1GiB"}])
    st = json.loads(run_gputop("status", "--json").stdout)
    [h] = st["holders"]
    out = run_gputop("reap", "--apply", "--grace", "1")
    time.sleep(0.3)
    assert running(ids["k"]) and running(ids["m"]), (
        f"status said {h['verdict']}; reap: {out.stdout}{out.stderr}")
    assert h["verdict"]["kind"] != "orphan", h["verdict"]
