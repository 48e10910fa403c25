"""The TUI's side-panel source runs the rogue audit when the holders change, else at most every 5 s."""

from __future__ import annotations

import dataclasses

from gputop import rogue
from gputop.config import Config
from gputop.tui.app import PanelSource
from tests.tui.helpers import frozen_snapshot


def test_audit_reruns_on_new_holders_and_is_rate_limited_otherwise(monkeypatch):
    calls = []
    real = rogue.audit
    monkeypatch.setattr(rogue, "audit", lambda snap, cfg, **kw: calls.append(snap.at) or real(snap, cfg, **kw))
    clock = [1000.0]
    monkeypatch.setattr("gputop.tui.app.time.monotonic", lambda: clock[0])
    source, cfg = PanelSource(), Config()
    snap = frozen_snapshot()
    first = source(snap, cfg)
    assert len(calls) == 1 and first.audit_available and first.findings
    clock[0] += 1
    again = source(dataclasses.replace(snap, at=snap.at + 1), cfg)
    assert len(calls) == 1 and again.findings == first.findings  # same holders, within 5 s: reused
    clock[0] += 0.5
    source(dataclasses.replace(snap, at=snap.at + 2, holders=snap.holders[1:]), cfg)
    assert len(calls) == 2  # a holder went away: audited at once
    clock[0] += PanelSource.AUDIT_EVERY
    source(dataclasses.replace(snap, at=snap.at + 8, holders=snap.holders[1:]), cfg)
    assert len(calls) == 3  # the interval passed
