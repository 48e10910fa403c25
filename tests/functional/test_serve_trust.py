"""Issue 25: `gputop serve` and `gputop mcp --http` trust only what the kernel says. A second real user
(created here) races writes by closing the socket at once; it cannot enter the Unix socket's directory;
X-Forwarded-For changes no actor; the servers run as root, like on the node where the race was found."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import tempfile
import time

import pytest

from gputop.core import auditlog
from gputop.guard import state
from gputop.core.requester import create_token
from tests.conftest import run_gputop
from tests.functional.mcphttp import McpHttp
from tests.functional.servehelp import Served, unix_request
from tests.functional.test_mcp_http import needs_root, other_user  # noqa: F401 - fixture

TRIES = 50

# Run by /usr/bin/python3 as the second user: argv = host, port, tries, MCP session id ('' for serve),
# then JSON [path, body, headers] requests used in turn. Each try connects, sends the whole request and
# closes at once, before any answer: the close-at-once race of issue 25.
RACE = r'''
import http.client, json, socket, sys
host, port, n, mcp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
reqs = [json.loads(a) for a in sys.argv[5:]]
sid = ""
if mcp:
    hdr = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
           "MCP-Protocol-Version": "2025-06-18"}
    def post(body, sid=""):
        c = http.client.HTTPConnection(host, port, timeout=60)
        c.request("POST", "/mcp", body=json.dumps(body), headers=dict(hdr, **({"Mcp-Session-Id": sid} if sid else {})))
        r = c.getresponse()
        r.read()
        c.close()
        return r.headers.get("Mcp-Session-Id") or sid
    sid = post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "race", "version": "1"}}})
    post({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
for i in range(n):
    path, body, hdrs = reqs[i % len(reqs)]
    if mcp:
        body = {"jsonrpc": "2.0", "id": i + 1, "method": "tools/call", "params": body}
        hdrs = dict(hdrs, **{"Mcp-Session-Id": sid, "Accept": "application/json, text/event-stream",
                             "MCP-Protocol-Version": "2025-06-18"})
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n")
    s = socket.create_connection((host, port))
    s.sendall(head.encode() + data)
    s.close()
print("sent", n)
'''


def race(url: str, user: tuple[int, int], requests: list, mcp: bool) -> None:
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    cmd = ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "/usr/bin/python3", "-c", RACE,
           host, port, str(TRIES), "1" if mcp else "", *(json.dumps(r) for r in requests)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/",
                       env={"PATH": os.environ.get("PATH", "")})
    assert r.returncode == 0 and f"sent {TRIES}" in r.stdout, r.stderr


def refusals(face: str) -> list[dict]:
    return [r for r in auditlog.read() if r.get("face") == face and r.get("outcome") == "refused"]


def wait_counted(face: str, n: int, timeout: float = 40) -> int:
    """The refusals counted in the audit log (coalesced lines count for their number), once they reach
    ``n`` or ``timeout`` passes (the limiter writes its summary when its 10-second window ends)."""
    deadline = time.time() + timeout
    while True:
        got = sum(r.get("coalesced", 1) for r in refusals(face))
        if got >= n or time.time() > deadline:
            return got
        time.sleep(0.5)


def assert_no_root_actor(recs: list[dict]) -> None:
    assert recs
    for r in recs:
        a = r["actor"]
        assert a["uid"] is None and a["user"] == "unknown uid, no token" and a["transport"] == "tcp", r
        assert a["uid"] != 0 and a["user"] != "root", r


@pytest.fixture
def targets(scenario, procs):
    victim = procs.sleeper("victim")
    bystander = procs.sleeper("bystander")
    scenario(holders=[{"pid": victim.pid, "gpu": 0, "memory": "4GiB"},
                      {"pid": bystander.pid, "gpu": 0, "memory": "4GiB"}], gpus=1)
    return victim, bystander


@needs_root
def test_close_at_once_race_against_mcp_http_never_writes(targets, other_user, tmp_path):
    victim, bystander = targets
    create_token(tmp_path / "token")  # a token file present, as in the report
    s = McpHttp("--token-file", str(tmp_path / "token"))
    try:
        mode = {"name": "guard_set_mode", "arguments": {"mode": "enforce", "confirm": True}}
        kill = {"name": "kill_process", "arguments": {"pid": victim.pid, "confirm": True, "force": True}}
        race(s.url, other_user, [["/mcp", mode, {}], ["/mcp", kill, {}]], mcp=True)
        wait_counted("mcp", TRIES)
    finally:
        s.stop()
    assert victim.poll() is None and bystander.poll() is None and state.get_mode() == "off"
    counted = sum(r.get("coalesced", 1) for r in refusals("mcp"))
    assert counted == TRIES, counted
    assert_no_root_actor(refusals("mcp"))
    assert not [r for r in auditlog.read() if r.get("outcome") != "refused"]


@needs_root
def test_close_at_once_race_against_serve_never_writes(targets, other_user, tmp_path):
    victim, bystander = targets
    create_token(tmp_path / "token")
    s = Served("--interval", "0.3", "--token-file", str(tmp_path / "token"))
    try:
        race(s.url, other_user, [["/v1/guard/mode", {"mode": "enforce"}, {}],
                                 ["/v1/kill", {"pid": victim.pid, "force": True}, {}]], mcp=False)
        wait_counted("api", TRIES)
    finally:
        s.stop()
    assert victim.poll() is None and bystander.poll() is None and state.get_mode() == "off"
    counted = sum(r.get("coalesced", 1) for r in refusals("api"))
    assert counted == TRIES, counted
    assert_no_root_actor(refusals("api"))
    assert not [r for r in auditlog.read() if r.get("outcome") != "refused"]


def _connect_as(user: tuple[int, int], path: str) -> subprocess.CompletedProcess:
    code = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
            "try:\n s.connect(sys.argv[1]); print('connected')\nexcept OSError as e: print(e.errno)")
    return subprocess.run(["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups",
                           "/usr/bin/python3", "-c", code, path], capture_output=True, text=True, timeout=30, cwd="/")


@needs_root
def test_unix_socket_own_user_writes_with_its_kernel_uid_and_another_user_cannot_enter(targets, other_user):
    victim, bystander = targets
    s = Served("--interval", "0.3")  # no token file: nothing over TCP may write
    try:
        path = s.socket
        d = os.stat(os.path.dirname(path))
        assert stat.S_IMODE(d.st_mode) == 0o700 and d.st_uid == os.geteuid()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        import errno

        assert _connect_as(other_user, path).stdout.strip() == str(errno.EACCES)  # cannot even enter
        code, _, body = unix_request(path, "POST", "/v1/guard/mode", b'{"mode": "dry-run"}')
        assert code == 200, body
        assert state.get_mode() == "dry-run"
        code, _, body = unix_request(path, "POST", "/v1/kill", json.dumps({"pid": victim.pid}).encode())
        assert code == 200 and json.loads(body)["ok"], body
        import httpx

        r = httpx.post(s.url + "/v1/guard/mode", json={"mode": "off"})  # root, over TCP: no token file
        assert r.status_code == 403 and "no token file" in r.json()["error"]
        assert state.get_mode() == "dry-run" and bystander.poll() is None
    finally:
        s.stop()
    assert not os.path.exists(path)  # removed when the server stops
    ok = [r for r in auditlog.read() if r.get("face") == "api" and r.get("outcome") != "refused"]
    assert {r["action"] for r in ok} == {"guard-mode", "kill"}
    for r in ok:
        a = r["actor"]
        assert a["uid"] == os.geteuid() and a["transport"] == "unix" and a["credential"] == "peer-uid", r
        assert a["pid"] == os.getpid()


def test_socket_directory_that_others_may_enter_or_own_is_refused(targets, tmp_path):
    d = tempfile.mkdtemp(prefix="gt-", dir="/tmp")
    try:
        os.chmod(d, 0o755)
        r = run_gputop("serve", "--port", "0", "--socket", f"{d}/s.sock", timeout=30)
        assert r.returncode == 5 and "chmod 700" in r.stderr and "Traceback" not in r.stderr, r.stderr
        os.chmod(d, 0o700)
        if os.geteuid() == 0:
            os.chown(d, 65534, 65534)
            r = run_gputop("serve", "--port", "0", "--socket", f"{d}/s.sock", timeout=30)
            assert r.returncode == 5 and "belongs to uid 65534" in r.stderr, r.stderr
            os.chown(d, 0, 0)
        os.symlink(d, f"{d}-link")
        r = run_gputop("mcp", "--http", "--port", "0", "--socket", f"{d}-link/s.sock", timeout=30)
        assert r.returncode == 5 and "symlink" in r.stderr, r.stderr
        with open(f"{d}/s.sock", "w"):
            pass
        r = run_gputop("serve", "--port", "0", "--socket", f"{d}/s.sock", timeout=30)
        assert r.returncode == 5 and "not a socket" in r.stderr, r.stderr
        os.unlink(f"{d}/s.sock")
        s = Served("--socket", f"{d}/s.sock")  # a live server's socket is not taken over
        try:
            r = run_gputop("serve", "--port", "0", "--socket", f"{d}/s.sock", timeout=30)
            assert r.returncode != 0 and "another server listens" in r.stderr, r.stderr
        finally:
            s.stop()
    finally:
        import shutil

        if os.path.islink(f"{d}-link"):
            os.unlink(f"{d}-link")
        shutil.rmtree(d, ignore_errors=True)


def test_x_forwarded_for_does_not_change_the_actor(targets, tmp_path):
    import httpx

    token = create_token(tmp_path / "token")
    s = Served("--interval", "0.3", "--token-file", str(tmp_path / "token"))
    try:
        forged = {"X-Forwarded-For": "10.9.8.7", "X-Real-IP": "10.9.8.7", "Forwarded": "for=10.9.8.7",
                  "X-Forwarded-Proto": "https"}
        r = httpx.post(s.url + "/v1/guard/mode", json={"mode": "dry-run"}, headers=forged)
        assert r.status_code == 401
        r = httpx.post(s.url + "/v1/guard/mode", json={"mode": "dry-run"},
                       headers={**forged, "Authorization": f"Bearer {token}"})
        assert r.status_code == 200
        code, _, _ = unix_request(s.socket, "POST", "/v1/guard/mode", b'{"mode": "off"}', headers=forged)
        assert code == 200
    finally:
        s.stop()
    recs = [r for r in auditlog.read() if r.get("face") == "api"]
    assert [r["outcome"] for r in recs] == ["refused", "ok", "ok"]
    for r in recs:
        assert "10.9.8.7" not in json.dumps(r["actor"]), r
    assert recs[0]["actor"]["client"].startswith("127.0.0.1:") and recs[1]["actor"]["client"].startswith("127.0.0.1:")
    assert recs[2]["actor"]["uid"] == os.geteuid() and "client" not in recs[2]["actor"]


def _partial(url: str, data: bytes) -> socket.socket:
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    c = socket.create_connection((host, int(port)))
    c.sendall(data)
    return c


def _closed_within(c: socket.socket, seconds: float, drip: bytes = b"") -> float | None:
    """Seconds until the server closes ``c`` (sending ``drip`` every second meanwhile), or None."""
    t0 = time.monotonic()
    c.settimeout(1.0)
    while time.monotonic() - t0 < seconds:
        try:
            if c.recv(4096) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            if drip:
                try:
                    c.sendall(drip)
                except OSError:
                    return time.monotonic() - t0
        except OSError:
            return time.monotonic() - t0
    return None


def test_a_client_that_never_finishes_its_request_is_dropped(targets):
    import httpx

    from gputop.service.api import REQUEST_TIMEOUT

    s = Served("--interval", "0.3")
    try:
        idle = _partial(s.url, b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never end
        drip = _partial(s.url, b"GET /v1/status HTTP/1.1\r\n")  # one header byte a second
        body = _partial(s.url, b"POST /v1/kill HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        for c, d in ((idle, b""), (drip, b"X"), (body, b" ")):
            took = _closed_within(c, REQUEST_TIMEOUT + 20, d)
            assert took is not None and took < REQUEST_TIMEOUT + 20, (d, took)
            c.close()
        assert httpx.get(s.url + "/v1/status", timeout=10).status_code == 200  # others are answered meanwhile
    finally:
        s.stop()
    assert "".join(s.stderr).count("Traceback") == 0, "".join(s.stderr)[-3000:]


def test_out_of_file_descriptors_gives_one_line_and_the_server_recovers(targets):
    import httpx

    s = Served("--interval", "0.3")
    held = []
    try:
        # Lower the running server's descriptor limit (prlimit), then hold more connections than it has.
        subprocess.run(["prlimit", f"--pid={s.proc.pid}", "--nofile=64:64"], check=True)
        host, port = s.url.split("//", 1)[1].rsplit(":", 1)
        for _ in range(120):
            held.append(socket.create_connection((host, int(port)), timeout=10))
        time.sleep(6)  # several of asyncio's one-second accept retries
        err = "".join(s.stderr)
        tracebacks = err.count("Traceback")  # (a bare 'in' would make pytest diff megabytes of text)
        assert tracebacks == 0, err[-3000:]
        warn = [line for line in s.stderr if "cannot accept connections" in line]
        assert 1 <= len(warn) <= 2 and len(err.splitlines()) <= 6, err[-3000:]
        for c in held:
            c.close()
        held.clear()
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(s.url + "/v1/status", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the server did not serve again once descriptors were free"
            time.sleep(0.5)
        assert s.proc.poll() is None
    finally:
        for c in held:
            c.close()
        s.stop()


def test_a_flood_of_tcp_connections_is_capped_and_the_unix_socket_still_answers(targets):
    from gputop.service.api import MAX_CONNECTIONS

    s = Served("--interval", "0.3")
    held = []
    try:
        host, port = s.url.split("//", 1)[1].rsplit(":", 1)
        for _ in range(MAX_CONNECTIONS + 20):
            held.append(socket.create_connection((host, int(port)), timeout=10))
        time.sleep(2)
        closed = 0
        for c in held:
            c.settimeout(0.05)
            try:
                closed += c.recv(1) == b""
            except TimeoutError:
                pass
            except OSError:
                closed += 1
        assert 20 <= closed < MAX_CONNECTIONS, closed  # the ones over the cap, closed at once
        code, _, body = unix_request(s.socket, "GET", "/v1/status", timeout=10)
        assert code == 200, body
    finally:
        for c in held:
            c.close()
        s.stop()
