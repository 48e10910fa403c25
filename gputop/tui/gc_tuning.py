"""The cyclic collector's young-generation threshold while a full-screen view runs (the node view and the
fleet view; the fleet view must not import the node view's app, a tenth of a second of start-up).

A refresh allocates and frees a few thousand objects (the fleet view ~100,000 at 1,000 nodes), so at
Python's default of 700 a young-generation collection ran almost every second (28 a minute at 16 holders,
~2% of the TUI's instructions; ~20% of the fleet view's CPU) and found nothing to free: steady refreshes
make no reference cycles (tests/tui/test_gc.py). Cycles made elsewhere are still collected, every 10,000
net allocations instead of 700. Put back when the view unmounts.
"""

from __future__ import annotations

import gc

GC_GEN0 = 10_000


def raise_gen0() -> tuple[int, ...]:
    """Raise the first threshold to GC_GEN0 (never lower it); returns the thresholds to put back."""
    saved = gc.get_threshold()
    gc.set_threshold(max(GC_GEN0, saved[0]), *saved[1:])
    return saved


def restore(saved: tuple[int, ...] | None) -> None:
    if saved is not None:
        gc.set_threshold(*saved)
