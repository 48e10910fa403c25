"""Safe actions: kill, orphan-tree reap and GPU reset. The ONE place that signals processes or resets GPUs.

Every face (CLI, TUI, guard, MCP, HTTP API) calls this module. Right before each signal it re-reads the
target, checks its identity (pid + start time), refuses PID 1, kernel threads, gputop itself and its
ancestors, and anything whose verdict (re-classified now) is protected or unknown. On Linux it signals
through a pidfd opened after the identity check, so a reused PID can never be hit; elsewhere it uses
psutil with a start-time check. Every action and every refusal is written to the audit log.

Expected failures come back as ``ActionResult(ok=False, ...)``; they do not raise. No UI imports here.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable

from gputop import auditlog
from gputop.backends.base import ResetError
from gputop.config import Config, load_config
from gputop.errors import (
    EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_OK, EXIT_PERMISSION, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE,
    GputopError,
)
from gputop.orphans import PROTECTED, UNKNOWN, classify, compile_protect, protect_reason
from gputop.procs import IS_LINUX, ProcInfo, ProcTable, read_proc, self_and_ancestors

FACES = ("cli", "tui", "guard", "mcp", "api")

# Start times are rounded to 0.01 s; two readings of one process are equal, allow for float noise.
_START_EPS = 0.006
_POLL = 0.02
# Signals that are not meant to end the process: report "signalled" instead of waiting for an exit.
_NON_LETHAL = {"SIGSTOP", "SIGCONT", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGUSR1", "SIGUSR2", "SIGWINCH",
               "SIGCHLD", "SIGURG"}


@dataclass(frozen=True)
class ActionResult:
    action: str  # "kill" | "reap" | "reset"
    ok: bool
    outcome: str  # short token: terminated, killed, reaped, reset, signalled, still-alive, refused, ...
    message: str  # one line for humans; on failure it says what to do
    pid: int | None = None
    gpu: int | None = None
    exit_code: int = EXIT_OK  # gputop.errors EXIT_* code
    memory_released: bool | None = None
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"action": self.action, "ok": self.ok, "outcome": self.outcome, "message": self.message,
                "pid": self.pid, "gpu": self.gpu, "exit_code": self.exit_code,
                "memory_released": self.memory_released, "details": self.details}


@dataclass(frozen=True)
class OrphanTree:
    """An orphan root and everything under it, as reaping would take it."""

    root: ProcInfo
    members: tuple[ProcInfo, ...]  # root first, then every live descendant (parents before children)
    holders: tuple[int, ...]
    gpus: tuple[int, ...]
    gpu_memory: int | None
    reason: str
    reaper: int | None = None

    @property
    def pid(self) -> int:
        return self.root.pid

    def to_dict(self) -> dict:
        return {"root": _proc_dict(self.root), "members": [_proc_dict(m) for m in self.members],
                "holders": list(self.holders), "gpus": list(self.gpus), "gpu_memory": self.gpu_memory,
                "reason": self.reason, "reaper": self.reaper}


# ---- helpers ---------------------------------------------------------------------------------

def parse_signal(name: str | int) -> signal.Signals:
    """``TERM``, ``SIGTERM``, ``term`` or ``15`` -> signal.SIGTERM. Raises ValueError."""
    s = str(name).strip().upper()
    try:
        if s.isdigit():
            return signal.Signals(int(s))
        if not s.startswith("SIG"):
            s = "SIG" + s
        return signal.Signals[s]
    except (KeyError, ValueError):
        raise ValueError(f"unknown signal {name!r}: use a name such as TERM, KILL, INT, HUP or a number") from None


def same_start(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) < _START_EPS


def _proc_dict(p: ProcInfo | None) -> dict | None:
    if p is None:
        return None
    return {"pid": p.pid, "ppid": p.ppid, "start_time": p.start_time, "name": p.name,
            "cmdline": list(p.cmdline), "user": p.user, "uid": p.uid}


def _target(pid: int | None, info: ProcInfo | None, gpus: Iterable[int] = (),
            expected_start: float | None = None) -> dict:
    return {"pid": pid, "start_time": info.start_time if info else expected_start,
            "user": info.user if info else None, "uid": info.uid if info else None,
            "name": info.name if info else None, "cmdline": list(info.cmdline) if info else None,
            "gpus": sorted(set(gpus))}


def _err_text(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


class _Ctx:
    """Config and sampler for one action; opens (and later closes) a sampler when none was given."""

    def __init__(self, sampler, config: Config | None):
        self.error: ActionResult | None = None
        self.owned = False
        self.sampler = sampler
        self.sampler_error: str | None = None
        self.config = config or (getattr(sampler, "config", None) if sampler is not None else None)
        if self.config is None:
            self.config = load_config()  # may raise UsageError: caught by the callers
        if self.sampler is None:
            try:
                from gputop.snapshot import Sampler

                self.sampler = Sampler.open(config=self.config)
                self.owned = True
            except GputopError as e:
                self.sampler_error = str(e)
        self.platform = getattr(self.sampler, "platform", None) or (
            "windows" if sys.platform.startswith("win") else "posix")

    def sample(self):
        if self.sampler is None:
            return None
        return self.sampler.sample()

    def close(self):
        if self.owned and self.sampler is not None:
            self.sampler.close()

    def verdict(self, pid: int):
        cfg = self.config
        return classify(pid, ProcTable(), platform=self.platform, protect=compile_protect(cfg.protect),
                        nohup_protects=cfg.nohup_protects, max_chain=cfg.max_chain)


class _Serial:
    """Serialises sample() of a shared sampler between the threads of kill_many."""

    def __init__(self, sampler):
        self._s = sampler
        self._lock = threading.Lock()

    def sample(self):
        with self._lock:
            return self._s.sample()

    def close(self):
        pass

    def __getattr__(self, name):
        return getattr(self._s, name)


class _Handle:
    """A verified handle on one process: a pidfd on Linux, a psutil.Process elsewhere.

    Opened only after the identity check, and checked again after opening, so the handle refers to the
    process the caller saw and a later signal cannot reach a process that reused the PID.
    """

    def __init__(self, info: ProcInfo):
        self.info = info
        self.pid = info.pid
        self.fd: int | None = None
        self.proc = None
        if IS_LINUX and hasattr(os, "pidfd_open"):
            try:
                self.fd = os.pidfd_open(info.pid)  # ProcessLookupError if gone
            except ProcessLookupError:
                raise
            except OSError as e:
                if e.errno != errno.ENOSYS:  # a kernel before 5.3 has no pidfd: use psutil below
                    raise
        if self.fd is not None:
            now = read_proc(info.pid)
            if now is None or now.zombie or not same_start(now.start_time, info.start_time):
                os.close(self.fd)
                self.fd = None
                raise LookupError("identity changed")
        else:
            import psutil

            p = psutil.Process(info.pid)  # NoSuchProcess: the caller reports "not-found"
            if not same_start(round(p.create_time(), 2), info.start_time):
                raise LookupError("identity changed")
            self.proc = p

    def send(self, sig: int) -> bool:
        """Signal the process; False if it has already exited. PermissionError propagates."""
        if self.fd is not None:
            try:
                signal.pidfd_send_signal(self.fd, sig)
                return True
            except ProcessLookupError:
                return False
        import psutil

        try:
            if not self.proc.is_running():  # psutil compares the create time too
                return False
            self.proc.send_signal(sig)
            return True
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied as e:
            raise PermissionError(1, "Operation not permitted") from e

    def alive(self) -> bool:
        now = read_proc(self.pid)
        return now is not None and not now.zombie and same_start(now.start_time, self.info.start_time)

    def close(self):
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


def _wait_gone(handles: list[_Handle], timeout: float) -> list[_Handle]:
    """Wait up to ``timeout`` for the handles' processes to exit; return those still alive."""
    deadline = time.monotonic() + max(0.0, timeout)
    alive = [h for h in handles if h.alive()]
    while alive and time.monotonic() < deadline:
        time.sleep(_POLL)
        alive = [h for h in alive if h.alive()]
    return alive


def _memory_released(ctx: _Ctx, pids: set[int], wait: float = 2.0) -> bool | None:
    """Sample again until none of ``pids`` holds a GPU (the driver may take a moment)."""
    if ctx.sampler is None or not pids:
        return None
    deadline = time.monotonic() + wait
    while True:
        try:
            snap = ctx.sample()
        except Exception:
            return None
        if not any(snap.holder(p) is not None for p in pids):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _safety_refusal(info: ProcInfo, protected_pids: set[int]) -> tuple[str, str] | None:
    """(rule, message) if this process must never be signalled by gputop."""
    if info.pid == 1:
        return "pid1", "pid 1 (init) is never signalled"
    if info.kthread:
        return "kthread", f"pid {info.pid} ({info.name}) is a kernel thread; it cannot be killed from user space"
    if info.pid == os.getpid():
        return "self", f"pid {info.pid} is gputop itself"
    if info.pid in protected_pids:
        return "ancestor", (f"pid {info.pid} ({info.name}) is an ancestor of gputop (your shell or session); "
                            "gputop never signals its own ancestors")
    return None


def _other_user(m: ProcInfo, owner: ProcInfo) -> bool:
    """True if ``m`` belongs to a user other than ``owner``'s (unknown owners count as other)."""
    return m.uid is None or owner.uid is None or m.uid != owner.uid


def _log(record: dict, ctx_config: Config | None, details: dict) -> None:
    try:
        auditlog.append(record, config=ctx_config)
    except auditlog.AuditLogError as e:
        details["audit_error"] = str(e)


def _record(action: str, face: str, outcome: str, ok: bool, message: str, target: dict,
            signals: list[dict], reason: str | None, **extra) -> dict:
    now = time.time()
    rec = {"at": now, "time": auditlog.iso(now), "host": socket.gethostname(), "actor": auditlog.actor(),
           "face": face, "action": action, "target": target, "signals": signals, "outcome": outcome,
           "ok": ok, "message": message}
    if reason:
        rec["reason"] = reason
    rec.update(extra)
    return rec


def _sig_event(sig: int, pids: Iterable[int]) -> dict:
    now = time.time()
    return {"signal": signal.Signals(sig).name, "at": now, "time": auditlog.iso(now), "pids": list(pids)}


# ---- kill ------------------------------------------------------------------------------------

def kill_process(pid: int, *, expected_start: float | None, face: str, force: bool = False,
                 timeout: float = 5.0, signal_name: str = "TERM", dry_run: bool = False,
                 require_holder: bool = True, allow_protected: bool = False, sampler=None,
                 config: Config | None = None, reason: str | None = None) -> ActionResult:
    """Signal one process safely; wait up to ``timeout``; with ``force``, escalate to SIGKILL.

    ``expected_start`` is the start time the caller saw (a snapshot); None means "as it is now".
    """
    if face not in FACES:
        raise ValueError(f"face must be one of {FACES}, not {face!r}")
    details: dict = {}
    signals: list[dict] = []
    state: dict = {"info": None, "gpus": [], "cfg": config}

    def done(ok: bool, outcome: str, message: str, code: int, mem: bool | None = None) -> ActionResult:
        gpus = state["gpus"]
        target = _target(pid, state["info"], gpus, expected_start)
        rec = _record("kill", face, outcome, ok, message, target, signals, reason, dry_run=dry_run,
                      force=force, exit_code=code, memory_released=mem, details=dict(details))
        _log(rec, state["cfg"], details)
        return ActionResult("kill", ok, outcome, message, pid=pid, gpu=gpus[0] if len(gpus) == 1 else None,
                            exit_code=code, memory_released=mem, details=details)

    try:
        sig = parse_signal(signal_name)
    except ValueError as e:
        return done(False, "bad-request", str(e), EXIT_USAGE)
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return done(False, "not-found", f"pid {pid!r} is not a valid process id", EXIT_NOT_FOUND)
    try:
        ctx = _Ctx(sampler, config)
    except GputopError as e:
        return done(False, "failed", str(e), e.exit_code)
    state["cfg"] = ctx.config
    try:
        return _kill(ctx, pid, sig, expected_start, force, timeout, dry_run, require_holder,
                     allow_protected, details, signals, state, done)
    finally:
        ctx.close()


def _kill(ctx: _Ctx, pid: int, sig: signal.Signals, expected_start, force, timeout, dry_run,
          require_holder, allow_protected, details, signals, state, done) -> ActionResult:
    gpus = state["gpus"]
    info = read_proc(pid)
    state["info"] = info
    if info is None or info.zombie:
        return done(False, "not-found", f"no process {pid}: it has exited (check 'gputop status')",
                    EXIT_NOT_FOUND)
    if expected_start is not None and not same_start(info.start_time, expected_start):
        details["found_start_time"] = info.start_time
        return done(False, "identity-changed",
                    f"pid {pid} is now a different process (started {info.start_time:.2f}, expected "
                    f"{expected_start:.2f}): the one you saw has exited and the PID was reused; refresh and retry",
                    EXIT_REFUSED)
    refusal = _safety_refusal(info, self_and_ancestors())
    if refusal:
        details["rule"] = refusal[0]
        return done(False, "refused", refusal[1], EXIT_REFUSED)

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
        gpus.extend(holder.gpus)
        details["gpu_memory"] = holder.gpu_memory
    if require_holder and holder is None:
        details["rule"] = "not-holder"
        if snap is None:
            return done(False, "refused", f"cannot tell whether pid {pid} holds a GPU "
                        f"({ctx.sampler_error}); pass --any-process to kill it anyway", EXIT_UNAVAILABLE)
        return done(False, "refused", f"pid {pid} ({info.name}) holds no GPU; pass --any-process to kill "
                    "a process that is not a GPU holder", EXIT_REFUSED)

    verdict = ctx.verdict(pid)
    if holder is not None and (holder.proc is None or holder.verdict.kind == UNKNOWN):
        verdict = holder.verdict  # the GPU side cannot tie this PID to what we see here: unknown wins
    details["verdict"] = {"kind": verdict.kind, "reason": verdict.reason}
    if verdict.kind == UNKNOWN:
        details["rule"] = "unknown"
        return done(False, "refused", f"pid {pid} ({info.name}) has an unknown verdict ({verdict.reason}); "
                    "gputop never signals a process whose ancestry it cannot verify", EXIT_REFUSED)
    if verdict.kind == PROTECTED and not allow_protected:
        details["rule"] = "protected"
        return done(False, "refused", f"pid {pid} ({info.name}) is protected: {verdict.reason}; use "
                    "--allow-protected for an explicit manual kill", EXIT_REFUSED)

    if dry_run:
        return done(True, "dry-run", f"would send {sig.name} to pid {pid} ({info.name}, user {info.user})"
                    + (" and SIGKILL after the timeout" if force and sig != signal.SIGKILL else ""), EXIT_OK)

    try:
        handle = _Handle(info)
    except (ProcessLookupError, LookupError) as e:
        if isinstance(e, ProcessLookupError) or read_proc(pid) is None:
            return done(False, "not-found", f"pid {pid} exited before it could be signalled", EXIT_NOT_FOUND)
        return done(False, "identity-changed", f"pid {pid} changed identity while being checked; refresh and "
                    "retry", EXIT_REFUSED)
    except Exception as e:  # psutil.NoSuchProcess and friends on other platforms
        return done(False, "not-found", f"pid {pid} cannot be opened: {_err_text(e)}", EXIT_NOT_FOUND)
    try:
        try:
            signals.append(_sig_event(sig, [pid]))
            sent = handle.send(sig)
        except PermissionError:
            signals.pop()
            return done(False, "permission-denied",
                        f"no permission to signal pid {pid} (user {info.user}); run as that user or as root",
                        EXIT_PERMISSION)
        if not sent:
            signals.pop()
            return done(False, "not-found", f"pid {pid} exited before it could be signalled", EXIT_NOT_FOUND)
        if sig.name in _NON_LETHAL:
            return done(True, "signalled", f"sent {sig.name} to pid {pid} ({info.name})", EXIT_OK)
        now = read_proc(pid)
        if sig != signal.SIGKILL and now is not None and now.state in ("T", "t"):
            # A stopped process keeps the signal pending until it runs again; let it run to handle it.
            signals.append(_sig_event(signal.SIGCONT, [pid]))
            handle.send(signal.SIGCONT)
        alive = _wait_gone([handle], timeout)
        outcome = "killed" if sig == signal.SIGKILL else "terminated"
        if alive and force and sig != signal.SIGKILL:
            signals.append(_sig_event(signal.SIGKILL, [pid]))
            handle.send(signal.SIGKILL)
            alive = _wait_gone([handle], max(timeout, 5.0))
            outcome = "killed"
        if alive:
            if force or sig == signal.SIGKILL:
                now = read_proc(pid)
                msg = (f"pid {pid} ({info.name}) is still alive after SIGKILL (state {now.state if now else '?'}; "
                       "a process in uninterruptible I/O dies when the I/O ends)")
            else:
                msg = (f"pid {pid} ({info.name}) is still alive {timeout:g}s after {sig.name}; "
                       "use --force to send SIGKILL")
            return done(False, "still-alive", msg, EXIT_FAILURE)
    except BaseException as e:
        # Interrupted (Ctrl-C, a bug) after a signal may have gone out: record it before it propagates.
        details["error"] = f"{type(e).__name__}: {e}"
        done(False, "interrupted", f"the kill of pid {pid} ({info.name}) was interrupted ({type(e).__name__}) "
             "after the signals listed; check 'gputop status'", EXIT_FAILURE)
        raise
    finally:
        handle.close()
    mem = _memory_released(ctx, {pid}) if gpus else None
    what = {"terminated": f"pid {pid} ({info.name}) exited after {sig.name}",
            "killed": f"pid {pid} ({info.name}) killed with SIGKILL"}[outcome]
    if mem is True:
        what += "; its GPU memory was released"
    elif mem is False:
        what += "; the GPU still lists it (the driver has not released its memory yet)"
    return done(True, outcome, what, EXIT_OK, mem)


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
            from gputop.snapshot import Sampler

            owned = sampler = Sampler.open(config=cfg)
        except GputopError:
            sampler = None  # each kill_process reports the problem itself
    shared = _Serial(sampler) if sampler is not None else None
    try:
        with ThreadPoolExecutor(max_workers=min(32, len(targets))) as ex:
            futs = [ex.submit(kill_process, pid, expected_start=start, sampler=shared, **kw)
                    for pid, start in targets]
            return [f.result() for f in futs]
    finally:
        if owned is not None:
            owned.close()


# ---- reap ------------------------------------------------------------------------------------

def orphan_trees(snapshot, table: ProcTable | None = None) -> list[OrphanTree]:
    """Every orphan root of ``snapshot`` with its live tree (re-read now)."""
    table = table or ProcTable()
    out = []
    for r in snapshot.roots:
        cur = table.get(r.pid)
        if cur is None or cur.zombie or not same_start(cur.start_time, r.proc.start_time):
            continue
        members = (cur,) + tuple(table.descendants(r.pid))
        out.append(OrphanTree(cur, members, tuple(r.holders), tuple(r.gpus), r.gpu_memory, r.reason,
                              r.reaper))
    return out


def _scan_tree(roots: dict[int, float]) -> dict[int, ProcInfo]:
    """Every live process under (and including) the ``{pid: start_time}`` roots, from one fresh table.

    A root whose PID now belongs to another process (it exited and the PID was reused) is skipped with
    everything under it: walking the new process's children would put strangers into the tree.
    """
    table = ProcTable()
    table.scan_all()
    out: dict[int, ProcInfo] = {}
    for pid, start in roots.items():
        info = table.get(pid)
        if info is None or info.zombie or not same_start(info.start_time, start):
            continue
        out.setdefault(pid, info)
        for d in table.descendants(pid):
            out.setdefault(d.pid, d)
    return out


def reap_tree(root_pid: int, *, expected_start: float | None, face: str, grace: float | None = None,
              dry_run: bool = False, sampler=None, config: Config | None = None,
              reason: str | None = None) -> ActionResult:
    """Remove the whole orphan tree under ``root_pid``: SIGSTOP all, SIGTERM, SIGCONT, SIGKILL after ``grace``.

    Acts only if the tree is still an orphan now, and none of its holders is protected or unknown.
    """
    if face not in FACES:
        raise ValueError(f"face must be one of {FACES}, not {face!r}")
    details: dict = {}
    signals: list[dict] = []
    state: dict = {"info": None, "gpus": [], "cfg": config}

    def done(ok, outcome, message, code, mem=None):
        info = state["info"]
        target = _target(root_pid, info, state["gpus"], expected_start)
        rec = _record("reap", face, outcome, ok, message, target, signals, reason, dry_run=dry_run,
                      grace=grace, exit_code=code, memory_released=mem, details=dict(details))
        _log(rec, state["cfg"], details)
        return ActionResult("reap", ok, outcome, message, pid=root_pid,
                            gpu=state["gpus"][0] if len(state["gpus"]) == 1 else None, exit_code=code,
                            memory_released=mem, details=details)

    try:
        ctx = _Ctx(sampler, config)
    except GputopError as e:
        return done(False, "failed", str(e), e.exit_code)
    state["cfg"] = ctx.config
    if grace is None:  # every face gets the configured default (kill_timeout), not a constant of its own
        grace = ctx.config.kill_timeout
    try:
        return _reap(ctx, root_pid, expected_start, grace, dry_run, details, signals, state, done)
    finally:
        ctx.close()


def _reap(ctx: _Ctx, root_pid, expected_start, grace, dry_run, details, signals, state, done) -> ActionResult:
    info = read_proc(root_pid)
    state["info"] = info
    if info is None or info.zombie:
        return done(False, "not-found", f"no process {root_pid}: the tree's root has exited (check "
                    "'gputop reap')", EXIT_NOT_FOUND)
    if expected_start is not None and not same_start(info.start_time, expected_start):
        details["found_start_time"] = info.start_time
        return done(False, "identity-changed", f"pid {root_pid} is now a different process (the PID was "
                    "reused); run 'gputop reap' again", EXIT_REFUSED)
    ancestors = self_and_ancestors()
    refusal = _safety_refusal(info, ancestors)
    if refusal:
        details["rule"] = refusal[0]
        return done(False, "refused", refusal[1], EXIT_REFUSED)
    if ctx.sampler is None:
        details["rule"] = "no-sampler"
        return done(False, "refused", f"cannot verify that pid {root_pid} is an orphan root "
                    f"({ctx.sampler_error})", EXIT_UNAVAILABLE)

    # Verify again, now: a fresh sample with fresh verdicts, and the tree as it is now.
    snap = ctx.sample()
    root = next((r for r in snap.roots if r.pid == root_pid), None)
    members = _scan_tree({root_pid: info.start_time})
    if root_pid not in members:
        now = read_proc(root_pid)
        if now is None or now.zombie:
            return done(False, "not-found", f"pid {root_pid} exited while the tree was being checked; "
                        "nothing was signalled", EXIT_NOT_FOUND)
        details["found_start_time"] = now.start_time
        return done(False, "identity-changed", f"pid {root_pid} is now a different process (the PID was "
                    "reused while the tree was being checked); nothing was signalled; run 'gputop reap' "
                    "again", EXIT_REFUSED)
    member_set = set(members)
    tree_holders = [h for h in snap.holders if h.pid in member_set]
    state["gpus"] = sorted({g for h in tree_holders for g in h.gpus})
    bad = [h for h in tree_holders if h.verdict.kind in (PROTECTED, UNKNOWN)]
    if bad:
        h = bad[0]
        details["rule"] = h.verdict.kind
        return done(False, "refused", f"the tree under pid {root_pid} has a {h.verdict.kind} holder, pid {h.pid}: "
                    f"{h.verdict.reason}; gputop never reaps protected or unknown trees", EXIT_REFUSED)
    if root is None or not same_start(root.proc.start_time, info.start_time):
        details["rule"] = "not-orphan"
        why = "; ".join(f"pid {h.pid}: {h.verdict.kind} ({h.verdict.reason})" for h in tree_holders[:3])
        return done(False, "refused", f"pid {root_pid} ({info.name}) is not the root of an orphan tree that "
                    f"holds a GPU{': ' + why if why else ''}; see 'gputop reap'", EXIT_REFUSED)
    protect = compile_protect(ctx.config.protect)
    for m in members.values():
        rule = _safety_refusal(m, ancestors)
        if rule:
            details["rule"] = rule[0]
            return done(False, "refused", f"tree member {rule[1]}; not reaping this tree", EXIT_REFUSED)
        why = protect_reason(m, protect, ctx.config.nohup_protects)
        if why:
            details["rule"] = "protected"
            return done(False, "refused", f"tree member {why}; gputop never reaps protected trees",
                        EXIT_REFUSED)
        if _other_user(m, info):
            # A reap takes a whole tree as one unit; another user's process (sudo, setpriv, a setuid
            # helper) in it was not what was confirmed or selected. Root could otherwise kill it.
            details["rule"] = "other-user"
            return done(False, "refused", f"tree member pid {m.pid} ({m.name}) belongs to user {m.user}, not to "
                        f"{info.user} who owns the root; gputop reaps a tree only when one user owns all of it "
                        "(kill its processes one by one with 'gputop kill --pid')", EXIT_REFUSED)
    details["members"] = [_proc_dict(m) for m in members.values()]
    details["holders"] = list(root.holders)
    details["gpu_memory"] = root.gpu_memory
    details["orphan_reason"] = root.reason
    if dry_run:
        return done(True, "dry-run", f"would reap the tree of pid {root_pid} ({info.name}): "
                    f"{len(members)} process(es), holders {list(root.holders)}", EXIT_OK)

    handles: dict[int, _Handle] = {}
    gone: set[int] = set()
    skipped: list[int] = []
    denied: list[int] = []

    def adopt(found: dict[int, ProcInfo], sigs: list[int]) -> list[int]:
        """Open handles for members not seen yet, and send them ``sigs`` at once; return their pids."""
        new = []
        for pid, m in found.items():
            if pid in handles or pid in gone:
                continue
            if _safety_refusal(m, ancestors):
                continue  # never: checked above for the initial tree; a new child can't be init or ours
            if _other_user(m, info) or protect_reason(m, protect, ctx.config.nohup_protects):
                # Started during the reap, under a member: it was not verified, so it is left alone.
                if pid not in skipped:
                    skipped.append(pid)
                    details.setdefault("skipped_new_members", []).append(_proc_dict(m))
                continue
            try:
                handles[pid] = _Handle(m)
            except Exception:
                gone.add(pid)
                continue
            new.append(pid)
            for s in sigs:
                _send(pid, s)
        return new

    def _send(pid: int, s: int) -> None:
        try:
            if not handles[pid].send(s):
                gone.add(pid)
        except PermissionError:
            if pid not in denied:
                denied.append(pid)

    def send_all(s: int, pids: list[int]) -> None:
        if not pids:
            return
        signals.append(_sig_event(s, pids))
        for pid in pids:
            _send(pid, s)

    def tracked_alive() -> list[int]:
        return [p for p, h in handles.items() if p not in gone and h.alive()]

    def tracked_roots() -> dict[int, float]:
        """The live tracked processes with their identities, for _scan_tree."""
        return {p: handles[p].info.start_time for p in tracked_alive()}

    def wait_stopped(pids: list[int], timeout: float = 2.0) -> None:
        """SIGSTOP is asynchronous: wait until each process is really stopped (or gone)."""
        deadline = time.monotonic() + timeout
        left = list(pids)
        while left and time.monotonic() < deadline:
            nxt = []
            for pid in left:
                now = read_proc(pid)
                if now is None or now.zombie or now.state in ("T", "t") or not handles[pid].alive():
                    continue
                nxt.append(pid)
            left = nxt
            if left:
                time.sleep(0.005)

    def freeze(first: list[int]) -> None:
        """Stop ``first``, then repeatedly stop every new descendant of any tracked process, until a scan
        taken while everything is stopped finds nothing new: a stopped process cannot fork, so nothing
        can appear after that."""
        send_all(signal.SIGSTOP, first)
        wait_stopped(first)
        for _ in range(50):
            new = adopt(_scan_tree(tracked_roots()), [signal.SIGSTOP])
            if not new:
                return
            signals.append(_sig_event(signal.SIGSTOP, new))
            wait_stopped(new)

    try:
        # 1. Freeze the whole tree, so that nothing in it can start a new worker.
        freeze(adopt(members, []))
        if denied:
            # Nothing was killed yet: let the tree run again and say why.
            send_all(signal.SIGCONT, [p for p in handles if p not in denied])
            return done(False, "permission-denied", f"no permission to signal pid(s) {denied} in the tree of "
                        f"pid {root_pid} (user {info.user}); run as that user or as root", EXIT_PERMISSION)
        # 2. Ask everything to terminate, then let it run to handle SIGTERM.
        frozen = tracked_alive()
        send_all(signal.SIGTERM, frozen)
        send_all(signal.SIGCONT, frozen)
        # 3. Wait up to the grace. Anything that appears now was started by a member that survived SIGTERM
        #    (a retry loop, a supervisor): it is stopped at once and killed with the rest, so no new worker
        #    ever runs, and its parent, waiting for it, starts no other. (No SIGTERM for it: a pending
        #    SIGTERM is delivered before a pending SIGSTOP, and its death would let the loop go round.)
        held: set[int] = set()
        deadline = time.monotonic() + max(0.0, grace)
        while True:
            alive = tracked_alive()
            new = adopt(_scan_tree({p: handles[p].info.start_time for p in alive}), [signal.SIGSTOP])
            if new:
                held.update(new)
                signals.append({**_sig_event(signal.SIGSTOP, new), "note": "started after SIGTERM: kept stopped"})
            running = [p for p in alive if p not in held]
            if not running and not new:
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        details["started_during_reap"] = sorted(held)
        # 4. Freeze what is left (and anything it started meanwhile), then kill it all.
        killed_any = False
        for _ in range(20):
            alive = tracked_alive()
            if not alive:
                break
            freeze(alive)
            alive = tracked_alive()
            send_all(signal.SIGKILL, alive)
            killed_any = True
            left = _wait_gone([handles[p] for p in alive], 5.0)
            if left:
                break  # ignores SIGKILL for now (uninterruptible I/O); reported below
        survivors = tracked_alive()
    except BaseException as e:
        # Interrupted (Ctrl-C, a bug): never leave a tree stopped. Whatever has SIGTERM pending acts on it.
        cont = [p for p in handles if p not in gone]
        if cont:
            signals.append(_sig_event(signal.SIGCONT, cont))
        for pid in cont:
            try:
                handles[pid].send(signal.SIGCONT)
            except OSError:
                pass
        # Signals were sent: the audit log must say so, and how it ended, before the exception goes on.
        details["members"] = [_proc_dict(h.info) for h in handles.values()]
        details["error"] = f"{type(e).__name__}: {e}"
        done(False, "interrupted", f"the reap of the tree of pid {root_pid} was interrupted "
             f"({type(e).__name__}); the tree was continued (SIGCONT), not left stopped; check 'gputop reap'",
             EXIT_FAILURE)
        raise
    finally:
        for h in handles.values():
            h.close()
    details["members"] = [_proc_dict(h.info) for h in handles.values()]
    details["survivors"] = survivors
    details["sigkill"] = killed_any
    if survivors:
        return done(False, "still-alive", f"pid(s) {survivors} of the tree of pid {root_pid} are still alive "
                    "after SIGKILL (uninterruptible I/O?); check 'gputop reap' again", EXIT_FAILURE)
    mem = _memory_released(ctx, set(root.holders))
    late = len(details.get("started_during_reap") or ())
    msg = (f"reaped the tree of pid {root_pid} ({info.name}): {len(handles)} process(es)"
           + (f" ({late} started during the reap, stopped at once)" if late else "")
           + (", SIGKILL needed" if killed_any else ", all exited after SIGTERM"))
    if mem is True:
        msg += "; GPU memory released"
    elif mem is False:
        msg += "; the GPU still lists a holder (the driver has not released its memory yet)"
    return done(True, "reaped", msg, EXIT_OK, mem)


# ---- watchdog --------------------------------------------------------------------------------

class Watchdog:
    """Reaps (or only logs) orphan trees that stay orphaned, with the same root identity, past ``grace``.

    ``scan(now)`` is one pass; ``run_watch`` loops it. A tree that is an orphan only briefly (a command
    that was finishing) is forgotten as soon as it is no longer seen, and never touched.
    """

    def __init__(self, sampler, *, apply: bool, grace: float, face: str = "cli", kill_grace: float = 5.0,
                 config: Config | None = None, reason: str = "watchdog"):
        self.sampler = sampler
        self.apply = apply
        self.grace = grace
        self.face = face
        self.kill_grace = kill_grace
        self.config = config or getattr(sampler, "config", None)
        self.reason = reason
        self.first_seen: dict[tuple[int, float], float] = {}
        self.reported: set[tuple[int, float]] = set()

    def scan(self, now: float) -> list[dict]:
        events: list[dict] = []
        snap = self.sampler.sample()
        trees = orphan_trees(snap)
        seen = {t.root.identity: t for t in trees}
        for key in list(self.first_seen):
            if key not in seen:
                del self.first_seen[key]
                self.reported.discard(key)
        for key, tree in seen.items():
            first = self.first_seen.setdefault(key, now)
            age = now - first
            if age <= self.grace:
                events.append({"event": "pending", "root": tree.pid, "age": age, "tree": tree})
                continue
            why = f"{self.reason}: orphaned for {age:.0f}s (grace {self.grace:g}s)"
            if not self.apply:
                if key in self.reported:
                    continue
                self.reported.add(key)
                res = reap_tree(tree.pid, expected_start=tree.root.start_time, face=self.face,
                                grace=self.kill_grace, dry_run=True, sampler=self.sampler,
                                config=self.config, reason=why)
                events.append({"event": "would-reap", "root": tree.pid, "age": age, "tree": tree,
                               "result": res})
                continue
            res = reap_tree(tree.pid, expected_start=tree.root.start_time, face=self.face,
                            grace=self.kill_grace, sampler=self.sampler, config=self.config, reason=why)
            if res.ok:
                del self.first_seen[key]
            events.append({"event": "reaped" if res.ok else "reap-failed", "root": tree.pid, "age": age,
                           "tree": tree, "result": res})
        return events


def run_watch(sampler, *, apply: bool, interval: float, grace: float, face: str = "cli",
              kill_grace: float = 5.0, config: Config | None = None,
              clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
              on_event: Callable[[dict], None] | None = None, iterations: int | None = None,
              stop: Callable[[], bool] | None = None) -> Watchdog:
    """The watchdog loop: scan, report events, sleep ``interval``; until ``stop()`` or ``iterations``."""
    dog = Watchdog(sampler, apply=apply, grace=grace, face=face, kill_grace=kill_grace, config=config)
    n = 0
    while True:
        for ev in dog.scan(clock()):
            if on_event:
                on_event(ev)
        n += 1
        if (iterations is not None and n >= iterations) or (stop is not None and stop()):
            return dog
        sleep(interval)


# ---- reset -----------------------------------------------------------------------------------

_RESET_CODES = {
    "permission": ("permission-denied", EXIT_PERMISSION, "run it as root (sudo gputop reset --gpu {i})"),
    "display": ("refused", EXIT_REFUSED, "this GPU drives a display; stop the display server on it first"),
    "unsupported": ("unsupported", EXIT_UNAVAILABLE, "this GPU or driver cannot be reset from user space"),
    "missing-tool": ("missing-tool", EXIT_UNAVAILABLE, "install the vendor tool (nvidia-smi / amdsmi) and retry"),
    "busy": ("busy", EXIT_REFUSED, "stop the processes using it (gputop reset --gpu {i} --force)"),
    "failed": ("failed", EXIT_FAILURE, "see the message; check 'gputop status'"),
}


def reset_gpu(index: int, *, face: str, force: bool = False, sampler=None,
              config: Config | None = None, reason: str | None = None,
              kill_timeout: float | None = None, dry_run: bool = False) -> ActionResult:
    """Reset GPU ``index``. Refuses while processes hold it; ``force`` first kills them (same kill path).

    ``dry_run``: make every check (holders, refusals) and say what would happen; signal and reset nothing.
    The backend's own checks (root, a display, the reset tool) run only in a real reset."""
    if face not in FACES:
        raise ValueError(f"face must be one of {FACES}, not {face!r}")
    details: dict = {}
    state = {"cfg": config}

    def done(ok, outcome, message, code):
        rec = _record("reset", face, outcome, ok, message, {"gpu": index}, [], reason, force=force,
                      exit_code=code, details=dict(details))
        _log(rec, state["cfg"], details)
        return ActionResult("reset", ok, outcome, message, gpu=index, exit_code=code, details=details)

    try:
        ctx = _Ctx(sampler, config)
    except GputopError as e:
        return done(False, "failed", str(e), e.exit_code)
    state["cfg"] = ctx.config
    try:
        if ctx.sampler is None:
            return done(False, "unavailable", f"no GPU backend: {ctx.sampler_error}", EXIT_UNAVAILABLE)
        try:
            ctx.sampler.locate(index)
        except GputopError as e:
            return done(False, "not-found", str(e), e.exit_code)
        snap = ctx.sample()
        holders = snap.holders_on(index)
        details["holders"] = [{"pid": h.pid, "start_time": h.start_time, "user": h.user, "name": h.name,
                               "cmd": h.cmd, "verdict": h.verdict.kind} for h in holders]
        if not holders and dry_run:
            return done(True, "dry-run", f"would reset GPU {index} (no process holds it)", EXIT_OK)
        if holders and not force:
            listing = ", ".join(f"{h.pid} ({h.name}, {h.user or '?'})" for h in holders)
            return done(False, "busy", f"GPU {index} is in use by {len(holders)} process(es): {listing}; "
                        f"stop them or use --force to kill them first", EXIT_REFUSED)
        if holders:
            invisible = [h.pid for h in holders if not h.visible]
            if invisible:
                return done(False, "refused", f"GPU {index} is held by pid(s) {invisible} that gputop cannot see "
                            "(another PID namespace); stop them there first", EXIT_REFUSED)
            # Refuse before killing anyone: a reset that one holder blocks must not cost the others their jobs.
            ancestors = self_and_ancestors()
            blocked = []
            for h in holders:
                rule = _safety_refusal(h.proc, ancestors) if h.proc is not None else None
                if rule is not None:
                    blocked.append(f"pid {h.pid} ({rule[1]})")
                elif h.verdict.kind in (PROTECTED, UNKNOWN):
                    blocked.append(f"pid {h.pid} ({h.name}) is {h.verdict.kind}: {h.verdict.reason}")
            if blocked:
                details["rule"] = "holder-refused"
                return done(False, "refused", f"GPU {index} not reset, and no holder was killed: "
                            + "; ".join(blocked) + "; gputop never kills these, stop them yourself first",
                            EXIT_REFUSED)
            if dry_run:
                return done(True, "dry-run", f"would kill {len(holders)} process(es) holding GPU {index} "
                            f"({', '.join(str(h.pid) for h in holders)}), then reset it", EXIT_OK)
            timeout = kill_timeout if kill_timeout is not None else ctx.config.kill_timeout
            results = kill_many([(h.pid, h.start_time) for h in holders], face=face, force=True,
                                timeout=timeout, sampler=ctx.sampler, config=ctx.config,
                                reason=f"reset of GPU {index}" + (f": {reason}" if reason else ""))
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
                return done(False, "busy", f"GPU {index} not reset: pid(s) {[h.pid for h in left]} still hold "
                            "it after the kill", EXIT_FAILURE)
        try:
            what = ctx.sampler.reset(index)
        except ResetError as e:
            outcome, code, hint = _RESET_CODES.get(e.kind, _RESET_CODES["failed"])
            details["kind"] = e.kind
            return done(False, outcome, f"GPU {index} not reset: {e}; {hint.format(i=index)}", code)
        except GputopError as e:
            return done(False, "failed", f"GPU {index} not reset: {e}", e.exit_code)
        except Exception as e:
            return done(False, "failed", f"GPU {index} not reset: {type(e).__name__}: {e}", EXIT_FAILURE)
        return done(True, "reset", what or f"GPU {index} reset", EXIT_OK)
    finally:
        ctx.close()
