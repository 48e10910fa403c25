"""The reap planner on fixture process tables (pure: no processes, no /proc)."""

from __future__ import annotations

import pytest

from gputop.actions.plan import Rules, plan_reap
from gputop.core.orphans import DEFAULT_PROTECT, NOT_ORPHAN, ORPHAN, classify, compile_protect
from gputop.core.procs import ProcInfo

PROTECT = compile_protect(DEFAULT_PROTECT)


def P(pid, ppid, name="python", start=100.0, sid=None, cmd=None, uid=1000, sighup=False, state="S", half=False):
    return ProcInfo(pid=pid, ppid=ppid, name=name, cmdline=tuple((cmd or name).split()), start_time=start,
                    sid=sid, uid=uid, user={0: "root", 1000: "alice", 1001: "bob"}.get(uid, str(uid)),
                    state=state, sighup_ignored=sighup, half_exited=half)


class FixtureTable(dict):
    """A process table: ``get``, ``children`` and ``hidden`` (pids that exist but cannot be read)."""

    def __init__(self, *procs, hidden=()):
        super().__init__({p.pid: p for p in procs})
        self._hidden = set(hidden)
        self._kids: dict[int, list[int]] = {}
        for p in procs:
            self._kids.setdefault(p.ppid, []).append(p.pid)
        for pid, ppid in hidden:
            self._kids.setdefault(ppid, []).append(pid)
        self._hidden = {pid for pid, _ in hidden}

    def children(self, pid):
        return list(self._kids.get(pid, ()))

    def hidden(self, pid):
        return pid in self._hidden


INIT = P(1, 0, "systemd", 1.0, 1, "/sbin/init", uid=0)


def rules(table, holders=(), never=frozenset({4242})):
    return Rules(lambda pid: classify(pid, table, protect=PROTECT), frozenset(never), frozenset(holders),
                 table.hidden)


# Each fixture: (table, root, holders). Session 80 is dead (its leader exited); 60 is a live login shell.
FIXTURES = {
    # setsid sh -c 'loop & exit': the loop (81) and its worker (82), both orphans.
    "plain": (FixtureTable(INIT, P(81, 1, "bash", 50, 80), P(82, 81, "python", 60, 80)), 81, {82}),
    # issue 11 case 1: a holder in the dead session, a setsid child, and a setsid bash session with a holder.
    "live-subtrees": (FixtureTable(INIT, P(81, 1, "bash", 50, 80), P(82, 81, "python", 60, 80),
                                   P(83, 81, "python", 61, 83), P(84, 81, "bash", 62, 84),
                                   P(85, 84, "python", 63, 84), P(86, 83, "python", 64, 83)), 81, {82, 85}),
    # a member that moved into a live session (its leader 60 is alive).
    "live-session-member": (FixtureTable(INIT, P(60, 1, "bash", 5, 60), P(81, 1, "bash", 50, 80),
                                         P(82, 81, "python", 60, 80), P(83, 81, "python", 61, 60)), 81, {82, 83}),
    "protected-sibling": (FixtureTable(INIT, P(81, 1, "bash", 50, 80), P(82, 81, "python", 60, 80),
                                       P(83, 81, "tmux", 61, 80)), 81, {82}),
    "nohup-member": (FixtureTable(INIT, P(81, 1, "bash", 50, 80), P(82, 81, "python", 60, 80),
                                  P(83, 81, "sleep", 61, 80, sighup=True)), 81, {82}),
    "other-user": (FixtureTable(INIT, P(81, 1, "bash", 50, 80), P(82, 81, "python", 60, 80, uid=1001)), 81, {82}),
    "hidden-child": (FixtureTable(INIT, P(81, 1, "bash", 50, 80), P(82, 81, "python", 60, 80),
                                  hidden=[(83, 81)]), 81, {82}),
    # a member whose main thread exited (state Z, threads live): alive, and its child is still in the tree.
    "half-exited": (FixtureTable(INIT, P(81, 1, "python", 50, 80, state="Z", half=True),
                                 P(82, 81, "python", 60, 80)), 81, {82}),
    "real-zombie": (FixtureTable(INIT, P(81, 1, "bash", 50, 80), P(82, 81, "python", 60, 80),
                                 P(83, 81, "true", 61, 80, state="Z")), 81, {82}),
    "gputop-ancestor": (FixtureTable(INIT, P(81, 1, "bash", 50, 80), P(82, 81, "python", 60, 80),
                                     P(4242, 81, "gputop", 61, 80)), 81, {82}),
    # the root is not an orphan root: its session leader lives.
    "root-not-orphan": (FixtureTable(INIT, P(60, 1, "bash", 5, 60), P(61, 60, "python", 10, 60)), 61, {61}),
    # the session leader cannot be seen (hidepid): unknown, never reaped.
    "hidden-leader": (FixtureTable(INIT, P(81, 1, "python", 50, 80), hidden=[(80, 1)]), 81, {81}),
    "subreaper": (FixtureTable(INIT, P(40, 1, "systemd", 5, 40), P(81, 40, "bash", 50, 80),
                               P(82, 81, "python", 60, 80), P(83, 82, "python", 61, 83)), 81, {82}),
}


def plan_of(name):
    table, root, holders = FIXTURES[name]
    return plan_reap(table, root, table[root].start_time, rules(table, holders)), table


def test_live_subtrees_are_left_alone_and_the_rest_is_planned():
    plan, _ = plan_of("live-subtrees")
    assert plan.pids == (81, 82) and plan.refusal is None and plan.holders == (82,)
    left = {e.pid: e for e in plan.left_alone}
    assert set(left) == {83, 84}
    assert left[83].rule == "not-orphan" and "session leader itself" in left[83].reason and left[83].subtree == (86,)
    assert left[84].subtree == (85,) and not left[84].blocks
    assert plan.held_back == (85,)


def test_a_member_of_a_live_session_is_left_alone():
    plan, _ = plan_of("live-session-member")
    assert plan.pids == (81, 82) and [e.pid for e in plan.left_alone] == [83]
    assert "session leader pid 60 (bash) is alive" in plan.left_alone[0].reason


@pytest.mark.parametrize("name,rule,word", [("protected-sibling", "protected", "tmux"),
                                            ("nohup-member", "protected", "nohup"),
                                            ("other-user", "other-user", "belongs to user bob"),
                                            ("hidden-child", "hidden", "cannot be seen"),
                                            ("gputop-ancestor", "never", "ancestor of gputop")])
def test_blocking_members_make_apply_refuse_the_whole_tree(name, rule, word):
    plan, _ = plan_of(name)
    assert plan.refusal is not None and plan.refusal[0] == rule and word in plan.refusal[1], plan.refusal
    assert any(e.rule == rule and e.blocks for e in plan.left_alone)


def test_a_half_exited_member_is_alive_and_its_child_stays_in_the_tree():
    plan, _ = plan_of("half-exited")
    assert plan.pids == (81, 82) and plan.refusal is None


def test_a_real_zombie_is_not_a_member():
    plan, _ = plan_of("real-zombie")
    assert plan.pids == (81, 82) and plan.left_alone == ()


def test_a_root_that_is_not_an_orphan_root_is_refused():
    plan, _ = plan_of("root-not-orphan")
    assert plan.refusal[0] == "not-orphan" and "not the root of an orphan tree" in plan.refusal[1]


def test_a_hidden_session_leader_makes_the_root_unknown():
    plan, _ = plan_of("hidden-leader")
    assert plan.refusal[0] == "unknown" and "cannot be seen" in plan.refusal[1]


def test_identity_and_existence_of_the_root():
    table, root, holders = FIXTURES["plain"]
    assert plan_reap(table, root, 49.0, rules(table, holders)).refusal[0] == "identity-changed"
    assert plan_reap(table, 99, None, rules(table, holders)).refusal[0] == "not-found"
    assert plan_reap(table, root, None, rules(table, set())).refusal[0] == "not-orphan"  # no GPU holder in it


def test_the_plan_is_the_json_the_preview_shows():
    plan, _ = plan_of("live-subtrees")
    d = plan.to_dict()
    assert [m["pid"] for m in d["members"]] == [81, 82] and d["refusal"] is None
    assert [(e["pid"], e["rule"], e["subtree"], e["owner"]) for e in d["left_alone"]] == [
        (83, "not-orphan", [86], None), (84, "not-orphan", [85], None)]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_no_planned_member_is_ever_a_non_orphan(name):
    """Over every fixture and every possible root: a planned member is an orphan by the classifier's own
    verdict, and nothing in a left-alone subtree is a member."""
    table, _, holders = FIXTURES[name]
    r = rules(table, holders)
    for root in table:
        plan = plan_reap(table, root, None, r)
        left = {p for e in plan.left_alone for p in (e.pid, *e.subtree)}
        for m in plan.members:
            v = classify(m.pid, table, protect=PROTECT)
            assert v.kind == ORPHAN, (name, root, m.pid, v)
            assert v.kind != NOT_ORPHAN and m.pid not in left
        if plan.refusal is None:
            assert plan.members and plan.members[0].pid == root
