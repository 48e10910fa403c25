"""The process tree as plain data (no Textual): groups, ancestor chains and holders, sorted and filtered.

The widget reconciles its nodes against this model by key, so the model is cheap to rebuild on every
snapshot while expansion and the cursor survive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gputop.core.ledger import SOURCE_DEVICE_FILE, GpuLedger, gpu_ledgers, holder_note
from gputop.core.orphans import ORPHAN, PROTECTED, UNKNOWN
from gputop.core.procs import ProcInfo
from gputop.core.model import Holder, Snapshot
from gputop.util.units import fmt_bytes
from gputop.util.textsafe import visible

GROUP_GPU = "gpu"
GROUP_ROOT = "root"
GROUP_JOB = "job"
GROUP_ALLOC = "alloc"  # by allocation: each job's GPUs with whoever holds them (issue 29)
GROUPINGS = (GROUP_GPU, GROUP_ROOT, GROUP_JOB, GROUP_ALLOC)

# name -> (title, key function over a holder, descending by default)
SORTS: dict[str, tuple[str, bool]] = {
    "gpu-mem": ("GPU-MEM", True),
    "sm": ("SM%", True),
    "cpu": ("CPU%", True),
    "host-mem": ("HOST-MEM", True),
    "time": ("TIME", True),
    "pid": ("PID", False),
    "user": ("USER", False),
}
SORT_ORDER = tuple(SORTS)

MAX_ANCESTORS = 3  # ancestors shown above a holder that is not an orphan (details show the full chain)


def sort_value(h: Holder, key: str):
    if key == "gpu-mem":
        return h.gpu_memory if h.gpu_memory is not None else -1
    if key == "sm":
        return h.sm_util if h.sm_util is not None else -1.0
    if key == "cpu":
        return h.cpu_percent if h.cpu_percent is not None else -1.0
    if key == "host-mem":
        return h.rss if h.rss is not None else -1
    if key == "time":
        return h.runtime if h.runtime is not None else -1.0
    if key == "user":
        return h.user or "~"
    return h.pid


@dataclass
class Node:
    key: str
    kind: str  # "group" | "ancestor" | "holder"
    pid: int | None = None
    holder: Holder | None = None
    proc: ProcInfo | None = None
    gpu: int | None = None  # the group's GPU (per-GPU grouping), for plot and reset
    root: int | None = None  # the orphan root this row belongs to, if any
    title: str = ""  # group title
    children: list["Node"] = field(default_factory=list)
    _rank: object = None  # sort key of the best holder below
    standing: str | None = None  # a holder row's standing against its GPUs' allocation (None: not read)


def matches(h: Holder, text: str) -> bool:
    """Case-insensitive match on pid, user, name and command of the holder or any process in its chain."""
    if not text:
        return True
    t = text.lower()
    if t == str(h.pid):
        return True
    for p in ((h.proc,) if h.proc else ()) + h.chain:
        if t == str(p.pid) or t in p.name.lower() or t in p.cmd.lower() or (p.user and t in p.user.lower()):
            return True
    return not h.proc and t in h.cmd.lower()


def row_matches(node: "Node", text: str) -> bool:
    """The search (F3): does this row's pid, user, name or command contain ``text``?"""
    t = text.lower()
    p = node.proc
    if node.pid is not None and t in str(node.pid):
        return True
    if p is not None and (t in p.name.lower() or t in p.cmd.lower() or (p.user and t in p.user.lower())):
        return True
    return node.holder is not None and t in node.holder.cmd.lower()


def shown_chain(h: Holder) -> list[ProcInfo]:
    """The ancestors drawn above a holder, topmost first.

    An orphan: up to its orphan root (the tree that reaping removes). Otherwise: the ancestors in the
    holder's own session (up to its session leader), at most MAX_ANCESTORS, never PID 1.
    """
    out: list[ProcInfo] = []
    if h.proc is None:
        return out
    root = h.verdict.root if h.verdict.kind in (ORPHAN, PROTECTED, UNKNOWN) else None
    for p in h.chain:
        if p.pid <= 1:
            break
        if root is None and (len(out) >= MAX_ANCESTORS or p.sid != h.proc.sid):
            break  # only the holder's own session: its shell, launcher, workers
        out.append(p)
        if root is not None and p.pid == root:
            break
    if root is not None and h.pid == root:
        return []
    return list(reversed(out))


def _insert(parent: Node, group: str, h: Holder, gpu: int | None, index: dict | None = None) -> None:
    """Put ``h`` under ``parent`` below its shown chain. ``index`` maps (id(node), child key) to that
    child, so that finding a child is a lookup, not a scan of its siblings (hundreds under one launcher)."""
    if index is None:
        index = {}
    cur = parent
    root = h.verdict.root if h.verdict.kind == ORPHAN else None
    for p in shown_chain(h):
        key = f"{group}/{p.pid}"
        child = index.get((id(cur), key))
        if child is None:
            child = Node(key, "ancestor", pid=p.pid, proc=p, gpu=gpu, root=root)
            cur.children.append(child)
            index[(id(cur), key)] = child
        cur = child
    key = f"{group}/{h.pid}"
    existing = index.get((id(cur), key))
    if existing is not None:  # the holder is also an ancestor row of another holder: make it a holder row
        existing.kind, existing.holder = "holder", h
        return
    node = Node(key, "holder", pid=h.pid, holder=h, proc=h.proc, gpu=gpu, root=root)
    cur.children.append(node)
    index[(id(cur), key)] = node


def _merge_tops(g: Node) -> None:
    """One row per process in a group. A holder's chain is cut at MAX_ANCESTORS, so two holders under one
    launcher can be cut at different heights: 526>527>848>851 and 527>848>915>916 drew 527 and 848 twice
    (seen on a real node). A top row whose process is already a row deeper in the group is folded into
    that row (same process, same orphan root). Recurses into sub-groups (MIG devices)."""
    deeper: dict[str, Node] = {}  # (no nested function: a recursive closure is a cycle for the collector)
    stack = []
    for top in g.children:
        if top.kind == "group":
            _merge_tops(top)
        else:
            stack.extend(top.children)
    while stack:
        n = stack.pop()
        if n.kind != "group":
            deeper.setdefault(n.key, n)
            stack.extend(n.children)
    kept = []
    for top in g.children:
        into = deeper.get(top.key) if top.kind == "ancestor" else None
        if into is None or into is top or into.root != top.root:
            kept.append(top)
        else:
            _fold(top, into)
    g.children = kept


def _fold(src: Node, dst: Node) -> None:
    """Put ``src``'s rows under ``dst`` (the same process), merging rows of the same process."""
    if src.holder is not None and dst.holder is None:
        dst.kind, dst.holder = "holder", src.holder
    have = {c.key: c for c in dst.children}
    for c in src.children:
        same = have.get(c.key)
        if same is None:
            dst.children.append(c)
        else:
            _fold(c, same)


def _rank(node: Node, sort: str, reverse: bool):
    vals = []
    if node.holder is not None:
        vals.append(sort_value(node.holder, sort))
    for c in node.children:
        r = _rank(c, sort, reverse)
        if r is not None:
            vals.append(r)
    desc = SORTS[sort][1] != reverse
    node._rank = (max(vals) if desc else min(vals)) if vals else None
    if node.children:
        node.children.sort(key=lambda c: (c._rank is None, c.pid or 0))
        node.children.sort(key=lambda c: c._rank if c._rank is not None else 0, reverse=desc)
        # unknown ranks last, whichever the direction
        node.children.sort(key=lambda c: c._rank is None)
    return node._rank


def _group_title(head: str, holders: list[Holder], total: int | None = None) -> str:
    """``total``: how many the group holds when a filter hides some (``2 of 3 shown``)."""
    # A device-file holder's memory is unknown by nature (the ledger suffix counts them): it does not make
    # the listed holders' sum unknown (on a real node any nvidia-smi or monitor is one).
    mems = [h.gpu_memory for h in holders if h.source != SOURCE_DEVICE_FILE]
    mem = "" if not mems else (" · N/A" if any(m is None for m in mems) else f" · {fmt_bytes(sum(mems))}")
    n = len(holders)
    if total is not None and total != n:
        return f"{head} · {n} of {total} holder{'s' if total != 1 else ''} shown{mem}"
    return f"{head} · {n} holder{'s' if n != 1 else ''}{mem}"


def ledger_suffix(lg: GpuLedger | None) -> str:
    """What a GPU group's title adds from the memory ledger: the unexplained rest, the device-file holders
    and zombies among its rows, or that only a reset frees it; "" when there is nothing to explain."""
    if lg is None or not (lg.notable or lg.device_file_pids):
        return ""
    if lg.driver_held:
        return f" · {fmt_bytes(lg.used)} held by the driver: only a reset frees it (R)"
    parts = []
    if lg.unexplained is not None and lg.notable:
        parts.append(f"{fmt_bytes(lg.unexplained)} unexplained")
    if lg.device_file_pids:
        parts.append(f"{len(lg.device_file_pids)} via device file (dev)")
    if lg.zombies:
        parts.append(f"{len(lg.zombies)} zombie{'s' if len(lg.zombies) != 1 else ''}")
    return "".join(f" · {p}" for p in parts)


def holder_mark(h: Holder) -> str | None:
    """How the memory ledger marks a holder's row: found through a device file, a zombie (with the parent
    that must wait for it), the MPS server; None for a listed holder with nothing to add. For the tree's
    label and the details pane (text from processes is made safe here)."""
    n = h.notes
    if n is not None and n.zombie:
        p = n.parent
        return (f"zombie: parent {p.pid} ({visible(p.name)}) must wait for it" if p is not None
                else "zombie: its parent cannot be seen")
    note = holder_note(h)
    return visible(note) if note is not None else None


def _job_groups(holders: list[Holder]) -> list[Node]:
    """One group per Slurm job (with slurmctld's state), then the holders in no job."""
    by_job: dict[int | None, list[Holder]] = {}
    for h in holders:
        by_job.setdefault(h.job.job_id if h.job is not None else None, []).append(h)
    groups = []
    for jid in sorted(j for j in by_job if j is not None):
        on = by_job[jid]
        st = on[0].job_state
        g = Node(f"job{jid}", "group")
        index: dict = {}
        for h in on:
            _insert(g, g.key, h, h.gpus[0] if h.gpus else None, index)
        state = st.state if st is not None and st.state else "state unknown"
        g.title = _group_title(f"Slurm job {jid} ({'ended: ' if st is not None and st.ended else ''}{state})", on)
        groups.append(g)
    rest = Node("nojob", "group")
    index = {}
    for h in by_job.get(None, []):
        _insert(rest, rest.key, h, h.gpus[0] if h.gpus else None, index)
    rest.title = _group_title("not in a Slurm job", by_job.get(None, []))
    return groups + [rest]


STANDING_MARKS = {"squatter": "squatter", "outside": "outside its allocation", "unknown": "standing unknown"}


def standing_mark(node: Node) -> str:
    """The flag a holder row carries for its standing: '' for inside and unallocated (nothing to flag)."""
    return STANDING_MARKS.get(node.standing or "", "")


def _alloc_groups(snapshot: Snapshot, holders: list[Holder]) -> list[Node]:
    """One group per allocated job (its GPUs, whoever holds them: its own processes and squatters), then
    the GPUs no job has (outside and unallocated holders)."""
    alloc = snapshot.allocation
    by_job: dict[str, list[int]] = {}
    users: dict[str, str] = {}
    for g, a in sorted(alloc.by_gpu.items()) if alloc is not None else ():
        by_job.setdefault(a.job, []).append(g)
        users[a.job] = visible(a.user or str(a.uid))
    free = [d.index for d in snapshot.devices if alloc is None or alloc.of(d.index) is None]
    groups = []
    for key, head, gpus in [(f"alloc{job}", f"job {visible(job)} ({users[job]})", gs) for job, gs in by_job.items()] \
            + [("alloc-none", "allocated to no job" if alloc is not None and not alloc.error
                else "allocation unknown", free)]:
        on = [h for h in holders if set(h.gpus) & set(gpus)]
        g = Node(key, "group", gpu=gpus[0] if gpus else None)
        index: dict = {}
        for h in on:
            _insert(g, g.key, h, h.gpus[0] if h.gpus else None, index)
        flagged = [h for h in on if alloc is not None and (st := alloc.standing(h.pid)) is not None
                   and st.kind in ("squatter", "outside")]
        note = f" · {len(flagged)} flagged" if flagged else ""
        g.title = _group_title(f"{head} · GPU {','.join(map(str, gpus)) or '-'}", on) + note
        groups.append(g)
    return groups


def _gpu_alloc_note(snapshot: Snapshot, gpu: int, on: list[Holder]) -> str:
    """A GPU group's allocation: `` · job 42 (alice)`` and how many of its holders are flagged."""
    alloc = snapshot.allocation
    if alloc is None:
        return ""
    a = alloc.of(gpu)
    text = f" · job {visible(a.job)} ({visible(a.user or str(a.uid))})" if a is not None else " · no job"
    flagged = [h for h in on if (st := alloc.standing(h.pid)) is not None and st.kind in ("squatter", "outside")]
    return text + (f" · {len(flagged)} flagged" if flagged else "")


def _mark_standings(snapshot: Snapshot, groups: list[Node]) -> None:
    alloc = snapshot.allocation
    if alloc is None:
        return
    for n in walk(groups):
        if n.holder is not None:
            st = alloc.standing(n.holder.pid)
            n.standing = st.kind if st is not None else None


def build(snapshot: Snapshot, *, grouping: str = GROUP_GPU, sort: str = "gpu-mem", reverse: bool = False,
          filter_text: str = "") -> list[Node]:
    """The groups of the tree, each with its chains and holders, sorted and filtered."""
    holders = [h for h in snapshot.holders if matches(h, filter_text)]
    if grouping == GROUP_GPU:
        groups = _gpu_groups(snapshot, holders, filter_text)
    elif grouping == GROUP_JOB:
        groups = _job_groups(holders)
    elif grouping == GROUP_ALLOC:
        groups = _alloc_groups(snapshot, holders)
    else:
        groups = _root_groups(snapshot, holders, filter_text)
    mig_order = {_instance_key(m): i for i, m in enumerate(getattr(snapshot, "instances", ()))}
    for g in groups:
        _merge_tops(g)
        for c in g.children:
            _rank(c, sort, reverse)
        desc = SORTS[sort][1] != reverse
        g.children.sort(key=lambda c: c._rank if c._rank is not None else 0, reverse=desc)
        g.children.sort(key=lambda c: c._rank is None)
        if mig_order:  # MIG devices first, in NVML's order; the rest as sorted above (a stable sort)
            g.children.sort(key=lambda c: (c.kind != "group", mig_order.get(c.key, 0)))
    _mark_standings(snapshot, groups)
    return groups


def _gpu_groups(snapshot: Snapshot, holders: list[Holder], filter_text: str) -> list[Node]:
    """One group per GPU (its MIG devices as groups under it), titled with its allocation and ledger."""
    groups: list[Node] = []
    by_gpu: dict[int, list[Holder]] = {}  # one pass over the holders, not one per GPU
    for h in holders:
        for gpu in h.gpus:
            by_gpu.setdefault(gpu, []).append(h)
    ledgers = {lg.gpu: lg for lg in gpu_ledgers(snapshot)}
    for d in snapshot.devices:
        g = Node(f"gpu{d.index}", "group", gpu=d.index)
        on = by_gpu.get(d.index, [])
        index: dict = {}
        mig = _instance_groups(snapshot, g, on) if getattr(snapshot, "instances", ()) else None
        for h in on if mig is None else mig:
            _insert(g, g.key, h, d.index, index)
        title = f"GPU {d.index} {visible(d.name or '')}".rstrip()
        total = sum(d.index in h.gpus for h in snapshot.holders) if filter_text else None
        g.title = (_group_title(title + (" (lost)" if d.lost else ""), on, total)
                   + _gpu_alloc_note(snapshot, d.index, on) + ledger_suffix(ledgers.get(d.index)))
        groups.append(g)
    return groups


def _root_groups(snapshot: Snapshot, holders: list[Holder], filter_text: str) -> list[Node]:
    """One group per orphan tree root, then the holders that are not orphaned, then unknown verdicts."""
    groups: list[Node] = []
    by_root = {r.pid: r for r in snapshot.roots}
    for r in snapshot.roots:
        g = Node(f"root{r.pid}", "group", pid=r.pid, proc=r.proc, root=r.pid)
        g.gpu = r.gpus[0] if r.gpus else None
        on = [h for h in holders if h.verdict.kind == ORPHAN and h.verdict.root == r.pid]
        index = {}
        for h in on:
            _insert(g, g.key, h, h.gpus[0] if h.gpus else None, index)
        total = sum(h.verdict.kind == ORPHAN and h.verdict.root == r.pid
                    for h in snapshot.holders) if filter_text else None
        g.title = _group_title(f"orphan tree {r.pid} ({visible(r.proc.name)})", on, total)
        groups.append(g)
    rest = [h for h in holders if not (h.verdict.kind == ORPHAN and h.verdict.root in by_root)]
    # An unknown verdict is not "not orphaned": gputop could not tell (and never kills it).
    unknown = [h for h in rest if h.verdict.kind == UNKNOWN]
    for key, head, on in (("rest", "not orphaned", [h for h in rest if h.verdict.kind != UNKNOWN]),
                          ("unknown", "unknown verdict (not visible, or ancestry unreadable)", unknown)):
        if key == "unknown" and not on:
            continue
        g = Node(key, "group")
        index = {}
        for h in on:
            _insert(g, g.key, h, h.gpus[0] if h.gpus else None, index)
        g.title = _group_title(head, on)
        groups.append(g)
    return groups


def _instance_key(m) -> str:
    """The tree key of a MIG device's group (under its GPU's group, "gpu0")."""
    return f"gpu{m.gpu}/gi{m.gpu_instance_id}ci{m.compute_instance_id}"


def _instance_groups(snapshot: Snapshot, g: Node, on: list[Holder]) -> list[Holder] | None:
    """A GPU with MIG devices: one sub-group per device under ``g`` ("MIG 1g.18gb GI 5/CI 0 · 1 holder"),
    each holder under the device its use runs on; returns the holders on no listed device (they stay
    directly under the GPU), or None when the GPU has no MIG device."""
    instances = snapshot.instances_on(g.gpu)
    if not instances:
        return None
    placed: set[int] = set()
    for m in instances:
        sub = Node(_instance_key(m), "group", gpu=g.gpu)
        mine = [h for h in on if any(u.instance_key == m.key for u in h.uses)]
        index: dict = {}
        for h in mine:
            _insert(sub, sub.key, h, g.gpu, index)
            placed.add(h.pid)
        util = "N/A" if m.util_gpu is None else f"{m.util_gpu:.0f}%"
        sub.title = _group_title(f"MIG {visible(m.label)} · util {util}", mine)
        g.children.append(sub)
    return [h for h in on if h.pid not in placed]


def walk(nodes: list[Node]):
    for n in nodes:
        yield n
        yield from walk(n.children)


def max_depth(nodes: list[Node], depth: int = 0) -> int:
    best = depth
    for n in nodes:
        best = max(best, max_depth(n.children, depth + 1))
    return best
