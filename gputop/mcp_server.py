"""``gputop mcp``: an MCP server (the official ``mcp`` SDK 2.x, MCPServer) for AI assistants.

Read tools sample the GPUs when called. Destructive tools (kill_process, reap_orphans, reset_gpu, and
guard_set_mode to "enforce") only preview unless called with confirm=true; when confirmed they go through
gputop.actions with face "mcp", so they make exactly the refusals the CLI makes and write the audit log.
Nothing here writes to stdout: on the stdio transport stdout carries the protocol.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from gputop import __version__, faces
from gputop.errors import GputopError
from gputop.faces import LiveSnapshot
from gputop.snapshot import holder_to_dict
from gputop.units import fmt_bytes

FACE = "mcp"
INSTRUCTIONS = """gputop shows which processes hold each GPU on this machine, finds orphaned GPU jobs, and can kill
them, reap orphan trees or reset a GPU. Destructive tools preview what they would do unless called with
confirm=true; show the preview to the user and ask before confirming. Refusals (protected, unknown or
own-ancestor processes, a PID reused by another process) are final: do not try to work around them."""

_READ = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
_DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False,
                               open_world_hint=False)


def _call(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except GputopError as e:  # bad input: the model gets the one-line message
        raise ToolError(str(e)) from None


def build_server(live: LiveSnapshot) -> MCPServer:
    server = MCPServer("gputop", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    def fresh():
        return live.refresh()

    @server.tool(annotations=_READ)
    def gpu_status() -> dict[str, Any]:
        """Every GPU (utilisation, memory, temperature, power) and every GPU-holding process with its
        ancestry, context type (C/G/C+G) and orphan verdict; orphan trees under 'roots'."""
        return fresh().to_dict()

    @server.tool(annotations=_READ)
    def list_processes(gpu: int | None = None, user: str | None = None, name: str | None = None,
                       min_memory: str | None = None) -> dict[str, Any]:
        """GPU-holding processes, filtered by GPU index, user (exact), name (case-insensitive regex over the name or
        command line) and minimum GPU memory (bytes, or a size such as '4GiB'; holders above it)."""
        return _call(faces.processes_payload, fresh(), gpu=gpu, user=user, name=name, memory_gt=min_memory)

    @server.tool(annotations=_DESTRUCTIVE)
    def kill_process(pid: int, force: bool = False, confirm: bool = False,
                     start_time: float | None = None) -> dict[str, Any]:
        """Terminate one GPU-holding process (SIGTERM; with force, SIGKILL if it does not exit in time).
        Without confirm=true this only previews (the same safety checks, nothing is signalled).
        start_time (from gpu_status/list_processes) pins the exact process; a reused PID is refused."""
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
            out["preview"] = True
            out["next"] = ("nothing was done; call kill_process again with confirm=true to do it"
                           if res.ok else "refused: this process will not be killed")
        return out

    @server.tool(annotations=_DESTRUCTIVE)
    def reap_orphans(confirm: bool = False, roots: list[int] | None = None) -> dict[str, Any]:
        """Kill whole orphan trees (a job whose session died, still holding a GPU), from the topmost root
        down. All orphan trees, or only those whose root PID is in roots. Previews unless confirm=true."""
        fresh()
        results = _call(faces.do_reap, live, FACE, roots=roots, dry_run=not confirm,
                        grace=live.config.kill_timeout, reason="requested through MCP")
        out: dict[str, Any] = {"confirmed": bool(confirm), "count": len(results),
                               "ok": all(r["ok"] for r in results), "results": results}
        if not results:
            out["message"] = "no orphan trees hold a GPU now"
        if not confirm:
            out["preview"] = True
            out["next"] = "nothing was done; call reap_orphans again with confirm=true to reap these trees"
        return out

    @server.tool(annotations=_DESTRUCTIVE)
    def reset_gpu(index: int, confirm: bool = False, force: bool = False) -> dict[str, Any]:
        """Reset GPU `index`. Refused while processes hold it, unless force=true (they are killed first,
        through the same safe kill). Previews unless confirm=true."""
        snap = fresh()
        if not confirm:  # the same checks as a real reset (actions.reset_gpu), with nothing done
            dev = snap.device(index)
            if dev is None:
                raise ToolError(f"no GPU {index}: this host has {len(snap.devices)} GPU(s)")
            res = _call(faces.do_reset, live, FACE, index=index, force=force, dry_run=True,
                        reason="preview through MCP")
            would = res.message if res.ok else f"would refuse: {res.message}"
            return {"preview": True, "confirmed": False, "gpu": index, "name": dev.name, "message": would,
                    "holders": [holder_to_dict(h) for h in snap.holders_on(index)],
                    "next": "nothing was done; call reset_gpu again with confirm=true to do it"}
        res = _call(faces.do_reset, live, FACE, index=index, force=force, reason="requested through MCP")
        return res.to_dict() | {"confirmed": True}

    @server.tool(annotations=_READ)
    def audit_rogue() -> dict[str, Any]:
        """Suspicious GPU use: miner-like names, processes of unknown users, idle holders of much memory,
        and similar findings, each with a severity, the rule and the evidence."""
        fresh()
        return faces.rogue_payload(live)

    @server.tool(annotations=_READ)
    def guard_status() -> dict[str, Any]:
        """The guard: mode (off, dry-run, enforce), policy file and rules, daemon liveness, recent hits."""
        return _call(faces.guard_status)

    @server.tool(annotations=_DESTRUCTIVE)
    def guard_set_mode(mode: str, confirm: bool = False) -> dict[str, Any]:
        """Switch the guard mode: off, dry-run or enforce. Switching to enforce lets the guard kill
        processes by policy, so it needs confirm=true (off and dry-run do not)."""
        if mode == "enforce" and not confirm:
            from gputop.guard import state

            return {"preview": True, "confirmed": False, "mode": state.get_mode(),
                    "message": "would switch the guard to enforce: it will act on policy hits (kill processes)",
                    "next": "call guard_set_mode again with confirm=true to do it"}
        return _call(faces.do_guard_mode, FACE, mode)

    return server


def serve_stdio(live: LiveSnapshot) -> None:
    build_server(live).run("stdio")


def serve_http(live: LiveSnapshot, port: int) -> None:
    # Bound to loopback only: the MCP HTTP transport has no authentication of its own here.
    build_server(live).run("streamable-http", host="127.0.0.1", port=port)
