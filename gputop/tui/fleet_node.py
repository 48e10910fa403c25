"""A node of the fleet: its GPUs and holders from the same series. k kills and r reaps through
``gputop --remote NODE`` (the node's gputop re-checks identity, pid and start time, and writes its audit
log), each after the usual confirmation; t opens the node's own TUI over ssh."""

from __future__ import annotations

import subprocess

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Static

from gputop.fleet.client import Prometheus
from gputop.fleet.node import HolderRow, NodeDetail, node_detail
from gputop.fleet.remote_actions import gputop_argv, kill_args, reap_args, run_remote
from gputop.tui.dialogs.base import ConfirmDialog
from gputop.util.errors import GputopError
from gputop.util.textsafe import visible
from gputop.util.units import fmt_bytes


class RemoteReapDialog(ConfirmDialog):
    def __init__(self, host: str, holder: HolderRow):
        super().__init__()
        self.host, self.holder = host, holder
        self.DIALOG_TITLE = f"Reap the orphan tree of pid {holder.pid} on {visible(host)}?"

    def body(self) -> ComposeResult:
        h = self.holder
        yield Static(Text(f"pid {h.pid}  user {visible(h.user)}  {visible(h.name)}  [{h.verdict}]  "
                          f"GPU memory {fmt_bytes(h.memory)}"))
        yield Static("The node's gputop plans the reap again from its own view (gputop reap --root PID --apply) "
                     "and refuses what is not an orphan tree.", classes="dialog-note")

    def buttons(self) -> ComposeResult:
        yield Button("Reap", id="reap", variant="error", compact=True)


class NodeScreen(Screen):
    AUTO_FOCUS = "#holders"
    BINDINGS = [
        Binding("escape,q", "app.pop_screen", "Back"),
        Binding("k,f9", "kill", "Kill"),
        Binding("r", "reap", "Reap"),
        Binding("t", "open_tui", "Node TUI"),
        Binding("f5", "reload", "Reload"),
    ]

    def __init__(self, prom: Prometheus, host: str):
        super().__init__()
        self.prom, self.host = prom, host
        self.detail: NodeDetail | None = None

    def compose(self) -> ComposeResult:
        yield Static(Text(f"node {visible(self.host)} · loading…"), id="node-title")
        gpus = DataTable(id="gpus", cursor_type="row")
        gpus.add_columns("GPU", "MODEL", "UTIL", "MEM", "TEMP", "LOST", "SRC")
        yield gpus
        holders = DataTable(id="holders", cursor_type="row")
        holders.add_columns("PID", "USER", "NAME", "VERDICT", "GPU", "GPU-MEM", "OWNER")
        yield holders
        yield Static("", id="node-result")
        yield Footer()

    def on_mount(self) -> None:
        self.load()

    @work(thread=True, exclusive=True, group="node-load")
    def load(self) -> None:
        try:
            detail = node_detail(self.prom, self.host)
        except GputopError as e:
            self.app.call_from_thread(self._say, f"cannot read the node: {e}")
            return
        self.app.call_from_thread(self.show, detail)

    def show(self, d: NodeDetail) -> None:
        self.detail = d
        self.query_one("#node-title", Static).update(
            Text(f"node {visible(d.host)} · {len(d.gpus)} GPU(s) · {len(d.holders)} holder(s) · "
                 "k kill, r reap, t node TUI (through gputop --remote)"))
        gpus = self.query_one("#gpus", DataTable)
        gpus.clear()
        for g in d.gpus:
            gpus.add_row(visible(g.gpu), Text(visible(g.model)),
                         "-" if g.util is None else f"{g.util * 100:.0f}%",
                         f"{fmt_bytes(g.mem_used)}/{fmt_bytes(g.mem_total)}",
                         "-" if g.temp is None else f"{g.temp:.0f}C", "LOST" if g.lost else "", g.source)
        holders = self.query_one("#holders", DataTable)
        holders.clear()
        for h in d.holders:
            style = "bold red" if h.verdict == "orphan" else ""
            holders.add_row(str(h.pid), Text(visible(h.user)), Text(visible(h.name), style=style),
                            Text(visible(h.verdict), style=style), ",".join(map(visible, h.gpus)),
                            fmt_bytes(h.memory), Text(visible(h.owner)))

    def _say(self, text: str) -> None:
        self.query_one("#node-result", Static).update(Text(text))

    def _selected(self) -> HolderRow | None:
        table = self.query_one("#holders", DataTable)
        if self.detail is None or not self.detail.holders or table.cursor_row >= len(self.detail.holders):
            self.app.notify("no holder selected", severity="warning")
            return None
        return self.detail.holders[table.cursor_row]

    def action_kill(self) -> None:
        h = self._selected()
        if h is None:
            return
        from gputop.tui.dialogs.kill import KillDialog, KillTarget

        target = KillTarget(pid=h.pid, start_time=h.start_time, user=h.user, cmd=f"{h.name} on {self.host}",
                            gpu_memory=int(h.memory) if h.memory is not None else None,
                            gpus=tuple(int(g) for g in h.gpus if g.isdigit()), children=None, verdict=h.verdict)

        def done(choice):
            if choice in ("TERM", "KILL"):
                self._say(f"killing pid {h.pid} on {visible(self.host)} ({choice})…")
                self.act(kill_args(h.pid, h.start_time, choice))

        self.app.push_screen(KillDialog([target]), done)

    def action_reap(self) -> None:
        h = self._selected()
        if h is None:
            return

        def done(choice):
            if choice == "reap":
                self._say(f"reaping the tree of pid {h.pid} on {visible(self.host)}…")
                self.act(reap_args(h.pid))

        self.app.push_screen(RemoteReapDialog(self.host, h), done)

    @work(thread=True, exclusive=True, group="node-act")
    def act(self, args: list[str]) -> None:
        result = run_remote(self.host, args)
        word = "done" if result.ok else f"FAILED (exit {result.rc})"
        self.app.call_from_thread(self._say, f"{word}: {result.message}")
        self.load()

    def action_reload(self) -> None:
        self.load()

    def action_open_tui(self) -> None:
        with self.app.suspend():
            subprocess.run(gputop_argv(self.host, []))
        self.load()
