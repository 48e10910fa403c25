"""A row whose only change is its TIME is not rendered again: the TIME characters are rewritten in the
strip drawn last time (TreeLines.respliced). These tests check that what is on screen after such
refreshes is exactly what a full render draws (text and styles), that a row that changed more than its
TIME (a tag, the cursor) is drawn in full, and that the top bar's clock advances."""

from __future__ import annotations

import re
import time

from gputop.backends.base import BackendStatus, DeviceSample
from gputop.core.orphans import NOT_ORPHAN, Verdict
from gputop.core.model import GpuUse, Holder, Snapshot
from gputop.tui.process_tree import ProcessTree, node_depth
from gputop.tui.tree_lines import TreeLines
from gputop.util.units import fmt_duration

from .helpers import (AT, GiB, _p, frozen_app, row_line, run_async, screen_text, switch_snapshot,
                      wait_until)

N = 16
MiB = 1024**2


def snapshot(shift: float = 0.0) -> Snapshot:
    """N holders on 8 GPUs; ``shift`` seconds later (their TIME and the clock advance, nothing else)."""
    init = _p(1, 0, "systemd", "/sbin/init", 1, AT - 86400, user="root")
    holders = []
    for i in range(N):
        pid = 20000 + i
        proc = _p(pid, 1, "python", f"python job{i}.py", pid, AT - 1000 - i)
        holders.append(Holder(pid, (GpuUse(i % 8, "C" if i % 3 else "G", (4096 - i) * MiB, 10.0),), proc,
                              (init,), Verdict(NOT_ORPHAN, "session leader itself"), 5.0, 50.0 + i + shift))
    devices = tuple(DeviceSample(g, "NVIDIA H200", memory_total=140 * GiB, memory_used=20 * GiB, util_gpu=50,
                                 temperature=40, power_w=200, power_limit_w=700, backend="simulated",
                                 backend_index=g) for g in range(8))
    return Snapshot(at=AT + shift, host="node01", devices=devices, holders=tuple(holders), roots=(),
                    backends=(BackendStatus("simulated", True, "", 8),))


def drawn_strips(tree: ProcessTree) -> list:
    """The tree's lines as drawn now: (text, segments with their styles)."""
    return [(s.text, list(s)) for s in tree.render_lines(tree.size.region)]


def full_render(tree: ProcessTree) -> list:
    """The tree's lines rendered and styled from scratch (no cached or spliced strip)."""
    tree.lines.clear()  # the line cache, the rows' last strips and the styled lines
    tree.refresh()  # and Textual's styled lines
    return drawn_strips(tree)


@run_async
async def test_rows_whose_time_advances_show_what_a_full_render_shows():
    async with frozen_app(snapshot()) as (app, pilot, sampler):
        tree = app.query_one(ProcessTree)
        assert await wait_until(pilot, lambda: row_line(app, 20000) is not None)
        spliced = 0
        real = TreeLines.respliced

        def counting(self, *a):
            nonlocal spliced
            out = real(self, *a)
            spliced += out is not None
            return out

        from gputop.tui import tree_lines

        splices = 0
        real_splice = tree_lines.splice

        def counting_splice(*a):
            nonlocal splices
            splices += 1
            return real_splice(*a)

        TreeLines.respliced = counting
        tree_lines.splice = counting_splice
        try:
            for shift in (1, 2, 61, 3600):  # seconds, a minute, an hour: TIME's text changes each time
                await switch_snapshot(pilot, app, sampler, snapshot(shift))
                for i in range(N):
                    line = row_line(app, 20000 + i)
                    if line is not None:
                        assert f" {fmt_duration(50.0 + i + shift)} " in line, (shift, line)
                shown = drawn_strips(tree)
                assert shown == full_render(tree), shift
        finally:
            TreeLines.respliced = real
            tree_lines.splice = real_splice
        assert spliced >= N  # the rows were spliced, not rendered again (else this test checks nothing)
        assert splices >= spliced + N  # ... and in the styled lines too (TreeLines._splice_styled)
        # The top bar's clock follows the snapshot's time.
        clock = time.strftime("%H:%M:%S", time.localtime(AT + 3600))
        assert clock in screen_text(app).splitlines()[0]


@run_async
async def test_a_row_that_changes_more_than_its_time_is_drawn_in_full():
    async with frozen_app(snapshot()) as (app, pilot, sampler):
        tree = app.query_one(ProcessTree)
        assert await wait_until(pilot, lambda: row_line(app, 20000) is not None)
        tree.focus()
        await pilot.pause(0.1)
        for shift, key in ((1, "down"), (2, "space"), (3, "down"), (4, "space")):  # move, tag, move, tag
            await pilot.press(key)
            await switch_snapshot(pilot, app, sampler, snapshot(shift))
            assert drawn_strips(tree) == full_render(tree), (shift, key)
        assert tree.tagged
        for pid in tree.tagged:  # a tag shows at once, though the row's TIME changed too
            assert re.search(rf"\*. *{pid} ", row_line(app, pid) or ""), screen_text(app)


@run_async
async def test_cells_worked_out_from_the_last_ones_equal_a_fresh_row_cells():
    """ProcessTree._time_only formats only TIME when nothing else a row shows changed: after refreshes
    where TIME advances and, for two holders, the command or CPU% changes too, every row's cells are what
    row_cells makes from scratch."""
    import dataclasses

    from gputop.tui.process_tree import row_cells

    async with frozen_app(snapshot()) as (app, pilot, sampler):
        tree = app.query_one(ProcessTree)
        assert await wait_until(pilot, lambda: row_line(app, 20000) is not None)
        fast = 0
        original = tree._time_only

        def counted(*a):
            nonlocal fast
            out = original(*a)
            fast += out is not None
            return out

        tree._time_only = counted
        for shift in (1, 2, 65):
            snap = snapshot(shift)
            if shift == 65:  # one holder shows another command line, another uses more CPU
                hs = list(snap.holders)
                h = hs[3]
                proc = dataclasses.replace(h.proc, cmdline=("python", "other.py"))
                hs[3] = Holder(h.pid, h.uses, proc, h.chain, h.verdict, h.cpu_percent, h.runtime)
                h = hs[5]
                hs[5] = Holder(h.pid, h.uses, h.proc, h.chain, h.verdict, 99.0, h.runtime)
                snap = dataclasses.replace(snap, holders=tuple(hs))
            await switch_snapshot(pilot, app, sampler, snap)
            await pilot.pause()
            for key, tnode in tree.nodes_by_key.items():
                if id(tnode) in tree._stale:
                    continue
                want = row_cells(tnode.data, node_depth(tnode), tree.max_depth, False, tree.compact)
                assert tree._labels[key] == want, key
        assert fast >= N  # the fast path ran (rows whose TIME alone advanced)
        assert "python other.py" in row_line(app, 20003) and " 99%" in row_line(app, 20005)
