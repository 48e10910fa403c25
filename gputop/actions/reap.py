"""Reap an orphan tree: check the root, make the plan (gputop.actions.plan), show it or carry it out.

``orphan_trees`` gives every orphan tree of a snapshot with its plan: the preview (``gputop reap``, the
TUI dialog, the API) shows exactly what ``reap_tree`` would do. ``reap_tree`` re-reads everything,
plans again, and hands the plan to the executor (gputop.actions.executor), which re-plans after freezing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gputop.actions.common import (
    FACES, ActionResult, Ctx, OrphanTree, log_record, memory_released, name, proc_dict, record, target_dict,
)
from gputop.actions import interrupt
from gputop.actions.identity import TargetLock
from gputop.actions.plan import PidNs, ReapPlan, Rules, plan_reap
from gputop.core.config import Config, load_config
from gputop.util.errors import EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, GputopError
from gputop.core.orphans import UNKNOWN, classify, compile_protect
from gputop.core.ownership import NONE
from gputop.core.procs import (
    IS_LINUX, ProcTable, pid_ns, pid_ns_init, pid_ns_members, read_proc, self_and_ancestors,
)

_REFUSAL_CODES = {"not-found": ("not-found", EXIT_NOT_FOUND), "identity-changed": ("identity-changed", EXIT_REFUSED)}


def make_rules(config: Config, platform: str, table, snapshot, never: frozenset[int] | None = None, sampler=None) -> Rules:
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


def orphan_trees(snapshot, table: ProcTable | None = None, config: Config | None = None, sampler=None) -> list[OrphanTree]:
    """Every orphan root of ``snapshot`` with its live tree and reap plan (re-read now)."""
    table = table or ProcTable()
    config = config or load_config()
    rules = make_rules(config, getattr(snapshot, "platform", "posix"), table, snapshot, sampler=sampler)
    out = []
    for r in snapshot.roots:
        plan = plan_reap(table, r.pid, r.proc.start_time, rules)
        if plan.root is None or plan.refusal and plan.refusal[0] in _REFUSAL_CODES:
            continue  # exited or reused since the snapshot: not a tree any more
        out.append(OrphanTree(plan.root, plan.members, tuple(r.holders), tuple(r.gpus), r.gpu_memory, r.reason,
                              r.reaper, plan))
    return out


@dataclass
class ReapRun:
    """One reap: its inputs, what it found and did, and the audit record that ``done`` writes."""

    root_pid: int
    expected_start: float | None
    face: str
    grace: float | None
    dry_run: bool
    reason: str | None
    cfg: Config | None

    def __post_init__(self):
        self.info = None
        self.gpus: list[int] = []
        self.details: dict = {}
        self.signals: list[dict] = []
        self.recorded = False

    def done(self, ok: bool, outcome: str, message: str, code: int, mem: bool | None = None) -> ActionResult:
        self.recorded = True
        target = target_dict(self.root_pid, self.info, self.gpus, self.expected_start)
        rec = record("reap", self.face, outcome, ok, message, target, self.signals, self.reason,
                     dry_run=self.dry_run, grace=self.grace, exit_code=code, memory_released=mem,
                     details=dict(self.details))
        log_record(rec, self.cfg, self.details)
        gpu = self.gpus[0] if len(self.gpus) == 1 else None
        return ActionResult("reap", ok, outcome, message, pid=self.root_pid, gpu=gpu, exit_code=code,
                            memory_released=mem, details=self.details)


def reap_tree(root_pid: int, *, expected_start: float | None, face: str, grace: float | None = None,
              dry_run: bool = False, sampler=None, config: Config | None = None,
              reason: str | None = None) -> ActionResult:
    """Reap the orphan tree under ``root_pid`` as planned: SIGSTOP, re-plan, SIGTERM, SIGCONT, SIGKILL.

    Acts only if the root is still an orphan root now, and only on members the classifier calls orphans;
    refuses the whole tree when the plan does (protected, unknown, another user's, ...)."""
    if face not in FACES:
        raise ValueError(f"face must be one of {FACES}, not {face!r}")
    run = ReapRun(root_pid, expected_start, face, grace, dry_run, reason, config)
    try:
        ctx = Ctx(sampler, config)
    except GputopError as e:
        return run.done(False, "failed", str(e), e.exit_code)
    run.cfg = ctx.config
    if run.grace is None:  # every face gets the configured default (kill_timeout), not a constant of its own
        run.grace = ctx.config.kill_timeout
    try:
        with interrupt.deferred():  # SIGHUP/SIGTERM now: finish the plan, record it, then exit as asked
            try:
                return _reap(ctx, run)
            except BaseException as e:  # a second signal, Ctrl-C: the executor rolled back what it held
                if not run.recorded:  # ... but it came outside the executor: the record still goes out
                    run.details["error"] = f"{type(e).__name__}: {e}"
                    run.done(False, "interrupted", f"the reap of the tree of pid {root_pid} was interrupted "
                             f"({type(e).__name__}) after the signals listed; check 'gputop reap'", EXIT_FAILURE)
                raise
    finally:
        ctx.close()


def current_plan(ctx: Ctx, run: ReapRun, snapshot, table: ProcTable | None = None) -> ReapPlan:
    """The plan from a fresh scan of every process (``table``: an empty ProcTable to scan into, for a
    caller that wants the scan's lineage fields too)."""
    table = table if table is not None else ProcTable()
    table.scan_all()
    rules = make_rules(ctx.config, ctx.platform, table, snapshot, sampler=ctx.sampler)
    return plan_reap(table, run.root_pid, run.info.start_time, rules)


def _reap(ctx: Ctx, run: ReapRun) -> ActionResult:
    from gputop.actions.executor import execute

    pid = run.root_pid
    info = run.info = read_proc(pid)
    if info is None or info.zombie:
        return run.done(False, "not-found", f"no process {pid}: the tree's root has exited (check "
                        "'gputop reap')", EXIT_NOT_FOUND)
    if run.expected_start is not None and abs(info.start_time - run.expected_start) > 0.006:
        run.details["found_start_time"] = info.start_time
        return run.done(False, "identity-changed", f"pid {pid} is now a different process (the PID was "
                        "reused); run 'gputop reap' again", EXIT_REFUSED)
    if ctx.sampler is None:
        run.details["rule"] = "no-sampler"
        return run.done(False, "refused", f"cannot verify that pid {pid} is an orphan root "
                        f"({ctx.sampler_error})", EXIT_UNAVAILABLE)
    snap = ctx.sample()
    table = ProcTable()
    plan = current_plan(ctx, run, snap, table)
    refused = _refused(run, plan, snap)
    if refused is not None:
        return refused
    if run.dry_run:
        return run.done(True, "dry-run", f"would reap the tree of pid {pid} ({name(info)}): {plan_summary(plan)}",
                        EXIT_OK)
    lock = TargetLock("reap", pid, info.start_time)
    stats = table.stat_fields()  # the lineage baseline: what ran when the plan was made
    if not lock.acquire():
        if not lock.wait(pid, info.start_time, run.grace + 15.0):
            run.details["by_other"] = True
            return run.done(False, "busy", f"the tree of pid {pid} is being reaped by another gputop "
                            "invocation; this one sent no signal; check 'gputop reap'", EXIT_REFUSED)
        stats = None  # waited for another reap: the executor takes its baseline afresh
    try:
        result = execute(ctx, run, plan, snap, stats=stats)
    finally:
        lock.release()
    if result is not None:
        return result
    return _finish(ctx, run, plan)


def _refused(run: ReapRun, plan: ReapPlan, snap) -> ActionResult | None:
    """Record the plan in the details; a refusal result when the plan says apply must signal nothing."""
    member_set = set(plan.pids) | {p for e in plan.left_alone for p in (e.pid, *e.subtree)}
    run.gpus = sorted({g for h in snap.holders if h.pid in member_set for g in h.gpus})
    run.details["plan"] = plan.to_dict()
    if plan.refusal is None:
        return None
    rule, message = plan.refusal
    if rule in _REFUSAL_CODES:
        outcome, code = _REFUSAL_CODES[rule]
        if rule == "not-found":
            message = f"pid {run.root_pid} exited while the tree was being checked; nothing was signalled"
        return run.done(False, outcome, message, code)
    run.details["rule"] = rule
    return run.done(False, "refused", message, EXIT_REFUSED)


def plan_summary(plan: ReapPlan) -> str:
    text = f"{len(plan.members)} process(es) {list(plan.pids)}, holders {list(plan.holders)}"
    if plan.left_alone:
        text += "; left alone: " + "; ".join(e.reason for e in plan.left_alone)
    return text


def _finish(ctx: Ctx, run: ReapRun, plan: ReapPlan) -> ActionResult:
    d = run.details
    survivors = d.get("survivors") or []
    n = len(d.get("members") or ())
    if "not_converged" in d:
        return run.done(False, "still-alive", f"the tree of pid {run.root_pid} did not settle: new processes kept "
                        f"appearing after SIGKILL (a member that re-forks?); last seen: pid(s) {survivors or '?'}; "
                        "check 'gputop reap' again", EXIT_FAILURE)
    if survivors:
        names = ", ".join(f"{p}" for p in survivors)
        return run.done(False, "still-alive", f"pid(s) {names} of the tree of pid {run.root_pid} are still alive "
                        "after SIGKILL (uninterruptible I/O?); check 'gputop reap' again", EXIT_FAILURE)
    mem = memory_released(ctx, set(d.get("reaped_holders") or ()))
    late = len(set(d.get("started_during_reap") or ()) | set(d.get("joined_by_session") or ()))
    msg = (f"reaped the tree of pid {run.root_pid} ({name(run.info)}): {n} process(es)"
           + (f" ({late} started during the reap, stopped at once)" if late else "")
           + (", SIGKILL needed" if d.get("sigkill") else ", all exited after SIGTERM"))
    left = d.get("left_alone") or []
    if left:
        msg += "; left alone as planned: " + ", ".join(f"{e['pid']} ({e['rule']})" for e in left)
    new_left = d.get("left_alone_new") or []
    if new_left:
        msg += (f"; started during the reap and left alone: {', '.join(str(e['pid']) for e in new_left)} "
                "(not orphans of this tree; see the audit log)")
    if interrupt.caught():
        msg += f"; interrupted by {', '.join(interrupt.caught())}: the confirmed plan was carried out to its end"
    if mem is True:
        msg += "; GPU memory released"
    elif mem is False:
        msg += "; the GPU still lists a holder (the driver has not released its memory yet)"
    held = plan.held_back
    if held:
        msg += f"; GPU holder(s) {list(held)} were left alone and still hold their GPU"
    return run.done(True, "reaped", msg, EXIT_OK, mem)


__all__ = ["orphan_trees", "reap_tree", "make_rules", "plan_summary", "proc_dict"]
