"""SpanCompositor renders only the widgets and lines that dirty spans cross; what it writes to the terminal
must be exactly what Textual's own partial update writes, on every frame."""

from __future__ import annotations

from textual._compositor import Compositor

from gputop.tui import compositor as span
from gputop.tui.app import GputopApp

from .helpers import FakeSampler, frozen_panel, run_async, screen_text, switch_snapshot, wait_until
from .test_device_board import _devices
from .test_offscreen_rows import big_snapshot


def test_textual_is_the_one_it_was_written_for():
    assert span.COMPATIBLE  # else the app silently falls back to Textual's update (and this work is lost)


@run_async
async def test_every_partial_update_writes_what_textuals_would(monkeypatch):
    compared = []
    mine = span.SpanCompositor.render_partial_update

    def both(self):
        regions = self._dirty_regions.copy()
        theirs = Compositor.render_partial_update(self)
        self._dirty_regions = regions
        ours = mine(self)
        console = app.console
        compared.append((ours is None) == (theirs is None))
        if ours is not None and theirs is not None:
            compared.append(ours.render_segments(console) == theirs.render_segments(console))
        return ours

    monkeypatch.setattr(span.SpanCompositor, "render_partial_update", both)
    base = big_snapshot(util=50.0)
    sampler = FakeSampler(base)
    app = GputopApp(sampler, interval=30, panel_source=frozen_panel)
    async with app.run_test(size=(160, 45)) as pilot:
        assert await wait_until(pilot, lambda: " 50%" in screen_text(app))
        assert type(app.screen._compositor) is span.SpanCompositor
        snaps = [_devices(base, {3: {"util_gpu": 97.0}}), big_snapshot(runtime_shift=61, at=base.at + 2),
                 _devices(base, {5: {"lost": True}})]
        for snap in snaps:
            await switch_snapshot(pilot, app, sampler, snap)
        for key in ("down", "down", "space", "end", "home", "b", "b", "left", "right", "g", "s"):
            await pilot.press(key)
            await pilot.pause()
    assert len(compared) > 20 and all(compared), compared
