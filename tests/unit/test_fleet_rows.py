"""The fleet's pure parts: rows from query answers (unknown is never 0), worst first, sort and filter, the
PromQL string escape, and hostile label values on screen."""

from __future__ import annotations

import pytest

from gputop.fleet import queries
from gputop.fleet.node import holders_from
from gputop.fleet.rows import build_rows, filter_rows, rank, sort_rows


def s(host, field, value):
    return {"metric": {"Hostname": host, "field": field}, "value": [0, str(value)]}


def rows_of(gputop=(), dcgm=(), seen=(), at=1000.0):
    return {r.host: r for r in build_rows(list(gputop), list(dcgm), list(seen), at=at, stale_after=60)}


def test_worst_first_in_the_issues_order():
    g = [s("ok", "gpus", 8), s("orph", "gpus", 8), s("orph", "orphans", 1), s("orph", "orphan_mem", 1e9),
         s("hits", "gpus", 8), s("hits", "guard_hits", 3), s("lost", "gpus", 8), s("lost", "lost", 2),
         s("hot", "gpus", 8), s("hot", "hot_idle", 1)]
    seen = [s(h, "gputop", 990) for h in ("ok", "orph", "hits", "lost", "hot")] + [s("gone", "gputop", 100)]
    order = [r.host for r in build_rows(g, [], seen, at=1000.0, stale_after=60)]
    assert order == ["orph", "hits", "hot", "lost", "gone", "ok"]


def test_unknown_is_never_zero_and_nan_is_unknown():
    r = rows_of(dcgm=[s("d", "gpus", 4), s("d", "util", "NaN")], seen=[s("d", "dcgm", 1)])["d"]
    assert r.source == "dcgm" and r.util is None and r.orphans is None and r.holders is None
    g = rows_of(gputop=[s("g", "gpus", 2)], seen=[s("g", "gputop", 999)])["g"]
    assert g.orphans == 0 and g.unexplained is None and g.squatters is None and not g.stale


def test_a_node_only_in_the_window_is_marked_not_scraped():
    r = rows_of(seen=[s("gone", "gputop", 900)])["gone"]
    assert r.stale and r.age == 100 and r.problems == ("not scraped for 100s",)
    r = rows_of(seen=[s("gone", "dcgm", 1)])["gone"]
    assert r.stale and r.age is None and r.problems == ("not scraped",)


def test_bad_series_are_skipped():
    bad = [{"metric": {"field": "gpus"}, "value": [0, "1"]}, {"metric": {"Hostname": "x"}}, {"value": 3}, None]
    assert build_rows(bad, bad, bad, at=0) == []


def test_sort_and_filter():
    rows = list(rows_of(gputop=[s("b", "gpus", 1), s("a", "gpus", 2), s("c", "gpus", 3), s("c", "orphans", 1)],
                        seen=[s(h, "gputop", 1000) for h in "abc"]).values())
    assert [r.host for r in rank(rows)] == ["c", "a", "b"]
    assert [r.host for r in sort_rows(rows, "host")] == ["a", "b", "c"]
    assert [r.host for r in sort_rows(rows, "host", reverse=True)] == ["c", "b", "a"]
    assert [r.host for r in sort_rows(rows, "gpus")] == ["c", "a", "b"]
    assert [r.host for r in filter_rows(rows, "ORPHAN")] == ["c"]
    with pytest.raises(ValueError):
        sort_rows(rows, "nope")


def test_label_values_are_escaped_in_promql():
    assert queries.label_value('a"b\\c') == '"a\\"b\\\\c"'
    assert queries.label_value("x\ny\x1b") == '"x\\x0ay\\x1b"'
    assert 'Hostname="n\\"}' in queries.node_devices_query('n"}')


def test_at_most_five_queries_and_each_tolerates_absent_series():
    texts = queries.raw_queries(queries.Settings())
    assert len(texts) <= 5 and len(queries.RECORDED) == len(texts)
    assert queries.UNEXPLAINED in texts[0] and queries.STANDING in texts[0]


def test_holders_from_series():
    res = [{"metric": {"__name__": "gputop_process_gpu_memory_bytes", "pid": "7", "gpu": "0", "name": "py",
                       "user": "u"}, "value": [0, "100"]},
           {"metric": {"__name__": "gputop_process_gpu_memory_bytes", "pid": "7", "gpu": "1"}, "value": [0, "50"]},
           {"metric": {"__name__": "gputop_process_verdict_info", "pid": "7", "verdict": "orphan"}, "value": [0, "1"]},
           {"metric": {"__name__": "gputop_process_start_time_seconds", "pid": "7"}, "value": [0, "123.5"]},
           {"metric": {"__name__": "gputop_process_verdict_info", "pid": "x"}, "value": [0, "1"]}]
    (h,) = holders_from(res)
    assert (h.pid, h.verdict, h.gpus, h.memory, h.start_time) == (7, "orphan", ("0", "1"), 150.0, 123.5)


def test_hostile_names_reach_the_screen_escaped():
    from gputop.tui.fleet_app import cells

    r = rows_of(gputop=[s("evil\x1b]0;pwn\x07", "gpus", 1)], seen=[s("evil\x1b]0;pwn\x07", "gputop", 1000)])
    (row,) = r.values()
    text = "".join(str(getattr(c, "plain", c)) for c in cells(row))
    assert "\x1b" not in text and "\x07" not in text and "\\x1b" in text


def test_credentials_over_plain_http_to_another_host_are_warned_about():
    from gputop.fleet.client import Auth, cleartext_warning

    assert "plain http" in cleartext_warning("http://prom.example:9090", Auth(token="t"))
    assert "plain http" in cleartext_warning("http://10.0.0.1:9090", Auth(user="u", password="p"))
    assert cleartext_warning("https://prom.example:9090", Auth(token="t")) is None
    assert cleartext_warning("http://127.0.0.1:9090", Auth(token="t")) is None
    assert cleartext_warning("http://prom.example:9090", Auth()) is None


def _rec(name, host=None, field=None, **labels):
    metric = {"__name__": name, **labels}
    if host:
        metric.update(Hostname=host, field=field)
    return {"metric": metric, "value": [0, "1"]}


def test_the_recorded_series_count_only_with_the_mark_of_these_queries():
    digest = queries.rules_digest()
    g, d, seen = (_rec(queries.RECORDED[0], "n1", "gpus"), _rec(queries.RECORDED[1], "n2", "gpus"),
                  _rec(queries.RECORDED[2], "n1", "gputop"))
    mark = _rec(queries.MARK, queries=digest)
    assert queries.split_recorded([g, d, seen, mark], digest) == ([g], [d], [seen])
    assert queries.split_recorded([mark], digest) == ([], [], [])  # loaded, nothing to say (no node)
    assert queries.split_recorded([g, d, seen], digest) is None  # no mark: the rules are not loaded
    other = queries.rules_digest(queries.Settings(hot=0.8))
    assert other != digest
    assert queries.split_recorded([g, d, seen, _rec(queries.MARK, queries=other)], digest) is None
    assert queries.split_recorded(["junk", {"metric": None}, mark], digest) == ([], [], [])
    # an exporter that writes the rules' names is scraped: its series carry job and instance, and count for
    # nothing (a forged mark does not make a server without the rules look like one with them)
    forged = _rec(queries.MARK, queries=digest, job="node", instance="evil:9400")
    assert queries.split_recorded([g, forged], digest) is None
    fake_row = _rec(queries.RECORDED[0], "n9", "orphans", job="node", instance="evil:9400")
    assert queries.split_recorded([g, fake_row, mark], digest) == ([g], [], [])


def test_the_rules_record_the_queries_and_end_with_their_mark():
    rules = queries.recording_rules()["groups"][0]["rules"]
    assert [r["record"] for r in rules] == [*queries.RECORDED, queries.MARK]
    assert [r["expr"] for r in rules[:3]] == list(queries.raw_queries(queries.Settings()))
    assert rules[-1]["labels"] == {"queries": queries.rules_digest()}
    for name in (*queries.RECORDED, queries.MARK):
        assert name in queries.recorded_query()


def test_a_row_is_drawn_again_exactly_when_its_cells_change():
    """The TUI skips making the cells of a row whose drawn fields did not change (every refresh moves every
    row's age and last scrape time): any field that changes a cell must make drawn_same say no."""
    import dataclasses

    from gputop.fleet.rows import NodeRow
    from gputop.tui.fleet_app import cells, drawn_same

    base = NodeRow(host="n1", source="gputop", gpus=8, lost=0, util=0.5, mem_used=1e9, mem_total=8e10, temp_max=60.0,
                   holders=3, orphans=0, orphan_mem=0.0, hot_idle=0, idle_gpus=5, guard_hits=0.0, findings=0,
                   unexplained=None, squatters=None, idle_alloc=None, up=True, last_seen=1000.0, age=5.0)
    other = {int: 3, float: 0.25, str: "n2", bool: False, tuple: ("1 orphan(s)",)}
    for f in dataclasses.fields(NodeRow):
        value = getattr(base, f.name)
        new = other.get(type(value), 1.0) if f.name != "age" else 7200.0
        changed = dataclasses.replace(base, **{f.name: new})
        if cells(changed) != cells(base):
            assert not drawn_same(base, changed), f.name
    assert drawn_same(base, dataclasses.replace(base, age=30.0, last_seen=1030.0))  # still "<1m"
    assert not drawn_same(base, dataclasses.replace(base, age=90.0))  # "1m"
