"""The sampler and the Snapshot it produces: an immutable value that every face reads.

backends -> Sampler.sample() -> Snapshot (devices, holders with ancestry, owners and verdicts, orphan roots).
Device indexes are global: backends are numbered in probe order (NVIDIA first, then AMD, then Intel).
"""

from __future__ import annotations

import dataclasses
import os
import datetime as _dt
import sys
import time
from dataclasses import dataclass
from collections.abc import Callable

from gputop import __version__
from gputop.util import saferegex
from gputop.backends import close_backends, device_map, probe, read_device, read_devices
from gputop.backends.base import Backend, BackendStatus, DeviceSample, GpuProcess, ProbeResult, merge_ctx
from gputop.core.config import Config
from gputop.util.errors import NotFoundError, UsageError
from gputop.core.orphans import ORPHAN, UNKNOWN, Verdict, classify, compile_protect, verdict_inputs
from gputop.core.ownership import Owner, OwnerCache
from gputop.core.procs import IS_LINUX, ProcInfo, ProcTable, StaticCache, hidepid_note, start_time, tgid_of
from gputop.core.slurm_jobs import JobRef, JobState, JobStates, process_job

PLATFORM = "windows" if sys.platform.startswith("win") else "posix"


class cached_property:  # noqa: N801 (functools.cached_property, without its lock)
    """functools.cached_property without the lock Python before 3.12 takes on every first read (~1 us):
    a snapshot makes a thousand holders a refresh, each read once from one thread."""

    def __init__(self, fn):
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


_set = object.__setattr__  # GpuUse and Holder set their __dict__ whole: one call, not one a field


@dataclass(frozen=True, init=False)
class GpuUse:
    """One process's context on one GPU (global index)."""

    gpu: int
    ctx: str
    used_memory: int | None
    sm_util: float | None

    def __init__(self, gpu: int, ctx: str, used_memory: int | None, sm_util: float | None):
        # Not the generated __init__ of a frozen dataclass (one object.__setattr__ call a field): a sample
        # makes one GpuUse and one Holder a holder, a thousand a refresh. Still frozen after this.
        _set(self, "__dict__", {"gpu": gpu, "ctx": ctx, "used_memory": used_memory, "sm_util": sm_util})


@dataclass(frozen=True, init=False)
class Holder:
    """A process holding at least one GPU, with its host view, ancestry and verdict."""

    pid: int
    uses: tuple[GpuUse, ...]
    proc: ProcInfo | None  # None: the PID cannot be seen here
    chain: tuple[ProcInfo, ...]  # parent, grandparent, ... up to init
    verdict: Verdict
    cpu_percent: float | None = None
    runtime: float | None = None  # seconds
    owner: Owner | None = None  # who owns it, from its cgroup (None: not read, or not readable)
    chain_owners: tuple[Owner | None, ...] = ()  # the owner of each chain member, in chain order
    job: JobRef | None = None  # the Slurm job it belongs to (cgroup path or environ)
    job_state: JobState | None = None  # what slurmctld says about that job

    def __init__(self, pid: int, uses: tuple[GpuUse, ...], proc: ProcInfo | None, chain: tuple[ProcInfo, ...],
                 verdict: Verdict, cpu_percent: float | None = None, runtime: float | None = None,
                 owner: Owner | None = None, chain_owners: tuple[Owner | None, ...] = (), job: JobRef | None = None,
                 job_state: JobState | None = None):
        # As GpuUse.__init__: the fields in one dict, not one object.__setattr__ call each.
        d = {"pid": pid, "uses": uses, "proc": proc, "chain": chain, "verdict": verdict, "cpu_percent": cpu_percent,
             "runtime": runtime, "owner": owner, "chain_owners": chain_owners, "job": job, "job_state": job_state}
        if len(uses) == 1:  # most holders use one GPU: the cached properties below are its use's values
            u = uses[0]
            d["ctx"], d["gpus"], d["gpu_memory"], d["sm_util"] = u.ctx or "C", (u.gpu,), u.used_memory, u.sm_util
        _set(self, "__dict__", d)

    @property
    def visible(self) -> bool:
        return self.proc is not None

    @property
    def start_time(self) -> float | None:
        return self.proc.start_time if self.proc else None

    @cached_property  # uses never change; faces read these many times per refresh
    def ctx(self) -> str:
        ctx = None
        for u in self.uses:
            ctx = merge_ctx(ctx, u.ctx) if ctx else u.ctx
        return ctx or "C"

    @cached_property
    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({u.gpu for u in self.uses}))

    @cached_property
    def gpu_memory(self) -> int | None:
        """Total over this holder's GPUs; None when any part is unknown."""
        if any(u.used_memory is None for u in self.uses):
            return None
        return sum(u.used_memory for u in self.uses)  # type: ignore[misc]

    @cached_property
    def sm_util(self) -> float | None:
        vals = [u.sm_util for u in self.uses if u.sm_util is not None]
        return max(vals) if vals else None

    @property
    def user(self) -> str | None:
        return self.proc.user if self.proc else None

    @property
    def name(self) -> str:
        return self.proc.name if self.proc else "(not visible)"

    @property
    def cmd(self) -> str:
        return self.proc.cmd if self.proc else "(not visible: another PID namespace, or exited)"

    @property
    def rss(self) -> int | None:
        return self.proc.rss if self.proc else None


@dataclass(frozen=True, init=False)
class OrphanRoot:
    """The topmost live ancestor of one or more orphaned holders; reaping removes its whole tree."""

    proc: ProcInfo
    holders: tuple[int, ...]
    gpus: tuple[int, ...]
    gpu_memory: int | None
    reason: str
    reaper: int | None

    def __init__(self, proc: ProcInfo, holders: tuple[int, ...], gpus: tuple[int, ...], gpu_memory: int | None,
                 reason: str, reaper: int | None):
        # As GpuUse.__init__ (one per orphan tree a refresh).
        _set(self, "__dict__", {"proc": proc, "holders": holders, "gpus": gpus, "gpu_memory": gpu_memory,
                                "reason": reason, "reaper": reaper})

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass(frozen=True)
class Snapshot:
    """One sample of the node: devices, holders with their verdicts, orphan roots, warnings."""

    at: float
    host: str
    devices: tuple[DeviceSample, ...]
    holders: tuple[Holder, ...]
    roots: tuple[OrphanRoot, ...]
    backends: tuple[BackendStatus, ...]
    warnings: tuple[str, ...] = ()
    platform: str = PLATFORM
    # The sampler's ownership and Slurm lookups (owner_of, job_of, job_state), so that an action that
    # classifies again (the reap planner) judges a process as the snapshot did. Not part of the value.
    hooks: dict | None = dataclasses.field(default=None, compare=False, repr=False)

    def holder(self, pid: int) -> Holder | None:
        for h in self.holders:
            if h.pid == pid:
                return h
        return None

    def device(self, index: int) -> DeviceSample | None:
        for d in self.devices:
            if d.index == index:
                return d
        return None

    def holders_on(self, index: int) -> list[Holder]:
        return [h for h in self.holders if index in h.gpus]

    def owner(self, pid: int) -> Owner | None:
        """The owner of a holder or of a member of a holder's chain (an orphan root), if it was read."""
        for h in self.holders:
            if h.pid == pid:
                return h.owner
            for c, o in zip(h.chain, h.chain_owners):
                if c.pid == pid:
                    return o
        return None

    def to_dict(self) -> dict:
        return snapshot_to_dict(self)


class _Recording:
    """A view of a ProcTable that records every answer classify() gets from it (get and hidden)."""

    __slots__ = ("_table", "gets", "hides")

    def __init__(self, table: ProcTable):
        self._table = table
        self.gets: dict[int, ProcInfo | None] = {}
        self.hides: dict[int, bool] = {}

    def get(self, pid: int) -> ProcInfo | None:
        info = self.gets[pid] = self._table.get(pid)
        return info

    def hidden(self, pid: int) -> bool:
        answer = self.hides[pid] = self._table.hidden(pid)
        return answer

    def exe(self, pid: int) -> str | None:
        # Not recorded: the executable changes only with an exec, which changes the name and the command
        # line the memo compares (verdict_inputs).
        return self._table.exe(pid)


class _Context:
    """The part of a verdict's inputs that the holders of one tree share: each process-table answer
    classify() got for a PID other than the holder's own (its ancestors, their session leaders, init),
    each "hidden" answer, and the chain it walked. Sibling holders classified over the same table get
    the same answers (the same ProcInfo objects), so the Sampler keeps one _Context for all of them
    (interned by the identity of those objects) and checks it once per sample instead of once a holder."""

    __slots__ = ("gets", "hides", "chain", "same", "current")

    def __init__(self, gets: tuple[tuple[int, ProcInfo | None], ...], hides: tuple[tuple[int, bool], ...],
                 chain: tuple[ProcInfo, ...]):
        self.gets, self.hides, self.chain = gets, hides, chain
        # Per answer in gets, the newest record found to have the same verdict inputs (a record re-read
        # once its command line was old, an exited process's): compared by identity from then on.
        self.same: list[ProcInfo | None] = [info for _, info in gets]
        self.current = chain  # the chain as the newest sample that checked this context read it

    def key(self) -> tuple:
        """Equal for two contexts made of the very same answers (the objects are held by the context)."""
        return (tuple((pid, id(info)) for pid, info in self.gets), self.hides, tuple(map(id, self.chain)))

    def holds(self, table: ProcTable) -> bool:
        """Whether the current table answers every recorded question as before."""
        same = self.same
        for i, (pid, old) in enumerate(self.gets):
            cur = table.get(pid)
            if cur is old or cur is same[i]:
                continue
            if cur is None or old is None or verdict_inputs(cur) != verdict_inputs(old):
                return False  # gone, appeared, replaced (pid, start), reparented, renamed, exec'd, exited...
            same[i] = cur
        for pid, was in self.hides:
            if table.hidden(pid) != was:
                return False
        return True


@dataclass(slots=True)
class _Memo:
    """One holder's verdict, with every input it was computed from: the holder's own record (its
    verdict inputs), its owner, and the answers it shares with its tree (_Context). classify() is a pure
    function of these and of the rules (config), so while every one of them gives the same answer
    again, it would return the same verdict. ``info`` is the newest record found to have those inputs
    (moved on by _verdict, so that the next sample's identity check usually answers)."""

    info: ProcInfo
    inputs: tuple  # verdict_inputs(info)
    ctx: _Context
    owner: Owner | None
    verdict: Verdict


def hostname() -> str:
    """socket.gethostname(), without importing socket where uname() says the same (its import is ~2 ms
    of a one-shot 'gputop status')."""
    uname = getattr(os, "uname", None)
    if uname is not None:
        return uname().nodename
    import socket

    return socket.gethostname()


class Sampler:
    """Reads the backends and the host processes; keeps the state that CPU% needs between samples."""

    def __init__(
        self,
        backends: list[Backend],
        statuses: list[BackendStatus] | None = None,
        config: Config | None = None,
        *,
        proc_root: str = "/proc",
        run_root: str = "/run",
        clock: Callable[[], float] = time.time,
        platform: str = PLATFORM,
        static_ttl: float = 5.0,
        memo: bool = True,
    ):
        self.backends = backends
        self.statuses = list(statuses or [BackendStatus(b.name, True) for b in backends])
        self.config = config or Config()
        self.proc_root = proc_root
        self.clock = clock
        self.platform = platform
        self._protect = compile_protect(self.config.protect)
        self._protect_cmdline = compile_protect(self.config.protect_cmdline)
        self._cpu_prev: dict[tuple[int, float], tuple[float, float]] = {}
        # Command lines and uids of known processes, re-read every static_ttl seconds (0: every sample),
        # so that a refresh reads one /proc file per known process instead of three.
        self._static = StaticCache(static_ttl) if static_ttl > 0 else None
        # Owners (cgroups) of holders and their chains, by identity, re-read as often as command lines.
        self._owners = OwnerCache(proc_root, run_root, ttl=static_ttl,
                                  start_of=lambda pid: start_time(pid, proc_root)) if IS_LINUX else None
        if self._owners is not None and self._static is not None:
            # The process layer reads each cgroup through the process's pinned dir when it reads the
            # command line (first sight, then every static_ttl), and the owner cache parses those bytes.
            self._static.cgroups = self._owners.pinned = {}
        self.host = hostname()
        # Identities (pid, start) known to lead their thread group: NVML may report a thread id instead.
        self._leaders: set[tuple[int, float]] = set()
        self._leaders_seen: set[tuple[int, float]] = set()
        self.job_states = JobStates(ttl=max(0.5, self.config.interval * 0.9))
        self._job_refs: dict[tuple[int, float], JobRef | None] = {}
        self._hidepid: tuple[str | None] | None = None  # (the hidepid warning or None), once read
        # The verdict memo: holder pid -> _Memo, kept while every input of the verdict is unchanged, for
        # the rules of _rules_of (see _verdict). Faces only: actions classify again on a fresh table.
        # memo=False: a one-shot sampler (one 'gputop status'), which would only pay to record the inputs.
        self._memo: dict[int, _Memo] | None = {} if memo else None
        # The memos' shared parts, interned (_Context.key -> _Context), and this sample's check of each
        # one checked so far (id -> (the context, None or (chain now, its owners))).
        self._contexts: dict[tuple, _Context] = {}
        self._ctx_now: dict[int, tuple[_Context, tuple | None]] = {}
        self._memo_changed = False  # a memo was made or dropped since the last _forget_memos
        self._live_holders = 0  # the visible, live holders of the last sample
        # Per GPU (global index), pid -> (the backend's GpuProcess, the GpuUse made of it): last sample's
        # and this sample's (_add_uses). A backend that reports an unchanged process as the same frozen
        # object gets the same GpuUse back.
        self._last_uses: dict[int, dict[int, tuple[GpuProcess, GpuUse]]] = {}
        self._uses_now: dict[int, dict[int, tuple[GpuProcess, GpuUse]]] = {}
        self._rules_of: tuple[Config, str] = (self.config, self.platform)

    def _job_of(self, info: ProcInfo) -> JobRef | None:
        """The Slurm job of a process, read once per identity (a process's job never changes)."""
        key = (info.pid, info.start_time)  # info.identity, without the property call (once a holder)
        try:
            return self._job_refs[key]
        except KeyError:
            owner = self._owners.of(info) if self._owners is not None else None
            ref = self._job_refs[key] = process_job(info.pid, self.proc_root, owner)
            return ref

    def _holder_jobs(self, infos: dict[int, ProcInfo]) -> tuple[dict[int, JobRef], dict[int, JobState]]:
        """The job of each visible holder (pid -> its live record), and the state of each of those jobs
        (one scontrol per job)."""
        jobs: dict[int, JobRef] = {}
        for pid, info in infos.items():
            ref = self._job_of(info)
            if ref is not None:
                jobs[pid] = ref
        states = self.job_states.get_many({j.job_id for j in jobs.values()}) if jobs else {}
        return jobs, states

    @staticmethod
    def _job_warnings(states: dict[int, JobState]) -> list[str]:
        return [f"{st.describe()}: its holders are judged by the session rule, and never called orphans"
                for _, st in sorted(states.items()) if st.state is None]

    @classmethod
    def open(cls, backend: str | None = None, scenario: str | None = None,
             config: Config | None = None, **kw) -> "Sampler":
        return cls.from_probe(probe(backend, scenario), config, **kw)

    @classmethod
    def from_probe(cls, result: ProbeResult, config: Config | None = None, **kw) -> "Sampler":
        """A sampler over backends already opened (``probe``): the TUI reads its first devices from them
        before it imports the process layer."""
        # $GPUTOP_PROC_ROOT: read host processes from a fixture /proc (tests; see docs/backends.md "AMD and Intel").
        kw.setdefault("proc_root", os.environ.get("GPUTOP_PROC_ROOT") or "/proc")
        # $GPUTOP_RUN_ROOT: read logind's sessions from a fixture /run (tests; see docs/orphans.md).
        kw.setdefault("run_root", os.environ.get("GPUTOP_RUN_ROOT") or "/run")
        return cls(result.backends, result.statuses, config, **kw)

    def owner_of(self, proc: ProcInfo) -> Owner | None:
        """Who owns ``proc`` (its cgroup), from this sampler's cache; None off Linux or when unreadable.
        Pass it as ``classify(..., owner_of=sampler.owner_of)`` so a verdict follows the ownership rules."""
        return self._owners.of(proc) if self._owners is not None else None

    def locate(self, index: int) -> tuple[Backend, int]:
        mapping = device_map(self.backends)
        if not 0 <= index < len(mapping):
            raise NotFoundError(f"no GPU {index}: this host has {len(mapping)} GPU(s); see 'gputop status'")
        return mapping[index]

    def reset(self, index: int) -> str:
        backend, local = self.locate(index)
        return backend.reset(local)

    def close(self) -> None:
        close_backends(self.backends)
        if self._static is not None:
            self._static.close()

    def _holder(self, pid: int, uses: tuple[GpuUse, ...], info: ProcInfo, table: ProcTable, now: float,
                cpu_seen: dict[tuple[int, float], tuple[float, float]], jobs: dict[int, JobRef],
                job_states: dict[int, JobState]) -> Holder:
        """One visible holder: its verdict, chain, CPU%, owners and Slurm job."""
        owners = self._owners
        start, cpu_time = info.start_time, info.cpu_time
        owner = owners.get(pid, start) if owners is not None else None
        verdict, chain, chain_owners = self._verdict(pid, info, table, owner, jobs, job_states)
        job = jobs.get(pid) if jobs else None
        cpu = None
        if cpu_time is not None:
            key = (pid, start)
            prev = self._cpu_prev.get(key)
            if prev is not None and now > prev[1]:
                cpu = (cpu_time - prev[0]) / (now - prev[1]) * 100.0
                if not cpu > 0.0:  # max(0.0, cpu)
                    cpu = 0.0
            elif now > start:  # first sight: lifetime average, as ps shows
                cpu = cpu_time / max(now - start, 1e-3) * 100.0
            cpu_seen[key] = (cpu_time, now)
        if chain_owners is None:  # owners are read only for holders and their chains
            chain_owners = owners.of_all(chain) if owners is not None else ()
        runtime = now - start if now > start else 0.0
        return Holder(pid, uses, info, chain, verdict, cpu, runtime, owner,
                      chain_owners, job, job_states.get(job.job_id) if job is not None else None)

    def _verdict(self, pid: int, info: ProcInfo, table: ProcTable, owner: Owner | None,
                 jobs: dict[int, JobRef], job_states: dict[int, JobState]
                 ) -> tuple[Verdict, tuple[ProcInfo, ...], tuple[Owner | None, ...] | None]:
        """The holder's verdict, its chain (parent, ... up to init) and, when known, the chain's owners:
        from the memo while every input of the verdict gives the same answer, else from classify() over
        this sample's table.

        Not memoised: a holder in a Slurm job (its job's state changes without any process changing)
        and a chain that could not be walked (unknown, and cheap). The memo is only ever a faster way to
        the verdict classify() would return now: never an older one."""
        if self._memo is None:
            verdict, chain, _ = self._classify(pid, table, table, jobs, job_states)
            return verdict, chain, None
        memo = self._memo.get(pid)
        if memo is not None and pid not in jobs and (owner is memo.owner or owner == memo.owner):
            if info is not memo.info and verdict_inputs(info) == memo.inputs:
                memo.info = info  # the same inputs: compare by identity next time
            if info is memo.info:
                ctx = memo.ctx  # _context_now, its usual answer (checked already this sample) inlined
                seen = self._ctx_now.get(id(ctx))
                shared = seen[1] if seen is not None and seen[0] is ctx else self._context_now(ctx, table)
                if shared is not None:
                    return memo.verdict, shared[0], shared[1]
        rec = _Recording(table)
        rec.get(pid)  # the holder first: its answer is the memo's own, the rest are the tree's
        verdict, chain, walked = self._classify(pid, rec, table, jobs, job_states)
        self._memo_changed = True
        if pid in jobs or not walked:
            self._memo.pop(pid, None)
            return verdict, chain, None
        ctx = _Context(tuple(item for item in rec.gets.items() if item[0] != pid), tuple(rec.hides.items()),
                       chain)
        ctx = self._contexts.setdefault(ctx.key(), ctx)
        self._memo[pid] = _Memo(info, verdict_inputs(info), ctx, owner, verdict)
        return verdict, chain, None

    def _classify(self, pid: int, view, table: ProcTable, jobs: dict[int, JobRef],
                  job_states: dict[int, JobState]) -> tuple[Verdict, tuple[ProcInfo, ...], bool]:
        """classify() over ``view`` (the table, or a recording of it), the chain up to init, and whether
        that is the chain the verdict walked (False: the walk failed, the verdict is unknown)."""
        walked: list = []
        owners = self._owners
        verdict = classify(pid, view, platform=self.platform, protect=self._protect,
                           nohup_protects=self.config.nohup_protects, max_chain=self.config.max_chain,
                           walked=walked, owner_of=owners.of if owners is not None else None,
                           job_of=self._job_of if jobs else None, job_state=job_states.get,
                           protect_cmdline=self._protect_cmdline)
        if not walked:  # the walk failed (unknown): the chain as far as it goes
            return verdict, tuple(table.ancestors(pid, limit=self.config.max_chain)), False
        # The chain the verdict walked, up to init: the same as table.ancestors(pid).
        init = view.get(1) if walked[-1].ppid == 1 else None
        return verdict, tuple(walked[1:]) + ((init,) if init is not None else ()), True

    def _context_now(self, ctx: _Context, table: ProcTable
                     ) -> tuple[tuple[ProcInfo, ...], tuple[Owner | None, ...]] | None:
        """Once per sample per shared context: None if any of its answers changed, else the chain as
        this sample read it (new CPU time or RSS, the same verdict inputs) and the chain's owners."""
        seen = self._ctx_now.get(id(ctx))
        if seen is not None and seen[0] is ctx:
            return seen[1]
        out = None
        if ctx.holds(table):
            chain = ctx.current
            for c in chain:
                if table.get(c.pid) is not c:
                    # Kept for the next sample (as ``same`` keeps the newest records): a record re-read
                    # once its command line aged is a new object, and the same one ever after.
                    chain = ctx.current = tuple(table.get(c.pid) for c in chain)  # type: ignore[misc]
                    break
            owners = self._owners
            out = (chain, owners.of_all(chain) if owners is not None else ())
        self._ctx_now[id(ctx)] = (ctx, out)
        return out

    def _check_rules(self) -> None:
        """A new config (a reload) brings new protect rules: compile them, and forget every verdict."""
        if self.config is not self._rules_of[0] or self.platform != self._rules_of[1]:
            self._protect = compile_protect(self.config.protect)
            self._protect_cmdline = compile_protect(self.config.protect_cmdline)
            self._rules_of = (self.config, self.platform)
            if self._memo is not None:
                self._memo.clear()
            self._contexts.clear()

    def _tgid(self, pid: int, table: ProcTable) -> int:
        """``tgid_of(pid)``, which reads /proc/<pid>/status, read once per process rather than once per
        refresh: a process (pid, start time) found to lead its thread group leads it until it exits."""
        info = table.get(pid) if IS_LINUX else None
        key = (pid, info.start_time) if info is not None else None
        if key is not None and key in self._leaders:
            self._leaders_seen.add(key)
            return pid
        # The status file the table has just read for this PID (a new process), else read it now.
        tgid = self._static.tgids.get(pid) if self._static is not None and info is not None else None
        if tgid is None:
            tgid = tgid_of(pid, self.proc_root)
        if tgid == pid and key is not None:
            self._leaders_seen.add(key)
        return tgid

    def _add_uses(self, gi: int, procs: list, table: ProcTable, uses: dict[int, list[GpuUse]],
                  visible: dict[int, bool]) -> None:
        """One device's process list into ``uses`` and ``visible``, by thread group (NVML may report a
        thread id). The hot loop of a sample: _tgid's usual answer (a known leader) is inlined, and a
        process the backend reports as the very same GpuProcess as last sample keeps its GpuUse."""
        leaders, seen = self._leaders, self._leaders_seen
        get = table.get if IS_LINUX else None
        last = self._last_uses.get(gi, {}).get
        kept = self._uses_now[gi] = {}
        for p in procs:
            pid = p.pid
            if p.visible:
                info = get(pid) if get is not None else None
                if info is None or (pid, info.start_time) not in leaders:
                    pid = self._tgid(pid, table)
                else:
                    seen.add((pid, info.start_time))
            had = last(p.pid)
            if had is not None and had[0] is p:
                use = had[1]
            else:
                use = GpuUse(gi, p.ctx, p.used_memory, p.sm_util)
            kept[p.pid] = (p, use)
            had = uses.get(pid)
            if had is None:
                uses[pid] = [use]
                visible[pid] = p.visible
            else:
                had.append(use)
                visible[pid] = visible[pid] and p.visible

    def sample_devices(self) -> tuple[DeviceSample, ...]:
        """The devices alone (no processes, no /proc): what a screen can show before the first full
        sample, which at a thousand holders takes most of a second to read and classify."""
        return read_devices(self.backends)

    def sample(self) -> Snapshot:
        now = self.clock()
        self._ctx_now = {}  # this sample's context checks only, even when the last sample failed part-way
        self._uses_now = {}
        self._check_rules()
        warnings: list[str] = []
        if self._hidepid is None:  # the mount's options: read once per sampler, not every refresh
            self._hidepid = (hidepid_note(self.proc_root),)
        note = self._hidepid[0]
        if note:
            warnings.append(note)
        devices: list[DeviceSample] = []
        uses: dict[int, list[GpuUse]] = {}
        visible: dict[int, bool] = {}
        table = ProcTable(self.proc_root, static=self._static)
        if self._static is not None:
            self._static.tgids.clear()  # this refresh's reads only (prune clears it too, unless one failed)
            self._static.begin()  # one clock reading for this refresh's freshness checks
        if self._owners is not None:
            self._owners.begin()
        for gi, (backend, local) in enumerate(device_map(self.backends)):
            dev = read_device(gi, backend, local)
            devices.append(dev)
            if dev.lost:
                warnings.append(f"GPU {gi} ({dev.name or backend.name}) is lost or unreachable")
                continue
            try:
                procs = backend.processes(local)
            except Exception as e:
                warnings.append(f"GPU {gi}: process list failed: {e}")
                procs = []
            self._add_uses(gi, procs, table, uses, visible)
        for b in self.backends:
            try:
                warnings.extend(b.warnings())
            except Exception:
                pass

        holders = self._holders(table, uses, visible, now, warnings)
        self._last_uses, self._uses_now = self._uses_now, {}
        self._leaders, self._leaders_seen = self._leaders_seen, set()
        self._forget_memos(uses)
        if len(self._job_refs) > self._live_holders:  # it holds every live holder's (_holder_jobs): more
            live = {h.proc.identity for h in holders if h.proc is not None}  # is exited
            self._job_refs = {k: v for k, v in self._job_refs.items() if k in live}
        if self._static is not None:
            self._static.prune()
        if self._owners is not None:
            self._owners.prune()
        return Snapshot(
            at=now, host=self.host, devices=tuple(devices), holders=tuple(holders),
            roots=tuple(_roots(holders, table)), backends=tuple(self.statuses),
            warnings=tuple(warnings), platform=self.platform, hooks=self.verdict_hooks(),
        )

    def _forget_memos(self, holders: dict[int, list[GpuUse]]) -> None:
        """Keep the memos of this sample's holders (``holders``: by pid), and the contexts they share;
        end this sample's checks. A refresh that made no memo and whose holders kept theirs changes
        neither (the usual refresh: nothing to rebuild)."""
        memo = self._memo
        self._ctx_now = {}
        if memo is None:
            return
        changed, self._memo_changed = self._memo_changed, False
        if not memo.keys() <= holders.keys():  # some holder of an earlier sample is gone
            self._memo = memo = {pid: m for pid, m in memo.items() if pid in holders}
            changed = True
        if changed:
            live = {id(m.ctx) for m in memo.values()}
            if len(live) < len(self._contexts):
                self._contexts = {k: c for k, c in self._contexts.items() if id(c) in live}

    def _holders(self, table: ProcTable, uses: dict[int, list[GpuUse]], visible: dict[int, bool], now: float,
                 warnings: list[str]) -> list[Holder]:
        """Every holder, in PID order: the visible, live ones judged; the rest unknown, with a warning."""
        holders: list[Holder] = []
        cpu_seen: dict[tuple[int, float], tuple[float, float]] = {}
        infos: dict[int, ProcInfo] = {}  # the visible, live holders: one table lookup each
        order = sorted(uses)
        get = table.get
        for pid in order:
            info = get(pid) if visible[pid] else None
            if info is not None and (info.state not in ("Z", "X") or info.half_exited):  # not info.zombie
                infos[pid] = info
        self._live_holders = len(infos)
        jobs, job_states = self._holder_jobs(infos)
        warnings.extend(self._job_warnings(job_states))
        holder, append = self._holder, holders.append
        for pid in order:
            info = infos.get(pid)
            if info is None:
                verdict = Verdict(UNKNOWN, f"pid {pid} is not visible here (another PID namespace, or the "
                                           "driver still holds the memory of a process that exited)")
                append(Holder(pid, tuple(uses[pid]), None, (), verdict))
                warnings.append(f"GPU holder pid {pid} is not visible in this PID namespace")
                continue
            append(holder(pid, tuple(uses[pid]), info, table, now, cpu_seen, jobs, job_states))
        self._cpu_prev = cpu_seen
        return holders

    def verdict_hooks(self) -> dict:
        """classify()'s ownership and Slurm inputs, as this sampler reads them."""
        hooks: dict = {"job_of": self._job_of, "job_state": self.job_states.get}
        if self._owners is not None:
            hooks["owner_of"] = self._owners.of
        return hooks


def select_holders(snap: Snapshot, *, gpu: int | None = None, user: str | None = None,
                   name: str | None = None, memory_gt: int | None = None) -> list[Holder]:
    """The holders that match every given selector; the one selection rule for every face.

    ``name``: a case-insensitive regular expression searched in the process name and its command line
    (a plain word matches as a substring). ``user``: exact. ``gpu``: a global index. ``memory_gt``:
    bytes; a holder whose GPU memory is unknown never matches. Raises UsageError for a bad regex."""
    name_re = None
    if name:
        try:
            name_re = saferegex.compile(name, ignore_case=True)  # bounded: the pattern comes from a request
        except saferegex.PatternError as e:
            raise UsageError(f"bad name pattern {name!r}: {e}") from None
    out = []
    for h in snap.holders:
        if gpu is not None and gpu not in h.gpus:
            continue
        if user is not None and h.user != user:
            continue
        if name_re is not None and not (name_re.search(h.name) or name_re.search(h.cmd)):
            continue
        if memory_gt is not None and (h.gpu_memory is None or h.gpu_memory <= memory_gt):
            continue
        out.append(h)
    return out


def _roots(holders: list[Holder], table: ProcTable) -> list[OrphanRoot]:
    by_root: dict[int, list[Holder]] = {}
    for h in holders:
        v = h.verdict
        if v.kind == ORPHAN and v.root is not None:
            hs = by_root.get(v.root)
            if hs is None:
                by_root[v.root] = [h]
            else:
                hs.append(h)
    out = []
    for root_pid in sorted(by_root):
        root = table.get(root_pid)
        if root is None:
            continue
        hs = by_root[root_pid]
        gpus: set[int] = set()
        mem: int | None = 0
        for h in hs:  # plain loops: once a refresh for every orphan tree
            gpus.update(h.gpus)
            m = h.gpu_memory
            mem = None if m is None or mem is None else mem + m
        v = hs[0].verdict
        out.append(OrphanRoot(root, tuple([h.pid for h in hs]), tuple(sorted(gpus)), mem, v.reason, v.reaper))
    return out


# ---- JSON ------------------------------------------------------------------------------------

def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds")


def proc_to_dict(p: ProcInfo) -> dict:
    return {"pid": p.pid, "ppid": p.ppid, "start_time": p.start_time, "name": p.name,
            "cmdline": list(p.cmdline), "user": p.user}


def device_to_dict(d: DeviceSample) -> dict:
    return {
        "index": d.index, "backend": d.backend, "backend_index": d.backend_index, "name": d.name,
        "uuid": d.uuid, "pci_bus_id": d.pci_bus_id, "lost": d.lost,
        "memory_total": d.memory_total, "memory_used": d.memory_used,
        "utilization_gpu": d.util_gpu, "utilization_memory": d.util_mem,
        "temperature_c": d.temperature, "power_w": d.power_w, "power_limit_w": d.power_limit_w,
        "fan_percent": d.fan_pct, "clock_sm_mhz": d.clock_sm_mhz, "clock_mem_mhz": d.clock_mem_mhz,
        "errors": list(d.errors),
    }


def verdict_to_dict(v: Verdict) -> dict:
    return {"kind": v.kind, "reason": v.reason, "root": v.root, "reaper": v.reaper,
            "orphan_reason": v.orphan_reason}


def owner_to_dict(o: Owner | None) -> dict | None:
    return o.to_dict() if o is not None else None


def use_to_dict(u: GpuUse) -> dict:
    # Not dataclasses.asdict(): it deep-copies field by field (~10 us a use; 1,024 holders in one status).
    return {"gpu": u.gpu, "ctx": u.ctx, "used_memory": u.used_memory, "sm_util": u.sm_util}


def holder_to_dict(h: Holder, _entries: dict | None = None) -> dict:
    """``_entries``: chain entries already made in this document, by (process, owner) object; the
    holders of one tree share their ancestors, so a node's JSON makes each one once."""
    p = h.proc
    owners = h.chain_owners or (None,) * len(h.chain)
    return {
        "pid": h.pid, "visible": h.visible, "start_time": h.start_time,
        "user": h.user, "name": h.name if p else None, "cmdline": list(p.cmdline) if p else None,
        "ppid": p.ppid if p else None, "sid": p.sid if p else None,
        "ctx": h.ctx, "gpus": list(h.gpus), "gpu_memory": h.gpu_memory, "sm_util": h.sm_util,
        "cpu_percent": round(h.cpu_percent, 1) if h.cpu_percent is not None else None,
        "rss": h.rss, "runtime": round(h.runtime, 1) if h.runtime is not None else None,
        "uses": [use_to_dict(u) for u in h.uses],
        "verdict": verdict_to_dict(h.verdict),
        "owner": owner_to_dict(h.owner),
        "slurm": slurm_to_dict(h),
        "chain": [_chain_entry(c, o, _entries) for c, o in zip(h.chain, owners)],
    }


def _chain_entry(c: ProcInfo, o: Owner | None, entries: dict | None) -> dict:
    if entries is None:
        return {**proc_to_dict(c), "owner": owner_to_dict(o)}
    key = (id(c), id(o))  # both alive (held by the snapshot) while the document is made
    e = entries.get(key)
    if e is None:
        e = entries[key] = {**proc_to_dict(c), "owner": owner_to_dict(o)}
    return e


def slurm_to_dict(h: Holder) -> dict | None:
    """The holder's Slurm job: id, step, uid, where it was read, and slurmctld's state; None: no job."""
    if h.job is None:
        return None
    st = h.job_state
    return {**h.job.to_dict(), "state": st.state if st else None, "ended": st.ended if st else None,
            "state_detail": st.detail if st else None}


def snapshot_to_dict(s: Snapshot) -> dict:
    """The snapshot as JSON-ready data. Chain entries of holders that share an ancestor are one dict
    object (made once): serialise it, do not edit it in place."""
    entries: dict = {}
    gpu_holders = [
        {"gpu": u.gpu, "pid": h.pid, "ctx": u.ctx, "used_memory": u.used_memory, "sm_util": u.sm_util}
        for h in s.holders for u in h.uses
    ]
    return {
        "at": _iso(s.at),
        "at_epoch": s.at,
        "host": s.host,
        "platform": s.platform,
        "version": __version__,
        "gpu": {"gpus": [device_to_dict(d) for d in s.devices], "holders": gpu_holders},
        "holders": [holder_to_dict(h, entries) for h in s.holders],
        "roots": [
            {**proc_to_dict(r.proc), "holders": list(r.holders), "gpus": list(r.gpus),
             "gpu_memory": r.gpu_memory, "reason": r.reason, "reaper": r.reaper,
             "owner": owner_to_dict(s.owner(r.pid))}
            for r in s.roots
        ],
        "warnings": list(s.warnings),
        "backends": [dataclasses.asdict(b) for b in s.backends],
    }


_COMPACT = None  # a json.JSONEncoder, made on first use (json.dumps makes one a call with these options)


def snapshot_json(s: Snapshot) -> str:
    """``snapshot_to_dict(s)`` as compact JSON: exactly what ``json.dumps(..., separators=(",", ":"),
    default=str)`` writes, made faster. The holders of one tree share their chain entries (about two
    thirds of the document at a thousand holders), and each is encoded once and spliced in."""
    global _COMPACT
    import json

    if _COMPACT is None:
        _COMPACT = json.JSONEncoder(separators=(",", ":"), default=str)
    enc = _COMPACT.encode
    doc = snapshot_to_dict(s)
    keys = list(doc)
    cut = keys.index("holders")
    head = enc({k: doc[k] for k in keys[:cut]})
    tail = enc({k: doc[k] for k in keys[cut + 1:]})
    done: dict[int, str] = {}  # id(chain entry) -> its JSON; the entries are held by doc meanwhile
    parts = []
    for h in doc["holders"]:
        chain = h.pop("chain")  # the last key: the rest of the holder, then the chain
        links = []
        for e in chain:
            text = done.get(id(e))
            if text is None:
                text = done[id(e)] = enc(e)
            links.append(text)
        parts.append(f'{enc(h)[:-1]},"chain":[{",".join(links)}]}}')
    return f'{head[:-1]},"holders":[{",".join(parts)}],{tail[1:]}'
