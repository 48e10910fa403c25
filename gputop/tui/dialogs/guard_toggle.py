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

    def __init__(self, current: str, target: str, daemon: dict | None = None, policy: str | None = None):
        super().__init__()
        self.current = current
        self.target = target
        self.daemon = daemon
        self.policy = policy
        self.DIALOG_TITLE = f"Switch guard mode to {target}?"

    def body(self) -> ComposeResult:
        text = Text()
        text.append(f"{self.current}", style="bold")
        text.append("  →  ")
        text.append(f"{self.target}", style="bold reverse" if self.target == "enforce" else "bold")
        text.append(f"\n\n{self.target}: {MEANING.get(self.target, '')}.\n\n")
        from gputop.tui.side_panel import PanelData, daemon_line

        line = daemon_line(PanelData(guard_available=True, guard_daemon=self.daemon, guard_policy=self.policy))
        text.append(line if line.plain else Text("daemon: unknown (the guard state could not be read)"))
        if not self.policy and not (self.daemon or {}).get("policy_file"):
            text.append("\nno policy file is set: gputop guard --policy-file FILE", style="yellow")
        yield Static(text)

    def buttons(self) -> ComposeResult:
        yield Button(f"Switch to {self.target}", id="switch", variant="warning", compact=True)
