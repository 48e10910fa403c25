"""The ownership rules of orphan verdicts, over constructed process tables and the cgroup fixture trees."""

from __future__ import annotations

import pytest

from gputop.core.orphans import NOT_ORPHAN, ORPHAN, PROTECTED, UNKNOWN, Verdict, apply_owner, classify, compile_protect
from gputop.core.ownership import read_owner
from tests.unit.test_ownership import EXPECTED, FIXTURES, PID
from tests.unit.test_orphans import INIT, P, Table

PROTECT = compile_protect(["jupyter"])


def fixture_owner(layout: str):
    base = FIXTURES / layout
    return lambda proc: read_owner(PID if proc.pid == PID else -1, str(base / "proc"), str(base / "run"))


def double_forked_daemon() -> Table:
    # A unit's ExecStart ran a script (session leader 80) that double-forked the daemon and exited: from
    # /proc alone the daemon looks like a dead-session orphan reparented to init.
    return Table(INIT, P(PID, 1, "python", 50, 80, "python daemon.py"))


def orphan_under_shell() -> Table:
    # setsid sh -c 'loop & exit' in a login: the loop (81) was reparented to init, the holder runs under it.
    return Table(INIT, P(81, 1, "bash", 50, 80, "bash retry.sh"), P(PID, 81, "python", 60, 80))


def test_double_forked_daemon_in_a_service_is_not_an_orphan():
    t = double_forked_daemon()
    assert classify(PID, t).kind == ORPHAN  # the session test alone
    v = classify(PID, t, owner_of=fixture_owner("systemd-service"))
    assert v.kind == NOT_ORPHAN
    assert v.reason.startswith("managed by systemd unit foo.service; the session test alone said: "
                               "session leader pid 80 is gone")
    assert v.root is None and v.reaper is None
    assert v.orphan_reason and "session leader pid 80 is gone" in v.orphan_reason  # reap lists it as skipped


def test_user_service_is_managed_by_the_user_manager():
    v = classify(PID, double_forked_daemon(), owner_of=fixture_owner("user-service"))
    assert v.kind == NOT_ORPHAN
    assert v.reason.startswith("managed by systemd unit train.service (the user manager of uid 1000, "
                               "user@1000.service)")


def test_login_service_leftover_is_still_judged_by_its_session():
    # No pam_systemd: an ssh login's processes sit in ssh.service, which does not stop them.
    v = classify(PID, orphan_under_shell(), owner_of=fixture_owner("login-service-ssh"))
    assert v.kind == ORPHAN and v.root == 81


def test_session_scope_closing_is_an_orphan_with_logind_in_the_reason():
    v = classify(PID, orphan_under_shell(), owner_of=fixture_owner("session-closing"))
    assert v.kind == ORPHAN and v.root == 81 and v.reaper == 1
    assert v.reason.startswith("logind session 12 is closing (its user logged out); session leader pid 80 is gone")


def test_session_scope_gone_is_an_orphan_with_logind_in_the_reason():
    v = classify(PID, orphan_under_shell(), owner_of=fixture_owner("session-gone"))
    assert v.kind == ORPHAN and "logind session 12 is gone" in v.reason


@pytest.mark.parametrize("layout", ["session-active", "session-online"])
def test_session_scope_live_is_not_an_orphan(layout):
    v = classify(PID, orphan_under_shell(), owner_of=fixture_owner(layout))
    assert v.kind == NOT_ORPHAN
    assert "is active (its user is logged in)" in v.reason or "is online" in v.reason
    assert v.root is None


def test_closing_session_never_makes_an_orphan_of_a_deliberate_session():
    # tmux or setsid in a login that ended: the process leads its own session, or its leader lives.
    leader = Table(INIT, P(PID, 1, "python", 50, PID))
    assert classify(PID, leader, owner_of=fixture_owner("session-closing")).kind == NOT_ORPHAN
    live = Table(INIT, P(70, 1, "tmux", 40, 70), P(71, 70, "bash", 45, 71), P(PID, 71, "python", 50, 71))
    assert classify(PID, live, owner_of=fixture_owner("session-closing")).kind == NOT_ORPHAN


def test_no_logind_leaves_the_session_test_alone():
    v = classify(PID, orphan_under_shell(), owner_of=fixture_owner("session-no-logind"))
    assert v == classify(PID, orphan_under_shell())


@pytest.mark.parametrize("layout", ["docker-systemd", "kubepods-systemd", "slurm-v1", "slurm-v2",
                                    "plain-v2", "user-delegated-lies"])
def test_recorded_only_owners_do_not_change_the_verdict(layout):
    # user-delegated-lies is inside user@1000.service: a service, so not an orphan; the rest: recorded.
    want = NOT_ORPHAN if layout == "user-delegated-lies" else ORPHAN
    assert classify(PID, orphan_under_shell(), owner_of=fixture_owner(layout)).kind == want


def test_protection_still_applies_and_is_no_longer_an_orphan_it_saved():
    t = Table(INIT, P(PID, 1, "jupyter", 50, 80, "jupyter lab"))
    v0 = classify(PID, t, protect=PROTECT)
    assert v0.kind == PROTECTED and v0.orphan_reason
    v = classify(PID, t, protect=PROTECT, owner_of=fixture_owner("systemd-service"))
    assert v.kind == PROTECTED and v.orphan_reason is None and v.root is None
    v = classify(PID, t, protect=PROTECT, owner_of=fixture_owner("session-closing"))
    assert v.kind == PROTECTED and v.orphan_reason.startswith("logind session 12 is closing")


def test_unknown_stays_unknown():
    # A chain with a gap: nothing about the owner makes it safe to act on.
    t = Table(INIT, P(PID, 55, "python", 50, 80))
    assert classify(PID, t, owner_of=fixture_owner("systemd-service")).kind == UNKNOWN
    assert apply_owner(Verdict(UNKNOWN, "x"), read_owner(PID, str(FIXTURES / "session-active" / "proc"),
                                                        str(FIXTURES / "session-active" / "run"))).kind == UNKNOWN


def test_unreadable_owner_leaves_the_verdict_alone():
    v = classify(PID, orphan_under_shell(), owner_of=lambda p: None)
    assert v == classify(PID, orphan_under_shell())


def test_not_orphan_reason_names_the_owner_first():
    t = Table(INIT, P(PID, 1, "python", 50, PID))
    v = classify(PID, t, owner_of=fixture_owner("systemd-service"))
    assert v.kind == NOT_ORPHAN and v.reason.startswith("managed by systemd unit foo.service; session leader itself")


@pytest.mark.parametrize("layout", sorted(EXPECTED))
def test_no_layout_turns_a_not_orphan_into_an_orphan(layout):
    """Ownership rules only take orphan verdicts away or add evidence: over every fixture."""
    for t in (Table(INIT, P(PID, 1, "python", 50, PID)),
              Table(INIT, P(60, 1, "bash", 20, 60), P(PID, 60, "python", 50, 60))):
        assert classify(PID, t, owner_of=fixture_owner(layout)).kind == NOT_ORPHAN
