"""Kill one process (or several in parallel), safely.

Right before the signal: resolve a thread id to its process, re-read it, check its identity
(pid + start time), refuse PID 1, kernel threads, gputop and its ancestors, hidden, unknown and (unless
allowed) protected processes, then signal through a verified pidfd. Success means the process has
exited, re-checked by identity. A paused target (state T) gets SIGCONT with the signal and, if it does
not end, SIGSTOP again. A PID that cannot be seen but exists (EPERM, or the GPU lists it) is refused,
never called gone. Concurrent kills of one process take a shared lock: only the one that
signalled says "killed"; the others say the process exited under another invocation's signal.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

from gputop.actions.common import (
    FACES, NON_LETHAL, ActionResult, Ctx, err_text, memory_released, name, parse_signal, safety_refusal,
    same_start, sig_event, user,
)
from gputop.actions import interrupt
from gputop.actions.identity import Handle, TargetLock, wait_gone
from gputop.actions.run import ProcessRun
from gputop.core.config import Config, load_config
from gputop.util.errors import (
    EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_OK, EXIT_PERMISSION, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE,
    GputopError,
)
from gputop.core.permissions import signal_refusal
from gputop.core.orphans import PROTECTED, UNKNOWN
from gputop.core.procs import HIDDEN, read_proc, self_and_ancestors, tgid_of, visibility


def kill_process(pid: int, *, expected_start: float | None, face: str, force: bool = False,
                 timeout: float = 5.0, signal_name: str = "TERM", dry_run: bool = False,
                 require_holder: bool = True, allow_protected: bool = False, sampler=None,
                 config: Config | None = None, reason: str | None = None, policy: bool = False) -> ActionResult:
    """Signal one process safely; wait up to ``timeout``; with ``force``, escalate to SIGKILL.

    ``expected_start`` is the start time the caller saw (a snapshot); None means "as it is now".
    ``policy``: an admin's guard rule matched the process itself. Its orphan verdict (protected by a name,
    an ancestor or the nohup mark; unknown because its ancestry cannot be followed) is about whether a tree
    was abandoned, and the user chooses all of it: it does not exempt the process from the rule. Every
    identity and safety check still applies, and a holder gputop cannot see is still never signalled.
    """
    if face not in FACES:
        raise ValueError(f"face must be one of {FACES}, not {face!r}")
    run = _KillRun(pid, expected_start, face, force, timeout, dry_run, reason, config)
    try:
        sig = parse_signal(signal_name)
    except ValueError as e:
        return run.done(False, "bad-request", str(e), EXIT_USAGE)
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return run.done(False, "not-found", f"pid {pid!r} is not a valid process id", EXIT_NOT_FOUND)
    try:
        ctx = Ctx(sampler, config)
    except GputopError as e:
        return run.done(False, "failed", str(e), e.exit_code)
    run.cfg = ctx.config
    try:
        return run.run(ctx, sig, require_holder, allow_protected, policy)
    finally:
        ctx.close()


class _KillRun(ProcessRun):
    """One kill: its state; its record names the signal's options (dry_run, force)."""

    action = "kill"

    def __init__(self, pid, expected_start, face, force, timeout, dry_run, reason, cfg):
        super().__init__(pid, expected_start, face, reason, cfg)
        self.force, self.timeout, self.dry_run = force, timeout, dry_run

    def record_fields(self, code: int, mem: bool | None) -> dict:
        return {"dry_run": self.dry_run, "force": self.force, "exit_code": code, "memory_released": mem}

    def run(self, ctx: Ctx, sig: signal.Signals, require_holder: bool, allow_protected: bool,
            policy: bool = False) -> ActionResult:
        tgid = tgid_of(self.pid)
        if tgid != self.pid:  # NVML reported a thread id: act on its process
            self.details["thread_id"] = self.pid
            self.pid = tgid
        refusal = (self.check_target(ctx)
                   or self.check_gpu_and_verdict(ctx, require_holder, allow_protected, policy))
        if refusal is not None:
            return refusal
        info = self.info
        if self.dry_run:  # every check a real kill makes, the kernel's permission check (kill(pid, 0)) too
            why = signal_refusal(self.pid)
            if why is not None:
                return self.done(False, "permission-denied", f"would be refused: {why}", EXIT_PERMISSION)
            return self.done(True, "dry-run", f"would send {sig.name} to pid {self.pid} ({name(info)}, user "
                             f"{user(info)})" + (" and SIGKILL after the timeout"
                                                 if self.force and sig != signal.SIGKILL else ""), EXIT_OK)
        lock = TargetLock("kill", self.pid, info.start_time)
        if not lock.acquire():
            waited = self.timeout + (5.0 if self.force else 0.0) + 2.0
            if not lock.wait(self.pid, info.start_time, waited) or not self.still_there():
                lock.release()
                return self.exited_meanwhile(ctx)
        try:
            return self.signal(ctx, sig)
        finally:
            lock.release()

    def still_there(self) -> bool:
        now = read_proc(self.pid)
        return now is not None and not now.zombie and same_start(now.start_time, self.info.start_time)

    def exited_meanwhile(self, ctx: Ctx) -> ActionResult:
        """Another gputop held the lock and the process exited: say so, and take no credit."""
        if self.still_there():
            return self.done(False, "busy", f"pid {self.pid} ({name(self.info)}) is being killed by another gputop "
                             "invocation, and it is still alive; this one sent no signal", EXIT_FAILURE)
        self.details["by_other"] = True
        mem = memory_released(ctx, {self.pid}) if self.gpus else None
        return self.done(True, "exited", f"pid {self.pid} ({name(self.info)}) exited under another gputop "
                         "invocation's signal while this one waited; this one sent no signal", EXIT_OK, mem)

    def check_target(self, ctx: Ctx | None = None) -> ActionResult | None:
        pid = self.pid
        info = self.info = read_proc(pid)
        if info is None or info.zombie:
            return self.not_visible(ctx, zombie=info is not None)
        exp = self.expected_start
        if exp is not None and not same_start(info.start_time, exp):
            self.details["found_start_time"] = info.start_time
            return self.done(False, "identity-changed",
                             f"pid {pid} is now a different process (started {info.start_time:.2f}, expected "
                             f"{exp:.2f}): the one you saw has exited and the PID was reused; refresh and retry",
                             EXIT_REFUSED)
        refusal = safety_refusal(info, self_and_ancestors())
        if refusal:
            self.details["rule"] = refusal[0]
            return self.done(False, "refused", refusal[1], EXIT_REFUSED)
        return None

    def not_visible(self, ctx: Ctx | None, zombie: bool) -> ActionResult:
        """No live process ``pid`` is seen here. Hidden is not gone: the kernel (kill(pid, 0): EPERM) or the
        GPU driver (it lists the PID as a holder) may say it exists. Then refuse, exit 5, as for any
        process gputop cannot verify; only a PID nothing knows of is "not found" (exit 3)."""
        pid = self.pid
        if zombie:  # never "killed": only its parent's wait (or exit) frees what it holds
            from gputop.actions.zombie import zombie_refusal

            rule, message, parent = zombie_refusal(pid, ctx)
            self.details["rule"] = rule
            if parent is not None:
                self.details["parent"] = parent
            return self.done(False, "refused", message, EXIT_REFUSED)
        if visibility(pid, read_first=False) == HIDDEN:
            self.details["rule"] = "hidden"
            return self.done(False, "refused", f"pid {pid} exists but cannot be seen here (/proc hidepid, "
                             "or another user's process); gputop never signals what it cannot verify",
                             EXIT_REFUSED)
        listed = self.gpu_lists(ctx)
        if listed:
            self.details["rule"] = "hidden"
            self.gpus.extend(listed)
            return self.done(False, "refused", f"the GPU driver lists pid {pid} as a holder of GPU "
                             f"{','.join(map(str, listed))}, but it cannot be seen here (it runs in another PID "
                             "namespace, or it has exited and the driver has not released its memory yet); "
                             "gputop never signals what it cannot verify", EXIT_REFUSED)
        if self.expected_start is not None:
            return self.done(False, "not-found", f"no process {pid}: the one that started at "
                             f"{self.expected_start:.2f} has exited (check 'gputop status')", EXIT_NOT_FOUND)
        return self.done(False, "not-found", f"no process {pid} (it has exited, or never existed); check "
                         "'gputop status'", EXIT_NOT_FOUND)

    def gpu_lists(self, ctx: Ctx | None) -> list[int]:
        """The GPUs whose driver lists ``pid`` as a holder that cannot be seen here; [] when none does
        (or no sample can be taken)."""
        if ctx is None or ctx.sampler is None:
            return []
        try:
            snap = ctx.sample()
        except Exception:
            return []
        holder = snap.holder(self.pid) if snap is not None else None
        if holder is None or holder.proc is not None:
            return []
        return sorted(holder.gpus)

    def check_gpu_and_verdict(self, ctx: Ctx, require_holder: bool, allow_protected: bool,
                              policy: bool = False) -> ActionResult | None:
        pid, info = self.pid, self.info
        snap = None
        if ctx.sampler is not None:
            try:
                snap = ctx.sample()
            except Exception as e:
                ctx.sampler_error = f"sampling failed: {e}"
        holder = snap.holder(pid) if snap is not None else None
        if holder is not None and holder.proc is not None and not same_start(holder.start_time, info.start_time):
            holder = None
        if holder is not None:
            self.gpus.extend(holder.gpus)
            self.details["gpu_memory"] = holder.gpu_memory
        if require_holder and holder is None:
            self.details["rule"] = "not-holder"
            if snap is None:
                return self.refuse(f"cannot tell whether pid {pid} holds a GPU "
                                   f"({ctx.sampler_error}); pass --any-process to kill it anyway", EXIT_UNAVAILABLE)
            return self.refuse(f"pid {pid} ({name(info)}) holds no GPU; pass --any-process to "
                               "kill a process that is not a GPU holder")
        verdict = ctx.verdict(pid)
        if holder is not None and (holder.proc is None or holder.verdict.kind == UNKNOWN):
            verdict = holder.verdict  # the GPU side cannot tie this PID to what we see here: unknown wins
        self.details["verdict"] = {"kind": verdict.kind, "reason": verdict.reason}
        if policy:
            if holder is not None and holder.proc is None:
                self.details["rule"] = "unknown"
                return self.refuse(f"pid {pid} ({name(info)}): the GPU reports this PID, but gputop "
                                   f"cannot tie it to a process it sees here ({verdict.reason}); never signalled",
                                   EXIT_REFUSED)
            if verdict.kind in (PROTECTED, UNKNOWN):
                self.details["policy_overrides"] = verdict.kind  # the audit line says what did not exempt it
            return None
        if verdict.kind == UNKNOWN:
            self.details["rule"] = "unknown"
            return self.refuse(f"pid {pid} ({name(info)}) has an unknown verdict ({verdict.reason}); "
                               "gputop never signals a process whose ancestry it cannot verify")
        if verdict.kind == PROTECTED and not allow_protected:
            self.details["rule"] = "protected"
            return self.refuse(f"pid {pid} ({name(info)}) is protected: {verdict.reason}; use "
                               "--allow-protected for an explicit manual kill")
        return None

    def refuse(self, message: str, code: int = EXIT_REFUSED) -> ActionResult:
        """Refuse, unless the target exited while it was being checked (another gputop's kill, say): a
        refusal would then name a process that is gone, so say it exited, and that nothing was sent."""
        if not self.still_there():
            self.details.pop("rule", None)
            return self.done(False, "not-found", f"pid {self.pid} ({name(self.info)}) exited while it was being "
                             "checked; nothing was sent", EXIT_NOT_FOUND)
        return self.done(False, "refused", message, code)

    def signal(self, ctx: Ctx, sig: signal.Signals) -> ActionResult:
        pid, info = self.pid, self.info
        try:
            handle = Handle(info)
        except (ProcessLookupError, LookupError) as e:
            now = read_proc(pid)
            if isinstance(e, ProcessLookupError) or now is None or now.zombie:
                return self.done(False, "not-found", f"pid {pid} exited before it could be signalled", EXIT_NOT_FOUND)
            return self.done(False, "identity-changed", f"pid {pid} changed identity while being checked; "
                             "refresh and retry", EXIT_REFUSED)
        except PermissionError as e:  # alive, but its identity cannot be checked or it is not ours
            return self.done(False, "permission-denied", f"pid {pid}: {err_text(e)}", EXIT_PERMISSION)
        except Exception as e:
            return self.done(False, "not-found", f"pid {pid} cannot be opened: {err_text(e)}", EXIT_NOT_FOUND)
        with interrupt.deferred():  # SIGHUP/SIGTERM: finish the wait (and --force), record, then exit
            try:
                return self.send_and_wait(ctx, handle, sig)
            except BaseException as e:
                # Interrupted (Ctrl-C, a bug) after a signal may have gone out: record it before it propagates.
                self.interrupted(e, f"the kill of pid {pid} ({name(info)}) was interrupted "
                                 f"({type(e).__name__}) after the signals listed; check 'gputop status'")
                raise
            finally:
                handle.close()

    def send_and_wait(self, ctx: Ctx, handle: Handle, sig: signal.Signals) -> ActionResult:
        pid, info = self.pid, self.info
        before = read_proc(pid)
        paused = before is not None and before.state == "T"  # stopped by its owner (job control), not traced
        try:
            self.signals.append(sig_event(sig, [pid]))
            sent = handle.send(sig)
        except PermissionError:
            self.signals.pop()
            return self.done(False, "permission-denied", f"no permission to signal pid {pid} (user {user(info)}); "
                             "run as that user or as root", EXIT_PERMISSION)
        if not sent:
            self.signals.pop()
            return self.done(False, "not-found", f"pid {pid} exited before it could be signalled", EXIT_NOT_FOUND)
        if sig.name in NON_LETHAL:
            return self.done(True, "signalled", f"sent {sig.name} to pid {pid} ({name(info)})", EXIT_OK)
        now = read_proc(pid)
        continued = False
        if sig != signal.SIGKILL and (paused or (now is not None and now.state in ("T", "t"))):
            # A stopped process keeps the signal pending until it runs again; let it run to handle it.
            self.signals.append(sig_event(signal.SIGCONT, [pid]))
            continued = handle.send(signal.SIGCONT)
        alive = wait_gone([handle], self.timeout)
        outcome = "killed" if sig == signal.SIGKILL else "terminated"
        if alive and self.force and sig != signal.SIGKILL:
            self.signals.append(sig_event(signal.SIGKILL, [pid]))
            handle.send(signal.SIGKILL)
            alive = wait_gone([handle], max(self.timeout, 5.0))
            outcome = "killed"
        if alive and paused and continued and outcome != "killed":
            self.pause_again(handle)
            alive = wait_gone([handle], 0)  # it may have ended just now, before the SIGSTOP
        if alive:
            return self.still_alive(sig)
        return self.gone(ctx, sig, outcome)

    def pause_again(self, handle: Handle) -> None:
        """The target was paused (state T), got SIGCONT with the signal, and did not end: stop it again, so
        a failed kill leaves it as its owner left it. ``details["paused_again"]`` says whether it is."""
        pid = self.pid
        self.details["was_paused"] = True
        self.signals.append(sig_event(signal.SIGSTOP, [pid]))
        try:
            sent = handle.send(signal.SIGSTOP)
        except OSError:
            sent = False
        if not sent:
            self.signals.pop()
        deadline = time.monotonic() + 2.0
        state = None
        while sent:
            now = read_proc(pid)
            state = now.state if now is not None else None
            if state in ("T", None) or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        self.details["paused_again"] = state == "T"

    def still_alive(self, sig: signal.Signals) -> ActionResult:
        pid, info = self.pid, self.info
        self.details["survivors"] = [pid]
        if self.force or sig == signal.SIGKILL:
            now = read_proc(pid)
            msg = (f"pid {pid} ({name(info)}) is still alive after SIGKILL (state {now.state if now else '?'}; "
                   "a process in uninterruptible I/O dies when the I/O ends)")
        else:
            msg = (f"pid {pid} ({name(info)}) is still alive {self.timeout:g}s after {sig.name}; "
                   "use --force to send SIGKILL")
            if self.details.get("was_paused"):
                msg += ("; it was paused (state T) and is paused again" if self.details.get("paused_again") else
                        "; it was paused (state T), got SIGCONT with the signal, and could NOT be paused again: "
                        "it is running now")
        return self.done(False, "still-alive", msg, EXIT_FAILURE)

    def gone(self, ctx: Ctx, sig: signal.Signals, outcome: str) -> ActionResult:
        pid, info = self.pid, self.info
        mem = memory_released(ctx, {pid}) if self.gpus else None
        what = {"terminated": f"pid {pid} ({name(info)}) exited after {sig.name}",
                "killed": f"pid {pid} ({name(info)}) killed with SIGKILL"}[outcome]
        if "thread_id" in self.details:
            what += f" (GPU holder thread {self.details['thread_id']} belongs to it)"
        if mem is True:
            what += "; its GPU memory was released"
        elif mem is False:
            what += "; the GPU still lists it (the driver has not released its memory yet)"
        return self.done(True, outcome, what, EXIT_OK, mem)


def kill_many(targets: list[tuple[int, float | None]], **kw) -> list[ActionResult]:
    """kill_process for every (pid, expected_start), in parallel (one timeout, not one per target)."""
    if not targets:
        return []
    sampler = kw.pop("sampler", None)
    owned = None
    if sampler is None:
        try:
            cfg = kw.get("config") or load_config()
            kw["config"] = cfg
            from gputop.core.sampler import Sampler

            owned = sampler = Sampler.open(config=cfg)
        except GputopError:
            sampler = None  # each kill_process reports the problem itself
    from gputop.core.sampler import LockedSampler  # the process layer: loaded with the first action

    shared = LockedSampler.around(sampler) if sampler is not None else None
    try:
        # The kills run in worker threads, where no signal handler can be installed: the caller's thread
        # holds SIGHUP/SIGTERM until every kill has finished and written its record.
        with interrupt.deferred(), ThreadPoolExecutor(max_workers=min(32, len(targets))) as ex:
            futs = [ex.submit(kill_process, pid, expected_start=start, sampler=shared, **kw)
                    for pid, start in targets]
            return [f.result() for f in futs]
    finally:
        if owned is not None:
            owned.close()
