"""A per-device history ring buffer (no Textual): utilisation and memory, fed once per snapshot."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gputop.snapshot import Snapshot

DEFAULT_LENGTH = 3600  # samples: an hour at the default 1 s refresh


@dataclass(frozen=True)
class Point:
    at: float
    util: float | None  # percent; None: unknown
    mem: float | None  # percent of total; None: unknown


class DeviceHistory:
    def __init__(self, length: int = DEFAULT_LENGTH):
        self.length = length
        self._series: dict[int, deque[Point]] = {}

    def add(self, snapshot: Snapshot) -> None:
        for d in snapshot.devices:
            mem = None
            if d.memory_used is not None and d.memory_total:
                mem = 100.0 * d.memory_used / d.memory_total
            util = None if d.lost else d.util_gpu
            if d.lost:
                mem = None
            self._series.setdefault(d.index, deque(maxlen=self.length)).append(Point(snapshot.at, util, mem))

    def series(self, index: int) -> list[Point]:
        return list(self._series.get(index, ()))

    def last(self, index: int, n: int) -> list[Point]:
        s = self._series.get(index)
        if not s:
            return []
        if n >= len(s):
            return list(s)
        return [s[i] for i in range(len(s) - n, len(s))]


BLOCKS = " ▁▂▃▄▅▆▇█"


def strip(values: list[float | None], width: int) -> str:
    """A fixed 0-100 scale strip, newest on the right; unknown samples are '?'. Cheap: no plotting."""
    vals = values[-width:] if width > 0 else []
    out = []
    for v in vals:
        if v is None:
            out.append("?")
        else:
            out.append(BLOCKS[max(0, min(8, round(v / 100 * 8)))])
    return "".join(out).rjust(width, " ") if width > 0 else ""
