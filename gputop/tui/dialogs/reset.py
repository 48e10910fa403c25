"""Reset confirmation: the holders of the GPU, and the user types the GPU index to confirm.

The dialog offers only what the actions module would do: a GPU held by a protected, unknown or invisible
process gets no reset button at all (the reset would be refused); a GPU held by other processes gets
"Kill holders and reset" (the kill goes through the same checks as k); a free GPU gets "Reset GPU". The
index box has the focus, so typing works at once; Enter with any other index (or none) cancels."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Button, Input, Static

from gputop.tui.dialogs.base import ConfirmDialog
from gputop.util.units import fmt_bytes
from gputop.util.textsafe import visible

FORCE = "force"


def blockers(holders: list) -> list:
    """Holders that gputop never kills: the reset is refused while they hold the GPU (the actions rule)."""
    from gputop.actions.reset import reset_blockers

    return [h for h, _ in reset_blockers(holders)]


def refusal(backend, holders: list) -> str | None:
    """Why the reset itself would be refused before any holder is touched, or None: the core reset's own
    checks (the right to reset on this backend, the kernel's permission to signal each holder), so the dialog
    says what the action will say instead of offering a button that only leads to a refusal."""
    from gputop.actions.reset import reset_rights, signal_blockers

    rights = reset_rights(backend) if backend is not None else None
    if rights is not None:
        return rights[1]
    why = signal_blockers(holders)
    return "; ".join(why) if why else None


class ResetDialog(ConfirmDialog):
    """Returns "reset", FORCE (kill the holders, then reset) or None. Only a matching typed index confirms."""

    BODY_FOCUSABLE = False

    def __init__(self, index: int, name: str | None, holders: list, backend=None):
        super().__init__()
        self.index = index
        self.gpu_name = name
        self.holders = holders
        self.blocked = blockers(holders)
        self.refused = None if self.blocked else refusal(backend, holders)
        self.choice = None if self.blocked or self.refused else (FORCE if holders else "reset")
        self.AUTO_FOCUS = "#cancel" if self.choice is None else "#confirm-index"
        self.DIALOG_TITLE = f"Reset GPU {index} ({name or 'unknown'})?"

    def body(self) -> ComposeResult:
        if self.holders:
            text = Text()
            text.append(f"{len(self.holders)} process(es) hold this GPU:\n", style="bold yellow")
            for h in self.holders:
                text.append(f"{h.pid:>7} {visible(h.user or '?'):<8} {fmt_bytes(h.gpu_memory):>7} {h.verdict.kind:<11} ")
                text.append(Text(visible(h.cmd)))
                text.append("\n")
            text.rstrip()
        else:
            text = Text("No process holds this GPU.")
        yield Static(text)
        if self.refused:
            yield Static(Text(f"The reset would be refused: {visible(self.refused)}."), classes="dialog-note")
            return
        if self.choice is None:
            pids = ", ".join(str(h.pid) for h in self.blocked)
            yield Static(Text(f"The reset would be refused: gputop never kills pid(s) {pids} (protected, "
                              "unknown or not visible here). Stop them yourself first, then reset."),
                         classes="dialog-note")
            return
        if self.choice == FORCE:
            yield Static("A held GPU is not reset. 'Kill holders and reset' kills them first (each checked "
                         "as k does); or kill them yourself with k, then reset.", classes="dialog-note")
        yield Static(f"Type {self.index} and press enter to confirm (any other answer cancels):",
                     classes="dialog-note")
        yield Input(placeholder=f"GPU index ({self.index})", id="confirm-index")

    def buttons(self) -> ComposeResult:
        if self.choice is not None:
            label = "Kill holders and reset" if self.choice == FORCE else "Reset GPU"
            yield Button(label, id=self.choice, variant="error", disabled=True, compact=True)

    def _typed_ok(self, value: str) -> bool:
        return value.strip() == str(self.index)

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_one(f"#{self.choice}", Button).disabled = not self._typed_ok(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(self.choice if self._typed_ok(event.value) else None)
