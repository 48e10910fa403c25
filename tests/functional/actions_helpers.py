"""Helpers for the kill/reap/reset/audit tests: a safe config, TERM-ignoring holders, audit records."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from gputop.core import auditlog

_SEQ = itertools.count()

# Processes that ignore SIGTERM print "ready" once the handler is installed, so no test races it.
IGNORE_TERM = ("import signal,sys,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               "print('ready', flush=True); time.sleep(600)  # {marker}")


def write_config(path: Path, monkeypatch, protect=(), nohup_protects=False, **extra) -> Path:
    """A config for the tests: no default protect patterns (the test runner may itself run under tmux
    or nohup, which would make every holder protected), plus what the test asks for."""
    import yaml

    data = {"protect": list(protect), "nohup_protects": nohup_protects, **extra}
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("GPUTOP_CONFIG", str(path))
    return path


def spawn_ignoring_term(procs, marker: str = "ignore-term") -> subprocess.Popen:
    p = procs.spawn([sys.executable, "-c", IGNORE_TERM.format(marker=marker)], stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"ready"
    return p


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def records(**match) -> list[dict]:
    """Audit records whose top-level fields (or target.pid via pid=) match."""
    out = []
    for r in auditlog.read():
        if "pid" in match and (r.get("target") or {}).get("pid") != match["pid"]:
            continue
        if any(r.get(k) != v for k, v in match.items() if k != "pid"):
            continue
        out.append(r)
    return out


def check_common(rec: dict, *, action: str, outcome: str, face: str = "cli") -> None:
    """The fields every audit line carries."""
    assert rec["action"] == action
    assert rec["outcome"] == outcome
    assert rec["face"] == face
    assert rec["host"] == os.uname().nodename
    assert rec["actor"]["uid"] == os.geteuid()
    assert isinstance(rec["at"], float) and abs(rec["at"] - time.time()) < 120
    assert rec["time"].startswith(time.strftime("%Y-", time.gmtime(rec["at"])))
    assert isinstance(rec["signals"], list)
    assert rec["message"]


def ident(pid: int) -> dict:
    """What the audit line should say about a process: capture it before acting."""
    p = psutil.Process(pid)
    return {"pid": pid, "start": p.create_time(), "user": p.username(), "cmdline": p.cmdline()}


def check_target(rec: dict, who: dict, gpus=None) -> None:
    t = rec["target"]
    assert t["pid"] == who["pid"]
    assert abs(t["start_time"] - who["start"]) < 0.05
    assert t["user"] == who["user"]
    assert t["cmdline"] == who["cmdline"]
    if gpus is not None:
        assert t["gpus"] == gpus


def load_json(out: str):
    return json.loads(out)


def with_marker(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains ``marker``, other than this one."""
    for _ in range(20):
        try:
            return _with_marker(marker)
        except FileNotFoundError:  # psutil let a process that exited mid-scan through (seen under -n 4): scan again
            time.sleep(0.01)
    return _with_marker(marker)


def _with_marker(marker: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
            continue
        if marker in " ".join(p.info["cmdline"] or []):
            out.append(p.pid)
    return out


def unique(marker: str) -> str:
    """A marker no other test run (in parallel, or left over) uses."""
    if "#" in marker:
        return marker
    return f"{marker}#{os.getpid()}-{next(_SEQ)}"


def orphan_python(procs, marker: str, timeout: float = 10.0) -> int:
    """A real orphan python process (its session leader sh exited at once); returns its PID."""
    marker = unique(marker)
    code = f"import time; time.sleep(600)  # {marker}"
    procs.spawn(["setsid", "sh", "-c", f"{sys.executable} -c '{code}' & exit 0"]).wait(timeout)
    deadline = time.time() + timeout
    while time.time() < deadline:
        for pid in with_marker(marker):
            try:
                if psutil.Process(pid).cmdline()[:2] == [sys.executable, "-c"]:
                    procs.pids.append(pid)
                    return pid
            except psutil.Error:
                continue
        time.sleep(0.05)
    raise TimeoutError(f"orphan {marker!r} did not start")


class OtherUser:
    """Runs gputop as an unprivileged user against processes of this (root) test run.

    ``OtherUser.make(monkeypatch, request)`` skips the test, with the reason, where that is impossible.
    """

    def __init__(self, name: str, gid: str, shared: Path, monkeypatch):
        self.name, self.gid, self.shared = name, gid, shared
        self.cfg = write_config(shared / "config.yaml", monkeypatch)
        os.chmod(self.cfg, 0o644)
        self.scenario = shared / "scenario.yaml"
        self.log = shared / "audit.jsonl"

    @classmethod
    def make(cls, monkeypatch, request) -> "OtherUser":
        import pytest

        if os.geteuid() != 0:
            pytest.skip("needs root: gputop runs as another (unprivileged) user against root's processes")
        if not shutil.which("setpriv"):
            pytest.skip("setpriv (util-linux) is missing: cannot run gputop as an unprivileged user")
        user = _unprivileged()
        if user is None:
            pytest.skip("no unprivileged user exists and none can be created")
        # pytest's own tmp dirs are private to root; this one is readable by the other user, and writable
        # with the sticky bit (like /tmp): root loads only files that no other user can replace (trustfile).
        shared = Path(tempfile.mkdtemp(prefix="gputop-perm-"))
        request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
        os.chmod(shared, 0o1777)
        self = cls(user[0], user[1], shared, monkeypatch)
        probe = self.run("-c", "import gputop", module=False)
        if probe.returncode != 0:
            pytest.skip(f"user {self.name} cannot import gputop from this checkout: {probe.stderr.strip()[-200:]}")
        return self

    def holders(self, holders: list[dict]) -> None:
        import yaml

        self.scenario.write_text(yaml.safe_dump({"gpus": [{"name": "Sim", "memory_total": "80GiB"}],
                                                 "holders": holders}))
        os.chmod(self.scenario, 0o644)

    def setpriv(self) -> list[str]:
        return ["setpriv", "--reuid", self.name, "--regid", self.gid, "--clear-groups"]

    def run(self, *args, module: bool = True) -> subprocess.CompletedProcess:
        env = {**os.environ, "GPUTOP_AUDIT_LOG": str(self.log), "GPUTOP_STATE_DIR": str(self.shared / "state"),
               "HOME": str(self.shared), "GPUTOP_SCENARIO": str(self.scenario), "GPUTOP_CONFIG": str(self.cfg)}
        for var in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
            env.pop(var, None)
        cmd = self.setpriv() + [sys.executable] + (["-m", "gputop"] if module else []) + list(args)
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=str(self.shared))

    def records(self) -> list[dict]:
        return [json.loads(x) for x in self.log.read_text().splitlines()] if self.log.exists() else []


def _unprivileged() -> tuple[str, str] | None:
    import pwd

    for name in ("nobody", "gputop-test"):
        try:
            return name, str(pwd.getpwnam(name).pw_gid)
        except KeyError:
            continue
    if os.geteuid() == 0 and shutil.which("useradd"):
        from tests.conftest import _passwd_tool

        # shared by every test that needs "some other user" and never removed; exit 9: a parallel worker made it
        _passwd_tool(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "gputop-test"], ok=(0, 9))
        return "gputop-test", str(pwd.getpwnam("gputop-test").pw_gid)
    return None


NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")


class ForkedAt:
    """A process spawn_at_pid started (os.fork, then exec): the Popen calls the tests use of it."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (the procs fixture's cleanup)
                self.returncode = -9
                return self.returncode
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.01)
        return self.returncode


def _fork_exec(exe: str, argv: list[str], env: dict, devnull: int) -> int:
    """fork, and exec ``argv`` in the child (stdio on /dev/null, default SIGPIPE/SIGXFSZ as Popen gives)."""
    import signal

    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            os.execve(exe, argv, env)
        finally:
            os._exit(127)
    return child


def spawn_at_pid(procs, pid: int, cmd: list[str], tries: int = 2000) -> ForkedAt:
    """Really reuse ``pid``: start ``cmd`` as a new process with exactly that PID (root: ns_last_pid).

    Another process on the host may take the PID first, so it retries; skips (with the reason) where the
    kernel does not let us choose the next PID. The PID is written and the fork made right after, with
    everything prepared before: parallel test workers fork all the time, and a Popen between the two (as
    this was) lost the PID to them every time under -n 4.
    """
    import pytest

    from tests.conftest import PROCS_TOKEN

    if not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip("cannot choose the next PID (/proc/sys/kernel/ns_last_pid is not writable): no real PID reuse")
    exe = shutil.which(cmd[0]) or cmd[0]
    env = {**os.environ, PROCS_TOKEN: procs.token}
    want = str(pid - 1).encode()
    devnull = os.open(os.devnull, os.O_RDWR)
    counter = int(NS_LAST_PID.read_text())  # put back afterwards: a counter left at an old PID hands recently
    try:                                    # freed PIDs to other tests' processes (one "gone" PID came back)
        free_by = time.monotonic() + 30  # the old process's zombie may wait for init a while
        for _ in range(tries):
            while psutil.pid_exists(pid):
                if time.monotonic() > free_by:
                    pytest.skip(f"PID {pid} was not freed within 30 s: no real PID reuse")
                time.sleep(0.01)
            try:
                fd = os.open(NS_LAST_PID, os.O_WRONLY)
            except OSError as e:
                pytest.skip(f"cannot choose the next PID: {e}")
            try:
                os.write(fd, want)
                child = _fork_exec(exe, cmd, env, devnull)
            finally:
                os.close(fd)
            procs.pids.append(child)
            if child == pid:
                return ForkedAt(child)
            os.kill(child, 9)
            os.waitpid(child, 0)
    finally:
        os.close(devnull)
        _forward_pid_counter(counter)
    pytest.skip(f"could not get PID {pid} back after {tries} tries (a busy host took it)")


def _forward_pid_counter(to: int) -> None:
    """Move the node's next-PID counter back to ``to`` when it is behind it (spawn_at_pid rewound it)."""
    try:
        if int(NS_LAST_PID.read_text()) < to:
            NS_LAST_PID.write_text(str(to))
    except (OSError, ValueError):
        pass


def gone_and_reaped(pid: int, timeout: float = 5.0) -> bool:
    """True once no process, not even a zombie, has ``pid`` (so the PID is free to be reused)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not psutil.pid_exists(pid):
            return True
        time.sleep(0.01)
    return False


class SwapAfterSample:
    """A real sampler whose first sample() returns the real snapshot and then runs ``swap``, which gives
    the target's PID to another process (real PID reuse) before the action acts on what it saw."""

    def __init__(self, sampler, swap):
        self._s, self._swap, self.swapped = sampler, swap, None

    def sample(self):
        snap = self._s.sample()
        if self.swapped is None:
            self.swapped = self._swap()
        return snap

    def __getattr__(self, name):
        return getattr(self._s, name)


def scan_stats(proc_root: str = "/proc") -> dict:
    """(ppid, process group, session, start ticks) of every process, from a stat scan of its own: the
    independent reader that the executor's one-scan rounds (``ProcTable.stat_fields``) are checked against."""
    from gputop.core.procs import StatFields

    out = {}
    try:
        pids = [d for d in os.listdir(proc_root) if d.isdigit()]
    except OSError:
        return out
    for d in pids:
        try:
            with open(f"{proc_root}/{d}/stat", "rb") as f:
                raw = f.read()
            f_ = raw[raw.rindex(b")") + 2:].split()
            out[int(d)] = StatFields(int(f_[1]), int(f_[2]), int(f_[3]), int(f_[19]))
        except (OSError, ValueError, IndexError):
            continue  # gone or unreadable: as the table does
    return out
