"""NVIDIA GPUs through NVML: libnvidia-ml.so.1 called straight through ctypes (no nvidia-ml-py).

Every field is read on its own: NotSupported, FunctionNotFound or any other NVML error on one field makes
that field None (unknown, never 0) and adds a short entry to ``DeviceSample.errors``. GPU_IS_LOST, or a
handle that cannot be had, makes the whole device ``lost``. The process lists are the expensive calls
(milliseconds, under a driver lock): ``processes()`` calls each list once, and the sampler decides how
often ``processes()`` runs.

NVML has no reset call. ``reset()`` runs ``nvidia-smi --gpu-reset``, which needs root, a GPU that drives
no display and that no process uses, our own NVML handle included: so NVML is shut down around it.
"""

from __future__ import annotations

import ctypes
import operator
import os
import struct
import threading

TYPE_CHECKING = False  # typing is not imported at run time (start-up: ~2 ms of a one-shot command)
if TYPE_CHECKING:
    from typing import Any, Callable

from gputop.backends.base import (
    CTX_BOTH, CTX_COMPUTE, CTX_GRAPHICS, Backend, BackendUnavailable, DeviceSample, GpuProcess,
    MigInstance, ResetError,
)
from gputop.backends.nvml_mig import MigLost, MigReader

# NVML return codes (nvml.h).
ERR_UNINITIALIZED = 1
ERR_NOT_SUPPORTED = 3
ERR_NO_PERMISSION = 4
ERR_NOT_FOUND = 6
ERR_DRIVER_NOT_LOADED = 9
ERR_LIBRARY_NOT_FOUND = 12
ERR_FUNCTION_NOT_FOUND = 13
ERR_GPU_IS_LOST = 15
ERR_LIB_RM_VERSION_MISMATCH = 18
ERR_ARGUMENT_VERSION_MISMATCH = 25
NVIDIA_MAJOR = 195  # /dev/nvidiaN is char 195:N; /dev/nvidiactl is 195:255
ERROR_NAMES = {
    1: "Uninitialized", 2: "InvalidArgument", 3: "NotSupported", 4: "NoPermission",
    5: "AlreadyInitialized", 6: "NotFound", 7: "InsufficientSize", 8: "InsufficientPower",
    9: "DriverNotLoaded", 10: "Timeout", 11: "IrqIssue", 12: "LibraryNotFound", 13: "FunctionNotFound",
    14: "CorruptedInforom", 15: "GpuIsLost", 16: "ResetRequired", 17: "OperatingSystem",
    18: "LibRmVersionMismatch", 19: "InUse", 20: "Memory", 21: "NoData", 25: "ArgumentVersionMismatch",
    999: "Unknown",
}
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long
RESET_TIMEOUT_S = 120.0

# The process-list calls, newest first. "" is the unversioned (v1) call with the 16-byte v1 struct.
PROC_VERSIONS = ("_v3", "_v2", "")


def error_name(code: int | None) -> str:
    """A short name for an NVML return code, for DeviceSample.errors ("NotSupported")."""
    if code is None:
        return "Error"
    return ERROR_NAMES.get(code, f"Error{code}")


def unavailable_reason(code: int | None, detail: str = "") -> str:
    """Why NVML cannot be used, in words a user can act on."""
    if code == ERR_LIBRARY_NOT_FOUND:
        broken = library_load_problem()
        if broken:  # _load() says "not found" for any OSError from dlopen: a garbage file is something else
            return f"nvml: libnvidia-ml.so.1 failed to load: {broken}"
        return "nvml: libnvidia-ml.so.1 not found (no NVIDIA driver installed)"
    if code == ERR_DRIVER_NOT_LOADED:
        return "nvml: driver not loaded (is the nvidia kernel module loaded? try 'nvidia-smi')"
    if code == ERR_NO_PERMISSION:
        return "nvml: no permission to open the GPU devices (/dev/nvidia*); ask for access to them"
    if code == ERR_LIB_RM_VERSION_MISMATCH:
        return "nvml: driver and library versions differ (reload the nvidia module or reboot)"
    return f"nvml: cannot initialise NVML: {detail or error_name(code)}"


def library_load_problem() -> str | None:
    """Why dlopen refuses libnvidia-ml.so.1 when a file by that name exists (a broken or foreign file);
    None when it loads or is simply not there."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        msg = str(e)
        if "No such file or directory" in msg and "cannot open shared object file" in msg:
            return None
        return msg
    return None


def reset_error_kind(output: str) -> str:
    """Classify nvidia-smi --gpu-reset's error text into a ResetError kind."""
    text = output.lower()
    if "not supported" in text:
        return "unsupported"
    if "insufficient permissions" in text or "permission" in text:
        return "permission"
    if "in use" in text or "being used" in text or "processes" in text:
        return "busy"
    return "failed"


def merge_process_lists(compute: list[tuple[int, int | None]],
                        graphics: list[tuple[int, int | None]]) -> dict[int, tuple[str, int | None]]:
    """Merge NVML's compute and graphics lists, (pid, used memory or None), into pid -> (ctx, memory).

    Within one list a PID can appear once per MIG instance: those entries add up. A C+G process appears
    in both lists with its memory on this device, so across lists the larger value is kept, not the sum.
    None (not available) stays None unless the other list knows the value.
    """
    def per_pid(entries):
        out: dict[int, int | None] = {}
        for pid, mem in entries:
            if pid in out:
                prev = out[pid]
                out[pid] = None if prev is None or mem is None else prev + mem
            else:
                out[pid] = mem
        return out

    c, g = per_pid(compute), per_pid(graphics)
    merged: dict[int, tuple[str, int | None]] = {}
    for pid, mem in c.items():
        if pid in g:
            gmem = g[pid]
            merged[pid] = (CTX_BOTH, gmem if mem is None else (mem if gmem is None else max(mem, gmem)))
        else:
            merged[pid] = (CTX_COMPUTE, mem)
    for pid, mem in g.items():
        if pid not in c:
            merged[pid] = (CTX_GRAPHICS, mem)
    return merged


class _ProcessInfoV1(ctypes.Structure):
    # nvmlProcessInfo_v1_t: what the unversioned nvmlDevice*RunningProcesses calls fill.
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _ProcessInfoV2(ctypes.Structure):  # nvmlProcessInfo_t: the _v2 and _v3 calls share it
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _ProcessUtilizationSample(ctypes.Structure):  # nvmlProcessUtilizationSample_t
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


_PROC_STRUCT = {"_v3": _ProcessInfoV2, "_v2": _ProcessInfoV2, "": _ProcessInfoV1}
_LIST_CALLS = {(kind, suffix): f"nvmlDeviceGet{kind}RunningProcesses{suffix}"
               for kind in ("Compute", "Graphics") for suffix in PROC_VERSIONS}
# The same layouts for struct.iter_unpack, which turns a whole filled buffer into tuples in C: reading the
# fields through ctypes makes a struct view per entry and a descriptor call per field (~1 us an entry).
# Native alignment ("@") is the C compiler's, as ctypes lays the structs out; the sizes are checked here.
# Only the fields gputop reads are unpacked ("x": skipped bytes): process infos give (pid, usedGpuMemory),
# utilisation samples (pid, timeStamp, smUtil).
_PROC_FORMAT = {_ProcessInfoV1: struct.Struct("@IQ"), _ProcessInfoV2: struct.Struct("@IQ8x"),
                _ProcessUtilizationSample: struct.Struct("@IQI12x")}
assert all(f.size == ctypes.sizeof(t) for t, f in _PROC_FORMAT.items())
assert all(getattr(t, name).offset == off for t in _PROC_FORMAT
           for name, off in (("pid", 0), ("usedGpuMemory" if t is not _ProcessUtilizationSample else "timeStamp", 8)))
assert _ProcessUtilizationSample.smUtil.offset == 16
# _read's plain fields, one C call each (the clock call twice: SM, then memory).
_READ_CALLS = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
               "nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetFanSpeed", "nvmlDeviceGetClockInfo")


def _missing(*_args) -> int:
    """Stands in for a C function this driver's library lacks."""
    return ERR_FUNCTION_NOT_FOUND


_NOT_AVAILABLE_BYTES = NOT_AVAILABLE.to_bytes(8, "little")  # all ones: the same in either byte order


def _unpack(buf, n: int) -> tuple[list[tuple], bytes]:
    """The first ``n`` entries of a filled ctypes array of one of _PROC_FORMAT's structs, as tuples of
    the fields _PROC_FORMAT reads, and the raw bytes they came from."""
    if not n:
        return [], b""
    fmt = _PROC_FORMAT[buf._type_]
    raw = bytes(memoryview(buf).cast("B")[:n * fmt.size])
    return list(fmt.iter_unpack(raw)), raw
NVML_SUCCESS, ERR_INSUFFICIENT_SIZE = 0, 7
_TIMESTAMP = operator.itemgetter(1)  # of an unpacked utilisation sample


# The device fields, read straight through ctypes into these (nvml.h layouts): nvidia-ml-py's structs
# reroute every field access through Python (__getattribute__/__setattr__), and each of its calls makes a
# new struct and looks its function up under a lock, for eight calls a device a refresh.
class _Memory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _MemoryV2(ctypes.Structure):  # nvmlMemory_v2_t
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _Utilization(ctypes.Structure):  # nvmlUtilization_t
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _TemperatureV1(ctypes.Structure):  # nvmlTemperature_v1_t
    _fields_ = [("version", ctypes.c_uint), ("sensorType", ctypes.c_uint), ("temperature", ctypes.c_int)]


MEMORY_V2 = ctypes.sizeof(_MemoryV2) | (2 << 24)  # nvmlMemory_v2 (NVML_STRUCT_VERSION(Memory, 2))
TEMPERATURE_V1 = ctypes.sizeof(_TemperatureV1) | (1 << 24)  # nvmlTemperature_v1
TEMPERATURE_GPU, CLOCK_SM, CLOCK_MEM = 0, 1, 2  # nvmlTemperatureSensors_t, nvmlClockType_t


# ---- the library ----------------------------------------------------------------------------------
# nvidia-ml-py (pynvml) is not used: importing it costs ~2.7 MiB and its wrappers allocate a struct and take
# a lock per call. The calls below are the few the backend makes; the layouts are nvml.h's.

class NvmlError(Exception):
    """An NVML call returned ``value`` (an nvmlReturn_t other than SUCCESS)."""

    def __init__(self, value: int, text: str | None = None):
        super().__init__(text or error_name(value))
        self.value = value


class _PciInfo(ctypes.Structure):  # nvmlPciInfo_t (nvmlDeviceGetPciInfo_v3)
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


NAME_BUFFER_SIZE = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE
FEATURE_ENABLED = 1  # nvmlEnableState_t
_LIB: Any = None
_LIB_LOCK = threading.Lock()


def _load():
    """libnvidia-ml.so.1 (nvml.dll on Windows), loaded once per process; NvmlError(LIBRARY_NOT_FOUND)
    when it cannot be loaded (library_load_problem() says why, for a file that exists)."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            if os.name == "nt":
                names = [os.path.join(os.getenv("WINDIR", "C:/Windows"), "System32/nvml.dll"),
                         os.path.join(os.getenv("ProgramFiles", "C:/Program Files"),
                                      "NVIDIA Corporation/NVSMI/nvml.dll")]
            else:
                names = ["libnvidia-ml.so.1"]
            for name in names:
                try:
                    _LIB = ctypes.CDLL(name)
                    break
                except OSError:
                    continue
            else:
                raise NvmlError(ERR_LIBRARY_NOT_FOUND)
        return _LIB


def _symbol(lib, name: str):
    """The C function ``name``; NvmlError(FUNCTION_NOT_FOUND) when this driver's library lacks it."""
    try:
        return getattr(lib, name)
    except AttributeError:
        raise NvmlError(ERR_FUNCTION_NOT_FOUND) from None


def _check(ret: int) -> None:
    if ret != NVML_SUCCESS:
        raise NvmlError(ret, _error_string(ret))


def _error_string(ret: int) -> str | None:
    """The library's own words for a return code (nvmlErrorString), if it has them."""
    try:
        fn = getattr(_LIB, "nvmlErrorString")
        fn.restype = ctypes.c_char_p
        text = fn(ret)
    except Exception:
        return None
    return text.decode(errors="replace") if text else None


class _Lost(Exception):
    pass


def _failed(errors: list[str], label: str, ret: int) -> None:
    """A field's call returned ``ret`` (not SUCCESS): GPU_IS_LOST raises _Lost, any other error is
    noted in ``errors``; the field is unknown (None)."""
    if ret == ERR_GPU_IS_LOST:
        raise _Lost(label)
    errors.append(f"{label}: {error_name(ret)}")


class NvmlBackend(Backend):
    name = "nvml"
    vendor = "nvidia"

    def __init__(self):
        self._lib: Any = None
        self._lock = threading.RLock()
        self._handles: dict[int, Any] = {}
        self._static: dict[int, dict[str, Any]] = {}  # name, uuid, pci bus id: they do not change
        self._last_seen: dict[int, int] = {}  # device -> newest process-utilisation sample seen (us)
        self._proc_version: dict[str, int] = {"Compute": 0, "Graphics": 0}  # index into PROC_VERSIONS
        self._list_calls: dict[str, tuple[str, Any, Any]] = {}  # _list_call()
        self._last_procs: dict[int, dict[int, GpuProcess]] = {}  # device -> its last processes() by pid
        # The process and utilisation lists are read straight through ctypes into buffers kept per
        # (call, device): nvidia-ml-py sizes, allocates and converts a new array on every call, which
        # cost more than the rest of a sample (see benchmarks/RESULTS.md).
        self._fns: dict[str, Any] = {}
        self._bufs: dict[tuple[str, int], Any] = {}
        self._mem_v2: bool | None = None  # None: not tried yet; False: fall back for good
        self._memory_v2, self._memory_v1, self._util = _MemoryV2(), _Memory(), _Utilization()
        self._temp_v1, self._uint = _TemperatureV1(), ctypes.c_uint()
        self._list_count = ctypes.c_uint()  # _fill's element count, in and out
        self._since = ctypes.c_ulonglong()  # _sm_utils' lastSeenTimeStamp (calls run under _lock)
        # byref() of each kept struct, made once: every refresh passes them again (calls run under _lock).
        self._memory_v2_ref, self._memory_v1_ref = ctypes.byref(self._memory_v2), ctypes.byref(self._memory_v1)
        self._util_ref, self._temp_v1_ref = ctypes.byref(self._util), ctypes.byref(self._temp_v1)
        self._uint_ref, self._list_count_ref = ctypes.byref(self._uint), ctypes.byref(self._list_count)
        self._temp_v: bool | None = None
        self._read_calls: tuple | None = None  # _read_fns()
        self._warnings: list[str] = []
        self._minors: dict[int, int | None] = {}  # device -> its node's st_rdev (device_node), once read
        self._initialised = False
        self._mig = MigReader(self._ret, error_name)  # MIG devices and their holders (nvml_mig)
        self._init()
        try:
            self._count = self._device_count()
        except NvmlError as e:
            self.close()
            raise BackendUnavailable(f"nvml: cannot count devices: {e}") from None

    # ---- library lifetime ----
    def _init(self) -> None:
        try:
            self._lib = _load()
            _check(self._first_fn("nvmlInit_v2", "nvmlInit")())
        except NvmlError as e:
            raise BackendUnavailable(unavailable_reason(e.value, str(e))) from None
        self._initialised = True
        self._handles.clear()
        self._mig.clear()

    def close(self) -> None:
        with self._lock:
            if not self._initialised:
                return
            self._initialised = False
            self._handles.clear()
            try:
                _check(self._fn("nvmlShutdown")())
            except NvmlError:
                pass

    def device_count(self) -> int:
        return self._count

    def _device_count(self) -> int:
        n = ctypes.c_uint()
        _check(self._first_fn("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount")(ctypes.byref(n)))
        return int(n.value)

    def _handle(self, index: int):
        h = self._handles.get(index)
        if h is None:
            if not self._initialised:
                raise _Lost("NVML is not initialised")
            h = ctypes.c_void_p()  # nvmlDevice_t
            _check(self._first_fn("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex")(
                index, ctypes.byref(h)))
            self._handles[index] = h
        return h

    # ---- one device ----
    def _field(self, errors: list[str], label: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except NvmlError as e:
            code = e.value
            if code == ERR_GPU_IS_LOST:
                raise _Lost(label) from None
            errors.append(f"{label}: {error_name(code)}")
            return None

    def _static_info(self, index: int, h, errors: list[str]) -> dict[str, Any]:
        info = self._static.get(index)
        if info is not None:
            return info
        info = {"name": self._field(errors, "name", lambda: self._string("nvmlDeviceGetName", h)),
                "uuid": self._field(errors, "uuid", lambda: self._string("nvmlDeviceGetUUID", h))}
        pci = self._field(errors, "pci", lambda: self._pci(h))
        info["pci_bus_id"] = _text(pci.busId) if pci is not None else None
        for k in ("name", "uuid", "pci_bus_id"):
            if isinstance(info[k], bytes):
                info[k] = info[k].decode(errors="replace")
        if all(info[k] is not None for k in info):
            self._static[index] = info
        return info

    def _string(self, name: str, h) -> bytes:
        """A call that fills a text buffer (name, UUID)."""
        buf = ctypes.create_string_buffer(NAME_BUFFER_SIZE)
        _check(self._fn(name)(h, buf, ctypes.c_uint(NAME_BUFFER_SIZE)))
        return buf.value

    def _pci(self, h) -> _PciInfo:
        pci = _PciInfo()
        _check(self._fn("nvmlDeviceGetPciInfo_v3")(h, ctypes.byref(pci)))
        return pci

    def _ret(self, name: str, *args) -> int | None:
        """One NVML call through its C function: the status it returns (FUNCTION_NOT_FOUND when the
        driver lacks the function)."""
        try:
            return self._fn(name)(*args)
        except NvmlError as e:
            return e.value

    def _call(self, name: str, *args) -> int:
        """``_ret`` for a refresh's calls: the kept C function straight away once it has been found (each
        field is read many times a second; the function lookup and its error handling run once)."""
        fn = self._fns.get(name)
        return fn(*args) if fn is not None else self._ret(name, *args)

    def _memory(self, h, errors: list[str]) -> tuple[int | None, int | None]:
        if self._mem_v2 is not False:
            m = self._memory_v2
            m.version = MEMORY_V2
            ret = self._call("nvmlDeviceGetMemoryInfo_v2", h, self._memory_v2_ref)
            if ret == NVML_SUCCESS:
                self._mem_v2 = True
                return int(m.total), int(m.used)  # v2 "used" leaves out the driver-reserved memory
            if ret == ERR_GPU_IS_LOST:
                raise _Lost("memory")
            if ret not in (ERR_FUNCTION_NOT_FOUND, ERR_ARGUMENT_VERSION_MISMATCH):
                errors.append(f"memory: {error_name(ret)}")
                return None, None
            self._mem_v2 = False
        m1 = self._memory_v1
        ret = self._call("nvmlDeviceGetMemoryInfo", h, self._memory_v1_ref)
        if ret == NVML_SUCCESS:
            return int(m1.total), int(m1.used)
        _failed(errors, "memory", ret)
        return None, None

    def _temperature(self, h, errors: list[str]) -> float | None:
        # nvmlDeviceGetTemperature is deprecated (to go in CUDA 14); older drivers lack the V call.
        if self._temp_v is not False:
            t = self._temp_v1
            t.version, t.sensorType = TEMPERATURE_V1, TEMPERATURE_GPU
            ret = self._call("nvmlDeviceGetTemperatureV", h, self._temp_v1_ref)
            if ret == NVML_SUCCESS:
                self._temp_v = True
                return t.temperature
            if ret == ERR_GPU_IS_LOST:
                raise _Lost("temperature")
            if ret not in (ERR_FUNCTION_NOT_FOUND, ERR_ARGUMENT_VERSION_MISMATCH):
                errors.append(f"temperature: {error_name(ret)}")
                return None
            self._temp_v = False
        ret = self._call("nvmlDeviceGetTemperature", h, TEMPERATURE_GPU, self._uint_ref)
        return self._uint.value if ret == NVML_SUCCESS else _failed(errors, "temperature", ret)

    def sample(self, index: int) -> DeviceSample:
        with self._lock:
            errors: list[str] = []
            info: dict[str, Any] = self._static.get(index, {})
            try:
                h = self._handle(index)
                info = self._static_info(index, h, errors)
                self._mig.refresh(index, h)  # MIG can be turned on or off, instances made or destroyed
                return self._read(index, h, info, errors)
            except (_Lost, MigLost) as e:
                return DeviceSample(index=index, lost=True, errors=(f"{e}: GPU is lost",), **info)
            except NvmlError as e:  # the handle itself
                self._handles.pop(index, None)
                return DeviceSample(index=index, lost=True, errors=(f"handle: {error_name(e.value)}",), **info)

    def _read_fns(self) -> tuple:
        """The C functions of a refresh's plain fields (_READ_CALLS' order), looked up once; a function
        this driver lacks answers FUNCTION_NOT_FOUND, as a missing field does."""
        fns = self._read_calls
        if fns is None:
            out = []
            for name in _READ_CALLS:
                try:
                    out.append(self._fn(name))
                except NvmlError as e:
                    if e.value != ERR_FUNCTION_NOT_FOUND:  # not loaded: look again next time
                        raise
                    out.append(_missing)
            fns = self._read_calls = tuple(out)
        return fns

    def _read(self, index: int, h, info: dict, errors: list[str]) -> DeviceSample:
        # Straight-line: eight fields a device a refresh, each one C call into a kept struct or uint; a
        # failed call makes its field None through _failed (GPU_IS_LOST raises _Lost).
        util_fn, power_fn, enforced_fn, limit_fn, fan_fn, clock_fn = self._read_fns()
        total, used = self._memory(h, errors)
        u, n, nref, failed = self._util, self._uint, self._uint_ref, _failed
        ret = util_fn(h, self._util_ref)
        util_gpu, util_mem = (float(u.gpu), float(u.memory)) if not ret else (failed(errors, "utilization", ret),
                                                                              None)
        temp = self._temperature(h, errors)
        ret = power_fn(h, nref)
        power = n.value / 1000.0 if not ret else failed(errors, "power", ret)
        ret = enforced_fn(h, nref)
        if ret:  # the enforced limit unknown (not an error to report): the management limit
            if ret == ERR_GPU_IS_LOST:
                raise _Lost("power limit")
            ret = limit_fn(h, nref)
        limit = n.value / 1000.0 if not ret else failed(errors, "power limit", ret)
        ret = fan_fn(h, nref)
        fan = float(n.value) if not ret else failed(errors, "fan", ret)
        ret = clock_fn(h, CLOCK_SM, nref)
        sm = n.value if not ret else failed(errors, "sm clock", ret)
        ret = clock_fn(h, CLOCK_MEM, nref)
        mem_clock = n.value if not ret else failed(errors, "memory clock", ret)
        return DeviceSample(
            index, info.get("name"), info.get("uuid"), info.get("pci_bus_id"), total, used, util_gpu, util_mem,
            float(temp) if temp is not None else None, power, limit, fan, sm, mem_clock, False,
            tuple(errors) if errors else (), self.name, index, self._mig.mode(index))

    # ---- processes ----
    def _fn(self, name: str):
        fn = self._fns.get(name)
        if fn is None:  # raises NvmlError(FUNCTION_NOT_FOUND) when the driver lacks it
            if self._lib is None:
                raise NvmlError(ERR_UNINITIALIZED)
            fn = self._fns[name] = _symbol(self._lib, name)
        return fn

    def _first_fn(self, *names: str):
        """The first of ``names`` (newest version first) that the library has."""
        for name in names[:-1]:
            try:
                return self._fn(name)
            except NvmlError:
                continue
        return self._fn(names[-1])

    def _fill(self, key: tuple[str, int], struct, fn, h, since: Any = None) -> tuple[Any, int]:
        """Run an NVML list call into this key's buffer, growing it on INSUFFICIENT_SIZE.

        ``fn`` is a process-list call, ``fn(h, count*, array*)``, or with ``since`` the utilisation
        samples call, ``fn(h, array*, count*, since)``; it returns the NVML status. The first call asks for
        the size (NULL buffer, count 0), like the library's own size-query protocol; later calls reuse the
        buffer, so a steady list costs one C call and no allocation.
        """
        buf = self._bufs.get(key)
        count, ref = self._list_count, self._list_count_ref
        for _ in range(4):
            count.value = len(buf) if buf is not None else 0
            ret = fn(h, ref, buf) if since is None else fn(h, buf, ref, since)
            if ret == NVML_SUCCESS:
                return buf, (count.value if buf is not None else 0)
            if ret != ERR_INSUFFICIENT_SIZE:
                raise NvmlError(ret)
            buf = self._bufs[key] = (struct * (count.value * 2 + 8))()  # room for processes that start meanwhile
        raise NvmlError(ERR_INSUFFICIENT_SIZE)

    def _list_call(self, kind: str) -> tuple[str, Any, Any]:
        """The newest process-list call of ``kind`` this library has (_v3, _v2, then v1), as (name, C
        function, struct): found once, then kept."""
        call = self._list_calls.get(kind)
        if call is None:
            for version in range(self._proc_version[kind], len(PROC_VERSIONS)):
                name = _LIST_CALLS[kind, PROC_VERSIONS[version]]
                try:
                    fn = self._fn(name)
                except NvmlError as e:
                    if e.value == ERR_FUNCTION_NOT_FOUND and version + 1 < len(PROC_VERSIONS):
                        continue
                    raise
                self._proc_version[kind] = version
                call = self._list_calls[kind] = (name, fn, _PROC_STRUCT[PROC_VERSIONS[version]])
                break
        return call

    def _list(self, kind: str, h, index: int) -> list[tuple[int, int | None]]:
        """One process list ("Compute" or "Graphics")."""
        while True:
            name, fn, struct = self._list_call(kind)
            try:
                buf, n = self._fill((name, index), struct, fn, h)
                break
            except NvmlError as e:  # the call itself says FunctionNotFound: the next older one
                if e.value == ERR_FUNCTION_NOT_FOUND and self._proc_version[kind] + 1 < len(PROC_VERSIONS):
                    self._proc_version[kind] += 1  # remembered: later calls go straight to it
                    del self._list_calls[kind]
                    continue
                raise
        if not n:  # no buffer yet when n is 0
            return []
        # NOT_AVAILABLE memory is None (unknown): the entries are looked at one by one only when those
        # bytes occur anywhere in the list.
        entries, raw = _unpack(buf, n)
        if _NOT_AVAILABLE_BYTES in raw:
            na = NOT_AVAILABLE
            return [(pid, None if mem == na else mem) for pid, mem in entries]
        return entries

    def _sm_utils(self, index: int, h) -> dict[int, float]:
        since = self._since
        since.value = self._last_seen.get(index, 0)
        try:
            buf, n = self._fill(("nvmlDeviceGetProcessUtilization", index), _ProcessUtilizationSample,
                                self._fn("nvmlDeviceGetProcessUtilization"), h, since)
            samples = _unpack(buf, n)[0]  # (pid, timeStamp, smUtil)
        except NvmlError as e:
            code = e.value
            if code == ERR_GPU_IS_LOST:
                raise _Lost("process utilization") from None
            if code not in (ERR_NOT_FOUND, ERR_NOT_SUPPORTED, ERR_FUNCTION_NOT_FOUND):
                self._warnings.append(f"nvml: GPU {index} per-process utilisation: {error_name(code)}")
            return {}  # NOT_FOUND: no samples since the last one seen
        if not samples:
            return {}
        # Each PID's newest sample (of equal times, the later entry): sorted by time (stable), the last
        # entry of a PID is the one the dict keeps.
        samples.sort(key=_TIMESTAMP)
        newest = samples[-1][1]
        if newest > self._last_seen.get(index, 0):
            self._last_seen[index] = newest
        return {pid: float(sm) for pid, _, sm in samples}

    def _list_or_none(self, kind: str, h, index: int) -> list[tuple[int, int | None]]:
        """``_list``, or no entries when the call fails (GPU_IS_LOST raises _Lost; any error other than
        NOT_SUPPORTED is a warning)."""
        try:
            return self._list(kind, h, index)
        except NvmlError as e:
            code = e.value
            if code == ERR_GPU_IS_LOST:
                raise _Lost(kind) from None
            if code != ERR_NOT_SUPPORTED:
                self._warnings.append(f"nvml: GPU {index} {kind.lower()} process list: {error_name(code)}")
            return []

    def processes(self, index: int) -> list[GpuProcess]:
        with self._lock:
            try:
                h = self._handle(index)
                if self._mig.enabled(index, h):  # holders placed on their MIG devices
                    return self._mig.processes(index, h, lambda mh, key: merge_process_lists(
                        self._list("Compute", mh, key), self._list_or_none("Graphics", mh, key)))
                compute, graphics = self._list_or_none("Compute", h, index), \
                    self._list_or_none("Graphics", h, index)
                # The usual list: compute contexts only, one entry a process (no merging to do).
                plain = not graphics and len(dict(compute)) == len(compute)
                merged = {} if plain else merge_process_lists(compute, graphics)
                sm = self._sm_utils(index, h) if compute or merged else {}
            except (_Lost, MigLost, NvmlError):
                return []
        # Whether this PID namespace can see the PID is decided by the sampler, which reads every
        # holder's /proc entry anyway (NVML reports host PIDs, even inside a container).
        # The same GpuProcess as last refresh where nothing about it changed (they are frozen): most
        # holders keep their memory and SM% from one refresh to the next, and a lookup costs a fifth of a
        # new object.
        smget, prev, out = sm.get, self._last_procs.get(index, {}), []
        append, last, ctx = out.append, prev.get, CTX_COMPUTE
        if not plain:
            ctx_of = {pid: c for pid, (c, _) in merged.items()}.__getitem__
            compute = [(pid, mem) for pid, (_, mem) in merged.items()]
        for pid, mem in compute:
            util = smget(pid)
            if not plain:
                ctx = ctx_of(pid)
            p = last(pid)
            if p is None or p.used_memory != mem or p.sm_util != util or p.ctx != ctx:
                p = GpuProcess(pid, index, ctx, mem, util)
            append(p)
        self._last_procs[index] = {p.pid: p for p in out}
        return out

    def mig_instances(self, index: int) -> list[MigInstance]:
        with self._lock:
            try:
                return self._mig.instances(index, self._handle(index))
            except (_Lost, MigLost, NvmlError):
                return []

    def device_node(self, index: int) -> int | None:
        """The device's node number: major 195, minor from nvmlDeviceGetMinorNumber (read once; None when
        the driver does not say, or the device cannot be reached now)."""
        with self._lock:
            if index in self._minors:
                return self._minors[index]
            try:
                h = self._handle(index)
            except (NvmlError, _Lost):
                return None
            minor = ctypes.c_uint()
            ret = self._ret("nvmlDeviceGetMinorNumber", h, ctypes.byref(minor))
            rdev = os.makedev(NVIDIA_MAJOR, int(minor.value)) if ret == NVML_SUCCESS else None
            if ret in (NVML_SUCCESS, ERR_NOT_SUPPORTED, ERR_FUNCTION_NOT_FOUND):  # else try again next time
                self._minors[index] = rdev
            return rdev

    def warnings(self) -> list[str]:
        with self._lock:
            out, self._warnings = self._warnings + self._mig.warnings, []
            self._mig.warnings = []
        return out

    # ---- reset ----

    def reset(self, index: int) -> str:
        """Refuse (ResetError) without root, on a GPU driving a display, on a GPU in use, or without
        nvidia-smi; else shut NVML down, run nvidia-smi --gpu-reset, and re-open NVML whatever happened."""
        if not 0 <= index < self._count:
            raise ResetError(f"nvml: no GPU {index} (NVML sees {self._count})", kind="failed")
        if hasattr(os, "geteuid") and os.geteuid() != 0:
            raise ResetError(f"nvml: resetting GPU {index} needs root", kind="permission")
        with self._lock:
            try:
                h = self._handle(index)
            except (_Lost, NvmlError) as e:
                h = None  # a lost GPU is what a reset is for: name it as last seen
                info = self._static.get(index) or {}
                target = info.get("pci_bus_id") or info.get("uuid") or str(index)
                note = f" (its NVML handle failed: {e})"
            if h is not None:
                note = ""
                _check_display(self._ret, index, h)
                holders = [p.pid for p in self.processes(index)]
                if index in self._mig.unseen:  # "cannot see" is never "gone"
                    raise ResetError(f"nvml: GPU {index} has MIG on and its holders cannot be read (no process "
                                     "list answers); not resetting what may be in use", kind="busy")
                if holders:
                    raise ResetError(f"nvml: GPU {index} is in use by pid(s) {', '.join(map(str, holders))}",
                                     kind="busy")
                # nvidia-smi's -i numbering can differ from NVML's: name the device by PCI bus id, else UUID.
                info = self._static_info(index, h, [])
                target = info.get("pci_bus_id") or info.get("uuid") or str(index)
            import shutil
            import subprocess  # only a reset runs it (start-up of every other command)

            smi = shutil.which("nvidia-smi")
            if smi is None:
                raise ResetError("nvml: nvidia-smi not found on PATH (NVML has no reset call; gputop resets "
                                 "NVIDIA GPUs with 'nvidia-smi --gpu-reset')", kind="missing-tool")
            # Our own NVML handle counts as a user of the GPU: shut it down for the reset.
            self.close()
            try:
                r = subprocess.run([smi, "--gpu-reset", "-i", target], capture_output=True, text=True,
                                   timeout=RESET_TIMEOUT_S)
                out = " ".join((r.stdout + "\n" + r.stderr).split())
                rc = r.returncode
            except subprocess.TimeoutExpired:
                out, rc = f"nvidia-smi did not finish within {RESET_TIMEOUT_S:.0f}s", -1
            except OSError as e:
                out, rc = f"cannot run nvidia-smi: {e}", -1
            finally:
                self._reinit()
        if rc != 0:
            raise ResetError(f"nvml: nvidia-smi --gpu-reset -i {target} failed: {out or f'exit {rc}'}{note}",
                             kind=reset_error_kind(out))
        return f"GPU {index} ({target}) reset with nvidia-smi: {out or 'done'}"

    def _reinit(self) -> None:
        try:
            self._init()
            self._count = self._device_count()
        except (BackendUnavailable, NvmlError) as e:
            self._warnings.append(f"nvml: could not re-initialise NVML after the reset: {e}")


def _check_display(call, index: int, h) -> None:
    """ResetError when GPU ``index`` drives a display (a display is initialised on it: DisplayActive);
    ``call(name, *args)`` is the backend's C call. Not DisplayMode: a headless H200 answers Enabled there
    (driver 580, docs/hardware.md), which would refuse every reset of a data-centre GPU."""
    state = ctypes.c_int()  # nvmlEnableState_t
    if call("nvmlDeviceGetDisplayActive", h, ctypes.byref(state)) != NVML_SUCCESS:
        return  # unknown: nvidia-smi will refuse if it must
    if state.value == FEATURE_ENABLED:
        raise ResetError(f"nvml: GPU {index} drives a display (display active)", kind="display")


def _text(v) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


__all__ = ["NvmlBackend", "NvmlError", "merge_process_lists", "unavailable_reason", "reset_error_kind", "error_name"]
