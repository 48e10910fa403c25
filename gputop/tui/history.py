"""A per-device history ring buffer (no Textual): utilisation and memory, fed once per snapshot."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice

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
        # index -> (util, mem) block characters of the same points, so that a pane's strips each second
        # are a join of characters, not a pass over Point objects.
        self._blocks: dict[int, tuple[deque[str], deque[str]]] = {}

    def add(self, snapshot: Snapshot) -> None:
        for d in snapshot.devices:
            mem = None
            if d.memory_used is not None and d.memory_total:
                mem = 100.0 * d.memory_used / d.memory_total
            util = None if d.lost else d.util_gpu
            if d.lost:
                mem = None
            self._series.setdefault(d.index, deque(maxlen=self.length)).append(Point(snapshot.at, util, mem))
            u, m = self._blocks.setdefault(d.index, (deque(maxlen=self.length), deque(maxlen=self.length)))
            u.append(block(util))
            m.append(block(mem))

    def strips(self, index: int, width: int) -> tuple[str, str]:
        """The utilisation and memory strips of the last ``width`` points (what ``strip`` draws)."""
        if width <= 0:
            return "", ""
        u, m = self._blocks.get(index, ((), ()))
        skip = max(0, len(u) - width)
        return ("".join(islice(u, skip, None)).rjust(width, " "), "".join(islice(m, skip, None)).rjust(width, " "))

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


def block(v: float | None) -> str:
    """One point of a strip on the fixed 0-100 scale; '?' when unknown."""
    return "?" if v is None else BLOCKS[max(0, min(8, round(v / 100 * 8)))]


def strip(values: list[float | None], width: int) -> str:
    """A fixed 0-100 scale strip, newest on the right; unknown samples are '?'. Cheap: no plotting."""
    vals = values[-width:] if width > 0 else []
    return "".join([block(v) for v in vals]).rjust(width, " ") if width > 0 else ""
