"""Review of issue 11 and the ownership rules: the reap planner (not only `status`) must follow the cgroup
owner rules. A process in a systemd service is managed by systemd, never an orphan, so a reap never
signals it: neither as the root named with --root, nor as a member of an orphan tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gputop.util.errors import EXIT_REFUSED
from tests.conftest import run_gputop, wait_gone
from tests.functional.test_ownership_cgroups import Cgroups, run_root, sample  # noqa: F401  (fixtures)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="needs root on Linux to make cgroups")


@pytest.fixture
def cgroups():
    c = Cgroups()
    yield c
    c.cleanup()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_reap_root_of_a_service_daemon_is_refused(procs, scenario, cgroups, run_root, cfg):
    """`status` says the unit's double-forked daemon is not an orphan; `reap --apply --root` must agree."""
    daemon = procs.orphan("sleep 721", "sleep 721")
    unit = f"{cgroups.tag}-train.service"
    cgroups.move(cgroups.systemd, f"{cgroups.tag}/system.slice/{unit}", daemon)
    scen = scenario([{"pid": daemon, "gpu": 0, "memory": "2GiB"}])

    st = run_gputop("status", "--scenario", str(scen))
    assert f"pid {daemon}: not-orphan: managed by systemd unit {unit}" in st.stdout, st.stdout

    out = run_gputop("reap", "--apply", "--root", str(daemon), "--scenario", str(scen), "--grace", "1")
    assert _alive(daemon), f"reap --root killed a process of {unit}: {out.stdout}{out.stderr}"
    assert out.returncode == EXIT_REFUSED, out.stdout + out.stderr
    assert "systemd unit" in out.stderr


def test_reap_never_signals_a_tree_member_in_a_service(procs, scenario, cgroups, run_root, cfg, tmp_path):
    """An orphan root with two children in the dead session: one stays in the tree, one was moved into a
    systemd service (a unit took it over). The reap takes the first and leaves the unit's process alone."""
    script = tmp_path / "tree.sh"
    script.write_text("sleep 731 &\nsleep 732 &\nwait\n")
    procs.spawn(["setsid", "sh", "-c", f"bash {script} & exit 0"]).wait(10)
    worker = procs.wait_for("sleep 731")
    managed = procs.wait_for("sleep 732")
    root = psutil.Process(worker).ppid()
    procs.pids.append(root)
    assert psutil.Process(managed).ppid() == root
    unit = f"{cgroups.tag}-agent.service"
    cgroups.move(cgroups.systemd, f"{cgroups.tag}/system.slice/{unit}", managed)
    scen = scenario([{"pid": worker, "gpu": 0, "memory": "1GiB"}, {"pid": managed, "gpu": 1, "memory": "1GiB"}])

    st = run_gputop("status", "--scenario", str(scen))
    assert f"pid {managed}: not-orphan: managed by systemd unit {unit}" in st.stdout, st.stdout

    prev = run_gputop("reap", "--scenario", str(scen))
    out = run_gputop("reap", "--apply", "--root", str(root), "--scenario", str(scen), "--grace", "1")
    assert wait_gone(worker), out.stdout + out.stderr
    assert _alive(managed), (f"the reap signalled pid {managed} of {unit}, which status calls not-orphan:\n"
                             f"{prev.stdout}\n{out.stdout}{out.stderr}")
    assert f"left alone {managed:>7}" in prev.stdout and unit in prev.stdout, prev.stdout
    assert f"left alone {managed:>7} [{unit}]: not-orphan" in prev.stdout, prev.stdout  # the plan names the owner


def test_the_reap_plan_names_the_owner_of_what_it_leaves_alone(procs, scenario, cgroups, run_root, cfg, tmp_path):
    script = tmp_path / "tree.sh"
    script.write_text("sleep 751 &\nsleep 752 &\nwait\n")
    procs.spawn(["setsid", "sh", "-c", f"bash {script} & exit 0"]).wait(10)
    worker = procs.wait_for("sleep 751")
    managed = procs.wait_for("sleep 752")
    procs.pids.append(psutil.Process(worker).ppid())
    unit = f"{cgroups.tag}-agent.service"
    cgroups.move(cgroups.systemd, f"{cgroups.tag}/system.slice/{unit}", managed)
    scen = scenario([{"pid": worker, "gpu": 0, "memory": "1GiB"}])
    data = json.loads(run_gputop("reap", "--json", "--scenario", str(scen)).stdout)
    [tree] = data["trees"]
    [left] = tree["left_alone"]
    assert left["pid"] == managed and left["rule"] == "not-orphan" and left["owner"] == unit, left


def test_the_watchdog_leaves_a_service_member_alive(procs, scenario, cgroups, run_root, cfg, tmp_path):
    script = tmp_path / "tree.sh"
    script.write_text("sleep 741 &\nsleep 742 &\nwait\n")
    procs.spawn(["setsid", "sh", "-c", f"bash {script} & exit 0"]).wait(10)
    worker = procs.wait_for("sleep 741")
    managed = procs.wait_for("sleep 742")
    root = psutil.Process(worker).ppid()
    procs.pids.append(root)
    unit = f"{cgroups.tag}-agent.service"
    cgroups.move(cgroups.systemd, f"{cgroups.tag}/system.slice/{unit}", managed)
    scen = scenario([{"pid": worker, "gpu": 0, "memory": "1GiB"}])
    out = run_gputop("reap", "--watch", "--apply", "--grace", "0", "--interval", "0.2", "--count", "2",
                     "--scenario", str(scen))
    assert out.returncode == 0, out.stderr
    assert wait_gone(worker) and wait_gone(root), out.stdout
    time.sleep(0.3)
    assert _alive(managed), f"the watchdog reaped pid {managed} of {unit}: {out.stdout}"
