"""The TUI killed by SIGTERM or SIGHUP restores the terminal: alternate screen off, mouse tracking off,
cursor shown (checked on the bytes it writes to a real pty)."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT


def read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    out = b""
    deadline = time.time() + timeout
    while time.time() < deadline and needle not in out:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_restores_the_terminal(scenario, sig):
    path = scenario(holders=[], gpus=1)
    master, slave = pty.openpty()
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="100", LINES="30")
    p = subprocess.Popen([sys.executable, "-m", "gputop", "--scenario", str(path), "--backend", "simulated"],
                         stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, start_new_session=True,
                         preexec_fn=None)
    os.close(slave)
    try:
        start = read_until(master, b"\x1b[?1049h", 60)
        assert b"\x1b[?1049h" in start, start[-500:]
        start += read_until(master, b"GPU", 30)  # the first screen is drawn
        p.send_signal(sig)
        rest = read_until(master, b"\x1b[?1049l", 30)
        rest += read_until(master, b"\x1b[?25h", 5)
        rc = p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    assert b"\x1b[?1049l" in rest, rest[-500:]  # alternate screen off
    assert b"\x1b[?25h" in rest  # cursor shown
    assert b"\x1b[?1000l" in rest  # mouse tracking off
    assert rc == 128 + sig
