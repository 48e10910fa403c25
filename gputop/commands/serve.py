"""gputop serve: a local HTTP API (JSON) and Prometheus /metrics."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import stat
import sys
from pathlib import Path

from gputop.commands._common import config_from, open_sampler
from gputop.util.units import check_interval
from gputop.util.errors import GputopError, PermissionDeniedError, RefusedError, UnavailableError, UsageError

NAME = "serve"
HELP = "serve a local HTTP API and Prometheus /metrics (127.0.0.1 by default)"
DESCRIPTION = """Serve GET /v1/status, /v1/processes, /v1/audit/rogue, /v1/guard/status and /metrics, and
POST /v1/kill, /v1/reap, /v1/reset, /v1/guard/mode, on TCP and on a Unix socket (default
<state dir>/sockets/serve.sock, in a directory only you can enter). Through the Unix socket your own user
(and root) may write without a token: curl --unix-socket PATH -X POST -d '{"pid": N}' http://localhost/v1/kill.
Every other write, and every write over TCP, needs 'Authorization: Bearer TOKEN' where TOKEN is the content
of the token file (default <state dir>/api-token, mode 0600); --create-token writes one when there is none.
The audit log names the uid the kernel gives for the Unix socket, or "token holder" for TCP."""

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
    add_socket_arguments(p, "serve.sock")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also accept this Host header (e.g. the node's name behind a proxy); by default only "
                        "the bound address and localhost names are answered (421 otherwise: DNS rebinding)")


def add_socket_arguments(p, name: str) -> None:
    p.add_argument("--socket", metavar="PATH",
                   help=f"the Unix socket (default <state dir>/sockets/{name}); its directory must be yours and "
                        "closed to others (mode 0700): it is created so when missing")
    p.add_argument("--no-socket", action="store_true", help="offer no Unix socket (then every write needs the token)")


def default_socket_path(name: str) -> Path:
    from gputop.core.config import state_dir

    return state_dir() / "sockets" / name


def _check_socket_dir(fd: int, where: Path) -> None:
    st = os.fstat(fd)
    me = os.geteuid()
    if st.st_uid != me:
        raise RefusedError(f"socket directory {where} belongs to uid {st.st_uid}, not to you (uid {me}): "
                           "choose another --socket")
    if st.st_mode & 0o077:
        raise RefusedError(f"socket directory {where} has mode {stat.S_IMODE(st.st_mode):04o}: others could enter "
                           f"it; run 'chmod 700 {where}' or choose another --socket")


def listen_unix(path: Path) -> tuple[socket.socket, tuple[int, int]]:
    """A listening Unix socket at ``path``, mode 0600, in a directory owned by this user with no access for
    group or others (created 0700 when missing; an existing one that others own or may enter is refused).
    The directory is opened without following a symlink and the socket bound through that descriptor, so
    nobody can swap the directory between the check and the bind. A stale socket left by a dead server
    is replaced; a live one is refused. Returns the socket and the (st_dev, st_ino) of the socket file."""
    path = Path(path).expanduser().absolute()
    parent, name = path.parent, path.name
    if len(str(path).encode()) > 100:
        raise UsageError(f"the socket path {path} is too long for a Unix socket (at most 100 bytes): "
                         "choose a shorter --socket")
    try:
        os.makedirs(parent, mode=0o700, exist_ok=True)
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise RefusedError(f"cannot use socket directory {parent}: {e.strerror or e} (a symlink is refused)") from None
    try:
        _check_socket_dir(dfd, parent)
        via = f"/proc/self/fd/{dfd}/{name}"
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if not stat.S_ISSOCK(st.st_mode):
                raise RefusedError(f"{path} exists and is not a socket: remove it or choose another --socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(via)
                raise UnavailableError(f"another server listens on {path}: stop it or choose another --socket")
            except (ConnectionRefusedError, FileNotFoundError):
                os.unlink(name, dir_fd=dfd)  # a dead server's socket
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(via)
        except OSError as e:
            sock.close()
            raise UnavailableError(f"cannot listen on {path}: {e.strerror or e}") from None
        finally:
            os.umask(old)
        os.chmod(name, 0o600, dir_fd=dfd)
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        sock.listen(128)
        sock.set_inheritable(True)
        return sock, (st.st_dev, st.st_ino)
    finally:
        os.close(dfd)


def remove_unix(path: Path, ident: tuple[int, int]) -> None:
    """Remove the socket file at ``path`` if it is still the one this server bound."""
    try:
        st = os.stat(path, follow_symlinks=False)
        if (st.st_dev, st.st_ino) == ident:
            os.unlink(path)
    except OSError:
        pass


def open_unix(args, name: str) -> tuple[socket.socket | None, Path | None, tuple | None]:
    """The command's Unix socket (None with --no-socket): (socket, path, identity)."""
    if args.no_socket:
        if args.socket:
            raise UsageError("--socket and --no-socket contradict each other")
        return None, None, None
    path = Path(args.socket).expanduser() if args.socket else default_socket_path(name)
    sock, ident = listen_unix(path)
    return sock, path.absolute(), ident


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
    try:
        check_interval(args.interval)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.metrics_only and (args.create_token or args.token_file):
        raise UsageError("--metrics-only serves no action API: drop --create-token/--token-file")
    if args.read_only and args.create_token:
        raise UsageError("--read-only and --create-token contradict each other")
    # Listen first: a busy port or a wrong --bind fails at once, before a token file is created.
    sock = _listen(args.bind, args.port)
    unix = upath = ident = None
    try:
        if not args.metrics_only:
            unix, upath, ident = open_unix(args, "serve.sock")
        return _serve(args, sock, unix, upath, lambda: remove_unix(upath, ident) if unix is not None else None)
    finally:
        sock.close()
        if unix is not None:
            unix.close()
            remove_unix(upath, ident)


def resolve_token(args) -> tuple[Path | None, str]:
    """(the token file writes need, or None for read-only; a note saying so). Shared with 'mcp --http'."""
    from gputop.core.requester import create_token, default_token_path, read_token

    token_path: Path | None = Path(args.token_file).expanduser() if args.token_file else default_token_path()
    if getattr(args, "metrics_only", False):
        token_path, note = None, "metrics only: GET /metrics, no action API"
    elif getattr(args, "read_only", False):
        token_path, note = None, "read-only (--read-only)"
    else:
        token = read_token(token_path)  # refuses a token file others can read: the service does not start
        if token is None and args.create_token:
            create_token(token_path)
            note = f"writes over TCP need the bearer token in {token_path} (created, mode 0600)"
        elif token is None and args.token_file:
            raise UsageError(f"token file {token_path} does not exist; add --create-token to create it")
        elif token is None:
            note = f"no writes over TCP: no token file {token_path}; --create-token makes one"
            token_path = None
        else:
            note = f"writes over TCP need the bearer token in {token_path}"
    return token_path, note


def _serve(args, sock: socket.socket, unix: socket.socket | None, upath: Path | None, on_shutdown) -> int:
    from gputop.service import faces
    from gputop.service.faces import LiveSnapshot
    from gputop.service.api import allowed_hosts, create_app, run_server

    token_path, note = resolve_token(args)
    config = config_from(args)
    sampler = open_sampler(args, config)
    live = LiveSnapshot(sampler, config, interval=args.interval)
    try:
        live.start()
        host, port = sock.getsockname()[:2]
        hosts = allowed_hosts(host, port, tuple(args.allow_host))
        if args.metrics_only:
            from gputop.service.metrics import create_metrics_app

            app = create_metrics_app(live)  # no action API; a remote scraper needs no Host check
        else:
            app = create_app(live, token_path, hosts=hosts, read_only=args.read_only)
        shown = f"[{host}]" if ":" in host else host
        if unix is not None:
            who = "reads only (--read-only)" if args.read_only else "your own user may write without a token"
            print(f"gputop serve: Unix socket {upath}  ({who}: curl --unix-socket {upath} http://localhost/v1/status)",
                  file=sys.stderr, flush=True)
        print(f"gputop serve: listening on http://{shown}:{port}  ({note})", file=sys.stderr, flush=True)
        if not ipaddress.ip_address(host).is_loopback:
            print("gputop serve: warning: not bound to loopback; put TLS in front of it before sending a token "
                  "over the network", file=sys.stderr, flush=True)
        run_server(app, [sock] + ([unix] if unix is not None else []), "gputop serve", on_shutdown)
    finally:
        live.close()
        faces.REFUSALS.flush_all()  # the count of refusals coalesced in the last window
    return 0
