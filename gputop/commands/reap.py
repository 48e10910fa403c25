"""gputop reap: list orphan trees, remove them (--apply), or watch for them (--watch)."""

from __future__ import annotations

import json
import signal
import sys
import time

from gputop import actions
from gputop.actions import interrupt
from gputop.commands._common import config_from, open_sampler, print_json
from gputop.util.errors import EXIT_NOT_FOUND, EXIT_OK, UsageError
from gputop.core.orphans import ORPHAN
from gputop.util.textsafe import visible
from gputop.util.units import check_interval, fmt_bytes, parse_duration

NAME = "reap"
HELP = "list orphan process trees holding GPUs; --apply removes them; --watch is a watchdog"
DESCRIPTION = """List every orphan tree that holds a GPU: its root, members, GPUs, memory and why it is an
orphan. Nothing is signalled without --apply.

The list is the reap plan: the members apply signals, and each subtree it leaves alone with the reason
(a session leader of its own session, a member of a live session, protected, nohup, another user's,
cannot be seen). A member that is not itself an orphan is never signalled, whatever its ancestor is.

--apply [--root PID] [--grace S]: re-check that each tree is still an orphan, plan again, stop the
members (SIGSTOP, so a retry loop cannot start a new worker), plan again on the frozen table, send
SIGTERM and SIGCONT to the plan's members only, and SIGKILL what is left after the grace (default:
kill_timeout, 5 s). Protected, nohup, unknown and mixed-user trees are refused whole. Exit 0 only when
every planned member has exited; otherwise the survivors are named and the exit is non-zero.

--watch [--apply] [--interval S] [--grace S]: scan every interval (default reap.interval, 60 s); a tree
that stays an orphan, with the same root, for longer than the grace (default reap.grace, 60 s) is
reaped (with --apply) or only logged."""


def add_arguments(p) -> None:
    p.add_argument("--apply", action="store_true", help="reap (default: preview only)")
    p.add_argument("--root", type=int, metavar="PID", help="only the tree with this root")
    p.add_argument("--grace", metavar="S",
                   help="--apply: seconds between SIGTERM and SIGKILL (default: kill_timeout); "
                        "--watch: how long a tree must stay orphaned (default: reap.grace)")
    p.add_argument("--watch", action="store_true", help="keep scanning (watchdog); with --apply, reap")
    p.add_argument("--interval", metavar="S", help="--watch: seconds between scans (default: reap.interval)")
    p.add_argument("--count", type=int, metavar="N", help="--watch: stop after N scans")
    p.add_argument("--json", action="store_true", help="print JSON (with --watch: one object per line)")


def _dur(value, name: str, default: float) -> float:
    if value is None:
        return default
    try:
        return parse_duration(value)
    except ValueError as e:
        raise UsageError(f"{name}: {e}") from None


def run(args) -> int:
    config = config_from(args)
    if args.interval is not None and not args.watch:
        raise UsageError("--interval goes with --watch")
    if args.count is not None and (not args.watch or args.count < 1):
        raise UsageError("--count N (N >= 1) goes with --watch")
    if args.watch and args.root is not None:
        raise UsageError("--root does not go with --watch: the watchdog looks at every orphan tree")
    sampler = open_sampler(args, config)
    try:
        if args.watch:
            return _watch(args, config, sampler)
        if args.apply:
            return _apply(args, config, sampler)
        return _preview(args, config, sampler)
    finally:
        sampler.close()


def tree_dict(t: actions.OrphanTree) -> dict:
    return t.to_dict()


def render_tree(t: actions.OrphanTree) -> list[str]:
    """The plan, as apply would carry it out: the members it signals, what it leaves alone and why, and
    what makes apply refuse. Every process-controlled string is shown with control characters visible."""
    r = t.root
    out = [f"root {r.pid} ({visible(r.name)}, user {visible(r.user or '?')}, started "
           f"{time.strftime('%H:%M:%S', time.localtime(r.start_time))})"
           f": GPU {','.join(map(str, t.gpus))}, {fmt_bytes(t.gpu_memory)}, holders {list(t.holders)}",
           f"  why: {t.reason}"]
    for m in t.members:
        mark = " [GPU]" if m.pid in t.holders else ""
        out.append(f"  member {m.pid:>7}  ppid {m.ppid:>7}  {visible(m.cmd[:70])}{mark}")
    for e in t.left_alone:
        under = f" and {len(e.subtree)} under it {list(e.subtree)}" if e.subtree else ""
        owner = f" [{visible(e.owner)}]" if e.owner else ""
        out.append(f"  left alone {e.pid:>7}{under}{owner}: {e.rule}: {e.reason}")
        if e.namespace:  # a PID namespace's init: the host PIDs with the PIDs inside the namespace
            out.append("    its PID namespace: " + ", ".join(f"{p} (pid {local} inside)" for p, local in e.namespace))
    if t.refusal is not None:
        out.append(f"  apply will refuse this tree ({t.refusal[0]}): {t.refusal[1]}")
    return out


def _preview(args, config, sampler) -> int:
    snap = sampler.sample()
    trees = actions.orphan_trees(snap, config=config, sampler=sampler)
    if args.root is not None:
        trees = [t for t in trees if t.pid == args.root]
    skipped = [h for h in snap.holders if h.verdict.kind != ORPHAN and h.verdict.orphan_reason]
    if args.json:
        print_json({"at": snap.at, "host": snap.host, "trees": [tree_dict(t) for t in trees],
                    "skipped": [{"pid": h.pid, "verdict": h.verdict.kind, "reason": h.verdict.reason,
                                 "root": h.verdict.root} for h in skipped]})
        return EXIT_OK if trees or args.root is None else EXIT_NOT_FOUND
    if not trees:
        print(f"no orphan tree{' with root ' + str(args.root) if args.root is not None else ''} holds a GPU")
    for t in trees:
        print("\n".join(render_tree(t)))
    for h in skipped:
        print(f"skipped: pid {h.pid} would be an orphan but is {h.verdict.kind}: {h.verdict.reason}")
    if trees:
        n = sum(1 for t in trees if t.refusal is None)
        print(f"{len(trees)} orphan tree(s), {n} that apply would reap as planned; nothing was signalled. "
              "Reap with 'gputop reap --apply' (or --apply --root PID).")
    return EXIT_OK if trees or args.root is None else EXIT_NOT_FOUND


def _apply(args, config, sampler) -> int:
    grace = _dur(args.grace, "--grace", config.kill_timeout)
    snap = sampler.sample()
    trees = actions.orphan_trees(snap, config=config, sampler=sampler)
    if args.root is not None:
        match = [t for t in trees if t.pid == args.root]
        # A root that is not (or no longer) an orphan still goes through reap_tree: it refuses, says why,
        # and the refusal is in the audit log.
        targets = [(t.pid, t.root.start_time) for t in match] or [(args.root, None)]
    else:
        targets = [(t.pid, t.root.start_time) for t in trees]
    if not targets:
        if args.json:
            print_json({"ok": True, "results": []})
        else:
            print("no orphan tree holds a GPU; nothing to reap")
        return EXIT_OK
    results = []
    with interrupt.deferred():  # a SIGHUP/SIGTERM: finish this tree, start no other, print, then exit
        for pid, st in targets:
            if interrupt.caught():
                break
            results.append(actions.reap_tree(pid, expected_start=st, face="cli", grace=grace, sampler=sampler,
                                             config=config))
        _print_results(args, results)
    return next((r.exit_code for r in results if not r.ok), EXIT_OK)


def _print_results(args, results) -> None:
    if args.json:
        print_json({"ok": all(r.ok for r in results), "results": [r.to_dict() for r in results]})
    else:
        for r in results:
            if r.ok:
                print(f"root {r.pid}: {r.outcome}: {visible(r.message)}")
            else:
                print(f"gputop: root {r.pid}: {r.outcome}: {visible(r.message)}", file=sys.stderr)
            # an audit-log failure was already printed once, loudly, by auditlog.warn()


def _watch(args, config, sampler) -> int:
    interval = _dur(args.interval, "--interval", config.reap_interval)
    grace = _dur(args.grace, "--grace", config.reap_grace)
    try:  # 0 would scan in a busy loop
        check_interval(interval)
    except ValueError as e:
        raise UsageError(str(e)) from None
    stopping = {"v": False}

    def on_term(signum, frame):
        stopping["v"] = True
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    mode = "reaping" if args.apply else "logging (no --apply)"
    if not args.json:
        print(f"watchdog: {mode} orphan trees that stay orphaned > {grace:g}s; scan every {interval:g}s",
              flush=True)

    def on_event(ev: dict) -> None:
        t = ev["tree"]
        res = ev.get("result")
        if args.json:
            out = {"event": ev["event"], "root": ev["root"], "age": round(ev["age"], 1), "tree": t.to_dict()}
            if res is not None:
                out["result"] = res.to_dict()
            sys.stdout.write(json.dumps(out, default=str) + "\n")
            sys.stdout.flush()
            return
        stamp = time.strftime("%H:%M:%S")
        if ev["event"] == "pending":
            print(f"{stamp} orphan tree root {t.pid} ({visible(t.root.name)}) seen for {ev['age']:.0f}s "
                  f"(grace {grace:g}s)", flush=True)
        else:
            print(f"{stamp} {ev['event']}: root {t.pid} ({visible(t.root.name)}): {visible(res.message)}", flush=True)

    try:
        actions.run_watch(sampler, apply=args.apply, interval=interval, grace=grace, face="cli",
                          kill_grace=config.kill_timeout, config=config, on_event=on_event,
                          iterations=args.count)
    except KeyboardInterrupt:
        # SIGTERM (a service stop) is a clean stop; Ctrl-C is an interrupt: 130, as a shell reports it
        return EXIT_OK if stopping["v"] else 130
    finally:
        signal.signal(signal.SIGTERM, old)
    return EXIT_OK
