"""The reap planner: a pure function from a process table and a root to the plan a reap carries out.

The plan names every process a reap signals and every subtree it leaves alone, each with a reason. A
member is signalled only when the orphan classifier calls it an orphan itself: a session leader of its
own session (``setsid``), or a member of a live session, is left alone with everything under it,
whatever its ancestor is. Some reasons block the whole tree, because a reap is confirmed or selected as
one unit: a protected or nohup-detached member, another user's process, one that cannot be seen or whose
verdict is unknown, and PID 1, kernel threads or gputop's own ancestors. The preview prints exactly this
plan; apply recomputes it after freezing the tree and signals only its members.

The planner also makes its own inputs from the live system (``make_rules``: the orphan classifier with the
configured protect rules, gputop's ancestors, the GPU holders, the PID namespaces) and says what a reap
answers when a plan refuses (``refusal_of``), so the reap (``reap``, ``jobreap``) and the executor, which
plans again after freezing, share one rule for both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, Protocol

from gputop.actions.common import other_user, proc_dict, safety_refusal, same_start
from gputop.core.config import Config
from gputop.core.orphans import NOT_ORPHAN, ORPHAN, PROTECTED, UNKNOWN, Verdict, classify, compile_protect
from gputop.core.ownership import NONE
from gputop.core.procs import IS_LINUX, ProcInfo, StatFields, pid_ns, pid_ns_init, pid_ns_members, self_and_ancestors
from gputop.util.errors import EXIT_NOT_FOUND, EXIT_REFUSED
from gputop.util.textsafe import visible

# Rules for a subtree left alone. Only "not-orphan" leaves the rest of the tree to be reaped.
NOT_ORPHAN_RULE = NOT_ORPHAN
BLOCKING = ("never", "other-user", PROTECTED, UNKNOWN, "hidden")


class TreeTable(Protocol):
    def get(self, pid: int) -> ProcInfo | None: ...

    def children(self, pid: int) -> list[int]: ...


@dataclass(frozen=True)
class LeftAlone:
    """A subtree the reap does not signal: its top process, why, and every process under it."""

    proc: ProcInfo | None  # None: it cannot be seen (then ``pid`` says which)
    pid: int
    rule: str  # not-orphan | pid-namespace | protected | unknown | hidden | other-user | never
    reason: str
    subtree: tuple[int, ...] = ()
    owner: str | None = None  # who manages it (a systemd unit, a container, ...), when known
    # A PID namespace's init: every process in its namespace, (host pid, pid inside the namespace)
    namespace: tuple[tuple[int, int | None], ...] = ()

    @property
    def blocks(self) -> bool:
        return self.rule in BLOCKING

    def to_dict(self) -> dict:
        d = {"pid": self.pid, "proc": proc_dict(self.proc), "rule": self.rule, "reason": self.reason,
             "subtree": list(self.subtree), "owner": self.owner, "blocks": self.blocks}
        if self.namespace:
            d["namespace"] = [{"pid": p, "ns_pid": local} for p, local in self.namespace]
        return d


@dataclass(frozen=True)
class PidNs:
    """The PID namespace a process is the init of: SIGKILL to the init kills every process in it.

    ``inode`` None: the process may be an init, but its namespace cannot be read (never signalled then)."""

    inode: int | None
    processes: tuple[tuple[int, int | None], ...] = ()  # (host pid, pid inside), the init included
    unreadable: tuple[int, ...] = ()  # processes whose namespace cannot be read (they may be in it)


@dataclass(frozen=True)
class ReapPlan:
    """What a reap of ``root_pid`` does: ``members`` are signalled; ``left_alone`` are not.

    ``refusal`` (rule, message) is set when apply must signal nothing at all."""

    root_pid: int
    root: ProcInfo | None
    members: tuple[ProcInfo, ...]  # root first, parents before children
    left_alone: tuple[LeftAlone, ...]
    holders: tuple[int, ...]  # GPU holders among the members
    refusal: tuple[str, str] | None = None

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(m.pid for m in self.members)

    @property
    def held_back(self) -> tuple[int, ...]:
        """GPU holders in subtrees left alone: the reap does not free their memory."""
        return tuple(p for e in self.left_alone for p in (e.pid, *e.subtree) if p in self._all_holders)

    _all_holders: frozenset = frozenset()
    # Process groups the reap would orphan while they hold a process it leaves alone (orphaned_groups)
    orphaned_groups: tuple = ()

    def to_dict(self) -> dict:
        d = {"root": self.root_pid, "members": [proc_dict(m) for m in self.members],
             "left_alone": [e.to_dict() for e in self.left_alone], "holders": list(self.holders),
             "held_back": list(self.held_back),
             "refusal": {"rule": self.refusal[0], "message": self.refusal[1]} if self.refusal else None}
        if self.orphaned_groups:
            d["orphaned_groups"] = [dict(g) for g in self.orphaned_groups]
        return d


@dataclass(frozen=True)
class Rules:
    """What the planner needs besides the table: every input is explicit, so the planner stays pure."""

    verdict: Callable[[int], Verdict]  # the orphan classifier over the same table
    never: frozenset[int] = frozenset()  # gputop itself and its ancestors
    holders: frozenset[int] = frozenset()  # GPU holders (for the plan's holder lists)
    hidden: Callable[[int], bool] = lambda pid: False  # exists but cannot be read
    owner: Callable[[int], str | None] = lambda pid: None  # who manages it (its cgroup owner's label), when known
    namespace: Callable[[int], PidNs | None] = lambda pid: None  # the PID namespace it is the init of, if any


def make_rules(config: Config, platform: str, table, snapshot, never: frozenset[int] | None = None,
               sampler=None) -> Rules:
    """The planner's inputs: the orphan classifier over ``table`` with the configured protect rules, where a
    GPU holder the snapshot could not tie to a visible process keeps its unknown verdict."""
    protect, cmdline = compile_protect(config.protect), compile_protect(config.protect_cmdline)
    unknown = {h.pid: h.verdict for h in snapshot.holders if h.proc is None or h.verdict.kind == UNKNOWN}
    hooks = sampler.lookups().kwargs() if sampler is not None else {}  # the sampler's owner and Slurm job lookups

    def verdict(pid: int):
        if pid in unknown:
            return unknown[pid]
        return classify(pid, table, platform=platform, protect=protect, nohup_protects=config.nohup_protects,
                        max_chain=config.max_chain, protect_cmdline=cmdline, **hooks)

    owner_of = hooks.get("owner_of")

    def owner(pid: int) -> str | None:  # who manages a subtree left alone, for the plan
        info = table.get(pid) if owner_of is not None else None
        o = owner_of(info) if info is not None else None
        return o.label if o is not None and o.kind != NONE else None

    hidden = getattr(table, "hidden", None) or (lambda pid: False)
    return Rules(verdict, frozenset(self_and_ancestors()) if never is None else never,
                 frozenset(h.pid for h in snapshot.holders), hidden, owner, namespace_reader(table))


def namespace_reader(table):
    """``pid -> PidNs | None``: the PID namespace ``pid`` is the init of, with every process in it (read
    from /proc/PID/ns/pid and NSpid); None when it is no namespace's init. One read of the namespace link
    for a process in our own namespace; the whole process table is looked at only for an init."""
    if not IS_LINUX:
        return lambda pid: None
    own = pid_ns(os.getpid())
    cache: dict[int, PidNs | None] = {}

    def namespace(pid: int) -> PidNs | None:
        if pid in cache:
            return cache[pid]
        info = table.get(pid)
        ns = pid_ns_init(pid, info.ppid, own=own) if info is not None else None
        if ns is False:
            out = PidNs(None)
        elif ns is None:
            out = None
        else:
            pids = list(table.stat_fields()) if hasattr(table, "stat_fields") and table.stat_fields() else None
            if pids is None:
                pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
            inside, unreadable = pid_ns_members(pid, ns, pids, own=own)
            out = PidNs(ns, tuple(inside), tuple(unreadable))
        cache[pid] = out
        return out

    return namespace


# A plan refused because its root is gone or is another process now: the answer is not "refused" but says so.
GONE = {"not-found": ("not-found", EXIT_NOT_FOUND), "identity-changed": ("identity-changed", EXIT_REFUSED)}


@dataclass(frozen=True)
class Refusal:
    """What a reap answers when it signals nothing to end: the result's outcome, its message and exit code,
    and the rule for the audit record's details (None where the answer is not a refusal by a rule)."""

    outcome: str
    message: str
    code: int
    rule: str | None = None


def refusal_of(plan: ReapPlan) -> Refusal | None:
    """What a reap answers when ``plan`` says it must signal nothing at all, or None when it may go on."""
    if plan.refusal is None:
        return None
    rule, message = plan.refusal
    if rule in GONE:
        outcome, code = GONE[rule]
        if rule == "not-found":
            message = f"pid {plan.root_pid} exited while the tree was being checked; nothing was signalled"
        return Refusal(outcome, message, code)
    return Refusal("refused", message, EXIT_REFUSED, rule)


def plan_gpus(plan: ReapPlan, snapshot, left_alone: bool = True) -> list[int]:
    """The GPUs the plan's processes hold (the record's target): its members, and with ``left_alone`` (a
    tree's plan) the subtrees it leaves alone too."""
    member_set = set(plan.pids)
    if left_alone:
        member_set |= {p for e in plan.left_alone for p in (e.pid, *e.subtree)}
    return sorted({g for h in snapshot.holders if h.pid in member_set for g in h.gpus})


def _label(p: ProcInfo) -> str:
    return f"pid {p.pid} ({visible(p.name)})"


def leave_reason(p: ProcInfo, owner: ProcInfo, rules: Rules) -> tuple[str, str, str | None] | None:
    """(rule, reason, owner) when member ``p`` of a tree owned by ``owner`` must not be signalled."""
    refusal = safety_refusal(p, set(rules.never))
    if refusal is not None:
        return "never", refusal[1], None
    v = rules.verdict(p.pid)
    managed = rules.owner(p.pid)
    if v.kind == NOT_ORPHAN:
        return NOT_ORPHAN_RULE, f"{_label(p)} is not an orphan: {v.reason}", managed
    if other_user(p, owner):
        who = visible(p.user) if p.user else "an unknown user"
        return "other-user", (f"{_label(p)} belongs to user {who}, not to {visible(owner.user or '?')} who owns "
                              "the root; gputop reaps a tree only when one user owns all of it"), managed
    if v.kind != ORPHAN:
        return v.kind, f"{_label(p)} is {v.kind}: {v.reason}", managed
    return None


def judge(table: TreeTable, p: ProcInfo, owner: ProcInfo, rules: Rules
          ) -> tuple[str, str, str | None, tuple[tuple[int, int | None], ...]] | None:
    """(rule, reason, owner, namespace) when ``p`` must not be signalled: ``leave_reason``, and a PID
    namespace's init whose namespace holds anything the reap would not take itself.

    SIGKILL to a namespace's init makes the kernel kill every process in the namespace, so the init is
    one unit with all of them: it is signalled only when every process in its namespace is in its own
    subtree and would be signalled anyway. A process left alone inside (a setsid'd one, another user's,
    a protected one), or one entered from outside the tree (nsenter, docker exec), keeps the init."""
    why = leave_reason(p, owner, rules)
    if why is not None:
        return (*why, ())
    ns = rules.namespace(p.pid)
    if ns is None:
        return None
    head = f"{_label(p)} is the init of a PID namespace (SIGKILL to it kills every process in it)"
    if ns.inode is None:
        return UNKNOWN, f"{head}, and gputop cannot read which processes are in that namespace", None, ()
    inner = set(_subtree(table, p.pid))
    found: list[tuple[str, str]] = []
    for q, local in ns.processes:
        if q == p.pid:
            continue
        qi = table.get(q)
        if qi is None or qi.zombie:
            if qi is None and rules.hidden(q):
                found.append(("hidden", f"pid {q} (pid {local} inside), which cannot be seen here"))
            continue
        where = f"pid {q} (pid {local} inside, {visible(qi.name)})"
        w = leave_reason(qi, owner, rules)
        if q not in inner:
            found.append((w[0] if w is not None and w[0] in BLOCKING else "pid-namespace",
                          f"{where}, entered into it from outside the tree (nsenter, docker exec)"
                          + (f": {w[1]}" if w is not None else "")))
        elif w is not None:
            found.append((w[0] if w[0] in BLOCKING else "pid-namespace", f"{where}, left alone: {w[1]}"))
    if not found and ns.unreadable:
        found.append((UNKNOWN, f"pid(s) {list(ns.unreadable)[:5]} whose namespace cannot be read"))
    if not found:
        return None
    blocking = [f for f in found if f[0] in BLOCKING]
    rule, text = (blocking or found)[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return rule, f"{head}; its PID namespace holds {text}{more}", None, ns.processes


def _subtree(table: TreeTable, pid: int, limit: int = 100000) -> tuple[int, ...]:
    out: list[int] = []
    stack, seen = [pid], {pid}
    while stack and len(out) < limit:
        for c in sorted(table.children(stack.pop(0))):
            if c not in seen:
                seen.add(c)
                info = table.get(c)
                if info is None or not info.zombie:
                    out.append(c)
                    stack.append(c)
    return tuple(out)


def walk(table: TreeTable, parents: Iterable[int], known: set[int], owner: ProcInfo,
         rules: Rules) -> tuple[list[ProcInfo], list[LeftAlone]]:
    """Every process under ``parents`` not in ``known``: the members to signal, and the subtrees to leave.

    A process left alone is not descended into: everything under it is left with it."""
    members: list[ProcInfo] = []
    left: list[LeftAlone] = []
    queue = list(parents)
    seen = set(known) | set(queue)
    while queue:
        for c in sorted(table.children(queue.pop(0))):
            if c in seen:
                continue
            seen.add(c)
            info = table.get(c)
            if info is None:
                if rules.hidden(c):
                    left.append(LeftAlone(None, c, "hidden", f"pid {c} exists but cannot be seen here (/proc "
                                          "hidepid, or another user's process)"))
                continue
            if info.zombie:
                continue  # exited: nothing to signal, and its children were reparented away
            why = judge(table, info, owner, rules)
            if why is not None:
                left.append(LeftAlone(info, c, why[0], why[1], _subtree(table, c), why[2], why[3]))
                continue
            members.append(info)
            queue.append(c)
    return members, left


def plan_reap(table: TreeTable, root_pid: int, root_start: float | None, rules: Rules) -> ReapPlan:
    """The plan for reaping the orphan tree rooted at ``root_pid`` (with start time ``root_start``)."""
    root = table.get(root_pid)
    if root is None or root.zombie:
        why = ("exists but cannot be seen here" if root is None and rules.hidden(root_pid) else "has exited")
        return ReapPlan(root_pid, None, (), (), (), ("not-found", f"pid {root_pid} {why}; nothing to reap"))
    if root_start is not None and not same_start(root.start_time, root_start):
        return ReapPlan(root_pid, root, (), (), (), ("identity-changed", f"pid {root_pid} is now a different "
                                                     "process (the PID was reused); run 'gputop reap' again"))
    refusal = _root_refusal(root, rules)
    if refusal is not None:  # nothing is planned under a root that is not an orphan root now
        return ReapPlan(root_pid, root, (), (), (), refusal)
    ns = judge(table, root, root, rules)
    if ns is not None:  # the root is a PID namespace's init that must stay (nothing else can be the reason here)
        e = LeftAlone(root, root_pid, ns[0], ns[1], _subtree(table, root_pid), ns[2], ns[3])
        return ReapPlan(root_pid, root, (), (e,), (), (ns[0], f"the tree of {_label(root)} is not reaped: {ns[1]}"),
                        _all_holders=frozenset(rules.holders))
    members, left = walk(table, [root_pid], set(), root, rules)
    members = [root, *members]
    holders = tuple(m.pid for m in members if m.pid in rules.holders)
    if refusal is None:
        blocking = [e for e in left if e.blocks]
        if blocking:
            e = blocking[0]
            refusal = (e.rule, f"the tree of {_label(root)} is not reaped: {e.reason}"
                               + (f" (and {len(blocking) - 1} more)" if len(blocking) > 1 else ""))
    orphaned = tuple(orphaned_groups(table, members, left))
    if refusal is None and orphaned:
        g = orphaned[0]
        why = (f"pid(s) {g['left_alone']} of it are left alone"
               + (f" and pid(s) {g['stopped']} are stopped" if g["stopped"] else
                  f", and gputop stops the members it reaps there ({g['members']})"))
        refusal = ("orphaned-group", f"the tree of {_label(root)} is not reaped: that would orphan process group "
                                     f"{g['pgid']} (its members' parents outside the group, {g['anchors']}, are "
                                     f"reaped), where {why}; the kernel sends SIGHUP and SIGCONT to a newly orphaned "
                                     "group with a stopped process, which would end what the plan leaves alone"
                                     + (f" (and {len(orphaned) - 1} more group(s))" if len(orphaned) > 1 else ""))
    if refusal is None and not holders:  # only a tree whose orphans hold a GPU is reaped (not one whose holders are left alone)
        refusal = ("not-orphan", f"{_label(root)} is not the root of an orphan tree that holds a GPU: no "
                                 "orphan in its tree holds one; see 'gputop reap'")
    return ReapPlan(root_pid, root, tuple(members), tuple(left), holders, refusal,
                    _all_holders=frozenset(rules.holders), orphaned_groups=orphaned)


def orphaned_groups(table: TreeTable, members: list[ProcInfo], left: list[LeftAlone]) -> list[dict]:
    """Process groups the reap would orphan while they hold a process it does not signal.

    A group is orphaned when no process in it has a parent in the same session but in another group.
    When a process's exit orphans a group that holds a stopped process, the kernel sends the whole group
    SIGHUP and SIGCONT, and SIGHUP ends a process that does not handle it. So a group is reported when
    every such parent of its processes (its "anchors") is a member, and it holds a process the reap leaves
    alone (in the plan or not in the tree at all) together with a stopped process or a member (gputop
    stops the members it reaps, and one may still be stopped when an anchor exits). Only groups of a
    left-alone process in one of the members' sessions can be affected (an anchor shares the session),
    so a plan with none costs nothing. The table must answer ``stat_fields()`` (ProcTable after a scan);
    without it nothing is reported."""
    fields = getattr(table, "stat_fields", None)
    stats = fields() if callable(fields) else {}
    if not stats or not left:
        return []
    member_pids = {m.pid for m in members}
    kept = {p for e in left for p in (e.pid, *e.subtree)}
    sessions = {stats[p].sid for p in member_pids if p in stats}
    groups = {stats[p].pgid for p in kept if p in stats and stats[p].sid in sessions}
    out = []
    for g in sorted(groups):
        procs = [i for p, st in stats.items() if st.pgid == g and (i := table.get(p)) is not None and not i.zombie]
        if not procs:
            continue
        sid = stats[procs[0].pid].sid if procs[0].pid in stats else None
        anchors = {q.ppid for q in procs if (par := stats.get(q.ppid)) is not None and par.sid == sid
                   and par.pgid != g}
        if not anchors or not anchors <= member_pids:
            continue  # stays anchored by a process the reap leaves, or is orphaned already
        left_in = [q.pid for q in procs if q.pid not in member_pids]
        stopped = [q.pid for q in procs if q.state in ("T", "t")]
        ours = [q.pid for q in procs if q.pid in member_pids]
        if left_in and (stopped or ours):
            out.append({"pgid": g, "anchors": sorted(anchors), "left_alone": left_in, "stopped": stopped,
                        "members": ours})
    return out


def plan_group(table: TreeTable, group: Iterable[int], owner: ProcInfo, rules: Rules,
               known: Iterable[int] = ()) -> ReapPlan:
    """The plan for stopping a whole group of processes known by membership, not by one root: a
    finished Slurm job's leftovers (its cgroup or environment). Every member is a leftover by
    definition, so no orphan root is required; each is still judged by ``leave_reason`` (gputop and its
    ancestors, a protected process, another user's, an unknown verdict are left alone, with everything
    under them, and reported). Nothing blocks the rest of the group. The group's tops are its members with
    no ancestor in the group; a member under another is reached by the walk down from its top (``walk``),
    so a member anywhere under a top left alone is left alone with it. Members are listed parents first.
    ``root_pid`` is 0 and ``root`` None: the plan has no single root.

    ``known``: processes already tracked (the executor's rounds, which walk under them itself): a top in
    ``known`` is neither judged nor walked again, nor listed. The rounds use this same function, so a
    round never takes what the first plan left alone."""
    pids = set(group)
    live = {p: i for p in sorted(pids) if (i := table.get(p)) is not None and not i.zombie}
    tops = [p for p in sorted(live) if not _under_group(table, p, live)]
    seen = set(known)
    members: list[ProcInfo] = []
    left: list[LeftAlone] = []
    for pid in tops:
        if pid in seen:
            continue
        info = live[pid]
        why = judge(table, info, owner, rules)
        if why is not None:
            left.append(LeftAlone(info, pid, why[0], why[1], _subtree(table, pid), why[2], why[3]))
        else:
            members.append(info)
    seen |= {p for e in left for p in (e.pid, *e.subtree)} | {m.pid for m in members}
    more, more_left = walk(table, [m.pid for m in members], seen, owner, rules)
    members += more
    left += more_left
    holders = tuple(m.pid for m in members if m.pid in rules.holders)
    return ReapPlan(0, None, tuple(members), tuple(left), holders, None, _all_holders=frozenset(rules.holders))


def _under_group(table: TreeTable, pid: int, group: dict, limit: int = 4096) -> bool:
    """True when an ancestor of ``pid`` (through processes of any kind) is in ``group``."""
    info, seen = table.get(pid), {pid}
    while info is not None and info.ppid > 1 and info.ppid not in seen and len(seen) < limit:
        if info.ppid in group:
            return True
        seen.add(info.ppid)
        info = table.get(info.ppid)
    return False


def _root_refusal(root: ProcInfo, rules: Rules) -> tuple[str, str] | None:
    refusal = safety_refusal(root, set(rules.never))
    if refusal is not None:
        return refusal
    v = rules.verdict(root.pid)
    if v.kind in (PROTECTED, UNKNOWN):
        return v.kind, (f"{_label(root)} is {v.kind}: {v.reason}; gputop never reaps protected or unknown "
                        "trees")
    if v.kind != ORPHAN or v.root != root.pid:
        why = v.reason if v.kind != ORPHAN else f"its orphan tree's root is pid {v.root}"
        return "not-orphan", (f"{_label(root)} is not the root of an orphan tree: {why}; see 'gputop reap'")
    return None


# ---- processes the tree starts during the reap, found by session and process group ----

# A lineage check reads the fields of /proc/PID/stat in StatFields (ppid, pgid, sid, start in clock ticks
# since boot): ProcTable.stat_fields() gives them for every process from the table's own scan.


@dataclass(frozen=True)
class Lineage:
    """What marks a process as the reaped tree's own after its parent has gone.

    A member that starts a worker and exits at once leaves the worker reparented to init or a subreaper,
    out of reach of a walk down the tree. The worker keeps the tree's session and process group, and it
    did not exist when the reap began: that is how the executor finds it."""

    sessions: frozenset[int]  # the members' sessions (a dead session, for an orphan tree)
    groups: frozenset[int]  # the members' process groups
    foreign_groups: frozenset[int]  # groups, in those sessions, of processes that are not the tree's
    # Every process when the reap began (pid -> its fields): a read-only view of the scan's own table, not
    # a copy (a copy of every process cost a few ms before the first signal).
    baseline: Mapping[int, StatFields] = field(hash=False)

    def is_new(self, pid: int, st: StatFields) -> bool:
        old = self.baseline.get(pid)
        return old is None or old.start != st.start

    def group_is_ours(self, st: StatFields) -> bool:
        return st.pgid in self.groups or st.pgid not in self.foreign_groups


def lineage(stats: dict[int, StatFields], members: Iterable[int]) -> Lineage:
    """The lineage of a tree whose members are ``members``, from a stat scan taken before any signal."""
    mine = {p for p in members if p in stats}
    sessions = frozenset(stats[p].sid for p in mine if stats[p].sid > 0)
    groups = frozenset(stats[p].pgid for p in mine)
    foreign = frozenset(s.pgid for p, s in stats.items() if s.sid in sessions and p not in mine) - groups
    return Lineage(sessions, groups, foreign, MappingProxyType(stats))


def joiners(stats: dict[int, StatFields], table: TreeTable, lin: Lineage, ours: set[int], owner: ProcInfo,
            rules: Rules, foreign: set[tuple[int, int]]) -> tuple[list[ProcInfo], list[LeftAlone]]:
    """Processes that joined the tree during the reap without being under a live member.

    A candidate is in one of the tree's sessions, new since the reap began, in one of the tree's process
    groups (or a group new in that session), and its parent is one of ``ours``, gone, or outside the
    session (init or a subreaper took it). Each is classified like any member (``leave_reason``): one
    the classifier does not call an orphan of this user is left alone and reported, never signalled.
    ``foreign`` (updated in place) holds new processes once seen under a live process that is not the
    tree's (another tree in the same session): they are never taken, even after their parent exits."""
    cand = _candidates(stats, lin, ours, foreign)
    # Children of a candidate are reached by the walk below, under their parent's verdict.
    tops = sorted((p for p, st in cand.items() if st.ppid not in cand), key=lambda p: (cand[p].start, p))
    members: list[ProcInfo] = []
    left: list[LeftAlone] = []
    for pid in tops:
        info = table.get(pid)
        if info is None or info.zombie:
            continue
        why = judge(table, info, owner, rules)
        if why is not None:
            left.append(LeftAlone(info, pid, why[0], why[1], _subtree(table, pid), why[2], why[3]))
        else:
            members.append(info)
    more, more_left = walk(table, [m.pid for m in members], set(ours) | {m.pid for m in members}, owner, rules)
    return members + more, left + more_left


def _candidates(stats: dict[int, StatFields], lin: Lineage, ours: set[int],
                foreign: set[tuple[int, int]]) -> dict[int, StatFields]:
    fresh = {p: st for p, st in stats.items()
             if st.sid in lin.sessions and p not in ours and lin.is_new(p, st) and (p, st.start) not in foreign
             and lin.group_is_ours(st)}
    verdict: dict[int, bool] = {}

    def ours_by_parent(pid: int, depth: int = 0) -> bool:
        if pid in verdict:
            return verdict[pid]
        st = fresh[pid]
        parent = stats.get(st.ppid)
        if st.ppid in ours or parent is None or parent.sid != st.sid:
            ok = True  # a member's child, or reparented away from a member that exited
        elif st.ppid in fresh and depth < 1000:
            ok = ours_by_parent(st.ppid, depth + 1)
        else:
            ok = False  # under a live process of the session that is not the tree's
        verdict[pid] = ok
        return ok

    out = {}
    for pid, st in fresh.items():
        if ours_by_parent(pid):
            out[pid] = st
        else:
            foreign.add((pid, st.start))
    return out
