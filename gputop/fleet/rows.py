"""One row per node, made from the three fleet queries' answers, and the orders the view offers: worst
first (the default), or by any column."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

STALE_AFTER = 120.0  # seconds without a scrape before a node is marked "not scraped"


@dataclass(frozen=True)
class NodeRow:
    host: str
    source: str  # "gputop", "dcgm" or "gputop+dcgm": which exporters answered for it
    gpus: int | None = None
    lost: int | None = None  # lost GPUs (gputop), or GPUs whose last XID is non-zero (DCGM only)
    util: float | None = None  # mean GPU utilisation, 0-1
    mem_used: float | None = None  # bytes
    mem_total: float | None = None
    temp_max: float | None = None
    holders: int | None = None
    orphans: int | None = None  # orphan holders
    orphan_mem: float | None = None  # bytes held by orphans
    hot_idle: int | None = None  # GPUs busy with no process (needs gputop's process series)
    idle_gpus: int | None = None  # GPUs with no process
    guard_hits: float | None = None  # in the hits window
    findings: int | None = None  # current rogue-audit findings
    unexplained: float | None = None  # bytes (the ledger; None where no node exports it)
    squatters: int | None = None
    idle_alloc: int | None = None
    up: bool | None = None  # gputop's last sample succeeded
    last_seen: float | None = None  # newest scrape, either exporter (epoch seconds)
    age: float | None = None  # seconds since last_seen, at the query time
    stale: bool = False  # not scraped recently (its numbers are its last known, or unknown)
    problems: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        # every field is a number, a string, None or the problems (asdict's deep copy was half of --json's
        # time to print 1,000 rows)
        d = {name: getattr(self, name) for name in _FIELDS}
        d["problems"] = list(self.problems)
        return d


_FIELDS = tuple(f.name for f in fields(NodeRow))


def _values(result: list[dict]) -> dict[str, dict[str, float]]:
    """{host: {field: value}} from a tagged query's answer. A NaN is left out (unknown, not 0)."""
    out: dict[str, dict[str, float]] = {}
    isnan = math.isnan
    for series in result or ():
        try:
            labels, (_, raw) = series["metric"], series["value"]
            host, name, value = labels.get("Hostname"), labels.get("field"), float(raw)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        if host and name and type(host) is str and type(name) is str and not isnan(value):
            node = out.get(host)
            if node is None:
                node = out[host] = {}
            node[name] = value
    return out


def _int(v):
    return None if v is None else int(round(v))


def build_rows(gputop: list[dict], dcgm: list[dict], seen: list[dict], at: float,
               stale_after: float = STALE_AFTER) -> list[NodeRow]:
    """Every node any query names, worst first. gputop's numbers win where both exporters report a node;
    DCGM fills what gputop lacks (and is all a DCGM-only node has)."""
    g, d, s = _values(gputop), _values(dcgm), _values(seen)
    rows = []
    for host in set(g) | set(d) | set(s):
        rows.append(_row(host, g.get(host, {}), d.get(host, {}), s.get(host, {}), at, stale_after))
    return rank(rows)


def _row(host, g, d, s, at, stale_after) -> NodeRow:
    src = "+".join(n for n, v in (("gputop", g or "gputop" in s), ("dcgm", d or "dcgm" in s)) if v)
    pick = lambda k: g.get(k, d.get(k))  # noqa: E731
    seen = [v for v in (s.get("gputop"), g.get("at"), d.get("at")) if v is not None]
    last = max(seen) if seen else None
    age = None if last is None else max(0.0, at - last)
    stale = (not g and not d) or (age is not None and age > stale_after)
    lost = g.get("lost", 0.0) if g else d.get("xid")
    kw = dict(
        host=host, source=src or "?", gpus=_int(pick("gpus")), lost=_int(lost), util=pick("util"),
        mem_used=pick("mem_used"), mem_total=pick("mem_total"), temp_max=pick("temp_max"),
        holders=_int(g.get("holders", 0.0 if g else None)), orphans=_int(g.get("orphans", 0.0 if g else None)),
        orphan_mem=g.get("orphan_mem", 0.0 if g else None), hot_idle=_int(g.get("hot_idle", 0.0 if g else None)),
        idle_gpus=_int(g.get("idle_gpus", 0.0 if g else None)),
        guard_hits=g.get("guard_hits", 0.0 if g else None), findings=_int(g.get("findings", 0.0 if g else None)), unexplained=g.get("unexplained"), squatters=_int(g.get("squatters")),
        idle_alloc=_int(g.get("idle_alloc")), up=None if not g else g.get("up", 1.0) >= 1,
        last_seen=last, age=age, stale=stale)
    return NodeRow(**kw, problems=_problems(kw))


def _problems(r: dict) -> tuple[str, ...]:
    """A row's problems, worst first, from its fields."""
    p = []
    if r["orphans"]:
        p.append(f"{r['orphans']} orphan(s)")
    if r["guard_hits"] and r["guard_hits"] >= 0.5:
        p.append(f"{r['guard_hits']:.0f} guard hit(s)")
    if r["unexplained"]:
        p.append("unexplained memory")
    if r["squatters"]:
        p.append(f"{r['squatters']} squatter(s)")
    if r["idle_alloc"]:
        p.append(f"{r['idle_alloc']} idle allocation(s)")
    if r["hot_idle"]:
        p.append(f"{r['hot_idle']} hot GPU(s) with no process")
    if r["lost"]:
        p.append(f"{r['lost']} lost GPU(s)" if "gputop" in r["source"] else f"{r['lost']} GPU(s) with XID errors")
    if r["up"] is False:
        p.append("gputop sampling fails")
    if r["stale"]:
        p.append("not scraped" + (f" for {r['age']:.0f}s" if r["age"] is not None else ""))
    return tuple(p)


def badness(r: NodeRow) -> tuple:
    """Worse is larger, in the issue's order: orphans and their memory, guard hits, unexplained memory,
    squatters and idle allocations, hot GPUs with no process, lost GPUs, nodes not scraped."""
    n = lambda v: v or 0  # noqa: E731
    return (n(r.orphans) > 0, n(r.orphan_mem), n(r.orphans), n(r.guard_hits), n(r.unexplained),
            n(r.squatters) + n(r.idle_alloc), n(r.hot_idle), n(r.lost), r.up is False, r.stale)


def rank(rows: list[NodeRow]) -> list[NodeRow]:
    """Worst first; among equals, by host name."""
    rows = sorted(rows, key=lambda r: r.host)
    return sorted(rows, key=badness, reverse=True)


# The orders the view cycles through with ``s`` (node view: sort by the next column).
SORTS: dict[str, object] = {
    "worst": None,
    "host": lambda r: r.host,
    "gpus": lambda r: r.gpus or 0,
    "util": lambda r: r.util if r.util is not None else -1.0,
    "mem": lambda r: r.mem_used or 0.0,
    "orphans": lambda r: (r.orphans or 0, r.orphan_mem or 0.0),
    "hits": lambda r: r.guard_hits or 0.0,
    "age": lambda r: r.age if r.age is not None else math.inf,
}
DESCENDING = {"gpus", "util", "mem", "orphans", "hits", "age"}


def sort_rows(rows: list[NodeRow], key: str = "worst", reverse: bool = False) -> list[NodeRow]:
    if key not in SORTS:
        raise ValueError(f"unknown sort {key!r}: one of {', '.join(SORTS)}")
    fn = SORTS[key]
    out = rank(rows) if fn is None else sorted(sorted(rows, key=lambda r: r.host), key=fn,
                                                    reverse=key in DESCENDING)
    return out[::-1] if reverse else out


def matches(r: NodeRow, text: str) -> bool:
    """The filter: case-insensitive, on the host name, the exporters and the problems."""
    t = text.strip().lower()
    return not t or t in r.host.lower() or t in r.source or any(t in p for p in r.problems)


def filter_rows(rows: list[NodeRow], text: str) -> list[NodeRow]:
    return [r for r in rows if matches(r, text)]
