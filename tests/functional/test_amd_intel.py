"""AMD and Intel end to end on fixture /proc and /sys trees: `gputop status --json` in a subprocess, and two
samples through the real Sampler with a controllable clock. On this machine (no such GPU) both backends
say why they are unavailable and status exits 0."""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import subprocess
import sys

import pytest

from gputop.backends.amd import AmdBackend
from gputop.backends.fdinfo import FdinfoScanner
from gputop.backends.intel import IntelBackend
from gputop.core.sampler import Sampler
from tests.conftest import ROOT, run_gputop
from tests.drm_tree import (
    AMD_PCI, BTIME, DEVICE_UTIL, EXPECTED, GIB, I915_PCI, XE_PCI, DrmTree,
)
from tests.unit.test_fdinfo import Clock, denying_listdir


def _without_dac_override():
    """preexec: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set, so that even as root
    the child gets the kernel's real EACCES on the fixture's chmod-000 /proc/<pid>/fd, as an
    unprivileged user does on another user's process."""
    import signal
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                os._exit(97)


def status_json(tree: DrmTree, *extra: str) -> tuple[dict, subprocess.CompletedProcess]:
    env = dict(os.environ, GPUTOP_PROC_ROOT=str(tree.proc), GPUTOP_SYS_ROOT=str(tree.sys))
    env.pop("GPUTOP_BACKEND", None)
    r = subprocess.run([sys.executable, "-m", "gputop", "status", "--json", *extra], capture_output=True,
                       text=True, env=env, timeout=60, cwd=ROOT, preexec_fn=_without_dac_override)
    if r.returncode == 97:
        pytest.skip("cannot drop CAP_DAC_OVERRIDE here, so root would read the unreadable fixture")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r


@pytest.fixture
def tree(tmp_path):
    return DrmTree(tmp_path)


def test_status_json_on_fixture_shows_amd_and_intel(tree):
    data, _ = status_json(tree, "--sample-time", "0")  # one sample: no utilisation yet
    backends = {b["name"]: b for b in data["backends"]}
    assert backends["amd"]["available"] and backends["amd"]["devices"] == 1
    assert backends["intel"]["available"] and backends["intel"]["devices"] == 2
    gpus = {g["pci_bus_id"]: g for g in data["gpu"]["gpus"]}
    assert set(gpus) == {AMD_PCI, I915_PCI, XE_PCI}
    amd = gpus[AMD_PCI]
    assert amd["backend"] == "amd" and amd["name"] == "Radeon RX 7900 XTX"
    assert (amd["utilization_gpu"], amd["memory_total"], amd["memory_used"]) == (37.0, 16 * GIB, 5 * GIB)
    assert (amd["temperature_c"], amd["power_w"], amd["power_limit_w"], amd["fan_percent"]) == \
        (52.0, 120.0, 300.0, 40.0)
    assert amd["clock_sm_mhz"] == 2100 and amd["uuid"] == "7e5a1c2d3b4f5a6e"
    i915 = gpus[I915_PCI]
    assert i915["backend"] == "intel" and i915["clock_sm_mhz"] == 1300
    # Unknown stays unknown: no VRAM counters, no hwmon, and utilisation needs a second sample.
    assert (i915["memory_total"], i915["temperature_c"], i915["utilization_gpu"]) == (None, None, None)
    assert gpus[XE_PCI]["temperature_c"] == 45.0 and gpus[XE_PCI]["power_limit_w"] == 190.0

    index_of = {g["pci_bus_id"]: g["index"] for g in data["gpu"]["gpus"]}
    holders = {h["pid"]: h for h in data["holders"]}
    assert set(holders) == set(EXPECTED)  # pid 500 is unreadable: counted in a warning, below
    for pid, (pci, ctx, mem, _, _) in EXPECTED.items():
        h = holders[pid]
        assert h["gpus"] == [index_of[pci]], pid
        assert (h["ctx"], h["gpu_memory"], h["sm_util"]) == (ctx, mem, None), pid  # first sample: no util
    # Host data from the fixture /proc: names, users, ancestry.
    try:
        user = pwd.getpwuid(1000).pw_name
    except KeyError:
        user = "1000"
    assert holders[202]["cmdline"] == ["python3", "train.py"] and holders[202]["user"] == user
    assert [c["pid"] for c in holders[402]["chain"]] == [401, 100, 1]
    assert holders[402]["start_time"] == pytest.approx(BTIME + 100_000 / os.sysconf("SC_CLK_TCK"), abs=0.01)
    assert "1 process not readable: run as root to see them" in data["warnings"]


def test_status_samples_twice_for_utilisation(tree):
    # The fixture's counters do not move between the two samples: every engine that was read is 0% busy,
    # and only what cannot be known stays N/A (a client without engine keys; a client counted elsewhere).
    data, _ = status_json(tree, "--sample-time", "0.2")
    gpus = {g["pci_bus_id"]: g for g in data["gpu"]["gpus"]}
    assert gpus[I915_PCI]["utilization_gpu"] == 0.0 and gpus[XE_PCI]["utilization_gpu"] == 0.0
    assert gpus[AMD_PCI]["utilization_gpu"] == DEVICE_UTIL[AMD_PCI]  # amdgpu: from sysfs, both times
    holders = {h["pid"]: h for h in data["holders"]}
    for pid, (pci, _, _, util2, _) in EXPECTED.items():
        # xe: utilisation is cycles over total cycles, and the fixture's total cycles did not advance
        # either: 0/0 is unknown, not 0%.
        want = None if util2 is None or pci == XE_PCI else 0.0
        assert holders[pid]["sm_util"] == want, pid


def test_status_backend_amd_only(tree):
    data, _ = status_json(tree, "--backend", "amd")
    assert [g["pci_bus_id"] for g in data["gpu"]["gpus"]] == [AMD_PCI]
    assert sorted(h["pid"] for h in data["holders"]) == [201, 202, 203]
    table = subprocess.run([sys.executable, "-m", "gputop", "status", "--backend", "intel"],
                           capture_output=True, text=True, cwd=ROOT, timeout=60,
                           env=dict(os.environ, GPUTOP_PROC_ROOT=str(tree.proc), GPUTOP_SYS_ROOT=str(tree.sys)))
    assert table.returncode == 0, table.stderr
    assert "vainfo" in table.stdout and "C+G" in table.stdout and "intel" in table.stdout


def test_two_samples_through_the_sampler_match_hand_computed(tree):
    clock = Clock(BTIME + 5000.0)
    sc = FdinfoScanner(str(tree.proc), str(tree.sys), clock=clock,
                       listdir=denying_listdir(tree.unreadable_pid))
    amd = AmdBackend(str(tree.proc), str(tree.sys), scanner=sc, clock=clock)
    intel = IntelBackend(str(tree.proc), str(tree.sys), scanner=sc, clock=clock)
    assert amd.mode == "sysfs"  # a fixture sys root never consults the host's amdsmi
    sampler = Sampler([amd, intel], proc_root=str(tree.proc), clock=clock)

    first = sampler.sample()
    assert sc.scans == 1  # one walk of /proc for three devices and two backends
    assert all(h.sm_util is None for h in first.holders)
    assert first.warnings.count("1 process not readable: run as root to see them") == 1

    tree.write_sample(2)
    clock.t += 2.0
    second = sampler.sample()
    assert sc.scans == 2
    pci_of = {d.index: d.pci_bus_id for d in second.devices}
    for pid, (pci, ctx, mem, util2, _) in EXPECTED.items():
        h = second.holder(pid)
        assert h is not None and [pci_of[g] for g in h.gpus] == [pci], pid
        assert (h.ctx, h.gpu_memory) == (ctx, mem), pid
        assert h.sm_util == (pytest.approx(util2) if util2 is not None else None), pid
    util = {d.pci_bus_id: d.util_gpu for d in second.devices}
    assert util == {k: pytest.approx(v) for k, v in DEVICE_UTIL.items()}
    xe_dev = next(d for d in second.devices if d.pci_bus_id == XE_PCI)
    assert xe_dev.power_w == pytest.approx(50.0)  # energy1_input: 1e8 µJ over 2 s
    assert next(d for d in first.devices if d.pci_bus_id == XE_PCI).power_w is None
    # The whole snapshot serialises, with the per-GPU holder rows the JSON consumers read.
    rows = second.to_dict()["gpu"]["holders"]
    assert {(r["pid"], r["ctx"]) for r in rows} >= {(202, "C"), (203, "C+G"), (201, "G")}
    sampler.close()


def test_this_machine_lists_amd_and_intel_unavailable_and_exits_0(tmp_path):
    empty = tmp_path / "sys"
    empty.mkdir()
    r = run_gputop("status", "--json", env={"GPUTOP_SYS_ROOT": str(empty)})
    assert r.returncode == 0, r.stderr
    reasons = {b["name"]: b["reason"] for b in json.loads(r.stdout)["backends"] if not b["available"]}
    assert reasons["amd"] == f"amd: no amdgpu device in {empty}/class/drm"  # amdsmi: only with the real /sys
    assert reasons["intel"] == f"intel: no i915/xe device in {empty}/class/drm"
    table = run_gputop("status", env={"GPUTOP_SYS_ROOT": str(empty)})
    assert table.returncode == 0 and "intel: no i915/xe device" in table.stdout


@pytest.mark.skipif(os.path.isdir("/sys/class/drm"), reason="this host has DRM devices")
def test_real_sys_without_drm_devices():
    r = run_gputop("status", "--json")
    assert r.returncode == 0, r.stderr
    reasons = {b["name"]: b["reason"] for b in json.loads(r.stdout)["backends"]}
    assert reasons["amd"] == "amd: no amdgpu device in /sys/class/drm (amdsmi not installed)"
    assert reasons["intel"] == "intel: no i915/xe device in /sys/class/drm"
    one = run_gputop("status", "--backend", "amd")
    assert one.returncode == 6 and "amd: no amdgpu device" in one.stderr
