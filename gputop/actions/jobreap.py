"""Reap a group of processes known by membership (a finished Slurm job's leftovers) as one unit.

The group goes through the reap executor (gputop.actions.executor) like a tree: every member is stopped
together (SIGSTOP through verified pidfds), the group is planned again from the frozen table
(gputop.actions.plan.plan_group over the membership read again), then SIGTERM and SIGCONT for all, one
grace for all, SIGKILL for what is left. In every round the membership is read again from the round's own
table (one scan of /proc a round), and what joined is planned by the same plan_group, so a process the
group starts meanwhile (a supervisor's new child, a double fork into a new session) is stopped and killed
with the rest, and one under a process left alone is left alone with it, as in the first plan. Protected
processes, another user's and gputop's own ancestors are left alone and reported.
"""

from __future__ import annotations

from typing import Callable

from gputop.actions import interrupt
from gputop.actions.common import ActionResult, Ctx
from gputop.actions.executor import Outcome, execute
from gputop.actions.plan import LeftAlone, ReapPlan, make_rules, plan_group, plan_gpus
from gputop.actions.reap import ReapRun
from gputop.core.config import Config
from gputop.util.errors import EXIT_FAILURE, EXIT_OK, GputopError
from gputop.core.procs import ProcInfo, ProcTable


class GroupRun(ReapRun):
    """A reap of a group: no root; its audit record names the group (``target``)."""

    action = "reap-group"

    def __init__(self, target: dict, face: str, grace: float, reason: str | None, cfg: Config | None):
        super().__init__(None, None, face, grace, False, reason, cfg)
        self.group = target

    def target(self) -> dict:
        return {**self.group, "gpus": self.gpus}

    def record_fields(self, code: int, mem: bool | None) -> dict:
        return {"grace": self.grace, "exit_code": code}

    def result_fields(self, mem: bool | None) -> dict:
        return {}


def reap_group(membership: Callable[[ProcTable], list[int]], owner: ProcInfo, *, target: dict, face: str,
               grace: float, sampler, config: Config | None = None, reason: str | None = None) -> ActionResult:
    """Stop, plan, SIGTERM, wait one ``grace``, SIGKILL every process ``membership(table)`` names (and
    what they start meanwhile). ``owner``: a member, whose user every signalled process must have.
    Success means every planned member is gone; the survivors are named otherwise."""
    run = GroupRun(target, face, grace, reason, config)
    try:
        ctx = Ctx(sampler, config)
    except GputopError as e:
        return run.done(False, "failed", str(e), e.exit_code)
    run.cfg = ctx.config
    run.info = owner
    try:
        snap = ctx.sample()
        table = ProcTable()
        table.scan_all()  # the only scan before any signal: the plan's, and the lineage baseline's
        plan = _plan(ctx, snap, table, membership, owner)
        reported = {(e.pid, e.proc.start_time if e.proc else None) for e in plan.left_alone}

        def planner(table: ProcTable) -> ReapPlan:
            """The group's plan over ``table``, already scanned by the executor's round."""
            return _plan(ctx, snap, table, membership, owner)

        def rescan(table: ProcTable, rules, known: set[int]) -> tuple[list[ProcInfo], list[LeftAlone]]:
            """Members that joined since (the same rule as the plan: plan_group over this round's table),
            and what it leaves alone that was not reported yet."""
            found = plan_group(table, membership(table), owner, rules, known=known)
            left = [e for e in found.left_alone if (e.pid, e.proc.start_time if e.proc else None) not in reported]
            reported.update((e.pid, e.proc.start_time if e.proc else None) for e in left)
            return [m for m in found.members if m.pid not in known], left

        run.details["plan"] = plan.to_dict()
        run.gpus = plan_gpus(plan, snap, left_alone=False)
        if not plan.members:
            return run.done(True, "nothing", _left_text("no process to signal", plan), EXIT_OK)
        with interrupt.deferred():  # SIGHUP/SIGTERM: finish the plan, record it, then exit as asked
            outcome = execute(ctx, run, plan, snap, planner=planner, rescan=rescan, stats=table.stat_fields())
            return run.executed(outcome, snap) or _finish(run, outcome)
    finally:
        ctx.close()


def _plan(ctx: Ctx, snap, table: ProcTable, membership: Callable[[ProcTable], list[int]],
          owner: ProcInfo) -> ReapPlan:
    rules = make_rules(ctx.config, ctx.platform, table, snap, sampler=ctx.sampler)
    return plan_group(table, membership(table), owner, rules)


def _left_text(msg: str, plan: ReapPlan) -> str:
    if plan.left_alone:
        msg += "; left alone: " + "; ".join(e.reason for e in plan.left_alone[:5])
    return msg


def _finish(run: GroupRun, done: Outcome) -> ActionResult:
    """The result of a group reap the executor carried out: success only when every member is gone."""
    survivors = list(done.survivors)
    late = sorted(set(done.started_during_reap) | set(done.joined_by_session))
    if done.not_converged is not None:
        return run.done(False, "still-alive", "the group did not settle: new processes kept appearing after "
                        f"SIGKILL (a member that re-forks?); last seen: pid(s) {survivors or '?'}", EXIT_FAILURE)
    if survivors:
        return run.done(False, "still-alive", f"pid(s) {', '.join(map(str, survivors))} still alive after SIGKILL "
                        "(uninterruptible I/O?)", EXIT_FAILURE)
    msg = (f"{len(done.members)} process(es) stopped together and reaped"
           + (f" ({len(late)} joined during the reap, stopped at once: {late})" if late else "")
           + done.ending)
    left = list(done.left_alone) + list(done.left_alone_new)
    if left:
        msg += "; left alone: " + "; ".join(str(e.reason) for e in left[:5])
    msg += interrupt.finished_note()
    return run.done(True, "reaped", msg, EXIT_OK)


__all__ = ["reap_group", "GroupRun"]
