"""Guard mode confirmation: shows the mode it switches to and what that mode does."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Button, Static

from gputop.tui.dialogs.base import ConfirmDialog

MEANING = {
    "off": "the guard evaluates nothing",
    "dry-run": "the guard evaluates its rules and records what it would do, but kills nothing",
    "enforce": "the guard acts on its rules: it kills the processes they select",
}


class GuardToggleDialog(ConfirmDialog):
    """Returns "switch" or None."""

    def __init__(self, current: str, target: str):
        super().__init__()
        self.current = current
        self.target = target
        self.DIALOG_TITLE = f"Switch guard mode to {target}?"

    def body(self) -> ComposeResult:
        text = Text()
        text.append(f"{self.current}", style="bold")
        text.append("  →  ")
        text.append(f"{self.target}", style="bold reverse" if self.target == "enforce" else "bold")
        text.append(f"\n\n{self.target}: {MEANING.get(self.target, '')}.")
        yield Static(text)

    def buttons(self) -> ComposeResult:
        yield Button(f"Switch to {self.target}", id="switch", variant="warning", compact=True)
