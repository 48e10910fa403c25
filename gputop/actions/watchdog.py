"""The watchdog: reap (or only log) orphan trees that stay orphaned, with the same root identity, past a grace.

It uses the same planner and executor as ``gputop reap --apply`` (``reap.orphan_trees`` and
``reap.reap_tree``, or the ``trees`` and ``reap`` a caller passes: a test's stand-ins), and counts a reap
as done only when every planned member has exited.
"""

from __future__ import annotations

import time
from typing import Callable

from gputop.actions.reap import orphan_trees, reap_tree
from gputop.core.config import Config


class Watchdog:
    """Reaps (or only logs) orphan trees that stay orphaned, with the same root identity, past ``grace``.

    ``scan(now)`` is one pass; ``run_watch`` loops it. A tree that is an orphan only briefly (a command
    that was finishing) is forgotten as soon as it is no longer seen, and never touched.
    """

    def __init__(self, sampler, *, apply: bool, grace: float, face: str = "cli", kill_grace: float = 5.0,
                 config: Config | None = None, reason: str = "watchdog", trees: Callable = orphan_trees,
                 reap: Callable = reap_tree):
        self.sampler = sampler
        self.trees, self.reap = trees, reap  # (snapshot[, config=]) -> [OrphanTree]; reap_tree's signature
        self.apply = apply
        self.grace = grace
        self.face = face
        self.kill_grace = kill_grace
        self.config = config or getattr(sampler, "config", None)
        self.reason = reason
        self.first_seen: dict[tuple[int, float], float] = {}
        self.reported: set[tuple[int, float]] = set()

    def scan(self, now: float) -> list[dict]:
        events: list[dict] = []
        snap = self.sampler.sample()
        trees = self.trees(snap, config=self.config, sampler=self.sampler)
        seen = {t.root.identity: t for t in trees}
        for key in list(self.first_seen):
            if key not in seen:
                del self.first_seen[key]
                self.reported.discard(key)
        for key, tree in seen.items():
            first = self.first_seen.setdefault(key, now)
            age = now - first
            if age <= self.grace:
                events.append({"event": "pending", "root": tree.pid, "age": age, "tree": tree})
                continue
            why = f"{self.reason}: orphaned for {age:.0f}s (grace {self.grace:g}s)"
            if not self.apply:
                if key in self.reported:
                    continue
                self.reported.add(key)
                res = self.reap(tree.pid, expected_start=tree.root.start_time, face=self.face,
                                grace=self.kill_grace, dry_run=True, sampler=self.sampler,
                                config=self.config, reason=why)
                events.append({"event": "would-reap", "root": tree.pid, "age": age, "tree": tree,
                               "result": res})
                continue
            res = self.reap(tree.pid, expected_start=tree.root.start_time, face=self.face,
                            grace=self.kill_grace, sampler=self.sampler, config=self.config, reason=why)
            if res.ok:
                del self.first_seen[key]
            events.append({"event": "reaped" if res.ok else "reap-failed", "root": tree.pid, "age": age,
                           "tree": tree, "result": res})
        return events


def run_watch(sampler, *, apply: bool, interval: float, grace: float, face: str = "cli",
              kill_grace: float = 5.0, config: Config | None = None,
              clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
              on_event: Callable[[dict], None] | None = None, iterations: int | None = None,
              stop: Callable[[], bool] | None = None, trees: Callable = orphan_trees,
              reap: Callable = reap_tree) -> Watchdog:
    """The watchdog loop: scan, report events, sleep ``interval``; until ``stop()`` or ``iterations``."""
    dog = Watchdog(sampler, apply=apply, grace=grace, face=face, kill_grace=kill_grace, config=config,
                   trees=trees, reap=reap)
    n = 0
    while True:
        for ev in dog.scan(clock()):
            if on_event:
                on_event(ev)
        n += 1
        if (iterations is not None and n >= iterations) or (stop is not None and stop()):
            return dog
        sleep(interval)

