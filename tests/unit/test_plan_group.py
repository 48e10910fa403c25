"""plan_group: the plan for a group known by membership (a finished Slurm job's leftovers). Pure."""

from __future__ import annotations

from gputop.actions.plan import Rules, plan_group
from gputop.core.orphans import compile_protect, classify
from tests.unit.test_reap_plan import INIT, FixtureTable, P


def _rules(table, holders=(), never=frozenset({4242}), protect=None):
    pat = compile_protect(protect or [])
    return Rules(lambda pid: classify(pid, table, protect=pat), frozenset(never), frozenset(holders), table.hidden)


def test_every_member_of_the_group_is_planned_parents_first_with_their_children():
    # Two leftovers of the job in dead sessions (80, 90), one with a child outside the group (no job env).
    t = FixtureTable(INIT, P(81, 1, "bash", 50, 80), P(82, 81, "python", 60, 80), P(83, 82, "sleep", 61, 80),
                     P(91, 1, "python", 70, 90), P(60, 1, "bash", 5, 60), P(61, 60, "python", 6, 60))
    plan = plan_group(t, [82, 81, 91], t[81], _rules(t, holders={82}))
    assert plan.pids == (81, 91, 82, 83) and plan.holders == (82,) and plan.refusal is None
    assert plan.root is None and not plan.left_alone  # 60/61 (not in the group, not under it) are not looked at


def test_protected_other_user_and_never_are_left_alone_with_their_subtree_and_block_nothing():
    t = FixtureTable(INIT, P(81, 1, "tmux", 50, 80), P(82, 81, "python", 60, 80), P(91, 1, "python", 70, 90),
                     P(92, 1, "python", 71, 80, uid=1001), P(4242, 1, "gputop", 72, 93))
    plan = plan_group(t, [81, 82, 91, 92, 4242], t[91], _rules(t, protect=["tmux"]))
    assert plan.pids == (91,) and plan.refusal is None
    rules = {e.pid: e.rule for e in plan.left_alone}
    assert rules == {81: "protected", 92: "other-user", 4242: "never"}
    assert next(e for e in plan.left_alone if e.pid == 81).subtree == (82,)


def test_gone_and_zombie_members_are_skipped():
    t = FixtureTable(INIT, P(81, 1, "bash", 50, 80, state="Z"), P(91, 1, "python", 70, 90))
    plan = plan_group(t, [81, 91, 12345], t[91], _rules(t))
    assert plan.pids == (91,)


def test_a_member_under_a_top_left_alone_is_left_alone_even_through_a_process_outside_the_group():
    # 81 (protected, in the group) -> 82 (not in the group: its environment was cleared) -> 83 (in the
    # group again). 83 is not a top: it is under 81, and left alone with 81's subtree.
    t = FixtureTable(INIT, P(81, 1, "tmux", 50, 80), P(82, 81, "env", 60, 80), P(83, 82, "python", 61, 80),
                     P(91, 1, "python", 70, 90))
    plan = plan_group(t, [81, 83, 91], t[91], _rules(t, protect=["tmux"]))
    assert plan.pids == (91,)
    assert [(e.pid, e.subtree) for e in plan.left_alone] == [(81, (82, 83))]


def test_a_round_with_known_members_takes_only_new_ones_under_the_same_rule():
    # The executor's rounds call plan_group with what they track (``known``): a known top is not listed
    # again, a new top is judged, and a member under a top left alone stays left alone though its own
    # verdict (here: an orphan, judged alone) would let it be signalled.
    from gputop.core.orphans import ORPHAN, PROTECTED, Verdict

    t = FixtureTable(INIT, P(81, 1, "keep", 50, 80), P(82, 81, "python", 60, 80), P(91, 1, "python", 70, 90),
                     P(92, 91, "python", 71, 90), P(95, 1, "python", 72, 95))
    verdicts = {81: Verdict(PROTECTED, "protected by pattern 'keep'")}
    rules = Rules(lambda pid: verdicts.get(pid, Verdict(ORPHAN, "orphan", root=pid)), frozenset({4242}),
                  frozenset(), t.hidden)
    plan = plan_group(t, [81, 82, 91, 92, 95], t[91], rules, known={91, 92})
    assert plan.pids == (95,)
    assert [(e.pid, e.rule, e.subtree) for e in plan.left_alone] == [(81, "protected", (82,))]
    assert plan_group(t, [81, 82, 91, 92, 95], t[91], rules).pids == (91, 95, 92)
