"""SIGTERM/SIGHUP end the TUI even when the app's own exit never finishes (a closed terminal can leave
Textual's shutdown waiting for ever on its output queue: seen as idle gputop processes after their tmux
windows were killed during start-up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

STUCK = textwrap.dedent("""
    import asyncio, sys
    from gputop.tui import launch
    launch.EXIT_GRACE_S = 0.5

    class StuckApp:  # an app whose exit never ends the loop (what the deadlocked shutdown looks like)
        def exit(self, return_code=0):
            print("exit asked", flush=True)

    async def main():
        print("ready", flush=True)
        await asyncio.sleep(60)

    with launch._exit_on_signals(lambda: StuckApp()):
        asyncio.run(main())
    print("loop ended by itself", flush=True)
""")


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_a_stuck_exit_still_ends_the_process_with_128_plus_the_signal(sig):
    p = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        p.send_signal(sig)
        rc = p.wait(timeout=20)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert rc == 128 + sig
    assert "exit asked" in p.stdout.read()  # the normal exit was tried first
    assert took < 15


def test_the_forced_exit_is_called_off_once_the_app_has_exited(monkeypatch):
    """The forced exit is for a shutdown that hangs; once the app's normal exit has returned, a process that
    lives on (a caller, a test) is not ended 10 s later."""
    import asyncio
    import time

    from gputop.tui import launch

    monkeypatch.setattr(launch, "EXIT_GRACE_S", 0.3)
    forced = []
    monkeypatch.setattr(launch.os, "_exit", lambda code: forced.append(code))

    class App:
        def exit(self, return_code=None):
            pass

    async def main():
        with launch._exit_on_signals(lambda: App()):
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.05)

    asyncio.run(main())
    time.sleep(0.6)
    assert forced == []
