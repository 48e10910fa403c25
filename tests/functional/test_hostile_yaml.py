"""Billion-laughs, oversized and FIFO policies, configs and scenarios are refused at once, in bounded
memory, and a running guard keeps its last valid policy."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time

import pytest

from gputop.util.errors import EXIT_USAGE, UsageError
from gputop.guard.policy import PolicyError, load_policy, parse_policy
from tests.conftest import run_gputop_measured
from tests.functional.test_guard_daemon import KILL_VICTIMS

LAUGHS = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)) + "rules: *a9\n"


def big_policy(n_bytes: int) -> str:
    rule = ("  - name: r{i}\n    conditions:\n      - {{type: process_name, operator: '==', value: x}}\n"
            "    action: log\n")
    out, i = ["rules:\n"], 0
    size = len(out[0])
    while size < n_bytes:
        s = rule.format(i=i)
        out.append(s)
        size += len(s)
        i += 1
    return "".join(out)


def test_billion_laughs_is_refused_at_once(tmp_path):
    assert len(LAUGHS) < 1200
    p = tmp_path / "lol.yaml"
    p.write_text(LAUGHS)
    t = time.monotonic()
    with pytest.raises(PolicyError, match="invalid policy: aliases expand to more than"):
        load_policy(p)
    assert time.monotonic() - t < 1.0


def test_oversized_policy_is_refused_before_it_is_read(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text(big_policy(3 << 20))
    t = time.monotonic()
    with pytest.raises(PolicyError, match="invalid policy: the file is .* bytes; at most 1048576"):
        load_policy(p)
    assert time.monotonic() - t < 1.0


def test_many_nodes_and_deep_nesting_are_refused():
    with pytest.raises(PolicyError, match="more than 50000 nodes"):
        parse_policy("rules: [" + ", ".join(["1"] * 60000) + "]\n")
    with pytest.raises(PolicyError, match="nesting deeper than 64"):
        parse_policy("rules: " + "[" * 100 + "]" * 100 + "\n")


def test_policy_fifo_does_not_block(tmp_path):
    fifo = tmp_path / "policy.yaml"
    os.mkfifo(fifo)
    done = []
    t = threading.Thread(target=lambda: done.append(pytest.raises(PolicyError, load_policy, fifo)), daemon=True)
    t.start()
    t.join(3)
    assert done, "load_policy blocked on a FIFO"
    assert "not a regular file" in str(done[0].value)


@pytest.mark.parametrize("kind", ["laughs", "big"])
def test_cli_refuses_with_exit_2_in_bounded_memory(tmp_path, kind):
    p = tmp_path / "p.yaml"
    p.write_text(LAUGHS if kind == "laughs" else big_policy(50 << 20))
    rc, _, err, peak_mib, elapsed = run_gputop_measured(["guard", "--policy-file", str(p)], {}, tmp_path)
    assert rc == EXIT_USAGE, err
    assert "invalid policy" in err and "Traceback" not in err
    assert peak_mib < 150, f"peak RSS {peak_mib:.0f} MiB"  # the bomb took 990 MB
    assert elapsed < 15  # Python start-up on a loaded machine; the bomb took over 60 s


def test_running_guard_keeps_its_policy_over_bombs_big_files_and_fifos(scenario, tmp_path):
    from gputop.guard.daemon import GuardDaemon
    from tests.functional.guard_helpers import Clock, sampler_for

    policy = tmp_path / "policy.yaml"
    policy.write_text(KILL_VICTIMS)
    path = scenario(holders=[], gpus=1)
    out = io.StringIO()
    d = GuardDaemon(sampler_for(path, Clock()), str(policy), interval=0.1, out=out)
    d.tick()

    def fifo():
        policy.unlink()
        os.mkfifo(policy)

    for bad in (lambda: policy.write_text(LAUGHS), lambda: policy.write_text(big_policy(2 << 20)), fifo):
        bad()
        os.utime(policy, ns=(time.time_ns(), time.time_ns() + 10**9))
        t = time.monotonic()
        d.tick()  # must not raise or block: a running guard keeps going
        assert time.monotonic() - t < 2.0
        assert [r.name for r in d.policy.rules] == ["kill-victims"]
        assert "invalid policy" in d.last_error
        if policy.is_fifo():
            policy.unlink()
            policy.write_text(KILL_VICTIMS)


def test_config_and_scenario_bombs_are_usage_errors(tmp_path, monkeypatch):
    from gputop.backends.simulated import SimulatedBackend
    from gputop.core.config import load_config

    cfg = tmp_path / "config.yaml"
    cfg.write_text(LAUGHS.replace("rules:", "protect:"))
    with pytest.raises(UsageError, match="aliases expand"):
        load_config(str(cfg))
    scen = tmp_path / "scenario.yaml"
    scen.write_text(LAUGHS.replace("rules:", "gpus:"))
    with pytest.raises(UsageError, match="aliases expand"):
        SimulatedBackend(scen)
