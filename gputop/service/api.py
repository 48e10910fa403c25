"""``gputop serve``: a local HTTP API and a Prometheus endpoint (Starlette on uvicorn).

Reads come from the latest snapshot, which one background thread refreshes (sampling never runs on the
event loop). Who may write is gputop.core.requester.check_write: the server's own user (or root) through its
Unix socket (SO_PEERCRED), anyone else with the bearer token kept in a file only its owner can read
(0600); every TCP write needs the token. Writes go through gputop.actions with face "api", which
re-checks identity and safety and writes the audit log. --read-only refuses every write (403).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from functools import partial
from pathlib import Path

import h11
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from gputop import __version__
from gputop.service import faces
from gputop.core import requester
from gputop.util.errors import GputopError, UsageError
from gputop.service.faces import HTTP_STATUS, LiveSnapshot
from gputop.service.metrics import FindingCounter, GuardHitCounter, SnapshotCollector, exposition

FACE = "api"


# ---- the app ---------------------------------------------------------------------------------

MAX_BODY = 64 * 1024  # bytes in a write request's body (413 beyond)
MAX_REASON = 1000  # characters in a 'reason'


def _error(status: int, message: str, **extra) -> JSONResponse:
    return JSONResponse({"ok": False, "error": message, **extra}, status_code=status)


def _http_error(request: Request, exc) -> JSONResponse:
    """Unknown routes and wrong methods answer in JSON like the rest of the API."""
    code = getattr(exc, "status_code", 500)
    if code == 404:
        msg = f"no such endpoint {request.url.path}: GET / lists the endpoints"
    elif code == 405:
        msg = f"{request.method} is not allowed on {request.url.path}"
    else:
        msg = str(getattr(exc, "detail", "") or "error")
    return JSONResponse({"ok": False, "error": msg}, status_code=code, headers=getattr(exc, "headers", None))


def allowed_hosts(bind: str, port: int, extra: tuple[str, ...] = ()) -> set[str]:
    """Host header values accepted: the bound address and loopback names (DNS rebinding stays out)."""
    names = {bind, "localhost", "127.0.0.1", "::1", "[::1]", *extra}
    if ":" in bind and not bind.startswith("["):
        names.add(f"[{bind}]")
    return names | {f"{n}:{port}" for n in names}


class HostCheck:
    """ASGI middleware: 421 for a Host header that is not one of ``hosts`` (None: accept any)."""

    def __init__(self, app, hosts: set[str] | None):
        self.app = app
        self.hosts = {h.lower() for h in hosts} if hosts is not None else None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.hosts is not None:
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1").lower()
            if host not in self.hosts:
                resp = _error(421, f"Host header {host[:100]!r} is not this server's address; "
                                   "use http://127.0.0.1:PORT (or start serve with --allow-host NAME)")
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _want(data: dict, key: str, types: tuple, what: str, default=None):
    """data[key], checked strictly: bool is not a number, a string is not a number or a bool."""
    if key not in data or data[key] is None:
        return default
    v = data[key]
    if isinstance(v, bool) and bool not in types:
        raise UsageError(f"{key} must be {what}, got {json.dumps(v)}")
    if not isinstance(v, types):
        raise UsageError(f"{key} must be {what}, got {json.dumps(v)[:60]}")
    if isinstance(v, float) and not math.isfinite(v):
        raise UsageError(f"{key} must be a finite number")
    return v


def _reason(data: dict) -> str | None:
    r = _want(data, "reason", (str,), "a string")
    if r is not None and len(r) > MAX_REASON:
        raise UsageError(f"reason is {len(r)} characters long; at most {MAX_REASON} are allowed")
    return r


def _write_endpoint(live: LiveSnapshot, token_path: Path | None, read_only: bool, action: str, fn):
    """A POST endpoint: who asked and whether they may write is decided first (gputop.core.requester: the Unix
    socket's SO_PEERCRED uid, or the bearer token), every record names that actor, then ``fn(live, body)``
    runs in a thread."""
    async def endpoint(request: Request):
        if read_only:
            actor = requester.request_actor(request.scope, FACE)
            msg = "this gputop serve is read-only (--read-only): it refuses every write"
            with requester.acting_for(actor):
                faces.refusal_record(action, FACE, msg, rule="read-only")
            return _error(403, msg)
        check = requester.check_write(request.scope, request.headers.get("authorization", ""), token_path, FACE)
        with requester.acting_for(check.actor):  # every record names who asked
            if check.why is not None:
                faces.refusal_record(action, FACE, check.why, rule=check.rule)
                headers = {"WWW-Authenticate": 'Bearer realm="gputop"'} if check.status == 401 else None
                return JSONResponse({"ok": False, "error": check.why}, status_code=check.status, headers=headers)
            try:
                data = await _body(request)
                return await run_in_threadpool(_acting, check.actor, partial(fn, live), data)
            except GputopError as e:
                faces.refusal_record(action, FACE, str(e)[:300], rule="bad-request")
                code = 413 if isinstance(e, _TooLarge) else HTTP_STATUS.get(e.exit_code, 400)
                return _error(code, str(e))
    return endpoint


def _kill(live: LiveSnapshot, data: dict):
    _only(data, {"pid", "start_time", "force", "signal", "dry_run", "reason"})
    res = faces.do_kill(live, FACE, pid=_want(data, "pid", (int,), "an integer"),
                        start_time=_want(data, "start_time", (int, float), "a number"),
                        force=_want(data, "force", (bool,), "true or false", False),
                        signal_name=_want(data, "signal", (str, int), "a signal name or number", "TERM"),
                        dry_run=_want(data, "dry_run", (bool,), "true or false", False), reason=_reason(data))
    return JSONResponse(res.to_dict(), status_code=HTTP_STATUS.get(res.exit_code, 500))


def _reap(live: LiveSnapshot, data: dict):
    _only(data, {"roots", "dry_run", "grace", "reason"})
    grace = _want(data, "grace", (int, float), "a number of seconds", live.config.kill_timeout)
    if grace < 0:
        raise UsageError("grace must be a number of seconds")
    roots = _want(data, "roots", (list, int), "a list of root PIDs")
    if isinstance(roots, list) and not all(isinstance(r, int) and not isinstance(r, bool) for r in roots):
        raise UsageError("roots must be a list of integers (root PIDs)")
    results = faces.do_reap(live, FACE, roots=roots, dry_run=_want(data, "dry_run", (bool,), "true or false", False),
                            grace=float(grace), reason=_reason(data))
    ok = all(r["ok"] for r in results)
    code = 200 if ok else max((HTTP_STATUS.get(r["exit_code"], 500) for r in results if not r["ok"]))
    return JSONResponse({"ok": ok, "results": results, "count": len(results)}, status_code=code)


def _reset(live: LiveSnapshot, data: dict):
    _only(data, {"index", "gpu", "force", "reason"})
    index = _want(data, "index", (int,), "an integer (the GPU index)")
    if index is None:
        index = _want(data, "gpu", (int,), "an integer")
    res = faces.do_reset(live, FACE, index=index, force=_want(data, "force", (bool,), "true or false", False),
                         reason=_reason(data))
    return JSONResponse(res.to_dict(), status_code=HTTP_STATUS.get(res.exit_code, 500))


def _guard_mode(live: LiveSnapshot, data: dict):
    _only(data, {"mode"})
    return JSONResponse(faces.do_guard_mode(FACE, _want(data, "mode", (str,), "a string")))


def endpoints(routes) -> list[str]:
    """What the root names: each route but "/" itself, writes as "POST <path>" (read from the routes, so
    the list cannot drift from them)."""
    return [("POST " if "POST" in (r.methods or ()) else "") + r.path for r in routes if r.path != "/"]


def _read_routes(live: LiveSnapshot, read_only: bool, registry: CollectorRegistry) -> list[Route]:
    async def status(request: Request):
        return JSONResponse(live.latest().to_dict())

    async def processes(request: Request):
        q = request.query_params
        try:
            payload = faces.processes_payload(live.latest(), name=q.get("name"), user=q.get("user"),
                                              gpu=q.get("gpu"), memory_gt=q.get("memory_gt"))
        except UsageError as e:
            return _error(400, str(e))
        return JSONResponse(payload)

    async def rogue(request: Request):
        return JSONResponse(faces.rogue_payload(live))

    async def guard(request: Request):
        return JSONResponse(await run_in_threadpool(faces.guard_status))

    async def metrics(request: Request):
        data, ctype = await run_in_threadpool(exposition, registry, request.headers.get("accept"))
        return Response(data, media_type=ctype)

    async def root(request: Request):
        return JSONResponse({"service": "gputop", "version": __version__, "read_only": read_only,
                             "endpoints": endpoints(request.app.routes)})

    async def ledger(request: Request):
        return JSONResponse(faces.ledger_payload(live.latest()))

    return [Route("/", root), Route("/v1/status", status), Route("/v1/processes", processes),
            Route("/v1/audit/rogue", rogue), Route("/v1/guard/status", guard), Route("/metrics", metrics),
            Route("/v1/ledger", ledger)]


def create_app(live: LiveSnapshot, token_path: Path | None, hosts: set[str] | None = None,
               read_only: bool = False) -> Starlette:
    """Writes: see gputop.core.requester.check_write (the Unix socket's own user, or the bearer token of
    ``token_path``; ``token_path`` None: no token, so nothing over TCP). ``read_only``: no writes at all.
    ``hosts``: the Host header values accepted (see allowed_hosts); None accepts any."""
    findings = FindingCounter()
    live.add_listener(findings)
    # The snapshot taken before the listener was added counts too.
    if live._latest is not None:
        findings(live._latest, live._findings)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(live, findings, GuardHitCounter()))
    writes = [Route(path, _write_endpoint(live, token_path, read_only, action, fn), methods=["POST"])
              for path, action, fn in (("/v1/kill", "kill", _kill), ("/v1/reap", "reap", _reap),
                                       ("/v1/reset", "reset", _reset), ("/v1/guard/mode", "guard-mode", _guard_mode))]
    app = Starlette(routes=_read_routes(live, read_only, registry) + writes,
                    exception_handlers={404: _http_error, 405: _http_error}, lifespan=flush_refusals_on_shutdown)
    app.state.live = live
    app.add_middleware(HostCheck, hosts=hosts)
    return app


@contextlib.asynccontextmanager
async def flush_refusals_on_shutdown(app):
    """uvicorn re-raises SIGTERM after shutdown, so code after server.run() never runs: the count of
    refusals coalesced in the last window is written here, at lifespan shutdown."""
    try:
        yield
    finally:
        faces.REFUSALS.flush_all()


class _TooLarge(UsageError):
    pass


def _acting(actor: dict, fn, data: dict):
    with requester.acting_for(actor):
        return fn(data)


async def _body(request: Request) -> dict:
    """The JSON object in the body: at most MAX_BODY bytes (413), parsed without a traceback (400)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_BODY:
        raise _TooLarge(f"the request body is {declared} bytes; at most {MAX_BODY} are allowed")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise _TooLarge(f"the request body is over {MAX_BODY} bytes")
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except RecursionError:
        raise UsageError("the request body is nested too deeply") from None
    except ValueError as e:
        raise UsageError(f"the request body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise UsageError("the request body must be a JSON object")
    return data


def _only(data: dict, allowed: set[str]) -> None:
    extra = sorted(set(data) - allowed)
    if extra:
        raise UsageError(f"unknown field(s) {', '.join(extra)}: allowed are {', '.join(sorted(allowed))}")


# ---- the HTTP server: peer credentials, deadlines, a bounded number of connections -------------------

REQUEST_TIMEOUT = 10.0  # seconds a client has to send a whole request (line, headers and body)
MAX_CONNECTIONS = 100  # open connections per transport (TCP, Unix socket); more are closed at once
EMFILE_WARN_EVERY = 30.0  # seconds between two "out of file descriptors" lines


class GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus:

    - the kernel's word on the peer (gputop.core.requester.socket_peer: SO_PEERCRED on the Unix socket), read
      when the connection is made and put in every request's scope;
    - a deadline for each request: a client that has not sent the whole request REQUEST_TIMEOUT seconds
      after connecting (or after the previous response) is dropped, however slowly it trickles bytes in
      (uvicorn's keep-alive timer restarts on every byte);
    - at most MAX_CONNECTIONS open connections per transport, so a flood over TCP cannot lock the
      server's own user out of its Unix socket.
    """

    request_timeout = REQUEST_TIMEOUT
    max_connections = MAX_CONNECTIONS

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._deadline = None
        self.peer = requester.socket_peer(transport.get_extra_info("socket"))
        kind = self.peer["transport"]
        same = sum(1 for c in self.connections if getattr(c, "peer", requester.TCP_PEER)["transport"] == kind)
        if same > self.max_connections:
            transport.close()
            return
        inner, peer = self.app, self.peer

        async def with_peer(scope, receive, send):
            scope[requester.PEER_KEY] = peer
            await inner(scope, receive, send)

        self.app = with_peer
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout, self._expired)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.conn.their_state is not h11.DONE and not self.transport.is_closing():
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is h11.DONE:  # the whole request is in: the app's turn
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request on this keep-alive connection has the same deadline

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)


class FdWarning:
    """The event loop's handler for "socket.accept() out of system resource" (EMFILE, ENFILE): asyncio
    logs a traceback each time it retries (every second); this writes one line at most every
    EMFILE_WARN_EVERY seconds, saying how many times it happened. asyncio keeps retrying the accept, so
    the server serves again once descriptors are free. Anything else goes to the default handler."""

    def __init__(self, name: str, every: float = EMFILE_WARN_EVERY):
        self.name, self.every = name, every
        self.last = None
        self.count = 0

    def __call__(self, loop, context: dict) -> None:
        import errno
        import time

        exc = context.get("exception")
        if not (isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)):
            loop.default_exception_handler(context)
            return
        self.count += 1
        now = time.monotonic()
        if self.last is None or now - self.last >= self.every:
            print(f"{self.name}: warning: cannot accept connections: {exc.strerror} ({self.count} time(s)); "
                  "they wait until descriptors are free (raise 'ulimit -n' if this lasts)",
                  file=sys.stderr, flush=True)
            self.last, self.count = now, 0


class _Server(uvicorn.Server):
    def __init__(self, config, name: str, on_shutdown=None):
        super().__init__(config)
        self.fd_warning = FdWarning(name)
        self.on_shutdown = on_shutdown

    async def shutdown(self, sockets=None) -> None:
        try:
            await super().shutdown(sockets=sockets)
        finally:
            if self.on_shutdown is not None:  # uvicorn re-raises SIGTERM afterwards: no code after run() runs
                self.on_shutdown()

    async def startup(self, sockets=None) -> None:
        import asyncio

        asyncio.get_running_loop().set_exception_handler(self.fd_warning)
        await super().startup(sockets=sockets)


def run_server(app, sockets: list, name: str, on_shutdown=None) -> None:
    """Serve ``app`` on the listening ``sockets`` (TCP and Unix) until SIGINT/SIGTERM, then call
    ``on_shutdown``. Proxy headers are off: X-Forwarded-For and friends never change the client address,
    so never the recorded actor."""
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", http=GuardedProtocol,
                            loop="asyncio", proxy_headers=False, server_header=False)
    _Server(config, name, on_shutdown).run(sockets=sockets)
