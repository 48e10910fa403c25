"""The audit log: one JSON line per action or refusal, flushed and fsynced.

It lives at ``Config.audit_log_path()`` (``audit_log`` in the config, ``$GPUTOP_AUDIT_LOG``, or
``<state dir>/audit.jsonl``). A line that cannot be written is never skipped silently: ``append`` prints
a loud warning on stderr and raises ``AuditLogError``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import sys
import threading
from pathlib import Path

from gputop.config import Config
from gputop.errors import GputopError
from gputop.procs import user_name

_LOCK = threading.Lock()


class AuditLogError(GputopError):
    """The audit log could not be written (or read)."""


def log_path(config: Config | None = None, path: str | os.PathLike | None = None) -> Path:
    if path is not None:
        return Path(path)
    return (config or Config()).audit_log_path()


def iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds")


def warn(message: str) -> None:
    """A warning nobody can miss: the audit trail is incomplete."""
    try:
        sys.stderr.write(f"\n*** gputop WARNING: {message} ***\n")
        sys.stderr.flush()
    except Exception:  # stderr closed: nothing more we can do, the caller still gets the exception
        pass


def check_writable(config: Config | None = None, path: str | os.PathLike | None = None) -> str | None:
    """None if the log can be appended to; otherwise why not (used to refuse acting without a log)."""
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


def append(record: dict, config: Config | None = None, path: str | os.PathLike | None = None) -> Path:
    """Append ``record`` as one JSON line; flush and fsync. Raises AuditLogError (after a loud warning).

    Every record says when, on which host and by whom, whichever face wrote it."""
    p = log_path(config, path)
    rec = dict(record)
    rec.setdefault("time", iso(rec.get("at") or _now()))
    rec.setdefault("host", socket.gethostname())
    rec.setdefault("actor", actor())
    line = json.dumps(rec, default=str, sort_keys=False) + "\n"
    try:
        with _LOCK:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                data = line.encode("utf-8")
                written = os.write(fd, data)  # one write in O_APPEND mode: lines never interleave
                if written != len(data):
                    raise OSError(f"short write ({written} of {len(data)} bytes)")
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as e:
        msg = (f"audit log {p} could not be written ({getattr(e, 'strerror', None) or e}); this action "
               f"is NOT recorded: {rec.get('action')} pid={(rec.get('target') or {}).get('pid')} "
               f"outcome={rec.get('outcome')}. Fix the path or set GPUTOP_AUDIT_LOG")
        warn(msg)
        raise AuditLogError(msg) from None
    return p


def _now() -> float:
    import time

    return time.time()


def read(since: float | None = None, config: Config | None = None,
         path: str | os.PathLike | None = None) -> list[dict]:
    """The records at or after ``since`` (epoch seconds), oldest first. A missing log is empty.

    A line that is not valid JSON (e.g. cut short by a crash) is returned as
    ``{"corrupt": True, "line": N, "text": ...}`` rather than dropped.
    """
    p = log_path(config, path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as e:
        raise AuditLogError(f"audit log {p} cannot be read: {e.strerror or e}") from None
    out: list[dict] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError
        except ValueError:
            out.append({"corrupt": True, "line": n, "text": line[:200]})
            continue
        if since is not None:
            at = rec.get("at")
            if isinstance(at, (int, float)) and at < since:
                continue
        out.append(rec)
    return out
