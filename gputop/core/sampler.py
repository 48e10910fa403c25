"""The sampler: reads the backends and the host processes, and returns a Snapshot (gputop.core.model).

backends -> Sampler.sample() -> Snapshot (devices, holders with ancestry, owners and verdicts, orphan roots).
Device indexes are global: backends are numbered in probe order (NVIDIA first, then AMD, then Intel).
The holders' verdicts come from the sampler's VerdictCache (gputop.core.verdicts). ``LockedSampler``
shares one sampler between threads (a face's sampling thread and its actions), one call at a time.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from gputop.backends import close_backends, device_map, mig_instances, probe, read_device, read_devices
from gputop.backends.base import Backend, BackendStatus, DeviceSample, GpuProcess, MigInstance, ProbeResult
from gputop.core.allocation import AllocationSource
from gputop.core.config import Config
from gputop.core.ledger_sampling import LedgerSampling
from gputop.core.model import PLATFORM, GpuUse, Holder, OrphanRoot, Snapshot
from gputop.core.orphans import ORPHAN, UNKNOWN, Verdict
from gputop.core.ownership import Owner, OwnerCache
from gputop.core import procs
from gputop.core.procs import IS_LINUX, ProcInfo, ProcTable, StaticCache, hidepid_note, start_time, tgid_of
from gputop.core.slurm_jobs import JobRef, JobState, JobStates, process_job
from gputop.core.verdicts import Lookups, VerdictCache
from gputop.util.errors import NotFoundError


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
        for b in backends:
            b.host_start_time = procs.start_time  # the simulated backend's liveness (backends import no core)
        self.statuses = list(statuses or [BackendStatus(b.name, True) for b in backends])
        self.config = config or Config()
        self.proc_root = proc_root
        self.clock = clock
        self.platform = platform
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
        # Whom the scheduler gave each GPU to, and each holder's standing (gputop.core.allocation).
        self.allocations = AllocationSource(self.job_states, ttl=max(0.5, self.config.interval * 0.9))
        self._minors: dict[int, int | None] = {}
        self._pods = None  # the kubelet's allocation (gputop.core.pod_allocation), made on first use
        self._hidepid: tuple[str | None] | None = None  # (the hidepid warning or None), once read
        # The holders' verdicts, kept while every input of each is unchanged (gputop.core.verdicts).
        # memo=False: a one-shot sampler (one 'gputop status'), which would only pay to record the inputs.
        self.verdicts = VerdictCache(self._owners, self._job_of, memo=memo)
        # The memory ledger's part of a sample: device-file holders, zombies, MPS (gputop.core.ledger_sampling).
        self._ledger = LedgerSampling(proc_root, self.verdicts)
        self.verdicts.begin(self.config, self.platform)  # the protect rules, compiled now
        self._live_holders = 0  # the visible, live holders of the last sample
        # Per GPU (global index), pid -> (the backend's GpuProcess, the GpuUse made of it): last sample's
        # and this sample's (_add_uses). A backend that reports an unchanged process as the same frozen
        # object gets the same GpuUse back.
        self._last_uses: dict[int, dict[int, tuple[GpuProcess, GpuUse]]] = {}
        self._uses_now: dict[int, dict[int, tuple[GpuProcess, GpuUse]]] = {}

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

    def lookups(self) -> Lookups:
        """classify()'s ownership and Slurm inputs as this sampler reads them (its caches): an action that
        classifies again (the reap planner) passes them on, to judge a process as this sampler's snapshots
        did. Not thread-safe on their own: call them where the sampler's lock is held (LockedSampler)."""
        owners = self._owners
        return Lookups(owner_of=owners.of if owners is not None else None, job_of=self._job_of,
                       job_state=self.job_states.get)

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
                job_states: dict[int, JobState], notes=None) -> Holder:
        """One visible holder: its verdict, chain, CPU%, owners and Slurm job."""
        owners = self._owners
        start, cpu_time = info.start_time, info.cpu_time
        owner = owners.get(pid, start) if owners is not None else None
        verdict, chain, chain_owners = self.verdicts.verdict(pid, info, table, owner, jobs, job_states)
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
                      chain_owners, job, job_states.get(job.job_id) if job is not None else None, notes)

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
                  visible: dict[int, bool], source: str = "nvml") -> None:
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
                use = GpuUse(gi, p.ctx, p.used_memory, p.sm_util, p.gpu_instance_id, p.compute_instance_id,
                             source)
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
        self._uses_now = {}
        self.verdicts.begin(self.config, self.platform)
        warnings: list[str] = []
        if self._hidepid is None:  # the mount's options: read once per sampler, not every refresh
            self._hidepid = (hidepid_note(self.proc_root),)
        note = self._hidepid[0]
        if note:
            warnings.append(note)
        uses: dict[int, list[GpuUse]] = {}
        visible: dict[int, bool] = {}
        table = ProcTable(self.proc_root, static=self._static)
        if self._static is not None:
            self._static.tgids.clear()  # this refresh's reads only (prune clears it too, unless one failed)
            self._static.begin()  # one clock reading for this refresh's freshness checks
        if self._owners is not None:
            self._owners.begin()
        devices, instances = self._read_gpus(table, uses, visible, warnings)
        holders = self._holders(table, uses, visible, now, warnings)
        self._end_refresh(holders, uses)
        allocation = self._allocation(devices, holders, now)
        if allocation is not None and allocation.error:
            warnings.append(f"GPU allocation unknown: {allocation.error}")
        return Snapshot(
            at=now, host=self.host, devices=tuple(devices), holders=tuple(holders),
            roots=tuple(_roots(holders, table)), backends=tuple(self.statuses),
            warnings=tuple(warnings), platform=self.platform, allocation=allocation,
            instances=tuple(instances), searched=self._ledger.searched,
        )

    def _read_gpus(self, table: ProcTable, uses: dict[int, list[GpuUse]], visible: dict[int, bool],
                   warnings: list[str]) -> tuple[list[DeviceSample], list[MigInstance]]:
        """Each backend's devices, MIG instances and GPU processes (into ``uses`` and ``visible``), then
        the holders found by the device-file scan, and the backends' warnings."""
        devices: list[DeviceSample] = []
        instances: list[MigInstance] = []
        for gi, (backend, local) in enumerate(device_map(self.backends)):
            dev = read_device(gi, backend, local)
            devices.append(dev)
            if dev.lost:
                warnings.append(f"GPU {gi} ({dev.name or backend.name}) is lost or unreachable")
                continue
            instances.extend(mig_instances(gi, backend, local, warnings))
            try:
                procs = backend.processes(local)
            except Exception as e:
                warnings.append(f"GPU {gi}: process list failed: {e}")
                procs = []
            self._add_uses(gi, procs, table, uses, visible, getattr(backend, "list_source", "nvml"))
            self._ledger.node(gi, backend, local, dev.memory_used)
        self._ledger.add_device_file_uses(uses, visible, warnings, table)
        for b in self.backends:
            try:
                warnings.extend(b.warnings())
            except Exception:
                pass
        return devices, instances

    def _end_refresh(self, holders: list[Holder], uses: dict[int, list[GpuUse]]) -> None:
        """Forget what this refresh no longer saw: the last uses, session leaders, job references and the
        caches' stale entries."""
        self._last_uses, self._uses_now = self._uses_now, {}
        self._leaders, self._leaders_seen = self._leaders_seen, set()
        self.verdicts.end(uses)
        if len(self._job_refs) > self._live_holders:  # it holds every live holder's (_holder_jobs): more
            live = {h.proc.identity for h in holders if h.proc is not None}  # is exited
            self._job_refs = {k: v for k, v in self._job_refs.items() if k in live}
        if self._static is not None:
            self._static.prune()
        if self._owners is not None:
            self._owners.prune()

    def _allocation(self, devices, holders, now: float):
        """Whom the scheduler gave each GPU to: Slurm's allocation on a Slurm node, else the kubelet's
        where its pod-resources socket is (gputop.core.pod_allocation); None on a node with neither."""
        view = self.allocations.view(devices, holders, self.minor_of, now)
        if view is not None:
            return view
        if self._pods is None:
            from gputop.core.pod_allocation import PodAllocations

            self._pods = PodAllocations(ttl=self.allocations.slurm.ttl)
        return self._pods.view(devices, holders, now) if self._pods.available else None

    def minor_of(self, gpu: int) -> int | None:
        """A GPU's (global index) minor number, from its backend, read once; None when unknown."""
        if gpu not in self._minors:
            try:
                backend, local = self.locate(gpu)
                self._minors[gpu] = backend.minor_number(local)
            except Exception:
                return None
        return self._minors[gpu]

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
        notes = self._ledger.notes_for
        for pid in order:
            info = infos.get(pid)
            if info is None and visible[pid]:  # a zombie the list still names: its parent must wait for it
                z = self._ledger.zombie_holder(pid, tuple(uses[pid]), table, jobs, job_states, warnings)
                if z is not None:
                    append(z)
                    continue
            if info is None:
                verdict = Verdict(UNKNOWN, f"pid {pid} is not visible here (another PID namespace, or the "
                                           "driver still holds the memory of a process that exited)")
                append(Holder(pid, tuple(uses[pid]), None, (), verdict))
                warnings.append(f"GPU holder pid {pid} is not visible in this PID namespace")
                continue
            append(holder(pid, tuple(uses[pid]), info, table, now, cpu_seen, jobs, job_states, notes(pid, info)))
        self._cpu_prev = cpu_seen
        return holders



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


class LockedSampler:
    """One sampler shared between threads (a face's sampling thread, its action threads, the parallel
    kills of kill_many), one call at a time. Every face that shares a sampler uses this wrapper.

    ``lock`` is reentrant: a face may hold it across an action (``with shared.lock: kill_process(...,
    sampler=shared)``), and the action's own samples through the wrapper take it again. ``lookups()``
    gives lookups that take the lock too: the reap planner calls them from an action thread while the
    sampling thread samples. Anything else is the sampler's own attribute (``platform``, ``config``,
    ``statuses``, ``locate``...)."""

    def __init__(self, sampler):
        self.inner = sampler  # the sampler it shares
        self.lock = threading.RLock()

    @classmethod
    def around(cls, sampler) -> "LockedSampler":
        """``sampler`` itself when it is already shared this way, else a new wrapper around it."""
        return sampler if isinstance(sampler, cls) else cls(sampler)

    def sample(self) -> Snapshot:
        with self.lock:
            return self.inner.sample()

    def sample_devices(self) -> tuple[DeviceSample, ...]:
        with self.lock:
            return self.inner.sample_devices()

    def reset(self, index: int) -> str:
        with self.lock:
            return self.inner.reset(index)

    def lookups(self) -> Lookups:
        with self.lock:
            inner = self.inner.lookups()
        return Lookups(**{k: self._locked(fn) for k, fn in vars(inner).items() if fn is not None})

    def _locked(self, fn: Callable) -> Callable:
        lock = self.lock

        def call(*args):
            with lock:
                return fn(*args)
        return call

    def close(self) -> None:
        with self.lock:
            self.inner.close()

    def __getattr__(self, name):
        return getattr(self.inner, name)
