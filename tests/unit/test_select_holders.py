"""One selection rule for every face (CLI kill selectors, HTTP /v1/processes, MCP list_processes)."""

from __future__ import annotations

import pytest

from gputop.util.errors import UsageError
from gputop.core.model import select_holders
from tests.tui.helpers import frozen_snapshot


def pids(hs):
    return sorted(h.pid for h in hs)


def test_selectors_combine_and_name_is_a_case_insensitive_regex():
    snap = frozen_snapshot()
    everyone = pids(snap.holders)
    assert pids(select_holders(snap)) == everyone
    by_name = select_holders(snap, name="TRAIN")  # a plain word: a substring, any case
    assert by_name and all("train" in (h.name + h.cmd).lower() for h in by_name)
    assert pids(select_holders(snap, name=r"^python$")) == pids(h for h in snap.holders if h.name == "python")
    alice = select_holders(snap, user="alice")
    assert alice and all(h.user == "alice" for h in alice)
    both = select_holders(snap, user="alice", gpu=0)
    assert both and all(0 in h.gpus and h.user == "alice" for h in both)
    assert len(both) < len(everyone)


def test_unknown_memory_never_matches_a_memory_floor():
    snap = frozen_snapshot()
    big = select_holders(snap, memory_gt=1)
    assert big and all(h.gpu_memory is not None and h.gpu_memory > 1 for h in big)
    assert all(h.gpu_memory is not None for h in big)


def test_bad_pattern_is_a_usage_error():
    with pytest.raises(UsageError, match="bad name pattern"):
        select_holders(frozen_snapshot(), name="((")
