"""The gputop Textual app: the layout of the main screen, and the routing of messages.

What the app routes to: tui/sampling.py (the sampling thread, which posts SnapshotReady and DevicesReady),
tui/main_screen.py (the main screen's keys), tui/flows.py (the kill, reap, reset and guard flows: dialog,
then a worker through gputop.actions, face "tui"), tui/view.py (grouping, sort, filter, selection, the top
bar's line), and the widgets (ProcessTree, DevicesBox, SidePanel, FindBox). No handler blocks: a handler
only reads the latest snapshot, updates widgets, or starts a worker.
"""

from __future__ import annotations

from functools import partial
from typing import Iterable

from rich.text import Text
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from gputop.core.config import Config
from gputop.core.ledger import ledger_lines
from gputop.core.model import Snapshot
from gputop.tui import keymap
from gputop.tui.bar import TextBar
from gputop.tui.device_pane import DevicesBox, allocation_texts
from gputop.tui.find_box import FindBox
from gputop.tui.flows import ActionFlows, tui_wording  # noqa: F401 - tui_wording was defined here
from gputop.tui.history import DeviceHistory
from gputop.tui.legend import legend_text
from gputop.tui.process_tree import ColumnHeader, ProcessTree, column_level, use_palette
from gputop.tui.rows import build, max_depth, walk
from gputop.tui.sampling import (DevicesReady, LockedSampler, PanelSource, SampleFailed, SamplingLoop,  # noqa: F401
                                 SnapshotReady)  # PanelSource, LockedSampler were defined here
from gputop.tui.side_panel import PanelData, SidePanel
from gputop.tui.view import Selection, TopBarFacts, ViewState, has_jobs, topbar_text

_MAIN_ACTIONS = frozenset(k.action for k in keymap.KEYS)
FILTER_PLACEHOLDER = "filter: pid, user, name or command (enter keeps, esc clears)"
SEARCH_PLACEHOLDER = "search: pid, user, name or command (F3 next match, enter or esc closes)"
SIDE_PANEL_MIN_WIDTH = 120  # below this the side panel starts hidden (b shows it)

from gputop.tui.gc_tuning import GC_GEN0, raise_gen0, restore as restore_gc  # noqa: E402,F401 - tests read app.GC_GEN0


from gputop.tui.css import css_path  # noqa: E402 - in its own module: the fleet view loads it without the app


def demo_banner(demo) -> Text:
    """Where the demo's scenario and state live, and how a second shell uses them (env.sh)."""
    t = Text(" demo", style="bold")
    env = getattr(demo, "env_path", None)
    if env is not None:
        t.append(" · from a second shell: ")  # 80 columns: the path must not be cut (docs/tui.md: env.sh)
        t.append(f". {env}", style="bold")
    else:
        t.append(f"  scenario: {demo.scenario_path}")
    return t


ALT_SCREEN_ON = "\x1b[?1049h"


def _driver():
    """gputop's driver where Textual would run its LinuxDriver (see gputop.tui.driver), else Textual's."""
    from gputop.tui import first_frame

    if not first_frame.wanted():
        return None
    from gputop.tui.driver import QuietInputDriver

    return QuietInputDriver


def _driver_after_first_frame(app):
    """Textual's terminal driver, for a terminal that first_frame already switched to the alternate screen.

    Switching again would save the cursor a second time, over the one saved on the normal screen (xterm
    saves on every switch), and the shell's prompt would come back at the wrong place after gputop exits;
    some terminals also clear the screen. So the first switch is skipped; the rest of Textual's start, its
    exit (back to the normal screen, cursor restored) and a later suspend and resume (ctrl+z) are its own.
    ``app.took_screen`` says whether the driver took the screen over (launch undoes the frame if not).
    """
    from gputop.tui.driver import QuietInputDriver  # Textual's LinuxDriver, run where first_frame.wanted()

    class AfterFirstFrame(QuietInputDriver):
        _switched = False

        def write(self, data: str) -> None:
            if data == ALT_SCREEN_ON and not self._switched:
                self._switched = app.took_screen = True
                return
            super().write(data)

    return AfterFirstFrame


class GputopApp(App):
    TITLE = "gputop"
    AUTO_FOCUS = "ProcessTree"
    CSS_PATH = str(css_path())
    ENABLE_COMMAND_PALETTE = True
    # Toasts sit over the tree's right-hand columns: short-lived (Textual's default is 5 s; an action's
    # failure stays flows.NOTIFY_ERROR_S), and cleared when a dialog opens, so they never cover its border.
    NOTIFICATION_TIMEOUT = 4

    def __init__(self, sampler, *, config: Config | None = None, interval: float | None = None,
                 readonly: bool = False, demo=None, panel_source=None, devices: tuple | None = None,
                 first_frame: bool = False):
        """``sampler``: a core Sampler (sample, sample_devices, statuses, locate, reset, close).
        ``devices``: the devices alone, read before the app starts (launch.run_tui), shown in the first
        frame; without them the sampling thread reads them first (see SamplingLoop).
        ``first_frame``: gputop.tui.first_frame already put the terminal on the alternate screen."""
        super().__init__(driver_class=_driver_after_first_frame(self) if first_frame else _driver())
        keymap.install_key_characters()
        use_palette(self.no_color)  # App reads NO_COLOR in __init__
        self.sampler = LockedSampler.around(sampler)
        self.config = config or Config()
        self.interval = float(interval if interval is not None else self.config.interval or 1.0)
        self.readonly = readonly
        self.demo = demo
        self.history = DeviceHistory()
        self.snapshot: Snapshot | None = None
        self.panel = PanelData()
        self.panel_shown = PanelData()
        self.view = ViewState()
        self.flows = ActionFlows(self)
        self.sampling = SamplingLoop(self.sampler, panel_source or PanelSource(), self.config, self.interval,
                                     self.post_message)
        self._sample_error: str | None = None
        self.panel_user_choice: bool | None = None  # b pressed: the side panel stays as chosen
        self._devices_only = False  # the device panes are up, the first full sample is not
        self._cursor_placed = False  # the cursor went to the first holder (once; then it is the user's)
        self._first_devices = devices or None
        self.took_screen = False  # see _driver_after_first_frame

    # ---- layout ---------------------------------------------------------------------------------

    def get_default_screen(self) -> Screen:
        """The main screen: the layout below is mounted on it, and it carries the keys (MainScreen)."""
        from gputop.tui.main_screen import MainScreen

        return MainScreen(id="_default")

    def compose(self) -> ComposeResult:
        # The widgets that every refresh updates are kept here: composed once, never replaced.
        self._topbar = TextBar(id="topbar")
        self._devices = DevicesBox(self.history, id="devices")
        self._header = ColumnHeader(id="colheader")
        self.process_tree = ProcessTree(id="tree")
        self._side = SidePanel(id="side")
        self._filter = FindBox(placeholder=FILTER_PLACEHOLDER, id="filter")
        self._search = FindBox(placeholder=SEARCH_PLACEHOLDER, id="search")
        self._filter.display = self._search.display = False
        yield self._topbar
        if self.demo is not None:
            yield Static(demo_banner(self.demo), id="demo-banner")
        yield self._devices
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield self._header
                yield self.process_tree
            yield self._side
        yield Static(legend_text(), id="legend")
        yield self._filter
        yield self._search
        yield Footer(compact=True, show_command_palette=False)  # ctrl+p is in the help; 80 columns fit

    def on_mount(self) -> None:
        from gputop.tui import compositor, prefs

        compositor.install(self.default_screen)  # partial updates render only what they repaint
        theme = prefs.load().get("theme")
        if isinstance(theme, str) and theme in self.available_themes and theme != self.theme:
            self.theme = theme
        self.theme_changed_signal.subscribe(self, lambda t: prefs.save(theme=t.name))
        self._apply_size()
        if self._first_devices:  # mounted now, they are in the first frame
            self.on_devices_ready(DevicesReady(self._first_devices))
        self.update_topbar()

    def on_ready(self) -> None:
        self._gc_saved = raise_gen0()  # gputop.tui.gc_tuning
        self.run_worker(partial(self.sampling.run, devices_first=not self._first_devices), name="sampler",
                        group="sampler", description="sampling", exclusive=True, thread=True)

    def on_unmount(self) -> None:
        self.sampling.stop()
        restore_gc(self.__dict__.pop("_gc_saved", None))

    def _gone(self) -> bool:
        """The app is shutting down (its widgets already gone): a late sample is dropped."""
        return self.sampling.stopped or not self._topbar.is_attached

    def on_resize(self, event) -> None:
        # This runs before App._on_resize records the new size: take it from the event.
        self._apply_size(event.size)

    def _apply_size(self, size=None) -> None:
        from gputop.tui import too_small

        w, h = size or self.size
        too_small.cover(self, w, h)
        if size is not None:  # the top bar leaves out what does not fit this width
            self.call_later(self.update_topbar)
        if self.panel_user_choice is None:
            self._side.display = w >= SIDE_PANEL_MIN_WIDTH
        compact = column_level(w, self._side.display, self.view.sort_key, has_jobs(self.snapshot))
        if compact != self.process_tree.compact and self.snapshot is not None:
            self.refresh_tree()
        else:
            self.process_tree.compact = compact
            self._header.show(self.process_tree.max_depth, compact, self.view.sort_key, self.view.sort_reverse)

    def push_screen(self, screen, *args, **kwargs):
        """A dialog opened (from a worker) while the terminal is too small goes under the message."""
        from gputop.tui.too_small import TooSmallScreen

        top = self.screen_stack[-1] if self.screen_stack else None
        self.clear_notifications()  # a dialog (or the plot, or help) is what is to be read now
        result = super().push_screen(screen, *args, **kwargs)
        if isinstance(top, TooSmallScreen) and not isinstance(screen, TooSmallScreen):
            self.call_later(self._apply_size)  # put a message back on top of it
        return result

    # ---- messages from the sampling thread ---------------------------------------------------------

    def sample_now(self) -> None:
        self.sampling.wake()

    def on_devices_ready(self, message: DevicesReady) -> None:
        """The device panes before the first full sample; the tree fills in with it."""
        if self.snapshot is not None:  # the full sample came first: it has the devices too
            return
        self._devices.show(message.devices, tuple(self.sampler.statuses), self.size.height)
        self._devices_only = True
        self.update_topbar()

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        if self._gone():
            return  # a sample that arrives while the app shuts down (its widgets already gone)
        snap = message.snapshot
        self.snapshot = snap
        self.panel = message.panel
        self._sample_error = None
        self.history.add(snap)
        self._devices.show(snap.devices, snap.backends, self.size.height,
                           allocation_texts(snap.allocation, snap.holders, snap.at), snap.instances,
                           ledger_lines(snap))
        self.refresh_tree()
        if message.panel != self.panel_shown:  # its height can change: lay out only when it does
            self.panel_shown = message.panel
            self._side.show(message.panel)
        self.update_topbar()
        redraw = getattr(self.screen, "redraw", None)  # the plot screen follows the history
        if callable(redraw):
            redraw()

    def on_sample_failed(self, message: SampleFailed) -> None:
        if self._gone():
            return
        if self._sample_error != message.error:
            self.notify(f"sampling failed: {message.error}", severity="error", timeout=8)
        self._sample_error = message.error
        self.update_topbar()

    # ---- drawing the state ----------------------------------------------------------------------

    def refresh_tree(self) -> None:
        if self.snapshot is None:
            return
        tree, view = self.process_tree, self.view
        groups = build(self.snapshot, **view.build_args())
        compact = column_level(self.size.width, self._side.display, view.sort_key, has_jobs(self.snapshot))
        tree.tagged &= {h.pid for h in self.snapshot.holders}
        tree.reconcile(groups, max(1, max_depth(groups) - 1), compact)
        self._header.show(tree.max_depth, tree.compact, view.sort_key, view.sort_reverse)
        if not self._cursor_placed:
            self._place_cursor(groups)

    def _place_cursor(self, groups) -> None:
        """Start on the first holder, not on the first group's header (where d, k and r have nothing to
        act on); only while the cursor is still on the first line, where the tree put it."""
        if self.process_tree.cursor_line > 0:
            self._cursor_placed = True  # the user has moved it
            return
        first = next((n for n in walk(groups) if n.kind == "holder"), None)
        if first is not None:
            self._cursor_placed = self.select_key(first.key)

    def update_topbar(self) -> None:
        facts = TopBarFacts(readonly=self.readonly, demo=self.demo is not None, devices_only=self._devices_only,
                            tagged=len(self.process_tree.tagged), panel=self.panel, sample_error=self._sample_error)
        # TextBar repaints only when the line changed; the width decides what the line leaves out
        self._topbar.update(topbar_text(self.snapshot, self.view, facts, self.size.width))

    def selection(self) -> Selection:
        return Selection.of(self.process_tree.selected, self.snapshot)

    def select_key(self, key: str) -> bool:
        """Put the cursor on the row with this key (e.g. "gpu2/2001"); False if there is none."""
        return self.process_tree.select_key(key)

    # ---- keys, the palette, and the widgets' messages -------------------------------------------------

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if self.readonly and action in keymap.DESTRUCTIVE:
            return False  # hidden from the footer and not runnable
        if action in _MAIN_ACTIONS and len(self.screen_stack) > 1:
            return False  # a dialog or the plot is open: the main screen's keys wait (ctrl+q still quits)
        return True

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for k in keymap.KEYS:
            if self.readonly and k.destructive:
                continue
            if k.action == "quit":
                continue  # the built-in "Quit" command is already there
            yield SystemCommand(f"{k.description} ({k.display})", k.help,
                                partial(self.run_action, k.action, self.default_screen))

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input is self._search:
            self.view.search_text = event.value.strip()
            self.process_tree.find(self.view.search_text, after_cursor=False)
        elif event.input is self._filter:
            self.view.filter_text = event.value.strip()
            self.refresh_tree()
            self.update_topbar()

    def on_find_box_closed(self, event: FindBox.Closed) -> None:
        if event.cleared:
            self.view.filter_text = ""
            self.refresh_tree()
            self.update_topbar()
        self.process_tree.focus()

    def on_process_tree_tags_changed(self, event: ProcessTree.TagsChanged) -> None:
        self.update_topbar()
