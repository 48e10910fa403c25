"""DRM fdinfo parsing and scanning, and DRM sysfs metrics, on fixture trees in the kernel's formats.

Every expected number is computed by hand in tests/drm_tree.py (EXPECTED) or below.
"""

from __future__ import annotations

import os

import pytest

from gputop.backends.drm_sysfs import find_cards, read_card
from gputop.backends.fdinfo import (
    FdinfoScanner, engine_utilisation, parse_fdinfo, parse_number,
)
from tests.drm_tree import (
    AMD_PCI, EXPECTED, GIB, I915_PCI, KIB, MIB, XE_PCI, DrmTree, amdgpu_new, amdgpu_old, i915, i915_bare, xe,
)


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def denying_listdir(*pids: int):
    """As root, chmod 000 does not stop us; this listdir raises the PermissionError the kernel raises for
    another user's /proc/<pid>/fd. The real EACCES path is covered by the functional test (run as nobody)."""
    def listdir(path: str) -> list[str]:
        for pid in pids:
            if path.endswith(f"/{pid}/fd"):
                raise PermissionError(13, "Permission denied", path)
        return os.listdir(path)
    return listdir


@pytest.fixture
def tree(tmp_path):
    return DrmTree(tmp_path)


def scanner(tree, clock, **kw):
    kw.setdefault("listdir", denying_listdir(tree.unreadable_pid))
    return FdinfoScanner(str(tree.proc), str(tree.sys), clock=clock, **kw)


# ---- parsing ----

def test_units():
    assert parse_number("1234") == 1234
    assert parse_number("4 KiB") == 4096
    assert parse_number("2 MiB") == 2 * MIB
    assert parse_number("5 ns") == 5
    assert parse_number("12 parsecs") is None
    assert parse_number("") is None


def test_memory_prefers_resident_then_memory_then_total():
    c = parse_fdinfo(amdgpu_new(11, 5))
    # vram: resident 98304 KiB beats memory 65536 KiB and total 131072 KiB; gtt: resident 2048 KiB.
    assert c.memory == {"vram": 98304 * KIB, "gtt": 2048 * KIB, "cpu": 0}
    assert c.gpu_memory == 98304 * KIB  # device-local region only
    old = parse_fdinfo(amdgpu_old(12, "4194304 KiB"))
    assert old.memory["vram"] == 4 * GIB and old.memory["gtt"] == 1024 * KIB  # "gtt: \t" spacing is fine
    assert parse_fdinfo(amdgpu_old(13, "512 MiB")).gpu_memory == 512 * MIB
    total_only = parse_fdinfo("drm-driver:\txe\ndrm-total-vram0:\t3 MiB\ndrm-total-gtt:\t1 MiB\n")
    assert total_only.gpu_memory == 3 * MIB


def test_integrated_memory_sums_all_regions():
    c = parse_fdinfo(i915(7, 1, 2))
    assert c.memory == {"system0": 6144 * KIB, "stolen-system0": 0}
    assert c.gpu_memory == 6144 * KIB


def test_engines_cycles_capacity_and_ids():
    c = parse_fdinfo(xe(21, 100, 200, 1000))
    assert (c.driver, c.pdev, c.client_id) == ("xe", XE_PCI, 21)
    assert c.cycles["rcs"] == 100 and c.total_cycles["ccs"] == 1000
    assert c.capacity == {"vcs": 2, "ccs": 4}
    assert "total-cycles-rcs" not in c.memory and not any(k.startswith("cycles") for k in c.memory)
    assert c.memory["vram0"] == 262144 * KIB
    i = parse_fdinfo(i915(7, 10, 20))
    assert i.engines == {"render": 10, "copy": 0, "video": 20, "video-enhance": 0}
    assert i.capacity == {"video": 2}


def test_missing_keys_and_non_drm():
    bare = parse_fdinfo(i915_bare(8))
    assert bare.gpu_memory is None and bare.engines == {} and bare.cycles == {}
    assert parse_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t1\n") is None
    assert parse_fdinfo("drm-driver:\tamdgpu\n").client_id is None


def test_utilisation_first_sample_none_then_deltas():
    a = parse_fdinfo(i915(7, 500_000_000, 0))
    util, state = engine_utilisation(None, a, 10.0)
    assert util is None
    b = parse_fdinfo(i915(7, 900_000_000, 2_000_000_000))
    util, _ = engine_utilisation(state, b, 12.0)
    assert util["render"] == pytest.approx(20.0)  # 0.4e9 ns / 2e9 ns
    assert util["video"] == pytest.approx(50.0)  # 2e9 / (2e9 * capacity 2)


def test_backwards_counter_is_not_negative_and_keeps_the_larger_value():
    s1 = parse_fdinfo(amdgpu_old(13, "1 MiB", gfx=3_000_000_000, compute=1_000_000_000))
    _, st = engine_utilisation(None, s1, 0.0)
    s2 = parse_fdinfo(amdgpu_old(13, "1 MiB", gfx=2_500_000_000, compute=1_500_000_000))
    util, st = engine_utilisation(st, s2, 2.0)
    assert util == {"gfx": 0.0, "compute": pytest.approx(25.0)}
    assert st.engines["gfx"] == 3_000_000_000  # stays with the larger previous value
    s3 = parse_fdinfo(amdgpu_old(13, "1 MiB", gfx=3_200_000_000, compute=1_500_000_000))
    util, _ = engine_utilisation(st, s3, 4.0)
    assert util["gfx"] == pytest.approx(10.0)  # 0.2e9 over the kept 3.0e9, not 0.7e9 over 2.5e9


def test_xe_cycles_over_total_cycles():
    _, st = engine_utilisation(None, parse_fdinfo(xe(21, 1000, 2000, 10_000)), 0.0)
    util, _ = engine_utilisation(st, parse_fdinfo(xe(21, 4000, 10_000, 20_000)), 0.5)
    assert util["rcs"] == pytest.approx(30.0)  # 3000 / 10000; wall time does not matter
    assert util["ccs"] == pytest.approx(20.0)  # 8000 / (10000 * 4)
    assert util["bcs"] == 0.0


# ---- scanning ----

def _by_pid(scan):
    return {u.pid: u for uses in scan.uses.values() for u in uses}


def test_scan_two_samples_matches_hand_computed(tree):
    clock = Clock()
    sc = scanner(tree, clock)
    first = _by_pid(sc.scan())
    assert set(first) == set(EXPECTED)  # 500 unreadable, 600 has no DRM fd, 1/100/2 none either
    for pid, (pci, ctx, mem, _, _) in EXPECTED.items():
        assert (first[pid].pdev, first[pid].ctx, first[pid].memory) == (pci, ctx, mem), pid
        assert first[pid].util is None, pid  # the first sample has no utilisation
    tree.write_sample(2)
    clock.t += 2.0
    scan = sc.scan()
    second = _by_pid(scan)
    for pid, (pci, ctx, mem, util2, _) in EXPECTED.items():
        assert (second[pid].ctx, second[pid].memory) == (ctx, mem), pid
        assert second[pid].util == (pytest.approx(util2) if util2 is not None else None), pid
    assert scan.device_util(I915_PCI) == pytest.approx(50.0)
    assert scan.device_util(XE_PCI) == pytest.approx(30.0)
    tree.write_sample(3)
    clock.t += 2.0
    third = _by_pid(sc.scan())
    for pid, (_, _, _, _, util3) in EXPECTED.items():
        assert third[pid].util == (pytest.approx(util3) if util3 is not None else None), pid


def test_dedupe_two_fds_one_client_and_shared_across_processes(tree):
    scan = scanner(tree, Clock()).scan()
    uses = _by_pid(scan)
    assert uses[201].clients == (11,)  # fds 5 and 6 are one client: memory counted once
    assert uses[201].memory == 98304 * KIB
    assert uses[401].memory == 262144 * KIB and uses[402].memory == 0  # 402 inherited 401's client
    amd_total = sum(u.memory or 0 for u in scan.uses[AMD_PCI])
    assert amd_total == 98304 * KIB + 4 * GIB + 512 * MIB


def test_unreadable_process_is_counted_not_dropped(tree):
    sc = scanner(tree, Clock())
    scan = sc.scan()
    assert scan.unreadable == 1  # pid 500; the kernel thread (pid 2, empty cmdline) is not counted
    assert sc.warnings() == ["1 process not readable: run as root to see them"]
    assert sc.warnings(once=True) and sc.warnings(once=True) == []


def test_unreadable_fdinfo_file_is_counted(tree):
    def opener(path: str) -> bytes:
        if path.endswith("/301/fdinfo/9"):
            raise PermissionError(13, "Permission denied", path)
        with open(path, "rb") as f:
            return f.read()
    sc = scanner(tree, Clock(), opener=opener)
    scan = sc.scan()
    assert 301 not in _by_pid(scan)
    assert scan.unreadable == 2
    assert sc.warnings() == ["2 processes not readable: run as root to see them"]


def test_one_walk_of_proc_per_refresh(tree):
    clock = Clock()
    sc = scanner(tree, clock)
    for _ in range(5):
        sc.scan()
    assert sc.scans == 1
    clock.t += 1.0
    sc.scan()
    assert sc.scans == 2


def test_regular_files_are_not_devices_on_the_real_proc(tree):
    # With node_files off (the real /proc), a regular file saying "226:128" is not a DRM device.
    sc = scanner(tree, Clock(), node_files=False)
    assert sc.scan().uses == {}


# ---- sysfs ----

def test_sysfs_cards_and_metrics(tree):
    amd = find_cards(str(tree.sys), {"amdgpu"})
    assert [(c.card, c.pci, c.driver) for c in amd] == [("card1", AMD_PCI, "amdgpu")]
    intel = find_cards(str(tree.sys), {"i915", "xe"})
    assert [(c.pci, c.driver) for c in intel] == [(I915_PCI, "i915"), (XE_PCI, "xe")]
    m = read_card(amd[0])
    assert (m.util_gpu, m.memory_total, m.memory_used) == (37.0, 16 * GIB, 5 * GIB)
    assert (m.temperature, m.power_w, m.power_limit_w, m.fan_pct) == (52.0, 120.0, 300.0, 40.0)
    assert (m.clock_sm_mhz, m.clock_mem_mhz, m.name) == (2100, 1249, "Radeon RX 7900 XTX")
    i = read_card(intel[0])
    assert i.util_gpu is None and i.memory_total is None and i.temperature is None  # unknown, not 0
    assert i.clock_sm_mhz == 1300
    x = read_card(intel[1])
    assert (x.temperature, x.power_w, x.power_limit_w, x.clock_sm_mhz) == (45.0, None, 190.0, 2400)
    assert x.energy_uj == 1_000_000_000
    assert find_cards(str(tree.root / "nowhere"), {"amdgpu"}) == []


def test_engine_missing_from_a_sample_keeps_its_value():
    # amdgpu prints only engines with time; one vanishing for a sample must not restart its count at 0.
    _, st = engine_utilisation(None, parse_fdinfo(amdgpu_old(13, "1 MiB", gfx=4_000_000_000)), 0.0)
    util, st = engine_utilisation(st, parse_fdinfo(amdgpu_old(13, "1 MiB")), 1.0)
    assert util == {"gfx": 0.0} and st.engines["gfx"] == 4_000_000_000
    util, _ = engine_utilisation(st, parse_fdinfo(amdgpu_old(13, "1 MiB", gfx=4_500_000_000)), 2.0)
    assert util["gfx"] == pytest.approx(50.0)  # 0.5e9 ns over 1 s, not 4.5e9
