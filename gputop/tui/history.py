"""A per-device history ring buffer (no Textual): utilisation and memory, fed once per snapshot."""

from __future__ import annotations

import math
from array import array
from collections import deque
from dataclasses import dataclass
from itertools import islice

from gputop.core.model import Snapshot

DEFAULT_LENGTH = 3600  # samples: an hour at the default 1 s refresh
MAX_STRIP = 1024  # the widest history strip drawn (a pane is narrower than the terminal)
_NONE = math.nan  # how an unknown value is stored


@dataclass(frozen=True, slots=True)
class Point:
    at: float
    util: float | None  # percent; None: unknown
    mem: float | None  # percent of total; None: unknown


def _value(v: float) -> float | None:
    return None if v != v else v  # NaN: unknown


class _Ring:
    """One device's samples in three arrays of doubles (24 bytes a sample, against about 200 for a deque of
    Point objects: an hour of 8 GPUs is 0.7 MiB, not 6), oldest first from ``start``."""

    __slots__ = ("length", "start", "at", "util", "mem")

    def __init__(self, length: int):
        self.length, self.start = length, 0
        self.at, self.util, self.mem = array("d"), array("d"), array("d")

    def __len__(self) -> int:
        return len(self.at)

    def append(self, at: float, util: float | None, mem: float | None) -> None:
        util = _NONE if util is None else util
        mem = _NONE if mem is None else mem
        if len(self.at) < self.length:
            self.at.append(at), self.util.append(util), self.mem.append(mem)
            return
        i = self.start
        self.at[i], self.util[i], self.mem[i] = at, util, mem
        self.start = (i + 1) % self.length

    def points(self, first: int = 0) -> list[Point]:
        """Samples ``first`` (0: the oldest) to the newest."""
        n, start = len(self.at), self.start
        out = []
        for k in range(max(0, first), n):
            i = (start + k) % n
            out.append(Point(self.at[i], _value(self.util[i]), _value(self.mem[i])))
        return out


class DeviceHistory:
    def __init__(self, length: int = DEFAULT_LENGTH):
        self.length = length
        self._series: dict[int, _Ring] = {}
        # index -> (util, mem) block characters of the newest points (no strip is wider than a terminal), so
        # that a pane's strips each second are a join of characters, not a pass over the samples.
        self._blocks: dict[int, tuple[deque[str], deque[str]]] = {}
        self._block_len = min(length, MAX_STRIP)

    def add(self, snapshot: Snapshot) -> None:
        for d in snapshot.devices:
            mem = None
            if d.memory_used is not None and d.memory_total:
                mem = 100.0 * d.memory_used / d.memory_total
            util = None if d.lost else d.util_gpu
            if d.lost:
                mem = None
            ring = self._series.get(d.index)
            if ring is None:
                ring = self._series[d.index] = _Ring(self.length)
            ring.append(snapshot.at, util, mem)
            u, m = self._blocks.setdefault(d.index, (deque(maxlen=self._block_len), deque(maxlen=self._block_len)))
            u.append(block(util))
            m.append(block(mem))

    def strips(self, index: int, width: int) -> tuple[str, str]:
        """The utilisation and memory strips of the last ``width`` points (what ``strip`` draws)."""
        if width <= 0:
            return "", ""
        u, m = self._blocks.get(index, ((), ()))
        return _tail(u, width), _tail(m, width)

    def series(self, index: int) -> list[Point]:
        s = self._series.get(index)
        return s.points() if s else []

    def last(self, index: int, n: int) -> list[Point]:
        s = self._series.get(index)
        if not s:
            return []
        return s.points(len(s) - n)


BLOCKS = " ▁▂▃▄▅▆▇█"


def block(v: float | None) -> str:
    """One point of a strip on the fixed 0-100 scale; '?' when unknown."""
    if v is None or v != v:  # NaN: unknown too
        return "?"
    return BLOCKS[round(min(max(v, 0.0), 100.0) / 100 * 8)]


def _tail(blocks, width: int) -> str:
    """The last ``width`` block characters, right-aligned in ``width`` cells."""
    skip = max(0, len(blocks) - width)
    return "".join(islice(blocks, skip, None)).rjust(width, " ")


def strip(values: list[float | None], width: int) -> str:
    """A fixed 0-100 scale strip, newest on the right; unknown samples are '?'. Cheap: no plotting.
    (DeviceHistory.strips draws the same from the blocks it keeps.)"""
    return _tail([block(v) for v in values[-width:]], width) if width > 0 else ""
