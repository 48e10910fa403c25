"""The churn benchmark's holders (benchmarks/_churner.py, issue 33) are real processes that are replaced as
told, described to the GPU library after each change, and all gone when the benchmark leaves."""

from __future__ import annotations

import json
import os
import time

import yaml

from benchmarks.churn import Churn


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_the_churner_replaces_the_oldest_holders_and_stops_them_all():
    churn = Churn(gpus=2, holders=6, replace=3, every=0.3, backend="simulated")
    with churn:
        first = json.loads(churn.pids_file.read_text())["pids"]
        assert len(first) == 6 and all(_alive(p) for p in first)
        deadline = time.monotonic() + 30
        while churn.generation < 2 and time.monotonic() < deadline:
            churn.follow()
            time.sleep(0.05)
        assert churn.generation >= 2
        now = json.loads(churn.pids_file.read_text())["pids"]
        assert len(now) == 6 and all(_alive(p) for p in now)
        assert not any(_alive(p) for p in first), "the replaced holders were killed and reaped"
        scenario = yaml.safe_load((churn.dir / "scenario.yaml").read_text())
        listed = [h["pid"] for h in scenario["holders"]]
        assert set(listed) <= set(first) | set(now) and len(listed) == 6  # the scenario follows the churner
        churner = json.loads(churn.pids_file.read_text())["churner"]
    deadline = time.monotonic() + 10
    while (_alive(churner) or any(_alive(p) for p in now)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(churner) and not any(_alive(p) for p in now)
    assert not os.path.exists(churn.dir)
