"""The backend interface: devices, a per-device sample, the GPU processes on a device, reset, close.

Every field may be unknown (None). Unknown is never reported as 0.
"""

from __future__ import annotations

import os

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

# Context types. A process can hold a compute context, a graphics context, or both.
CTX_COMPUTE = "C"
CTX_GRAPHICS = "G"
CTX_BOTH = "C+G"
CONTEXT_TYPES = (CTX_COMPUTE, CTX_GRAPHICS, CTX_BOTH)


def merge_ctx(a: str | None, b: str | None) -> str:
    """Merge two context types seen for one PID (e.g. from the compute and graphics lists)."""
    kinds = set()
    for c in (a, b):
        if c == CTX_BOTH:
            kinds.update((CTX_COMPUTE, CTX_GRAPHICS))
        elif c in (CTX_COMPUTE, CTX_GRAPHICS):
            kinds.add(c)
    if kinds == {CTX_COMPUTE, CTX_GRAPHICS}:
        return CTX_BOTH
    if kinds:
        return kinds.pop()
    # Neither is a context type the driver reported (a use found through a device file, "dev"): keep it.
    return a or b or CTX_COMPUTE


@dataclass(frozen=True, init=False)
class DeviceSample:
    """One reading of one device. ``index`` is the backend's own index."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total: int | None = None  # bytes
    memory_used: int | None = None  # bytes
    util_gpu: float | None = None  # percent
    util_mem: float | None = None  # percent
    temperature: float | None = None  # Celsius
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_pct: float | None = None
    clock_sm_mhz: int | None = None
    clock_mem_mhz: int | None = None
    lost: bool = False  # the device fell off the bus / GPU_IS_LOST
    errors: tuple[str, ...] = ()  # per-field degradations, e.g. "power: NotSupported"
    backend: str = ""  # filled in by the sampler, which also renumbers ``index`` across backends
    backend_index: int | None = None
    mig_enabled: bool | None = None  # MIG mode on (True), off (False), or the GPU cannot do MIG / unknown (None)

    def __init__(self, index: int, name: str | None = None, uuid: str | None = None,
                 pci_bus_id: str | None = None, memory_total: int | None = None, memory_used: int | None = None,
                 util_gpu: float | None = None, util_mem: float | None = None, temperature: float | None = None,
                 power_w: float | None = None, power_limit_w: float | None = None, fan_pct: float | None = None,
                 clock_sm_mhz: int | None = None, clock_mem_mhz: int | None = None, lost: bool = False,
                 errors: tuple[str, ...] = (), backend: str = "", backend_index: int | None = None,
                 mig_enabled: bool | None = None):
        # As GpuProcess: the fields in one update, not the frozen dataclass's object.__setattr__ each
        # (2.3 us a device a refresh, against 0.6). Still frozen after this.
        self.__dict__.update(
            index=index, name=name, uuid=uuid, pci_bus_id=pci_bus_id, memory_total=memory_total,
            memory_used=memory_used, util_gpu=util_gpu, util_mem=util_mem, temperature=temperature,
            power_w=power_w, power_limit_w=power_limit_w, fan_pct=fan_pct, clock_sm_mhz=clock_sm_mhz,
            clock_mem_mhz=clock_mem_mhz, lost=lost, errors=errors, backend=backend, backend_index=backend_index,
            mig_enabled=mig_enabled)


@dataclass(frozen=True)
class MigInstance:
    """One MIG device: compute instance ``compute_instance_id`` of GPU instance ``gpu_instance_id`` on GPU
    ``gpu`` (the backend's index; the sampler renumbers it to the global index). Unknown is None."""

    gpu: int
    mig_index: int  # its place in NVML's nvmlDeviceGetMigDeviceHandleByIndex order
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    profile: str | None = None  # "1g.18gb", as DCGM's GPU_I_PROFILE
    uuid: str | None = None  # "MIG-..."
    name: str | None = None
    memory_total: int | None = None  # bytes
    memory_used: int | None = None  # bytes
    util_gpu: float | None = None  # NVML answers NOT_SUPPORTED on a MIG device: None (N/A), never 0
    util_source: str | None = None  # where util_gpu came from, when it is known
    errors: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[int, int | None, int | None]:
        """(parent GPU, GPU instance id, compute instance id): how a holder's use finds its instance."""
        return (self.gpu, self.gpu_instance_id, self.compute_instance_id)

    @property
    def label(self) -> str:
        """'GI 1/CI 0 1g.18gb' (the ids, then the profile when known)."""
        gi = "?" if self.gpu_instance_id is None else self.gpu_instance_id
        ci = "?" if self.compute_instance_id is None else self.compute_instance_id
        return f"GI {gi}/CI {ci}" + (f" {self.profile}" if self.profile else "")


def mig_profile(name: str | None) -> str | None:
    """The profile in a MIG device's name ("NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb"), as the driver
    names it; None when the name has none."""
    if not name or " MIG " not in name:
        return None
    tail = name.rsplit(" MIG ", 1)[1].strip()
    return tail or None


@dataclass(frozen=True, init=False)
class GpuProcess:
    """A process holding a context on one device, as the vendor library reports it."""

    pid: int
    index: int  # the backend's device index
    ctx: str = CTX_COMPUTE  # C, G or C+G
    used_memory: int | None = None  # bytes; None under WDDM, on MIG, or when unknown
    sm_util: float | None = None  # percent; None when there are no samples
    visible: bool = True  # False when the vendor names a PID this namespace cannot see
    gpu_instance_id: int | None = None  # MIG: the instance it runs on (None: not MIG)
    compute_instance_id: int | None = None

    def __init__(self, pid: int, index: int, ctx: str = CTX_COMPUTE, used_memory: int | None = None,
                 sm_util: float | None = None, visible: bool = True, gpu_instance_id: int | None = None,
                 compute_instance_id: int | None = None):
        # One update, not the frozen dataclass's object.__setattr__ a field: one a holder a refresh.
        self.__dict__.update(pid=pid, index=index, ctx=ctx, used_memory=used_memory, sm_util=sm_util,
                             visible=visible, gpu_instance_id=gpu_instance_id,
                             compute_instance_id=compute_instance_id)


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend is usable here, and why not."""

    name: str
    available: bool
    reason: str = ""
    devices: int = 0


class ResetError(Exception):
    """A reset that could not be done; the message says why and what to do."""

    def __init__(self, message: str, kind: str = "failed"):
        super().__init__(message)
        self.kind = kind  # permission | display | unsupported | missing-tool | busy | failed


class BackendUnavailable(Exception):
    """Raised by a backend constructor when its library/driver is missing; the message is the reason."""


class Backend(ABC):
    """A source of GPUs. Construct it to open the vendor library; raise BackendUnavailable if it can't."""

    name: str = "backend"
    vendor: str = "unknown"
    # True where utilisation comes from counter deltas (DRM fdinfo): a one-shot reader must sample twice.
    needs_two_samples: bool = False
    # How a backend that must tell whether a PID still runs (the simulated one, as a driver knows which
    # processes hold a context) reads a live process's start time (None: gone or a zombie). The sampler
    # sets it to core.procs.start_time, so that no backend imports core (the layers contract).
    host_start_time = None
    # Where its process list comes from, as a holder's "source" says it (gputop.core.ledger).
    list_source: str = "nvml"

    @abstractmethod
    def device_count(self) -> int: ...

    @abstractmethod
    def sample(self, index: int) -> DeviceSample:
        """Read one device. Must not raise for a lost device or an unsupported field."""

    @abstractmethod
    def processes(self, index: int) -> list[GpuProcess]:
        """The processes holding this device, merged per PID. Must not raise for a lost device."""

    def reset(self, index: int) -> str:
        """Reset the device; return a one-line description of what was done, or raise ResetError."""
        raise ResetError(f"{self.name}: reset is not supported by this backend", kind="unsupported")

    def minor_number(self, index: int) -> int | None:
        """The device's NVIDIA minor number (/dev/nvidiaN: N), which Slurm's gres.conf ``File=`` names: the
        minor of ``device_node`` when that is an NVIDIA node (major 195); None when the backend does not know."""
        rdev = self.device_node(index)
        return os.minor(rdev) if rdev is not None and os.major(rdev) == 195 else None

    def mig_instances(self, index: int) -> list[MigInstance]:
        """The MIG devices of this device, when MIG is on (none otherwise). Must not raise."""
        return []

    def device_node(self, index: int) -> int | None:
        """The device number (``st_rdev``) of this device's node (NVIDIA: /dev/nvidiaN, 195:N), or None when
        unknown: the sampler then looks for no device-file holders of it (gputop.core.devholders)."""
        return None

    def warnings(self) -> list[str]:
        """Conditions worth showing the user (e.g. processes whose data could not be read)."""
        return []

    def close(self) -> None:
        """Release the vendor library handle."""


@dataclass
class ProbeResult:
    """What probe() found: the backends that opened, and a status line for every backend tried."""

    backends: list[Backend] = field(default_factory=list)
    statuses: list[BackendStatus] = field(default_factory=list)
