"""The command line: ``gputop`` (the TUI) and its subcommands. Textual is imported only for the TUI."""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import sys

from gputop import __version__
from gputop.backends import CHOICES
from gputop.commands import COMMANDS
from gputop.util.errors import GputopError

EPILOG = """\
exit codes:
  0 success   1 action failed (or output not written)   2 bad usage or input   3 not found
  4 permission denied   5 refused by a safety rule
  6 backend, tool, host or optional package unavailable (serve: gputop[serve], mcp: gputop[mcp])
    fleet: gputop[fleet]; a Prometheus that refuses the credentials is 4, one down or too slow is 6

environment:
  GPUTOP_BACKEND    auto|nvml|amd|intel|simulated (same as --backend)
  GPUTOP_SCENARIO   scenario file for the simulated backend (same as --scenario)
  GPUTOP_CONFIG     config file (default: <XDG config>/gputop/config.yaml)
  GPUTOP_STATE_DIR  state directory: audit log, guard state (default: <XDG state>/gputop)
  GPUTOP_AUDIT_LOG  audit log file (default: <state dir>/audit.jsonl, or the config key audit_log)
  GPUTOP_SYSTEM_CONFIG the node's config (default: /etc/gputop/config.yaml; merged under yours)
  GPUTOP_NODE_AUDIT_LOG the node audit trail (default: /var/log/gputop/audit.jsonl)
  GPUTOP_AUDIT_SOCKET   the node audit server's socket (default: /run/gputop/audit.sock)
  GPUTOP_PROC_ROOT  read processes and DRM fdinfo from this /proc (testing; default /proc)
  GPUTOP_SYS_ROOT   read DRM devices from this /sys (testing; default /sys)
  GPUTOP_RUN_ROOT   read logind's sessions (systemd/sessions/N) from this /run (testing; default /run)
  GPUTOP_REMOTE_CMD the gputop command on --remote/--hosts hosts (same as --remote-gputop)
  GPUTOP_SSH        the local ssh command (default: ssh)
  GPUTOP_PROMETHEUS_TOKEN    fleet: a bearer token for the Prometheus (or --token-file)
  GPUTOP_PROMETHEUS_PASSWORD fleet: the basic-auth password (or --password-file)
"""


# Optional packages and the extra that installs them (pyproject.toml [project.optional-dependencies]).
EXTRAS = {"prometheus_client": "serve", "starlette": "serve", "uvicorn": "serve", "mcp": "mcp",
          "prometheus_api_client": "fleet", "requests": "fleet"}


def missing_extra(command: str | None, e: ModuleNotFoundError) -> str | None:
    """The one-line message for a subcommand whose optional packages are not installed, or None."""
    root = (e.name or "").split(".")[0]
    if root not in EXTRAS:
        return None
    extra = "mcp" if command == "mcp" else EXTRAS[root]
    return (f"'gputop {command}' needs the optional packages of gputop[{extra}] ({root} is not installed): "
            f"pip install 'gputop[{extra}]' (or 'gputop[all]')")


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error that points to --help (exit 2), instead of the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def add_common(p: argparse.ArgumentParser, suppress: bool = False) -> None:
    """Options accepted both before and after the subcommand."""
    d = argparse.SUPPRESS if suppress else None
    p.add_argument("--backend", choices=CHOICES, default=d,
                   help="GPU backend (default: auto, or $GPUTOP_BACKEND)")
    p.add_argument("--scenario", metavar="FILE", default=d,
                   help="use the simulated backend with this scenario file ($GPUTOP_SCENARIO)")
    p.add_argument("--config", metavar="FILE", default=d, help="config file ($GPUTOP_CONFIG)")


def _named_command(argv: list[str] | None) -> str | None:
    """The subcommand this command line most likely runs; None when unsure (or for help)."""
    if argv is None:
        return None
    for a in argv:
        if a in COMMANDS:
            return a
        if a == "--" or a.startswith(("-h", "--h")):  # top-level help lists every command
            return None
    return None


def _tui_only(argv: list[str] | None) -> bool:
    """True when this command line names no subcommand and asks for no help: the TUI, which then needs
    none of the subcommands' modules (about a tenth of its start-up on a loaded machine)."""
    return argv is not None and not any(a in COMMANDS or a == "--" or a.startswith(("-h", "--h")) for a in argv)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser; given ``argv``, only the subcommand it names is imported (start-up time).

    Every other subcommand gets a placeholder that marks ``_lazy``: main() then builds the full parser
    and parses again, so a wrong guess costs time, never behaviour.
    """
    wanted = _named_command(argv)
    tui = _tui_only(argv)
    parser = Parser(
        prog="gputop",
        description="A top-like GPU process manager. With no subcommand, starts the full-screen TUI.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gputop {__version__}")
    add_common(parser)
    parser.add_argument("--interval", type=float, default=None, metavar="S",
                        help="TUI refresh interval in seconds (default 1)")
    parser.add_argument("--readonly", action="store_true", help="TUI: hide and disable every action")
    parser.add_argument("--demo", action="store_true",
                        help="start real demo processes on simulated GPUs and open the TUI on them")
    parser.add_argument("--remote", metavar="HOST",
                        help="run gputop (the TUI, or the subcommand that follows) on HOST through ssh")
    parser.add_argument("--remote-gputop", metavar="CMD",
                        help="the gputop command on the remote host (default: gputop, or $GPUTOP_REMOTE_CMD)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        if (wanted is not None and name != wanted) or tui:
            sp = sub.add_parser(name, add_help=False)
            sp.add_argument("_lazy_rest", nargs=argparse.REMAINDER)
            sp.set_defaults(_lazy=name)
            continue
        mod = importlib.import_module(f"gputop.commands.{name.replace('-', '_')}")
        sp = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        add_common(sp, suppress=True)
        mod.add_arguments(sp)
        sp.set_defaults(_run=mod.run)
    return parser


# One-shot commands that only read: nothing to audit, no thread, and every file they open closed before
# they return (the quick exit skips objects' __del__). The console script runs them with the cyclic
# garbage collector off (its passes: ~2% of the instructions of a ``status --json`` at 1,024 holders, for
# cycles that die with the process) and leaves through os._exit once the output is flushed and the atexit
# handlers have run (Python's teardown of every module and object: ~3% more).
QUICK = frozenset({"status"})


def entry() -> None:
    """The ``gputop`` console script and ``python -m gputop``."""
    sys.exit(main(quick=True))


def _quick_exit(rc: int) -> int:
    """Flush stdout and stderr, run the atexit handlers (as Python's exit does first), and os._exit(rc):
    what is skipped is the teardown of every module and object, and the final collection. Only when no
    other thread runs (the normal exit would wait for it). When a flush fails (a full disk, a closed
    pipe), return rc and let the normal exit run and report it, as it would have."""
    threading = sys.modules.get("threading")
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)  # CPython's; elsewhere, the normal exit
    if run_exitfuncs is None or (threading is not None and threading.active_count() > 1):
        return rc
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        run_exitfuncs()  # each handler once: CPython clears them after the run
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - the normal exit flushes again and reports it
        return rc
    os._exit(rc)


def main(argv: list[str] | None = None, *, quick: bool = False) -> int:
    """``quick``: the console script's fast path for QUICK commands (see QUICK); in-process callers
    leave it off."""
    argv = sys.argv[1:] if argv is None else list(argv)
    gc_off = quick and _named_command(argv) in QUICK and gc.isenabled()
    if gc_off:
        gc.disable()
    try:
        return _main(argv, gc_off)
    finally:
        if gc_off:
            gc.enable()


def _main(argv: list[str], quick: bool) -> int:
    try:
        # gputop.commands.remote is imported only when it can matter (start-up time).
        if any(a.partition("=")[0] in ("--remote", "--remote-gputop") for a in argv):
            from gputop.commands.remote import run_remote, split_remote_argv

            remote = split_remote_argv(argv)
            if remote is not None:  # everything else is for the gputop on that host
                return run_remote(remote)
    except GputopError as e:
        print(f"gputop: {e}", file=sys.stderr)
        return e.exit_code
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "_lazy", None):  # the guessed subcommand was not the one parsed
        parser = build_parser()
        args = parser.parse_args(argv)
    elif extra:  # what parse_args() says, pointing to the subcommand's help
        words = [getattr(args, k, None) for k in ("command", "guard_command")]
        prog = " ".join(["gputop"] + [w for w in words if w])
        print(f"{prog}: unrecognized arguments: {' '.join(extra)} (see '{prog} --help')", file=sys.stderr)
        return 2
    if isinstance(getattr(args, "interval", None), float):  # the TUI's (a float; a subcommand's is its own)
        from gputop.util.units import check_interval

        try:
            check_interval(args.interval)
        except ValueError as e:
            print(f"gputop: {e}", file=sys.stderr)
            return 2
    if quick and getattr(args, "command", None) not in QUICK:  # the guess was wrong: a normal run
        gc.enable()
        quick = False
    try:
        if getattr(args, "_run", None) is None:
            from gputop.tui.launch import run_tui  # imports Textual

            return run_tui(args)
        rc = int(args._run(args) or 0)
        return _quick_exit(rc) if quick else rc
    except GputopError as e:
        print(f"gputop: {e}", file=sys.stderr)
        return e.exit_code
    except ModuleNotFoundError as e:
        msg = missing_extra(getattr(args, "command", None), e)
        if msg is None:
            raise
        print(f"gputop: {msg}", file=sys.stderr)
        return 6
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    entry()
