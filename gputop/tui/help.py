"""``?``: every key of the main screen and of the plot, and what the colours and marks mean."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from gputop.tui.keymap import KEYS, PLOT_KEYS
from gputop.tui.legend import legend_text


class HelpScreen(ModalScreen):
    # The scrollable body has the focus, so that up/down/pgup/pgdn/home/end reach the legend at the bottom
    # on an 80x24 terminal without pressing tab first.
    AUTO_FOCUS = "#help-body"
    BINDINGS = [Binding("escape,q,question_mark,f1,enter", "close", "Close")]

    def __init__(self, readonly: bool = False):
        super().__init__()
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=False, padding=(0, 1), expand=False)
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for k in KEYS:
            if self.readonly and k.destructive:
                continue
            table.add_row(k.display, k.help)
        table.add_row("ctrl+p", "Command palette: every action above, by name; also picks a theme (remembered)")
        table.add_row("↑ ↓", "Move the cursor (pgup, pgdn, home, end too)")
        table.add_row("← →", "Collapse / expand a branch (← on a leaf goes to its parent); enter toggles")
        table.add_row("", "")
        table.add_row(Text("Plot", style="bold underline"), "")
        for k in PLOT_KEYS:
            table.add_row(k.display, k.help)
        with Vertical(classes="dialog help"):
            yield Static("gputop keys" + ("  (read-only: actions are disabled)" if self.readonly else ""),
                         classes="dialog-title")
            with VerticalScroll(classes="dialog-body", id="help-body"):
                yield Static(table)
                yield Static(legend_text(long=True))
            yield Button("Close", id="cancel", variant="primary", compact=True)

    def action_close(self) -> None:
        self.dismiss(None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None)
