"""Review of issue 11: a reap that is refused after it froze the tree must leave the tree as it found it.
A member its owner had stopped (SIGSTOP, a paused job) stays stopped; only what gputop stopped is continued."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil

from gputop import actions
from gputop.actions.executor import Executor
from gputop.core.config import load_config
from gputop.core.sampler import Sampler
from tests.functional.actions_helpers import unique, write_config
from tests.functional.test_reap_safety import find, running

PY = sys.executable
SLEEP = "import time; time.sleep(600)"
# A member that becomes protected when told to (SIGUSR1): it takes the nohup mark (SIGHUP ignored) and
# renames itself tmux. (Issue 25: a python that only calls itself tmux is a disguise, never protected by
# the name; the nohup mark is what protects it now.)
RENAME = ("import ctypes,signal,time; "
          "signal.signal(signal.SIGUSR1, lambda *a: (signal.signal(signal.SIGHUP, signal.SIG_IGN), "
          "ctypes.CDLL(None).prctl(15,b'tmux',0,0,0))); time.sleep(600)")


def _wait_caught(pid: int, sig: int, timeout: float = 10.0) -> None:
    """Until ``pid`` has a handler for ``sig`` (SigCgt): before that, the signal would kill it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(f"/proc/{pid}/status") as f:
            cgt = next(line for line in f if line.startswith("SigCgt:")).split()[1]
        if int(cgt, 16) >> (sig - 1) & 1:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} installed no handler for signal {sig}")


def _state(pid: int) -> str:
    stat = open(f"/proc/{pid}/stat").read()
    return stat[stat.rindex(")") + 2]


def test_a_refused_reap_leaves_a_member_its_owner_stopped_stopped(procs, scenario, tmp_path, monkeypatch):
    write_config(tmp_path / "config.yaml", monkeypatch, protect=["^tmux$"], nohup_protects=True)
    m = unique("gtrev-ref")
    script = tmp_path / "tree.sh"
    script.write_text(f"{PY} -c '{SLEEP}' {m}-h &\n{PY} -c '{SLEEP}' {m}-paused &\n"
                      f"{PY} -c \"{RENAME}\" {m}-r &\nwait\n")
    procs.spawn(["setsid", "sh", "-c", f"bash {script} & exit 0"]).wait(10)
    ids = {k: find(f"{m}-{k}")[0] for k in ("h", "paused", "r")}
    ids["root"] = psutil.Process(ids["h"]).ppid()
    procs.pids.extend(ids.values())
    _wait_caught(ids["r"], signal.SIGUSR1)  # python is still starting: SIGUSR1 would kill it
    os.kill(ids["paused"], signal.SIGSTOP)  # its owner paused it, long before any reap
    deadline = time.time() + 5
    while _state(ids["paused"]) != "T" and time.time() < deadline:
        time.sleep(0.01)
    scenario(holders=[{"pid": ids["h"], "gpu": 0, "memory": "1GiB"}])
    [t] = actions.orphan_trees(Sampler.open().sample())
    assert t.refusal is None and ids["paused"] in {x.pid for x in t.members}

    freeze = Executor.freeze
    calls = []

    def protected_then_freeze(self, first):
        if not calls:  # between the plan and the freeze, a member becomes protected: apply must refuse
            os.kill(ids["r"], signal.SIGUSR1)
            deadline = time.time() + 5
            while open(f"/proc/{ids['r']}/comm").read().strip() != "tmux" and time.time() < deadline:
                time.sleep(0.01)
        calls.append(first)
        return freeze(self, first)

    monkeypatch.setattr(Executor, "freeze", protected_then_freeze)
    res = actions.reap_tree(ids["root"], expected_start=t.root.start_time, face="cli", grace=1.0,
                            config=load_config())
    assert not res.ok and res.details.get("rule") == "protected", res.message
    time.sleep(0.2)
    for k in ("root", "h", "r"):  # what gputop stopped runs again
        assert running(ids[k]) and _state(ids[k]) != "T", k
    assert _state(ids["paused"]) == "T", "the refused reap continued (SIGCONT) a process its owner had stopped"
