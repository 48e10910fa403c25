"""What every action shares: results, the per-action context, safety rules and audit records."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Iterable

from gputop.actions import interrupt
from gputop.core import auditlog
from gputop.core.config import Config, load_config
from gputop.util.errors import EXIT_OK, GputopError
from gputop.core.orphans import classify, compile_protect
from gputop.core.procs import ProcInfo, ProcTable
from gputop.util.textsafe import visible

FACES = ("cli", "tui", "guard", "mcp", "api")

# Start times are rounded to 0.01 s; two readings of one process are equal, allow for float noise.
_START_EPS = 0.006
# Signals that are not meant to end the process: report "signalled" instead of waiting for an exit.
NON_LETHAL = {"SIGSTOP", "SIGCONT", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGUSR1", "SIGUSR2", "SIGWINCH",
              "SIGCHLD", "SIGURG"}


@dataclass(frozen=True)
class ActionResult:
    action: str  # "kill" | "reap" | "reset"
    ok: bool
    outcome: str  # short token: terminated, killed, reaped, reset, signalled, still-alive, refused, ...
    message: str  # one line for humans; on failure it says what to do
    pid: int | None = None
    gpu: int | None = None
    exit_code: int = EXIT_OK  # gputop.util.errors EXIT_* code
    memory_released: bool | None = None
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"action": self.action, "ok": self.ok, "outcome": self.outcome, "message": self.message,
                "pid": self.pid, "gpu": self.gpu, "exit_code": self.exit_code,
                "memory_released": self.memory_released, "details": self.details}


@dataclass(frozen=True)
class OrphanTree:
    """An orphan root and what a reap of it does: ``members`` are signalled, ``plan.left_alone`` are not."""

    root: ProcInfo
    members: tuple[ProcInfo, ...]  # the plan's members: root first, parents before children
    holders: tuple[int, ...]
    gpus: tuple[int, ...]
    gpu_memory: int | None
    reason: str
    reaper: int | None = None
    plan: object = None  # gputop.actions.plan.ReapPlan

    @property
    def left_alone(self) -> tuple:
        return tuple(getattr(self.plan, "left_alone", ()) or ())

    @property
    def refusal(self) -> tuple[str, str] | None:
        return getattr(self.plan, "refusal", None)

    @property
    def pid(self) -> int:
        return self.root.pid

    def to_dict(self) -> dict:
        return {"root": proc_dict(self.root), "members": [proc_dict(m) for m in self.members],
                "holders": list(self.holders), "gpus": list(self.gpus), "gpu_memory": self.gpu_memory,
                "reason": self.reason, "reaper": self.reaper,
                "left_alone": [e.to_dict() for e in self.left_alone],
                "refusal": {"rule": self.refusal[0], "message": self.refusal[1]} if self.refusal else None}


def name(p: ProcInfo | None) -> str:
    """A process's name for a message: messages reach terminals, so control characters are made visible."""
    return visible(p.name) if p is not None else "?"


def user(p: ProcInfo | None) -> str:
    return visible(p.user) if p is not None and p.user is not None else "?"


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


def proc_dict(p: ProcInfo | None) -> dict | None:
    if p is None:
        return None
    return {"pid": p.pid, "ppid": p.ppid, "start_time": p.start_time, "name": p.name,
            "cmdline": list(p.cmdline), "user": p.user, "uid": p.uid}


def target_dict(pid: int | None, info: ProcInfo | None, gpus: Iterable[int] = (),
            expected_start: float | None = None) -> dict:
    return {"pid": pid, "start_time": info.start_time if info else expected_start,
            "user": info.user if info else None, "uid": info.uid if info else None,
            "name": info.name if info else None, "cmdline": list(info.cmdline) if info else None,
            "gpus": sorted(set(gpus))}


def err_text(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


class Ctx:
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
                from gputop.core.sampler import Sampler

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

    def classifier(self, table):
        """``pid -> Verdict`` over ``table``, with this action's protect rules: the one rule every path uses."""
        cfg = self.config
        protect, cmdline = compile_protect(cfg.protect), compile_protect(cfg.protect_cmdline)

        def verdict(pid: int):
            return classify(pid, table, platform=self.platform, protect=protect, nohup_protects=cfg.nohup_protects,
                            max_chain=cfg.max_chain, protect_cmdline=cmdline)
        return verdict

    def verdict(self, pid: int):
        return self.classifier(ProcTable())(pid)


def memory_released(ctx: Ctx, pids: set[int], wait: float = 2.0) -> bool | None:
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


def safety_refusal(info: ProcInfo, protected_pids: set[int]) -> tuple[str, str] | None:
    """(rule, message) if this process must never be signalled by gputop."""
    if info.pid == 1:
        return "pid1", "pid 1 (init) is never signalled"
    if info.kthread:
        return "kthread", f"pid {info.pid} ({name(info)}) is a kernel thread; it cannot be killed from user space"
    if info.pid == os.getpid():
        return "self", f"pid {info.pid} is gputop itself"
    if info.pid in protected_pids:
        return "ancestor", (f"pid {info.pid} ({name(info)}) is an ancestor of gputop (your shell or session); "
                            "gputop never signals its own ancestors")
    return None


def other_user(m: ProcInfo, owner: ProcInfo) -> bool:
    """True if ``m`` belongs to a user other than ``owner``'s (unknown owners count as other)."""
    return m.uid is None or owner.uid is None or m.uid != owner.uid


def log_record(record: dict, ctx_config: Config | None, details: dict) -> None:
    try:
        auditlog.append(record, config=ctx_config)
    except auditlog.AuditLogError as e:
        details["audit_error"] = str(e)


def record(action: str, face: str, outcome: str, ok: bool, message: str, target: dict,
            signals: list[dict], reason: str | None, **extra) -> dict:
    now = time.time()
    rec = {"at": now, "time": auditlog.iso(now), "host": socket.gethostname(), "actor": auditlog.actor(),
           "face": face, "action": action, "target": target, "signals": signals, "outcome": outcome,
           "ok": ok, "message": message}
    if reason:
        rec["reason"] = reason
    rec.update(extra)
    intr = interrupt.note(outcome)  # a SIGHUP/SIGTERM came while the action ran: say so, and what was done then
    if intr is not None:
        rec["interrupted"] = intr
    return rec


def sig_event(sig: int, pids: Iterable[int]) -> dict:
    now = time.time()
    return {"signal": signal.Signals(sig).name, "at": now, "time": auditlog.iso(now), "pids": list(pids)}

