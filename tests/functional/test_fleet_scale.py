"""The fleet at scale: a real Prometheus on a TSDB backfilled (promtool tsdb create-blocks-from openmetrics)
with 1,000 nodes x 8 GPUs, every 10th with only DCGM series; built once for the module. And the shipped
recording rules: the same rows, read from their series."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.conftest import ROOT, run_gputop
from tests.functional import fleet_helpers as fh

pytestmark = [pytest.mark.skipif(fh.WHY_NOT is not None, reason=str(fh.WHY_NOT)),
              pytest.mark.xdist_group("fleet")]
RULES = ROOT / "packaging" / "prometheus" / "gputop-fleet-rules.yml"


@pytest.fixture(scope="module")
def scale(tmp_path_factory):
    d = tmp_path_factory.mktemp("fleet-scale")
    info = fh.scale_openmetrics(d / "om.txt", nodes=1000, gpus=8)
    fh.backfill(d / "om.txt", d / "tsdb")
    rules = yaml.safe_load(RULES.read_text())
    rules["groups"][0]["interval"] = "1s"  # the test does not wait 15 s for the first evaluation
    (d / "rules.yml").write_text(yaml.safe_dump(rules))
    prom = fh.Prometheus(d / "prom", tsdb=d / "tsdb", rules=d / "rules.yml")
    try:
        yield prom, info
    finally:
        prom.stop()


def _json(url, *args):
    r = run_gputop("fleet", "--prometheus", url, "--json", "--stale-after", "1h", "--timeout", "30", *args,
                   timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_thousand_nodes_in_three_queries_orphans_first(scale):
    prom, info = scale
    data = _json(prom.url, "--rules", "off")
    assert data["queries"] == 3 and data["recorded"] is False
    nodes = data["nodes"]
    assert len(nodes) == 1000
    first = [n["host"] for n in nodes[:len(info["orphans"])]]
    assert sorted(first) == sorted(info["orphans"]) and len(first) == 9
    assert all(n["orphans"] == 1 and n["orphan_mem"] == 2 * 1024 ** 3 for n in nodes[:9])
    dcgm = [n for n in nodes if n["source"] == "dcgm"]
    assert sorted(n["host"] for n in dcgm) == sorted(info["dcgm_only"]) and len(dcgm) == 100
    assert all(n["gpus"] == 8 and n["holders"] is None for n in dcgm)
    both = next(n for n in nodes if n["host"] == "gpu0001")
    assert both["source"] == "gputop+dcgm" and both["gpus"] == 8 and both["holders"] == 6 and both["idle_gpus"] == 2


def test_the_recording_rules_give_the_same_rows(scale):
    prom, _ = scale
    raw = _json(prom.url, "--rules", "off")
    deadline = time.time() + 90
    while True:  # the rules' first evaluations
        rec = _json(prom.url)
        if rec["recorded"] and len(rec["nodes"]) == 1000:
            break
        assert time.time() < deadline, (rec["recorded"], len(rec["nodes"]), rec["error"])
        time.sleep(1)
    assert rec["queries"] == 1  # every recorded series and the mark, in one query
    drop = ("age", "last_seen")
    strip = lambda n: {k: v for k, v in n.items() if k not in drop}  # noqa: E731
    assert [strip(n) for n in rec["nodes"]] == [strip(n) for n in raw["nodes"]]


def test_the_shipped_rules_are_the_queries(tmp_path):
    r = run_gputop("fleet", "--print-rules")
    assert r.returncode == 0 and r.stdout == RULES.read_text()
    import subprocess

    out = subprocess.run([fh.PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_tui_fills_a_screenful_first_then_every_node_in_order(scale):
    """1,000 rows: the table gets a screenful at once and the rest in batches after the paint; a change to a
    row not yet added is in it when it comes; a search reaches a node past the first screenful."""
    import asyncio
    import dataclasses

    from textual.widgets import DataTable

    from gputop.fleet.client import Prometheus
    from gputop.fleet.source import FleetSource
    from gputop.tui import fleet_app
    from gputop.tui.fleet_app import FleetApp

    prom, _ = scale
    source = FleetSource(Prometheus(prom.url, timeout=30), rules="off", stale_after=3600)

    async def until(pilot, cond, what):
        for _ in range(300):
            if cond():
                return
            await pilot.pause(0.05)
        raise AssertionError(what)

    async def run():
        app = FleetApp(source, refresh=3600)
        async with app.run_test(size=(160, 45)) as pilot:
            table = app.query_one("#nodes", DataTable)
            await until(pilot, lambda: app.frame is not None and table.row_count == 1000, "never 1,000 rows")
            frame = app.frame
            on = app.shown[table.cursor_row].host
            app.action_sort()  # by host: the table is filled again, now: a screenful, down to the cursor's node
            assert fleet_app.FIRST_ROWS <= table.row_count < 1000
            assert str(table.get_row_at(table.cursor_row)[0]) == on == app.shown[table.cursor_row].host
            # a new frame in the same order, one row past the first screenful changed
            i = 600
            target = app.shown[i]
            changed = dataclasses.replace(target, util=0.123)
            app.show_frame(dataclasses.replace(frame, rows=tuple(changed if r is target else r for r in frame.rows)))
            assert table.row_count < 1000
            await until(pilot, lambda: table.row_count == 1000, "the rest never came")
            assert [str(table.get_row_at(k)[0]) for k in range(1000)] == [r.host for r in app.shown]
            assert table.get_row_at(i)[3] == "12%"
            app.action_sort()  # filled again; a search jumps past the first screenful at once
            app._jump("gpu0999")
            assert str(table.get_row_at(table.cursor_row)[0]) == "gpu0999"

    try:
        asyncio.run(run())
    finally:
        source.close()
