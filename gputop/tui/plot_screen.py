"""The detailed device plot (plotext 6): utilisation and memory over a chosen time range, with axes.

Drawn only while this screen is open, on the UI thread (a few ms), from the history ring buffer.
"""

from __future__ import annotations

import os
import threading

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static

from gputop.tui.history import DeviceHistory
from gputop.tui.keymap import PLOT_KEYS

RANGES = (60, 300, 900, 3600)  # seconds
_PLOTEXT_LOCK = threading.Lock()  # plotext draws on one global figure


def plot_text(history: DeviceHistory, index: int, seconds: int, width: int, height: int, now: float,
              color: bool = True, title: str = "") -> Text:
    import plotext as plt

    pts = [p for p in history.series(index) if p.at >= now - seconds]
    if width < 20 or height < 6:
        return Text("(too small to plot)")
    with _PLOTEXT_LOCK:
        # The widget's size, not the terminal plotext would ask (none under a test or a screenshot: 80).
        plt.terminal.limit(False, False)
        f = plt.figure
        f.clear()
        f.theme("simple" if color else "colorless")
        f.plot_size(width, height)
        # A sample a moment newer than ``now`` would be drawn past the right edge of the frame: clamp to 0.
        xs = [min(0.0, p.at - now) for p in pts]
        util = [(x, p.util) for x, p in zip(xs, pts) if p.util is not None]
        mem = [(x, p.mem) for x, p in zip(xs, pts) if p.mem is not None]
        # No plotext legend: it is drawn inside the canvas, over the newest values. legend() below is
        # shown in the title line instead, in the colours plotext gives the first and second signal.
        f.legend(active=False)
        if util:
            f.draw(f.signal([x for x, _ in util], [y for _, y in util]).lines())
        if mem:
            f.draw(f.signal([x for x, _ in mem], [y for _, y in mem]).lines())
        if not util and not mem:
            f.draw(f.signal([-seconds, 0], [0, 0]))
            title = f"{title} (no data)".strip()
        f.ruler("y").lim(0, 100)
        f.ruler("x").lim(-seconds, 0)
        f.title(title)
        f.label("seconds ago", "%")
        out = f.build().string(colorless=not color)
        f.clear()
    return Text.from_ansi(out) if color else Text(out)


SERIES = (("utilisation %", "color(12)"), ("memory %", "color(10)"))  # plotext's first two colours


def legend() -> Text:
    t = Text()
    for name, colour in SERIES:
        t.append("  ━━ ", style=f"bold {colour}")
        t.append(name)
    return t


def plot_title(index: int, name: str, seconds: int, width: int) -> Text:
    """GPU, name, range, the legend, and the keys; what does not fit ``width`` is left out, the keys first
    (the footer shows them too), then the name, so that the legend is never cut."""
    full, short = f" GPU {index} · {name} · last {seconds} s", f" GPU {index} · last {seconds} s"
    for head, keys in ((full, "  (← → GPU, + - range, esc closes)"), (full, ""), (short, "")):
        title = Text(head, style="bold")
        title.append(legend())
        title.append(keys)
        if not width or title.cell_len <= width:
            break
    return title


class PlotView(Widget):
    def __init__(self, screen: "PlotScreen", **kw):
        super().__init__(**kw)
        self.plot_screen = screen

    def render(self) -> Text:
        s = self.plot_screen
        return s.render_plot(self.size.width, self.size.height)


class PlotScreen(Screen):
    AUTO_FOCUS = None
    BINDINGS = [Binding(k.key, k.action, k.description) for k in PLOT_KEYS]

    def __init__(self, history: DeviceHistory, indexes: list[int], index: int, names: dict[int, str],
                 now_fn):
        super().__init__()
        self.history = history
        self.indexes = indexes or [index]
        self.index = index
        self.names = names
        self.now_fn = now_fn
        self.range_i = 0

    def compose(self) -> ComposeResult:
        yield Static(id="plot-title")
        yield Static(id="plot-sensors")  # every field, also those the one-line panes leave out
        yield PlotView(self, id="plot")
        yield Footer()

    def on_mount(self) -> None:
        self._retitle()
        self._sensors()

    def _retitle(self) -> None:
        self.query_one("#plot-title", Static).update(
            plot_title(self.index, self.names.get(self.index, ""), RANGES[self.range_i], self.size.width))

    def on_resize(self, event) -> None:
        self._retitle()

    def _sensors(self) -> None:
        from gputop.tui.device_pane import sensors_text
        from gputop.util.units import fmt_bytes

        snap = getattr(self.app, "snapshot", None)
        d = snap.device(self.index) if snap is not None else None
        if d is None:
            text = " no sample yet"
        elif d.lost:
            text = " LOST: " + ("; ".join(d.errors) or "unreachable")
        else:
            util = "N/A" if d.util_gpu is None else f"{d.util_gpu:.0f}%"
            text = (f" util {util}  memory {fmt_bytes(d.memory_used)}/{fmt_bytes(d.memory_total)}  "
                    + sensors_text(d))
        self.query_one("#plot-sensors", Static).update(Text(text))

    def render_plot(self, width: int, height: int) -> Text:
        color = not (getattr(self.app, "no_color", False) or os.environ.get("NO_COLOR") is not None)
        return plot_text(self.history, self.index, RANGES[self.range_i], width, height, self.now_fn(),
                         color=color, title=f"GPU {self.index}")

    def redraw(self) -> None:
        self._sensors()
        self.query_one(PlotView).refresh()

    def _move(self, step: int) -> None:
        i = self.indexes.index(self.index) if self.index in self.indexes else 0
        self.index = self.indexes[(i + step) % len(self.indexes)]
        self._retitle()
        self.redraw()

    def action_prev_gpu(self) -> None:
        self._move(-1)

    def action_next_gpu(self) -> None:
        self._move(1)

    def action_zoom_out(self) -> None:
        self.range_i = min(len(RANGES) - 1, self.range_i + 1)
        self._retitle()
        self.redraw()

    def action_zoom_in(self) -> None:
        self.range_i = max(0, self.range_i - 1)
        self._retitle()
        self.redraw()

    def action_close(self) -> None:
        self.dismiss(None)
