"""gputop slurm epilog|prolog|check: clean up after Slurm jobs, and keep a job's GPUs free of strays."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time

from gputop.commands._common import config_from, open_sampler, print_json
from gputop.util.errors import EXIT_FAILURE, EXIT_OK, UsageError
from gputop.util.textsafe import visible

NAME = "slurm"
HELP = "Slurm node hooks: epilog reaps a finished job's leftovers, prolog frees a job's GPUs, check"
DESCRIPTION = """Slurm node hooks (run as root by slurmd; see README "Running under Slurm" and docs/slurm.md).

  gputop slurm epilog   as Epilog=: every process still alive that belongs to the job in SLURM_JOB_ID
                        (by cgroup or by environment) and runs as SLURM_JOB_UID is reaped, all together:
                        stopped, SIGTERM, one grace, SIGKILL, and what the job starts meanwhile with them.
                        Exit 0 when nothing it targeted is left; 1 (Slurm drains the node) when a GPU
                        holder of the job, or a process it signalled, survives, named on stderr.
  gputop slurm prolog   as Prolog=: the job's GPUs (SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES, or the GRES IDX
                        of 'scontrol show job -d') must hold no process of another job. A stray of an ended
                        job (an orphan) is reaped; a holder of a running job, or one gputop may not reap,
                        fails the prolog with exit 1 (Slurm requeues the job and drains the node).
  gputop slurm check    the same checks, read-only. With a job (SLURM_JOB_ID or --job), the prolog's check
                        of its GPUs; without one, the whole node: exit 1 when any GPU holder is a stray of
                        an ended Slurm job. For admins and HealthCheckProgram.

Every signal goes through the same planner and executor as 'gputop reap', and every action is in the
audit log with the job id and uid."""

EPILOG_GRACE = 3.0  # seconds between SIGTERM and SIGKILL: well inside Slurm's epilog time
DEADLINE = 60.0  # no new tree or process is started on after this many seconds (each wait is bounded)


def add_arguments(p) -> None:
    from gputop.commands.cli import add_common

    sub = p.add_subparsers(dest="slurm_command", metavar="{epilog,prolog,check}")
    for name, help_ in (("epilog", "reap what the job in SLURM_JOB_ID left behind (Epilog=)"),
                        ("prolog", "free the job's GPUs of strays; fail on a running job's holder (Prolog=)"),
                        ("check", "the prolog's checks, or a node-wide stray check, read-only")):
        sp = sub.add_parser(name, help=help_, description=help_)
        add_common(sp, suppress=True)
        sp.add_argument("--job", type=int, metavar="N", help="the job (default: $SLURM_JOB_ID)")
        sp.add_argument("--uid", type=int, metavar="UID", help="the job's user (default: $SLURM_JOB_UID)")
        sp.add_argument("--json", action="store_true", help="print JSON")
        if name != "epilog":
            sp.add_argument("--gpus", metavar="LIST", help="the job's GPUs, e.g. 0,2-3 (default: from the "
                            "job's environment or scontrol)")
        if name != "check":
            sp.add_argument("--deadline", type=float, default=DEADLINE, metavar="S",
                            help=f"start on no new tree after S seconds; report what is left (default {DEADLINE:g})")
            sp.add_argument("--grace", type=float, default=EPILOG_GRACE, metavar="S",
                            help=f"seconds between SIGTERM and SIGKILL (default {EPILOG_GRACE:g})")


def _env_int(args, attr: str, var: str, required: bool) -> int | None:
    v = getattr(args, attr, None)
    if v is not None:
        return v
    raw = os.environ.get(var)
    if raw is None or raw == "":
        if required:
            raise UsageError(f"no job: {var} is not set (slurmd sets it for Prolog= and Epilog=); "
                             f"pass --{attr} to run this by hand")
        return None
    if not raw.isdigit():
        raise UsageError(f"{var}={raw!r} is not a number")
    return int(raw)


def run(args) -> int:
    cmd = getattr(args, "slurm_command", None)
    if cmd is None:
        raise UsageError("say which: gputop slurm epilog|prolog|check")
    if cmd == "epilog":
        return _epilog(args)
    return _prolog(args, apply=(cmd == "prolog"))


def _emit(args, result: dict, lines: list[str], errors: list[str]) -> None:
    if args.json:
        print_json(result)
    else:
        for line in lines:
            print(line)
    for e in errors:  # always on stderr: slurmd logs a failed hook's stderr
        print(f"gputop: {e}", file=sys.stderr)


def _audit(config, action: str, job: int | None, uid: int | None, ok: bool, message: str, extra: dict) -> None:
    from gputop.core import auditlog

    now = time.time()
    rec = {"at": now, "time": auditlog.iso(now), "host": socket.gethostname(), "actor": auditlog.actor(),
           "face": "cli", "action": action, "target": {"slurm_job": job, "slurm_uid": uid}, "signals": [],
           "outcome": "ok" if ok else "failed", "ok": ok, "message": message,
           "slurm": {"job_id": job, "uid": uid}, **extra}
    try:
        auditlog.append(rec, config=config)
    except auditlog.AuditLogError:
        pass  # append() has already warned loudly on stderr


# ---- epilog --------------------------------------------------------------------------------------

def _epilog(args) -> int:
    from gputop.core import slurm_jobs as sl
    from gputop.core.procs import ProcTable, self_and_ancestors

    job = _env_int(args, "job", "SLURM_JOB_ID", True)
    uid = _env_int(args, "uid", "SLURM_JOB_UID", True)
    config = dataclasses.replace(config_from(args), nohup_protects=False)
    started = time.monotonic()
    members = sl.job_processes(job, uid, ProcTable(), exclude=self_and_ancestors())
    if not members:
        msg = f"Slurm job {job} (uid {uid}) left no process on this node"
        _audit(config, "slurm-epilog", job, uid, True, msg, {"members": []})
        _emit(args, {"ok": True, "job": job, "uid": uid, "members": [], "results": [], "survivors": []}, [msg], [])
        return EXIT_OK
    sampler = open_sampler(args, config)
    sampler.job_states.assume(job, "COMPLETING", "its epilog is running")
    try:
        snap = sampler.sample()
        member_pids = {m.proc.pid for m in members}
        holders = [h.pid for h in snap.holders if h.pid in member_pids]
        results = _reap_job(sampler, config, snap, members, job, uid, args.grace, started + args.deadline)
        after = sampler.sample()
    finally:
        sampler.close()
    survivors = sl.job_processes(job, uid, ProcTable(), exclude=self_and_ancestors())
    gpu_survivors = [h for h in after.holders if any(_holder_is(h, m.proc) for m in survivors)]
    took = time.monotonic() - started
    ok, errors = epilog_verdict(job, [m.proc for m in survivors], gpu_survivors, results)
    gone = sum(1 for m in members if not any(_is(s.proc, m.proc.pid, m.proc.start_time) for s in survivors))
    msg = (f"Slurm job {job} (uid {uid}): {len(members)} leftover process(es), GPU holders {holders}; "
           f"{gone} gone, {len(survivors)} left ({took:.1f}s)")
    _audit(config, "slurm-epilog", job, uid, ok, msg + ("" if ok else "; " + "; ".join(errors[:3])),
           {"members": [_pdict(m.proc) for m in members], "holders": holders,
            "survivors": [m.proc.pid for m in survivors], "gpu_survivors": [h.pid for h in gpu_survivors],
            "seconds": round(took, 2)})
    _emit(args, {"ok": ok, "job": job, "uid": uid, "members": [_pdict(m.proc) for m in members],
                 "holders": holders, "results": [r.to_dict() for r in results],
                 "survivors": [m.proc.pid for m in survivors], "gpu_survivors": [h.pid for h in gpu_survivors]},
          [msg] + [f"  {r.outcome}: {visible(r.message)}" for r in results], errors)
    return EXIT_OK if ok else EXIT_FAILURE


def epilog_verdict(job: int, survivors: list, gpu_survivors: list, results: list) -> tuple[bool, list[str]]:
    """Whether the epilog succeeded, and its stderr lines (pure). ``survivors``: the job's processes alive
    after the reap (ProcInfo). It fails (exit 1: Slurm drains the node) when a GPU holder of the job
    survives, or when a process the reap took as a target survives it (SIGKILL did not end it, or it could
    not be signalled), as Slurm drains a node whose job step cannot be killed. A target is a member of the
    reap's plan or a process it signalled, matched by (pid, start time): a process that reuses a target's
    PID is not blamed for it. When a reap failed before it planned, every survivor fails the epilog. A
    survivor the reap did not target (left alone on purpose: protected, past the deadline; or started
    after it) and that holds no GPU is a warning."""
    gpu = {h.pid for h in gpu_survivors}
    blind = any(not r.ok and not _planned(r) for r in results)
    errors = [f"Slurm job {job}: GPU holder pid {h.pid} ({visible(h.name)}, user {visible(h.user)}) survived the "
              f"epilog: {_why(results, h.pid, getattr(h, 'proc', None))}; the node should be drained and checked"
              for h in gpu_survivors]
    bad = bool(gpu)
    for p in survivors:
        if p.pid in gpu:
            continue
        if blind or _targeted(results, p):
            bad = True
            errors.append(f"Slurm job {job}: pid {p.pid} ({visible(p.name)}) survived the epilog: "
                          f"{_why(results, p.pid, p)}; the node should be drained and checked")
        else:
            errors.append(f"warning: pid {p.pid} ({visible(p.name)}) of job {job} is still alive (it holds no "
                          f"GPU): {_why(results, p.pid, p)}")
    return not bad, errors


def _planned(r) -> bool:
    """True when reap result ``r`` got as far as a plan (it names its targets)."""
    return bool(r.details.get("plan") or r.details.get("members"))


def _targets(r) -> list[tuple[int, float | None]]:
    """(pid, start time) of every target of reap result ``r``: what it signalled, and its plan's members
    (one it could not signal included) but those it released on re-planning (left alone on purpose)."""
    d = r.details
    released = set(d.get("released") or ())
    planned = [m for m in (d.get("plan") or {}).get("members") or [] if m and m.get("pid") not in released]
    return [(m["pid"], m.get("start_time")) for m in [*(d.get("members") or []), *planned] if m]


def _targeted(results: list, p) -> bool:
    return any(_is(p, pid, start) for r in results for pid, start in _targets(r))


def _is(p, pid: int, start: float | None) -> bool:
    """True when process ``p`` is the process (pid, start); an unknown start matches by pid alone."""
    from gputop.actions.common import same_start

    return p.pid == pid and (start is None or p.start_time is None or same_start(p.start_time, start))


def _holder_is(h, p) -> bool:
    """True when GPU holder ``h`` (a later sample) is process ``p``."""
    return _is(p, h.pid, h.proc.start_time if h.proc is not None else None)


def _pdict(p) -> dict:
    return {"pid": p.pid, "ppid": p.ppid, "start_time": p.start_time, "name": p.name, "uid": p.uid,
            "user": p.user, "cmdline": list(p.cmdline)}


def _why(results, pid: int, p=None) -> str:
    """Why ``pid`` (process ``p`` when known) is still there, from the reap results."""
    for r in results:
        if p is not None and any(_is(p, t, s) for t, s in _targets(r)) or p is None and (
                r.pid == pid or pid in (r.details.get("survivors") or [])):
            return f"{r.outcome}: {visible(r.message)}"
        for e in (r.details.get("left_alone") or []) + ((r.details.get("plan") or {}).get("left_alone") or []):
            if pid == e.get("pid") or pid in (e.get("subtree") or []):
                return f"left alone ({e.get('rule')}): {visible(str(e.get('reason')))}"
    if any(_planned(r) for r in results):
        return "the reap did not take it (it started after the reap, or it reuses a reaped process's PID)"
    failed = [r for r in results if not r.ok]
    if failed:
        return f"{failed[0].outcome}: {visible(failed[0].message)}"
    return "it was not reaped (not an orphan, or protected)"


def _reap_job(sampler, config, snap, members, job: int, uid: int, grace: float, deadline: float) -> list:
    """Every leftover of the job as one group, through the reap executor (gputop.actions.jobreap): all
    stopped together, planned again, SIGTERM together, one grace, SIGKILL for the rest; the job's
    membership (cgroup or environment, gputop.core.slurm_jobs.job_processes) is read again in every round, from the
    table that round scanned, so what the job starts meanwhile is taken too. A protected process is left
    alone and reported; a process of another job or user, or one of the epilog's ancestors, is never a
    member."""
    from gputop.core import slurm_jobs as sl
    from gputop.actions.jobreap import reap_group
    from gputop.core.procs import self_and_ancestors

    left = deadline - time.monotonic()
    if left <= 0:
        return []  # past the deadline: what is left is reported as surviving (Slurm drains the node)
    never = set(self_and_ancestors())

    def membership(table) -> list[int]:
        return [m.proc.pid for m in sl.job_processes(job, uid, table, exclude=never)]

    why = f"slurm epilog: job {job} (uid {uid}) ended; its process was left behind"
    return [reap_group(membership, members[0].proc, target={"slurm_job": job, "slurm_uid": uid, "uid": uid},
                       face="cli", grace=max(0.0, min(grace, left)), sampler=sampler, config=config, reason=why)]


# ---- prolog and check ----------------------------------------------------------------------------

def _prolog(args, apply: bool) -> int:
    from gputop.core import slurm_jobs as sl
    from gputop.core.orphans import ORPHAN

    job = _env_int(args, "job", "SLURM_JOB_ID", apply)
    if job is None:
        return _node_check(args)
    config = config_from(args)
    if args.gpus:
        try:
            gpus, source = sl.parse_index_list(args.gpus), "--gpus"
        except ValueError as e:
            raise UsageError(str(e)) from None
    else:
        gpus, source = sl.job_gpus(dict(os.environ), job)
    if gpus is None:
        msg = f"Slurm job {job}: no GPUs to check ({source})"
        _emit(args, {"ok": True, "job": job, "gpus": None, "source": source, "holders": []}, [msg], [])
        return EXIT_OK
    sampler = open_sampler(args, config)
    try:
        snap = sampler.sample()
        others = [h for h in snap.holders if set(h.gpus) & set(gpus) and _not_this_run(h, job)]
        results = []
        if apply:
            for root in sorted({h.verdict.root for h in others if h.verdict.kind == ORPHAN and h.verdict.root}):
                results.append(_reap_stray(sampler, config, snap, root, job))
            if results:
                snap = sampler.sample()
                others = [h for h in snap.holders if set(h.gpus) & set(gpus) and _not_this_run(h, job)]
    finally:
        sampler.close()
    return _prolog_report(args, config, job, gpus, source, others, results, apply)


def _not_this_run(h, job: int) -> bool:
    """A holder that is not of this run of ``job``: of no job, of another job, or a leftover of an earlier
    run of this job (requeued; gputop.core.slurm_jobs.JobState.for_ref)."""
    return h.job is None or h.job.job_id != job or _state(h) is not None and _state(h).earlier_run


def _state(h):
    """The holder's job state as it concerns the holder (an earlier run of a requeued job has ended)."""
    return h.job_state.for_ref(h.job) if h.job is not None and h.job_state is not None else h.job_state


def _holder_line(h) -> str:
    job = f"Slurm job {h.job.label()} ({_state(h).describe() if h.job_state else 'state unknown'})" \
        if h.job else "no Slurm job"
    return (f"pid {h.pid} ({visible(h.name)}, user {visible(h.user)}) on GPU {','.join(map(str, h.gpus))}: "
            f"{job}; {h.verdict.kind}: {visible(h.verdict.reason)}")


def _prolog_report(args, config, job, gpus, source, others, results, apply) -> int:
    ok = not others
    what = "prolog" if apply else "check"
    msg = (f"Slurm job {job}: GPU(s) {','.join(map(str, gpus))} ({source}) "
           + ("are free of other jobs' processes" if ok else f"are held by {len(others)} other process(es)")
           + (f"; {len(results)} stray tree(s) reaped" if results else ""))
    errors = [f"{_holder_line(h)}" for h in others]
    if not ok:
        errors.append(f"the {what} fails: " + ("Slurm requeues the job and drains the node" if apply else
                                              "the job's GPUs are not free"))
    if apply:
        _audit(config, "slurm-prolog", job, _env_int(args, "uid", "SLURM_JOB_UID", False), ok, msg,
               {"gpus": gpus, "holders": [h.pid for h in others], "reaped": [r.pid for r in results if r.ok]})
    _emit(args, {"ok": ok, "job": job, "gpus": gpus, "source": source,
                 "holders": [_hdict(h) for h in others], "results": [r.to_dict() for r in results]},
          [msg] + [f"  {r.outcome}: {visible(r.message)}" for r in results], errors)
    return EXIT_OK if ok else EXIT_FAILURE


def _hdict(h, snap=None) -> dict:
    from gputop.core.snapshot_json import slurm_to_dict

    st = snap.allocation.standing(h.pid) if snap is not None and snap.allocation is not None else None
    return {"pid": h.pid, "name": h.name, "user": h.user, "gpus": list(h.gpus), "slurm": slurm_to_dict(h),
            "verdict": {"kind": h.verdict.kind, "reason": h.verdict.reason, "root": h.verdict.root},
            "standing": st.to_dict() if st is not None else None}


def _reap_stray(sampler, config, snap, root: int, job: int):
    from gputop import actions

    r = next(x for x in snap.roots if x.pid == root)
    return actions.reap_tree(root, expected_start=r.proc.start_time, face="cli", config=config,
                             sampler=sampler, reason=f"slurm prolog of job {job}: a stray holds its GPU")


def _node_check(args) -> int:
    """No job: every GPU holder of the node that is a stray of an ended Slurm job fails the check."""
    sampler = open_sampler(args)
    try:
        snap = sampler.sample()
    finally:
        sampler.close()
    strays = [h for h in snap.holders if h.job is not None and h.job_state is not None and _state(h).ended]
    unknown = [h for h in snap.holders if h.job is not None and (h.job_state is None or h.job_state.ended is None)]
    lines = [f"{socket.gethostname()}: {len(snap.holders)} GPU holder(s), "
             f"{sum(1 for h in snap.holders if h.job)} in Slurm jobs, {len(strays)} stray(s) of ended jobs"]
    lines += [f"  {_holder_line(h)}" for h in snap.holders if h.job is not None]
    errors = [f"stray: {_holder_line(h)}" for h in strays]
    errors += [f"warning: {_holder_line(h)}" for h in unknown]
    result = {"ok": not strays, "holders": [_hdict(h, snap) for h in snap.holders], "strays": [h.pid for h in strays]}
    standing_report(snap, result, lines, errors)
    _emit(args, result, lines, errors)
    return EXIT_OK if not strays else EXIT_FAILURE


def standing_report(snap, result: dict, lines: list[str], errors: list[str]) -> None:
    """Squatters and processes outside their job's allocation (gputop.core.allocation): reported in the
    lines, on stderr and in the JSON (``squatters``, ``outside``, ``allocation``); they do not fail the
    check, which drains the node only for strays of ended jobs (docs/allocation.md)."""
    alloc = snap.allocation
    result["allocation"] = alloc.to_dict() if alloc is not None else None
    result["squatters"], result["outside"] = [], []
    if alloc is None:
        return
    lines.append("  allocation: " + (", ".join(f"GPU {g} job {visible(a.job)} ({visible(a.user or str(a.uid))})"
                                               for g, a in sorted(alloc.by_gpu.items())) or "no GPU is allocated"))
    for h in snap.holders:
        st = alloc.standing(h.pid)
        if st is not None and st.kind in ("squatter", "outside"):
            result["squatters" if st.kind == "squatter" else "outside"].append(h.pid)
            errors.append(f"{st.kind}: pid {h.pid} ({visible(h.name)}, user {visible(h.user)}) on GPU "
                          f"{','.join(map(str, h.gpus))}: {visible(st.reason)}")
    if alloc.error:
        errors.append(f"warning: the GPU allocation is unknown: {visible(alloc.error)}")
