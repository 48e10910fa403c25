"""The per-user plan (gputop.guard.engine.plan_user_kills): which of a user's processes a per-user kill
takes, on constructed snapshots (pure: no process is touched)."""

from __future__ import annotations

import textwrap

from gputop.backends.base import DeviceSample
from gputop.guard.engine import Engine, plan_user_kills
from gputop.guard.policy import Policy, parse_policy
from gputop.core.orphans import NOT_ORPHAN, PROTECTED, UNKNOWN, Verdict
from gputop.core.procs import ProcInfo
from gputop.core.model import GpuUse, Holder, Snapshot

GIB = 1024**3
AT = 1_796_000_000.0


JUPYTER_KERNEL = ("python", "-m", "ipykernel_launcher", "-f", "kernel.json")  # the default protect_cmdline


def holder(pid, mem, age, user="alice", kind=NOT_ORPHAN, reason="alive", cmdline=None):
    """A holder that started ``age`` seconds before AT (smaller age: newer)."""
    proc = ProcInfo(pid=pid, ppid=1, name=f"job{pid}", cmdline=cmdline or ("python", f"job{pid}.py"),
                    start_time=AT - age, uid=1000, user=user, sid=pid)
    return Holder(pid, (GpuUse(0, "C", mem, 50.0),), proc, (), Verdict(kind, reason), runtime=age)


def snap(*holders):
    return Snapshot(at=AT, host="node", devices=(DeviceSample(index=0, util_gpu=50.0),), holders=holders,
                    roots=(), backends=())


def rule(limit="8GiB", select="newest", ctype="user_memory", action="kill"):
    text = textwrap.dedent(f"""\
        rules:
          - name: cap
            scope: per_user
            select: {select}
            conditions:
              - {{type: {ctype}, operator: ">", value: {limit}}}
            action: {action}
    """)
    return parse_policy(text).rules[0]


def plan(r, s, going=()):
    """The engine's plan for alice (Engine.plan: the rule's order and limit over plan_user_kills)."""
    eng = Engine(Policy(rules=(r,)), record=lambda h: None)
    (a,) = [a for a in eng.assess(r, s) if a.target.user == "alice"]
    return eng.plan(r, a, s, {h.pid: h for h in going})


BIG_NEW = holder(30, 9 * GIB, age=10)  # the newest: 9 GiB
SMALL_1 = holder(20, 1 * GIB, age=100)
SMALL_2 = holder(10, 1 * GIB, age=1000)
BYSTANDER = holder(40, 20 * GIB, age=5, user="bob")  # another user's: never in alice's plan


def pids(hs):
    return [h.pid for h in hs]


def test_newest_alone_is_enough_so_it_is_the_whole_plan():
    p = plan(rule(), snap(BIG_NEW, SMALL_1, SMALL_2, BYSTANDER))
    assert p.reachable and pids(p.chosen) == [30] and p.going == () and p.skipped == ()


def test_protected_newest_that_the_rest_cannot_replace_means_kill_nothing():
    jupyter = holder(30, 9 * GIB, age=10, kind=PROTECTED, reason="jupyter kernel (protect_cmdline)",
                     cmdline=JUPYTER_KERNEL)
    p = plan(rule(), snap(jupyter, SMALL_1, SMALL_2, BYSTANDER))
    assert not p.reachable and p.chosen == ()
    assert [(h.pid, why.split(" ")[0]) for h, why in p.skipped] == [(30, "protected")]


def test_protected_newest_is_skipped_when_the_others_reach_the_limit():
    jupyter = holder(30, 2 * GIB, age=10, kind=PROTECTED, reason="jupyter kernel", cmdline=JUPYTER_KERNEL)
    mid = holder(25, 5 * GIB, age=50)
    p = plan(rule(), snap(jupyter, mid, SMALL_1, SMALL_2))  # 9 GiB: mid (5) alone brings it to 4
    assert p.reachable and pids(p.chosen) == [25] and pids(h for h, _ in p.skipped) == [30]


def test_what_only_the_ancestry_says_does_not_exempt_from_a_per_user_kill():
    """Issue 25: nohup, a parent named tmux or a chain too long to follow decide whether a tree is abandoned,
    not whether the admin's limit applies. Only the process itself matching a protect pattern is skipped."""
    for kind, why in ((UNKNOWN, "ancestor chain is longer than 64"),
                      (PROTECTED, "pid 7 (tmux) matches protect pattern 'tmux'"),
                      (PROTECTED, "pid 30 (job30) ignores SIGHUP: detached with nohup")):
        h = holder(30, 9 * GIB, age=10, kind=kind, reason=why)
        p = plan(rule(), snap(h, SMALL_1, SMALL_2))
        assert p.reachable and pids(p.chosen) == [30] and p.skipped == (), why


def test_a_per_user_reap_keeps_the_orphan_verdict():
    unknown = holder(30, 9 * GIB, age=10, kind=UNKNOWN, reason="session leader cannot be seen")
    p = plan(rule(action="reap"), snap(unknown, SMALL_1, SMALL_2))
    assert not p.reachable and p.chosen == ()
    assert [why.split(" ")[0] for _, why in p.skipped] == ["unknown"]


def test_a_signalled_process_in_its_grace_counts_as_going_and_nothing_more_is_chosen():
    newer = holder(35, 1 * GIB, age=2)  # started after the big one was signalled
    p = plan(rule(), snap(BIG_NEW, SMALL_1, SMALL_2, newer), going=[BIG_NEW])
    assert p.reachable and p.chosen == () and pids(p.going) == [30]
    # without it, the newer small job would be chosen first, and then the big one as well
    p = plan(rule(), snap(BIG_NEW, SMALL_1, SMALL_2, newer))
    assert pids(p.chosen) == [35, 30]


def test_going_that_is_not_enough_is_counted_and_the_rest_is_chosen_without_it():
    s = snap(holder(30, 3 * GIB, age=10), holder(20, 4 * GIB, age=100), holder(10, 4 * GIB, age=1000))
    p = plan(rule(), s, going=[s.holders[0]])  # 11 GiB; 3 going leaves 8... not above: nothing needed
    assert p.chosen == () and p.reachable
    p = plan(rule("7GiB"), s, going=[s.holders[0]])  # 8 GiB without it: one more (the newest left)
    assert pids(p.chosen) == [20] and pids(p.going) == [30]


def test_select_largest_order():
    s = snap(holder(30, 1 * GIB, age=10), holder(20, 6 * GIB, age=100), holder(10, 3 * GIB, age=1000))
    assert pids(plan(rule("5GiB", select="largest"), s).chosen) == [20]
    assert pids(plan(rule("5GiB"), s).chosen) == [30, 20]  # newest first: 1 GiB is not enough alone


def test_process_count_rule():
    s = snap(*(holder(p, GIB, age=100 - p) for p in range(1, 5)))  # pid 4 is the newest
    assert pids(plan(rule("2", ctype="process_count"), s).chosen) == [4, 3]


def test_the_pure_function_with_a_plain_predicate():
    a, b, c = holder(1, 5, age=1), holder(2, 3, age=2), holder(3, 4, age=3)
    size = {1: 5, 2: 3, 3: 4}

    def over(gone):
        return sum(v for k, v in size.items() if k not in gone) > 5  # 12 in all

    p = plan_user_kills([a, b, c], over, why_not=lambda h: "refused" if h.pid == 1 else None)
    assert pids(p.chosen) == [2, 3] and pids(h for h, _ in p.skipped) == [1]
    p = plan_user_kills([a, b, c], over, why_not=lambda h: "refused" if h.pid != 2 else None)
    assert not p.reachable and p.chosen == ()
    assert plan_user_kills([a, b, c], lambda gone: False).chosen == ()


def test_test_policies_shows_the_plan_the_guard_would_carry_out():
    """--test-policies (explain) uses the same plan: the protected newest is not listed as a victim, and
    when the rest cannot reach the limit it says nothing would be killed."""
    from gputop.guard.engine import explain

    jupyter = holder(30, 2 * GIB, age=10, kind=PROTECTED, reason="jupyter kernel", cmdline=JUPYTER_KERNEL)
    mid = holder(25, 5 * GIB, age=50)
    (entry,) = explain(Policy(rules=(rule(),)), snap(jupyter, mid, SMALL_1, SMALL_2))
    (t,) = [t for t in entry["targets"] if t["user"] == "alice"]
    assert "pid 25 (job25" in t["verdict"] and "pid 30 (job30, 2" not in t["verdict"], t["verdict"]
    assert "may not take pid 30" in t["verdict"]
    jupyter = holder(30, 9 * GIB, age=10, kind=PROTECTED, reason="jupyter kernel", cmdline=JUPYTER_KERNEL)
    (entry,) = explain(Policy(rules=(rule(),)), snap(jupyter, SMALL_1, SMALL_2))
    (t,) = [t for t in entry["targets"] if t["user"] == "alice"]
    assert "nothing: the user stays over the limit" in t["verdict"], t["verdict"]
