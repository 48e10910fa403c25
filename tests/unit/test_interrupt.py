"""gputop.actions.interrupt: SIGHUP/SIGTERM held during an action, raised again after it."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from gputop.actions import interrupt


@pytest.fixture
def seen():
    """A handler of our own for SIGHUP, standing in for the face's (or the default action)."""
    got: list[int] = []
    old = signal.signal(signal.SIGHUP, lambda s, f: got.append(s))
    yield got
    signal.signal(signal.SIGHUP, old)


def test_a_signal_during_the_action_is_held_then_raised_again_with_the_old_handler(seen):
    with interrupt.deferred():
        with interrupt.deferred():  # nested: the outermost one holds and raises
            os.kill(os.getpid(), signal.SIGHUP)
            assert interrupt.caught() == ["SIGHUP"] and seen == []
            assert interrupt.note("reaped") == {"signals": ["SIGHUP"], "then": "finished"}
        assert seen == []
    assert seen == [signal.SIGHUP] and interrupt.caught() == []
    assert interrupt.note("reaped") is None
    assert interrupt.note("interrupted") == {"signals": [], "then": "rolled back"}


def test_a_second_signal_raises_interrupted(seen):
    with pytest.raises(interrupt.Interrupted):
        with interrupt.deferred():
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGHUP)
            for _ in range(1000):  # the handler runs between bytecodes of the main thread
                pass
    assert seen == [signal.SIGHUP]


def test_off_the_main_thread_it_installs_nothing_and_counts_the_action(seen):
    started, release = threading.Event(), threading.Event()

    def worker():
        with interrupt.deferred():
            started.set()
            release.wait(10)

    t = threading.Thread(target=worker)
    t.start()
    started.wait(10)
    assert signal.getsignal(signal.SIGHUP) is not interrupt._handler
    assert not interrupt.idle(0.05)  # an action is in flight
    release.set()
    assert interrupt.idle(10)
    t.join()
