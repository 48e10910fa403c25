"""Orphan verdicts: a pure function over a process table (any ``get(pid) -> ProcInfo | None``).

POSIX (Linux, macOS): a process is an orphan when its session leader is gone (or the PID was reused),
it is not itself a session leader, and its chain was reparented to PID 1 or a subreaper.
Windows: an ancestor's parent PID is missing, or that parent started after the child (PID reuse).
A cycle or an over-long chain is "unknown", and unknown is never killed.
With ``owner_of`` (the holder's cgroup owner, see gputop.core.ownership), ownership rules refine the POSIX
verdict: see apply_owner.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from collections.abc import Callable, Sequence

from gputop.core.disguise import disguise
from gputop.core.defaults import DEFAULT_MAX_CHAIN, DEFAULT_PROTECT, DEFAULT_PROTECT_CMDLINE  # noqa: F401 (re-exported)
from gputop.core.ownership import ENDED_STATES, LIVE_STATES, SERVICE, SESSION, Owner
from gputop.core.procs import ProcInfo
from gputop.util.textsafe import visible

ORPHAN = "orphan"
NOT_ORPHAN = "not-orphan"
PROTECTED = "protected"
UNKNOWN = "unknown"
VERDICTS = (ORPHAN, NOT_ORPHAN, PROTECTED, UNKNOWN)
# Start times are rounded to the clock tick; allow for that when comparing parent and child.
_TICK = 0.011


class Table:
    """What classify() reads processes through (a ProcTable, or a test's own table): the interface only,
    not a base class (typing.Protocol would import typing at start-up)."""

    def get(self, pid: int) -> ProcInfo | None: ...

    # Optional: ``hidden(pid) -> bool``, True when ``pid`` exists but cannot be read (hidepid, another
    # user's process). A table without it cannot tell hidden from gone, and treats missing as gone.
    # Optional: ``exe(pid) -> str | None``, the executable /proc/PID/exe names (None: unreadable). Without
    # it, a name pattern's disguise test compares the name with argv[0] only (gputop.core.disguise).


def verdict_inputs(p: ProcInfo) -> tuple:
    """Everything of one process that a verdict may read: all of ProcInfo but what changes while a process
    merely runs (CPU time, RSS, and the run state R/S/D, of which only "exited" (``zombie``) counts).
    Two processes with equal inputs get the same verdict from the same table answers, so a sampler may
    keep a verdict while every process it read still gives these (see Sampler's verdict memo). A field
    that classify() starts to read must be added here (tests/unit/test_verdict_memo.py checks)."""
    return (p.pid, p.ppid, p.name, p.cmdline, p.start_time, p.uid, p.user, p.sid, p.zombie, p.half_exited,
            p.sighup_ignored, p.kthread)


def _hidden(table: Table, pid: int) -> bool:
    fn = getattr(table, "hidden", None)
    return bool(fn(pid)) if fn is not None else False


def _n(p: ProcInfo) -> str:
    """A process name fit for a reason string: reasons reach terminals."""
    return visible(p.name)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What classify() says of one holder: its kind, why, and for an orphan its tree root and reaper."""

    kind: str  # one of VERDICTS
    reason: str
    root: int | None = None  # orphan root PID (the topmost live ancestor that lost its origin)
    reaper: int | None = None  # PID the chain was reparented to (1 or a subreaper)
    orphan_reason: str | None = None  # for protected/unknown: what the orphan test said, if it ran


_SOURCES: dict[str, tuple[str, ...]] = {}  # a joined pattern -> the patterns it was joined from


def _which(protect, hit: str, whole: bool) -> str:
    """The pattern (as the config wrote it) of the joined ``protect`` that matched ``hit``: a reason
    quotes the pattern, not the text it matched. The joined text if it cannot be told."""
    from gputop.util import saferegex

    for p in _SOURCES.get(protect.pattern, ()):
        try:
            one = saferegex.compile(p, ignore_case=True)
        except saferegex.PatternError:
            continue
        if (one.fullmatch(hit) if whole else one.search(hit)):
            return p
    return protect.pattern


def compile_protect(patterns: Sequence[str]) -> re.Pattern[str] | None:
    """One case-insensitive regex from a list of patterns; None for an empty list."""
    pats = [p for p in patterns if p]
    if not pats:
        return None
    joined = "|".join(f"(?:{p})" for p in pats)
    _SOURCES[joined] = tuple(pats)
    if tuple(pats) in (tuple(DEFAULT_PROTECT), tuple(DEFAULT_PROTECT_CMDLINE)):  # our own: safe for re, and
        # no RE2 start-up cost (~25 ms and 2.5 MiB of RSS in the TUI)
        return re.compile(joined, re.IGNORECASE)
    from gputop.util import saferegex  # bounded (RE2): the list comes from a config, the text from other users

    return saferegex.compile(joined, ignore_case=True)


# The matches below are memoised: holders share most of their ancestors, and the same processes come back
# every refresh. A memo keeps its keys alive after the process exits, and command lines are other users'
# text of up to 2 MiB each: only keys up to MEMO_MAX_CHARS are kept (at most 8,192 x ~1 KiB each);
# a longer one is matched every time (linear-time, and rare).
MEMO_MAX_CHARS = 1024


def _protect_match(protect: re.Pattern[str], name: str, argv0: str) -> str | None:
    # A protect pattern says what a program is: it matches the WHOLE process name or argv[0]'s basename
    # (anchored: 'tmux' protects 'tmux', not 'xmrig-tmux'), never a word inside an argument or a path
    # ("--out=/data/screenshots" is not "screen").
    if len(argv0) + len(name) > MEMO_MAX_CHARS:
        return _protect_search(protect, name, argv0)
    return _protect_memo(protect, name, argv0)


def _protect_search(protect: re.Pattern[str], name: str, argv0: str) -> str | None:
    hit = protect.fullmatch(name) or (protect.fullmatch(os.path.basename(argv0)) if argv0 else None)
    return hit.group(0) if hit else None


_protect_memo = lru_cache(maxsize=8192)(_protect_search)


def _cmdline_match(protect: re.Pattern[str], cmdline: tuple[str, ...]) -> str | None:
    if sum(map(len, cmdline)) + len(cmdline) > MEMO_MAX_CHARS:
        return _cmdline_search(protect, cmdline)
    return _cmdline_memo(protect, cmdline)


def _cmdline_search(protect: re.Pattern[str], cmdline: tuple[str, ...]) -> str | None:
    hit = protect.search(" ".join(cmdline)) if cmdline else None
    return hit.group(0) if hit else None


_cmdline_memo = lru_cache(maxsize=8192)(_cmdline_search)


def _protect_hit(
    members: Sequence[ProcInfo], protect: re.Pattern[str] | None, nohup_protects: bool,
    protect_cmdline: re.Pattern[str] | None = None, exe_of: Callable[[int], str | None] | None = None,
) -> str | None:
    for m in members:
        if protect is not None:
            hit = _protect_match(protect, m.name, m.cmdline[0] if m.cmdline else "")
            # A disguised process (its name, argv[0] and executable disagree) is never protected by a name:
            # it says one thing and runs another (gputop.core.disguise, the rogue audit's test).
            if hit is not None and disguise(m.name, m.cmdline, exe_of(m.pid) if exe_of else None) is None:
                return f"pid {m.pid} ({_n(m)}) matches protect pattern '{visible(_which(protect, hit, True))}'"
        if protect_cmdline is not None:
            hit = _cmdline_match(protect_cmdline, m.cmdline)
            if hit is not None:
                pat = visible(_which(protect_cmdline, hit, False))
                return f"pid {m.pid} ({_n(m)}): its command line matches protect_cmdline pattern '{pat}'"
        if nohup_protects and m.sighup_ignored:
            return f"pid {m.pid} ({_n(m)}) ignores SIGHUP: detached with nohup"
    return None


def protect_reason(member: ProcInfo, protect: re.Pattern[str] | None, nohup_protects: bool,
                   protect_cmdline: re.Pattern[str] | None = None,
                   exe_of: Callable[[int], str | None] | None = None) -> str | None:
    """Why one process is protected (protect lists or nohup mark), or None: the rule every path uses."""
    return _protect_hit((member,), protect, nohup_protects, protect_cmdline, exe_of)


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
    protect_cmdline: re.Pattern[str] | None = None,
) -> Verdict:
    """The verdict for GPU holder ``pid``. Pure: reads only ``table`` (and ``owner_of``).

    ``protect`` matches each chain member's name and argv[0] basename; ``protect_cmdline`` its whole
    command line. ``walked``, when given, receives the chain the POSIX rule walked (the holder, then its
    ancestors up to but not including PID 1), so that a caller needs not walk it again. ``owner_of``, when given, says
    who owns the holder (its cgroup); the ownership rules (apply_owner) then refine the verdict.
    ``job_of`` (a process's Slurm JobRef, or None) and ``job_state`` (job id -> JobState), when given, add
    the Slurm job rule (slurm_job_rule) first: a holder whose job's state is known is judged by it alone."""
    if platform == "windows":
        return _classify_windows(pid, table, protect, max_chain, protect_cmdline)
    chain: list[ProcInfo] = walked if walked is not None else []
    # A table may say which executable a process runs (``exe(pid)``, see Table): a name pattern then
    # protects only a process whose executable agrees with its name.
    exe_of = getattr(table, "exe", None)
    verdict = _classify_posix(pid, table, _Protect(protect, protect_cmdline, nohup_protects, exe_of), max_chain,
                              chain)
    job = job_of(chain[0]) if job_of is not None and job_state is not None and chain else None
    if job is not None:
        state = job_state(job.job_id)  # type: ignore[attr-defined]
        if state is not None and hasattr(state, "for_ref"):
            state = state.for_ref(job)  # a leftover of an earlier run of a requeued job: ended (gputop.core.slurm_jobs)
        if state is not None:
            jid = job.job_id  # type: ignore[attr-defined]
            verdict = slurm_job_rule(verdict, chain, job, state,
                                     lambda m: getattr(job_of(m), "job_id", None) == jid, protect, nohup_protects,
                                     protect_cmdline, exe_of)
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


@dataclass(frozen=True)
class _Protect:
    """The compiled protect rules of one config: names, command lines, and whether nohup protects."""

    names: re.Pattern[str] | None
    cmdline: re.Pattern[str] | None
    nohup: bool
    exe_of: Callable[[int], str | None] | None = None

    def hit(self, members: Sequence[ProcInfo]) -> str | None:
        return _protect_hit(members, self.names, self.nohup, self.cmdline, self.exe_of)


def _walk(pid: int, table: Table, max_chain: int) -> tuple[list[ProcInfo], str | None]:
    """Holder and ancestors up to (excluding) PID 1; an error string on a cycle, gap or over-long chain."""
    holder = table.get(pid)
    if holder is None:
        if _hidden(table, pid):
            return [], f"pid {pid} exists but cannot be seen here (/proc hidepid, or another user's process)"
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
            if _hidden(table, cur.ppid):
                return chain, (f"parent pid {cur.ppid} of pid {cur.pid} exists but cannot be seen here "
                               "(/proc hidepid, or another user's process)")
            return chain, f"parent pid {cur.ppid} of pid {cur.pid} vanished during the scan"
        seen.add(cur.ppid)
        chain.append(parent)
        cur = parent
    return chain, None


# Processes that adopt orphans (PR_SET_CHILD_SUBREAPER): a user's systemd, container inits and shims,
# supervisors. /proc does not say which processes are subreapers, so any other live parent outside the
# session may be the process that started the tree and then called setsid (a daemon that forked its
# workers first): its children were never reparented, and they belong to its live job.
KNOWN_SUBREAPERS = frozenset({
    "systemd", "init", "tini", "docker-init", "dumb-init", "catatonit", "conmon", "bwrap", "s6-svscan",
    "s6-supervise", "runsv", "runsvdir", "launchd",
})


def _not_a_known_subreaper(reaper: int, info: ProcInfo | None, top: ProcInfo) -> str | None:
    """Why the parent a session's topmost member hangs under may not have adopted it; None when it did
    (PID 1, or a process known to be a subreaper)."""
    if reaper <= 1:
        return None
    if info is None:
        return (f"pid {top.pid}'s parent pid {reaper} cannot be seen here, so gputop cannot tell whether it "
                "adopted the tree")
    name = info.name or ""
    argv0 = os.path.basename(info.cmdline[0]) if info.cmdline else ""
    if name in KNOWN_SUBREAPERS or argv0 in KNOWN_SUBREAPERS or name.startswith("containerd-shim") \
            or argv0.startswith("containerd-shim"):
        return None
    return (f"pid {top.pid}'s parent pid {reaper} ({_n(info)}) is alive in another session: it may have "
            "started the tree and then called setsid (its job lives), not adopted it as a subreaper")


def _init_in_hidden_session(table: Table) -> bool:
    init = table.get(1)
    return init is not None and init.sid == 0


def _classify_posix(
    pid: int, table: Table, protect: _Protect, max_chain: int, walked: list[ProcInfo] | None = None,
) -> Verdict:
    chain, err = _walk(pid, table, max_chain)
    if err:
        return Verdict(UNKNOWN, err)
    if walked is not None:
        walked.extend(chain)
    holder = chain[0]
    if holder.pid == 1 or holder.kthread:
        return Verdict(NOT_ORPHAN, "init or a kernel thread")
    if holder.sid is None:
        return Verdict(UNKNOWN, "session id is unknown")
    found, top_i = _session_state(chain, holder, table)
    if found.kind == UNKNOWN:
        return found
    # An orphan's members up to its tree root are checked for protection (PID 1 and the subreaper never
    # are); any other holder's whole chain but PID 1.
    members = chain[: top_i + 1] if found.kind == ORPHAN else [m for m in chain if m.pid != 1]
    hit = protect.hit(members)
    if hit:
        return Verdict(PROTECTED, hit, root=found.root, reaper=found.reaper, orphan_reason=found.orphan_reason)
    return found


def _session_state(chain: list[ProcInfo], holder: ProcInfo, table: Table) -> tuple[Verdict, int]:
    """What the holder's session says, before protection: NOT_ORPHAN, UNKNOWN, or ORPHAN with the index
    in ``chain`` of the tree root (the topmost member of the holder's session)."""
    top_of_chain = chain[-1]
    if top_of_chain.ppid == 0 and top_of_chain.pid != 1:
        # Its parent lives outside this PID namespace (docker exec, a container runtime). An orphan is
        # reparented to the namespace's init, so a parent PID of 0 means that parent is still alive.
        return Verdict(NOT_ORPHAN, f"pid {top_of_chain.pid} ({_n(top_of_chain)}) was started from outside "
                                   "this PID namespace, and that parent is alive"), 0
    if holder.sid == 0 and _init_in_hidden_session(table):
        # A container started without a tty (docker run, a Kubernetes pod, a CI runner): its init did not
        # call setsid, so the whole container runs in one session whose leader is outside the namespace.
        # That session lasts as long as the container; no login session ended under this process.
        return Verdict(NOT_ORPHAN, "it runs in the container's own session, which PID 1 shares (its leader "
                                   "is outside this PID namespace), so no login session ended under it"), 0
    if holder.sid == 0:
        return Verdict(UNKNOWN, "its session leader is outside this PID namespace: gputop cannot tell "
                                "whether it is alive"), 0
    if holder.sid == holder.pid:
        return Verdict(NOT_ORPHAN, "session leader itself (started deliberately with setsid, a daemon or a "
                                   "service)"), 0
    alive, lost = _session_leader(table, holder)
    if alive is not None:
        return Verdict(NOT_ORPHAN, alive), 0
    if lost is None:
        return Verdict(UNKNOWN, f"its session leader pid {holder.sid} exists but cannot be seen here "
                                "(/proc hidepid, or another user's process): gputop cannot tell whether "
                                "its session is alive"), 0
    return _orphaned_tree(chain, holder, table, lost)


def _orphaned_tree(chain: list[ProcInfo], holder: ProcInfo, table: Table, lost: str) -> tuple[Verdict, int]:
    """The holder's session leader is gone. The topmost member of its session was reparented: its parent
    is init, or a process outside the session, which can only be a subreaper that adopted it."""
    top, top_i = chain[0], 0
    for i, member in enumerate(chain[1:], 1):
        if member.sid != holder.sid:
            break
        top, top_i = member, i
    root, reaper = top.pid, top.ppid
    reaper_info = table.get(reaper) if reaper > 0 else None
    doubt = _not_a_known_subreaper(reaper, reaper_info, top)
    if doubt:
        return Verdict(UNKNOWN, f"{lost}; but {doubt}"), top_i
    via = "init" if reaper <= 1 else f"subreaper pid {reaper} ({_n(reaper_info) if reaper_info else 'init'})"
    reason = f"{lost}; tree root pid {root} ({_n(top)}) was reparented to {via}"
    return Verdict(ORPHAN, reason, root=root, reaper=reaper, orphan_reason=reason), top_i


def _session_leader(table: Table, holder: ProcInfo) -> tuple[str | None, str | None]:
    """(why the session is alive, None) or (None, why it was lost), or (None, None) when its leader exists
    but cannot be seen: cannot see is not gone. A leader whose main thread exited while other threads
    run (state Z, live tasks) is alive: ``ProcInfo.zombie`` is False for it."""
    sid = holder.sid
    leader = table.get(sid)
    if leader is not None and not leader.zombie and leader.start_time <= holder.start_time + _TICK:
        return f"session leader pid {leader.pid} ({_n(leader)}) is alive", None
    if leader is not None and not leader.zombie:
        return None, f"session leader pid {sid} was reused (it started after the process)"
    if leader is None and _hidden(table, sid):
        return None, None
    return None, f"session leader pid {sid} is gone"


def _classify_windows(
    pid: int, table: Table, protect: re.Pattern[str] | None, max_chain: int,
    protect_cmdline: re.Pattern[str] | None = None,
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
            root, reason = cur, f"parent pid {cur.ppid} of pid {cur.pid} ({_n(cur)}) is missing"
            break
        if parent.start_time > cur.start_time + _TICK:
            root = cur
            reason = f"parent pid {cur.ppid} of pid {cur.pid} ({_n(cur)}) was reused (it started after the child)"
            break
        seen.add(cur.ppid)
        chain.append(parent)
        cur = parent
    if root is None:
        members = chain
        hit = _protect_hit(members, protect, False, protect_cmdline)
        if hit:
            return Verdict(PROTECTED, hit)
        return Verdict(NOT_ORPHAN, "every ancestor's parent is alive")
    members = chain[: chain.index(root) + 1]
    hit = _protect_hit(members, protect, False, protect_cmdline)
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
    protect_cmdline: re.Pattern[str] | None = None,
    exe_of: Callable[[int], str | None] | None = None,
) -> Verdict:
    """The verdict for a holder that belongs to Slurm job ``job`` (a gputop.core.slurm_jobs.JobRef) whose state is
    ``state`` (a gputop.core.slurm_jobs.JobState), given the session rule's ``verdict`` and the walked ``chain``
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
        hit = _protect_hit([m for m in chain if m.pid != 1], protect, nohup_protects, protect_cmdline, exe_of)
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
    hit = _protect_hit(chain[: top_i + 1], protect, False, protect_cmdline, exe_of)
    kind = PROTECTED if hit else ORPHAN
    return Verdict(kind, hit or reason, root=root.pid, reaper=root.ppid, orphan_reason=reason)
