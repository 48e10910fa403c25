"""core/allocation: the pure parts (scontrol's lines, gres.conf order, hostlists, standings)."""

from __future__ import annotations

import pytest

from gputop.core import allocation as al
from gputop.core.allocation import Allocation, JobAlloc, gpu_standing, gres_files, parse_jobs
from gputop.core.slurm_jobs import JobRef, JobState

LINE = ("JobId={id} JobName=wrap UserId={user} GroupId=root(0) JobState={state} Restarts=0 "
        "StartTime=2026-12-04T13:08:36 NodeList={nodes} NumNodes=2 JOB_GRES=gpu:2   "
        "Nodes={g1} CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:{i1})   Nodes={g2} CPU_IDs=1 Mem=0 GRES=gpu:a100:2(IDX:{i2}) "
        "MinCPUsNode=1 Features=(null)")


def test_parse_jobs_takes_this_nodes_group_only_and_running_jobs_only():
    text = "\n".join([
        LINE.format(id=7, user="alice(1000)", state="RUNNING", nodes="n[01-02]", g1="n01", i1="3", g2="n02", i2="0-1"),
        LINE.format(id=8, user="bob(1001)", state="COMPLETED", nodes="n02", g1="n02", i1="2", g2="n09", i2="0"),
        LINE.format(id=9, user="eve(1002)", state="SUSPENDED", nodes="n[01-03]", g1="n[01,03]", i1="0", g2="n02",
                    i2="2"),
        "garbage JobId=x JobState=RUNNING",
    ])
    got = {j.job_id: j for j in parse_jobs(text, {"n02"})}
    assert set(got) == {7, 9}
    assert got[7].idx == (0, 1) and got[7].user == "alice" and got[7].uid == 1000 and got[7].since
    assert got[9].idx == (2,)
    assert {j.job_id for j in parse_jobs(text, {"n03"})} == {9}


def test_gres_files_are_in_slurmds_order_and_only_this_nodes():
    conf = """AutoDetect=off
# comment
Name=gpu File=/dev/nvidia[2-3]
NodeName=other Name=gpu File=/dev/nvidia9
Name=gpu File=/dev/nvidia1   # trailing comment
Name=gpu File=/dev/nvidia10
Name=gpu File=/dev/nvidia0
Name=mps Count=100
"""
    assert [g.path for g in gres_files(conf, {"me"})] == [f"/dev/nvidia{i}" for i in (0, 1, 2, 3, 10)]
    typed = "Name=gpu Type=a100 File=/dev/nvidia1\nName=gpu Type=v100x File=/dev/nvidia0\nName=gpu Type=a100 File=/dev/nvidia2\n"
    assert [g.path for g in gres_files(typed, {"me"})] == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"]


def test_hostlists_expand_with_padding_and_are_bounded():
    assert al.expand_hostlist("n[01-03,7],m1") == ["n01", "n02", "n03", "n7", "m1"]  # each range its own width
    assert al.expand_hostlist("r[1-2]c[1-2]") == ["r1c1", "r1c2", "r2c1", "r2c2"]
    with pytest.raises(ValueError):
        al.expand_hostlist("n[0-99999999]")
    with pytest.raises(ValueError):
        al.expand_hostlist("n[a-b]")


class _P:
    def __init__(self, uid):
        self.uid = uid


class _H:
    def __init__(self, pid, gpus, job=None, uid=0, state="RUNNING", source="environ"):
        self.pid, self.gpus, self.proc = pid, gpus, _P(uid)
        self.job = JobRef(job, "batch", uid, source) if job is not None else None
        self.job_state = JobState(job, state) if job is not None else None


def test_standings():
    a7 = Allocation(0, "7", 7, "alice", 1000, None)
    jobs = {7: JobAlloc(7, "alice", 1000, "RUNNING", None, (0,)), 8: JobAlloc(8, "bob", 1001, "RUNNING", None, (1,))}
    by = {0: a7}

    def kind(h, known=True, readable=True):
        return al.standing(h, by, jobs, known, lambda _h: readable).kind

    assert kind(_H(1, (0,), 7, 1000)) == "inside"
    assert kind(_H(1, (0, 2), 7, 1000)) == "outside"  # the worst of its GPUs
    assert kind(_H(1, (2,), 8, 1001)) == "outside"
    assert kind(_H(1, (0,), 8, 1001)) == "squatter"
    assert kind(_H(1, (0,))) == "squatter"
    assert kind(_H(1, (0,)), readable=False) == "unknown"  # its environment is not ours to read
    assert kind(_H(1, (2,))) == "unallocated"
    assert kind(_H(1, (0,), 7, 1000), known=False) == "unknown"
    # An environment claim of another user's job is refused; the cgroup's word is the kernel's.
    assert kind(_H(1, (0,), 7, 1002)) == "squatter"
    assert kind(_H(1, (0,), 7, 1002, source="cgroup")) == "inside"
    # A leftover of an ended job is of no job.
    assert kind(_H(1, (2,), 7, 1000, state="COMPLETED")) == "unallocated"


def test_gpu_standing_is_pure_and_explains():
    kind, why = gpu_standing(3, None, "5", True, None, True)
    assert kind == "outside" and "GPU 3" in why and "job 5" in why


def test_idle_tracker_keeps_the_first_idle_time_until_a_holder_comes():
    t = al.IdleTracker()
    a = {0: Allocation(0, "7", 7, "alice", 1000, 100.0)}
    assert t.update(a, set(), 200.0) == {0: 200.0}
    assert t.update(a, set(), 260.0) == {0: 200.0}
    assert t.update(a, {0}, 300.0) == {}
    assert t.update(a, set(), 310.0) == {0: 310.0}
    b = {0: Allocation(0, "8", 8, "bob", 1001, 305.0)}
    assert t.update(b, set(), 320.0) == {0: 320.0}  # another job's allocation starts again


def test_a_failing_or_slow_scontrol_is_an_error_never_an_empty_allocation():
    class States:
        scontrol, timeout = "/bin/false", 2.0

    src = al.SlurmAllocations(States(), runner=lambda: (-1, "", "scontrol did not answer within 2s"))
    got = src.read()
    assert got.error and "did not answer" in got.error and got.by_minor == {}


@pytest.mark.parametrize("conds,action,why", [
    ('{type: allocation_idle, operator: ">", value: 1h}', "kill", "can only log or notify"),
    ('{type: standing, operator: ==, value: unknown}', "log", "needs one of inside, outside, squatter"),
    ('{type: standing, operator: in, value: squatter}', "log", "needs a list of"),
    ('{type: allocation_idle, operator: ">", value: 1h}, {type: gpu_memory, operator: ">", value: 1GiB}', "log",
     "not gpu_memory"),
])
def test_policy_refuses_allocation_rules_that_cannot_work(conds, action, why):
    from gputop.guard.policy import PolicyError, parse_policy

    with pytest.raises(PolicyError, match=why):
        parse_policy(f"rules: [{{name: r, conditions: [{conds}], action: {action}}}]")


def test_a_gres_conf_root_may_not_trust_makes_the_allocation_unknown(tmp_path, monkeypatch):
    import os

    if os.geteuid() != 0:
        pytest.skip("the trust rule applies to root")
    conf = tmp_path / "etc"
    conf.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    (conf / "slurm.conf").write_text("ClusterName=x\n")
    gres = conf / "gres.conf"
    gres.write_text("Name=gpu File=/dev/nvidia[0-1]\n")
    gres.chmod(0o666)  # anyone could write it
    monkeypatch.setenv("SLURM_CONF", str(conf / "slurm.conf"))
    monkeypatch.setenv("GPUTOP_SLURM_NODE", "n01")
    line = LINE.format(id=7, user="alice(1000)", state="RUNNING", nodes="n01", g1="n01", i1="1", g2="n02", i2="0")

    class States:
        scontrol, timeout = "/bin/false", 2.0

    got = al.SlurmAllocations(States(), runner=lambda: (0, line, "")).read()
    assert got.by_minor == {} and "gres.conf" in got.error and "cannot be used" in got.error
    gres.chmod(0o644)  # root's alone: IDX 1 is /dev/nvidia1 (minor 1 by its name; no such device here)
    got = al.SlurmAllocations(States(), runner=lambda: (0, line, "")).read()
    assert got.error is None and got.by_minor[1][0].job_id == 7 and "IDX 1 = /dev/nvidia1" in got.by_minor[1][1]
    gres.unlink()  # AutoDetect: slurmd's minor order
    got = al.SlurmAllocations(States(), runner=lambda: (0, line, "")).read()
    assert got.error is None and "minor order" in got.by_minor[1][1]


def test_pod_log_directories_count_only_when_root_alone_can_write_them(tmp_path):
    import os

    from gputop.core.pod_allocation import pod_names

    logs = tmp_path / "pods"
    logs.mkdir(mode=0o755)
    (logs / "ml_train-a_0b1c2d3e-0000-4000-8000-000000000001").mkdir()
    (logs / "not-a-pod-dir").mkdir()
    assert pod_names(str(logs)) == {"0b1c2d3e-0000-4000-8000-000000000001": ("ml", "train-a")}
    if os.geteuid() != 0:
        return
    logs.chmod(0o777)  # anyone could make a "namespace_pod_uid" entry
    assert pod_names(str(logs)) == {}
    logs.chmod(0o755)
    os.chown(logs, 65534, 65534)  # nobody's: that user could
    assert pod_names(str(logs)) == {}


def test_after_a_failure_scontrol_is_not_asked_again_at_every_refresh():
    class States:
        scontrol, timeout = "/bin/false", 2.0

    calls, now = [], [100.0]

    def runner():
        calls.append(now[0])
        return -1, "", "scontrol did not answer within 2s"

    src = al.SlurmAllocations(States(), ttl=1.0, clock=lambda: now[0], runner=runner)
    for t in (100.0, 101.5, 105.0, 109.9, 110.1):
        now[0] = t
        assert src.read().error
    assert calls == [100.0, 110.1]
