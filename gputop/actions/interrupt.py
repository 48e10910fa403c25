"""Signals that arrive while an action runs: the action finishes or rolls back, and the record says so.

A kill or reap that dies half-way leaves a tree stopped (gputop SIGSTOPs a tree before it signals it)
or a member that ignores SIGTERM running, with no audit record. So, while an action runs on the main
thread, ``deferred()`` holds SIGHUP and SIGTERM (an SSH drop, a service stop):

- the first one is noted and the action carries on to the end of its confirmed plan (a reap's grace,
  then SIGKILL; a kill's timeout and --force); the audit record says it was interrupted, by what, and
  that the plan was finished;
- a second one (someone insists) raises ``Interrupted`` in the main thread: the action's own rollback
  runs (a reap continues, SIGCONT, whatever it stopped and did not kill) and records "interrupted".
  Only where the signal's handler was the default action: a face with its own handler (the guard daemon
  reloads on SIGHUP) gets the signal after the action, however many came;
- SIGINT keeps Python's KeyboardInterrupt, which takes that same rollback path: Ctrl-C at the keyboard
  means stop now.

When the outermost ``deferred()`` ends, the held signal is raised again with the handler that was there
before, so the process still exits the way that signal asks (exit 129 for SIGHUP, a face's own SIGTERM
handler, ...), after the record is written.

Python runs signal handlers only on the main thread. An action in a worker thread (the TUI, the guard)
cannot install them; ``deferred()`` then only counts the action as in flight, and the face's main thread
decides: the TUI's own handler notes the signal (``note_for_workers()``), leaves the screen, and waits for
``idle()`` before the process ends, so the action finishes its plan and its record says it was interrupted.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager

HELD = (signal.SIGHUP, signal.SIGTERM)


class Interrupted(BaseException):
    """A second SIGHUP/SIGTERM during an action: roll back now (a BaseException, as KeyboardInterrupt)."""


_lock = threading.Lock()
_caught: list[int] = []  # signals held by the outermost deferred() on the main thread
_depth = 0
_active = 0  # actions in flight in any thread (see idle())
_ended = 0  # actions ended so far (see settle())
_idle = threading.Condition(_lock)


_old: dict[int, object] = {}  # the handlers deferred() replaced


def _handler(signum, frame):
    _caught.append(signum)
    # A second one rolls back only where the signal would have ended the process (its default action).
    # A face with a handler of its own (the guard daemon reloads on SIGHUP, stops on SIGTERM) gets its
    # signals after the action, however many came.
    if len(_caught) > 1 and _old.get(signum) in (signal.SIG_DFL, None):
        raise Interrupted(f"{signal.Signals(signum).name} received again during the action")


def caught() -> list[str]:
    """Names of the signals held so far (empty: not interrupted)."""
    return [signal.Signals(s).name for s in list(_caught)]


def note(outcome: str) -> dict | None:
    """What an audit record says about an interruption, or None: which signals, and whether the action
    went on to the end of its plan ("finished") or was rolled back ("rolled back")."""
    sigs = caught()
    if not sigs and outcome != "interrupted":  # "interrupted" alone: Ctrl-C (KeyboardInterrupt) or a bug
        return None
    return {"signals": sigs, "then": "rolled back" if outcome == "interrupted" else "finished"}


def finished_note() -> str:
    """For the message of an action that went on to the end of its plan: which signals came meanwhile
    ("" when none did)."""
    sigs = caught()
    return f"; interrupted by {', '.join(sigs)}: the confirmed plan was carried out to its end" if sigs else ""


@contextmanager
def deferred():
    """Hold SIGHUP and SIGTERM for the duration (main thread only; nested uses share the outermost)."""
    global _depth, _active, _ended
    with _lock:
        _active += 1
    main = threading.current_thread() is threading.main_thread()
    outer = main and _depth == 0
    old = {}
    if outer:
        _caught.clear()
        try:
            for s in HELD:
                old[s] = signal.signal(s, _handler)
                _old[s] = old[s]
        except (ValueError, OSError):  # not the main interpreter, or a platform without the signal
            for s, h in old.items():
                signal.signal(s, h)
            old, outer = {}, False
    if main:
        _depth += 1
    try:
        yield
    finally:
        if main:
            _depth -= 1
        with _lock:
            _active -= 1
            _ended += 1
            _idle.notify_all()
        if outer:
            for s, h in old.items():
                signal.signal(s, h)
            held, _caught[:] = list(_caught), []
            if held:
                for f in (sys.stdout, sys.stderr):
                    try:
                        f.flush()
                    except Exception:
                        pass
                signal.raise_signal(held[0])  # as if it came now: the process exits as it asked


def note_for_workers(signum: int) -> bool:
    """For a face whose actions run in worker threads (the TUI), from its own SIGHUP/SIGTERM handler: when
    an action is in flight, note the signal for that action's record (it finishes its plan, and the record
    says it was interrupted) and return True; the face must then wait for ``idle()`` before the process
    ends. False when no action is in flight."""
    with _lock:
        if _active == 0:
            return False
        _caught.append(signum)
        return True


def idle(timeout: float) -> bool:
    """Wait until no action is in flight in any thread (a face's main thread, before it exits)."""
    with _idle:
        return _idle.wait_for(lambda: _active == 0, timeout)


def settle(quiet: float) -> bool:
    """Wait until no action is in flight in any thread, for as long as actions keep ending: False only
    when none has ended for ``quiet`` seconds (one that hangs). For a face that runs several actions one
    after another after the signal (the TUI's kill of tagged processes), where no fixed total fits."""
    with _idle:
        while _active:
            seen = _ended
            if not _idle.wait_for(lambda: _active == 0 or _ended != seen, quiet):
                return False
        return True
