"""The host process layer: read processes from /proc (Linux) or psutil (elsewhere).

Only the processes that are asked for are read, so a sample costs in proportion to the GPU holders and
their ancestors, not to the number of processes on the host. ``ProcTable.scan_all`` reads everything and
is meant for the reap path, which needs children.
"""

from __future__ import annotations

import os
try:
    import pwd
except ImportError:  # Windows: user names come from psutil there
    pwd = None  # type: ignore[assignment]
import sys
import weakref
from dataclasses import dataclass, field
from functools import lru_cache
from collections import namedtuple

PF_KTHREAD = 0x00200000
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
IS_LINUX = sys.platform.startswith("linux")


@dataclass(frozen=True, slots=True)  # no __dict__: kept for every process a sampler knows
class ProcInfo:
    """What gputop knows about one host process. ``(pid, start_time)`` is its identity."""

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    start_time: float  # seconds since the epoch, rounded to the clock tick
    uid: int | None = None
    user: str | None = None
    sid: int | None = None  # session id (POSIX); None where unknown
    state: str = "?"  # R, S, D, Z, T, ...
    sighup_ignored: bool | None = None  # bit 0 of SigIgn; the visible mark of nohup
    kthread: bool = False
    rss: int | None = None  # bytes
    cpu_time: float | None = None  # user+system seconds, for CPU% deltas
    # State Z, but another thread of the group still runs (the main thread called pthread_exit): the
    # process is alive, its children are still its children, and a signal still reaches it.
    half_exited: bool = False
    pgid: int | None = None  # process group (POSIX); None where unknown
    start_ticks: int | None = None  # start in clock ticks since boot, as /proc/PID/stat says; None off Linux

    @property
    def cmd(self) -> str:
        return " ".join(self.cmdline) if self.cmdline else f"[{self.name}]"

    @property
    def identity(self) -> tuple[int, float]:
        return (self.pid, self.start_time)

    @property
    def zombie(self) -> bool:
        """Exited (waiting to be reaped): every thread is gone, not only the main one."""
        return self.state in ("Z", "X") and not self.half_exited


# The lineage fields of one /proc/PID/stat line: parent, process group, session, start (clock ticks since
# boot). ``ProcTable.stat_fields`` gives them for every process its scan read. collections.namedtuple, not
# typing.NamedTuple: typing is not imported at run time (start-up).
StatFields = namedtuple("StatFields", ["ppid", "pgid", "sid", "start"])


@lru_cache(maxsize=4096)
def user_name(uid: int) -> str:
    """The login name of ``uid``, or the number when it has none (or there is no passwd database)."""
    if pwd is None:
        return str(uid)
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@lru_cache(maxsize=8)
def _boot_time(proc_root: str) -> float:
    try:
        with open(os.path.join(proc_root, "stat"), "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    import psutil

    return psutil.boot_time()


_READ_CHUNK = 16384
# A stat line is at most ~1.1 KiB (52 numeric fields and a 15-byte name): one 4 KiB read holds it, and
# os.read allocates the whole chunk before it shrinks it to what was read.
STAT_CHUNK = 4096


def _open_ro(path: str, dir_fd: int | None = None) -> int | bytes | None:
    """An fd open for reading, or _read's answer for a file that cannot be opened: None (gone) or b""
    (unreadable)."""
    try:
        return os.open(path, os.O_RDONLY, dir_fd=dir_fd)
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    except PermissionError:
        return b""


def _read(path: str, dir_fd: int | None = None, chunk: int = _READ_CHUNK) -> bytes | None:
    # os.open/os.read rather than open(): a buffered file object costs extra syscalls (fstat, ioctl,
    # lseek) and allocations, and a sample reads three small files per process. The /proc files read
    # here return everything that fits in one read, so a short read is the end of the file.
    fd = _open_ro(path, dir_fd)
    if not isinstance(fd, int):
        return fd
    try:
        data = os.read(fd, chunk)
        if len(data) == chunk:
            parts = [data]
            while more := os.read(fd, _READ_CHUNK):
                parts.append(more)
            data = b"".join(parts)
        return data
    except (ProcessLookupError, FileNotFoundError):
        return None
    except PermissionError:
        return b""
    finally:
        os.close(fd)


def _status_field(status: bytes, key: bytes) -> bytes | None:
    """The first value after ``key`` (b"\\nUid:") in /proc/<pid>/status, or None."""
    i = status.find(key)
    if i < 0:
        return None
    end = status.find(b"\n", i + 1)
    vals = status[i + len(key): end if end >= 0 else None].split()
    return vals[0] if vals else None


class StaticCache:
    """Command line and owner of processes seen in earlier samples, keyed by identity (pid, start).

    A long-lived sampler passes one to its ProcTables, so that a refresh reads only /proc/<pid>/stat
    for a process it already knows: identity, parent, session, state, CPU and the nohup mark are read
    fresh every time, while the command line and the uid (two more files, ~2/3 of the I/O) are re-read
    once they are older than ``ttl`` seconds. Actions never use it: they re-read everything.
    """

    def __init__(self, ttl: float = 5.0, clock=None):
        import time

        self.ttl = ttl
        self.clock = clock or time.monotonic
        self._entries: dict[tuple[int, int], tuple[float, tuple[str, ...], int | None]] = {}
        self._used: set[tuple[int, int]] = set()
        # pid -> (the stat line last read, the ProcInfo made from it, its key): an idle process has a
        # byte-identical stat line from one refresh to the next, and then parses to the same ProcInfo.
        self._last: dict[int, tuple[bytes, ProcInfo, tuple[int, int]]] = {}
        # pid -> Tgid, from the status files read since the last prune (a refresh): tgid_of() without
        # reading the file again.
        self.tgids: dict[int, int] = {}
        # (pid, start time) -> /proc/<pid>/cgroup, read through the pinned dir with the command line since
        # the last prune: the owner cache parses it instead of reading the file again by path and
        # checking the start time after. None: not read (no owner cache wants it).
        self.cgroups: dict[tuple[int, float], bytes] | None = None
        self._now: float | None = None  # begin()'s reading of the clock, until the next prune
        # pid -> an open /proc/<pid>/stat of a known process (the real /proc only, up to a share of the
        # fd limit): the next refresh reads it with one pread instead of open, read and close. The fd is
        # bound to the process it was opened on: once that process is gone it answers ESRCH, even when
        # the PID names a new process, which is then read by path. Closed when the process is pruned,
        # and by close().
        self._fds: dict[int, int] = {}
        self.fd_budget = _stat_fd_budget()  # shared: every cache of the process counts against it
        self._finalizer = weakref.finalize(self, _close_fds, self._fds)

    def begin(self) -> None:
        """A refresh starts: its freshness checks all use this one reading of the clock (one clock call a
        refresh, not one a process), until prune() ends the refresh."""
        self._now = self.clock()

    def _time(self) -> float:
        now = self._now
        return self.clock() if now is None else now

    def get(self, key: tuple[int, int]) -> tuple[tuple[str, ...], int | None] | None:
        e = self._entries.get(key)
        if e is None or self._time() - e[0] >= self.ttl:
            return None
        self._used.add(key)
        return e[1], e[2]

    def put(self, key: tuple[int, int], cmdline: tuple[str, ...], uid: int | None) -> None:
        # Stamped with the refresh's clock reading (begin()), as the owner cache stamps its entries: the
        # two expire in the same refresh, so an owner is re-read from the cgroup this refresh read.
        self._entries[key] = (self._time(), cmdline, uid)
        self._used.add(key)

    def unchanged(self, pid: int, stat: bytes) -> ProcInfo | None:
        """The ProcInfo made last time, if the stat line is the same bytes and the entry is fresh."""
        last = self._last.get(pid)
        if last is None or last[0] != stat:
            return None
        e = self._entries.get(last[2])  # get(), inlined: called for every known process every refresh
        if e is None or self._time() - e[0] >= self.ttl:
            return None
        self._used.add(last[2])
        return last[1]

    def knows(self, pid: int) -> bool:
        """Whether an earlier sample read ``pid`` (if not, its command line and uid must be read)."""
        return pid in self._last

    def remember(self, pid: int, stat: bytes, info: ProcInfo, key: tuple[int, int]) -> None:
        self._last[pid] = (stat, info, key)

    def stat(self, pid: int, proc_root: str) -> bytes | None:
        """/proc/<pid>/stat of a process an earlier sample read, as ``_read`` answers (None: gone, b"":
        unreadable): through its kept fd when it has one, else by path (keeping the fd, within the
        budget). The bytes describe whatever process the fd is bound to; the caller takes the identity
        from them (the start time), never from the fd."""
        fds = self._fds
        fd = fds.get(pid)
        if fd is not None:
            try:
                data = os.pread(fd, STAT_CHUNK, 0)
            except OSError:  # ESRCH: the process it was opened on is gone (the PID may name a new one)
                data = b""
            if data and len(data) < STAT_CHUNK:
                return data
            del fds[pid]
            _KEPT.discard(fd)
            os.close(fd)
        path = f"{proc_root}/{pid}/stat"
        if proc_root != "/proc" or len(_KEPT) >= self.fd_budget:  # a fixture's files may be replaced
            return _read(path, None, STAT_CHUNK)
        fd = _open_ro(path)
        if not isinstance(fd, int):
            return fd
        try:
            data = os.pread(fd, STAT_CHUNK, 0)
        except OSError:
            data = b""
        if data and len(data) < STAT_CHUNK:
            fds[pid] = fd
            _KEPT.add(fd)
            return data
        os.close(fd)
        return _read(path, None, STAT_CHUNK)  # _read's answer for a read that failed or was long

    def prune(self) -> None:
        """Forget processes not looked at since the last prune (they exited or stopped mattering)."""
        used = self._used
        if not len(used) == len(self._entries) == len(self._last):  # else every entry was used (a refresh
            self._entries = {k: v for k, v in self._entries.items() if k in used}  # of an unchanged host)
            self._last = last = {p: v for p, v in self._last.items() if v[2] in used}
            fds = self._fds
            if not fds.keys() <= last.keys():
                for pid in [p for p in fds if p not in last]:
                    fd = fds.pop(pid)
                    _KEPT.discard(fd)
                    os.close(fd)
        self._used = set()
        self.tgids = {}
        if self.cgroups:
            self.cgroups.clear()  # in place: the owner cache holds the same dict
        self._now = None

    def close(self) -> None:
        """Close the kept stat fds (a sampler that ends); the cache still works, reading by path."""
        _close_fds(self._fds)

    def __len__(self) -> int:
        return len(self._entries)


def _stat_fd_budget() -> int:
    """How many stat fds the StaticCaches of this process may keep open in all: half the soft fd limit
    less a margin (at the common soft limit of 1,024: 448), at most 8,192; the rest of the processes are
    read by path."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 0
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(0, min(8192, soft // 2 - 64))


# The stat fds kept open by every StaticCache of this process (their budget is for all of them).
_KEPT: set[int] = set()


def _close_fds(fds: dict[int, int]) -> None:
    while fds:
        fd = fds.popitem()[1]
        _KEPT.discard(fd)
        try:
            os.close(fd)
        except OSError:
            pass


def _open_dir(base: str) -> int | None:
    try:
        return os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None


def _read_linux(pid: int, proc_root: str, static: StaticCache | None = None,
                stat: bytes | None = None) -> ProcInfo | None:
    """One process from /proc. Its files are read through one open /proc/<pid> directory, which stays
    bound to that process: if it exits and the PID is reused between two reads, the later reads fail
    instead of mixing the new process's command line or owner into the old one's record."""
    base = f"{proc_root}/{pid}"
    dfd = None
    try:
        if stat is None and static is not None and static.knows(pid):
            # A long-lived sampler: usually only the stat line is needed (the rest is cached), so read
            # it by path; a cache miss pins the process before reading more (see _parse_linux).
            # (A process no sample has read yet is a certain miss: pinned at once below, so that its
            # stat line is not read twice, which the first sample would do for every process.)
            stat = _read(f"{base}/stat", None, STAT_CHUNK)
        elif stat is None:
            dfd = _open_dir(base)
            if dfd is None:
                return None
            stat = _read("stat", dfd, STAT_CHUNK)
        if not stat:
            return None
        return _parse_linux(pid, proc_root, base, stat, static, dfd)
    finally:
        if dfd is not None:
            os.close(dfd)


def _parse_linux(pid: int, proc_root: str, base: str, stat: bytes, static: StaticCache | None,
                 dfd: int | None) -> ProcInfo | None:
    if static is not None and b") Z " not in stat:  # a zombie's threads may exit with its stat unchanged
        same = static.unchanged(pid, stat)
        if same is not None:
            return same
    try:
        lpar = stat.index(b"(")
        rpar = stat.rindex(b")")
        comm = stat[lpar + 1 : rpar].decode("utf-8", "replace")
        f = stat[rpar + 2 :].split()
        state = f[0].decode()
        ppid, pgid, sid, flags = int(f[1]), int(f[2]), int(f[3]), int(f[6])
        cpu = (int(f[11]) + int(f[12])) / _CLK_TCK
        start_ticks = int(f[19])
        start = round(_boot_time(proc_root) + start_ticks / _CLK_TCK, 2)
        rss = int(f[21]) * _PAGE_SIZE
        # Field 33, sigignore: the low 31 signals, which include SIGHUP (bit 0), the mark of nohup.
        sighup = bool(int(f[30]) & 1) if len(f) > 30 else None
    except (ValueError, IndexError):
        return None
    key = (pid, start_ticks)
    half = state in ("Z", "X") and live_threads(base)
    cached = static.get(key) if static is not None and not half else None
    if cached is not None and _renamed(static, pid, key, stat[lpar + 1: rpar]):
        cached = None  # its name changed under the same identity: an exec, so its command line is new too
        # (the protect rules compare the name with argv[0]: gputop.core.disguise)
    if cached is not None:
        cmdline, uid = cached
    else:
        if dfd is None:
            # The stat line came from an earlier scan: pin the process now, and make sure the PID still
            # names the process that line described before reading more of it.
            dfd = _open_dir(base)
            if dfd is None:
                return None
            try:
                return _read_linux_pinned(pid, proc_root, base, static, dfd, start_ticks)
            finally:
                os.close(dfd)
        cmdline, uid, sighup, tgid = _read_static(dfd, base, half, sighup)
        if static is not None:
            _keep_static(static, dfd, key, start, cmdline, uid, tgid)
    info = ProcInfo(
        pid=pid, ppid=ppid, name=_full_name(comm, cmdline), cmdline=cmdline, start_time=start, uid=uid,
        user=user_name(uid) if uid is not None else None, sid=sid, state=state,
        sighup_ignored=sighup, kthread=bool(flags & PF_KTHREAD),  # not "ppid == 2": in a PID namespace that is a user process
        rss=rss, cpu_time=cpu, half_exited=half, pgid=pgid, start_ticks=start_ticks,
    )
    if static is not None:
        static.remember(pid, stat, info, key)
    return info


def _renamed(static: StaticCache, pid: int, key: tuple[int, int], comm: bytes) -> bool:
    """Whether the process's name (comm, as bytes) changed since the last scan, under the same identity."""
    last = static._last.get(pid)
    return last is not None and last[2] == key and last[0][last[0].index(b"(") + 1: last[0].rindex(b")")] != comm


def _keep_static(static: StaticCache, dfd: int, key: tuple[int, int], start: float, cmdline: tuple[str, ...],
                 uid: int | None, tgid: int | None) -> None:
    """Cache what does not change under one identity: command line, uid, thread group, cgroup."""
    pid = key[0]
    static.put(key, cmdline, uid)
    if tgid is not None:
        static.tgids[pid] = tgid
    if static.cgroups is not None:  # the owner, read through the same pinned dir
        cgroup = _read("cgroup", dfd)
        if cgroup:
            static.cgroups[(pid, start)] = cgroup


def _full_name(comm: str, cmdline: tuple[str, ...]) -> str:
    """comm is truncated to 15 bytes: argv[0]'s basename when it starts with comm, else comm."""
    if len(comm) >= 15 and cmdline:
        exe_name = os.path.basename(cmdline[0])
        if exe_name.startswith(comm):
            return exe_name
    return comm


def _read_static(dfd: int, base: str, half: bool,
                 sighup: bool | None) -> tuple[tuple[str, ...], int | None, bool | None, int | None]:
    """Command line, uid, (when stat had no sigignore field) the nohup mark, and the thread group (Tgid),
    through the pinned dir."""
    raw_cmd = _read("cmdline", dfd) or (_live_thread_file(base, "cmdline") if half else b"") or b""
    cmdline = tuple(a.decode("utf-8", "replace") for a in raw_cmd.split(b"\0") if a)
    uid = tgid = None
    status = _read("status", dfd)
    if status:
        tg = _status_field(status, b"\nTgid:")
        tgid = int(tg) if tg is not None and tg.isdigit() else None
        uid = _status_field(status, b"\nUid:")
        if uid is not None:
            uid = int(uid)
        if sighup is None:
            sigign = _status_field(status, b"\nSigIgn:")
            if sigign is not None:
                sighup = bool(int(sigign, 16) & 1)
    if uid is None:
        try:
            uid = os.stat(".", dir_fd=dfd).st_uid
        except OSError:
            pass
    return cmdline, uid, sighup, tgid


def _read_linux_pinned(pid: int, proc_root: str, base: str, static: StaticCache | None, dfd: int,
                       start_ticks: int) -> ProcInfo | None:
    stat = _read("stat", dfd, STAT_CHUNK)
    if not stat:
        return None
    try:
        if int(stat[stat.rindex(b")") + 2:].split()[19]) != start_ticks:
            return None  # the PID was reused since the scan: the process that was scanned is gone
    except (ValueError, IndexError):
        return None
    return _parse_linux(pid, proc_root, base, stat, static, dfd)


def _read_psutil(pid: int) -> ProcInfo | None:
    # psutil is imported where it is used: on Linux the sample path reads /proc itself (start-up time).
    import psutil

    states = {
        psutil.STATUS_RUNNING: "R", psutil.STATUS_SLEEPING: "S", psutil.STATUS_DISK_SLEEP: "D",
        psutil.STATUS_STOPPED: "T", psutil.STATUS_ZOMBIE: "Z", psutil.STATUS_DEAD: "X",
    }
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            try:
                cmdline = tuple(p.cmdline())
            except (psutil.AccessDenied, psutil.ZombieProcess):
                cmdline = ()
            try:
                uid = p.uids().real
            except (psutil.AccessDenied, AttributeError):
                uid = None
            try:
                user = p.username()
            except (psutil.AccessDenied, KeyError):
                user = None
            try:
                rss = p.memory_info().rss
                ct = p.cpu_times()
                cpu = ct.user + ct.system
            except psutil.AccessDenied:
                rss = cpu = None
            try:
                sid = os.getsid(pid) if hasattr(os, "getsid") else None
            except OSError:
                sid = None
            return ProcInfo(
                pid=pid, ppid=p.ppid(), name=p.name(), cmdline=cmdline,
                start_time=round(p.create_time(), 2), uid=uid, user=user, sid=sid,
                state=states.get(p.status(), "?"), rss=rss, cpu_time=cpu,
            )
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return None


def read_proc(pid: int, proc_root: str = "/proc", static: StaticCache | None = None) -> ProcInfo | None:
    """Read one process now; None if it does not exist (or cannot be seen).

    ``static``: reuse the command line and uid read in an earlier sample (see StaticCache).
    """
    if pid <= 0:
        return None
    if IS_LINUX:
        return _read_linux(pid, proc_root, static)
    return _read_psutil(pid)


def start_time(pid: int, proc_root: str = "/proc") -> float | None:
    """The start time that forms half of a process's identity; None if it is gone."""
    if IS_LINUX:
        # Only /proc/<pid>/stat is needed: same result as read_proc(), a third of the reads.
        now = stat_state(pid, proc_root)
        return None if now is None else now[1]
    info = read_proc(pid, proc_root)
    return None if info is None or info.zombie else info.start_time


def stat_state(pid: int, proc_root: str = "/proc") -> tuple[str, float] | None:
    """(state, start time) of a live process from /proc/<pid>/stat alone (Linux); None if it is gone, cannot
    be read, or has exited (a zombie all of whose threads have exited: read_proc's ``zombie``). A
    half-exited process is alive and reports its main thread's state, Z."""
    if pid <= 0:
        return None
    if not IS_LINUX:
        info = read_proc(pid, proc_root)
        return None if info is None or info.zombie else (info.state, info.start_time)
    stat = _read(f"{proc_root}/{pid}/stat", None, STAT_CHUNK)
    if not stat:
        return None
    try:
        f = stat[stat.rindex(b")") + 2:].split(None, 20)
        if f[0] in (b"Z", b"X") and not live_threads(f"{proc_root}/{pid}"):
            return None
        return f[0].decode(), round(_boot_time(proc_root) + int(f[19]) / _CLK_TCK, 2)
    except (ValueError, IndexError, UnicodeDecodeError):
        return None


def live_threads(base: str) -> bool:
    """True if any thread of the process at ``base`` (/proc/PID) has not exited.

    A main thread that called pthread_exit leaves the process in state Z while the others run on.
    Read only for a process in state Z, so it costs nothing for the ordinary case."""
    try:
        tids = os.listdir(f"{base}/task")
    except OSError:
        return False
    for tid in tids:
        stat = _read(f"{base}/task/{tid}/stat")
        try:
            if stat and stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] not in (b"Z", b"X"):
                return True
        except ValueError:
            continue
    return False


def _live_thread_file(base: str, name: str) -> bytes | None:
    """``name`` (e.g. cmdline) read through a live thread: the exited main thread has no memory map."""
    try:
        tids = sorted(os.listdir(f"{base}/task"), key=int)
    except (OSError, ValueError):
        return None
    for tid in tids:
        data = _read(f"{base}/task/{tid}/{name}")
        if data:
            return data
    return None


def tgid_of(pid: int, proc_root: str = "/proc") -> int:
    """The thread group (process) that thread ``pid`` belongs to; ``pid`` itself when it is one, or unknown.

    NVML may report a thread id: every action and verdict works on the process (``Tgid:``)."""
    if not IS_LINUX or pid <= 0:
        return pid
    status = _read(f"{proc_root}/{pid}/status")
    tgid = _status_field(status, b"\nTgid:") if status else None
    try:
        return int(tgid) if tgid is not None else pid
    except ValueError:
        return pid


GONE, HIDDEN, VISIBLE = "gone", "hidden", "visible"


@lru_cache(maxsize=4)
def hidepid_note(proc_root: str = "/proc") -> str | None:
    """A warning when ``proc_root`` is mounted with hidepid (other users' processes are hidden from us)."""
    if not IS_LINUX or os.geteuid() == 0:
        return None  # root (CAP_SYS_PTRACE) sees every process whatever the mount says
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 4 and fields[4] == proc_root and " - proc " in line:
            for opt in line.rsplit(" ", 1)[-1].split(","):
                if opt.startswith("hidepid=") and opt not in ("hidepid=0", "hidepid=off"):
                    return (f"{proc_root} is mounted with {opt}: other users' processes are hidden; a verdict "
                            "that depends on one is 'unknown' (never reaped or killed)")
    return None


def visibility(pid: int, proc_root: str = "/proc", read_first: bool = True) -> str:
    """``gone`` only when the kernel says no such process (ESRCH); ``hidden`` when it exists but /proc does
    not show it (hidepid, another user's process); ``visible`` otherwise. Cannot see is not gone.
    ``read_first=False``: the caller has just read /proc and not found it (the answer is the same)."""
    if pid <= 0:
        return GONE
    if read_first and read_proc(pid, proc_root) is not None:
        return VISIBLE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return GONE
    except PermissionError:
        return HIDDEN  # EPERM: it exists, it is not ours
    except OSError:
        return HIDDEN
    # It exists (kill(pid, 0) succeeded) yet /proc did not show it: hidden, or it started just now.
    return HIDDEN if read_proc(pid, proc_root) is None else VISIBLE


def is_alive(pid: int, start: float | None = None, proc_root: str = "/proc") -> bool:
    """True if ``pid`` runs (not a zombie) and, when given, still has start time ``start``."""
    st = start_time(pid, proc_root)
    return st is not None and (start is None or st == start)


_UNREAD = object()


@dataclass
class ProcTable:
    """A lazily-filled, per-sample cache of host processes. Read each PID at most once."""

    proc_root: str = "/proc"
    _cache: dict[int, ProcInfo | None] = field(default_factory=dict)
    _children: dict[int, list[int]] | None = None
    static: StaticCache | None = None  # optional: carried across samples by a long-lived Sampler
    _scan_stat: dict[int, bytes] = field(default_factory=dict)  # stat lines read by scan_all, not parsed yet
    _hidden: dict[int, bool] = field(default_factory=dict)  # hidden(): asked once per PID per table
    _stat_fields: dict[int, StatFields] = field(default_factory=dict)  # scan_all's lineage fields per PID

    def get(self, pid: int) -> ProcInfo | None:
        info = self._cache.get(pid, _UNREAD)  # not try/except KeyError: a miss raised one a process
        if info is not _UNREAD:
            return info
        static = self.static
        stat = self._scan_stat.pop(pid, None) if self._scan_stat else None
        if stat is not None:  # scan_all read its stat line: read the rest now
            info = _read_linux(pid, self.proc_root, static, stat)
        elif static is not None and IS_LINUX and (last := static._last.get(pid)) is not None:
            # A process an earlier sample read (a long-lived sampler, every refresh): one stat read, and
            # usually the same bytes as last time, so the same ProcInfo (static.unchanged(), inlined: it
            # runs for every holder every refresh). Else as _read_linux() would.
            stat = static.stat(pid, self.proc_root)
            info = None
            if stat:
                e = static._entries.get(last[2]) if stat == last[0] and b") Z " not in stat else None
                if e is not None and static._time() - e[0] < static.ttl:
                    static._used.add(last[2])
                    info = last[1]
                else:
                    info = _read_linux(pid, self.proc_root, static, stat)
        else:
            info = read_proc(pid, self.proc_root, static)
        self._cache[pid] = info
        return info

    def __contains__(self, pid: int) -> bool:
        return self.get(pid) is not None

    def hidden(self, pid: int) -> bool:
        """True if ``pid`` exists but cannot be read here (hidepid, permissions): never "gone".

        Asked once per PID per table: the holders of one orphan tree all ask about the same gone session
        leader (a /proc read and a kill(0) each, 129 times per refresh for a tree of 128 holders)."""
        if self.get(pid) is not None or self.proc_root != "/proc":
            return False
        try:
            return self._hidden[pid]
        except KeyError:
            answer = self._hidden[pid] = visibility(pid, self.proc_root, read_first=False) == HIDDEN
            return answer

    def exe(self, pid: int) -> str | None:
        """The executable ``pid`` runs (/proc/PID/exe), or None where it cannot be read (another user's
        process when not root, a kernel thread). Read only when a protect name pattern matched (the
        classifier's disguise test, gputop.core.disguise)."""
        try:
            return os.readlink(f"{self.proc_root}/{pid}/exe")
        except (OSError, ValueError):
            return None

    def scan_all(self) -> None:
        """Read every process on the host (needed only to find children).

        On Linux only /proc/<pid>/stat is read here (for the parent PID); the command line and status of
        a process are read when get() asks for it, so a reap reads three files only for its tree.
        """
        if not IS_LINUX:
            children: dict[int, list[int]] = {}
            import psutil

            for pid in psutil.pids():
                info = self.get(pid)
                if info is not None:
                    children.setdefault(info.ppid, []).append(pid)
            self._children = children
            return
        children = {}
        scan_stat: dict[int, bytes] = {}
        fields: dict[int, StatFields] = {}
        root = self.proc_root
        for pid in _linux_pids(root):
            if pid in self._cache:
                info = self._cache[pid]
                if info is not None:
                    children.setdefault(info.ppid, []).append(pid)
                    if info.pgid is not None and info.sid is not None and info.start_ticks is not None:
                        fields[pid] = StatFields(info.ppid, info.pgid, info.sid, info.start_ticks)
                continue
            stat = _read(f"{root}/{pid}/stat", None, STAT_CHUNK)
            try:
                f = stat[stat.rindex(b")") + 2:].split(None, 20)  # type: ignore[index]
                ppid = int(f[1])
            except (AttributeError, TypeError, ValueError, IndexError):  # gone, unreadable, malformed: as get()
                self._cache[pid] = None
                continue
            scan_stat[pid] = stat
            children.setdefault(ppid, []).append(pid)
            try:
                fields[pid] = StatFields(ppid, int(f[2]), int(f[3]), int(f[19]))
            except (ValueError, IndexError):
                pass  # a line too short for the lineage fields: no lineage, as a stat-only scan would skip it
        self._scan_stat = scan_stat
        self._children = children
        self._stat_fields = fields

    def stat_fields(self) -> dict[int, StatFields]:
        """(ppid, process group, session, start ticks) of every process the last ``scan_all`` found, from
        the stat lines that scan read (no second read of /proc); zombies and half-exited processes
        included. Empty before a scan and off Linux. Do not modify the dict returned."""
        return self._stat_fields

    def children(self, pid: int) -> list[int]:
        if self._children is None:
            self.scan_all()
        assert self._children is not None
        return list(self._children.get(pid, ()))

    def descendants(self, pid: int) -> list[ProcInfo]:
        """All live descendants of ``pid``, parents before children."""
        out: list[ProcInfo] = []
        seen = {pid}
        stack = [pid]
        while stack:
            cur = stack.pop(0)
            for child in sorted(self.children(cur)):
                if child in seen:
                    continue
                seen.add(child)
                info = self.get(child)
                if info is not None and not info.zombie:
                    out.append(info)
                    stack.append(child)
        return out

    def ancestors(self, pid: int, limit: int = 64) -> list[ProcInfo]:
        """Parent, grandparent, ... up to PID 1 (inclusive), stopping at a cycle or ``limit``."""
        out: list[ProcInfo] = []
        info = self.get(pid)
        seen = {pid}
        while info is not None and info.ppid > 0 and len(out) < limit:
            if info.ppid in seen:
                break
            seen.add(info.ppid)
            info = self.get(info.ppid)
            if info is None:
                break
            out.append(info)
        return out


def _linux_pids(proc_root: str) -> list[int]:
    try:
        return [int(d) for d in os.listdir(proc_root) if d.isdigit()]
    except OSError:
        import psutil

        return psutil.pids()


def self_and_ancestors() -> set[int]:
    """gputop's own PID and every ancestor's PID (the user's shell, sshd, ...): never signalled."""
    pids = {os.getpid()}
    table = ProcTable()
    for info in table.ancestors(os.getpid(), limit=256):
        pids.add(info.pid)
    return pids


# ---- PID namespaces (a reap must not SIGKILL a namespace's init: the kernel then kills every process in
# that namespace, including ones entered later with nsenter or docker exec) ----

_NS_GET_PARENT = 0xB702  # ioctl on a namespace fd: a fd for its parent namespace (Linux 4.9)


def pid_ns(pid: int, proc_root: str = "/proc") -> int | None:
    """The inode of ``pid``'s PID namespace (/proc/PID/ns/pid), or None if it cannot be read (gone, or
    not ours to inspect: the link needs ptrace-read access)."""
    try:
        link = os.readlink(f"{proc_root}/{pid}/ns/pid")
    except OSError:
        return None
    try:
        return int(link[link.index("[") + 1:link.rindex("]")])
    except ValueError:
        return None


def ns_pids(pid: int, proc_root: str = "/proc") -> tuple[int, ...] | None:
    """NSpid from /proc/PID/status: its PID in our namespace, then in each nested one (last: its own)."""
    status = _read(f"{proc_root}/{pid}/status")
    if not status:
        return None
    i = status.find(b"\nNSpid:")
    if i < 0:
        return None
    end = status.find(b"\n", i + 1)
    try:
        return tuple(int(x) for x in status[i + 7: end if end >= 0 else None].split()) or None
    except ValueError:
        return None


def pid_ns_chain(pid: int, proc_root: str = "/proc", limit: int = 33) -> tuple[int, ...] | None:
    """Inodes of ``pid``'s PID namespace and of each namespace above it (as far as the kernel lets us
    go up), innermost first; None if its namespace cannot be opened."""
    import fcntl

    try:
        fd = os.open(f"{proc_root}/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    chain: list[int] = []
    try:
        while len(chain) < limit:
            chain.append(os.fstat(fd).st_ino)
            try:
                parent = fcntl.ioctl(fd, _NS_GET_PARENT)
            except OSError:  # the initial namespace (EPERM: none above ours that we may see)
                break
            os.close(fd)
            fd = parent
    finally:
        os.close(fd)
    return tuple(chain)


def pid_ns_init(pid: int, ppid: int, proc_root: str = "/proc", own: int | None = None) -> int | None | bool:
    """The inode of the PID namespace ``pid`` is the init of (its namespace differs from its parent's);
    None when it is not an init; False when it cannot be told (its namespace link cannot be read).

    ``own``: our own namespace's inode: a process in it is no namespace's init here (its parent, which we
    can see, is in it too), which answers most processes with one read."""
    ns = pid_ns(pid, proc_root)
    if ns is None:
        nsp = ns_pids(pid, proc_root)  # status is readable by anyone: PID 1 inside its namespace = its init
        if nsp is None:
            return False
        return False if len(nsp) > 1 and nsp[-1] == 1 else None
    if own is not None and ns == own:
        return None
    parent = pid_ns(ppid, proc_root) if ppid > 0 else None
    if parent is None:
        nsp = ns_pids(pid, proc_root)
        return ns if nsp is not None and len(nsp) > 1 and nsp[-1] == 1 else None
    return ns if parent != ns else None


def pid_ns_members(init: int, ns: int, pids, proc_root: str = "/proc", own: int | None = None
                   ) -> tuple[list[tuple[int, int | None]], list[int]]:
    """Processes among ``pids`` in PID namespace ``ns`` (whose init is ``init``) or in one nested in it,
    each with its PID inside ``ns`` (from NSpid); and the processes whose namespace cannot be read (they
    may be in it)."""
    depth = len(ns_pids(init, proc_root) or ())
    inside: list[tuple[int, int | None]] = []
    unknown: list[int] = []
    for pid in pids:
        mine = pid_ns(pid, proc_root)
        if mine is None:  # not ours to inspect: NSpid (world-readable) says how deep it is
            nsp = ns_pids(pid, proc_root)
            if nsp is not None and len(nsp) >= max(depth, 2):
                unknown.append(pid)  # deep enough to be inside: cannot tell
            continue
        if mine == own:
            continue
        if mine != ns:
            chain = pid_ns_chain(pid, proc_root)
            if chain is None or ns not in chain:
                continue
        nsp = ns_pids(pid, proc_root) or ()
        inside.append((pid, nsp[depth - 1] if depth and len(nsp) >= depth else None))
    return inside, unknown
