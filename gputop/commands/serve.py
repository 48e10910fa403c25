"""gputop serve: a local HTTP API (JSON) and Prometheus /metrics."""

from __future__ import annotations

import errno
import math
import ipaddress
import socket
import sys
from pathlib import Path

from gputop.commands._common import config_from, open_sampler
from gputop.errors import GputopError, PermissionDeniedError, UnavailableError, UsageError

NAME = "serve"
HELP = "serve a local HTTP API and Prometheus /metrics (127.0.0.1 by default)"
DESCRIPTION = """Serve GET /v1/status, /v1/processes, /v1/audit/rogue, /v1/guard/status and /metrics, and
POST /v1/kill, /v1/reap, /v1/reset, /v1/guard/mode. Writes need 'Authorization: Bearer TOKEN' where TOKEN is
the content of the token file (default <state dir>/api-token, which must be mode 0600); with no token file
the service is read-only. --create-token writes a new token file (0600) when there is none."""

DEFAULT_PORT = 9407


def add_arguments(p) -> None:
    p.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                   help="address to listen on (default 127.0.0.1; anything else exposes the API to the network)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="N",
                   help=f"port (default {DEFAULT_PORT}; 0 picks a free one and prints it)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between samples (default 1)")
    p.add_argument("--token-file", metavar="FILE", help="bearer token file (default <state dir>/api-token)")
    p.add_argument("--create-token", action="store_true",
                   help="create the token file (mode 0600) with a random token if it does not exist")
    p.add_argument("--read-only", action="store_true", help="refuse every write, even with a token file")
    p.add_argument("--metrics-only", action="store_true",
                   help="serve only GET /metrics (no action API, no token): for Prometheus scraping from "
                        "other hosts")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also accept this Host header (e.g. the node's name behind a proxy); by default only "
                        "the bound address and localhost names are answered (421 otherwise: DNS rebinding)")


def bind_error(host: str, port: int, e: OSError, bind_option: str | None) -> GputopError:
    """A one-line error for a failed bind that says what to change (also used by 'gputop mcp --http')."""
    what = f"cannot listen on {host}:{port}: {e.strerror or e}"
    if e.errno == errno.EADDRINUSE:
        return UnavailableError(f"{what}; another program uses that port: choose another --port"
                                + (" (or --port 0 for a free one)" if bind_option else ""))
    if e.errno in (errno.EACCES, errno.EPERM):
        return PermissionDeniedError(f"{what}; ports below 1024 need root: choose --port 1024 or above")
    if bind_option and (isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL):
        return UsageError(f"{what}; {bind_option} must be an address of this machine (default 127.0.0.1)")
    return UnavailableError(what)


def _listen(bind: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {port}")
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(bind).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind, port))
    except OSError as e:
        sock.close()
        raise bind_error(bind, port, e, bind_option="--bind") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def run(args) -> int:
    if not math.isfinite(args.interval) or args.interval <= 0:
        raise UsageError(f"--interval must be a positive number of seconds, got {args.interval}")
    if args.metrics_only and (args.create_token or args.token_file):
        raise UsageError("--metrics-only serves no action API: drop --create-token/--token-file")
    if args.read_only and args.create_token:
        raise UsageError("--read-only and --create-token contradict each other")
    # Listen first: a busy port or a wrong --bind fails at once, before a token file is created.
    sock = _listen(args.bind, args.port)
    try:
        return _serve(args, sock)
    finally:
        sock.close()


def resolve_token(args) -> tuple[Path | None, str]:
    """(the token file writes need, or None for read-only; a note saying so). Shared with 'mcp --http'."""
    from gputop.serve import create_token, default_token_path, read_token

    token_path: Path | None = Path(args.token_file).expanduser() if args.token_file else default_token_path()
    if getattr(args, "metrics_only", False):
        token_path, note = None, "metrics only: GET /metrics, no action API"
    elif getattr(args, "read_only", False):
        token_path, note = None, "read-only (--read-only)"
    else:
        token = read_token(token_path)  # refuses a token file others can read: the service does not start
        if token is None and args.create_token:
            create_token(token_path)
            note = f"writes need the bearer token in {token_path} (created, mode 0600)"
        elif token is None and args.token_file:
            raise UsageError(f"token file {token_path} does not exist; add --create-token to create it")
        elif token is None:
            note = f"read-only (no token file {token_path}; --create-token makes one)"
            token_path = None
        else:
            note = f"writes need the bearer token in {token_path}"
    return token_path, note


def _serve(args, sock: socket.socket) -> int:
    import uvicorn

    from gputop import faces
    from gputop.faces import LiveSnapshot
    from gputop.serve import allowed_hosts, create_app

    token_path, note = resolve_token(args)
    config = config_from(args)
    sampler = open_sampler(args, config)
    live = LiveSnapshot(sampler, config, interval=args.interval)
    try:
        live.start()
        host, port = sock.getsockname()[:2]
        hosts = allowed_hosts(host, port, tuple(args.allow_host))
        if args.metrics_only:
            from gputop.metrics import create_metrics_app

            app = create_metrics_app(live)  # no action API; a remote scraper needs no Host check
        else:
            app = create_app(live, token_path, hosts=hosts)
        shown = f"[{host}]" if ":" in host else host
        print(f"gputop serve: listening on http://{shown}:{port}  ({note})", file=sys.stderr, flush=True)
        if not ipaddress.ip_address(host).is_loopback:
            print("gputop serve: warning: not bound to loopback; put TLS in front of it before sending a token "
                  "over the network", file=sys.stderr, flush=True)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
        server.run(sockets=[sock])
    finally:
        live.close()
        faces.REFUSALS.flush_all()  # the count of refusals coalesced in the last window
    return 0
