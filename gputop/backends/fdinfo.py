"""DRM fdinfo: per-process GPU memory, engine utilisation and context type for amdgpu, i915 and xe (Linux).

Format: https://docs.kernel.org/gpu/drm-usage-stats.html. For every process we list ``<proc>/<pid>/fd``,
keep the fds that are DRM character devices (major 226), and parse ``<proc>/<pid>/fdinfo/<fd>``:

- memory per region: ``drm-resident-<r>`` if present, else ``drm-memory-<r>`` (deprecated), else
  ``drm-total-<r>``; bytes, or ``KiB``/``MiB``. A client's GPU memory is the sum of its device-local
  regions (``vram*``, ``local*``) when it has any, else of all regions (integrated GPUs use system RAM).
- utilisation per engine: the ``drm-engine-<e>`` ns delta over the wall-clock delta, or on xe the
  ``drm-cycles-<e>`` delta over the ``drm-total-cycles-<e>`` delta, divided by ``drm-engine-capacity-<e>``
  (default 1). A counter lower than before keeps the previous (larger) value, as the spec asks, so the
  delta is 0, never negative. The first sight of a client has no utilisation (None). A process's
  utilisation is its busiest engine, summed over its clients, capped at 100.
- context type from the engines a client has used (counter > 0): gfx/render/rcs -> G, compute/ccs -> C,
  a process holding ``/dev/kfd`` -> C; both -> C+G; a client that has used neither -> G (it opened a
  graphics device and runs no compute).

Clients are deduplicated by (drm-pdev, drm-client-id): fds that share one ``struct drm_file`` (dup, fork,
fd passing) count once, for the lowest PID holding it; other PIDs holding it are still listed as holders
of the device, with 0 bytes (their share is counted on that PID).

Reading another user's fds needs ptrace-read access; such processes are counted, and reported by
``warnings()``, never dropped silently.

Testing with fixture trees: ``proc_root`` and ``sys_root`` are configurable ($GPUTOP_PROC_ROOT,
$GPUTOP_SYS_ROOT). On the real /proc an fd's device number comes from ``os.stat`` (``st_rdev`` of a
character device). A fixture cannot hold device nodes without root, so under a non-default proc root an fd
symlink may point at a small regular file whose content is the device number as ``MAJOR:MINOR`` -- the
format of sysfs ``dev`` attributes (``/sys/class/drm/renderD128/dev`` holds ``226:128``). The same test
(character device, major 226) then runs on that number. ``/dev/kfd`` is recognised by its device number,
read from ``<sys>/class/kfd/kfd/dev``.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from gputop.backends.base import CTX_BOTH, CTX_COMPUTE, CTX_GRAPHICS

ENV_PROC_ROOT = "GPUTOP_PROC_ROOT"
ENV_SYS_ROOT = "GPUTOP_SYS_ROOT"
DRM_MAJOR = 226

GRAPHICS_ENGINES = frozenset({"gfx", "render", "rcs"})
COMPUTE_ENGINES = frozenset({"compute", "ccs"})
_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "ns": 1}


def proc_root_default() -> str:
    return os.environ.get(ENV_PROC_ROOT) or "/proc"


def sys_root_default() -> str:
    return os.environ.get(ENV_SYS_ROOT) or "/sys"


# ---- parsing --------------------------------------------------------------------------------------


def parse_number(value: str) -> int | None:
    """``"1234"``, ``"4 KiB"``, ``"2 MiB"``, ``"5 ns"`` -> an int (bytes or ns); None if malformed."""
    parts = value.split()
    if not parts or len(parts) > 2:
        return None
    unit = parts[1] if len(parts) == 2 else ""
    if unit not in _UNITS:
        return None
    try:
        return int(parts[0]) * _UNITS[unit]
    except ValueError:
        return None


@dataclass(frozen=True)
class FdinfoClient:
    """One DRM fdinfo file, parsed."""

    driver: str
    pdev: str | None = None
    client_id: int | None = None
    memory: dict[str, int] = field(default_factory=dict)  # region -> bytes, by key preference
    engines: dict[str, int] = field(default_factory=dict)  # engine -> busy ns
    cycles: dict[str, int] = field(default_factory=dict)  # engine -> busy cycles (xe)
    total_cycles: dict[str, int] = field(default_factory=dict)  # engine -> total cycles (xe)
    capacity: dict[str, int] = field(default_factory=dict)  # engine -> identical engines

    @property
    def gpu_memory(self) -> int | None:
        """Device-local regions if the client has any, else all regions; None if no memory keys."""
        if not self.memory:
            return None
        local = [v for r, v in self.memory.items() if r.startswith(("vram", "local"))]
        return sum(local) if local else sum(self.memory.values())

    def used_engines(self) -> set[str]:
        used = {e for e, v in self.engines.items() if v > 0}
        used.update(e for e, v in self.cycles.items() if v > 0)
        return used


_MEM_PREF = {"resident": 0, "memory": 1, "total": 2}  # lower wins


def parse_fdinfo(text: str) -> FdinfoClient | None:
    """Parse one fdinfo file; None unless it is a DRM client (has ``drm-driver``)."""
    kv: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.startswith("drm-"):
            kv[key.strip()] = value.strip()
    driver = kv.get("drm-driver")
    if not driver:
        return None
    client_id = None
    if "drm-client-id" in kv:
        try:
            client_id = int(kv["drm-client-id"])
        except ValueError:
            pass
    memory: dict[str, tuple[int, int]] = {}
    engines: dict[str, int] = {}
    cycles: dict[str, int] = {}
    total_cycles: dict[str, int] = {}
    capacity: dict[str, int] = {}
    for key, value in kv.items():
        if key.startswith("drm-engine-capacity-"):
            n = parse_number(value)
            if n and n > 0:  # zero capacity is not allowed by the spec
                capacity[key[len("drm-engine-capacity-"):]] = n
        elif key.startswith("drm-engine-"):
            n = parse_number(value)
            if n is not None:
                engines[key[len("drm-engine-"):]] = n
        elif key.startswith("drm-total-cycles-"):
            n = parse_number(value)
            if n is not None:
                total_cycles[key[len("drm-total-cycles-"):]] = n
        elif key.startswith("drm-cycles-"):
            n = parse_number(value)
            if n is not None:
                cycles[key[len("drm-cycles-"):]] = n
        else:
            kind, _, region = key[len("drm-"):].partition("-")
            if kind in _MEM_PREF and region:
                n = parse_number(value)
                if n is None:
                    continue
                rank = _MEM_PREF[kind]
                if region not in memory or rank < memory[region][0]:
                    memory[region] = (rank, n)
    return FdinfoClient(
        driver=driver, pdev=kv.get("drm-pdev") or None, client_id=client_id,
        memory={r: v for r, (_, v) in memory.items()}, engines=engines, cycles=cycles,
        total_cycles=total_cycles, capacity=capacity,
    )


def ctx_of(engines_used: set[str], kfd: bool) -> str:
    kinds = set()
    if engines_used & GRAPHICS_ENGINES:
        kinds.add(CTX_GRAPHICS)
    if kfd or engines_used & COMPUTE_ENGINES:
        kinds.add(CTX_COMPUTE)
    if kinds == {CTX_COMPUTE, CTX_GRAPHICS}:
        return CTX_BOTH
    return kinds.pop() if kinds else CTX_GRAPHICS


# ---- utilisation state ----------------------------------------------------------------------------


@dataclass
class _Counters:
    at: float  # scanner clock, seconds
    engines: dict[str, int]
    cycles: dict[str, int]
    total_cycles: dict[str, int]


def engine_utilisation(prev: _Counters | None, cur: FdinfoClient, now: float) -> tuple[dict[str, float] | None,
                                                                                  _Counters]:
    """Per-engine busy percent between ``prev`` and ``cur``; None on first sight. Returns the new state.

    A counter below its previous value keeps the previous one (the spec's rule), so its delta is 0.
    """
    engines = dict(cur.engines)
    cycles = dict(cur.cycles)
    total = dict(cur.total_cycles)
    if prev is not None:
        for new, old in ((engines, prev.engines), (cycles, prev.cycles), (total, prev.total_cycles)):
            for e, v in old.items():
                if new.get(e, -1) < v:  # lower, or not printed this time: stay with the larger value
                    new[e] = v
    state = _Counters(now, engines, cycles, total)
    if prev is None:
        return None, state
    util: dict[str, float] = {}
    dt_ns = (now - prev.at) * 1e9
    if dt_ns > 0:
        for e, v in engines.items():
            # amdgpu prints only engines that were used: an engine new to a known client started at 0.
            delta = v - prev.engines.get(e, 0)
            util[e] = delta / (dt_ns * cur.capacity.get(e, 1)) * 100.0
    for e, v in cycles.items():
        if e not in prev.cycles or e not in total or e not in prev.total_cycles:
            continue
        dtotal = total[e] - prev.total_cycles[e]
        if dtotal > 0:
            util[e] = (v - prev.cycles[e]) / (dtotal * cur.capacity.get(e, 1)) * 100.0
    return {e: min(100.0, max(0.0, u)) for e, u in util.items()}, state


# ---- scanning -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DrmUse:
    """One process's use of one DRM device (its deduplicated clients together)."""

    pid: int
    pdev: str
    driver: str
    ctx: str
    memory: int | None  # bytes; None when its clients report no memory keys
    util: float | None  # percent, busiest engine; None until a second sample
    engine_util: dict[str, float] | None = None  # per engine, summed over its clients
    clients: tuple[int | str, ...] = ()


@dataclass
class Scan:
    at: float
    uses: dict[str, list[DrmUse]]  # pdev -> uses, by pid
    unreadable: int  # processes whose fds or fdinfo could not be read
    kfd_pids: frozenset[int]  # processes holding /dev/kfd
    first: bool  # no earlier scan to compute utilisation against
    warned: bool = False

    def device_util(self, pdev: str) -> float | None:
        """The device's busiest engine over all visible clients; None on the first scan."""
        if self.first:
            return None
        per_engine: dict[str, float] = {}
        for use in self.uses.get(pdev, ()):
            for e, u in (use.engine_util or {}).items():
                per_engine[e] = per_engine.get(e, 0.0) + u
        return min(100.0, max(per_engine.values())) if per_engine else 0.0


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class FdinfoScanner:
    """Scans /proc for DRM clients. ``scan()`` reuses a result younger than ``max_age`` seconds, so the
    per-device calls of one refresh (and the AMD and Intel backends, which share a scanner) cost one
    walk of /proc."""

    def __init__(self, proc_root: str | None = None, sys_root: str | None = None, *,
                 clock: Callable[[], float] = time.monotonic, max_age: float = 0.2,
                 node_files: bool | None = None,
                 opener: Callable[[str], bytes] = _read_file,
                 listdir: Callable[[str], list[str]] = os.listdir):
        self.proc_root = (proc_root or proc_root_default()).rstrip("/") or "/"
        self.sys_root = (sys_root or sys_root_default()).rstrip("/") or "/"
        self.clock = clock
        self.max_age = max_age
        # Regular files holding "MAJOR:MINOR" stand for device nodes only under a fixture proc root.
        self.node_files = (self.proc_root != "/proc") if node_files is None else node_files
        self.opener = opener
        self.listdir = listdir
        self.scans = 0  # how many times /proc was walked (for tests and benchmarks)
        self._lock = threading.Lock()
        self._last: Scan | None = None
        self._state: dict[tuple, _Counters] = {}

    # -- device numbers --
    def _dev_number(self, path: str) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if stat.S_ISCHR(st.st_mode):
            return os.major(st.st_rdev), os.minor(st.st_rdev)
        if self.node_files and stat.S_ISREG(st.st_mode) and st.st_size <= 32:
            try:
                return _parse_devnum(_read_file(path))
            except OSError:
                return None
        return None

    def _kfd_number(self) -> tuple[int, int] | None:
        try:
            return _parse_devnum(_read_file(f"{self.sys_root}/class/kfd/kfd/dev"))
        except OSError:
            return None

    def _pids(self) -> list[int]:
        try:
            return sorted(int(d) for d in self.listdir(self.proc_root) if d.isdigit())
        except OSError:
            return []

    def _is_user_process(self, pid: int) -> bool:
        """False for kernel threads and zombies (empty cmdline): they hold no fds worth reporting."""
        try:
            return bool(self.opener(f"{self.proc_root}/{pid}/cmdline"))
        except OSError:
            return False

    def scan(self) -> Scan:
        with self._lock:
            now = self.clock()
            if self._last is not None and 0 <= now - self._last.at < self.max_age:
                return self._last
            self._last = self._scan(now)
            return self._last

    def _scan(self, now: float) -> Scan:
        self.scans += 1
        found, kfd_pids, unreadable = self._read_clients(self._kfd_number())
        first = self._last is None
        per_pid = self._count_clients(found, now)
        uses: dict[str, list[DrmUse]] = {}
        for (pdev, pid), items in sorted(per_pid.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            uses.setdefault(pdev, []).append(_use(pdev, pid, items, pid in kfd_pids))
        return Scan(at=now, uses=uses, unreadable=unreadable, kfd_pids=frozenset(kfd_pids), first=first)

    def _read_clients(self, kfd_dev) -> tuple[list[tuple[int, tuple, FdinfoClient]], set[int], int]:
        """Every DRM client open in every process: (pid, client key, parsed client); the pids that have
        /dev/kfd open; how many user processes could not be read."""
        unreadable = 0
        kfd_pids: set[int] = set()
        found: list[tuple[int, tuple, FdinfoClient]] = []
        for pid in self._pids():
            base = f"{self.proc_root}/{pid}"
            try:
                fds = self.listdir(f"{base}/fd")
            except PermissionError:
                if self._is_user_process(pid):
                    unreadable += 1
                continue
            except OSError:  # gone, or not a process directory
                continue
            if self._read_fds(pid, base, fds, kfd_dev, kfd_pids, found):
                unreadable += 1
        return found, kfd_pids, unreadable

    def _read_fds(self, pid: int, base: str, fds, kfd_dev, kfd_pids: set[int], found: list) -> bool:
        """Adds ``pid``'s DRM clients to ``found``; True when an fdinfo of a DRM fd was denied."""
        denied = False
        for fd in fds:
            dev = self._dev_number(f"{base}/fd/{fd}")
            if dev is None:
                continue
            if kfd_dev is not None and dev == kfd_dev:
                kfd_pids.add(pid)
                continue
            if dev[0] != DRM_MAJOR:
                continue
            try:
                text = self.opener(f"{base}/fdinfo/{fd}").decode("utf-8", "replace")
            except PermissionError:
                denied = True
                continue
            except OSError:  # the fd was closed meanwhile
                continue
            client = parse_fdinfo(text)
            if client is None or not client.pdev:
                continue
            key = (client.pdev, client.client_id) if client.client_id is not None else \
                (client.pdev, f"{pid}/{fd}")
            found.append((pid, key, client))
        return denied

    def _count_clients(self, found, now: float) -> dict[tuple[str, int], list]:
        """(pdev, pid) -> [(client key, client, engine utilisation, counted)]: a client shared by several
        processes (an fd passed on) is counted, with its memory and utilisation, for the first one only.
        Keeps this scan's counters for the next one; clients that closed are forgotten."""
        seen_keys: dict[tuple, int] = {}
        per_pid: dict[tuple[str, int], list[tuple[tuple, FdinfoClient, dict[str, float] | None, bool]]] = {}
        new_state: dict[tuple, _Counters] = {}
        for pid, key, client in found:
            owner = seen_keys.setdefault(key, pid)
            counted = owner == pid and key not in new_state
            util = None
            if counted:
                util, new_state[key] = engine_utilisation(self._state.get(key), client, now)
            per_pid.setdefault((client.pdev, pid), []).append((key, client, util, counted))  # type: ignore[arg-type]
        self._state = new_state
        return per_pid

    def warnings(self, once: bool = False) -> list[str]:
        """The unreadable-process warning of the latest scan. With ``once``, each scan's warning is
        handed out a single time, so two backends sharing this scanner do not repeat it."""
        with self._lock:
            last = self._last
            if last is None or not last.unreadable or (once and last.warned):
                return []
            if once:
                last.warned = True
        n = last.unreadable
        return [f"{n} process{'es' if n != 1 else ''} not readable: run as root to see them"]


def _parse_devnum(raw: bytes) -> tuple[int, int] | None:
    try:
        major, minor = raw.decode().strip().split(":")
        return int(major), int(minor)
    except (ValueError, UnicodeDecodeError):
        return None


_SHARED: dict[tuple[str, str], FdinfoScanner] = {}
_SHARED_LOCK = threading.Lock()


def shared_scanner(proc_root: str | None = None, sys_root: str | None = None) -> FdinfoScanner:
    """One scanner per pair of roots, shared by the AMD and Intel backends (one /proc walk a refresh)."""
    key = ((proc_root or proc_root_default()), (sys_root or sys_root_default()))
    with _SHARED_LOCK:
        sc = _SHARED.get(key)
        if sc is None:
            sc = _SHARED[key] = FdinfoScanner(*key)
        return sc


def _use(pdev: str, pid: int, items: list, kfd: bool) -> DrmUse:
    """One process's use of one device, from its clients there (a client open on two fds counts once)."""
    used: set[str] = set()
    mem_parts: list[int] = []
    mem_known = False
    engine_util: dict[str, float] | None = None
    keys = []
    for key, client, util, counted in items:
        if key[1] in keys:
            continue  # a second fd of the same client in this process
        keys.append(key[1])
        used |= client.used_engines()
        m = client.gpu_memory
        if m is not None:
            mem_known = True
            mem_parts.append(m if counted else 0)
        if util is not None:
            engine_util = engine_util or {}
            for e, u in util.items():
                engine_util[e] = engine_util.get(e, 0.0) + u
    driver = items[0][1].driver
    if engine_util:
        busiest: float | None = min(100.0, max(engine_util.values()))
    else:  # amdgpu omits engines it never used: none listed on a second sample means idle
        busiest = 0.0 if engine_util is not None and driver == "amdgpu" else None
    return DrmUse(pid=pid, pdev=pdev, driver=driver, ctx=ctx_of(used, kfd and driver == "amdgpu"),
                  memory=sum(mem_parts) if mem_known else None, util=busiest,
                  engine_util=engine_util, clients=tuple(keys))
