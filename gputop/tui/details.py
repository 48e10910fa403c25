"""Details of the selected process: identity, GPU use, owner, verdict and why, and the full ancestor chain."""

from __future__ import annotations

import datetime as _dt

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from gputop.core.ownership import NONE, Owner
from gputop.core.procs import ProcInfo
from gputop.core.model import Holder
from gputop.tui.rows import holder_mark
from gputop.util.units import fmt_bytes, fmt_duration
from gputop.util.textsafe import visible


def _when(t: float | None) -> str:
    if t is None:
        return "N/A"
    return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _owner_text(owner: Owner | None) -> Text:
    t = Text()
    t.append("owner: ", style="bold")
    if owner is None:
        t.append("unknown (its cgroup could not be read)")
        return t
    t.append(owner.describe())
    if owner.cgroup and owner.kind != NONE:
        t.append(f"\n  cgroup {visible(owner.cgroup)}", style="dim")
    return t


def _proc_line(p: ProcInfo, mark: str = "", owner: Owner | None = None) -> Text:
    t = Text()
    t.append(f"{p.pid:>7} ", style="bold")
    t.append(f"ppid {p.ppid:<7} sid {p.sid if p.sid is not None else '?':<7} {visible(p.user or '?'):<8} ")
    t.append(Text(visible(p.name), style="bold"))
    t.append("  ")
    t.append(Text(visible(p.cmd), style="dim"))
    if owner is not None and owner.kind != NONE:
        t.append(f"  [{visible(owner.label)}]", style="italic")
    if mark:
        t.append(f"  {mark}", style="bold red")
    return t


def _verdict_lines(out: Text, holder: Holder, standing) -> None:
    """The holder's verdict and why, its orphan root, its standing and what the memory ledger says of it."""
    v = holder.verdict
    out.append("\n\nverdict: ", style="bold")
    out.append(v.kind, style="bold red" if v.kind == "orphan" else "bold")
    out.append("\nwhy: ", style="bold")
    out.append(Text(visible(v.reason)))
    if v.orphan_reason and v.orphan_reason != v.reason:
        out.append("\norphan test: ", style="bold")
        out.append(Text(visible(v.orphan_reason)))
    if v.root is not None:
        out.append(f"\norphan root: pid {v.root}" + (f", reparented to pid {v.reaper}" if v.reaper else ""))
    if standing is not None:
        out.append("\nstanding: ", style="bold")
        out.append(standing.kind, style="bold red" if standing.kind in ("squatter", "outside") else "bold")
        out.append(Text(f" ({visible(standing.reason)})"))
    ledger = holder_mark(holder)  # the memory ledger: a device-file holder, a zombie, the MPS server
    if ledger:
        out.append("\nmemory ledger: ", style="bold")
        out.append(Text(ledger))


def details_text(holder: Holder | None, proc: ProcInfo | None, root: int | None,
                 owner: Owner | None = None, standing=None) -> Text:
    """``owner``: for a process that is not a holder (a holder's owner is its own). ``standing``: the
    holder's standing against its GPUs' allocation (gputop.core.allocation), where one is read."""
    out = Text()
    if holder is not None:
        out.append(f"pid {holder.pid}", style="bold")
        out.append(f"   started {_when(holder.start_time)}   runtime {fmt_duration(holder.runtime)}\n")
        out.append(f"user {visible(holder.user or '?')}   context {holder.ctx}   GPU "
                   f"{','.join(map(str, holder.gpus))}   GPU memory {fmt_bytes(holder.gpu_memory)}   "
                   f"SM {'N/A' if holder.sm_util is None else f'{holder.sm_util:.0f}%'}   host memory "
                   f"{fmt_bytes(holder.rss)}\n")
        for u in holder.uses:
            out.append(f"  GPU {u.gpu}: {u.ctx}, {fmt_bytes(u.used_memory)}, SM "
                       f"{'N/A' if u.sm_util is None else f'{u.sm_util:.0f}%'}\n")
        out.append("command: ", style="bold")
        out.append(Text(visible(holder.cmd)))
        if holder.proc is not None:
            out.append("\n")
            out.append(_owner_text(holder.owner))
        _verdict_lines(out, holder, standing)
        chain = holder.chain
        me = holder.proc
    else:
        out.append("not a GPU holder: an ancestor of one", style="bold")
        if proc is not None and root is not None and proc.pid == root:
            out.append(" (the root of an orphan tree: r reaps it)", style="bold red")
        out.append("\n")
        if owner is not None:
            out.append(_owner_text(owner))
        chain = ()
        me = proc
    out.append("\n\nchain (the process, then its parent, up to init):\n", style="bold")
    if me is not None:
        out.append(_proc_line(me, "this process", holder.owner if holder is not None else owner))
        out.append("\n")
    owners = (holder.chain_owners if holder is not None else ()) or (None,) * len(chain)
    for p, o in zip(chain, owners):
        mark = "orphan root" if holder is not None and p.pid == holder.verdict.root else ""
        out.append(_proc_line(p, mark, o))
        out.append("\n")
    if holder is None and proc is not None:
        out.append("(select a GPU holder to see its full chain)\n", style="dim")
    out.rstrip()
    return out


class DetailsScreen(ModalScreen):
    AUTO_FOCUS = "#cancel"
    BINDINGS = [Binding("escape,q,d", "close", "Close")]

    def __init__(self, holder: Holder | None, proc: ProcInfo | None, root: int | None,
                 owner: Owner | None = None, standing=None):
        super().__init__()
        self.holder, self.proc, self.root, self.owner = holder, proc, root, owner
        self.standing = standing

    def compose(self) -> ComposeResult:
        pid = self.holder.pid if self.holder else (self.proc.pid if self.proc else "?")
        with Vertical(classes="dialog details"):
            yield Static(f"Process {pid}", classes="dialog-title")
            with VerticalScroll(classes="dialog-body"):
                yield Static(details_text(self.holder, self.proc, self.root, self.owner, self.standing))
            yield Button("Close", id="cancel", variant="primary", compact=True)

    def action_close(self) -> None:
        self.dismiss(None)

    def on_button_pressed(self, event) -> None:
        event.stop()
        self.dismiss(None)
