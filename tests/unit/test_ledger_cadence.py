"""The device-file scan's cadence (docs/memory-ledger.md): every scan_every seconds while some GPU's memory
is unexplained or unknown, every quiet_every seconds while all of it is explained."""

from __future__ import annotations

import os

import gputop.core.ledger_sampling as ls
from gputop.core.model import GpuUse
from gputop.core.procs import ProcTable

GIB = 1 << 30


class CountingScan:
    scans = 0

    def __init__(self, proc_root, full_every):
        self.unreadable = 0

    def scan(self, rdevs):
        CountingScan.scans += 1
        return {}


class OneNode:
    def device_node(self, local):
        return os.makedev(195, 0)


def run(monkeypatch, used: int | None, listed: int | None, steps: list[float]) -> int:
    monkeypatch.setattr(ls, "DeviceScan", CountingScan)
    monkeypatch.setattr(ls, "nvidia_control_nodes", lambda root: frozenset())
    CountingScan.scans = 0
    now = [0.0]
    led = ls.LedgerSampling("/proc", verdicts=None, clock=lambda: now[0])
    for t in steps:
        now[0] = t
        led.node(0, OneNode(), 0, used)
        uses = {4242: [GpuUse(0, "C", listed, None)]}
        led.add_device_file_uses(uses, {4242: True}, [], ProcTable())
    return CountingScan.scans


def test_explained_memory_is_scanned_every_minute(monkeypatch):
    assert run(monkeypatch, 10 * GIB, 10 * GIB, [0, 5, 10, 30, 59, 61, 100, 121]) == 3  # at 0, 61, 121


def test_unexplained_or_unknown_memory_is_scanned_every_five_seconds(monkeypatch):
    assert run(monkeypatch, 10 * GIB, 4 * GIB, [0, 4, 5, 9, 10, 16]) == 4  # at 0, 5, 10, 16
    assert run(monkeypatch, None, 4 * GIB, [0, 4, 5, 10]) == 3
    assert run(monkeypatch, 10 * GIB, None, [0, 4, 5, 10]) == 3
