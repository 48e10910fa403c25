"""MIG (Multi-Instance GPU) on NVML: which GPUs have MIG on, their MIG devices, and who holds each one.

The calls are nvml.h's: ``nvmlDeviceGetMigMode(dev, &current, &pending)`` (NOT_SUPPORTED: the GPU cannot do
MIG), ``nvmlDeviceGetMaxMigDeviceCount``, ``nvmlDeviceGetMigDeviceHandleByIndex`` (NOT_FOUND: no MIG device
at that index), ``nvmlDeviceGetGpuInstanceId`` / ``nvmlDeviceGetComputeInstanceId`` on a MIG handle, and name,
UUID and memory on a MIG handle. Holders are read from each MIG handle's own process lists: the parent's
aggregate list is for privileged callers only (NO_PERMISSION otherwise), and a MIG handle's list places every
holder on its instance without it. Utilisation answers NOT_SUPPORTED on a MIG device and on a MIG-enabled
parent (device and per process): it stays None (N/A), never 0; where a MIG handle does answer it, it is
shown, with "nvml" as its source.

The backend hands this reader its one C-call helper (``call(name, *args) -> return code``); nothing here
imports gputop.backends.nvml.
"""

from __future__ import annotations

import ctypes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

from gputop.backends.base import GpuProcess, MigInstance, mig_profile

SUCCESS, NOT_SUPPORTED, NOT_FOUND, FUNCTION_NOT_FOUND, GPU_IS_LOST = 0, 3, 6, 13, 15
MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
NO_ID = 0xFFFFFFFF
NAME_SIZE = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE
MAX_MIG = 7  # more MIG devices than any GPU has (A100/H100/H200: 7), if the count itself fails


class _Memory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MigLost(Exception):
    """The parent GPU answered GPU_IS_LOST."""


class MigReader:
    """MIG state per GPU of one NVML backend. ``refresh(index, h)`` re-reads the mode and forgets the MIG
    handles (a sample calls it: instances can be made and destroyed while the GPU runs)."""

    def __init__(self, call: Callable[..., int], error_name: Callable[[int], str]):
        self._call, self._error_name = call, error_name
        self._enabled: dict[int, bool] = {}
        self._capable: dict[int, bool | None] = {}  # GetMigMode answered (the GPU can do MIG)
        self._handles: dict[int, list[tuple[int, Any, int | None, int | None]]] = {}
        self.warnings: list[str] = []  # the backend hands them on with its own (NvmlBackend.warnings)
        self.unseen: set[int] = set()  # GPUs whose holders could not be read at all (last processes())

    def clear(self) -> None:
        """Forget every handle (NVML was shut down or opened again)."""
        self._enabled.clear()
        self._capable.clear()
        self._handles.clear()

    def refresh(self, index: int, h) -> bool:
        """Read the current MIG mode of GPU ``index`` again; True when MIG is on. A GPU that answered
        NOT_SUPPORTED cannot do MIG: it is not asked again (until NVML is opened again: ``clear``)."""
        if self._capable.get(index) is False:
            return False
        cur, pend = ctypes.c_uint(), ctypes.c_uint()
        ret = self._call("nvmlDeviceGetMigMode", h, ctypes.byref(cur), ctypes.byref(pend))
        if ret == GPU_IS_LOST:
            raise MigLost("mig mode")
        on = ret == SUCCESS and cur.value == MIG_ENABLED
        self._enabled[index] = on
        # True: MIG-capable; False for good (NOT_SUPPORTED, or a library without the call); None: ask again
        self._capable[index] = True if ret == SUCCESS else False if ret in (NOT_SUPPORTED, FUNCTION_NOT_FOUND) else None
        self._handles.pop(index, None)
        return on

    def mode(self, index: int) -> bool | None:
        """The MIG mode last read: True on, False off, None when the GPU cannot do MIG (or not read yet)."""
        return self._enabled.get(index) if self._capable.get(index) else None

    def enabled(self, index: int, h) -> bool:
        on = self._enabled.get(index)
        return self.refresh(index, h) if on is None else on

    def _uint(self, name: str, h) -> int | None:
        v = ctypes.c_uint()
        ret = self._call(name, h, ctypes.byref(v))
        if ret == GPU_IS_LOST:
            raise MigLost(name)
        return v.value if ret == SUCCESS and v.value != NO_ID else None

    def handles(self, index: int, h) -> list[tuple[int, Any, int | None, int | None]]:
        """(mig index, MIG handle, GPU instance id, compute instance id) of each MIG device of GPU ``index``;
        none when MIG is off."""
        found = self._handles.get(index)
        if found is not None:
            return found
        found = []
        if self.enabled(index, h):
            n = self._uint("nvmlDeviceGetMaxMigDeviceCount", h)
            for i in range(MAX_MIG if n is None else n):
                mh = ctypes.c_void_p()
                ret = self._call("nvmlDeviceGetMigDeviceHandleByIndex", h, i, ctypes.byref(mh))
                if ret == GPU_IS_LOST:
                    raise MigLost("mig device handle")
                if ret != SUCCESS:  # NOT_FOUND: no MIG device at this index (the next may have one)
                    continue
                found.append((i, mh, self._uint("nvmlDeviceGetGpuInstanceId", mh),
                              self._uint("nvmlDeviceGetComputeInstanceId", mh)))
        self._handles[index] = found
        return found

    def _text(self, name: str, mh, errors: list[str], label: str) -> str | None:
        buf = ctypes.create_string_buffer(NAME_SIZE)
        ret = self._call(name, mh, buf, ctypes.c_uint(NAME_SIZE))
        if ret != SUCCESS:
            errors.append(f"{label}: {self._error_name(ret)}")
            return None
        return buf.value.decode(errors="replace")

    def instances(self, index: int, h) -> list[MigInstance]:
        """The MIG devices of GPU ``index``: ids, profile, UUID, memory; utilisation where NVML has it."""
        out = []
        for i, mh, gi, ci in self.handles(index, h):
            errors: list[str] = []
            name = self._text("nvmlDeviceGetName", mh, errors, "name")
            uuid = self._text("nvmlDeviceGetUUID", mh, errors, "uuid")
            mem = _Memory()
            ret = self._call("nvmlDeviceGetMemoryInfo", mh, ctypes.byref(mem))
            total, used = (int(mem.total), int(mem.used)) if ret == SUCCESS else (None, None)
            util = ctypes.c_uint * 2
            rates = util()
            ret = self._call("nvmlDeviceGetUtilizationRates", mh, ctypes.byref(rates))
            busy = float(rates[0]) if ret == SUCCESS else None  # NOT_SUPPORTED on MIG: N/A, not 0
            out.append(MigInstance(gpu=index, mig_index=i, gpu_instance_id=gi, compute_instance_id=ci,
                                   profile=mig_profile(name), uuid=uuid, name=name, memory_total=total,
                                   memory_used=used, util_gpu=busy, util_source="nvml" if busy is not None else None,
                                   errors=tuple(errors)))
        return out

    def processes(self, index: int, h, read_lists: Callable[[Any, str], dict]) -> list[GpuProcess]:
        """The holders of GPU ``index``, one GpuProcess per (process, MIG device), placed by the MIG handle
        whose list names them. ``read_lists(handle, key)`` reads a handle's compute and graphics lists
        merged, {pid: (ctx, memory or None)}, and raises when the compute list cannot be read.
        Per-process utilisation is NOT_SUPPORTED on MIG: None.

        A MIG device whose list cannot be read (NVML: not supported in vGPU host mode) must not make its
        holders disappear ("cannot see" is never "gone"): then the GPU's own (aggregate) list is read too,
        and a holder only it names is kept, on no known instance, with a warning."""
        out, failed = [], []
        self.unseen.discard(index)
        for i, mh, gi, ci in self.handles(index, h):
            try:
                lists = read_lists(mh, f"{index} MIG {i}")
            except Exception as e:
                if isinstance(e, MigLost) or getattr(e, "value", None) == GPU_IS_LOST:
                    raise MigLost("mig process list") from None
                failed.append(f"MIG {i}: {e}")
                continue
            out.extend(GpuProcess(pid, index, ctx, mem, None, True, gi, ci) for pid, (ctx, mem) in lists.items())
        if failed:
            seen = {p.pid for p in out}
            try:
                whole = read_lists(h, str(index))
                note = "its holders are read from the GPU's own list, on no known instance"
            except Exception as e:
                if isinstance(e, MigLost) or getattr(e, "value", None) == GPU_IS_LOST:
                    raise MigLost("process list") from None
                whole, note = {}, f"nor can the GPU's own list ({e}): its holders cannot be seen"
                self.unseen.add(index)
            out.extend(GpuProcess(pid, index, ctx, mem) for pid, (ctx, mem) in whole.items() if pid not in seen)
            self.warnings.append(f"nvml: GPU {index}: the process lists of {', '.join(failed)} cannot be read; "
                                 + note)
        return out


__all__ = ["MigReader", "MigLost", "MigInstance"]
