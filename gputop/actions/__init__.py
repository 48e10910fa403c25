"""Safe actions: kill, orphan-tree reap and GPU reset. The ONE place that signals processes or resets GPUs.

Every face (CLI, TUI, guard, MCP, HTTP API) calls this package. The files show the design:

- ``common``: results, the per-action context, safety rules (PID 1, kernel threads, gputop and its
  ancestors are never signalled) and audit records;
- ``run``: one action run (kill, reap, group reap, reset), which writes its one audit record and returns
  its result;
- ``identity``: a verified pidfd per target (identity = pid + start time, checked right before acting),
  waiting for an exit, and the cross-invocation lock on one target;
- ``kill``: one process (a thread id is resolved to its process first), or several in parallel;
- ``plan``: the reap planner, a pure function from a process table and a root to the plan; also the
  rules it plans with (``make_rules``) and what a refused plan answers (``refusal_of``);
- ``reap``: orphan trees with their plans, and ``reap_tree``, which re-checks and plans again;
- ``executor``: carries out a plan (freeze, re-plan, SIGTERM, SIGKILL), signals only its members, and
  returns what it did (``Outcome``);
- ``jobreap``: a group known by membership (a finished Slurm job's leftovers), through the same executor;
- ``watchdog``: reaps trees that stay orphaned past a grace;
- ``reset``: GPU reset, killing the holders first only with ``force``.

Expected failures come back as ``ActionResult(ok=False, ...)``; they do not raise. Success means every
target has exited. Every action and refusal is in the audit log. No UI imports here.
"""

from gputop.actions.common import FACES, ActionResult, OrphanTree, parse_signal, same_start
from gputop.actions.kill import kill_many, kill_process
from gputop.actions.plan import LeftAlone, ReapPlan, Rules, plan_reap
from gputop.actions.reap import orphan_trees, reap_tree
from gputop.actions.reset import reset_gpu
from gputop.actions.watchdog import Watchdog, run_watch

__all__ = [
    "FACES", "ActionResult", "LeftAlone", "OrphanTree", "ReapPlan", "Rules", "Watchdog", "kill_many", "kill_process",
    "orphan_trees", "parse_signal", "plan_reap", "reap_tree", "reset_gpu", "run_watch", "same_start",
]
