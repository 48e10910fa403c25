"""gputop_up follows the sampler thread: 0 once it has died."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gputop.core.config import Config
from gputop.service.faces import LiveSnapshot
from gputop.service.api import FindingCounter, GuardHitCounter, SnapshotCollector
from tests.tui.helpers import frozen_snapshot


class OneSnapshot:
    def sample(self):
        return frozen_snapshot()

    def close(self):
        pass


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_gputop_up_goes_to_0_when_the_sampler_thread_dies():
    live = LiveSnapshot(OneSnapshot(), Config(), interval=float("inf"))  # Event.wait(inf) raises: the thread dies
    live.start()
    live._thread.join(5)
    assert not live._thread.is_alive()
    assert live.error and "sampler thread stopped" in live.error
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(live, FindingCounter(), GuardHitCounter()))
    assert b"gputop_up 0.0" in generate_latest(reg)
    live.close()
    assert live.error is None  # closed on purpose: not an error
