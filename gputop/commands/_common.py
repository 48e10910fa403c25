"""Helpers shared by subcommands."""

from __future__ import annotations

import json
import os
import sys

from gputop.util.errors import GputopError
from gputop.util.textsafe import visible

TYPE_CHECKING = False  # typing is not imported at run time (start-up of a one-shot command)
if TYPE_CHECKING:  # imported where used: print_json and table do not need the sampler (~70 ms of CPU)
    from gputop.core.config import Config
    from gputop.core.sampler import Sampler


def config_from(args) -> Config:
    from gputop.core.config import load_config

    return load_config(getattr(args, "config", None))


def open_sampler(args, config: Config | None = None, **kw) -> Sampler:
    """``kw``: Sampler options (``memo=False`` for a command that samples once)."""
    from gputop.core.sampler import Sampler

    return Sampler.open(getattr(args, "backend", None), getattr(args, "scenario", None),
                        config or config_from(args), **kw)


def to_terminal() -> bool:
    """Whether stdout is a terminal (a person reading) rather than a pipe or a file (a script)."""
    return sys.stdout.isatty()


def write_stdout(text: str) -> None:
    """``text`` on stdout, flushed. A write that fails (a full disk, a quota, an I/O error) is a one-line
    error (exit 1), and stdout is pointed at /dev/null so that Python's exit does not fail again on what is
    left in its buffer. A closed pipe stays BrokenPipeError, which main() ends with 0 (``| head``)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):  # no file descriptor behind it (an in-process caller)
            pass
        raise GputopError(f"cannot write the output: {e.strerror or e} (free some space, or write it "
                          "elsewhere)") from None


def print_json(obj, compact: bool | None = False) -> None:
    """``obj`` as JSON on stdout, indented; ``compact=None``: compact unless stdout is a terminal (a pipe
    gets one line from the C encoder; indenting drops to the pure-Python encoder, ~3x the time)."""
    if compact is None:
        compact = not to_terminal()
    # One write: json.dump() to a text stream writes each token separately (tens of thousands of calls
    # for a node with 128 holders, ~30 ms).
    if compact:
        write_stdout(json.dumps(obj, separators=(",", ":"), default=str) + "\n")
    else:
        write_stdout(json.dumps(obj, indent=2, default=str) + "\n")


def fit_last(rows: list[list[str]], headers: list[str]) -> list[list[str]]:
    """On a terminal, cut the last column (a command, a message) so that rows fit its width; piped or
    redirected, keep it whole (a script or a file wants all of it)."""
    if not to_terminal():
        return rows
    import shutil

    width = shutil.get_terminal_size().columns  # $COLUMNS first, then the terminal
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers[:-1])]
    room = max(20, width - sum(widths) - 2 * len(widths))
    return [r[:-1] + [r[-1] if len(r[-1]) <= room else r[-1][: room - 1] + "…"] for r in rows]


def table(rows: list[list[str]], headers: list[str], right: set[int] = frozenset()) -> str:
    """A plain aligned text table (no colour, so it pipes cleanly). Cells often hold what a process chose
    (name, command line, user), so control characters in them are made visible."""
    rows = [[visible(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    def fmt(r):
        cells = [(c.rjust(widths[i]) if i in right else c.ljust(widths[i])) for i, c in enumerate(r)]
        return "  ".join(cells).rstrip()
    return "\n".join([fmt(headers)] + [fmt(r) for r in rows])
