"""Bounded regular expressions for patterns that come from other people (requests, policies, configs).

Python's ``re`` backtracks: ``(.*)*Q`` or ``(a+)+$`` against a few dozen characters runs for ever, and
on a shared node the text (a command line) is chosen by another user. Every user-supplied pattern is
compiled here with RE2 (``google-re2``), whose matching time is linear in the text, with a cap on the
pattern's length, on the memory RE2 may use for it, and on the length of the text searched.

RE2 has no backreferences (``\\1``) and no lookaround (``(?=...)``, ``(?<!...)``): such a pattern cannot be
bounded and is refused with a one-line reason (``PatternError``, a ValueError).
"""

from __future__ import annotations

from functools import lru_cache

MAX_PATTERN = 1024  # characters
MAX_TEXT = 65536  # characters searched per call (a command line is at most a few pages)
MAX_MEM = 8 << 20  # bytes RE2 may use for one compiled pattern


class PatternError(ValueError):
    """A pattern that is not a regular expression, or one that cannot be matched in bounded time."""


class BoundedPattern:
    """A compiled pattern whose ``search``/``match``/``fullmatch`` run in time linear in a capped text."""

    __slots__ = ("pattern", "ignore_case", "_re")

    def __init__(self, pattern: str, ignore_case: bool, compiled):
        self.pattern = pattern
        self.ignore_case = ignore_case
        self._re = compiled

    def search(self, text: str):
        return self._re.search(_cap(text))

    def match(self, text: str):
        return self._re.match(_cap(text))

    def fullmatch(self, text: str):
        return self._re.fullmatch(_cap(text))

    def __repr__(self) -> str:
        return f"BoundedPattern({self.pattern!r}{', ignore_case=True' if self.ignore_case else ''})"

    def __eq__(self, other) -> bool:
        return isinstance(other, BoundedPattern) and (other.pattern, other.ignore_case) == (
            self.pattern, self.ignore_case)

    def __hash__(self) -> int:
        return hash((self.pattern, self.ignore_case))


def _cap(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT]


def _why(e: Exception) -> str:
    msg = e.args[0] if e.args else str(e)
    if isinstance(msg, bytes):
        msg = msg.decode("utf-8", "replace")
    msg = str(msg)
    if "invalid escape sequence: \\" in msg and msg.rstrip()[-1:].isdigit():
        return f"{msg} (backreferences cannot be matched in bounded time)"
    if "invalid perl operator: (?" in msg and any(x in msg for x in ("(?=", "(?!", "(?<")):
        return f"{msg} (lookaround cannot be matched in bounded time)"
    if "pattern too large" in msg:
        return f"{msg} (it needs more than {MAX_MEM >> 20} MiB to match)"
    return msg


@lru_cache(maxsize=512)
def compile(pattern: str, ignore_case: bool = False) -> BoundedPattern:  # noqa: A001 - mirrors re.compile
    """Compile ``pattern`` for bounded matching. Raises PatternError with a one-line reason."""
    if not isinstance(pattern, str):
        raise PatternError(f"a pattern must be a string, got {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN:
        raise PatternError(f"pattern is {len(pattern)} characters long; at most {MAX_PATTERN} are allowed")
    import re2  # here, not at the top: ~25 ms that a plain 'gputop status' does not need

    opts = re2.Options()
    opts.max_mem = MAX_MEM
    opts.log_errors = False
    opts.case_sensitive = not ignore_case
    try:
        compiled = re2.compile(pattern, opts)
    except Exception as e:  # re2.error (its own class), or a TypeError for odd input
        raise PatternError(_why(e)) from None
    return BoundedPattern(pattern, ignore_case, compiled)
