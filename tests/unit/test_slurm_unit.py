"""Slurm: scontrol output, job states and their cache, GPU lists, tree roots, and the job rule for orphans."""

from __future__ import annotations

import os
import stat
import time

import pytest

from gputop.core import slurm_jobs as slurm
from gputop.core.orphans import NOT_ORPHAN, ORPHAN, PROTECTED, UNKNOWN, Verdict, classify, compile_protect, slurm_job_rule
from gputop.core.procs import ProcInfo
from gputop.core.slurm_jobs import JobProcess, JobRef, JobState, JobStates

SHOW = ("JobId=42 JobName=train UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A Priority=1 "
        "JobState=RUNNING Reason=None Dependency=(null) Command=/home/alice/run x=y NodeList=n1")


def test_parse_show_job_and_states():
    assert slurm.parse_show_job(SHOW)["JobState"] == "RUNNING"
    assert slurm.state_from_output(42, 0, SHOW, "").state == "RUNNING"
    st = slurm.state_from_output(42, 0, SHOW.replace("RUNNING", "COMPLETED"), "")
    assert st.ended and st.describe() == "Slurm job 42 ended: COMPLETED"
    gone = slurm.state_from_output(7, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
    assert gone.state == slurm.FORGOTTEN and gone.ended is True and "Invalid job id" in gone.describe()
    down = slurm.state_from_output(7, 1, "", "slurm_load_jobs error: Unable to contact slurm controller\n")
    assert down.state is None and down.ended is None and "Unable to contact" in down.detail
    assert JobState(1, "COMPLETING").ended and not JobState(1, "SUSPENDED").ended
    assert JobState(1, "PENDING").ended is False


def test_job_states_cache_per_refresh_and_assume():
    calls = []
    now = [0.0]

    def runner(j):
        calls.append(j)
        return JobState(j, "RUNNING", "fake")

    js = JobStates(runner=runner, ttl=1.0, clock=lambda: now[0])
    assert js.get_many([1, 2, 1])[2].state == "RUNNING"
    js.get(1)
    assert sorted(calls) == [1, 2]
    now[0] = 1.5
    js.get(1)
    assert sorted(calls) == [1, 1, 2]
    js.assume(3, "COMPLETING", "epilog")
    assert js.get(3).ended and 3 not in calls


def _script(tmp_path, body: str) -> str:
    p = tmp_path / "scontrol"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_scontrol_missing_slow_and_real_output(tmp_path):
    missing = JobStates(scontrol=str(tmp_path / "nope"))
    st = missing.get(5)
    assert st.state is None and "cannot run" in st.detail
    slow = JobStates(scontrol=_script(tmp_path, "exec sleep 5\n"), timeout=0.3)
    t = time.monotonic()
    st = slow.get(5)
    assert st.state is None and "did not answer" in st.detail and time.monotonic() - t < 3
    ok = JobStates(scontrol=_script(tmp_path, f"echo '{SHOW}'\n"))
    assert ok.get(42).state == "RUNNING"


def test_no_scontrol_on_path_is_unknown(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("GPUTOP_SCONTROL", raising=False)
    st = JobStates().get(9)
    assert st.state is None and "scontrol not found" in st.detail


def test_gpu_lists():
    assert slurm.parse_index_list("0,2-3") == [0, 2, 3]
    with pytest.raises(ValueError):
        slurm.parse_index_list("GPU-5140a7ed")
    detail = "   Nodes=n1 CPU_IDs=0-1 Mem=0 GRES=gpu:a100:2(IDX:1,3)\n"
    assert slurm.gres_gpus(detail) == [1, 3]
    assert slurm.gres_gpus("   Nodes=n1 CPU_IDs=0 Mem=0 GRES=\n") is None
    assert slurm.job_gpus({"SLURM_JOB_GPUS": "0,1"}, 4) == ([0, 1], "SLURM_JOB_GPUS")
    # UUIDs in CUDA_VISIBLE_DEVICES are not indexes: fall through to the next source.
    gpus, why = slurm.job_gpus({"CUDA_VISIBLE_DEVICES": "GPU-abc"}, None)
    assert gpus is None and "no SLURM_JOB_GPUS" in why


def _p(pid, ppid, sid, uid=1001, name="python", start=100.0, sighup=False):
    return ProcInfo(pid=pid, ppid=ppid, name=name, cmdline=(name,), start_time=start, uid=uid, sid=sid,
                    state="S", sighup_ignored=sighup)


def test_tree_roots_holders_first():
    ref = JobRef(5)
    members = [JobProcess(_p(10, 1, 10), ref), JobProcess(_p(11, 10, 10), ref), JobProcess(_p(20, 1, 20), ref),
               JobProcess(_p(30, 1, 30), ref)]
    assert slurm.tree_roots(members, first=[30, 11]) == [10, 30, 20]


class Table(dict):
    def get(self, pid):
        return super().get(pid)


def _table(*procs):
    return Table({p.pid: p for p in procs})


def test_job_rule_running_job_is_not_an_orphan_though_its_session_leader_is_gone():
    # A job's helper that double-forked: its session leader (the batch shell, 50) is gone, its parent is init.
    t = _table(_p(1, 0, 1, uid=0, name="init"), _p(200, 1, 50))
    session = classify(200, t)
    assert session.kind == ORPHAN  # what the session rule alone says
    job_of = {200: JobRef(42, "batch", 1001, "environ")}.get
    v = classify(200, t, job_of=lambda m: job_of(m.pid), job_state=lambda j: JobState(j, "RUNNING"))
    assert v.kind == NOT_ORPHAN and "Slurm job 42 is RUNNING" in v.reason


def test_job_rule_ended_job_is_an_orphan_whatever_its_session_and_root_is_topmost_job_member():
    # A setsid leftover (its own session leader: the session rule says not an orphan) with a child holder.
    t = _table(_p(1, 0, 1, uid=0, name="init"), _p(300, 1, 300, name="launcher"), _p(301, 300, 300))
    assert classify(301, t).kind == NOT_ORPHAN
    jobs = {300: JobRef(42), 301: JobRef(42)}
    v = classify(301, t, job_of=lambda m: jobs.get(m.pid), job_state=lambda j: JobState(j, "COMPLETED"))
    assert v.kind == ORPHAN and v.reason.startswith("Slurm job 42 ended: COMPLETED") and v.root == 300
    # Forgotten by slurmctld: ended too.
    v = classify(301, t, job_of=lambda m: jobs.get(m.pid), job_state=lambda j: JobState(j, slurm.FORGOTTEN))
    assert v.kind == ORPHAN and "no longer knows it" in v.reason


def test_job_rule_root_stops_at_another_job_or_user():
    t = _table(_p(1, 0, 1, uid=0, name="init"), _p(400, 1, 400, uid=0, name="slurmstepd"), _p(401, 400, 400))
    jobs = {400: JobRef(42), 401: JobRef(42)}
    v = classify(401, t, job_of=lambda m: jobs.get(m.pid), job_state=lambda j: JobState(j, "COMPLETING"))
    assert v.kind == ORPHAN and v.root == 401  # the root-owned parent is never part of the user's tree


def test_job_rule_protect_patterns_apply_but_not_the_nohup_mark():
    t = _table(_p(1, 0, 1, uid=0, name="init"), _p(500, 1, 500, sighup=True))
    jobs = {500: JobRef(42)}
    ended = dict(job_of=lambda m: jobs.get(m.pid), job_state=lambda j: JobState(j, "COMPLETED"))
    assert classify(500, t, **ended).kind == ORPHAN
    v = classify(500, t, protect=compile_protect(["python"]), **ended)
    assert v.kind == PROTECTED and v.orphan_reason.startswith("Slurm job 42 ended")
    running = dict(job_of=lambda m: jobs.get(m.pid), job_state=lambda j: JobState(j, "RUNNING"))
    assert classify(500, t, **running).kind == PROTECTED  # a live job's nohup'd process: as anywhere


def test_job_rule_unknown_state_never_makes_an_orphan():
    t = _table(_p(1, 0, 1, uid=0, name="init"), _p(200, 1, 50))
    v = classify(200, t, job_of=lambda m: JobRef(42), job_state=lambda j: JobState(j, None, "scontrol not found"))
    assert v.kind == UNKNOWN and "state unknown" in v.reason
    t2 = _table(_p(1, 0, 1, uid=0, name="init"), _p(600, 1, 600))
    v = classify(600, t2, job_of=lambda m: JobRef(42), job_state=lambda j: JobState(j, None, "timeout"))
    assert v.kind == NOT_ORPHAN  # the session rule stands when it says "not an orphan"


def test_slurm_job_rule_leaves_an_unwalkable_chain_alone():
    v = Verdict(UNKNOWN, "ancestor chain has a cycle at pid 3")
    assert slurm_job_rule(v, [], JobRef(1), JobState(1, "COMPLETED"), lambda m: True) is v


def test_tui_groups_by_slurm_job_and_shows_a_job_column():
    import dataclasses

    from gputop.tui.process_tree import WIDE, column_level, row_cells
    from gputop.tui.rows import GROUP_JOB, build, walk
    from tests.tui.helpers import frozen_snapshot

    snap = frozen_snapshot()
    jobs = {1101: (JobRef(42, "0"), JobState(42, "RUNNING")), 2001: (JobRef(7), JobState(7, "COMPLETED"))}
    holders = tuple(dataclasses.replace(h, job=jobs[h.pid][0], job_state=jobs[h.pid][1]) if h.pid in jobs else h
                    for h in snap.holders)
    snap = dataclasses.replace(snap, holders=holders)
    groups = build(snap, grouping=GROUP_JOB)
    assert [g.key for g in groups] == ["job7", "job42", "nojob"]
    assert groups[0].title.startswith("Slurm job 7 (ended: COMPLETED)")
    assert groups[1].title.startswith("Slurm job 42 (RUNNING)")
    assert [n.pid for n in walk(groups[1:2]) if n.kind == "holder"] == [1101]
    node = next(n for n in walk(groups) if n.kind == "holder" and n.pid == 1101)
    layout = column_level(200, False, None, jobs=True)
    assert layout == (WIDE, None, True)
    cells = row_cells(node, 1, 3, False, layout)[4]
    assert cells[-1].strip() == "42.0"  # the JOB column, just before COMMAND
    assert len(row_cells(node, 1, 3, False, False)[4]) == len(cells) - 1  # no Slurm: no JOB column


# ---- requeued jobs: runs told apart by the restart count ----------------------------------------

def test_restarts_parsed_and_an_earlier_run_has_ended():
    st = slurm.state_from_output(42, 0, SHOW.replace("JobState=RUNNING", "JobState=RUNNING Restarts=2"), "")
    assert st.restarts == 2 and st.ended is False
    assert slurm.state_from_output(42, 0, SHOW, "").restarts is None  # not printed: unknown
    old = st.for_ref(JobRef(42, run=0))
    assert old.earlier_run and old.ended is True and "was requeued: this process is from run 0" in old.describe()
    assert old.to_dict()["earlier_run"] is True
    assert st.for_ref(JobRef(42, run=2)) is st and st.for_ref(JobRef(42, run=3)) is st  # this run (or later)
    assert st.for_ref(JobRef(42, run=None)) is st  # the process's run unknown: the job's state stands
    assert JobState(42, "RUNNING").for_ref(JobRef(42, run=0)).ended is False  # the job's restarts unknown
    assert JobState(42, None, "down", restarts=1).for_ref(JobRef(42, run=0)).ended is None  # unknown stays


def test_restart_count_from_the_environment(tmp_path):
    def env(pid, data: bytes):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "environ").write_bytes(data)

    env(10, b"PATH=/bin\0SLURM_JOB_ID=42\0SLURM_RESTART_COUNT=3\0")
    env(11, b"SLURM_JOB_ID=42\0")  # the first run: slurmd sets no SLURM_RESTART_COUNT
    env(12, b"SLURM_JOB_ID=42\0SLURM_RESTART_COUNT=x\0")
    env(13, b"")  # unreadable in effect (a zombie, a kernel thread)
    env(14, b"XSLURM_RESTART_COUNT=5\0SLURM_JOB_ID=42\0")
    assert slurm.restart_count(10, str(tmp_path)) == 3
    assert slurm.restart_count(11, str(tmp_path)) == 0
    assert slurm.restart_count(12, str(tmp_path)) is None
    assert slurm.restart_count(13, str(tmp_path)) is None
    assert slurm.restart_count(14, str(tmp_path)) == 0
    assert slurm.restart_count(99, str(tmp_path)) is None  # gone
    ref = slurm.process_job(10, str(tmp_path))
    assert ref is not None and ref.job_id == 42 and ref.run == 3


def test_classify_a_leftover_of_an_earlier_run_of_a_running_job_is_an_orphan():
    t = _table(_p(1, 0, 1, uid=0, name="init"), _p(200, 1, 50), _p(201, 1, 60))
    jobs = {200: JobRef(42, run=0), 201: JobRef(42, run=1)}
    running = dict(job_of=lambda m: jobs.get(m.pid), job_state=lambda j: JobState(j, "RUNNING", restarts=1))
    old = classify(200, t, **running)
    assert old.kind == ORPHAN and "Slurm job 42 was requeued" in old.reason and old.root == 200
    assert classify(201, t, **running).kind == NOT_ORPHAN


# ---- the epilog's verdict (pure) -------------------------------------------------------------------

def _left(pid, name="w", start=1.0):
    from gputop.core.procs import ProcInfo

    return ProcInfo(pid=pid, ppid=1, name=name, cmdline=(name,), start_time=start, uid=1000, user="u")


def _member(pid, start=1.0):
    return {"pid": pid, "ppid": 1, "start_time": start, "name": "w", "cmdline": ["w"], "user": "u", "uid": 1000}


def _result(ok, survivors=(), left_alone=(), members=(), planned=(), released=()):
    """A reap-group result as the executor leaves it: ``members`` signalled (pid, start 1.0), ``planned``
    the first plan's members, ``survivors`` the pids it saw alive at its end."""
    from gputop.actions.common import ActionResult

    details = {"survivors": list(survivors), "left_alone": list(left_alone), "released": list(released),
               "members": [_member(p) for p in members],
               "plan": {"members": [_member(p) for p in planned], "left_alone": []}}
    return ActionResult("reap-group", ok, "reaped" if ok else "still-alive", "m", details=details)


def test_epilog_fails_when_a_signalled_process_that_holds_no_gpu_survives():
    from gputop.commands.slurm import epilog_verdict

    ok, errors = epilog_verdict(7, [_left(10, "stuck")], [], [_result(False, survivors=[10], members=[10])])
    assert not ok
    assert errors and "pid 10 (stuck) survived the epilog" in errors[0] and not errors[0].startswith("warning")


def test_epilog_fails_when_the_reap_itself_failed_and_the_leftovers_are_still_there():
    from gputop.actions.common import ActionResult
    from gputop.commands.slurm import epilog_verdict

    failed = ActionResult("reap-group", False, "failed", "no permission to signal", details={})
    ok, errors = epilog_verdict(7, [_left(11)], [], [failed])
    assert not ok and "no permission" in errors[0]


def test_epilog_warns_only_for_a_survivor_left_alone_on_purpose_that_holds_no_gpu():
    from gputop.commands.slurm import epilog_verdict

    left = {"pid": 12, "subtree": [12], "rule": "protect", "reason": "protected by pattern 'sshd'"}
    ok, errors = epilog_verdict(7, [_left(12, "sshd")], [], [_result(True, left_alone=[left])])
    assert ok and errors == [
        "warning: pid 12 (sshd) of job 7 is still alive (it holds no GPU): left alone (protect): protected by "
        "pattern 'sshd'"]
    # Past the deadline nothing was targeted: a CPU-only leftover is a warning, a GPU holder a failure.
    assert epilog_verdict(7, [_left(13)], [], [])[0]
    holder = type("H", (), {"pid": 14, "name": "python", "user": "u"})()
    ok, errors = epilog_verdict(7, [_left(14, "python")], [holder], [])
    assert not ok and "GPU holder pid 14" in errors[0]


def test_epilog_fails_when_a_member_survives_that_the_reap_counted_gone():
    # The executor's survivors name nothing (it saw the member gone, or lost track of it), yet the same
    # process (pid and start time) is alive after the reap: a target survived, the node is drained.
    from gputop.commands.slurm import epilog_verdict

    ok, errors = epilog_verdict(7, [_left(10, "stuck")], [], [_result(True, members=[10], planned=[10])])
    assert not ok and "pid 10 (stuck) survived the epilog: reaped" in errors[0]
    # A member of the plan it could not signal (no permission) is a target as well.
    ok, _ = epilog_verdict(7, [_left(11)], [], [_result(False, planned=[11])])
    assert not ok


def test_epilog_does_not_blame_a_process_that_reuses_a_reaped_members_pid():
    # The reap saw pid 10 alive at its end (still-alive), then it died and a new process of the job took
    # its PID (start time 7.0): that process was never a target; it holds no GPU, so it is a warning.
    from gputop.commands.slurm import epilog_verdict

    result = _result(False, survivors=[10], members=[10, 12], planned=[10, 12])
    ok, errors = epilog_verdict(7, [_left(10, "new", start=7.0)], [], [result])
    assert ok, errors
    assert errors == ["warning: pid 10 (new) of job 7 is still alive (it holds no GPU): the reap did not take it "
                      "(it started after the reap, or it reuses a reaped process's PID)"]
    # The same process as the target (same start) fails the epilog.
    assert not epilog_verdict(7, [_left(10, "stuck")], [], [result])[0]


def test_epilog_warns_for_a_member_released_on_re_planning():
    # Planned first, then left alone on purpose when the frozen group was planned again: not a target.
    from gputop.commands.slurm import epilog_verdict

    left = {"pid": 10, "subtree": [], "rule": "protected", "reason": "protected by pattern 'keep'"}
    ok, errors = epilog_verdict(7, [_left(10)], [], [_result(True, planned=[10, 12], members=[12],
                                                             released=[10], left_alone=[left])])
    assert ok and errors[0].startswith("warning: pid 10") and "left alone (protected)" in errors[0]


def test_epilog_succeeds_when_nothing_is_left():
    from gputop.commands.slurm import epilog_verdict

    assert epilog_verdict(7, [], [], [_result(True)]) == (True, [])
