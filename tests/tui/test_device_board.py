"""The device board repaints only the lines that changed and keeps a Strip per line: after every kind of
change (a value, a LOST device, N/A fields, fewer or more GPUs, one-line layout, no GPU, a theme), what
it shows must be exactly what a full redraw shows."""

from __future__ import annotations

import dataclasses

from gputop.tui.device_pane import DeviceBoard

from .helpers import frozen_app, run_async, screen_text, switch_snapshot, wait_until
from .test_offscreen_rows import big_snapshot


def _screen(app) -> list[str]:
    return [repr(list(s)) for s in app.screen._compositor.render_strips()]


async def _full_redraw(pilot, board: DeviceBoard) -> list[str]:
    board._strips.clear()
    board._built_for = (0, 0)
    board.refresh()
    await pilot.pause()
    return _screen(pilot.app)


def _devices(snap, changes=None):
    """The snapshot with device i changed as changes[i] says (a dict of fields), one second later."""
    changes = changes or {}
    devs = [dataclasses.replace(d, **changes.get(d.index, {})) for d in snap.devices]
    return dataclasses.replace(snap, devices=tuple(devs), at=snap.at + 1)


@run_async
async def test_the_board_shows_what_a_full_redraw_shows_after_each_change():
    base = big_snapshot(util=50.0)
    async with frozen_app(base) as (app, pilot, sampler):
        assert await wait_until(pilot, lambda: " 50%" in screen_text(app))
        board = app.query_one(DeviceBoard)
        steps = [
            _devices(base, {3: {"util_gpu": 97.0, "temperature": 81}}),
            _devices(base, {5: {"lost": True, "errors": ("GPU is lost",)}}),
            _devices(base, {2: {"errors": ("fan: not supported",), "fan_pct": None, "power_w": None}}),
            dataclasses.replace(base, devices=base.devices[:3]),
            dataclasses.replace(base, devices=tuple(
                dataclasses.replace(d, index=i) for i, d in enumerate(base.devices * 2))),  # one line each
            dataclasses.replace(base, devices=base.devices[:2]),
            dataclasses.replace(base, devices=()),
            _devices(base, {0: {"name": "evil\x1b]0;owned\x07gpu", "util_gpu": 10.0}}),
        ]
        for i, snap in enumerate(steps):
            await switch_snapshot(pilot, app, sampler, snap)
            shown = _screen(app)
            assert shown == await _full_redraw(pilot, board), f"step {i}"
            assert ("no GPU found" in screen_text(app)) == (not snap.devices), f"step {i}"
        text = screen_text(app)
        assert "\x1b" not in text and "evil\\x1b]0;owned\\x07gpu" in text
        app.theme = "textual-light" if app.theme != "textual-light" else "nord"
        await pilot.pause()
        assert _screen(app) == await _full_redraw(pilot, board), "theme"


@run_async
async def test_a_changed_line_is_repainted_and_an_unchanged_one_is_not():
    base = big_snapshot(util=50.0)
    async with frozen_app(base, size=(120, 50)) as (app, pilot, sampler):
        assert await wait_until(pilot, lambda: " 50%" in screen_text(app))
        await switch_snapshot(pilot, app, sampler, _devices(base))  # the history strips settle
        board = app.query_one(DeviceBoard)
        painted = []
        real = board.refresh
        board.refresh = lambda *regions, **kw: (painted.extend(regions), real(*regions, **kw))[1]
        await switch_snapshot(pilot, app, sampler, _devices(_devices(base), {3: {"temperature": 81}}))
        # Two lines per GPU: the second (the history strips) gains a point; of the first lines only GPU 3's.
        assert sorted(r.y for r in painted) == [1, 3, 5, 6, 7, 9, 11, 13, 15]
