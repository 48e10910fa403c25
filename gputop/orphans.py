"""Orphan verdicts: a pure function over a process table (any ``get(pid) -> ProcInfo | None``).

POSIX (Linux, macOS): a process is an orphan when its session leader is gone (or the PID was reused),
it is not itself a session leader, and its chain was reparented to PID 1 or a subreaper.
Windows: an ancestor's parent PID is missing, or that parent started after the child (PID reuse).
A cycle or an over-long chain is "unknown", and unknown is never killed.
With ``owner_of`` (the holder's cgroup owner, see gputop.ownership), ownership rules refine the POSIX
verdict: see apply_owner.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Protocol, Sequence

from gputop.ownership import ENDED_STATES, LIVE_STATES, SERVICE, SESSION, Owner
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
    return re.compile("|".join(f"(?:{p})" for p in pats), re.IGNORECASE)


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
    owner_of: Callable[[ProcInfo], Owner | None] | None = None,
    job_of: Callable[[ProcInfo], object] | None = None,
    job_state: Callable[[int], object] | None = None,
) -> Verdict:
    """The verdict for GPU holder ``pid``. Pure: reads only ``table`` (and ``owner_of``).

    ``walked``, when given, receives the chain the POSIX rule walked (the holder, then its ancestors up to
    but not including PID 1), so that a caller needs not walk it again. ``owner_of``, when given, says
    who owns the holder (its cgroup); the ownership rules (apply_owner) then refine the verdict.
    ``job_of`` (a process's Slurm JobRef, or None) and ``job_state`` (job id -> JobState), when given, add
    the Slurm job rule (slurm_job_rule) first: a holder whose job's state is known is judged by it alone."""
    if platform == "windows":
        return _classify_windows(pid, table, protect, max_chain)
    chain: list[ProcInfo] = walked if walked is not None else []
    verdict = _classify_posix(pid, table, protect, nohup_protects, max_chain, chain)
    job = job_of(chain[0]) if job_of is not None and job_state is not None and chain else None
    if job is not None:
        state = job_state(job.job_id)  # type: ignore[attr-defined]
        if state is not None:
            jid = job.job_id  # type: ignore[attr-defined]
            verdict = slurm_job_rule(verdict, chain, job, state,
                                     lambda m: getattr(job_of(m), "job_id", None) == jid, protect, nohup_protects)
            if state.ended is not None:
                return verdict  # the job rule decided: a job's process is judged by its job, not its session
    if owner_of is not None:
        holder = table.get(pid)
        verdict = apply_owner(verdict, owner_of(holder) if holder is not None else None)
    return verdict


def apply_owner(verdict: Verdict, owner: Owner | None) -> Verdict:
    """The ownership rules, in order, over the session test's verdict. They only ever take an orphan
    verdict away or add evidence to it; unknown stays unknown, and protection still applies.

    1. (issue 16 adds the Slurm job rule here, first: a job that ended makes an orphan, a running job
       not. It must come before the service rule: on cgroup v1, proctrack/linuxproc leaves a job's
       processes in slurmd.service.)
    2. A process in a systemd service (system or user@UID.service) is managed by systemd: never an
       orphan. A double-forked daemon started by a unit looks like a dead-session orphan from /proc alone.
       Login spawners (sshd, cron, getty, slurmd) are left to the session test: without pam_systemd their
       users' sessions live in their cgroup, and they do not stop them.
    3. A login session that logind says is active or online: its user is logged in, not an orphan.
       Closing, or gone from /run/systemd/sessions: evidence for orphan, stated in the reason. It never
       makes an orphan by itself: a setsid or tmux session that outlives the login was made on purpose.
    Containers and pods are recorded only."""
    if owner is None or verdict.kind == UNKNOWN:
        return verdict
    if owner.kind == SERVICE and not owner.login_service:
        by = f" (the user manager of uid {owner.uid}, {owner.manager})" if owner.manager else ""
        return _owner_not_orphan(verdict, f"managed by systemd unit {owner.unit}{by}")
    if owner.kind == SESSION and owner.session_state in LIVE_STATES:
        return _owner_not_orphan(verdict, f"logind session {owner.session} is {owner.session_state} "
                                          "(its user is logged in)")
    if owner.kind == SESSION and owner.session_state in ENDED_STATES and verdict.kind in (ORPHAN, PROTECTED):
        said = ("is closing (its user logged out)" if owner.session_state == "closing"
                else "is gone (logind no longer knows it)")
        ended = f"logind session {owner.session} {said}"
        if verdict.kind == ORPHAN:
            return dataclasses.replace(verdict, reason=f"{ended}; {verdict.reason}",
                                       orphan_reason=f"{ended}; {verdict.orphan_reason}")
        if verdict.orphan_reason:
            return dataclasses.replace(verdict, orphan_reason=f"{ended}; {verdict.orphan_reason}")
    return verdict


def _owner_not_orphan(verdict: Verdict, why: str) -> Verdict:
    if verdict.kind == ORPHAN:  # keep what the session test said: reap lists it as "would be an orphan"
        return Verdict(NOT_ORPHAN, f"{why}; the session test alone said: {verdict.reason}",
                       orphan_reason=verdict.orphan_reason)
    if verdict.kind == NOT_ORPHAN:
        return dataclasses.replace(verdict, reason=f"{why}; {verdict.reason}")
    # Protected: still protected, but no longer an orphan that protection saved.
    return dataclasses.replace(verdict, root=None, reaper=None, orphan_reason=None)


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


# ---- the Slurm job rule -------------------------------------------------------------------------

def slurm_job_rule(
    verdict: Verdict,
    chain: Sequence[ProcInfo],
    job,
    state,
    in_job,
    protect: re.Pattern[str] | None = None,
    nohup_protects: bool = True,
) -> Verdict:
    """The verdict for a holder that belongs to Slurm job ``job`` (a gputop.slurm.JobRef) whose state is
    ``state`` (a gputop.slurm.JobState), given the session rule's ``verdict`` and the walked ``chain``
    (holder first, up to but not including PID 1). ``in_job(member)`` says whether an ancestor belongs to
    the same job. Pure but for what ``in_job`` reads.

    - Job ended (a terminal state, COMPLETING, or forgotten by slurmctld): an orphan, whatever its session
      looks like. Its tree root is the topmost ancestor of the same job and user. Protect patterns still
      apply; the nohup mark does not (ignoring SIGHUP is how a job's process outlives it: it detaches
      from a login session, and a job has none).
    - Job alive (RUNNING, SUSPENDED, PENDING, ...): not an orphan, even if its session leader is gone.
      Protect patterns and the nohup mark apply as for any live process.
    - State unknown (no scontrol, a timeout): the session rule stands, except that its "orphan" becomes
      "unknown": gputop cannot tell whether the job still runs, and unknown is never killed.
    """
    if not chain or chain[0].pid == 1 or chain[0].kthread:
        return verdict  # the chain could not be walked (unknown stays unknown), or init / a kernel thread
    holder = chain[0]
    ended = state.ended
    if ended is None:
        if verdict.kind != ORPHAN:
            return verdict
        return Verdict(UNKNOWN, f"{state.describe()}: the session rule says orphan ({verdict.reason}), "
                                "but whether its job still runs cannot be told", root=verdict.root,
                       reaper=verdict.reaper, orphan_reason=verdict.reason)
    if not ended:
        hit = _protect_hit([m for m in chain if m.pid != 1], protect, nohup_protects)
        if hit:
            return Verdict(PROTECTED, hit)
        return Verdict(NOT_ORPHAN, f"{state.describe()}: a process of a live job is not an orphan")
    top_i = 0
    for i, member in enumerate(chain[1:], 1):
        if member.kthread or member.uid != holder.uid or not in_job(member):
            break
        top_i = i
    root = chain[top_i]
    reason = f"{state.describe()}; tree root pid {root.pid} ({root.name})"
    hit = _protect_hit(chain[: top_i + 1], protect, False)
    kind = PROTECTED if hit else ORPHAN
    return Verdict(kind, hit or reason, root=root.pid, reaper=root.ppid, orphan_reason=reason)
