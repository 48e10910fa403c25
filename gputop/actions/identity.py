"""Process identity and signalling: a verified pidfd (Linux) or psutil handle, thread-group resolution,
waiting for an exit, and a per-target lock so that concurrent gputop invocations tell who killed what."""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import time

from gputop.actions.common import same_start
from gputop.core.procs import IS_LINUX, ProcInfo, read_proc, start_time, stat_state

_POLL = 0.02

class Handle:
    """A verified handle on one process: a pidfd on Linux, a psutil.Process elsewhere.

    Opened only after the identity check, and checked again after opening, so the handle refers to the
    process the caller saw and a later signal cannot reach a process that reused the PID.
    """

    def __init__(self, info: ProcInfo):
        self.info = info
        self.pid = info.pid
        self.fd: int | None = None
        self.proc = None
        self.state: str | None = None  # its state (R, S, T, ...) right after the pidfd was opened (Linux)
        if IS_LINUX and hasattr(os, "pidfd_open"):
            try:
                self.fd = os.pidfd_open(info.pid)  # ProcessLookupError if gone
            except ProcessLookupError:
                raise
            except OSError as e:
                # ENOSYS: a kernel before 5.3 has no pidfd (use psutil below). EINVAL: a thread id; callers
                # resolve those to their process first (tgid_of), so it is an identity change here.
                if e.errno == errno.EINVAL:
                    raise LookupError("not a process (a thread id?)") from None
                if e.errno != errno.ENOSYS:
                    raise
        if self.fd is not None:
            now = stat_state(info.pid)  # None: gone, exited, or its /proc entry cannot be read
            if now is None and not _exited(self.fd):
                # The pidfd says it runs, but /proc will not show it (hidepid, or it became unreadable):
                # its identity cannot be checked. Not gone: refused, as a permission problem.
                os.close(self.fd)
                self.fd = None
                raise PermissionError(1, f"cannot check the identity of pid {info.pid}: /proc/{info.pid} "
                                         "cannot be read")
            if now is None or not same_start(now[1], info.start_time):
                os.close(self.fd)
                self.fd = None
                raise LookupError("identity changed")
            self.state = now[0]
        else:
            import psutil

            try:
                p = psutil.Process(info.pid)
                created = round(p.create_time(), 2)
            except psutil.NoSuchProcess:
                raise ProcessLookupError(errno.ESRCH, f"no process {info.pid}") from None
            except psutil.AccessDenied:
                raise PermissionError(1, f"cannot check the identity of pid {info.pid}") from None
            if not same_start(created, info.start_time):
                raise LookupError("identity changed")
            self.proc = p

    def send(self, sig: int) -> bool:
        """Signal the process; False if it has already exited. PermissionError propagates."""
        if self.fd is not None:
            try:
                signal.pidfd_send_signal(self.fd, sig)
                return True
            except ProcessLookupError:
                return False
        import psutil

        try:
            if not self.proc.is_running():  # psutil compares the create time too
                return False
            self.proc.send_signal(sig)
            return True
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied as e:
            raise PermissionError(1, "Operation not permitted") from e

    def alive(self) -> bool:
        """The process runs (not a zombie; a half-exited one runs) and the PID still has its start time.

        With a pidfd, the pidfd answers: it refers to this very process and turns readable only when every
        thread has exited, so a process whose /proc entry cannot be read is never taken for gone. Without
        one, /proc/PID/stat (the same start and zombie test as read_proc)."""
        if self.fd is not None:
            return not _exited(self.fd)
        now = start_time(self.pid)
        return now is not None and same_start(now, self.info.start_time)

    def close(self):
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


def wait_gone(handles: list[Handle], timeout: float) -> list[Handle]:
    """Wait up to ``timeout`` for the handles' processes to exit; return those still alive.

    Where every handle is a pidfd, the wait wakes when one of them exits (a pidfd turns readable then)
    instead of polling /proc, so it returns as soon as the last one is gone; /proc still decides."""
    deadline = time.monotonic() + max(0.0, timeout)
    alive = [h for h in handles if h.alive()]
    while alive:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        _wait_exit(alive, min(left, _POLL * 10))
        alive = [h for h in alive if h.alive()]
    return alive


def _exited(fd: int) -> bool:
    """True once the process of pidfd ``fd`` has exited (all its threads: a zombie has, a half-exited
    process has not). A pidfd that cannot be polled says nothing: False (still there)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    try:
        return bool(poller.poll(0))
    except OSError:
        return False


def _wait_exit(handles: list[Handle], timeout: float) -> None:
    """Sleep until one of ``handles`` exits or ``timeout`` passes (``_POLL`` at most without pidfds)."""
    fds = [h.fd for h in handles if h.fd is not None]
    if len(fds) != len(handles):
        time.sleep(min(timeout, _POLL))
        return
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    try:
        poller.poll(max(0, int(timeout * 1000)))
    except InterruptedError:
        pass



ROOT_LOCK_DIR = "/run/gputop/locks"  # root's lock files (the directory: root's, 0755)
_BIND_LISTEN = 0.1  # how long a name that is bound but not listened on may stay so before it is ignored
_TRUST_FOR = 0.5  # how long a trusted holder's credentials are taken as still valid (each check is queued
#                   on the holder's socket until it closes: this keeps a long wait far below its backlog)


class TargetLock:
    """A lock on one target identity, so that concurrent gputop invocations tell who killed what: the
    one that holds it signals; a concurrent one sends nothing and waits to report what happened (ten
    concurrent kills of one process do not all claim to have killed it). The kernel releases it when
    its holder exits.

    No other user can hold it against root or against you:

    - Root locks a file in ROOT_LOCK_DIR (an exclusive flock; a directory only root may write, checked
      on every use, so only root can hold such a lock), and also binds the abstract Unix socket name
      below, best effort, so that unprivileged gputops see root's lock.
    - Any other user (and root where that directory cannot be used) binds, and listens on, the
      abstract name ``\\0gputop-ACTION-PID-START``. Anyone can bind any abstract name, so a taken name
      is obeyed only when the kernel says its holder (connect, then SO_PEERCRED) is root or this same
      effective uid. A name held by another uid, or by a socket whose credentials cannot be read
      (bound but never listened on, or its queue full), is not obeyed: this invocation acts without
      the lock (``foreign_holder`` says what held it). Under such squatting two concurrent invocations
      of one unprivileged user may both signal the same verified process (each through its own pidfd).
    """

    def __init__(self, action: str, pid: int, start: float):
        self.name = f"\0gputop-{action}-{pid}-{int(round(start * 100))}"
        self.sock: socket.socket | None = None
        self.file_fd: int | None = None
        self.file_path: str | None = None
        self.foreign_holder: dict | None = None  # {"pid", "uid"} (None when unreadable) of an ignored holder
        self._trusted_until = 0.0

    def acquire(self) -> bool:
        """True when this invocation may signal: the lock is ours, or the name is held by someone whose
        word does not count (see the class). False: a trusted gputop holds it."""
        if not IS_LINUX:
            return True  # no abstract sockets: every invocation acts for itself
        if self.sock is not None or self.file_fd is not None:
            return True
        if os.geteuid() == 0:
            got = self._acquire_file()
            if got is not None:
                if got:
                    self._advertise()
                return got
        return self._acquire_name()

    def _bind(self) -> int:
        """Bind and listen on the name: 0 when ours, else the errno."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(self.name)
            s.listen(socket.SOMAXCONN)  # so that waiters can read our credentials
        except OSError as e:
            s.close()
            return e.errno or errno.EIO
        self.sock = s
        return 0

    def _advertise(self) -> None:
        """Root holds the file lock: the name too, where it is free (for unprivileged gputops)."""
        if self._bind() == errno.EADDRINUSE:
            cred = _holder_cred(self.name)
            if not isinstance(cred, tuple):
                self.foreign_holder = {"pid": None, "uid": None}
            elif cred[1] != 0:
                self.foreign_holder = {"pid": cred[0], "uid": cred[1]}

    def _acquire_name(self) -> bool:
        deadline = time.monotonic() + _BIND_LISTEN
        while True:
            err = self._bind()
            if err == 0:
                self.foreign_holder = None
                return True
            if err != errno.EADDRINUSE:
                return True  # no lock to be had (out of descriptors...): act, as without abstract sockets
            if time.monotonic() < self._trusted_until:
                return False
            cred = _holder_cred(self.name)
            if cred == "refused" and time.monotonic() < deadline:
                time.sleep(0.005)  # between its holder's bind and listen, or freed meanwhile: look again
                continue
            if isinstance(cred, tuple):
                pid, uid = cred
                if uid == 0 or uid == os.geteuid():
                    self._trusted_until = time.monotonic() + _TRUST_FOR
                    return False
                self.foreign_holder = {"pid": pid, "uid": uid}
            else:
                self.foreign_holder = {"pid": None, "uid": None}
            return True

    def _acquire_file(self) -> bool | None:
        """Root's lock: an exclusive flock on a file in ROOT_LOCK_DIR. True when ours, False when another
        root gputop holds it, None when the directory cannot be used (missing and not creatable, or not
        root's alone)."""
        import fcntl

        from gputop.util import trustfile

        for d in (os.path.dirname(ROOT_LOCK_DIR), ROOT_LOCK_DIR):
            try:
                os.mkdir(d, 0o755)
                os.chmod(d, 0o755)  # whatever the umask: /run/gputop also holds the node audit socket
            except FileExistsError:
                pass
            except OSError:
                return None
        if not trustfile.private_dir(ROOT_LOCK_DIR):
            return None
        path = os.path.join(ROOT_LOCK_DIR, self.name.lstrip("\0"))
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except OSError:
                os.close(fd)
                return None
            try:
                same = os.fstat(fd).st_ino == os.lstat(path).st_ino
            except OSError:
                same = False
            if same:
                self.file_fd, self.file_path = fd, path
                return True
            os.close(fd)  # its last holder removed that file after we opened it: lock the new one

    def wait(self, pid: int, start: float, timeout: float) -> bool:
        """Wait until the lock is free or the target is gone; True once the lock is ours."""
        deadline = time.monotonic() + max(0.0, timeout)
        while time.monotonic() < deadline:
            if self.acquire():
                return True
            now = read_proc(pid)
            if now is None or now.zombie or not same_start(now.start_time, start):
                return False
            time.sleep(_POLL)
        return self.acquire()

    def release(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.file_fd is not None:
            try:
                os.unlink(self.file_path)  # while still locked: a waiter that opened it sees it gone
            except OSError:
                pass
            os.close(self.file_fd)
            self.file_fd = None


def _holder_cred(name: str) -> tuple[int, int] | str:
    """(pid, uid) of whoever listens on the abstract socket ``name``, from the kernel (SO_PEERCRED: the
    listener's credentials when it called listen()); "refused" when nothing listens on it; "unreadable"
    when its queue is full or the connection fails otherwise."""
    import struct

    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.setblocking(False)  # a full queue must not block us
    try:
        c.connect(name)
        pid, uid, _gid = struct.unpack("iII", c.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("iII")))
        return pid, uid
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "unreadable"
    finally:
        c.close()
