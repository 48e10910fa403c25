"""Benchmark 4: reap latency for an orphan tree of 100 processes with a retry loop at its root.

The tree is a real orphan: ``setsid sh -c 'sh retry-loop & exit 0'``. The loop restarts the job whenever
it dies: root sh (the loop) -> python job -> forked python -> 97 ``sleep`` workers, one of which holds a
(fake) GPU. Two variants: "polite" (everything dies on SIGTERM) and "stubborn" (the whole tree ignores
SIGTERM, so only SIGKILL after the grace ends it).

gputop.actions.reap_tree runs in a worker process on the fake NVML library (or the simulated backend),
given an open sampler that has sampled once, as every face that reaps has one (the TUI, the guard, the
API, the watchdog; ``gputop reap --apply`` opens its own before it plans). A watcher thread there waits on
a pidfd per member, which turns readable when the process exits (``--watch proc`` reads every member's
/proc/PID/stat every 2 ms instead: those reads compete with the reap for the interpreter lock and delay
it, 0.85 s against 0.23 s to the first SIGTERM in one measured round). Budget: every process gone within
grace + 0.5 s.
The run also checks that the retry loop did not start a new job afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import (
    MAX_LIFE_S, PY, ROOT, Sleepers, _default_sighup, _q, host_process_count, median, print_table, verdict,
)
from benchmarks.fake_gpus import fake_nvml_dir, make_field

TREE_SCRIPT = str(Path(__file__).with_name("_tree.py"))
WORKERS = 97  # + loop shell + job + forked job = 100 processes
SLACK = 0.5


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read()
    except OSError:
        return False
    return s[s.rindex(b")") + 2:s.rindex(b")") + 3] not in (b"Z", b"X")


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        s = f.read()
    return int(s[s.rindex(b")") + 2:].split()[1])


def start_tree(stubborn: bool, workdir: Path) -> dict:
    out = workdir / "tree.json"
    trap = "trap '' TERM; " if stubborn else ""
    loop = (f"{trap}while :; do {_q(PY)} {_q(TREE_SCRIPT)} {_q(str(out))} {WORKERS} {MAX_LIFE_S}; "
            "sleep 0.2; done")
    starter = subprocess.Popen(["setsid", "sh", "-c", f"sh -c {_q(loop)} & exit 0"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               preexec_fn=_default_sighup)
    starter.wait(10)
    deadline = time.time() + 30
    while not out.exists():
        if time.time() > deadline:
            raise RuntimeError("the orphan tree did not start")
        time.sleep(0.01)
    d = json.loads(out.read_text())
    out.unlink()  # a restarted job would write it again
    d["loop"] = _ppid(d["root"])
    d["members"] = [d["loop"], d["root"], d["mid"], *d["workers"]]
    d["out"] = str(out)
    return d


def kill_tree(tree: dict) -> None:
    import signal

    for pid in tree["members"]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _poll_proc(members: list[int], gone_at: dict[int, float], stop: threading.Event) -> None:
    """Read every live member's /proc/PID/stat every 2 ms (``--watch proc``; the default waits on pidfds)."""
    left = set(members)
    while left and not stop.is_set():
        now = time.perf_counter()
        for pid in list(left):
            if not _alive(pid):
                gone_at[pid] = now
                left.discard(pid)
        time.sleep(0.002)


def _poll_pidfd(members: list[int], gone_at: dict[int, float], stop: threading.Event) -> None:
    """Sleep in poll() on a pidfd per member, which turns readable when the process exits (the moment
    it turns zombie): no /proc reads, and the reaping thread keeps the interpreter lock meanwhile."""
    import select

    poller, fds = select.poll(), {}
    for pid in members:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            gone_at[pid] = time.perf_counter()
            continue
        fds[fd] = pid
        poller.register(fd, select.POLLIN)
    while fds and not stop.is_set():
        for fd, _ in poller.poll(100):
            gone_at[fds[fd]] = time.perf_counter()
            poller.unregister(fd)
            del fds[fd]
            os.close(fd)
    for fd in fds:
        os.close(fd)


def worker(tree_json: str, grace: float, profile: str | None = None, watch: str = "pidfd",
           sampler: str = "warm") -> dict:
    from gputop.actions import reap_tree
    from gputop.core.procs import read_proc
    from gputop.core.sampler import Sampler

    open_sampler = Sampler.open() if sampler == "warm" else None
    if open_sampler is not None:
        open_sampler.sample()

    tree = json.loads(tree_json)
    members = tree["members"]
    root = read_proc(tree["loop"])
    gone_at: dict[int, float] = {}
    stop = threading.Event()
    t = threading.Thread(target=_poll_pidfd if watch == "pidfd" else _poll_proc, args=(members, gone_at, stop),
                         daemon=True)
    sent = _record_signals()
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    t0 = time.perf_counter()
    t.start()
    if prof is not None:
        prof.enable()
    result = reap_tree(root.pid, expected_start=root.start_time, face="cli", grace=grace,
                       reason="benchmark", sampler=open_sampler)
    t1 = time.perf_counter()
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    t.join(grace + 10)
    stop.set()
    time.sleep(0.5)  # would the retry loop have started a new job?
    if open_sampler is not None:
        open_sampler.close()
    respawned = Path(tree["out"]).exists()
    return {
        "ok": result.ok, "outcome": result.outcome, "message": result.message,
        "returned": t1 - t0, "all_gone": (max(gone_at.values()) - t0) if len(gone_at) == len(members) else None,
        "gone": len(gone_at), "members": len(members), "respawned": respawned,
        "sigkill": result.details.get("sigkill"), "host": host_process_count(),
        "sigterm_at": next((at - t0 for name, at in sent if name == "SIGTERM"), None),
        "sigkill_at": next((at - t0 for name, at in sent if name == "SIGKILL"), None),
    }


def _record_signals() -> list[tuple[str, float]]:
    """(signal, perf_counter) of every signal event the executor records, in order: when the grace began
    (the first SIGTERM) and ended (the first SIGKILL)."""
    import gputop.actions.executor as ex

    sent: list[tuple[str, float]] = []
    orig = ex.sig_event

    def recording(sig, pids):
        sent.append((signal.Signals(sig).name, time.perf_counter()))
        return orig(sig, pids)

    ex.sig_event = recording
    return sent


def round_cost(rounds: int = 40) -> dict[str, float]:
    """Milliseconds per executor round spent reading /proc, at this host's process count: the table's scan
    with its lineage fields (now), and the same scan followed by a second stat scan (before; the tests'
    reference reader). Alternated."""
    from gputop.core.procs import ProcTable
    from tests.functional.actions_helpers import scan_stats

    now, before = [], []
    for i in range(rounds * 2):
        t0 = time.perf_counter()
        table = ProcTable()
        table.scan_all()
        stats = table.stat_fields() if i % 2 == 0 else scan_stats()
        dt = (time.perf_counter() - t0) * 1000
        (now if i % 2 == 0 else before).append(dt)
        assert stats
    return {"host": host_process_count(), "now_ms": median(now), "before_ms": median(before),
            "load": os.getloadavg()[0]}


def run(runs: int = 3, grace: float = 1.0, host: int = 2000, profile: str | None = None, watch: str = "pidfd",
        sampler: str = "warm") -> str:
    backend = "nvml" if fake_nvml_dir() is not None else "simulated"
    rows, notes, results = [], [], {}
    with Sleepers(host - host_process_count() - 100):
        for variant in ("polite", "stubborn"):
            results[variant] = []
            for i in range(runs):
                with tempfile.TemporaryDirectory(prefix="gputop-bench-reap-") as d:
                    tree = start_tree(variant == "stubborn", Path(d))
                    try:
                        field = make_field(1, [(0, tree["workers"][0])])
                        out = subprocess.run(
                            [PY, "-m", "benchmarks.reap_latency", "--worker", json.dumps(tree),
                             "--grace", str(grace), "--watch", watch, "--sampler", sampler,
                             *(["--profile", f"{profile}.{variant}{i}"] if profile else [])],
                            cwd=ROOT, env=field.env(backend), capture_output=True, text=True, timeout=120)
                        if out.returncode != 0:
                            raise RuntimeError(f"reap worker failed: {out.stderr[-1500:]}")
                        results[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
                    finally:
                        kill_tree(tree)
    for variant, rs in results.items():
        done = [r["all_gone"] for r in rs if r["all_gone"] is not None]
        worst = max(done) if len(done) == len(rs) else None
        ok = worst is not None and worst <= grace + SLACK and all(r["ok"] and not r["respawned"] for r in rs)
        rows.append([
            variant, f"{rs[0]['members']}", f"{grace:.1f} s",
            f"{median(done):.3f} s" if done else "-", f"{worst:.3f} s" if worst is not None else "not all gone",
            f"{median([r['returned'] for r in rs]):.3f} s", f"{grace + SLACK:.1f} s", verdict(ok),
            ", ".join(sorted({r['outcome'] + (' (SIGKILL)' if r['sigkill'] else '') for r in rs})),
            "yes" if any(r["respawned"] for r in rs) else "no",
        ])
    for variant, rs in results.items():
        term = [r["sigterm_at"] for r in rs if r.get("sigterm_at") is not None]
        kill = [r["sigkill_at"] for r in rs if r.get("sigkill_at") is not None]
        notes.append(f"{variant}: first SIGTERM at {median(term):.3f} s (median)"
                     + (f", first SIGKILL at {median(kill):.3f} s" if kill else "") + "; load average "
                     + f"{os.getloadavg()[0]:.2f}")
    how = ("each member's pidfd turning readable (its exit), waited for in poll()" if watch == "pidfd" else
           "the last of the 100 PIDs leaving /proc (or turning zombie), polled every 2 ms")
    notes.append(f"{runs} runs per variant, {rs[0]['host']:,} host processes, backend {backend}; 'all gone' is "
                 f"measured from the reap_tree() call to {how}; "
                 + ("reap_tree() is given an open sampler that has sampled once, as the TUI, guard, API and "
                    "watchdog have." if sampler == "warm" else "reap_tree() opens its own sampler."))
    return print_table(
        "4. Reap latency: orphan tree of 100 processes with a retry loop at the root (budget: grace + 0.5 s)",
        ["variant", "procs", "grace", "all gone (median)", "all gone (worst)", "reap_tree returned",
         "budget", "result", "outcome", "loop respawned"], rows, notes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.reap_latency")
    ap.add_argument("--worker", metavar="TREE_JSON", help=argparse.SUPPRESS)
    ap.add_argument("--grace", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--host", type=int, default=2000)
    ap.add_argument("--profile", metavar="FILE",
                    help="write a cProfile of each reap_tree() call to FILE.<variant><run>")
    ap.add_argument("--watch", choices=("proc", "pidfd"), default="pidfd",
                    help="how the worker sees members go: wait on pidfds (default; no reads competing with the "
                         "reap in the same interpreter), or read /proc every 2 ms")
    ap.add_argument("--sampler", choices=("warm", "none"), default="warm",
                    help="give reap_tree() an open sampler that has sampled once, as every face has (default), "
                         "or none, so that it opens its own inside the measured call")
    ap.add_argument("--round-cost", action="store_true",
                    help="print the /proc cost of one executor round, here and with --host sleepers")
    args = ap.parse_args(argv)
    from benchmarks.common import exit_cleanly_on_sigterm

    exit_cleanly_on_sigterm()
    if args.worker:
        print(json.dumps(worker(args.worker, args.grace, args.profile, args.watch, args.sampler)))
        return 0
    if args.round_cost:
        print(json.dumps(round_cost()))
        with Sleepers(args.host - host_process_count()):
            print(json.dumps(round_cost()))
        return 0
    run(args.runs, args.grace, args.host, args.profile, args.watch, args.sampler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
