"""gputop kill: signal a GPU holder (or, with selectors, several) safely, through gputop.actions."""

from __future__ import annotations

import sys

from gputop import actions
from gputop.util import saferegex
from gputop.commands._common import config_from, open_sampler, print_json, table
from gputop.util.errors import EXIT_NOT_FOUND, EXIT_OK, NotFoundError, UsageError
from gputop.core.model import select_holders
from gputop.util.textsafe import visible
from gputop.util.units import fmt_bytes, parse_duration

NAME = "kill"
HELP = "kill a GPU-holding process (--pid N) or preview/kill a selection (--gpu/--user/--name, --yes)"
DESCRIPTION = """Kill a GPU-holding process safely. Right before signalling, gputop re-reads the target,
checks its identity (pid + start time), and refuses PID 1, kernel threads, gputop and its ancestors,
and protected or unknown processes. It sends SIGTERM (or --signal), waits --timeout seconds, and with
--force escalates to SIGKILL; then it samples again to say whether the GPU memory was released. A thread
id (as NVML may report) is resolved to its process. Success (exit 0) means the process has exited; when
several invocations kill one process at once, only the one whose signal ended it says "killed", the
others say it "exited" under another invocation's signal. A job its owner had paused (state T) that
the kill does not end is paused again. A process that exists but cannot be seen here (/proc hidepid,
another PID namespace) is refused (exit 5); exit 3 means no such process.

With --gpu/--user/--name (combinable) it previews the matching GPU holders; --yes signals them all in
parallel. Every action and refusal is written to the audit log ('gputop log')."""


def add_arguments(p) -> None:
    p.add_argument("--pid", type=int, action="append", metavar="N", help="the process to kill (repeatable)")
    p.add_argument("--start-time", type=float, metavar="T",
                   help="with one --pid: the start time you saw (status --json); refuse if the PID now "
                        "belongs to another process")
    p.add_argument("--gpu", type=int, metavar="N", help="select the holders of GPU N")
    p.add_argument("--user", metavar="U", help="select the holders owned by user U")
    p.add_argument("--name", metavar="REGEX", help="select the holders whose name or command line matches")
    p.add_argument("--yes", "-y", action="store_true", help="selectors: act (default: preview only)")
    p.add_argument("--force", action="store_true", help="send SIGKILL to what is left after the timeout")
    p.add_argument("--timeout", metavar="S", help="seconds to wait after the signal (default 5, config kill_timeout)")
    p.add_argument("--signal", default="TERM", metavar="NAME", help="signal to send first (default TERM)")
    p.add_argument("--dry-run", action="store_true", help="check everything and report, but send nothing")
    p.add_argument("--any-process", action="store_true",
                   help="--pid: allow a process that holds no GPU")
    p.add_argument("--allow-protected", action="store_true",
                   help="allow an explicit kill of a protected process (never an unknown one)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _timeout(args, config) -> float:
    if args.timeout is None:
        return config.kill_timeout
    try:
        return parse_duration(args.timeout)
    except ValueError as e:
        raise UsageError(f"--timeout: {e}") from None


def _print_results(results, as_json: bool, extra: dict | None = None) -> int:
    code = next((r.exit_code for r in results if not r.ok), EXIT_OK)
    if as_json:
        print_json({"ok": all(r.ok for r in results), **(extra or {}),
                    "results": [r.to_dict() for r in results]})
    else:
        for r in results:
            mem = {True: "  [GPU memory released]", False: "  [GPU memory NOT released]"}.get(r.memory_released, "")
            line = f"pid {r.pid}: {r.outcome}: {visible(r.message)}"
            print(line) if r.ok else print(f"gputop: {line}", file=sys.stderr)
            if r.ok and mem and "memory" not in r.message:
                print(mem.strip())
            # an audit-log failure was already printed once, loudly, by auditlog.warn()
    return code


def run(args) -> int:
    config = config_from(args)
    timeout = _timeout(args, config)
    _check_args(args)
    kw = dict(face="cli", force=args.force, timeout=timeout, signal_name=args.signal, dry_run=args.dry_run,
              allow_protected=args.allow_protected, config=config)
    sampler = open_sampler(args, config)
    try:
        if args.pid:
            targets = [(pid, args.start_time) for pid in args.pid]
            if len(targets) == 1:
                results = [actions.kill_process(targets[0][0], expected_start=targets[0][1], sampler=sampler,
                                                require_holder=not args.any_process, **kw)]
            else:
                results = actions.kill_many(targets, sampler=sampler, require_holder=not args.any_process, **kw)
            return _print_results(results, args.json)
        return _kill_selected(args, sampler, kw)
    finally:
        sampler.close()


def _check_args(args) -> None:
    """UsageError for a bad combination or value, before anything is sampled."""
    selectors = args.gpu is not None or args.user is not None or args.name is not None
    if not args.pid and not selectors:
        raise UsageError("say what to kill: --pid N, or select with --gpu N / --user U / --name REGEX")
    if args.pid and selectors:
        raise UsageError("use either --pid or the selectors --gpu/--user/--name, not both")
    bad = [p for p in args.pid or () if p <= 0]
    if bad:
        raise UsageError(f"--pid {bad[0]}: a process id is a number above 0")
    if args.start_time is not None and (not args.pid or len(args.pid) != 1):
        raise UsageError("--start-time goes with exactly one --pid")
    try:
        actions.parse_signal(args.signal)
    except ValueError as e:
        raise UsageError(f"--signal: {e}") from None
    if args.name is not None:
        try:
            saferegex.compile(args.name, ignore_case=True)
        except saferegex.PatternError as e:
            raise UsageError(f"--name: bad regular expression {args.name!r}: {e}") from None


def _kill_selected(args, sampler, kw: dict) -> int:
    """--gpu/--user/--name: a preview of the matching holders, or with --yes, kill them."""
    snap = sampler.sample()
    chosen = select_holders(snap, gpu=args.gpu, user=args.user, name=args.name)
    what = " ".join(f"{k} {v}" for k, v in (("--gpu", args.gpu), ("--user", args.user), ("--name", args.name))
                    if v is not None)
    if args.gpu is not None and snap.device(args.gpu) is None:
        raise NotFoundError(f"no GPU {args.gpu}: this host has {len(snap.devices)} GPU(s); see 'gputop status'")
    if not chosen:
        if args.json:
            print_json({"ok": False, "preview": not args.yes, "targets": [], "results": []})
        else:
            print(f"gputop: no GPU holder matches {what}")
        return EXIT_NOT_FOUND
    if not args.yes:
        if args.json:
            print_json({"ok": True, "preview": True, "targets": [_target_dict(h) for h in chosen], "results": []})
            return EXIT_OK
        rows = [[str(h.pid), h.user or "?", ",".join(map(str, h.gpus)), fmt_bytes(h.gpu_memory),
                 h.verdict.kind, h.cmd[:60]] for h in chosen]
        print(table(rows, ["PID", "USER", "GPU", "GPU-MEM", "VERDICT", "COMMAND"], right={0, 3}))
        print(f"{len(chosen)} process(es) match {what}; nothing was signalled. "
              "Add --yes to kill them (protected and unknown ones are refused).")
        return EXIT_OK
    results = actions.kill_many([(h.pid, h.start_time) for h in chosen], sampler=sampler,
                                require_holder=True, **kw)
    return _print_results(results, args.json, {"preview": False, "targets": [_target_dict(h) for h in chosen]})


def _target_dict(h) -> dict:
    return {"pid": h.pid, "start_time": h.start_time, "user": h.user, "name": h.name, "cmd": h.cmd,
            "gpus": list(h.gpus), "gpu_memory": h.gpu_memory, "verdict": h.verdict.kind}
