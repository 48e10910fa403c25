"""Ask NVML, through nvidia-ml-py, every question gputop's NVML backend (and nvitop) asks, and print the answers
as JSON: a value, or the NVML error's name. Run it on a real GPU and against the fake library
(tests/fakenvml) to see where the fake answers differently from a real driver.

    python3 scripts/nvml-probe.py                      # the machine's libnvidia-ml.so.1
    LD_LIBRARY_PATH=DIR FAKE_NVML_CONFIG=CFG python3 scripts/nvml-probe.py   # the fake (tests/fakenvml/build.py)

Read-only: it changes no setting (no MIG mode, no clocks, no reset). Exit 0, or 2 when NVML cannot start.
"""

from __future__ import annotations

import json
import sys

try:
    import pynvml as N
except ImportError:  # pragma: no cover - the probe needs nvidia-ml-py
    print("nvml-probe: nvidia-ml-py is not installed (pip install nvidia-ml-py)", file=sys.stderr)
    sys.exit(2)


def _plain(v):
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if hasattr(v, "_fields_"):
        return {name: _plain(getattr(v, name)) for name, *_ in v._fields_}
    if hasattr(v, "value") and type(v).__module__ == "ctypes":
        return v.value
    if type(v).__name__ == "nvmlFriendlyObject":
        return {k: _plain(x) for k, x in vars(v).items()}
    return v


def ask(fn, *args):
    try:
        return _plain(fn(*args))
    except N.NVMLError as e:
        return f"ERROR {e.value} {e}"
    except Exception as e:  # noqa: BLE001 - a probe reports whatever happens
        return f"EXC {type(e).__name__}: {e}"


def device(h) -> dict:
    d: dict = {}
    simple = {
        "name": N.nvmlDeviceGetName, "uuid": N.nvmlDeviceGetUUID, "minor": N.nvmlDeviceGetMinorNumber,
        "pci": N.nvmlDeviceGetPciInfo_v3, "memory_v1": N.nvmlDeviceGetMemoryInfo,
        "utilization": N.nvmlDeviceGetUtilizationRates, "power_mw": N.nvmlDeviceGetPowerUsage,
        "power_limit_mw": N.nvmlDeviceGetPowerManagementLimit,
        "enforced_limit_mw": N.nvmlDeviceGetEnforcedPowerLimit, "fan": N.nvmlDeviceGetFanSpeed,
        "pstate": N.nvmlDeviceGetPerformanceState, "display_mode": N.nvmlDeviceGetDisplayMode,
        "display_active": N.nvmlDeviceGetDisplayActive, "mig_mode": N.nvmlDeviceGetMigMode,
        "max_mig_devices": N.nvmlDeviceGetMaxMigDeviceCount, "compute_mode": N.nvmlDeviceGetComputeMode,
        "persistence": N.nvmlDeviceGetPersistenceMode,
        "compute_procs": N.nvmlDeviceGetComputeRunningProcesses,
        "graphics_procs": N.nvmlDeviceGetGraphicsRunningProcesses,
        "mps_procs": N.nvmlDeviceGetMPSComputeRunningProcesses,
        "is_mig_device_handle": N.nvmlDeviceIsMigDeviceHandle,
    }
    for key, fn in simple.items():
        d[key] = ask(fn, h)
    d["memory_v2"] = ask(N.nvmlDeviceGetMemoryInfo, h, N.nvmlMemory_v2)
    d["temperature_gpu"] = ask(N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU)
    if hasattr(N, "nvmlDeviceGetTemperatureV"):
        d["temperature_v"] = ask(N.nvmlDeviceGetTemperatureV, h, N.NVML_TEMPERATURE_GPU)
    for label, clock in (("sm", N.NVML_CLOCK_SM), ("mem", N.NVML_CLOCK_MEM)):
        d[f"clock_{label}"] = ask(N.nvmlDeviceGetClockInfo, h, clock)
        d[f"max_clock_{label}"] = ask(N.nvmlDeviceGetMaxClockInfo, h, clock)
    d["process_utilization"] = ask(N.nvmlDeviceGetProcessUtilization, h, 0)
    migs = []
    mode = d["mig_mode"]
    if isinstance(mode, list) and mode and mode[0] == 1 and isinstance(d["max_mig_devices"], int):
        for i in range(d["max_mig_devices"]):
            mh = None
            try:
                mh = N.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except N.NVMLError as e:
                migs.append({"index": i, "handle": f"ERROR {e.value} {e}"})
                continue
            migs.append({"index": i, "uuid": ask(N.nvmlDeviceGetUUID, mh),
                         "gi": ask(N.nvmlDeviceGetGpuInstanceId, mh),
                         "ci": ask(N.nvmlDeviceGetComputeInstanceId, mh),
                         "memory": ask(N.nvmlDeviceGetMemoryInfo, mh),
                         "compute_procs": ask(N.nvmlDeviceGetComputeRunningProcesses, mh)})
    d["mig_devices"] = migs
    return d


def main() -> int:
    try:
        N.nvmlInit()
    except N.NVMLError as e:
        print(f"nvml-probe: NVML did not start: {e}", file=sys.stderr)
        return 2
    out = {
        "driver": ask(N.nvmlSystemGetDriverVersion),
        "nvml": ask(N.nvmlSystemGetNVMLVersion),
        "cuda_driver": ask(N.nvmlSystemGetCudaDriverVersion_v2),
        "count": ask(N.nvmlDeviceGetCount),
        "bad_index": ask(N.nvmlDeviceGetHandleByIndex, 4096),
        "devices": [],
    }
    for i in range(out["count"] if isinstance(out["count"], int) else 0):
        try:
            h = N.nvmlDeviceGetHandleByIndex(i)
        except N.NVMLError as e:
            out["devices"].append({"index": i, "handle": f"ERROR {e.value} {e}"})
            continue
        out["devices"].append({"index": i, **device(h)})
    N.nvmlShutdown()
    json.dump(out, sys.stdout, indent=1, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
