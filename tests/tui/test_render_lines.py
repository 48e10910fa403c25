"""ProcessTree renders its lines itself (cheaper than Tree's); each line must equal what Tree would draw."""

from __future__ import annotations

import pytest
from textual.widgets import Tree

from gputop.tui.process_tree import ProcessTree
from tests.tui.helpers import run_async, wait_until
from tests.tui.test_snapshots import make_app


def _segments(strip) -> list[tuple]:
    """Text, style and click metadata of every segment. Where Tree marks a label {"node": id}, ProcessTree
    marks it {"label": True} (a style per node id made new styles for every new row under churn, kept in
    Textual's style caches: issue 33; a click is handled by "line"): both read as one mark here."""
    out = []
    for seg in strip:
        style = seg.style
        meta = {("label" if k == "node" else k): (True if k == "node" else v)
                for k, v in (style.meta if style is not None else {}).items()}
        out.append((seg.text, style.clear_meta_and_links() if style is not None else None, meta, seg.control))
    return out


def _lines_differing(tree: ProcessTree) -> list[int]:
    style, width = tree.rich_style, tree.size.width
    bad = []
    for y in range(tree.last_line + 1):
        tree._line_cache.clear()  # Tree's own (its rendering is the reference here)
        theirs = _segments(Tree._render_line(tree, y, 0, width, style))
        tree.lines.clear()
        ours = _segments(tree.lines.line(y, width, style).crop(0, width))
        if theirs != ours:  # text, colours, attributes and the click metadata of every segment
            bad.append(y)
    return bad


@pytest.mark.parametrize("size", [(150, 40), (80, 24)])
@run_async
async def test_every_line_matches_what_tree_would_draw(size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        assert await wait_until(pilot, lambda: app.snapshot is not None)
        await pilot.pause()
        tree = app.query_one(ProcessTree)
        assert tree.last_line + 1 > 5
        assert _lines_differing(tree) == []
        for keys in (["down", "down", "down"], ["space"], ["left"], ["tab"]):  # cursor, tag, collapse, blur
            for k in keys:
                await pilot.press(k)
            await pilot.pause()
            assert _lines_differing(tree) == [], keys
        # The mouse over a row (Tree marks the node under it; ProcessTree reads hover_line), then focus.
        for offset in ((12, 4), (12, 2), (12, 0)):  # a holder, its parent, a GPU group (all its guides)
            await pilot.hover(ProcessTree, offset=offset)
            await pilot.pause()
            assert tree.hover_line >= 0
            assert _lines_differing(tree) == [], offset
        tree.focus()
        await pilot.pause()
        assert _lines_differing(tree) == [], "focused, hovered"


def _screen(app) -> list[str]:
    return [repr(list(s)) for s in app.screen._compositor.render_strips()]


@pytest.mark.parametrize("size", [(150, 40), (80, 24), (60, 15)])
@run_async
async def test_device_board_and_top_bar_draw_what_textual_would(size, monkeypatch):
    """DeviceBoard and TextBar draw their lines themselves; every segment (text, colours, attributes,
    selection offsets) must equal Textual's own rendering of the same Text, in the two-line and one-line
    layouts of the board, and for a top bar that fits and one cut at the right (at 60 columns)."""
    from textual.widget import Widget

    from gputop.tui.bar import TextBar
    from gputop.tui.device_pane import DeviceBoard

    screens = []
    for theirs in (False, True):
        if theirs:
            monkeypatch.setattr(DeviceBoard, "render_line", Widget.render_line)
            monkeypatch.setattr(TextBar, "render_line", Widget.render_line)
        app = make_app()
        async with app.run_test(size=size) as pilot:
            assert await wait_until(pilot, lambda: app.snapshot is not None)
            await pilot.pause()
            assert app.query_one(DeviceBoard)._lines
            screens.append(_screen(app))
            await pilot.press("slash", "x", "enter")  # the top bar says so (wider: at 60 columns it is cut)
            assert await wait_until(pilot, lambda: app.view.filter_text == "x" and app.focused is app.process_tree
                                    and not app.query_one("#filter").display)
            await pilot.pause(0.2)
            screens.append(_screen(app))
    assert screens[:2] == screens[2:]
