"""``gputop fleet``: one row per node, worst first, refreshed from Prometheus in a worker thread. Sort
(s, S), filter (/), search (F3) as in the node view; enter opens a node (tui/fleet_node.py)."""

from __future__ import annotations

import threading
import time
from operator import attrgetter

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Input, Static

from gputop.fleet.rows import SORTS, NodeRow, filter_rows, matches, sort_rows
from gputop.fleet.source import FleetSource, Frame
from gputop.util.textsafe import visible
from gputop.util.units import fmt_bytes

COLUMNS = ("NODE", "SRC", "GPUS", "UTIL", "MEM", "ORPH", "ORPH-MEM", "HITS", "AGE", "PROBLEMS")
# Rows added to an empty table before the frame is painted (a screenful: the terminal's height, at least
# this); the rest follow in batches once it is on the screen. The table measures every cell it is given
# before it paints (~0.3 ms a row): a screenful first keeps 1,000 nodes' measuring off the first frame.
FIRST_ROWS = 24
BATCH_ROWS = 250
from gputop.tui.gc_tuning import raise_gen0, restore as restore_gc  # noqa: E402


def _num(v) -> str:
    return "-" if v is None else str(v)


def _age(age: float | None) -> str:
    """Coarse, so that 1,000 rows are not redrawn every refresh for a second more (the exact age is in
    --json and in a stale row's problem)."""
    if age is None:
        return "-"
    if age < 60:
        return "<1m"
    return f"{age // 60:.0f}m" if age < 3600 else f"{age // 3600:.0f}h"


def cells(r: NodeRow) -> tuple:
    """One row's cells; names and problems come from the series (anything): never markup, never raw."""
    util = "-" if r.util is None else f"{r.util * 100:.0f}%"
    mem = "-" if r.mem_used is None else f"{fmt_bytes(r.mem_used)}/{fmt_bytes(r.mem_total)}"
    age = _age(r.age)
    problems = "; ".join(r.problems) or "ok"
    style = "bold red" if r.orphans or r.lost or r.stale else ("yellow" if r.problems else "")
    return (Text(visible(r.host), style=style), r.source, _num(r.gpus), util, mem, _num(r.orphans),
            "-" if r.orphan_mem is None else fmt_bytes(r.orphan_mem),
            "-" if r.guard_hits is None else f"{r.guard_hits:.0f}", age, Text(visible(problems), style=style))


# What cells() reads, but the age (coarse there): a refresh moves every row's age and last scrape time, and
# making 1,000 rows' cells again to find them unchanged was most of a refresh's drawing.
_DRAWN = attrgetter("host", "source", "gpus", "util", "mem_used", "mem_total", "orphans", "orphan_mem",
                    "guard_hits", "problems", "lost", "stale")


def drawn_same(a: NodeRow, b: NodeRow) -> bool:
    """Whether two rows draw the same cells."""
    return _DRAWN(a) == _DRAWN(b) and _age(a.age) == _age(b.age)


class FleetApp(App):
    AUTO_FOCUS = "#nodes"
    TITLE = "gputop fleet"
    BINDINGS = [
        Binding("q,f10", "quit", "Quit"),
        Binding("slash,f4", "filter", "Filter"),
        Binding("f3", "search", "Search"),
        Binding("s,f6", "sort", "Sort"),
        Binding("S", "sort_reverse", "Reverse", show=False),
        Binding("enter", "open_node", "Open node"),
        Binding("escape", "clear_filter", "Clear", show=False),
    ]
    CSS = """
    #status { height: 1; width: 1fr; background: $boost; }
    #status.stale { background: $error; color: $text; }
    #find { display: none; height: 3; }
    #find.shown { display: block; }
    #nodes { height: 1fr; }
    """

    def __init__(self, source: FleetSource, refresh: float = 2.0, filter_text: str = "", sort: str = "worst",
                 first=None):
        from gputop.tui.css import css_path

        self.CSS_PATH = str(css_path())
        super().__init__()
        self.source = source
        self.refresh_s = refresh
        self.filter_text = filter_text
        self.sort_key = sort
        self.reverse = False
        self.frame: Frame | None = None
        self.shown: list[NodeRow] = []
        self._cells: list[tuple] = []  # what the table shows (or will, once added) for each row of ``shown``
        self._fill = 0  # a new fill of the table cancels the batches of the one before
        self._find_mode = "filter"
        self._first = first  # the first refresh, started before Textual was imported (fleet/first.py)
        self._next_wait = 0.0  # before the refresh thread's first refresh
        self._halt = threading.Event()
        self._wake_up = threading.Event()

    def compose(self) -> ComposeResult:
        yield Static(Text(f"gputop fleet · {self.source.prom.url} · waiting for the first answer…"), id="status")
        yield Input(placeholder="filter: node name, exporter or problem (esc clears)", id="find")
        table = DataTable(id="nodes", cursor_type="row", zebra_stripes=True)
        table.add_columns(*COLUMNS)
        yield table
        yield Footer()

    def on_mount(self) -> None:
        """The first refresh's rows, when they came while Textual started: in the first paint, not after it."""
        first = self._first
        if first is not None and getattr(first, "ready", None) is not None and first.ready():
            self._first = None
            frame = first.result()
            self.show_frame(frame)
            self._next_wait = max(0.1, self.refresh_s - frame.took)

    def on_ready(self) -> None:
        self._gc_saved = raise_gen0()  # gputop.tui.gc_tuning
        threading.Thread(target=self._refresh_loop, name="fleet-refresh", daemon=True).start()

    def _refresh_loop(self) -> None:
        self._wake_up.wait(self._next_wait)  # 0, or the rest of the period of the frame shown at mount
        self._wake_up.clear()
        while not self._halt.is_set():
            first, self._first = self._first, None
            frame = first.result() if first is not None else self.source.refresh()
            if self._halt.is_set():
                return
            self.call_from_thread(self.show_frame, frame)
            self._wake_up.wait(max(0.1, self.refresh_s - frame.took))  # one refresh every refresh_s
            self._wake_up.clear()

    def on_unmount(self) -> None:
        self._halt.set()
        self._wake_up.set()
        restore_gc(self.__dict__.pop("_gc_saved", None))

    # ---- drawing ---------------------------------------------------------------------------------

    def show_frame(self, frame: Frame) -> None:
        self.frame = frame
        self._status(frame)
        self.redraw()

    def _status(self, frame: Frame) -> None:
        status = self.query_one("#status", Static)
        at = "never" if frame.at is None else time.strftime("%H:%M:%S", time.localtime(frame.at))
        n = len(frame.rows)
        bad = sum(1 for r in frame.rows if r.problems)
        order = self.sort_key + (" (reversed)" if self.reverse else "")
        if frame.error is not None:
            text = f"STALE, data from {at}: {frame.error}"
            status.add_class("stale")
        else:
            text = (f"{visible(self.source.prom.url)} · {n} nodes, {bad} with problems · {frame.queries} queries "
                    f"in {frame.took:.2f}s at {at} · sort: {order}")
            status.remove_class("stale")
        if self.filter_text:
            text += f" · filter: {visible(self.filter_text)}"
        status.update(Text(text), layout=False)  # one line, its size fixed: no layout of the screen

    def redraw(self) -> None:
        if self.frame is None:
            return
        rows = sort_rows(filter_rows(list(self.frame.rows), self.filter_text), self.sort_key, self.reverse)
        table = self.query_one("#nodes", DataTable)
        keys = [r.host for r in rows]
        if keys == [r.host for r in self.shown]:  # same rows, same order: update the cells that changed
            drawn = self._cells
            for i, (old, new) in enumerate(zip(self.shown, rows)):
                if not drawn_same(old, new):
                    fresh = cells(new)
                    if i < table.row_count:  # else not added yet: _add_rest adds the fresh cells
                        for col, (a, b) in enumerate(zip(drawn[i], fresh)):
                            if a != b:
                                table.update_cell_at((i, col), b)
                    drawn[i] = fresh
        else:
            cursor = self.shown[table.cursor_row].host if self.shown and table.cursor_row < len(self.shown) else None
            self._cells = [cells(r) for r in rows]
            table.clear()
            self._fill += 1
            target = keys.index(cursor) if cursor in keys else 0
            start = min(len(rows), max(FIRST_ROWS, self.size.height, target + table.size.height + 1))
            table.add_rows(self._cells[:start])
            if target:
                table.move_cursor(row=target)
            if start < len(rows):
                self.call_after_refresh(self._add_rest, self._fill, start)
        self.shown = rows

    def _add_rest(self, fill: int, start: int) -> None:
        """The rows after the first screenful, a batch after each paint (keys stay answered)."""
        if fill != self._fill:  # the table was filled again since
            return
        table = self.query_one("#nodes", DataTable)
        end = min(len(self._cells), start + BATCH_ROWS)
        table.add_rows(self._cells[start:end])
        if end < len(self._cells):
            self.call_after_refresh(self._add_rest, fill, end)

    def _add_all(self) -> None:
        """Every row in the table now (a search jumps to any of them)."""
        table = self.query_one("#nodes", DataTable)
        if table.row_count < len(self._cells):
            self._fill += 1
            table.add_rows(self._cells[table.row_count:])

    # ---- keys --------------------------------------------------------------------------------------

    def action_sort(self) -> None:
        names = list(SORTS)
        self.sort_key = names[(names.index(self.sort_key) + 1) % len(names)]
        self._after_change()

    def action_sort_reverse(self) -> None:
        self.reverse = not self.reverse
        self._after_change()

    def _after_change(self) -> None:
        self.redraw()
        if self.frame is not None:
            self._status(self.frame)

    def action_filter(self) -> None:
        self._open_find("filter", self.filter_text)

    def action_search(self) -> None:
        self._open_find("search", "")

    def _open_find(self, mode: str, value: str) -> None:
        self._find_mode = mode
        box = self.query_one("#find", Input)
        box.placeholder = ("filter: node name, exporter or problem (esc clears)" if mode == "filter"
                           else "search: jump to the next node that matches (enter)")
        box.value = value
        box.add_class("shown")
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if self._find_mode == "filter":
            self.filter_text = event.value
            self._after_change()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if self._find_mode == "search":
            self._jump(event.value)
        self.query_one("#find", Input).remove_class("shown")
        self.query_one("#nodes", DataTable).focus()

    def _jump(self, text: str) -> None:
        self._add_all()
        table = self.query_one("#nodes", DataTable)
        n = len(self.shown)
        for k in range(1, n + 1):
            i = (table.cursor_row + k) % n
            if matches(self.shown[i], text):
                table.move_cursor(row=i)
                return
        self.notify(f"no node matches {visible(text)!r}", severity="warning")

    def action_clear_filter(self) -> None:
        box = self.query_one("#find", Input)
        box.remove_class("shown")
        if self.filter_text:
            self.filter_text = ""
            self._after_change()
        self.query_one("#nodes", DataTable).focus()

    def action_open_node(self) -> None:
        table = self.query_one("#nodes", DataTable)
        if not self.shown or table.cursor_row >= len(self.shown):
            return
        from gputop.tui.fleet_node import NodeScreen

        self.push_screen(NodeScreen(self.source.prom, self.shown[table.cursor_row].host))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "nodes":
            self.action_open_node()


def run_fleet_tui(source: FleetSource, refresh: float = 2.0, filter_text: str = "", sort: str = "worst",
                  first=None) -> int:
    from gputop.tui.launch import require_terminal

    require_terminal()
    FleetApp(source, refresh=refresh, filter_text=filter_text, sort=sort, first=first).run()
    return 0
