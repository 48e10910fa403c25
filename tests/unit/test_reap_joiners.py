"""plan.joiners on fixture stat tables: what joined the tree during the reap, found by session and group."""

from __future__ import annotations

from gputop.actions.plan import joiners, lineage
from gputop.core.procs import StatFields
from tests.unit.test_reap_plan import INIT, FixtureTable, P, rules

# Dead session 80: the tree's member 82 (group 80), another tree's root 90 (group 90) in the same session.
BEFORE = {1: StatFields(0, 1, 1, 1), 82: StatFields(1, 80, 80, 600), 90: StatFields(1, 90, 80, 610),
          60: StatFields(1, 60, 60, 50)}


def run(after: dict[int, StatFields], procs, ours=frozenset({82}), foreign=None):
    table = FixtureTable(INIT, P(82, 1, "python", 60, 80), P(90, 1, "python", 61, 80), *procs)
    lin = lineage(BEFORE, [82])
    foreign = set() if foreign is None else foreign
    members, left = joiners(after, table, lin, set(ours), table[82], rules(table), foreign)
    return [m.pid for m in members], [e.pid for e in left], foreign


def test_a_worker_reparented_to_init_after_its_member_exited_joins():
    after = {**BEFORE, 100: StatFields(1, 80, 80, 900), 101: StatFields(100, 80, 80, 901)}
    del after[82]  # the member exited
    assert run(after, [P(100, 1, "python", 90, 80), P(101, 100, "python", 91, 80)])[:2] == ([100, 101], [])


def test_a_new_process_under_another_tree_of_the_same_session_is_never_taken():
    after = {**BEFORE, 100: StatFields(90, 90, 80, 900), 101: StatFields(90, 80, 80, 901)}
    members, left, foreign = run(after, [P(100, 90, "python", 90, 80), P(101, 90, "python", 91, 80)])
    assert members == [] and left == [] and foreign == {(101, 901)}  # 100: a foreign group, never a candidate
    # and once its parent exits, it is still not taken
    after2 = {p: s for p, s in after.items() if p != 90}
    after2[101] = StatFields(1, 80, 80, 901)
    assert run(after2, [P(101, 1, "python", 91, 80)], foreign=foreign)[0] == []


def test_what_existed_before_another_session_and_a_foreign_group_are_not_candidates():
    after = {**BEFORE, 82: StatFields(1, 80, 80, 600), 110: StatFields(1, 60, 60, 900), 111: StatFields(1, 90, 80, 901)}
    procs = [P(110, 1, "python", 90, 60), P(111, 1, "python", 91, 80)]
    assert run(after, procs)[:2] == ([], [])


def test_a_joiner_the_classifier_does_not_call_an_orphan_is_left_alone():
    # pid 120 moved into live session 60 (its leader is alive): same group, new, but not an orphan
    after = {**BEFORE, 60: StatFields(1, 60, 60, 50), 120: StatFields(1, 80, 80, 900)}
    procs = [P(60, 1, "bash", 5, 60), P(120, 1, "python", 90, 60)]
    # the stat says session 80 (the scan), the classifier reads session 60 (now): never signalled
    assert run(after, procs)[:2] == ([], [120])


def test_a_pid_reused_with_a_new_start_time_is_new():
    after = {1: StatFields(0, 1, 1, 1), 82: StatFields(1, 80, 80, 999), 90: StatFields(1, 90, 80, 610)}
    assert run(after, [], ours=frozenset())[0] == [82]
