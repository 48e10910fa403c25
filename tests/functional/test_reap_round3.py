"""Issue 26 on real processes: a member that re-forks faster than a scan, a signal to gputop mid-grace,
a PID-namespace init in an orphan tree, and a process group the reap would orphan. Each test says who
lives and who dies."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gputop import actions
from tests.conftest import run_gputop, wait_gone
from tests.functional.actions_helpers import alive, records, unique, with_marker, write_config

PY = sys.executable
HERE = Path(__file__).resolve().parent
LINUX = sys.platform.startswith("linux")


# ---- helpers ----

@pytest.fixture(scope="module")
def reforker(tmp_path_factory) -> str:
    """The re-forker (reforker.c), compiled with gcc as the suite compiles the fake NVML library."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None or not LINUX:
        pytest.skip("needs a C compiler on Linux")
    out = tmp_path_factory.mktemp("reforker") / "reforker"
    subprocess.run([cc, "-O2", "-o", str(out), str(HERE / "reforker.c")], check=True)
    return str(out)


def marked(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line mentions ``marker``."""
    out = []
    for pid in with_marker(marker):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            pass
    return out


def group_survivors(pgid: int, marker: str) -> list[int]:
    """Live processes of ``marker`` in process group ``pgid``, seen reliably: the group is stopped as one
    first (a chain that re-forks every 100 us is not in a plain scan of /proc), then scanned."""
    try:
        os.killpg(pgid, signal.SIGSTOP)
    except ProcessLookupError:
        return []
    time.sleep(0.02)
    return marked(marker)


def kill_marked(marker: str) -> None:
    """Cleanup for a chain that outlived a failed reap: stop its groups as one, then kill them."""
    for _ in range(50):
        pids = marked(marker)
        if not pids:
            return
        for pid in pids:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)


def state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def orphan_of(procs, inner: str, marker: str, n: int = 1, timeout: float = 10.0) -> list[int]:
    """Start ``inner`` as a real orphan (``setsid sh -c 'inner & exit 0'``); the ``n`` processes with
    ``marker`` in their command line, oldest first."""
    procs.spawn(["setsid", "sh", "-c", f"{inner} & exit 0"]).wait(timeout)
    deadline = time.time() + timeout
    while time.time() < deadline:
        pids = [p for p in marked(marker) if p != os.getpid()]
        if len(pids) >= n:
            pids.sort(key=lambda p: psutil.Process(p).create_time())
            procs.pids.extend(pids)
            return pids
        time.sleep(0.02)
    raise TimeoutError(f"{marker}: not {n} process(es)")


# ---- 2. a member that re-forks: success only when the tree has converged ----

@pytest.mark.parametrize("interval_us", [300, 100])
def test_a_member_that_reforks_is_never_a_false_success(procs, scenario, cfg, reforker, tmp_path, interval_us):
    innocent = procs.sleeper("gt-innocent")
    runs, ok, failed = 20, 0, 0
    for i in range(runs):
        marker = unique(f"gt-refork{interval_us}")
        exe = tmp_path / marker  # its own name, so every successor can be found by its command line
        shutil.copy(reforker, exe)
        [root] = orphan_of(procs, f"{exe} {interval_us}", marker)
        pgid = os.getpgid(root)
        assert pgid != os.getpgrp()
        scenario(holders=[{"pid": root, "gpu": 0, "memory": "1GiB"}])
        try:
            r = actions.reap_tree(root, expected_start=psutil.Process(root).create_time(), face="cli", grace=0.2)
            left = group_survivors(pgid, marker)
            if r.ok:
                ok += 1
                assert left == [], f"run {i}: reported success ({r.message}) while {left} ran on"
                assert "SIGKILL needed" in r.message, r.message
            else:
                failed += 1
                assert r.outcome == "still-alive" and r.details.get("survivors"), r.to_dict()
        finally:
            kill_marked(marker)
    assert alive(innocent.pid)
    # The tree's own process group is stopped as one, so the chain is caught: every run succeeds here.
    assert ok == runs, f"{failed} of {runs} runs failed (no false success, but the chain was not caught)"
