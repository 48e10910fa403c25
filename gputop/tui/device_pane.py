"""Every GPU in one widget: name, utilisation, memory, temperature, power, fan, clocks and two history strips.

The strips are drawn on a fixed 0-100 scale from the history ring buffer (a string of block characters,
well under a millisecond), never with an auto-scaling sparkline or a plotting library.

A line is a tuple of ``(text, style)`` pieces, each piece one segment on screen (the style is a Rich style
string, "" for none). Lines are compared as tuples; only a line that changed becomes a new Strip and is
repainted. No Rich ``Text`` is made per frame (``DeviceBoard.render`` makes one for Textual's own pipeline,
which the tests compare with).
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from gputop.backends.base import DeviceSample
from gputop.util.textsafe import visible
from gputop.tui.bar import LineStyles
from gputop.tui.history import DeviceHistory
from gputop.tui.mig_lines import by_gpu, instance_pieces
from gputop.util.units import fmt_bytes, fmt_opt

Line = tuple  # of (text, style) pieces


def _level_style(v: float | None) -> str:
    if v is None:
        return "dim"
    if v >= 90:
        return "bold red"
    if v >= 60:
        return "yellow"
    return "green"


def _levels(d: DeviceSample) -> tuple[str, str, str, str]:
    """Utilisation and memory: their texts and styles."""
    mem_pct = 100.0 * d.memory_used / d.memory_total if d.memory_used is not None and d.memory_total else None
    util_txt = fmt_opt(d.util_gpu, "{:.0f}%").rjust(4)
    mem_txt = f"{fmt_bytes(d.memory_used)}/{fmt_bytes(d.memory_total)}".rjust(13)
    return util_txt, _level_style(d.util_gpu), mem_txt, _level_style(mem_pct)


def _reason(d: DeviceSample, default: str) -> str:
    return visible("; ".join(d.errors) or default)


def line_pieces(d: DeviceSample, history: DeviceHistory, width: int) -> Line:
    """One line, for many GPUs on a small terminal: index, short name, both strips, memory, temp, power.
    The whole line is bold (the look of the per-GPU panes it replaces)."""
    head = f"{d.index:>2} {visible(d.name or 'unknown')[:14].ljust(14)}"
    if d.lost:
        return ((head, "bold"), ("  LOST: " + _reason(d, "unreachable"), "bold red"))
    util_txt, util_style, mem_txt, mem_style = _levels(d)
    tail = f" {fmt_opt(d.temperature, '{:.0f}°C'):>5} {fmt_opt(d.power_w, '{:.0f}W'):>5}"
    fixed = cell_len(head) + 1 + len(util_txt) + 1 + 1 + len(mem_txt) + len(tail) + 2
    strip_w = max(3, (width - fixed) // 2) if width else 10
    util_strip, mem_strip = history.strips(d.index, strip_w)
    # A space before each number: "100%" and "140GiB/140GiB" fill their columns and would run into the bars.
    return ((head + " ", "bold"), (util_strip, "bold " + util_style), (" " + util_txt, "bold " + util_style),
            (" ", "bold"), (mem_strip, "bold " + mem_style), (" " + mem_txt, "bold " + mem_style),
            (tail, "bold"))


def _pair(a, b, unit: str, what: str) -> str:
    """``610/700W``; ``power N/A`` when neither is known (not ``N/A/N/AW``); ``610W/N/A`` when one is."""
    if a is None and b is None:
        return f"{what} N/A"
    if a is None or b is None:
        return f"{fmt_opt(a, '{:.0f}' + unit)}/{fmt_opt(b, '{:.0f}' + unit)}"
    return f"{a:.0f}/{b:.0f}{unit}"


def sensors_text(d: DeviceSample) -> str:
    """Every sensor of a device on one line: temperature, power and limit, fan, SM and memory clocks.
    Each in a column of its own width, so that a device that lacks some lines up with one that has all."""
    temp = fmt_opt(d.temperature, "{:.0f}°C").rjust(5)
    power = _pair(d.power_w, d.power_limit_w, "W", "power").rjust(9)
    fan = f"fan {fmt_opt(d.fan_pct, '{:.0f}%')}".rjust(8)
    clocks = _pair(d.clock_sm_mhz, d.clock_mem_mhz, "MHz", "clocks").rjust(12)
    return f"{temp}  {power}  {fan}  {clocks}"


def pane_pieces(d: DeviceSample, history: DeviceHistory, width: int) -> tuple[Line, Line]:
    """Two lines: identity and sensors (all bold); then utilisation and memory with their history strips."""
    gpu = f"GPU {d.index} "
    name = visible(d.name or "unknown device")
    if d.lost:
        reason = _reason(d, "the device fell off the bus or is unreachable")
        return ((gpu, "bold"), (name, "bold"), ("  LOST", "bold reverse red")), ((f"  {reason}", "red"),)
    name_len = len(gpu) + cell_len(name)
    right = sensors_text(d)
    note = f"  ({len(d.errors)} field(s) N/A)" if d.errors else ""
    # What does not fit goes: first the note (the fields it counts read N/A anyway), then the clocks. The
    # sensors are in fixed columns (sensors_text), so a device that lacks some lines up with the others.
    if width and name_len + 2 + len(right) + len(note) > width:
        note = ""
    if width and name_len + 2 + len(right) > width:
        right = right.rsplit("  ", 1)[0]
    gap = max(2, width - name_len - len(right) - len(note)) if width else 2
    line1 = ((gpu, "bold"), (name, "bold"))
    if note:  # after the name: the sensors end at the right edge, as every other device's do
        line1 += ((note, "bold dim"),)
    line1 += ((" " * gap + right, "bold"),)
    util_txt, util_style, mem_txt, mem_style = _levels(d)
    fixed = len("UTIL ") + 1 + len(util_txt) + 3 + len("MEM ") + 1 + len(mem_txt)
    strip_w = max(4, (width - fixed) // 2) if width else 20
    util_strip, mem_strip = history.strips(d.index, strip_w)
    line2 = (("UTIL ", "bold"), (util_strip, util_style), (" " + util_txt, util_style), ("   ", ""),
             ("MEM ", "bold"), (mem_strip, mem_style), (" " + mem_txt, mem_style))
    return line1, line2


def job_piece(jobs: dict | None, index: int) -> Line:
    """The job a GPU is allocated to, as pieces for the end of its first line (``jobs``: GPU -> text, from
    ``allocation_texts``); none where no scheduler is read."""
    text = jobs.get(index) if jobs else None
    if not text:
        return ()
    return ((f"  {text}", "bold red" if "squatter" in text else "bold cyan"),)


def allocation_texts(allocation, holders=(), at: float = 0.0) -> dict[int, str]:
    """GPU -> "job 42 alice", "job 42 alice idle 5:00", "job 42 alice · 1 squatter", "no job" (issue 29)."""
    from gputop.util.units import fmt_duration

    if allocation is None:
        return {}
    squat: dict[int, int] = {}
    for h in holders:
        st = allocation.standing(h.pid)
        if st is not None and st.kind == "squatter":
            for g in h.gpus:
                squat[g] = squat.get(g, 0) + 1
    out = {}
    for g, a in allocation.by_gpu.items():
        text = f"job {visible(a.job)} {visible(a.user or str(a.uid))}"
        idle = allocation.idle_for(g, at)
        if idle is not None:
            text += f" idle {fmt_duration(idle)}"
        if squat.get(g):
            text += f" · {squat[g]} squatter{'s' if squat[g] > 1 else ''}"
        out[g] = text
    return out


def line_text(pieces: Line) -> Text:
    """A line as Rich Text (what Textual's pipeline would be given): each styled piece one span."""
    return Text.assemble(*[(t, s) if s else t for t, s in pieces])


class DeviceBoard(Widget):
    """Every device of the latest snapshot, one or two lines each, in one widget (in the #devices scroll box).

    One widget, not one per GPU: Textual's cost per widget refreshed (styles, padding, cropping) is paid
    once. Its lines are drawn here (render_line): a line that did not change keeps its Strip, and only
    changed lines are repainted. ``test_device_board_draws_what_textual_would`` checks that each line is
    exactly what Textual draws for ``render()``.
    """

    DEFAULT_CSS = "DeviceBoard { height: auto; }"

    def __init__(self, history: DeviceHistory, **kw):
        super().__init__(**kw)
        self.history = history
        self.devices: tuple[DeviceSample, ...] = ()
        self.lines = 2  # per device
        self._lines: list[Line] = []  # what each line shows
        self._built_for = (0, 0)  # the (width, lines per device) _lines were made for
        self._strips: dict[int, tuple[Line, Strip]] = {}  # y -> the line and its Strip
        self._strips_key: tuple | None = None  # the width and styles the strips were made with
        self._line_styles = LineStyles()  # piece style -> the style Textual draws it with
        self.jobs: dict[int, str] = {}  # GPU -> the job it is allocated to (allocation_texts); {}: none read
        self.instances: tuple = ()  # MIG devices: one line each, under its GPU (gputop.tui.mig_lines)
        self.ledger: tuple[str, ...] = ()  # the memory ledger's lines (gputop.core.ledger), under the GPUs

    def show(self, devices, lines: int, instances=(), ledger: tuple[str, ...] = ()) -> None:
        """Take a new sample; repaint only the lines that would look different."""
        self.devices = tuple(devices)
        self.instances = tuple(instances)
        resized = len(ledger) != len(self.ledger)
        self.ledger = tuple(ledger)
        if resized or lines != self.lines or len(self._lines) != self._height():
            self.lines = lines
            self._build()
            self.styles.height = len(self._lines)
            self.refresh()
            return
        old = self._lines
        self._build()
        width = self.size.width
        changed = [Region(0, y, width, 1) for y, (a, b) in enumerate(zip(old, self._lines)) if a != b]
        if changed:
            self.refresh(*changed)

    def _build(self) -> None:
        width = self.size.width
        out: list[Line] = []
        mig = by_gpu(self.instances) if self.instances else {}
        for d in self.devices:
            job = job_piece(self.jobs, d.index)  # at the end of its first line, which leaves room for it
            room = max(0, width - cell_len(job[0][0])) if job and width else width
            if self.lines == 1:
                out.append(line_pieces(d, self.history, room) + job)
            else:
                first, second = pane_pieces(d, self.history, room)
                out.extend((first + job, second if room == width else pane_pieces(d, self.history, width)[1]))
            out.extend(instance_pieces(m, width) for m in mig.get(d.index, ()))
        out.extend(((" " + visible(text), "yellow"),) for text in self.ledger)
        self._lines, self._built_for = out, (width, self.lines)

    def get_content_height(self, container, viewport, width: int) -> int:
        return self._height()

    def _height(self) -> int:
        return self.lines * len(self.devices) + len(self.instances) + len(self.ledger)

    def render(self) -> Text:
        if self._built_for != (self.size.width, self.lines):
            self._build()
        return Text("\n").join([line_text(line) for line in self._lines])

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self._built_for != (width, self.lines):  # resized: every line again
            self._build()
        base = self.visual_style
        key = (width, base, self.app.ansi_theme)
        if key != self._strips_key:
            self._strips, self._strips_key = {}, key
        if y >= len(self._lines):
            return Strip.blank(width, base.rich_style)
        line = self._lines[y]
        cached = self._strips.get(y)
        if cached is not None and cached[0] == line:
            return cached[1]
        strip = self._line_styles.strip(line, y, base, self.app.ansi_theme).crop(0, width)
        self._strips[y] = (line, strip)
        return strip


class DevicesBox(VerticalScroll):
    """The #devices scroll box: the DeviceBoard (and, while no GPU is found, a message saying why), sized
    to the board's lines within about half the screen."""

    def __init__(self, history: DeviceHistory, **kw):
        super().__init__(**kw)
        self.board = DeviceBoard(history, id="board")
        self._no_gpu: Static | None = None  # the "no GPU" message, while it is shown

    def compose(self):
        yield self.board

    def show(self, devices: tuple, backends: tuple, screen_height: int, jobs: dict | None = None,
             instances: tuple = (), ledger: tuple[str, ...] = ()) -> None:
        """``jobs``: GPU -> the job it is allocated to (``allocation_texts``); None keeps the last ones."""
        if jobs is not None:
            self.board.jobs = jobs
        # Two lines per GPU when they fit in about half the screen, else one line each (+ a line per MIG
        # device); then one line for each GPU whose memory ledger has something to explain.
        budget = max(4, (screen_height - 10) // 2)
        lines = 2 if 2 * len(devices) + len(instances) <= budget else 1
        self.board.show(devices, lines, instances, ledger)
        if not devices:
            if self._no_gpu is None:
                from gputop.backends import no_gpu_message

                self._no_gpu = Static(Text(no_gpu_message(list(backends)), style="yellow"), id="no-gpu")
                self.mount(self._no_gpu)
            lines = 5  # the message above wraps over a few lines at 80 columns
        elif self._no_gpu is not None:  # the GPUs are back
            self._no_gpu.remove()
            self._no_gpu = None
        height = min(max(2, lines * max(1, len(devices)) + len(instances) + len(ledger)), budget) + 1  # + the border
        if self.styles.height is None or self.styles.height.value != height:
            self.styles.height = height
