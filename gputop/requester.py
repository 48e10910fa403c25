"""Who asked: the actor every audit record names while a request from another process is served.

``gputop serve`` and ``gputop mcp --http`` run as one user and act for whoever connects. While they
handle a request they set the requester here (``acting_for``), and ``auditlog.actor()`` records that
requester (its uid, found from the kernel's socket table) instead of the uid the server runs as; the
server's own uid is kept beside it as ``server_uid``.

``tcp_peer_uid`` finds the uid that owns the other end of a loopback TCP connection: /proc/net/tcp and
tcp6 list every socket with its owner, and the client's socket is the one whose local address is the
connection's remote address. For a client on another host it is None (unknown).
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import os
import sys

_CURRENT: contextvars.ContextVar[dict | None] = contextvars.ContextVar("gputop_requester", default=None)


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


def _hex_addr(host: str, port: int) -> tuple[str, str] | None:
    """(v4 form, v6 form) of ``host:port`` as /proc/net/tcp{,6} print it (host byte order per 32 bits)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    v6 = ip if ip.version == 6 else ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    words = [v6.packed[i:i + 4] for i in range(0, 16, 4)]
    six = "".join(format(int.from_bytes(w, sys.byteorder), "08X") for w in words) + f":{port:04X}"
    v4 = ip if ip.version == 4 else v6.ipv4_mapped
    four = f"{format(int.from_bytes(v4.packed, sys.byteorder), '08X')}:{port:04X}" if v4 is not None else None
    return four, six


def tcp_peer_uid(peer: tuple[str, int] | None, local: tuple[str, int] | None) -> int | None:
    """The uid owning the socket at ``peer`` that is connected to our ``local`` address, when it is on
    this host (loopback); None when it cannot be found."""
    if not peer or not local:
        return None
    a, b = _hex_addr(peer[0], int(peer[1])), _hex_addr(local[0], int(local[1]))
    if a is None or b is None:
        return None
    for table, idx in (("/proc/net/tcp", 0), ("/proc/net/tcp6", 1)):
        want = (a[idx], b[idx])
        if None in want:
            continue
        try:
            with open(table, encoding="ascii", errors="replace") as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) > 7 and parts[1] == want[0] and parts[2] == want[1]:
                        return int(parts[7])
        except (OSError, ValueError):
            continue
    return None


def http_actor(client: tuple[str, int] | None, server: tuple[str, int] | None, via: str) -> dict:
    """The audit actor for an HTTP request: the uid behind the client's socket, the server's own uid."""
    from gputop.procs import user_name

    uid = tcp_peer_uid(client, server)
    me = os.geteuid() if hasattr(os, "geteuid") else None
    out: dict = {"user": user_name(uid) if uid is not None else "?", "uid": uid, "via": via,
                 "server_uid": me, "server_user": user_name(me) if me is not None else None}
    if client:
        out["client"] = f"{client[0]}:{client[1]}"
    return out
