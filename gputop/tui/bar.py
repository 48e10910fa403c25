"""A one-line bar (the top bar) that draws its Text itself.

The top bar changes every second (its clock). Textual's pipeline for a Static (visualize the Text as
Content, wrap, align, style) costs about a millisecond per update; here the line is Rich's segments of the
Text with each style converted as Textual converts it. A Text wider than the bar, or with a character that
is not printable, takes Textual's pipeline (it wraps and sanitises); ``test_render_lines`` checks that both
draw the same.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style as RichStyle
from rich.text import Text
from textual.strip import Strip
from textual.style import Style as VisualStyle
from textual.widget import Widget


class TextBar(Widget):
    DEFAULT_CSS = "TextBar { height: 1; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.shown = Text()
        self._strip: Strip | None = None
        self._key: tuple | None = None  # the Text, width and styles the strip was made for

    def update(self, text: Text) -> None:
        if text != self.shown:
            self.shown = text
            self.refresh()

    def render(self) -> Text:
        return self.shown

    def render_line(self, y: int) -> Strip:
        text, width = self.shown, self.size.width
        if y or text.cell_len > width or not text.plain.isprintable():
            return super().render_line(y)
        base = self.visual_style
        key = (text, width, base, self.app.ansi_theme)
        if self._strip is None or key != self._key:
            self._strip, self._key = self._line(text, base), key
        return self._strip

    def _line(self, text: Text, base: VisualStyle) -> Strip:
        theme = self.app.ansi_theme
        segments, x = [], 0
        for seg in text.render(self.app.console, end=""):
            visual = VisualStyle.from_rich_style(seg.style, theme) if seg.style else VisualStyle()
            segments.append(Segment(seg.text, (base + visual).rich_style + RichStyle.from_meta({"offset": (x, 0)})))
            x += len(seg.text)
        return Strip(segments)
