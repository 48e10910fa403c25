"""The device-file scan (gputop.core.devholders) against ``fuser -v`` over the same device nodes (issue 28).

    python -m benchmarks.devscan                      # 10,000 host processes, 9 rounds
    python -m benchmarks.devscan --hosts 2000 --rounds 5

Eight char nodes 195:N are made with mknod in a temporary directory and each is held (O_PATH) by one
real process; the host is topped up with real sleepers (3 descriptors each) to ``--hosts`` processes.
Each round runs, one after the other: ``fuser -v NODES`` (its CPU time, user + system, from wait4);
gputop's scan as the sampler runs it every refresh (warm: a process is read again only when new or its
descriptor count changed); and a cold scan (a new scanner: every process read). Each reports the holders
it found, and both must find the same eight. Ratios are gputop's CPU time over fuser's, per round, with
their median and spread (goal: at most 0.5x). Needs root (mknod); exits 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import PY, Ratio, Sleepers, host_process_count, ms, print_table, run_measured

GOAL = 0.5
HOLD = "import os,sys,time; fd=os.open(sys.argv[1], os.O_PATH); print(1, flush=True); time.sleep(1800)"


def _nodes(tmp: str, n: int) -> list[str]:
    out = []
    for i in range(n):
        path = os.path.join(tmp, f"nvidia{240 + i}")
        os.mknod(path, 0o600 | 0o020000, os.makedev(195, 240 + i))
        out.append(path)
    return out


def _fuser(nodes: list[str]) -> tuple[float, float, set[int]]:
    """fuser -v over the nodes: (CPU seconds, wall seconds, the PIDs it names)."""
    r = run_measured(["fuser", "-v", *nodes])  # -v: its table goes to stderr; the PIDs are read below
    named = subprocess.run(["fuser", *nodes], capture_output=True, text=True)  # not timed
    return r.cpu, r.wall, {int(tok) for tok in named.stdout.split() if tok.isdigit()}


def _scan(scan, rdevs) -> tuple[float, float, set[int]]:
    c0, t0 = time.process_time(), time.perf_counter()
    found = scan.scan(rdevs)
    return time.process_time() - c0, time.perf_counter() - t0, set(found)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.devscan")
    ap.add_argument("--hosts", type=int, default=10_000, help="host processes to top up to (default 10,000)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", help="also append the table to FILE")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("benchmarks.devscan: needs root (mknod of char device nodes)", file=sys.stderr)
        return 2
    import shutil

    if shutil.which("fuser") is None:
        print("benchmarks.devscan: fuser is not installed (Debian package psmisc)", file=sys.stderr)
        return 2
    from gputop.core.devholders import DeviceScan

    tmp = tempfile.mkdtemp(prefix="gputop-devscan-")
    nodes = _nodes(tmp, 8)
    rdevs = frozenset(os.stat(p).st_rdev for p in nodes)
    holders = [subprocess.Popen([PY, "-c", HOLD, p], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
               for p in nodes]
    for h in holders:
        h.stdout.readline()
    want = {h.pid for h in holders}
    try:
        with Sleepers(a.hosts - host_process_count()):
            n = host_process_count()
            warm = DeviceScan(full_every=3600)
            warm.scan(rdevs)  # the sampler's first refresh
            fuser_cpu, warm_cpu, cold_cpu, walls = [], [], [], {"fuser": [], "warm": [], "cold": []}
            for _ in range(a.rounds):
                fc, fw, fp = _fuser(nodes)
                wc, ww, wp = _scan(warm, rdevs)
                cc, cw, cp = _scan(DeviceScan(), rdevs)
                if not (want <= wp and want <= cp and want <= fp):
                    print(f"benchmarks.devscan: holders missed: fuser {sorted(want - fp)}, warm "
                          f"{sorted(want - wp)}, cold {sorted(want - cp)}", file=sys.stderr)
                    return 1
                fuser_cpu.append(fc), warm_cpu.append(wc), cold_cpu.append(cc)
                walls["fuser"].append(fw), walls["warm"].append(ww), walls["cold"].append(cw)
            rows = []
            for name, cpu in (("warm (every refresh)", warm_cpu), ("cold (first refresh)", cold_cpu)):
                r = Ratio([g / f for g, f in zip(cpu, fuser_cpu) if f > 0])
                key = "warm" if name.startswith("warm") else "cold"
                rows.append([name, f"{n:,}", ms(sorted(cpu)[len(cpu) // 2]), ms(sorted(fuser_cpu)[len(cpu) // 2]),
                             ms(sorted(walls[key])[len(cpu) // 2]), ms(sorted(walls["fuser"])[len(cpu) // 2]),
                             r.cell(), r.verdict(GOAL)])
            text = print_table(
                f"Device-file scan vs fuser -v, 8 nodes, {n:,} host processes, {a.rounds} rounds",
                ["gputop scan", "host procs", "gputop CPU", "fuser CPU", "gputop wall", "fuser wall",
                 "ratio (CPU, median and spread)", f"goal <= {GOAL}x"], rows,
                ["CPU is user + system time: gputop's in-process (time.process_time around one scan), fuser's "
                 "from wait4 (its whole run). Both found the same 8 holders every round."])
            if a.out:
                with open(a.out, "a") as f:
                    f.write("\n" + text)
    finally:
        for h in holders:
            h.kill()
            h.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
