"""The PromQL of one refresh: three queries for the whole fleet, aggregated by node on the server
(``by (Hostname)``), never one per node. Each query joins several aggregates with ``or``, each tagged
with a ``field`` label, so one HTTP round trip brings many columns. A series that no node exports (an
older gputop without the ledger, a cluster with only dcgm-exporter) adds nothing: its column is unknown.

The drill-down into one node sends two more (its devices, its processes), only while it is open."""

from __future__ import annotations

from dataclasses import dataclass

# Series that other parts of gputop add (the ledger, Slurm/Kubernetes allocations). Named here once, so a
# rename is one line; their columns are blank where no node exports them.
UNEXPLAINED = "gputop_gpu_memory_unexplained_bytes"  # per GPU: used memory no listed process explains
STANDING = "gputop_process_standing_info"  # per process, label standing="squatter"|...
ALLOCATION_IDLE = "gputop_gpu_allocation_idle_seconds"  # per GPU: how long its allocation has had no process

# instance -> Hostname, for gputop's per-node series that carry no Hostname label (gputop_up, ...): from
# GPU 0's info series only (an index lookup: an eighth of the series of a node with 8 GPUs)
_HOSTMAP = 'max by (job, instance, Hostname) (gputop_gpu_info{gpu="0"})'


def _per_node(expr: str, agg: str = "max") -> str:
    return f"{agg} by (Hostname) ({expr} * on (job, instance) group_left (Hostname) {_HOSTMAP})"


def _tagged(fields: list[tuple[str, str]]) -> str:
    return " or ".join(f'label_replace({expr}, "field", "{name}", "", "")' for name, expr in fields)


@dataclass(frozen=True)
class Settings:
    hot: float = 0.5  # a GPU at or above this utilisation (0-1) with no process is "hot with no process"
    window: str = "15m"  # how far back a node that stopped being scraped is still listed
    hits_window: str = "1h"  # guard hits counted over this window
    idle_after: float = 1800.0  # an allocated GPU with no process this long (s) is an idle allocation


def gputop_query(s: Settings) -> str:
    orphan = 'gputop_process_verdict_info{verdict="orphan"}'
    # A count that is 0 is not sent (``> 0``): for a node gputop reports, absent means 0 (rows.py).
    return _tagged([
        ("gpus", "count by (Hostname) (gputop_gpu_info)"),
        ("lost", "sum by (Hostname) (gputop_gpu_lost) > 0"),
        ("util", "avg by (Hostname) (gputop_gpu_utilization_ratio)"),
        ("mem_used", "sum by (Hostname) (gputop_gpu_memory_used_bytes)"),
        ("mem_total", "sum by (Hostname) (gputop_gpu_memory_total_bytes)"),
        ("temp_max", "max by (Hostname) (gputop_gpu_temperature_celsius)"),
        ("holders", "count by (Hostname) (gputop_process_verdict_info)"),
        ("orphans", f"count by (Hostname) ({orphan})"),
        ("orphan_mem", f"sum by (Hostname) (gputop_process_gpu_memory_bytes * on (Hostname, pid) group_left () max by (Hostname, pid) ({orphan}))"),
        ("hot_idle", f"count by (Hostname) ((gputop_gpu_utilization_ratio >= {s.hot:g}) unless on (Hostname, gpu) "
                     "gputop_process_gpu_memory_bytes)"),
        ("idle_gpus", "count by (Hostname) (gputop_gpu_info unless on (Hostname, gpu) gputop_process_gpu_memory_bytes)"),
        ("guard_hits", _per_node(f"increase(gputop_guard_hits_total[{s.hits_window}])", "sum") + " > 0"),
        ("findings", _per_node("gputop_audit_findings_current", "sum") + " > 0"),
        ("up", _per_node("gputop_up", "min") + " == 0"),  # only the failing
        ("unexplained", f"sum by (Hostname) ({UNEXPLAINED})"),
        ("squatters", f'count by (Hostname) ({STANDING}{{standing="squatter"}})'),
        ("idle_alloc", f"count by (Hostname) ({ALLOCATION_IDLE} >= {s.idle_after:g})"),
    ])


def dcgm_query(s: Settings) -> str:
    """DCGM's numbers for the nodes gputop does not report (where both do, gputop's win, so DCGM's are not
    sent: a tenth of the answer at 1,000 nodes)."""
    used, free = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
    only = ' unless on (Hostname) gputop_gpu_info{gpu="0"}'
    return _tagged([(name, f"({expr}){only}") for name, expr in (
        ("gpus", f"count by (Hostname) ({used})"),
        ("util", "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL) / 100"),
        ("mem_used", f"sum by (Hostname) ({used}) * 1048576"),
        ("mem_total", f"(sum by (Hostname) ({used}) + sum by (Hostname) ({free})) * 1048576"),
        ("temp_max", "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)"),
        ("hot", f"count by (Hostname) (DCGM_FI_DEV_GPU_UTIL >= {s.hot * 100:g})"),
        ("xid", "count by (Hostname) (DCGM_FI_DEV_XID_ERRORS > 0)"),
        ("at", f"max by (Hostname) (timestamp({used}))"),  # the newest scrape
    )])


def seen_query(s: Settings) -> str:
    """Every node seen within the window, with gputop's last snapshot time (DCGM's series say only that the
    node was there: the time of its last scrape is in dcgm_query while it is scraped). A node that stopped
    being scraped has no instant series any more, but is here. (A subquery over DCGM's timestamps would
    give its time too, at ~15x the cost of this whole query at 1,000 nodes.)"""
    last_host = f'max by (job, instance, Hostname) (last_over_time(gputop_gpu_info{{gpu="0"}}[{s.window}]))'
    return _tagged([
        ("gputop", f"max by (Hostname) (last_over_time(gputop_snapshot_timestamp_seconds[{s.window}]) "
                   f"* on (job, instance) group_left (Hostname) {last_host})"),
        ("dcgm", f"group by (Hostname) (last_over_time(DCGM_FI_DEV_FB_USED[{s.window}]))"),
    ])


def label_value(value: str) -> str:
    """``value`` as a PromQL double-quoted string (label values come from the series: anything)."""
    out = []
    for ch in value:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def node_devices_query(host: str) -> str:
    return ('{__name__=~"gputop_gpu_.*|DCGM_FI_DEV_(GPU_UTIL|FB_USED|FB_FREE|GPU_TEMP|XID_ERRORS)", '
            f"Hostname={label_value(host)}}}")


def node_processes_query(host: str) -> str:
    return ('{__name__=~"gputop_process_(gpu_memory_bytes|verdict_info|start_time_seconds|owner_info)|'
            f'{STANDING}", Hostname={label_value(host)}}}')


# ---- recording rules (packaging/prometheus/gputop-fleet-rules.yml is made from these) ----------------------

RECORDED = ("gputop_fleet:gputop_fields", "gputop_fleet:dcgm_fields", "gputop_fleet:seen_fields")
# The group's last rule: a constant series whose ``queries`` label names the three expressions (a digest).
# Present with this gputop's digest: the rules are loaded, evaluated at least once (rules run in order),
# and record exactly these queries; a rule file from another gputop version, or other --hot/--window
# settings, does not match, and the raw queries are sent instead.
MARK = "gputop_fleet:rules_info"
RULES_INTERVAL = "15s"


def raw_queries(s: Settings) -> tuple[str, str, str]:
    return gputop_query(s), dcgm_query(s), seen_query(s)


def rules_digest(s: Settings = Settings()) -> str:
    import hashlib

    return hashlib.sha256("\n".join(raw_queries(s)).encode()).hexdigest()[:16]


def recording_rules(s: Settings = Settings()) -> dict:
    """The three queries as recording rules, and the mark: with them loaded, a refresh reads ~10 series a
    node in one query instead of evaluating the aggregates (the server does that once per interval, for
    every viewer)."""
    rules = [{"record": name, "expr": expr} for name, expr in zip(RECORDED, raw_queries(s))]
    rules.append({"record": MARK, "expr": "vector(1)", "labels": {"queries": rules_digest(s)}})
    return {"groups": [{"name": "gputop-fleet", "interval": RULES_INTERVAL, "rules": rules}]}


def recorded_query() -> str:
    """One query for every recorded series and the mark (a refresh with the rules: one round trip, and the
    mark in the same answer says whether the other series can be trusted)."""
    return '{__name__=~"' + "|".join(RECORDED + (MARK,)) + '"}'


def split_recorded(result: list[dict], digest: str) -> tuple[list[dict], list[dict], list[dict]] | None:
    """The recorded query's answer as the three raw queries' answers, or None when the mark with
    ``digest`` is not in it (the rules are not loaded, not evaluated yet, or record other queries)."""
    parts: dict[str, list[dict]] = {name: [] for name in RECORDED}
    marked = False
    for series in result or ():
        labels = series.get("metric") if isinstance(series, dict) else None
        if not isinstance(labels, dict) or "instance" in labels or "job" in labels:
            continue  # the rules' series have neither; a scraped exporter's always do (a forged mark, too)
        name = labels.get("__name__")
        if name == MARK:
            marked = marked or labels.get("queries") == digest
        elif name in parts:
            parts[name].append(series)
    return tuple(parts[name] for name in RECORDED) if marked else None
