"""Benchmark 2: ``gputop status --json`` against ``nvitop --once``, whole process, same fake GPUs.

At 16, 128 and 1,024 holders on 8 GPUs, with 200 and 10,000 host processes, both tools on the fake
libnvidia-ml.so.1. Runs alternate (gputop, nvitop, gputop, ...) so that both see the same load; wall, CPU
(wait4 rusage: user + system of the process) and peak RSS. Goal (issue 13): gputop / nvitop CPU <= 1.0 at
16 holders, <= 0.5 at 1,024 (128: reported against 1.0).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.common import (
    BENCH_EXTRA_HINT, HOLDER_COUNTS, HOST_COUNTS, PY, Ratio, host_process_count, median, missing_tools, ms,
    print_table, run_measured,
)
from benchmarks.fake_gpus import fake_nvml_dir, fake_nvml_error

VENV_BIN = Path(PY).parent


def _tool(name: str) -> str:
    p = VENV_BIN / name
    return str(p) if p.exists() else name


def commands() -> dict[str, list[str]]:
    return {
        "gputop status --json": [_tool("gputop"), "status", "--json"],
        "nvitop --once": [_tool("nvitop"), "--once"],
        "gputop status (table)": [_tool("gputop"), "status"],
        "python -c pass (interpreter floor)": [PY, "-c", "pass"],
    }


# Goals of issue 13: status --json CPU at most 1.0x nvitop --once at 16 holders, 0.5x at 1,024.
def goal_for(holders: int) -> float:
    return 0.5 if holders >= 1024 else 1.0


def measure(setup, runs: int = 9) -> dict:
    """Alternating runs of every command at one size; per-pair ratios of gputop to nvitop."""
    cmds = commands()
    res: dict[str, list] = {k: [] for k in cmds}
    env = setup.field.env("nvml")
    env["COLUMNS"] = "120"
    for name, cmd in cmds.items():  # warm the page cache and the bytecode caches
        run_measured(cmd, env=env)
    for _ in range(runs):
        for name, cmd in cmds.items():
            res[name].append(run_measured(cmd, env=env))
    g, n = res["gputop status --json"], res["nvitop --once"]
    return {"holders": setup.holders, "host": host_process_count(), "res": res,
            "cpu": Ratio([a.cpu / b.cpu for a, b in zip(g, n)]),
            "wall": Ratio([a.wall / b.wall for a, b in zip(g, n)])}


def run(runs: int = 9, host_counts=HOST_COUNTS, holder_counts=HOLDER_COUNTS) -> str:
    if fake_nvml_dir() is None:
        return print_table("2. gputop status --json vs nvitop --once", ["skipped"], [[fake_nvml_error()]])
    if missing_tools("nvitop"):
        return print_table("2. gputop status --json vs nvitop --once", ["skipped"],
                           [[f"nvitop is not installed: {BENCH_EXTRA_HINT}"]])
    from benchmarks.common import setups

    return report([measure(s, runs) for s in setups(holder_counts, host_counts)], runs)


def report(results: list[dict], runs: int) -> str:
    rows = []
    for r in results:
        res = r["res"]
        g, n = res["gputop status --json"], res["nvitop --once"]
        t, f = res["gputop status (table)"], res["python -c pass (interpreter floor)"]
        goal = goal_for(r["holders"])
        rows.append([
            f"{r['holders']:,}", f"{r['host']:,}", ms(median([x.cpu for x in g])), ms(median([x.cpu for x in n])),
            r["cpu"].cell(), f"<= {goal}", r["cpu"].verdict(goal), r["wall"].cell(),
            ms(median([x.cpu for x in t])), ms(median([x.cpu for x in f])),
            f"{median([x.maxrss_kb for x in g]) / 1024:.1f} / {median([x.maxrss_kb for x in n]) / 1024:.1f} MiB",
            f"{median([len(x.stdout) for x in g]) / 1024:.0f} / {median([len(x.stdout) for x in n]) / 1024:.0f} KiB",
        ])
    notes = [
        f"{runs} alternating runs per size after one warm-up each; ratios are medians of per-pair ratios, spread "
        "min-max (25th-75th percentile from 8 pairs). PASS: the whole spread within the goal; 'not shown': the "
        "spread crosses it. CPU: user + system of the whole process (wait4).",
        "Both write to a file (not a terminal): gputop's JSON is then compact. 8 fake GPUs (libnvidia-ml.so.1 "
        "from tests/fakenvml).",
    ]
    return print_table("2. gputop status --json vs nvitop --once (whole process)",
                       ["holders", "host procs", "gputop CPU", "nvitop CPU", "CPU ratio (spread)", "goal",
                        "result", "wall ratio (spread)", "status (table) CPU", "python -c pass CPU",
                        "peak RSS g / n", "output g / n"], rows, notes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cli_once")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--hosts", default=",".join(map(str, HOST_COUNTS)))
    ap.add_argument("--holder-counts", default=",".join(map(str, HOLDER_COUNTS)))
    args = ap.parse_args(argv)
    from benchmarks.common import exit_cleanly_on_sigterm

    exit_cleanly_on_sigterm()
    run(args.runs, tuple(int(x) for x in args.hosts.split(",")),
        tuple(int(x) for x in args.holder_counts.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
