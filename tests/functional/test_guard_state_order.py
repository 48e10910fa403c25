"""Guard mode and policy changes: no-op changes are not recorded, concurrent changes are recorded in the
order they were made, --config's guard.policy is honoured, and an unwritable audit log is reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from gputop.core import auditlog
from gputop.guard import state
from tests.conftest import run_gputop
from tests.functional.test_guard_daemon import KILL_VICTIMS


def mode_records():
    return [r for r in auditlog.read() if r.get("action") == "guard-mode"]


def test_a_no_op_mode_change_is_not_recorded():
    state.set_mode("enforce", "cli")
    assert state.set_mode("enforce", "api") == "enforce"
    state.set_mode("enforce", "mcp")
    recs = mode_records()
    assert [(r["previous"], r["mode"]) for r in recs] == [("off", "enforce")]


def test_concurrent_mode_changes_are_recorded_in_order():
    modes = ["dry-run", "enforce", "off"] * 14

    def go(m):
        state.set_mode(m, "api")

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(go, modes))
    recs = mode_records()
    assert recs
    # each record's "previous" is the mode the one before it set: the log tells one consistent story
    for a, b in zip(recs, recs[1:]):
        assert b["previous"] == a["mode"], (a, b)
        assert b["previous"] != b["mode"]
    assert recs[-1]["mode"] == state.get_mode()


def test_concurrent_cli_processes_are_recorded_in_order():
    flags = ["--enforce", "--dry-run", "--disable"] * 5
    ps = [subprocess.Popen([sys.executable, "-m", "gputop", "guard", f], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL) for f in flags]
    for p in ps:
        p.wait(60)
    recs = mode_records()
    for a, b in zip(recs, recs[1:]):
        assert b["previous"] == a["mode"], (a, b)
    assert all(r["previous"] != r["mode"] for r in recs)


def test_config_guard_policy_is_used_by_guard_status(tmp_path):
    pol = tmp_path / "policy.yaml"
    pol.write_text(KILL_VICTIMS)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"guard:\n  policy: {pol}\n")
    r = run_gputop("--config", str(cfg), "guard", "status", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["policy_file"] == str(pol) and st["rules"] == ["kill-victims"]
    r = run_gputop("--config", str(cfg), "guard", "--test-policies", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["policy_file"] == str(pol)


@pytest.mark.skipif(os.geteuid() == 0 and not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_enforce_with_an_unwritable_audit_log_prints_the_mode_line(tmp_path):
    r = run_gputop("guard", "--enforce", env={"GPUTOP_AUDIT_LOG": "/dev/full"})
    assert r.returncode == 1, r.stderr
    assert "guard mode: off -> enforce" in r.stdout
    assert "the audit log could not be written" in r.stderr
    assert state.get_mode() == "enforce"
