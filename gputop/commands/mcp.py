"""gputop mcp: an MCP server for AI assistants (stdio; optionally streamable HTTP on 127.0.0.1)."""

from __future__ import annotations

import sys

from gputop.commands._common import config_from, open_sampler
from gputop.commands.serve import add_socket_arguments
from gputop.util.errors import UsageError

NAME = "mcp"
HELP = "run an MCP server for AI assistants (stdio, or --http on 127.0.0.1)"
DESCRIPTION = """Run an MCP server (official MCP SDK) with the tools gpu_status, list_processes, kill_process,
reap_orphans, reset_gpu, audit_rogue, guard_status and guard_set_mode. Destructive tools preview unless
called with confirm=true, make the same refusals as the CLI, and write the audit log (face "mcp").
With --http it also listens on a Unix socket (default <state dir>/sockets/mcp.sock, in a directory only
you can enter): there your own user (and root) may write without a token. Every other write, and every
write over TCP, needs the bearer token of 'gputop serve' (the same token file). The audit log names the
uid the kernel gives for the Unix socket, or "token holder" for TCP.
Example client entry: {"command": "gputop", "args": ["mcp"]}."""

DEFAULT_PORT = 8765


def add_arguments(p) -> None:
    p.add_argument("--http", action="store_true",
                   help="serve the streamable HTTP transport on 127.0.0.1 instead of stdio")
    p.add_argument("--port", type=int, default=None, metavar="N",
                   help=f"--http: port (default {DEFAULT_PORT}; 0 picks a free one and prints it)")
    p.add_argument("--token-file", metavar="FILE",
                   help="--http: bearer token file for writes (default <state dir>/api-token, as serve)")
    p.add_argument("--create-token", action="store_true",
                   help="--http: create the token file (mode 0600) with a random token if it does not exist")
    add_socket_arguments(p, "mcp.sock")


def run(args) -> int:
    from gputop.service.faces import LiveSnapshot

    if not args.http and (args.port is not None or args.token_file or args.create_token or args.socket
                          or args.no_socket):
        raise UsageError("--port goes with --http, as do --token-file, --create-token, --socket and --no-socket "
                         "(the default transport is stdio): gputop mcp --http --port N")
    port = DEFAULT_PORT if args.port is None else args.port
    sock = token_path = note = unix = upath = ident = None
    try:
        if args.http:
            from gputop.commands.serve import _listen, open_unix, remove_unix, resolve_token

            sock = _listen("127.0.0.1", port)  # a busy port fails here with one line, before anything starts
            token_path, note = resolve_token(args)
            unix, upath, ident = open_unix(args, "mcp.sock")
        config = config_from(args)
        live = LiveSnapshot(open_sampler(args, config), config)
        try:
            if sock is not None:
                _serve_http(live, sock, token_path, note, unix, upath,
                            lambda: remove_unix(upath, ident) if unix is not None else None)
            else:
                _serve_stdio(live)
        finally:
            live.close()
            from gputop.service.faces import REFUSALS

            REFUSALS.flush_all()  # the count of refusals coalesced in the last window
    finally:
        if sock is not None:
            sock.close()
        if unix is not None:
            from gputop.commands.serve import remove_unix

            unix.close()
            remove_unix(upath, ident)
    return 0


def _serve_stdio(live) -> None:
    from gputop.service.mcp_server import serve_stdio

    if sys.stdin.isatty():
        print("gputop mcp: an MCP server on stdio, waiting for a client (an AI assistant starts it with "
              "'gputop mcp'); Ctrl-C to quit, 'gputop mcp --http' for HTTP", file=sys.stderr, flush=True)
    serve_stdio(live)


def _serve_http(live, sock, token_path, note: str, unix, upath, on_shutdown) -> None:
    from gputop.service.mcp_server import http_app
    from gputop.service.api import run_server

    port = sock.getsockname()[1]
    if unix is not None:
        print(f"gputop mcp: Unix socket {upath}  (your own user may write without a token)",
              file=sys.stderr, flush=True)
    print(f"gputop mcp: streamable HTTP on http://127.0.0.1:{port}/mcp  ({note})", file=sys.stderr, flush=True)
    run_server(http_app(live, token_path), [sock] + ([unix] if unix is not None else []), "gputop mcp", on_shutdown)
