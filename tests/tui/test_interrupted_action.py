"""Issue 26, the TUI face: SIGHUP, SIGTERM or SIGINT to the gputop TUI while a confirmed reap or kill waits.

The real ``gputop`` runs in tmux on the simulated backend; a real orphan tree holds a simulated GPU and its
root ignores SIGTERM, so the reap waits out its grace before SIGKILL. The signal comes mid-grace: the TUI
leaves the screen, the reap (a worker thread) finishes its plan, its audit record says it was interrupted,
and only then does the process end, with 128 + the signal. Nothing of the tree is left (none stopped), and
an innocent bystander lives. The same for a kill, and for a kill of several tagged processes.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_gone
from tests.functional.actions_helpers import alive, records, unique, write_config
from tests.functional.test_reap_namespaces_reforks_interrupts import marked, nothing_stopped, state, stubborn_tree
from tests.tui.test_e2e_tmux import Tmux as E2eTmux

TMUX = shutil.which("tmux")
PY = sys.executable
GRACE = 5  # the config's kill_timeout: the reap's grace, long enough to signal gputop inside it


class Tmux(E2eTmux):
    """The e2e tests' tmux (session "e2e"), waiting for any condition on the screen."""

    def until(self, cond, what: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if cond(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{what} never appeared on the screen:\n{screen}")

    def pane(self, fmt: str) -> str:
        return self("display-message", "-p", "-t", "e2e", fmt, check=False).strip()


def _gputop_pid(pane: int, launcher: Path, timeout: float = 30) -> int:
    """The gputop process: the launcher's child, in the pane (under a shell or not)."""
    deadline = time.monotonic() + timeout
    while True:
        for p in [psutil.Process(pane), *psutil.Process(pane).children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                if str(launcher) in p.cmdline() and p.children():
                    return p.children()[0].pid
        assert time.monotonic() < deadline, "the launcher started no gputop"
        time.sleep(0.05)


# gputop itself, or gputop whose forced exit (launch.EXIT_GRACE_S: the backstop for a shutdown that hangs
# on a closed terminal) comes 1 s after the signal, well inside the reap's grace: what a kill_timeout longer
# than that backstop (10 s) meets.
GPUTOP = [PY, "-m", "gputop"]
GPUTOP_QUICK_BACKSTOP = [PY, "-c", "from gputop.tui import launch; launch.EXIT_GRACE_S = 1.0; "
                                   "from gputop.commands.cli import entry; entry()"]

# The pane runs this launcher, which runs gputop and writes how it ended: its exit status, or -N where
# signal N itself ended it (a shell's $? says 129 for both; tmux's #{pane_dead_status} is not always there).
LAUNCHER = """import subprocess, sys
rc = subprocess.run(sys.argv[2:]).returncode
open(sys.argv[1] + ".tmp", "w").write(str(rc))
import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


class TuiRun:
    """gputop (``exe``) in tmux at 120x30 on the scenario ``path``, through the launcher."""

    def __init__(self, tmp_path: Path, exe: list[str], path: Path, config: Path):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        env.update(TERM="xterm-256color", GPUTOP_CONFIG=str(config), GPUTOP_SCENARIO=str(path))
        self.tmux = Tmux(tmp_path / "tmux.sock")
        self.rc_file, launcher = tmp_path / "gputop.rc", tmp_path / "launcher.py"
        launcher.write_text(LAUNCHER)
        cmd = shlex.join([PY, str(launcher), str(self.rc_file), *exe,
                          "--scenario", str(path), "--backend", "simulated", "--interval", "0.5"])
        subprocess.run(self.tmux.base + ["-f", "/dev/null", "new-session", "-d", "-s", "e2e", "-x", "120",
                                         "-y", "30", cmd, ";", "set-option", "-t", "e2e", "remain-on-exit", "on"],
                       env=env, check=True, timeout=10, cwd=Path(__file__).resolve().parents[2])
        self.pid = _gputop_pid(int(self.tmux.pane("#{pane_pid}")), launcher)

    def select(self, pid: int, memory: str) -> None:
        """Wait for the holder's row, then put the cursor on it (F3 search)."""
        tmux = self.tmux
        tmux.wait_for_row(str(pid), memory, timeout=60)
        tmux.keys("F3")
        tmux.wait_for("search: pid")
        tmux.keys("-l", str(pid))
        time.sleep(0.5)
        tmux.keys("Enter")
        tmux.until(lambda s: "▔▔▔" not in s, "the search box closed")

    def confirm(self, key: str, title: str) -> None:
        """Open a dialog with ``key``, wait for ``title``, press the button right of Cancel."""
        self.tmux.keys(key)
        self.tmux.wait_for(title)
        self.tmux.keys("Tab")  # Cancel -> the action's button (Reap tree; TERM)
        self.tmux.keys("Enter")

    def wait_flag(self, flag: Path) -> None:
        deadline = time.monotonic() + 30
        while not flag.exists():
            assert time.monotonic() < deadline, f"the target never got its SIGTERM:\n{self.tmux.screen()}"
            time.sleep(0.02)

    def signal(self, *sigs: int) -> tuple[int, float, str]:
        """Send ``sigs`` to gputop (0.3 s apart); wait until it ends: (how it ended, seconds, last screen)."""
        t0 = time.monotonic()
        for i, sig in enumerate(sigs):
            if i:
                time.sleep(0.3)
            os.kill(self.pid, sig)
        deadline = time.monotonic() + GRACE + 30
        while not self.rc_file.exists():
            assert time.monotonic() < deadline, f"gputop did not end:\n{self.tmux.screen()}"
            time.sleep(0.05)
        return int(self.rc_file.read_text()), time.monotonic() - t0, self.tmux.screen()

    def close(self) -> None:
        self.tmux("kill-server", check=False)


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (bash .ci/run installs it)")
@pytest.mark.slow
@pytest.mark.parametrize("sigs,exe", [([signal.SIGHUP], GPUTOP), ([signal.SIGTERM], GPUTOP),
                                      ([signal.SIGINT], GPUTOP), ([signal.SIGHUP], GPUTOP_QUICK_BACKSTOP),
                                      ([signal.SIGHUP, signal.SIGTERM], GPUTOP)],
                         ids=["SIGHUP", "SIGTERM", "SIGINT", "SIGHUP-forced-exit-inside-the-grace",
                              "SIGHUP-then-SIGTERM"])
def test_a_signal_to_the_tui_mid_grace_finishes_the_reap(procs, scenario, tmp_path, monkeypatch, sigs, exe):
    marker = unique("gt-tui-intr")
    flag = tmp_path / f"{marker}.flag"  # written by the root when its SIGTERM arrives: the grace has begun
    t = stubborn_tree(procs, tmp_path, marker)
    members = marked(marker)
    assert {t["root"], t["polite"]} <= set(members)
    bystander = procs.sleeper("gt-bystander")
    path = scenario(holders=[{"pid": t["polite"], "gpu": 0, "memory": "3GiB", "sm": 70},
                             {"pid": bystander.pid, "gpu": 1, "memory": "2GiB"}])
    config = write_config(tmp_path / "config.yaml", monkeypatch, kill_timeout=GRACE)
    tui = TuiRun(tmp_path, exe, path, config)
    try:
        tui.select(t["polite"], "3.0GiB")
        tui.confirm("r", f"Reap the orphan tree of pid {t['root']}")
        tui.wait_flag(flag)
        assert alive(t["root"])  # in the grace: the root ignores SIGTERM until SIGKILL
        # The process ends once the reap has finished its plan (the rest of the grace, then SIGKILL).
        rc, took, after = tui.signal(*sigs)
    finally:
        tui.close()
    assert rc == 128 + sigs[0], after  # the first signal's status
    assert "Traceback" not in after and "Error" not in after, after  # the worker's end after the app's is quiet
    for pid in members:  # every member is gone: killed, not left stopped
        assert wait_gone(pid, 10), f"pid {pid} ({state(pid)}) outlived the reap"
    nothing_stopped(marked(marker))
    assert alive(bystander.pid)
    [rec] = records(action="reap", pid=t["root"])
    assert rec["face"] == "tui"
    assert rec["outcome"] == "reaped" and rec["ok"], rec
    assert rec["interrupted"] == {"signals": [signal.Signals(s).name for s in sigs], "then": "finished"}
    assert "SIGKILL" in [s["signal"] for s in rec["signals"]]
    assert took < GRACE + 15  # not the 180 s backstop


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (bash .ci/run installs it)")
@pytest.mark.slow
def test_sigterm_to_the_tui_mid_wait_finishes_the_kill(procs, scenario, tmp_path, monkeypatch):
    """A TERM kill of a process that ignores SIGTERM waits out kill_timeout, then says it is still alive:
    SIGTERM to the TUI in that wait lets it get there, and its record says it was interrupted."""
    marker = unique("gt-tui-intr-kill")
    flag = tmp_path / f"{marker}.flag"
    t = stubborn_tree(procs, tmp_path, marker)
    bystander = procs.sleeper("gt-bystander")
    path = scenario(holders=[{"pid": t["root"], "gpu": 0, "memory": "3GiB", "sm": 70},
                             {"pid": bystander.pid, "gpu": 1, "memory": "2GiB"}])
    config = write_config(tmp_path / "config.yaml", monkeypatch, kill_timeout=GRACE)
    tui = TuiRun(tmp_path, GPUTOP, path, config)
    try:
        tui.select(t["root"], "3.0GiB")
        tui.confirm("k", f"Kill process {t['root']}?")
        tui.wait_flag(flag)
        rc, took, after = tui.signal(signal.SIGTERM)
    finally:
        tui.close()
    assert rc == 128 + signal.SIGTERM, after
    assert "Traceback" not in after and "Error" not in after, after
    [rec] = records(action="kill", pid=t["root"])
    assert rec["face"] == "tui"
    assert rec["outcome"] == "still-alive" and not rec["ok"], rec  # TERM without force: the plan's end
    assert rec["interrupted"] == {"signals": ["SIGTERM"], "then": "finished"}
    assert alive(t["root"]) and state(t["root"]) not in ("T", "t")  # running as before: not left stopped
    assert alive(t["polite"]) and alive(bystander.pid)  # a kill takes the one process
    assert took < GRACE + 15


# A process that ignores SIGTERM, and writes its flag file when one comes.
IGNORES_TERM = ("import ctypes, signal, time\n"
                "ctypes.CDLL(None).prctl(15, b'gt-ignoreterm', 0, 0, 0)\n"
                "signal.signal(signal.SIGTERM, lambda *a: open({flag!r}, 'w').write('x'))\n"
                "print('ready', flush=True)\n"
                "while True: time.sleep(0.05)\n")


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (bash .ci/run installs it)")
@pytest.mark.slow
@pytest.mark.parametrize("exe", [GPUTOP, GPUTOP_QUICK_BACKSTOP], ids=["gputop", "forced-exit-between-kills"])
def test_a_signal_to_the_tui_mid_kill_of_tagged_processes_finishes_every_kill(procs, scenario, tmp_path,
                                                                                 monkeypatch, exe):
    """The TUI kills tagged processes one by one, each waiting out kill_timeout here. Once the app has
    exited, the outcome of each kill can no longer be shown: the next kills still happen. And the forced
    exit (1 s after the signal in the second run, 10 s in gputop) comes between two of them, and still
    waits for the rest of the confirmed list."""
    timeout = 2
    targets, flags = [], []
    for i in range(3):
        flags.append(tmp_path / f"term-{i}.flag")
        p = procs.spawn([PY, "-c", IGNORES_TERM.format(flag=str(flags[-1]))], stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"ready"
        targets.append(p)
    bystander = procs.sleeper("gt-bystander")
    path = scenario(holders=[*({"pid": p.pid, "gpu": 0, "memory": f"{i + 1}GiB"} for i, p in enumerate(targets)),
                             {"pid": bystander.pid, "gpu": 1, "memory": "2GiB"}])
    config = write_config(tmp_path / "config.yaml", monkeypatch, kill_timeout=timeout)
    tui = TuiRun(tmp_path, exe, path, config)
    try:
        for i, p in enumerate(targets):
            tui.select(p.pid, f"{i + 1}.0GiB")
            tui.tmux.keys("Space")
            tui.tmux.wait_for(f"{i + 1} tagged")
        tui.confirm("k", "Kill 3 tagged processes?")
        deadline = time.monotonic() + 30
        while not any(f.exists() for f in flags):
            assert time.monotonic() < deadline, f"no target got its SIGTERM:\n{tui.tmux.screen()}"
            time.sleep(0.02)
        rc, took, after = tui.signal(signal.SIGHUP)
    finally:
        tui.close()
    assert rc == 128 + signal.SIGHUP, after
    assert all(f.exists() for f in flags), "the kill of the tagged processes was cut short"
    for p in targets:
        [rec] = records(action="kill", pid=p.pid)
        assert rec["face"] == "tui" and rec["outcome"] == "still-alive", rec
        assert rec["interrupted"] == {"signals": ["SIGHUP"], "then": "finished"}
        assert alive(p.pid) and state(p.pid) not in ("T", "t")  # TERM without force: left running
    assert alive(bystander.pid)
    assert took < 3 * timeout + 15


# ---- the wait before the process ends: as long as actions keep ending, not a fixed total ----

def test_settle_waits_for_actions_one_after_another_and_gives_up_on_one_that_hangs():
    import threading

    from gputop.actions import interrupt

    def actions(n: int, each: float, hang: threading.Event | None = None) -> threading.Thread:
        def run():
            for _ in range(n):
                with interrupt.deferred():  # in a worker thread: only counted as in flight
                    time.sleep(each)
            if hang is not None:
                with interrupt.deferred():
                    hang.wait(30)

        th = threading.Thread(target=run, daemon=True)
        th.start()
        time.sleep(0.05)
        return th

    # Four actions of 0.5 s in a row: 2 s in all, more than the 1.5 s any one may take; settle waits for all.
    th = actions(4, 0.5)
    t0 = time.monotonic()
    assert interrupt.settle(1.5)  # interrupt.idle(1.5) gives up half-way
    assert time.monotonic() - t0 > 1.7
    th.join(5)
    # One that hangs: settle gives up once none has ended for its quiet time.
    hang = threading.Event()
    th = actions(1, 0.2, hang)
    t0 = time.monotonic()
    assert not interrupt.settle(0.6)
    assert 0.7 < time.monotonic() - t0 < 5
    hang.set()
    th.join(5)
    assert interrupt.idle(5)
