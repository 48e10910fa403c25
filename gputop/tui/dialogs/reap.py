"""Reap confirmation: the whole orphan tree that will go, root first."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Button, Static

from gputop.tui.dialogs.base import ConfirmDialog
from gputop.util.units import fmt_bytes
from gputop.util.textsafe import visible


class ReapDialog(ConfirmDialog):
    """``tree`` is an actions.OrphanTree (root, members, holders, gpus, gpu_memory, reason).
    Returns "reap" or None."""

    def __init__(self, tree):
        super().__init__()
        self.orphan_tree = tree
        self.DIALOG_TITLE = f"Reap the orphan tree of pid {tree.root.pid} ({len(tree.members)} processes)?"

    def body(self) -> ComposeResult:
        t = self.orphan_tree
        head = Text()
        head.append(f"GPU {','.join(map(str, t.gpus)) or '-'}  GPU memory {fmt_bytes(t.gpu_memory)}\n")
        head.append(Text(visible(t.reason), style="italic"))
        yield Static(head)
        depth = {t.root.pid: 0}
        lines = Text()
        for m in t.members:
            d = depth.get(m.ppid, -1) + 1 if m.pid != t.root.pid else 0
            depth[m.pid] = d
            lines.append("  " * d + ("└ " if d else ""))
            lines.append(f"{m.pid:>7} ", style="bold red" if m.pid in t.holders else "bold")
            lines.append(f"{visible(m.user or '?'):<8} ")
            lines.append(Text(visible(m.cmd)))
            if m.pid in t.holders:
                lines.append("  GPU holder", style="red")
            lines.append("\n")
        lines.rstrip()
        yield Static(lines, classes="tree-list")
        yield Static("Every process above is stopped, then sent TERM, then KILL after the grace period.",
                     classes="dialog-note")
        for e in getattr(t, "left_alone", ()):  # the plan: what the reap does not touch, and why
            yield Static(Text(f"left alone: pid {e.pid}" + (f" and {len(e.subtree)} under it" if e.subtree else "")
                              + f": {visible(e.reason)}"), classes="dialog-note")
            if getattr(e, "namespace", ()):  # a PID namespace's init: host PIDs and the PIDs inside
                yield Static(Text("  its PID namespace: " + ", ".join(
                    f"{p} (pid {local} inside)" for p, local in e.namespace)), classes="dialog-note")
        if getattr(t, "refusal", None):
            yield Static(Text(f"The reap will be refused: {visible(t.refusal[1])}"), classes="dialog-note")

    def buttons(self) -> ComposeResult:
        yield Button("Reap tree", id="reap", variant="error", compact=True)
