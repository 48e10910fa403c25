"""Steady refreshes make no reference cycles, so the app can run the cyclic GC's young generation rarely
(app.GC_GEN0) without garbage piling up between collections; the threshold is put back on exit."""

from __future__ import annotations

import gc

from textual.strip import Strip

from gputop.tui import app as app_module
from gputop.tui.app import GputopApp

from .helpers import FakeSampler, frozen_panel, run_async, screen_text, switch_snapshot, wait_until
from .test_offscreen_rows import big_snapshot


@run_async
async def test_refreshes_leave_no_cyclic_garbage_and_the_threshold_is_restored():
    before = gc.get_threshold()
    base = big_snapshot(util=50.0)
    sampler = FakeSampler(base)
    app = GputopApp(sampler, interval=30, panel_source=frozen_panel)
    garbage: list = []
    async with app.run_test(size=(160, 45)) as pilot:
        assert await wait_until(pilot, lambda: " 50%" in screen_text(app))
        assert gc.get_threshold()[0] == max(app_module.GC_GEN0, before[0])
        for shift in range(1, 4):  # warm up: every widget drawn, every cache made
            await switch_snapshot(pilot, app, sampler, big_snapshot(runtime_shift=shift, at=base.at + shift))
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            # What a running monitor sees each second: every holder's TIME advances, a GPU's use moves.
            for shift in range(4, 12):
                await switch_snapshot(pilot, app, sampler,
                                      big_snapshot(runtime_shift=shift, util=50.0 + shift, at=base.at + shift))
            gc.collect()
            garbage = list(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        # The refreshes did draw: the TIME of the first holder moved on (1000 s + 11 = 16:51).
        assert await wait_until(pilot, lambda: "16:51" in screen_text(app))
    strips = [o for o in garbage if isinstance(o, Strip)]
    assert not strips, f"{len(strips)} strips freed only by the cyclic GC"
    assert len(garbage) < 50, sorted({type(o).__qualname__ for o in garbage})
    assert gc.get_threshold() == before
