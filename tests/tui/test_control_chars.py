"""Control characters a process puts in its name or command line never reach the terminal from the TUI."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.tui.helpers import open_app, run_async, screen_text, wait_row, wait_screen, wait_until

EVIL_ARGV0 = "\x1b]0;pwned\x07\x1b[2Jevil"


def _evil(procs):
    p = procs.spawn([EVIL_ARGV0, "-c", "import ctypes,time;ctypes.CDLL(None).prctl(15,b'\\x1b[2Jgti11',0,0,0);"
                     "time.sleep(600)", "arg\x1b[31mred"], executable=sys.executable)
    deadline = time.time() + 10
    while b"gti11" not in Path(f"/proc/{p.pid}/comm").read_bytes() and time.time() < deadline:
        time.sleep(0.02)
    return p


def _clean(text: str) -> bool:
    return not any(ch in text for ch in ("\x1b", "\x07", "\x9b"))


@run_async
async def test_escape_sequences_in_argv_are_shown_not_sent(procs, scenario):
    evil = _evil(procs)
    path = scenario([{"pid": evil.pid, "gpu": 0, "memory": "4GiB"}])
    app = open_app(path)
    async with app.run_test(size=(160, 40)) as pilot:
        assert await wait_row(pilot, f"gpu0/{evil.pid}")
        assert await wait_until(pilot, lambda: "\\x1b" in screen_text(app))
        text = screen_text(app)
        assert _clean(text) and "\\x1b]0;pwned\\x07\\x1b[2Jevil" in text
        assert app.select_key(f"gpu0/{evil.pid}")
        await pilot.press("d")  # details: name, command line, verdict
        await pilot.pause(0.5)
        text = screen_text(app)
        assert _clean(text) and "\\x1b[2Jgti11" in text and "arg\\x1b[31mred" in text
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert app.select_key(f"gpu0/{evil.pid}")
        await pilot.press("k")  # the kill dialog shows the command line
        assert await wait_screen(pilot, "KillDialog")
        await pilot.pause(0.3)
        text = screen_text(app)
        assert _clean(text) and "\\x1b]0;pwned" in text
        await pilot.press("escape")
    assert evil.poll() is None
