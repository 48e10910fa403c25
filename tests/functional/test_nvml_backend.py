"""The NVML backend (ctypes straight into libnvidia-ml.so.1), against the fake libnvidia-ml.so.1.

The fake library (tests/fakenvml) is the only fake: it is loaded through LD_LIBRARY_PATH, which the
dynamic loader reads at process start, so gputop runs in a subprocess. The holders are real processes.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, _default_sighup, run_gputop
from tests.fakenvml.build import FakeNvmlBuildError, build_fake_nvml, compiler, write_fake_nvml_config

GiB = 1 << 30

pytestmark = pytest.mark.skipif(compiler() is None, reason="gcc is needed to build the fake NVML library "
                                                           "(.ci/run installs it)")


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory):
    """variant -> directory holding that build of libnvidia-ml.so.1 (built once per session)."""
    out = tmp_path_factory.mktemp("fakenvml")
    cache: dict[str, Path] = {}

    def get(variant: str = "default") -> Path:
        if variant not in cache:
            try:
                cache[variant] = build_fake_nvml(out, variant)
            except FakeNvmlBuildError as e:
                pytest.fail(str(e))
        return cache[variant]

    return get


@pytest.fixture
def nvml(tmp_path, fake_libs):
    """``nvml(gpus, holders, variant=..., **opts) -> env`` for a subprocess that loads the fake library."""
    cfg = tmp_path / "fakenvml.conf"

    def make(gpus, holders=(), variant="default", **opts) -> dict:
        write_fake_nvml_config(cfg, gpus, list(holders), **opts)
        return {"LD_LIBRARY_PATH": str(fake_libs(variant)), "FAKE_NVML_CONFIG": str(cfg),
                "GPUTOP_BACKEND": "nvml"}

    make.path = cfg
    return make


def _env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "FAKE_NVML_INIT_ERROR")}
    env.update(extra)
    return env


def run_py(code: str, env: dict, timeout: float = 60, **kw) -> dict:
    """Run python code in a subprocess with ``env``; it prints one JSON object as its last line."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       env=_env(env), cwd=ROOT, timeout=timeout, preexec_fn=kw.pop("preexec_fn", _default_sighup),
                       **kw)
    assert r.returncode == 0, f"subprocess failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


READ_ALL = """
    import dataclasses, json
    from gputop.backends.base import BackendUnavailable
    from gputop.backends.nvml import NvmlBackend
    try:
        b = NvmlBackend()
    except BackendUnavailable as e:
        print(json.dumps({"unavailable": str(e)}))
        raise SystemExit(0)
    out = {"count": b.device_count(), "devices": [], "procs": []}
    for i in range(b.device_count()):
        out["devices"].append(dataclasses.asdict(b.sample(i)))
        out["procs"].append({p.pid: dataclasses.asdict(p) for p in b.processes(i)})
    out["warnings"] = b.warnings()
    b.close()
    print(json.dumps(out))
"""


def read_all(env: dict) -> dict:
    out = run_py(READ_ALL, env)
    out["procs"] = [{int(k): v for k, v in d.items()} for d in out.get("procs", [])]
    return out


def test_compute_graphics_and_both_are_merged_per_pid(nvml, procs):
    a, g, both = procs.sleeper("trainer"), procs.sleeper("xorg-ish"), procs.sleeper("viz")
    env = nvml(2, [
        {"pid": a.pid, "gpu": 0, "memory": 3 * GiB, "type": "C", "sm": 70},
        {"pid": g.pid, "gpu": 0, "memory": 256 << 20, "type": "G"},
        {"pid": both.pid, "gpu": 0, "memory": GiB, "type": "C+G", "sm": 20},
        {"pid": both.pid, "gpu": 1, "memory": 2 * GiB, "type": "C", "sm": 5},
    ])
    out = read_all(env)
    assert out["count"] == 2
    gpu0, gpu1 = out["procs"]
    assert set(gpu0) == {a.pid, g.pid, both.pid}
    assert (gpu0[a.pid]["ctx"], gpu0[a.pid]["used_memory"], gpu0[a.pid]["sm_util"]) == ("C", 3 * GiB, 70.0)
    assert (gpu0[g.pid]["ctx"], gpu0[g.pid]["used_memory"], gpu0[g.pid]["sm_util"]) == ("G", 256 << 20, None)
    # in both lists, with its memory on this device: not counted twice
    assert (gpu0[both.pid]["ctx"], gpu0[both.pid]["used_memory"]) == ("C+G", GiB)
    assert set(gpu1) == {both.pid}
    assert (gpu1[both.pid]["ctx"], gpu1[both.pid]["used_memory"], gpu1[both.pid]["index"]) == ("C", 2 * GiB, 1)
    assert all(p["visible"] for d in out["procs"] for p in d.values())
    assert out["warnings"] == []


def test_device_fields_are_read_and_converted(nvml):
    env = nvml([
        {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-11111111-2222-3333-4444-555555555555",
         "pci_bus_id": "00000000:17:00.0", "memory_total": 80 * GiB, "memory_used": 12 * GiB,
         "utilization": 63, "memory_utilization": 21, "temperature": 57, "power": 312.5,
         "power_limit": 700, "fan": 44, "clock_sm": 1755, "clock_mem": 2619},
    ])
    d = read_all(env)["devices"][0]
    assert d == {**d, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-11111111-2222-3333-4444-555555555555",
                 "pci_bus_id": "00000000:17:00.0", "memory_total": 80 * GiB, "memory_used": 12 * GiB,
                 "util_gpu": 63.0, "util_mem": 21.0, "temperature": 57.0, "power_w": 312.5,
                 "power_limit_w": 700.0, "fan_pct": 44.0, "clock_sm_mhz": 1755, "clock_mem_mhz": 2619,
                 "lost": False, "errors": []}


def test_unsupported_and_failing_fields_are_unknown_not_zero(nvml, procs):
    p = procs.sleeper("job")
    env = nvml([{"fan": None, "power": None, "errors": {"temp": "UNKNOWN", "clock_sm": "FUNCTION_NOT_FOUND"}}],
               [{"pid": p.pid, "memory": GiB, "sm": 10}])
    d = read_all(env)["devices"][0]
    assert d["fan_pct"] is None and d["power_w"] is None and d["temperature"] is None
    assert d["clock_sm_mhz"] is None and d["clock_mem_mhz"] == 2619
    assert sorted(d["errors"]) == ["fan: NotSupported", "power: NotSupported", "sm clock: FunctionNotFound",
                                   "temperature: Unknown"]
    assert d["lost"] is False and d["memory_used"] == GiB and d["util_gpu"] == 10.0  # the rest still reads


def test_memory_not_available_is_none_like_wddm(nvml, procs):
    p, q = procs.sleeper("wddm"), procs.sleeper("known")
    env = nvml(1, [{"pid": p.pid, "memory": None, "type": "C+G"}, {"pid": q.pid, "memory": GiB}])
    out = read_all(env)
    gpu0 = out["procs"][0]
    assert gpu0[p.pid]["used_memory"] is None  # NVML_VALUE_NOT_AVAILABLE, never 0
    assert gpu0[p.pid]["ctx"] == "C+G"
    assert gpu0[q.pid]["used_memory"] == GiB
    r = run_gputop("status", "--json", env=_env(env))
    assert r.returncode == 0, r.stderr
    holders = {h["pid"]: h for h in json.loads(r.stdout)["holders"]}
    assert holders[p.pid]["gpu_memory"] is None and holders[q.pid]["gpu_memory"] == GiB


@pytest.mark.parametrize("lost", [True, "handle"])
def test_one_lost_device_does_not_stop_the_other(nvml, procs, lost):
    a, b = procs.sleeper("on-lost"), procs.sleeper("on-good")
    env = nvml([{"name": "Lost GPU", "lost": lost}, {"name": "Good GPU"}],
               [{"pid": a.pid, "gpu": 0, "memory": GiB}, {"pid": b.pid, "gpu": 1, "memory": 2 * GiB, "sm": 40}])
    out = read_all(env)
    d0, d1 = out["devices"]
    assert d0["lost"] is True and d0["memory_used"] is None and d0["errors"]
    assert out["procs"][0] == {}
    assert d1["lost"] is False and d1["name"] == "Good GPU" and d1["memory_used"] == 2 * GiB
    assert set(out["procs"][1]) == {b.pid}

    r = run_gputop("status", "--json", env=_env(env))
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    gpus = snap["gpu"]["gpus"]
    assert [g["lost"] for g in gpus] == [True, False]
    assert [h["pid"] for h in snap["holders"]] == [b.pid]
    assert any("lost" in w for w in snap["warnings"])
    r = run_gputop("status", env=_env(env))
    assert r.returncode == 0 and "LOST" in r.stdout and "Good GPU" in r.stdout


@pytest.mark.parametrize("variant", ["no_v3", "v1"])
def test_versioned_process_calls_fall_back(nvml, procs, variant):
    """_v3 missing (FunctionNotFound from dlsym) -> _v2; both missing -> the unversioned v1 struct."""
    a, g = procs.sleeper("old-driver-c"), procs.sleeper("old-driver-g")
    env = nvml(1, [{"pid": a.pid, "memory": 5 * GiB, "type": "C", "sm": 33},
                   {"pid": g.pid, "memory": None, "type": "C+G"}], variant=variant)
    out = run_py("""
        import ctypes, json
        from gputop.backends.nvml import NvmlBackend
        b = NvmlBackend()
        # the symbol really is absent from the library (dlsym fails)
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        v3 = "present" if hasattr(lib, "nvmlDeviceGetComputeRunningProcesses_v3") else "FunctionNotFound"
        first = {p.pid: [p.ctx, p.used_memory, p.sm_util] for p in b.processes(0)}
        second = {p.pid: [p.ctx, p.used_memory, p.sm_util] for p in b.processes(0)}
        d = b.sample(0)
        print(json.dumps({"v3": v3, "first": first, "second": second, "warnings": b.warnings(),
                          "versions": b._proc_version, "device": [d.memory_used, d.temperature, d.errors],
                          "new_calls": [b._mem_v2, b._temp_v]}))
    """, env)
    assert out["v3"] == "FunctionNotFound"
    expected = {str(a.pid): ["C", 5 * GiB, 33.0], str(g.pid): ["C+G", None, None]}
    assert out["first"] == expected and out["second"] == expected
    want = 1 if variant == "no_v3" else 2
    assert out["versions"] == {"Compute": want, "Graphics": want}  # remembered, not re-probed each tick
    assert out["warnings"] == []
    assert out["device"] == [5 * GiB, 40.0, []]  # memory v1 and the old temperature call still read
    assert out["new_calls"] == ([True, True] if variant == "no_v3" else [False, False])


def test_no_driver_status_exits_0_and_says_why(nvml):
    env = nvml(1, [], init_error="DRIVER_NOT_LOADED")
    env.pop("GPUTOP_BACKEND")
    r = run_gputop("status", env=_env(env))
    assert r.returncode == 0, r.stderr
    assert "nvml: driver not loaded" in r.stdout
    assert "--scenario" in r.stdout or "--demo" in r.stdout  # points to the simulated backend
    r = run_gputop("status", "--json", env=_env(env))
    assert r.returncode == 0
    nv = [b for b in json.loads(r.stdout)["backends"] if b["name"] == "nvml"][0]
    assert nv["available"] is False and nv["reason"].startswith("nvml: driver not loaded")
    # asking for NVML explicitly is an error with the same reason (exit 6: unavailable)
    r = run_gputop("status", "--backend", "nvml", env=_env(env))
    assert r.returncode == 6 and "nvml: driver not loaded" in r.stderr


def test_init_errors_from_the_environment(nvml):
    env = nvml(1, [])
    out = run_py(READ_ALL, {**env, "FAKE_NVML_INIT_ERROR": "NO_PERMISSION"})
    assert out["unavailable"].startswith("nvml: no permission")


def _real_nvml_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


@pytest.mark.skipif(_real_nvml_present(), reason="this machine has a real libnvidia-ml.so.1")
def test_no_library_at_all_says_library_not_found():
    env = _env({})
    env.pop("GPUTOP_BACKEND", None)
    r = run_gputop("status", env=env)
    assert r.returncode == 0, r.stderr
    assert "libnvidia-ml.so.1 not found" in r.stdout


def test_status_json_matches_the_config(nvml, procs):
    a = procs.sleeper("gpu-job")
    g = procs.sleeper("gpu-viz")
    env = nvml([{"name": "NVIDIA A100-SXM4-80GB", "pci_bus_id": "00000000:07:00.0", "memory_total": 80 * GiB,
                 "temperature": 61, "power": 250, "power_limit": 400, "fan": None, "clock_sm": 1410,
                 "clock_mem": 1593, "memory_utilization": 12},
                {"name": "NVIDIA A100-SXM4-40GB", "memory_total": 40 * GiB, "utilization": 0}],
               [{"pid": a.pid, "gpu": 0, "memory": 6 * GiB, "type": "C", "sm": 88},
                {"pid": g.pid, "gpu": 0, "memory": GiB, "type": "G"},
                {"pid": g.pid, "gpu": 1, "memory": GiB, "type": "G"}])
    r = run_gputop("status", "--json", env=_env(env))
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    g0, g1 = snap["gpu"]["gpus"]
    assert g0["backend"] == "nvml" and g0["name"] == "NVIDIA A100-SXM4-80GB"
    assert g0["pci_bus_id"] == "00000000:07:00.0" and g0["uuid"].startswith("GPU-")
    assert (g0["memory_total"], g0["memory_used"]) == (80 * GiB, 7 * GiB)  # used: the holders' sum
    assert (g0["utilization_gpu"], g0["utilization_memory"]) == (88.0, 12.0)
    assert (g0["temperature_c"], g0["power_w"], g0["power_limit_w"]) == (61.0, 250.0, 400.0)
    assert g0["fan_percent"] is None and "fan: NotSupported" in g0["errors"]
    assert (g0["clock_sm_mhz"], g0["clock_mem_mhz"]) == (1410, 1593)
    assert (g1["memory_total"], g1["utilization_gpu"]) == (40 * GiB, 0.0)
    holders = {h["pid"]: h for h in snap["holders"]}
    assert set(holders) == {a.pid, g.pid}
    assert (holders[a.pid]["ctx"], holders[a.pid]["gpus"], holders[a.pid]["gpu_memory"],
            holders[a.pid]["sm_util"]) == ("C", [0], 6 * GiB, 88.0)
    assert (holders[g.pid]["ctx"], holders[g.pid]["gpus"], holders[g.pid]["gpu_memory"]) == ("G", [0, 1], 2 * GiB)
    assert holders[a.pid]["name"] == "gpu-job"
    assert holders[a.pid]["chain"][0]["pid"] == os.getpid()  # its parent: this test
    assert holders[a.pid]["verdict"]["kind"] == "not-orphan"
    flat = {(x["gpu"], x["pid"]): x for x in snap["gpu"]["holders"]}
    assert flat[(0, a.pid)]["used_memory"] == 6 * GiB and flat[(1, g.pid)]["ctx"] == "G"
    assert [b for b in snap["backends"] if b["name"] == "nvml"][0] == {
        "name": "nvml", "available": True, "reason": "", "devices": 2}


def test_holder_not_in_this_pid_namespace_is_kept_and_marked(nvml, procs):
    ghost = 4_000_000  # above the default pid_max: no process here has it
    assert not os.path.exists(f"/proc/{ghost}")
    a = procs.sleeper("local")
    env = nvml(1, [{"pid": a.pid, "memory": GiB}, {"pid": ghost, "memory": 2 * GiB, "visible": False}])
    out = read_all(env)
    assert ghost in out["procs"][0] and a.pid in out["procs"][0]  # the backend keeps it; the sampler marks it
    r = run_gputop("status", "--json", env=_env(env))
    holders = {h["pid"]: h for h in json.loads(r.stdout)["holders"]}
    assert holders[ghost]["visible"] is False and holders[ghost]["verdict"]["kind"] == "unknown"
    assert holders[ghost]["gpu_memory"] == 2 * GiB


def test_config_is_reread_and_exited_holders_vanish(nvml, procs):
    a, b = procs.sleeper("first"), procs.sleeper("second")
    env = nvml(1, [{"pid": a.pid, "memory": GiB, "sm": 10}])
    out = run_py(f"""
        import json, os, signal, time
        from gputop.backends.nvml import NvmlBackend
        from tests.fakenvml.build import write_fake_nvml_config
        nv = NvmlBackend()
        seen = [sorted(p.pid for p in nv.processes(0))]
        write_fake_nvml_config({str(nvml.path)!r}, [{{}}], [{{"pid": {a.pid}, "memory": 1 << 30}},
                                                     {{"pid": {b.pid}, "memory": 1 << 30, "sm": 50}}])
        seen.append(sorted(p.pid for p in nv.processes(0)))
        seen.append(nv.sample(0).memory_used)
        print(json.dumps(seen))
    """, env)
    assert out == [[a.pid], sorted([a.pid, b.pid]), 2 * GiB]
    a.kill()
    a.wait()
    out = read_all(env)
    assert set(out["procs"][0]) == {b.pid}  # the driver frees a dead process's context
    assert out["devices"][0]["memory_used"] == GiB


def test_reused_list_buffers_grow_and_shrink_with_the_holders(nvml, procs):
    # gputop keeps one ctypes buffer per list call and device; a list that outgrows it is read again.
    ps = [procs.sleeper(f"grow{i}") for i in range(30)]
    env = nvml(1, [{"pid": ps[0].pid, "memory": GiB, "sm": 5}])
    out = run_py(f"""
        import ctypes, json, pynvml
        from gputop.backends import nvml as m
        from tests.fakenvml.build import write_fake_nvml_config
        layouts = [ctypes.sizeof(m._ProcessInfoV2) == ctypes.sizeof(pynvml.c_nvmlProcessInfo_v3_t),
                   ctypes.sizeof(m._ProcessUtilizationSample) ==
                   ctypes.sizeof(pynvml.c_nvmlProcessUtilizationSample_t)]
        nv = m.NvmlBackend()
        pids = {[p.pid for p in ps]!r}
        seen = []
        for n in (1, 30, 2):
            write_fake_nvml_config({str(nvml.path)!r}, [{{}}],
                                   [{{"pid": p, "memory": (i + 1) << 20, "sm": i}} for i, p in enumerate(pids[:n])])
            procs = nv.processes(0)
            seen.append([[p.pid, p.used_memory, p.sm_util] for p in sorted(procs, key=lambda p: p.used_memory)])
        print(json.dumps({{"layouts": layouts, "seen": seen}}))
    """, env)
    assert out["layouts"] == [True, True]
    pids = [p.pid for p in ps]
    for n, seen in zip((1, 30, 2), out["seen"]):
        assert seen == [[pids[i], (i + 1) << 20, float(i)] for i in range(n)]


def test_process_utilisation_without_samples_is_none_not_error(nvml, procs):
    a = procs.sleeper("quiet")
    env = nvml(1, [{"pid": a.pid, "memory": GiB, "sm": None}])
    out = read_all(env)
    assert out["procs"][0][a.pid]["sm_util"] is None
    assert out["warnings"] == []


def test_size_query_protocol_and_struct_layouts(nvml, procs):
    ps = [procs.sleeper(f"p{i}") for i in range(3)]
    env = nvml([{}, {"mig": False}], [{"pid": p.pid, "gpu": 0, "memory": (i + 1) * GiB} for i, p in enumerate(ps)])
    out = run_py("""
        import ctypes, json, pynvml
        pynvml.nvmlInit()
        h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
        res = {"sizeof_v3": ctypes.sizeof(pynvml.c_nvmlProcessInfo_v3_t)}
        n = ctypes.c_uint(0)
        res["query"] = [fn(h0, ctypes.byref(n), None), n.value]
        small = (pynvml.c_nvmlProcessInfo_v3_t * 1)()
        n = ctypes.c_uint(1)
        res["too_small"] = [fn(h0, ctypes.byref(n), small), n.value]
        full = (pynvml.c_nvmlProcessInfo_v3_t * 8)()
        n = ctypes.c_uint(8)
        res["full"] = [fn(h0, ctypes.byref(n), full), n.value]
        res["entries"] = [[full[i].pid, full[i].usedGpuMemory, full[i].gpuInstanceId, full[i].computeInstanceId]
                          for i in range(n.value)]
        n = ctypes.c_uint(0)
        res["empty"] = [fn(h1, ctypes.byref(n), None), n.value]
        pci = pynvml.nvmlDeviceGetPciInfo(h0)
        text = lambda v: v.decode() if isinstance(v, bytes) else v
        res["pci"] = [text(pci.busId), text(pci.busIdLegacy), pci.bus]
        mem = pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2)
        res["mem_v2"] = [mem.total, mem.used, mem.free]
        bad = pynvml.c_nvmlMemory_v2_t()
        bad.version = 1
        res["mem_bad_version"] = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2")(h0, ctypes.byref(bad))
        # MIG (issue 30): a MIG-capable GPU with MIG off answers its mode pair and max count; one without MIG
        # answers NOT_SUPPORTED and a count of 0; neither is a MIG handle (the calls of tests/functional/test_mig.py)
        cur, pend = ctypes.c_uint(9), ctypes.c_uint(9)
        mode = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetMigMode")
        res["mig"] = [mode(h0, ctypes.byref(cur), ctypes.byref(pend)), list(pynvml.nvmlDeviceGetMigMode(h1)),
                      pynvml.nvmlDeviceGetMaxMigDeviceCount(h0), pynvml.nvmlDeviceGetMaxMigDeviceCount(h1),
                      *(getattr(v, "value", v) for v in map(pynvml.nvmlDeviceIsMigDeviceHandle, (h0, h1)))]
        print(json.dumps(res))
    """, env)
    NVML_ERROR_INSUFFICIENT_SIZE = 7
    assert out["sizeof_v3"] == 24
    assert out["query"] == [NVML_ERROR_INSUFFICIENT_SIZE, 3]
    assert out["too_small"] == [NVML_ERROR_INSUFFICIENT_SIZE, 3]
    assert out["full"] == [0, 3]
    assert out["entries"] == [[p.pid, (i + 1) * GiB, 0xFFFFFFFF, 0xFFFFFFFF] for i, p in enumerate(ps)]
    assert out["empty"] == [0, 0]
    assert out["pci"] == ["00000000:10:00.0", "0000:10:00.0", 0x10]
    assert out["mem_v2"] == [80 * GiB, 6 * GiB, 74 * GiB]
    assert out["mem_bad_version"] == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert out["mig"] == [3, [0, 0], 0, 7, 0, 0]  # NOT_SUPPORTED; MIG off; 0 / 7 devices at most; no MIG handle


RESET = """
    import json
    from gputop.backends.base import ResetError
    from gputop.backends.nvml import NvmlBackend
    b = NvmlBackend()
    try:
        msg, kind = b.reset({index}), None
    except ResetError as e:
        msg, kind = str(e), e.kind
    # NVML is still usable afterwards
    print(json.dumps({{"kind": kind, "msg": msg, "after": b.sample({index}).name}}))
"""


def _reset(env, index=0, **kw) -> dict:
    return run_py(RESET.format(index=index), env, **kw)


def test_reset_refuses_a_gpu_that_drives_a_display(nvml):
    if os.geteuid() != 0:
        pytest.skip("the display check comes after the root check")
    env = nvml([{"name": "Display GPU", "display": True}, {}])
    out = _reset(env)
    assert out["kind"] == "display" and "display" in out["msg"] and out["after"] == "Display GPU"


def test_reset_refuses_a_gpu_in_use(nvml, procs):
    if os.geteuid() != 0:
        pytest.skip("the in-use check comes after the root check")
    a = procs.sleeper("busy-job")
    env = nvml(1, [{"pid": a.pid, "memory": GiB}])
    out = _reset(env)
    assert out["kind"] == "busy" and str(a.pid) in out["msg"]
    assert a.poll() is None  # a refusal touches nothing


def test_reset_without_nvidia_smi_says_so(nvml):
    if os.geteuid() != 0:
        pytest.skip("the nvidia-smi check comes after the root check")
    path = os.pathsep.join(p for p in ("/usr/sbin", "/usr/bin", "/sbin", "/bin") if os.path.isdir(p))
    if shutil.which("nvidia-smi", path=path):
        pytest.skip("this machine has nvidia-smi: the test would reset a real GPU")
    env = nvml(1, [])
    out = _reset({**env, "PATH": path})
    assert out["kind"] == "missing-tool" and "nvidia-smi" in out["msg"]
    assert out["after"] is not None


@pytest.mark.parametrize("outcome", ["ok", "in-use"])
def test_reset_runs_nvidia_smi_on_the_pci_bus_id_and_reopens_nvml(nvml, tmp_path, outcome):
    # A stand-in nvidia-smi: it records its arguments and answers as the real one does.
    if os.geteuid() != 0:
        pytest.skip("the reset itself comes after the root check")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    args_file = tmp_path / "args"
    smi = bin_dir / "nvidia-smi"
    if outcome == "ok":
        body = 'echo "GPU $3 was successfully reset."; echo "All done."'
    else:
        body = ('echo "Unable to reset this GPU because it\'s being used by some other process '
                '(e.g. CUDA application, graphics application like X server, monitoring application '
                'like other instance of nvidia-smi)." >&2; exit 255')
    smi.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {args_file}\n{body}\n')
    smi.chmod(0o755)
    env = nvml(1, [])
    out = _reset({**env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert args_file.read_text().split() == ["--gpu-reset", "-i", "00000000:10:00.0"]
    if outcome == "ok":
        assert out["kind"] is None and "successfully reset" in out["msg"] and "00000000:10:00.0" in out["msg"]
    else:
        assert out["kind"] == "busy" and "being used by some other process" in out["msg"]
    assert out["after"] is not None  # NVML was opened again after the reset, whatever happened


def test_reset_needs_root(nvml):
    env = nvml(1, [])
    code = textwrap.dedent(RESET.format(index=0))
    cmd = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        # A new user namespace without a uid map: the kernel reports us as the overflow uid (not root)
        # while the files we own stay readable.
        if shutil.which("unshare") is None or subprocess.run(
                ["unshare", "-U", "true"], capture_output=True).returncode != 0:
            pytest.skip("running as root and cannot drop root with 'unshare -U'")
        cmd = ["unshare", "-U", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(env), cwd=ROOT, timeout=60,
                       preexec_fn=_default_sighup)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["kind"] == "permission" and "root" in out["msg"] and out["after"] is not None


def test_nvitop_runs_against_the_same_fake(nvml, procs):
    nvitop = Path(sys.executable).with_name("nvitop")
    if not nvitop.exists():
        pytest.skip("nvitop is not installed in this venv")
    a, g = procs.sleeper("nvitop-c"), procs.sleeper("nvitop-g")
    env = nvml([{"name": "NVIDIA H100 80GB HBM3"}, {"name": "NVIDIA L40S"}],
               [{"pid": a.pid, "gpu": 0, "memory": 3 * GiB, "sm": 50},
                {"pid": g.pid, "gpu": 1, "memory": None, "type": "G"}])
    r = subprocess.run([str(nvitop), "--once"], capture_output=True, text=True, env=_env(env), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "H100 80GB HBM3" in r.stdout and "L40S" in r.stdout
    assert str(a.pid) in r.stdout and str(g.pid) in r.stdout
    assert "3072MiB" in r.stdout


def test_cli_reset_refusals_leave_every_process_alone(nvml, procs):
    """`gputop reset --gpu N` end to end on the fake: a display GPU and a missing nvidia-smi are refused."""
    if os.geteuid() != 0:
        pytest.skip("the display and nvidia-smi checks come after the root check")
    path = os.pathsep.join(p for p in (str(Path(sys.executable).parent), "/usr/sbin", "/usr/bin", "/sbin", "/bin")
                           if os.path.isdir(p))
    if shutil.which("nvidia-smi", path=path):
        pytest.skip("this machine has nvidia-smi: the test would reset a real GPU")
    bystander = procs.sleeper("bystander")
    env = nvml([{"name": "Display GPU", "display": True}, {"name": "Compute GPU"}],
               [{"pid": bystander.pid, "gpu": 1, "memory": GiB}])
    env = _env({**env, "PATH": path})
    r = run_gputop("reset", "--gpu", "0", env=env)
    assert r.returncode == 5, (r.stdout, r.stderr)  # refused
    assert "drives a display" in r.stdout + r.stderr
    write_fake_nvml_config(nvml.path, [{"name": "Compute GPU"}, {"name": "Compute GPU"}],
                           [{"pid": bystander.pid, "gpu": 1, "memory": GiB}])
    r = run_gputop("reset", "--gpu", "0", "--json", env=env)
    assert r.returncode == 6, (r.stdout, r.stderr)  # unavailable: the vendor tool is missing
    out = json.loads(r.stdout)
    assert out["ok"] is False and "nvidia-smi not found" in out["message"]
    assert bystander.poll() is None


def test_a_garbage_library_is_reported_as_failing_to_load(tmp_path):
    (tmp_path / "libnvidia-ml.so.1").write_bytes(b"this is not an ELF file\n" * 100)
    env = _env({"LD_LIBRARY_PATH": str(tmp_path)})
    env.pop("GPUTOP_BACKEND", None)
    r = run_gputop("status", env=env)
    out = r.stdout + r.stderr
    assert "libnvidia-ml.so.1 failed to load:" in out, out
    assert "not found (no NVIDIA driver installed)" not in out


def test_a_process_that_changed_is_read_anew_and_an_unchanged_one_keeps_its_records(nvml, procs):
    """The backend hands back last refresh's GpuProcess for an unchanged process, and the sampler its
    GpuUse: never for one whose memory, SM% or context type changed."""
    a, b = procs.sleeper("a"), procs.sleeper("b")
    env = nvml(1, [{"pid": a.pid, "memory": GiB, "sm": 10}, {"pid": b.pid, "memory": GiB, "sm": 20}])
    cfg = nvml.path
    out = run_py(f"""
        import json, os, time
        from gputop.backends import probe
        from gputop.core.sampler import Sampler
        from tests.fakenvml.build import write_fake_nvml_config
        r = probe("nvml")
        s = Sampler(r.backends, r.statuses)
        uses = lambda snap: {{h.pid: h.uses[0] for h in snap.holders}}
        first = uses(s.sample())
        second = uses(s.sample())
        write_fake_nvml_config({str(cfg)!r}, 1, [
            {{"pid": {a.pid}, "memory": 3 << 30, "sm": 10}},
            {{"pid": {b.pid}, "memory": {GiB}, "sm": 20, "type": "C+G"}}])
        third = uses(s.sample())
        print(json.dumps({{
            "kept": [second[p] is first[p] for p in ({a.pid}, {b.pid})],
            "third": {{p: [u.used_memory, u.ctx, u.sm_util, u is second[p]] for p, u in third.items()}}}}))
    """, env)
    assert out["kept"] == [True, True]
    assert out["third"][str(a.pid)] == [3 * GiB, "C", 10.0, False]
    assert out["third"][str(b.pid)] == [GiB, "C+G", 20.0, False]


def test_a_holder_reported_by_thread_id_stays_its_process_while_its_records_are_kept(nvml, procs):
    """NVML may name a thread: across refreshes that hand back the same GpuProcess (and GpuUse), the
    holder is still the thread's process, never the thread id."""
    p, tid = procs.threaded()
    env = nvml(1, [{"pid": tid, "memory": GiB, "sm": 10}])
    out = run_py("""
        import json
        from gputop.backends import probe
        from gputop.core.sampler import Sampler
        r = probe("nvml")
        s = Sampler(r.backends, r.statuses)
        snaps = [s.sample() for _ in range(3)]
        print(json.dumps({"pids": [[h.pid for h in x.holders] for x in snaps],
                          "kept": snaps[2].holders[0].uses[0] is snaps[1].holders[0].uses[0]}))
    """, env)
    assert out["pids"] == [[p.pid]] * 3
    assert out["kept"]  # the records were reused, and the holder is still the process


def _shape(v):
    """What kind of answer an NVML call gave: its error code, or its value's type (a struct's fields)."""
    if isinstance(v, str) and v.startswith(("ERROR ", "EXC ")):
        return v.split()[:2]
    if isinstance(v, dict):
        return {k: _shape(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_shape(v[0])] if v else []
    return type(v).__name__


def test_the_fake_answers_every_question_as_a_real_h200_did(nvml, procs):
    """scripts/nvml-probe.py's answers from a real H200 (driver 580.159.04, 2026-12-04, one CUDA process
    holding 3.6 GiB; tests/fakenvml/h200-probe.json) against the fake set up as that GPU: every call
    succeeds or fails alike, with the same fields, and the memory arithmetic agrees (v1 counts the
    reserved memory as used; v2 does not)."""
    real = json.loads((ROOT / "tests" / "fakenvml" / "h200-probe.json").read_text())["devices"][0]
    holder = procs.sleeper("h200-holder")
    env = nvml([{"name": "NVIDIA H200", "memory_total": real["memory_v1"]["total"],
                 "memory_reserved": real["memory_v2"]["reserved"], "fan": None, "mig": False,
                 "clock_mem": 3201, "max_clock_mem": 3201}],
               [{"pid": holder.pid, "gpu": 0, "memory": real["compute_procs"][0]["usedGpuMemory"], "sm": 1}])
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "nvml-probe.py")], capture_output=True, text=True,
                       env=_env(env), timeout=60)
    assert r.returncode == 0, r.stderr
    fake = json.loads(r.stdout)["devices"][0]
    differ = {k: (_shape(real[k]), _shape(fake.get(k))) for k in real
              if _shape(real[k]) != _shape(fake.get(k))}
    assert not differ, differ
    for dev in (real, fake):
        v1, v2 = dev["memory_v1"], dev["memory_v2"]
        assert v1["used"] == v2["used"] + v2["reserved"]
        assert v2["free"] == v2["total"] - v2["reserved"] - v2["used"] == v1["free"]
    assert fake["display_mode"] == real["display_mode"] == 1 and fake["display_active"] == real["display_active"] == 0
    assert fake["mig_mode"] == real["mig_mode"] == [0, 0]
