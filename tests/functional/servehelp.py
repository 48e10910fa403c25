"""Start real `gputop serve` / `gputop mcp` processes for the service tests."""

from __future__ import annotations

import os
import queue
import socket
import re
import subprocess
import sys
import threading
import time

from tests.conftest import _default_sighup


class Service:
    """A real `gputop ARGS...` service started on a free port: waits for the stderr line that ``ready``
    matches and takes ``url`` from its first group."""

    what = "gputop"

    def __init__(self, argv: list[str], ready: str, env: dict | None = None, timeout: float = 20.0):
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen([sys.executable, "-m", "gputop", *argv],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=e, preexec_fn=_default_sighup)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = None
        self.socket = None  # the Unix socket's path, when the service says it offers one
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            sock = re.search(r"Unix socket (\S+)", line)
            if sock:
                self.socket = sock.group(1)
            m = re.search(ready, line)
            if m:
                self.url = m.group(1)
                return
        self.stop()
        raise RuntimeError(f"{self.what} did not start (rc={self.proc.returncode}): {''.join(self.stderr)}")

    def _pump(self):
        for line in self.proc.stderr:
            self.stderr.append(line)
            self.lines.put(line)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Served(Service):
    """A running `gputop serve` on a free port; ``url`` is its base URL."""

    what = "gputop serve"

    def __init__(self, *args: str, env: dict | None = None, timeout: float = 20.0):
        super().__init__(["serve", "--port", "0", *args], r"listening on (http://\S+)", env=env, timeout=timeout)


def unix_request(path: str, method: str, target: str, body: bytes = b"", headers: dict | None = None,
                 timeout: float = 60) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 request over the Unix socket ``path``: (status, headers, body)."""
    import http.client

    class UnixConnection(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(path)

    c = UnixConnection("localhost", timeout=timeout)
    try:
        c.request(method, target, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()
