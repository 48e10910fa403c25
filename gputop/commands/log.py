"""gputop log: show the audit log (every action and refusal, from every face)."""

from __future__ import annotations

import datetime as _dt
import os
import time

from gputop import auditlog
from gputop.commands._common import config_from, fit_last, print_json, table
from gputop.errors import EXIT_OK, UsageError
from gputop.units import parse_duration

NAME = "log"
HELP = "show the audit log of kills, reaps, resets and refusals"
DESCRIPTION = """Show the audit log: one line per action or refusal (kill, reap, reset), from every face
(cli, tui, guard, mcp, api). It lives in <XDG state>/gputop/audit.jsonl unless the config key
audit_log or $GPUTOP_AUDIT_LOG says otherwise."""


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print the records as a JSON list")
    p.add_argument("--since", metavar="T", help="only records since T: a duration (10m, 2h, 1d) or an ISO time")
    p.add_argument("--limit", type=int, metavar="N", help="only the last N records")


def parse_since(value: str, now: float | None = None) -> float:
    """Epoch seconds from '10m' / '2h' / '90' (ago) or an ISO time (local time if no zone is given)."""
    now = time.time() if now is None else now
    try:
        return now - parse_duration(value)
    except ValueError:
        pass
    try:
        t = _dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--since: bad time {value!r}: use a duration such as 10m, 2h, 1d or an ISO time "
                         "such as 2026-11-30T02:00") from None
    return t.timestamp()


def _signals(events: list) -> str:
    """SIGSTOP, SIGSTOP, SIGKILL -> 'STOPx2,KILL'."""
    names = [str(e.get("signal", "?")).replace("SIG", "") for e in events if isinstance(e, dict)]
    out: list[list] = []
    for n in names:
        if out and out[-1][0] == n:
            out[-1][1] += 1
        else:
            out.append([n, 1])
    return ",".join(n if c == 1 else f"{n}x{c}" for n, c in out)


def _target(r: dict, t: dict) -> str:
    """What a record acted on: a process, a GPU, or for guard records the mode or policy file."""
    if t.get("pid") is not None:
        return f"pid {t['pid']}" + (f" ({t['name']})" if t.get("name") else "")
    if "gpu" in t:
        return f"gpu {t['gpu']}"
    if r.get("action") == "guard-mode" and r.get("mode"):
        return f"mode {r.get('previous') or '?'} -> {r['mode']}"
    if r.get("policy_file"):
        return f"policy {os.path.basename(str(r['policy_file']))}"
    if r.get("mode"):
        return f"mode {r['mode']}"
    return "-"


def run(args) -> int:
    config = config_from(args)
    since = parse_since(args.since) if args.since else None
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be 1 or more")
    records = auditlog.read(since, config=config)
    if args.limit:
        records = records[-args.limit:]
    if args.json:
        print_json(records)
        return EXIT_OK
    if not records:
        where = auditlog.log_path(config)
        print(f"no audit records{' since ' + args.since if args.since else ''} in {where}")
        return EXIT_OK
    rows = []
    for r in records:
        if r.get("corrupt"):
            rows.append(["?", "", "", "", "corrupt", "", f"line {r['line']}: {r['text'][:60]}"])
            continue
        t = r.get("target") or {}
        at = r.get("at")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if isinstance(at, (int, float)) else "?"
        who = (r.get("actor") or {}).get("user", "?")
        target = _target(r, t)
        sigs = _signals(r.get("signals") or [])
        msg = r.get("message", "")
        if r.get("reason"):
            msg = f"[{r['reason']}] {msg}"
        rows.append([when, f"{r.get('face', '?')}/{who}", r.get("action", "?"), target, r.get("outcome", "?"),
                     sigs or "-", msg])
    headers = ["TIME", "FACE/USER", "ACTION", "TARGET", "OUTCOME", "SIGNALS", "MESSAGE"]
    print(table(fit_last(rows, headers), headers))
    return EXIT_OK
