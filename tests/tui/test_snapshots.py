"""Snapshot tests of the main screen and every dialog, with a frozen sampler and a frozen clock.

The sampler returns one constructed Snapshot (fixed pids, names, times); the history is seeded with fixed
values; the clock shown comes from the snapshot; TZ is UTC. Update with ``pytest --snapshot-update``.
"""

from __future__ import annotations

import time

import pytest

from gputop.tui.app import GputopApp
from tests.tui.helpers import utc  # noqa: F401 (the fixture, used through pytestmark)
from tests.tui.helpers import FakeSampler, frozen_panel, frozen_snapshot, seed_history, wait_screen, wait_until

pytestmark = pytest.mark.usefixtures("utc")


def make_app(readonly: bool = False) -> GputopApp:
    snap = frozen_snapshot()
    app = GputopApp(FakeSampler(snap), interval=3600, readonly=readonly, panel_source=frozen_panel)
    seed_history(app, snap)
    return app


def ready(*keys: str, select: str | None = None, screen: str | None = None):
    async def run_before(pilot) -> None:
        assert await wait_until(pilot, lambda: pilot.app.snapshot is not None)
        await pilot.pause()
        if select:
            assert pilot.app.select_key(select)
            await pilot.pause()
        for k in keys:
            await pilot.press(k)
            await pilot.pause()
        if screen:  # a key that opens a screen (some from a worker): wait until it is up and focused
            assert await wait_screen(pilot, screen)
        await pilot.pause(0.1)
    return run_before


def test_main_screen_80x24(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=ready())


def test_main_screen_wide_with_side_panel(snap_compare):
    assert snap_compare(make_app(), terminal_size=(150, 40), run_before=ready())


def test_grouped_by_orphan_root(snap_compare):
    assert snap_compare(make_app(), terminal_size=(100, 30), run_before=ready("o"))


def test_kill_dialog(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=ready("k", select="gpu0/1101", screen="KillDialog"))


def test_reap_dialog(snap_compare):
    # The reap dialog re-reads the live tree, so it needs a real orphan root: it is built from actions'
    # OrphanTree by the app; here the frozen root (pid 2000) does not exist, so we open the dialog directly.
    from gputop.actions import OrphanTree
    from gputop.tui.dialogs.reap import ReapDialog

    snap = frozen_snapshot()
    root = snap.roots[0]
    worker = snap.holder(2001).proc
    tree = OrphanTree(root.proc, (root.proc, worker), root.holders, root.gpus, root.gpu_memory, root.reason, 1)

    async def run_before(pilot):
        await ready()(pilot)
        pilot.app.push_screen(ReapDialog(tree))
        await pilot.pause(0.1)

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run_before)


def test_reset_dialog(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24),
                        run_before=ready("R", select="gpu2/2001", screen="ResetDialog"))


def test_guard_dialog(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=ready("g", screen="GuardToggleDialog"))


def test_help(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=ready("question_mark", screen="HelpScreen"))


def test_details(snap_compare):
    assert snap_compare(make_app(), terminal_size=(100, 30), run_before=ready("d", select="gpu2/2001", screen="DetailsScreen"))


def test_device_plot(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=ready("p", screen="PlotScreen"))


def test_readonly_main_screen(snap_compare):
    assert snap_compare(make_app(readonly=True), terminal_size=(80, 24), run_before=ready())


def test_too_small(snap_compare):
    assert snap_compare(make_app(), terminal_size=(50, 12), run_before=ready())


def test_no_color(snap_compare, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")  # read by the App when it is created
    app = make_app()
    assert app.no_color
    assert snap_compare(app, terminal_size=(80, 24), run_before=ready())


def test_main_screen_60x15(snap_compare):
    # The smallest size gputop runs at: the COMMAND column keeps some room (CPU% and TIME give way).
    assert snap_compare(make_app(), terminal_size=(60, 15), run_before=ready())


def test_reset_dialog_for_a_held_gpu(snap_compare):
    # Held by an ordinary process: "Kill holders and reset", the index box focused.
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=ready("R", select="gpu0/1101", screen="ResetDialog"))


def test_tagged_rows_and_sort_by_a_hidden_column(snap_compare):
    # Two rows tagged with space (marked *, counted on the top line; space moves down, as in htop); sorted
    # by HOST-MEM, which 80 columns do not show: it takes the place of TIME, with the sort mark.
    assert snap_compare(make_app(), terminal_size=(80, 24),
                        run_before=ready("space", "down", "down", "down", "space", "s", "s", "s",
                                         select="gpu0/1101"))
