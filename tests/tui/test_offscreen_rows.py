"""Rows off screen are formatted only when they are drawn, and panes repaint only when they change: these
tests check that what is on screen is still the latest data (a 1,024-holder tree scrolled to its bottom,
a row in view, a device pane), so that skipping work never shows stale values."""

from __future__ import annotations

import dataclasses

from gputop.backends.base import BackendStatus, DeviceSample
from gputop.core.orphans import NOT_ORPHAN, Verdict
from gputop.core.model import GpuUse, Holder, Snapshot
from gputop.tui.process_tree import ProcessTree
from gputop.util.units import fmt_duration

from .helpers import (AT, GiB, _p, frozen_app, row_line, run_async, screen_text, switch_snapshot,
                      wait_until)

N = 1024
MiB = 1024**2


def big_snapshot(runtime_shift: float = 0.0, util: float = 50.0, at: float = AT) -> Snapshot:
    """N session-leader holders on 8 GPUs; GPU memory sorts them, so the last row is pid 10000+N-1."""
    init = _p(1, 0, "systemd", "/sbin/init", 1, AT - 86400, user="root")
    holders = []
    for i in range(N):
        pid = 10000 + i
        proc = _p(pid, 1, "python", f"python job{i}.py", pid, AT - 1000 - i)
        holders.append(Holder(pid, (GpuUse(i % 8, "C", (4096 - i) * MiB, 10.0),), proc, (init,),
                              Verdict(NOT_ORPHAN, "session leader itself"), 5.0, 1000.0 + i + runtime_shift))
    devices = tuple(DeviceSample(g, "NVIDIA H200", memory_total=140 * GiB, memory_used=20 * GiB, util_gpu=util,
                                 temperature=40, power_w=200, power_limit_w=700, backend="simulated",
                                 backend_index=g) for g in range(8))
    return Snapshot(at=at, host="node01", devices=devices, holders=tuple(holders), roots=(),
                    backends=(BackendStatus("simulated", True, "", 8),))


@run_async
async def test_the_bottom_of_a_big_tree_shows_the_latest_values_when_scrolled_to():
    async with frozen_app(big_snapshot()) as (app, pilot, sampler):
        tree = app.query_one(ProcessTree)
        assert await wait_until(pilot, lambda: f"gpu7/{10000 + N - 1}" in tree.nodes_by_key)
        await pilot.pause(0.2)
        last = 10000 + N - 1
        assert row_line(app, last) is None  # far below the screen
        # The values of every row change (an hour later); the bottom rows are off screen meanwhile.
        later = big_snapshot(runtime_shift=3600)
        await switch_snapshot(pilot, app, sampler, later)
        app.query_one(ProcessTree).focus()
        await pilot.press("end")
        assert await wait_until(pilot, lambda: row_line(app, last) is not None)
        line = row_line(app, last)
        assert fmt_duration(1000.0 + N - 1 + 3600) in line, line
        assert f" {fmt_duration(1000.0 + N - 1)} " not in line, line  # not the old value
        # A change while scrolled down shows on the rows in view, and the top (now off screen) follows too.
        latest = big_snapshot(runtime_shift=7200)
        await switch_snapshot(pilot, app, sampler, latest)
        assert await wait_until(pilot, lambda: fmt_duration(1000.0 + N - 1 + 7200) in (row_line(app, last) or ""))
        await pilot.press("home")
        assert await wait_until(pilot, lambda: row_line(app, 10000) is not None)
        assert fmt_duration(1000.0 + 7200) in row_line(app, 10000)


@run_async
async def test_a_value_change_in_a_row_on_screen_shows_on_the_next_refresh():
    async with frozen_app(big_snapshot()) as (app, pilot, sampler):
        assert await wait_until(pilot, lambda: row_line(app, 10000) is not None)
        assert fmt_duration(1000.0) in row_line(app, 10000)
        await switch_snapshot(pilot, app, sampler, big_snapshot(runtime_shift=61))
        assert await wait_until(pilot, lambda: fmt_duration(1061.0) in (row_line(app, 10000) or ""))
        assert f" {fmt_duration(1000.0)} " not in row_line(app, 10000)


@run_async
async def test_a_device_pane_value_change_shows():
    async with frozen_app(big_snapshot(util=50.0)) as (app, pilot, sampler):
        assert await wait_until(pilot, lambda: " 50%" in screen_text(app))
        changed = big_snapshot(util=50.0, at=AT + 1)
        devs = list(changed.devices)
        devs[3] = dataclasses.replace(devs[3], util_gpu=97.0, temperature=81)
        await switch_snapshot(pilot, app, sampler, dataclasses.replace(changed, devices=tuple(devs)))
        gpu3 = next(line for line in screen_text(app).splitlines() if line.lstrip().startswith("3 NVIDIA"))
        assert "97%" in gpu3 and "81°C" in gpu3, gpu3
        assert "█" in gpu3  # the history strip has the new (high) point


@run_async
async def test_rows_never_drawn_hold_no_label_text_and_are_drawn_right_when_scrolled_to():
    from gputop.tui import process_tree

    async with frozen_app(big_snapshot()) as (app, pilot, sampler):
        tree = app.query_one(ProcessTree)
        last = 10000 + N - 1
        assert await wait_until(pilot, lambda: f"gpu7/{last}" in tree.nodes_by_key)
        await pilot.pause(0.2)
        undrawn = [n for n in tree.nodes_by_key.values() if id(n) not in tree._texts]
        assert len(undrawn) > N - 100  # only the rows in view built their Text
        node = tree.nodes_by_key[f"gpu7/{last}"]
        assert tree.get_label_width(node) == process_tree.EXPANDER + len(process_tree.text_from_cells(
            tree._labels[node.data.key]).plain)
        tree.focus()
        await pilot.press("end")
        assert await wait_until(pilot, lambda: row_line(app, last) is not None)
        assert id(node) in tree._texts and f"job{N - 1}.py" in row_line(app, last)
        assert fmt_duration(1000.0 + N - 1) in row_line(app, last)
