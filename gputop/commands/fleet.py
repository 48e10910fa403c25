"""gputop fleet: the whole cluster, one row per node, read from a Prometheus (issue 31)."""

from __future__ import annotations

import re
import sys

from gputop.util.errors import UsageError
from gputop.util.units import fmt_bytes, parse_duration

# commands/_common is imported where --json and --table print, not here: the TUI's first frame does not
# wait for the sampler's imports (~70 ms of CPU) that it never uses.

NAME = "fleet"
HELP = "the cluster view: one row per node, worst first, from Prometheus (--prometheus URL)"
DESCRIPTION = """The fleet view: every node a Prometheus scrapes (gputop serve --metrics-only, or NVIDIA's
dcgm-exporter), one row per node, worst first: orphans and the memory they hold, guard hits, unexplained
memory, squatters and idle allocations, hot GPUs with no process, lost GPUs, nodes not scraped recently.
Three PromQL queries per refresh, aggregated on the server (one with the recording rules). Enter opens a node (its GPUs and holders);
from there, k kills and r reaps through 'gputop --remote NODE' (ssh), t opens the node's own TUI.

Credentials never go on the command line: a bearer token from --token-file or $GPUTOP_PROMETHEUS_TOKEN,
basic auth with --user and --password-file or $GPUTOP_PROMETHEUS_PASSWORD. Exit codes: 2 bad option,
4 the server refused the credentials, 6 the server is down, slow or not a Prometheus."""


def add_arguments(p) -> None:
    p.add_argument("--prometheus", metavar="URL",
                   help="the Prometheus (or Thanos, VictoriaMetrics) base URL, e.g. http://prom:9090")
    p.add_argument("--json", action="store_true", help="print the rows once as JSON and exit")
    p.add_argument("--table", action="store_true", help="print the rows once as a table and exit")
    p.add_argument("--token-file", metavar="FILE", help="a bearer token ($GPUTOP_PROMETHEUS_TOKEN)")
    p.add_argument("--user", metavar="NAME", help="basic auth user")
    p.add_argument("--password-file", metavar="FILE", help="basic auth password ($GPUTOP_PROMETHEUS_PASSWORD)")
    p.add_argument("--ca-file", metavar="FILE", help="CA certificate(s) to verify the server's TLS certificate")
    p.add_argument("--client-cert", metavar="FILE", help="TLS client certificate (PEM)")
    p.add_argument("--client-key", metavar="FILE", help="TLS client key (PEM)")
    p.add_argument("--insecure", action="store_true", help="do not verify the server's TLS certificate")
    p.add_argument("--timeout", metavar="S", default="5", help="seconds to wait for an answer (default 5)")
    p.add_argument("--refresh", metavar="S", default="2", help="TUI refresh interval (default 2)")
    p.add_argument("--stale-after", metavar="S", default="120",
                   help="mark a node 'not scraped' after this long without a sample (default 120)")
    p.add_argument("--window", metavar="S", default="15m",
                   help="list a node that stopped being scraped for this long (default 15m)")
    p.add_argument("--hot", type=float, default=50.0, metavar="PCT",
                   help="a GPU at or above this utilisation with no process is 'hot' (default 50)")
    p.add_argument("--filter", metavar="TEXT", default="", help="only nodes whose name or problems contain TEXT")
    p.add_argument("--sort", default="worst", metavar="COL",
                   help="worst (default), host, gpus, util, mem, orphans, hits, age")
    p.add_argument("--rules", choices=("auto", "on", "off"), default="auto",
                   help="read the fleet's recording rules' series (packaging/prometheus/gputop-fleet-rules.yml): "
                        "auto (default: when the server has them), on, off")
    p.add_argument("--print-rules", action="store_true",
                   help="print the fleet's recording rules (Prometheus rule_files YAML) for --hot and --window, "
                        "and exit")
    p.add_argument("--node", metavar="HOST", help="--json/--table: one node's GPUs and holders instead")


def _seconds(text: str, opt: str) -> float:
    try:
        v = parse_duration(text)
    except ValueError as e:
        raise UsageError(f"{opt}: {e}") from None
    if v <= 0:
        raise UsageError(f"{opt}: must be more than 0")
    return v


def settings_from(args):
    """The queries' settings (--hot, --window): the recording rules are made for them too."""
    from gputop.fleet import queries

    if not 0 < args.hot <= 100:
        raise UsageError("--hot: a percentage above 0, at most 100")
    window = _seconds(args.window, "--window")
    # as given when PromQL reads it the same ("15m"), so the default settings match the recording rules
    span = args.window if re.fullmatch(r"[1-9][0-9]*[smhd]", args.window) else f"{int(window)}s"
    return queries.Settings(hot=args.hot / 100.0, window=span)


def open_source(args):
    from gputop.fleet.client import Prometheus, auth_from, cleartext_warning
    from gputop.fleet.source import FleetSource

    settings = settings_from(args)
    auth = auth_from(args)
    warning = cleartext_warning(args.prometheus, auth)
    if warning:
        print(f"gputop: {warning}", file=sys.stderr)
    prom = Prometheus(args.prometheus, auth, timeout=_seconds(args.timeout, "--timeout"))
    return FleetSource(prom, settings, stale_after=_seconds(args.stale_after, "--stale-after"), rules=args.rules)


RULES_HEADER = """\
# gputop fleet's recording rules (issue 31): the three queries of a refresh, evaluated once per interval on
# the server, and a mark (rules_info) naming them, so that each refresh of every 'gputop fleet' reads their
# series in one query. Made by 'gputop fleet --print-rules' (for its --hot and --window); add this file to
# rule_files in prometheus.yml (docs/fleet.md).
"""


def print_rules(args) -> int:
    """The rules for the settings given (--hot, --window): the shipped file is the defaults'."""
    import yaml

    from gputop.fleet.queries import recording_rules

    print(RULES_HEADER + yaml.safe_dump(recording_rules(settings_from(args)), sort_keys=False, width=10000), end="")
    return 0


def run(args) -> int:
    from gputop.fleet.rows import SORTS, filter_rows, sort_rows

    if args.print_rules:
        return print_rules(args)
    if not args.prometheus:
        raise UsageError("give the server: --prometheus URL (e.g. http://prometheus:9090)")

    if args.sort not in SORTS:
        raise UsageError(f"--sort {args.sort!r}: one of {', '.join(SORTS)}")
    source = open_source(args)
    try:
        if args.node and (args.json or args.table):
            return _node(source, args)
        if args.json or args.table:
            frame = source.refresh()
            if frame.error is not None:
                raise frame.error
            rows = sort_rows(filter_rows(list(frame.rows), args.filter), args.sort)
            frame = frame.__class__(**{**frame.__dict__, "rows": tuple(rows)})
            if args.json:
                from gputop.commands._common import print_json

                print_json(frame.to_dict(source.prom.url, source.recorded), compact=None)
            else:
                print(_table(rows))
            return 0
        return _tui(source, args)
    finally:
        source.close()


def _tui(source, args) -> int:
    import importlib.util

    from gputop.fleet.first import FirstRefresh

    refresh = _seconds(args.refresh, "--refresh")
    for name in ("requests", "prometheus_api_client"):  # missing: the extra's message, here, not in the child
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    first = FirstRefresh(source)  # a child refreshes while Textual loads and starts (the first frame's time)
    try:
        from gputop.tui.fleet_app import run_fleet_tui  # imports Textual

        return run_fleet_tui(source, refresh=refresh, filter_text=args.filter, sort=args.sort, first=first)
    finally:
        first.close()


def _node(source, args) -> int:
    from gputop.commands._common import print_json, table
    from gputop.fleet.node import node_detail

    detail = node_detail(source.prom, args.node)
    if args.json:
        print_json(detail.to_dict(), compact=None)
    else:
        print(table([[str(h.pid), h.user, h.name, h.verdict, ",".join(h.gpus), fmt_bytes(h.memory)]
                     for h in detail.holders], ["PID", "USER", "NAME", "VERDICT", "GPU", "GPU-MEM"], right={0, 5}))
    return 0


def _table(rows) -> str:
    from gputop.commands._common import table

    def n(v):
        return "-" if v is None else str(v)
    body = [[r.host, r.source, n(r.gpus), "-" if r.util is None else f"{r.util * 100:.0f}%",
             f"{fmt_bytes(r.mem_used)}/{fmt_bytes(r.mem_total)}", n(r.orphans), fmt_bytes(r.orphan_mem),
             "-" if r.guard_hits is None else f"{r.guard_hits:.0f}", "; ".join(r.problems) or "ok"]
            for r in rows]
    return table(body, ["NODE", "SOURCE", "GPUS", "UTIL", "MEM", "ORPH", "ORPH-MEM", "HITS", "PROBLEMS"],
                 right={2, 3, 5, 6, 7})

