"""Device node numbers for the memory-ledger tests: the device-file scan reads the whole host's /proc, so
two tests running at once (pytest-xdist, or another checkout's suite) must never hold the same 195:N.
``claim_minor()`` takes a minor in 100..250 under an flock of its own file in the system temp dir (the
kernel drops the lock if the test process dies); ``release_minors()`` gives back this process's claims."""

from __future__ import annotations

import fcntl
import os
import random
import tempfile

LOCKS = os.path.join(tempfile.gettempdir(), "gputop-test-minors")
_held: list[int] = []  # fds of this process's claims


def claim_minor() -> int:
    os.makedirs(LOCKS, mode=0o777, exist_ok=True)
    minors = list(range(100, 251))
    random.shuffle(minors)
    for m in minors:
        fd = os.open(os.path.join(LOCKS, str(m)), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _held.append(fd)
        return m
    raise RuntimeError("every test minor 100..250 is claimed by a running test")


def release_minors() -> None:
    while _held:
        os.close(_held.pop())  # closing the fd drops the flock
