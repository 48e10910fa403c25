"""A node audit trail under attack, for tests/functional/test_audit_hostile.py and scripts/audit-flood.py.

- ``make_user(name)``: a second real user, created with useradd and removed afterwards;
- ``NodeGuard``: a real root ``gputop guard run`` serving the node trail on a socket in a shared directory;
- ``flood`` / ``slow_connections``: what the second user runs against it (its own processes, via setpriv);
- ``root_kill``: root's ``gputop kill`` of a real process, as a person would type it;
- ``run_flood``: all together (the 10 s test and the 60 s script measure the same thing).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from gputop.core import auditlog

ROOT = Path(__file__).resolve().parent.parent.parent


def _default_sighup():
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@contextlib.contextmanager
def make_user(name: str):
    """A second real user (useradd, no home); removed afterwards. Needs root. ``name``: from
    tests.conftest.unique_name (parallel test processes never share a user)."""
    from tests.conftest import add_user, del_user

    try:
        yield add_user(name, shell="/bin/sh")
    finally:
        del_user(name)


def as_user(pw, cmd: list[str], env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", *cmd],
                            env=env, cwd=ROOT, **kw)


class Shared:
    """A directory both users can read: the node socket, the node trail, root's own state."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="gputop-audit-"))
        self.dir.chmod(0o755)
        self.sock = self.dir / "run" / "audit.sock"
        self.log = self.dir / "log" / "audit.jsonl"
        self.env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": str(self.dir),
                    "GPUTOP_AUDIT_SOCKET": str(self.sock), "GPUTOP_NODE_AUDIT_LOG": str(self.log),
                    "GPUTOP_SYSTEM_CONFIG": str(self.dir / "none.yaml"), "GPUTOP_BACKEND": "simulated",
                    "GPUTOP_STATE_DIR": str(self.dir / "root-state")}
        self.policy = self.dir / "policy.yaml"
        self.policy.write_text("rules:\n  - name: none\n    conditions:\n      - {type: process_name, operator: "
                               "'==', value: nothing-at-all}\n    action: log\n")
        self.scenario(self.dir / "scenario.yaml", [])

    def scenario(self, path: Path, pids: list[int]) -> Path:
        path.write_text(yaml.safe_dump({"gpus": [{"name": "Sim"}], "holders": [
            {"pid": p, "gpu": 0, "memory": "1GiB"} for p in pids]}))
        path.chmod(0o644)
        return path

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class NodeGuard:
    """``gputop guard run`` as root, serving the node trail of ``shared`` (its own state dir ``name``)."""

    def __init__(self, shared: Shared, name: str = "guard", extra_env: dict | None = None, wait: bool = True):
        env = {**shared.env, "GPUTOP_STATE_DIR": str(shared.dir / name),
               "GPUTOP_SCENARIO": str(shared.dir / "scenario.yaml"), **(extra_env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "gputop", "guard", "run", "--interval", "0.5",
                                      "--policy-file", str(shared.policy)], env=env, cwd=ROOT,
                                     stderr=subprocess.PIPE, text=True, preexec_fn=_default_sighup)
        self.shared, self.err = shared, ""
        if wait:
            self.wait_serving()

    def wait_serving(self, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while auditlog.listener_pid(self.shared.sock) != self.proc.pid:
            if time.time() > deadline or self.proc.poll() is not None:
                self.stop()
                raise AssertionError(f"the guard did not serve the node trail: {self.err}")
            time.sleep(0.1)

    def wait_started(self, timeout: float = 60) -> None:
        """Until its guard-start record is in the node trail (whoever serves it)."""
        deadline = time.time() + timeout
        while not any(r.get("action") == "guard-start" and (r.get("peer") or {}).get("pid") == self.proc.pid
                      for r in auditlog.read(path=self.shared.log)):
            assert time.time() < deadline and self.proc.poll() is None, "the guard never started"
            time.sleep(0.1)

    def stop(self) -> str:
        """SIGTERM, and its stderr (stopping twice is fine)."""
        if self.proc.stderr is not None and not self.proc.stderr.closed:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            _, self.err = self.proc.communicate(timeout=60)
        return self.err


FLOODER = r"""
import json, socket, sys, time
path, seconds, rate, size = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
pad = "f" * max(0, size - 120)
sent = ok = 0
t0 = time.monotonic()
while time.monotonic() - t0 < seconds:
    due = t0 + sent / rate
    if due > time.monotonic():
        time.sleep(due - time.monotonic())
    rec = json.dumps({"at": time.time(), "action": "kill", "outcome": "killed", "n": sent, "pad": pad})
    sent += 1
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(path)
            s.sendall(rec.encode())
            s.shutdown(socket.SHUT_WR)
            ok += s.recv(64).startswith(b"ok")
    except OSError:
        pass
print(json.dumps({"sent": sent, "ok": ok, "bytes": sent * len(rec)}))
"""

SLOW = r"""
import json, select, socket, sys, time
path, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
conns, opened = [], 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    while len(conns) < n:  # keep n connections open, each sending one byte and then nothing
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(1)
        try:
            s.connect(path)
            s.send(b"{")
        except OSError:
            s.close()
            break
        conns.append(s)
        opened += 1
    ready, _, _ = select.select(conns, [], [], 0.2)
    for s in ready:  # the server gave up on it: open another
        conns.remove(s)
        s.close()
print(json.dumps({"opened": opened}))
"""


def flood(pw, shared: Shared, seconds: float, rate: float, size: int) -> subprocess.Popen:
    return as_user(pw, [sys.executable, "-c", FLOODER, str(shared.sock), str(seconds), str(rate), str(size)],
                   shared.env, stdout=subprocess.PIPE, text=True)


def slow_connections(pw, shared: Shared, n: int, seconds: float) -> subprocess.Popen:
    return as_user(pw, [sys.executable, "-c", SLOW, str(shared.sock), str(n), str(seconds)], shared.env,
                   stdout=subprocess.PIPE, text=True)


def root_kill(shared: Shared, argv: list[str] | None = None, tag: str = "") -> tuple[int, subprocess.CompletedProcess]:
    """Root kills a real process with ``gputop kill --force``: (its pid, the command's result)."""
    victim = subprocess.Popen(argv or ["sleep", "300"], preexec_fn=_default_sighup)
    try:
        scn = shared.scenario(shared.dir / f"scenario-{victim.pid}{tag}.yaml", [victim.pid])
        r = subprocess.run([sys.executable, "-m", "gputop", "--scenario", str(scn), "kill", "--pid", str(victim.pid),
                            "--force"], env=shared.env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        if victim.poll() is None:
            victim.kill()
        victim.wait(10)
    return victim.pid, r


def root_kills_in(records: list[dict], pids: list[int]) -> list[int]:
    """The pids among ``pids`` whose kill by root is in ``records``."""
    got = {(r.get("target") or {}).get("pid") for r in records
           if r.get("action") == "kill" and (r.get("peer") or {}).get("uid") == 0}
    return [p for p in pids if p in got]


def run_flood(pw, seconds: float, *, rate: float = 19.0, size: int = 60_000, max_bytes: int = 256 * 1024,
              say=lambda line: None) -> dict:
    """A second user floods the node trail for ``seconds`` (``rate`` records of ``size`` bytes a second:
    just under the server's 200 per 10 s) while root kills a real process about every second. The main
    trail rotates at ``max_bytes`` (the whole old trail was 6 x max_bytes). Returns the figures."""
    shared = Shared()
    try:
        guard = NodeGuard(shared, extra_env={"GPUTOP_AUDIT_MAX_BYTES": str(max_bytes)})
        try:
            guard.wait_started()
            f = flood(pw, shared, seconds, rate, size)
            try:
                kills, failures, t0 = [], [], time.monotonic()
                while f.poll() is None:
                    pid, r = root_kill(shared)
                    kills.append(pid)
                    if r.returncode != 0 or "WARNING" in r.stderr:
                        failures.append((pid, r.returncode, r.stderr.strip()[-300:]))
                    say(f"{time.monotonic() - t0:5.1f} s: root killed pid {pid} (exit {r.returncode})")
                    time.sleep(0.5)
                out, _ = f.communicate(timeout=60)
            finally:
                if f.poll() is None:
                    f.kill()
                    f.wait(10)
            flooded = json.loads(out)
        finally:
            guard.stop()
        recs = auditlog.read_node(path=shared.log)
        main = auditlog.read(path=shared.log)
        files = sorted(p for p in shared.log.parent.iterdir())
        return {
            "seconds": seconds, "flood": flooded, "root_kills": len(kills),
            "root_kills_in_trail": len(root_kills_in(recs, kills)), "root_failures": failures,
            "guard_start_kept": any(r.get("action") == "guard-start" for r in main),
            "guard_stop_kept": any(r.get("action") == "guard-stop" for r in main),
            "user_records_in_trail": sum((r.get("peer") or {}).get("uid") == pw.pw_uid
                                         and r.get("action") == "kill" for r in recs),
            "dropped_records": [r.get("message") for r in recs if r.get("action") == "audit-dropped"],
            "files": {p.name: p.stat().st_size for p in files},
            "guard_err": guard.err,
        }
    finally:
        shared.cleanup()
