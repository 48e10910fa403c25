"""The CLI imports only the subcommand it runs (start-up time), and a wrong guess changes nothing."""

from __future__ import annotations

import subprocess
import sys

from gputop.commands.cli import _named_command, build_parser


def test_named_command_guess():
    assert _named_command(["status", "--json"]) == "status"
    assert _named_command(["--backend", "nvml", "kill", "--pid", "3"]) == "kill"
    assert _named_command(["--help", "status"]) is None  # top-level help lists every command
    assert _named_command(["--interval", "2"]) is None  # the TUI
    assert _named_command(None) is None


def test_status_does_not_import_other_subcommands():
    code = ("import sys; from gputop.commands.cli import build_parser; build_parser(['status', '--json']); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('gputop.commands.') and m != 'gputop.commands.cli')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["gputop.commands._common", "gputop.commands.status"]


def test_an_option_value_named_like_a_command_still_parses_the_real_one(tmp_path):
    # "kill" is the --scenario value here; the command is status. main() re-parses with every command.
    parser = build_parser(["--scenario", "kill", "status", "--json"])
    args, _ = parser.parse_known_args(["--scenario", "kill", "status", "--json"])
    assert args._lazy == "status"
    full = build_parser().parse_args(["--scenario", "kill", "status", "--json"])
    assert full.json and full.scenario == "kill" and full.command == "status"


def test_the_tui_command_line_imports_no_subcommand():
    code = ("import sys; from gputop.commands.cli import build_parser; a = build_parser(['--interval', '2']).parse_args(['--interval', '2']); "
            "print(a.interval, getattr(a, '_run', None), ' '.join(sorted(m for m in sys.modules if m.startswith('gputop.commands.') and m != 'gputop.commands.cli')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["2.0", "None"]


def test_a_subcommand_after_tui_options_still_runs(tmp_path):
    # "--interval 2 status": the guess (status) is right; an unknown word is still an error, as before.
    args = build_parser(["--interval", "2", "status"]).parse_args(["--interval", "2", "status"])
    assert args.command == "status" and callable(args._run)
    r = subprocess.run([sys.executable, "-m", "gputop", "--interval", "2", "nosuchcommand"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_a_status_run_imports_neither_typing_nor_subprocess(tmp_path):
    # Start-up of the one-shot command: typing (annotations come from collections.abc), and subprocess
    # (only a Slurm job's scontrol or a reset runs one) stay out of a sample with no Slurm job.
    scenario = tmp_path / "s.yaml"
    scenario.write_text("gpus: [{name: g, memory_total: 1GiB}]\nholders: []\n")
    code = ("import sys; from gputop.commands.cli import main; main(['status', '--json', '--scenario', %r]); "
            "sys.stderr.write(' '.join(m for m in ('typing', 'subprocess') if m in sys.modules))") % str(scenario)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stderr.strip() == ""
