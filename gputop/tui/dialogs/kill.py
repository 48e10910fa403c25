"""Kill confirmation: pid, user, command, GPU memory and child count of each target; TERM or KILL."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Button, Static

from gputop.tui.dialogs.base import ConfirmDialog
from gputop.util.units import fmt_bytes
from gputop.util.textsafe import visible


@dataclass(frozen=True)
class KillTarget:
    pid: int
    start_time: float | None
    user: str | None
    cmd: str
    gpu_memory: int | None
    gpus: tuple[int, ...]
    children: int | None  # None: could not be counted
    verdict: str
    reason: str = ""  # the verdict's reason, shown for protected targets
    parent_of: int | None = None  # the zombie GPU holder whose parent this is (its exit frees the memory)


OVERRIDE = "KILL-override"


class KillDialog(ConfirmDialog):
    """Returns "TERM", "KILL", OVERRIDE (SIGKILL, letting a protected target through) or None.

    Protected processes are refused by the actions module; the override is a separate, explicit
    button that only appears when a target is protected, so it is always a deliberate choice."""

    def __init__(self, targets: list[KillTarget]):
        super().__init__()
        self.targets = targets
        self.DIALOG_TITLE = (f"Kill process {targets[0].pid}?" if len(targets) == 1
                             else f"Kill {len(targets)} tagged processes?")

    def body(self) -> ComposeResult:
        for t in self.targets:
            text = Text()
            text.append(f"pid {t.pid}", style="bold")
            text.append(f"  user {visible(t.user or '?')}  GPU {','.join(map(str, t.gpus)) or '-'}  "
                        f"GPU memory {fmt_bytes(t.gpu_memory)}  ")
            kids = "? children" if t.children is None else f"{t.children} child process(es)"
            text.append(kids, style="bold yellow" if t.children else "")
            text.append(f"  [{t.verdict}]\n")
            text.append(Text(visible(t.cmd)))  # a command line is never markup
            yield Static(text, classes="target")
            if t.parent_of is not None:
                yield Static(Text(f"pid {t.parent_of} is a zombie: no signal ends it. This is its parent: only "
                                  "its wait for the zombie, or its exit, frees the GPU memory."), classes="dialog-note")
        if any(t.children for t in self.targets):
            yield Static("Children are not signalled: they may keep running (reap an orphan tree with r).",
                         classes="dialog-note")
        yield Static("TERM asks the process to exit (waits, then reports); KILL ends it at once.",
                     classes="dialog-note")
        for t in self.targets:
            if t.verdict == "protected":
                yield Static(Text(f"pid {t.pid} is protected ({visible(t.reason)}): TERM and KILL will be refused. "
                                  "'Override' kills it anyway."), classes="dialog-note")

    def buttons(self) -> ComposeResult:
        yield Button("TERM", id="TERM", variant="warning", compact=True)
        yield Button("KILL", id="KILL", variant="error", compact=True)
        if any(t.verdict == "protected" for t in self.targets):
            yield Button("Override", id=OVERRIDE, variant="error", compact=True)
