"""Errors raised at boundaries, each with a message a user can act on, and the exit codes."""

from __future__ import annotations

# Documented exit codes (README "Exit codes").
EXIT_OK = 0
EXIT_FAILURE = 1  # the action ran and failed (e.g. the process is still alive)
EXIT_USAGE = 2  # bad command line or bad input file (argparse uses 2 as well)
EXIT_NOT_FOUND = 3  # no such process / GPU
EXIT_PERMISSION = 4  # no permission
EXIT_REFUSED = 5  # refused by a safety rule (protected, identity changed, ...)
EXIT_UNAVAILABLE = 6  # a needed backend, library, tool or host is unavailable


class GputopError(Exception):
    """An error with a one-line, actionable message and an exit code."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(GputopError):
    exit_code = EXIT_USAGE


class NotFoundError(GputopError):
    exit_code = EXIT_NOT_FOUND


class PermissionDeniedError(GputopError):
    exit_code = EXIT_PERMISSION


class RefusedError(GputopError):
    exit_code = EXIT_REFUSED


class UnavailableError(GputopError):
    exit_code = EXIT_UNAVAILABLE


def type_name(v: object) -> str:
    """A YAML value described for an error message: a string ('x'), a mapping, nothing..."""
    if v is None:
        return "nothing"
    if isinstance(v, bool):
        return f"a boolean ({str(v).lower()})"
    if isinstance(v, (int, float)):
        return f"a number ({v})"
    if isinstance(v, str):
        return f"a string ({v!r})"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "a mapping"
    return type(v).__name__
