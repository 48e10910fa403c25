"""Benchmark 2: ``gputop status --json`` against ``nvitop --once``, whole process, same fake GPUs.

2,000 host processes, 8 GPUs x 16 holders, both tools on the fake libnvidia-ml.so.1. Runs alternate
(gputop, nvitop, gputop, ...) so that both see the same load; wall, CPU (wait4 rusage: user + system of
the process) and peak RSS. Budget: gputop / nvitop <= 1.0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.common import (
    PY, ROOT, HolderForest, Sleepers, host_process_count, median, ms, print_table, run_measured, verdict,
)
from benchmarks.fake_gpus import fake_nvml_dir, fake_nvml_error, make_field

BUDGET = 1.0
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


def run(runs: int = 9, host: int = 2000) -> str:
    if fake_nvml_dir() is None:
        return print_table("2. gputop status --json vs nvitop --once", ["skipped"], [[fake_nvml_error()]])
    cmds = commands()
    res: dict[str, list] = {k: [] for k in cmds}
    with HolderForest(gpus=8, per_gpu=16) as forest, Sleepers(host - host_process_count()):
        field = make_field(8, forest.holders())
        env = field.env("nvml")
        env["COLUMNS"] = "120"
        hosts = host_process_count()
        for name, cmd in cmds.items():  # warm the page cache and the bytecode caches
            run_measured(cmd, env=env)
        for _ in range(runs):
            for name, cmd in cmds.items():
                res[name].append(run_measured(cmd, env=env))
    g, n = res["gputop status --json"], res["nvitop --once"]
    wall_ratio = median([a.wall / b.wall for a, b in zip(g, n)])
    cpu_ratio = median([a.cpu / b.cpu for a, b in zip(g, n)])
    rows = []
    for name, rs in res.items():
        rows.append([name, ms(median([r.wall for r in rs])), ms(median([r.cpu for r in rs])),
                     f"{median([r.maxrss_kb for r in rs]) / 1024:.1f} MiB",
                     f"{median([len(r.stdout) for r in rs]) / 1024:.0f} KiB"])
    notes = [
        f"gputop/nvitop: wall {wall_ratio:.2f}x {verdict(wall_ratio <= BUDGET)}, "
        f"CPU {cpu_ratio:.2f}x {verdict(cpu_ratio <= BUDGET)} (budget <= {BUDGET}; medians of per-pair ratios)",
        f"{hosts:,} host processes, 128 holders on 8 fake GPUs (libnvidia-ml.so.1 from tests/fakenvml), "
        f"{runs} alternating runs after one warm-up each.",
    ]
    return print_table("2. gputop status --json vs nvitop --once (whole process)",
                       ["command", "wall", "CPU", "peak RSS", "output"], rows, notes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cli_once")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--host", type=int, default=2000)
    args = ap.parse_args(argv)
    from benchmarks.common import exit_cleanly_on_sigterm

    exit_cleanly_on_sigterm()
    run(args.runs, args.host)
    return 0


if __name__ == "__main__":
    sys.exit(main())
