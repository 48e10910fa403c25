"""GPU reset: refuses while processes hold the GPU; with ``force`` it kills them first (the kill path)."""

from __future__ import annotations

import os
import time

from gputop.actions.common import Ctx, FACES, ActionResult, safety_refusal
from gputop.actions.kill import kill_many
from gputop.actions.reset_mig import mig_refusal
from gputop.actions.run import ActionRun
from gputop.backends.base import ResetError
from gputop.core.config import Config
from gputop.util.errors import (
    EXIT_FAILURE, EXIT_OK, EXIT_PERMISSION, EXIT_REFUSED, EXIT_UNAVAILABLE, GputopError,
)
from gputop.core.orphans import PROTECTED, UNKNOWN
from gputop.core.permissions import signal_refusal
from gputop.core.procs import self_and_ancestors
from gputop.util.textsafe import visible

_RESET_CODES = {
    "permission": ("permission-denied", EXIT_PERMISSION, "run it as root (sudo gputop reset --gpu {i})"),
    "display": ("refused", EXIT_REFUSED, "this GPU drives a display; stop the display server on it first"),
    "unsupported": ("unsupported", EXIT_UNAVAILABLE, "this GPU or driver cannot be reset from user space"),
    "missing-tool": ("missing-tool", EXIT_UNAVAILABLE, "install the vendor tool (nvidia-smi / amdsmi) and retry"),
    "busy": ("busy", EXIT_REFUSED, "stop the processes using it (gputop reset --gpu {i} --force)"),
    "failed": ("failed", EXIT_FAILURE, "see the message; check 'gputop status'"),
}


class ResetRun(ActionRun):
    """One reset of GPU ``gpu``: its record names the GPU and whether the holders were to be killed."""

    action = "reset"

    def __init__(self, gpu: int, face: str, force: bool, reason: str | None, cfg: Config | None):
        super().__init__(face, reason, cfg)
        self.gpu, self.force = gpu, force

    def target(self) -> dict:
        return {"gpu": self.gpu}

    def record_fields(self, code: int, mem: bool | None) -> dict:
        return {"force": self.force, "exit_code": code}

    def result_fields(self, mem: bool | None) -> dict:
        return {"gpu": self.gpu}


def reset_gpu(index: int, *, face: str, force: bool = False, sampler=None,
              config: Config | None = None, reason: str | None = None,
              kill_timeout: float | None = None, dry_run: bool = False) -> ActionResult:
    """Reset GPU ``index``. Refuses while processes hold it; ``force`` first kills them (same kill path).

    ``dry_run``: make every check (holders, refusals) and say what would happen; signal and reset nothing.
    The backend's own checks (root, a display, the reset tool) run only in a real reset."""
    if face not in FACES:
        raise ValueError(f"face must be one of {FACES}, not {face!r}")
    run = ResetRun(index, face, force, reason, config)
    try:
        ctx = Ctx(sampler, config)
    except GputopError as e:
        return run.done(False, "failed", str(e), e.exit_code)
    run.cfg = ctx.config
    try:
        return _checked_reset(ctx, run, kill_timeout, dry_run)
    finally:
        ctx.close()


def _checked_reset(ctx: Ctx, run: ResetRun, kill_timeout: float | None, dry_run: bool) -> ActionResult:
    """Check that GPU ``run.gpu`` can be reset and who holds it, clear the holders (``run.force``), reset."""
    index, details, done = run.gpu, run.details, run.done
    if ctx.sampler is None:
        return done(False, "unavailable", f"no GPU backend: {ctx.sampler_error}", EXIT_UNAVAILABLE)
    try:
        ctx.sampler.locate(index)
    except GputopError as e:
        return done(False, "not-found", str(e), e.exit_code)
    rights = reset_rights(ctx.sampler.locate(index)[0])
    if rights is not None:  # before any holder is killed: a reset that cannot happen costs nobody a job
        outcome, code, hint = _RESET_CODES[rights[0]]
        details["kind"] = rights[0]
        return done(False, outcome, f"GPU {index} not reset: {rights[1]}; {hint.format(i=index)}", code)
    snap = ctx.sample()
    holders = snap.holders_on(index)
    details["holders"] = [{"pid": h.pid, "start_time": h.start_time, "user": h.user, "name": h.name,
                           "cmd": h.cmd, "verdict": h.verdict.kind} for h in holders]
    mig = mig_refusal(snap, index, holders)  # MIG: any held instance refuses, --force and --dry-run too
    if mig is not None:
        details["rule"], details["instances"] = "mig-held", mig[1]
        return done(False, "busy", mig[0], EXIT_REFUSED)
    if not holders and dry_run:
        return done(True, "dry-run", f"would reset GPU {index} (no process holds it)", EXIT_OK)
    if holders and not run.force:
        listing = ", ".join(f"{h.pid} ({visible(h.name)}, {visible(h.user or '?')})" for h in holders)
        return done(False, "busy", f"GPU {index} is in use by {len(holders)} process(es): {listing}; "
                    f"stop them or use --force to kill them first", EXIT_REFUSED)
    if holders:
        stop = _clear_holders(ctx, run, holders, kill_timeout, dry_run)
        if stop is not None:
            return stop
    return _reset(ctx, run)


def reset_rights(backend) -> tuple[str, str] | None:
    """(kind, why) when this process cannot reset a GPU of ``backend`` at all, or None.

    The same facts the backends enforce in ``reset`` (every vendor backend resets only as root; the base
    backend cannot reset), asked before anything else, so the dry run every face previews with (the CLI's
    --dry-run, the TUI dialog, MCP, the API) says what the real reset will do, and a real reset with
    --force does not kill the holders first only to fail."""
    from gputop.backends.base import Backend

    name = getattr(backend, "name", "?")
    if type(backend).reset is Backend.reset:
        return "unsupported", f"{name}: reset is not supported by this backend"
    if name != "simulated" and hasattr(os, "geteuid") and os.geteuid() != 0:
        return "permission", f"{name}: a GPU reset needs root (this process runs as uid {os.geteuid()})"
    return None


def signal_blockers(holders) -> list[str]:
    """Why the kernel would refuse this process's signal to a holder (kill(pid, 0), which sends nothing)."""
    return [why for why in (signal_refusal(h.pid) for h in holders) if why is not None]


def reset_blockers(holders, ancestors: set[int] | None = None) -> list[tuple[object, str]]:
    """The holders gputop never kills, each with why: a reset of their GPU is refused while they hold it.
    One rule for the reset itself and for every face that offers a reset (the TUI dialog)."""
    ancestors = self_and_ancestors() if ancestors is None else ancestors
    out = []
    for h in holders:
        if not h.visible:
            out.append((h, f"pid {h.pid} cannot be seen here (another PID namespace)"))
            continue
        rule = safety_refusal(h.proc, ancestors) if h.proc is not None else None
        if rule is not None:
            out.append((h, f"pid {h.pid} ({rule[1]})"))
        elif h.verdict.kind in (PROTECTED, UNKNOWN):
            out.append((h, f"pid {h.pid} ({visible(h.name)}) is {h.verdict.kind}: {h.verdict.reason}"))
    return out


def _clear_holders(ctx: Ctx, run: ResetRun, holders, kill_timeout: float | None, dry_run: bool):
    """Kill the GPU's holders (all or none): a result that stops the reset, or None once they are gone."""
    index, details, done = run.gpu, run.details, run.done
    invisible = [h.pid for h in holders if not h.visible]
    if invisible:
        return done(False, "refused", f"GPU {index} is held by pid(s) {invisible} that gputop cannot see "
                    "(another PID namespace); stop them there first", EXIT_REFUSED)
    # Refuse before killing anyone: a reset that one holder blocks must not cost the others their jobs.
    blocked = [why for _, why in reset_blockers(holders)]
    if blocked:
        details["rule"] = "holder-refused"
        return done(False, "refused", f"GPU {index} not reset, and no holder was killed: "
                    + "; ".join(blocked) + "; gputop never kills these, stop them yourself first", EXIT_REFUSED)
    denied = signal_blockers(holders)
    if denied:
        details["rule"] = "permission"
        return done(False, "permission-denied", f"GPU {index} not reset, and no holder was killed: "
                    + "; ".join(denied), EXIT_PERMISSION)
    if dry_run:
        return done(True, "dry-run", f"would kill {len(holders)} process(es) holding GPU {index} "
                    f"({', '.join(str(h.pid) for h in holders)}), then reset it", EXIT_OK)
    timeout = kill_timeout if kill_timeout is not None else ctx.config.kill_timeout
    results = kill_many([(h.pid, h.start_time) for h in holders], face=run.face, force=True, timeout=timeout,
                        sampler=ctx.sampler, config=ctx.config,
                        reason=f"reset of GPU {index}" + (f": {run.reason}" if run.reason else ""))
    details["kills"] = [r.to_dict() for r in results]
    failed = [r for r in results if not r.ok and r.outcome != "not-found"]
    if failed:
        r = failed[0]
        return done(False, "refused", f"GPU {index} not reset: holder pid {r.pid} could not be "
                    f"killed: {r.message}", r.exit_code or EXIT_FAILURE)
    deadline = time.monotonic() + 5.0
    while ctx.sample().holders_on(index) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = ctx.sample().holders_on(index)
    if left:
        details["survivors"] = [h.pid for h in left]
        return done(False, "busy", f"GPU {index} not reset: pid(s) {[h.pid for h in left]} still hold "
                    "it after the kill", EXIT_FAILURE)
    return None


def _reset(ctx: Ctx, run: ResetRun) -> ActionResult:
    index, done = run.gpu, run.done
    try:
        what = ctx.sampler.reset(index)
    except ResetError as e:
        outcome, code, hint = _RESET_CODES.get(e.kind, _RESET_CODES["failed"])
        run.details["kind"] = e.kind
        return done(False, outcome, f"GPU {index} not reset: {e}; {hint.format(i=index)}", code)
    except GputopError as e:
        return done(False, "failed", f"GPU {index} not reset: {e}", e.exit_code)
    except Exception as e:
        return done(False, "failed", f"GPU {index} not reset: {type(e).__name__}: {e}", EXIT_FAILURE)
    return done(True, "reset", what or f"GPU {index} reset", EXIT_OK)
