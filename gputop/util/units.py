"""Parsing and formatting of memory sizes and durations (shared by scenarios, config and policies)."""

from __future__ import annotations

import re

_MEM_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}
_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DUR_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DUR_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_memory(value: object) -> int:
    """Bytes from an int or a string such as ``8GiB``, ``8GB`` or ``512MiB``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a memory size, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"memory size must not be negative: {value!r}")
        return int(value)
    if isinstance(value, str):
        m = _MEM_RE.match(value)
        if m and m.group(2).lower() in _MEM_UNITS:
            return int(float(m.group(1)) * _MEM_UNITS[m.group(2).lower()])
    raise ValueError(f"bad memory size {value!r}: use bytes or a unit such as 8GiB, 8GB, 512MiB")


def parse_duration(value: object) -> float:
    """Seconds from a number or a string such as ``30s``, ``5m`` or ``2h``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"duration must not be negative: {value!r}")
        return float(value)
    if isinstance(value, str):
        m = _DUR_RE.match(value)
        if m:
            return float(m.group(1)) * _DUR_UNITS[m.group(2)]
    raise ValueError(f"bad duration {value!r}: use seconds or a unit such as 30s, 5m, 2h")


def fmt_bytes(n: int | None) -> str:
    """Human-readable binary size; None (unknown) is 'N/A', never 0."""
    if n is None:
        return "N/A"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(size)}B"
            return f"{size:.1f}{unit}" if size < 10 else f"{size:.0f}{unit}"
        size /= 1024
    return f"{size:.0f}TiB"  # pragma: no cover


def fmt_duration(seconds: float | None) -> str:
    """Compact runtime such as ``3:04``, ``2:03:04`` or ``3d02h``."""
    if seconds is None:
        return "N/A"
    s = int(max(0, seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}:{m:02d}:{s:02d}"
    return f"{m}:{s:02d}"


def fmt_opt(value: object, fmt: str = "{}", na: str = "N/A") -> str:
    """Format a possibly-unknown value; None is shown as N/A."""
    return na if value is None else fmt.format(value)


# The shortest interval any face samples or scans at (docs/tui.md "Intervals"): each sample reads every
# holder's /proc entries and NVML's process lists, which hold a driver lock; faster than this only loads
# the node.
MIN_INTERVAL = 0.1


def check_interval(seconds: float, option: str = "--interval") -> float:
    """``seconds`` when it is a finite number of at least MIN_INTERVAL; else ValueError with what to write."""
    import math

    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise ValueError(f"{option} must be a number of seconds, got {seconds!r}")
    if seconds < 0:
        raise ValueError(f"{option} must not be negative (got {seconds:g}); e.g. {option} 2")
    if seconds < MIN_INTERVAL:
        raise ValueError(f"{option} {seconds:g} is under the floor of {MIN_INTERVAL:g} s; e.g. {option} 2")
    return float(seconds)
