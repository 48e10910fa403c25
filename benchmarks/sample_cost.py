"""Benchmark 1: the in-process cost of one refresh (devices, holders, chains, verdicts) as the host grows.

The floor is reading /proc/<pid>/stat (os.open + os.read + os.close, no parsing) for exactly the processes
gputop needs: the holders, their ancestors up to init, and their session leaders. That set is computed
here from /proc, independently of gputop. Floor and sample are timed in alternating rounds in the same
process, so the ratio is taken under the same load.

Budget: sample <= 3x floor, and the sample must not grow with the number of host processes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks.common import (
    PY, ROOT, HolderForest, Sleepers, host_process_count, median, ms, print_table, verdict,
)
from benchmarks.fake_gpus import fake_nvml_dir, fake_nvml_error, make_field

HOST_COUNTS = (200, 2000, 5000)
BUDGET = 3.0


def _stat_fields(pid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read()
    except OSError:
        return None
    f_ = s[s.rindex(b")") + 2:].split()
    return int(f_[1]), int(f_[3])  # ppid, sid


def needed_pids(holders: list[int]) -> list[int]:
    """Holders + every ancestor up to init + the holders' session leaders (whether alive or not)."""
    need: set[int] = set()
    for pid in holders:
        cur = pid
        first = _stat_fields(pid)
        if first is not None and first[1] > 0:
            need.add(first[1])
        while cur > 0 and cur not in need:
            need.add(cur)
            f = _stat_fields(cur)
            if f is None:
                break
            cur = f[0]
        need.add(cur) if cur > 0 else None
    return sorted(need)


def floor_read(pids: list[int]) -> None:
    for pid in pids:
        try:
            fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        except OSError:
            continue
        try:
            os.read(fd, 4096)
        finally:
            os.close(fd)


def worker(rounds: int, holders: list[int], backend: str) -> dict:
    from gputop.config import load_config
    from gputop.procs import ProcTable
    from gputop.snapshot import Sampler

    sampler = Sampler.open(backend, None, load_config())
    snap = None
    for _ in range(3):  # warm up: imports, caches, the backend's first reads
        snap = sampler.sample()
    need = needed_pids(holders)
    for _ in range(3):
        floor_read(need)
    floors, samples, cpu = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        floor_read(need)
        t1 = time.perf_counter()
        c0 = time.process_time()
        snap = sampler.sample()
        t2 = time.perf_counter()
        cpu.append(time.process_time() - c0)
        floors.append(t1 - t0)
        samples.append(t2 - t1)
    scans = []
    for _ in range(max(3, rounds // 10)):
        t0 = time.perf_counter()
        ProcTable().scan_all()
        scans.append(time.perf_counter() - t0)
    sampler.close()
    kinds: dict[str, int] = {}
    for h in snap.holders:
        kinds[h.verdict.kind] = kinds.get(h.verdict.kind, 0) + 1
    return {
        "backend": backend, "host": host_process_count(), "needed": len(need), "holders": len(snap.holders),
        "gpus": len(snap.devices), "verdicts": kinds, "roots": len(snap.roots),
        "floor": median(floors), "sample": median(samples), "sample_cpu": median(cpu),
        "ratio": median([s / f for s, f in zip(samples, floors)]), "scan_all": median(scans),
    }


def run(rounds: int = 60, host_counts=HOST_COUNTS, backends=("nvml", "simulated")) -> str:
    rows, notes, results = [], [], []
    nvml_ok = fake_nvml_dir() is not None
    if "nvml" in backends and not nvml_ok:
        notes.append(f"nvml rows skipped: {fake_nvml_error()}")
        backends = tuple(b for b in backends if b != "nvml")
    with HolderForest(gpus=8, per_gpu=16) as forest:
        field = make_field(8, forest.holders())
        holder_pids = [p for _, p in forest.holders()]
        for target in host_counts:
            with Sleepers(target - host_process_count()):
                for backend in backends:
                    out = subprocess.run(
                        [PY, "-m", "benchmarks.sample_cost", "--worker", "--backend", backend,
                         "--rounds", str(rounds), "--holders", ",".join(map(str, holder_pids))],
                        cwd=ROOT, env=field.env(backend), capture_output=True, text=True, timeout=600)
                    if out.returncode != 0:
                        raise RuntimeError(f"sample_cost worker ({backend}) failed: {out.stderr[-1500:]}")
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    r["target"] = target
                    results.append(r)
    by_backend: dict[str, list[dict]] = {}
    for r in results:
        by_backend.setdefault(r["backend"], []).append(r)
        v = r["verdicts"]
        rows.append([
            f"{r['host']:,}", r["backend"], f"{r['holders']} on {r['gpus']} GPUs",
            f"{r['needed']}", ms(r["floor"]), ms(r["sample"]), f"{r['ratio']:.2f}x",
            verdict(r["ratio"] <= BUDGET), ms(r["scan_all"]),
            f"{v.get('orphan', 0)} orphan / {v.get('not-orphan', 0)} not",
        ])
    for backend, rs in by_backend.items():
        if len(rs) >= 2:
            growth = rs[-1]["sample"] / rs[0]["sample"]
            scan_growth = rs[-1]["scan_all"] / rs[0]["scan_all"]
            notes.append(f"{backend}: sample at {rs[-1]['host']:,} / at {rs[0]['host']:,} host processes = "
                         f"{growth:.2f}x (whole-table scan, for contrast: {scan_growth:.1f}x)")
    notes.append(f"Medians of {rounds} alternating floor/sample rounds per row; ratio = median of per-round "
                 "sample/floor. 'needed' = holders + ancestors to init + session leaders.")
    return print_table(
        "1. In-process sample cost vs the /proc floor (budget: <= 3x floor, flat in host processes)",
        ["host procs", "backend", "holders", "needed", "floor", "sample", "ratio", "budget",
         "scan_all (reap path)", "verdicts"], rows, notes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sample_cost")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="simulated")
    ap.add_argument("--holders", default="")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--hosts", default=",".join(map(str, HOST_COUNTS)))
    args = ap.parse_args(argv)
    if args.worker:
        holders = [int(x) for x in args.holders.split(",") if x]
        print(json.dumps(worker(args.rounds, holders, args.backend)))
        return 0
    run(args.rounds, tuple(int(x) for x in args.hosts.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
