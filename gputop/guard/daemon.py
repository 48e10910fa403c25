"""``gputop guard run``: the foreground guard daemon.

Each interval it: re-reads the mode (guard.json, by mtime) and the policy file (by mtime and size), samples
once, evaluates the policy (unless the mode is off), records hits and writes guard-daemon.json.

A policy file that becomes invalid is reported (stderr, the state's last_error, the audit log) and the
daemon KEEPS ENFORCING the last valid policy. Only an invalid policy at start-up stops it (exit 2).

SIGHUP (``systemctl reload gputop-guard``) re-reads the config and the policy at once; a bad file keeps the
last valid one, exactly as the file watcher does. SIGTERM and SIGINT stop it cleanly.

Every line on stderr starts with a syslog priority prefix (``<4>`` warning, ``<6>`` info, ...), which
journald turns into the entry's priority, so ``journalctl -p warning -u gputop-guard`` works.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from gputop.core import auditlog
from gputop.core.config import Config, guard_dir
from gputop.util.errors import GputopError, RefusedError
from gputop.guard import notify as _notify
from gputop.guard import state as _state
from gputop.guard.engine import Engine
from gputop.guard.policy import Issue, Policy, PolicyError, load_policy
from gputop.core.procs import start_time
from gputop.util.textsafe import visible




def _load(path: str) -> Policy:
    """load_policy, with anything the YAML reader throws (a NUL byte, a recursive alias) turned into a
    PolicyError: at start-up that is exit 2 with a message, in a running guard the old policy stays."""
    try:
        return load_policy(path)
    except PolicyError:
        raise
    except Exception as e:
        raise PolicyError([Issue(None, None, f"cannot load the policy: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}")], path) from None


def acquire_lock() -> int:
    """One daemon per state directory (two would act twice on every hit). Returns the fd to keep open."""
    d = guard_dir()
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / "guard-daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # pragma: no cover - not POSIX
        return fd
    except OSError:
        os.close(fd)
        other = _state.daemon_status()
        raise RefusedError(f"a guard daemon is already running for {d} (pid {other.get('pid', '?')}); "
                           "stop it first, or use another GPUTOP_STATE_DIR") from None
    return fd


# syslog priorities (RFC 5424), as journald reads them from a "<N>" line prefix on stderr.
LOG_ERR, LOG_WARNING, LOG_NOTICE, LOG_INFO = 3, 4, 5, 6


def _lines(text: str) -> list[str]:
    """``text`` split at newlines only (journald's entry separator); one trailing newline ends the text."""
    lines = text.split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return lines


def prefixed(text: str, priority: int) -> str:
    """Every line of ``text`` with the "<N>gputop guard: " prefix (journald reads one entry per line).

    The prefix is the only priority journald sees: each line starts with it, and every control character
    in the line is made visible (``visible``), so text that came from a process name or a file cannot end
    a line early or carry a "<0>" of its own to the start of one."""
    return "".join(f"<{priority}>gputop guard: {visible(line)}\n" for line in _lines(text))


class JournalStream:
    """A text stream for the engine's hit lines: every journal line it writes gets exactly one prefix,
    ``priority``, chosen here (a line of its own that starts with "<" gets it too).

    The engine writes one hit per ``write``: its line, then one "  notify TARGET: OUTCOME" line per
    target. A newline anywhere else (inside a process name or a message) does not start a journal line:
    it is shown as \\x0a, as every other control character is (``visible``)."""

    CONTINUATION = "  notify "
    MAX_PENDING = 65536  # a writer that never ends its line is flushed at this size

    def __init__(self, out, priority: int = LOG_WARNING):
        self.out = out
        self.priority = priority
        self._buf = ""

    def write(self, text: str) -> int:
        self._buf += text
        if not self._buf.endswith("\n") and len(self._buf) < self.MAX_PENDING:
            return len(text)
        record, self._buf = self._buf, ""
        entries: list[str] = []
        for line in _lines(record):
            if entries and not line.startswith(self.CONTINUATION):
                entries[-1] += "\n" + line  # a newline inside the text: escaped below
            else:
                entries.append(line)
        self.out.write("".join(f"<{self.priority}>{visible(e)}\n" for e in entries))
        return len(text)

    def flush(self) -> None:
        self.out.flush()


class _ModeWatch:
    """Reads guard.json again only when its mtime changes."""

    def __init__(self):
        self._sig: tuple | None = None
        self._data: dict = {}

    def read(self) -> dict:
        sig = _state.file_sig(str(_state.state_path()))
        if sig != self._sig:
            self._sig = sig
            self._data = _state.read_state()
        return self._data


class GuardDaemon:
    def __init__(self, sampler, policy_path: str, *, config: Config | None = None, interval: float = 5.0,
                 out=None, sleep: Callable[[float], None] | None = None,
                 config_loader: Callable[[], Config] | None = None):
        self.sampler = sampler
        self.config = config or Config()
        self.interval = interval
        self.out = out if out is not None else sys.stderr
        self.policy_path = str(Path(policy_path).resolve())
        self.policy: Policy = _load(self.policy_path)  # PolicyError at start-up: the caller exits 2
        self.policy_sig = _state.file_sig(self.policy_path)
        self.policy_loaded_at = time.time()
        journal = JournalStream(self.out)  # hit lines, and the "log" notify target's lines: warnings
        self.engine = Engine(self.policy, config=self.config, sampler=sampler, out=journal,
                             notifier=functools.partial(_notify.send, log=journal))
        self.mode_watch = _ModeWatch()
        self.mode = _state.get_mode()
        self.stop_event = threading.Event()
        self.reload_event = threading.Event()  # set by SIGHUP
        self._wake = threading.Event()  # ends the sleep between ticks early (stop or reload)
        self.config_loader = config_loader
        self.reloads = 0
        self._sleep = sleep
        self.started_at = time.time()
        self.ticks = 0
        self.errors = 0
        self.last_error: str | None = None
        _state.set_last_error(None, face="guard")

    # ---- output ----

    def say(self, line: str, priority: int = LOG_INFO) -> None:
        try:
            self.out.write(prefixed(line, priority))
            self.out.flush()
        except (OSError, ValueError):  # stderr closed or gone: keep guarding
            pass

    def _audit(self, record: dict) -> None:
        try:
            auditlog.append({"at": time.time(), "face": "guard", **record}, config=self.config)
        except auditlog.AuditLogError:
            pass  # auditlog already printed a loud warning

    # ---- watching ----

    def check_mode(self) -> None:
        data = self.mode_watch.read()
        mode = data.get("mode") if data.get("mode") in _state.MODES else _state.DEFAULT_MODE
        if mode != self.mode:
            self.say(f"mode {self.mode} -> {mode} (set by {data.get('updated_by') or '?'})", LOG_NOTICE)
            if mode == "off":
                self.engine.reset()
            else:
                self.engine.mode_changed()
            self.mode = mode
        wanted = data.get("policy_file")
        if wanted and str(Path(wanted).resolve()) != self.policy_path:
            self.say(f"policy file changed to {wanted}")
            self.policy_path = str(Path(wanted).resolve())
            self.policy_sig = None  # force a load attempt below

    def check_policy(self) -> None:
        sig = _state.file_sig(self.policy_path)
        if sig == self.policy_sig:
            return
        self.policy_sig = sig
        try:
            new = _load(self.policy_path)
        except PolicyError as e:
            self.errors += 1
            kept = ", ".join(r.name for r in self.policy.rules)
            msg = (f"new policy {self.policy_path} is invalid; still enforcing the last valid policy "
                   f"({self.policy.path}, loaded {time.strftime('%H:%M:%S', time.localtime(self.policy_loaded_at))}"
                   f", rules: {kept}):\n{e}")
            self.last_error = str(e)
            self.say(msg, LOG_ERR)
            _state.set_last_error(str(e), face="guard")
            self._audit({"action": "guard-policy", "outcome": "rejected", "ok": False,
                         "policy_file": self.policy_path, "kept_policy": self.policy.path,
                         "message": msg.replace("\n", " | ")})
            return
        self.policy = new
        self.policy_loaded_at = time.time()
        self.engine.set_policy(new)
        self.last_error = None
        _state.set_last_error(None, face="guard")
        self.say(f"policy reloaded from {self.policy_path}: rules {', '.join(r.name for r in new.rules)}",
                 LOG_NOTICE)
        self._audit({"action": "guard-policy", "outcome": "loaded", "ok": True,
                     "policy_file": self.policy_path, "rules": [r.name for r in new.rules],
                     "message": f"guard policy reloaded from {self.policy_path}"})

    # ---- one interval ----

    def reload(self) -> None:
        """SIGHUP: re-read the config and the policy now. A bad file keeps the last valid one."""
        self.reloads += 1
        self.say("SIGHUP: reloading the config and the policy", LOG_NOTICE)
        if self.config_loader is not None:
            try:
                new = self.config_loader()
            except GputopError as e:
                self.errors += 1
                self.last_error = f"config reload failed, keeping the last valid config: {e}"
                self.say(self.last_error, LOG_ERR)
                self._audit({"action": "guard-config", "outcome": "rejected", "ok": False,
                             "message": self.last_error})
            else:
                self.config = new
                self.engine.config = new
                self.sampler.config = new  # the snapshots' verdicts use the new protect rules from the next sample
                self.say("config reloaded", LOG_NOTICE)
        wanted = _state.get_policy_path()  # guard.json's choice, else guard.policy in the config
        if wanted and str(Path(wanted).resolve()) != self.policy_path:
            self.say(f"policy file changed to {wanted}", LOG_NOTICE)
            self.policy_path = str(Path(wanted).resolve())
        self.policy_sig = None  # force a load attempt (an unchanged file reloads to the same rules)

    def tick(self) -> list[dict]:
        if self.reload_event.is_set():
            self.reload_event.clear()
            self.reload()
        self.check_mode()
        self.check_policy()
        hits: list[dict] = []
        if self.mode != "off":
            try:
                snap = self.sampler.sample()
                hits = self.engine.evaluate(snap, self.mode)
            except Exception as e:  # one bad sample must not stop the guard
                self.errors += 1
                self.last_error = f"evaluation failed: {type(e).__name__}: {e}"
                self.say(self.last_error, LOG_ERR)
        self.ticks += 1
        self.write_status()
        return hits

    def write_status(self) -> None:
        counts = dict(self.engine.counts)
        counts.update(ticks=self.ticks, errors=self.errors)
        try:
            _state.write_daemon_status({
                "pid": os.getpid(), "start_time": start_time(os.getpid()), "started_at": self.started_at,
                "last_tick": time.time(), "interval": self.interval, "mode": self.mode,
                "policy_file": self.policy.path, "policy_loaded_at": self.policy_loaded_at,
                "rules": [r.name for r in self.policy.rules], "last_error": self.last_error,
                "counts": counts,
            })
        except OSError as e:
            self.say(f"cannot write the daemon status: {e}", LOG_WARNING)

    def start_node_trail(self) -> "auditlog.NodeAuditServer | None":
        """Serve the node audit trail (root, or a socket path given in the environment). A failure is an
        error in the journal, not a reason to stop guarding. A socket another live process serves (a second
        guard daemon) is never taken over: one warning line, and this daemon guards without serving it."""
        auditlog.set_warn_writer(lambda m: self.say(m, LOG_ERR))
        problem = auditlog.check_writable(self.config)
        if problem:
            self.say(f"{problem}: actions are recorded in the node trail only", LOG_ERR)
        if os.geteuid() != 0 and not os.environ.get("GPUTOP_AUDIT_SOCKET"):
            self.say("not root: the node audit trail is not served (run the guard as root, see "
                     "packaging/gputop-guard.service)", LOG_NOTICE)
            return None
        try:
            server = auditlog.NodeAuditServer().start()
        except auditlog.AuditSocketBusy as e:  # a second guard never takes a live trail over
            self.say(str(e), LOG_WARNING)
            return None
        except OSError as e:
            self.say(f"cannot serve the node audit trail on {auditlog.node_socket_path()}: "
                     f"{e.strerror or e}", LOG_ERR)
            return None
        self.say(f"node audit trail: {server.log} (socket {server.sock_path})")
        return server

    def run(self, iterations: int | None = None) -> int:
        self.say(f"running (pid {os.getpid()}), mode {self.mode}, interval {self.interval:g}s, policy "
                 f"{self.policy_path}: rules {', '.join(r.name for r in self.policy.rules)}")
        if self.mode == "off":
            self.say("mode is off: nothing is evaluated until 'gputop guard --enable' (or the TUI) turns it on",
                     LOG_NOTICE)
        self._audit({"action": "guard-start", "outcome": "ok", "ok": True, "mode": self.mode,
                     "policy_file": self.policy_path, "message": f"guard daemon started, mode {self.mode}"})
        n = 0
        try:
            while not self.stop_event.is_set():
                t0 = time.monotonic()
                self.tick()
                n += 1
                if iterations is not None and n >= iterations:
                    break
                left = self.interval - (time.monotonic() - t0)
                if self._sleep is not None:
                    self._sleep(max(0.0, left))
                elif left > 0:
                    self._wake.wait(left)
                    self._wake.clear()
        finally:
            self._audit({"action": "guard-stop", "outcome": "ok", "ok": True, "mode": self.mode,
                         "message": "guard daemon stopped"})
            self.say("stopped", LOG_NOTICE)
        return 0

    def install_signal_handlers(self) -> None:
        def stop(signum, frame):
            self.stop_event.set()
            self._wake.set()

        def hup(signum, frame):
            self.reload_event.set()
            self._wake.set()

        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, stop)
        signal.signal(signal.SIGHUP, hup)
