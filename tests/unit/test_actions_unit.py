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


def test_watchdog_timer_keys_on_root_identity():
    """Only a tree that stays orphaned with the same (pid, start time) past the grace is reaped."""
    current: list[OrphanTree] = []
    reaped = []
    seams = {"trees": lambda snap, **kw: list(current),
             "reap": lambda pid, **kw: reaped.append((pid, kw)) or
             ActionResult("reap", True, "dry-run" if kw.get("dry_run") else "reaped", "ok", pid=pid)}

    class FakeSampler:
        config = None

        def sample(self):
            return None

    def tree(pid, start):
        root = _p(pid, start)
        return OrphanTree(root, (root,), (pid,), (0,), 1, "lost")

    dog = Watchdog(FakeSampler(), apply=True, grace=10, **seams)
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
    dog = Watchdog(FakeSampler(), apply=False, grace=1, **seams)
    current[:] = [tree(200, 2.0)]
    reaped.clear()
    dog.scan(0)
    dog.scan(5)
    dog.scan(9)
    assert [kw["dry_run"] for _, kw in reaped] == [True]


def test_run_watch_loops_with_injected_clock():

    class S:
        config = None
        calls = 0

        def sample(self):
            S.calls += 1

    slept = []
    actions.run_watch(S(), apply=True, interval=60, grace=60, clock=lambda: 0.0, sleep=slept.append,
                      iterations=3, trees=lambda snap, **kw: [])
    assert S.calls == 3 and slept == [60, 60]


def test_face_is_checked():
    with pytest.raises(ValueError, match="face"):
        actions.kill_process(1, expected_start=None, face="web")


def test_log_signals_column_collapses_repeats():
    from gputop.commands.log import _signals

    ev = [{"signal": s} for s in ("SIGSTOP", "SIGTERM", "SIGCONT", "SIGSTOP", "SIGSTOP", "SIGKILL")]
    assert _signals(ev) == "STOP,TERM,CONT,STOPx2,KILL"
    assert _signals([]) == ""


# ---- one run type: every kind writes one record with its keys in one order, and returns its result ----

HEAD = ["at", "time", "host", "actor", "face", "action", "target", "signals", "outcome", "ok", "message", "reason"]


@pytest.fixture
def written(monkeypatch):
    """The records the runs append to the audit log (nothing reaches a file)."""
    from gputop.core import auditlog

    out: list[dict] = []
    monkeypatch.setattr(auditlog, "append", lambda rec, config=None: out.append(rec))
    return out


def _runs():
    from gputop.actions.jobreap import GroupRun
    from gputop.actions.kill import _KillRun
    from gputop.actions.reap import ReapRun
    from gputop.actions.reset import ResetRun

    info = ProcInfo(pid=4242, ppid=1, name="python3", cmdline=("python3", "x.py"), start_time=12.5, uid=1000,
                    user="alice")
    kill = _KillRun(4242, 12.5, "cli", True, 5.0, False, "why", None)
    reap = ReapRun(4242, 12.5, "tui", 3.0, False, "why", None)
    kill.info = reap.info = info
    group = GroupRun({"job": "77", "uid": 1000}, "cli", 3.0, "why", None)
    reset = ResetRun(1, "api", True, "why", None)
    for r in (kill, reap, group):
        r.gpus = [0]
    return kill, reap, group, reset


def test_every_run_kind_writes_its_record_keys_in_the_audit_order_and_returns_its_result(written):
    kill, reap, group, reset = _runs()
    res = [r.done(True, "done", "m", 0, True) if r in (kill, reap) else r.done(True, "done", "m", 0)
           for r in (kill, reap, group, reset)]
    tail = {"kill": ["dry_run", "force", "exit_code", "memory_released", "details"],
            "reap": ["dry_run", "grace", "exit_code", "memory_released", "details"],
            "reap-group": ["grace", "exit_code", "details"], "reset": ["force", "exit_code", "details"]}
    assert [r["action"] for r in written] == ["kill", "reap", "reap-group", "reset"]
    for rec in written:
        assert list(rec) == HEAD + tail[rec["action"]], rec["action"]
    assert list(written[0]["target"]) == ["pid", "start_time", "user", "uid", "name", "cmdline", "gpus"]
    assert written[2]["target"] == {"job": "77", "uid": 1000, "gpus": [0]} and written[3]["target"] == {"gpu": 1}
    assert [(r.action, r.pid, r.gpu, r.memory_released) for r in res] == [
        ("kill", 4242, 0, True), ("reap", 4242, 0, True), ("reap-group", None, None, None), ("reset", None, 1, None)]
    assert all(r.details is run.details for r, run in zip(res, (kill, reap, group, reset)))


def test_an_interrupted_run_records_what_was_found_then_the_error(written):
    _, reap, _, _ = _runs()
    reap.details["plan"] = {}
    res = reap.interrupted(KeyboardInterrupt(), "cut short", {"members": []})
    assert res.outcome == "interrupted" and not res.ok and res.exit_code == 1
    assert list(written[0]["details"]) == ["plan", "members", "error"]
    assert written[0]["details"]["error"] == "KeyboardInterrupt: " and written[0]["interrupted"] == {
        "signals": [], "then": "rolled back"}


def test_a_record_that_cannot_be_written_is_said_in_the_result(monkeypatch):
    from gputop.core import auditlog

    def refuse(rec, config=None):
        raise auditlog.AuditLogError("disk full")

    monkeypatch.setattr(auditlog, "append", refuse)
    _, _, _, reset = _runs()
    assert reset.done(False, "busy", "m", 5).details == {"audit_error": "disk full"}


def test_the_executors_outcome_becomes_details_in_the_order_the_reap_learns_them():
    from gputop.actions.executor import Outcome
    from gputop.actions.plan import LeftAlone, Refusal

    p = _p(10, 1.0)
    new = LeftAlone(p, 10, "not-orphan", "r")
    done = Outcome(members=(p,), left_alone=(), left_alone_new=(new,), released=(3,), survivors=(),
                   reaped_holders=(10,), sigkill=True, started_during_reap=(5,), joined_by_session=(6,))
    assert list(done.details()) == ["left_alone_new", "sigkill", "started_during_reap", "joined_by_session", "members",
                                    "left_alone", "released", "survivors", "reaped_holders"]
    assert done.details()["members"][0]["pid"] == 10 and done.details()["released"] == [3]
    stuck = Outcome(members=(p,), survivors=(10, 11), sigkill=True, not_converged=(11,), converge_rounds=20)
    assert list(stuck.details())[:2] == ["not_converged", "converge_rounds"]
    assert stuck.details()["survivors"] == [10, 11]
    refused = Outcome(refusal=Refusal("permission-denied", "no", 4), left_alone_new=(new,))
    assert list(refused.details()) == ["left_alone_new"]
    cut = Outcome(members=(p,), interrupted=True)
    assert list(cut.details()) == ["members"]


def test_the_planner_says_what_a_refused_plan_answers():
    from gputop.actions.plan import ReapPlan, Refusal, refusal_of

    root = _p(10, 1.0)
    assert refusal_of(ReapPlan(10, root, (root,), (), (10,))) is None
    assert refusal_of(ReapPlan(10, root, (), (), (), ("protected", "is protected"))) == Refusal(
        "refused", "is protected", 5, "protected")
    assert refusal_of(ReapPlan(10, None, (), (), (), ("not-found", "pid 10 has exited"))) == Refusal(
        "not-found", "pid 10 exited while the tree was being checked; nothing was signalled", 3)
    assert refusal_of(ReapPlan(10, root, (), (), (), ("identity-changed", "reused"))) == Refusal(
        "identity-changed", "reused", 5)


def test_a_plans_gpus_are_its_members_and_for_a_tree_its_subtrees_left_alone_too():
    from types import SimpleNamespace

    from gputop.actions.plan import LeftAlone, ReapPlan, plan_gpus

    root, kept = _p(10, 1.0), _p(20, 1.0)
    plan = ReapPlan(10, root, (root,), (LeftAlone(kept, 20, "not-orphan", "r", (21,)),), (10,))
    snap = SimpleNamespace(holders=[SimpleNamespace(pid=10, gpus=(1,)), SimpleNamespace(pid=21, gpus=(0, 1)),
                                    SimpleNamespace(pid=99, gpus=(3,))])
    assert plan_gpus(plan, snap) == [0, 1] and plan_gpus(plan, snap, left_alone=False) == [1]
