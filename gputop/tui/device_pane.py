"""One pane per GPU: name, utilisation, memory, temperature, power, fan, clocks and two history strips.

The strips are drawn on a fixed 0-100 scale from the history ring buffer (a string of block characters,
well under a millisecond), never with an auto-scaling sparkline or a plotting library.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style as RichStyle
from rich.text import Text
from textual.strip import Strip
from textual.style import Style as VisualStyle
from textual.geometry import Region
from textual.widget import Widget

from gputop.backends.base import DeviceSample
from gputop.tui.history import DeviceHistory
from gputop.units import fmt_bytes


def _na(v, fmt: str) -> str:
    return "N/A" if v is None else fmt.format(v)


def _level_style(v: float | None) -> str:
    if v is None:
        return "dim"
    if v >= 90:
        return "bold red"
    if v >= 60:
        return "yellow"
    return "green"


def line_text(d: DeviceSample, history: DeviceHistory, width: int) -> Text:
    """One line, for many GPUs on a small terminal: index, short name, both strips, memory, temp, power."""
    head = Text(f"{d.index:>2} ", style="bold")
    head.append(Text((d.name or "unknown")[:14].ljust(14)))
    if d.lost:
        return head + Text("  LOST: " + ("; ".join(d.errors) or "unreachable"), style="bold red")
    util = d.util_gpu
    mem_pct = 100.0 * d.memory_used / d.memory_total if d.memory_used is not None and d.memory_total else None
    util_txt = _na(util, "{:.0f}%").rjust(4)
    mem_txt = f"{fmt_bytes(d.memory_used)}/{fmt_bytes(d.memory_total)}".rjust(13)
    tail = f" {_na(d.temperature, '{:.0f}°C'):>5} {_na(d.power_w, '{:.0f}W'):>5}"
    fixed = head.cell_len + 1 + len(util_txt) + 1 + 1 + len(mem_txt) + len(tail) + 2
    strip_w = max(3, (width - fixed) // 2) if width else 10
    util_strip, mem_strip = history.strips(d.index, strip_w)
    out = head
    out.append(" ")
    out.append(util_strip, style=_level_style(util))
    out.append(util_txt, style=_level_style(util))
    out.append("  ")
    out.append(mem_strip, style=_level_style(mem_pct))
    out.append(mem_txt, style=_level_style(mem_pct))
    out.append(tail)
    return out


def _pair(a, b, unit: str, what: str) -> str:
    """``610/700W``; ``power N/A`` when neither is known (not ``N/A/N/AW``); ``610W/N/A`` when one is."""
    if a is None and b is None:
        return f"{what} N/A"
    if a is None or b is None:
        return f"{_na(a, '{:.0f}' + unit)}/{_na(b, '{:.0f}' + unit)}"
    return f"{a:.0f}/{b:.0f}{unit}"


def sensors_text(d: DeviceSample) -> str:
    """Every sensor of a device on one line: temperature, power and limit, fan, SM and memory clocks."""
    temp = _na(d.temperature, "{:.0f}°C")
    power = _pair(d.power_w, d.power_limit_w, "W", "power")
    fan = f"fan {_na(d.fan_pct, '{:.0f}%')}"
    clocks = _pair(d.clock_sm_mhz, d.clock_mem_mhz, "MHz", "clocks")
    return f"{temp}  {power}  {fan}  {clocks}"


def pane_text(d: DeviceSample, history: DeviceHistory, width: int) -> Text:
    """Two lines: identity and sensors; then utilisation and memory with their history strips."""
    name = Text(f"GPU {d.index} ", style="bold")
    name.append(Text(d.name or "unknown device", style="bold"))
    if d.lost:
        name.append("  LOST", style="bold reverse red")
        reason = "; ".join(d.errors) or "the device fell off the bus or is unreachable"
        line2 = Text(f"  {reason}", style="red")
        return Text("\n").join([name, line2])
    right = sensors_text(d)
    if width and name.cell_len + 2 + len(right) > width:
        right = right.rsplit("  ", 1)[0]  # drop the clocks first
    gap = max(2, width - name.cell_len - len(right)) if width else 2
    line1 = name + Text(" " * gap) + Text(right)

    util = d.util_gpu
    mem_pct = 100.0 * d.memory_used / d.memory_total if d.memory_used is not None and d.memory_total else None
    util_txt = _na(util, "{:.0f}%").rjust(4)
    mem_txt = f"{fmt_bytes(d.memory_used)}/{fmt_bytes(d.memory_total)}".rjust(13)
    fixed = len("UTIL ") + 1 + len(util_txt) + 3 + len("MEM ") + 1 + len(mem_txt)
    strip_w = max(4, (width - fixed) // 2) if width else 20
    util_strip, mem_strip = history.strips(d.index, strip_w)
    line2 = Text()
    line2.append("UTIL ", style="bold")
    line2.append(util_strip, style=_level_style(util))
    line2.append(" " + util_txt, style=_level_style(util))
    line2.append("   ")
    line2.append("MEM ", style="bold")
    line2.append(mem_strip, style=_level_style(mem_pct))
    line2.append(" " + mem_txt, style=_level_style(mem_pct))
    if d.errors:
        line1.append(f"  ({len(d.errors)} field(s) N/A)", style="dim")
    return Text("\n").join([line1, line2])


class DevicePane(Widget):
    """Renders one device from the latest snapshot and the shared history.

    Its lines are drawn here (render_line), not by Textual's general text pipeline (parse, wrap, align)
    on every change: a line that did not change keeps its Strip, and a changed one is Rich's segments of
    its Text with each style converted once (as Textual converts it). A pane with a line that would not
    fit, or that holds a character that is not printable, takes Textual's pipeline (the output is the
    same; ``test_device_panes_draw_what_textual_would`` checks it).
    """

    DEFAULT_CSS = "DevicePane { height: 2; }"

    def __init__(self, index: int, history: DeviceHistory, **kw):
        super().__init__(**kw)
        self.index = index
        self.history = history
        self.device: DeviceSample | None = None
        self.lines = 2
        self._shown: Text | None = None  # what the pane shows, made by show() or render()
        self._shown_for: tuple[int, int] = (0, 0)  # the (width, lines) it was made for
        self._strips: list[tuple[Text, Strip]] = []  # each line's Text and its Strip
        self._strips_key: tuple | None = None  # the width and styles the strips were made with
        self._styles: dict = {}  # Rich style of a segment -> the style Textual would draw it with
        self._placed: dict = {}  # (Rich style of a segment, x, y) -> that style plus its offset
        self._split_of: Text | None = None  # the Text last split into lines
        self._split: list[Text] | None = None  # its lines; None: drawn by Textual's pipeline

    def set_lines(self, lines: int) -> None:
        if lines != self.lines:
            self.lines = lines
            self.styles.height = lines
            self.refresh()

    def show(self, device: DeviceSample) -> None:
        """Take a new sample; repaint only when the pane would look different (a steady GPU costs nothing)."""
        self.device = device
        text = self._text()
        if text != self._shown:
            old = self._shown.split("\n") if self._shown is not None else []
            self._shown, self._shown_for = text, (self.size.width, self.lines)
            new = text.split("\n")
            if len(old) != len(new):
                self.refresh()
                return
            width = self.size.width
            for y, (a, b) in enumerate(zip(old, new)):  # repaint only the lines that changed
                if a != b:
                    self.refresh(Region(0, y, width, 1))

    def _text(self) -> Text:
        if self.device is None:
            return Text(f"GPU {self.index}: waiting for the first sample…", style="dim")
        if self.lines == 1:
            return line_text(self.device, self.history, self.size.width)
        return pane_text(self.device, self.history, self.size.width)

    def render(self) -> Text:
        if self._shown is None or self._shown_for != (self.size.width, self.lines):  # resized, or re-laid out
            self._shown, self._shown_for = self._text(), (self.size.width, self.lines)
        return self._shown

    def render_line(self, y: int) -> Strip:
        text = self.render()
        if text is not self._split_of:
            lines = text.split("\n")
            # A line that would wrap, or that holds a character that is not printable: Textual's pipeline
            # for the whole pane (it wraps and sanitises), exactly as before.
            fast = all(line.cell_len <= self.size.width and line.plain.isprintable() for line in lines)
            self._split_of, self._split = text, (lines if fast else None)
        lines = self._split
        if lines is None:
            return super().render_line(y)
        width = self.size.width
        base = self.visual_style
        key = (width, base, self.app.ansi_theme)
        if key != self._strips_key:
            self._strips, self._strips_key, self._styles, self._placed = [], key, {}, {}
        if y >= len(lines):
            return Strip.blank(width, base.rich_style)
        strips = self._strips
        while len(strips) <= y:
            strips.append((None, None))
        line = lines[y]
        cached_line, strip = strips[y]
        if strip is None or cached_line != line:
            strip = self._line_strip(line, y, base)
            strips[y] = (line, strip)
        return strip

    def _line_strip(self, line: Text, y: int, base: VisualStyle) -> Strip:
        """Line ``y`` as Textual draws a Text: each segment in the widget's style plus its own, marked with
        its offset (Textual's text selection reads it); Textual pads it to the width."""
        styles = self._styles
        theme = self.app.ansi_theme
        segments = []
        x = 0
        placed = self._placed  # (segment style, x, y) -> the style drawn: mostly the same every second
        if len(placed) > 4096:
            placed.clear()
        for seg in line.render(self.app.console, end=""):
            key = (seg.style, x, y)
            drawn = placed.get(key)
            if drawn is None:
                style = styles.get(seg.style)
                if style is None:
                    visual = VisualStyle.from_rich_style(seg.style, theme) if seg.style else VisualStyle()
                    style = styles[seg.style] = (base + visual).rich_style
                drawn = placed[key] = style + RichStyle.from_meta({"offset": (x, y)})
            segments.append(Segment(seg.text, drawn))
            x += len(seg.text)
        return Strip(segments)
