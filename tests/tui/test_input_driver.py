"""gputop's terminal driver (gputop.tui.driver): its input thread sleeps until there is input, still turns
a lone Esc into a key once no more bytes follow, and stops at once when told to. Real threads, a real
pipe for the terminal's input; the wake-ups are the kernel's count of the thread's context switches."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from gputop.tui.driver import QuietInputDriver

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="counts wake-ups in /proc")


def switches(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/status") as f:
        d = dict(line.rstrip("\n").split(":\t", 1) for line in f if "ctxt_switches" in line)
    return int(d["voluntary_ctxt_switches"]) + int(d["nonvoluntary_ctxt_switches"])


def wait_until(cond, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture
def driver():
    """A driver whose terminal input is a pipe: (driver, the pipe's write end, the messages it sent)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTSTP, signal.SIGCONT)}

    async def make():  # a Driver is made on the app's running loop; the input thread never uses the app
        return QuietInputDriver(object())

    d = asyncio.run(make())
    for s, h in saved.items():  # LinuxDriver installs ctrl+z handlers for the app
        signal.signal(s, h)
    r, w = os.pipe()
    d.fileno = r
    got: list = []
    d.process_message = got.append
    yield d, w, got
    d.exit_event.set()
    d.close()
    os.close(r)
    os.close(w)


def start(d) -> tuple[threading.Thread, int]:
    tids: list[int] = []
    t = threading.Thread(target=lambda: (tids.append(threading.get_native_id()), d.run_input_thread()),
                         daemon=True)
    t.start()
    assert wait_until(lambda: tids)
    return t, tids[0]


def keys(got) -> list[str]:
    return [getattr(m, "key", None) for m in got]


def test_the_input_thread_sleeps_until_input_and_stops_at_once(driver):
    d, w, got = driver
    assert d.quiet  # the Textual this driver was written for (pinned)
    t, tid = start(d)
    time.sleep(0.3)
    before = switches(tid)
    time.sleep(1.5)
    assert switches(tid) - before <= 2  # Textual's own loop wakes ten times a second
    os.write(w, b"a")
    assert wait_until(lambda: "a" in keys(got)), got
    os.write(w, b"\x1b")  # a lone Esc: a key only once no more bytes follow (the parser's timeout)
    assert wait_until(lambda: "escape" in keys(got)), got
    t0 = time.monotonic()
    d.exit_event.set()
    t.join(2)
    assert not t.is_alive() and time.monotonic() - t0 < 1.0


def test_an_escape_sequence_is_still_one_key(driver):
    d, w, got = driver
    t, _ = start(d)
    os.write(w, b"\x1b[A")  # cursor up
    assert wait_until(lambda: "up" in keys(got)), got
    time.sleep(0.3)
    assert "escape" not in keys(got)
    d.exit_event.set()
    t.join(2)
    assert not t.is_alive()


def test_the_version_check_does_not_load_importlib_metadata():
    """textual.__version__ would (2.3 MiB of the TUI's peak RSS, seen in benchmark 3)."""
    import subprocess
    import sys

    code = ("import sys; from gputop.tui.driver import WRITTEN_FOR, textual_is; "
            "print(textual_is(WRITTEN_FOR), 'importlib.metadata' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "False"], out.stderr
