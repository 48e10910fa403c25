"""The installed gputop in tmux at 80x24: the DEMO line and the clock fit, the cursor starts on the first
holder, a filter says "N of M shown", notifications go when a dialog opens, the plot title keeps its legend,
--readonly refuses tags, numbers never run into bars, a GPU that lacks fields keeps its columns, and
`gputop 2>err.log` says why it exits on the terminal too (these came with issue 32)."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from tests.tui.test_e2e_tmux import TMUX, Tmux, _demo_procs, _demo_session, installed_gputop

pytestmark = [pytest.mark.skipif(TMUX is None, reason="tmux is not installed"), pytest.mark.slow]

CLOCK = re.compile(r"\d\d:\d\d:\d\d\s*$")


def _gone(tmux: Tmux, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while text in (screen := tmux.screen()):
        assert time.monotonic() < deadline, f"{text!r} stayed on the screen:\n{screen}"
        time.sleep(0.1)
    return screen


def test_the_demo_at_80x24(tmp_path):
    tmux = _demo_session(tmp_path)
    try:
        demo_dir, procs = _demo_procs(tmux)
        screen = tmux.wait_for_row(str(procs["miner"][0]))
        top, banner = screen.splitlines()[:2]
        assert banner.rstrip().endswith(f". {demo_dir}/env.sh"), banner  # the whole path, nothing cut
        # The cursor starts on the first holder: d opens its details (not "Select a process first").
        tmux.keys("d")
        screen = tmux.wait_for("Process ")
        first = re.search(r"Process (\d+)", screen).group(1)
        assert "Select a process first" not in screen
        assert int(first) in (procs["worker0"][0], procs["worker1"][0]), screen
        tmux.keys("Escape")
        _gone(tmux, "Process ", 10)
        # Two tags, and the clock stays at the right end of the top line.
        tmux.keys("Space")  # tags the first holder, moves down
        for word in ("xmrig",):
            tmux.keys("F3")
            tmux.wait_for("search: pid")
            tmux.keys("-l", word)
            time.sleep(0.5)
            tmux.keys("Enter")
            _gone(tmux, "▔▔▔", 10)
            tmux.keys("Space")
        screen = tmux.wait_for("2 tagged")
        top = screen.splitlines()[0]
        assert CLOCK.search(top), top
        # A notification goes as soon as a dialog opens (it covered the dialog's border).
        tmux.keys("Home")  # the GPU 0 group row, not a holder: space says so in a toast
        time.sleep(0.3)
        tmux.keys("Space")
        tmux.wait_for("can be tagged")
        tmux.keys("?")
        tmux.wait_for("gputop keys")
        assert "can be tagged" not in tmux.screen()
        tmux.keys("Escape")
        _gone(tmux, "gputop keys", 10)
        # A filter: groups whose holders are only hidden say so.
        tmux.keys("/")
        tmux.wait_for("filter: pid")
        tmux.keys("-l", "xmrig")
        screen = tmux.wait_for("0 of 1 holder shown")
        assert "· 0 holders" not in screen
        assert "1 of 3 holders shown" in screen, screen
        tmux.keys("Enter")
        _gone(tmux, "▔▔▔", 10)
        # The plot's title keeps its legend whole at 80 columns.
        tmux.keys("p")
        screen = tmux.wait_for("seconds ago")
        assert "utilisation %" in screen.splitlines()[0] and "memory %" in screen.splitlines()[0], screen
        tmux.keys("Escape")
        tmux.wait_for("GPU-MEM")
        tmux.keys("q")
        screen = tmux.wait_for("GPUTOP-EXIT=")
        assert "GPUTOP-EXIT=0" in screen
    finally:
        tmux("kill-server", check=False)


def test_the_readonly_demo_refuses_tags(tmp_path):
    tmux = _demo_session(tmp_path, cmd_tail=" --readonly; echo GPUTOP-EXIT=$?; sleep 30")
    try:
        _, procs = _demo_procs(tmux)
        screen = tmux.wait_for_row(str(procs["miner"][0]))
        assert "READ-ONLY" in screen and "space Tag" not in screen
        for _ in range(3):
            tmux.keys("Space")
            time.sleep(0.3)
        time.sleep(0.5)
        screen = tmux.screen()
        assert "tagged" not in screen.splitlines()[0], screen
        assert not any(line.startswith("*") or " *" in line[:12] for line in screen.splitlines()[8:-2]), screen
        tmux.keys("?")
        screen = tmux.wait_for("gputop keys")
        assert "kills every tagged one" not in screen and "read-only" in screen
        tmux.keys("Escape")
        _gone(tmux, "gputop keys", 10)
        tmux.keys("q")
        assert "GPUTOP-EXIT=0" in tmux.wait_for("GPUTOP-EXIT=")
    finally:
        tmux("kill-server", check=False)


def _scenario_session(tmp_path, holder_pid: int) -> Tmux:
    exe = installed_gputop()
    if exe is None:
        pytest.skip("the gputop console script is not installed (pip install -e .)")
    path = tmp_path / "scenario.yaml"
    full = ("{name: Simulated H100 80GB, memory_total: 140GiB, temperature: 67, power: 610, power_limit: 700, "
            "fan: 40, clock_sm: 1980, clock_mem: 2619}")
    bare = "{name: Simulated H100 80GB, memory_total: 80GiB}"  # no sensors at all
    path.write_text(f"gpus: [{full}, {bare}]\nholders:\n  - {{pid: {holder_pid}, gpu: 0, memory: 140GiB, sm: 100}}\n")
    config = tmp_path / "config.yaml"
    config.write_text("protect: []\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
    env.update(TERM="xterm-256color", GPUTOP_CONFIG=str(config))
    tmux = Tmux(tmp_path / "tmux.sock")
    subprocess.run(tmux.base + ["-f", "/dev/null", "new-session", "-d", "-s", "e2e", "-x", "80", "-y", "24",
                                f"{exe} --scenario {path}; echo GPUTOP-EXIT=$?; sleep 30"],
                   env=env, check=True, timeout=10)
    return tmux


def test_full_numbers_and_missing_fields_keep_their_columns(procs, tmp_path):
    holder = procs.sleeper("gt-cols-full")
    tmux = _scenario_session(tmp_path, holder.pid)
    try:
        screen = tmux.wait_for_row(str(holder.pid))
        tmux.wait_for("100%")
        screen = tmux.screen()
        # A number that fills its column is not glued to the bar before it.
        assert not re.search(r"[▁▂▃▄▅▆▇█]\d", screen), screen
        lines = screen.splitlines()
        g0 = next(line for line in lines if line.lstrip().startswith("GPU 0"))
        g1 = next(line for line in lines if line.lstrip().startswith("GPU 1"))
        # The sensors sit in the same columns: the power column (after the temperature) ends at one place.
        assert re.search(r"610/700W", g0) and re.search(r"power N/A", g1), (g0, g1)
        assert g0.index("610/700W") + len("610/700W") == g1.index("power N/A") + len("power N/A"), (g0, g1)
        assert g0.index("°C") + 2 == g1.index("N/A") + 3, (g0, g1)
        tmux.keys("q")
        assert "GPUTOP-EXIT=0" in tmux.wait_for("GPUTOP-EXIT=")
    finally:
        tmux("kill-server", check=False)


def test_stderr_redirected_says_why_on_the_terminal(tmp_path):
    exe = installed_gputop()
    if exe is None:
        pytest.skip("the gputop console script is not installed (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
    env["TERM"] = "xterm-256color"
    tmux = Tmux(tmp_path / "tmux.sock")
    err = tmp_path / "err.log"
    subprocess.run(tmux.base + ["-f", "/dev/null", "new-session", "-d", "-s", "e2e", "-x", "80", "-y", "24",
                                f"{exe} 2>{err}; echo GPUTOP-EXIT=$?; sleep 30"], env=env, check=True, timeout=10)
    try:
        screen = tmux.wait_for("GPUTOP-EXIT=", timeout=30)
        assert "GPUTOP-EXIT=2" in screen
        assert "standard error is not one" in screen and "2>FILE" in screen.replace("\n", ""), screen
        assert "standard error is not one" in err.read_text()  # and in the file, as before
    finally:
        tmux("kill-server", check=False)
