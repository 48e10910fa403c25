"""The "terminal too small" screen: pushed over everything (the main screen and any dialog) while the
terminal is below the minimum, popped when it grows back. It keeps the keyboard: q quits from here."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Static

from gputop.tui.first_frame import MIN_HEIGHT, MIN_WIDTH  # one limit for both frames


def fits(w: int, h: int) -> bool:
    return w >= MIN_WIDTH and h >= MIN_HEIGHT


def cover(app, w: int, h: int) -> None:
    """Cover everything, dialogs included, with the too-small message; uncover when it fits again."""
    top = app.screen_stack[-1] if app.screen_stack else None
    if not fits(w, h) and isinstance(top, TooSmallScreen):
        top.show(message(w, h, MIN_WIDTH, MIN_HEIGHT))
    elif not fits(w, h):
        app.push_screen(TooSmallScreen(message(w, h, MIN_WIDTH, MIN_HEIGHT)))
    elif isinstance(top, TooSmallScreen):
        app.pop_screen()


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
        if fits(*self.app.size):
            self.call_later(self.dismiss)

    def action_leave(self) -> None:
        self.app.exit()
