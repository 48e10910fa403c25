"""Acting on a node of the fleet: through gputop's own ``--remote`` path (ssh, host-key checking on, every
argument quoted, the host name checked), so the node's gputop re-checks identity and safety and writes
its audit log. Nothing here signals anything itself."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from gputop.util.textsafe import visible

TIMEOUT = 60.0


@dataclass(frozen=True)
class RemoteResult:
    rc: int
    message: str  # one line (the remote's output, control characters made visible)

    @property
    def ok(self) -> bool:
        return self.rc == 0


def gputop_argv(host: str, args: list[str]) -> list[str]:
    """``gputop --remote=HOST ARGS...``: the existing remote path refuses a host that starts with '-' or
    holds spaces (a Hostname label is whatever an exporter wrote)."""
    return [sys.executable, "-m", "gputop", f"--remote={host}", *args]


def kill_args(pid: int, start_time: float | None, signal_name: str = "TERM") -> list[str]:
    args = ["kill", "--pid", str(int(pid)), "--signal", signal_name]
    if start_time is not None:
        args += ["--start-time", repr(float(start_time))]
    return args


def reap_args(root_pid: int) -> list[str]:
    return ["reap", "--root", str(int(root_pid)), "--apply"]


def run_remote(host: str, args: list[str], timeout: float = TIMEOUT) -> RemoteResult:
    """Run it, wait, and say what happened in one line. Never claims success without exit 0."""
    try:
        p = subprocess.run(gputop_argv(host, args), stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout, text=True, errors="replace")
    except subprocess.TimeoutExpired:
        return RemoteResult(124, f"{host}: no answer within {timeout:g}s (the action may still be running there)")
    except OSError as e:
        return RemoteResult(1, f"{host}: cannot start gputop --remote: {e.strerror or e}")
    text = " ".join((p.stdout.strip() + " " + p.stderr.strip()).split())
    return RemoteResult(p.returncode, visible(text[:400]) or f"exit {p.returncode}")
