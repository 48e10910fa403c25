"""Every key the help screen lists, pressed, with its effect asserted (issue 14: keys that did nothing).

The frozen sampler gives fixed rows; the actions that need live processes (kill, reap, reset) are tested
end to end in test_flows.py and test_e2e_tmux.py: here the key must open their dialog."""

from __future__ import annotations

import pytest

from gputop.tui.app import GputopApp
from gputop.tui.keymap import KEYS, PLOT_KEYS
from gputop.tui.process_tree import ProcessTree
from tests.tui.helpers import FakeSampler, frozen_panel, run_async, screen_text, wait_screen, wait_until


class CountingSampler(FakeSampler):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def sample(self):
        self.calls += 1
        return super().sample()


def make_app() -> GputopApp:
    return GputopApp(CountingSampler(), interval=3600, panel_source=frozen_panel)


async def started(pilot):
    assert await wait_until(pilot, lambda: pilot.app.snapshot is not None)
    await pilot.pause(0.1)
    return pilot.app.query_one(ProcessTree)


async def screen_is(pilot, name: str) -> bool:
    return await wait_screen(pilot, name)  # on top and focused


async def close_to_main(pilot):
    await pilot.press("escape")
    assert await screen_is(pilot, "MainScreen")


# ---- one checker per action: press ``key`` on the main screen, assert what it did -----------------

async def check_help(pilot, key):
    await pilot.press(key)
    assert await screen_is(pilot, "HelpScreen")
    await close_to_main(pilot)


async def check_filter(pilot, key):
    await pilot.press(key)
    box = pilot.app.query_one("#filter")
    assert box.display and box.has_focus
    await pilot.press(*"xmrig")
    tree = pilot.app.query_one(ProcessTree)
    assert await wait_until(pilot, lambda: "gpu0/1101" not in tree.nodes_by_key and "gpu3/3200" in tree.nodes_by_key)
    await pilot.press("escape")  # clears
    assert await wait_until(pilot, lambda: "gpu0/1101" in tree.nodes_by_key and not box.display)


async def check_search(pilot, key):
    tree = pilot.app.query_one(ProcessTree)
    pilot.app.select_key("gpu0")
    await pilot.press(key)
    box = pilot.app.query_one("#search")
    assert box.display and box.has_focus
    await pilot.press(*"carol")  # pid 3000 is on GPU 2 and GPU 3: two matches
    assert await wait_until(pilot, lambda: tree.cursor_node.data.key == "gpu2/3000")
    await pilot.press("f3")
    assert await wait_until(pilot, lambda: tree.cursor_node.data.key == "gpu3/3000")
    await pilot.press("f3")  # the next match, wrapping
    assert await wait_until(pilot, lambda: tree.cursor_node.data.key == "gpu2/3000")
    await pilot.press("enter")  # keeps the row, closes the box; the tree is not filtered
    assert not box.display and tree.has_focus and "gpu0/1101" in tree.nodes_by_key
    assert tree.cursor_node.data.key == "gpu2/3000"
    await pilot.press(key)  # F3 again opens the box afresh (escape closes it, leaving the cursor)
    assert box.display and box.value == ""
    await pilot.press("escape")
    assert not box.display and tree.cursor_node.data.key == "gpu2/3000"


async def check_toggle_tag(pilot, key):
    tree = pilot.app.query_one(ProcessTree)
    assert pilot.app.select_key("gpu0/1101")
    await pilot.press(key)
    assert await wait_until(pilot, lambda: tree.tagged == {1101})
    assert "1 tagged" in screen_text(pilot.app)
    assert any(line.lstrip("└├│ ").startswith("* ") or "*    1101" in line or "* " in line.split("1101")[0]
               for line in screen_text(pilot.app).splitlines() if "1101" in line)
    assert pilot.app.select_key("gpu1/1102")
    await pilot.press(key)
    assert await wait_until(pilot, lambda: tree.tagged == {1101, 1102})
    assert "2 tagged" in screen_text(pilot.app)
    assert pilot.app.select_key("gpu1/1102")
    await pilot.press(key)  # again: untags
    assert await wait_until(pilot, lambda: tree.tagged == {1101})


async def check_untag_all(pilot, key):
    tree = pilot.app.query_one(ProcessTree)
    tree.tagged.update({1101, 1102})
    await pilot.press(key)
    assert await wait_until(pilot, lambda: not tree.tagged)
    assert "tagged" not in screen_text(pilot.app).splitlines()[0]


async def check_kill(pilot, key):
    assert pilot.app.select_key("gpu0/1101")
    await pilot.press(key)
    assert await screen_is(pilot, "KillDialog")
    assert pilot.app.screen.focused.id == "cancel"
    await close_to_main(pilot)


async def check_reap(pilot, key):
    # pid 2000 of the frozen snapshot does not exist: the key re-reads the live tree and says so.
    assert pilot.app.select_key("gpu2/2001")
    await pilot.press(key)
    assert await wait_until(pilot, lambda: any("orphan tree 2000" in n.message for n in pilot.app._notifications)
                            or type(pilot.app.screen).__name__ == "ReapDialog")
    if type(pilot.app.screen).__name__ == "ReapDialog":
        await close_to_main(pilot)


async def check_reset(pilot, key):
    assert pilot.app.select_key("gpu1")
    await pilot.press(key)
    assert await screen_is(pilot, "ResetDialog")
    await close_to_main(pilot)


async def check_guard(pilot, key):
    await pilot.press(key)
    assert await screen_is(pilot, "GuardToggleDialog")
    assert pilot.app.screen.target == "enforce"  # the frozen panel says dry-run
    await close_to_main(pilot)


async def check_details(pilot, key):
    assert pilot.app.select_key("gpu2/2001")
    await pilot.press(key)
    assert await screen_is(pilot, "DetailsScreen")
    await close_to_main(pilot)


async def check_grouping(pilot, key):
    assert pilot.app.view.grouping == "gpu"
    await pilot.press(key)
    tree = pilot.app.query_one(ProcessTree)
    assert await wait_until(pilot, lambda: pilot.app.view.grouping == "root" and "root2000" in tree.nodes_by_key)
    await pilot.press(key)
    assert await wait_until(pilot, lambda: pilot.app.view.grouping == "gpu" and "gpu0" in tree.nodes_by_key)


async def check_sort(pilot, key):
    assert pilot.app.view.sort_key == "gpu-mem"
    await pilot.press(key)
    assert pilot.app.view.sort_key == "sm"
    assert await wait_until(pilot, lambda: "SM%▼" in screen_text(pilot.app))


async def check_sort_reverse(pilot, key):
    await pilot.press(key)
    assert pilot.app.view.sort_reverse
    assert await wait_until(pilot, lambda: "GPU-MEM▲" in screen_text(pilot.app))


async def check_plot(pilot, key):
    assert pilot.app.select_key("gpu1/1102")
    await pilot.press(key)
    assert await screen_is(pilot, "PlotScreen")
    assert pilot.app.screen.index == 1
    await close_to_main(pilot)


async def check_panel(pilot, key):
    side = pilot.app.query_one("#side")
    shown = side.display
    await pilot.press(key)
    assert await wait_until(pilot, lambda: side.display != shown)


async def check_refresh(pilot, key):
    sampler = pilot.app.sampler.inner
    before = sampler.calls
    await pilot.press(key)
    assert await wait_until(pilot, lambda: sampler.calls > before, timeout=5)


async def check_quit(pilot, key):
    await pilot.press(key)
    assert await wait_until(pilot, lambda: not pilot.app.is_running)


CHECKS = {
    "help": check_help, "filter": check_filter, "search": check_search, "toggle_tag": check_toggle_tag,
    "untag_all": check_untag_all, "kill": check_kill, "reap": check_reap, "reset": check_reset,
    "guard": check_guard, "details": check_details, "grouping": check_grouping, "sort": check_sort,
    "sort_reverse": check_sort_reverse, "plot": check_plot, "panel": check_panel, "refresh": check_refresh,
    "quit": check_quit,
}
PRESSES = [(k.action, key) for k in KEYS for key in k.key.split(",")]


def test_every_main_key_has_a_check():
    assert {a for a, _ in PRESSES} == set(CHECKS)
    assert {"f1", "f3", "f4", "f5", "f6", "f9", "f10", "space"} <= {key for _, key in PRESSES}


@pytest.mark.parametrize("action,key", PRESSES, ids=[f"{a}-{k}" for a, k in PRESSES])
@run_async
async def test_main_key(action, key):
    app = make_app()
    async with app.run_test(size=(100, 40)) as pilot:
        await started(pilot)
        await CHECKS[action](pilot, key)


@run_async
async def test_left_and_right_collapse_and_expand_a_branch():
    app = make_app()
    async with app.run_test(size=(100, 40)) as pilot:
        tree = await started(pilot)
        assert app.select_key("gpu0/1100")  # the launcher: a branch with the worker under it
        await pilot.press("left")
        assert not tree.nodes_by_key["gpu0/1100"].is_expanded
        await pilot.press("right")
        assert tree.nodes_by_key["gpu0/1100"].is_expanded
        await pilot.press("right")  # on an expanded branch: to its first child
        assert tree.cursor_node.data.key == "gpu0/1101"
        await pilot.press("left")  # on a leaf: to its parent
        assert tree.cursor_node.data.key == "gpu0/1100"
        await pilot.press("down", "down")
        assert tree.cursor_node.data.key == "gpu1"
        await pilot.press("up")
        assert tree.cursor_node.data.key == "gpu0/1101"
        await pilot.press("enter")  # enter still toggles (on a leaf: nothing), space does not
        assert tree.nodes_by_key["gpu0/1100"].is_expanded


@run_async
async def test_plot_keys():
    app = make_app()
    async with app.run_test(size=(100, 40)) as pilot:
        await started(pilot)
        assert app.select_key("gpu0/1101")
        checked = set()
        for k in PLOT_KEYS:
            for key in k.key.split(","):
                await pilot.press("p")
                assert await screen_is(pilot, "PlotScreen")
                plot = app.screen
                index, rng = plot.index, plot.range_i
                await pilot.press(key)
                if k.action == "close":
                    assert await screen_is(pilot, "MainScreen"), key
                    continue
                if k.action == "next_gpu":
                    assert plot.index == 1
                elif k.action == "prev_gpu":
                    assert plot.index == 3  # wraps from 0 to the last GPU
                elif k.action == "zoom_out":
                    assert plot.range_i == rng + 1
                elif k.action == "zoom_in":
                    await pilot.press("minus", key)
                    assert plot.range_i == rng
                checked.add(key)
                await pilot.press("escape")
                assert await screen_is(pilot, "MainScreen")
        assert {"left", "right", "minus", "plus", "equals_sign"} <= checked


@run_async
async def test_help_scrolls_to_the_legend_by_keyboard_at_80x24():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await started(pilot)
        await pilot.press("question_mark")
        assert await screen_is(pilot, "HelpScreen")
        await pilot.pause(0.1)
        body = app.screen.query_one("#help-body")
        assert body.max_scroll_y > 0 and "subreaper" not in screen_text(app)  # the legend is below the fold
        await pilot.press("down")
        assert await wait_until(pilot, lambda: body.scroll_y == 1)
        await pilot.press("pagedown", "pagedown", "pagedown", "end")
        assert await wait_until(pilot, lambda: body.scroll_y == body.max_scroll_y)
        assert "subreaper" in screen_text(app)  # the colour legend's explanations, reached without tab
        await pilot.press("home")
        assert await wait_until(pilot, lambda: body.scroll_y == 0)


@run_async
async def test_help_shows_readable_key_names():
    app = make_app()
    async with app.run_test(size=(120, 60)) as pilot:
        await started(pilot)
        await pilot.press("f1")
        assert await screen_is(pilot, "HelpScreen")
        await pilot.pause(0.1)
        text = screen_text(app)
        assert "plus" not in text and "equals_sign" not in text and "question_mark" not in text
        for name in ("F1", "F3", "F4", "F5", "F6", "F9", "F10", "space", "+", "-", "← →"):
            assert name in text, name


@run_async
async def test_too_small_wins_over_a_dialog_and_q_quits():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await started(pilot)
        await pilot.press("g")
        assert await screen_is(pilot, "GuardToggleDialog")
        await pilot.resize_terminal(50, 12)
        assert await screen_is(pilot, "TooSmallScreen")
        assert "Terminal too small: 50x12" in screen_text(app)
        await pilot.resize_terminal(80, 24)  # back: the dialog is there again
        assert await screen_is(pilot, "GuardToggleDialog")
        await pilot.resize_terminal(50, 12)
        assert await screen_is(pilot, "TooSmallScreen")
        await pilot.press("q")
        assert await wait_until(pilot, lambda: not app.is_running)


@run_async
async def test_theme_is_remembered_across_runs():
    from gputop.tui import prefs

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await started(pilot)
        assert app.theme != "nord"
        app.theme = "nord"  # what picking it in the command palette does
        assert await wait_until(pilot, lambda: prefs.load().get("theme") == "nord")
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await started(pilot)
        assert app.theme == "nord"
