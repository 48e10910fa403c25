"""core.sampler.LockedSampler: the one wrapper that shares a sampler between threads (a face's sampling
thread, its action threads, kill_many's parallel kills), and the lookups an action takes from it."""

from __future__ import annotations

import threading
import time

from gputop.core.config import Config
from gputop.core.sampler import LockedSampler
from gputop.core.verdicts import Lookups
from gputop.service.faces import LiveSnapshot
from tests.tui.helpers import frozen_snapshot


class Overlaps:
    """A sampler whose calls take a while and count how many run at once."""

    def __init__(self):
        self.now = self.most = 0
        self.count = threading.Lock()
        self.closed = False
        self.platform = "posix"

    def _call(self, out):
        with self.count:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.01)
        with self.count:
            self.now -= 1
        return out

    def sample(self):
        return self._call(frozen_snapshot())

    def sample_devices(self):
        return self._call(())

    def reset(self, index):
        return self._call(f"reset {index}")

    def lookups(self):
        return Lookups(owner_of=lambda proc: self._call(("owner", proc)), job_state=lambda job: self._call(job))

    def close(self):
        self.closed = True


def test_calls_from_many_threads_run_one_at_a_time():
    inner = Overlaps()
    shared = LockedSampler(inner)
    look = shared.lookups()
    calls = [shared.sample, shared.sample_devices, lambda: shared.reset(1), lambda: look.owner_of(7),
             lambda: look.job_state(3)]
    threads = [threading.Thread(target=calls[i % len(calls)]) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert inner.most == 1  # never two calls into the sampler at once
    assert look.job_of is None  # what the sampler does not look up stays unset
    assert look.owner_of(7) == ("owner", 7) and shared.reset(2) == "reset 2"


def test_a_lookup_waits_while_another_thread_holds_the_lock():
    shared = LockedSampler(Overlaps())
    look = shared.lookups()
    done = threading.Event()
    with shared.lock:
        t = threading.Thread(target=lambda: (look.owner_of(1), done.set()))
        t.start()
        assert not done.wait(0.3)  # the reap planner's lookup waits for the sampling thread
    assert done.wait(20)
    t.join(20)


def test_the_lock_is_reentrant_so_a_face_can_hold_it_across_an_action():
    shared = LockedSampler(Overlaps())
    out = []

    def action():
        with shared.lock:  # a face holds the lock while the action runs ...
            out.append(shared.sample())  # ... and the action samples through the same wrapper
            out.append(shared.lookups().owner_of(5))
    t = threading.Thread(target=action, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive() and len(out) == 2


def test_other_attributes_are_the_samplers_and_a_wrapper_is_not_wrapped_twice():
    inner = Overlaps()
    shared = LockedSampler(inner)
    assert shared.platform == "posix" and shared.inner is inner
    assert LockedSampler.around(shared) is shared and LockedSampler.around(inner) is not shared
    shared.close()
    assert inner.closed


def test_the_service_faces_share_their_sampler_through_it():
    inner = Overlaps()
    live = LiveSnapshot(inner, Config())
    assert isinstance(live.sampler, LockedSampler) and live.sampler.inner is inner
    assert live.lock is live.sampler.lock  # one lock for the refresh thread and the actions
    assert LiveSnapshot(live.sampler, Config()).sampler is live.sampler
    assert live.refresh() is not None
    live.close()
    assert inner.closed
