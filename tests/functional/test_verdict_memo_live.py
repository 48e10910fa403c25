"""The Sampler's verdict memo on real processes: a session leader that dies between two samples of the
same long-lived sampler changes the holder's verdict on the very next sample."""

from __future__ import annotations

import os
import signal
import time

from gputop.core.orphans import classify, compile_protect
from gputop.core.procs import ProcTable, read_proc
from gputop.core.sampler import Sampler


def _fresh(sampler, pid):
    cfg = sampler.config
    return classify(pid, ProcTable(), protect=compile_protect(cfg.protect),
                    protect_cmdline=compile_protect(cfg.protect_cmdline), owner_of=sampler.lookups().owner_of)


def test_session_leader_dies_between_two_samples(procs, scenario):
    from gputop.backends.simulated import SimulatedBackend

    # A session leader (setsid sh) whose child holds the GPU; the shell waits, so the session lives.
    leader = procs.spawn(["setsid", "sh", "-c", "sleep 601 & wait"])
    holder = procs.wait_for("sleep 601")
    path = scenario([{"pid": holder, "gpu": 0, "memory": "1GiB"}])
    s = Sampler([SimulatedBackend(path)])
    first = s.sample().holder(holder).verdict
    second = s.sample().holder(holder).verdict  # from the memo
    assert first.kind == second.kind == "not-orphan", first
    os.kill(leader.pid, signal.SIGKILL)
    leader.wait(10)
    deadline = time.time() + 10
    while time.time() < deadline and read_proc(holder).ppid == leader.pid:
        time.sleep(0.02)  # reparenting is done by the kernel as the leader exits
    after = s.sample().holder(holder).verdict
    assert after.kind != "not-orphan", after
    assert "session leader" in after.reason or "gone" in after.reason or after.kind == "unknown", after
    assert after == _fresh(s, holder)
    os.kill(holder, signal.SIGKILL)
