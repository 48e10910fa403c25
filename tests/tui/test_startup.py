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
    "prometheus_client", "gputop.actions", "gputop.guard", "gputop.auditlog", "gputop.rogue",
    "gputop.remote", "gputop.demo", "gputop.tui.help", "gputop.tui.plot_screen", "gputop.tui.details",
    "gputop.tui.dialogs.kill", "gputop.tui.dialogs.reap", "gputop.tui.dialogs.reset",
    "gputop.tui.dialogs.guard_toggle", "gputop.tui.too_small",
)

START = """
import json, sys
from gputop.cli import build_parser
argv = ["--interval", "1"]
build_parser(argv).parse_known_args(argv)  # what main() does before the TUI
import gputop.tui.launch, gputop.tui.app
from gputop.config import Config
from gputop.orphans import compile_protect
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
    commands = sorted(m for m in loaded if m.startswith("gputop.commands."))
    assert commands == [], f"subcommand modules imported for the TUI: {commands}"


def test_launch_reads_the_devices_before_the_app(monkeypatch):
    from gputop.tui import launch

    class Devs:
        def sample_devices(self):
            return ("d0", "d1")

    class Broken:
        def sample_devices(self):
            raise OSError("driver gone")

    assert launch._first_devices(Devs()) == ("d0", "d1")
    assert launch._first_devices(Broken()) is None  # the first full sample reports it


@run_async
async def test_first_frame_shows_the_devices_given_at_start(procs, scenario):
    # launch.run_tui reads the devices (a few ms) before it starts the app: they are in the app's first
    # frame, without waiting for the sampling thread. Here that thread is held, devices and all, so
    # anything on screen came from what the app was given.
    from gputop.config import Config
    from gputop.snapshot import Sampler
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
