"""``gputop serve``: a local HTTP API and a Prometheus endpoint (Starlette on uvicorn).

Reads come from the latest snapshot, which one background thread refreshes (sampling never runs on the
event loop). Writes need a bearer token kept in a file only its owner can read (0600); they go through
gputop.actions with face "api", which re-checks identity and safety and writes the audit log. Without a
token file the service is read-only and every write answers 403.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import stat
from pathlib import Path

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gputop import __version__, faces
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
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
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

def _error(status: int, message: str, **extra) -> JSONResponse:
    return JSONResponse({"ok": False, "error": message, **extra}, status_code=status)


def create_app(live: LiveSnapshot, token_path: Path | None) -> Starlette:
    """``token_path`` None: read-only service. Otherwise writes need ``Authorization: Bearer <token>``."""
    findings = FindingCounter()
    live.add_listener(findings)
    # The snapshot taken before the listener was added counts too.
    if live._latest is not None:
        findings(live._latest, live._findings)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(live, findings, GuardHitCounter()))

    async def status(request: Request):
        snap = live.latest()
        return JSONResponse(snap.to_dict())

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
                             "endpoints": ["/v1/status", "/v1/processes", "/v1/audit/rogue", "/v1/guard/status",
                                           "/metrics", "POST /v1/kill", "POST /v1/reap", "POST /v1/reset",
                                           "POST /v1/guard/mode"]})

    def authorize(request: Request, action: str) -> JSONResponse | None:
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

    async def body(request: Request) -> dict:
        raw = await request.body()
        if not raw.strip():
            return {}
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise UsageError(f"the request body is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise UsageError("the request body must be a JSON object")
        return data

    def write(action: str, fn):
        async def endpoint(request: Request):
            denied = authorize(request, action)
            if denied is not None:
                return denied
            try:
                data = await body(request)
                return await run_in_threadpool(fn, data)
            except GputopError as e:
                faces.refusal_record(action, FACE, str(e), rule="bad-request")
                return _error(HTTP_STATUS.get(e.exit_code, 400), str(e))
        return endpoint

    _KILL_KEYS = {"pid", "start_time", "force", "signal", "dry_run", "reason"}

    def kill(data: dict):
        _only(data, _KILL_KEYS)
        res = faces.do_kill(live, FACE, pid=data.get("pid"), start_time=data.get("start_time"),
                            force=bool(data.get("force", False)), signal_name=data.get("signal", "TERM"),
                            dry_run=bool(data.get("dry_run", False)), reason=data.get("reason"))
        return JSONResponse(res.to_dict(), status_code=HTTP_STATUS.get(res.exit_code, 500))

    def reap(data: dict):
        _only(data, {"roots", "dry_run", "grace", "reason"})
        grace = data.get("grace", live.config.kill_timeout)
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
            raise UsageError("grace must be a number of seconds")
        results = faces.do_reap(live, FACE, roots=data.get("roots"), dry_run=bool(data.get("dry_run", False)),
                                grace=float(grace), reason=data.get("reason"))
        ok = all(r["ok"] for r in results)
        code = 200 if ok else max((HTTP_STATUS.get(r["exit_code"], 500) for r in results if not r["ok"]))
        return JSONResponse({"ok": ok, "results": results, "count": len(results)}, status_code=code)

    def reset(data: dict):
        _only(data, {"index", "gpu", "force", "reason"})
        res = faces.do_reset(live, FACE, index=data.get("index", data.get("gpu")),
                             force=bool(data.get("force", False)), reason=data.get("reason"))
        return JSONResponse(res.to_dict(), status_code=HTTP_STATUS.get(res.exit_code, 500))

    def guard_mode(data: dict):
        _only(data, {"mode"})
        return JSONResponse(faces.do_guard_mode(FACE, data.get("mode")))

    routes = [
        Route("/", root),
        Route("/v1/status", status),
        Route("/v1/processes", processes),
        Route("/v1/audit/rogue", rogue),
        Route("/v1/guard/status", guard),
        Route("/metrics", metrics),
        Route("/v1/kill", write("kill", kill), methods=["POST"]),
        Route("/v1/reap", write("reap", reap), methods=["POST"]),
        Route("/v1/reset", write("reset", reset), methods=["POST"]),
        Route("/v1/guard/mode", write("guard-mode", guard_mode), methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.live = live
    return app


def _only(data: dict, allowed: set[str]) -> None:
    extra = sorted(set(data) - allowed)
    if extra:
        raise UsageError(f"unknown field(s) {', '.join(extra)}: allowed are {', '.join(sorted(allowed))}")
