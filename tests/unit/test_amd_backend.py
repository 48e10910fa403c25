"""The AMD backend with and without amdsmi. amdsmi is the vendor library, so it is the one thing faked here:
a stand-in module object with amdsmi's function names and return shapes (amdsmi_interface.py)."""

from __future__ import annotations

import enum
import os
import sys
import types

import pytest

from gputop.backends.amd import AmdBackend, load_amdsmi
from gputop.backends.base import BackendUnavailable, ResetError
from gputop.backends.fdinfo import FdinfoScanner
from tests.drm_tree import AMD_PCI, GIB, KIB, MIB, DrmTree
from tests.unit.test_fdinfo import Clock, denying_listdir


class FakeAmdSmi(types.SimpleNamespace):
    class AmdSmiMemoryType(enum.IntEnum):
        VRAM = 0

    class AmdSmiTemperatureType(enum.IntEnum):
        EDGE = 0

    class AmdSmiTemperatureMetric(enum.IntEnum):
        CURRENT = 0

    def __init__(self, procs=None, fail=()):
        super().__init__()
        self.procs = procs if procs is not None else []
        self.fail = set(fail)
        self.resets: list[str] = []
        self.shut = False

    def _chk(self, name):
        if name in self.fail:
            raise RuntimeError(f"AMDSMI_STATUS_NOT_SUPPORTED ({name})")

    def amdsmi_get_processor_handles(self):
        return ["h0"]

    def amdsmi_get_gpu_device_bdf(self, h):
        return AMD_PCI.upper()

    def amdsmi_get_gpu_asic_info(self, h):
        return {"market_name": "AMD Instinct MI300X", "vendor_id": "0x1002"}

    def amdsmi_get_gpu_device_uuid(self, h):
        return "1fff74a1-0000-1000-80ed-8c6b5e2b4b3a"

    def amdsmi_get_gpu_activity(self, h):
        self._chk("activity")
        return {"gfx_activity": 88, "umc_activity": 41, "mm_activity": "N/A"}

    def amdsmi_get_gpu_memory_total(self, h, kind):
        return 192 * GIB

    def amdsmi_get_gpu_memory_usage(self, h, kind):
        return 12 * GIB

    def amdsmi_get_temp_metric(self, h, kind, metric):
        self._chk("temp")
        return 61

    def amdsmi_get_power_info(self, h):
        return {"current_socket_power": 455, "average_socket_power": 440, "power_limit": 750_000_000}

    def amdsmi_get_gpu_process_list(self, h):
        return self.procs

    def amdsmi_reset_gpu(self, h):
        self.resets.append(h)

    def amdsmi_shut_down(self):
        self.shut = True


@pytest.fixture
def tree(tmp_path):
    return DrmTree(tmp_path)


def backend(tree, smi=None, clock=None):
    clock = clock or Clock()
    sc = FdinfoScanner(str(tree.proc), str(tree.sys), clock=clock, listdir=denying_listdir(tree.unreadable_pid))
    return AmdBackend(str(tree.proc), str(tree.sys), scanner=sc, clock=clock, smi=smi)


def test_amdsmi_metrics_override_sysfs_and_unsupported_fields_fall_back(tree):
    smi = FakeAmdSmi(fail={"temp"})
    b = backend(tree, smi)
    assert b.mode == "amdsmi" and b.device_count() == 1
    d = b.sample(0)
    assert (d.name, d.util_gpu, d.util_mem) == ("AMD Instinct MI300X", 88.0, 41.0)
    assert (d.memory_total, d.memory_used, d.power_w, d.power_limit_w) == (192 * GIB, 12 * GIB, 455.0, 750.0)
    assert d.temperature == 52.0  # amdsmi said NOT_SUPPORTED: sysfs hwmon fills in
    assert d.pci_bus_id == AMD_PCI and not d.lost
    b.close()
    assert smi.shut


def test_amdsmi_processes_are_united_with_fdinfo_per_pid(tree):
    smi = FakeAmdSmi(procs=[
        # KFD compute processes, as amdsmi_get_gpu_process_list returns them
        {"name": "python3", "pid": 202, "mem": 0, "engine_usage": {"gfx": 0, "enc": 0},
         "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 6 * GIB}, "cu_occupancy": 40},
        {"name": "glxgears", "pid": 201, "mem": 0, "engine_usage": {"gfx": 0, "enc": 0},
         "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 1 * MIB}},
        {"name": "N/A", "pid": 4_000_000, "mem": 0, "engine_usage": {"gfx": 0, "enc": 0},
         "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 2 * GIB}},
    ])
    procs = {p.pid: p for p in backend(tree, smi).processes(0)}
    assert set(procs) == {201, 202, 203, 4_000_000}
    assert (procs[202].ctx, procs[202].used_memory) == ("C", 6 * GIB)  # larger of amdsmi 6 GiB, fdinfo 4 GiB
    assert (procs[201].ctx, procs[201].used_memory) == ("C+G", 98304 * KIB)  # graphics + KFD: C+G
    assert (procs[203].ctx, procs[203].used_memory) == ("C+G", 512 * MIB)  # fdinfo only
    assert procs[4_000_000].visible is False  # a KFD pid not in this /proc: kept, marked not visible
    assert procs[4_000_000].used_memory == 2 * GIB


def test_reset_needs_amdsmi_and_root(tree, monkeypatch):
    plain = backend(tree)
    with pytest.raises(ResetError) as e:
        plain.reset(0)
    assert e.value.kind == "unsupported" and "amdsmi" in str(e.value)
    smi = FakeAmdSmi()
    b = backend(tree, smi)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ResetError) as e:
        b.reset(0)
    assert e.value.kind == "permission" and smi.resets == []
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert "amdsmi_reset_gpu" in b.reset(0)
    assert smi.resets == ["h0"]


def test_import_keyerror_when_libamd_smi_is_missing(tmp_path, monkeypatch):
    # What the real amdsmi package does without libamd_smi.so: a KeyError from its library lookup.
    pkg = tmp_path / "amdsmi"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("libs = {}\nlib = libs['libamd_smi.so']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    with pytest.raises(BackendUnavailable, match="libamd_smi.so not found"):
        load_amdsmi()


def test_init_failure_and_not_installed(tmp_path, monkeypatch):
    pkg = tmp_path / "amdsmi"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "class AmdSmiLibraryException(Exception): pass\n"
        "def amdsmi_init(*a):\n    raise AmdSmiLibraryException('AMDSMI_STATUS_INIT_ERROR')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    with pytest.raises(BackendUnavailable, match="amd: amdsmi init failed: .*INIT_ERROR"):
        load_amdsmi()
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # not importable at all
    with pytest.raises(BackendUnavailable, match="^amd: amdsmi not installed$"):
        load_amdsmi()


def test_no_device_reason(tmp_path):
    (tmp_path / "sys").mkdir()
    with pytest.raises(BackendUnavailable) as e:
        AmdBackend(str(tmp_path), str(tmp_path / "sys"), use_amdsmi=False)
    assert str(e.value) == f"amd: no amdgpu device in {tmp_path}/sys/class/drm"
