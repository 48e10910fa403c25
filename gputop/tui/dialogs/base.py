"""The shared shape of a confirmation dialog: a title, a body, and buttons with Cancel focused first."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmDialog(ModalScreen):
    """Subclasses set TITLE and implement body() and buttons(); the result is the pressed button's id,
    or None for Cancel and Escape."""

    AUTO_FOCUS = "#cancel"
    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("left", "app.focus_previous", "Previous button", show=False),
        Binding("right", "app.focus_next", "Next button", show=False),
    ]
    DIALOG_TITLE = "Confirm"
    BODY_FOCUSABLE = True  # False where tab should go from Cancel straight to an input in the body

    def body(self) -> ComposeResult:
        yield from ()

    def buttons(self) -> ComposeResult:
        yield from ()

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.DIALOG_TITLE, classes="dialog-title")
            with VerticalScroll(classes="dialog-body") as body:
                body.can_focus = self.BODY_FOCUSABLE
                yield from self.body()
            with Horizontal(classes="dialog-buttons"):
                yield Button("Cancel", id="cancel", variant="primary", compact=True)
                yield from self.buttons()

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "cancel":
            self.dismiss(None)
        else:
            self.dismiss(event.button.id)
