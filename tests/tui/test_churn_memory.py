"""The TUI's memory stays bounded under holder churn (issue 33): when thousands of GPU holders come and go,
what the tree keeps per process is dropped with the process, and no style is made per process (a style
that names a tree node lands in Textual's and Rich's style caches: 16,384 ANSI renderings, each holding
its Style, filled up over ten minutes of churn, +12 MiB)."""

from __future__ import annotations

import gc
import weakref

import pytest
from textual.app import App

from rich.style import Style

from gputop.backends.base import BackendStatus, DeviceSample
from gputop.core.model import GpuUse, Holder, Snapshot
from gputop.core.orphans import NOT_ORPHAN, Verdict
from gputop.tui.app import GputopApp
from gputop.tui.process_tree import ProcessTree
from gputop.tui.tree_release import ReleasingTree

from .helpers import AT, GiB, FakeSampler, _p, frozen_panel, run_async, screen_text, switch_snapshot, wait_until

HOLDERS = 256
STEPS = 14  # 3,584 holders replaced
MiB = 1024**2


def churned(step: int) -> Snapshot:
    """HOLDERS holders on 8 GPUs, all children of one job launcher; at each step every holder and the
    launcher are new processes (new PIDs), as on a node that runs many short GPU jobs."""
    init = _p(1, 0, "systemd", "/sbin/init", 1, AT - 86400, user="root")
    lpid = 500 + step
    launcher = _p(lpid, 1, "python", "python launcher.py", lpid, AT - 3600)
    holders = []
    for i in range(HOLDERS):
        pid = 100000 + step * HOLDERS + i
        proc = _p(pid, lpid, "python", f"python job{pid}.py", lpid, AT - 10)
        holders.append(Holder(pid, (GpuUse(i % 8, "C", (4096 - i) * MiB, 10.0),), proc, (launcher, init),
                              Verdict(NOT_ORPHAN, f"session leader pid {lpid} is alive"), 5.0, 10.0 + step))
    devices = tuple(DeviceSample(g, "NVIDIA H200", memory_total=140 * GiB, memory_used=20 * GiB, util_gpu=50,
                                 temperature=40, power_w=200, power_limit_w=700, backend="simulated",
                                 backend_index=g) for g in range(8))
    return Snapshot(at=AT + step, host="node01", devices=devices, holders=tuple(holders), roots=(),
                    backends=(BackendStatus("simulated", True, "", 8),))


def styles_alive() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, Style))


@run_async
async def test_churned_holders_leave_nothing_behind_in_the_tree_or_the_style_caches():
    sampler = FakeSampler(churned(0))
    app = GputopApp(sampler, interval=30, panel_source=frozen_panel)
    async with app.run_test(size=(160, 50)) as pilot:
        tree = app.query_one(ProcessTree)
        assert await wait_until(pilot, lambda: " 100000 " in screen_text(app))
        for step in range(1, 4):  # warm up: every widget drawn, every fixed style made
            await switch_snapshot(pilot, app, sampler, churned(step))
            tree.nodes_by_key[f"gpu1/{500 + step}"].collapse()  # the user collapses a job's branch, and GPU 2
        tree.nodes_by_key["gpu2"].collapse()
        before = styles_alive()
        for step in range(4, 4 + STEPS):
            await switch_snapshot(pilot, app, sampler, churned(step))
        # The rows on screen are the newest processes' (they were drawn, so their styles were made).
        last = 100000 + (3 + STEPS) * HOLDERS
        assert await wait_until(pilot, lambda: f" {last} " in screen_text(app))
        grown = styles_alive() - before
        sizes = tree.retained_sizes()
    rows = HOLDERS + 8 + 8  # the holders, a launcher row per GPU, the GPU groups
    assert all(n <= rows for n in sizes.values()), sizes
    assert sizes["collapsed"] == 1, sizes  # GPU 2's: the branches of jobs that ended are forgotten
    assert grown < 200, f"{grown} more rich Styles alive after {STEPS * HOLDERS} holders came and went"


@run_async
async def test_a_click_on_a_row_still_selects_it_with_no_node_in_the_style():
    from .helpers import frozen_app, frozen_snapshot

    async with frozen_app(frozen_snapshot(), size=(150, 40)) as (app, pilot, sampler):
        tree = app.query_one(ProcessTree)
        assert await wait_until(pilot, lambda: tree.last_line > 4)
        await pilot.pause(0.2)
        for line in (3, 1):
            # on the command, far right of the label, and on the expander/guides at the left
            for x in (60, 1):
                assert await pilot.click(ProcessTree, offset=(x, line))
                assert await wait_until(pilot, lambda: tree.cursor_line == line), (x, line, tree.cursor_line)


RELEASE_STEPS = 6  # 1,536 holders replaced with the cyclic collector off
CYCLIC_PER_HOLDER = 2  # objects the collector may find per holder that left (16 with Tree's own _build and line cache)


@run_async
async def test_rows_that_left_the_tree_are_freed_at_once_not_left_to_the_cyclic_collector():
    """Textual's Tree._build keeps the lines it built in a reference cycle (gputop.tui.tree_release): the
    rows that left, with their Holder and ProcInfo, waited for the cyclic collector, 16 objects per holder
    that left, freed in bulk seconds later (issue 33). With the collector off: a row that left is freed as
    soon as the tree is laid out again, and what the collector finds after the churn is bounded."""
    sampler = FakeSampler(churned(0))
    app = GputopApp(sampler, interval=30, panel_source=frozen_panel)
    async with app.run_test(size=(160, 50)) as pilot:
        tree = app.query_one(ProcessTree)
        assert await wait_until(pilot, lambda: " 100000 " in screen_text(app))
        for step in range(1, 4):  # warm up: every widget drawn, every fixed style made
            await switch_snapshot(pilot, app, sampler, churned(step))
        gc.collect()
        gc.disable()
        try:
            # Laid out with the collector off: the cycle of this layout (Tree._build's) is not freed by it.
            await switch_snapshot(pilot, app, sampler, churned(4))
            first = 100000 + 4 * HOLDERS  # a holder row of step 4, on screen
            assert await wait_until(pilot, lambda: f" {first} " in screen_text(app))
            row = weakref.ref(tree.nodes_by_key[f"gpu0/{first}"])
            holder = weakref.ref(tree.nodes_by_key[f"gpu0/{first}"].data.holder)
            for step in range(5, 5 + RELEASE_STEPS):
                await switch_snapshot(pilot, app, sampler, churned(step))
            last = 100000 + (4 + RELEASE_STEPS) * HOLDERS
            assert await wait_until(pilot, lambda: f" {last} " in screen_text(app))
            kept = (row() is not None, holder() is not None)
            found = gc.collect()
        finally:
            gc.enable()
    assert kept == (False, False), f"a row that left (its TreeNode, its Holder) is still alive: {kept}"
    assert found < CYCLIC_PER_HOLDER * RELEASE_STEPS * HOLDERS, \
        f"{found} objects left to the cyclic collector after {RELEASE_STEPS * HOLDERS} holders came and went"


def _released(tree_class) -> tuple[int, int]:
    """(removed nodes still alive, tree nodes and lines the cyclic collector then finds) after 40 leaves of a
    drawn ``tree_class`` were removed and the tree was laid out and drawn again, with the collector off."""
    from textual.widgets.tree import TreeNode

    class TreeApp(App):
        def compose(self):
            yield tree_class("root")

    async def run() -> tuple[int, int]:
        app = TreeApp()
        async with app.run_test(size=(60, 50)) as pilot:
            tree = app.query_one(tree_class)
            tree.root.expand()
            leaves = [tree.root.add_leaf(f"process {1000 + i}", data=i) for i in range(40)]
            await pilot.pause(0.2)
            gc.collect()
            gc.disable()
            try:
                tree.root.add_leaf("process 2000")  # laid out and drawn with the collector off
                await pilot.pause(0.2)
                refs = [weakref.ref(leaf) for leaf in leaves]
                for leaf in leaves:
                    leaf.remove()
                del leaves, leaf
                await pilot.pause(0.2)  # laid out and drawn again
                alive = sum(ref() is not None for ref in refs)
                gc.set_debug(gc.DEBUG_SAVEALL)
                gc.collect()
                found = sum(1 for o in gc.garbage if isinstance(o, TreeNode) or type(o).__name__ == "_TreeLine")
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()
        return alive, found

    import asyncio

    return asyncio.run(run())


def test_a_releasing_tree_frees_the_nodes_it_no_longer_shows_without_the_cyclic_collector():
    from textual.widgets import Tree

    assert _released(ReleasingTree) == (0, 0)
    # Textual's own Tree keeps them, and their lines, until the collector runs (what ReleasingTree is for)
    alive, found = _released(Tree)
    assert alive == 40 and found >= 80, (alive, found)
