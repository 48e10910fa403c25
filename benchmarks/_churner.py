"""GPU holders that come and go, for the churn benchmark (benchmarks/churn.py).

``python benchmarks/_churner.py OUT N REPLACE EVERY WATCH_PID`` starts N ``sleep`` processes; every EVERY
seconds it kills the REPLACE oldest (and reaps them) and starts as many new ones. After each change it
writes the live PIDs (oldest first) as JSON to OUT, atomically. It stops, killing every sleeper, when
WATCH_PID (the benchmark) is gone or on SIGTERM. Started detached (see churn.py), so that the holders'
ancestor chains are this process and init, not the benchmark's shell.
"""

import json
import os
import signal
import sys
import time

out, n, replace, every, watch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
MAX_LIFE = "1800"
live: list[int] = []
stop = False


def _stop(signum, frame):
    global stop
    stop = True


def spawn(k: int) -> None:
    for _ in range(k):
        live.append(os.posix_spawn("/bin/sleep", ["sleep", MAX_LIFE], os.environ))


def kill(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    for p in pids:
        try:
            os.waitpid(p, 0)
        except OSError:
            pass


def publish(generation: int) -> None:
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"generation": generation, "pids": live, "churner": os.getpid()}, f)
    os.replace(tmp, out)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


signal.signal(signal.SIGTERM, _stop)
signal.signal(signal.SIGHUP, _stop)
spawn(n)
generation = 0
publish(generation)
next_at = time.monotonic() + every
try:
    while not stop and alive(watch):
        time.sleep(max(0.0, min(0.2, next_at - time.monotonic())))
        if time.monotonic() < next_at:
            continue
        next_at += every
        old, live[:] = live[:replace], live[replace:]
        kill(old)
        spawn(replace)
        generation += 1
        publish(generation)
finally:
    kill(live)
