"""What the main screen shows, apart from the widgets: how the tree is grouped, sorted and filtered, what is
selected, and the top bar's line. Plain data and functions (no widget, no Textual)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.text import Text

from gputop.core.model import Snapshot
from gputop.tui import process_tree
from gputop.tui.rows import GROUP_ALLOC, GROUP_GPU, GROUP_JOB, GROUP_ROOT, SORT_ORDER
from gputop.tui.side_panel import PanelData
from gputop.util.textsafe import visible

GROUP_NAMES = {GROUP_GPU: "GPU", GROUP_ROOT: "orphan root", GROUP_JOB: "Slurm job", GROUP_ALLOC: "allocation"}


def has_jobs(snapshot: Snapshot | None) -> bool:
    """Some holder belongs to a Slurm job (a Slurm node: a JOB column, and grouping per job)."""
    return snapshot is not None and any(h.job is not None for h in snapshot.holders)


@dataclass
class ViewState:
    """How the tree is grouped, sorted and filtered, and what the search box holds."""

    grouping: str = GROUP_GPU
    sort_key: str = "gpu-mem"
    sort_reverse: bool = False
    filter_text: str = ""
    search_text: str = ""

    def next_grouping(self, snapshot: Snapshot | None) -> str:
        """GPU -> orphan root -> Slurm job (only where a holder is in a job) -> allocation (only where a
        scheduler's allocation is read) -> GPU."""
        alloc = GROUP_ALLOC if snapshot is not None and snapshot.allocation is not None else GROUP_GPU
        nxt = {GROUP_GPU: GROUP_ROOT, GROUP_ROOT: GROUP_JOB if has_jobs(snapshot) else alloc,
               GROUP_JOB: alloc, GROUP_ALLOC: GROUP_GPU}
        self.grouping = nxt.get(self.grouping, GROUP_GPU)
        return self.grouping

    def next_sort(self) -> None:
        self.sort_key = SORT_ORDER[(SORT_ORDER.index(self.sort_key) + 1) % len(SORT_ORDER)]

    def build_args(self) -> dict:
        """The arguments of rows.build for this view."""
        return {"grouping": self.grouping, "sort": self.sort_key, "reverse": self.sort_reverse,
                "filter_text": self.filter_text}


@dataclass(frozen=True)
class Selection:
    pid: int | None
    holder: object | None
    proc: object | None
    gpu: int | None
    root: int | None

    @classmethod
    def of(cls, node, snapshot: Snapshot | None) -> "Selection":
        """The selection on the tree row ``node`` (a rows.Node, or None), its holder as ``snapshot`` has it."""
        if node is None:
            return cls(None, None, None, None, None)
        holder = node.holder
        if holder is not None and snapshot is not None:
            holder = snapshot.holder(holder.pid) or holder
        return cls(node.pid, holder, node.proc, node.gpu, node.root)

    def gpu_or_first(self, snapshot: Snapshot | None) -> int | None:
        """The GPU of the selected row: its group's, else the holder's first, else the first GPU."""
        if self.gpu is not None:
            return self.gpu
        if self.holder is not None and self.holder.gpus:
            return self.holder.gpus[0]
        if snapshot and snapshot.devices:
            return snapshot.devices[0].index
        return None


@dataclass(frozen=True)
class TopBarFacts:
    """What the top bar says besides the snapshot and the view."""

    readonly: bool = False
    demo: bool = False
    devices_only: bool = False  # the device panes are up, the first full sample is not
    tagged: int = 0
    panel: PanelData = field(default_factory=PanelData)
    sample_error: str | None = None


def topbar_text(s: Snapshot | None, view: ViewState, facts: TopBarFacts, width: int | None = None) -> Text:
    """The top line. Given ``width``, parts that matter least are left out until it fits (the grouping,
    then the host, then "guard off"), so that the clock and what the user changed (filter, tags) stay."""
    parts: list[tuple[Text, int]] = []  # (part, rank): the highest rank is left out first; 0 stays

    def add(text: str | Text, style: str = "", rank: int = 0) -> None:
        parts.append((text if isinstance(text, Text) else Text(text, style=style), rank))

    add(" gputop ", "bold reverse")
    if facts.readonly:
        add(" READ-ONLY", "bold reverse")
    if facts.demo:
        add(" DEMO", "bold reverse yellow")
    if s is None:
        add("  reading processes…" if facts.devices_only else "  waiting for the first sample…")
    else:
        add(f" {visible(s.host)}", rank=2)
        add(f"  {len(s.devices)} GPU  {len(s.holders)} holder{'s' if len(s.holders) != 1 else ''}  ")
        if s.roots:
            add(f"{len(s.roots)} orphan tree{'s' if len(s.roots) != 1 else ''}", process_tree.ORPHAN_STYLE)
        else:
            add("no orphans")
    # What the user changed comes first: the line is cut at the right on a narrow terminal.
    if view.filter_text:
        add(Text.assemble("  filter ", Text(repr(view.filter_text), style="bold")))
    if facts.tagged:
        add(f"  {facts.tagged} tagged", "bold")
    if facts.panel.guard_available:
        mode = facts.panel.guard_mode or "off"
        add(Text.assemble("  guard ", (mode, {"enforce": "bold red", "dry-run": "bold yellow"}.get(mode, ""))),
            rank=1 if mode == "off" else 0)
    add(f"  by {GROUP_NAMES[view.grouping]}", rank=3)
    tail = Text()  # the clock and a failure: kept whole at the right end, whatever is cut before them
    if s is not None:
        tail.append(f"  {time.strftime('%H:%M:%S', time.localtime(s.at))}")
    if facts.sample_error:
        tail.append("  sampling failed", style="bold red")
    if width is not None:
        for rank in (3, 2, 1):
            if sum(p.cell_len for p, _ in parts) + tail.cell_len <= width:
                break
            parts = [(p, r) for p, r in parts if r != rank]
    t = Text()
    for p, _ in parts:
        t.append_text(p)
    if width is not None and t.cell_len + tail.cell_len > width:  # a long filter, many tags: cut before the clock
        t.truncate(max(1, width - tail.cell_len), overflow="ellipsis")
    t.append_text(tail)
    return t
