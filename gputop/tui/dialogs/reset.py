"""Reset confirmation: the holders of the GPU, and the user types the GPU index to confirm."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Button, Input, Static

from gputop.tui.dialogs.base import ConfirmDialog
from gputop.units import fmt_bytes
from gputop.textsafe import visible


class ResetDialog(ConfirmDialog):
    """Returns "reset" (only once the typed index matches) or None."""

    BODY_FOCUSABLE = False  # tab goes from Cancel to the index box

    def __init__(self, index: int, name: str | None, holders: list):
        super().__init__()
        self.index = index
        self.gpu_name = name
        self.holders = holders
        self.DIALOG_TITLE = f"Reset GPU {index} ({name or 'unknown'})?"

    def body(self) -> ComposeResult:
        if self.holders:
            text = Text()
            text.append(f"{len(self.holders)} process(es) hold this GPU; the reset is refused while they do:\n",
                        style="bold yellow")
            for h in self.holders:
                text.append(f"{h.pid:>7} {visible(h.user or '?'):<8} {fmt_bytes(h.gpu_memory):>7}  ")
                text.append(Text(visible(h.cmd)))
                text.append("\n")
            text.rstrip()
        else:
            text = Text("No process holds this GPU.")
        yield Static(text)
        yield Static(f"Type {self.index} to confirm:", classes="dialog-note")
        yield Input(placeholder=f"GPU index ({self.index})", id="confirm-index")

    def buttons(self) -> ComposeResult:
        yield Button("Reset GPU", id="reset", variant="error", disabled=True, compact=True)

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_one("#reset", Button).disabled = event.value.strip() != str(self.index)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip() == str(self.index):
            self.dismiss("reset")
