"""A refresh of the fleet: the three queries, evaluated at one instant, turned into rows. When the server
is down or slow, the last rows are kept and the frame says so (stale, with the error)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gputop.fleet import queries
from gputop.fleet.client import Prometheus
from gputop.fleet.rows import STALE_AFTER, NodeRow, build_rows
from gputop.util.errors import GputopError, UnavailableError

MAX_QUERIES = 5  # per refresh (issue 31): 1 with the recording rules, 3 without, 4 when it finds out
ASK_AGAIN = 30  # refreshes between asks for the recorded series while evaluating (--rules auto): rules loaded
# later, or evaluated again after a server restart, are read again within a minute at a 2 s refresh


@dataclass(frozen=True)
class Frame:
    rows: tuple[NodeRow, ...]
    at: float | None  # when the rows were queried (None: never)
    queries: int  # HTTP queries this refresh sent
    took: float  # seconds
    error: GputopError | None = None  # this refresh failed: rows are the last good ones
    stale: bool = False  # the rows are older than this refresh

    def to_dict(self, url: str, recorded: bool | None = None) -> dict:
        return {"prometheus": url, "recorded": bool(recorded), "at": self.at, "queries": self.queries, "took_s": round(self.took, 3),
                "stale": self.stale, "error": str(self.error) if self.error else None,
                "nodes": [r.to_dict() for r in self.rows]}


class RulesMissing(UnavailableError):
    """--rules on, and the server does not record the fleet's rules for these settings (exit 6)."""


@dataclass
class FleetSource:
    prom: Prometheus
    settings: queries.Settings = field(default_factory=queries.Settings)
    stale_after: float = STALE_AFTER
    last: Frame | None = None
    # "auto": read the recorded series while the server has them for these settings, else evaluate; "on":
    # only the recorded series (an error without them); "off": always evaluate the three queries
    rules: str = "auto"
    recorded: bool | None = None  # whether the last refresh read the recording rules' series (None: not asked)

    def __post_init__(self):
        self._evaluated = 0  # refreshes that evaluated the queries since the recorded series were last asked for
        self._raw = queries.raw_queries(self.settings)
        self._digest = queries.rules_digest(self.settings)
        self._pool = ThreadPoolExecutor(max_workers=len(self._raw), thread_name_prefix="fleet-query")
        if self.rules == "off":
            self.recorded = False

    def _answers(self, at: float) -> tuple[list[dict], list[dict], list[dict]]:
        """The three answers: from the recorded series (one query, whose mark says they are these queries')
        while the server has them, else the three queries evaluated in parallel; at most 4 queries."""
        if self.rules == "on" or (self.rules == "auto" and (self.recorded is not False
                                                            or self._evaluated >= ASK_AGAIN)):
            self._evaluated = 0
            split = queries.split_recorded(self.prom.query(queries.recorded_query(), at), self._digest)
            self.recorded = split is not None
            if split is not None:
                return split
            if self.rules == "on":
                raise RulesMissing(
                    f"Prometheus at {self.prom.url} does not record gputop's fleet rules for these settings "
                    f"({queries.MARK}{{queries=\"{self._digest}\"}} is missing): load the output of 'gputop "
                    "fleet --print-rules' with the same --hot and --window into its rule_files, or use --rules auto")
        self._evaluated += 1
        futures = [self._pool.submit(self.prom.query, q, at) for q in self._raw]
        return tuple(f.result() for f in futures)

    def refresh(self) -> Frame:
        """Query once, at one evaluation time. Never raises a GputopError: a failed refresh returns the
        last rows, marked stale, with the error."""
        t0 = time.monotonic()
        before = self.prom.queries
        at = time.time()
        try:
            answers = self._answers(at)
        except GputopError as e:
            old = self.last
            frame = Frame(rows=old.rows if old else (), at=old.at if old else None,
                          queries=self.prom.queries - before, took=time.monotonic() - t0, error=e, stale=True)
            return frame
        rows = tuple(build_rows(*answers, at=at, stale_after=self.stale_after))
        frame = Frame(rows=rows, at=at, queries=self.prom.queries - before, took=time.monotonic() - t0)
        self.last = frame
        return frame

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.prom.close()
