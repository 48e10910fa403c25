"""Shared fixtures: isolated user dirs, real process spawning, and simulated-GPU scenarios.

Only the GPU vendor library is faked (the simulated backend reads a scenario that names live PIDs).
Processes, signals and files are real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

# gputop calls a process whose chain ignores SIGHUP "protected: detached with nohup". A test session started
# under nohup (or from any parent that ignores SIGHUP) would hand that to every process it spawns and every
# orphan and kill test would see protected processes: the session starts from the default disposition.
signal.signal(signal.SIGHUP, signal.SIG_DFL)

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    """Give the test processes a session whose leader this PID namespace can see.

    A runner started from outside the namespace without setsid (a container's init, `docker exec`)
    leaves every process with session id 0. gputop then judges them by the container rule (see
    gputop/core/orphans.py and tests/unit/test_orphans.py); the functional tests want the ordinary case,
    a live login session, wherever they run. Only done when our own session leader is invisible.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            sid = int(f.read().rsplit(b")", 1)[1].split()[3])
    except (OSError, ValueError, IndexError):
        return  # not Linux
    if sid == 0:
        try:
            os.setsid()
        except OSError:  # already a process group leader: keep the session we have
            pass


def wait_comm(pid: int, name: str, timeout: float = 15.0, proc=None) -> bool:
    """Wait until the kernel calls ``pid`` ``name`` (comm: its first 15 bytes). False when ``proc`` (its
    Popen) exited first; TimeoutError when the name never came."""
    want = name.encode()[:15]
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:
                if f.read().strip() == want:
                    return True
        except OSError:
            pass
        time.sleep(0.01)
    raise TimeoutError(f"pid {pid} never took the name {name!r}")


# ---- running in parallel (pytest-xdist; docs/testing.md "Writing tests that run in parallel") -------------------
# Several test processes run at once: xdist's workers, and other test runs on the same node. Anything the whole
# machine shares (a user name, a fixed path, a daemon) gets a name that is unique to this process, or its tests
# share one xdist_group so that they run on one worker, one after another.

def worker() -> str:
    """This test process's xdist worker ("gw0", "gw1", ...; "main" without xdist)."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def unique_name(prefix: str) -> str:
    """``prefix`` made unique among the test processes running now on this machine (our PID): for user
    names (at most 32 characters: keep ``prefix`` short), abstract socket names, tmux sessions."""
    return f"{prefix}-{os.getpid()}"


def _passwd_tool(cmd: list[str], ok: tuple[int, ...]) -> int:
    """useradd/userdel, retried while another process holds the passwd lock (exit 10) or the shadow files."""
    rc, err = -1, b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = subprocess.run(cmd, capture_output=True)
        rc, err = r.returncode, r.stderr
        if rc in ok:
            return rc
        time.sleep(0.1)
    raise AssertionError(f"{' '.join(cmd)} failed with exit {rc}: {err.decode(errors='replace').strip()}")


def add_user(name: str, *options: str, shell: str = "/usr/sbin/nologin"):
    """Create the real user ``name`` (no home), removing a leftover of that name first; its pwd entry.

    Give ``name`` from unique_name(): test processes running at once must never share (or delete) a user.
    Retries while another process holds the passwd lock. Needs root."""
    import pwd

    del_user(name)
    _passwd_tool(["useradd", "--no-create-home", "--shell", shell, *options, name], ok=(0,))
    return pwd.getpwnam(name)


def del_user(name: str) -> None:
    """Remove the user ``name`` (-f: even while a process of it runs); no error when there is none."""
    _passwd_tool(["userdel", "-f", name], ok=(0, 6))


def _default_sighup():
    # A test runner started under nohup would pass "SIGHUP ignored" on to every child, and gputop would
    # then (correctly) call them "detached with nohup". Tests want plain processes.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


# A small launcher runs a command and reports its children's peak RSS. Measuring from pytest itself is
# wrong: a forked child starts with pytest's whole resident set (hundreds of MiB late in a suite), and
# Linux keeps that high-water mark across exec, so wait4's ru_maxrss would report pytest, not gputop.
_RSS_LAUNCHER = """import os, resource, signal, subprocess, sys
signal.signal(signal.SIGHUP, signal.SIG_DFL)
rc = subprocess.run(sys.argv[2:]).returncode
with open(sys.argv[1], "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(rc)
"""


def run_gputop_measured(args, env, tmp_path, timeout=120):
    """Run gputop; (exit status, stdout, stderr, gputop's own peak RSS in MiB, seconds)."""
    out_f, err_f, rss_f = tmp_path / "measured.out", tmp_path / "measured.err", tmp_path / "measured.rss"
    t0 = time.monotonic()
    with open(out_f, "wb") as o, open(err_f, "wb") as e:
        p = subprocess.Popen([sys.executable, "-c", _RSS_LAUNCHER, str(rss_f), sys.executable, "-m", "gputop", *args],
                             stdout=o, stderr=e, stdin=subprocess.DEVNULL, env={**os.environ, **env},
                             start_new_session=True)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise AssertionError(f"gputop {' '.join(args)} ran past {timeout}s") from None
    took = time.monotonic() - t0
    return p.returncode, out_f.read_text(), err_f.read_text(), int(rss_f.read_text()) / 1024, took


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path_factory, monkeypatch):
    """Keep user config, state and audit log out of the real home directory."""
    base = tmp_path_factory.mktemp("xdg")
    for var in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        d = base / var.lower()
        d.mkdir()
        monkeypatch.setenv(var, str(d))
    monkeypatch.setenv("GPUTOP_STATE_DIR", str(base / "state"))
    # never the node's real trail, socket or /etc config
    monkeypatch.setenv("GPUTOP_AUDIT_SOCKET", str(base / "run" / "audit.sock"))
    monkeypatch.setenv("GPUTOP_NODE_AUDIT_LOG", str(base / "node-log" / "audit.jsonl"))
    monkeypatch.setenv("GPUTOP_SYSTEM_CONFIG", str(base / "etc" / "config.yaml"))
    for var in ("GPUTOP_CONFIG", "GPUTOP_SCENARIO", "GPUTOP_BACKEND", "GPUTOP_AUDIT_LOG", "NO_COLOR"):
        monkeypatch.delenv(var, raising=False)
    # An xdist worker has COLUMNS and LINES in its environment. shutil.get_terminal_size() (gputop's table width,
    # Textual's terminal size) takes them before the terminal's own size: a TUI in tmux then never saw a resize.
    for var in ("COLUMNS", "LINES"):
        monkeypatch.delenv(var, raising=False)
    return base


_PROCS_SEQ = iter(range(1, 1 << 30))
PROCS_TOKEN = "GPUTOP_TEST_PROCS"  # in the environment of every process a Procs spawns (and its descendants)


class Procs:
    """Spawns real processes and makes sure they (and their descendants) are gone afterwards.

    Every process it spawns carries ``GPUTOP_TEST_PROCS=<token>`` in its environment (which descendants
    inherit): ``wait_for`` takes only processes with this test's token, never another test's process with the
    same command line (tests run in parallel: "sleep 731" may be two tests' marker at once)."""

    def __init__(self):
        self.pids: list[int] = []
        self.token = f"{os.getpid()}-{next(_PROCS_SEQ)}"

    def spawn(self, cmd, **kw) -> subprocess.Popen:
        if isinstance(cmd, str):
            cmd = ["sh", "-c", cmd]
        kw["env"] = {**(os.environ if kw.get("env") is None else kw["env"]), PROCS_TOKEN: self.token}
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        p = subprocess.Popen(cmd, preexec_fn=_default_sighup, **kw)
        self.pids.append(p.pid)
        return p

    def sleeper(self, name: str = "sleep", seconds: int = 600) -> subprocess.Popen:
        """A real process whose name (comm) is ``name`` (set with prctl(PR_SET_NAME)).

        Returns once the name is set, so a test never sees the interpreter's name under load."""
        code = (f"import ctypes,time;ctypes.CDLL(None).prctl(15,{name!r}.encode(),0,0,0);"
                f"time.sleep({seconds})")
        p = self.spawn([sys.executable, "-c", code])
        wait_comm(p.pid, name, 20, proc=p)
        return p

    def threaded(self) -> tuple[subprocess.Popen, int]:
        """A real process with a second thread, and that thread's id (what NVML may report instead of
        the process's PID). Returns once the thread runs."""
        code = ("import threading,time;threading.Thread(target=time.sleep,args=(600,),daemon=True).start();"
                "time.sleep(600)")
        p = self.spawn([sys.executable, "-c", code])
        deadline = time.time() + 10
        while len(os.listdir(f"/proc/{p.pid}/task")) < 2 and time.time() < deadline:
            time.sleep(0.02)
        # the task that is not the leader (not the highest id: after a PID wrap, or beside the PID-reuse
        # tests that rewind the counter, the thread's id can be lower than the process's)
        tid = next(int(t) for t in os.listdir(f"/proc/{p.pid}/task") if int(t) != p.pid)
        return p, tid

    def orphan(self, inner: str, marker: str, timeout: float = 10.0) -> int:
        """Start ``inner`` as a real orphan: its session leader shell exits at once.

        ``setsid sh -c 'inner & exit'``: the job is reparented to init (or a subreaper) and its session
        leader is gone. Returns the PID of the process whose cmdline starts with ``marker``.
        """
        self.spawn(["setsid", "sh", "-c", f"{inner} & exit 0"]).wait(timeout)
        return self.wait_for(marker, timeout)

    def wait_for(self, marker: str, timeout: float = 10.0) -> int:
        """PID of the process whose command line starts with ``marker`` (so a ``sh -c`` that merely
        mentions it does not match)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for p in psutil.process_iter(["pid", "cmdline"]):
                cmd = " ".join(p.info["cmdline"] or [])
                if cmd.startswith(marker) and p.pid != os.getpid() and self.mine(p.pid):
                    self.pids.append(p.pid)
                    return p.pid
            time.sleep(0.05)
        raise TimeoutError(f"no process of this test with {marker!r} in its cmdline")

    def mine(self, pid: int, unreadable: bool = True) -> bool:
        """``pid`` descends from a process this Procs spawned (its environment has our token). A process whose
        environment cannot be read (another user's, as non-root) is taken as ``unreadable`` says: True for
        wait_for (then matched by its command line), False for cleanup (never kill what is not surely ours)."""
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            return unreadable
        return f"{PROCS_TOKEN}={self.token}".encode() in env

    def _strays(self) -> list[psutil.Process]:
        """Processes with our token that no longer descend from one we know: a ``sleep 600`` whose ``sh -c``
        parent died, or a double fork (Slurm tests leaked these)."""
        out = []
        me = os.getpid()
        for pid in psutil.pids():
            if pid != me and pid not in self.pids and self.mine(pid, unreadable=False):
                try:
                    out.append(psutil.Process(pid))
                except psutil.Error:
                    pass
        return out

    def cleanup(self):
        # Only what is this test's: a PID in self.pids whose process exited may have been reused by another
        # test's process since (parallel workers fork all the time, and spawn_at_pid rewinds the PID
        # counter), so a PID is killed only when the process carries our token or is our own child; the
        # children of such a process are ours.
        procs = []
        for pid in self.pids:
            try:
                p = psutil.Process(pid)
                if not (self.mine(pid) or p.ppid() == os.getpid()):
                    continue
                procs.append(p)
                procs.extend(p.children(recursive=True))
            except psutil.Error:
                pass
        procs.extend(self._strays())
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        # Our own children are reaped here; killed orphans belong to init, which may reap late (or, in
        # some sandboxes, never): a zombie is dead enough, so don't wait for it to disappear.
        for p in procs:
            try:
                p.wait(timeout=0) if p.ppid() == os.getpid() else None
            except psutil.Error:
                pass
        for p in procs:
            wait_gone(p.pid, timeout=5)


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.cleanup()


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    """True once ``pid`` has exited (a zombie counts as exited)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def scenario(tmp_path, monkeypatch):
    """Write a simulated-GPU scenario and point $GPUTOP_SCENARIO at it.

    ``scenario(holders=[{"pid": p, "gpu": 0, "memory": "4GiB"}], gpus=2)`` -> Path
    """
    path = tmp_path / "scenario.yaml"

    def write(holders=(), gpus=2, **gpu_fields):
        gpu_list = gpus if isinstance(gpus, list) else [
            {"name": "Simulated H100 80GB", "memory_total": "80GiB", "temperature": 50 + i,
             "power": 200, "power_limit": 700, "fan": 30, "clock_sm": 1980, "clock_mem": 2619,
             "memory_utilization": 10, **gpu_fields}
            for i in range(gpus)
        ]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump({"gpus": gpu_list, "holders": list(holders)}))
        os.replace(tmp, path)
        monkeypatch.setenv("GPUTOP_SCENARIO", str(path))
        return path

    return write


def run_gputop(*args, env=None, timeout=60, input=None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (python -m gputop), as a user would."""
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "gputop", *args], capture_output=True, text=True,
                          env=e, timeout=timeout, input=input, preexec_fn=_default_sighup)


def run_on_pty(argv, env=None, merge_stderr: bool = True, timeout: float = 60) -> tuple[int, str, str]:
    """Run ``argv`` with stdout (and stderr, unless ``merge_stderr`` is False) on a pty, draining the terminal
    while the child writes (a child blocked on a full pty never exits). (exit status, what the terminal got
    with CRLF turned into LF, stderr when it was not on the terminal)."""
    import pty
    import select

    master, slave = pty.openpty()
    chunks = []
    try:
        p = subprocess.Popen(argv, stdout=slave, stderr=slave if merge_stderr else subprocess.PIPE,
                             stdin=subprocess.DEVNULL, env=env)
        os.close(slave)
        slave = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1)[0]:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child has exited and its side is drained
                break
            if not data:
                break
            chunks.append(data)
        else:
            p.kill()
        err = p.stderr.read().decode("utf-8", "replace") if p.stderr else ""
        rc = p.wait(timeout=timeout)
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    return rc, b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n"), err
