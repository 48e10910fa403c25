"""CLI rough edges from issue 14: exit codes for bad input, whole lines when piped, notes on stderr, JSON
errors for --json."""

from __future__ import annotations

import json
import sys

from tests.conftest import run_gputop


def test_kill_with_a_negative_or_zero_pid_is_bad_input():
    for pid in ("-5", "0"):
        r = run_gputop("kill", "--pid", pid, "--scenario", "/nonexistent.yaml")
        assert r.returncode == 2, (pid, r.stderr)
        assert "above 0" in r.stderr and r.stderr.count("\n") == 1


def test_missing_scenario_file_is_bad_input(tmp_path):
    r = run_gputop("status", "--scenario", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "cannot read scenario" in r.stderr


def test_status_prints_the_whole_command_when_piped(procs, scenario):
    long_arg = "x" * 150
    p = procs.spawn([sys.executable, "-c", "import time; time.sleep(600)", long_arg])
    path = scenario([{"pid": p.pid, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("status", "--scenario", str(path), env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert long_arg in r.stdout  # piped: not cut at a fixed width


def test_log_prints_the_whole_message_when_piped(procs, scenario):
    from tests.functional.names_helpers import spawn_named

    p = spawn_named(procs, "keepme")  # its names agree: a renamed python is a disguise (issue 25)
    path = scenario([{"pid": p.pid, "gpu": 0, "memory": "1GiB"}])
    cfg = path.parent / "config.yaml"
    cfg.write_text("protect: ['keepme']\n")
    r = run_gputop("kill", "--pid", str(p.pid), "--scenario", str(path), "--config", str(cfg))
    assert r.returncode == 5, r.stderr  # protected: refused, and logged with a long message
    full = json.loads(run_gputop("log", "--json").stdout)[-1]["message"]
    assert len(full) > 100
    out = run_gputop("log").stdout
    assert full in out, out


def test_backends_unavailable_note_goes_to_stderr(scenario, monkeypatch):
    # Ask for every backend (auto + a scenario): nvml and the others are unavailable here, simulated works.
    path = scenario([], gpus=1)
    r = run_gputop("status", "--backend", "auto", env={"GPUTOP_SCENARIO": str(path), "GPUTOP_BACKEND": "auto"})
    assert r.returncode == 0, r.stderr
    assert "backends unavailable" not in r.stdout


def test_unavailable_note_is_not_part_of_the_table():
    from gputop.backends.base import BackendStatus
    from gputop.commands.status import render, unavailable_note
    from tests.tui.helpers import frozen_snapshot
    import dataclasses

    snap = dataclasses.replace(frozen_snapshot(), backends=(BackendStatus("simulated", True, "", 4),
                                                            BackendStatus("nvml", False, "nvml: no driver")))
    assert "backends unavailable" not in render(snap)
    assert "nvml: no driver" in unavailable_note(snap)


def test_test_policies_json_without_a_policy_prints_a_json_error(scenario):
    path = scenario([], gpus=1)
    r = run_gputop("guard", "--test-policies", "--json", "--scenario", str(path))
    assert r.returncode == 2
    doc = json.loads(r.stdout)
    assert "no policy file" in doc["error"] and doc["exit_code"] == 2
