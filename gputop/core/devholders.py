"""Holders found through device files: the processes that have a GPU's device node open or mapped.

NVML lists only the processes the driver attributes memory to: not those of another PID namespace (seen
from a container's NVML), not zombies, not MPS clients. Any process that holds the GPU has its node open
(``/proc/PID/fd``) or mapped (``/proc/PID/maps``), so the host's /proc names them all, in every PID
namespace. Matching is by device number (``st_rdev``), never by path: a container mounts /dev elsewhere,
and an ``O_PATH`` descriptor of a node made with ``mknod`` (the tests) shows exactly like a real one.

A mapping is looked for (``/proc/PID/maps``, which costs the kernel more to write than the rest of a
process's scan) only in a process that holds some node of a wanted node's major: every CUDA process keeps
``/dev/nvidiactl`` (195:255) open for its context's life, so a mapping of a GPU with no NVIDIA descriptor
left is not looked for.

Cost: one ``stat`` of ``/proc/PID/fd`` a process a scan. On Linux 6.2 and later its ``st_size`` is the
number of open descriptors and its inode is new for every new process, so a process is read again (its
descriptors, each one stat'ed, and its maps) only when it is new or its descriptor count changed; and
every process is read again every ``full_every`` seconds, which catches a descriptor swapped for another
at the same count. Older kernels (``st_size`` 0) list the directory to count. See docs/memory-ledger.md.
"""

from __future__ import annotations

import os
import stat as stat_mod
import time

__all__ = ["DeviceScan", "nvidia_control_nodes"]

_SIZE_COUNTS: dict[str, bool] = {}  # proc root -> whether st_size of its PID/fd counts descriptors


def _size_counts(proc_root: str) -> bool:
    counts = _SIZE_COUNTS.get(proc_root)
    if counts is None:
        try:
            counts = os.stat(os.path.join(proc_root, "self", "fd")).st_size > 0
        except OSError:  # a fixture /proc (no "self"), or none: count the entries
            counts = False
        _SIZE_COUNTS[proc_root] = counts
    return counts


def nvidia_control_nodes(proc_root: str = "/proc") -> frozenset[int]:
    """nvidiactl (195:255) and the nvidia-uvm nodes (a dynamic major, from /proc/devices): a process
    holding one of them is a CUDA process of some GPU."""
    out = {os.makedev(195, 255)}
    try:
        with open(os.path.join(proc_root, "devices"), "rb") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[1] == b"nvidia-uvm" and parts[0].isdigit():
                    out.update(os.makedev(int(parts[0]), m) for m in (0, 1))
    except OSError:
        pass
    return frozenset(out)


class DeviceScan:
    """Finds, across the host's /proc, the processes holding any of a set of device nodes.

    ``scan(rdevs)`` returns pid -> the rdevs it holds (only processes that hold one). Kept between scans:
    per process, the key of its descriptor directory (inode, count) and what it held then."""

    def __init__(self, proc_root: str = "/proc", full_every: float = 30.0, clock=time.monotonic):
        self.proc_root = proc_root
        self.full_every = full_every
        self.clock = clock
        # pid -> (fd dir key, the nodes it held, whether every descriptor could be examined)
        self._known: dict[int, tuple[tuple[int, int], frozenset[int], bool]] = {}
        self._whole = True
        self._rdevs: frozenset[int] = frozenset()
        self._full_at = 0.0
        # (st_dev, st_ino) of each node seen with a wanted rdev -> that rdev: maps name a mapped file by
        # the filesystem and inode it lives on, not by its rdev.
        self.node_ids: dict[tuple[int, int], int] = {}
        self._maps_patterns: dict[bytes, int] = {}  # node_ids as the text a maps line holds
        self._majors: frozenset[int] = frozenset()  # the wanted nodes' majors: maps are read only near them
        self.unreadable = 0  # processes whose descriptors (all, or some) could not be read in the last scan
        self.rescanned = 0  # processes read again in the last scan (new, changed, or a full pass)

    def _seed(self, rdevs: frozenset[int]) -> None:
        """The host's own nodes of ``rdevs`` (udev's /dev/char/MAJ:MIN links), so that a mapping of one
        whose descriptor was closed is found even if no process holds it open."""
        for rdev in rdevs:
            try:
                st = os.stat(f"/dev/char/{os.major(rdev)}:{os.minor(rdev)}")
            except OSError:
                continue
            if stat_mod.S_ISCHR(st.st_mode) and st.st_rdev == rdev:
                self.node_ids[(st.st_dev, st.st_ino)] = rdev

    def scan(self, rdevs: frozenset[int]) -> dict[int, frozenset[int]]:
        root = self.proc_root
        now = self.clock()
        full = rdevs != self._rdevs or now - self._full_at >= self.full_every
        if full:
            if rdevs != self._rdevs:
                self.node_ids = {}
                self._majors = frozenset(os.major(r) for r in rdevs)
                self._seed(rdevs)
            self._rdevs, self._full_at = rdevs, now
        counts = _size_counts(root)
        known, fresh = self._known, {}
        out: dict[int, frozenset[int]] = {}
        self.unreadable = self.rescanned = 0
        try:
            names = os.listdir(root)
        except OSError:
            return out
        for name in names:
            if not name.isdigit():
                continue
            pid = int(name)
            fd_dir = f"{root}/{name}/fd"
            try:
                st = os.stat(fd_dir)
            except PermissionError:
                self.unreadable += 1
                continue
            except OSError:
                continue  # exited
            if counts:
                key = (st.st_ino, st.st_size)
            else:  # before Linux 6.2 st_size is 0: count the entries
                try:
                    key = (st.st_ino, len(os.listdir(fd_dir)))
                except PermissionError:
                    self.unreadable += 1
                    continue
                except OSError:
                    continue
            had = known.get(pid)
            if had is not None and had[0] == key and not full:
                held, whole = had[1], had[2]
            else:
                self._whole = True
                held = self._read(pid, fd_dir, rdevs)
                if held is None:
                    self.unreadable += 1
                    continue
                whole = self._whole
                self.rescanned += 1
            if not whole:  # some descriptor of it could not be examined: it may hold a node unseen
                self.unreadable += 1
            fresh[pid] = (key, held, whole)
            if held:
                out[pid] = held
        self._known = fresh
        return out

    def _read(self, pid: int, fd_dir: str, rdevs: frozenset[int]) -> frozenset[int] | None:
        """The wanted nodes one process holds, by its descriptors and its maps; None when unreadable."""
        try:
            fds = os.listdir(fd_dir)
        except PermissionError:
            return None
        except OSError:
            return frozenset()
        held = set()
        node_ids, majors = self.node_ids, self._majors
        near = False  # it holds some node of a wanted major (every CUDA process keeps nvidiactl, 195:255)
        for fd in fds:
            try:
                st = os.stat(f"{fd_dir}/{fd}")  # follows the magic link to the open file itself
            except PermissionError:  # (a process of another user namespace, say): unseen, not absent
                self._whole = False
                continue
            except OSError:
                continue  # closed meanwhile
            rdev = st.st_rdev
            if rdev and stat_mod.S_ISCHR(st.st_mode) and os.major(rdev) in majors:
                near = True
                if rdev in rdevs:
                    held.add(rdev)
                    node_ids[(st.st_dev, st.st_ino)] = rdev
        if near and node_ids:  # reading maps costs more than the rest: only where a mapping can be
            held.update(self._mapped(pid))
        return frozenset(held)

    def _mapped(self, pid: int) -> set[int]:
        """The wanted nodes ``pid`` maps: a maps line names a mapped file by the device and inode it lives
        on, " MM:mm INODE " (hex device numbers), which for a node is its (st_dev, st_ino). One substring
        search of the whole file per known node, not a parse of every line."""
        out: set[int] = set()
        try:
            with open(f"{self.proc_root}/{pid}/maps", "rb") as f:
                data = f.read(1 << 22)  # bounded: a process may map a great many regions
        except OSError:
            return out
        for pattern, rdev in self._patterns().items():
            if pattern in data:
                out.add(rdev)
        return out

    def _patterns(self) -> dict[bytes, int]:
        if len(self._maps_patterns) != len(self.node_ids):
            self._maps_patterns = {
                f" {os.major(dev):02x}:{os.minor(dev):02x} {ino} ".encode(): rdev
                for (dev, ino), rdev in self.node_ids.items()}
        return self._maps_patterns
