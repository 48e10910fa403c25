"""Would the kernel let this process do it? The permission side of a preview.

A dry run in gputop.actions makes every safety check (identity, protected, unknown, own ancestors) but
sends no signal, so it cannot learn that the signal itself would be refused. A preview that says "would
send SIGTERM" when the real call gets EPERM is a lie; the faces ask here first. ``os.kill(pid, 0)`` makes
exactly the kernel's permission check for a signal, and sends nothing. (A GPU reset's preview is the
core reset dry run itself: gputop.actions.reset.reset_rights and signal_blockers.)
"""

from __future__ import annotations

import os
from typing import Iterable


def _owner(pid: int) -> str:
    try:
        from gputop.core.procs import user_name

        return user_name(os.stat(f"/proc/{pid}").st_uid)
    except (OSError, ImportError):
        return "?"


def signal_refusal(pid: int) -> str | None:
    """Why a signal to ``pid`` from this process would be refused, or None (allowed, or already gone)."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        me = os.geteuid()
        return (f"permission denied: no permission to signal pid {pid} (user {_owner(pid)}) as uid {me}; "
                "run as that user or as root")
    except (ProcessLookupError, OSError):
        return None
    return None


def first_signal_refusal(pids: Iterable[int]) -> str | None:
    for pid in pids:
        why = signal_refusal(pid)
        if why is not None:
            return why
    return None
