"""Issue 29 in the TUI: device panes name the job each GPU is allocated to (and its squatters), the GPU
groups say it too, holder rows carry their standing, and 'o' reaches a grouping by allocation."""

from __future__ import annotations

import dataclasses

from gputop.core.allocation import Allocation, AllocationView, Standing
from gputop.tui import rows
from gputop.tui.device_pane import allocation_texts

from .helpers import frozen_app, run_async, screen_text, wait_until
from .test_offscreen_rows import AT, big_snapshot


def alloc_snapshot():
    base = big_snapshot()
    holders = base.holders[:4]  # pids 10000-10003 on GPUs 0-3
    view = AllocationView(
        "slurm", {0: Allocation(0, "42", 42, "alice", 1000, AT - 3600), 1: Allocation(1, "42", 42, "alice", 1000,
                                                                                     AT - 3600),
                  5: Allocation(5, "43", 43, "bob", 1001, AT - 60)},
        {10000: Standing("inside", "its job"), 10001: Standing("squatter", "a process of no job on GPU 1"),
         10002: Standing("outside", "job 7's process on GPU 2"), 10003: Standing("unallocated", "no job")},
        {5: AT - 60})
    return dataclasses.replace(base, holders=holders, allocation=view)


def test_rows_carry_standings_and_group_by_allocation():
    snap = alloc_snapshot()
    groups = rows.build(snap, grouping=rows.GROUP_ALLOC)
    titles = [g.title for g in groups]
    assert titles[0].startswith("job 42 (alice) · GPU 0,1 · 2 holders") and titles[0].endswith("1 flagged")
    assert titles[1].startswith("job 43 (bob) · GPU 5 · 0 holders")
    assert titles[2].startswith("allocated to no job · GPU 2,3,4,6,7 · 2 holders")
    marks = {n.pid: rows.standing_mark(n) for n in rows.walk(groups) if n.holder is not None}
    assert marks == {10000: "", 10001: "squatter", 10002: "outside its allocation", 10003: ""}
    by_gpu = rows.build(snap)
    # (the memory ledger's note, when it has one, comes after the allocation's)
    assert "· job 42 (alice) · 1 flagged" in by_gpu[1].title and "· no job" in by_gpu[3].title
    # No scheduler read: nothing changes (the titles of every existing snapshot test stay as they were).
    plain = rows.build(big_snapshot())
    assert all("job" not in g.title for g in plain) and all(n.standing is None for n in rows.walk(plain))


def test_device_texts_name_the_job_its_idle_time_and_squatters():
    snap = alloc_snapshot()
    texts = allocation_texts(snap.allocation, snap.holders, snap.at)
    assert texts == {0: "job 42 alice", 1: "job 42 alice · 1 squatter", 5: "job 43 bob idle 1:00"}


@run_async
async def test_the_device_panes_name_the_job_and_o_groups_by_allocation():
    snap = alloc_snapshot()
    async with frozen_app(snap, size=(160, 50)) as (app, pilot, sampler):
        assert await wait_until(pilot, lambda: "job 42 alice · 1 squatter" in screen_text(app))
        line = next(x for x in screen_text(app).splitlines() if "GPU 5 " in x)
        assert "job 43 bob idle 1:00" in line
        from gputop.tui.process_tree import ProcessTree

        app.query_one(ProcessTree).focus()
        for _ in range(2):  # GPU -> orphan root -> allocation (no holder is in a Slurm job here)
            await pilot.press("o")
        assert await wait_until(pilot, lambda: "job 43 (bob) · GPU 5" in screen_text(app))


def test_the_details_of_a_squatter_say_its_standing_and_why():
    from gputop.tui.details import details_text

    snap = alloc_snapshot()
    h = snap.holders[1]
    text = details_text(h, h.proc, None, standing=snap.allocation.standing(h.pid)).plain
    assert "standing: squatter (a process of no job on GPU 1)" in text
    assert "standing" not in details_text(h, h.proc, None).plain  # no scheduler read: no line


def test_a_squatters_row_and_an_outsiders_row_are_flagged_before_the_command():
    from gputop.tui.process_tree import row_cells

    groups = rows.build(alloc_snapshot())
    cmds = {n.pid: row_cells(n, 0, 0, False, False)[6] for n in rows.walk(groups) if n.holder is not None}
    assert cmds[10001].startswith("[squatter] ") and cmds[10002].startswith("[outside its allocation] ")
    assert not cmds[10000].startswith("[") and not cmds[10003].startswith("[")  # inside, unallocated: no flag
