"""The TUI's sampling: one long-lived thread samples, works out the side panel's data, and posts the result
to the app as a message (SnapshotReady, replacing any older one still queued); the app only draws it.

The thread shares one sampler with the action workers through LockedSampler (one call at a time).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from textual.message import Message

from gputop.core.config import Config
from gputop.core.model import Snapshot
from gputop.core.sampler import LockedSampler  # noqa: F401 - the one shared wrapper (the app uses it)
from gputop.tui.side_panel import PanelData


class SnapshotReady(Message):
    """A new snapshot (plus side-panel data); replaces any older one still queued."""

    def __init__(self, snapshot: Snapshot, panel: PanelData):
        super().__init__()
        self.snapshot = snapshot
        self.panel = panel

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotReady)


class DevicesReady(Message):
    """The devices alone, read before the first full sample (see SamplingLoop._sample_devices_first)."""

    def __init__(self, devices: tuple):
        super().__init__()
        self.devices = devices


class SampleFailed(Message):
    def __init__(self, error: str):
        super().__init__()
        self.error = error

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SampleFailed)


class PanelSource:
    """Guard state and audit findings for the side panel, read in the sampling thread (never the UI
    thread). An engine that is not installed is reported as such; the audit keeps its history between
    samples, so that its sustained rules (e.g. a hashing profile held for a minute) can fire."""

    # The audit reads every holder's executable, fds and the TCP table: run it when the set of holders
    # changes, and otherwise at most this often (findings are about processes, not about one second).
    AUDIT_EVERY = 5.0

    GUARD_EVERY = 10.0  # the guard files are read again at least this often, changed or not

    def __init__(self):
        self._guard_key: tuple | None = None
        self._guard_at = float("-inf")
        self._guard: tuple = ("off", (), None)
        self._rogue_history = None
        self._audit_key: tuple | None = None
        self._audit_at = float("-inf")
        self._findings: tuple = ()

    def __call__(self, snapshot: Snapshot, config: Config) -> PanelData:
        guard_ok, mode, gerr, hits, daemon, policy = False, None, None, (), None, None
        try:
            from gputop.guard import state as guard_state
        except Exception:
            guard_state = None
        if guard_state is not None:
            guard_ok = True
            try:
                mode, hits, policy = self._guard_files(guard_state, config)
                d = guard_state.daemon_status()  # what `gputop guard status` says: is one running?
                daemon = {"alive": bool(d.get("alive")), "pid": d.get("pid"),
                          "policy_file": d.get("policy_file"), "mode": d.get("mode")}
            except Exception as e:
                self._guard_key = None
                gerr = f"cannot read guard state: {e}"
        audit_ok, aerr, findings = False, None, ()
        try:
            from gputop.core import rogue
        except Exception:
            rogue = None
        if rogue is not None and hasattr(rogue, "audit"):
            audit_ok = True
            try:
                if self._rogue_history is None and hasattr(rogue, "History"):
                    self._rogue_history = rogue.History()
                key = tuple(sorted((h.pid, h.start_time) for h in snapshot.holders))
                now = time.monotonic()
                if key != self._audit_key or now - self._audit_at >= self.AUDIT_EVERY:
                    self._findings = tuple(rogue.audit(snapshot, config, history=self._rogue_history))
                    self._audit_key, self._audit_at = key, now
                findings = self._findings
            except Exception as e:
                aerr = f"audit failed: {e}"
        return PanelData(guard_ok, mode, gerr, hits, audit_ok, aerr, findings, daemon, policy)

    def _guard_files(self, guard_state, config: Config) -> tuple:
        """The guard's mode, recent hits and policy file, read again only when the state or hits file
        changed (a new inode, size or mtime: both are replaced atomically or appended to), or after
        GUARD_EVERY seconds; ``config`` (the app's, --config included) names the policy when the state
        does not. The daemon's liveness is not cached (see __call__)."""
        d = guard_state.guard_dir()
        key = (d, guard_state.file_sig(d / guard_state.STATE_FILE), guard_state.file_sig(d / guard_state.HITS_FILE))
        now = time.monotonic()
        if key != self._guard_key or now - self._guard_at >= self.GUARD_EVERY:
            self._guard = (guard_state.get_mode(), tuple(guard_state.recent_hits(50)),
                           guard_state.get_policy_path(config))
            self._guard_key, self._guard_at = key, now
        return self._guard


class SamplingLoop:
    """The body of the sampling thread: sample, post, wait ``interval`` (or until woken), until stopped.

    ``post`` is the app's post_message (thread-safe). With ``devices_first`` the devices alone are read and
    posted before the first full sample, which reads and classifies every holder (most of a second at a
    thousand holders); the tree stays empty and the top bar says so until then."""

    def __init__(self, sampler, panel_source: Callable[[Snapshot, Config], PanelData], config: Config,
                 interval: float, post: Callable[[Message], object]):
        self.sampler = sampler
        self.panel_source = panel_source
        self.config = config
        self.interval = interval
        self._post = post
        self._wake = threading.Event()
        self._stop = threading.Event()

    def run(self, devices_first: bool) -> None:
        if devices_first:
            self._sample_devices_first()
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                snap = self.sampler.sample()
                panel = self.panel_source(snap, self.config)
                self._post(SnapshotReady(snap, panel))
            except Exception as e:  # keep sampling: a transient failure must not freeze the screen
                self._post(SampleFailed(f"{type(e).__name__}: {e}"))
            self._wake.wait(max(0.05, self.interval - (time.monotonic() - started)))
            self._wake.clear()

    def _sample_devices_first(self) -> None:
        try:
            devices = self.sampler.sample_devices()
        except Exception:
            return  # the full sample that follows reports the failure
        if devices:
            self._post(DevicesReady(devices))

    def wake(self) -> None:
        """Sample now (ctrl+l, after an action)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()
