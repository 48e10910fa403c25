"""A `protect` pattern with a '/' would protect nothing (protect matches the process name and argv[0]'s
basename): it is refused at load with a one-line error naming protect_cmdline; the CLI exits 2 and a
running guard keeps its last valid config."""

from __future__ import annotations

import io

from gputop.core.config import load_config
from gputop.util.errors import EXIT_USAGE
from tests.conftest import run_gputop
from tests.functional.test_guard_daemon import KILL_VICTIMS


def test_the_cli_refuses_a_protect_path_with_exit_2_and_one_line(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("protect: [tmux, /opt/lab/bin/keep-me]\n")
    r = run_gputop("--config", str(cfg), "reap")
    assert r.returncode == EXIT_USAGE, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "/opt/lab/bin/keep-me" in lines[0] and "protect_cmdline" in lines[0], r.stderr


def _guard_reloading(scenario, tmp_path, new_config: str):
    """A guard started with ``protect: [keep-me]`` whose config file then says ``new_config``, reloaded."""
    from gputop.guard.daemon import GuardDaemon
    from tests.functional.guard_helpers import Clock, sampler_for

    cfg = tmp_path / "config.yaml"
    cfg.write_text("protect: [keep-me]\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(KILL_VICTIMS)
    path = scenario(holders=[], gpus=1)
    d = GuardDaemon(sampler_for(path, Clock()), str(policy), config=load_config(str(cfg)), interval=0.1,
                    out=io.StringIO(), config_loader=lambda: load_config(str(cfg)))
    cfg.write_text(new_config)
    d.reload()
    return d


def test_a_running_guard_keeps_its_last_valid_config(scenario, tmp_path):
    d = _guard_reloading(scenario, tmp_path, "protect: [keep-me, /usr/local/bin/keep-me]\n")
    assert d.config.protect == ("keep-me",) and d.engine.config.protect == ("keep-me",)
    assert "protect_cmdline" in d.last_error and "keeping the last valid config" in d.last_error


def test_a_good_config_reload_reaches_the_guards_sampler(scenario, tmp_path):
    # the snapshots the guard's rules see are classified with the reloaded protect patterns, not the start-up ones
    d = _guard_reloading(scenario, tmp_path, "protect: [keep-me, keep-this-too]\n")
    assert d.sampler.config is d.config and d.sampler.config.protect == ("keep-me", "keep-this-too")
