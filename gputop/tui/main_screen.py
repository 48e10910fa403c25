"""The main screen's keys: every binding of keymap.KEYS, each routed to what does the work (the app's view
state and process tree, the dialogs and screens, the action flows of tui/flows.py).

The screen's widgets are the app's layout (GputopApp.compose mounts them on this screen, the app's
default). Its bindings are active only while it is on top: a dialog or the plot screen has its own.
"""

from __future__ import annotations

import time

from textual.screen import Screen

from gputop.tui import keymap
from gputop.tui.find_box import FindBox
from gputop.tui.side_panel import SidePanel
from gputop.tui.view import GROUP_NAMES
from gputop.util.textsafe import visible


class MainScreen(Screen):
    BINDINGS = keymap.bindings(app_actions=frozenset({"quit"}))

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        return self.app.check_action(action, parameters)  # --readonly, and the keys wait under a dialog

    def action_help(self) -> None:
        from gputop.tui.help import HelpScreen

        self.app.push_screen(HelpScreen(self.app.readonly))

    def action_panel(self) -> None:
        side = self.query_one("#side", SidePanel)
        side.display = not side.display
        self.app.panel_user_choice = side.display
        self.app.refresh_tree()

    def action_refresh(self) -> None:
        self.app.sample_now()

    def action_filter(self) -> None:
        self.query_one("#filter", FindBox).open(self.app.view.filter_text)

    def action_search(self) -> None:
        """F3, as in htop: type to jump to the first matching row; F3 in the box jumps to the next match."""
        box = self.query_one("#search", FindBox)
        if box.display:  # F3 while typing: the next match
            self.app.process_tree.find(self.app.view.search_text, after_cursor=True)
        else:
            box.open()

    def action_toggle_tag(self) -> None:
        self.app.process_tree.action_toggle_tag()

    def action_untag_all(self) -> None:
        self.app.process_tree.untag()

    def action_grouping(self) -> None:
        grouping = self.app.view.next_grouping(self.app.snapshot)
        self.app.refresh_tree()
        self.app.update_topbar()
        self.app.notify(f"grouped by {GROUP_NAMES[grouping]}", timeout=2)

    def action_sort(self) -> None:
        self.app.view.next_sort()
        self.app.refresh_tree()

    def action_sort_reverse(self) -> None:
        self.app.view.sort_reverse = not self.app.view.sort_reverse
        self.app.refresh_tree()

    def action_details(self) -> None:
        from gputop.tui.details import DetailsScreen

        app = self.app
        sel = app.selection()
        if sel.pid is None:
            app.notify("Select a process first.", severity="warning")
            return
        snap = app.snapshot
        owner = snap.owner(sel.pid) if snap is not None else None
        standing = snap.allocation.standing(sel.pid) if snap is not None and snap.allocation is not None else None
        app.push_screen(DetailsScreen(sel.holder, sel.proc, sel.root, owner, standing=standing))

    def action_plot(self) -> None:
        from gputop.tui.plot_screen import PlotScreen

        app = self.app
        idx = app.selection().gpu_or_first(app.snapshot)
        if idx is None or app.snapshot is None:
            app.notify("No GPU to plot.", severity="warning")
            return
        names = {d.index: visible(d.name or "") for d in app.snapshot.devices}
        app.push_screen(PlotScreen(app.history, [d.index for d in app.snapshot.devices], idx, names,
                                   lambda: app.snapshot.at if app.snapshot else time.time()))

    # The four flows on processes, GPUs and the guard: tui/flows.py.
    def action_kill(self) -> None:
        self.app.flows.kill()

    def action_reap(self) -> None:
        self.app.flows.reap()

    def action_reset(self) -> None:
        self.app.flows.reset()

    def action_guard(self) -> None:
        self.app.flows.guard()
