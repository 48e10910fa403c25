"""The "terminal too small" screen: pushed over everything (the main screen and any dialog) while the
terminal is below the minimum, popped when it grows back. It keeps the keyboard: q quits from here."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Static


def message(w: int, h: int, min_w: int, min_h: int) -> str:
    return (f"Terminal too small: {w}x{h}.\n\ngputop needs at least {min_w}x{min_h} "
            f"(80x24 is comfortable).\nEnlarge the window, or press q to quit.")


class TooSmallScreen(Screen):
    AUTO_FOCUS = None
    BINDINGS = [Binding("q,f10,ctrl+c", "leave", "Quit", show=False)]

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        yield Static(self.text, id="too-small")

    def show(self, text: str) -> None:
        if text != self.text:
            self.text = text
            self.query_one("#too-small", Static).update(text)

    def on_screen_resume(self) -> None:
        # Uncovered again after the dialog above it closed: the terminal may have grown meanwhile.
        fits = getattr(self.app, "fits", None)
        if callable(fits) and fits():
            self.call_later(self.dismiss)

    def action_leave(self) -> None:
        self.app.exit()
