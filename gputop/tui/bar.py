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


class LineStyles:
    """The styles a widget draws its pieces with, kept for one base style and theme: a piece's style (a Rich
    style or its string) becomes the widget's style plus the piece's, marked with the piece's offset
    (Textual's text selection reads it). Shared by the top bar and the device board."""

    def __init__(self):
        self._key: tuple | None = None  # (base, theme) the styles were made for
        self._styles: dict = {}  # piece style -> base + it
        self._placed: dict = {}  # (piece style, x, y) -> that plus its offset

    def strip(self, pieces, y: int, base: VisualStyle, theme) -> Strip:
        """Line ``y`` of ``(text, style)`` pieces as Textual draws a Text (a style "" or None is none)."""
        if (base, theme) != self._key or len(self._placed) > 4096:
            self._key, self._styles, self._placed = (base, theme), {}, {}
        styles, placed = self._styles, self._placed
        segments, x = [], 0
        for text, name in pieces:
            if not text:
                continue
            drawn = placed.get((name, x, y))
            if drawn is None:
                style = styles.get(name)
                if style is None:
                    rich = RichStyle.parse(name) if isinstance(name, str) else name
                    visual = VisualStyle.from_rich_style(rich, theme) if rich else VisualStyle()
                    style = styles[name] = (base + visual).rich_style
                drawn = placed[(name, x, y)] = style + RichStyle.from_meta({"offset": (x, y)})
            segments.append(Segment(text, drawn))
            x += len(text)
        return Strip(segments)


class TextBar(Widget):
    DEFAULT_CSS = "TextBar { height: 1; }"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.shown = Text()
        self._strip: Strip | None = None
        self._key: tuple | None = None  # the Text, width and styles the strip was made for
        self._styles = LineStyles()

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
        theme = self.app.ansi_theme
        key = (text, width, base, theme)
        if self._strip is None or key != self._key:
            segments = text.render(self.app.console, end="")
            self._strip = self._styles.strip([(seg.text, seg.style) for seg in segments], 0, base, theme)
            self._key = key
        return self._strip
