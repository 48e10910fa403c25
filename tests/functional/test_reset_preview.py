"""The reset preview is the core reset dry run (gputop.actions.reset): MCP says what the real reset
will do, for lack of root and for holders the kernel would not let this process signal, and a real
reset with --force refuses before it kills anyone."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from mcp.types import CallToolResult

from gputop import actions
from gputop.service import mcp_server
from gputop.backends.base import Backend
from gputop.backends.simulated import SimulatedBackend
from gputop.core.config import Config
from gputop.service.faces import LiveSnapshot
from gputop.core.sampler import Sampler
from tests.functional.test_mcp import _as_nobody, alive


class VendorBackend(SimulatedBackend):
    name = "vendorx"  # a vendor backend: resets only as root (as nvml and amd do)


class NoResetBackend(SimulatedBackend):
    name = "noreset"
    reset = Backend.reset  # the base backend: cannot reset


_DIRS: list[Path] = []


@pytest.fixture(autouse=True)
def _cleanup():
    yield
    while _DIRS:
        shutil.rmtree(_DIRS.pop(), ignore_errors=True)


def _live(holders, backend=SimulatedBackend) -> LiveSnapshot:
    d = Path(tempfile.mkdtemp(prefix="gtsafety-"))
    _DIRS.append(d)
    d.chmod(0o755)  # readable by the unprivileged child too
    path = d / "scenario.yaml"
    path.write_text(yaml.safe_dump({"gpus": [{"name": "Sim", "memory_total": "80GiB"}], "holders": holders}))
    path.chmod(0o644)
    return LiveSnapshot(Sampler([backend(str(path))], config=Config()), Config())


def _preview(live, force=True) -> dict:
    out = mcp_server._preview_reset(live, live.sampler.sample(), 0, force, None)
    return dict(out.structured_content) if isinstance(out, CallToolResult) else dict(out)


def _core(live, force=True) -> dict:
    r = actions.reset_gpu(0, face="mcp", force=force, sampler=live.sampler, config=live.config, dry_run=True)
    return {"ok": r.ok, "outcome": r.outcome, "message": r.message}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to nobody")
def test_preview_of_a_forced_reset_of_roots_job_as_nobody_is_the_core_refusal(procs):
    victim = procs.sleeper("rootjob")
    live = _live([{"pid": victim.pid, "gpu": 0, "memory": "1GiB"}])
    out, core = _as_nobody(lambda: (_preview(live), _core(live)))
    assert out["ok"] is False and out["outcome"] == "permission-denied", out
    assert f"no permission to signal pid {victim.pid}" in out["message"]
    assert out["message"] == f"would refuse: {core['message']}" and core["outcome"] == "permission-denied"
    assert alive(victim.pid)
    ok = _preview(live)  # root may: the same dry run says it would kill, then reset
    assert ok["ok"] is True and "would kill 1 process(es)" in ok["message"], ok


def test_preview_says_a_vendor_reset_needs_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    out = _preview(_live([], VendorBackend), force=False)
    assert out["ok"] is False and out["outcome"] == "permission-denied", out
    assert "needs root" in out["message"] and "sudo gputop reset --gpu 0" in out["message"]


def test_preview_says_a_backend_cannot_reset(procs):
    out = _preview(_live([], NoResetBackend), force=False)
    assert out["ok"] is False and out["outcome"] == "unsupported", out


def test_a_forced_reset_that_needs_root_kills_nobody_first(procs, monkeypatch):
    victim = procs.sleeper("ownjob")
    live = _live([{"pid": victim.pid, "gpu": 0, "memory": "1GiB"}], VendorBackend)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    r = actions.reset_gpu(0, face="cli", force=True, sampler=live.sampler, config=live.config, kill_timeout=1)
    assert r.ok is False and r.outcome == "permission-denied" and "needs root" in r.message, r
    assert alive(victim.pid), "the holder was killed for a reset that could not happen"
