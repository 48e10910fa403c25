"""A zombie is never killed: it has exited already, and what it holds (a GPU's memory, when the driver
still lists it) goes only when its parent waits for it or exits. ``zombie_refusal`` says so, naming the
parent and the parent's verdict, for the kill path (gputop.actions.kill) to refuse with."""

from __future__ import annotations

from gputop.actions.common import name, user
from gputop.core.procs import ProcTable, read_proc


def zombie_refusal(pid: int, ctx) -> tuple[str, str, dict | None]:
    """(rule, message, the parent as a record or None) for a kill of zombie ``pid``."""
    info = read_proc(pid)
    ppid = info.ppid if info is not None else 0
    parent = read_proc(ppid) if ppid > 0 else None
    if parent is None:
        return "zombie", (f"pid {pid} is a zombie (it has exited): no signal can end it, and its parent "
                          f"(pid {ppid or '?'}) cannot be seen here; the memory it holds goes when that parent "
                          "waits for it or exits"), None
    verdict = None
    if ctx is not None:
        try:
            verdict = ctx.classifier(ProcTable())(parent.pid)
        except Exception:
            verdict = None
    said = f"; the parent's verdict: {verdict.kind} ({verdict.reason})" if verdict is not None else ""
    record = {"pid": parent.pid, "start_time": parent.start_time, "name": parent.name, "user": parent.user,
              "verdict": verdict.kind if verdict is not None else None}
    return "zombie", (f"pid {pid} is a zombie (it has exited): no signal can end it; only its parent pid "
                      f"{parent.pid} ({name(parent)}, user {user(parent)}) frees what it holds, by waiting "
                      f"for it or by exiting{said}. To free it: gputop kill --pid {parent.pid}"), record
