"""A long-lived Sampler under process churn (issue 13): every cache keyed by a process (pid or identity)
is pruned when the process is gone, so its size follows the live holders, not the refresh count."""

from __future__ import annotations

import subprocess

from gputop.core.sampler import Sampler


def _sizes(s: Sampler) -> dict[str, int]:
    out = {"cpu": len(s._cpu_prev), "memo": len(s.verdicts.memos), "leaders": len(s._leaders),
           "job_refs": len(s._job_refs)}
    if s._static is not None:
        out.update(static=len(s._static._entries), static_last=len(s._static._last))
    if s._owners is not None:
        out["owners"] = len(s._owners._entries)
    return out


def test_caches_stay_bounded_by_the_live_holders_under_churn(scenario):
    from gputop.backends.simulated import SimulatedBackend

    live: list[subprocess.Popen] = []
    spawn = lambda: subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)  # noqa: E731
    try:
        live = [spawn() for _ in range(12)]
        path = scenario([{"pid": p.pid, "gpu": i % 2, "memory": "1GiB"} for i, p in enumerate(live)])
        s = Sampler([SimulatedBackend(path)], static_ttl=60)
        seen: set[int] = set()
        for r in range(15):
            snap = s.sample()
            assert {h.pid for h in snap.holders} == {p.pid for p in live}
            seen |= {p.pid for p in live}
            sizes = _sizes(s)
            # holders, plus their ancestors (this test's process and its own chain up to init)
            bound = len(live) + 16
            assert all(n <= bound for n in sizes.values()), (r, sizes)
            for i in (r % 12, (r + 5) % 12, (r + 9) % 12):  # three holders exit, three new ones start
                live[i].kill()
                live[i].wait()
                live[i] = spawn()
            scenario([{"pid": p.pid, "gpu": i % 2, "memory": "1GiB"} for i, p in enumerate(live)])
        assert len(seen) > bound + len(live)  # churn: more processes came and went than any cache may hold
    finally:
        for p in live:
            p.kill()
            p.wait()
