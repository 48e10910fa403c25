"""Metrics Grafana and Prometheus users can use: DCGM-style identity labels, base units, a process series
that keeps its identity when its verdict changes, OpenMetrics on request, a metrics-only listener, and
the shipped alert rules and dashboard checked with promtool against a live /metrics."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gputop.core.demo import Demo
from tests.conftest import ROOT
from tests.functional.servehelp import Served

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian package "
                                    "prometheus; .ci/run installs it)")
PKG = ROOT / "packaging"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import os

    d = tmp_path_factory.mktemp("metrics")
    env = {"GPUTOP_STATE_DIR": str(d / "state"), "GPUTOP_AUDIT_SOCKET": str(d / "none.sock"),
           "GPUTOP_SYSTEM_CONFIG": str(d / "none.yaml")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with Demo(d / "demo", animate=False) as demo:
            s = Served("--interval", "0.3", "--metrics-only", env={"GPUTOP_SCENARIO": str(demo.scenario_path)})
            try:
                yield s, demo
            finally:
                s.stop()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_every_device_series_carries_the_dcgm_identity_labels(served):
    s, _ = served
    fams = families(httpx.get(s.url + "/metrics").text)
    host = socket.gethostname()
    device = [f for n, f in fams.items() if n.startswith("gputop_gpu_")]
    assert len(device) >= 11
    for f in device:
        for sample in f.samples:
            assert {"gpu", "UUID", "modelName", "Hostname"} <= set(sample.labels), (f.name, sample.labels)
            assert sample.labels["Hostname"] == host
    names = set(fams)
    for n in ("gputop_gpu_memory_utilization_ratio", "gputop_gpu_sm_clock_hertz", "gputop_gpu_memory_clock_hertz",
              "gputop_gpu_fan_speed_ratio", "gputop_gpu_utilization_ratio", "gputop_guard_daemon_up"):
        assert n in names and fams[n].samples, n
    clocks = [x.value for x in fams["gputop_gpu_sm_clock_hertz"].samples]
    assert all(1e8 < v < 1e10 for v in clocks)  # hertz, not MHz
    assert all(0 <= x.value <= 1 for x in fams["gputop_gpu_utilization_ratio"].samples)
    assert not [n for n in names if "percent" in n or n.endswith("_mhz")]


def test_metrics_only_has_no_action_api(served):
    s, demo = served
    assert httpx.get(s.url + "/").json()["metrics_only"] is True
    for path in ("/v1/status", "/v1/processes"):
        r = httpx.get(s.url + path)
        assert r.status_code == 404 and "metrics" in r.json()["error"]
    r = httpx.post(s.url + "/v1/kill", json={"pid": demo.pid("worker0"), "force": True})
    assert r.status_code in (404, 405)
    assert demo.pid("worker0") and _alive(demo.pid("worker0"))


def _alive(pid: int) -> bool:
    import psutil

    return psutil.pid_exists(pid)


def test_openmetrics_when_the_scraper_asks(served):
    s, _ = served
    r = httpx.get(s.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.rstrip().endswith("# EOF")
    r = httpx.get(s.url + "/metrics")
    assert r.headers["content-type"].startswith("text/plain") and "# EOF" not in r.text


@needs_promtool
def test_promtool_check_metrics_on_live_metrics(served):
    s, _ = served
    text = httpx.get(s.url + "/metrics").text
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    # promtool's lint (exit 3) wants snake_case label names; UUID, modelName and Hostname are DCGM
    # exporter's names, kept on purpose so dashboards join (DCGM's own output draws the same lint).
    # Any other problem, or a parse error (exit 1), fails.
    problems = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    deliberate = [ln for ln in problems if ln.endswith("label names should be written in 'snake_case' not "
                                                       "'camelCase'")]
    assert r.returncode in (0, 3) and problems == deliberate, r.stdout + r.stderr
    bad = text.replace("UUID=", "uuid=").replace("modelName=", "model_name=").replace("Hostname=", "hostname=")
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=bad, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr  # nothing else is wrong


@needs_promtool
def test_promtool_checks_and_tests_the_shipped_alert_rules():
    d = PKG / "prometheus"
    r = subprocess.run([PROMTOOL, "check", "rules", "gputop-alerts.yml"], capture_output=True, text=True, cwd=d)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([PROMTOOL, "test", "rules", "gputop-alerts.test.yml"], capture_output=True, text=True, cwd=d)
    assert r.returncode == 0, r.stdout + r.stderr
    names = {m["alert"] for g in _yaml(d / "gputop-alerts.yml")["groups"] for m in g["rules"]}
    assert {"GputopOrphanHoldingGPU", "GputopGuardActed", "GputopGPULost", "GputopGuardDaemonDown"} <= names


def _yaml(p):
    import yaml

    return yaml.safe_load(p.read_text())


def test_dashboard_and_rules_use_only_metrics_gputop_exports(served):
    s, _ = served
    exported = {smp.name for f in families(httpx.get(s.url + "/metrics").text).values() for smp in f.samples}
    exported |= set(families(httpx.get(s.url + "/metrics").text))
    dash = json.loads((PKG / "grafana" / "gputop-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [r["expr"] for g in _yaml(PKG / "prometheus" / "gputop-alerts.yml")["groups"] for r in g["rules"]]
    used = {m for e in exprs for m in re.findall(r"\b(gputop_[a-z_]+)", e)}
    assert used and not used - exported - {"gputop_guard_hits_total"}, used - exported


def test_a_process_keeps_its_series_when_it_turns_orphan(procs, scenario, tmp_path):
    pidfile = tmp_path / "child.pid"
    code = "import time; time.sleep(300)"
    # a session leader (sh) that starts a child and exits when told (the go file): the child turns orphan then.
    # (Told, not after a fixed 4 s: a loaded machine took longer than that to serve the first scrape.)
    go = tmp_path / "go"
    leader = procs.spawn(["setsid", "sh", "-c", f"{sys.executable} -c '{code}' & echo $! > {pidfile}; "
                                                f"n=0; while [ ! -e {go} ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n+1)); done"])
    deadline = time.time() + 20
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.time() < deadline
        time.sleep(0.05)
    child = int(pidfile.read_text())
    scenario(holders=[{"pid": child, "gpu": 0, "memory": "2GiB", "sm": 40}])
    s = Served("--interval", "0.3", "--metrics-only")
    try:
        before = _process_series(s.url, child)
        assert before["verdict"] == "not-orphan", before
        go.touch()
        leader.wait(30)
        deadline = time.time() + 20
        while (after := _process_series(s.url, child))["verdict"] != "orphan":
            assert time.time() < deadline, after
            time.sleep(0.3)
        assert after["memory"] == before["memory"] and after["sm"] == before["sm"]  # same series identity
    finally:
        s.stop()
        subprocess.run(["kill", str(child)])


def _process_series(url: str, pid: int) -> dict:
    fams = families(httpx.get(url + "/metrics").text)

    def labels(name):
        got = [tuple(sorted(x.labels.items())) for x in fams[name].samples if x.labels.get("pid") == str(pid)]
        assert len(got) == 1, (name, got)
        return got[0]

    (verdict,) = [x.labels["verdict"] for x in fams["gputop_process_verdict_info"].samples
                  if x.labels["pid"] == str(pid)]
    return {"memory": labels("gputop_process_gpu_memory_bytes"),
            "sm": labels("gputop_process_sm_utilization_ratio"), "verdict": verdict}


def test_every_visible_holder_has_an_owner_info_series(served):
    """The owner (Slurm job, pod, container, unit) is its own info series, one per visible holder."""
    s, _ = served
    deadline = time.time() + 20
    while True:
        fams = families(httpx.get(s.url + "/metrics").text)
        visible = {x.labels["pid"] for x in fams["gputop_process_verdict_info"].samples
                   if x.labels["verdict"] != "unknown"}
        if visible or time.time() > deadline:
            break
        time.sleep(0.3)
    owners = {x.labels["pid"]: x.labels for x in fams["gputop_process_owner_info"].samples}
    assert visible and visible <= set(owners), (visible, owners)
    for labels in owners.values():
        assert labels["owner_kind"] in ("none", "service", "session", "container", "pod", "slurm")
        assert set(labels) == {"pid", "Hostname", "owner_kind", "slurm_job", "pod", "container", "unit"}
