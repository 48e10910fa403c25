"""Helpers for the guard and audit tests: a controllable clock, a sampler on a simulated scenario, a
loopback webhook receiver and a loopback "mining pool" TCP server."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from gputop.backends.simulated import SimulatedBackend
from gputop.core.config import Config
from gputop.core.sampler import Sampler

GIB = 1024**3


class Clock:
    """Starts at the real time (so process runtimes make sense) and moves only when told."""

    def __init__(self):
        self.t = time.time()

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def sampler_for(path, clock, config: Config | None = None) -> Sampler:
    return Sampler([SimulatedBackend(path)], config=config or Config(), clock=clock)


class Webhook:
    """An HTTP server on 127.0.0.1 that records every POSTed JSON body."""

    def __init__(self):
        received = self.received = []

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                received.append({"path": self.path, "type": self.headers.get("Content-Type"),
                                 "json": json.loads(body)})
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class PoolServer:
    """A TCP listener on 127.0.0.1 standing in for a mining pool; accepts and holds connections."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._stop = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                c, _ = self.sock.accept()
                self.conns.append(c)
            except OSError:
                continue

    def close(self):
        self._stop = True
        self.thread.join(2)
        for c in self.conns:
            c.close()
        self.sock.close()


class SmtpSink:
    """A minimal SMTP server on 127.0.0.1 that stores each message (envelope and data)."""

    def __init__(self):
        self.messages: list[dict] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as rf:
                conn.sendall(b"220 sink ESMTP\r\n")
                msg = {"from": None, "to": [], "data": b""}
                while True:
                    line = rf.readline()
                    if not line:
                        break
                    cmd = line.strip().upper()
                    if cmd.startswith((b"EHLO", b"HELO")):
                        conn.sendall(b"250 sink\r\n")
                    elif cmd.startswith(b"MAIL FROM:"):
                        msg["from"] = line.strip()[10:].decode()
                        conn.sendall(b"250 OK\r\n")
                    elif cmd.startswith(b"RCPT TO:"):
                        msg["to"].append(line.strip()[8:].decode())
                        conn.sendall(b"250 OK\r\n")
                    elif cmd == b"DATA":
                        conn.sendall(b"354 go ahead\r\n")
                        data = b""
                        while True:
                            ln = rf.readline()
                            if not ln or ln == b".\r\n":
                                break
                            data += ln
                        msg["data"] = data
                        self.messages.append(dict(msg))
                        conn.sendall(b"250 OK queued\r\n")
                    elif cmd == b"QUIT":
                        conn.sendall(b"221 bye\r\n")
                        break
                    else:
                        conn.sendall(b"250 OK\r\n")

    def close(self):
        self.sock.close()
