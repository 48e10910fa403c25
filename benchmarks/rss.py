"""Peak RSS (VmHWM) of the full-screen monitors, side by side: ``gputop`` against ``nvitop`` (and any other
commands given with --variant) at the same moment, in tmux windows of the same size, on the same fake GPUs.

    python -m benchmarks.rss --holder-counts 16,128,1024 --runs 3 --settle 20
    python -m benchmarks.rss --variant "base=python /tmp/base/run_gputop.py --interval 1"

Each run starts every command at once, waits until each shows its devices (and a holder's PID, where it
fits), lets them refresh for ``--settle`` seconds, then reads VmHWM of each. The floors are measured too:
``python -c pass``, a bare Textual app with one Static widget (in tmux), and the imports of ``textual.app``
and ``gputop.tui.app``. Issue 13's goal: gputop <= 1.5x nvitop.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from benchmarks.common import PY, HolderForest, compile_sources, median, proc_peak_rss_kb
from benchmarks.fake_gpus import make_field
from benchmarks.tui import APPS, DEVICES, Tmux, _ints, wait_for

GPUS = 8
BARE_TEXTUAL = ("from textual.app import App\nfrom textual.widgets import Static\n"
                "class A(App):\n    def compose(self):\n        yield Static('H200 bare')\nA().run()\n")
IMPORT_FLOOR = ("import re, sys\n{stmt}\n"
                "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))")


def import_floor(stmt: str, env: dict) -> int:
    """VmHWM (KiB) of a fresh interpreter that only runs ``stmt``."""
    r = subprocess.run([PY, "-c", IMPORT_FLOOR.format(stmt=stmt)], env=env, capture_output=True, text=True,
                       timeout=60, check=True)
    return int(r.stdout.split()[-1])


def one_run(tmux: Tmux, session: str, apps: dict[str, str], holder: re.Pattern[str], settle: float) -> dict:
    """Every app at once; VmHWM of each after ``settle`` seconds past its first full frame."""
    pids, t0 = {}, {}
    for name, command in apps.items():
        t0[name] = time.perf_counter()
        pids[name] = tmux.launch(session, name, command)
    try:
        for name in apps:
            pattern = DEVICES.get(name.split("-")[0], DEVICES["gputop"])
            wait_for(tmux, f"{session}:{name}", [pattern, holder], t0[name], optional_s=15)
        time.sleep(settle)
        return {name: proc_peak_rss_kb(pid) for name, pid in pids.items()}
    finally:
        for name in apps:
            tmux.close(f"{session}:{name}")
        time.sleep(0.5)


def measure(holders: int, apps: dict[str, str], runs: int, settle: float, size: tuple[int, int]) -> dict:
    with HolderForest(gpus=GPUS, per_gpu=max(1, holders // GPUS)) as forest:
        field = make_field(GPUS, forest.holders())
        holder = re.compile(r"\b(" + "|".join(str(p) for _, p in forest.holders()) + r")\b")
        with Tmux(field.env("nvml")) as tmux:
            session = tmux.session(*size)
            out: dict[str, list[int]] = {name: [] for name in apps}
            for _ in range(runs):
                for name, kb in one_run(tmux, session, apps, holder, settle).items():
                    out[name].append(kb)
            env = field.env("nvml")
            floors = {"bare Textual app (one Static)": one_run(tmux, session, {"bare": f"{PY} -c {_sh(BARE_TEXTUAL)}"},
                                                                re.compile("bare"), 2.0)["bare"]}
    for label, stmt in (("python -c pass", "pass"), ("import textual.app", "import textual.app"),
                        ("import gputop.tui.app", "import gputop.tui.app")):
        floors[label] = import_floor(stmt, env)
    return {"holders": holders, "kb": out, "floors": floors}


def _sh(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def _mib(kb: float) -> str:
    return f"{kb / 1024:.1f}"


def report(res: dict) -> str:
    kb, n = res["kb"], median(res["kb"]["nvitop"])
    lines = [f"{res['holders']:,} holders ({len(kb['nvitop'])} runs, MiB, median [all]; ratio to nvitop's median):"]
    for name, xs in kb.items():
        lines.append(f"  {name:<12} {_mib(median(xs)):>6}  [{', '.join(_mib(x) for x in xs)}]  "
                     f"{median(xs) / n:.2f}x")
    lines.append("  floors: " + "; ".join(f"{k} {_mib(v)}" for k, v in res["floors"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rss", description=__doc__.split("\n\n")[0])
    ap.add_argument("--holder-counts", default="16,128,1024")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settle", type=float, default=20.0, help="seconds of refreshes after the first frame")
    ap.add_argument("--size", default="120x40")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=COMMAND",
                    help="another command measured alongside (e.g. an older gputop)")
    args = ap.parse_args(argv)
    apps = dict(APPS)
    for v in args.variant:
        name, _, command = v.partition("=")
        apps[f"gputop-{name}"] = command
    compile_sources()
    size = tuple(int(x) for x in args.size.split("x"))
    print(f"load {os.getloadavg()[0]:.1f}; size {args.size}; settle {args.settle:.0f} s", flush=True)
    for n in _ints(args.holder_counts):
        print(report(measure(n, apps, args.runs, args.settle, size)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
