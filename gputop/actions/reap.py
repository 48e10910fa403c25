"""Reap an orphan tree: check the root, make the plan (gputop.actions.plan), show it or carry it out.

``orphan_trees`` gives every orphan tree of a snapshot with its plan: the preview (``gputop reap``, the
TUI dialog, the API) shows exactly what ``reap_tree`` would do. ``reap_tree`` re-reads everything,
plans again, and hands the plan to the executor (gputop.actions.executor), which re-plans after freezing.
"""

from __future__ import annotations

from gputop.actions.common import (
    FACES, ActionResult, Ctx, OrphanTree, memory_released, name, proc_dict, same_start,
)
from gputop.actions import interrupt
from gputop.actions.executor import Outcome, execute
from gputop.actions.identity import TargetLock
from gputop.actions.plan import GONE, ReapPlan, Refusal, make_rules, plan_gpus, plan_reap, refusal_of
from gputop.actions.run import ProcessRun
from gputop.core.config import Config, load_config
from gputop.util.errors import EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, GputopError
from gputop.core.procs import ProcTable, read_proc


def orphan_trees(snapshot, table: ProcTable | None = None, config: Config | None = None,
                 sampler=None) -> list[OrphanTree]:
    """Every orphan root of ``snapshot`` with its live tree and reap plan (re-read now)."""
    table = table or ProcTable()
    config = config or load_config()
    rules = make_rules(config, getattr(snapshot, "platform", "posix"), table, snapshot, sampler=sampler)
    out = []
    for r in snapshot.roots:
        plan = plan_reap(table, r.pid, r.proc.start_time, rules)
        if plan.root is None or plan.refusal and plan.refusal[0] in GONE:
            continue  # exited or reused since the snapshot: not a tree any more
        out.append(OrphanTree(plan.root, plan.members, tuple(r.holders), tuple(r.gpus), r.gpu_memory, r.reason,
                              r.reaper, plan))
    return out


class ReapRun(ProcessRun):
    """One reap of the tree under ``pid`` (``root_pid``): its record names the grace and dry_run."""

    action = "reap"

    def __init__(self, root_pid: int | None, expected_start: float | None, face: str, grace: float | None,
                 dry_run: bool, reason: str | None, cfg: Config | None):
        super().__init__(root_pid, expected_start, face, reason, cfg)
        self.grace, self.dry_run = grace, dry_run

    @property
    def root_pid(self) -> int | None:
        return self.pid

    def record_fields(self, code: int, mem: bool | None) -> dict:
        return {"dry_run": self.dry_run, "grace": self.grace, "exit_code": code, "memory_released": mem}

    def check_plan(self, plan: ReapPlan, snap) -> ActionResult | None:
        """Record the plan in the details; a refusal result when the plan says apply must signal nothing."""
        self.gpus = plan_gpus(plan, snap)
        self.details["plan"] = plan.to_dict()
        refusal = refusal_of(plan)
        return self.refuse(refusal) if refusal is not None else None

    def refuse(self, refusal: Refusal) -> ActionResult:
        if refusal.rule is not None:
            self.details["rule"] = refusal.rule
        return self.done(False, refusal.outcome, refusal.message, refusal.code)

    def executed(self, outcome: Outcome, snap) -> ActionResult | None:
        """Put what the executor did into the details (the one place its outcome becomes record keys); the
        result of a refusal, or None when the plan was carried out (the caller says how it ended)."""
        self.details.update(outcome.details())
        if outcome.refusal is None:
            return None
        if outcome.replan is not None:  # planned again from the frozen table, and that plan refused
            self.details["replanned"] = True
            return self.check_plan(outcome.replan, snap)
        return self.refuse(outcome.refusal)


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
                    run.interrupted(e, f"the reap of the tree of pid {root_pid} was interrupted "
                                    f"({type(e).__name__}) after the signals listed; check 'gputop reap'")
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
    pid = run.root_pid
    info = run.info = read_proc(pid)
    if info is None or info.zombie:
        return run.done(False, "not-found", f"no process {pid}: the tree's root has exited (check "
                        "'gputop reap')", EXIT_NOT_FOUND)
    if run.expected_start is not None and not same_start(info.start_time, run.expected_start):
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
    refused = run.check_plan(plan, snap)
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
        outcome = execute(ctx, run, plan, snap, stats=stats)
    finally:
        lock.release()
    return run.executed(outcome, snap) or _finish(ctx, run, plan, outcome)


def plan_summary(plan: ReapPlan) -> str:
    text = f"{len(plan.members)} process(es) {list(plan.pids)}, holders {list(plan.holders)}"
    if plan.left_alone:
        text += "; left alone: " + "; ".join(e.reason for e in plan.left_alone)
    return text


def _finish(ctx: Ctx, run: ReapRun, plan: ReapPlan, done: Outcome) -> ActionResult:
    """The result of a reap the executor carried out: success only when every member is gone."""
    survivors = list(done.survivors)
    if done.not_converged is not None:
        return run.done(False, "still-alive", f"the tree of pid {run.root_pid} did not settle: new processes kept "
                        f"appearing after SIGKILL (a member that re-forks?); last seen: pid(s) {survivors or '?'}; "
                        "check 'gputop reap' again", EXIT_FAILURE)
    if survivors:
        names = ", ".join(f"{p}" for p in survivors)
        return run.done(False, "still-alive", f"pid(s) {names} of the tree of pid {run.root_pid} are still alive "
                        "after SIGKILL (uninterruptible I/O?); check 'gputop reap' again", EXIT_FAILURE)
    mem = memory_released(ctx, set(done.reaped_holders))
    late = len(set(done.started_during_reap) | set(done.joined_by_session))
    msg = (f"reaped the tree of pid {run.root_pid} ({name(run.info)}): {len(done.members)} process(es)"
           + (f" ({late} started during the reap, stopped at once)" if late else "")
           + done.ending)
    if done.left_alone:
        msg += "; left alone as planned: " + ", ".join(f"{e.pid} ({e.rule})" for e in done.left_alone)
    if done.left_alone_new:
        msg += (f"; started during the reap and left alone: {', '.join(str(e.pid) for e in done.left_alone_new)} "
                "(not orphans of this tree; see the audit log)")
    msg += interrupt.finished_note()
    if mem is True:
        msg += "; GPU memory released"
    elif mem is False:
        msg += "; the GPU still lists a holder (the driver has not released its memory yet)"
    held = plan.held_back
    if held:
        msg += f"; GPU holder(s) {list(held)} were left alone and still hold their GPU"
    return run.done(True, "reaped", msg, EXIT_OK, mem)


__all__ = ["orphan_trees", "reap_tree", "make_rules", "plan_summary", "proc_dict"]
