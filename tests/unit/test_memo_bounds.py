"""Memory held by the data layer's memos stays bounded as processes come and go (issue 13)."""

from __future__ import annotations

import gc
import tracemalloc
from types import SimpleNamespace

from gputop.core import orphans
from gputop.core.orphans import DEFAULT_PROTECT, DEFAULT_PROTECT_CMDLINE, compile_protect


def _proc(i: int, arg_len: int):
    # Another user's job: a unique, long command line (Linux allows 128 KiB an argument).
    argv0 = f"/opt/job{i}/" + "p" * arg_len
    return SimpleNamespace(pid=1000 + i, name=f"job{i}", cmdline=(argv0, "--run", f"{i}-" + "x" * arg_len),
                           sighup_ignored=False)


def test_protect_memos_do_not_keep_long_command_lines_of_exited_processes():
    protect, protect_cmdline = compile_protect(DEFAULT_PROTECT), compile_protect(DEFAULT_PROTECT_CMDLINE)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(1500):  # 1,500 processes that each ran once and exited (each ~16 KiB of text)
            assert orphans._protect_hit([_proc(i, 8192)], protect, False, protect_cmdline) is None
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert kept < 1 << 20, f"the protect memos keep {kept >> 20} MiB of exited processes' command lines"


def test_short_command_lines_are_still_memoised_and_still_match():
    protect, protect_cmdline = compile_protect(DEFAULT_PROTECT), compile_protect(DEFAULT_PROTECT_CMDLINE)
    kernel = SimpleNamespace(pid=7, name="python3", cmdline=("python3", "-m", "ipykernel_launcher", "-f", "k.json"),
                             sighup_ignored=False)
    before = orphans._cmdline_memo.cache_info().hits
    for _ in range(2):
        assert "ipykernel_launcher" in orphans._protect_hit([kernel], protect, False, protect_cmdline)
    assert orphans._cmdline_memo.cache_info().hits > before
    long_kernel = SimpleNamespace(pid=8, name="python3", sighup_ignored=False,
                                  cmdline=("python3", "-m", "ipykernel_launcher", "-f", "k" * 5000))
    assert "ipykernel_launcher" in orphans._protect_hit([long_kernel], protect, False, protect_cmdline)
    tmux = SimpleNamespace(pid=9, name="tmux: server", cmdline=("/usr/bin/" + "d" * 3000 + "/tmux",),
                           sighup_ignored=False)
    assert orphans._protect_hit([tmux], protect, False, None) is not None  # argv0's basename, unmemoised
