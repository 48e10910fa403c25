"""Orphan verdicts: a pure function over a process table (any ``get(pid) -> ProcInfo | None``).

POSIX (Linux, macOS): a process is an orphan when its session leader is gone (or the PID was reused),
it is not itself a session leader, and its chain was reparented to PID 1 or a subreaper.
Windows: an ancestor's parent PID is missing, or that parent started after the child (PID reuse).
A cycle or an over-long chain is "unknown", and unknown is never killed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol, Sequence

from gputop.procs import ProcInfo

ORPHAN = "orphan"
NOT_ORPHAN = "not-orphan"
PROTECTED = "protected"
UNKNOWN = "unknown"
VERDICTS = (ORPHAN, NOT_ORPHAN, PROTECTED, UNKNOWN)

DEFAULT_PROTECT = (
    "jupyter", "nohup", "tmux", "screen", "code-server",
    "explorer.exe", "services.exe", "svchost.exe",
)
DEFAULT_MAX_CHAIN = 64
# Start times are rounded to the clock tick; allow for that when comparing parent and child.
_TICK = 0.011


class Table(Protocol):
    def get(self, pid: int) -> ProcInfo | None: ...


@dataclass(frozen=True)
class Verdict:
    kind: str  # one of VERDICTS
    reason: str
    root: int | None = None  # orphan root PID (the topmost live ancestor that lost its origin)
    reaper: int | None = None  # PID the chain was reparented to (1 or a subreaper)
    orphan_reason: str | None = None  # for protected/unknown: what the orphan test said, if it ran


def compile_protect(patterns: Sequence[str]) -> re.Pattern[str] | None:
    """One case-insensitive regex from a list of patterns; None for an empty list."""
    pats = [p for p in patterns if p]
    if not pats:
        return None
    joined = "|".join(f"(?:{p})" for p in pats)
    if tuple(pats) == tuple(DEFAULT_PROTECT):  # our own plain words: safe for re, and no RE2 start-up cost
        return re.compile(joined, re.IGNORECASE)
    from gputop import saferegex  # bounded (RE2): the list comes from a config, the text from other users

    return saferegex.compile(joined, ignore_case=True)


@lru_cache(maxsize=8192)
def _protect_match(protect: re.Pattern[str], name: str, cmdline: tuple[str, ...]) -> str | None:
    # Memoised: holders share most of their ancestors, and the same processes come back every refresh,
    # while a search over a long command line costs microseconds.
    hit = protect.search(name) or protect.search(" ".join(cmdline) if cmdline else f"[{name}]")
    return hit.group(0) if hit else None


def _protect_hit(
    members: Sequence[ProcInfo], protect: re.Pattern[str] | None, nohup_protects: bool
) -> str | None:
    for m in members:
        if protect is not None:
            hit = _protect_match(protect, m.name, m.cmdline)
            if hit is not None:
                return f"pid {m.pid} ({m.name}) matches protect pattern '{hit}'"
        if nohup_protects and m.sighup_ignored:
            return f"pid {m.pid} ({m.name}) ignores SIGHUP: detached with nohup"
    return None


def protect_reason(member: ProcInfo, protect: re.Pattern[str] | None, nohup_protects: bool) -> str | None:
    """Why one process is protected (protect list or nohup mark), or None: the rule every path uses."""
    return _protect_hit((member,), protect, nohup_protects)


def classify(
    pid: int,
    table: Table,
    *,
    platform: str = "posix",
    protect: re.Pattern[str] | None = None,
    nohup_protects: bool = True,
    max_chain: int = DEFAULT_MAX_CHAIN,
    walked: list[ProcInfo] | None = None,
) -> Verdict:
    """The verdict for GPU holder ``pid``. Pure: reads only ``table``.

    ``walked``, when given, receives the chain the POSIX rule walked (the holder, then its ancestors up to
    but not including PID 1), so that a caller needs not walk it again."""
    if platform == "windows":
        return _classify_windows(pid, table, protect, max_chain)
    return _classify_posix(pid, table, protect, nohup_protects, max_chain, walked)


def _walk(pid: int, table: Table, max_chain: int) -> tuple[list[ProcInfo], str | None]:
    """Holder and ancestors up to (excluding) PID 1; an error string on a cycle, gap or over-long chain."""
    holder = table.get(pid)
    if holder is None:
        return [], f"pid {pid} is not visible (another PID namespace, or it has exited)"
    chain = [holder]
    seen = {pid}
    cur = holder
    while cur.ppid > 1:
        if cur.ppid in seen:
            return chain, f"ancestor chain has a cycle at pid {cur.ppid}"
        if len(chain) >= max_chain:
            return chain, f"ancestor chain is longer than {max_chain}"
        parent = table.get(cur.ppid)
        if parent is None:
            return chain, f"parent pid {cur.ppid} of pid {cur.pid} vanished during the scan"
        seen.add(cur.ppid)
        chain.append(parent)
        cur = parent
    return chain, None


def _init_in_hidden_session(table: Table) -> bool:
    init = table.get(1)
    return init is not None and init.sid == 0


def _classify_posix(
    pid: int, table: Table, protect: re.Pattern[str] | None, nohup_protects: bool, max_chain: int,
    walked: list[ProcInfo] | None = None,
) -> Verdict:
    chain, err = _walk(pid, table, max_chain)
    if err:
        return Verdict(UNKNOWN, err)
    if walked is not None:
        walked.extend(chain)
    holder = chain[0]
    if holder.pid == 1 or holder.kthread:
        return Verdict(NOT_ORPHAN, "init or a kernel thread")

    orphan_reason: str | None = None
    root = reaper = None
    protect_members: Sequence[ProcInfo] = chain
    if holder.sid is None:
        return Verdict(UNKNOWN, "session id is unknown")
    top_of_chain = chain[-1]
    if top_of_chain.ppid == 0 and top_of_chain.pid != 1:
        # Its parent lives outside this PID namespace (docker exec, a container runtime). An orphan is
        # reparented to the namespace's init, so a parent PID of 0 means that parent is still alive.
        kind, reason = NOT_ORPHAN, (f"pid {top_of_chain.pid} ({top_of_chain.name}) was started from outside "
                                    "this PID namespace, and that parent is alive")
    elif holder.sid == 0 and _init_in_hidden_session(table):
        # A container started without a tty (docker run, a Kubernetes pod, a CI runner): its init did not
        # call setsid, so the whole container runs in one session whose leader is outside the namespace.
        # That session lasts as long as the container; no login session ended under this process.
        kind, reason = NOT_ORPHAN, ("it runs in the container's own session, which PID 1 shares (its leader is "
                                    "outside this PID namespace), so no login session ended under it")
    elif holder.sid == 0:
        return Verdict(UNKNOWN, "its session leader is outside this PID namespace: gputop cannot tell "
                                "whether it is alive")
    elif holder.sid == holder.pid:
        kind, reason = NOT_ORPHAN, "session leader itself (started deliberately with setsid, a daemon or a service)"
    else:
        leader = table.get(holder.sid)
        if leader is not None and not leader.zombie and leader.start_time <= holder.start_time + _TICK:
            kind, reason = NOT_ORPHAN, f"session leader pid {leader.pid} ({leader.name}) is alive"
        else:
            lost = (
                f"session leader pid {holder.sid} is gone"
                if leader is None or leader.zombie
                else f"session leader pid {holder.sid} was reused (it started after the process)"
            )
            # The topmost member of the holder's session was reparented: its parent is init, or
            # a process outside the session, which can only be a subreaper that adopted it.
            top, top_i = chain[0], 0
            for i, member in enumerate(chain[1:], 1):
                if member.sid != holder.sid:
                    break
                top, top_i = member, i
            root = top.pid
            reaper = top.ppid
            reaper_info = table.get(reaper) if reaper > 0 else None
            reaper_name = reaper_info.name if reaper_info else "init"
            kind = ORPHAN
            via = "init" if reaper <= 1 else f"subreaper pid {reaper} ({reaper_name})"
            reason = f"{lost}; tree root pid {root} ({top.name}) was reparented to {via}"
            orphan_reason = reason
            # PID 1 and the subreaper are never checked for protection.
            protect_members = chain[: top_i + 1]
    if kind != ORPHAN:
        protect_members = [m for m in chain if m.pid != 1]
    hit = _protect_hit(protect_members, protect, nohup_protects)
    if hit:
        return Verdict(PROTECTED, hit, root=root, reaper=reaper, orphan_reason=orphan_reason)
    return Verdict(kind, reason, root=root, reaper=reaper, orphan_reason=orphan_reason)


def _classify_windows(
    pid: int, table: Table, protect: re.Pattern[str] | None, max_chain: int
) -> Verdict:
    """Windows keeps a dead parent's PID as the PPID: the parent is missing, or was reused."""
    holder = table.get(pid)
    if holder is None:
        return Verdict(UNKNOWN, f"pid {pid} is not visible")
    chain = [holder]
    seen = {pid}
    cur = holder
    root = None
    reason = None
    while cur.ppid > 0:
        if cur.ppid in seen:
            return Verdict(UNKNOWN, f"ancestor chain has a cycle at pid {cur.ppid}")
        if len(chain) >= max_chain:
            return Verdict(UNKNOWN, f"ancestor chain is longer than {max_chain}")
        parent = table.get(cur.ppid)
        if parent is None:
            root, reason = cur, f"parent pid {cur.ppid} of pid {cur.pid} ({cur.name}) is missing"
            break
        if parent.start_time > cur.start_time + _TICK:
            root = cur
            reason = f"parent pid {cur.ppid} of pid {cur.pid} ({cur.name}) was reused (it started after the child)"
            break
        seen.add(cur.ppid)
        chain.append(parent)
        cur = parent
    if root is None:
        members = chain
        hit = _protect_hit(members, protect, False)
        if hit:
            return Verdict(PROTECTED, hit)
        return Verdict(NOT_ORPHAN, "every ancestor's parent is alive")
    members = chain[: chain.index(root) + 1]
    hit = _protect_hit(members, protect, False)
    if hit:
        return Verdict(PROTECTED, hit, root=root.pid, orphan_reason=reason)
    return Verdict(ORPHAN, reason, root=root.pid, orphan_reason=reason)
