"""Peak RSS of the TUI (issue 13): the TUI process leaves out modules it never uses (``ssl``, which asyncio
would load only to offer TLS: libcrypto and libssl, ~4.5 MiB resident), and nothing else is affected."""

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


def test_the_running_tui_does_not_load_ssl(scenario):
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

