"""gputop mcp: an MCP server for AI assistants (stdio; optionally streamable HTTP on 127.0.0.1)."""

from __future__ import annotations

import socket
import sys

from gputop.commands._common import config_from, open_sampler
from gputop.errors import UsageError

NAME = "mcp"
HELP = "run an MCP server for AI assistants (stdio, or --http on 127.0.0.1)"
DESCRIPTION = """Run an MCP server (official MCP SDK) with the tools gpu_status, list_processes, kill_process,
reap_orphans, reset_gpu, audit_rogue, guard_status and guard_set_mode. Destructive tools preview unless
called with confirm=true, make the same refusals as the CLI, and write the audit log (face "mcp").
Example client entry: {"command": "gputop", "args": ["mcp"]}."""

DEFAULT_PORT = 8765


def add_arguments(p) -> None:
    p.add_argument("--http", action="store_true",
                   help="serve the streamable HTTP transport on 127.0.0.1 instead of stdio")
    p.add_argument("--port", type=int, default=None, metavar="N", help=f"--http: port (default {DEFAULT_PORT})")


def _check_port(port: int) -> None:
    """Fail with one line, before anything starts, when the port cannot be bound (uvicorn would print a log
    line and exit 1 after we had already announced the server)."""
    from gputop.commands.serve import bind_error

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as e:
        raise bind_error("127.0.0.1", port, e, bind_option=None) from None
    finally:
        sock.close()


def run(args) -> int:
    from gputop.faces import LiveSnapshot
    from gputop.mcp_server import serve_http, serve_stdio

    if args.port is not None and not args.http:
        raise UsageError("--port goes with --http (the default transport is stdio): gputop mcp --http --port N")
    port = DEFAULT_PORT if args.port is None else args.port
    if args.http:
        if not 0 < port <= 65535:
            raise UsageError(f"--port must be between 1 and 65535, got {port}")
        _check_port(port)
    config = config_from(args)
    live = LiveSnapshot(open_sampler(args, config), config)
    try:
        if args.http:
            print(f"gputop mcp: streamable HTTP on http://127.0.0.1:{port}/mcp", file=sys.stderr, flush=True)
            serve_http(live, port)
        else:
            serve_stdio(live)
    finally:
        live.close()
    return 0
