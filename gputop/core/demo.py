"""``gputop --demo``: real demo processes on simulated GPUs, cleaned up on exit.

No Textual here: the TUI, the screenshot script and other faces reuse it.

    with Demo() as demo:
        run_something(scenario=demo.scenario_path)

It starts, as real processes (all sleeping, so they cost no CPU):
- a training-like tree: a launcher (its own session, as a job started with setsid) with two python workers;
- an orphaned tree: ``setsid sh -c 'sh retry.sh & exit'``, a retry loop whose session leader is gone, and
  the worker it restarts (the demo follows a restart, as a driver would see the new process take the GPU);
- a process named like a miner (comm ``xmrig``);
- a graphics client (context type G) and a jupyter kernel (protected by the default protect list);
- one holder whose PID is not visible here (verdict unknown), as under another PID namespace.

Their command lines read as real ones do: ``torchrun``, ``xmrig`` and ``glxgears`` are scripts in the demo
dir with a ``#!/path/to/python`` line, as pip's console scripts are (``/path/to/python /path/xmrig -o ...``);
the kernel is ``python -m ipykernel_launcher -f ...``; the workers are ``python train.py --rank 0 ...``.

A YAML scenario in a temp dir names them on four simulated GPUs; a background thread keeps it current
(utilisation that moves, a restarted retry worker) and reaps the demo's own exited children. ``env.sh`` there
sets GPUTOP_SCENARIO, GPUTOP_STATE_DIR and the demo's own GPUTOP_AUDIT_SOCKET and GPUTOP_NODE_AUDIT_LOG
for a second shell (the demo and a guard started from env.sh never touch the node's audit trail). A watcher process holds the read end of a
pipe whose write end only gputop holds: when gputop dies, even by SIGKILL, the pipe closes and the watcher
kills every demo process it recorded (pid and start time checked) and removes the directory.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from gputop.core.procs import ProcTable
from gputop.core.procs import start_time as proc_start_time

# A PID above the default pid_max (4194304 is the hard limit; 4194303 is rarely used): never visible here.
INVISIBLE_PID = 4194301

_WORKER = """\
import ctypes, os, signal, time
signal.signal(signal.SIGHUP, signal.SIG_DFL)
name = os.environ.pop("GPUTOP_DEMO_NAME", "") or "python"
try:
    ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)
except Exception:
    pass
while True:
    time.sleep(3600)
"""

_LAUNCHER = """\
import ctypes, os, signal, subprocess, sys
signal.signal(signal.SIGHUP, signal.SIG_DFL)
name = os.environ.pop("GPUTOP_DEMO_NAME", "")  # popped: the workers are "python"
try:
    if name:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)
except Exception:
    pass
py = os.environ.get("GPUTOP_DEMO_PYTHON") or sys.executable
workers = [subprocess.Popen(["python", "train.py", "--rank", str(r), "--world-size", "2"], executable=py)
           for r in range(2)]
signal.signal(signal.SIGTERM, lambda *a: [w.terminate() for w in workers] and sys.exit(0))
for w in workers:
    w.wait()
"""

# The retry loop restarts its worker whenever it dies: the reason to reap from the root.
_RETRY = """\
echo $$ > "$1"
while true; do
  {run}
  sleep 1
done
"""


# Waits for EOF on fd 3 (gputop is gone: it held the only write end), then kills the demo's process trees
# listed in procs.json (each (pid, start time) checked first, so that a reused PID is never touched).
_WATCHER = """\
import json, os, shutil, signal, sys, time
for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)
demo_dir = sys.argv[1]
fd = int(sys.argv[3])
said = b""
while True:
    b = os.read(fd, 4096)
    if not b:
        break
    said += b[:16]
if said.startswith(b"clean"):  # gputop stopped the demo itself: nothing is left to do
    sys.exit(0)
try:
    import psutil
    procs = json.load(open(os.path.join(demo_dir, "procs.json")))
    victims = []
    for pid, start in procs.values():
        try:
            p = psutil.Process(pid)
            if start is None or abs(p.create_time() - start) > 0.05:
                continue
            victims.append(p)
            victims.extend(p.children(recursive=True))
        except psutil.Error:
            pass
    for p in victims:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(victims, timeout=3)
except Exception:
    pass
if sys.argv[2] == "own":
    shutil.rmtree(demo_dir, ignore_errors=True)
"""

# Starts one process in a new session and exits at once, so that the process is reparented.
_DETACH = """\
import json, os, subprocess, sys
spec = json.loads(sys.argv[1])
p = subprocess.Popen(spec["argv"], executable=spec["exe"], cwd=spec["cwd"], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(p.pid, flush=True)
os._exit(0)
"""


@dataclass
class DemoProc:
    role: str  # launcher, worker0, worker1, retry-root, retry-worker, miner, graphics, jupyter
    pid: int
    start_time: float | None


@dataclass
class _Gpu:
    name: str
    util: float
    temp: float
    power: float


class Demo:
    """Starts the demo processes and writes the scenario; ``stop()`` (or leaving ``with``) kills them."""

    def __init__(self, directory: str | os.PathLike | None = None, *, animate: bool = True,
                 python: str | None = None, mig: bool = False):
        self._own_dir = directory is None
        self.dir = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="gputop-demo-"))
        self.scenario_path = self.dir / "scenario.yaml"
        self.env_path = self.dir / "env.sh"
        self._watch_fd: int | None = None
        self.animate = animate
        self.python = python or sys.executable
        self.procs: dict[str, DemoProc] = {}
        self._popens: list[subprocess.Popen] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._old_handlers: dict[int, object] = {}
        self._tick = 0
        self.mig = mig  # GPU 1 an H200 split with MIG, two holders on its instances (mig_node)
        self._started = time.time()  # the invisible holder's start: a reset of its GPU clears it too
        self._gpus = [
            _Gpu("Simulated H100 80GB", 96, 67, 610),
            _Gpu("Simulated H100 80GB", 93, 65, 590),
            _Gpu("Simulated A100 40GB", 45, 52, 180),
            _Gpu("Simulated L40S 48GB", 99, 74, 300),
        ]

    # ---- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "Demo":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Demo":
        atexit.register(self.stop)
        self._install_signal_handlers()
        try:
            self._write_scripts()
            self._start_watcher()
            self._start_processes()
            self.write_scenario()
            self.write_env()
        except BaseException:
            self.stop()
            raise
        self._thread = threading.Thread(target=self._run, name="gputop-demo", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Kill every demo process (whole trees), reap our children, remove the temp dir. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._stop.set()
        # Every tree at once: one SIGKILL each, then one wait for all of them (no serial waits).
        left = _kill_and_wait(self._victims(), timeout=3.0)
        for po in self._popens:  # our own children (setsid sh): long exited; reap them, never wait
            with contextlib.suppress(OSError):
                if po.poll() is None:
                    po.kill()
        if self._watch_fd is not None:  # "clean": the watcher has nothing to do, and exits at once
            with contextlib.suppress(OSError):
                if not left:
                    os.write(self._watch_fd, b"clean")
            with contextlib.suppress(OSError):
                os.close(self._watch_fd)
            self._watch_fd = None
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                self._watcher.wait(timeout=5)
        self._restore_signal_handlers()
        try:
            atexit.unregister(self.stop)
        except Exception:
            pass
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _victims(self) -> list[int]:
        """The demo's processes (pid and start time checked: a reused PID is not ours) and everything
        below them, from one read of the process table."""
        roots = [p.pid for p in list(self.procs.values())
                 if p.start_time is not None and proc_start_time(p.pid) == p.start_time]
        table = ProcTable()  # one scan of /proc/*/stat (psutil's children() scans it once per call)
        out, todo = [], roots[::-1]  # parents before children: the retry loop dies before its worker
        while todo:
            pid = todo.pop()
            if pid not in out:
                out.append(pid)
                todo.extend(sorted(table.children(pid), reverse=True))
        return out

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum, frame):
            old = self._old_handlers.get(signum)
            for sig in list(self._old_handlers):  # a second signal (TERM then HUP) must not cut the cleanup
                try:
                    signal.signal(sig, signal.SIG_IGN)
                except (ValueError, OSError):
                    pass
            self.stop()
            if callable(old):
                old(signum, frame)
            else:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._old_handlers[sig] = signal.getsignal(sig)
                signal.signal(sig, handler)
            except (ValueError, OSError):
                pass

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, old in self._old_handlers.items():
            try:
                signal.signal(sig, old if old is not None else signal.SIG_DFL)
            except (ValueError, OSError, TypeError):
                pass
        self._old_handlers.clear()

    # ---- processes ---------------------------------------------------------------------------

    def _write_scripts(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "train.py").write_text(_WORKER)
        (self.dir / "ipykernel_launcher.py").write_text(_WORKER)  # python -m ipykernel_launcher finds it here
        # As a script run from its directory reads: "python3 ./xmrig -o ...". env execs python3, so the
        # name (comm) is "python3" until the script renames itself: _detached waits for that.
        shebang = f"#!{self.python}\n"
        if os.path.exists("/usr/bin/env"):
            shebang = "#!/usr/bin/env python3\n"
            (self.dir / "bin").mkdir(exist_ok=True)
            (self.dir / "bin" / "python3").symlink_to(self.python)
        for name, body in (("torchrun", _LAUNCHER), ("xmrig", _WORKER), ("glxgears", _WORKER)):
            path = self.dir / name
            path.write_text(shebang + body)
            path.chmod(0o755)
        # bash can set argv[0], so that the worker reads "python train.py ..." like the others.
        if shutil.which("bash"):
            run = '( exec -a python "$GPUTOP_DEMO_PYTHON" train.py --retry --epochs 100 )'
        else:
            run = '"$GPUTOP_DEMO_PYTHON" train.py --retry --epochs 100'
        (self.dir / "retry.sh").write_text(_RETRY.replace("{run}", run))

    def _env(self) -> dict:
        env = dict(os.environ)
        env["GPUTOP_DEMO_PYTHON"] = self.python
        # The scripts' "#!/usr/bin/env python3" finds the demo's own python3 (a link to this interpreter)
        # first: the command line reads "python3 ./xmrig ...", not a shim's or a venv's full path.
        env["PATH"] = str(self.dir / "bin") + os.pathsep + env.get("PATH", os.defpath)
        return env

    def _popen(self, argv: list[str], name: str | None = None, **kw) -> subprocess.Popen:
        env = self._env()
        if name:
            env["GPUTOP_DEMO_NAME"] = name
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        p = subprocess.Popen(argv, preexec_fn=_default_sighup, env=env, cwd=str(self.dir), **kw)
        self._popens.append(p)
        return p

    def _detached(self, argv: list[str], name: str | None = None, executable: str | None = None) -> int:
        """Start ``argv`` in its own session, reparented to init (or the nearest subreaper) at once, as a
        job started with ``setsid``: its chain is not gputop's, so a gputop running inside tmux or
        screen (protected names) does not make the demo's processes protected."""
        env = self._env()
        if name:
            env["GPUTOP_DEMO_NAME"] = name
        spec = json.dumps({"argv": argv, "exe": executable, "cwd": str(self.dir)})
        out = subprocess.run([self.python, "-c", _DETACH, spec], env=env, preexec_fn=_default_sighup,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=15)
        try:
            pid = int(out.stdout.split()[0])
        except (IndexError, ValueError):
            raise RuntimeError(f"demo: could not start {argv[0]}: {out.stderr.strip()[-200:]}") from None
        if name:
            _wait_name(pid, name)
        return pid

    def _record(self, role: str, pid: int) -> DemoProc:
        dp = DemoProc(role, pid, _wait_start_time(pid))
        self.procs[role] = dp
        self._write_procs()
        return dp

    def _write_procs(self) -> None:
        """What the watcher kills if gputop dies without cleaning up (pid, start time)."""
        tmp = self.dir / "procs.json.tmp"
        tmp.write_text(json.dumps({role: [p.pid, p.start_time] for role, p in self.procs.items()}))
        os.replace(tmp, self.dir / "procs.json")

    def _start_watcher(self) -> None:
        r, w = os.pipe()  # both ends non-inheritable: only the watcher gets r (pass_fds), only we hold w
        try:
            p = subprocess.Popen([self.python, "-c", _WATCHER, str(self.dir), "own" if self._own_dir else "keep",
                                  str(r)], pass_fds=(r,), start_new_session=True,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            os.close(r)
        self._watch_fd = w
        self._watcher = p

    @property
    def audit_socket(self) -> Path:
        """The demo's own node-audit socket: the demo never sends to /run/gputop/audit.sock."""
        return self.dir / "run" / "audit.sock"

    @property
    def node_audit_log(self) -> Path:
        """The demo's own node trail: demo actions never reach /var/log/gputop/audit.jsonl."""
        return self.dir / "log" / "audit.jsonl"

    def sandbox(self) -> Path:
        """Point this process at the demo: its state dir (unless one is set), its own audit socket and
        node trail (always, whatever was set), and write ``env.sh`` for a second shell."""
        os.environ.setdefault("GPUTOP_STATE_DIR", str(self.dir / "state"))
        os.environ["GPUTOP_AUDIT_SOCKET"] = str(self.audit_socket)
        os.environ["GPUTOP_NODE_AUDIT_LOG"] = str(self.node_audit_log)
        return self.write_env(os.environ["GPUTOP_STATE_DIR"])

    def write_env(self, state_dir: str | os.PathLike | None = None) -> Path:
        """``env.sh``: source it in a second shell to point gputop at this demo (scenario, state dir, and
        the demo's own audit socket and node trail: a guard started there, even as root, serves the demo's
        trail and never touches the node's)."""
        state = state_dir or os.environ.get("GPUTOP_STATE_DIR") or (self.dir / "state")
        text = (f"# gputop --demo: source this file ('. {self.env_path}') to use the demo from another shell\n"
                f"export GPUTOP_SCENARIO={shlex.quote(str(self.scenario_path))}\n"
                f"export GPUTOP_STATE_DIR={shlex.quote(str(state))}\n"
                f"export GPUTOP_AUDIT_SOCKET={shlex.quote(str(self.audit_socket))}\n"
                f"export GPUTOP_NODE_AUDIT_LOG={shlex.quote(str(self.node_audit_log))}\n")
        self.env_path.write_text(text)
        return self.env_path

    def _start_processes(self) -> None:
        # A training job started deliberately in its own session (setsid): not an orphan.
        # Every demo job is detached this way (see _detached); only the orphan is made differently.
        launcher = self._detached(["./torchrun", "--nproc-per-node", "2", "train.py"], name="torchrun")
        self._record("launcher", launcher)
        workers = _wait_children(launcher, 2)
        for i, pid in enumerate(workers):
            self._record(f"worker{i}", pid)
        # An orphaned tree: the session leader (sh) exits at once; the retry loop goes to init.
        pidfile = self.dir / "retry.pid"
        shell = "bash" if shutil.which("bash") else "sh"  # as a person types it, not /usr/bin/bash
        self._popen(["setsid", "sh", "-c", f'{shell} retry.sh "$0" & exit 0', pidfile.name]).wait(10)
        root = _wait_pidfile(pidfile)
        self._record("retry-root", root)
        self._record("retry-worker", _wait_children(root, 1)[0])
        # A process named like a miner: argv[0] and comm are "xmrig".
        self._record("miner", self._detached(["./xmrig", "-o", "pool.example.net:3333", "--donate-level", "1"],
                                             name="xmrig"))
        self._record("graphics", self._detached(["./glxgears", "-info"], name="glxgears"))
        self._record("jupyter", self._detached(["python", "-m", "ipykernel_launcher", "-f",
                                                "/run/user/jupyter/kernel-demo.json"], executable=self.python))

    def pid(self, role: str) -> int:
        return self.procs[role].pid

    # ---- scenario ----------------------------------------------------------------------------

    def scenario(self) -> dict:
        gpus = []
        for i, g in enumerate(self._gpus):
            wobble = (((self._tick * (i + 3)) % 11) - 5) if self.animate else 0
            gpus.append({  # no "utilization": the backend sums the live holders' SM% (0 once none is left)
                "name": g.name,
                "memory_total": "80GiB" if "80GB" in g.name else ("40GiB" if "40GB" in g.name else "48GiB"),
                "memory_utilization": max(0, min(100, g.util * 0.4 + wobble)),
                "temperature": g.temp + wobble / 2,
                "power": g.power + wobble * 4,
                "power_limit": 700 if "H100" in g.name else (400 if "A100" in g.name else 350),
                "fan": None if "H100" in g.name else 40 + wobble,
                "clock_sm": 1980 if "H100" in g.name else 1410,
                "clock_mem": 2619 if "H100" in g.name else 1593,
            })
        holders = []

        def add(role, gpu, memory, ctx="C", sm=None):
            p = self.procs.get(role)
            if p is not None:
                if sm and self.animate:  # the GPU's utilisation moves with its holders'
                    sm = max(1, min(100, sm + ((self._tick * (gpu + 3)) % 11) - 5))
                holders.append({"pid": p.pid, "gpu": gpu, "memory": memory, "type": ctx, "sm": sm,
                                "start_time": p.start_time})

        add("worker0", 0, "61GiB", sm=96)
        add("worker1", 1, "61GiB", sm=93)
        add("retry-worker", 2, "18GiB", sm=45)
        holders.append({"pid": INVISIBLE_PID, "gpu": 2, "memory": "3GiB", "type": "C", "visible": False,
                        "start_time": self._started})
        add("miner", 3, "4GiB", sm=96)
        add("graphics", 3, "512MiB", ctx="G", sm=3)
        add("jupyter", 3, "9GiB", ctx="C+G", sm=0)
        if self.mig:
            mig_node(gpus, holders, {role: p.pid for role, p in self.procs.items()})
        return {"gpus": gpus, "holders": holders}

    def write_scenario(self) -> Path:
        data = self.scenario()
        tmp = self.scenario_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
        os.replace(tmp, self.scenario_path)
        return self.scenario_path

    # ---- background --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self._reap_children()
                changed = self._follow_retry_worker()
                if self.animate or changed:
                    self._tick += 1
                    with self._lock:
                        if not self._stopped:
                            self.write_scenario()
            except Exception:  # the demo must never take the app down
                pass

    def _reap_children(self) -> None:
        for p in self._popens:
            p.poll()

    def _follow_retry_worker(self) -> bool:
        """The retry loop restarted its worker: the new process takes the GPU, as with a real job."""
        root = self.procs.get("retry-root")
        cur = self.procs.get("retry-worker")
        if root is None or not _same(root):
            return False
        if cur is not None and _same(cur):
            return False
        try:
            kids = psutil.Process(root.pid).children()
        except psutil.Error:
            return False
        for k in kids:
            try:
                if "--retry" in k.cmdline():
                    self._record("retry-worker", k.pid)
                    return True
            except psutil.Error:
                continue
        return False


def mig_node(gpus: list[dict], holders: list[dict], pids: dict[str, int]) -> None:
    """Make the demo a MIG node: GPU 1 an H200 split 3g.71gb + 2 x 1g.18gb + 1g.18gb, with worker1 on the
    3g.71gb instance and the notebook (moved from GPU 3) on a 1g.18gb one. With MIG on, NVML gives no GPU
    or per-process utilisation: the scenario leaves them out (N/A)."""
    gpus[1].update({"name": "Simulated H200 141GB", "memory_total": "141GiB", "utilization": None,
                    "memory_utilization": None, "mig": [
                        {"gi": 1, "ci": 0, "profile": "3g.71gb", "memory_total": "71GiB"},
                        {"gi": 5, "ci": 0, "profile": "1g.18gb", "memory_total": "18GiB"},
                        {"gi": 6, "ci": 0, "profile": "1g.18gb", "memory_total": "18GiB"},
                        {"gi": 13, "ci": 0, "profile": "1g.18gb", "memory_total": "18GiB"}]})
    for h in holders:
        if h["pid"] == pids.get("worker1"):
            h.update({"gi": 1, "ci": 0, "sm": None})
        elif h["pid"] == pids.get("jupyter"):
            h.update({"gpu": 1, "gi": 5, "ci": 0, "type": "C", "sm": None, "memory": "7GiB"})


def _kill_and_wait(pids: list[int], timeout: float) -> list[int]:
    """SIGKILL every one of ``pids`` through a pidfd, then wait until all have exited (a pidfd turns
    readable then; a zombie init has not reaped yet has exited) or ``timeout`` passes. The pids still
    running."""
    import select

    opened: dict[int, int] = {}  # pidfd -> pid
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except AttributeError:  # no pidfds here (not Linux 5.3+): a plain kill, as the demo did before
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            continue
        except OSError:  # gone already: nothing to signal (a PID reused since is not ours)
            continue
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        opened[fd] = pid
    fds = list(opened)
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    running = set(fds)
    deadline = time.monotonic() + timeout
    try:
        while running and time.monotonic() < deadline:
            for fd, _ in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                running.discard(fd)
                poller.unregister(fd)
        return [opened[fd] for fd in running]
    finally:
        for fd in fds:
            os.close(fd)


def _same(p: DemoProc) -> bool:
    return p.start_time is not None and proc_start_time(p.pid) == p.start_time


def _default_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_name(pid: int, name: str, timeout: float = 10.0) -> None:
    """Until the process has renamed itself (prctl PR_SET_NAME in its first lines)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == name[:15]:
                    return
        except OSError:
            return  # not Linux, or gone: nothing to wait for
        time.sleep(0.02)


def _wait_start_time(pid: int, timeout: float = 5.0) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = proc_start_time(pid)
        if st is not None:
            return st
        time.sleep(0.02)
    return None


def _wait_children(pid: int, n: int, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kids = sorted(c.pid for c in psutil.Process(pid).children())
        except psutil.Error:
            kids = []
        if len(kids) >= n:
            return kids[:n]
        time.sleep(0.02)
    raise RuntimeError(f"demo: process {pid} did not start {n} child process(es) within {timeout:.0f}s")


def _wait_pidfile(path: Path, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = path.read_text().strip()
            if text:
                return int(text)
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise RuntimeError(f"demo: the retry loop did not start within {timeout:.0f}s")
