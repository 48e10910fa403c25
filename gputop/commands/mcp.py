"""gputop mcp: an MCP server for AI assistants (stdio; optionally streamable HTTP on 127.0.0.1)."""

from __future__ import annotations

import sys

from gputop.commands._common import config_from, open_sampler
from gputop.errors import UsageError

NAME = "mcp"
HELP = "run an MCP server for AI assistants (stdio, or --http on 127.0.0.1)"
DESCRIPTION = """Run an MCP server (official MCP SDK) with the tools gpu_status, list_processes, kill_process,
reap_orphans, reset_gpu, audit_rogue, guard_status and guard_set_mode. Destructive tools preview unless
called with confirm=true, make the same refusals as the CLI, and write the audit log (face "mcp").
Example client entry: {"command": "gputop", "args": ["mcp"]}."""


def add_arguments(p) -> None:
    p.add_argument("--http", action="store_true",
                   help="serve the streamable HTTP transport on 127.0.0.1 instead of stdio")
    p.add_argument("--port", type=int, default=8765, metavar="N", help="--http: port (default 8765)")


def run(args) -> int:
    from gputop.faces import LiveSnapshot
    from gputop.mcp_server import serve_http, serve_stdio

    if args.http and not 0 < args.port <= 65535:
        raise UsageError(f"--port must be between 1 and 65535, got {args.port}")
    config = config_from(args)
    live = LiveSnapshot(open_sampler(args, config), config)
    try:
        if args.http:
            print(f"gputop mcp: streamable HTTP on http://127.0.0.1:{args.port}/mcp", file=sys.stderr, flush=True)
            serve_http(live, args.port)
        else:
            serve_stdio(live)
    finally:
        live.close()
    return 0
