"""StaticCache: what a long-lived Sampler reuses between refreshes, on real processes."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

from gputop.core.procs import StaticCache, read_proc
from gputop.core.sampler import Sampler
from tests.conftest import wait_comm


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _comparable(p):
    d = {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}  # ProcInfo has slots, no vars()
    for volatile in ("cpu_time", "rss", "state"):
        d.pop(volatile)
    return d


def test_cached_read_matches_a_full_read_for_every_process(procs):
    for i in range(12):  # a container or PID namespace may hold only a handful of processes
        procs.sleeper(f"gt-cache-{i}")
    cache = StaticCache(ttl=60)
    pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    checked = 0
    for pid in pids:
        full = read_proc(pid)
        first = read_proc(pid, static=cache)
        again = read_proc(pid, static=cache)  # from the cache
        after = read_proc(pid)
        if full is None or first is None or again is None or after is None:
            continue  # exited meanwhile
        if _comparable(after) != _comparable(full):
            continue  # it changed meanwhile (an exec, a rename): nothing to compare against
        assert _comparable(first) == _comparable(full), pid
        assert _comparable(again) == _comparable(full), pid
        checked += 1
    assert checked > 10


def test_sighup_mark_comes_from_stat_and_matches_status(procs):
    plain = procs.spawn(["sleep", "60"])
    nohup = procs.spawn(["nohup", "sleep", "60"])
    deadline = time.time() + 5
    while time.time() < deadline and (read_proc(nohup.pid) or read_proc(plain.pid)).name != "sleep":
        time.sleep(0.02)
    for p, expected in ((plain, False), (nohup, True)):
        with open(f"/proc/{p.pid}/status") as f:
            sigign = next(line for line in f if line.startswith("SigIgn:")).split()[1]
        assert bool(int(sigign, 16) & 1) is expected
        assert read_proc(p.pid).sighup_ignored is expected
        assert read_proc(p.pid, static=StaticCache()).sighup_ignored is expected


def _cpu_ticks(pid: int) -> int:
    """utime + stime from /proc/PID/stat, read here (not by the code under test)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_idle_process_is_reused_and_a_busy_one_reparsed(procs):
    idle = procs.spawn(["sleep", "60"])
    busy = procs.spawn(["sh", "-c", "while :; do :; done"])
    time.sleep(0.1)
    cache = StaticCache(ttl=60)
    a, b = read_proc(idle.pid, static=cache), read_proc(busy.pid, static=cache)
    time.sleep(0.1)
    # until the busy one has really run (a loaded machine may not give it a tick in 0.1 s): its own stat line
    ticks = _cpu_ticks(busy.pid)
    deadline = time.monotonic() + 30
    while _cpu_ticks(busy.pid) == ticks and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_proc(idle.pid, static=cache) is a  # byte-identical stat line: the same ProcInfo
    b2 = read_proc(busy.pid, static=cache)
    assert b2 is not b and b2.cpu_time > b.cpu_time  # CPU time moved: read fresh


def _exec_and_wait(p, first_arg: str) -> None:
    p.stdin.write(b"go\n")
    p.stdin.flush()
    deadline = time.time() + 5
    while read_proc(p.pid).cmdline[:3] != first_arg:
        assert time.time() < deadline
        time.sleep(0.02)


def test_command_line_is_reread_after_ttl_and_identity_change_is_never_cached(procs):
    clock = FakeClock()
    cache = StaticCache(ttl=5, clock=clock)
    # The same PID, start time and name (sh) before and after exec: only the command line changes.
    p = procs.spawn(["sh", "-c", "read x; exec sh -c 'sleep 60; :'"], stdin=-1)
    assert wait_comm(p.pid, "sh", proc=p)  # exec'd (under load the first read could see the fork's argv)
    first = read_proc(p.pid, static=cache)
    assert first.cmdline[:2] == ("sh", "-c") and first.name == "sh"
    _exec_and_wait(p, ("sh", "-c", "sleep 60; :"))
    clock.t += 4.9
    assert read_proc(p.pid, static=cache).cmdline == first.cmdline  # within the ttl: cached
    clock.t += 0.2
    fresh = read_proc(p.pid, static=cache)
    assert fresh.cmdline == ("sh", "-c", "sleep 60; :") and fresh.start_time == first.start_time


def test_an_exec_that_changes_the_name_rereads_the_command_line_at_once(procs):
    """A new name under the same identity is an exec: its command line is new too, whatever the ttl (a
    process must not keep an old argv that, say, a protect pattern or the disguise test reads)."""
    clock = FakeClock()
    cache = StaticCache(ttl=5, clock=clock)
    p = procs.spawn(["sh", "-c", "read x; exec sleep 60"], stdin=-1)
    assert wait_comm(p.pid, "sh", proc=p)
    first = read_proc(p.pid, static=cache)
    assert first.cmdline[:2] == ("sh", "-c")
    _exec_and_wait(p, ("sleep", "60"))
    fresh = read_proc(p.pid, static=cache)  # no time passed
    assert fresh.name == "sleep" and fresh.cmdline == ("sleep", "60") and fresh.start_time == first.start_time


def test_prune_forgets_processes_not_seen(procs):
    p = procs.spawn(["sleep", "60"])
    cache = StaticCache(ttl=60)
    read_proc(p.pid, static=cache)
    cache.prune()
    assert len(cache) == 1  # seen since the last prune
    cache.prune()
    assert len(cache) == 0  # not looked at in the last round


def test_sampler_keeps_verdicts_with_and_without_the_cache(procs, scenario):
    job = procs.orphan("sleep 61", "sleep 61")
    mine = procs.spawn(["sleep", "62"])
    path = scenario([{"pid": job, "gpu": 0, "memory": "1GiB"}, {"pid": mine.pid, "gpu": 1, "memory": "1GiB"}])
    from gputop.backends.simulated import SimulatedBackend

    warm = Sampler([SimulatedBackend(path)])
    cold = Sampler([SimulatedBackend(path)], static_ttl=0)
    for _ in range(3):
        w, c = warm.sample(), cold.sample()
        assert [(h.pid, h.verdict, h.user, h.cmd, [x.pid for x in h.chain]) for h in w.holders] == \
               [(h.pid, h.verdict, h.user, h.cmd, [x.pid for x in h.chain]) for h in c.holders]
        assert {h.pid: h.verdict.kind for h in w.holders} == {job: "orphan", mine.pid: "not-orphan"}
    os.kill(job, signal.SIGKILL)


def test_a_holders_chain_is_its_ancestors_up_to_init(procs, scenario):
    # The sampler reuses the chain the orphan rule walked; it must equal a plain walk up to init.
    from gputop.backends.simulated import SimulatedBackend
    from gputop.core.procs import ProcTable

    job = procs.orphan("sleep 63", "sleep 63")
    mine = procs.spawn(["sleep", "64"])
    assert wait_comm(mine.pid, "sleep", proc=mine)  # exec'd: a holder read mid-exec is not the one pinned
    path = scenario([{"pid": job, "gpu": 0, "memory": "1GiB"}, {"pid": mine.pid, "gpu": 1, "memory": "1GiB"},
                     {"pid": 1, "gpu": 1, "memory": "1GiB"}])
    snap = Sampler([SimulatedBackend(path)]).sample()
    table = ProcTable()
    assert len(snap.holders) == 3
    for h in snap.holders:
        want = [p.pid for p in table.ancestors(h.pid)]
        assert [p.pid for p in h.chain] == want, h.pid
        assert h.pid == 1 or want  # PID 1 has no ancestors; everything else has some
    os.kill(job, signal.SIGKILL)


def test_scan_all_finds_the_same_children_as_full_reads(procs):
    from gputop.core.procs import ProcTable

    parent = procs.spawn(["sh", "-c", "sleep 60 & sleep 60 & wait"])
    deadline = time.time() + 5
    table = ProcTable()
    while True:  # until both children have forked and exec'd sleep
        table = ProcTable()
        kids = table.children(parent.pid)
        members = table.descendants(parent.pid)
        # exec sets the name a moment before the new command line is readable: wait for both
        if len(kids) == 2 and all(m.name == "sleep" and m.cmdline == ("sleep", "60") for m in members) \
                or time.time() > deadline:
            break
        time.sleep(0.02)
    assert len(kids) == 2
    assert sorted(m.pid for m in members) == sorted(kids)
    assert all(m.cmdline == ("sleep", "60") and m.ppid == parent.pid for m in members)  # full reads
    # Only the processes asked for were read in full; the rest of the host is stat lines.
    assert 1 not in table._cache and 1 in table._scan_stat
    assert table.get(1) is not None and table.get(1).pid == 1 and 1 not in table._scan_stat


def test_a_scanned_stat_line_for_a_reused_pid_is_not_mixed_with_the_new_process(procs):
    """The reap path scans stat lines first and reads command lines later. If the PID was reused in
    between, the record must be dropped, not built from the old stat line and the new cmdline/owner."""
    from gputop.core.procs import _read_linux

    p = procs.sleeper("newproc")
    with open(f"/proc/{p.pid}/stat", "rb") as f:
        real = f.read()
    head, _, tail = real.rpartition(b") ")
    fields = tail.split(b" ")
    fields[19] = str(int(fields[19]) - 500).encode()  # the "old" process started 5 s earlier
    old_line = head + b") " + b" ".join(fields)
    assert _read_linux(p.pid, "/proc", None, stat=old_line) is None
    same = _read_linux(p.pid, "/proc", None, stat=real)
    assert same is not None and same.name == "newproc"
    assert _read_linux(p.pid, "/proc").cmdline == same.cmdline


def test_a_process_seen_for_the_first_time_has_its_stat_read_once(procs, monkeypatch):
    # The first sample (the TUI's first frame, every 'status') used to read each stat line twice: by path,
    # then again through the pinned directory on the certain cache miss.
    import gputop.core.procs as procs_mod

    p = procs.sleeper("gt-once")
    reads = []
    real = procs_mod._read

    def counting(path, dir_fd=None, *more):
        reads.append(path)
        return real(path, dir_fd, *more)

    monkeypatch.setattr(procs_mod, "_read", counting)
    cache = StaticCache(ttl=60)
    first = read_proc(p.pid, static=cache)
    assert first is not None and "gt-once" in " ".join(first.cmdline)
    assert sum(1 for r in reads if r.endswith("stat")) == 1, reads
    reads.clear()
    again = read_proc(p.pid, static=cache)  # known now: only the stat line, by path
    assert again is not None and again.cmdline == first.cmdline
    assert [r for r in reads if not r.endswith("stat")] == [] and len(reads) == 1, reads


def test_a_gone_pid_is_checked_once_per_table(procs, monkeypatch):
    # Every holder of an orphan tree asks about the same gone session leader; one check per refresh.
    import gputop.core.procs as procs_mod

    p = procs.sleeper("gt-gone")
    p.kill()
    p.wait()
    calls = []
    real = procs_mod.visibility
    monkeypatch.setattr(procs_mod, "visibility", lambda pid, root="/proc", **kw: calls.append(pid) or real(pid, root, **kw))
    table = procs_mod.ProcTable()
    assert [table.hidden(p.pid) for _ in range(5)] == [False] * 5
    assert calls == [p.pid]


def _stat_fds_open() -> dict[int, str]:
    """This process's open fds that name a /proc/<pid>/stat file: fd -> target."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("/proc/") and target.endswith("/stat"):
            out[int(name)] = target
    return out


def _tables(cache, pid, n):
    from gputop.core.procs import ProcTable

    out = []
    for _ in range(n):  # one table a refresh, as the Sampler makes them
        out.append(ProcTable(static=cache).get(pid))
        cache.prune()
    return out


def test_a_known_process_is_reread_through_its_kept_stat_fd(procs):
    p = procs.sleeper("gt-keptfd")
    cache = StaticCache(ttl=60)
    first, second = _tables(cache, p.pid, 2)
    assert first is not None and second is not None and second.name == "gt-keptfd"
    fd = cache._fds[p.pid]
    assert _stat_fds_open()[fd] == f"/proc/{p.pid}/stat"
    os.kill(p.pid, signal.SIGSTOP)
    try:
        deadline = time.time() + 5
        while (now := _tables(cache, p.pid, 1)[0]).state != "T" and time.time() < deadline:
            time.sleep(0.01)
        assert now.state == "T" and now.start_time == first.start_time  # fresh bytes, the same fd
        assert cache._fds[p.pid] == fd
    finally:
        os.kill(p.pid, signal.SIGCONT)
    p.kill()
    p.wait()  # reaped: the fd's process is gone, and nothing else has the PID
    assert _tables(cache, p.pid, 1) == [None]
    assert p.pid not in cache._fds and fd not in _stat_fds_open()


def test_a_kept_fd_of_a_gone_process_never_answers_for_the_pid_of_a_live_one(procs):
    # As after PID reuse: the fd kept for a PID is bound to a process that is gone, while the PID now
    # names another (live) process. The fd answers ESRCH; the live process is read by path, not taken
    # for gone.
    dead = procs.sleeper("gt-dead")
    live = procs.sleeper("gt-live")
    cache = StaticCache(ttl=60)
    _tables(cache, live.pid, 2)
    stale = os.open(f"/proc/{dead.pid}/stat", os.O_RDONLY)
    dead.kill()
    dead.wait()
    os.close(cache._fds[live.pid])
    cache._fds[live.pid] = stale
    info = _tables(cache, live.pid, 1)[0]
    assert info is not None and info.name == "gt-live" and info.pid == live.pid
    assert stale not in _stat_fds_open() or cache._fds[live.pid] != stale
    assert _stat_fds_open()[cache._fds[live.pid]] == f"/proc/{live.pid}/stat"


def test_prune_closes_the_stat_fds_of_processes_no_longer_asked_for(procs):
    a, b = procs.sleeper("gt-prune-a"), procs.sleeper("gt-prune-b")
    cache = StaticCache(ttl=60)
    from gputop.core.procs import ProcTable

    for _ in range(2):
        t = ProcTable(static=cache)
        t.get(a.pid), t.get(b.pid)
        cache.prune()
    fa, fb = cache._fds[a.pid], cache._fds[b.pid]
    _tables(cache, a.pid, 1)  # b not asked for: forgotten, its fd closed
    assert cache._fds == {a.pid: fa} and fb not in _stat_fds_open()
    cache.close()
    assert cache._fds == {} and fa not in _stat_fds_open()
    assert _tables(cache, a.pid, 2)[1].name == "gt-prune-a"  # still works, reopening


def test_kept_stat_fds_stay_within_one_budget_for_every_cache(procs):
    import gc
    import resource

    from gputop.core.procs import _KEPT, ProcTable, _stat_fd_budget

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert 0 < _stat_fd_budget() <= max(1, soft // 2)
    gc.collect()  # other tests' caches, closed by their finalizers
    ps = [procs.sleeper(f"gt-budget-{i}") for i in range(4)]
    caches = [StaticCache(ttl=60), StaticCache(ttl=60)]  # two samplers in one process share the budget
    for c in caches:
        c.fd_budget = len(_KEPT) + 3
    for _ in range(3):
        for cache in caches:
            t = ProcTable(static=cache)
            infos = [t.get(p.pid) for p in ps]
            cache.prune()
            assert [i.name for i in infos] == [f"gt-budget-{i}" for i in range(4)]
    assert [len(c._fds) for c in caches] == [3, 0]
    caches[0].close()
    _tables(caches[1], ps[0].pid, 2)
    assert len(caches[1]._fds) == 1  # the budget freed by the first cache


def test_a_sampler_closes_its_kept_stat_fds(procs, scenario):
    from gputop.backends.simulated import SimulatedBackend

    held = procs.sleeper("gt-held")
    path = scenario([{"pid": held.pid, "gpu": 0, "memory": "1GiB"}])
    before = set(_stat_fds_open().values())
    s = Sampler([SimulatedBackend(path)])
    for _ in range(2):
        assert [h.name for h in s.sample().holders] == ["gt-held"]
    assert f"/proc/{held.pid}/stat" in set(_stat_fds_open().values()) - before
    s.close()
    assert set(_stat_fds_open().values()) <= before


def test_owners_come_from_the_cgroup_read_with_the_command_line(procs, scenario, monkeypatch):
    # A sampler reads each process's cgroup through its pinned /proc dir when it reads the command line
    # (first sight, then every static_ttl), not again by path with a start-time check after.
    import gputop.core.ownership as ownership
    import gputop.core.sampler as sampler_mod
    from gputop.backends.simulated import SimulatedBackend

    job = procs.orphan("sleep 71", "sleep 71")
    mine = procs.sleeper("gt-pinned")
    path = scenario([{"pid": job, "gpu": 0, "memory": "1GiB"}, {"pid": mine.pid, "gpu": 1, "memory": "1GiB"}])
    by_path, starts = [], []
    real_read, real_start = ownership.read_owner, sampler_mod.start_time
    monkeypatch.setattr(ownership, "read_owner", lambda pid, *a: by_path.append(pid) or real_read(pid, *a))
    monkeypatch.setattr(sampler_mod, "start_time", lambda pid, *a: starts.append(pid) or real_start(pid, *a))
    s = Sampler([SimulatedBackend(path)])
    clock = FakeClock()
    s._static.clock = s._owners.clock = clock
    reads = []
    real_static = s._static.put
    s._static.put = lambda key, *a: reads.append(key[0]) or real_static(key, *a)
    for step in range(4):
        snap = s.sample()
        want = {h.pid: real_read(h.pid) for h in snap.holders}
        assert {h.pid: h.owner for h in snap.holders} == want and all(want.values())
        for h in snap.holders:
            assert h.chain_owners == tuple(real_read(c.pid) for c in h.chain)
        if step in (0, 2):  # first sight, and after the ttl: command lines (and cgroups) read again
            assert {mine.pid, job} <= set(reads)
        else:
            assert reads == []  # from the caches
        reads.clear()
        clock.t += 3.0  # steps 0 -> 1: 3 s (fresh); 1 -> 2: 6 s (stale)
    assert by_path == [] and starts == []
    os.kill(job, signal.SIGKILL)
