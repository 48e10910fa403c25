"""The HTTP API's token file: created 0600, refused when others can read it, a symlink, or empty."""

from __future__ import annotations

import os
import stat

import pytest

from gputop.util.errors import RefusedError, UsageError
from gputop.core.requester import create_token, read_token


def test_create_then_read(tmp_path):
    p = tmp_path / "state" / "api-token"
    tok = create_token(p)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert read_token(p) == tok
    with pytest.raises(UsageError):
        create_token(p)  # never overwritten


def test_missing_is_none(tmp_path):
    assert read_token(tmp_path / "nope") is None


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o666])
def test_loose_mode_refused(tmp_path, mode):
    p = tmp_path / "t"
    create_token(p)
    os.chmod(p, mode)
    with pytest.raises(RefusedError, match="chmod 600"):
        read_token(p)


def test_symlink_and_short_token_refused(tmp_path):
    real = tmp_path / "real"
    create_token(real)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(RefusedError):
        read_token(link)
    short = tmp_path / "short"
    fd = os.open(short, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"abc\n")
    os.close(fd)
    with pytest.raises(RefusedError, match="no usable token"):
        read_token(short)
