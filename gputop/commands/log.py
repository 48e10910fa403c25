"""gputop log: show the audit log (every action and refusal, from every face)."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import shutil
import sys
import time

from gputop.core import auditlog
from gputop.commands._common import config_from, fit_last, print_json, table
from gputop.util.errors import EXIT_OK, NotFoundError, PermissionDeniedError, UsageError
from gputop.util.units import parse_duration

NAME = "log"
HELP = "show the audit log of kills, reaps, resets and refusals"
DESCRIPTION = """Show the audit log: one line per action or refusal (kill, reap, reset), from every face
(cli, tui, guard, mcp, api).

Two trails: your own log (<XDG state>/gputop/audit.jsonl unless the config key audit_log or
$GPUTOP_AUDIT_LOG says otherwise), and the node trail /var/log/gputop/audit.jsonl ($GPUTOP_NODE_AUDIT_LOG),
written by the root guard service with the uid the kernel gave for each sender, which no user can edit.
Without --node/--mine the node trail is shown when you may read it (root, group adm), else your own log;
and your own log when the node trail has not got your latest action (the guard service, which writes the
trail, is not running). The line on standard error says which is shown.
A record that cannot be shown (bad JSON, unexpected types) is listed as a bad record; the rest still show.
In the node trail, root's and the guard's records are in audit.jsonl and each other user's in
audit-uid-UID.jsonl (a flood by one user rotates only that user's file); all are read, in the order the
server received them. Logs rotate at 16 MiB (a user's node file at 4 MiB), keeping 5 old files
(audit.jsonl.1 .. .5); all are read."""


def add_arguments(p) -> None:
    w = p.add_mutually_exclusive_group()
    w.add_argument("--node", action="store_true", help="show the node trail (error if you cannot read it)")
    w.add_argument("--mine", action="store_true", help="show your own log")
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


_CTRL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _clean(v) -> str:
    """A cell: never a raw control character (other users write these records' names and messages)."""
    return _CTRL.sub(lambda m: f"\\x{ord(m.group()):02x}", v if isinstance(v, str) else str(v))


def _signals(events) -> str:
    """SIGSTOP, SIGSTOP, SIGKILL -> 'STOPx2,KILL'."""
    if not isinstance(events, list):
        return ""
    names = [str(e.get("signal", "?")).replace("SIG", "") for e in events if isinstance(e, dict)]
    out: list[list] = []
    for n in names:
        if out and out[-1][0] == n:
            out[-1][1] += 1
        else:
            out.append([n, 1])
    return ",".join(n if c == 1 else f"{n}x{c}" for n, c in out)


def _target(r: dict, t) -> str:
    """What a record acted on: a process, a GPU, or for guard records the mode or policy file."""
    if not isinstance(t, dict):
        t = {}
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


def _who(r: dict) -> str:
    """The user: in the node trail the uid the kernel gave (and what the record claimed, if different)."""
    a = r.get("actor")
    claimed = a.get("user", "?") if isinstance(a, dict) else str(a or "?")
    peer = r.get("peer")
    if isinstance(peer, dict) and "uid" in peer:
        user = str(peer.get("user") or peer["uid"])
        claimed_uid = a.get("uid") if isinstance(a, dict) else None
        if claimed_uid not in (None, peer["uid"]) and peer["uid"] != 0:
            return f"{user}(claimed {claimed})"
        return user
    return claimed


def _when(at) -> str:
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        raise ValueError(f"bad time {at!r}")
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))  # OverflowError/OSError: bad record


def _row(r: dict) -> list[str]:
    if r.get("corrupt"):
        return ["?", "", "", "", "bad record", "", f"line {r.get('line')}: {r.get('text', '')}"]
    msg = r.get("message", "")
    msg = msg if isinstance(msg, str) else json.dumps(msg, default=str)[:200]
    if r.get("reason"):
        msg = f"[{r['reason']}] {msg}"
    details = r.get("details")
    survivors = details.get("survivors") if isinstance(details, dict) else None
    if survivors:  # a partial failure: say who is still alive before the message is cut short
        msg = f"[survivors {', '.join(map(str, survivors)) if isinstance(survivors, list) else survivors}] {msg}"
    row = [_when(r.get("at")), f"{r.get('face', '?')}/{_who(r)}", r.get("action", "?"),
           _target(r, r.get("target")), r.get("outcome", "?"), _signals(r.get("signals")) or "-", msg]
    return [_clean(c) for c in row]


def _safe_row(r: dict) -> list[str]:
    try:
        return _row(r)
    except (Exception, RecursionError) as e:  # one odd record never hides the others
        try:
            text = json.dumps(r, default=str)[:120]
        except (Exception, RecursionError):
            text = "(nested too deep to show)"
        return ["?", "", "", "", "bad record", "", _clean(f"{type(e).__name__}: {text}")]


def _json_safe(records: list[dict]) -> list[dict]:
    out = []
    for r in records:
        try:
            json.dumps(r, default=str)
            out.append(r)
        except (Exception, RecursionError):
            out.append({"corrupt": True, "text": "a record nested too deep to print"})
    return out


def _choose(args, config) -> tuple:
    """(path, which, note): the trail to show, 'node' or 'mine', and a line for stderr (or None)."""
    node = auditlog.node_log_path()
    readable = node.exists() and os.access(node, os.R_OK)
    if args.node:
        if not node.exists():
            raise NotFoundError(f"there is no node audit trail at {node}: the gputop-guard service writes it "
                                "(see README 'Running on a node')")
        if not readable:
            raise PermissionDeniedError(f"the node audit trail {node} is readable by root and group adm only")
        return node, "node", None
    if args.mine or not readable:
        note = None
        if not args.mine and node.exists():
            note = f"(node audit trail: {node}, readable by root and group adm; showing your own log)"
        return auditlog.log_path(config), "mine", note
    return node, "node", f"(node audit trail: {node}; --mine for your own log)"


def _latest(path) -> dict | None:
    """The newest whole record of your own log's live file (with a numeric time), or None."""
    try:
        records = auditlog.read(path=path, rotated=False)
    except auditlog.AuditLogError:
        return None
    for r in reversed(records):
        at = r.get("at")
        if not r.get("corrupt") and isinstance(at, (int, float)) and not isinstance(at, bool):
            return r
    return None


def _holds(trail: list[dict], rec: dict) -> bool:
    """Whether the node ``trail`` has ``rec`` (the server adds its stamps; what the writer wrote stays)."""
    key = ("at", "action", "face", "outcome", "host")
    want = tuple(rec.get(k) for k in key)
    return any(tuple(r.get(k) for k in key) == want for r in reversed(trail))


def run(args) -> int:
    config = config_from(args)
    since = parse_since(args.since) if args.since else None
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be 1 or more")
    path, which, note = _choose(args, config)
    records = auditlog.read_node(since, path=path) if which == "node" else auditlog.read(since, path=path)
    if which == "node" and not args.node:
        mine = auditlog.log_path(config)
        last = _latest(mine)
        if last is not None and (since is None or last["at"] >= since) and not _holds(records, last):
            path, which = mine, "mine"
            records = auditlog.read(since, path=mine)
            note = (f"(the node audit trail {auditlog.node_log_path()} has not got your latest action: is the "
                    f"gputop-guard service running? Showing your own log {mine}; --node for the node trail)")
    if args.limit:
        records = records[-args.limit:]
    if note:
        print(note, file=sys.stderr)
    if args.json:
        print_json(_json_safe(records))
        return EXIT_OK
    if not records:
        print(f"no audit records{' since ' + args.since if args.since else ''} in {path}")
        return EXIT_OK
    rows = [_safe_row(r) for r in records]
    headers = ["TIME", "FACE/USER", "ACTION", "TARGET", "OUTCOME", "SIGNALS", "MESSAGE"]
    print(table(fit_last(rows, headers), headers))
    return EXIT_OK
