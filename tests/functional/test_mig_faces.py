"""MIG (issue 30) on every face but the TUI, on the simulated backend with real holder processes: /metrics
with DCGM's GPU_I_ID and GPU_I_PROFILE labels, a reset refused while any instance is held (another user's
job on another instance survives even --force, as root), and the guard's gpu condition naming an instance."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gputop.guard.conditions import Facts, Target, evaluate
from gputop.guard.policy import parse_policy
from gputop.core.sampler import Sampler
from gputop.util.errors import EXIT_OK, EXIT_REFUSED
from tests.conftest import run_gputop
from tests.functional.actions_helpers import alive, check_common, records
from tests.functional.servehelp import Served

PROMTOOL = shutil.which("promtool")


def mig_gpus() -> list[dict]:
    return [{"name": "Simulated H200", "memory_total": "141GiB", "temperature": 45, "power": 300,
             "power_limit": 700, "mig": [
                 {"gi": 1, "ci": 0, "profile": "3g.71gb", "memory_total": "71GiB"},
                 {"gi": 5, "ci": 0, "profile": "1g.18gb", "memory_total": "18GiB", "utilization": 30,
                  "uuid": "MIG-5140a7ed-aaaa-4000-8000-000000000005"},
                 {"gi": 6, "ci": 0, "profile": "1g.18gb", "memory_total": "18GiB"}]},
            {"name": "Simulated H100", "memory_total": "80GiB", "temperature": 40}]


def test_metrics_carry_dcgm_instance_labels(procs, scenario):
    a, b, c = procs.sleeper("mig-a"), procs.sleeper("mig-b"), procs.sleeper("plain")
    scenario(holders=[{"pid": a.pid, "gpu": 0, "gi": 1, "memory": "20GiB", "sm": 60},
                      {"pid": b.pid, "gpu": 0, "gi": 5, "memory": "3GiB"},
                      {"pid": c.pid, "gpu": 1, "memory": "2GiB", "sm": 10}], gpus=mig_gpus())
    s = Served("--interval", "0.3", "--metrics-only")
    try:
        deadline = time.time() + 20
        while True:
            text = httpx.get(s.url + "/metrics").text
            fams = {f.name: f for f in text_string_to_metric_families(text)}
            if fams.get("gputop_mig_info") and fams["gputop_mig_info"].samples or time.time() > deadline:
                break
            time.sleep(0.3)
    finally:
        s.stop()
    info = {x.labels["GPU_I_ID"]: x.labels for x in fams["gputop_mig_info"].samples}
    assert set(info) == {"1", "5", "6"}
    parent_uuid = next(x.labels["UUID"] for x in fams["gputop_gpu_info"].samples if x.labels["gpu"] == "0")
    for labels in info.values():  # the parent's DCGM labels: a dashboard joins on gpu/UUID/GPU_I_ID
        assert labels["gpu"] == "0" and labels["UUID"] == parent_uuid and labels["modelName"] == "Simulated H200"
        assert labels["Hostname"] and labels["GPU_CI_ID"] == "0" and labels["mig_uuid"].startswith("MIG-")
    assert info["5"]["GPU_I_PROFILE"] == "1g.18gb" and info["1"]["GPU_I_PROFILE"] == "3g.71gb"
    assert info["5"]["mig_uuid"] == "MIG-5140a7ed-aaaa-4000-8000-000000000005"
    used = {x.labels["GPU_I_ID"]: x.value for x in fams["gputop_mig_memory_used_bytes"].samples}
    assert used == {"1": 20 * 2**30, "5": 3 * 2**30, "6": 0}
    # utilisation only where it is known (the scenario's, for GI 5): absent, never 0, for the others
    util = {x.labels["GPU_I_ID"]: x.value for x in fams["gputop_mig_utilization_ratio"].samples}
    assert util == {"5": 0.3}
    pmem = {(x.labels["pid"], x.labels["GPU_I_ID"]): x.value for x in fams["gputop_mig_process_gpu_memory_bytes"].samples}
    assert pmem == {(str(a.pid), "1"): 20 * 2**30, (str(b.pid), "5"): 3 * 2**30}
    holders = {x.labels["GPU_I_ID"]: x.value for x in fams["gputop_mig_holders"].samples}
    assert holders == {"1": 1, "5": 1, "6": 0}
    # no process SM% on MIG (N/A): the plain GPU's holder has one, the MIG holders none
    sm = {x.labels["pid"] for x in fams["gputop_process_sm_utilization_ratio"].samples}
    assert sm == {str(c.pid)}
    if PROMTOOL:
        r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
        problems = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()
                    and not ln.endswith("label names should be written in 'snake_case' not 'camelCase'")]
        assert r.returncode in (0, 3) and not problems, r.stdout + r.stderr


@pytest.fixture
def other_user():
    """A second real user (made here, removed after): (name, uid, gid)."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("needs root, useradd and setpriv to run a job as a second user")
    name = f"gtmig{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        pw = pwd.getpwnam(name)
        yield name, pw.pw_uid, pw.pw_gid
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def test_reset_of_a_mig_gpu_is_refused_while_any_instance_is_held(procs, scenario, cfg, other_user):
    """Root asks to reset GPU 0 with --force: one holder is root's, one is another user's job on another
    instance. gputop refuses, names both per instance, kills nobody, and writes the refusal to the audit log;
    --dry-run says the same. GPU 1 (no MIG) with the same kind of holder is still reset by --force."""
    name, uid, gid = other_user
    mine = procs.sleeper("mig-mine")
    theirs = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "sleep", "600"])
    try:
        deadline = time.time() + 10
        while os.stat(f"/proc/{theirs.pid}").st_uid != uid:  # setpriv has exec'd sleep as the other user
            assert time.time() < deadline
            time.sleep(0.05)
        sc = scenario(holders=[{"pid": mine.pid, "gpu": 0, "gi": 1, "memory": "8GiB"},
                               {"pid": theirs.pid, "gpu": 0, "gi": 6, "memory": "4GiB"}], gpus=mig_gpus())
        for extra in ([], ["--dry-run"], ["--force"], ["--force", "--dry-run"]):
            r = run_gputop("reset", "--gpu", "0", *extra)
            out = r.stdout + r.stderr
            assert r.returncode == EXIT_REFUSED, (extra, out)
            assert "MIG on" in out and "even with --force" in out
            assert f"GI 1/CI 0 3g.71gb: {mine.pid} (mig-mine" in out, out
            assert f"GI 6/CI 0 1g.18gb: {theirs.pid} (sleep, {name})" in out, out
            assert alive(mine.pid) and alive(theirs.pid)
        assert not sc.with_name(sc.name + ".resets.jsonl").exists()
        recs = records(action="reset")
        assert len(recs) == 4
        for rec in recs:
            check_common(rec, action="reset", outcome="busy")
            assert rec["details"]["rule"] == "mig-held"
            by_gi = {i["gpu_instance_id"]: i["holders"] for i in rec["details"]["instances"]}
            assert by_gi == {1: [mine.pid], 5: [], 6: [theirs.pid]}
    finally:
        theirs.kill()
        theirs.wait()


def test_an_empty_mig_gpu_can_be_reset(scenario, cfg):
    sc = scenario(holders=[], gpus=mig_gpus())
    r = run_gputop("reset", "--gpu", "0", "--dry-run")
    assert r.returncode == EXIT_OK and "would reset GPU 0" in r.stdout, r.stdout + r.stderr
    r = run_gputop("reset", "--gpu", "0")
    assert r.returncode == EXIT_OK, r.stdout + r.stderr
    assert sc.with_name(sc.name + ".resets.jsonl").exists()


def _cond(value, op="=="):
    import yaml

    text = yaml.safe_dump({"rules": [{"name": "r", "action": "log",
                                      "conditions": [{"type": "gpu", "operator": op, "value": value}]}]})
    return parse_policy(text).rules[0].conditions[0]


def test_guard_gpu_condition_knows_the_instance(procs, scenario):
    a, b, c = procs.sleeper("g-a"), procs.sleeper("g-b"), procs.sleeper("g-c")
    scenario(holders=[{"pid": a.pid, "gpu": 0, "gi": 1, "memory": "1GiB"},
                      {"pid": b.pid, "gpu": 0, "gi": 5, "memory": "1GiB"},
                      {"pid": c.pid, "gpu": 1, "memory": "1GiB"}], gpus=mig_gpus())
    s = Sampler.open("simulated")
    try:
        snap = s.sample()
    finally:
        s.close()
    facts = Facts.of(snap)
    hold = {h.pid: h for h in snap.holders}

    def hits(value, op="=="):
        cond = _cond(value, op)
        return {pid for pid, h in hold.items() if evaluate(cond, Target.process(h), snap, facts).ok}

    assert hits(0) == {a.pid, b.pid}  # a GPU index still takes in every instance of it
    assert hits("0:GI5") == {b.pid} and hits("0:GI5/CI0") == {b.pid}
    assert hits("MIG-5140a7ed-aaaa-4000-8000-000000000005") == {b.pid}
    assert hits(["0:GI1", 1], "in") == {a.pid, c.pid}
    assert hits("0:GI5", "!=") == {a.pid, c.pid}
    out = evaluate(_cond("0:GI5"), Target.process(hold[b.pid]), snap, facts)
    assert "MIG 0:GI5/CI0" in out.detail


@pytest.mark.parametrize("bad", ["0:GI", "GI5", "0:GI5/CI", "MIG-", "0:gi5; rm", True, -1, [], ["0:GI5", "x"]])
def test_guard_gpu_condition_refuses_what_is_not_a_place(bad):
    import yaml

    from gputop.util.errors import UsageError

    op = "in" if isinstance(bad, list) else "=="
    text = yaml.safe_dump({"rules": [{"name": "r", "action": "log",
                                      "conditions": [{"type": "gpu", "operator": op, "value": bad}]}]})
    with pytest.raises((UsageError, ValueError)) as e:
        parse_policy(text)
    assert "GPU ind" in str(e.value)


def test_hardware_check_reports_mig_and_never_changes_it(tmp_path):
    """scripts/hardware-check.sh says whether MIG is on (from nvidia-smi) and never asks nvidia-smi to change
    it; here it stops right after, at the missing torch (exit 2)."""
    from tests.conftest import ROOT

    log = tmp_path / "smi.args"
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$@" >> {log}\ncase "$*" in\n'
                   '  *mig.mode.current*) echo Enabled ;;\n'
                   '  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-x)"; echo "  MIG 1g.18gb Device 0: (UUID: MIG-a)";'
                   ' echo "  MIG 3g.71gb Device 1: (UUID: MIG-b)" ;;\nesac\nexit 0\n')
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "PYTHON": "/bin/false"}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "hardware-check.sh")], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "INFO MIG is enabled on GPU 0: 2 MIG device(s)" in r.stdout, r.stdout
    calls = log.read_text().splitlines()
    assert calls and not [c for c in calls if "-mig" in c.split() or c.split()[:1] == ["mig"]
                          or "--multi-instance-gpu" in c], calls


@pytest.mark.parametrize("holder,gpu_mig,want", [
    ({"gi": 9}, [{"gi": 1}], "'gi: 9, ci: 0' is not a MIG device of its GPU"),
    ({"gi": 1}, None, "'gi: 1, ci: 0' is not a MIG device of its GPU"),
    ({}, [{"gi": "x"}], "needs an integer 'gi'"),
    ({}, {"gi": 1}, "'mig' must be a list of MIG devices"),
])
def test_a_scenario_naming_no_such_instance_is_refused(procs, scenario, holder, gpu_mig, want):
    p = procs.sleeper("mig-bad")
    gpu = {"name": "Simulated H200", "memory_total": "141GiB", **({"mig": gpu_mig} if gpu_mig is not None else {})}
    path = scenario(holders=[{"pid": p.pid, "gpu": 0, "memory": "1GiB", **holder}], gpus=[gpu])
    r = run_gputop("status", "--scenario", str(path))
    assert r.returncode == 2 and want in r.stderr, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1  # one line that says what is wrong
