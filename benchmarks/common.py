"""Shared benchmark helpers: real host processes, GPU holder trees, timing, per-process CPU accounting.

Everything here is real: sleepers are real processes, holder trees are real process trees (some of them
real orphans made with ``setsid sh -c '... & exit'``), CPU time is read from /proc or wait4().
Only the GPU vendor library is fake (tests/fakenvml, or the simulated backend's scenario file).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Every process a benchmark starts sleeps at most this long, so that nothing outlives a crashed run by much.
MAX_LIFE_S = 1800


def _default_sighup() -> None:
    # A benchmark started under nohup would hand "SIGHUP ignored" to every child, and gputop would then
    # (correctly) call the holder trees "detached with nohup".
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def exit_cleanly_on_sigterm() -> None:
    """SIGTERM (and SIGHUP) unwind like Ctrl+C, so that the context managers stop what they started."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)


def host_process_count() -> int:
    return sum(1 for d in os.listdir("/proc") if d.isdigit())


# ---- sleepers: the rest of the host ------------------------------------------------------------

_SPAWNER = r"""
import os, signal, sys
n, secs = int(sys.argv[1]), sys.argv[2]
pids = [os.posix_spawn("/bin/sleep", ["sleep", secs], os.environ) for _ in range(n)]
sys.stdout.write("ready %d\n" % len(pids)); sys.stdout.flush()
sys.stdin.read()  # until the benchmark closes our stdin, or dies
for p in pids:
    try: os.kill(p, signal.SIGKILL)
    except OSError: pass
for p in pids:
    try: os.waitpid(p, 0)
    except OSError: pass
"""


class Sleepers:
    """``n`` real ``sleep`` processes under one spawner; gone when the context exits or the benchmark dies.

    The spawner waits on its stdin: when the benchmark closes it (or exits for any reason), the spawner
    kills and reaps every sleeper.
    """

    def __init__(self, n: int):
        self.n = max(0, n)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Sleepers":
        if self.n:
            self.proc = subprocess.Popen(
                [PY, "-c", _SPAWNER, str(self.n), str(MAX_LIFE_S)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_default_sighup)
            line = self.proc.stdout.readline()
            if not line.startswith("ready"):
                raise RuntimeError(f"sleeper spawner failed: {line!r}")
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc = None


def top_up_host(target: int, reserve: int = 0) -> Sleepers:
    """Sleepers that bring the host to about ``target`` processes (``reserve``: ones still to come)."""
    return Sleepers(target - host_process_count() - reserve)


# ---- GPU holder trees ------------------------------------------------------------------------------

# The job script lives in a file, so that its command line is as short as a real job's.
_TREE = str(Path(__file__).with_name("_tree.py"))


@dataclass
class Tree:
    gpu: int
    orphan: bool
    root: int
    mid: int
    workers: list[int]
    sid: int
    pgid: int


@dataclass
class HolderForest:
    """``gpus`` trees of ``per_gpu`` GPU-holding workers each; every other tree is a real orphan.

    Non-orphan trees are started as ``sh -c 'setsid python tree & exit 0'`` (their root is a live session
    leader, reparented to init). Orphan trees are started as ``setsid sh -c 'python tree & exit 0'``: the
    session leader shell exits at once and the root is reparented to init.
    """

    gpus: int = 8
    per_gpu: int = 16
    trees: list[Tree] = field(default_factory=list)
    _dir: str | None = None

    @property
    def process_count(self) -> int:
        return self.gpus * (self.per_gpu + 2)

    def holders(self) -> list[tuple[int, int]]:
        """(gpu, pid) for every worker."""
        return [(t.gpu, p) for t in self.trees for p in t.workers]

    def __enter__(self) -> "HolderForest":
        self._dir = tempfile.mkdtemp(prefix="gputop-bench-forest-")
        starters = []
        for g in range(self.gpus):
            out = os.path.join(self._dir, f"tree{g}.json")
            orphan = g % 2 == 1
            tree_cmd = [PY, _TREE, out, str(self.per_gpu), str(MAX_LIFE_S)]
            if orphan:
                cmd = ["setsid", "sh", "-c", " ".join(_q(a) for a in tree_cmd) + " & exit 0"]
            else:
                # A detached job that leads its own session (as one started by tmux, screen or a
                # scheduler): not an orphan. It is reparented to init, so the benchmark's own ancestors
                # (whatever runs it) stay out of the holders' chains.
                cmd = ["sh", "-c", "setsid " + " ".join(_q(a) for a in tree_cmd) + " & exit 0"]
            starters.append((g, orphan, out, subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                preexec_fn=_default_sighup)))
        deadline = time.time() + 60
        for g, orphan, out, p in starters:
            while not os.path.exists(out):
                if time.time() > deadline:
                    self.__exit__()
                    raise RuntimeError("holder tree did not start")
                time.sleep(0.02)
            d = json.loads(Path(out).read_text())
            self.trees.append(Tree(g, orphan, d["root"], d["mid"], d["workers"], d["sid"], d["pgid"]))
            p.wait(10)  # the starting shell has exited: the tree hangs off init
        return self

    def __exit__(self, *exc) -> None:
        for t in self.trees:
            for pid in [t.root, t.mid, *t.workers]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        _reap_children()
        self.trees = []
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _q(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


# ---- GPU descriptions for the fake NVML library and the simulated backend --------------------------

def gpu_specs(n: int) -> list[dict]:
    return [{"name": "NVIDIA H200", "memory_total": 150754820096, "temperature": 40 + i, "power": 180.5,
             "power_limit": 700, "fan": 30, "clock_sm": 1980, "clock_mem": 3201, "utilization": 35,
             "memory_utilization": 12} for i in range(n)]


def write_scenario(path: Path, gpus: int, holders: list[tuple[int, int]]) -> Path:
    import yaml

    spec = {
        "gpus": [{"name": g["name"], "memory_total": g["memory_total"], "temperature": g["temperature"],
                  "power": g["power"], "power_limit": g["power_limit"], "fan": g["fan"],
                  "clock_sm": g["clock_sm"], "clock_mem": g["clock_mem"], "utilization": g["utilization"],
                  "memory_utilization": g["memory_utilization"]} for g in gpu_specs(gpus)],
        "holders": [{"pid": pid, "gpu": gpu, "memory": 1 << 30, "type": "C", "sm": 5} for gpu, pid in holders],
    }
    path.write_text(yaml.safe_dump(spec))
    return path


# ---- timing -----------------------------------------------------------------------------------------

def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


@dataclass
class ProcRun:
    wall: float  # seconds
    cpu: float  # user + system seconds, the process and the children it waited for
    maxrss_kb: int
    rc: int
    stdout: bytes


def run_measured(cmd: list[str], env: dict | None = None, timeout: float = 120) -> ProcRun:
    """Run ``cmd`` to completion; wall time, CPU (wait4 rusage) and peak RSS of the whole process."""
    out_f = tempfile.TemporaryFile()
    err_f = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out_f, stderr=err_f, env=env,
                         preexec_fn=_default_sighup)
    deadline = t0 + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            p.kill()
            os.wait4(p.pid, 0)
            raise TimeoutError(f"{cmd[0]} ran over {timeout}s")
        time.sleep(0.002)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    out_f.seek(0)
    err_f.seek(0)
    out = out_f.read()
    err = err_f.read()
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} exited {p.returncode}: {err.decode(errors='replace')[-800:]}")
    return ProcRun(wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss, p.returncode, out)


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a running process (and its reaped children), from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    # utime stime cutime cstime are fields 14-17 (1-based), i.e. 11-14 after the state field.
    return sum(int(x) for x in fields[11:15]) / CLK_TCK


def proc_cpu_ns(pid: int) -> tuple[int, frozenset[str]] | None:
    """CPU time of a running process's live threads in nanoseconds (the first field of each
    /proc/<pid>/task/<tid>/schedstat, the scheduler's own count), and their thread ids. Exact where
    /proc/<pid>/stat counts clock ticks (10 ms: a TUI at 0.5% of a core gets 5 of them in 10 s), but a
    thread that exits takes its time with it: compare the thread ids."""
    total, tids = 0, []
    try:
        names = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in names:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        tids.append(tid)
    return total, frozenset(tids)


def proc_peak_rss_kb(pid: int) -> int | None:
    """Peak resident set (VmHWM) of a running process, in KiB."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


# ---- output -------------------------------------------------------------------------------------------

def print_table(title: str, headers: list[str], rows: list[list[str]], notes: list[str] = ()) -> str:
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(str(c)))
    lines = [f"## {title}", ""]
    lines.append("| " + " | ".join(h.ljust(widths[i]) for i, h in enumerate(headers)) + " |")
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        lines.append("| " + " | ".join(str(c).ljust(widths[i]) for i, c in enumerate(r)) + " |")
    if notes:
        lines.append("")
        lines.extend(notes)
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    return text


def ms(x: float) -> str:
    return f"{x * 1000:.2f} ms" if x < 0.1 else f"{x * 1000:.0f} ms"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# ---- ratios under load: median, spread, and a verdict that admits doubt -------------------------------

@dataclass
class Ratio:
    """Per-round (or per-window) ratios of gputop to its reference, taken within one run."""

    values: list[float]

    @property
    def median(self) -> float:
        return median(self.values)

    @property
    def spread(self) -> tuple[float, float]:
        """The middle half (25th-75th percentile) of the ratios when there are 8 or more, else min-max."""
        xs = sorted(self.values)
        if not xs:
            return float("nan"), float("nan")
        if len(xs) < 8:
            return xs[0], xs[-1]
        q = statistics.quantiles(xs, n=4, method="inclusive")
        return q[0], q[2]

    def verdict(self, goal: float) -> str:
        """PASS when the whole spread is within ``goal``, MISS when the whole spread is over it, else
        "not shown": under this run's load the figures cannot tell."""
        lo, hi = self.spread
        if not self.values:
            return "not measured"
        if hi <= goal:
            return "PASS"
        if lo > goal:
            return "MISS"
        return "not shown"

    def cell(self) -> str:
        lo, hi = self.spread
        return f"{self.median:.2f}x ({lo:.2f}-{hi:.2f})"


def missing_tools(*names: str) -> list[str]:
    """Which of ``names`` are not installed next to this interpreter nor on $PATH."""
    venv_bin = Path(PY).parent
    return [n for n in names if not (venv_bin / n).exists() and shutil.which(n) is None]


BENCH_EXTRA_HINT = "install the bench extra: .venv/bin/pip install -e '.[bench]' (nvitop, py-spy)"


# ---- the sizes every benchmark runs at -----------------------------------------------------------------

HOLDER_COUNTS = (16, 128, 1024)  # on 8 GPUs
HOST_COUNTS = (200, 10000)  # host processes in all (the holder trees and whatever else runs included)
GPUS = 8


@dataclass
class Setup:
    """One size: ``holders`` GPU holders on 8 fake GPUs, the host topped up to about ``host_target``."""

    holders: int
    host_target: int
    forest: "HolderForest"
    field: object  # benchmarks.fake_gpus.Field

    @property
    def hosts(self) -> int:
        return host_process_count()

    @property
    def label(self) -> str:
        return f"{self.holders:,} holders, {host_process_count():,} host procs"


def compile_sources() -> None:
    """Byte-compile gputop as an installed package is (pip writes .pyc files at install; nvitop, measured
    alongside, is installed that way). Without it, a shell with PYTHONDONTWRITEBYTECODE=1 makes every
    gputop start compile its own sources: ~0.25 s of a 1 s ``status --json``."""
    import compileall

    compileall.compile_dir(str(ROOT / "gputop"), quiet=1)


def setups(holder_counts=HOLDER_COUNTS, host_counts=HOST_COUNTS):
    """Yield a Setup per (holders, host processes), building each forest once and topping up the host in
    ascending order. The host cannot be brought below what already runs: the real count is reported."""
    from benchmarks.fake_gpus import make_field

    compile_sources()
    for n in holder_counts:
        with HolderForest(gpus=GPUS, per_gpu=max(1, n // GPUS)) as forest:
            field = make_field(GPUS, forest.holders())
            for target in sorted(host_counts):
                with top_up_host(target):
                    yield Setup(len(forest.holders()), target, forest, field)
