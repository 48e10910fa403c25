"""``gputop serve``: a local HTTP API and a Prometheus endpoint (Starlette on uvicorn).

Reads come from the latest snapshot, which one background thread refreshes (sampling never runs on the
event loop). Writes need a bearer token kept in a file only its owner can read (0600); they go through
gputop.actions with face "api", which re-checks identity and safety and writes the audit log. Without a
token file the service is read-only and every write answers 403.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import math
import os
import secrets
import stat
from functools import partial
from pathlib import Path

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gputop import __version__, faces, requester
from gputop.config import state_dir
from gputop.errors import GputopError, RefusedError, UsageError
from gputop.faces import HTTP_STATUS, LiveSnapshot
from gputop.metrics import FindingCounter, GuardHitCounter, SnapshotCollector, exposition

TOKEN_FILE = "api-token"
FACE = "api"


# ---- the token -------------------------------------------------------------------------------

def default_token_path() -> Path:
    return state_dir() / TOKEN_FILE


def read_token(path: Path) -> str | None:
    """The token, or None when the file does not exist. Refuses a file others can read or write."""
    try:
        # O_NONBLOCK: a FIFO put in its place must not block the server in open().
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RefusedError(f"cannot open token file {path}: {e.strerror} (a symlink is refused)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedError(f"token file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise RefusedError(f"token file {path} has mode {stat.S_IMODE(st.st_mode):04o}: others can read it; "
                               f"run 'chmod 600 {path}' (or delete it and start with --create-token)")
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            raise RefusedError(f"token file {path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})")
        token = os.read(fd, 4096).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
    if len(token) < 16:
        raise RefusedError(f"token file {path} holds no usable token (at least 16 characters); "
                           "delete it and start with --create-token")
    return token


def create_token(path: Path) -> str:
    """Write a new random token to ``path``, created 0600 (never over an existing file)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        raise UsageError(f"token file {path} already exists; it is used as it is") from None
    try:
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    return token


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


def _authorize(token_path: Path | None, request: Request, action: str) -> JSONResponse | None:
    """None when the request may write; else the refusal (recorded in the audit log) to send."""
    if token_path is None:
        msg = ("this gputop serve is read-only: start it with a token file (gputop serve --create-token) "
               "to allow writes")
        faces.refusal_record(action, FACE, msg, rule="read-only")
        return _error(403, msg)
    try:
        token = read_token(token_path)
    except GputopError as e:
        faces.refusal_record(action, FACE, str(e), rule="token-file")
        return _error(403, f"writes are disabled: {e}")
    if token is None:
        msg = f"writes are disabled: the token file {token_path} is gone"
        faces.refusal_record(action, FACE, msg, rule="token-file")
        return _error(403, msg)
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        msg = f"missing or wrong bearer token: send 'Authorization: Bearer <contents of {token_path}>'"
        faces.refusal_record(action, FACE, msg, rule="token", client=request.client.host if request.client else None)
        return JSONResponse({"ok": False, "error": msg}, status_code=401,
                            headers={"WWW-Authenticate": 'Bearer realm="gputop"'})
    return None


def _write_endpoint(live: LiveSnapshot, token_path: Path | None, action: str, fn):
    """A POST endpoint: the requester's uid is known first (every record names it), then the token is
    checked, then ``fn(live, body)`` runs in a thread."""
    async def endpoint(request: Request):
        server = request.scope.get("server")
        actor = requester.http_actor(request.client and (request.client.host, request.client.port),
                                     server and (server[0], server[1]), via="api")
        with requester.acting_for(actor):  # every record names the uid that asked
            denied = _authorize(token_path, request, action)
            if denied is not None:
                return denied
            try:
                data = await _body(request)
                return await run_in_threadpool(_acting, actor, partial(fn, live), data)
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


def _read_routes(live: LiveSnapshot, token_path: Path | None, registry: CollectorRegistry) -> list[Route]:
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
        return JSONResponse({"service": "gputop", "version": __version__, "read_only": token_path is None,
                             "endpoints": endpoints(request.app.routes)})

    return [Route("/", root), Route("/v1/status", status), Route("/v1/processes", processes),
            Route("/v1/audit/rogue", rogue), Route("/v1/guard/status", guard), Route("/metrics", metrics)]


def create_app(live: LiveSnapshot, token_path: Path | None, hosts: set[str] | None = None) -> Starlette:
    """``token_path`` None: read-only service. Otherwise writes need ``Authorization: Bearer <token>``.
    ``hosts``: the Host header values accepted (see allowed_hosts); None accepts any."""
    findings = FindingCounter()
    live.add_listener(findings)
    # The snapshot taken before the listener was added counts too.
    if live._latest is not None:
        findings(live._latest, live._findings)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(live, findings, GuardHitCounter()))
    writes = [Route(path, _write_endpoint(live, token_path, action, fn), methods=["POST"])
              for path, action, fn in (("/v1/kill", "kill", _kill), ("/v1/reap", "reap", _reap),
                                       ("/v1/reset", "reset", _reset), ("/v1/guard/mode", "guard-mode", _guard_mode))]
    app = Starlette(routes=_read_routes(live, token_path, registry) + writes,
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
