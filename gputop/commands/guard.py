"""gputop guard: the policy guard's mode, policy file, dry test, status, and the foreground daemon."""

from __future__ import annotations

import datetime as _dt
import os
import sys

from gputop.commands._common import config_from, open_sampler, print_json
from gputop.util.errors import EXIT_FAILURE, UsageError
from gputop.guard import state
from gputop.guard.policy import PolicyError, load_policy
from gputop.util.textsafe import visible
from gputop.util.units import check_interval, parse_duration

NAME = "guard"
HELP = "guard mode: --enable/--disable/--dry-run/--enforce, --policy-file F, --test-policies, status, run"
DESCRIPTION = """The guard enforces a YAML policy (see examples/policy.yaml and docs/guard.md).

Modes: off, dry-run (record what would be done, kill nothing) and enforce. --enable turns an off guard
on in dry-run. The mode, the policy file and the rule hits live in the state directory and are shared
with a running 'gputop guard run' daemon and the TUI: a mode switch takes effect at the daemon's next
interval. Kills go through the same safe path as 'gputop kill' (identity re-checked; PID 1, kernel
threads, gputop and its ancestors, hidden processes never signalled). A kill rule that matches a process
kills it whatever its orphan verdict (a name, the nohup mark, ancestry are the user's to forge); only the
config's guard.exempt (users, groups, units, cgroups, root-owned executables) exempts. A reap rule still
leaves protected and unknown trees alone.

  gputop guard --policy-file /etc/gputop/policy.yaml --enable
  gputop guard --test-policies          # what would happen now, per rule and target, and why
  gputop guard status [--json]
  gputop guard run [--interval S] [--enforce|--dry-run]

'guard run' reloads the config and the policy on SIGHUP (systemctl reload gputop-guard) and stops on
SIGTERM. Its stderr lines carry syslog priorities (<3> error, <4> warning/hit, <5> notice, <6> info)
for journald. Exit 5: another guard daemon already runs for this state directory.
An invalid policy makes --policy-file, --test-policies and 'guard run' exit 2 with every problem listed
(file, line, rule). A running daemon given an invalid new file keeps enforcing its last valid policy."""


def _add_common(p) -> None:
    from gputop.commands.cli import add_common

    add_common(p, suppress=True)


def add_arguments(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--enable", dest="set_mode", action="store_const", const="enable",
                   help="turn the guard on (dry-run unless it is already on)")
    g.add_argument("--disable", dest="set_mode", action="store_const", const="off", help="mode off")
    g.add_argument("--dry-run", dest="set_mode", action="store_const", const="dry-run",
                   help="mode dry-run: evaluate and record what would be done, kill nothing")
    g.add_argument("--enforce", dest="set_mode", action="store_const", const="enforce",
                   help="mode enforce: act on rule hits")
    p.add_argument("--policy-file", metavar="FILE", help="validate FILE and make it the guard's policy "
                   "(with --test-policies: test FILE without installing it)")
    p.add_argument("--test-policies", action="store_true",
                   help="evaluate the policy once against the live snapshot and explain each decision")
    p.add_argument("--json", action="store_true", help="JSON output (status, --test-policies)")
    sub = p.add_subparsers(dest="guard_command", metavar="{status,run}")
    sp = sub.add_parser("status", help="mode, policy, daemon and recent hits")
    _add_common(sp)
    sp.add_argument("--json", action="store_true", dest="status_json", help="print JSON")
    sp.add_argument("--hits", type=int, default=10, metavar="N", help="recent hits to show (default 10)")
    rp = sub.add_parser("run", help="run the guard daemon in the foreground (for systemd)")
    _add_common(rp)
    rp.add_argument("--interval", metavar="S", help="seconds between evaluations (default 5, config "
                                                     "guard.interval)")
    rg = rp.add_mutually_exclusive_group()
    rg.add_argument("--enforce", dest="run_mode", action="store_const", const="enforce",
                    help="switch the shared mode to enforce before starting")
    rg.add_argument("--dry-run", dest="run_mode", action="store_const", const="dry-run",
                    help="switch the shared mode to dry-run before starting")
    rp.add_argument("--policy-file", dest="run_policy", metavar="FILE",
                    help="validate FILE and make it the guard's policy before starting")


def _guard_cfg(config) -> dict:
    g = config.extra.get("guard") or {}
    return g if isinstance(g, dict) else {}


def _validate(path: str):
    return load_policy(path)  # PolicyError (exit 2) lists every problem with file, line and rule


def _policy_path(explicit: str | None, config=None) -> str:
    path = explicit or state.get_policy_path(config)
    if not path:
        raise UsageError("no policy file: set one with 'gputop guard --policy-file FILE' "
                         "(see examples/policy.yaml)")
    return path


def run(args) -> int:
    sub = getattr(args, "guard_command", None)
    if sub == "run":
        return _run_daemon(args)
    if sub == "status":
        if args.hits < 0:
            raise UsageError(f"--hits must be 0 or more, got {args.hits}")
        return _status(args.status_json or args.json, args.hits, config_from(args))
    did = False
    if args.policy_file and not args.test_policies:
        pol = _validate(args.policy_file)
        state.set_policy_path(args.policy_file, face="cli")
        print(f"guard policy: {os.path.abspath(args.policy_file)} ({len(pol.rules)} rule(s): "
              f"{', '.join(r.name for r in pol.rules)})")
        did = True
    if args.set_mode:
        cur = state.get_mode()
        mode = args.set_mode
        if mode == "enable":
            mode = cur if cur != "off" else "dry-run"
        if mode != cur:
            from gputop.core.auditlog import AuditLogError

            try:
                state.set_mode(mode, face="cli")
            except AuditLogError:  # the mode changed; its record is missing (the warning says why)
                print(f"guard mode: {cur} -> {mode}")
                print("gputop guard: the mode was changed, but the audit log could not be written "
                      "(exit 1); fix the log path or set GPUTOP_AUDIT_LOG", file=sys.stderr)
                return EXIT_FAILURE
            print(f"guard mode: {cur} -> {mode}")
        else:
            print(f"guard mode: {mode} (unchanged)")
        if mode != "off" and not state.get_policy_path(config_from(args)):
            print("note: no policy file is set: 'gputop guard --policy-file FILE'", file=sys.stderr)
        d = state.daemon_status()
        if mode != "off" and not d.get("alive"):
            print("note: no guard daemon is running on this node: start 'gputop guard run' "
                  "(or the systemd unit packaging/gputop-guard.service)", file=sys.stderr)
        did = True
    if args.test_policies:
        return _test_policies(args)
    if not did:
        return _status(args.json, 10, config_from(args))
    return 0


def _test_policies(args) -> int:
    from gputop.guard.engine import explain, render_explanation

    try:
        path = _policy_path(args.policy_file, config_from(args))
    except UsageError as e:
        if args.json:  # a script reading stdout gets an answer it can parse, not nothing
            print_json({"error": str(e), "exit_code": e.exit_code})
        raise
    pol = _validate(path)
    config = config_from(args)
    sampler = open_sampler(args, config)
    try:
        snap = sampler.sample()
    finally:
        sampler.close()
    items = explain(pol, snap, config)
    if args.json:
        print_json({"policy_file": os.path.abspath(path), "mode": state.get_mode(), "host": snap.host,
                    "at": snap.at, "rules": items})
    else:
        print(f"policy {os.path.abspath(path)}: {len(pol.rules)} rule(s); {len(snap.holders)} GPU holder(s) "
              f"on {len(snap.devices)} GPU(s)")
        from gputop.commands.remote import terminal_safe  # the names in it are their owners' text

        print(terminal_safe(render_explanation(items, state.get_mode())))
        if args.policy_file and os.path.abspath(args.policy_file) != (state.get_policy_path() or ""):
            print(f"\n(tested only; to use it: gputop guard --policy-file {args.policy_file})")
    return 0


def _ts(t) -> str:
    if not isinstance(t, (int, float)):
        return "-"
    return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _status(as_json: bool, nhits: int, config=None) -> int:
    """The state as a table. Names, users, messages and paths in it came from processes and files other
    users control: every one goes through ``visible`` (JSON keeps the exact values)."""
    st = state.status(config)
    hits = state.recent_hits(nhits)
    if as_json:
        print_json({**st, "recent_hits": hits})
        return 0
    v = visible
    d = st["daemon"]
    valid = {True: "valid", False: "INVALID", None: "-"}[st["policy_valid"]]
    print(f"mode:        {v(st['mode'])}")
    print(f"policy:      {v(st['policy_file']) or '(none: gputop guard --policy-file FILE)'} [{valid}]")
    if st["rules"]:
        print(f"rules:       {', '.join(v(r) for r in st['rules'])}")
    if st["last_error"]:
        print("last error:  " + "\n             ".join(v(ln) for ln in str(st["last_error"]).split("\n")))
    if d["alive"]:
        print(f"daemon:      running, pid {v(d['pid'])}, mode {v(d['mode'])}, interval {v(d['interval'])}s, "
              f"last tick {_ts(d['last_tick'])}, policy {v(d['policy_file'])}")
    else:
        print("daemon:      not running (gputop guard run)")
    counts = st["counts"]
    print(f"hits:        {v(counts.get('hits_recorded', 0))} recorded")
    if hits:
        print("recent hits (newest first):")
        for h in hits:
            tag = " [dry-run]" if h.get("dry_run") else ""
            who = (f"pid {v(h.get('pid'))} ({v(h.get('target'))}, {v(h.get('user'))})" if h.get("pid") is not None
                   else v(h.get("target")))
            print(f"  {_ts(h.get('time'))}  {v(h.get('rule'))}  {who}  {v(h.get('action'))} -> "
                  f"{v(h.get('outcome'))}{tag}: {v(h.get('message'))}")
    return 0


def _run_daemon(args) -> int:
    from gputop.guard.daemon import GuardDaemon, acquire_lock

    acquire_lock()  # before touching the shared state: a second daemon changes nothing
    config = config_from(args)
    gcfg = _guard_cfg(config)
    option = "--interval" if args.interval is not None else "guard.interval"  # bad values first
    try:
        interval = check_interval(parse_duration(args.interval if args.interval is not None
                                                 else gcfg.get("interval", 5.0)), option)
    except ValueError as e:
        raise UsageError(f"{option}: {e}" if "interval" not in str(e) else str(e)) from None
    if args.run_policy:
        _validate(args.run_policy)
        state.set_policy_path(args.run_policy, face="guard")
    path = _policy_path(None, config)
    try:
        load_policy(path)
    except PolicyError as e:
        state.set_last_error(str(e), face="guard")
        raise
    if args.run_mode and args.run_mode != state.get_mode():
        state.set_mode(args.run_mode, face="guard")
    sampler = open_sampler(args, config)
    try:
        daemon = GuardDaemon(sampler, path, config=config, interval=interval,
                             config_loader=lambda: config_from(args))
        daemon.install_signal_handlers()
        trail = daemon.start_node_trail()
        try:
            return daemon.run()
        finally:
            if trail is not None:
                trail.close()
    finally:
        sampler.close()
