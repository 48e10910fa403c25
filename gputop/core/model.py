"""The data model: the immutable values a sample produces and every face reads.

``Snapshot`` (devices, holders with their ancestry, owners and verdicts, orphan roots, warnings), ``Holder``,
``GpuUse`` and ``OrphanRoot``, and ``select_holders``, the one selection rule over a snapshot. The sampler
that makes them is gputop.core.sampler; their JSON form is gputop.core.snapshot_json.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (gputop status does not)

from gputop.backends.base import BackendStatus, DeviceSample, MigInstance, merge_ctx
from gputop.core.snapshot_json import snapshot_to_dict
from gputop.util import saferegex
from gputop.util.errors import UsageError

if TYPE_CHECKING:
    from gputop.core.allocation import AllocationView
    from gputop.core.orphans import Verdict
    from gputop.core.ownership import Owner
    from gputop.core.procs import ProcInfo
    from gputop.core.slurm_jobs import JobRef, JobState

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
    gpu_instance_id: int | None = None  # MIG: the GPU instance and compute instance it runs on
    compute_instance_id: int | None = None
    source: str = "nvml"  # how it was found: the backend's list ("nvml", "fdinfo") or "device file"

    def __init__(self, gpu: int, ctx: str, used_memory: int | None, sm_util: float | None,
                 gpu_instance_id: int | None = None, compute_instance_id: int | None = None,
                 source: str = "nvml"):
        # Not the generated __init__ of a frozen dataclass (one object.__setattr__ call a field): a sample
        # makes one GpuUse and one Holder a holder, a thousand a refresh. Still frozen after this.
        _set(self, "__dict__", {"gpu": gpu, "ctx": ctx, "used_memory": used_memory, "sm_util": sm_util,
                                "gpu_instance_id": gpu_instance_id, "compute_instance_id": compute_instance_id,
                                "source": source})

    @property
    def instance_key(self) -> tuple[int, int, int | None] | None:
        """(gpu, gpu instance id, compute instance id) on a MIG device; None when not on one."""
        if self.gpu_instance_id is None:
            return None
        return (self.gpu, self.gpu_instance_id, self.compute_instance_id)


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
    notes: object = None  # gputop.core.ledger.HolderNotes (NSpid, zombie parent, MPS clients), or None

    def __init__(self, pid: int, uses: tuple[GpuUse, ...], proc: ProcInfo | None, chain: tuple[ProcInfo, ...],
                 verdict: Verdict, cpu_percent: float | None = None, runtime: float | None = None,
                 owner: Owner | None = None, chain_owners: tuple[Owner | None, ...] = (), job: JobRef | None = None,
                 job_state: JobState | None = None, notes=None):
        # As GpuUse.__init__: the fields in one dict, not one object.__setattr__ call each.
        d = {"pid": pid, "uses": uses, "proc": proc, "chain": chain, "verdict": verdict, "cpu_percent": cpu_percent,
             "runtime": runtime, "owner": owner, "chain_owners": chain_owners, "job": job, "job_state": job_state,
             "notes": notes}
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
        if self.proc is None:
            return "(not visible: another PID namespace, or exited)"
        return self.proc.cmd + " <defunct>" if self.notes is not None and self.notes.zombie else self.proc.cmd

    @property
    def rss(self) -> int | None:
        return self.proc.rss if self.proc else None

    @property
    def source(self) -> str:
        """How it was found: its backend's list ("nvml", "fdinfo"), else "device file" (memory unknown)."""
        for u in self.uses:
            if u.source != "device file":
                return u.source
        return "device file"

    @property
    def zombie(self) -> bool:
        return self.notes is not None and self.notes.zombie


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
    allocation: AllocationView | None = None  # whom the scheduler gave each GPU to (None: no scheduler)
    instances: tuple[MigInstance, ...] = ()  # MIG devices, each under its GPU (MigInstance.gpu: global index)
    # GPUs whose device node was searched for in every host process (gputop.core.ledger: only then does
    # "no holder" mean that the driver holds the memory)
    searched: tuple[int, ...] = ()

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

    def instances_on(self, index: int) -> list[MigInstance]:
        """The MIG devices of GPU ``index`` (none when MIG is off)."""
        return [m for m in self.instances if m.gpu == index]

    def instance_of(self, use: GpuUse) -> MigInstance | None:
        """The MIG device a use runs on; None when it is not on one (or the instance is not listed)."""
        key = use.instance_key
        if key is None:
            return None
        for m in self.instances:
            if m.key == key:
                return m
        return None

    def holders_on_instance(self, inst: MigInstance) -> list[Holder]:
        """The holders with a use on MIG device ``inst``."""
        return [h for h in self.holders if any(u.instance_key == inst.key for u in h.uses)]

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


def place_label(u: GpuUse) -> str:
    """Where a use runs: its GPU ("0"), or its GPU and MIG instance ("0:GI2/CI0")."""
    if u.gpu_instance_id is None:
        return str(u.gpu)
    ci = "?" if u.compute_instance_id is None else u.compute_instance_id
    return f"{u.gpu}:GI{u.gpu_instance_id}/CI{ci}"


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
