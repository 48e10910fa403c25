"""Issue 31's fleet goals, against a real Prometheus holding 1,000 nodes x 8 GPUs (a TSDB backfilled with
``promtool tsdb create-blocks-from openmetrics``; every 10th node DCGM-only):

- ``gputop fleet --json`` end to end (a fresh process) <= 1 s;
- at most 5 queries per refresh (the JSON says how many it sent);
- the TUI's first frame (tmux, from launch to the first node row written to the terminal) <= 1.5 s;
- the TUI's CPU at a 2 s refresh <= 5% of a core (schedstat of the app over a window).

``python -m benchmarks.fleet [--rounds N] [--window S] [--nodes N] [--rules] [--gputop PATH ...]``; prints medians
with spreads."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Ratio, proc_cpu_ns, proc_cpu_seconds, run_measured

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.functional import fleet_helpers as fh  # noqa: E402

GPUTOP = str(Path(sys.executable).parent / "gputop")
# what the measured processes get: no PYTHONDONTWRITEBYTECODE (this environment sets it), so that each build,
# byte-compiled first (_compile), starts from its .pyc files as an installed gputop does
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _compile(gputop: str) -> None:
    """Byte-compile the gputop package that the ``gputop`` script at this path runs (its interpreter is
    on the script's first line)."""
    with open(gputop, encoding="utf-8", errors="replace") as f:
        first = f.readline()
    py = first[2:].split()[0] if first.startswith("#!") else sys.executable
    subprocess.run([py, "-c", "import compileall, os, gputop; "
                    "compileall.compile_dir(os.path.dirname(gputop.__file__), quiet=1)"], env=ENV, check=True)


def _spread(xs: list[float], fmt: str = "{:.3f}") -> str:
    r = Ratio(xs)
    lo, hi = r.spread
    return f"{fmt.format(r.median)} ({fmt.format(lo)}-{fmt.format(hi)})"


def _tmux(sock: Path, *args: str) -> str:
    return subprocess.run(["tmux", "-S", str(sock), *args], capture_output=True, text=True, timeout=10).stdout


def first_frame(url: str, d: Path, gputop: str = GPUTOP, rules: list[str] = ()) -> float:
    """Seconds from launch to the first node row written to the terminal. The pane's output is copied to a
    file (tmux pipe-pane) and read in this process: polling with capture-pane, a tmux client every 10 ms,
    took CPU from what it measured on a loaded 2-core machine."""
    tag = time.monotonic_ns()
    sock, out = d / f"t{tag}.sock", d / f"t{tag}.out"
    out.write_bytes(b"")
    env = {k: v for k, v in ENV.items() if not k.startswith("TMUX")}
    env["TERM"] = "xterm-256color"
    cmd = f"read go; exec {gputop} fleet --prometheus {url} --stale-after 1h --timeout 60 {' '.join(rules)}"
    subprocess.run(["tmux", "-S", str(sock), "-f", "/dev/null", "new-session", "-d", "-s", "b", "-x", "160",
                    "-y", "45", cmd], env=env, check=True)
    try:
        _tmux(sock, "pipe-pane", "-o", "-t", "b", f"cat >> {out}")
        with open(out, "rb") as f:
            t0 = time.perf_counter()
            _tmux(sock, "send-keys", "-t", "b", "Enter")
            seen = b""
            while time.perf_counter() - t0 < 30:
                seen = seen[-8:] + f.read()
                if b"gpu0" in seen:
                    return time.perf_counter() - t0
                time.sleep(0.005)
        raise TimeoutError("no first frame within 30 s")
    finally:
        _tmux(sock, "kill-server")
        out.unlink(missing_ok=True)


def tui_cpu(url: str, d: Path, window: float, gputop: str = GPUTOP, rules: list[str] = ()) -> float:
    sock = d / f"cpu{time.monotonic_ns()}.sock"
    env = {k: v for k, v in ENV.items() if not k.startswith("TMUX")}
    env["TERM"] = "xterm-256color"
    subprocess.run(["tmux", "-S", str(sock), "-f", "/dev/null", "new-session", "-d", "-s", "b", "-x", "160",
                    "-y", "45", f"exec {gputop} fleet --prometheus {url} --refresh 2 --stale-after 1h --timeout 60 "
                    f"{' '.join(rules)}"],
                   env=env, check=True)
    try:
        pid = int(_tmux(sock, "display", "-p", "-t", "b", "#{pane_pid}").strip())
        deadline = time.time() + 30
        while "gpu0" not in _tmux(sock, "capture-pane", "-p", "-t", "b"):
            assert time.time() < deadline, "no first frame"
            time.sleep(0.05)
        time.sleep(3)  # past start-up
        a, t0 = proc_cpu_ns(pid), time.monotonic()
        time.sleep(window)
        b, t1 = proc_cpu_ns(pid), time.monotonic()
        return (b[0] - a[0]) / 1e9 / (t1 - t0) * 100.0
    finally:
        _tmux(sock, "kill-server")


def client_cpu(url: str, rounds: int) -> list[float]:
    """CPU seconds (all threads of this process) of one refresh's client side: the three answers read,
    parsed and turned into rows (the server's time is not in it)."""
    from gputop.fleet.client import Prometheus
    from gputop.fleet.source import FleetSource

    source = FleetSource(Prometheus(url, timeout=60), rules="off")
    out = []
    try:
        source.refresh()
        for _ in range(rounds):
            c0 = time.process_time()
            frame = source.refresh()
            out.append(time.process_time() - c0)
            assert frame.error is None and len(frame.rows) > 0
    finally:
        source.close()
    return out


def _json_round(gputop: str, prom, rules: list[str]) -> dict:
    s0 = proc_cpu_seconds(prom.proc.pid)
    r = run_measured([gputop, "fleet", "--prometheus", prom.url, "--json", "--stale-after", "1h", "--timeout", "60"]
                     + rules, env=ENV)
    data = json.loads(r.stdout)
    assert data["error"] is None and len(data["nodes"]) > 0, data["error"]
    return {"wall": r.wall, "cpu": r.cpu, "server": proc_cpu_seconds(prom.proc.pid) - s0,
            "queries": data["queries"], "took": data["took_s"], "rows": len(data["nodes"]),
            "recorded": data["recorded"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--window", type=float, default=20.0, help="TUI CPU: seconds per window")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rules", action="store_true", help="load the shipped recording rules into the server")
    ap.add_argument("--gputop", action="append", metavar="PATH",
                    help="the gputop to measure (default: this one); given more than once, each round measures "
                         "every one in turn (before/after, interleaved)")
    args = ap.parse_args(argv)
    if not fh.PROMETHEUS or not shutil.which("tmux"):
        print("needs prometheus, promtool and tmux")
        return 6
    builds = args.gputop or [GPUTOP]
    for b in builds:
        _compile(b)
    d = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    t = time.perf_counter()
    info = fh.scale_openmetrics(d / "om.txt", nodes=args.nodes, gpus=8)
    gen = time.perf_counter() - t
    t = time.perf_counter()
    fh.backfill(d / "om.txt", d / "tsdb")
    fill = time.perf_counter() - t
    rules_file = ROOT / "packaging" / "prometheus" / "gputop-fleet-rules.yml" if args.rules else None
    # the backfilled samples end now: a 1 h lookback keeps them current for the whole run (5 min by default)
    prom = fh.Prometheus(d / "prom", tsdb=d / "tsdb", rules=rules_file, lookback="1h")
    rules = [] if args.rules else ["--rules", "off"]
    if args.rules:
        time.sleep(20)  # the rules' first evaluation (every 15 s)
    print(f"{args.nodes} nodes x 8 GPUs ({len(info['dcgm_only'])} DCGM-only, {len(info['orphans'])} with an "
          f"orphan): OpenMetrics {gen:.1f}s, backfill {fill:.1f}s; load {os.getloadavg()[0]:.2f}")
    try:
        _measure(args, builds, prom, rules, d)
    finally:
        prom.stop()
        shutil.rmtree(d, ignore_errors=True)
    return 0


def _measure(args, builds: list[str], prom, rules: list[str], d: Path) -> None:
    name = {b: (f"[{b}] " if len(builds) > 1 else "") for b in builds}
    for b in builds:
        _json_round(b, prom, rules)  # warm the server's caches
    runs = {b: [] for b in builds}
    for _ in range(args.rounds):
        for b in builds:
            runs[b].append(_json_round(b, prom, rules))
    for b in builds:
        col = lambda k: [x[k] for x in runs[b]]  # noqa: E731
        print(f"{name[b]}--json end to end: {_spread(col('wall'))} s (goal <= 1 s), {runs[b][-1]['rows']} rows, "
              f"recorded {runs[b][-1]['recorded']}; the queries alone {_spread(col('took'))} s; queries per "
              f"refresh: max {max(col('queries'))} (goal <= 5); CPU: the --json process {_spread(col('cpu'))} s, "
              f"the server {_spread(col('server'), '{:.2f}')} s (clock ticks) per run")
    cc = client_cpu(prom.url, args.rounds)
    print(f"client CPU per refresh (in-process, this checkout, --rules off): {_spread(cc)} s = "
          f"{Ratio(cc).median / 2 * 100:.1f}% of a core at a 2 s refresh, before drawing")
    ff = {b: [] for b in builds}
    for _ in range(args.rounds):
        for b in builds:
            ff[b].append(first_frame(prom.url, d, b, rules))
    for b in builds:
        print(f"{name[b]}TUI first frame: {_spread(ff[b])} s (goal <= 1.5 s); load {os.getloadavg()[0]:.2f}")
    cpu = {b: [] for b in builds}
    for _ in range(args.windows):
        for b in builds:
            cpu[b].append(tui_cpu(prom.url, d, args.window, b, rules))
    for b in builds:
        print(f"{name[b]}TUI CPU at a 2 s refresh: {_spread(cpu[b], '{:.2f}')} % of a core (goal <= 5%), "
              f"{args.windows} windows of {args.window:g}s; load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
