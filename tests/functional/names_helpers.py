"""A real process called NAME whose names agree (issue 25).

``procs.sleeper(NAME)`` renames a python with prctl: its name says NAME, its argv[0] and executable say
python. That is a disguise (gputop.core.disguise, the rogue audit's test), and no protect pattern protects a
disguised process. A test that needs a process protected by its name starts a program really called so:
a python script named NAME (comm NAME, argv [python, .../NAME, ...], the interpreter running its script).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import wait_comm

_DIR: Path | None = None


def program(name: str) -> str:
    """The path of a script called ``name`` that sleeps 600 s (its arguments are ignored: markers)."""
    global _DIR
    if _DIR is None:
        _DIR = Path(tempfile.mkdtemp(prefix="gputop-names-"))
        os.chmod(_DIR, 0o755)
        atexit.register(shutil.rmtree, _DIR, True)
    path = _DIR / name
    if not path.exists():
        path.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
        os.chmod(path, 0o755)
    return str(path)


def spawn_named(procs, name: str, *args: str, timeout: float = 20.0):
    """Start ``program(name)`` (with ``args``) through ``procs``; return once the kernel calls it ``name``."""
    p = procs.spawn([program(name), *args])
    wait_comm(p.pid, name, timeout, proc=p)
    return p


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def orphan_named(spawn, procs, shell: str, name: str, timeout: float = 15.0) -> int:
    """Start ``shell`` as a real orphan (``spawn(argv)`` starts ``setsid sh -c '<shell> & exit 0'``: its
    session leader exits at once); the PID of the process named ``name`` it leaves."""
    import psutil

    before = {p.pid for p in psutil.process_iter()}
    leader = spawn(["setsid", "sh", "-c", f"{shell} & exit 0"])
    leader.wait(timeout)
    deadline = time.time() + timeout
    while time.time() < deadline:
        for p in psutil.process_iter(["pid", "name", "ppid"]):
            if p.pid not in before and p.info["name"] == name[:15] and p.info["ppid"] == 1 and _sid(p.pid) == leader.pid:
                procs.pids.append(p.pid)  # in the session setsid made (another test's orphan of that name is not)
                return p.pid
        time.sleep(0.05)
    raise TimeoutError(f"orphan {name!r} did not start")


def binary(name: str, source: str = "sleep") -> str:
    """A copy of the program ``source`` (sleep, sh, ...) called ``name``: every name of a process that runs
    it says ``name``."""
    program("x")  # makes the directory
    path = _DIR / name  # type: ignore[operator]
    if not path.exists():
        shutil.copy2(shutil.which(source), path)
        os.chmod(path, 0o755)
    return str(path)
