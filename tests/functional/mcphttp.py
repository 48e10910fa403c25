"""`gputop mcp --http` as a real process, and a stdlib-only MCP client that can run as another user."""

from __future__ import annotations

import json
import os
import subprocess

from tests.functional.servehelp import Service

# Run by /usr/bin/python3 (stdlib only), possibly as another user: argv = url, token ('' for none), Unix
# socket path ('' for TCP), then JSON lines of [tool, arguments] on stdin. Prints one JSON line per call:
# the JSON-RPC response.
CLIENT = r'''
import http.client, json, socket, sys, urllib.parse
url, token, unix = sys.argv[1], sys.argv[2], sys.argv[3]
hdr = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
       "MCP-Protocol-Version": "2025-06-18"}
if token:
    hdr["Authorization"] = "Bearer " + token
u = urllib.parse.urlsplit(url)
class UnixConnection(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(unix)
def post(body, sid=None):
    h = dict(hdr)
    if sid:
        h["Mcp-Session-Id"] = sid
    c = UnixConnection("localhost", timeout=60) if unix else http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    c.request("POST", u.path, body=json.dumps(body).encode(), headers=h)
    r = c.getresponse()
    text = r.read().decode()
    if r.status >= 400:
        sys.exit(f"HTTP {r.status}: {text}")
    sid = r.headers.get("Mcp-Session-Id") or sid
    c.close()
    msgs = [json.loads(l[5:]) for l in text.splitlines() if l.startswith("data:") and l[5:].strip()]
    if not msgs and text.strip():
        msgs = [json.loads(text)]
    return (msgs[-1] if msgs else None), sid
init, sid = post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
post({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
for n, line in enumerate(sys.stdin, 1):
    tool, args = json.loads(line)
    res, _ = post({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                   "params": {"name": tool, "arguments": args}}, sid)
    print(json.dumps(res), flush=True)
'''


class McpHttp(Service):
    """A running `gputop mcp --http --port 0`; ``url`` is its /mcp endpoint."""

    what = "gputop mcp --http"

    def __init__(self, *args: str, timeout: float = 30.0):
        super().__init__(["mcp", "--http", "--port", "0", *args], r"streamable HTTP on (http://\S+/mcp)",
                         timeout=timeout)

    def call(self, calls: list[tuple[str, dict]], token: str = "", user: tuple[int, int] | None = None,
             timeout: float = 90, unix: bool = False) -> list[dict]:
        """Make the tool calls in one session, as ``user`` (uid, gid) when given, over TCP or (``unix``)
        the server's Unix socket; the JSON-RPC results."""
        cmd = ["/usr/bin/python3", "-c", CLIENT, self.url, token, self.socket if unix else ""]
        if user is not None:
            cmd = ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", *cmd]
        r = subprocess.run(cmd, input="".join(json.dumps(c) + "\n" for c in calls), capture_output=True,
                           text=True, timeout=timeout, cwd="/", env={"PATH": os.environ.get("PATH", "")})
        assert r.returncode == 0, r.stderr
        return [json.loads(line)["result"] for line in r.stdout.splitlines()]
