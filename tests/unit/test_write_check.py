"""gputop.core.requester.check_write, the one write rule of serve and mcp --http, over the peers the HTTP
protocol puts in the scope (a functional test cannot make another uid's process reach the 0700 socket
directory: the directory keeps it out first)."""

from __future__ import annotations

import os
import socket

import pytest

from gputop.core import requester
from gputop.core.requester import create_token

ME = os.geteuid()
OTHER = 61299 if ME != 61299 else 61298


def scope(peer: dict | None, client=("127.0.0.1", 40000)) -> dict:
    s = {"type": "http", "client": client}
    if peer is not None:
        s[requester.PEER_KEY] = peer
    return s


@pytest.fixture
def token(tmp_path):
    return tmp_path / "t", create_token(tmp_path / "t")


def test_unix_peer_of_the_servers_uid_or_root_writes_without_token(token):
    path, _ = token
    for uid in {ME, 0}:
        c = requester.check_write(scope({"transport": "unix", "uid": uid, "pid": 42}), "", path, "api")
        assert c.why is None and c.actor["uid"] == uid and c.actor["credential"] == "peer-uid"
        assert c.actor["pid"] == 42 and "client" not in c.actor


def test_unix_peer_of_another_uid_needs_the_token_and_is_named_by_its_uid(token):
    path, tok = token
    peer = {"transport": "unix", "uid": OTHER, "pid": 7}
    c = requester.check_write(scope(peer), "", path, "api")
    assert c.status == 401 and f"from uid {OTHER}" in c.why and c.actor["uid"] == OTHER
    c = requester.check_write(scope(peer), "Bearer " + tok, path, "api")
    assert c.why is None and c.actor["uid"] == OTHER and c.actor["credential"] == "token"
    c = requester.check_write(scope(peer), "", None, "api")
    assert c.status == 403 and "no token file" in c.why


def test_tcp_never_writes_without_the_token_and_records_no_uid(token):
    path, tok = token
    for peer in (None, {"transport": "tcp"}, {"transport": "tcp", "uid": ME}):  # a uid on TCP is ignored
        c = requester.check_write(scope(peer), "", path, "mcp-http")
        assert c.status == 401 and "over TCP" in c.why
        assert c.actor["uid"] is None and c.actor["user"] == "unknown uid, no token"
        assert c.actor["client"] == "127.0.0.1:40000"
    c = requester.check_write(scope(None), "Bearer " + tok[:-1] + "x", path, "api")
    assert c.status == 401 and c.actor["user"] == "unknown uid, wrong token"
    c = requester.check_write(scope(None), "bearer  " + tok + " ", path, "api")
    assert c.why is None and c.actor == {**c.actor, "uid": None, "user": "token holder", "credential": "token"}


def test_socket_peer_reads_so_peercred():
    a, b = socket.socketpair(socket.AF_UNIX)
    try:
        assert requester.socket_peer(a) == {"transport": "unix", "uid": ME, "gid": os.getegid(), "pid": os.getpid()}
    finally:
        a.close()
        b.close()
    t = socket.socket(socket.AF_INET)
    try:
        assert requester.socket_peer(t) == {"transport": "tcp"}
    finally:
        t.close()
    assert not hasattr(requester, "tcp_peer_uid")  # nothing reads /proc/net/tcp any more
