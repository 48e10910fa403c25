"""``gputop`` with no subcommand: open the sampler (and the demo, with --demo) and run the app."""

from __future__ import annotations

import contextlib
import os

from gputop.config import load_config
from gputop.errors import UsageError
from gputop.snapshot import Sampler


def run_tui(args) -> int:
    config = load_config(getattr(args, "config", None))
    interval = getattr(args, "interval", None)
    if interval is not None and interval <= 0:
        raise UsageError(f"--interval must be above 0 seconds, got {interval}")
    stack = contextlib.ExitStack()
    with stack:
        demo = None
        scenario = getattr(args, "scenario", None)
        backend = getattr(args, "backend", None)
        if getattr(args, "demo", False):
            from gputop.demo import Demo

            demo = stack.enter_context(Demo())
            scenario, backend = str(demo.scenario_path), "simulated"
            # A sandbox: the demo's guard switch and audit log must not touch the node's real ones.
            os.environ.setdefault("GPUTOP_STATE_DIR", str(demo.dir / "state"))
        sampler = Sampler.open(backend, scenario, config)
        stack.callback(sampler.close)
        from gputop.tui.app import GputopApp  # imports Textual

        app = GputopApp(sampler, config=config, interval=interval, readonly=getattr(args, "readonly", False),
                        demo=demo)
        app.run()
        return int(app.return_code or 0)
