"""Every condition type and every operator, on constructed snapshots (pure: no processes)."""

from __future__ import annotations

import datetime as dt

import pytest

from gputop.backends.base import DeviceSample
from gputop.guard.conditions import Facts, Target, evaluate
from gputop.guard.policy import parse_policy
from gputop.core.orphans import NOT_ORPHAN, ORPHAN, Verdict
from gputop.core.procs import ProcInfo
from gputop.core.model import GpuUse, Holder, Snapshot
from gputop.core.allocation import Allocation, AllocationView, Standing

GIB = 1024**3
# Monday 2026-11-30 14:30 local time
AT = dt.datetime(2026, 11, 30, 14, 30).timestamp()


def holder(pid, name="python", cmd=("python", "train.py"), user="alice", gpu=0, mem=4 * GIB, sm=50.0,
           runtime=600.0, orphan=False):
    proc = ProcInfo(pid=pid, ppid=1, name=name, cmdline=tuple(cmd), start_time=AT - runtime, uid=1000,
                    user=user, sid=pid)
    v = Verdict(ORPHAN, "session leader gone", root=pid) if orphan else Verdict(NOT_ORPHAN, "alive")
    gpus = gpu if isinstance(gpu, tuple) else (gpu,)
    return Holder(pid, tuple(GpuUse(g, "C", mem, sm) for g in gpus), proc, (), v, runtime=runtime)


def snap(*holders, util=(70.0, 10.0), used=(10 * GIB, None), allocation=None):
    devs = tuple(DeviceSample(index=i, util_gpu=u, memory_used=m) for i, (u, m) in enumerate(zip(util, used)))
    return Snapshot(at=AT, host="node", devices=devs, holders=holders, roots=(), backends=(), allocation=allocation)


def cond(ctype, op, value, **extra):
    import yaml

    body = {"type": ctype, "operator": op, "value": value, **extra}
    text = yaml.safe_dump({"rules": [{"name": "r", "conditions": [body], "action": "log"}]})
    return parse_policy(text).rules[0].conditions[0]


def check(c, h, s):
    return evaluate(c, Target.process(h), s, Facts.of(s))


A = holder(101, name="xmrig", cmd=("./xmrig", "-o", "stratum+tcp://pool:3333"), user="mallory", sm=99.0,
           mem=300 * 1024**2, runtime=7200.0, orphan=True, gpu=1)
B = holder(102, user="alice", mem=5 * GIB, sm=None, gpu=0)  # SM% unknown: device util (70%) is used
C = holder(103, user="alice", mem=2 * GIB, sm=20.0, gpu=(0, 1))  # 2 GiB on each of 2 GPUs
# GPU 0 is allocated to alice's job 7: B is inside it, A squats on GPU 1... (standings as the sampler makes them)
ALLOC = AllocationView("slurm", {0: Allocation(0, "7", 7, "alice", 1000, AT - 3600)},
                       {101: Standing("squatter", "no job"), 102: Standing("inside", "its job"),
                        103: Standing("outside", "GPU 1")}, {0: AT - 600})
S = snap(A, B, C, allocation=ALLOC)

CASES = [
    # process_name: every string operator
    ("process_name", "==", "xmrig", A, True), ("process_name", "==", "xmri", A, False),
    ("process_name", "!=", "xmrig", B, True), ("process_name", "contains", "MRI", A, True),
    ("process_name", "contains_any", ["ethminer", "xmrig"], A, True),
    ("process_name", "contains_any", ["ethminer", "t-rex"], A, False),
    ("process_name", "matches", r"^x.*g$", A, True), ("process_name", "matches", r"^py", A, False),
    ("process_name", "in", ["python", "java"], B, True), ("process_name", "not_in", ["python"], B, False),
    # cmdline
    ("cmdline", "contains", "stratum+tcp://", A, True), ("cmdline", "contains", "stratum", B, False),
    ("cmdline", "matches", r"train\.py$", B, True),
    # user
    ("user", "==", "mallory", A, True), ("user", "in", ["alice", "bob"], A, False),
    ("user", "not_in", ["alice", "bob"], A, True), ("user", "contains_any", ["mal"], A, True),
    # gpu_utilization: process SM% where known, else the device's
    ("gpu_utilization", ">", 95, A, True), ("gpu_utilization", ">=", 99, A, True),
    ("gpu_utilization", "<", 95, A, False), ("gpu_utilization", "<=", 20, C, True),
    ("gpu_utilization", "==", 70, B, True), ("gpu_utilization", "!=", 70, B, False),
    # gpu_memory (per process), with units
    ("gpu_memory", ">", "4GiB", B, True), ("gpu_memory", ">", "4GiB", C, False),
    ("gpu_memory", ">=", "4GiB", C, True), ("gpu_memory", "<", "512MiB", A, True),
    ("gpu_memory", "==", 4 * GIB, C, True), ("gpu_memory", ">", "5GB", B, True),  # 5 GiB > 5 GB
    # user_memory: the user's total across GPUs (alice: 9 GiB)
    ("user_memory", ">", "8GiB", B, True), ("user_memory", ">", 8589934592, A, False),
    ("user_memory", "<=", "9GiB", C, True),
    # process_count: per user
    ("process_count", ">=", 2, B, True), ("process_count", ">", 1, A, False), ("process_count", "==", 1, A, True),
    # runtime
    ("runtime", ">", "1h", A, True), ("runtime", "<", "15m", B, True), ("runtime", ">=", 601, B, False),
    # orphan
    ("orphan", "==", True, A, True), ("orphan", "==", True, B, False), ("orphan", "!=", True, B, True),
    # gpu: list of indexes
    ("gpu", "in", [1, 2], A, True), ("gpu", "in", [1], B, False), ("gpu", "not_in", [1], B, True),
    ("gpu", "not_in", [1], C, False), ("gpu", "==", 0, C, True), ("gpu", "!=", 0, A, True),
    # time_window (Monday 14:30)
    ("time_window", "in", {"hours": "09:00-17:00", "weekdays": "mon-fri"}, A, True),
    ("time_window", "in", {"hours": "22:00-06:00"}, A, False),
    ("time_window", "not_in", {"weekdays": ["sat", "sun"]}, A, True),
    ("time_window", "not_in", {"hours": [9, 17]}, A, False),
    # standing (issue 29): the holder's, against its GPUs' allocation
    ("standing", "==", "squatter", A, True), ("standing", "==", "squatter", B, False),
    ("standing", "!=", "inside", C, True), ("standing", "in", ["outside", "squatter"], C, True),
    ("standing", "not_in", ["inside"], B, False),
    # allocation_idle is measured on an allocated GPU, never on a process (tests/unit/test_allocation_guard.py)
    ("allocation_idle", ">", "5m", B, False),
    # unexplained_memory: GPU 0 uses 10 GiB, its listed holders 7 (B 5, C 2): 3 GiB unexplained; GPU 1's use
    # is unknown, so A's is unknown (never acted on); C's is its GPUs' largest
    ("unexplained_memory", ">", "2GiB", B, True), ("unexplained_memory", ">", "2GiB", A, False),
    ("unexplained_memory", "<", "4GiB", C, True), ("unexplained_memory", "==", 3 * GIB, B, True),
    # source: how the holder was found (these are listed: "nvml")
    ("source", "==", "nvml", A, True), ("source", "==", "device file", A, False),
    ("source", "in", ["device file", "fdinfo"], B, False), ("source", "!=", "device file", C, True),
]


@pytest.mark.parametrize("ctype,op,value,h,expected", CASES,
                         ids=[f"{c[0]} {c[1]} {c[2]!r} pid{c[3].pid}" for c in CASES])
def test_condition(ctype, op, value, h, expected):
    out = check(cond(ctype, op, value), h, S)
    assert out.ok is expected, out.detail


def test_every_type_and_operator_is_covered():
    from gputop.guard.policy import CONDITION_TYPES, OPERATORS

    assert {c[0] for c in CASES} == set(CONDITION_TYPES)
    assert {c[1] for c in CASES} == set(OPERATORS)


def test_gpu_utilization_says_which_source_was_used():
    a = check(cond("gpu_utilization", ">", 95), A, S)
    b = check(cond("gpu_utilization", ">", 50), B, S)
    assert a.measured.source == "process" and "process SM%" in a.detail
    assert b.measured.source == "device" and "device GPU 0 utilization; process SM% unknown" in b.detail


def test_unknown_values_never_satisfy():
    u = holder(104, mem=None, sm=None, gpu=0)
    s = snap(u, util=(None,))
    for c in (cond("gpu_memory", "<", "1GiB"), cond("gpu_memory", "!=", 5),
              cond("gpu_utilization", "<", 100), cond("user_memory", "<", "1GiB")):
        out = check(c, u, s)
        assert out.ok is False and "unknown" in out.detail


def test_user_memory_is_per_user_not_per_process():
    facts = Facts.of(S)
    assert facts.user_memory == {"mallory": 300 * 1024**2, "alice": 9 * GIB}
    assert facts.user_count == {"mallory": 1, "alice": 2}
    out = evaluate(cond("user_memory", ">", "8GiB"), Target.for_user("alice"), S, facts)
    assert out.ok and "9.0GiB" in out.detail
