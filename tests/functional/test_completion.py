"""gputop completion: scripts generated from the real parser, valid for their shell."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import run_gputop


def test_bash_completion_knows_every_subcommand_and_is_valid_bash(tmp_path):
    r = run_gputop("completion", "bash")
    assert r.returncode == 0, r.stderr
    for word in ("status", "kill", "reap", "guard", "install-units", "completion", "--scenario"):
        assert word in r.stdout
    script = tmp_path / "gputop.bash"
    script.write_text(r.stdout)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # complete 'gputop gu' in a real bash
    probe = (f"source {script}; COMP_WORDS=(gputop gu); COMP_CWORD=1; COMP_LINE='gputop gu'; "
             "COMP_POINT=${#COMP_LINE}; _shtab_gputop; echo ${COMPREPLY[@]}")
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True)
    assert "guard" in out.stdout.split(), out.stdout + out.stderr


def test_zsh_completion(tmp_path):
    r = run_gputop("completion", "zsh")
    assert r.returncode == 0 and r.stdout.startswith("#compdef gputop")
    if shutil.which("zsh"):
        script = tmp_path / "_gputop"
        script.write_text(r.stdout)
        assert subprocess.run(["zsh", "-n", str(script)]).returncode == 0


@pytest.mark.parametrize("shell", ["fish", ""])
def test_unknown_shell_is_exit_2(shell):
    assert run_gputop("completion", shell).returncode == 2
