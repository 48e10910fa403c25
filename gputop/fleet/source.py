"""A refresh of the fleet: the three queries, evaluated at one instant, turned into rows. When the server
is down or slow, the last rows are kept and the frame says so (stale, with the error)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gputop.fleet import queries
from gputop.fleet.client import Prometheus
from gputop.fleet.rows import STALE_AFTER, NodeRow, build_rows
from gputop.util.errors import GputopError

MAX_QUERIES = 5  # per refresh (issue 31); the fleet sends 3


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


@dataclass
class FleetSource:
    prom: Prometheus
    settings: queries.Settings = field(default_factory=queries.Settings)
    stale_after: float = STALE_AFTER
    last: Frame | None = None
    rules: str = "auto"  # "auto": read the recorded series when the server has them (asked once); "on", "off"
    recorded: bool | None = None  # whether this source reads the recording rules' series (None: not asked)

    def __post_init__(self):
        self._texts = queries.raw_queries(self.settings)
        self._pool = ThreadPoolExecutor(max_workers=len(self._texts), thread_name_prefix="fleet-query")
        if self.rules == "on" or (self.rules == "auto" and self.settings != queries.Settings()):
            self.recorded = self.rules == "on"  # the rules are made with the default settings

    def _use_rules(self) -> None:
        """Once: does the server record the fleet rules? Their series are cheap to read."""
        if self.recorded is None and self.rules == "auto":
            found = {s.get("metric", {}).get("rule") for s in self.prom.query(queries.probe_query())}
            self.recorded = set(queries.RECORDED) <= found
        if self.recorded:
            self._texts = queries.RECORDED

    def refresh(self) -> Frame:
        """Query once (the three queries in parallel, at one evaluation time). Never raises a GputopError:
        a failed refresh returns the last rows, marked stale, with the error."""
        t0 = time.monotonic()
        before = self.prom.queries
        at = time.time()
        try:
            self._use_rules()
            futures = [self._pool.submit(self.prom.query, q, at) for q in self._texts]
            results = [f.result() for f in futures]
        except GputopError as e:
            old = self.last
            frame = Frame(rows=old.rows if old else (), at=old.at if old else None,
                          queries=self.prom.queries - before, took=time.monotonic() - t0, error=e, stale=True)
            return frame
        rows = tuple(build_rows(*results, at=at, stale_after=self.stale_after))
        frame = Frame(rows=rows, at=at, queries=self.prom.queries - before, took=time.monotonic() - t0)
        self.last = frame
        return frame

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.prom.close()
