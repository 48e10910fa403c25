"""End to end: the INSTALLED gputop console script in tmux at 80x24, killing a real process by keyboard."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_gone

TMUX = shutil.which("tmux")


def installed_gputop() -> str | None:
    venv = ROOT / ".venv" / "bin" / "gputop"
    if venv.exists():
        return str(venv)
    here = Path(sys.executable).parent / "gputop"
    return str(here) if here.exists() else shutil.which("gputop")


class Tmux:
    def __init__(self, socket: Path):
        self.base = [TMUX, "-S", str(socket)]

    def __call__(self, *args: str, check: bool = True) -> str:
        return subprocess.run(self.base + list(args), capture_output=True, text=True, check=check,
                              timeout=10).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "e2e", check=False)

    def wait_for(self, text: str, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never appeared on the screen:\n{screen}")

    def wait_for_row(self, *parts: str, timeout: float = 15.0) -> str:
        """Wait for one screen line that holds every one of ``parts``."""
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if any(all(p in line for p in parts) for line in screen.splitlines()):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"no line with {parts!r} on the screen:\n{screen}")

    def keys(self, *keys: str) -> None:
        self("send-keys", "-t", "e2e", *keys)


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (bash .ci/run installs it)")
@pytest.mark.slow
@pytest.mark.parametrize("term", ["xterm-256color", "xterm"])
def test_installed_gputop_kills_a_process_from_the_keyboard(procs, scenario, tmp_path, term):
    exe = installed_gputop()
    if exe is None:
        pytest.skip("the gputop console script is not installed (pip install -e .)")
    # A holder in its own session, so that its row sits right under its GPU's group row.
    victim = procs.spawn([sys.executable, "-c",
                          "import ctypes,time;ctypes.CDLL(None).prctl(15,b'e2evictim',0,0,0);time.sleep(600)"],
                         start_new_session=True)
    bystander = procs.sleeper("bystander")
    path = scenario([{"pid": victim.pid, "gpu": 0, "memory": "4GiB", "sm": 80},
                     {"pid": bystander.pid, "gpu": 1, "memory": "2GiB"}])
    config = tmp_path / "config.yaml"
    config.write_text("protect: []\n")  # the test runner may itself run inside tmux or screen
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
    env.update(TERM=term, GPUTOP_CONFIG=str(config), GPUTOP_SCENARIO=str(path))
    tmux = Tmux(tmp_path / "tmux.sock")
    cmd = f"{exe} --scenario {path} --interval 0.5; echo GPUTOP-EXIT=$?; sleep 30"
    subprocess.run(tmux.base + ["-f", "/dev/null", "new-session", "-d", "-s", "e2e", "-x", "80", "-y", "24",
                                cmd], env=env, check=True, timeout=10)
    try:
        tmux.wait_for_row(f"{victim.pid}", "4.0GiB", "80%")
        # A refresh that changes only some values of a row repaints that row on the real terminal.
        scenario([{"pid": victim.pid, "gpu": 0, "memory": "6GiB", "sm": 55},
                  {"pid": bystander.pid, "gpu": 1, "memory": "2GiB"}])
        tmux.wait_for_row(f"{victim.pid}", "6.0GiB", "55%")
        tmux.keys("/")
        tmux.wait_for("filter: pid")  # the filter box is open and focused
        tmux.keys("-l", "e2evictim")
        tmux.wait_for("e2evictim")
        tmux.keys("Enter")
        deadline = time.monotonic() + 10
        while str(bystander.pid) in tmux.screen() or "filter: pid" in tmux.screen():
            assert time.monotonic() < deadline, tmux.screen()
            time.sleep(0.1)
        tmux.keys("Down")  # from the GPU 0 group row onto the victim
        tmux.keys("k")
        tmux.wait_for(f"Kill process {victim.pid}?")
        tmux.keys("Tab")  # Cancel -> TERM
        tmux.keys("Enter")
        assert wait_gone(victim.pid, 15), tmux.screen()
        victim.wait(5)
        tmux.wait_for("kill done")
        tmux.keys("q")
        screen = tmux.wait_for("GPUTOP-EXIT=")
        assert "GPUTOP-EXIT=0" in screen, screen
        assert bystander.poll() is None
    finally:
        tmux("kill-server", check=False)
