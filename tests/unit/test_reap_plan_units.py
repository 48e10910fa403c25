"""The planner's units (issue 26) on fixture tables: a PID namespace's init, and process groups the reap
would orphan (pure: no processes, no /proc)."""

from __future__ import annotations

import dataclasses

from gputop.actions.plan import LeftAlone, PidNs, Rules, orphaned_groups, plan_reap
from gputop.core.orphans import classify
from gputop.core.procs import StatFields
from tests.unit.test_reap_plan import INIT, P, FixtureTable


class GroupTable(FixtureTable):
    """A fixture table that also answers ``stat_fields`` (ppid, process group, session, start)."""

    def __init__(self, *procs, groups=None):
        super().__init__(*procs)
        groups = groups or {}
        self._fields = {p.pid: StatFields(p.ppid, groups.get(p.pid, p.sid), p.sid, int(p.start_time))
                        for p in procs}

    def stat_fields(self):
        return self._fields


def rules(table, holders, namespaces=None):
    ns = namespaces or {}
    return Rules(lambda pid: classify(pid, table), frozenset({4242}), frozenset(holders), table.hidden,
                 namespace=lambda pid: ns.get(pid))


# Session 80 is dead (its leader exited): 81 the root, 82 a holder, 83 unshare, 84 the namespace's init
# (pid 1 inside), 85 its worker (pid 2 inside), 86 a setsid'd process inside (pid 3 inside, session 86).
NS_TREE = (INIT, P(81, 1, "sh", 50, 80), P(82, 81, "python", 51, 80), P(83, 81, "unshare", 52, 80),
           P(84, 83, "sh", 53, 80), P(85, 84, "python", 54, 80))


def test_an_init_whose_namespace_holds_a_setsid_process_is_left_alone_with_the_reason():
    table = FixtureTable(*NS_TREE, P(86, 84, "python", 55, 86))
    ns = PidNs(4026532000, ((84, 1), (85, 2), (86, 3)))
    plan = plan_reap(table, 81, 50, rules(table, {82}, {84: ns}))
    assert plan.refusal is None and plan.pids == (81, 82, 83)
    [e] = plan.left_alone
    assert e.pid == 84 and e.rule == "pid-namespace" and set(e.subtree) == {85, 86}
    assert "PID namespace" in e.reason and "pid 86 (pid 3 inside" in e.reason
    assert e.to_dict()["namespace"] == [{"pid": 84, "ns_pid": 1}, {"pid": 85, "ns_pid": 2}, {"pid": 86, "ns_pid": 3}]


def test_an_init_whose_namespace_holds_a_process_entered_from_outside_is_left_alone():
    # 90 is a live login shell (session 90); 91 its nsenter, 92 entered into the namespace (pid 4 inside).
    table = FixtureTable(*NS_TREE, P(90, 1, "bash", 5, 90), P(91, 90, "nsenter", 56, 90),
                         P(92, 91, "python", 57, 90))
    ns = PidNs(4026532000, ((84, 1), (85, 2), (92, 4)))
    plan = plan_reap(table, 81, 50, rules(table, {82}, {84: ns}))
    assert plan.refusal is None and 84 not in plan.pids and 85 not in plan.pids
    [e] = plan.left_alone
    assert e.rule == "pid-namespace" and "pid 92 (pid 4 inside" in e.reason and "outside the tree" in e.reason


def test_an_init_whose_namespace_holds_only_its_own_orphans_is_reaped_with_them():
    table = FixtureTable(*NS_TREE)
    plan = plan_reap(table, 81, 50, rules(table, {82}, {84: PidNs(4026532000, ((84, 1), (85, 2)))}))
    assert plan.refusal is None and plan.pids == (81, 82, 83, 84, 85) and plan.left_alone == ()


def test_an_init_whose_namespace_cannot_be_read_refuses_the_tree():
    table = FixtureTable(*NS_TREE)
    plan = plan_reap(table, 81, 50, rules(table, {82}, {84: PidNs(None)}))
    assert plan.refusal is not None and plan.refusal[0] == "unknown"


def test_another_users_process_in_the_namespace_refuses_the_tree():
    table = FixtureTable(*NS_TREE, dataclasses.replace(P(86, 84, "python", 55, 80), uid=1001, user="bob"))
    plan = plan_reap(table, 81, 50, rules(table, {82}, {84: PidNs(1, ((84, 1), (85, 2), (86, 3)))}))
    assert plan.refusal is not None and plan.refusal[0] == "other-user"


def test_a_root_that_is_an_init_with_something_to_keep_is_refused():
    table = FixtureTable(INIT, P(84, 1, "sh", 53, 80), P(85, 84, "python", 54, 80), P(86, 84, "python", 55, 86))
    plan = plan_reap(table, 84, 53, rules(table, {85}, {84: PidNs(7, ((84, 1), (85, 2), (86, 3)))}))
    assert plan.refusal is not None and plan.refusal[0] == "pid-namespace" and plan.members == ()


# ---- process groups ----

def _group_case(kept_state: str):
    # 81 the root (group 80), 82 a holder (group 80), 83 kept: group 83, left alone (its own session scope
    # is faked by the verdict below), anchored only by 81 (same session, another group).
    procs = (INIT, P(81, 1, "python", 50, 80), P(82, 81, "python", 51, 80), P(83, 81, "python", 52, 80, state=kept_state))
    table = GroupTable(*procs, groups={81: 80, 82: 80, 83: 83})
    base = rules(table, {82})

    def verdict(pid):
        v = classify(pid, table)
        return dataclasses.replace(v, kind="not-orphan", reason="managed by systemd unit x.service") if pid == 83 else v
    return table, dataclasses.replace(base, verdict=verdict)


def test_a_group_orphaned_by_the_reap_with_a_stopped_process_left_alone_refuses_the_tree():
    table, r = _group_case("T")
    plan = plan_reap(table, 81, 50, r)
    assert plan.refusal is not None and plan.refusal[0] == "orphaned-group", plan.refusal
    assert "process group 83" in plan.refusal[1] and "SIGHUP" in plan.refusal[1]
    assert plan.to_dict()["orphaned_groups"] == [{"pgid": 83, "anchors": [81], "left_alone": [83], "stopped": [83],
                                                  "members": []}]


def test_a_group_orphaned_with_only_a_running_process_left_alone_is_reaped_around_it():
    table, r = _group_case("S")
    plan = plan_reap(table, 81, 50, r)
    assert plan.refusal is None and plan.pids == (81, 82) and [e.pid for e in plan.left_alone] == [83]


def test_a_group_still_anchored_by_a_process_the_reap_leaves_is_not_reported():
    # 84 (left alone, group 84, same session) is another parent of group 83's processes: 83 stays anchored.
    procs = (INIT, P(81, 1, "python", 50, 80), P(83, 81, "python", 52, 80, state="T"),
             P(84, 1, "python", 49, 80), P(85, 84, "python", 53, 80, state="T"))
    table = GroupTable(*procs, groups={81: 80, 83: 83, 84: 84, 85: 83})
    left = [LeftAlone(table.get(83), 83, "not-orphan", "x")]
    assert orphaned_groups(table, [table.get(81)], left) == []
    assert orphaned_groups(table, [table.get(81), table.get(84)], left)[0]["pgid"] == 83
