"""gputop install-units: write the systemd units (guard, metrics) with the right ExecStart."""

from __future__ import annotations

import sys
from pathlib import Path

from gputop.util.errors import GputopError, PermissionDeniedError

NAME = "install-units"
HELP = "write the systemd units (gputop-guard, gputop-serve) for this gputop"
DESCRIPTION = """Write gputop-guard.service (the hardened root guard daemon and node audit trail) and
gputop-serve.service (Prometheus metrics only) into /etc/systemd/system, or --prefix DIR, with ExecStart
set to the gputop that runs this command (a venv or pipx install works). Prints each file it wrote and
what to run next. --print shows the units instead of writing them."""


def add_arguments(p) -> None:
    p.add_argument("--prefix", metavar="DIR", help="directory to write into (default /etc/systemd/system)")
    p.add_argument("--print", dest="print_only", action="store_true", help="print the units, write nothing")


def run(args) -> int:
    from gputop.commands import node_units

    if args.print_only:
        for name in node_units.UNITS:
            print(f"# ---- {name}\n{node_units.render(name)}")
        return 0
    prefix = Path(args.prefix) if args.prefix else node_units.DEFAULT_PREFIX
    try:
        written = node_units.install(prefix)
    except PermissionError as e:
        raise PermissionDeniedError(f"cannot write {e.filename or prefix}: run as root, or use --prefix DIR") from None
    except OSError as e:  # e.g. a directory where a unit file should be
        raise GputopError(f"cannot write the units in {prefix}: {e.strerror or e}"
                          f"{f' ({e.filename})' if e.filename else ''}; fix or remove that path") from None
    for path, what in written:
        print(f"{what}: {path}  (ExecStart {node_units.gputop_exe()})")
    if not args.prefix:
        print("next: sudo systemctl daemon-reload && sudo systemctl enable --now gputop-guard "
              "[gputop-serve]", file=sys.stderr)
    return 0
