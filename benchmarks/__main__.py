"""``python -m benchmarks``: run every benchmark and print one table each (Markdown).

    python -m benchmarks                 # all five (about 3-4 minutes)
    python -m benchmarks --quick         # shorter TUI window and fewer rounds (about 1-2 minutes)
    python -m benchmarks --only 1,4      # some of them
    python -m benchmarks --out FILE      # also write the tables to FILE

Benchmarks are not tests: they print figures and PASS/MISS against the budgets in issue 8, and exit 0
either way (2 only when one could not run). The machine's load is noted with the results, since other
work on a small machine moves the numbers; ratios are always taken within one run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import sys
import traceback


def _header(quick: bool) -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",) * 3
    return (f"# gputop benchmarks, {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}\n\n"
            f"{platform.node()}: {os.cpu_count()} CPUs, Linux {platform.release()}, Python "
            f"{platform.python_version()}; load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
            f"{'; --quick' if quick else ''}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs, for iterating")
    ap.add_argument("--only", default="1,2,3,4,5", help="comma-separated benchmark numbers")
    ap.add_argument("--out", metavar="FILE", help="also write the tables (Markdown) to FILE")
    args = ap.parse_args(argv)
    from benchmarks.common import exit_cleanly_on_sigterm

    exit_cleanly_on_sigterm()
    only = {int(x) for x in args.only.split(",") if x.strip()}
    quick = args.quick

    from benchmarks import cli_once, reap_latency, sample_cost, tui

    jobs = []
    if 1 in only:
        jobs.append(("1", lambda: sample_cost.run(rounds=20 if quick else 60)))
    if 2 in only:
        jobs.append(("2", lambda: cli_once.run(runs=5 if quick else 11)))
    if 3 in only or 5 in only:
        jobs.append(("3+5", lambda: tui.run(quick=quick)))
    if 4 in only:
        jobs.append(("4", lambda: reap_latency.run(runs=2 if quick else 5)))
    texts = [_header(quick)]
    print(texts[0])
    failed = False
    for name, job in jobs:
        try:
            texts.append(job())
        except Exception:
            failed = True
            err = traceback.format_exc()
            print(f"benchmark {name} could not run:\n{err}", file=sys.stderr)
            texts.append(f"## benchmark {name}: could not run\n\n```\n{err[-2000:]}```\n")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(texts))
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
