"""End to end: the INSTALLED gputop console script in tmux at 80x24, killing a real process by keyboard."""

from __future__ import annotations

import os
import re
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

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never appeared on the screen:\n{screen}")

    def wait_for_row(self, *parts: str, timeout: float = 30.0) -> str:
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
        # Wait for the box to close (its border gone, the tree's keys back in the footer), not only for the
        # typed text: the filter applies while typing, and a key sent before Enter is handled goes into the box.
        deadline = time.monotonic() + 10
        while (str(bystander.pid) in (screen := tmux.screen()) or "▔▔▔" in screen
               or not re.search(r"\bk Kill\b", screen)):
            assert time.monotonic() < deadline, screen
            time.sleep(0.1)
        # No Down: the app starts on the first holder (issue 32), the victim, which the filter keeps.
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


# ---- the installed `gputop --demo` at 80x24 (issue 14) ---------------------------------------------

def _demo_session(tmp_path, cmd_tail: str = "; echo GPUTOP-EXIT=$?; sleep 30", exec_: bool = False):
    exe = installed_gputop()
    if exe is None:
        pytest.skip("the gputop console script is not installed (pip install -e .)")
    config = tmp_path / "config.yaml"
    config.write_text("protect: []\n")  # the test runner may itself run inside tmux or screen
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TMUX", "GPUTOP_STATE_DIR"))}
    env.update(TERM="xterm-256color", GPUTOP_CONFIG=str(config))
    tmux = Tmux(tmp_path / "tmux.sock")
    cmd = f"exec {exe} --demo --interval 0.5" if exec_ else f"{exe} --demo --interval 0.5{cmd_tail}"
    subprocess.run(tmux.base + ["-f", "/dev/null", "new-session", "-d", "-s", "e2e", "-x", "80", "-y", "24",
                                cmd], env=env, check=True, timeout=10)
    return tmux


def _demo_procs(tmux: Tmux) -> tuple[Path, dict]:
    """The demo's dir (from the DEMO line on screen) and its processes: role -> (pid, start time)."""
    import json
    import re

    screen = tmux.wait_for("env.sh", timeout=30)
    demo_dir = Path(re.search(r"\. (/\S+)/env\.sh", screen).group(1))
    deadline = time.monotonic() + 15
    while True:
        try:
            procs = json.loads((demo_dir / "procs.json").read_text())
            if {"miner", "graphics", "jupyter"} <= set(procs):
                return demo_dir, {role: tuple(v) for role, v in procs.items()}
        except (OSError, ValueError):
            pass
        assert time.monotonic() < deadline, "the demo wrote no procs.json"
        time.sleep(0.1)


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _same(pid: int, start) -> bool:
    from gputop.core.procs import start_time

    return _proc_state(pid) not in (None, "Z") and start_time(pid) == start


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (bash .ci/run installs it)")
@pytest.mark.slow
def test_demo_tag_two_with_space_and_kill_both(tmp_path):
    tmux = _demo_session(tmp_path)
    try:
        demo_dir, procs = _demo_procs(tmux)
        miner, gfx = procs["miner"][0], procs["graphics"][0]
        tmux.wait_for_row(str(miner))
        for word in ("xmrig", "glxgears"):  # F3 search puts the cursor on the row; space tags it
            tmux.keys("F3")
            tmux.wait_for("search: pid")
            tmux.keys("-l", word)
            time.sleep(0.5)
            tmux.keys("Enter")
            deadline = time.monotonic() + 10
            while "▔▔▔" in tmux.screen():  # the search box (its border) is still open
                assert time.monotonic() < deadline, tmux.screen()
                time.sleep(0.1)
            tmux.keys("Space")
            time.sleep(0.5)
        screen = tmux.wait_for("2 tagged")
        for pid in (miner, gfx):
            assert any(f"*" in line.split(str(pid))[0] for line in screen.splitlines() if str(pid) in line), screen
        tmux.keys("k")
        tmux.wait_for("Kill 2 tagged processes?")
        tmux.keys("Tab")  # Cancel -> TERM
        tmux.keys("Enter")
        for pid in (miner, gfx):  # /proc: gone, or a zombie that init has not reaped yet (it has exited)
            assert wait_gone(pid, 15), tmux.screen()
            assert _proc_state(pid) in (None, "Z"), (pid, _proc_state(pid))
        # Nothing else: every other demo process is still the same process.
        for role, (pid, start) in procs.items():
            if role not in ("miner", "graphics"):
                assert _same(pid, start), f"{role} ({pid}) was killed too"
        tmux.keys("q")
        screen = tmux.wait_for("GPUTOP-EXIT=")
        assert "GPUTOP-EXIT=0" in screen, screen
        for role, (pid, _) in procs.items():
            assert wait_gone(pid, 10), f"{role} ({pid}) outlived the demo"
    finally:
        tmux("kill-server", check=False)


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (bash .ci/run installs it)")
@pytest.mark.slow
def test_kill_9_of_the_demo_leaves_none_of_its_processes(tmp_path):
    tmux = _demo_session(tmp_path, exec_=True)
    try:
        demo_dir, procs = _demo_procs(tmux)
        gputop_pid = int(tmux("display-message", "-p", "-t", "e2e", "#{pane_pid}").strip())
        assert all(_same(pid, start) for pid, start in procs.values())
        os.kill(gputop_pid, 9)
        for role, (pid, start) in procs.items():
            deadline = time.monotonic() + 15
            while _same(pid, start):
                assert time.monotonic() < deadline, f"{role} ({pid}) survived kill -9 of gputop --demo"
                time.sleep(0.1)
        deadline = time.monotonic() + 10
        while demo_dir.exists():
            assert time.monotonic() < deadline, f"{demo_dir} was left behind"
            time.sleep(0.1)
    finally:
        tmux("kill-server", check=False)


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (bash .ci/run installs it)")
@pytest.mark.slow
def test_too_small_message_wins_over_an_open_dialog(tmp_path):
    tmux = _demo_session(tmp_path)
    try:
        _demo_procs(tmux)
        tmux.keys("g")
        tmux.wait_for("Switch guard mode")
        tmux("resize-window", "-t", "e2e", "-x", "50", "-y", "12")
        tmux.wait_for("Terminal too small")
        tmux("resize-window", "-t", "e2e", "-x", "80", "-y", "24")
        tmux.wait_for("Switch guard mode")  # the dialog is back, unchanged
        tmux("resize-window", "-t", "e2e", "-x", "50", "-y", "12")
        tmux.wait_for("Terminal too small")
        tmux.keys("q")
        screen = tmux.wait_for("GPUTOP-EXIT=")
        assert "GPUTOP-EXIT=0" in screen, screen
    finally:
        tmux("kill-server", check=False)


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (bash .ci/run installs it)")
@pytest.mark.slow
def test_devices_come_first_and_the_shell_screen_comes_back(scenario, tmp_path):
    # The first frame (header and devices, drawn before Textual is imported) is on screen before the
    # app's own; after q the shell's screen and its cursor are back where they were.
    exe = installed_gputop()
    if exe is None:
        pytest.skip("the gputop console script is not installed (pip install -e .)")
    path = scenario([], gpus=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
    env.update(TERM="xterm-256color", GPUTOP_SCENARIO=str(path))
    tmux = Tmux(tmp_path / "tmux.sock")
    subprocess.run(tmux.base + ["-f", "/dev/null", "new-session", "-d", "-s", "e2e", "-x", "100", "-y", "30",
                                "bash --norc --noprofile"], env=env, check=True, timeout=10)
    try:
        tmux.wait_for("bash" if os.geteuid() == 0 else "$")  # bash's own prompt: bash-5.2# or bash-5.2$
        tmux.keys("PS1='$ '; clear; echo before-gputop", "Enter")
        tmux.wait_for("before-gputop\n$")
        tmux.keys(exe, "Enter")  # the scenario from $GPUTOP_SCENARIO: a short line that does not wrap
        screens = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any("PID" in s for s in screens[-1:]):
            screens.append(tmux.screen())
            time.sleep(0.01)
        first = next((s for s in screens if "Simulated H100" in s), "")
        assert "GPU 0  Simulated H100 80GB  util" in first and "reading processes" in first, first
        assert "PID" not in first  # the app's frame (with the tree) came after it
        tmux.wait_for("no orphans")
        tmux.keys("q")
        screen = tmux.wait_for(f"$ {exe}\n$")
        assert "before-gputop" in screen and "Simulated" not in screen, screen
        lines = screen.splitlines()
        cursor_y = int(tmux("display", "-p", "-t", "e2e", "#{cursor_y}").strip())
        assert lines[cursor_y].startswith("$") and lines[cursor_y - 1].startswith(f"$ {exe}"), (cursor_y, screen)
    finally:
        tmux("kill-server", check=False)
