"""gputop reset on the simulated backend, with real holder processes."""

from __future__ import annotations

import json
import time

import pytest

from gputop import actions
from gputop.backends.base import ResetError
from gputop.backends.simulated import SimulatedBackend
from gputop.core.config import load_config
from gputop.util.errors import EXIT_NOT_FOUND, EXIT_PERMISSION, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_FAILURE
from gputop.core.sampler import Sampler
from tests.conftest import run_gputop, wait_gone
from tests.functional.actions_helpers import (
    alive, check_common, records, spawn_ignoring_term, write_config,
)
from tests.functional.names_helpers import spawn_named


def resets(sc) -> list[dict]:
    log = sc.with_name(sc.name + ".resets.jsonl")
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def test_refuses_while_held_and_lists_holders(procs, scenario, cfg):
    holder = procs.sleeper("gt-busy")
    sc = scenario(holders=[{"pid": holder.pid, "gpu": 0, "memory": "4GiB"}])
    r = run_gputop("reset", "--gpu", "0")
    assert r.returncode == EXIT_REFUSED
    assert "in use by 1 process" in (r.stdout + r.stderr) and "--force" in (r.stdout + r.stderr)
    assert f"holder pid {holder.pid} (gt-busy" in (r.stdout + r.stderr)
    assert alive(holder.pid) and resets(sc) == []
    [rec] = records(action="reset")
    check_common(rec, action="reset", outcome="busy")
    assert rec["target"] == {"gpu": 0}
    assert [h["pid"] for h in rec["details"]["holders"]] == [holder.pid]


def test_force_kills_holders_through_the_kill_path_then_resets(procs, scenario, cfg):
    stubborn = spawn_ignoring_term(procs, "gt-stubborn")
    polite = procs.sleeper("gt-polite")
    other_gpu = procs.sleeper("gt-other-gpu")
    bystander = procs.sleeper("gt-bystander")
    sc = scenario(holders=[{"pid": stubborn.pid, "gpu": 0, "memory": "4GiB"},
                           {"pid": polite.pid, "gpu": 0, "memory": "1GiB"},
                           {"pid": other_gpu.pid, "gpu": 1, "memory": "1GiB"}])
    r = run_gputop("reset", "--gpu", "0", "--force", "--timeout", "0.5", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] and out["outcome"] == "reset" and out["gpu"] == 0
    kills = {k["pid"]: k["outcome"] for k in out["details"]["kills"]}
    assert kills == {stubborn.pid: "killed", polite.pid: "terminated"}
    assert wait_gone(stubborn.pid, 5) and wait_gone(polite.pid, 5)
    assert alive(other_gpu.pid) and alive(bystander.pid)
    assert [x["gpu"] for x in resets(sc)] == [0]
    kill_recs = records(action="kill")
    assert {k["target"]["pid"] for k in kill_recs} == {stubborn.pid, polite.pid}
    assert all(k["reason"] == "reset of GPU 0" and k["face"] == "cli" for k in kill_recs)
    [rec] = records(action="reset")
    check_common(rec, action="reset", outcome="reset")
    st = json.loads(run_gputop("status", "--json").stdout)
    assert [h["pid"] for h in st["holders"]] == [other_gpu.pid]


def test_force_refuses_when_a_holder_is_protected(procs, scenario, tmp_path, monkeypatch):
    write_config(tmp_path / "c.yaml", monkeypatch, protect=["gt-precious"])
    holder = spawn_named(procs, "gt-precious")  # its names agree: a renamed python is a disguise (issue 25)
    sc = scenario(holders=[{"pid": holder.pid, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("reset", "--gpu", "0", "--force")
    assert r.returncode == EXIT_REFUSED
    assert "not reset" in (r.stdout + r.stderr) and "protected" in (r.stdout + r.stderr)
    assert alive(holder.pid) and resets(sc) == []
    [rec] = records()  # refused before any kill was attempted
    assert rec["action"] == "reset" and rec["outcome"] == "refused" and rec["details"]["rule"] == "holder-refused"


def test_force_kills_nobody_when_one_holder_blocks_the_reset(procs, scenario, tmp_path, monkeypatch):
    write_config(tmp_path / "c.yaml", monkeypatch, protect=["gt-precious"])
    precious = spawn_named(procs, "gt-precious")
    plain = procs.sleeper("gt-plain")
    sc = scenario(holders=[{"pid": plain.pid, "gpu": 0, "memory": "1GiB"},
                           {"pid": precious.pid, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("reset", "--gpu", "0", "--force", "--timeout", "0.5")
    assert r.returncode == EXIT_REFUSED and f"pid {precious.pid}" in (r.stdout + r.stderr) and "protected" in (r.stdout + r.stderr)
    time.sleep(0.2)
    assert alive(precious.pid) and alive(plain.pid), "a holder was killed for a reset that did not happen"
    assert resets(sc) == [] and records(action="kill") == []


def test_dry_run_makes_every_check_and_does_nothing(procs, scenario, tmp_path, monkeypatch):
    write_config(tmp_path / "c.yaml", monkeypatch, protect=["gt-precious"])
    plain = procs.sleeper("gt-plain")
    precious = spawn_named(procs, "gt-precious")
    sc = scenario(holders=[{"pid": plain.pid, "gpu": 0, "memory": "1GiB"},
                           {"pid": precious.pid, "gpu": 1, "memory": "1GiB"}], gpus=3)
    cfg = load_config()
    r0 = actions.reset_gpu(0, face="mcp", force=True, dry_run=True, config=cfg)
    assert r0.ok and r0.outcome == "dry-run" and str(plain.pid) in r0.message
    r1 = actions.reset_gpu(1, face="mcp", force=True, dry_run=True, config=cfg)
    assert not r1.ok and r1.outcome == "refused" and "protected" in r1.message  # what a real reset would say
    free = actions.reset_gpu(2, face="mcp", dry_run=True, config=cfg)
    assert free.ok and free.outcome == "dry-run" and "would reset GPU 2" in free.message
    time.sleep(0.2)
    assert alive(plain.pid) and alive(precious.pid)
    assert resets(sc) == [] and records(action="kill") == []  # nothing signalled, nothing reset


def test_free_gpu_resets_and_bad_index(scenario, cfg):
    sc = scenario(holders=[])
    r = run_gputop("reset", "--gpu", "1")
    assert r.returncode == 0 and "reset" in (r.stdout + r.stderr)
    assert [x["gpu"] for x in resets(sc)] == [1]
    r = run_gputop("reset", "--gpu", "9")
    assert r.returncode == EXIT_NOT_FOUND and "no GPU 9" in (r.stdout + r.stderr)
    assert [x["outcome"] for x in records(action="reset")] == ["reset", "not-found"]


class _FailingReset(SimulatedBackend):
    kind = "failed"

    def reset(self, index: int) -> str:
        raise ResetError(f"{self.name}: cannot reset GPU {index} ({self.kind})", kind=self.kind)


@pytest.mark.parametrize("kind,outcome,code,hint", [
    ("permission", "permission-denied", EXIT_PERMISSION, "root"),
    ("display", "refused", EXIT_REFUSED, "display"),
    ("unsupported", "unsupported", EXIT_UNAVAILABLE, "cannot be reset"),
    ("missing-tool", "missing-tool", EXIT_UNAVAILABLE, "install"),
    ("failed", "failed", EXIT_FAILURE, "gputop status"),
])
def test_reset_errors_map_to_clear_messages_and_exit_codes(scenario, cfg, kind, outcome, code, hint):
    sc = scenario(holders=[])
    backend = _FailingReset(sc)
    backend.kind = kind
    sampler = Sampler([backend], config=load_config())
    res = actions.reset_gpu(0, face="api", sampler=sampler)
    assert not res.ok and res.outcome == outcome and res.exit_code == code
    assert hint in res.message and "\n" not in res.message
    [rec] = records(action="reset")
    assert rec["face"] == "api" and rec["details"]["kind"] == kind and rec["exit_code"] == code


def test_cli_dry_run_says_what_the_reset_would_do_and_does_nothing(procs, scenario, cfg):
    plain = procs.sleeper("gt-dry")
    sc = scenario(holders=[{"pid": plain.pid, "gpu": 0, "memory": "1GiB"}], gpus=2)
    held = run_gputop("reset", "--gpu", "0", "--force", "--dry-run")
    assert held.returncode == 0 and f"would kill 1 process(es) holding GPU 0 ({plain.pid})" in held.stdout, held
    free = run_gputop("reset", "--gpu", "1", "--dry-run", "--json")
    assert free.returncode == 0 and json.loads(free.stdout)["outcome"] == "dry-run", free
    busy = run_gputop("reset", "--gpu", "0", "--dry-run")  # without --force the real reset is refused: so is this
    assert busy.returncode == EXIT_REFUSED and "in use" in busy.stderr, busy
    time.sleep(0.2)
    assert alive(plain.pid) and resets(sc) == [] and records(action="kill") == []
