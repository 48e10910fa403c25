"""Time windows (hours on weekdays) as the guard policy and the rogue audit write them in YAML.

``{hours: "22:00-06:00", weekdays: mon-fri}``: a leaf helper, so that both the guard (``guard.policy``) and
the rogue audit (``core.rogue``) read them with one parser.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass

from gputop.util.errors import type_name as _type_name

WINDOW_KEYS = ("hours", "weekdays")
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True)
class TimeWindow:
    """Hours ``[start, end)`` (wrapping midnight when end <= start) on the given weekdays (0 = Monday)."""

    start_min: int | None = None  # minutes after midnight; None: any hour
    end_min: int | None = None
    weekdays: tuple[int, ...] | None = None  # None: any day
    text: str = ""

    def contains(self, when: _dt.datetime) -> bool:
        minute = when.hour * 60 + when.minute
        day = when.weekday()
        if self.start_min is not None and self.end_min is not None:
            if self.start_min < self.end_min:
                in_hours = self.start_min <= minute < self.end_min
            else:  # wraps midnight: the window belongs to the day it started on
                in_hours = minute >= self.start_min or minute < self.end_min
                if minute < self.end_min and self.start_min != self.end_min:
                    day = (day - 1) % 7
        else:
            in_hours = True
        return in_hours and (self.weekdays is None or day in self.weekdays)


def _parse_hhmm(v: object) -> int:
    if isinstance(v, bool):
        raise ValueError
    if isinstance(v, int) and 0 <= v <= 24:
        return v * 60
    if isinstance(v, str):
        m = re.fullmatch(r"\s*(\d{1,2})(?::(\d{2}))?\s*", v)
        if m:
            h, mi = int(m.group(1)), int(m.group(2) or 0)
            if 0 <= h <= 24 and 0 <= mi < 60 and h * 60 + mi <= 24 * 60:
                return h * 60 + mi
    raise ValueError


def parse_window(value: object, what: str = "time_window") -> TimeWindow:
    """``{hours: "22:00-06:00", weekdays: [mon, tue] | "mon-fri"}``; either key may be left out."""
    if not isinstance(value, dict):
        raise ValueError(f"{what} value must be a mapping with 'hours' and/or 'weekdays', "
                         f"e.g. {{hours: '08:00-18:00', weekdays: mon-fri}}; got {_type_name(value)}")
    unknown = [k for k in value if k not in WINDOW_KEYS]
    if unknown:
        raise ValueError(f"unknown key '{unknown[0]}' in {what}: use hours, weekdays")
    if not value:
        raise ValueError(f"{what} needs 'hours' and/or 'weekdays'")
    start = end = None
    hours = value.get("hours")
    if hours is not None:
        parts = None
        if isinstance(hours, str) and "-" in hours:
            parts = hours.split("-", 1)
        elif isinstance(hours, list) and len(hours) == 2:
            parts = hours
        try:
            if parts is None:
                raise ValueError
            start, end = _parse_hhmm(parts[0]), _parse_hhmm(parts[1])
        except ValueError:
            raise ValueError(f"bad hours {hours!r} in {what}: use 'HH:MM-HH:MM' (e.g. '22:00-06:00') "
                             "or [start, end]") from None
        if start == end:
            raise ValueError(f"bad hours {hours!r} in {what}: start and end are the same")
    days = None
    wd = value.get("weekdays")
    if wd is not None:
        items = wd if isinstance(wd, list) else [wd]
        out: list[int] = []
        for item in items:
            text = str(item).strip().lower()
            rng = text.split("-") if "-" in text else [text, text]
            try:
                a, b = (_day(x) for x in rng)
            except ValueError:
                raise ValueError(f"bad weekday {item!r} in {what}: use mon..sun or a range like mon-fri") from None
            i = a
            while True:
                out.append(i)
                if i == b:
                    break
                i = (i + 1) % 7
        days = tuple(sorted(set(out)))
    return TimeWindow(start, end, days, text=str({k: value[k] for k in value}))


_DAY_NAMES = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def _day(text: str) -> int:
    text = text.strip()
    for i, full in enumerate(_DAY_NAMES):
        if len(text) >= 3 and full.startswith(text):
            return i
    raise ValueError(text)
