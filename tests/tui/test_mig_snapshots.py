"""A MIG node in the TUI (issue 30), at 80x24 and 160x50: each MIG device a line under its GPU on the device
board (utilisation N/A, never 0%), and in the tree a group per MIG device with its holders under it.
Update with ``pytest --snapshot-update``."""

from __future__ import annotations

import time

import pytest

from gputop.backends.base import BackendStatus, DeviceSample, MigInstance
from gputop.core.model import GpuUse, Holder, Snapshot
from gputop.core.orphans import NOT_ORPHAN, Verdict
from gputop.tui.app import GputopApp
from tests.tui.helpers import utc  # noqa: F401 (the fixture, used through pytestmark)
from tests.tui.helpers import AT, FakeSampler, _p, frozen_panel, seed_history, screen_text, wait_until, run_async

GiB = 1024**3

pytestmark = pytest.mark.usefixtures("utc")


def mig_snapshot() -> Snapshot:
    init = _p(1, 0, "systemd", "/sbin/init", 1, AT - 86400, user="root")
    a = _p(5101, 1, "python", "python train.py --config big.yaml", 5101, AT - 3600, user="alice")
    b = _p(5201, 1, "python", "python -m vllm.entrypoints.api_server", 5201, AT - 1800, user="bob")
    c = _p(5301, 1, "python", "python eval.py", 5301, AT - 600, user="carol")
    d = _p(5401, 1, "python", "python train.py --rank 0", 5401, AT - 7200, user="dave")
    alive = Verdict(NOT_ORPHAN, "session leader itself")
    holders = (
        Holder(5101, (GpuUse(0, "C", 40 * GiB, None, 1, 0),), a, (init,), alive, 90.0, 3600.0),
        Holder(5201, (GpuUse(0, "C", 15 * GiB, None, 5, 0),), b, (init,), alive, 20.0, 1800.0),
        Holder(5301, (GpuUse(0, "C", 6 * GiB, None, 6, 0),), c, (init,), alive, 5.0, 600.0),
        Holder(5401, (GpuUse(1, "C", 70 * GiB, 88.0),), d, (init,), alive, 99.0, 7200.0),
    )
    devices = (
        DeviceSample(0, "NVIDIA H200", memory_total=141 * GiB, memory_used=61 * GiB, util_gpu=None,
                     util_mem=None, temperature=58, power_w=420, power_limit_w=700, fan_pct=None,
                     clock_sm_mhz=1980, clock_mem_mhz=3201, errors=("utilization: NotSupported",),
                     backend="nvml", backend_index=0),
        DeviceSample(1, "NVIDIA H200", memory_total=141 * GiB, memory_used=70 * GiB, util_gpu=88,
                     util_mem=41, temperature=66, power_w=610, power_limit_w=700, fan_pct=None,
                     clock_sm_mhz=1980, clock_mem_mhz=3201, backend="nvml", backend_index=1),
    )
    instances = (
        MigInstance(0, 0, 1, 0, "3g.71gb", "MIG-5140a7ed-0000-4000-8000-000000000001", "NVIDIA H200 MIG 3g.71gb",
                    71 * GiB, 40 * GiB),
        MigInstance(0, 1, 5, 0, "1g.18gb", "MIG-5140a7ed-0000-4000-8000-000000000005", "NVIDIA H200 MIG 1g.18gb",
                    18 * GiB, 15 * GiB),
        MigInstance(0, 2, 6, 0, "1g.18gb", "MIG-5140a7ed-0000-4000-8000-000000000006", "NVIDIA H200 MIG 1g.18gb",
                    18 * GiB, 6 * GiB),
        MigInstance(0, 3, 13, 0, "1g.18gb", "MIG-5140a7ed-0000-4000-8000-000000000013", "NVIDIA H200 MIG 1g.18gb",
                    18 * GiB, 0),
    )
    return Snapshot(at=AT, host="h200-node", devices=devices, holders=holders, roots=(),
                    backends=(BackendStatus("nvml", True, "", 2),), instances=instances)


def make_app() -> GputopApp:
    snap = mig_snapshot()
    app = GputopApp(FakeSampler(snap), interval=3600, panel_source=frozen_panel)
    seed_history(app, snap)
    return app


async def _ready(pilot) -> None:
    assert await wait_until(pilot, lambda: pilot.app.snapshot is not None)
    await pilot.pause()
    await pilot.pause(0.1)


def test_mig_node_80x24(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=_ready)


def test_mig_node_160x50(snap_compare):
    assert snap_compare(make_app(), terminal_size=(160, 50), run_before=_ready)


@run_async
async def test_mig_lines_and_groups_say_what_they_are():
    """Not only pixels: the board names each MIG device with N/A utilisation, and each holder sits in its
    device's group."""
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await _ready(pilot)
        text = screen_text(app)
    assert "0:1 MIG 1g.18gb  GI 5/CI 0" in text and "0:0 MIG 3g.71gb  GI 1/CI 0" in text
    board = [l for l in text.splitlines() if " MIG " in l and "UTIL" in l]
    assert len(board) == 4 and all("UTIL N/A" in l for l in board) and not any("UTIL 0%" in l for l in board)
    lines = text.splitlines()
    group = next(i for i, l in enumerate(lines) if "MIG GI 5/CI 0 1g.18gb" in l)
    assert "5201" in lines[group + 1]  # bob's server right under its instance's group
    assert any("MIG GI 13/CI 0 1g.18gb" in l and "0 holders" in l for l in lines)
