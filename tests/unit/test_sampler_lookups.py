"""The Snapshot is a value (data only); an action that judges processes again takes the ownership and Slurm
lookups from the sampler (``Sampler.lookups()``), so that it judges them as the snapshot's verdicts did."""

from __future__ import annotations

import dataclasses

import pytest

from gputop.actions.reap import make_rules
from gputop.core.config import Config
from gputop.core.procs import IS_LINUX, ProcTable
from gputop.core.sampler import LockedSampler
from gputop.core.verdicts import Lookups
from tests.unit.test_verdict_memo import HOLDER, INIT, LEADER, PARENT, fresh, host, sampler  # noqa: F401

pytestmark = pytest.mark.skipif(not IS_LINUX, reason="a fixture /proc is read the Linux way")


@pytest.fixture
def service_holder(host):  # noqa: F811
    """An orphaned tree (its session leader is gone) whose holder runs in a systemd service."""
    host.kill(LEADER)
    host.write_proc(PARENT, INIT, LEADER, "python", start=60, cmd=["python", "train.py"])
    host.write_proc(HOLDER, PARENT, LEADER, "python", start=70, cmd=["python", "worker.py"],
                    cgroup="0::/system.slice/train.service\n")
    return host


def test_a_snapshot_holds_data_and_no_sampler_functions(service_holder):
    snap = sampler(service_holder).sample()
    fields = {f.name: getattr(snap, f.name) for f in dataclasses.fields(snap)}
    assert "hooks" not in fields
    assert not [k for k, v in fields.items() if callable(v)], fields


def test_lookups_are_classifys_keyword_arguments(service_holder):
    s = sampler(service_holder)
    look = s.lookups()
    assert set(look.kwargs()) == {"owner_of", "job_of", "job_state"}
    assert Lookups(job_state=look.job_state).kwargs() == {"job_state": look.job_state}
    assert Lookups().kwargs() == {}


@pytest.mark.parametrize("wrap", [False, True], ids=["sampler", "locked-sampler"])
def test_the_reap_planner_judges_with_the_samplers_lookups(service_holder, wrap):
    s = sampler(service_holder)
    snap = s.sample()
    assert snap.holder(HOLDER).verdict.kind == "not-orphan"  # systemd manages it: the owner rule
    table = ProcTable(str(service_holder.proc))
    rules = make_rules(Config(), "posix", table, snap, sampler=LockedSampler(s) if wrap else s)
    assert rules.verdict(HOLDER) == snap.holder(HOLDER).verdict == fresh(service_holder, HOLDER, sampler_=s)
    assert rules.owner(HOLDER) and "train.service" in rules.owner(HOLDER)
    # Without the sampler the planner has no owner to read, and would judge the holder differently: the
    # lookups are what makes the two agree.
    bare = make_rules(Config(), "posix", table, snap)
    assert bare.verdict(HOLDER).kind == "orphan" and bare.owner(HOLDER) is None
