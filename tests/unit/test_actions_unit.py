"""Pure parts of the actions layer: signal names, identity comparison, --since parsing, the watchdog timer."""

from __future__ import annotations

import signal

import pytest

from gputop import actions
from gputop.actions import ActionResult, OrphanTree, Watchdog, parse_signal, same_start
from gputop.commands.log import parse_since
from gputop.util.errors import UsageError
from gputop.core.procs import ProcInfo


@pytest.mark.parametrize("name,sig", [("TERM", signal.SIGTERM), ("sigkill", signal.SIGKILL),
                                      ("SIGINT", signal.SIGINT), ("9", signal.SIGKILL), (" hup ", signal.SIGHUP)])
def test_parse_signal(name, sig):
    assert parse_signal(name) == sig


@pytest.mark.parametrize("bad", ["", "NOPE", "999", "SIG"])
def test_parse_signal_rejects(bad):
    with pytest.raises(ValueError, match="unknown signal"):
        parse_signal(bad)


def test_same_start():
    assert same_start(1796000000.12, 1796000000.12)
    assert same_start(1796000000.12, 1796000000.1200001)
    assert not same_start(1796000000.12, 1796000000.13)
    assert not same_start(None, 1.0) and not same_start(1.0, None)


def test_parse_since():
    assert parse_since("10m", now=10_000) == 9_400
    assert parse_since("2h", now=10_000) == 2_800
    assert parse_since("90", now=10_000) == 9_910
    assert parse_since("2026-11-30T02:00:00+00:00") == 1796004000.0
    assert parse_since("2026-11-30T02:00:00Z") == 1796004000.0
    with pytest.raises(UsageError):
        parse_since("last tuesday")


def test_action_result_to_dict():
    r = ActionResult("kill", False, "refused", "no", pid=5, exit_code=5, details={"rule": "pid1"})
    assert r.to_dict() == {"action": "kill", "ok": False, "outcome": "refused", "message": "no", "pid": 5,
                           "gpu": None, "exit_code": 5, "memory_released": None, "details": {"rule": "pid1"}}


def _p(pid, start):
    return ProcInfo(pid=pid, ppid=1, name="bash", cmdline=("bash",), start_time=start, sid=pid - 1)


def test_watchdog_timer_keys_on_root_identity(monkeypatch):
    """Only a tree that stays orphaned with the same (pid, start time) past the grace is reaped."""
    current: list[OrphanTree] = []
    reaped = []
    monkeypatch.setattr(actions, "orphan_trees", lambda snap, **kw: list(current))
    monkeypatch.setattr(actions, "reap_tree", lambda pid, **kw: reaped.append((pid, kw)) or
                        ActionResult("reap", True, "dry-run" if kw.get("dry_run") else "reaped", "ok", pid=pid))

    class FakeSampler:
        config = None

        def sample(self):
            return None

    def tree(pid, start):
        root = _p(pid, start)
        return OrphanTree(root, (root,), (pid,), (0,), 1, "lost")

    dog = Watchdog(FakeSampler(), apply=True, grace=10)
    current[:] = [tree(100, 1.0)]
    assert [e["event"] for e in dog.scan(0)] == ["pending"]
    assert [e["event"] for e in dog.scan(10)] == ["pending"]  # exactly the grace: not longer
    current[:] = [tree(100, 50.0)]  # the PID was reused by a new orphan: its own grace starts now
    assert [e["event"] for e in dog.scan(11)] == ["pending"]
    assert reaped == []
    assert [e["event"] for e in dog.scan(21.5)] == ["reaped"]
    assert reaped[0][0] == 100 and reaped[0][1]["expected_start"] == 50.0
    assert reaped[0][1]["reason"].startswith("watchdog: orphaned for 10")
    # Without --apply: logged once per tree, not on every scan.
    dog = Watchdog(FakeSampler(), apply=False, grace=1)
    current[:] = [tree(200, 2.0)]
    reaped.clear()
    dog.scan(0)
    dog.scan(5)
    dog.scan(9)
    assert [kw["dry_run"] for _, kw in reaped] == [True]


def test_run_watch_loops_with_injected_clock(monkeypatch):
    monkeypatch.setattr(actions, "orphan_trees", lambda snap, **kw: [])

    class S:
        config = None
        calls = 0

        def sample(self):
            S.calls += 1

    slept = []
    actions.run_watch(S(), apply=True, interval=60, grace=60, clock=lambda: 0.0, sleep=slept.append,
                      iterations=3)
    assert S.calls == 3 and slept == [60, 60]


def test_face_is_checked():
    with pytest.raises(ValueError, match="face"):
        actions.kill_process(1, expected_start=None, face="web")


def test_log_signals_column_collapses_repeats():
    from gputop.commands.log import _signals

    ev = [{"signal": s} for s in ("SIGSTOP", "SIGTERM", "SIGCONT", "SIGSTOP", "SIGSTOP", "SIGKILL")]
    assert _signals(ev) == "STOP,TERM,CONT,STOPx2,KILL"
    assert _signals([]) == ""
