"""The reap executor: carries out a reap plan, and only the plan.

1. SIGSTOP the plan's members (and, until nothing new appears, any new child of theirs the planner
   accepts), so that no retry loop or supervisor starts a new worker.
2. Re-read the process table and plan again. A refusal now signals nothing and continues the tree; a
   frozen process that is no longer a member is continued and left alone.
3. SIGTERM and SIGCONT the members; anything they start during the grace is stopped at once.
4. SIGKILL what is left; report every member that survives (success means every member is gone).
In every round the executor also looks for processes that joined the tree without being under a live
member (a member started a worker and exited at once, so init or a subreaper took the worker): new since
the reap began, in the tree's session and process group (gputop.actions.plan.joiners). They are classified
like members, stopped, and killed with the rest; one the classifier does not call an orphan is reported
and left alone.
Every signal goes through a verified pidfd (gputop.actions.identity.Handle).

The same executor carries out a plan that has no single root (a finished Slurm job's leftovers,
gputop.actions.jobreap): ``planner`` re-plans from a fresh table instead of the tree planner, and
``rescan`` adds, in every round, the processes that joined the group by membership (the job's cgroup or
environment), wherever they sit in the process tree.

``execute`` returns an ``Outcome``: a refusal (nothing was killed, the tree runs again) or what the reap did.
The run (gputop.actions.reap.ReapRun) turns it into its audit record's details, in one place.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from gputop.actions.common import Ctx, proc_dict, same_start, sig_event
from gputop.actions.identity import Handle, wait_gone
from gputop.actions.plan import (
    LeftAlone, Lineage, ReapPlan, Refusal, joiners, lineage, make_rules, plan_reap, refusal_of, walk,
)
from gputop.util.errors import EXIT_PERMISSION, EXIT_REFUSED
from gputop.core.procs import IS_LINUX, ProcInfo, ProcTable, StatFields, read_proc, self_and_ancestors, stat_state


@dataclass(frozen=True)
class Outcome:
    """What the executor did. ``refusal`` set: it signalled nothing to end and let the tree run again
    (``replan``: the plan made again from the frozen table, when that plan refused). Else the reap was
    carried out: success only when there are no ``survivors`` and it converged (``not_converged`` None).
    ``interrupted``: cut short; only what was done so far (``members``: every process it held)."""

    refusal: Refusal | None = None
    replan: ReapPlan | None = None
    members: tuple[ProcInfo, ...] = ()  # signalled (the processes it held, when interrupted)
    left_alone: tuple[LeftAlone, ...] = ()  # as the last plan left them
    left_alone_new: tuple[LeftAlone, ...] = ()  # started during the reap, and not the tree's to take
    released: tuple[int, ...] = ()  # frozen, then no member on re-planning: continued and left alone
    survivors: tuple[int, ...] = ()
    reaped_holders: tuple[int, ...] = ()  # GPU holders among the members
    sigkill: bool | None = None  # SIGKILL was needed; None: it did not come that far
    started_during_reap: tuple[int, ...] = ()
    joined_by_session: tuple[int, ...] = ()
    not_converged: tuple[int, ...] | None = None  # new processes kept appearing: the last seen
    converge_rounds: int | None = None
    interrupted: bool = False

    @property
    def ending(self) -> str:
        """How the members ended, for the result's message."""
        return ", SIGKILL needed" if self.sigkill else ", all exited after SIGTERM"

    def details(self) -> dict:
        """The audit record's details, keys in the order the reap learns them."""
        d: dict = {}
        if self.left_alone_new:
            d["left_alone_new"] = [e.to_dict() for e in self.left_alone_new]
        if self.not_converged is not None:
            d["not_converged"] = list(self.not_converged)
            d["converge_rounds"] = self.converge_rounds
        if self.sigkill is not None:
            d["sigkill"] = self.sigkill
            d["started_during_reap"] = list(self.started_during_reap)
            d["joined_by_session"] = list(self.joined_by_session)
        if self.refusal is not None:
            return d
        d["members"] = [proc_dict(m) for m in self.members]
        if self.interrupted:
            return d
        d["left_alone"] = [e.to_dict() for e in self.left_alone]
        d["released"] = list(self.released)
        d["survivors"] = list(self.survivors)
        d["reaped_holders"] = list(self.reaped_holders)
        return d


class Executor:
    def __init__(self, ctx: Ctx, run, plan: ReapPlan, snapshot, planner=None, rescan=None,
                 stats: dict[int, StatFields] | None = None):
        self.ctx, self.run, self.plan, self.snapshot = ctx, run, plan, snapshot
        self.planner = planner  # (table) -> ReapPlan over that scanned table; None: the tree planner
        self.rescan = rescan  # (table, rules, known pids) -> (members, left alone) that joined by membership
        self.handles: dict[int, Handle] = {}
        self.gone: set[int] = set()
        self.denied: list[int] = []
        self.released: list[int] = []  # frozen, then found not to be members: continued, left alone
        self.late: set[int] = set()
        self.pre_stopped: set[int] = set()  # stopped before gputop came (a paused job): never continued
        # Taken before any signal: what was there when the reap began, and the tree's session and groups
        # (``stats``: from the scan the plan was made from, when the caller has it; else scanned now).
        self.lineage: Lineage = lineage(_scanned().stat_fields() if stats is None else stats, plan.pids)
        self.foreign: set[tuple[int, int]] = set()  # new, but another tree's: never taken
        self.joined: set[int] = set()  # found by session and group, not under a live member
        self.last_scan: tuple[ProcTable, object] | None = None  # (table, rules) of the last new_members()
        self.scan_s = 0.0  # how long the last new_members() took (a scan of every process, mostly)
        self._never: frozenset[int] | None = None  # plan_never, once read
        # Process groups gputop stopped as one (group_stop), and which of their processes were stopped
        # before that (never continued); new processes found there stopped were stopped by gputop.
        self.stopped_groups: set[int] = set()
        self.group_prestopped: set[int] = set()
        self.churn: list[int] = []  # new processes found by the last scan that were gone before a handle
        # The first plan's left-alone processes, by identity: never reported as "started during the reap".
        # (pid -> start ticks, or None for a process under a left-alone top, whose start the plan lacks)
        self.planned_left: dict[int, int | None] = {p: None for e in plan.left_alone for p in e.subtree}
        self.planned_left.update({e.pid: e.proc.start_ticks if e.proc is not None else None
                                  for e in plan.left_alone})
        self.ever_churn = False
        self.left_new: dict[int, LeftAlone] = {}  # started during the reap and left alone, by pid
        self.not_converged: tuple[int, ...] | None = None  # kill_rest gave up: what it saw last
        self.rounds = 0  # kill_rest's bound, when it gave up
        self.sigkill: bool | None = None  # kill_rest's answer, once it has one

    # ---- signals ----
    def adopt(self, procs: list[ProcInfo], sigs: list[int]) -> list[int]:
        """Open handles for members not tracked yet, and send them ``sigs`` at once; return their pids."""
        new = []
        for m in procs:
            if m.pid in self.handles or m.pid in self.gone:
                continue
            try:
                self.handles[m.pid] = Handle(m)
            except (ProcessLookupError, LookupError):  # exited, or the PID is another process now
                self.gone.add(m.pid)
                self.churn.append(m.pid)  # seen, then gone: what it left behind may not be seen yet
                continue
            except Exception:  # alive but not verifiable or not ours to signal: never "gone"
                if m.pid not in self.denied:
                    self.denied.append(m.pid)
                continue
            new.append(m.pid)
            state = self.handles[m.pid].state  # read when its handle was verified
            if state is None:
                now = read_proc(m.pid)
                state = now.state if now is not None else None
            if state in ("T", "t") and not self._we_stopped(m):
                self.pre_stopped.add(m.pid)
            for s in sigs:
                self.send(m.pid, s)
        return new

    def send(self, pid: int, sig: int) -> None:
        try:
            if not self.handles[pid].send(sig):
                self.gone.add(pid)
        except PermissionError:
            if pid not in self.denied:
                self.denied.append(pid)

    def send_all(self, sig: int, pids: list[int], note: str | None = None) -> None:
        if not pids:
            return
        ev = sig_event(sig, pids)
        self.run.signals.append({**ev, "note": note} if note else ev)
        for pid in pids:
            self.send(pid, sig)

    def _we_stopped(self, m: ProcInfo) -> bool:
        """True when ``m`` is stopped because gputop stopped its process group (group_stop)."""
        return m.pgid in self.stopped_groups and m.pid not in self.group_prestopped

    def group_stop(self) -> list[int]:
        """SIGSTOP each of the tree's own process groups as one signal; return the groups stopped.

        A member that forks a successor and exits every few hundred microseconds outruns any scan of
        /proc: the successor a scan finds is gone before it can be stopped, and the next one is not in
        the scan at all. A signal to a process group reaches every process in it, a child forked at that
        instant included (the kernel restarts a fork that a group signal interrupts), and a stopped process
        cannot fork: after this, a scan sees the whole group, and it stands still.

        Only a group all of whose processes (in the last scan) are the tree's is stopped: tracked members,
        or processes new since the reap began in the tree's sessions and not another tree's (the joiners'
        rule). A group that holds anything else (a process left alone, gputop itself, a process that was
        there before the reap and is not a member) is never signalled as a group; its members are stopped
        one by one, as before."""
        if not IS_LINUX:
            return []
        if self.last_scan is None:
            self.new_members()
        table = self.last_scan[0]
        stats = table.stat_fields()
        lin = self.lineage
        tracked = {p for p in self.handles if p not in self.released}
        groups = {stats[p].pgid for p in tracked if p in stats and p not in self.gone} | set(lin.groups)
        mine = os.getpgrp()
        by_group: dict[int, list[int]] = {}
        for p, st in stats.items():
            if st.pgid in groups:
                by_group.setdefault(st.pgid, []).append(p)
        out = []
        for g, pids in sorted(by_group.items()):
            if g <= 1 or g == mine or any(p in self.plan_never for p in pids):
                continue
            if not all(p in tracked or (st := stats[p]).sid in lin.sessions and lin.is_new(p, st)
                       and (p, st.start) not in self.foreign for p in pids):
                continue
            if g not in self.stopped_groups:
                self.group_prestopped |= {p for p in pids if p not in self.handles and _state(table, p) in ("T", "t")}
            try:
                os.killpg(g, signal.SIGSTOP)
            except OSError:
                continue  # gone (ESRCH), or not ours (EPERM): its processes are stopped one by one
            self.stopped_groups.add(g)
            out.append(g)
        if out:
            self.run.signals.append({**sig_event(signal.SIGSTOP, []), "groups": out,
                                     "note": "the tree's own process group(s), stopped as one (no fork escapes)"})
        return out

    def alive(self) -> list[int]:
        return [p for p, h in self.handles.items() if p not in self.gone and p not in self.released and h.alive()]

    def wait_stopped(self, pids: list[int], timeout: float = 2.0) -> None:
        """SIGSTOP is asynchronous: wait until every live thread of each process is stopped (or it is gone).

        All of them together: a round reads the stat line of each one not stopped yet, and the pause
        between rounds grows from 1 ms to 8 ms (most stop within a few ms; only stragglers cost a read).
        A half-exited process (main thread exited, state Z) is stopped when its live threads are."""
        deadline = time.monotonic() + timeout
        left = list(pids)
        pause = 0.001
        while left:
            time.sleep(pause)  # first let them run into the stop: a check right after SIGSTOP finds few
            left = [p for p in left if not _stopped(p, self.handles[p].info)]
            if time.monotonic() >= deadline:
                return
            pause = min(pause * 2, 0.008)

    # ---- planning against the live table ----
    def new_members(self) -> list[ProcInfo]:
        """Processes the planner accepts that are not tracked yet: under the tracked members, or joined
        by session and process group after their parent exited (``plan.joiners``)."""
        t0 = time.monotonic()
        try:
            return self._new_members()
        finally:
            self.scan_s = time.monotonic() - t0

    def _new_members(self) -> list[ProcInfo]:
        table = _scanned()
        rules = make_rules(self.ctx.config, self.ctx.platform, table, self.snapshot, self.plan_never,
                           sampler=self.ctx.sampler)
        self.last_scan = (table, rules)
        alive = self.alive()
        members, left = walk(table, alive, set(self.handles) | self.gone, self.run.info, rules)
        ours = (set(self.handles) - set(self.released)) | self.gone | {m.pid for m in members}
        found, left_j = joiners(table.stat_fields(), table, self.lineage, ours, self.run.info, rules, self.foreign)
        if self.rescan is not None:
            more, left_r = self.rescan(table, rules, ours | {m.pid for m in found})
            found += [m for m in more if m.pid not in {f.pid for f in found}]
            left_j = left_j + left_r
        found = [m for m in found if m.pid not in self.plan_never and not _is_mine(m.pid, table)]
        self.joined.update(m.pid for m in found)
        for e in left + left_j:
            if e.pid in self.planned_left and self.planned_left[e.pid] in (
                    None, e.proc.start_ticks if e.proc is not None else None):
                continue  # left alone by the first plan: not new, and never reported as started during the reap
            self.left_new.setdefault(e.pid, e)
        return members + found

    @property
    def plan_never(self) -> frozenset[int]:
        """gputop and its ancestors, read once per reap: an ancestor can only exit, and a PID of one that
        exited stays refused (never signalled) for the rest of the reap."""
        if self._never is None:
            self._never = frozenset(self_and_ancestors())
        return self._never

    def freeze(self, first: list[int]) -> None:
        """Stop ``first``, then every new member (under the tracked ones, or joined by session and group),
        until a scan taken while all are stopped finds nothing new: a stopped process cannot fork, so
        nothing can appear after that."""
        self.send_all(signal.SIGSTOP, first)
        self.wait_stopped(first)
        for _ in range(50):
            new = self.adopt(self.new_members(), [signal.SIGSTOP])
            if not new:
                return  # self.last_scan: a table read while the tree was stopped
            self.run.signals.append(self._stop_event(new))
            self.wait_stopped(new)
        self.last_scan = None  # it never settled: replan reads a fresh table

    def _stop_event(self, new: list[int], note: str | None = None) -> dict:
        joined = [p for p in new if p in self.joined]
        if joined:
            extra = f"pid(s) {joined} joined the tree's session after their parent exited"
            note = f"{note}; {extra}" if note else extra
        ev = sig_event(signal.SIGSTOP, new)
        return {**ev, "note": note} if note else ev

    def replan(self) -> ReapPlan | None:
        """Plan again from the frozen table. Returns that plan when it refuses (the tree runs again), or
        None and keeps only its members.

        The frozen table is the one freeze() read last: taken with every member stopped, it found nothing
        new, so it is what a fresh scan would read now (without the cost of another read of /proc)."""
        if self.last_scan is None:
            self.last_scan = (_scanned(), None)
        table, rules = self.last_scan
        if self.planner is not None:
            plan = self.planner(table)
        else:
            if rules is None:
                rules = make_rules(self.ctx.config, self.ctx.platform, table, self.snapshot, self.plan_never,
                                   sampler=self.ctx.sampler)
            plan = plan_reap(table, self.run.root_pid, self.run.info.start_time, rules)
        if plan.refusal is not None:
            self.cont_all()
            return plan
        keep = set(plan.pids)
        out = [p for p in self.alive() if p not in keep]
        if out:
            self.send_all(signal.SIGCONT, [p for p in out if p not in self.pre_stopped],
                          "not a member on re-planning: continued and left alone")
            self.released.extend(out)
        self.adopt([m for m in plan.members if m.pid not in self.handles], [signal.SIGSTOP])
        self.plan = plan
        return None

    def cont_all(self) -> None:
        cont = [p for p in self.handles if p not in self.gone and p not in self.pre_stopped]
        if cont:
            self.run.signals.append(sig_event(signal.SIGCONT, cont))
        for pid in cont:
            try:
                self.handles[pid].send(signal.SIGCONT)
            except OSError:
                pass
        self.cont_groups()

    def cont_groups(self, fresh: bool = True) -> None:
        """Continue what a group stop stopped and was never taken as a member (nothing gputop stopped
        stays stopped): every process of a stopped group that is not tracked and was not stopped before.

        ``fresh`` False: from the last scan, when it was taken after the last group stop with the tree
        stopped (nothing in a stopped group can fork or appear after it): the end of a converged reap."""
        if not self.stopped_groups:
            return
        table = _scanned() if fresh or self.last_scan is None else self.last_scan[0]
        out = []
        for p, st in table.stat_fields().items():
            if st.pgid not in self.stopped_groups or p in self.handles or p in self.group_prestopped:
                continue
            info = table.get(p)
            if info is None or info.zombie or info.state not in ("T", "t"):
                continue
            try:
                h = Handle(info)
            except Exception:
                continue
            try:
                h.send(signal.SIGCONT)
                out.append(p)
            except OSError:
                pass
            finally:
                h.close()
        if out:
            self.run.signals.append({**sig_event(signal.SIGCONT, out),
                                     "note": "stopped with their process group, not members: continued"})

    # ---- the steps ----
    def terminate(self, grace: float) -> None:
        frozen = self.alive()
        self.send_all(signal.SIGTERM, frozen)
        self.send_all(signal.SIGCONT, frozen)
        # Anything that appears now was started by a member that survived SIGTERM (a retry loop, a
        # supervisor): it is stopped at once and killed with the rest, so no new worker ever runs. (No
        # SIGTERM for it: a pending SIGTERM is delivered before a pending SIGSTOP, and its death would let
        # the loop go round.)
        # Between two scans the wait wakes as soon as every running member is gone (wait_gone). The grace
        # ends on time: no scan starts that would end after it (kill_rest's freeze scans right after the
        # grace, with every member stopped, and takes in whatever appeared meanwhile).
        deadline = time.monotonic() + max(0.0, grace)
        while True:
            new = self.adopt(self.new_members(), [signal.SIGSTOP])
            if new:
                self.late.update(new)
                self.run.signals.append(self._stop_event(new, "started after SIGTERM: kept stopped"))
            running = [p for p in self.alive() if p not in self.late]
            left = deadline - time.monotonic()
            if (not running and not new) or left <= 0:
                break
            wait_gone([self.handles[p] for p in running], left if left <= self.scan_s + 0.05 else 0.05)
            if time.monotonic() >= deadline:
                break

    def kill_rest(self, rounds: int = 20, deadline_s: float = 30.0) -> bool:
        """SIGKILL every member still alive, until the tree has converged: a round that stops the tree's
        own process groups as one (group_stop), then freezes and scans, finds neither a live member nor
        a new process, not even one that was gone before it could be held (``churn``: a process that
        re-forks faster than a scan leaves a successor the scan may not show). Bounded by ``rounds`` and
        ``deadline_s``; a tree that has not converged by then is a failure, never success: the processes
        seen last are named in ``not_converged`` and as survivors."""
        killed_any = False
        end = time.monotonic() + deadline_s
        quiet = 0
        for _ in range(rounds):
            self.churn = []
            self.group_stop()
            self.freeze(self.alive())
            alive = self.alive()
            self.ever_churn = self.ever_churn or bool(self.churn)
            if not alive and not self.churn and self.last_scan is not None:
                # Converged. Where a process was once seen vanishing and no group could be stopped as
                # one, a scan can miss a successor: three quiet rounds in a row, then.
                quiet += 1
                if quiet >= (3 if self.ever_churn and not self.stopped_groups else 1):
                    return killed_any
                time.sleep(0.005)
                continue
            quiet = 0
            if alive:
                self.send_all(signal.SIGKILL, alive)
                killed_any = True
                if wait_gone([self.handles[p] for p in alive], 5.0):
                    return killed_any  # ignores SIGKILL for now (uninterruptible I/O); reported as a survivor
            if time.monotonic() >= end:
                break
        self.not_converged = tuple(sorted(set(self.churn) | set(self.alive())))
        self.rounds = rounds
        return killed_any

    def outcome(self, **kw) -> Outcome:
        """An Outcome with what the rounds found so far; ``kw``: the rest (the refusal, or the end)."""
        killed = self.sigkill is not None
        return Outcome(left_alone_new=tuple(self.left_new.values()), not_converged=self.not_converged,
                       converge_rounds=self.rounds if self.not_converged is not None else None,
                       sigkill=self.sigkill, started_during_reap=tuple(sorted(self.late)) if killed else (),
                       joined_by_session=tuple(sorted(self.joined)) if killed else (), **kw)

    def close(self) -> None:
        for h in self.handles.values():
            h.close()


def _state(table: ProcTable, pid: int) -> str | None:
    info = table.get(pid)
    return info.state if info is not None else None


def _scanned() -> ProcTable:
    """A fresh table of every process: one stat read each, which serves both the walk down the tree and
    the lineage check (``ProcTable.stat_fields``)."""
    table = ProcTable()
    table.scan_all()
    return table


def _stopped(pid: int, info: ProcInfo) -> bool:
    """True once process ``info`` can neither run nor fork: every live thread is stopped (T, or t when
    traced); or it is gone, exited, or its PID names another process (not ours to wait for; whether it
    lives is its pidfd's question, asked elsewhere). A half-exited process (main thread exited, state Z,
    threads still running) is alive: stopped only when each thread that has not exited is."""
    if not IS_LINUX or info.start_ticks is None:
        now = stat_state(pid)
        return now is None or now[0] in ("T", "t") or not same_start(now[1], info.start_time)
    f = _stat_fields(f"/proc/{pid}/stat")
    if f is None or len(f) < 20 or f[19] != str(info.start_ticks).encode():
        return True
    if f[0] in (b"T", b"t") and f[17] == b"1":
        return True
    if f[0] not in (b"Z", b"X") and f[17] == b"1":
        return False
    # Several threads (a group stop reaches each in turn), or a main thread that has exited: look at each.
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    states = [t[0] for t in (_stat_fields(f"/proc/{pid}/task/{tid}/stat") for tid in tids) if t]
    return all(st in (b"T", b"t", b"Z", b"X") for st in states)


def _stat_fields(path: str) -> list[bytes] | None:
    """The fields of a stat line after the command name (state first); None if it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return raw[raw.rindex(b")") + 2:].split(None, 20)
    except ValueError:
        return None


def _is_mine(pid: int, table: ProcTable) -> bool:
    """True for gputop's own descendants (a helper it runs while reaping from a dead session)."""
    me = os.getpid()
    return any(a.pid == me for a in table.ancestors(pid))


def execute(ctx: Ctx, run, plan: ReapPlan, snapshot, planner=None, rescan=None,
            stats: dict[int, StatFields] | None = None) -> Outcome:
    """Carry out ``plan``: the Outcome says whether it refused (nothing killed) or what it did. ``run``
    gives the tree (``root_pid``, ``info``: its root or owner, ``grace``) and keeps the signals sent; an
    interruption is recorded through it (``run.interrupted``) before it goes on. ``planner`` and ``rescan``:
    see Executor (a plan without a single root). ``stats``: the lineage fields of the table ``plan`` was
    made from (``ProcTable.stat_fields``), read before any signal; None: scan now."""
    ex = Executor(ctx, run, plan, snapshot, planner, rescan, stats)
    try:
        refused = _freeze_and_replan(ex)
        if refused is not None:
            return refused
        ex.terminate(run.grace)
        ex.sigkill = ex.kill_rest()
        survivors = ex.alive()
        if ex.not_converged is not None:
            survivors = sorted(set(survivors) | set(ex.not_converged))
        ex.cont_groups(fresh=ex.not_converged is not None)  # what a group stop caught, not a member
    except BaseException as e:
        # Interrupted (Ctrl-C, a bug): never leave a tree stopped. Whatever has SIGTERM pending acts on it.
        ex.cont_all()
        held = ex.outcome(members=tuple(h.info for h in ex.handles.values()), interrupted=True)
        run.interrupted(e, f"the reap of the tree of pid {run.root_pid} was interrupted ({type(e).__name__}); "
                        "the tree was continued (SIGCONT), not left stopped; check 'gputop reap'", held.details())
        raise
    finally:
        ex.close()
    signalled = tuple(h.info for p, h in ex.handles.items() if p not in ex.released)
    holders = {h.pid for h in snapshot.holders}
    return ex.outcome(members=signalled, left_alone=ex.plan.left_alone, released=tuple(ex.released),
                      survivors=tuple(survivors), reaped_holders=tuple(m.pid for m in signalled if m.pid in holders))


def _freeze_and_replan(ex: Executor) -> Outcome | None:
    """Freeze the tree and plan again: an Outcome with the refusal when nothing may be killed, else None."""
    run = ex.run
    ex.freeze(ex.adopt(list(ex.plan.members), []))
    if ex.denied:
        # Nothing was killed yet: let the tree run again and say why.
        ex.send_all(signal.SIGCONT, [p for p in ex.handles if p not in ex.denied and p not in ex.pre_stopped])
        return ex.outcome(refusal=Refusal(
            "permission-denied", f"no permission to signal pid(s) {ex.denied} in the tree of pid {run.root_pid} "
            f"(user {run.info.user}); run as that user or as root", EXIT_PERMISSION))
    replan = ex.replan()
    if replan is not None:
        return ex.outcome(refusal=refusal_of(replan), replan=replan)
    if run.root_pid is not None and (run.root_pid not in ex.handles or run.root_pid in ex.gone):
        ex.cont_all()
        return ex.outcome(refusal=Refusal(
            "identity-changed", f"pid {run.root_pid} could not be held while the tree was frozen; nothing was "
            "killed; run 'gputop reap' again", EXIT_REFUSED))
    return None
