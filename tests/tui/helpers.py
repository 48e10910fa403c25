"""Helpers for the TUI tests: a frozen sampler over constructed snapshots, screen text, waiting."""

from __future__ import annotations

import asyncio
import time


def screen_text(app) -> str:
    """The screen as plain text, one line per row (what a user reads)."""
    strips = app.screen._compositor.render_strips()
    return "\n".join(s.text.rstrip() for s in strips)


async def wait_until(pilot, cond, timeout: float = 10.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await pilot.pause(step)
    return bool(cond())
