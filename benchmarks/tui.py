"""Benchmarks 3 and 5: the full-screen monitors in tmux, gputop against nvitop on the same fake GPUs.

3. CPU over a window (60 s; 15 s with --quick) at a 1 s refresh: ``gputop --interval 1`` against
   ``nvitop -m full --interval 1``, both running at the same time in their own tmux windows, with peak RSS
   (VmHWM). CPU is utime+stime of the app process (all its threads) from /proc/<pid>/stat, counted from
   the first frame with data to the end of the window. Budget: gputop <= 0.5x nvitop.
5. Start-up: from launching the command in a tmux window to the first frame that shows a GPU holder's
   PID (capture-pane polled every 10 ms). Budget: < 1 s. nvitop is measured the same way, for reference.

Both use the fake libnvidia-ml.so.1 (8 GPUs x 16 holders, ~2,000 host processes).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import (
    PY, HolderForest, Sleepers, host_process_count, median, print_table, proc_cpu_seconds, proc_peak_rss_kb,
    verdict,
)
from benchmarks.fake_gpus import fake_nvml_dir, fake_nvml_error, make_field

VENV_BIN = Path(PY).parent
COLS, ROWS = 200, 70
CPU_BUDGET = 0.5
STARTUP_BUDGET = 1.0


def _tool(name: str) -> str:
    p = VENV_BIN / name
    return str(p) if p.exists() else name


APPS = {
    "gputop": f"{_tool('gputop')} --interval 1",
    "nvitop": f"{_tool('nvitop')} -m full --interval 1",
}


class Tmux:
    """A private tmux server (its own socket) whose windows run the apps."""

    def __init__(self, env: dict):
        self.sock = f"gputop-bench-{os.getpid()}"
        self.env = {**env, "TERM": "xterm-256color"}
        self.env.pop("TMUX", None)

    def __enter__(self) -> "Tmux":
        self.cmd("new-session", "-d", "-s", "bench", "-x", str(COLS), "-y", str(ROWS), "sleep 3600")
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True)

    def cmd(self, *args: str) -> str:
        r = subprocess.run(["tmux", "-L", self.sock, "-f", "/dev/null", *args], env=self.env,
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args[:2])}: {r.stderr.strip()}")
        return r.stdout

    def launch(self, name: str, command: str) -> int:
        self.cmd("new-window", "-d", "-t", "bench", "-n", name, f"exec {command}")
        return int(self.cmd("list-panes", "-t", f"bench:{name}", "-F", "#{pane_pid}").split()[0])

    def capture(self, name: str) -> str:
        return self.cmd("capture-pane", "-p", "-t", f"bench:{name}")

    def close(self, name: str) -> None:
        try:
            self.cmd("kill-window", "-t", f"bench:{name}")
        except RuntimeError:
            pass


def wait_for_data(tmux: Tmux, name: str, pattern: re.Pattern[str], t0: float, timeout: float = 30) -> float:
    """Seconds from ``t0`` until the window shows ``pattern`` (a holder PID)."""
    while True:
        now = time.perf_counter()
        if pattern.search(tmux.capture(name)):
            return now - t0
        if now - t0 > timeout:
            raise RuntimeError(f"{name} showed no GPU holder within {timeout:.0f} s:\n{tmux.capture(name)[:2000]}")
        time.sleep(0.01)


def _pid_gone(pid: int, timeout: float = 5) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.02)


def startup(tmux: Tmux, pattern: re.Pattern[str], runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in APPS}
    for i in range(runs):
        for name, command in APPS.items():
            win = f"{name}-start{i}"
            t0 = time.perf_counter()
            pid = tmux.launch(win, command)
            out[name].append(wait_for_data(tmux, win, pattern, t0))
            tmux.close(win)
            _pid_gone(pid)
    return out


def cpu_window(tmux: Tmux, pattern: re.Pattern[str], seconds: float) -> dict[str, dict]:
    res: dict[str, dict] = {}
    t0 = {}
    for name, command in APPS.items():
        t0[name] = time.perf_counter()
        res[name] = {"pid": tmux.launch(name, command)}
    for name in APPS:
        wait_for_data(tmux, name, pattern, t0[name])
        res[name]["cpu0"] = proc_cpu_seconds(res[name]["pid"])
        res[name]["w0"] = time.perf_counter()
    time.sleep(seconds)
    for name in APPS:
        r = res[name]
        r["cpu"] = proc_cpu_seconds(r["pid"]) - r["cpu0"]
        r["wall"] = time.perf_counter() - r["w0"]
        r["rss_kb"] = proc_peak_rss_kb(r["pid"])
        r["threads"] = len(os.listdir(f"/proc/{r['pid']}/task"))
        r["frame"] = tmux.capture(name)
        tmux.close(name)
    return res


def run(quick: bool = False, host: int = 2000, startup_runs: int = 5) -> str:
    if fake_nvml_dir() is None:
        return print_table("3/5. TUI benchmarks", ["skipped"], [[fake_nvml_error()]])
    if shutil.which("tmux") is None:
        return print_table("3/5. TUI benchmarks", ["skipped"], [["tmux is not installed (apt-get install tmux)"]])
    seconds = 15.0 if quick else 60.0
    texts = []
    with HolderForest(gpus=8, per_gpu=16) as forest, Sleepers(host - host_process_count()):
        field = make_field(8, forest.holders())
        pattern = re.compile(r"\b(" + "|".join(str(p) for _, p in forest.holders()) + r")\b")
        hosts = host_process_count()
        with Tmux(field.env("nvml")) as tmux:
            st = startup(tmux, pattern, 2 if quick else startup_runs)
            cpu = cpu_window(tmux, pattern, seconds)
    g, n = cpu["gputop"], cpu["nvitop"]
    ratio = g["cpu"] / n["cpu"] if n["cpu"] else float("inf")
    rows = [[name, f"{r['cpu']:.2f} s", f"{100 * r['cpu'] / r['wall']:.1f}%",
             f"{r['rss_kb'] / 1024:.1f} MiB" if r["rss_kb"] else "?", str(r["threads"])]
            for name, r in cpu.items()]
    texts.append(print_table(
        f"3. TUI CPU over {seconds:.0f} s at a 1 s refresh, both in tmux ({COLS}x{ROWS}) (budget: gputop <= "
        f"{CPU_BUDGET}x nvitop)",
        ["app", "CPU", "CPU %", "peak RSS", "threads"], rows,
        [f"gputop/nvitop CPU: {ratio:.2f}x {verdict(ratio <= CPU_BUDGET)}. Commands: "
         + "; ".join(f"`{c.replace(str(VENV_BIN) + '/', '')}`" for c in APPS.values()),
         f"{hosts:,} host processes, 128 holders on 8 fake GPUs; both apps ran at the same time; CPU counted "
         "from each app's first frame with data."]))
    rows = [[name, f"{median(xs):.3f} s", f"{min(xs):.3f} s", f"{max(xs):.3f} s",
             verdict(max(xs) < STARTUP_BUDGET) if name == "gputop" else "(reference)"]
            for name, xs in st.items()]
    texts.append(print_table(
        f"5. Start-up to the first frame with data, in tmux (budget: gputop < {STARTUP_BUDGET:.0f} s)",
        ["app", "median", "best", "worst", "budget"], rows,
        [f"{len(st['gputop'])} launches each, alternating; from `tmux new-window` to a holder PID in "
         "capture-pane (polled every 10 ms)."]))
    return "\n".join(texts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tui")
    ap.add_argument("--quick", action="store_true", help="15 s CPU window, 2 start-ups each")
    ap.add_argument("--host", type=int, default=2000)
    ap.add_argument("--startup-runs", type=int, default=5)
    args = ap.parse_args(argv)
    from benchmarks.common import exit_cleanly_on_sigterm

    exit_cleanly_on_sigterm()
    run(args.quick, args.host, args.startup_runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
