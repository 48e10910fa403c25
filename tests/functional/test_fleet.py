"""gputop fleet against a real Prometheus (Debian's prometheus, started here) scraping live `gputop serve
--metrics-only` instances on simulated GPUs and a stand-in dcgm-exporter: the order (a node with orphans
first), a DCGM-only node, a node that stopped being scraped, a down / slow / token-guarded server, the
drill-down, and a kill through --remote over a real sshd (the bystander survives)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import Procs, run_gputop, wait_gone
from tests.functional import fleet_helpers as fh
from tests.functional.servehelp import Served

pytestmark = [pytest.mark.skipif(fh.WHY_NOT is not None, reason=str(fh.WHY_NOT)),
              pytest.mark.xdist_group("fleet")]

GIB = 1024 ** 3


def _scenario(path: Path, gpus: list[dict], holders: list[dict]) -> Path:
    path.write_text(yaml.safe_dump({"gpus": gpus, "holders": holders}))
    return path


def _gpu(**kw) -> dict:
    return {"name": "Simulated H100 80GB", "memory_total": "80GiB", "temperature": 50, **kw}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    d = tmp_path_factory.mktemp("fleet")
    procs = Procs()
    started = []
    try:
        orphan = procs.orphan("sleep 3601", "sleep 3601")
        bystander = procs.sleeper("fleetbystand")
        worker = procs.sleeper("fleetworker")
        scen = {
            "fleet-a": _scenario(d / "a.yaml", [_gpu(utilization=80), _gpu(utilization=10)],
                                 [{"pid": orphan, "gpu": 0, "memory": "8GiB", "sm": 80},
                                  {"pid": bystander.pid, "gpu": 1, "memory": "2GiB", "sm": 10}]),
            "fleet-b": _scenario(d / "b.yaml", [_gpu(utilization=30)],
                                 [{"pid": worker.pid, "gpu": 0, "memory": "4GiB", "sm": 30}]),
            "fleet-c": _scenario(d / "c.yaml", [_gpu(utilization=95), _gpu(utilization=0)], []),
            "fleet-e": _scenario(d / "e.yaml", [_gpu(utilization=0)], []),
        }
        serves = {}
        for host, path in scen.items():
            env = {"GPUTOP_SCENARIO": str(path), "GPUTOP_STATE_DIR": str(d / host / "state"),
                   "GPUTOP_AUDIT_SOCKET": str(d / host / "none.sock"),
                   "GPUTOP_SYSTEM_CONFIG": str(d / host / "none.yaml")}
            s = Served("--interval", "0.5", "--metrics-only", env=env)
            started.append(s)
            serves[host] = s
        dcgm = fh.StaticExporter(fh.dcgm_text("dcgm-d", 4, util=70))
        started.append(dcgm)
        jobs = {host: (s.url.split("//", 1)[1], host) for host, s in serves.items()}
        jobs["dcgm"] = (dcgm.target, "dcgm-d")
        prom = fh.Prometheus(d / "prom", jobs)
        started.append(prom)
        _wait_nodes(prom.url, {"fleet-a", "fleet-b", "fleet-c", "fleet-e", "dcgm-d"}, key="orphans",
                    host="fleet-a")
        yield {"prom": prom, "serves": serves, "orphan": orphan, "bystander": bystander, "worker": worker,
               "scenarios": scen, "dir": d, "procs": procs}
    finally:
        for s in reversed(started):
            s.stop()
        procs.cleanup()


def fleet_json(url: str, *args: str, env: dict | None = None, timeout: float = 60):
    r = run_gputop("fleet", "--prometheus", url, "--json", *args, env=env, timeout=timeout)
    return r, (json.loads(r.stdout) if r.returncode == 0 else None)


def _wait_nodes(url: str, hosts: set[str], key: str | None = None, host: str | None = None, timeout: float = 60):
    """Until every host has a row (and ``host``'s ``key`` is non-zero): Prometheus scrapes every second."""
    deadline = time.time() + timeout
    data = None
    while time.time() < deadline:
        r, data = fleet_json(url)
        if data is not None:
            rows = {n["host"]: n for n in data["nodes"]}
            if hosts <= set(rows) and (key is None or rows[host].get(key)):
                return data
        time.sleep(0.5)
    raise AssertionError(f"the fleet never showed {hosts}: {data}")


def test_a_node_with_orphans_comes_first_in_three_queries(live):
    r, data = fleet_json(live["prom"].url)
    assert r.returncode == 0, r.stderr
    rows = {n["host"]: n for n in data["nodes"]}
    first = data["nodes"][0]
    assert first["host"] == "fleet-a", [n["host"] for n in data["nodes"]]
    assert first["orphans"] == 1 and first["orphan_mem"] == 8 * GIB
    assert "1 orphan(s)" in first["problems"]
    # the recorded series asked first (this server has no rules: the mark is missing), then the three queries
    assert data["queries"] <= 5 and data["queries"] == 4 and data["recorded"] is False
    _, off = fleet_json(live["prom"].url, "--rules", "off")
    assert off["queries"] == 3
    assert rows["fleet-b"]["orphans"] == 0 and rows["fleet-b"]["holders"] == 1
    # a GPU at 95% with no process: hot with no process
    assert rows["fleet-c"]["hot_idle"] == 1 and rows["fleet-c"]["idle_gpus"] == 2
    assert rows["fleet-b"]["problems"] == [] and rows["fleet-b"]["stale"] is False
    # the ledger's / allocations' series are absent here: unknown, not 0
    # the ledger is exported (nothing unexplained here); no scheduler: no standing series, squatters unknown
    assert rows["fleet-b"]["unexplained"] == 0 and rows["fleet-b"]["squatters"] is None


def test_a_dcgm_only_node_shows_what_dcgm_knows(live):
    _, data = fleet_json(live["prom"].url)
    d = {n["host"]: n for n in data["nodes"]}["dcgm-d"]
    assert d["source"] == "dcgm" and d["gpus"] == 4
    assert d["util"] == pytest.approx(0.70)
    assert d["mem_used"] == 4 * 1000 * 1048576 and d["mem_total"] == 4 * 81000 * 1048576
    assert d["orphans"] is None and d["holders"] is None  # DCGM does not know processes: unknown


def test_table_filter_and_sort(live):
    r = run_gputop("fleet", "--prometheus", live["prom"].url, "--table", "--filter", "dcgm")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:2] == ["NODE", "SOURCE"] and [ln.split()[0] for ln in lines[1:]] == ["dcgm-d"]
    r, data = fleet_json(live["prom"].url, "--sort", "host")
    assert [n["host"] for n in data["nodes"]] == sorted(n["host"] for n in data["nodes"])
    r = run_gputop("fleet", "--prometheus", live["prom"].url, "--json", "--sort", "nope")
    assert r.returncode == 2 and "--sort" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_drill_down_lists_the_gpus_and_holders_with_their_identity(live):
    r = run_gputop("fleet", "--prometheus", live["prom"].url, "--json", "--node", "fleet-a")
    assert r.returncode == 0, r.stderr
    detail = json.loads(r.stdout)
    assert [g["gpu"] for g in detail["gpus"]] == ["0", "1"]
    holders = {h["pid"]: h for h in detail["holders"]}
    assert holders[live["orphan"]]["verdict"] == "orphan"
    assert holders[live["orphan"]]["memory"] == 8 * GIB
    import psutil

    assert holders[live["orphan"]]["start_time"] == pytest.approx(psutil.Process(live["orphan"]).create_time(),
                                                                  abs=0.02)


def test_the_dashboards_fleet_row_runs_on_the_real_server(live):
    """Every query of the Grafana dashboard's fleet row is valid PromQL there, and its table names the
    node with an orphan."""
    import httpx

    from tests.conftest import ROOT

    dash = json.loads((ROOT / "packaging" / "grafana" / "gputop-dashboard.json").read_text())
    start = next(i for i, p in enumerate(dash["panels"]) if p["type"] == "row" and "Fleet" in p["title"])
    targets = [t for p in dash["panels"][start + 1:] for t in p["targets"]]
    assert len(targets) >= 8
    for t in targets:
        r = httpx.get(live["prom"].url + "/api/v1/query", params={"query": t["expr"]}, timeout=30).json()
        assert r["status"] == "success", (t["expr"], r)
        if t.get("legendFormat") == "orphans":
            assert {x["metric"].get("Hostname") for x in r["data"]["result"]} == {"fleet-a"}


def test_prometheus_down_is_one_line_and_exit_6():
    r = run_gputop("fleet", "--prometheus", f"http://127.0.0.1:{fh.free_port()}", "--json", timeout=30)
    assert r.returncode == 6, (r.returncode, r.stderr)
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert "unreachable" in r.stderr and "Traceback" not in r.stderr


def test_a_slow_prometheus_times_out_with_one_line(live):
    proxy = fh.Proxy(live["prom"].url)
    proxy.mode = "hang"
    try:
        t0 = time.monotonic()
        r = run_gputop("fleet", "--prometheus", proxy.url, "--json", "--timeout", "1", timeout=30)
        took = time.monotonic() - t0
    finally:
        proxy.stop()
    assert r.returncode == 6 and "did not answer within 1s" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and took < 10


def test_wrong_token_is_exit_4_and_the_right_one_works(live, tmp_path):
    proxy = fh.Proxy(live["prom"].url, token="s3cret-token")
    try:
        (tmp_path / "bad").write_text("wrong\n")
        (tmp_path / "good").write_text("s3cret-token\n")
        r = run_gputop("fleet", "--prometheus", proxy.url, "--json", "--token-file", str(tmp_path / "bad"))
        assert r.returncode == 4, r.stderr
        assert "refused the credentials (HTTP 401)" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        r = run_gputop("fleet", "--prometheus", proxy.url, "--json", env={"GPUTOP_PROMETHEUS_TOKEN": "wrong"})
        assert r.returncode == 4
        r, data = fleet_json(proxy.url, "--token-file", str(tmp_path / "good"))
        assert r.returncode == 0 and data["nodes"][0]["host"] == "fleet-a"
        r = run_gputop("fleet", "--prometheus", proxy.url, "--json", "--token-file", str(tmp_path / "none"))
        assert r.returncode == 2 and "token file" in r.stderr
    finally:
        proxy.stop()


def test_the_view_keeps_its_last_rows_marked_stale_when_the_server_goes_slow(live):
    from gputop.fleet.client import Prometheus
    from gputop.fleet.source import FleetSource

    proxy = fh.Proxy(live["prom"].url)
    source = FleetSource(Prometheus(proxy.url, timeout=1.0))
    try:
        good = source.refresh()
        assert good.error is None and not good.stale and good.rows[0].host == "fleet-a"
        proxy.mode = "hang"
        bad = source.refresh()
        assert bad.stale and bad.error is not None and "did not answer within 1s" in str(bad.error)
        assert bad.rows == good.rows and bad.at == good.at and bad.queries <= 5
        proxy.mode = "forward"
        again = source.refresh()
        assert again.error is None and not again.stale
    finally:
        source.close()
        proxy.stop()


def test_the_tui_says_stale_in_one_line_and_keeps_its_rows(live):
    import asyncio

    from gputop.fleet.client import Prometheus
    from gputop.fleet.source import FleetSource
    from gputop.tui.fleet_app import FleetApp

    proxy = fh.Proxy(live["prom"].url)
    source = FleetSource(Prometheus(proxy.url, timeout=1.0))

    async def run():
        app = FleetApp(source, refresh=0.5)
        async with app.run_test(size=(140, 30)) as pilot:
            for _ in range(100):
                await pilot.pause(0.1)
                if app.frame is not None and app.frame.error is None:
                    break
            hosts = [r.host for r in app.shown]
            assert hosts[0] == "fleet-a" and "dcgm-d" in hosts
            proxy.mode = "hang"
            for _ in range(100):
                await pilot.pause(0.1)
                if app.frame.error is not None:
                    break
            status = str(app.query_one("#status").render())
            assert status.startswith("STALE, data from") and "did not answer within 1s" in status
            assert "\n" not in status.strip()
            assert [r.host for r in app.shown] == hosts  # the last rows stay
            proxy.mode = "forward"
            for _ in range(100):
                await pilot.pause(0.1)
                if app.frame.error is None:
                    break
            assert "STALE" not in str(app.query_one("#status").render())

    try:
        asyncio.run(run())
    finally:
        source.close()
        proxy.stop()


def test_a_node_that_stopped_being_scraped_is_marked(live):
    live["serves"]["fleet-e"].stop()
    deadline = time.time() + 40
    row = None
    while time.time() < deadline:
        _, data = fleet_json(live["prom"].url, "--stale-after", "3")
        row = {n["host"]: n for n in data["nodes"]}.get("fleet-e")
        if row and row["stale"]:
            break
        time.sleep(0.5)
    assert row is not None and row["stale"], row
    assert any(p.startswith("not scraped") for p in row["problems"]), row
    assert row["last_seen"] is not None and row["age"] is not None and row["gpus"] is None
    assert data["nodes"][0]["host"] == "fleet-a"  # orphans still rank above a node not scraped


# ---- drill-down and actions through --remote (a real sshd on 127.0.0.1), and the TUI in tmux --------------

def _ssh_env(live, tmp_path_factory) -> dict:
    from tests.functional.sshd_helper import start_sshd, why_no_sshd

    why = why_no_sshd()
    if why is not None:
        pytest.skip(f"no sshd: {why}")
    if "sshd" not in live:
        sshd = start_sshd(tmp_path_factory.mktemp("fleet-ssh"))
        live["stop_sshd"] = sshd.stop
        text = sshd.ssh_config.read_text()
        block = text[text.index("Host gpunode"):text.index("Host stranger")]
        sshd.ssh_config.write_text(text + block.replace("Host gpunode", "Host fleet-a"))
        live["sshd"] = sshd
    sshd = live["sshd"]
    config = live["dir"] / "remote-config.yaml"
    config.write_text("protect: []\n")
    cmd = sshd.remote_cmd(GPUTOP_SCENARIO=str(live["scenarios"]["fleet-a"]), GPUTOP_CONFIG=str(config),
                          GPUTOP_STATE_DIR=str(live["dir"] / "remote-state"))
    return {"GPUTOP_SSH": sshd.ssh_env, "GPUTOP_REMOTE_CMD": cmd}


@pytest.fixture
def ssh_env(live, tmp_path_factory):
    env = _ssh_env(live, tmp_path_factory)
    yield env


@pytest.fixture(scope="module", autouse=True)
def _stop_sshd(live):
    yield
    stop = live.get("stop_sshd")
    if stop:
        stop()


def test_a_forged_hostname_never_reaches_ssh_as_an_option(tmp_path):
    """A Hostname label is whatever an exporter wrote: '-oProxyCommand=...' is refused by --remote's host
    check, so ssh never runs the command it names."""
    from gputop.fleet.remote_actions import kill_args, run_remote

    marker = tmp_path / "pwned"
    r = run_remote(f"-oProxyCommand=touch {marker}", kill_args(1, None))
    assert r.rc == 2 and not r.ok and "bad host name" in r.message
    r = run_remote("-oProxyCommand=touch%20x", kill_args(1, None))
    assert r.rc == 2
    time.sleep(0.2)
    assert not marker.exists()


def test_drill_down_kill_through_remote_spares_the_bystander(live, ssh_env, monkeypatch):
    """The identity the node's series carry (pid, start time) goes to the node's gputop over ssh, which
    re-checks it: a wrong start time is refused and kills nothing; the right one kills only the target."""
    from gputop.fleet.client import Prometheus
    from gputop.fleet.node import node_detail
    from gputop.fleet.remote_actions import kill_args, run_remote

    for k, v in ssh_env.items():
        monkeypatch.setenv(k, v)
    victim = live["procs"].sleeper("fleetvictim")
    # the victim joins node b's scenario (its gputop serve re-reads the file)
    path = live["scenarios"]["fleet-b"]
    data = yaml.safe_load(path.read_text())
    data["holders"].append({"pid": victim.pid, "gpu": 0, "memory": "1GiB"})
    path.write_text(yaml.safe_dump(data))
    prom = Prometheus(live["prom"].url)
    deadline = time.time() + 30
    holder = None
    while time.time() < deadline and holder is None:
        holder = next((h for h in node_detail(prom, "fleet-b").holders if h.pid == victim.pid), None)
        time.sleep(0.3)
    assert holder is not None and holder.start_time is not None
    monkeypatch.setenv("GPUTOP_REMOTE_CMD", ssh_env["GPUTOP_REMOTE_CMD"].replace(
        str(live["scenarios"]["fleet-a"]), str(path)))
    wrong = run_remote("fleet-a", kill_args(victim.pid, holder.start_time - 100))
    assert wrong.rc == 5 and victim.poll() is None, wrong
    r = run_remote("fleet-a", kill_args(victim.pid, holder.start_time))
    assert r.ok, r
    assert wait_gone(victim.pid, 10)
    assert live["worker"].poll() is None and live["bystander"].poll() is None


def test_drill_down_reap_through_remote_takes_the_orphan_tree_only(live, ssh_env, monkeypatch):
    from gputop.fleet.remote_actions import reap_args, run_remote

    for k, v in ssh_env.items():
        monkeypatch.setenv(k, v)
    root = live["procs"].orphan("sleep 3602", "sleep 3602")
    path = live["dir"] / "reap.yaml"
    _scenario(path, [_gpu()], [{"pid": root, "gpu": 0, "memory": "1GiB"},
                               {"pid": live["worker"].pid, "gpu": 0, "memory": "1GiB"}])
    monkeypatch.setenv("GPUTOP_REMOTE_CMD", ssh_env["GPUTOP_REMOTE_CMD"].replace(
        str(live["scenarios"]["fleet-a"]), str(path)))
    r = run_remote("fleet-a", reap_args(live["worker"].pid))  # not an orphan root: refused, nothing killed
    assert not r.ok and live["worker"].poll() is None, r
    r = run_remote("fleet-a", reap_args(root))
    assert r.ok, r
    assert wait_gone(root, 15)
    assert live["worker"].poll() is None and live["bystander"].poll() is None


TMUX = __import__("shutil").which("tmux")


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (bash .ci/run installs it)")
def test_tui_in_tmux_orders_filters_drills_down_and_kills_through_remote(live, ssh_env, tmp_path):
    from tests.tui.test_e2e_tmux import Tmux, installed_gputop

    exe = installed_gputop()
    if exe is None:
        pytest.skip("the gputop console script is not installed (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
    env.update(TERM="xterm-256color", **ssh_env)
    tmux = Tmux(tmp_path / "tmux.sock")
    cmd = f"{exe} fleet --prometheus {live['prom'].url} --refresh 1; echo FLEET-EXIT=$?; sleep 30"
    subprocess.run(tmux.base + ["-f", "/dev/null", "new-session", "-d", "-s", "e2e", "-x", "140", "-y", "30",
                                cmd], env=env, check=True, timeout=10)
    orphan = live["orphan"]
    try:
        screen = tmux.wait_for_row("fleet-a", "1 orphan(s)", timeout=30)
        rows = [ln for ln in screen.splitlines() if "fleet-" in ln or "dcgm-d" in ln]
        assert "fleet-a" in rows[0], screen  # worst first
        tmux.keys("/")
        tmux.wait_for("filter: node name")
        tmux.keys("-l", "dcgm")
        deadline = time.monotonic() + 10
        while "fleet-b" in (screen := tmux.screen()):
            assert time.monotonic() < deadline, screen
            time.sleep(0.1)
        assert "dcgm-d" in screen
        tmux.keys("Escape")
        tmux.wait_for_row("fleet-b")  # the filter is cleared; the cursor stays on dcgm-d
        tmux.keys("F3")  # search: jump to the next node that matches
        tmux.wait_for("search: jump")
        tmux.keys("-l", "fleet-a")
        tmux.keys("Enter")
        time.sleep(0.5)
        tmux.keys("Enter")
        tmux.wait_for_row(str(orphan), "orphan", timeout=20)
        # the orphan holds the most memory: the first holder row, under the cursor
        tmux.keys("k")
        tmux.wait_for(f"Kill process {orphan}?")
        tmux.keys("Tab")  # Cancel -> TERM
        tmux.keys("Enter")
        assert wait_gone(orphan, 30), tmux.screen()
        tmux.wait_for("done:", timeout=30)
        assert live["bystander"].poll() is None and live["worker"].poll() is None
        tmux.keys("t")  # the node's own TUI, through gputop --remote (ssh -t)
        tmux.wait_for_row("fleetbystand", timeout=30)
        tmux.wait_for("Guard", timeout=30)  # the node view's footer: not the fleet's
        tmux.keys("q")
        tmux.wait_for("t node TUI", timeout=30)  # back on the fleet's node screen
        tmux.keys("Escape")  # back to the fleet (a pause: ESC then q at once reads as alt+q)
        tmux.wait_for("nodes,", timeout=10)
        tmux.keys("q")
        assert "FLEET-EXIT=0" in tmux.wait_for("FLEET-EXIT=")
    finally:
        tmux("kill-server", check=False)


# ---- the first refresh in a forked child (the TUI's first frame), and the recording rules' mark ------------

def _first(url: str, action: str, timeout: float = 10.0, stdin: str = "") -> dict:
    p = fh.first_refresh_process(url, timeout, action)
    out, err = p.communicate(stdin, timeout=60)
    assert p.returncode == 0, err
    return json.loads(out.splitlines()[-1])


def test_the_first_refresh_in_a_child_gives_the_same_rows_and_hands_its_state_back(live):
    out = _first(live["prom"].url, "result")
    assert out["forked"] and out["error"] is None and not out["stale"]
    assert {"fleet-a", "fleet-b", "dcgm-d"} <= set(out["hosts"])
    # the child asked for the recorded series (none here) and evaluated the three queries: 4, counted here
    assert out["queries"] == 4 and out["counted"] >= 4 and out["recorded"] is False and out["last"]
    assert out["again"] and out["child_left"] is False  # answered once, and reaped
    assert out["next_hosts"] == out["hosts"] and out["next_queries"] == 3  # the parent knows: no rules


def test_a_child_that_dies_before_it_answers_leaves_the_parent_to_refresh(live):
    proxy = fh.Proxy(live["prom"].url)
    proxy.mode = "hang"
    try:
        p = fh.first_refresh_process(proxy.url, 10.0, "kill")
        assert p.stdout.readline().strip() == "killed"
        proxy.mode = "forward"
        out, err = p.communicate("go\n", timeout=60)
        assert p.returncode == 0, err
        out = json.loads(out.splitlines()[-1])
    finally:
        proxy.stop()
    assert out["forked"] and out["error"] is None  # late, never wrong
    assert {"fleet-a", "fleet-b", "dcgm-d"} <= set(out["hosts"])


def test_a_slow_server_gives_the_first_frame_a_clear_error(live):
    proxy = fh.Proxy(live["prom"].url)
    proxy.mode = "hang"
    try:
        out = _first(proxy.url, "result", timeout=1.0)
    finally:
        proxy.stop()
    assert out["forked"] and out["stale"] and out["hosts"] == []
    assert "did not answer within 1s (--timeout)" in out["error"] and "\n" not in out["error"]


def test_quitting_before_the_first_frame_ends_the_child_only(live):
    """close() kills the child it forked (its own, not yet reaped) and reaps it; a bystander lives on."""
    proxy = fh.Proxy(live["prom"].url)
    proxy.mode = "hang"
    bystander = live["procs"].sleeper("fleetfirstby")
    try:
        p = fh.first_refresh_process(proxy.url, 20.0, "close")
        started = json.loads(p.stdout.readline())
        assert started["forked"] and os.path.exists(f"/proc/{started['child']}")
        out, err = p.communicate("close\n", timeout=60)
        assert p.returncode == 0, err
        out = json.loads(out.splitlines()[-1])
    finally:
        proxy.stop()
    assert out["child_left"] is False
    assert bystander.poll() is None and os.path.exists(f"/proc/{bystander.pid}")


def test_rules_on_without_the_rules_is_one_line_and_exit_6(live):
    r = run_gputop("fleet", "--prometheus", live["prom"].url, "--json", "--rules", "on", timeout=60)
    assert r.returncode == 6 and r.stdout == "", r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "--print-rules" in r.stderr
    assert "does not record gputop's fleet rules" in r.stderr


def test_rules_made_for_other_settings_are_not_read_and_their_own_settings_read_them(live, tmp_path, monkeypatch):
    """--print-rules --hot 80 makes rules whose mark names those queries: a view with the defaults does not
    trust them (it evaluates), one with --hot 80 reads them, in one query, and gets the evaluated rows."""
    r = run_gputop("fleet", "--print-rules", "--hot", "80")
    assert r.returncode == 0
    rules = yaml.safe_load(r.stdout)
    default = yaml.safe_load(run_gputop("fleet", "--print-rules").stdout)
    assert rules["groups"][0]["rules"][-1]["labels"] != default["groups"][0]["rules"][-1]["labels"]
    rules["groups"][0]["interval"] = "1s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    jobs = {host: (s.url.split("//", 1)[1], host) for host, s in live["serves"].items() if s.proc.poll() is None}
    prom = fh.Prometheus(tmp_path / "prom", jobs, rules=tmp_path / "rules.yml")
    try:
        deadline = time.time() + 60
        while True:
            _, hot = fleet_json(prom.url, "--hot", "80")
            if hot and hot["recorded"] and {"fleet-a", "fleet-c"} <= {n["host"] for n in hot["nodes"]}:
                break
            assert time.time() < deadline, hot
            time.sleep(0.5)
        assert hot["queries"] == 1
        _, off = fleet_json(prom.url, "--hot", "80", "--rules", "off")
        strip = lambda n: {k: v for k, v in n.items() if k not in ("age", "last_seen")}  # noqa: E731
        assert [strip(n) for n in hot["nodes"]] == [strip(n) for n in off["nodes"]]
        _, plain = fleet_json(prom.url)
        assert plain["recorded"] is False and plain["queries"] == 4
        _the_view_reads_rules_loaded_later(prom, tmp_path, monkeypatch)
    finally:
        prom.stop()


def _the_view_reads_rules_loaded_later(prom, tmp_path, monkeypatch):
    """A view that evaluates (--rules auto, the server's rules are for other settings) asks again every
    ASK_AGAIN refreshes: rules for its settings, loaded later (prometheus reloads on SIGHUP), are read."""
    import signal

    from gputop.fleet import source as fsource
    from gputop.fleet.client import Prometheus
    from gputop.fleet.source import FleetSource

    monkeypatch.setattr(fsource, "ASK_AGAIN", 2)
    src = FleetSource(Prometheus(prom.url, timeout=10))
    try:
        counts = [src.refresh().queries for _ in range(3)]
        assert counts == [4, 3, 4] and src.recorded is False  # asked at the first, then after 2 evaluations
        rules = yaml.safe_load(run_gputop("fleet", "--print-rules").stdout)
        rules["groups"][0]["interval"] = "1s"
        (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
        prom.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 60
        while True:
            frame = src.refresh()
            assert frame.error is None and frame.queries in (1, 3, 4), frame
            if src.recorded:
                break
            assert time.time() < deadline, "the rules loaded later were never read"
            time.sleep(0.2)
        assert frame.queries == 1 and {"fleet-a", "fleet-c"} <= {r.host for r in frame.rows}
    finally:
        src.close()
