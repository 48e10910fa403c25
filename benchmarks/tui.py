"""Benchmarks 3 and 5: the full-screen monitors in tmux, gputop against nvitop on the same fake GPUs.

At 16, 128 and 1,024 holders on 8 GPUs, with 200 and 10,000 host processes, at 120x40 and 200x60:

3. CPU at a 1 s refresh: ``gputop --interval 1`` against ``nvitop -m full --interval 1``, both running at
   the same moment in their own tmux windows, over 8 consecutive 10 s windows (3 of 5 s with --quick); the ratio
   is the median of per-window ratios, with its spread. Goal: gputop <= 0.5x nvitop. Peak RSS (VmHWM) of
   each at the end; goal <= 1.5x.
5. Start-up: alternating launches, from ``tmux new-window`` to the first frame that shows the devices
   (the GPU name) and to the first that shows a holder's PID. Goal: devices no later than nvitop's.

A result whose spread crosses its goal is printed as "not shown": a loaded machine cannot tell.
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
    BENCH_EXTRA_HINT, HOLDER_COUNTS, HOST_COUNTS, PY, Ratio, host_process_count, median, missing_tools,
    print_table, proc_cpu_ns, proc_cpu_seconds, proc_peak_rss_kb, verdict,
)
from benchmarks.fake_gpus import fake_nvml_dir, fake_nvml_error

VENV_BIN = Path(PY).parent
SIZES = ((120, 40), (200, 60))
CPU_BUDGET = 0.5
RSS_BUDGET = 1.5


def _tool(name: str) -> str:
    p = VENV_BIN / name
    return str(p) if p.exists() else name


APPS = {
    "gputop": f"{_tool('gputop')} --interval 1",
    "nvitop": f"{_tool('nvitop')} --interval 1",  # its default display mode (auto), as a user runs it
}


class Tmux:
    """A private tmux server (its own socket); one session per terminal size, whose windows run the apps."""

    def __init__(self, env: dict):
        self.sock = f"gputop-bench-{os.getpid()}"
        self.env = {**env, "TERM": "xterm-256color"}
        self.env.pop("TMUX", None)
        self.sessions: set[str] = set()

    def __enter__(self) -> "Tmux":
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True)

    def session(self, cols: int, rows: int) -> str:
        name = f"s{cols}x{rows}"
        if name not in self.sessions:
            self.cmd("new-session", "-d", "-s", name, "-x", str(cols), "-y", str(rows), "sleep 3600")
            self.sessions.add(name)
        return name

    def cmd(self, *args: str) -> str:
        r = subprocess.run(["tmux", "-L", self.sock, "-f", "/dev/null", *args], env=self.env,
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args[:2])}: {r.stderr.strip()}")
        return r.stdout

    def launch(self, session: str, name: str, command: str) -> int:
        self.cmd("new-window", "-d", "-t", session, "-n", name, f"exec {command}")
        return int(self.cmd("list-panes", "-t", f"{session}:{name}", "-F", "#{pane_pid}").split()[0])

    def capture(self, target: str) -> str:
        return self.cmd("capture-pane", "-p", "-t", target)

    def close(self, target: str) -> None:
        try:
            self.cmd("kill-window", "-t", target)
        except RuntimeError:
            pass


# On screen only once a device row shows data: gputop's pane names the GPU; nvitop's compact mode does not,
# so for it the memory column ("2048MiB / 140.4GiB", "128.0GiB / 140.4GiB").
DEVICES = {"gputop": re.compile(r"H200"), "nvitop": re.compile(r"[KMG]iB / \d")}


def wait_for(tmux: Tmux, name: str, patterns: list[re.Pattern[str]], t0: float,
             timeout: float = 60, optional_s: float = 0) -> list[float | None]:
    """Seconds from ``t0`` until the window first shows each of ``patterns`` (capture-pane every 10 ms).

    The first pattern is required (an error after ``timeout``); the others are waited for at most
    ``optional_s`` longer, and None when not seen (nvitop shows no process list on a short terminal)."""
    seen: list[float | None] = [None] * len(patterns)
    while True:
        now = time.perf_counter()
        screen = tmux.capture(name)
        for i, p in enumerate(patterns):
            if seen[i] is None and p.search(screen):
                seen[i] = now - t0
        if all(x is not None for x in seen):
            return seen
        if seen[0] is not None and now - t0 > seen[0] + optional_s:
            return seen
        if seen[0] is None and now - t0 > timeout:
            raise RuntimeError(f"{name} did not show {patterns[0].pattern[:40]!r} within {timeout:.0f} s:\n"
                               f"{screen[:2000]}")
        time.sleep(0.01)


def _pid_gone(pid: int, timeout: float = 5) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.02)


def startup(tmux: Tmux, session: str, holder: re.Pattern[str], runs: int) -> dict[str, dict[str, list[float]]]:
    """Alternating launches: time to the first frame with the devices, and with a holder's PID."""
    out: dict[str, dict[str, list[float]]] = {name: {"devices": [], "holders": []} for name in APPS}
    for i in range(runs):
        for name, command in APPS.items():
            win = f"{name}-start{i}"
            t0 = time.perf_counter()
            pid = tmux.launch(session, win, command)
            try:
                dev, hold = wait_for(tmux, f"{session}:{win}", [DEVICES[name], holder], t0, optional_s=15)
            except RuntimeError as e:  # the app exited at start (seen once with nvitop under heavy load)
                print(f"   {name} launch {i} did not come up: {str(e).splitlines()[0]}", file=sys.stderr)
                continue
            out[name]["devices"].append(dev)
            out[name]["holders"].append(hold)
            tmux.close(f"{session}:{win}")
            _pid_gone(pid)
    return out


def cpu_windows(tmux: Tmux, session: str, holder: re.Pattern[str], windows: int, window_s: float) -> dict:
    """Both apps at the same time; CPU of each over ``windows`` consecutive windows of ``window_s``."""
    res: dict[str, dict] = {}
    t0 = {}
    for name, command in APPS.items():
        t0[name] = time.perf_counter()
        res[name] = {"pid": tmux.launch(session, name, command), "cpu": []}
    try:
        for name in APPS:
            wait_for(tmux, f"{session}:{name}", [DEVICES[name], holder], t0[name], optional_s=15)
        time.sleep(2.0)  # both past their first frames
        prev = {name: (proc_cpu_seconds(r["pid"]), proc_cpu_ns(r["pid"])) for name, r in res.items()}
        w0 = time.perf_counter()
        for _ in range(windows):
            time.sleep(window_s)
            for name, r in res.items():
                now = (proc_cpu_seconds(r["pid"]), proc_cpu_ns(r["pid"]))
                if now[0] is None or prev[name][0] is None:
                    raise RuntimeError(f"{name} exited during the CPU windows")
                (ticks, ns), (ticks0, ns0) = now, prev[name]
                # The scheduler's nanoseconds where the same threads lived through the window; else the
                # process's clock ticks, which keep the time of threads that exited.
                exact = ns is not None and ns0 is not None and ns[1] == ns0[1]
                r["cpu"].append((ns[0] - ns0[0]) / 1e9 if exact else ticks - ticks0)
                r.setdefault("exact", []).append(exact)
                prev[name] = now
        wall = time.perf_counter() - w0
        for name, r in res.items():
            r["wall"] = wall
            r["rss_kb"] = proc_peak_rss_kb(r["pid"])
            r["threads"] = len(os.listdir(f"/proc/{r['pid']}/task"))
    finally:
        for name in APPS:
            tmux.close(f"{session}:{name}")
    return res


def measure(setup, sizes=SIZES, windows: int = 8, window_s: float = 10.0, startup_runs: int = 3) -> list[dict]:
    """Every terminal size at one setup (holders, host processes)."""
    holder = re.compile(r"\b(" + "|".join(str(p) for _, p in setup.forest.holders()) + r")\b")
    out = []
    with Tmux(setup.field.env("nvml")) as tmux:
        for cols, rows in sizes:
            session = tmux.session(cols, rows)
            st = startup(tmux, session, holder, startup_runs)
            cpu = cpu_windows(tmux, session, holder, windows, window_s)
            g, n = cpu["gputop"], cpu["nvitop"]
            out.append({
                "holders": setup.holders, "host": host_process_count(), "size": f"{cols}x{rows}",
                "startup": st, "cpu": cpu, "window_s": window_s,
                # A window where nvitop used no CPU cannot be a ratio; it is left out (and counted).
                "ratio": Ratio([a / b for a, b in zip(g["cpu"], n["cpu"]) if b > 0]),
                "first_ratio": Ratio([a / b for a, b in zip(st["gputop"]["devices"], st["nvitop"]["devices"])]),
            })
    return out


def preflight() -> str | None:
    """Why the TUI benchmarks cannot run here, or None."""
    if fake_nvml_dir() is None:
        return fake_nvml_error()
    if shutil.which("tmux") is None:
        return "tmux is not installed (apt-get install tmux)"
    missing = missing_tools("nvitop", "gputop")
    if missing:
        return f"{', '.join(missing)} not installed: {BENCH_EXTRA_HINT}"
    return None


def run(quick: bool = False, holder_counts=HOLDER_COUNTS, host_counts=HOST_COUNTS, sizes=SIZES) -> str:
    why = preflight()
    if why:
        return print_table("3/5. TUI benchmarks", ["skipped"], [[why]])
    from benchmarks.common import setups

    results = []
    for setup in setups(holder_counts, host_counts):
        results.extend(measure(setup, sizes, *((3, 5.0, 2) if quick else (8, 10.0, 3))))
    return report(results)


def _times(xs: list[float]) -> str:
    """An app's median time to its first frame, with the range of its own launches."""
    return f"{median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f})" if xs else "n/a"


def _first(xs: list[float | None]) -> str:
    seen = [x for x in xs if x is not None]
    return f"{median(seen):.2f} s" if len(seen) == len(xs) else "not on screen" if not seen else \
        f"{median(seen):.2f} s ({len(seen)} of {len(xs)})"


def _pct(cpu: list[float], wall: float) -> str:
    return f"{100 * sum(cpu) / wall:.1f}%"


def _exact(results: list[dict]) -> str:
    flags = [x for r in results for app in r["cpu"].values() for x in app.get("exact", [])]
    return f"{sum(flags)} of {len(flags)} app-windows"


def _with_range(ratio: Ratio) -> str:
    """The ratio and its spread, and where the spread is the middle half (8 windows or more), every window's
    ratio from the lowest to the highest too."""
    if len(ratio.values) < 8:
        return ratio.cell()
    return f"{ratio.cell()}; all {min(ratio.values):.2f}-{max(ratio.values):.2f}"


def report(results: list[dict]) -> str:
    if not results:
        return ""
    rows = []
    for r in results:
        g, n = r["cpu"]["gputop"], r["cpu"]["nvitop"]
        rss = g["rss_kb"] / n["rss_kb"] if g["rss_kb"] and n["rss_kb"] else float("nan")
        rows.append([
            f"{r['holders']:,}", f"{r['host']:,}", r["size"], _pct(g["cpu"], g["wall"]), _pct(n["cpu"], n["wall"]),
            _with_range(r["ratio"]), r["ratio"].verdict(CPU_BUDGET),
            f"{g['rss_kb'] / 1024:.0f} / {n['rss_kb'] / 1024:.0f} MiB", f"{rss:.2f}x", verdict(rss <= RSS_BUDGET),
        ])
    win = results[0]
    texts = [print_table(
        f"3. TUI CPU at a 1 s refresh, both running at the same moment (goal: gputop <= {CPU_BUDGET}x nvitop; "
        f"peak RSS <= {RSS_BUDGET}x)",
        ["holders", "host procs", "terminal", "gputop CPU", "nvitop CPU", "CPU ratio (spread)", "result",
         "peak RSS g / n", "RSS ratio", "RSS result"], rows,
        [f"CPU: % of one core over {len(win['cpu']['gputop']['cpu'])} consecutive windows of "
         f"{win['window_s']:g} s after both showed their devices (and holders, where they fit); ratio = median of per-window ratios, spread min-max "
         "below 8 windows, the 25th-75th percentile from 8 (then 'all' gives the lowest and highest window). PASS: the whole spread within the goal; MISS: all of it over; "
         "'not shown': the spread crosses the goal. CPU time: the scheduler's nanoseconds of each app's "
         "threads (/proc/PID/task/*/schedstat) for every window in which no thread started or ended "
         f"({_exact(results)}), else /proc/PID/stat's clock ticks. Peak RSS: VmHWM at the end. Commands: "
         + "; ".join(f"`{c.replace(str(VENV_BIN) + '/', '')}`" for c in APPS.values()),
         "8 fake GPUs (libnvidia-ml.so.1 from tests/fakenvml); each app in its own tmux window of the size shown."])]
    rows = []
    for r in results:
        st = r["startup"]
        rows.append([
            f"{r['holders']:,}", f"{r['host']:,}", r["size"],
            _times(st["gputop"]["devices"]), _times(st["nvitop"]["devices"]),
            r["first_ratio"].cell(), r["first_ratio"].verdict(1.0),
            _first(st["gputop"]["holders"]), _first(st["nvitop"]["holders"]),
        ])
    texts.append(print_table(
        "5. Start-up to the first frame that shows the devices (goal: no slower than nvitop)",
        ["holders", "host procs", "terminal", "gputop: devices", "nvitop: devices", "ratio (spread)", "result",
         "gputop: holders", "nvitop: holders"], rows,
        [f"{len(results[0]['startup']['gputop']['devices'])} launches each, alternating gputop and nvitop; from "
         "`tmux new-window` to the GPU name ('devices') and to a holder's PID ('holders') in capture-pane, "
         "polled every 10 ms. Each app's median (min-max of its own launches); the ratio is the median of "
         "per-pair ratios, spread min-max below 8 pairs, the 25th-75th percentile from 8. 'not on "
         "screen': the app shows no process list at this terminal size (nvitop on 40 rows, 8 GPUs)."]))
    return "\n".join(texts)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_sizes(text: str) -> tuple[tuple[int, int], ...]:
    return tuple((int(w), int(h)) for w, h in (x.split("x") for x in text.split(",") if x.strip()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tui")
    ap.add_argument("--quick", action="store_true", help="3 windows of 5 s, 2 start-ups each")
    ap.add_argument("--holder-counts", default=",".join(map(str, HOLDER_COUNTS)))
    ap.add_argument("--hosts", default=",".join(map(str, HOST_COUNTS)))
    ap.add_argument("--sizes", default=",".join(f"{w}x{h}" for w, h in SIZES))
    args = ap.parse_args(argv)
    from benchmarks.common import exit_cleanly_on_sigterm

    exit_cleanly_on_sigterm()
    run(args.quick, _ints(args.holder_counts), _ints(args.hosts), parse_sizes(args.sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
