"""``gputop mcp``: an MCP server (the official ``mcp`` SDK 2.x, MCPServer) for AI assistants.

Read tools sample the GPUs when called. Destructive tools (kill_process, reap_orphans, reset_gpu, and
guard_set_mode to "enforce") only preview unless called with confirm=true; when confirmed they go through
gputop.actions with face "mcp", so they make exactly the refusals the CLI makes and write the audit log.
A preview also asks the kernel whether the signal would be allowed (gputop.core.permissions).

Over stdio the server belongs to the user who started it. Over HTTP (``--http``) anyone on the node can
connect to loopback, so every write (a confirmed destructive call, any guard mode change) follows
gputop.core.requester.check_write: through the server's Unix socket its own user (or root) may write, as
SO_PEERCRED says; everyone else, and everything over TCP, needs the bearer token of ``gputop serve``.
The audit record names the uid the kernel gives, or "token holder" for TCP.
Nothing here writes to stdout: on the stdio transport stdout carries the protocol.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from gputop import __version__
from gputop.service import faces
from gputop.core import permissions, requester
from gputop.util.errors import GputopError
from gputop.service.faces import LiveSnapshot
from gputop.core.snapshot_json import holder_to_dict
from gputop.util.units import fmt_bytes

FACE = "mcp"
INSTRUCTIONS = """gputop shows which processes hold each GPU on this machine, finds orphaned GPU jobs, and can kill
them, reap orphan trees or reset a GPU. Destructive tools preview what they would do unless called with
confirm=true; show the preview to the user and ask before confirming. Refusals (protected, unknown or
own-ancestor processes, a PID reused by another process, no permission) come back as errors and are
final: do not try to work around them."""

_READ = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
_DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False,
                               open_world_hint=False)

Confirm = Annotated[bool, Field(description="false (default): only preview, nothing is done; true: do it")]


def _call(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except GputopError as e:  # bad input: the model gets the one-line message
        raise ToolError(str(e)) from None


def _refused(out: dict) -> CallToolResult:
    """A refusal or failure: the whole result, marked isError so a client cannot take it for success."""
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(out, default=str))],
                          structured_content=out, is_error=True)


class HttpGate:
    """Who may write over HTTP: gputop.core.requester.check_write, the rule ``gputop serve`` uses (the Unix
    socket's own user or root, else the bearer token of ``token_path``; None: no token file)."""

    def __init__(self, token_path: Path | None):
        self.token_path = token_path

    def check(self, request) -> requester.WriteCheck:
        return requester.check_write(request.scope, request.headers.get("authorization", ""), self.token_path, VIA)


VIA = "mcp-http"


def _actor(ctx: Context | None) -> tuple[Any, dict | None]:
    """(the HTTP request or None for stdio, the actor to record for it when it only reads or previews)."""
    try:
        req = ctx.request_context.request if ctx is not None else None
    except ValueError:
        req = None
    if req is None or not hasattr(req, "headers"):
        return None, None
    return req, requester.request_actor(req.scope, VIA)


def build_server(live: LiveSnapshot, gate: HttpGate | None = None) -> MCPServer:
    server = MCPServer("gputop", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    gate = gate or HttpGate(None)

    def fresh():
        return live.refresh()

    def tool(title: str, annotations: ToolAnnotations):
        """Register with a title and the docstring as the description, indentation stripped."""
        def deco(fn):
            return server.tool(title=title, description=inspect.cleandoc(fn.__doc__ or ""),
                               annotations=annotations)(fn)
        return deco

    def writing(ctx: Context | None, action: str):
        """The actor context for a write; raises ToolError (isError) when an HTTP caller has no credential."""
        req, actor = _actor(ctx)
        if req is None:  # stdio: the user who started the server
            return requester.acting_for(None)
        check = gate.check(req)
        if check.why is not None:
            with requester.acting_for(check.actor):
                faces.refusal_record(action, FACE, check.why, rule=check.rule)
            raise ToolError(check.why)
        return requester.acting_for(check.actor)

    _register_reads(tool, live, fresh)
    _register_kill_reap(tool, live, fresh, writing)
    _register_reset_mode(tool, live, fresh, writing)
    return server


def _register_reads(tool, live: LiveSnapshot, fresh) -> None:
    @tool("GPU status", _READ)
    def gpu_status() -> dict[str, Any]:
        """Every GPU (utilisation, memory, temperature, power) and every GPU-holding process with its
        ancestry, context type (C/G/C+G) and orphan verdict; orphan trees under 'roots'."""
        return fresh().to_dict()

    @tool("List GPU processes", _READ)
    def list_processes(
        gpu: Annotated[int | None, Field(description="only processes on this GPU index")] = None,
        user: Annotated[str | None, Field(description="only processes of this user (exact login name)")] = None,
        name: Annotated[str | None, Field(description="case-insensitive regular expression (RE2 syntax: no "
                                                      "backreferences or lookaround) searched in the process "
                                                      "name and command line; a plain word is a substring")] = None,
        min_memory: Annotated[str | None, Field(description="only processes holding more GPU memory than this: "
                                                            "bytes, or a size such as '4GiB'")] = None,
    ) -> dict[str, Any]:
        """GPU-holding processes, filtered by GPU index, user, name pattern and minimum GPU memory."""
        return _call(faces.processes_payload, fresh(), gpu=gpu, user=user, name=name, memory_gt=min_memory)

    @tool("GPU memory ledger", _READ)
    def memory_ledger() -> dict[str, Any]:
        """Who holds each GPU's used memory: the bytes of the processes the driver lists, the processes found
        only through the GPU's device file (another PID namespace, MPS clients; memory unknown), zombies with
        the parent that must wait for them, the unexplained rest in bytes, and 'held by the driver: only a
        reset frees it' with the reset command when no process holds a GPU that has memory in use."""
        return faces.ledger_payload(fresh())

    @tool("Rogue GPU use audit", _READ)
    def audit_rogue() -> dict[str, Any]:
        """Suspicious GPU use: miner-like names, processes of unknown users, idle holders of much memory,
        and similar findings, each with a severity, the rule and the evidence."""
        fresh()
        return faces.rogue_payload(live)

    @tool("Guard status", _READ)
    def guard_status() -> dict[str, Any]:
        """The guard: mode (off, dry-run, enforce), policy file and rules, daemon liveness, recent hits."""
        return _call(faces.guard_status)


def _preview_kill(out: dict, pid: int) -> dict:
    # The actions dry run already made the kernel's permission check (a refusal is 'permission-denied').
    out["preview"] = True
    out["next"] = ("nothing was done; call kill_process again with confirm=true to do it"
                   if out.get("ok") else "refused: this process will not be killed")
    return out


def _register_kill_reap(tool, live: LiveSnapshot, fresh, writing) -> None:
    @tool("Kill a GPU process", _DESTRUCTIVE)
    def kill_process(
        pid: Annotated[int, Field(description="the process ID (from gpu_status or list_processes)")],
        force: Annotated[bool, Field(description="SIGKILL if it has not exited after SIGTERM and the "
                                                 "timeout")] = False,
        confirm: Confirm = False,
        start_time: Annotated[float | None, Field(description="the process's start_time from gpu_status: "
                                                              "pins the exact process, a reused PID is "
                                                              "refused")] = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Terminate one GPU-holding process (SIGTERM; with force, SIGKILL if it does not exit in time).
        Without confirm=true this only previews: the same safety checks and the permission check, nothing
        is signalled. A refusal comes back as an error (isError) with the reason."""
        with writing(ctx, "kill") if confirm else requester.acting_for(_actor(ctx)[1]):
            snap = fresh()
            res = _call(faces.do_kill, live, FACE, pid=pid, start_time=start_time, force=force,
                        dry_run=not confirm, reason="requested through MCP")
        out = res.to_dict()
        out["confirmed"] = bool(confirm)
        h = snap.holder(pid)
        if h is not None:
            out["target"] = {"pid": h.pid, "start_time": h.start_time, "name": h.name, "user": h.user,
                             "gpus": list(h.gpus), "gpu_memory": fmt_bytes(h.gpu_memory), "cmd": h.cmd,
                             "verdict": h.verdict.kind}
        if not confirm:
            out = _preview_kill(out, pid)
        return out if out.get("ok") else _refused(out)

    @tool("Reap orphan trees", _DESTRUCTIVE)
    def reap_orphans(
        confirm: Confirm = False,
        roots: Annotated[list[int] | None, Field(description="only the orphan trees whose root PID is in this "
                                                             "list (default: every orphan tree)")] = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Kill whole orphan trees (a job whose session died, still holding a GPU), from the topmost root
        down. Previews unless confirm=true. A refusal comes back as an error (isError)."""
        with writing(ctx, "reap") if confirm else requester.acting_for(_actor(ctx)[1]):
            fresh()
            results = _call(faces.do_reap, live, FACE, roots=roots, dry_run=not confirm,
                            grace=live.config.kill_timeout, reason="requested through MCP")
        if not confirm:
            for r in results:
                pids = [m.get("pid") for m in (r.get("tree") or {}).get("members", []) if isinstance(m, dict)]
                why = permissions.first_signal_refusal([p for p in [r.get("pid"), *pids] if isinstance(p, int)])
                if r.get("ok") and why is not None:
                    r.update(ok=False, outcome="permission-denied", message=f"would be refused: {why}")
        out: dict[str, Any] = {"confirmed": bool(confirm), "count": len(results),
                               "ok": all(r["ok"] for r in results), "results": results}
        if not results:
            out["message"] = "no orphan trees hold a GPU now"
        if not confirm:
            out["preview"] = True
            out["next"] = "nothing was done; call reap_orphans again with confirm=true to reap these trees"
        return out if out["ok"] else _refused(out)


def _register_reset_mode(tool, live: LiveSnapshot, fresh, writing) -> None:
    @tool("Reset a GPU", _DESTRUCTIVE)
    def reset_gpu(
        index: Annotated[int, Field(description="the GPU index (from gpu_status)")],
        confirm: Confirm = False,
        force: Annotated[bool, Field(description="kill the processes holding the GPU first (the same safe "
                                                 "kill); without it a GPU in use is refused")] = False,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Reset GPU `index`. Refused while processes hold it, unless force=true (they are killed first,
        through the same safe kill). Previews unless confirm=true. A refusal comes back as an error."""
        if confirm:
            with writing(ctx, "reset"):
                fresh()
                res = _call(faces.do_reset, live, FACE, index=index, force=force, reason="requested through MCP")
            out = res.to_dict() | {"confirmed": True}
            return out if res.ok else _refused(out)
        return _preview_reset(live, fresh(), index, force, _actor(ctx)[1])

    @tool("Set the guard mode", _DESTRUCTIVE)
    def guard_set_mode(
        mode: Annotated[Literal["off", "dry-run", "enforce"],
                        Field(description="off: evaluate nothing; dry-run: record what would be done; "
                                          "enforce: act on policy hits (kill processes)")],
        confirm: Annotated[bool, Field(description="needed to switch to enforce (off and dry-run do not "
                                                   "need it)")] = False,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Switch the guard mode: off, dry-run or enforce. Switching to enforce lets the guard kill
        processes by policy, so it needs confirm=true. Over HTTP every mode change needs a credential."""
        if mode == "enforce" and not confirm:
            from gputop.guard import state

            return {"preview": True, "confirmed": False, "mode": state.get_mode(),
                    "message": "would switch the guard to enforce: it will act on policy hits (kill processes)",
                    "next": "call guard_set_mode again with confirm=true to do it"}
        with writing(ctx, "guard-mode"):
            return _call(faces.do_guard_mode, FACE, mode)


def _preview_reset(live: LiveSnapshot, snap, index: int, force: bool, actor: dict | None):
    dev = snap.device(index)
    if dev is None:
        raise ToolError(f"no GPU {index}: this host has {len(snap.devices)} GPU(s)")
    with requester.acting_for(actor):
        res = _call(faces.do_reset, live, FACE, index=index, force=force, dry_run=True,
                    reason="preview through MCP")
    holders = snap.holders_on(index)
    # The core reset dry run (gputop.actions.reset) makes every check, the rights to reset and to signal
    # the holders included: the preview says what the CLI's --dry-run and the TUI dialog say.
    ok, message = res.ok, res.message
    if not ok:
        message = f"would refuse: {res.message}"
    out = {"preview": True, "confirmed": False, "ok": ok, "gpu": index, "name": dev.name, "message": message,
           "outcome": res.outcome,
           "holders": [holder_to_dict(h) for h in holders],
           "next": ("nothing was done; call reset_gpu again with confirm=true to do it" if ok
                    else "refused: this GPU will not be reset")}
    return out if ok else _refused(out)


def serve_stdio(live: LiveSnapshot) -> None:
    build_server(live).run("stdio")


def http_app(live: LiveSnapshot, token_path: Path | None):
    """The streamable HTTP app (Host and Origin checked by the SDK: loopback names only; "localhost"
    without a port too, which is what a client of the Unix socket sends)."""
    import contextlib

    from mcp.server.transport_security import TransportSecuritySettings

    from gputop.service.api import flush_refusals_on_shutdown

    hosts = ["127.0.0.1", "localhost", "[::1]"]
    security = TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                         allowed_hosts=hosts + [f"{h}:*" for h in hosts],
                                         allowed_origins=[f"http://{h}{p}" for h in hosts for p in ("", ":*")])
    app = build_server(live, HttpGate(token_path)).streamable_http_app(host="127.0.0.1",
                                                                       transport_security=security)
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a):
        async with inner(a) as st, flush_refusals_on_shutdown(a):
            yield st

    app.router.lifespan_context = lifespan
    return app
