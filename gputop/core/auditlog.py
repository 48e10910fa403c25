"""The audit logs: one JSON line per action or refusal, flushed and fsynced.

Two trails:

- **Your own log**, at ``Config.audit_log_path()`` (``audit_log`` in the config, ``$GPUTOP_AUDIT_LOG``, or
  ``<state dir>/audit.jsonl``), mode 0600. Every face writes it, as before.
- **The node trail**, ``/var/log/gputop/audit.jsonl`` (``$GPUTOP_NODE_AUDIT_LOG``), owned by root and
  written only by the node's audit server (hosted by the root guard daemon, see ``NodeAuditServer``).
  Every face sends each record to the server's Unix socket ``/run/gputop/audit.sock``
  (``$GPUTOP_AUDIT_SOCKET``); the server stamps it with the sender's uid, gid and pid from
  ``SO_PEERCRED`` (from the kernel: a user cannot forge it) and appends it. Users can neither edit nor
  erase it, nor push root's records out of it: root's and the guard's records go to ``audit.jsonl``,
  every other uid's to its own ``audit-uid-U.jsonl`` with its own rotation (``read_node`` merges them).
  Where no socket exists (no node service installed) only your own log is written.

Writes are robust: one ``write()`` of a whole line under ``flock`` in ``O_APPEND`` mode (concurrent writers
keep whole lines, in the order they got the lock); a failed or short write (a full disk) is cut back with
``ftruncate`` so no partial line stays; a file that does not end in a newline (a crash mid-write) gets one
before the next record. Both logs rotate by size: beyond ``MAX_BYTES`` the file becomes ``.1`` (``.1``
becomes ``.2``, ... up to ``KEEP`` files). A line that cannot be written is never skipped silently:
``append`` prints one loud warning on stderr and raises ``AuditLogError``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from gputop.core.config import Config
from gputop.util.errors import GputopError
from gputop.core.procs import user_name

_LOCK = threading.Lock()
NODE_LOG = Path("/var/log/gputop/audit.jsonl")
NODE_SOCKET = Path("/run/gputop/audit.sock")
MAX_BYTES = 16 * 1024 * 1024  # rotate beyond this ($GPUTOP_AUDIT_MAX_BYTES)
KEEP = 5  # rotated files kept: audit.jsonl.1 .. .5
MAX_RECORD = 64 * 1024  # a node record is cut down to this size (never refused)
_warn_writer: Callable[[str], None] | None = None


class AuditLogError(GputopError):
    """The audit log could not be written (or read)."""


def log_path(config: Config | None = None, path: str | os.PathLike | None = None) -> Path:
    if path is not None:
        return Path(path)
    return (config or Config()).audit_log_path()


def node_log_path() -> Path:
    env = os.environ.get("GPUTOP_NODE_AUDIT_LOG")
    return Path(env) if env else NODE_LOG


def node_socket_path() -> Path:
    env = os.environ.get("GPUTOP_AUDIT_SOCKET")
    return Path(env) if env else NODE_SOCKET


def max_bytes() -> int:
    try:
        return max(4096, int(os.environ.get("GPUTOP_AUDIT_MAX_BYTES", MAX_BYTES)))
    except ValueError:
        return MAX_BYTES


def iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds")


def set_warn_writer(fn: Callable[[str], None] | None) -> None:
    """Where warnings go instead of plain stderr (the guard daemon adds its journal priority)."""
    global _warn_writer
    _warn_writer = fn


def warn(message: str) -> None:
    """A warning nobody can miss: the audit trail is incomplete."""
    if _warn_writer is not None:
        _warn_writer(f"*** WARNING: {message} ***")
        return
    try:
        sys.stderr.write(f"\n*** gputop WARNING: {message} ***\n")
        sys.stderr.flush()
    except Exception:  # stderr closed: nothing more we can do, the caller still gets the exception
        pass


def check_writable(config: Config | None = None, path: str | os.PathLike | None = None) -> str | None:
    """None if the log can be appended to; otherwise why not (the guard daemon checks it at start-up)."""
    p = log_path(config, path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.close(fd)
    except OSError as e:
        return f"audit log {p} cannot be written: {e.strerror or e}"
    return None


def actor() -> dict:
    """Who is acting: the effective user (and the sudo user behind it), or, while serve or mcp --http
    handle a request, the user who asked (gputop.core.requester)."""
    from gputop.core import requester

    asked = requester.current()
    if asked is not None:
        return dict(asked)
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    out: dict = {"user": user_name(uid) if uid is not None else os.environ.get("USERNAME", "?"), "uid": uid}
    if os.environ.get("SUDO_USER"):
        out["sudo_user"] = os.environ["SUDO_USER"]
    return out


# ---- appending -------------------------------------------------------------------------------

def _rotate(p: Path, keep: int = KEEP) -> None:
    """audit.jsonl -> .1 -> .2 ... (the oldest beyond ``keep`` is dropped). Called under the file's lock."""
    for n in range(keep - 1, 0, -1):
        older = p.with_name(f"{p.name}.{n}")
        if older.exists():
            os.replace(older, p.with_name(f"{p.name}.{n + 1}"))
    os.replace(p, p.with_name(p.name + ".1"))


def _open_locked(p: Path, mode: int) -> int:
    """An O_APPEND fd on ``p`` holding its flock; reopened if another writer rotated the file meanwhile."""
    import fcntl

    for _ in range(100):
        fd = os.open(p, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.stat(p).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass  # rotated away and not yet created again: retry
        except OSError:
            os.close(fd)
            raise
        os.close(fd)  # rotated away under us: lock the new file
    raise OSError("the log keeps being rotated away")


def append_line(p: Path, data: bytes, mode: int = 0o600, limit: int | None = None,
                on_new: Callable[[int], None] | None = None) -> None:
    """Append ``data`` (one line, ending in a newline) durably; raise OSError with nothing half-written."""
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_locked(p, mode)
    try:
        size = os.fstat(fd).st_size
        if size and size + len(data) > (limit or max_bytes()):
            _rotate(p)
            os.close(fd)
            fd = _open_locked(p, mode)
            size = os.fstat(fd).st_size
        if on_new is not None and size == 0:
            on_new(fd)
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # the last line was cut short (a crash): never glue a record onto it
        try:
            written = os.write(fd, data)  # one write, O_APPEND, under flock: whole lines in lock order
            if written != len(data):
                raise OSError(28, f"short write ({written} of {len(data)} bytes)")
            os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, size)  # a full disk: take the partial line back out
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


def _encode(rec: dict) -> bytes:
    return (json.dumps(rec, default=str, sort_keys=False) + "\n").encode("utf-8")


def append(record: dict, config: Config | None = None, path: str | os.PathLike | None = None) -> Path:
    """Append ``record`` to your own log (and send it to the node trail); flush and fsync.

    Every record says when, on which host and by whom, whichever face wrote it. Raises AuditLogError
    (after one loud warning) when your own log cannot be written; a node trail that cannot be reached is
    a warning. With an explicit ``path`` only that file is written (tests, tools)."""
    p = log_path(config, path)
    rec = dict(record)
    rec.setdefault("time", iso(rec.get("at") or time.time()))
    rec.setdefault("host", socket.gethostname())
    rec.setdefault("actor", actor())
    data = _encode(rec)
    try:
        with _LOCK:
            append_line(p, data)
    except OSError as e:
        msg = (f"audit log {p} could not be written ({getattr(e, 'strerror', None) or e}); this action "
               f"is NOT recorded: {rec.get('action')} pid={_pid_of(rec)} "
               f"outcome={rec.get('outcome')}. Fix the path or set GPUTOP_AUDIT_LOG")
        warn(msg)
        raise AuditLogError(msg) from None
    finally:
        if path is None:
            send_node(fit(rec, MAX_RECORD - 1024))  # room for the server's peer and received stamps
    return p


def _pid_of(rec: dict):
    t = rec.get("target")
    return t.get("pid") if isinstance(t, dict) else None


_node_warned = False


def _self_peer() -> dict:
    """This process as SO_PEERCRED would give it (for a record the serving process writes itself)."""
    uid = os.geteuid()
    return {"uid": uid, "gid": os.getegid(), "pid": os.getpid(), "user": user_name(uid)}


def private_socket_path(sock_path: Path | None = None) -> Path:
    """The server's second socket, mode 0600: only root (the server's own uid) can connect to it, so no user
    can fill it or its backlog. /run/gputop/audit.sock -> /run/gputop/audit-root.sock."""
    p = Path(sock_path or node_socket_path())
    return p.with_name(f"{p.stem}-root{p.suffix}")


class _NotConnected(OSError):
    """connect() failed: nothing was sent."""


def _connect_send(path: Path, data: bytes, timeout: float) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(path))
        except OSError as e:
            raise _NotConnected(e.errno, e.strerror or str(e)) from None
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        return s.recv(256)


def send_node(data: bytes, timeout: float = 3.0) -> bool | None:
    """Send one encoded record to the node audit server. None: no node trail on this node (no socket);
    True: the server wrote it; False: it could not (warned once per process).

    In the process that serves the trail (the guard daemon) the record is written directly, never through
    a socket a user could keep busy; root's faces use the server's private socket, which users cannot
    reach, and fall back to the public one."""
    global _node_warned
    sock_path = node_socket_path()
    served = _served.get(str(sock_path))
    if served is not None:
        answer = served.handle(_self_peer(), data).encode()
    else:
        try:
            os.stat(sock_path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            pass  # there, but not for us to see: the connect below says why
        answer = None
        private = private_socket_path(sock_path)
        if os.access(private, os.W_OK):  # root (or the server's own user): the path users cannot exhaust
            try:
                answer = _connect_send(private, data, timeout)
            except _NotConnected:
                pass  # not served there (an older server): the public socket
            except OSError as e:
                answer = f"error: {e.strerror or e}".encode()  # sent: never twice
        if answer is None:
            try:
                answer = _connect_send(sock_path, data, timeout)
            except OSError as e:
                answer = f"error: {e.strerror or e}".encode()
    if answer.startswith(b"ok"):
        return True
    why = answer.decode("utf-8", "replace").strip() or "no answer"
    if not _node_warned:
        _node_warned = True
        warn(f"the node audit trail ({sock_path}) did not take this record: {why}; it is in your own log "
             "only (is the gputop-guard service running?)")
    return False


# ---- cutting an oversized record down --------------------------------------------------------

_MAX_ITEMS = 256  # a longer list keeps its first 256 items and a marker
_MARKED = re.compile(r"…\[truncated (\d+) bytes\]$")
_KEEP_KEYS = ("at", "time", "host", "face", "action", "outcome", "ok", "reason", "received")


def _marker(n: int, what: str = "bytes") -> str:
    return f"…[truncated {n} {what}]"


def _leaves(rec) -> list:
    """(container, key, value) for every str and list below ``rec``, iteratively (no recursion limit)."""
    out, stack, seen = [], [rec], 0
    while stack and seen < 100_000:
        c = stack.pop()
        seen += 1
        items = c.items() if isinstance(c, dict) else enumerate(c)
        for k, v in items:
            if isinstance(v, (dict, list)):
                if isinstance(v, list):
                    out.append((c, k, v))
                stack.append(v)
            elif isinstance(v, str):
                out.append((c, k, v))
    return out


def _summary(rec, data: bytes, why: str) -> dict:
    """The last resort for a record that cannot be cut down field by field: its plain top-level fields
    (each at most 200 characters) and the start of its text."""
    out: dict = {}
    if isinstance(rec, dict):
        for k in _KEEP_KEYS:
            v = rec.get(k)
            if isinstance(v, str):
                out[k] = v[:200]
            elif isinstance(v, (int, float, bool)) or v is None and k in rec:
                out[k] = v
        t = rec.get("target")
        if isinstance(t, dict):
            out["target"] = {k: t[k] for k in ("pid", "start_time", "gpu") if isinstance(t.get(k), (int, float))}
    out["truncated"] = True
    out["message"] = f"{why}; the first 1000 bytes are in 'text'"
    out["text"] = data[:1000].decode("utf-8", "replace")
    return out


def _cap(sizes: list[int], excess: int) -> int:
    """The largest cap (at least 256) such that cutting every size above it down to it (plus a marker of
    about 48 bytes) saves ``excess`` bytes; 256 when even that does not."""
    lo, hi = 256, max(sizes)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        saved = sum(e - mid - 48 for e in sizes if e > mid)
        if saved >= excess:
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit(rec: dict, limit: int = MAX_RECORD) -> bytes:
    """``rec`` encoded in at most ``limit`` bytes: never refused, cut down. Lists longer than 256 items keep
    their first 256 and a marker; then the longest strings are shortened, each ending in
    "…[truncated N bytes]" (N: the UTF-8 bytes cut); a record that still does not fit (thousands of small
    fields) becomes a summary of its main fields. Either way ``truncated: true`` says it was cut. Work is
    bounded (a few passes over the record), whatever a client sends."""
    try:
        data = _encode(rec)
    except (ValueError, TypeError, RecursionError):
        return _encode(_summary(rec, b"", "a record that cannot be encoded (nested too deep)"))
    if len(data) <= limit:
        return data
    size = len(data)
    rec = json.loads(data)  # a deep copy of plain JSON values, ours to cut
    rec["truncated"] = True
    for c, k, v in _leaves(rec):
        if isinstance(v, list) and len(v) > _MAX_ITEMS:
            c[k] = v[:_MAX_ITEMS] + [_marker(len(v) - _MAX_ITEMS, "items")]
    data = _encode(rec)
    for _ in range(6):  # each round shortens every string above one cap at once: bounded work per record
        excess = len(data) - limit
        if excess <= 0:
            return data
        strings = [(len(json.dumps(x[2])), x) for x in _leaves(rec) if isinstance(x[2], str) and len(x[2]) > 256]
        if not strings:
            break
        cap = _cap([e for e, _ in strings], excess)
        for enc, (c, k, s) in strings:
            if enc <= cap:
                continue
            m = _MARKED.search(s)  # cut before (by the client, or a round before): the count adds up
            before, s = (int(m.group(1)), s[:m.start()]) if m else (0, s)
            keep = min(len(s) - 1, max(200, int(len(s) * max(0, cap - 48) / enc)))
            c[k] = s[:keep] + _marker(before + len(s[keep:].encode("utf-8", "replace")))
        data = _encode(rec)
    if len(data) <= limit:
        return data
    return _encode(_summary(rec, data, f"a record of {size} bytes cut down to its main fields"))


# ---- the node audit server -------------------------------------------------------------------

MAX_READ = 256 * 1024  # the most the server reads from one client; a record is then cut to MAX_RECORD
PER_UID_CONNECTIONS = 8  # connections one uid may have open on the public socket at once
MAX_CONNECTIONS = 256  # all of them together (root has its own socket besides)
_served: dict[str, "NodeAuditServer"] = {}  # socket path -> the server this process runs on it


class AuditSocketBusy(AuditLogError):
    """Another live server holds the node audit socket (a second guard daemon never takes it over)."""


def _peer(conn: socket.socket) -> dict:
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                        struct.calcsize("3i")))
    return {"uid": uid, "gid": gid, "pid": pid, "user": user_name(uid)}


def listener_pid(sock_path: Path, timeout: float = 1.0) -> int | None:
    """The pid of the process listening on ``sock_path`` (SO_PEERCRED of a connection), None when no process
    answers there (no file, not a socket, a stale socket: ECONNREFUSED)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(sock_path))
            return _peer(s)["pid"]
    except socket.timeout:
        return -1  # it exists and is listening, but its backlog is full: alive
    except OSError:
        return None


def _node_group() -> int:
    """The node trail's group: 'adm' where it exists (admins read logs), else root's."""
    import grp

    try:
        return grp.getgrnam("adm").gr_gid
    except KeyError:
        return 0


def user_log_path(log: Path, uid: int) -> Path:
    """Where the node trail keeps the records of ``uid`` (not root): audit.jsonl -> audit-uid-1001.jsonl."""
    return log.with_name(f"{log.stem}-uid-{int(uid)}{log.suffix}")


def user_max_bytes() -> int:
    """A user's node-trail file rotates beyond this: a quarter of the main trail's size."""
    return max(4096, max_bytes() // 4)


class NodeAuditServer:
    """Accepts one JSON record per connection on a Unix socket, stamps it with the peer's credentials
    and appends it to the node trail. Runs in daemon threads of the (root) guard daemon.

    No user can erase or block it:

    - **Budgets per uid.** Records from root (and from the server's own uid) go to the main trail
      ``audit.jsonl``; every other uid's records go to that uid's own file ``audit-uid-U.jsonl``, which
      rotates on its own (at a quarter of the main size, ``KEEP`` old files). A user's flood only pushes out
      that user's older records. A user may send ``rate`` records in 10 s; what is over is dropped and one
      "audit-dropped" record in that user's file counts it.
    - **Nobody waits on a user.** The accept loop only accepts: each connection has its own thread and a
      deadline of ``timeout`` seconds for the whole record; one uid holds at most ``PER_UID_CONNECTIONS``
      at once (more are closed and counted as dropped). Root's faces use a second socket, mode 0600, that
      users cannot connect to, and the serving process writes its own records directly.
    - **Never refused for size.** A record over ``MAX_RECORD`` is cut down (``fit``), not refused.
    - **One server per socket.** ``start`` takes ``<socket>.lock`` (flock) and checks that nobody answers on
      the socket; a live one raises AuditSocketBusy, a dead one (a stale file) is replaced. ``close`` unlinks
      a socket path only while it still is the socket this server bound (same st_dev and st_ino).
    """

    def __init__(self, sock_path: Path | None = None, log: Path | None = None, *, timeout: float = 2.0,
                 rate: int = 200, per_uid: int = PER_UID_CONNECTIONS):
        self.sock_path = Path(sock_path or node_socket_path())
        self.private_path = private_socket_path(self.sock_path)
        self.log = Path(log or node_log_path())
        self.timeout = timeout
        self.rate = rate
        self.per_uid = per_uid
        self.owners = {0, os.geteuid()}  # their records go to the main trail, never rate-limited
        self._window: dict[int, list] = {}  # uid -> [window start, count, dropped]
        self._conns: dict[object, int] = {}  # uid (or "private") -> connections open now
        self._total = 0
        self._lock = threading.Lock()  # the bookkeeping above
        self._file_locks: dict[Path, threading.Lock] = {}
        self._listeners: list[tuple[socket.socket, Path, tuple]] = []
        self._lock_fd: int | None = None
        self.sock: socket.socket | None = None

    # ---- lifecycle ----

    def start(self) -> "NodeAuditServer":
        import fcntl
        import stat

        d = self.sock_path.parent
        d.mkdir(parents=True, exist_ok=True)
        if d.stat().st_uid == os.geteuid():
            os.chmod(d, 0o755)
        fd = os.open(self.sock_path.with_name(self.sock_path.name + ".lock"),
                     os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            self._busy(listener_pid(self.sock_path))
        pid = listener_pid(self.sock_path)
        if pid is not None:  # served without our lock (an older gputop): still never taken over
            os.close(fd)
            self._busy(pid)
        self._lock_fd = fd
        try:
            for path, mode in ((self.sock_path, 0o666), (self.private_path, 0o600)):
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        os.unlink(path)  # dead: we hold the lock and nobody answers on it
                except FileNotFoundError:
                    pass
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.bind(str(path))
                    st = os.stat(path)
                    os.chmod(path, mode)  # public: every user may write, the kernel says who they are
                    s.listen(128)
                except OSError:
                    s.close()
                    raise
                self._listeners.append((s, path, (st.st_dev, st.st_ino)))
        except OSError:
            self.close()
            raise
        self.sock = self._listeners[0][0]
        _served[str(self.sock_path)] = self
        for s, path, _ in self._listeners:
            private = path == self.private_path
            threading.Thread(target=self._accept, args=(s, private), daemon=True,
                             name="gputop-audit-root" if private else "gputop-audit-server").start()
        return self

    def _busy(self, pid: int | None):
        who = f"pid {pid}" if pid and pid > 0 else "another process"
        raise AuditSocketBusy(f"the node audit trail {self.sock_path} is already served by {who}: not taken "
                              "over (this process does not serve it; its records go to that server)")

    def close(self) -> None:
        if _served.get(str(self.sock_path)) is self:
            del _served[str(self.sock_path)]
        listeners, self._listeners, self.sock = self._listeners, [], None
        for s, path, ident in listeners:
            try:
                st = os.stat(path)
                if (st.st_dev, st.st_ino) == ident:  # still ours: never unlink another server's socket
                    os.unlink(path)
            except OSError:
                pass
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes the accept() of its thread
            except OSError:
                pass
            s.close()
        if listeners:
            self._flush_dropped()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # ---- connections ----

    def _accept(self, sock: socket.socket, private: bool) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                if not any(s is sock for s, _, _ in self._listeners):
                    return  # closed
                time.sleep(0.05)  # EMFILE and the like: never spin
                continue
            try:
                peer = _peer(conn)
            except OSError:
                conn.close()
                continue
            key = "private" if private else peer["uid"]
            limit = 64 if private else self.per_uid
            with self._lock:
                n = self._conns.get(key, 0)
                over = n >= limit or (not private and self._total >= MAX_CONNECTIONS)
                if not over:
                    self._conns[key] = n + 1
                    self._total += 0 if private else 1
            if over:
                conn.close()  # the client warns; its own log has the record
                if not private:
                    self._count_drop(peer["uid"])
                continue
            try:
                threading.Thread(target=self._serve, args=(conn, peer, key), daemon=True).start()
            except RuntimeError:  # no thread left
                conn.close()
                self._release(key)

    def _release(self, key) -> None:
        with self._lock:
            self._conns[key] -= 1
            if not self._conns[key]:
                del self._conns[key]
            if key != "private":
                self._total -= 1

    def _serve(self, conn: socket.socket, peer: dict, key) -> None:
        try:
            with conn:
                deadline = time.monotonic() + self.timeout
                raw, whole = _read_all(conn, MAX_READ, deadline)
                answer = self.handle(peer, raw, whole)
                conn.settimeout(max(0.05, deadline - time.monotonic()))
                conn.sendall(answer.encode() + b"\n")
        except OSError:  # too slow (its deadline passed), or gone
            pass
        finally:
            self._release(key)

    # ---- records ----

    def handle(self, peer: dict, raw: bytes, whole: bool = True) -> str:
        """The answer for one client: 'ok' or 'error: why'."""
        if not raw.strip():
            return "error: empty record"  # a probe (listener_pid), not a record
        uid = peer["uid"]
        if uid not in self.owners and not self._allow(uid):
            return "error: rate limited"
        rec = None
        if whole:
            try:
                rec = json.loads(raw)
            except (ValueError, RecursionError) as e:
                why = f"a client sent a record that is not a JSON object: {type(e).__name__}"
            else:
                why = "a client sent a record that is not a JSON object: not an object"
        else:
            why = f"a client sent more than {MAX_READ} bytes"
        if not isinstance(rec, dict):
            rec = {"action": "bad-record", "outcome": "rejected", "ok": False, "message": why,
                   "text": raw[:200].decode("utf-8", "replace")}
        rec["peer"] = peer  # what the kernel says about the sender; overrides anything the client sent
        rec["received"] = iso(time.time())
        return self.write(rec)

    def path_for(self, uid: int) -> Path:
        return self.log if uid in self.owners else user_log_path(self.log, uid)

    def write(self, rec: dict) -> str:
        peer = rec.get("peer") if isinstance(rec.get("peer"), dict) else {}
        uid = peer.get("uid", 0)
        path = self.path_for(uid)
        limit = None if uid in self.owners else user_max_bytes()
        with self._lock:
            lock = self._file_locks.setdefault(path, threading.Lock())
        try:
            with lock:
                append_line(path, fit(rec), mode=0o640, limit=limit, on_new=_chgrp)
        except OSError as e:
            warn(f"the node audit trail {path} could not be written: {e.strerror or e}")
            return f"error: the node trail cannot be written: {e.strerror or e}"
        return "ok"

    def _count_drop(self, uid: int) -> None:
        if uid in self.owners:
            return
        now = time.monotonic()
        with self._lock:
            self._window.setdefault(uid, [now, 0, 0])[2] += 1

    def _dropped_record(self, uid: int, dropped: int) -> dict:
        return {"at": time.time(), "time": iso(time.time()), "action": "audit-dropped", "outcome": "dropped",
                "ok": False, "peer": {"uid": uid, "user": user_name(uid)}, "received": iso(time.time()),
                "message": f"{dropped} record(s) from uid {uid} dropped: over {self.rate} in 10 s or over "
                           f"{self.per_uid} connections at once"}

    def _allow(self, uid: int) -> bool:
        now = time.monotonic()
        with self._lock:
            w = self._window.setdefault(uid, [now, 0, 0])
            if now - w[0] > 10:
                dropped, w[:] = w[2], [now, 0, 0]
            else:
                dropped = 0
            w[1] += 1
            allowed = w[1] <= self.rate
            if not allowed:
                w[2] += 1
        if dropped:  # in that user's own file: a flood never writes into the main trail
            self.write(self._dropped_record(uid, dropped))
        return allowed

    def _flush_dropped(self) -> None:
        with self._lock:
            pending = [(uid, w[2]) for uid, w in self._window.items() if w[2]]
            for w in self._window.values():
                w[2] = 0
        for uid, n in pending:
            self.write(self._dropped_record(uid, n))


def _chgrp(fd: int) -> None:
    try:
        os.fchown(fd, -1, _node_group())
        os.fchmod(fd, 0o640)
    except OSError:
        pass


def _read_all(conn: socket.socket, limit: int, deadline: float) -> tuple[bytes, bool]:
    """What the client sends until it shuts down writing, by ``deadline`` (socket.timeout after it):
    (data, True); or the first ``limit`` bytes and False when it sends more."""
    chunks, n = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("the client was too slow")
        conn.settimeout(left)
        b = conn.recv(65536)
        if not b:
            return b"".join(chunks), True
        chunks.append(b)
        n += len(b)
        if n > limit:
            return b"".join(chunks)[:limit], False


# ---- reading ---------------------------------------------------------------------------------

def _files(p: Path) -> list[Path]:
    """The rotated files oldest first, then the live one."""
    old = [p.with_name(f"{p.name}.{n}") for n in range(KEEP, 0, -1)]
    return [f for f in old if f.exists()] + [p]


def parse_line(line: str, n: int) -> dict:
    """One record, or ``{"corrupt": True, "line": N, "text": ...}`` for a line that is not a JSON object."""
    try:
        rec = json.loads(line)
        if not isinstance(rec, dict):
            raise ValueError
    except (ValueError, RecursionError):
        return {"corrupt": True, "line": n, "text": line[:200]}
    return rec


def read(since: float | None = None, config: Config | None = None,
         path: str | os.PathLike | None = None, rotated: bool = True) -> list[dict]:
    """The records at or after ``since`` (epoch seconds), oldest first, rotated files included. A
    missing log is empty. A line that is not a JSON object (e.g. cut short by a crash) is returned as
    ``{"corrupt": True, "line": N, "text": ...}`` rather than dropped; every whole line is read."""
    p = log_path(config, path)
    out: list[dict] = []
    for f in (_files(p) if rotated else [p]):
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        except OSError as e:
            raise AuditLogError(f"audit log {f} cannot be read: {e.strerror or e}") from None
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            rec = parse_line(line, n)
            if since is not None and not rec.get("corrupt"):
                at = rec.get("at")
                if isinstance(at, (int, float)) and math.isfinite(at) and at < since:
                    continue
            out.append(rec)
    return out


def user_logs(log: Path) -> list[Path]:
    """The per-uid files of the node trail ``log`` (audit-uid-U.jsonl), by uid."""
    prefix, suffix = f"{log.stem}-uid-", log.suffix
    found = []
    try:
        names = os.listdir(log.parent)
    except OSError:
        return []
    for name in names:
        uid = name[len(prefix):len(name) - len(suffix)] if suffix else name[len(prefix):]
        if name.startswith(prefix) and name.endswith(suffix) and uid.isdigit():
            found.append((int(uid), log.with_name(name)))
    return [p for _, p in sorted(found)]


def read_node(since: float | None = None, path: str | os.PathLike | None = None) -> list[dict]:
    """The whole node trail: the main trail (root, the guard) and every user's own file, rotated files
    included, merged into the order the server received them (its ``received`` stamp; each file is
    already in that order). Records are filtered by ``since`` as in ``read``."""
    import heapq

    log = Path(path) if path is not None else node_log_path()

    def keyed(records: list[dict]):
        last = ""
        for rec in records:
            r = rec.get("received")
            if isinstance(r, str):
                last = r
            yield last, rec

    chains = [read(since, path=p) for p in [log, *user_logs(log)]]
    return [rec for _, rec in heapq.merge(*(keyed(c) for c in chains), key=lambda x: x[0])]
