"""TUI start-up: what the first frame shows, and what the start imports (time and memory)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from tests.tui.helpers import run_async, screen_text

# Modules the TUI's start must not import: optional extras, the YAML and RE2 parsers (the default config
# needs neither), and the screens, dialogs and engines that are loaded when first used.
NOT_AT_START = (
    "yaml", "re2", "psutil", "plotext", "mcp", "pydantic", "starlette", "uvicorn", "aiohttp", "anyio",
    "prometheus_client", "gputop.actions", "gputop.guard", "gputop.core.auditlog", "gputop.core.rogue",
    "gputop.commands.remote", "gputop.core.demo", "gputop.tui.help", "gputop.tui.plot_screen", "gputop.tui.details",
    "gputop.tui.dialogs.kill", "gputop.tui.dialogs.reap", "gputop.tui.dialogs.reset",
    "gputop.tui.dialogs.guard_toggle", "gputop.tui.too_small",
)

START = """
import json, sys
from gputop.commands.cli import build_parser
argv = ["--interval", "1"]
build_parser(argv).parse_known_args(argv)  # what main() does before the TUI
import gputop.tui.launch, gputop.tui.app
from gputop.core.config import Config
from gputop.core.orphans import compile_protect
c = Config()  # the defaults: what a node without a config file runs
compile_protect(c.protect), compile_protect(c.protect_cmdline)  # what Sampler() compiles
class S:
    statuses = ()
gputop.tui.app.GputopApp(S())
print(json.dumps(sorted(sys.modules)))
"""


def test_tui_start_imports_no_heavy_module():
    out = subprocess.run([sys.executable, "-c", START], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout))
    assert "textual.app" in loaded and "gputop.tui.app" in loaded  # it did start
    early = sorted(m for m in loaded if m.split(".")[0] in NOT_AT_START or m in NOT_AT_START
                   or any(m.startswith(p + ".") for p in NOT_AT_START))
    assert early == [], f"imported at TUI start: {early}"
    # gputop.commands.cli is the parser every start runs (the entry point); no subcommand module may load.
    commands = sorted(m for m in loaded if m.startswith("gputop.commands.") and m != "gputop.commands.cli")
    assert commands == [], f"subcommand modules imported for the TUI: {commands}"


def test_launch_reads_the_devices_before_the_app(monkeypatch):
    from gputop.backends.base import DeviceSample
    from gputop.tui import launch

    class Fake:  # a backend with two devices, numbered by the backend itself
        name = "fake"

        def device_count(self):
            return 2

        def sample(self, i):
            return DeviceSample(index=i, name=f"d{i}")

    class Broken(Fake):
        def sample(self, i):
            raise OSError("driver gone")

    devs = launch._first_devices([Fake(), Fake()])
    assert [(d.index, d.name, d.backend, d.backend_index) for d in devs] == [
        (0, "d0", "fake", 0), (1, "d1", "fake", 1), (2, "d0", "fake", 0), (3, "d1", "fake", 1)]
    lost = launch._first_devices([Broken()])  # a failing backend: lost devices, as the full sample shows
    assert [(d.index, d.lost) for d in lost] == [(0, True), (1, True)]
    assert launch._first_devices([]) is None  # nothing to show: the app's first full sample says why


FIRST_FRAME_ORDER = """
import argparse, json, sys, types
from gputop.tui import first_frame, launch

seen = []
PROCESS_LAYER = ("gputop.core.sampler", "gputop.core.model", "gputop.core.verdicts", "gputop.core.orphans",
                 "gputop.core.ownership", "gputop.core.slurm_jobs")
launch.require_terminal = lambda: None
first_frame.draw = lambda devices, **kw: seen.append(
    ["draw", len(devices), [m for m in PROCESS_LAYER if m in sys.modules]]) or True
first_frame.leave = lambda out=None: seen.append(["leave"])

class App:
    took_screen = False

    def __init__(self, sampler, **kw):
        seen.append(["app", len(sampler.sample_devices()), kw["devices"] is not None])
        raise RuntimeError("stop here")

sys.modules["gputop.tui.app"] = types.SimpleNamespace(GputopApp=App)  # the real one imports gputop.core.model
args = argparse.Namespace(scenario=sys.argv[1], backend="simulated", interval=None, readonly=False, demo=False,
                          config=None)
try:
    launch.run_tui(args)
except RuntimeError:
    pass
print(json.dumps(seen))
"""


def test_the_process_layer_is_imported_after_the_first_frame(scenario):
    # The first frame needs the backends and the config only: gputop.core.sampler (the classifier, the /proc
    # and owner readers) is imported after it is drawn, and the sampler takes over the same backends.
    path = str(scenario([], gpus=3))
    out = subprocess.run([sys.executable, "-c", FIRST_FRAME_ORDER, path], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [["draw", 3, []], ["app", 3, True], ["leave"]]


@run_async
async def test_first_frame_shows_the_devices_given_at_start(procs, scenario):
    # launch.run_tui reads the devices (a few ms) before it starts the app: they are in the app's first
    # frame, without waiting for the sampling thread. Here that thread is held, devices and all, so
    # anything on screen came from what the app was given.
    from gputop.core.config import Config
    from gputop.core.sampler import Sampler
    from gputop.tui.app import GputopApp

    worker = procs.sleeper("firstframe")
    config = Config(protect=())
    sampler = Sampler.open("simulated", str(scenario([{"pid": worker.pid, "gpu": 1, "memory": "4GiB"}])),
                           config)
    devices = sampler.sample_devices()
    gate = threading.Event()
    real_sample, real_devices = sampler.sample, sampler.sample_devices
    sampler.sample = lambda: (gate.wait(20), real_sample())[1]
    sampler.sample_devices = lambda: (gate.wait(20), real_devices())[1]
    app = GputopApp(sampler, config=config, interval=3600, devices=devices)
    try:
        async with app.run_test(size=(120, 40)):
            text = screen_text(app)  # the first frame: run_test returns once it is on screen
            assert text.count("Simulated H100") == 2, text
            assert "reading processes" in text
            assert str(worker.pid) not in text and "0 holder" not in text  # no tree that reads as data
            gate.set()
    finally:
        gate.set()


# ---- the frame drawn before Textual is imported (gputop.tui.first_frame) ------------------------------

def _dev(index, name="NVIDIA H200", **kw):
    from gputop.backends.base import DeviceSample

    return DeviceSample(index=index, name=name, memory_total=140 << 30, memory_used=1 << 30, util_gpu=35.0,
                        temperature=40.0, power_w=180.0, **kw)


def test_first_frame_lines_are_real_readings_and_safe_text():
    from gputop.tui.first_frame import frame_lines

    lines = frame_lines([_dev(0), _dev(1, name="evil\x1b[2Jname"), _dev(2, lost=True)], 80, 24)
    assert lines[0].strip() == "gputop"
    assert "GPU 0  NVIDIA H200  util 35%  mem 1.0GiB/140GiB  40°C  180W" in lines[1]
    assert "\x1b" not in "".join(lines) and "evil\\x1b[2Jname" in lines[2]
    assert lines[3].endswith("LOST") and "util" not in lines[3]  # no readings from a lost device
    assert all(len(line) <= 80 for line in lines)
    # As many devices as the app's device box holds (about half the screen), then how many more.
    many = frame_lines([_dev(i) for i in range(16)], 80, 24)
    assert len(many) == 1 + 7 + 1 and many[-1].strip() == "… 9 more GPU(s)"


def _pty(cols, rows):
    import fcntl
    import os
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return master, os.fdopen(slave, "w", encoding="utf-8")


def test_first_frame_draws_on_the_alternate_screen_only_where_the_app_fits(monkeypatch):
    import os

    from gputop.tui import first_frame

    monkeypatch.delenv("TEXTUAL_DRIVER", raising=False)
    master, out = _pty(120, 40)
    try:
        assert first_frame.draw([_dev(0)], out)
        written = os.read(master, 65536).decode()
        assert written.startswith(first_frame.ENTER) and "reading processes" in written
        assert "GPU 0  NVIDIA H200  util 35%" in written
        assert not first_frame.draw((), out) and not first_frame.draw(None, out)  # nothing real to show
    finally:
        out.close()
        os.close(master)
    master, out = _pty(50, 12)  # too small: the app shows its too-small message instead
    try:
        assert not first_frame.draw([_dev(0)], out)
    finally:
        out.close()
        os.close(master)


def test_run_tui_takes_the_first_frame_down_when_the_app_never_starts(monkeypatch, scenario):
    # If the app fails (or a signal stops it) before Textual takes the terminal over, the normal screen
    # comes back: nothing is left on the alternate screen.
    import argparse

    import gputop.tui.app
    from gputop.tui import first_frame, launch

    calls = []
    monkeypatch.setattr(launch, "require_terminal", lambda: None)
    monkeypatch.setattr(first_frame, "draw", lambda devices, **kw: calls.append(("draw", len(devices))) or True)
    monkeypatch.setattr(first_frame, "leave", lambda out=None: calls.append(("leave",)))

    class Broken:
        def __init__(self, *a, **kw):
            raise RuntimeError("no app today")

    monkeypatch.setattr(gputop.tui.app, "GputopApp", Broken)
    args = argparse.Namespace(scenario=str(scenario([], gpus=2)), backend="simulated", interval=None,
                              readonly=False, demo=False, config=None)
    import pytest

    with pytest.raises(RuntimeError, match="no app today"):
        launch.run_tui(args)
    assert calls == [("draw", 2), ("leave",)]


def test_after_a_first_frame_textual_skips_only_its_first_switch_to_the_alternate_screen(monkeypatch):
    # A second switch would save the cursor over the normal screen's (xterm saves on every switch): the
    # shell's prompt would come back in the wrong place. A resume after ctrl+z switches again, as usual.
    from textual.drivers.linux_driver import LinuxDriver

    from gputop.tui.app import ALT_SCREEN_ON, GputopApp

    written = []
    monkeypatch.setattr(LinuxDriver, "write", lambda self, data: written.append(data))

    class S:
        statuses = ()

    app = GputopApp(S(), first_frame=True)
    assert issubclass(app.driver_class, LinuxDriver) and not app.took_screen
    async def make():  # the driver wants the running loop
        return app.driver_class(app)

    import asyncio

    driver = asyncio.run(make())
    for data in (ALT_SCREEN_ON, "\x1b[?25l", "\x1b[?1049l", ALT_SCREEN_ON):
        driver.write(data)
    assert written == ["\x1b[?25l", "\x1b[?1049l", ALT_SCREEN_ON] and app.took_screen
    from gputop.tui.driver import QuietInputDriver

    # No first frame: Textual's LinuxDriver all the same, with the quieter input thread of gputop.tui.driver.
    assert GputopApp(S()).driver_class is QuietInputDriver and issubclass(QuietInputDriver, LinuxDriver)
