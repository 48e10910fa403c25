"""``python -m benchmarks``: run every benchmark at every size and print one table each (Markdown).

    python -m benchmarks                 # all of them at every size of issue 13 (about 30 minutes)
    python -m benchmarks --quick         # 16 and 1,024 holders, 200 host processes, 120x40, short windows
    python -m benchmarks --only 1,4      # some of them
    python -m benchmarks --holder-counts 16,1024 --hosts 200 --sizes 120x40   # some sizes
    python -m benchmarks --out FILE      # also write the tables to FILE

Sizes: 16, 128 and 1,024 holders on 8 fake GPUs, with 200 and 10,000 host processes, at 120x40 and 200x60
terminals. Each size is set up once (real holder trees, real sleepers) and every benchmark runs on it.
gputop and its reference (nvitop, or the /proc floor) run interleaved or at the same moment, and each
ratio is printed as its median with its spread: PASS when the whole spread is within the goal, MISS when
all of it is over, and "not shown" when the spread crosses the goal (the machine was too loaded to tell).

Benchmarks are not tests: they exit 0 either way, 2 when one could not run (nvitop missing, no tmux, no C
compiler for the fake NVML library), with one line saying what to install.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import sys
import time
import traceback

QUICK = {"holder_counts": (16, 1024), "hosts": (200,), "sizes": ((120, 40),)}


def _header(quick: bool) -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",) * 3
    return (f"# gputop benchmarks, {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}\n\n"
            f"{platform.node()}: {os.cpu_count()} CPUs, Linux {platform.release()}, Python "
            f"{platform.python_version()}; load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
            f"{'; --quick' if quick else ''}\n")


def _missing() -> dict[int, str]:
    """Benchmarks that cannot run here, with the one line that says why."""
    from benchmarks.common import BENCH_EXTRA_HINT, missing_tools
    from benchmarks.fake_gpus import fake_nvml_dir, fake_nvml_error
    from benchmarks.tui import preflight

    out: dict[int, str] = {}
    if fake_nvml_dir() is None:
        out[2] = fake_nvml_error() or "fake NVML library unavailable"
    elif missing_tools("nvitop"):
        out[2] = f"nvitop is not installed: {BENCH_EXTRA_HINT}"
    why = preflight()
    if why:
        out[3] = out[5] = why
    return out


def main(argv=None) -> int:
    from benchmarks.common import HOLDER_COUNTS, HOST_COUNTS, exit_cleanly_on_sigterm
    from benchmarks.tui import SIZES, _ints, parse_sizes

    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes, shorter runs, for iterating")
    ap.add_argument("--only", default="1,2,3,4,5", help="comma-separated benchmark numbers")
    ap.add_argument("--holder-counts", help=f"GPU holders on 8 GPUs (default {','.join(map(str, HOLDER_COUNTS))})")
    ap.add_argument("--hosts", help=f"host processes (default {','.join(map(str, HOST_COUNTS))})")
    ap.add_argument("--sizes", help="terminal sizes, WxH (default " + ",".join(f"{w}x{h}" for w, h in SIZES) + ")")
    ap.add_argument("--out", metavar="FILE", help="also write the tables (Markdown) to FILE")
    args = ap.parse_args(argv)
    exit_cleanly_on_sigterm()
    only = {int(x) for x in args.only.split(",") if x.strip()}
    quick = args.quick
    base = QUICK if quick else {"holder_counts": HOLDER_COUNTS, "hosts": HOST_COUNTS, "sizes": SIZES}
    holder_counts = _ints(args.holder_counts) if args.holder_counts else base["holder_counts"]
    hosts = _ints(args.hosts) if args.hosts else base["hosts"]
    sizes = parse_sizes(args.sizes) if args.sizes else base["sizes"]

    texts = [_header(quick)]
    print(texts[0], flush=True)
    missing = _missing()
    for n in sorted(only & set(missing)):
        line = f"benchmark {n} cannot run here: {missing[n]}"
        print(line, file=sys.stderr)
        texts.append(f"## benchmark {n}: not run\n\n{line}\n")
    todo = only - set(missing)
    failed = bool(only & set(missing))
    done: list[str] = []
    try:
        _run_sizes(todo, quick, holder_counts, hosts, sizes, done)
    except Exception:
        failed = True
        err = traceback.format_exc()
        print(f"benchmarks could not finish:\n{err}", file=sys.stderr)
        done.append(f"## could not finish (the tables above hold the sizes measured before)\n\n```\n{err[-2000:]}```\n")
    texts.extend(done)
    if 4 in todo:
        from benchmarks import reap_latency

        texts.append(reap_latency.run(runs=2 if quick else 5))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(texts))
    return 2 if failed else 0


def _run_sizes(todo: set[int], quick: bool, holder_counts, hosts, sizes, texts: list[str]) -> None:
    """Benchmarks 1, 2, 3 and 5 at every (holders, host processes), each size set up once; their tables
    go to ``texts`` even when a later size fails."""
    if not todo & {1, 2, 3, 5}:
        return
    from benchmarks import cli_once, sample_cost, tui
    from benchmarks.common import setups

    samples, once, screens = [], [], []
    try:
        _measure_sizes(todo, quick, holder_counts, hosts, sizes, samples, once, screens)
    finally:
        if samples:
            texts.append(sample_cost.report(samples, rounds=20 if quick else 60))
        if once:
            texts.append(cli_once.report(once, runs=5 if quick else 9))
        if screens:
            texts.append(tui.report(screens))


def _measure_sizes(todo, quick, holder_counts, hosts, sizes, samples, once, screens) -> None:
    from benchmarks import cli_once, sample_cost, tui
    from benchmarks.common import setups

    for setup in setups(holder_counts, hosts):
        t0 = time.time()
        print(f"-- {setup.label} (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
        if 1 in todo:
            samples.extend(sample_cost.measure(setup, rounds=20 if quick else 60))
        if 2 in todo:
            once.append(cli_once.measure(setup, runs=5 if quick else 9))
        if todo & {3, 5}:
            screens.extend(tui.measure(setup, sizes, *((3, 5.0, 2) if quick else (8, 10.0, 8))))
        print(f"   done in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
