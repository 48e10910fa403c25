"""gputop serve against the demo's real processes on simulated GPUs: every endpoint, /metrics, and writes."""

from __future__ import annotations

import json
import os
import stat
import time

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gputop.core import auditlog
from gputop.core.demo import Demo
from tests.conftest import run_gputop, wait_gone
from tests.functional.servehelp import Served

GiB = 1024**3


@pytest.fixture
def demo(tmp_path, monkeypatch):
    with Demo(tmp_path / "demo", animate=False) as d:
        monkeypatch.setenv("GPUTOP_SCENARIO", str(d.scenario_path))
        yield d


@pytest.fixture
def token_file(tmp_path):
    p = tmp_path / "api-token"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"s3cret-token-for-the-tests-0123456789\n")
    os.close(fd)
    return p


@pytest.fixture
def server(demo, token_file):
    s = Served("--interval", "0.3", "--token-file", str(token_file))
    yield s
    s.stop()


def auth(token_file) -> dict:
    return {"Authorization": "Bearer " + token_file.read_text().strip()}


def metrics(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def series(m: dict, name: str, **labels) -> list[float]:
    want = {k: str(v) for k, v in labels.items()}
    return [v for (n, ls), v in m.items() if n == name and want.items() <= dict(ls).items()]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_status_is_status_json(server, demo):
    r = httpx.get(server.url + "/v1/status")
    assert r.status_code == 200
    api = r.json()
    cli = json.loads(run_gputop("status", "--json").stdout)
    assert set(api) == set(cli)
    assert {h["pid"] for h in api["holders"]} == {h["pid"] for h in cli["holders"]}
    assert len(api["gpu"]["gpus"]) == 4
    assert [r["pid"] for r in api["roots"]] == [demo.pid("retry-root")]


def test_root_names_every_route_and_each_answers(server, token_file):
    root = httpx.get(server.url + "/").json()
    assert root["read_only"] is False
    assert root["endpoints"] == ["/v1/status", "/v1/processes", "/v1/audit/rogue", "/v1/guard/status", "/metrics",
                                 "/v1/ledger", "POST /v1/kill", "POST /v1/reap", "POST /v1/reset", "POST /v1/guard/mode"]
    for ep in root["endpoints"]:
        method, _, path = ep.rpartition(" ")
        if method == "POST":  # exists and wants a body: a GET is 405, not 404
            assert httpx.get(server.url + path).status_code == 405, ep
        else:
            assert httpx.get(server.url + path).status_code == 200, ep


def test_processes_filters(server, demo):
    get = lambda **q: httpx.get(server.url + "/v1/processes", params=q)
    allp = get().json()
    assert allp["count"] == len(allp["processes"]) == 7
    assert [p["pid"] for p in get(name="xmrig").json()["processes"]] == [demo.pid("miner")]
    assert {p["pid"] for p in get(gpu=3).json()["processes"]} == {
        demo.pid("miner"), demo.pid("graphics"), demo.pid("jupyter")}
    big = {p["pid"] for p in get(memory_gt="20GiB").json()["processes"]}
    assert big == {demo.pid("worker0"), demo.pid("worker1")}
    me = psutil.Process().username()
    assert demo.pid("worker0") in {p["pid"] for p in get(user=me).json()["processes"]}
    assert get(user="nobody-like-this").json()["count"] == 0
    r = get(memory_gt="lots")
    assert r.status_code == 400 and "memory_gt" in r.json()["error"]
    assert get(gpu="x").status_code == 400


def test_rogue_and_guard_status(server, demo):
    r = httpx.get(server.url + "/v1/audit/rogue")
    assert r.status_code == 200
    body = r.json()
    assert body["error"] is None
    miner = [f for f in body["findings"] if f["pid"] == demo.pid("miner")]
    assert miner and miner[0]["severity"] == "high"
    g = httpx.get(server.url + "/v1/guard/status")
    assert g.status_code == 200 and g.json()["mode"] == "off"
    # Guard hits: counted per rule from the daemon's hit log, only new lines each scrape.
    from gputop.guard import state

    state.append_hit({"rule": "no-miners", "pid": demo.pid("miner"), "action": "kill", "outcome": "dry-run"})
    assert series(metrics(server.url), "gputop_guard_hits_total", rule="no-miners", action="kill") == [1]
    state.append_hit({"rule": "no-miners", "pid": demo.pid("miner"), "action": "kill", "outcome": "dry-run"})
    state.append_hit({"rule": "max-memory", "pid": demo.pid("worker0"), "action": "notify"})
    m = metrics(server.url)
    assert series(m, "gputop_guard_hits_total", rule="no-miners") == [2]
    assert series(m, "gputop_guard_hits_total", rule="max-memory", action="notify") == [1]
    assert httpx.get(server.url + "/v1/guard/status").json()["recent_hits"][0]["rule"] == "max-memory"
    # A finding that stays is counted once, however often the service samples.
    before = series(m, "gputop_audit_findings_total", severity="high")
    time.sleep(1.0)
    assert series(metrics(server.url), "gputop_audit_findings_total", severity="high") == before


def test_metrics_values_and_dead_series_removed(server, demo, token_file):
    m = metrics(server.url)
    assert series(m, "gputop_gpu_memory_total_bytes", gpu=0) == [80 * GiB]
    assert series(m, "gputop_gpu_memory_total_bytes", gpu=2) == [40 * GiB]
    assert series(m, "gputop_gpu_temperature_celsius", gpu=0) == [67]
    assert series(m, "gputop_gpu_power_watts", gpu=3) == [300]
    assert series(m, "gputop_gpu_utilization_ratio", gpu=1) == [0.93]
    w1 = demo.pid("worker1")
    assert series(m, "gputop_process_gpu_memory_bytes", pid=w1, gpu=1, ctx="C") == [61 * GiB]
    assert series(m, "gputop_process_sm_utilization_ratio", pid=w1) == [0.93]
    assert series(m, "gputop_process_gpu_memory_bytes", pid=demo.pid("retry-worker")) == [18 * GiB]
    assert series(m, "gputop_process_verdict_info", pid=demo.pid("retry-worker"), verdict="orphan") == [1]
    assert series(m, "gputop_process_gpu_memory_bytes", pid=demo.pid("jupyter"), ctx="C+G") == [9 * GiB]
    assert series(m, "gputop_process_verdict_info", pid=demo.pid("jupyter"), verdict="protected") == [1]
    assert series(m, "gputop_orphan_trees") == [1]
    assert series(m, "gputop_guard_mode", mode="off") == [1]
    # The miner-named process is a rogue-audit finding: counted once per rule and severity.
    rules = {dict(ls)["rule"] for (n, ls), v in m.items() if n == "gputop_audit_findings_total" and v >= 1}
    assert rules and all(series(m, "gputop_audit_findings_total", rule=r) for r in rules)
    assert series(m, "gputop_audit_findings_current", severity="high")
    # The unknown fan of an H100 is left out, never exported as 0; there is no fan metric at all.
    assert not series(m, "gputop_gpu_fan_speed_ratio", gpu=0)

    r = httpx.post(server.url + "/v1/kill", json={"pid": w1}, headers=auth(token_file), timeout=30)
    assert r.status_code == 200, r.text
    assert wait_gone(w1)
    m = metrics(server.url)
    assert series(m, "gputop_process_gpu_memory_bytes", pid=w1) == []
    assert series(m, "gputop_process_sm_utilization_ratio", pid=w1) == []
    assert series(m, "gputop_process_gpu_memory_bytes", pid=demo.pid("worker0")) == [61 * GiB]


def test_write_without_token_refused_and_changes_nothing(server, demo, token_file):
    w0 = demo.pid("worker0")
    for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}, {"Authorization": "Basic x"}):
        r = httpx.post(server.url + "/v1/kill", json={"pid": w0, "force": True}, headers=headers)
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"].startswith("Bearer")
    r = httpx.post(server.url + "/v1/guard/mode", json={"mode": "enforce"})
    assert r.status_code == 401
    r = httpx.post(server.url + "/v1/reap", json={})
    assert r.status_code == 401
    assert alive(w0) and alive(demo.pid("retry-root"))
    assert httpx.get(server.url + "/v1/guard/status").json()["mode"] == "off"
    refused = [x for x in auditlog.read() if x.get("face") == "api"]
    assert refused and all(x["outcome"] == "refused" for x in refused)


def test_read_only_service_answers_403(demo, tmp_path):
    s = Served("--read-only")
    try:
        w0 = demo.pid("worker0")
        r = httpx.post(s.url + "/v1/kill", json={"pid": w0})
        assert r.status_code == 403 and "read-only" in r.json()["error"]
        assert httpx.get(s.url + "/v1/status").status_code == 200
        assert alive(w0)
    finally:
        s.stop()


def test_loose_token_file_refuses_to_start(demo, token_file):
    os.chmod(token_file, 0o644)
    r = run_gputop("serve", "--port", "0", "--token-file", str(token_file), timeout=30)
    assert r.returncode == 5
    assert "chmod 600" in r.stderr


def test_token_loosened_while_running_disables_writes(server, demo, token_file):
    os.chmod(token_file, 0o640)
    r = httpx.post(server.url + "/v1/kill", json={"pid": demo.pid("worker0")}, headers=auth(token_file))
    assert r.status_code == 403 and "chmod 600" in r.json()["error"]
    assert alive(demo.pid("worker0"))


def test_create_token_is_0600(demo, tmp_path):
    p = tmp_path / "state" / "tok"
    s = Served("--token-file", str(p), "--create-token")
    try:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
        assert len(p.read_text().strip()) >= 32
    finally:
        s.stop()


def test_kill_with_token(server, demo, token_file):
    w1, w0 = demo.pid("worker1"), demo.pid("worker0")
    st = httpx.get(server.url + "/v1/processes", params={"name": "train"}).json()
    start = next(p["start_time"] for p in st["processes"] if p["pid"] == w1)
    # A wrong identity (a reused PID) is refused.
    r = httpx.post(server.url + "/v1/kill", json={"pid": w1, "start_time": start - 100}, headers=auth(token_file))
    assert r.status_code == 409 and r.json()["outcome"] == "identity-changed"
    assert alive(w1)
    r = httpx.post(server.url + "/v1/kill", json={"pid": w1, "start_time": start}, headers=auth(token_file),
                   timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["ok"] is True
    assert wait_gone(w1)
    assert alive(w0) and alive(demo.pid("miner")) and alive(demo.pid("jupyter"))
    assert w1 not in {h["pid"] for h in httpx.get(server.url + "/v1/status").json()["holders"]}
    rec = [x for x in auditlog.read() if x.get("face") == "api" and x.get("action") == "kill"]
    assert rec[-1]["outcome"] in ("terminated", "killed") and rec[-1]["target"]["pid"] == w1


def test_kill_refusals_through_api(server, demo, token_file):
    r = httpx.post(server.url + "/v1/kill", json={"pid": demo.pid("jupyter"), "force": True},
                   headers=auth(token_file))
    assert r.status_code == 409, r.text
    assert alive(demo.pid("jupyter"))
    r = httpx.post(server.url + "/v1/kill", json={"pid": 1}, headers=auth(token_file))
    assert r.status_code in (409, 404)
    r = httpx.post(server.url + "/v1/kill", json={"pdi": 5}, headers=auth(token_file))
    assert r.status_code == 400 and "unknown field" in r.json()["error"]
    r = httpx.post(server.url + "/v1/kill", content=b"{not json", headers=auth(token_file))
    assert r.status_code == 400


def test_reap_reset_and_guard_mode_with_token(server, demo, token_file):
    root, rw, w0 = demo.pid("retry-root"), demo.pid("retry-worker"), demo.pid("worker0")
    r = httpx.post(server.url + "/v1/reap", json={"dry_run": True}, headers=auth(token_file))
    assert r.status_code == 200 and r.json()["results"][0]["outcome"] == "dry-run"
    assert alive(root)
    r = httpx.post(server.url + "/v1/reap", json={"roots": [root]}, headers=auth(token_file), timeout=60)
    assert r.status_code == 200, r.text
    assert wait_gone(root) and wait_gone(rw)
    assert alive(w0)
    # Reset: refused while GPU 0 is held (nothing killed); allowed on the GPU the reap freed.
    r = httpx.post(server.url + "/v1/reset", json={"index": 0}, headers=auth(token_file))
    assert r.status_code == 409 and r.json()["outcome"] == "busy"
    assert alive(w0)
    r = httpx.post(server.url + "/v1/reset", json={"index": 9}, headers=auth(token_file))
    assert r.status_code == 404
    r = httpx.post(server.url + "/v1/guard/mode", json={"mode": "dry-run"}, headers=auth(token_file))
    assert r.status_code == 200 and r.json()["previous"] == "off"
    assert httpx.get(server.url + "/v1/guard/status").json()["mode"] == "dry-run"
    r = httpx.post(server.url + "/v1/guard/mode", json={"mode": "loud"}, headers=auth(token_file))
    assert r.status_code == 400
