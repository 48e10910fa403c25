"""gputop's TUI CPU cost: the installed ``gputop`` in tmux at a 1 s refresh, on 8 simulated GPUs with 128
real GPU-holding processes (half of them in real orphan trees), for 60 s.

CPU time is read from /proc/<pid>/stat (utime+stime) of the gputop process after a warm-up, so start-up
is not counted. As a floor measured in the same run, a bare ``Sampler.sample()`` loop at the same interval
runs alongside: the ratio is what the UI (Textual, the tree, the panes) costs on top of sampling.

    .venv/bin/python -m benchmarks.tui_cpu [--seconds 60] [--gpus 8] [--per-gpu 16] [--interval 1]

Not a test: it prints a table. The nvitop side-by-side comparison is the benchmarks issue's work.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import PY, ROOT, HolderForest, print_table, proc_cpu_seconds, write_scenario

SAMPLER_LOOP = """\
import sys, time
from gputop.core.config import Config
from gputop.core.sampler import Sampler
s = Sampler.open("simulated", sys.argv[1], Config())
interval, end = float(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    t = time.monotonic()
    s.sample()
    time.sleep(max(0.0, interval - (time.monotonic() - t)))
"""


def gputop_exe() -> str:
    for cand in (ROOT / ".venv" / "bin" / "gputop", Path(sys.executable).parent / "gputop"):
        if cand.exists():
            return str(cand)
    exe = shutil.which("gputop")
    if not exe:
        sys.exit("tui_cpu: the gputop console script is not installed (pip install -e .)")
    return exe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--per-gpu", type=int, default=16)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--size", default="120x40", help="terminal size, WxH")
    args = ap.parse_args(argv)
    tmux = shutil.which("tmux")
    if not tmux:
        sys.exit("tui_cpu: tmux is needed (apt-get install tmux)")
    exe = gputop_exe()
    w, h = args.size.split("x")
    tmp = Path(tempfile.mkdtemp(prefix="gputop-bench-tui-"))
    sock = tmp / "tmux.sock"
    cfg = tmp / "config.yaml"
    cfg.write_text("protect: []\n")
    with HolderForest(gpus=args.gpus, per_gpu=args.per_gpu) as forest:
        scenario = write_scenario(tmp / "scenario.yaml", args.gpus, forest.holders())
        env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        env.update(TERM="xterm-256color", GPUTOP_CONFIG=str(cfg), GPUTOP_STATE_DIR=str(tmp / "state"))
        cmd = f"exec {exe} --scenario {scenario} --interval {args.interval}"
        subprocess.run([tmux, "-S", str(sock), "-f", "/dev/null", "new-session", "-d", "-s", "b", "-x", w,
                        "-y", h, cmd], env=env, check=True)
        floor = None
        try:
            pid = int(subprocess.run([tmux, "-S", str(sock), "list-panes", "-t", "b", "-F", "#{pane_pid}"],
                                     capture_output=True, text=True, check=True).stdout.split()[0])
            time.sleep(args.warmup)
            screen = subprocess.run([tmux, "-S", str(sock), "capture-pane", "-p", "-t", "b"],
                                    capture_output=True, text=True).stdout
            holders_shown = f"{len(forest.holders())} holders" in screen
            floor = subprocess.Popen([PY, "-c", SAMPLER_LOOP, str(scenario), str(args.interval),
                                      str(args.seconds + 1)], env=env, cwd=ROOT)
            c0, t0 = proc_cpu_seconds(pid), time.monotonic()
            f0 = proc_cpu_seconds(floor.pid) or 0.0
            time.sleep(args.seconds)
            c1, t1 = proc_cpu_seconds(pid), time.monotonic()
            f1 = proc_cpu_seconds(floor.pid) or f0
            if c0 is None or c1 is None:
                sys.exit("tui_cpu: gputop exited during the run")
            tui = (c1 - c0) / (t1 - t0) * 100
            base = (f1 - f0) / (t1 - t0) * 100
        finally:
            subprocess.run([tmux, "-S", str(sock), "kill-server"], capture_output=True)
            if floor is not None:
                floor.kill()
                floor.wait()
            shutil.rmtree(tmp, ignore_errors=True)
    ratio = f"{tui / base:.1f}x" if base > 0 else "n/a"
    print_table(
        f"gputop TUI CPU, {args.gpus} GPUs, {len(forest.holders()) if forest.trees else args.gpus * args.per_gpu}"
        f" holders, {args.interval:g} s refresh, {args.seconds:g} s, {w}x{h}",
        ["process", "CPU %", "vs sampler floor"],
        [["gputop (TUI, in tmux)", f"{tui:.1f}", ratio], ["Sampler.sample() loop (floor)", f"{base:.1f}", "1.0x"]],
        notes=[f"{os.cpu_count()} CPUs; CPU % of one core; warm-up {args.warmup:g} s not counted",
               "screen showed all holders" if holders_shown else "warning: holder count not seen on screen"],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
