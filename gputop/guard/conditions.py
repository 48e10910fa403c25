"""Condition values and operators: what one condition measures on one target, and whether it holds.

A target is a GPU-holding process, or a user (for ``scope: per_user``). An unknown value (a field the
vendor library does not report) never satisfies a condition: the guard does not act on what it cannot see.
"""

from __future__ import annotations

import datetime as _dt
import operator as _op
from dataclasses import dataclass, field

from gputop.guard.mig_place import places
from gputop.guard.policy import Condition
from gputop.core.orphans import ORPHAN
from gputop.core.model import Holder, Snapshot
from gputop.util.textsafe import visible
from gputop.util.units import fmt_bytes, fmt_duration

_NUM = {">": _op.gt, ">=": _op.ge, "<": _op.lt, "<=": _op.le, "==": _op.eq, "!=": _op.ne}
PROCESS_LEVEL = ("process_name", "cmdline", "gpu_utilization", "gpu_memory", "runtime", "orphan", "gpu",
                 "unexplained_memory", "source")


@dataclass(frozen=True)
class Facts:
    """Per-snapshot aggregates: the user-level numbers, computed once per evaluation."""

    user_memory: dict[str, int]
    user_memory_unknown: dict[str, int]  # processes whose memory is unknown, per user
    user_count: dict[str, int]
    user_holders: dict[str, tuple[Holder, ...]]
    ledgers: dict = field(default_factory=dict)  # GPU -> its memory ledger (gputop.core.ledger), made on first use

    @classmethod
    def of(cls, snap: Snapshot, exclude: frozenset[int] = frozenset()) -> "Facts":
        mem: dict[str, int] = {}
        unknown: dict[str, int] = {}
        count: dict[str, int] = {}
        holders: dict[str, list[Holder]] = {}
        for h in snap.holders:
            if h.user is None or h.pid in exclude:
                continue
            count[h.user] = count.get(h.user, 0) + 1
            holders.setdefault(h.user, []).append(h)
            m = h.gpu_memory
            if m is None:
                unknown[h.user] = unknown.get(h.user, 0) + 1
            else:
                mem[h.user] = mem.get(h.user, 0) + m
            mem.setdefault(h.user, 0)
        return cls(mem, unknown, count, {u: tuple(v) for u, v in holders.items()})


@dataclass(frozen=True)
class Target:
    """What a rule is evaluated on: one process (holder) or one user."""

    kind: str  # "process" | "user"
    key: tuple
    user: str | None
    holder: Holder | None = None

    @property
    def label(self) -> str:
        if self.kind == "allocation":
            return f"GPU {self.key[1]} (allocated to job {visible(self.key[2])}, user {visible(self.user or '?')})"
        if self.holder is not None:
            return f"pid {self.holder.pid} ({visible(self.holder.name)}, user {self.user or '?'})"
        return f"user {self.user}"

    @property
    def pid(self) -> int | None:
        return self.holder.pid if self.holder else None

    @classmethod
    def process(cls, h: Holder) -> "Target":
        return cls("process", ("pid", h.pid, h.start_time), h.user, h)

    @classmethod
    def for_user(cls, user: str) -> "Target":
        return cls("user", ("user", user), user, None)

    @classmethod
    def for_allocation(cls, gpu: int, job: str, user: str | None) -> "Target":
        """An allocated GPU (rules with allocation_idle): key (allocation, gpu, job)."""
        return cls("allocation", ("allocation", gpu, job), user, None)


@dataclass(frozen=True)
class Measured:
    value: object  # None: unknown
    text: str  # the value as shown to a person, including where it came from
    source: str = ""  # e.g. "process SM%" or "device utilization"


@dataclass(frozen=True)
class Outcome:
    ok: bool
    measured: Measured
    detail: str  # e.g. "gpu_utilization 99% (process SM%) > 95: true"
    extra: dict = field(default_factory=dict)


def measure(cond: Condition, target: Target, snap: Snapshot, facts: Facts) -> Measured:
    t = cond.type
    h = target.holder
    if t == "user":
        return Measured(target.user, repr(target.user) if target.user else "unknown")
    if t in ("user_memory", "process_count"):
        user = target.user
        if user is None:
            return Measured(None, "unknown (the process's user cannot be read)")
        if t == "process_count":
            n = facts.user_count.get(user, 0)
            return Measured(n, f"{n} GPU process(es) of user {user}")
        total = facts.user_memory.get(user, 0)
        unknown = facts.user_memory_unknown.get(user, 0)
        note = f"; {unknown} process(es) with unknown memory not counted" if unknown else ""
        if total == 0 and unknown:
            return Measured(None, f"unknown (user {user}'s processes report no memory)")
        return Measured(total, f"{fmt_bytes(total)} ({total} bytes) across all GPUs of user {user}{note}")
    if t == "time_window":
        when = _dt.datetime.fromtimestamp(snap.at)
        return Measured(when, when.strftime("%a %H:%M (local time)"))
    if t in ("standing", "allocation_idle"):
        return measure_allocation(t, target, snap)
    if h is None:
        return Measured(None, "n/a for a per-user target")
    if t == "process_name":
        return Measured(h.name if h.proc else None, repr(h.name) if h.proc else "unknown")
    if t == "cmdline":
        return Measured(h.cmd if h.proc else None, repr(h.cmd[:200]) if h.proc else "unknown")
    if t == "gpu_utilization":
        if h.sm_util is not None:
            return Measured(h.sm_util, f"{h.sm_util:.0f}% (process SM%)", "process")
        utils = [(d.util_gpu, d.index) for g in h.gpus if (d := snap.device(g)) is not None
                 and d.util_gpu is not None]
        if utils:
            u, idx = max(utils)
            return Measured(u, f"{u:.0f}% (device GPU {idx} utilization; process SM% unknown)", "device")
        return Measured(None, "unknown (no process SM% and no device utilization)")
    if t == "gpu_memory":
        m = h.gpu_memory
        return Measured(m, f"{fmt_bytes(m)} ({m} bytes)" if m is not None else "unknown (not reported)")
    if t == "runtime":
        r = h.runtime
        return Measured(r, fmt_duration(r) if r is not None else "unknown")
    if t == "orphan":
        return Measured(h.verdict.kind == ORPHAN, f"{h.verdict.kind == ORPHAN} (verdict {h.verdict.kind})")
    if t == "gpu":  # its GPU indexes, and on MIG its instances (gputop.guard.mig_place)
        where = places(h, snap)
        mig = sorted(p for p in where if isinstance(p, str) and "/" in p)
        return Measured(where, f"GPU {','.join(map(str, h.gpus)) or 'none'}" + (f" (MIG {', '.join(mig)})" if mig else ""))
    if t == "unexplained_memory":
        return _unexplained(h, snap, facts)
    if t == "source":
        return Measured(h.source, repr(h.source))
    raise ValueError(f"unknown condition type {t}")  # pragma: no cover - validated at load


def measure_allocation(t: str, target: Target, snap: Snapshot) -> Measured:
    """standing (a process's, against its GPUs' allocation) and allocation_idle (an allocated GPU's time
    without a holder). Unknown (no scheduler read, or its answer unknown) never satisfies a condition."""
    alloc = snap.allocation
    if alloc is None:
        return Measured(None, "unknown (no scheduler allocation is read on this node)")
    if t == "allocation_idle":
        if target.kind != "allocation":
            return Measured(None, "n/a: allocation_idle is measured on an allocated GPU")
        idle = alloc.idle_for(target.key[1], snap.at)
        if idle is None:  # a process holds it: not idle at all (never true, whatever the operator)
            return Measured(None, "n/a (a process holds the GPU now)")
        return Measured(idle, f"{fmt_duration(idle)} without a holder")
    h = target.holder
    st = alloc.standing(h.pid) if h is not None else None
    if st is None or st.kind == "unknown":
        return Measured(None, f"unknown ({visible(st.reason) if st is not None else 'no standing for this target'})")
    return Measured(st.kind, f"{st.kind} ({visible(st.reason)})")


def _unexplained(h: Holder, snap: Snapshot, facts: Facts) -> Measured:
    """The largest unexplained rest among the holder's GPUs (the ledgers are made once an evaluation)."""
    from gputop.core.ledger import gpu_ledgers

    if not facts.ledgers:
        facts.ledgers.update({lg.gpu: lg for lg in gpu_ledgers(snap)} or {-1: None})
    best: tuple[int, int] | None = None
    for g in h.gpus:
        lg = facts.ledgers.get(g)
        if lg is not None and lg.unexplained is not None and (best is None or lg.unexplained > best[0]):
            best = (lg.unexplained, g)
    if best is None:
        return Measured(None, "unknown (no GPU of this process reports its used memory, or a listed amount "
                              "is unknown)")
    return Measured(best[0], f"{fmt_bytes(best[0])} ({best[0]} bytes) unexplained on GPU {best[1]}")


def compare(cond: Condition, actual: object) -> bool:
    """Apply the operator. ``actual`` is known (not None)."""
    op, want, t = cond.operator, cond.value, cond.type
    if t == "time_window":
        inside = want.contains(actual)  # type: ignore[union-attr]
        return inside if op == "in" else not inside
    if t == "gpu":
        gpus = set(actual)  # type: ignore[arg-type]
        if op in ("==", "in"):
            wanted = {want} if isinstance(want, (int, str)) else set(want)  # type: ignore[arg-type]
            return bool(gpus & wanted)
        wanted = {want} if isinstance(want, (int, str)) else set(want)  # type: ignore[arg-type]
        return not gpus & wanted
    if op in _NUM:
        if isinstance(want, str):  # string ==/!=: exact
            return _NUM[op](str(actual), want)
        return _NUM[op](actual, want)
    text = str(actual)
    if op == "contains":
        return str(want).lower() in text.lower()
    if op == "contains_any":
        low = text.lower()
        return any(str(w).lower() in low for w in want)  # type: ignore[union-attr]
    if op == "matches":
        return bool(want.search(text))  # type: ignore[union-attr]
    if op == "in":
        return text in want  # type: ignore[operator]
    if op == "not_in":
        return text not in want  # type: ignore[operator]
    raise ValueError(f"unknown operator {op}")  # pragma: no cover - validated at load


def _want_text(cond: Condition) -> str:
    v = cond.raw
    if isinstance(v, tuple):
        v = list(v)
    if cond.type in ("gpu_memory", "user_memory", "unexplained_memory") and isinstance(cond.value, int):
        return f"{fmt_bytes(cond.value)} ({cond.value} bytes)"
    if cond.type == "time_window":
        return str(v)
    return repr(v) if isinstance(v, (str, list)) else str(v)


def evaluate(cond: Condition, target: Target, snap: Snapshot, facts: Facts) -> Outcome:
    """Does ``cond`` hold for ``target`` right now (ignoring its duration)?"""
    m = measure(cond, target, snap, facts)
    if m.value is None:
        return Outcome(False, m, f"{cond.type} is {m.text}: not acting on an unknown value")
    ok = compare(cond, m.value)
    return Outcome(ok, m, f"{cond.type} {m.text} {cond.operator} {_want_text(cond)}: {str(ok).lower()}")
