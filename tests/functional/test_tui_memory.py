"""Peak RSS of the TUI (issue 13): the TUI process leaves out modules it never uses (``ssl``, which asyncio
would load only to offer TLS: libcrypto and libssl, ~4.5 MiB resident), and its threads share glibc's main
malloc arena (~1 MiB at 1,024 holders); nothing else in the process or in other processes is affected."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys

from tests.conftest import ROOT
from tests.functional.test_tui_signals import read_until


def _mapped(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def test_the_running_tui_leaves_out_ssl_and_thread_arenas(scenario):
    path = scenario(holders=[{"pid": os.getpid(), "gpu": 0, "memory": "1GiB"}], gpus=1)
    master, slave = pty.openpty()
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="100", LINES="30")
    p = subprocess.Popen([sys.executable, "-m", "gputop", "--scenario", str(path), "--backend", "simulated"],
                         stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, start_new_session=True)
    os.close(slave)
    try:
        screen = read_until(master, b"Quit", 90)  # the app's footer: Textual and asyncio are running
        assert b"Quit" in screen, screen[-500:]
        screen += read_until(master, str(os.getpid()).encode(), 30)  # the first full sample is shown
        maps = _mapped(p.pid)
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        os.close(master)
    assert "_asyncio" in maps  # asyncio is loaded, so the next line means something
    assert "_ssl" not in maps and "libssl" not in maps and "libcrypto" not in maps
    assert thread_arenas(maps) == 0  # its threads share the main malloc arena (one_malloc_arena)


BLOCK_CHECK = """
import sys
from gputop.tui.launch import unused_modules_left_out
with unused_modules_left_out() as blocked:
    assert blocked == ["ssl"], blocked
    import asyncio
    assert asyncio.sslproto.ssl is None
    try:
        import ssl
    except ImportError:
        pass
    else:
        raise SystemExit("ssl was imported")
    asyncio.run(asyncio.sleep(0))  # the event loop works without it
import ssl  # afterwards (code that runs after the TUI, in the same process): as usual
assert ssl.create_default_context() is not None
with unused_modules_left_out() as blocked:  # asyncio already imported: nothing to gain, nothing blocked
    assert blocked == [], blocked
print("ok")
"""


def test_the_block_is_scoped_and_undone():
    r = subprocess.run([sys.executable, "-c", BLOCK_CHECK], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr



HEAP = 1 << 26  # a glibc thread arena's heap: 64 MiB of address space, aligned to its size


def thread_arenas(maps: str) -> int:
    """glibc thread arenas in /proc/PID/maps: an anonymous read-write mapping at a 64 MiB boundary,
    followed by the unused rest of its 64 MiB reserved without access."""
    rows = []
    for line in maps.splitlines():
        parts = line.split()
        if not parts:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        rows.append((lo, hi, parts[1], len(parts) > 5))
    return sum(1 for (lo, hi, perms, named), (lo2, hi2, perms2, named2) in zip(rows, rows[1:])
               if lo % HEAP == 0 and perms == "rw-p" and not named and perms2 == "---p" and not named2
               and hi == lo2 and hi2 == lo + HEAP)


ARENAS = """
import sys, threading
from gputop.tui.launch import one_malloc_arena
if sys.argv[1] == "one":
    assert one_malloc_arena()
def work():
    keep = [bytes(4096 + i) for i in range(200)]  # over 512 bytes: from malloc, in this thread
    done.wait()
done = threading.Event()
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
import time; time.sleep(0.5)
print(open("/proc/self/maps").read())
done.set()
"""


def test_threads_share_one_malloc_arena():
    """With one_malloc_arena() (called by run_tui before any thread starts) four allocating threads make
    no arenas of their own; without it (the control) they do, so the check can tell."""
    def arenas(mode: str) -> int:
        r = subprocess.run([sys.executable, "-c", ARENAS, mode], capture_output=True, text=True, cwd=ROOT,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        return thread_arenas(r.stdout)

    assert arenas("default") >= 1
    assert arenas("one") == 0


def test_the_tree_keeps_a_bounded_number_of_drawn_lines():
    """Each refresh that advances the holders' TIME gives their lines new cache keys; the stale strips are
    dropped beyond the tree's height (or LINE_CACHE_ROWS), not kept up to Textual's 1,024."""
    from gputop.tui.process_tree import LINE_CACHE_ROWS, ProcessTree
    from tests.tui.helpers import frozen_app, row_line, run_async, switch_snapshot, wait_until
    from tests.tui.test_time_only_rows import N, snapshot

    @run_async
    async def check():
        async with frozen_app(snapshot()) as (app, pilot, sampler):
            tree = app.query_one(ProcessTree)
            assert await wait_until(pilot, lambda: row_line(app, 20000) is not None)
            for shift in range(1, 12):
                await switch_snapshot(pilot, app, sampler, snapshot(shift))
            assert row_line(app, 20000) is not None
            bound = max(LINE_CACHE_ROWS, tree.size.height)
            assert bound < 11 * N  # else the refreshes below could not exceed it
            assert len(tree.lines.cache) <= bound

    check()
