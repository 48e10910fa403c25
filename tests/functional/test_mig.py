"""MIG (issue 30) against the fake libnvidia-ml.so.1: the fake answers nvidia-ml-py as nvml.h says, nvitop lists
its instances, and gputop's NVML backend, status table and JSON show each MIG device under its GPU with its
holders placed on it and utilisation N/A (never 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_gputop
from tests.fakenvml.build import compiler
from tests.functional.test_nvml_backend import _env, fake_libs, nvml, run_py  # noqa: F401 (fixtures)

GiB = 1 << 30

pytestmark = pytest.mark.skipif(compiler() is None, reason="gcc is needed to build the fake NVML library")


def h200(**kw) -> dict:
    """An H200 split into 3g.71gb + 1g.18gb + 1g.18gb, as `nvidia-smi mig -cgi 9,19,19 -C` makes it."""
    return {"name": "NVIDIA H200", "memory_total": 141 * GiB, "mig": True, "mig_devices": [
        {"gi": 1, "ci": 0, "profile": "3g.71gb", "memory_total": 71 * GiB},
        {"gi": 5, "ci": 0, "profile": "1g.18gb", "memory_total": 18 * GiB},
        {"gi": 6, "ci": 0, "profile": "1g.18gb", "memory_total": 18 * GiB,
         "uuid": "MIG-11111111-2222-3333-4444-555555555555"},
    ], **kw}


def layout(procs, **kw):
    """Two holders on two instances of GPU 0 (with SM% in the config, which MIG must not report), one on a
    plain GPU 1."""
    a, b, c = procs.sleeper("mig-big"), procs.sleeper("mig-small"), procs.sleeper("plain")
    holders = [{"pid": a.pid, "gpu": 0, "gi": 1, "ci": 0, "memory": 20 * GiB, "sm": 60},
               {"pid": b.pid, "gpu": 0, "gi": 6, "ci": 0, "memory": 3 * GiB, "sm": 40},
               {"pid": c.pid, "gpu": 1, "memory": 2 * GiB, "sm": 10}]
    return (a, b, c), [h200(**kw), {"name": "NVIDIA H100 80GB HBM3"}], holders


PYNVML = """
    import json, pynvml as n
    val = lambda r: r.value if hasattr(r, "value") else r  # IsMigDeviceHandle gives a c_uint
    def code(f, *a):
        try:
            r = f(*a)
            return ["ok", r.value if hasattr(r, "value") else r]
        except n.NVMLError as e:
            return ["err", e.value]
    n.nvmlInit()
    h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    out = {"mode": n.nvmlDeviceGetMigMode(h0), "max": n.nvmlDeviceGetMaxMigDeviceCount(h0),
           "plain_mode": code(n.nvmlDeviceGetMigMode, h1), "plain_max": n.nvmlDeviceGetMaxMigDeviceCount(h1),
           "plain_is_mig": val(n.nvmlDeviceIsMigDeviceHandle(h1)),
           "plain_gi": code(n.nvmlDeviceGetGpuInstanceId, h1),
           "plain_by_index": code(n.nvmlDeviceGetMigDeviceHandleByIndex, h1, 0),
           "past_end": code(n.nvmlDeviceGetMigDeviceHandleByIndex, h0, 3),
           "past_max": code(n.nvmlDeviceGetMigDeviceHandleByIndex, h0, 7),
           "parent_util": code(n.nvmlDeviceGetUtilizationRates, h0),
           "parent_proc_util": code(n.nvmlDeviceGetProcessUtilization, h0, 0),
           "parent_records": sorted([p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId]
                                    for p in n.nvmlDeviceGetComputeRunningProcesses(h0)),
           "plain_records": [[p.gpuInstanceId, p.computeInstanceId]
                             for p in n.nvmlDeviceGetComputeRunningProcesses(h1)],
           "migs": []}
    for i in range(3):
        m = n.nvmlDeviceGetMigDeviceHandleByIndex(h0, i)
        mem = n.nvmlDeviceGetMemoryInfo(m)
        out["migs"].append({
            "is_mig": val(n.nvmlDeviceIsMigDeviceHandle(m)), "name": n.nvmlDeviceGetName(m),
            "uuid": n.nvmlDeviceGetUUID(m), "gi": n.nvmlDeviceGetGpuInstanceId(m),
            "ci": n.nvmlDeviceGetComputeInstanceId(m), "mem": [mem.total, mem.used],
            "parent": n.nvmlDeviceGetIndex(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)),
            "procs": [[p.pid, p.gpuInstanceId, p.computeInstanceId] for p in n.nvmlDeviceGetComputeRunningProcesses(m)],
            "util": code(n.nvmlDeviceGetUtilizationRates, m),
            "proc_util": code(n.nvmlDeviceGetProcessUtilization, m, 0),
            "temp": code(n.nvmlDeviceGetTemperature, m, 0),
            "mig_mode": code(n.nvmlDeviceGetMigMode, m)})
    print(json.dumps(out, default=str))
"""

NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND, NO_PERMISSION = 3, 2, 6, 4


def test_the_fake_answers_nvidia_ml_py_as_nvml_h_says(nvml, procs):
    (a, b, c), gpus, holders = layout(procs)
    out = run_py(PYNVML, nvml(gpus, holders))
    assert out["mode"] == [1, 1] and out["max"] == 7
    # a GPU without MIG: mode NOT_SUPPORTED, max count 0 (not an error), not a MIG handle, no instance id
    assert out["plain_mode"] == ["err", NOT_SUPPORTED] and out["plain_max"] == 0 and out["plain_is_mig"] == 0
    assert out["plain_gi"] == ["err", NOT_SUPPORTED] and out["plain_by_index"] == ["err", NOT_SUPPORTED]
    assert out["past_end"] == ["err", NOT_FOUND] and out["past_max"] == ["err", INVALID_ARGUMENT]
    # utilisation: NOT_SUPPORTED on a MIG-enabled parent and on each MIG device, device-wide and per process
    assert out["parent_util"] == ["err", NOT_SUPPORTED] and out["parent_proc_util"] == ["err", NOT_SUPPORTED]
    # the parent's (privileged) aggregate records carry gpuInstanceId/computeInstanceId; 0xFFFFFFFF off MIG
    assert out["parent_records"] == sorted([[a.pid, 20 * GiB, 1, 0], [b.pid, 3 * GiB, 6, 0]])
    assert out["plain_records"] == [[0xFFFFFFFF, 0xFFFFFFFF]]
    m0, m1, m2 = out["migs"]
    assert [m["is_mig"] for m in out["migs"]] == [1, 1, 1] and {m["parent"] for m in out["migs"]} == {0}
    assert [(m["gi"], m["ci"]) for m in out["migs"]] == [(1, 0), (5, 0), (6, 0)]
    assert [m["name"] for m in out["migs"]] == ["NVIDIA H200 MIG 3g.71gb", "NVIDIA H200 MIG 1g.18gb",
                                                "NVIDIA H200 MIG 1g.18gb"]
    assert m2["uuid"] == "MIG-11111111-2222-3333-4444-555555555555" and m0["uuid"].startswith("MIG-")
    assert m0["mem"] == [71 * GiB, 20 * GiB] and m1["mem"] == [18 * GiB, 0] and m2["mem"] == [18 * GiB, 3 * GiB]
    assert m0["procs"] == [[a.pid, 1, 0]] and m1["procs"] == [] and m2["procs"] == [[b.pid, 6, 0]]
    for m in out["migs"]:
        assert m["util"] == m["proc_util"] == m["temp"] == m["mig_mode"] == ["err", NOT_SUPPORTED]


def test_an_unprivileged_parent_list_is_refused_and_mig_handles_still_answer(nvml, procs):
    (a, b, c), gpus, holders = layout(procs, mig_denied=True)
    out = run_py("""
        import json, pynvml as n
        n.nvmlInit()
        h0 = n.nvmlDeviceGetHandleByIndex(0)
        try:
            n.nvmlDeviceGetComputeRunningProcesses(h0)
            parent = 0
        except n.NVMLError as e:
            parent = e.value
        m = n.nvmlDeviceGetMigDeviceHandleByIndex(h0, 2)
        print(json.dumps({"parent": parent, "mig": [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(m)]}))
    """, nvml(gpus, holders))
    assert out == {"parent": NO_PERMISSION, "mig": [b.pid]}


READ = """
    import dataclasses, json
    from gputop.backends.nvml import NvmlBackend
    b = NvmlBackend()
    out = {"devices": [dataclasses.asdict(b.sample(i)) for i in range(b.device_count())],
           "instances": [[dataclasses.asdict(m) for m in b.mig_instances(i)] for i in range(b.device_count())],
           "procs": [[dataclasses.asdict(p) for p in b.processes(i)] for i in range(b.device_count())],
           "warnings": b.warnings()}
    print(json.dumps(out))
"""


@pytest.mark.parametrize("denied", [False, True])
def test_backend_lists_instances_and_places_each_holder_on_its_instance(nvml, procs, denied):
    (a, b, c), gpus, holders = layout(procs, mig_denied=denied)
    out = run_py(READ, nvml(gpus, holders))
    mig, plain = out["instances"]
    assert plain == []
    assert [(m["gpu"], m["mig_index"], m["gpu_instance_id"], m["compute_instance_id"], m["profile"]) for m in mig] == [
        (0, 0, 1, 0, "3g.71gb"), (0, 1, 5, 0, "1g.18gb"), (0, 2, 6, 0, "1g.18gb")]
    assert [(m["memory_total"], m["memory_used"]) for m in mig] == [(71 * GiB, 20 * GiB), (18 * GiB, 0),
                                                                      (18 * GiB, 3 * GiB)]
    assert all(m["util_gpu"] is None and m["util_source"] is None for m in mig)  # N/A, never 0
    on0 = {p["pid"]: p for p in out["procs"][0]}
    assert set(on0) == {a.pid, b.pid}
    assert (on0[a.pid]["gpu_instance_id"], on0[a.pid]["compute_instance_id"]) == (1, 0)
    assert (on0[b.pid]["gpu_instance_id"], on0[b.pid]["used_memory"]) == (6, 3 * GiB)
    assert on0[a.pid]["sm_util"] is None and on0[b.pid]["sm_util"] is None  # NOT_SUPPORTED on MIG
    (p1,) = out["procs"][1]
    assert p1["pid"] == c.pid and p1["gpu_instance_id"] is None and p1["sm_util"] == 10.0
    d0, d1 = out["devices"]
    assert d0["util_gpu"] is None and "utilization: NotSupported" in d0["errors"] and d1["util_gpu"] is not None
    assert out["warnings"] == []


def test_status_json_and_table_put_each_instance_under_its_gpu(nvml, procs):
    (a, b, c), gpus, holders = layout(procs)
    env = _env(nvml(gpus, holders))
    r = run_gputop("status", "--json", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    inst = doc["gpu"]["instances"]
    assert [(m["gpu"], m["gpu_instance_id"], m["compute_instance_id"], m["profile"], m["holders"]) for m in inst] == [
        (0, 1, 0, "3g.71gb", [a.pid]), (0, 5, 0, "1g.18gb", []), (0, 6, 0, "1g.18gb", [b.pid])]
    assert {m["parent_uuid"] for m in inst} == {doc["gpu"]["gpus"][0]["uuid"]}
    assert inst[2]["uuid"] == "MIG-11111111-2222-3333-4444-555555555555"
    assert inst[2]["memory_total"] == 18 * GiB and inst[2]["memory_used"] == 3 * GiB
    assert all(m["utilization_gpu"] is None for m in inst)
    assert doc["gpu"]["gpus"][0]["utilization_gpu"] is None
    assert [g["mig_enabled"] for g in doc["gpu"]["gpus"]] == [True, None]  # the H100 here cannot do MIG
    by_pid = {h["pid"]: h for h in doc["holders"]}
    assert by_pid[b.pid]["uses"][0]["gpu_instance_id"] == 6 and by_pid[b.pid]["sm_util"] is None
    assert by_pid[c.pid]["uses"][0]["gpu_instance_id"] is None and by_pid[c.pid]["sm_util"] == 10.0
    rows = {(x["pid"], x["gpu_instance_id"], x["compute_instance_id"]) for x in doc["gpu"]["holders"]}
    assert rows == {(a.pid, 1, 0), (b.pid, 6, 0), (c.pid, None, None)}

    r = run_gputop("status", env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    gpu0 = next(i for i, l in enumerate(lines) if "NVIDIA H200" in l and "MIG" not in l)
    assert "N/A" in lines[gpu0]  # the parent's utilisation: NOT_SUPPORTED with MIG on
    for k, want in enumerate(["0:0  - MIG GI 1/CI 0 3g.71gb", "0:1  - MIG GI 5/CI 0 1g.18gb",
                              "0:2  - MIG GI 6/CI 0 1g.18gb"]):
        row = lines[gpu0 + 1 + k]
        assert row.strip().startswith(want) and "N/A" in row, row
    assert "3.0GiB / 18GiB" in lines[gpu0 + 3]
    holder_rows = {l.split()[0]: l for l in lines if l.strip() and l.split()[0].isdigit() and len(l.split()) > 5}
    assert "0:GI6/CI0" in holder_rows[str(b.pid)] and "0:GI1/CI0" in holder_rows[str(a.pid)]
    assert " N/A " in holder_rows[str(b.pid)]  # SM% on MIG: N/A, never 0%


def test_mig_off_shows_no_instances(nvml, procs):
    (a, b, c), gpus, holders = layout(procs)
    gpus[0]["mig"] = False
    for h in holders:
        h.pop("gi", None)
    doc = json.loads(run_gputop("status", "--json", env=_env(nvml(gpus, holders))).stdout)
    assert doc["gpu"]["instances"] == [] and doc["gpu"]["gpus"][0]["mig_enabled"] is False
    assert all(u["gpu_instance_id"] is None for h in doc["holders"] for u in h["uses"])
    assert doc["gpu"]["gpus"][0]["utilization_gpu"] == 100.0  # 60 + 40, capped: MIG off, utilisation is there


def test_nvitop_lists_the_instances_of_the_same_fake(nvml, procs):
    nvitop = Path(sys.executable).with_name("nvitop")
    if not nvitop.exists():
        pytest.skip("nvitop is not installed in this venv (pip install -e '.[bench]')")
    (a, b, c), gpus, holders = layout(procs)
    r = subprocess.run([str(nvitop), "--once"], capture_output=True, text=True,
                       env=_env(nvml(gpus, holders)), timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Enabled" in out  # MIG M. column of the parent
    for want in ("0:0", "3g.71gb @ GI/CI: 1/0", "0:1", "1g.18gb @ GI/CI: 5/0", "0:2", "1g.18gb @ GI/CI: 6/0"):
        assert want in out, out
    rows = [l.split() for l in out.splitlines() if l.startswith("│ ")]
    placed = {r[2]: r[1] for r in rows if len(r) > 3 and r[2] in (str(a.pid), str(b.pid))}
    assert placed == {str(a.pid): "0:0", str(b.pid): "0:2"}, out


def test_mig_on_without_instances_says_so(nvml, procs):
    """MIG on, nothing carved out yet: the GPU says MIG is on (why its utilisation is N/A), no instance rows."""
    gpus = [{**h200(), "mig_devices": []}, {}]
    env = _env(nvml(gpus, []))
    doc = json.loads(run_gputop("status", "--json", env=env).stdout)
    assert doc["gpu"]["instances"] == [] and doc["gpu"]["gpus"][0]["mig_enabled"] is True
    out = run_gputop("status", env=env).stdout
    assert "0:-  - MIG on, no MIG devices" in out, out


def test_a_mig_list_that_cannot_be_read_does_not_hide_its_holders(nvml, procs):
    """NVML does not support MIG handles' process lists in vGPU host mode: the holders are then read from the
    GPU's own (aggregate) list, kept on no known instance, with a warning; a reset still refuses, naming them.
    When the GPU's own list is refused too (unprivileged), the warning says the holders cannot be seen."""
    (a, b, c), gpus, holders = layout(procs, mig_procs_error="NOT_SUPPORTED")
    env = _env(nvml(gpus, holders))
    out = run_py(READ, env)
    on0 = {p["pid"]: p for p in out["procs"][0]}
    assert set(on0) == {a.pid, b.pid} and all(p["gpu_instance_id"] is None for p in on0.values())
    assert on0[a.pid]["used_memory"] == 20 * GiB
    (w,) = out["warnings"]
    assert "MIG 0: NotSupported" in w and "on no known instance" in w, w
    r = run_gputop("reset", "--gpu", "0", "--dry-run", env=env)
    assert r.returncode == 5 and f"no instance known: {a.pid}" in r.stderr, r.stdout + r.stderr
    assert a.poll() is None and b.poll() is None

    (a, b, c), gpus, holders = layout(procs, mig_procs_error="NOT_SUPPORTED", mig_denied=True)
    out = run_py(READ, nvml(gpus, holders))
    assert out["procs"][0] == []
    (w,) = out["warnings"]
    assert "its holders cannot be seen" in w and "NoPermission" in w, w
    if os.geteuid() == 0:  # a real reset (the backend's own check, after the root check): refused, not run
        r = run_gputop("reset", "--gpu", "0", env=_env(nvml(gpus, holders)))
        assert r.returncode == 5 and "holders cannot be read" in r.stderr, r.stdout + r.stderr
        assert a.poll() is None and b.poll() is None
