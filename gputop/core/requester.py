"""Who asked, and may they write: the actor every audit record names while a request is served.

``gputop serve`` and ``gputop mcp --http`` run as one user and act for whoever connects. Only what the
kernel says about a connection is trusted:

- On the Unix socket, SO_PEERCRED gives the uid and pid of the process that connected (taken when it
  connected; closing the socket early changes nothing). A peer whose uid is the server's own, or root,
  may write without a token; any other uid needs the bearer token. The record names that uid.
- Over TCP nothing says who is on the other end (/proc/net/tcp lists a closed socket's TIME_WAIT entry
  as uid 0, and proxy headers are whatever the client wrote), so every TCP write needs the bearer token,
  and the record names "the token holder" with the client's address and ``uid: null``.

The HTTP protocol (gputop.service.api.GuardedProtocol) reads the peer credential when the connection is made
and puts it in the ASGI scope under ``PEER_KEY``; a scope without it is treated as TCP.
While a request is handled its actor is set here (``acting_for``) and ``auditlog.actor()`` records it.
"""

from __future__ import annotations

import contextlib
import contextvars
import hmac
import os
import secrets
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from gputop.core.config import state_dir
from gputop.util.errors import RefusedError, UsageError

_CURRENT: contextvars.ContextVar[dict | None] = contextvars.ContextVar("gputop_requester", default=None)

PEER_KEY = "gputop.peer"  # the ASGI scope key holding socket_peer()'s answer
TCP_PEER = {"transport": "tcp"}
TOKEN_FILE = "api-token"


def current() -> dict | None:
    """The actor for the request being served, or None (then the process's own user acts)."""
    return _CURRENT.get()


@contextlib.contextmanager
def acting_for(actor: dict | None):
    token = _CURRENT.set(actor)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def socket_peer(sock) -> dict:
    """What the kernel says about the other end of an accepted connection: for a Unix socket the
    SO_PEERCRED uid, gid and pid; for TCP nothing but that it is TCP."""
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return dict(TCP_PEER)
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return {"transport": "unix", "uid": None}
    pid, uid, gid = struct.unpack("3i", raw)
    return {"transport": "unix", "uid": uid, "gid": gid, "pid": pid}


def server_uid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None


def peer_may_write_without_token(peer: dict) -> bool:
    """The Unix socket's peer is the server's own user, or root (who may enter any directory and act as
    any user anyway). Nothing over TCP qualifies."""
    uid = peer.get("uid")
    return peer.get("transport") == "unix" and uid is not None and uid in (server_uid(), 0)


def request_actor(scope: dict, via: str, credential: str | None = None) -> dict:
    """The audit actor for a request. ``credential``: "peer-uid" or "token" when the request may write,
    "bad-token" when it presented a wrong one, None when it presented none (or only reads)."""
    from gputop.core.procs import user_name

    peer = scope.get(PEER_KEY) or TCP_PEER
    me = server_uid()
    out: dict = {"via": via, "transport": peer.get("transport", "tcp")}
    if out["transport"] == "unix":
        uid = peer.get("uid")
        out.update(user=user_name(uid) if uid is not None else "?", uid=uid, pid=peer.get("pid"))
    else:
        # The kernel does not say who is behind a TCP connection: no uid is recorded, ever.
        out.update(uid=None, user={"token": "token holder", "bad-token": "unknown uid, wrong token"}.get(
            credential or "", "unknown uid, no token"))
        client = scope.get("client")
        if client:
            out["client"] = f"{client[0]}:{client[1]}"
    if credential:
        out["credential"] = credential
    out.update(server_uid=me, server_user=user_name(me) if me is not None else None)
    return out


@dataclass(frozen=True)
class WriteCheck:
    """The answer to "may this request write": ``why`` is None when it may; ``status`` is the HTTP code of
    the refusal (401 no or wrong token, 403 writes disabled); ``rule`` names it in the audit log."""

    actor: dict
    why: str | None = None
    rule: str | None = None
    status: int = 200


def check_write(scope: dict, authorization: str, token_path: Path | None, via: str) -> WriteCheck:
    """One rule for serve and mcp --http: a Unix socket peer of the server's uid (or root) may write;
    anyone else needs ``Authorization: Bearer <token in token_path>``, compared in constant time."""
    from gputop.util.errors import GputopError

    peer = scope.get(PEER_KEY) or TCP_PEER
    if peer_may_write_without_token(peer):
        return WriteCheck(request_actor(scope, via, "peer-uid"))
    scheme, _, given = (authorization or "").partition(" ")
    given = given.strip() if scheme.lower() == "bearer" else ""
    where = ("over TCP" if peer.get("transport") != "unix"
             else f"from uid {peer.get('uid')} (not the server's user) on the Unix socket")
    if token_path is None:
        return WriteCheck(request_actor(scope, via), rule="no-token-file", status=403,
                          why=f"writes {where} need a bearer token, and this server has no token file "
                              "(start it with --create-token); its own user may write through its Unix socket")
    try:
        token = read_token(token_path)
    except GputopError as e:
        return WriteCheck(request_actor(scope, via), why=f"writes are disabled: {e}", rule="token-file", status=403)
    if token is None:
        return WriteCheck(request_actor(scope, via), rule="token-file", status=403,
                          why=f"writes are disabled: the token file {token_path} is gone")
    if given and hmac.compare_digest(given.encode(), token.encode()):
        return WriteCheck(request_actor(scope, via, "token"))
    if given:
        return WriteCheck(request_actor(scope, via, "bad-token"), rule="token", status=401,
                          why=f"wrong bearer token: send 'Authorization: Bearer <contents of {token_path}>'")
    return WriteCheck(request_actor(scope, via), rule="token", status=401,
                      why=f"missing bearer token: writes {where} need "
                          f"'Authorization: Bearer <contents of {token_path}>'")


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
