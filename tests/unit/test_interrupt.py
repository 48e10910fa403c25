"""gputop.actions.interrupt: SIGHUP/SIGTERM held during an action, raised again after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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
            assert interrupt.finished_note() == "; interrupted by SIGHUP: the confirmed plan was carried out to its end"
        assert seen == []
    assert seen == [signal.SIGHUP] and interrupt.caught() == []
    assert interrupt.note("reaped") is None and interrupt.finished_note() == ""
    assert interrupt.note("interrupted") == {"signals": [], "then": "rolled back"}


def test_a_second_signal_raises_interrupted_where_it_would_have_ended_the_process():
    # SIGHUP's default action ends the process: run it in a child, which must roll back, then die of it.
    code = ("import os, signal\n"
            "from gputop.actions import interrupt\n"
            "with interrupt.deferred():\n"
            "    try:\n"
            "        os.kill(os.getpid(), signal.SIGHUP)\n"
            "        os.kill(os.getpid(), signal.SIGHUP)\n"
            "        for _ in range(100000): pass\n"
            "    except interrupt.Interrupted:\n"
            "        print('rolled back', flush=True)\n"
            "print('not reached', flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    assert r.stdout == "rolled back\n" and r.returncode == -signal.SIGHUP, (r.stdout, r.stderr)


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


def test_a_face_with_its_own_handler_is_never_rolled_back(seen):
    # seen: a handler of the face's own (the guard daemon's reload): two signals, no Interrupted.
    with interrupt.deferred():
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(1000):
            pass
        assert interrupt.caught() == ["SIGHUP", "SIGHUP"]
    assert seen == [signal.SIGHUP]
