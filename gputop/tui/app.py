"""The gputop Textual app: device panes, the process tree, the side panel, and keyboard actions.

Threads: one long-lived thread worker samples (started in on_ready) and posts SnapshotReady messages that
replace stale ones; actions run in their own thread workers through gputop.actions (face "tui"). No
handler blocks: a handler only reads the latest snapshot, updates widgets, or starts a worker.
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Iterable

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from gputop.core.config import Config
from gputop.core.orphans import ORPHAN
from gputop.util.textsafe import visible
from gputop.core.model import Snapshot
from gputop.tui import keymap, process_tree
from gputop.tui.bar import TextBar
from gputop.tui.device_pane import DeviceBoard
from gputop.tui.history import DeviceHistory
from gputop.tui.legend import legend_text
from gputop.tui.process_tree import ColumnHeader, ProcessTree, column_level, header_text, use_palette
from gputop.tui.rows import GROUP_GPU, GROUP_JOB, GROUP_ROOT, SORT_ORDER, build, max_depth

GROUP_NAMES = {GROUP_GPU: "GPU", GROUP_ROOT: "orphan root", GROUP_JOB: "Slurm job"}
from gputop.tui.side_panel import PanelData, SidePanel

from gputop.tui.first_frame import MIN_HEIGHT, MIN_WIDTH  # noqa: E402 - one limit for both frames
_MAIN_ACTIONS = frozenset(k.action for k in keymap.KEYS)
FILTER_PLACEHOLDER = "filter: pid, user, name or command (enter keeps, esc clears)"
SIDE_PANEL_MIN_WIDTH = 120  # below this the side panel starts hidden (b shows it)

# The cyclic GC's first threshold while the app runs (Python's default is 700). A refresh allocates and
# frees a few thousand objects, so at 700 a young-generation collection ran almost every second (28 a
# minute at 16 holders, ~2% of the TUI's instructions) and found nothing to free: steady refreshes make no
# reference cycles (tests/tui/test_gc.py). Cycles made elsewhere are still collected, every 10,000 net
# allocations instead of 700. Restored when the app unmounts.
GC_GEN0 = 10_000


def css_path() -> Path:
    """The stylesheet: shipped in the package (gputop/styles), which in the source tree links to styles/."""
    here = Path(__file__).resolve().parent
    for p in (here.parent / "styles" / "gputop.tcss", here.parent.parent / "styles" / "gputop.tcss"):
        if p.is_file():
            return p
    raise FileNotFoundError("gputop.tcss not found: reinstall gputop (pip install gputop)")


class LockedSampler:
    """One sampler shared by the sampling thread and the action threads, one call at a time."""

    def __init__(self, sampler):
        self._s = sampler
        self._lock = threading.Lock()

    def sample(self) -> Snapshot:
        with self._lock:
            return self._s.sample()

    def sample_devices(self) -> tuple:
        with self._lock:
            return self._s.sample_devices()

    def reset(self, index: int) -> str:
        with self._lock:
            return self._s.reset(index)

    def close(self) -> None:
        with self._lock:
            self._s.close()

    def __getattr__(self, name):
        return getattr(self._s, name)


class SnapshotReady(Message):
    """A new snapshot (plus side-panel data); replaces any older one still queued."""

    def __init__(self, snapshot: Snapshot, panel: PanelData):
        super().__init__()
        self.snapshot = snapshot
        self.panel = panel

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotReady)


class DevicesReady(Message):
    """The devices alone, read before the first full sample (see GputopApp._sample_devices_first)."""

    def __init__(self, devices: tuple):
        super().__init__()
        self.devices = devices


class SampleFailed(Message):
    def __init__(self, error: str):
        super().__init__()
        self.error = error

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SampleFailed)


class PanelSource:
    """Guard state and audit findings for the side panel, read in the sampling thread (never the UI
    thread). An engine that is not installed is reported as such; the audit keeps its history between
    samples, so that its sustained rules (e.g. a hashing profile held for a minute) can fire."""

    # The audit reads every holder's executable, fds and the TCP table: run it when the set of holders
    # changes, and otherwise at most this often (findings are about processes, not about one second).
    AUDIT_EVERY = 5.0

    GUARD_EVERY = 10.0  # the guard files are read again at least this often, changed or not

    def __init__(self):
        self._guard_key: tuple | None = None
        self._guard_at = float("-inf")
        self._guard: tuple = ("off", (), None)
        self._rogue_history = None
        self._audit_key: tuple | None = None
        self._audit_at = float("-inf")
        self._findings: tuple = ()

    def __call__(self, snapshot: Snapshot, config: Config) -> PanelData:
        guard_ok, mode, gerr, hits, daemon, policy = False, None, None, (), None, None
        try:
            from gputop.guard import state as guard_state
        except Exception:
            guard_state = None
        if guard_state is not None:
            guard_ok = True
            try:
                mode, hits, policy = self._guard_files(guard_state, config)
                d = guard_state.daemon_status()  # what `gputop guard status` says: is one running?
                daemon = {"alive": bool(d.get("alive")), "pid": d.get("pid"),
                          "policy_file": d.get("policy_file"), "mode": d.get("mode")}
            except Exception as e:
                self._guard_key = None
                gerr = f"cannot read guard state: {e}"
        audit_ok, aerr, findings = False, None, ()
        try:
            from gputop.core import rogue
        except Exception:
            rogue = None
        if rogue is not None and hasattr(rogue, "audit"):
            audit_ok = True
            try:
                if self._rogue_history is None and hasattr(rogue, "History"):
                    self._rogue_history = rogue.History()
                key = tuple(sorted((h.pid, h.start_time) for h in snapshot.holders))
                now = time.monotonic()
                if key != self._audit_key or now - self._audit_at >= self.AUDIT_EVERY:
                    self._findings = tuple(rogue.audit(snapshot, config, history=self._rogue_history))
                    self._audit_key, self._audit_at = key, now
                findings = self._findings
            except Exception as e:
                aerr = f"audit failed: {e}"
        return PanelData(guard_ok, mode, gerr, hits, audit_ok, aerr, findings, daemon, policy)

    def _guard_files(self, guard_state, config: Config) -> tuple:
        """The guard's mode, recent hits and policy file, read again only when the state or hits file
        changed (a new inode, size or mtime: both are replaced atomically or appended to), or after
        GUARD_EVERY seconds; ``config`` (the app's, --config included) names the policy when the state
        does not. The daemon's liveness is not cached (see __call__)."""
        d = guard_state.guard_dir()
        key = (d, guard_state.file_sig(d / guard_state.STATE_FILE), guard_state.file_sig(d / guard_state.HITS_FILE))
        now = time.monotonic()
        if key != self._guard_key or now - self._guard_at >= self.GUARD_EVERY:
            self._guard = (guard_state.get_mode(), tuple(guard_state.recent_hits(50)),
                           guard_state.get_policy_path(config))
            self._guard_key, self._guard_at = key, now
        return self._guard


# The actions module speaks to the CLI (flags); on this screen the same way out is a button or a key.
_TUI_WORDING = (
    ("use --allow-protected for an explicit manual kill", "press Override in the kill dialog to kill it anyway"),
    ("use --force to send SIGKILL", "kill it again and choose KILL"),
    ("stop them or use --force to kill them first",
     "kill its holders first (k), or choose 'Kill holders and reset' in the reset dialog"),
    ("(sudo gputop reset --gpu", "(run gputop as root; CLI: sudo gputop reset --gpu"),
    ("(gputop reset --gpu", "(kill them with k first; CLI: gputop reset --gpu"),
)


def tui_wording(message: str) -> str:
    for cli, tui in _TUI_WORDING:
        message = message.replace(cli, tui)
    return message


def demo_banner(demo) -> Text:
    """Where the demo's scenario and state live, and how a second shell uses them (env.sh)."""
    t = Text(" demo", style="bold")
    env = getattr(demo, "env_path", None)
    if env is not None:
        t.append(" · from a second shell: ")
        t.append(f". {env}", style="bold")
        t.append("  (its scenario and state dir)")
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


@dataclass(frozen=True)
class Selection:
    pid: int | None
    holder: object | None
    proc: object | None
    gpu: int | None
    root: int | None


class GputopApp(App):
    TITLE = "gputop"
    AUTO_FOCUS = "ProcessTree"
    CSS_PATH = str(css_path())
    BINDINGS = keymap.bindings()
    ENABLE_COMMAND_PALETTE = True

    def __init__(self, sampler, *, config: Config | None = None, interval: float | None = None,
                 readonly: bool = False, demo=None, panel_source=None, devices: tuple | None = None,
                 first_frame: bool = False):
        """``devices``: the devices alone, read before the app starts (launch.run_tui), shown in the first
        frame; without them the sampling thread reads them first (see _sample_devices_first).
        ``first_frame``: gputop.tui.first_frame already put the terminal on the alternate screen."""
        super().__init__(driver_class=_driver_after_first_frame(self) if first_frame else _driver())
        keymap.install_key_characters()
        use_palette(self.no_color)  # App reads NO_COLOR in __init__
        self.sampler = LockedSampler(sampler)
        self.config = config or Config()
        self.interval = float(interval if interval is not None else self.config.interval or 1.0)
        self.readonly = readonly
        self.demo = demo
        self.panel_source = panel_source or PanelSource()
        self.history = DeviceHistory()
        self.snapshot: Snapshot | None = None
        self.panel = PanelData()
        self.panel_shown = PanelData()
        self.grouping = GROUP_GPU
        self.sort_key = "gpu-mem"
        self.sort_reverse = False
        self.filter_text = ""
        self.search_text = ""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._sample_error: str | None = None
        self._panel_user_choice: bool | None = None
        self._devices_only = False  # the device panes are up, the first full sample is not
        self._first_devices = devices or None
        self.took_screen = False  # see _driver_after_first_frame
        self._main: dict | None = None  # the main screen's widgets that every refresh updates (see _parts)
        self._no_gpu: Static | None = None  # the "no GPU" message, while it is shown

    # ---- layout ---------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield TextBar(id="topbar")
        if self.demo is not None:
            yield Static(demo_banner(self.demo), id="demo-banner")
        with VerticalScroll(id="devices"):
            yield DeviceBoard(self.history, id="board")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield ColumnHeader(id="colheader")
                yield ProcessTree(id="tree")
            yield SidePanel(id="side")
        yield Static(legend_text(), id="legend")
        yield Input(placeholder=FILTER_PLACEHOLDER, id="filter")
        yield Input(placeholder="search: pid, user, name or command (F3 next match, enter or esc closes)",
                    id="search")
        yield Footer(compact=True, show_command_palette=False)  # ctrl+p is in the help; 80 columns fit

    def on_mount(self) -> None:
        from gputop.tui import compositor, prefs

        compositor.install(self.default_screen)  # partial updates render only what they repaint

        theme = prefs.load().get("theme")
        if isinstance(theme, str) and theme in self.available_themes and theme != self.theme:
            self.theme = theme
        self.theme_changed_signal.subscribe(self, lambda t: prefs.save(theme=t.name))
        self.query_one("#filter", Input).display = False
        self.query_one("#search", Input).display = False
        self._apply_size()
        if self._first_devices:  # mounted now, they are in the first frame
            self._show_devices_only(self._first_devices)
        self._update_topbar()
        self._update_header()

    def on_ready(self) -> None:
        self._gc_saved = gc.get_threshold()
        gc.set_threshold(max(GC_GEN0, self._gc_saved[0]), *self._gc_saved[1:])
        self._sample_loop()

    def _parts(self) -> dict:
        """The main screen's widgets that every refresh updates, found once: a query walks the DOM, and
        the top bar, panes box, tree, header and side panel are composed once and never replaced."""
        if self._main is None:
            screen = self.default_screen
            self._main = {"topbar": screen.query_one("#topbar", TextBar),
                          "devices": screen.query_one("#devices", VerticalScroll),
                          "board": screen.query_one("#board", DeviceBoard),
                          "tree": screen.query_one(ProcessTree), "header": screen.query_one(ColumnHeader),
                          "side": screen.query_one("#side", SidePanel)}
        return self._main

    def _gone(self) -> bool:
        """The app is shutting down (its widgets already gone): a late sample is dropped."""
        if self._stop.is_set():
            return True
        try:
            return not self._parts()["topbar"].is_attached
        except NoMatches:
            return True

    def on_resize(self, event) -> None:
        # This runs before App._on_resize records the new size: take it from the event.
        self._apply_size(event.size)

    def _apply_size(self, size=None) -> None:
        w, h = size or self.size
        self._too_small(w, h)
        if self._panel_user_choice is None:
            self.query_one("#side", SidePanel).display = w >= SIDE_PANEL_MIN_WIDTH
        tree = self.query_one(ProcessTree)
        compact = column_level(w, self.query_one("#side").display, self.sort_key, self._jobs())
        if compact != tree.compact and self.snapshot is not None:
            self._refresh_tree()
        else:
            tree.compact = compact
        self._update_header()

    def _jobs(self) -> bool:
        """A JOB column only on a Slurm node: when some holder belongs to a job."""
        return self.snapshot is not None and any(h.job is not None for h in self.snapshot.holders)

    def fits(self) -> bool:
        w, h = self.size
        return w >= MIN_WIDTH and h >= MIN_HEIGHT

    def _too_small(self, w: int, h: int) -> None:
        """Cover everything, dialogs included, with the too-small message; uncover when it fits again."""
        from gputop.tui.too_small import TooSmallScreen, message

        small = w < MIN_WIDTH or h < MIN_HEIGHT
        top = self.screen_stack[-1] if self.screen_stack else None
        if small and isinstance(top, TooSmallScreen):
            top.show(message(w, h, MIN_WIDTH, MIN_HEIGHT))
        elif small:
            self.push_screen(TooSmallScreen(message(w, h, MIN_WIDTH, MIN_HEIGHT)))
        elif isinstance(top, TooSmallScreen):
            self.pop_screen()

    def push_screen(self, screen, *args, **kwargs):
        """A dialog opened (from a worker) while the terminal is too small goes under the message."""
        from gputop.tui.too_small import TooSmallScreen

        top = self.screen_stack[-1] if self.screen_stack else None
        result = super().push_screen(screen, *args, **kwargs)
        if isinstance(top, TooSmallScreen) and not isinstance(screen, TooSmallScreen):
            self.call_later(self._apply_size)  # put a message back on top of it
        return result

    # ---- sampling ---------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="sampler", name="sampler")
    def _sample_loop(self) -> None:
        if not self._first_devices:
            self._sample_devices_first()
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                snap = self.sampler.sample()
                panel = self.panel_source(snap, self.config)
                self.post_message(SnapshotReady(snap, panel))
            except Exception as e:  # keep sampling: a transient failure must not freeze the screen
                self.post_message(SampleFailed(f"{type(e).__name__}: {e}"))
            self._wake.wait(max(0.05, self.interval - (time.monotonic() - started)))
            self._wake.clear()

    def _sample_devices_first(self) -> None:
        """The device panes before the first full sample, which reads and classifies every holder (most
        of a second at a thousand holders); the tree stays empty and the top bar says so until then."""
        try:
            devices = self.sampler.sample_devices()
        except Exception:
            return  # the full sample that follows reports the failure
        if devices:
            self.post_message(DevicesReady(devices))

    def on_devices_ready(self, message: "DevicesReady") -> None:
        if self.snapshot is not None:  # the full sample came first: it has the devices too
            return
        self._show_devices_only(message.devices)

    def _show_devices_only(self, devices: tuple) -> None:
        s = self.sampler.statuses
        self._update_devices(Snapshot(at=time.time(), host="", devices=devices, holders=(), roots=(),
                                      backends=tuple(s), warnings=(), platform=""))
        self._devices_only = True
        self._update_topbar()

    def sample_now(self) -> None:
        self._wake.set()

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        if self._gone():
            return  # a sample that arrives while the app shuts down (its widgets already gone)
        snap = message.snapshot
        self.snapshot = snap
        self.panel = message.panel
        self._sample_error = None
        self.history.add(snap)
        self._update_devices(snap)
        self._refresh_tree()
        if message.panel != self.panel_shown:  # its height can change: lay out only when it does
            self.panel_shown = message.panel
            self._parts()["side"].show(message.panel)
        self._update_topbar()
        redraw = getattr(self.screen, "redraw", None)  # the plot screen follows the history
        if callable(redraw):
            redraw()

    def on_sample_failed(self, message: SampleFailed) -> None:
        if self._gone():
            return
        if self._sample_error != message.error:
            self.notify(f"sampling failed: {message.error}", severity="error", timeout=8)
        self._sample_error = message.error
        self._update_topbar()

    def on_unmount(self) -> None:
        self._stop.set()
        self._wake.set()
        saved = self.__dict__.pop("_gc_saved", None)
        if saved is not None:
            gc.set_threshold(*saved)

    # ---- rendering --------------------------------------------------------------------------------

    def _update_devices(self, snap: Snapshot) -> None:
        box = self._parts()["devices"]
        board = self._parts()["board"]
        # Two lines per GPU when they fit in about half the screen, else one line each.
        budget = max(4, (self.size.height - 10) // 2)
        lines = 2 if 2 * len(snap.devices) <= budget else 1
        board.show(snap.devices, lines)
        if not snap.devices:
            if self._no_gpu is None:
                from gputop.backends import no_gpu_message

                self._no_gpu = Static(Text(no_gpu_message(list(snap.backends)), style="yellow"), id="no-gpu")
                box.mount(self._no_gpu)
            lines = 5  # the message above wraps over a few lines at 80 columns
        elif self._no_gpu is not None:  # the GPUs are back
            self._no_gpu.remove()
            self._no_gpu = None
        height = min(max(2, lines * max(1, len(snap.devices))), budget) + 1  # + the border
        if box.styles.height is None or box.styles.height.value != height:
            box.styles.height = height

    def _refresh_tree(self) -> None:
        if self.snapshot is None:
            return
        parts = self._parts()
        tree = parts["tree"]
        groups = build(self.snapshot, grouping=self.grouping, sort=self.sort_key, reverse=self.sort_reverse,
                       filter_text=self.filter_text)
        compact = column_level(self.size.width, parts["side"].display, self.sort_key, self._jobs())
        live = {h.pid for h in self.snapshot.holders}
        tree.tagged &= live
        tree.reconcile(groups, max(1, max_depth(groups) - 1), compact)
        self._update_header()

    def _update_header(self) -> None:
        tree = self._parts()["tree"]
        from gputop.tui.process_tree import GUIDE

        pad = max(0, (tree._max_depth - 1) * GUIDE)
        text = header_text(pad, tree.compact, self.sort_key, self.sort_reverse)
        header = self._parts()["header"]
        if text != getattr(header, "shown", None):
            header.shown = text
            header.update(text, layout=False)

    def _update_topbar(self) -> None:
        s = self.snapshot
        t = Text()
        t.append(" gputop ", style="bold reverse")
        if self.readonly:
            t.append(" READ-ONLY", style="bold reverse")
        if self.demo is not None:
            t.append(" DEMO", style="bold reverse yellow")
        if s is None:
            t.append("  reading processes…" if self._devices_only else "  waiting for the first sample…")
        else:
            t.append(f" {visible(s.host)}  {len(s.devices)} GPU  {len(s.holders)} holder{'s' if len(s.holders) != 1 else ''}  ")
            if s.roots:
                t.append(f"{len(s.roots)} orphan tree{'s' if len(s.roots) != 1 else ''}",
                         style=process_tree.ORPHAN_STYLE)
            else:
                t.append("no orphans")
        # What the user changed comes first: the line is cut at the right on a narrow terminal.
        if self.filter_text:
            t.append("  filter ")
            t.append(Text(repr(self.filter_text), style="bold"))
        tagged = self._parts()["tree"].tagged
        if tagged:
            t.append(f"  {len(tagged)} tagged", style="bold")
        if self.panel.guard_available:
            mode = self.panel.guard_mode or "off"
            t.append("  guard ")
            t.append(mode, style={"enforce": "bold red", "dry-run": "bold yellow"}.get(mode, ""))
        t.append(f"  by {GROUP_NAMES[self.grouping]}")
        if s is not None:
            t.append(f"  {time.strftime('%H:%M:%S', time.localtime(s.at))}")
        if self._sample_error:
            t.append("  sampling failed", style="bold red")
        self._parts()["topbar"].update(t)  # repaints only when it changed

    # ---- selection --------------------------------------------------------------------------------

    def selection(self) -> Selection:
        node = self.query_one(ProcessTree).selected
        if node is None:
            return Selection(None, None, None, None, None)
        holder = node.holder
        if holder is not None and self.snapshot is not None:
            holder = self.snapshot.holder(holder.pid) or holder
        return Selection(node.pid, holder, node.proc, node.gpu, node.root)

    def select_key(self, key: str) -> bool:
        """Put the cursor on the row with this key (e.g. "gpu2/2001"); False if there is none."""
        tree = self.query_one(ProcessTree)
        node = tree.nodes_by_key.get(key)
        if node is None:
            return False
        tree.move_cursor(node)
        tree.cursor_key = key
        return True

    # ---- bindings, help, palette ---------------------------------------------------------------------

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
            yield SystemCommand(f"{k.description} ({k.display})", k.help, partial(self.run_action, k.action))

    def action_help(self) -> None:
        from gputop.tui.help import HelpScreen

        self.push_screen(HelpScreen(self.readonly))

    def action_panel(self) -> None:
        side = self.query_one("#side", SidePanel)
        side.display = not side.display
        self._panel_user_choice = side.display
        self._refresh_tree()

    def action_refresh(self) -> None:
        self.sample_now()

    # ---- view actions ----------------------------------------------------------------------------

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.value = self.filter_text
        box.focus()

    def action_search(self) -> None:
        """F3, as in htop: type to jump to the first matching row; F3 in the box jumps to the next match."""
        box = self.query_one("#search", Input)
        if box.display:  # F3 while typing: the next match
            self._search_next(self.search_text, after_cursor=True)
            return
        box.display = True
        box.value = ""
        box.focus()

    def _search_next(self, text: str, after_cursor: bool) -> bool:
        """Move the cursor to the next row (after the cursor, wrapping) that matches ``text``."""
        from gputop.tui.rows import row_matches

        tree = self.query_one(ProcessTree)
        lines = [line.node for line in tree._tree_lines]
        if not text or not lines:
            return False
        start = tree.cursor_line + 1 if after_cursor else 0
        for i in range(len(lines)):
            node = lines[(start + i) % len(lines)]
            if node.data is not None and row_matches(node.data, text):
                tree.move_cursor(node)
                return True
        return False

    def _close_input(self, box: Input, clear: bool) -> None:
        box.display = False
        if box.id == "filter" and clear:
            box.value = ""
            self.filter_text = ""
            self._refresh_tree()
            self._update_topbar()
        self.query_one(ProcessTree).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "search":
            self.search_text = event.value.strip()
            self._search_next(self.search_text, after_cursor=False)
        elif event.input.id == "filter":
            self.filter_text = event.value.strip()
            self._refresh_tree()
            self._update_topbar()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id in ("filter", "search"):
            self._close_input(event.input, clear=False)

    def on_key(self, event) -> None:
        focused = self.focused
        if not isinstance(focused, Input) or focused.id not in ("filter", "search"):
            return
        if event.key == "escape":
            self._close_input(focused, clear=True)
            event.stop()

    def action_toggle_tag(self) -> None:
        sel = self.selection()
        tree = self.query_one(ProcessTree)
        if sel.holder is None:
            self.notify("Only GPU holders can be tagged (select a process row).", severity="warning")
            return
        if sel.pid in tree.tagged:
            tree.tagged.discard(sel.pid)
        else:
            tree.tagged.add(sel.pid)
        tree.relabel()
        self._update_topbar()
        # move down, as top and nvitop do
        tree.action_cursor_down()

    def action_untag_all(self) -> None:
        tree = self.query_one(ProcessTree)
        tree.tagged.clear()
        tree.relabel()
        self._update_topbar()

    def action_grouping(self) -> None:
        # GPU -> orphan root -> Slurm job (only where a holder is in a job) -> GPU
        jobs = self.snapshot is not None and any(h.job is not None for h in self.snapshot.holders)
        nxt = {GROUP_GPU: GROUP_ROOT, GROUP_ROOT: GROUP_JOB if jobs else GROUP_GPU, GROUP_JOB: GROUP_GPU}
        self.grouping = nxt.get(self.grouping, GROUP_GPU)
        self._refresh_tree()
        self._update_topbar()
        self.notify(f"grouped by {GROUP_NAMES[self.grouping]}", timeout=2)

    def action_sort(self) -> None:
        i = SORT_ORDER.index(self.sort_key)
        self.sort_key = SORT_ORDER[(i + 1) % len(SORT_ORDER)]
        self._refresh_tree()

    def action_sort_reverse(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._refresh_tree()

    def action_details(self) -> None:
        from gputop.tui.details import DetailsScreen

        sel = self.selection()
        if sel.pid is None:
            self.notify("Select a process first.", severity="warning")
            return
        owner = self.snapshot.owner(sel.pid) if self.snapshot is not None else None
        self.push_screen(DetailsScreen(sel.holder, sel.proc, sel.root, owner))

    def _selected_gpu(self) -> int | None:
        sel = self.selection()
        if sel.gpu is not None:
            return sel.gpu
        if sel.holder is not None and sel.holder.gpus:
            return sel.holder.gpus[0]
        if self.snapshot and self.snapshot.devices:
            return self.snapshot.devices[0].index
        return None

    def action_plot(self) -> None:
        from gputop.tui.plot_screen import PlotScreen

        idx = self._selected_gpu()
        if idx is None or self.snapshot is None:
            self.notify("No GPU to plot.", severity="warning")
            return
        names = {d.index: visible(d.name or "") for d in self.snapshot.devices}
        self.push_screen(PlotScreen(self.history, [d.index for d in self.snapshot.devices], idx, names,
                                    lambda: self.snapshot.at if self.snapshot else time.time()))

    # ---- actions on processes, GPUs and the guard -----------------------------------------------------

    def _refuse_readonly(self) -> bool:
        if self.readonly:
            self.notify("read-only: actions are disabled (started with --readonly)", severity="warning")
            return True
        return False

    def action_kill(self) -> None:
        if self._refuse_readonly() or self.snapshot is None:
            return
        tree = self.query_one(ProcessTree)
        holders = [h for h in self.snapshot.holders if h.pid in tree.tagged]
        if not holders:
            sel = self.selection()
            if sel.holder is None:
                self.notify("Select a GPU-holding process to kill (r reaps a whole orphan tree).",
                            severity="warning")
                return
            holders = [sel.holder]
        unknown = [h for h in holders if not h.visible]
        if unknown:
            self.notify(f"pid {unknown[0].pid} is not visible here: it cannot be signalled.", severity="error")
            return
        self._prepare_kill(holders)

    @work(thread=True, group="actions")
    def _prepare_kill(self, holders: list) -> None:
        import psutil

        from gputop.tui.dialogs.kill import KillDialog, KillTarget

        targets = []
        for h in holders:
            kids = None
            try:
                p = psutil.Process(h.pid)
                if h.start_time is not None and abs(p.create_time() - h.start_time) < 0.05:
                    kids = len(p.children(recursive=True))  # only for the process the snapshot saw
            except psutil.Error:
                pass
            targets.append(KillTarget(h.pid, h.start_time, h.user, h.cmd, h.gpu_memory, h.gpus, kids,
                                      h.verdict.kind, h.verdict.reason))
        self.call_from_thread(self.push_screen, KillDialog(targets), partial(self._kill_confirmed, targets))

    def _kill_confirmed(self, targets: list, choice: str | None) -> None:
        if choice is None:
            self.notify("kill cancelled", timeout=2)
            return
        self._do_kill(targets, choice)

    @work(thread=True, group="actions")
    def _do_kill(self, targets: list, signal_name: str) -> None:
        try:
            from gputop import actions
            from gputop.actions import interrupt
        except Exception as e:
            self.call_from_thread(self.notify, f"kill unavailable: {e}", severity="error", timeout=10)
            return
        from gputop.tui.dialogs.kill import OVERRIDE

        override = signal_name == OVERRIDE
        if override:
            signal_name = "KILL"
        # The confirmed list is one action in flight from its first kill to its last: a SIGHUP/SIGTERM to the
        # TUI between two of them does not end the process before the rest (see gputop.tui.launch).
        with interrupt.deferred():
            for t in targets:
                try:
                    r = actions.kill_process(t.pid, expected_start=t.start_time, face="tui",
                                             signal_name=signal_name, timeout=self.config.kill_timeout,
                                             sampler=self.sampler, config=self.config,
                                             allow_protected=override)
                    self._report(r)
                except Exception as e:  # an action must never be swallowed, even a crashing one
                    self._tell(self.notify, f"kill {t.pid} failed: {type(e).__name__}: {e}", severity="error",
                               timeout=10)
        self._tell(self._after_action, {t.pid for t in targets})

    def _report(self, result) -> None:
        sev = "information" if result.ok else "error"
        title = f"{result.action} {'done' if result.ok else 'FAILED'}"
        message = tui_wording(visible(result.message))
        audit_error = (result.details or {}).get("audit_error")
        if audit_error:  # stderr is not visible under the TUI: say it on screen, loudly
            message += f"\nAUDIT LOG NOT WRITTEN: {audit_error}"
            sev = "error"
        self._tell(self.notify, message, title=title, severity=sev, timeout=6 if sev != "error" else 15)

    def _tell(self, callback, *args, **kwargs) -> None:
        """call_from_thread for a kill's or reap's worker, which carries on once the app has exited: a signal
        ends the app while the action finishes its confirmed plan (the audit log has what it did), and an
        outcome nobody can see must not stop the kills that come after it."""
        if not self.is_running:
            return
        try:
            self.call_from_thread(callback, *args, **kwargs)
        except Exception:
            if self.is_running:
                raise

    def _after_action(self, pids: set[int] = frozenset()) -> None:
        tree = self.query_one(ProcessTree)
        tree.tagged -= set(pids)
        tree.relabel()
        self._update_topbar()
        self.sample_now()

    def action_reap(self) -> None:
        if self._refuse_readonly() or self.snapshot is None:
            return
        sel = self.selection()
        root = None
        if sel.holder is not None and sel.holder.verdict.kind == ORPHAN:
            root = sel.holder.verdict.root
        elif sel.root is not None:
            root = sel.root
        if root is None:
            if sel.holder is not None:
                self.notify(f"pid {sel.pid} is not an orphan ({sel.holder.verdict.kind}): nothing to reap. "
                            "k kills one process.", severity="warning")
            else:
                self.notify("Select an orphaned process (marked O) or its tree to reap.", severity="warning")
            return
        self._prepare_reap(self.snapshot, root)

    @work(thread=True, group="actions")
    def _prepare_reap(self, snapshot: Snapshot, root: int) -> None:
        from gputop.tui.dialogs.reap import ReapDialog

        try:
            from gputop import actions

            trees = [t for t in actions.orphan_trees(snapshot, config=self.config, sampler=self.sampler) if t.root.pid == root]
        except Exception as e:
            self.call_from_thread(self.notify, f"reap unavailable: {type(e).__name__}: {e}", severity="error",
                                  timeout=10)
            return
        if not trees:
            self.call_from_thread(self.notify, f"orphan tree {root} is gone or changed; nothing to reap.",
                                  severity="warning")
            self.sample_now()
            return
        self.call_from_thread(self.push_screen, ReapDialog(trees[0]), partial(self._reap_confirmed, trees[0]))

    def _reap_confirmed(self, tree, choice: str | None) -> None:
        if choice is None:
            self.notify("reap cancelled", timeout=2)
            return
        self._do_reap(tree)

    @work(thread=True, group="actions")
    def _do_reap(self, tree) -> None:
        from gputop import actions

        try:
            r = actions.reap_tree(tree.root.pid, expected_start=tree.root.start_time, face="tui",
                                  sampler=self.sampler, config=self.config)
            self._report(r)
        except Exception as e:
            self._tell(self.notify, f"reap {tree.root.pid} failed: {type(e).__name__}: {e}", severity="error",
                       timeout=15)
        self._tell(self._after_action, set(tree.holders))

    def action_reset(self) -> None:
        if self._refuse_readonly() or self.snapshot is None:
            return
        from gputop.tui.dialogs.reset import ResetDialog

        idx = self._selected_gpu()
        if idx is None:
            self.notify("No GPU to reset.", severity="warning")
            return
        dev = self.snapshot.device(idx)
        from gputop.util.errors import GputopError

        locate = getattr(self.sampler, "locate", None)  # the test doubles of the sampler have none
        try:
            backend = locate(idx)[0] if locate is not None else None
        except GputopError:  # a GPU that went away: the reset itself will say so
            backend = None
        self.push_screen(ResetDialog(idx, dev.name if dev else None, self.snapshot.holders_on(idx), backend),
                         partial(self._reset_confirmed, idx))

    def _reset_confirmed(self, index: int, choice: str | None) -> None:
        if choice is None:
            self.notify("reset cancelled", timeout=2)
            return
        from gputop.tui.dialogs.reset import FORCE

        self._do_reset(index, choice == FORCE)

    @work(thread=True, group="actions")
    def _do_reset(self, index: int, force: bool = False) -> None:
        try:
            from gputop import actions

            r = actions.reset_gpu(index, face="tui", force=force, sampler=self.sampler, config=self.config)
            self._report(r)
        except Exception as e:
            self.call_from_thread(self.notify, f"reset GPU {index} failed: {type(e).__name__}: {e}",
                                  severity="error", timeout=15)
        self.call_from_thread(self._after_action, set())

    def action_guard(self) -> None:
        if self._refuse_readonly():
            return
        try:
            from gputop.guard import state as guard_state
        except Exception:
            self.notify("The guard engine is not installed in this gputop.", severity="error")
            return
        from gputop.tui.dialogs.guard_toggle import GuardToggleDialog

        modes = guard_state.MODES
        current = self.panel.guard_mode if self.panel.guard_mode in modes else "off"
        target = modes[(modes.index(current) + 1) % len(modes)]
        self.push_screen(GuardToggleDialog(current, target, self.panel.guard_daemon, self.panel.guard_policy),
                         partial(self._guard_confirmed, target))

    def _guard_confirmed(self, target: str, choice: str | None) -> None:
        if choice is None:
            self.notify("guard mode unchanged", timeout=2)
            return
        self._do_guard(target)

    @work(thread=True, group="actions")
    def _do_guard(self, target: str) -> None:
        try:
            from gputop.guard import state as guard_state

            previous = guard_state.set_mode(target, "tui")
            self.call_from_thread(self.notify, f"guard mode {previous} → {target}", title="guard")
        except Exception as e:
            self.call_from_thread(self.notify, f"cannot switch the guard mode: {e}", severity="error",
                                  timeout=15)
        self.call_from_thread(self._after_action, set())
