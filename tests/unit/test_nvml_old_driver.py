"""A driver library that lacks some of the device calls (an older libnvidia-ml): each missing call makes
its field unknown with "FunctionNotFound", or falls back to the older call; the rest still reads.

The library is a Python stand-in for the C one (the fake libnvidia-ml exports every call): its entry
points get the same ctypes arguments and fill them through ``byref(...)._obj``."""

from __future__ import annotations

import pytest

from gputop.backends import nvml

GPU_IS_LOST = nvml.ERR_GPU_IS_LOST


class OldLib:
    """NVML without the _v2 memory call, TemperatureV, the fan call and the enforced power limit."""

    def __init__(self, lost_on: str | None = None):
        self.lost_on = lost_on
        self.calls: list[str] = []

    def __getattr__(self, name):  # like ctypes.CDLL: a missing symbol is an AttributeError
        raise AttributeError(name)

    def _ret(self, name: str) -> int:
        self.calls.append(name)
        return GPU_IS_LOST if name == self.lost_on else 0

    def nvmlInit_v2(self):
        return 0

    def nvmlShutdown(self):
        return 0

    def nvmlDeviceGetCount_v2(self, n):
        n._obj.value = 1
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, i, h):
        h._obj.value = 0x1000
        return 0

    def nvmlDeviceGetName(self, h, buf, n):
        buf.value = b"Tesla V100"
        return 0

    def nvmlDeviceGetUUID(self, h, buf, n):
        buf.value = b"GPU-0"
        return 0

    def nvmlDeviceGetPciInfo_v3(self, h, pci):
        pci._obj.busId = b"00000000:3B:00.0"
        return 0

    def nvmlDeviceGetMemoryInfo(self, h, m):
        m._obj.total, m._obj.used = 16 << 30, 1 << 30
        return self._ret("memory")

    def nvmlDeviceGetUtilizationRates(self, h, u):
        u._obj.gpu, u._obj.memory = 40, 7
        return self._ret("utilization")

    def nvmlDeviceGetTemperature(self, h, sensor, t):
        t._obj.value = 61
        return self._ret("temperature")

    def nvmlDeviceGetPowerUsage(self, h, p):
        p._obj.value = 150500
        return self._ret("power")

    def nvmlDeviceGetPowerManagementLimit(self, h, p):
        p._obj.value = 250000
        return self._ret("power limit")

    def nvmlDeviceGetClockInfo(self, h, which, c):
        c._obj.value = {nvml.CLOCK_SM: 1380, nvml.CLOCK_MEM: 877}[which]
        return self._ret("clock")


@pytest.fixture
def backend(monkeypatch):
    def make(lib):
        monkeypatch.setattr(nvml, "_load", lambda: lib)
        b = nvml.NvmlBackend()
        return b
    return make


def test_missing_calls_fall_back_or_are_unknown(backend):
    lib = OldLib()
    b = backend(lib)
    for _ in range(2):  # the first read finds what the library lacks; the second goes straight
        d = b.sample(0)
        assert (d.name, d.uuid, d.pci_bus_id) == ("Tesla V100", "GPU-0", "00000000:3B:00.0")
        assert (d.memory_total, d.memory_used) == (16 << 30, 1 << 30)  # the v1 call
        assert (d.util_gpu, d.util_mem, d.temperature) == (40.0, 7.0, 61.0)  # the legacy temperature call
        assert d.power_w == 150.5 and d.power_limit_w == 250.0  # the management limit stands in
        assert (d.clock_sm_mhz, d.clock_mem_mhz) == (1380, 877)
        assert d.fan_pct is None and d.errors == ("fan: FunctionNotFound",)  # unknown, never 0
        assert not d.lost


class NewerLib(OldLib):
    """One that has the enforced power limit call."""

    def nvmlDeviceGetEnforcedPowerLimit(self, h, p):
        p._obj.value = 300000
        return self._ret("enforced limit")


def test_the_enforced_power_limit_comes_first_where_the_library_has_it(backend):
    lib = NewerLib()
    d = backend(lib).sample(0)
    assert d.power_limit_w == 300.0 and "power limit" not in lib.calls


@pytest.mark.parametrize("where", ["power limit", "power", "clock", "utilization", "enforced limit"])
def test_gpu_lost_in_any_field_makes_the_device_lost(backend, where):
    b = backend((NewerLib if where == "enforced limit" else OldLib)(lost_on=where))
    d = b.sample(0)
    assert d.lost and d.name == "Tesla V100"
    assert d.power_w is None and d.memory_used is None  # no field of a lost device is reported
