"""The audit logs: one JSON line per action or refusal, flushed and fsynced.

Two trails:

- **Your own log**, at ``Config.audit_log_path()`` (``audit_log`` in the config, ``$GPUTOP_AUDIT_LOG``, or
  ``<state dir>/audit.jsonl``), mode 0600. Every face writes it, as before.
- **The node trail**, ``/var/log/gputop/audit.jsonl`` (``$GPUTOP_NODE_AUDIT_LOG``), owned by root and
  written only by the node's audit server (hosted by the root guard daemon, see ``NodeAuditServer``).
  Every face sends each record to the server's Unix socket ``/run/gputop/audit.sock``
  (``$GPUTOP_AUDIT_SOCKET``); the server stamps it with the sender's uid, gid and pid from
  ``SO_PEERCRED`` (from the kernel: a user cannot forge it) and appends it. Users can neither edit nor
  erase it. Where no socket exists (no node service installed) only your own log is written.

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
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from gputop.config import Config
from gputop.errors import GputopError
from gputop.procs import user_name

_LOCK = threading.Lock()
NODE_LOG = Path("/var/log/gputop/audit.jsonl")
NODE_SOCKET = Path("/run/gputop/audit.sock")
MAX_BYTES = 16 * 1024 * 1024  # rotate beyond this ($GPUTOP_AUDIT_MAX_BYTES)
KEEP = 5  # rotated files kept: audit.jsonl.1 .. .5
MAX_RECORD = 64 * 1024  # the node server refuses a bigger record
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
    handle a request, the user who asked (gputop.requester)."""
    from gputop import requester

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
            send_node(data)
    return p


def _pid_of(rec: dict):
    t = rec.get("target")
    return t.get("pid") if isinstance(t, dict) else None


_node_warned = False


def send_node(data: bytes, timeout: float = 3.0) -> bool | None:
    """Send one encoded record to the node audit server. None: no node trail on this node (no socket);
    True: the server wrote it; False: it could not (warned once per process)."""
    global _node_warned
    sock_path = node_socket_path()
    try:
        os.stat(sock_path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        pass  # there, but not for us to see: the connect below says why
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(sock_path))
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            answer = s.recv(256)
        if answer.startswith(b"ok"):
            return True
        why = answer.decode("utf-8", "replace").strip() or "no answer"
    except OSError as e:
        why = e.strerror or str(e)
    if not _node_warned:
        _node_warned = True
        warn(f"the node audit trail ({sock_path}) did not take this record: {why}; it is in your own log "
             "only (is the gputop-guard service running?)")
    return False


# ---- the node audit server -------------------------------------------------------------------

def _peer(conn: socket.socket) -> dict:
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                        struct.calcsize("3i")))
    return {"uid": uid, "gid": gid, "pid": pid, "user": user_name(uid)}


def _node_group() -> int:
    """The node trail's group: 'adm' where it exists (admins read logs), else root's."""
    import grp

    try:
        return grp.getgrnam("adm").gr_gid
    except KeyError:
        return 0


class NodeAuditServer:
    """Accepts one JSON record per connection on a Unix socket, stamps it with the peer's credentials
    and appends it to the node trail. Runs in daemon threads of the (root) guard daemon.

    Bounded: a record over MAX_RECORD bytes or a client slower than ``timeout`` is refused; a uid sending
    more than ``rate`` records in 10 s is refused until the window ends (one "audit-dropped" record says
    how many)."""

    def __init__(self, sock_path: Path | None = None, log: Path | None = None, *, timeout: float = 2.0,
                 rate: int = 200):
        self.sock_path = Path(sock_path or node_socket_path())
        self.log = Path(log or node_log_path())
        self.timeout = timeout
        self.rate = rate
        self._window: dict[int, list] = {}  # uid -> [window start, count, dropped]
        self._sem = threading.BoundedSemaphore(32)
        self._lock = threading.Lock()
        self.sock: socket.socket | None = None

    def start(self) -> "NodeAuditServer":
        self.sock_path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(self.sock_path.parent, 0o755)
        if self.sock_path.is_socket():
            self.sock_path.unlink()  # a stale socket from a daemon that died (we hold the guard lock)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(self.sock_path))
        os.chmod(self.sock_path, 0o666)  # every user may write; the kernel says who they are
        s.listen(64)
        self.sock = s
        threading.Thread(target=self._accept, name="gputop-audit-server", daemon=True).start()
        return self

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            try:
                self.sock_path.unlink()
            except OSError:
                pass

    def _accept(self) -> None:
        while self.sock is not None:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if not self._sem.acquire(blocking=False):
                conn.close()  # too many at once: the client warns, its own log has the record
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(self.timeout)
                answer = self.handle(_peer(conn), _read_all(conn, MAX_RECORD))
                conn.sendall(answer.encode() + b"\n")
        except OSError:
            pass
        finally:
            self._sem.release()

    def handle(self, peer: dict, raw: bytes | None) -> str:
        """The answer for one client: 'ok' or 'error: why'."""
        if raw is None:
            return f"error: record larger than {MAX_RECORD} bytes"
        if not self._allow(peer["uid"]):
            return "error: rate limited"
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except (ValueError, RecursionError) as e:
            rec = {"action": "bad-record", "outcome": "rejected", "ok": False,
                   "message": f"a client sent a record that is not a JSON object: {type(e).__name__}",
                   "text": raw[:200].decode("utf-8", "replace")}
        rec["peer"] = peer  # what the kernel says about the sender; overrides anything the client sent
        rec["received"] = iso(time.time())
        return self.write(rec)

    def write(self, rec: dict) -> str:
        try:
            with self._lock:
                append_line(self.log, _encode(rec), mode=0o640, on_new=_chgrp)
        except OSError as e:
            warn(f"the node audit trail {self.log} could not be written: {e.strerror or e}")
            return f"error: the node trail cannot be written: {e.strerror or e}"
        return "ok"

    def _allow(self, uid: int) -> bool:
        now = time.monotonic()
        with self._lock:
            w = self._window.setdefault(uid, [now, 0, 0])
            if now - w[0] > 10:
                dropped, w[:] = w[2], [now, 0, 0]
            else:
                dropped = 0
            w[1] += 1
            if w[1] > self.rate:
                w[2] += 1
        if dropped:
            self.write({"at": time.time(), "time": iso(time.time()), "action": "audit-dropped",
                        "outcome": "rate-limited", "ok": False, "peer": {"uid": uid, "user": user_name(uid)},
                        "message": f"{dropped} record(s) from uid {uid} refused: over {self.rate} in 10 s"})
        return w[1] <= self.rate


def _chgrp(fd: int) -> None:
    try:
        os.fchown(fd, -1, _node_group())
        os.fchmod(fd, 0o640)
    except OSError:
        pass


def _read_all(conn: socket.socket, limit: int) -> bytes | None:
    """Everything the client sends until it shuts down writing; None when over ``limit``."""
    chunks, n = [], 0
    while True:
        b = conn.recv(65536)
        if not b:
            return b"".join(chunks)
        n += len(b)
        if n > limit:
            return None
        chunks.append(b)


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
