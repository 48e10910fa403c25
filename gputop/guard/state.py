"""The guard's shared channel: mode, policy path and rule hits, shared by the daemon and every face.

Everything lives in files under ``gputop.core.config.guard_dir()``, so a TUI, the HTTP API or the MCP server on
the node can read and change what a running daemon does without talking to it:

- ``guard.json``: ``{mode, policy_file, last_error, updated_at, updated_by}``. Written atomically
  (temp file + rename) under a lock. The daemon re-reads it when its mtime changes, once per interval.
- ``guard-hits.jsonl``: one JSON line per rule hit, appended by the daemon (and by ``--test-policies``
  never: that only prints). ``recent_hits()`` reads its tail.
- ``guard-daemon.json``: written by a running daemon every interval: pid, start time, last tick, counts.

Modes: ``off`` (evaluate nothing), ``dry-run`` (evaluate and record what would be done, kill nothing),
``enforce`` (act). Enabling defaults to dry-run.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

from gputop.core.config import guard_dir
from gputop.util.errors import UsageError

MODES = ("off", "dry-run", "enforce")
DEFAULT_MODE = "off"
STATE_FILE = "guard.json"
HITS_FILE = "guard-hits.jsonl"
DAEMON_FILE = "guard-daemon.json"
LOCK_FILE = "guard.lock"
HITS_MAX_BYTES = 8 * 1024 * 1024  # rotate guard-hits.jsonl to .1 beyond this


def state_path() -> Path:
    return guard_dir() / STATE_FILE


def hits_path() -> Path:
    return guard_dir() / HITS_FILE


def daemon_path() -> Path:
    return guard_dir() / DAEMON_FILE


# ---- files -----------------------------------------------------------------------------------

def file_sig(path: str | os.PathLike | None) -> tuple | None:
    """What tells a file's new version from the last one read (it is replaced atomically or appended to):
    its mtime, size and inode, and its owner and mode (a chmod or chown alone can make root refuse a policy:
    gputop.util.trustfile); ``("missing",)`` when it cannot be read; None for no path. The daemon re-reads its
    state and policy, and the TUI's side panel the state and hits, when this changes."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return ("missing",)
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_uid, st.st_mode)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except (OSError, ValueError):
        return {}  # a torn or unreadable file reads as empty; writers always replace atomically
    return data if isinstance(data, dict) else {}


def _write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # readable by every face on the node; writable only by the owner
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked():
    """Serialise read-modify-write of guard.json between processes (TUI and CLI may race)."""
    d = guard_dir()
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - not POSIX
            pass
        yield
    finally:
        os.close(fd)


def read_state() -> dict:
    """The raw state: ``{mode, policy_file, last_error, updated_at, updated_by}`` (missing keys absent)."""
    return _read_json(state_path())


def _update(face: str, **fields) -> dict:
    with _locked():
        data = read_state()
        data.update(fields)
        data["updated_at"] = time.time()
        data["updated_by"] = face
        _write_json_atomic(state_path(), data)
        return data


def _audit(record: dict) -> None:
    from gputop.core import auditlog

    auditlog.append(record)


# ---- mode ------------------------------------------------------------------------------------

def get_mode() -> str:
    mode = read_state().get("mode")
    return mode if mode in MODES else DEFAULT_MODE


def set_mode(mode: str, face: str) -> str:
    """Switch the guard mode (atomic, audit-logged). Returns the previous mode.

    A change to the mode already set changes and records nothing. The record is written while the lock
    is held, so concurrent changes are recorded in the order they were made. Raises AuditLogError when
    the mode changed but its record could not be written."""
    if mode not in MODES:
        raise UsageError(f"unknown guard mode '{mode}': use one of {', '.join(MODES)}")
    with _locked():
        data = read_state()
        previous = data.get("mode") if data.get("mode") in MODES else DEFAULT_MODE
        if previous == mode:
            return previous
        data.update(mode=mode, updated_at=time.time(), updated_by=face)
        _write_json_atomic(state_path(), data)
        _audit({"at": time.time(), "face": face, "action": "guard-mode", "outcome": "ok",
                "mode": mode, "previous": previous,
                "message": f"guard mode {previous} -> {mode} (by {face})"})
    return previous


# ---- policy path ----------------------------------------------------------------------------

def get_policy_path(config=None) -> str | None:
    """The policy file the guard uses: the one set with set_policy_path, else ``guard.policy`` in the
    config (``config``, a gputop.core.config.Config such as the one --config loaded; else the default
    config), else None."""
    p = read_state().get("policy_file")
    if p:
        return str(p)
    try:
        from gputop.core.config import load_config

        guard = (config if config is not None else load_config()).extra.get("guard") or {}
    except Exception:
        return None
    p = guard.get("policy") or guard.get("policy_file") if isinstance(guard, dict) else None
    return os.path.expanduser(str(p)) if p else None


def set_policy_path(path: str | os.PathLike, face: str) -> None:
    """Point the guard at ``path`` (made absolute). Validate it first: see guard.policy.load_policy."""
    p = str(Path(os.path.expanduser(str(path))).resolve())
    with _locked():  # read, write and record as one step: concurrent changes are recorded in order
        data = read_state()
        previous = data.get("policy_file")
        if previous == p and not data.get("last_error"):
            return
        data.update(policy_file=p, last_error=None, updated_at=time.time(), updated_by=face)
        _write_json_atomic(state_path(), data)
        if previous != p:
            _audit({"at": time.time(), "face": face, "action": "guard-policy", "outcome": "ok",
                    "policy_file": p, "previous": previous,
                    "message": f"guard policy file set to {p} (by {face})"})


def set_last_error(message: str | None, face: str = "guard") -> None:
    """Record (or clear, with None) the last policy/daemon error so every face can show it."""
    if read_state().get("last_error") == message:
        return
    _update(face, last_error=message)


# ---- hits ------------------------------------------------------------------------------------

HIT_KEYS = ("time", "rule", "pid", "target", "user", "dry_run", "action", "outcome", "message")


def append_hit(hit: dict) -> None:
    """Append one hit (see HIT_KEYS; extra keys are kept) as a JSON line. Used by the daemon."""
    p = hits_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    rec = {k: hit.get(k) for k in HIT_KEYS}
    rec.update({k: v for k, v in hit.items() if k not in rec})
    if rec["time"] is None:
        rec["time"] = time.time()
    line = (json.dumps(rec, default=str) + "\n").encode("utf-8")
    with contextlib.suppress(OSError):
        if p.stat().st_size + len(line) > HITS_MAX_BYTES:
            os.replace(p, p.with_name(p.name + ".1"))
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one O_APPEND write: concurrent appenders never interleave lines
    finally:
        os.close(fd)


def _tail_lines(path: Path, limit: int, chunk: int = 65536) -> list[bytes]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            data = b""
            pos = end
            while pos > 0 and data.count(b"\n") <= limit:
                step = min(chunk, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    except OSError:
        return []
    lines = [ln for ln in data.split(b"\n") if ln.strip()]
    if pos > 0 and lines:
        lines = lines[1:]  # the first line may be cut
    return lines[-limit:] if limit > 0 else []


def recent_hits(limit: int = 100) -> list[dict]:
    """The last ``limit`` hits, NEWEST FIRST. Each: time (epoch), rule, pid, target (process name or
    user), user, dry_run, action, outcome, message (plus extra keys such as gpu, notify, reason)."""
    out = []
    for line in reversed(_tail_lines(hits_path(), limit)):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def count_hits() -> int:
    try:
        with open(hits_path(), "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 16), b""))
    except OSError:
        return 0


# ---- daemon ----------------------------------------------------------------------------------

def write_daemon_status(data: dict) -> None:
    _write_json_atomic(daemon_path(), data)


def daemon_status() -> dict:
    """What the daemon last wrote, plus ``alive``: its (pid, start time) still runs."""
    data = _read_json(daemon_path())
    if not data:
        return {"alive": False}
    from gputop.core.procs import is_alive

    pid, start = data.get("pid"), data.get("start_time")
    data["alive"] = isinstance(pid, int) and is_alive(pid, start)
    return data


def status(config=None) -> dict:
    """Everything a face shows about the guard, in one dict (``config``: see get_policy_path)."""
    st = read_state()
    policy_file = get_policy_path(config)
    valid: bool | None = None
    error = st.get("last_error")
    rules = None
    if policy_file:
        from gputop.guard.policy import PolicyError, load_policy

        try:
            rules = [r.name for r in load_policy(policy_file).rules]
            valid = True
        except PolicyError as e:
            valid = False
            error = error or str(e)
    d = daemon_status()
    return {
        "mode": get_mode(),
        "policy_file": policy_file,
        "policy_valid": valid,
        "rules": rules,
        "last_error": error,
        "updated_at": st.get("updated_at"),
        "updated_by": st.get("updated_by"),
        "daemon": {
            "alive": d.get("alive", False), "pid": d.get("pid"), "started_at": d.get("started_at"),
            "last_tick": d.get("last_tick"), "interval": d.get("interval"), "mode": d.get("mode"),
            "policy_file": d.get("policy_file"), "policy_loaded_at": d.get("policy_loaded_at"),
            "rules": d.get("rules"),
        },
        "counts": {"hits_recorded": count_hits(), **(d.get("counts") or {})},
        "state_dir": str(guard_dir()),
    }
