"""What the service faces (HTTP API and MCP server) share: filters, payloads and the calls into actions.

No web or MCP imports here. Every write goes through gputop.actions (kill, reap, reset) or
gputop.guard.state (mode), which re-check identity and safety and write the audit log.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from gputop.core.config import Config
from gputop.util.errors import (
    EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_OK, EXIT_PERMISSION, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE,
    GputopError, UsageError,
)
from gputop.core.model import Holder, Snapshot, select_holders
from gputop.core.sampler import LockedSampler, Sampler
from gputop.core.snapshot_json import holder_to_dict, standing_to_dict
from gputop.util.units import parse_memory

# ActionResult.exit_code -> HTTP status.
HTTP_STATUS = {EXIT_OK: 200, EXIT_FAILURE: 500, EXIT_USAGE: 400, EXIT_NOT_FOUND: 404, EXIT_PERMISSION: 403,
               EXIT_REFUSED: 409, EXIT_UNAVAILABLE: 503}


# ---- the shared sampler ----------------------------------------------------------------------

class LiveSnapshot:
    """One sampler, one background thread refreshing the latest snapshot; actions share the sampler.

    ``sampler`` is the shared sampler (core.sampler.LockedSampler): every call takes its lock, and a face
    holds ``lock`` (the same, reentrant) while an action runs (actions re-sample through it), so the
    sampler is never used by two threads at once. Readers never wait for it: they take ``latest``.
    """

    def __init__(self, sampler: Sampler | LockedSampler, config: Config, interval: float = 1.0):
        self.sampler = LockedSampler.around(sampler)
        self.config = config
        self.interval = interval
        self.lock = self.sampler.lock
        self._latest: Snapshot | None = None
        self._findings: list = []
        self._findings_error: str | None = None
        self._history = None  # rogue.History: "since when" for rules that need repeated samples
        self._listeners: list = []
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def error(self) -> str | None:
        """Why the latest snapshot is old: the last sampling error, or a sampler thread that died."""
        t = self._thread
        if t is not None and not t.is_alive() and not self._stop.is_set():
            return "the sampler thread stopped: the snapshot is no longer refreshed"
        return self._error

    @error.setter
    def error(self, value: str | None) -> None:
        self._error = value

    def add_listener(self, fn) -> None:
        """``fn(snapshot, findings)`` after every sample (called on the sampling thread)."""
        self._listeners.append(fn)

    def refresh(self) -> Snapshot:
        snap = self.sampler.sample()
        if self._history is None:
            try:
                from gputop.core.rogue import History

                self._history = History()
            except ImportError:
                pass
        findings, ferr = audit_findings(snap, self.config, self._history)
        self._latest, self._findings, self._findings_error = snap, findings, ferr
        self.error = None
        for fn in self._listeners:
            try:
                fn(snap, findings)
            except Exception:  # a metrics bug must not stop sampling
                pass
        return snap

    def latest(self) -> Snapshot:
        snap = self._latest
        return snap if snap is not None else self.refresh()

    def findings(self) -> tuple[list, str | None]:
        self.latest()
        return self._findings, self._findings_error

    def start(self) -> "LiveSnapshot":
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="gputop-sampler", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception as e:  # keep serving the last good snapshot, and say why it is old
                self.error = f"sampling failed: {e}"

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sampler.close()


# ---- reading ---------------------------------------------------------------------------------

def audit_findings(snap: Snapshot, config: Config, history=None) -> tuple[list, str | None]:
    try:
        from gputop.core.rogue import audit
    except ImportError:
        return [], "the rogue audit is not available in this build"
    try:
        return list(audit(snap, config, history=history)), None
    except Exception as e:
        return [], f"the rogue audit failed: {e}"


def finding_to_dict(f) -> dict:
    if hasattr(f, "to_dict"):
        return f.to_dict()
    if dataclasses.is_dataclass(f):
        return dataclasses.asdict(f)
    return dict(f)


def rogue_payload(live: LiveSnapshot) -> dict:
    snap = live.latest()
    findings, err = live.findings()
    return {"at": snap.at, "host": snap.host, "findings": [finding_to_dict(f) for f in findings],
            "error": err}


def guard_status() -> dict:
    from gputop.guard import state

    st = state.status()
    st["recent_hits"] = state.recent_hits(20)
    return st


def _opt_int(name: str, value) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise UsageError(f"{name} must be an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be an integer, got {value!r}") from None


def filter_holders(snap: Snapshot, *, name: str | None = None, user: str | None = None, gpu=None,
                   memory_gt=None) -> list[Holder]:
    """name: case-insensitive regex (a plain word is a substring) over the process name or command line;
    user: exact; gpu: index;
    memory_gt: bytes or a size such as 4GiB (holders whose GPU memory is unknown never match)."""
    gpu_i = _opt_int("gpu", gpu)
    mem = None
    if memory_gt not in (None, ""):
        try:
            mem = parse_memory(int(memory_gt) if isinstance(memory_gt, str) and memory_gt.isdigit() else memory_gt)
        except ValueError as e:
            raise UsageError(f"memory_gt: {e}") from None
    return select_holders(snap, gpu=gpu_i, user=user or None, name=name or None, memory_gt=mem)


def processes_payload(snap: Snapshot, **filters) -> dict:
    hs = filter_holders(snap, **filters)
    return {"at": snap.at, "host": snap.host, "count": len(hs),
            "processes": [holder_to_dict(h, standing=standing_to_dict(snap, h.pid)) for h in hs]}


def ledger_payload(snap: Snapshot) -> dict:
    """The memory ledger (gputop.core.ledger): each GPU's split of its used memory, the lines 'gputop status'
    prints, and the holders it rests on that the driver's list does not (device-file holders, zombies)."""
    from gputop.core.ledger import gpu_ledgers, ledger_lines

    extra = [h for h in snap.holders if h.source == "device file" or h.zombie]
    return {"at": snap.at, "host": snap.host, "ledger": [{"gpu": lg.gpu, **lg.to_dict()} for lg in gpu_ledgers(snap)],
            "lines": ledger_lines(snap), "holders": [holder_to_dict(h) for h in extra]}


# ---- writing ---------------------------------------------------------------------------------

def _start_for(snap: Snapshot, pid: int, given) -> float | None:
    """The identity to check: the start time the client gave, else the one in the snapshot it saw."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, (int, float)):
            raise UsageError(f"start_time must be a number (the 'start_time' of /v1/processes), got {given!r}")
        return float(given)
    h = snap.holder(pid)
    return h.start_time if h is not None else None


def do_kill(live: LiveSnapshot, face: str, *, pid, start_time=None, force: bool = False,
            signal_name: str = "TERM", dry_run: bool = False, reason: str | None = None):
    from gputop import actions

    pid_i = _opt_int("pid", pid)
    if pid_i is None:
        raise UsageError("pid is required")
    expected = _start_for(live.latest(), pid_i, start_time)
    with live.lock:
        res = actions.kill_process(pid_i, expected_start=expected, face=face, force=bool(force),
                                   timeout=live.config.kill_timeout, signal_name=str(signal_name),
                                   dry_run=bool(dry_run), sampler=live.sampler, config=live.config,
                                   reason=reason)
    _refresh_after(live, dry_run)
    return res


def do_reap(live: LiveSnapshot, face: str, *, roots=None, dry_run: bool = False, grace: float | None = None,
            reason: str | None = None) -> list:
    """Reap the orphan trees of the current snapshot (all of them, or those whose root is in ``roots``)."""
    from gputop import actions

    wanted = None
    if roots is not None:
        if not isinstance(roots, (list, tuple)):
            roots = [roots]
        wanted = {_opt_int("roots", r) for r in roots}
    with live.lock:
        snap = live.sampler.sample()
        trees = actions.orphan_trees(snap, config=live.config, sampler=live.sampler)
    results = []
    known = {t.pid for t in trees}
    for missing in sorted((wanted or set()) - known):
        results.append({"action": "reap", "ok": False, "outcome": "not-found", "pid": missing,
                        "exit_code": EXIT_NOT_FOUND,
                        "message": f"pid {missing} is not the root of an orphan tree now; see /v1/status roots"})
    for t in trees:
        if wanted is not None and t.pid not in wanted:
            continue
        with live.lock:
            res = actions.reap_tree(t.pid, expected_start=t.root.start_time, face=face, grace=grace,
                                    dry_run=bool(dry_run), sampler=live.sampler, config=live.config,
                                    reason=reason)
        results.append(res.to_dict() | {"tree": t.to_dict()})
    _refresh_after(live, dry_run)
    return results


def do_reset(live: LiveSnapshot, face: str, *, index, force: bool = False, reason: str | None = None,
             dry_run: bool = False):
    from gputop import actions

    idx = _opt_int("index", index)
    if idx is None:
        raise UsageError("index (the GPU index) is required")
    with live.lock:
        res = actions.reset_gpu(idx, face=face, force=bool(force), sampler=live.sampler, config=live.config,
                                reason=reason, dry_run=dry_run)
    if not dry_run:
        _refresh_after(live, False)
    return res


def do_guard_mode(face: str, mode) -> dict:
    from gputop.guard import state

    if not isinstance(mode, str):
        raise UsageError(f"mode must be one of {', '.join(state.MODES)}")
    previous = state.set_mode(mode, face)
    return {"ok": True, "mode": mode, "previous": previous, "message": f"guard mode {previous} -> {mode}"}


def _refresh_after(live: LiveSnapshot, dry_run: bool) -> None:
    if dry_run:
        return
    try:
        live.refresh()
    except Exception:
        pass


class RefusalLimiter:
    """At most ``burst`` refusal records per (face, rule) in ``window`` seconds; the rest are counted and
    one summary line says how many were coalesced, so a flood of bad requests cannot flood the log."""

    def __init__(self, burst: int = 5, window: float = 10.0):
        self.burst, self.window = burst, window
        self.lock = threading.Lock()
        self.slots: dict[tuple, list] = {}  # key -> [window start, written, suppressed, last record]

    def admit(self, key: tuple, rec: dict) -> bool:
        now = time.monotonic()
        with self.lock:
            slot = self.slots.get(key)
            if slot is None or now - slot[0] >= self.window:
                slot = self.slots[key] = [now, 0, 0, None]
            if slot[1] < self.burst:
                slot[1] += 1
                return True
            slot[2] += 1
            slot[3] = rec
            if slot[2] == 1:  # the first one held back: say how many when the window ends
                t = threading.Timer(max(0.0, self.window - (now - slot[0])), self._flush, (key, slot))
                t.daemon = True
                t.start()
            return False

    def _flush(self, key: tuple, slot: list) -> None:
        with self.lock:
            n, last = slot[2], slot[3]
            slot[2] = 0
        if n and last is not None:
            rec = dict(last, coalesced=n, at=time.time(),
                       message=f"{n} more refusal(s) like this in {self.window:g} s, coalesced: {last['message']}")
            _append_refusal(rec)

    def flush_all(self) -> None:
        for key, slot in list(self.slots.items()):
            self._flush(key, slot)


REFUSALS = RefusalLimiter()


def _append_refusal(rec: dict) -> None:
    from gputop.core import auditlog

    try:
        auditlog.append(rec)
    except GputopError:
        pass


def refusal_record(action: str, face: str, message: str, **extra) -> None:
    """Log a request refused before it reached the actions module (no token, bad token, bad input).
    Rate-limited per face and rule (RefusalLimiter): a burst gives a bounded number of lines."""
    from gputop.core import auditlog

    now = time.time()
    rec = {"at": now, "face": face, "action": action, "outcome": "refused", "ok": False, "message": message}
    rec.update(extra)
    rec.setdefault("actor", auditlog.actor())  # the requester, even when the line is written later
    if REFUSALS.admit((face, extra.get("rule")), rec):
        _append_refusal(rec)
