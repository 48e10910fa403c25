"""gputop --demo: real demo processes on simulated GPUs, with the verdicts they are meant to show, and
cleaned up on exit, on SIGTERM and on SIGHUP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from gputop.config import Config
from gputop.demo import INVISIBLE_PID, Demo
from gputop.snapshot import Sampler
from tests.conftest import wait_gone


def test_demo_processes_and_verdicts():
    with Demo(animate=False) as demo:
        pids = {role: p.pid for role, p in demo.procs.items()}
        snap = Sampler.open("simulated", str(demo.scenario_path), Config()).sample()
        by_pid = {h.pid: h for h in snap.holders}
        assert by_pid[pids["retry-worker"]].verdict.kind == "orphan"
        assert by_pid[pids["retry-worker"]].verdict.root == pids["retry-root"]
        assert [r.pid for r in snap.roots] == [pids["retry-root"]]
        assert by_pid[pids["worker0"]].verdict.kind == "not-orphan"
        assert by_pid[pids["miner"]].name == "xmrig"
        assert by_pid[pids["graphics"]].ctx == "G"
        assert by_pid[pids["jupyter"]].verdict.kind == "protected"
        assert by_pid[INVISIBLE_PID].verdict.kind == "unknown"
        assert len(snap.devices) == 4
        for role, pid in pids.items():  # every demo process resets SIGHUP to the default
            assert by_pid.get(pid) is None or by_pid[pid].proc.sighup_ignored is False, role
    for role, pid in pids.items():
        assert wait_gone(pid, 5), f"{role} ({pid}) survived the demo"
    assert not demo.dir.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_demo_cleans_up_on_signal(sig):
    code = ("import json, sys, time\nfrom gputop.demo import Demo\nd = Demo(animate=False).start()\n"
            "print(json.dumps({r: p.pid for r, p in d.procs.items()}), flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        pids = json.loads(p.stdout.readline())
        assert all(psutil.pid_exists(pid) for pid in pids.values())
        os.kill(p.pid, sig)
        p.wait(15)
        for role, pid in pids.items():
            assert wait_gone(pid, 5), f"{role} ({pid}) survived {sig.name}"
    finally:
        if p.poll() is None:
            p.kill()


def test_demo_keeps_guard_state_and_audit_log_in_its_own_directory(monkeypatch):
    """Toggling the guard or killing in the demo must not touch the node's real guard or audit log."""
    import argparse

    from gputop.config import guard_dir
    from gputop.tui import app as tui_app
    from gputop.tui.launch import run_tui

    monkeypatch.delenv("GPUTOP_STATE_DIR")
    seen = {}

    def fake_run(self):
        seen["state"], seen["guard"], seen["scenario"] = (os.environ.get("GPUTOP_STATE_DIR"), guard_dir(),
                                                          str(self.demo.scenario_path))

    monkeypatch.setattr(tui_app.GputopApp, "run", fake_run)
    args = argparse.Namespace(demo=True, backend=None, scenario=None, config=None, interval=None,
                              readonly=False)
    assert run_tui(args) == 0
    demo_dir = os.path.dirname(seen["scenario"])
    assert seen["state"] == os.path.join(demo_dir, "state") and str(seen["guard"]) == seen["state"]
