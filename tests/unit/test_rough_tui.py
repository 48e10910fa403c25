"""Issue 32, pure pieces: refusals quote the real protect pattern, the plot fills its widget and draws
nothing past its frame, the top bar keeps its clock, filtered groups say "N of M shown", sensors keep
their columns."""

from __future__ import annotations

import dataclasses
import time

from gputop.backends.base import DeviceSample
from gputop.core.orphans import DEFAULT_PROTECT, DEFAULT_PROTECT_CMDLINE, PROTECTED, classify, compile_protect
from tests.tui.helpers import frozen_snapshot
from tests.unit.test_orphans import INIT, P, Table


def test_a_refusal_quotes_the_protect_cmdline_pattern_not_the_text_it_matched():
    kernel = "/usr/bin/python3 -m ipykernel_launcher -f /run/user/1000/jupyter/kernel-1.json"
    t = Table(INIT, P(81, 1, "python3", 50, 80, kernel))
    v = classify(81, t, protect=compile_protect(DEFAULT_PROTECT),
                 protect_cmdline=compile_protect(DEFAULT_PROTECT_CMDLINE))
    assert v.kind == PROTECTED
    assert f"protect_cmdline pattern '{DEFAULT_PROTECT_CMDLINE[0]}'" in v.reason, v.reason
    assert "'-m ipykernel_launcher '" not in v.reason


def test_a_refusal_quotes_the_users_protect_pattern():
    t = Table(INIT, P(81, 1, "jupyter-lab", 50, 80, "/opt/jupyter-lab"), P(82, 81, "python", 60, 80))
    v = classify(82, t, protect=compile_protect(["tmux", "jup.*-lab"]))
    assert v.kind == PROTECTED and "protect pattern 'jup.*-lab'" in v.reason, v.reason


def test_the_plot_fills_its_widget_and_draws_nothing_past_its_frame():
    from gputop.tui.history import DeviceHistory
    from gputop.tui.plot_screen import plot_text

    now = time.time()
    h = DeviceHistory()
    base = frozen_snapshot()
    for i in range(30):  # the newest sample a moment after "now", as the sampler's clock may give it
        h.add(dataclasses.replace(base, at=now - 29 + i + 0.4))
    lines = plot_text(h, 0, 60, 98, 20, now, color=False, title="GPU 0").plain.splitlines()
    assert {len(line) for line in lines} == {98}  # not plotext's 80 columns of a terminal it cannot see
    right = max(line.rfind("┐") for line in lines)
    assert right > 0
    for line in lines:
        assert line[right + 1:].strip() == "", line  # no stray mark right of the frame


def test_the_plot_title_keeps_its_legend_at_80_columns():
    from gputop.tui.plot_screen import plot_title

    t = plot_title(0, "Simulated H100 80GB", 60, 80).plain
    assert len(t) <= 80 and t.rstrip().endswith("memory %"), t
    assert "esc closes" in plot_title(0, "Simulated H100 80GB", 60, 140).plain


def test_the_top_bar_keeps_its_clock_when_tags_and_a_filter_fill_it():
    from gputop.tui.view import TopBarFacts, ViewState, topbar_text

    snap = frozen_snapshot()
    clock = time.strftime("%H:%M:%S", time.localtime(snap.at))
    view = ViewState()
    for flt in ("", "xmrig", "a-filter-long-enough-to-fill-the-line-by-itself"):
        view.filter_text = flt
        for width in (60, 80, 100):
            t = topbar_text(snap, view, TopBarFacts(demo=True, tagged=2), width).plain
            assert t.endswith(clock) and len(t) <= width, (width, t)
    view.filter_text = ""
    assert "2 tagged" in topbar_text(snap, view, TopBarFacts(demo=True, tagged=2), 80).plain
    assert "by GPU" in topbar_text(snap, view, TopBarFacts(demo=True, tagged=2), None).plain  # unbounded: all


def test_filtered_groups_say_how_many_are_shown():
    from gputop.tui.rows import build

    snap = frozen_snapshot()
    groups = build(snap, filter_text="no-such-process-anywhere")
    titles = [g.title for g in groups if g.gpu is not None]
    assert titles and all(" of " in t and "shown" in t for t in titles if "0 of 0" not in t), titles
    assert not any("· 0 holders" in t for t in titles), titles
    assert all("shown" not in g.title for g in build(snap))  # no filter: the plain count


def test_sensors_keep_their_columns_when_fields_are_missing():
    from gputop.tui.device_pane import pane_pieces
    from gputop.tui.history import DeviceHistory

    full = DeviceSample(0, "Simulated H100 80GB", memory_total=80 << 30, memory_used=1 << 30, util_gpu=100,
                        temperature=67, power_w=610, power_limit_w=700, fan_pct=40, clock_sm_mhz=1980,
                        clock_mem_mhz=2619)
    bare = DeviceSample(1, "Simulated H100 80GB", memory_total=80 << 30, errors=("temperature: not supported",))
    for width in (80, 120):
        a, b = ("".join(t for t, _ in pane_pieces(d, DeviceHistory(), width)[0]) for d in (full, bare))
        assert a.index("610/700W") + 8 == b.index("power N/A") + 9, (a, b)
        assert len(a) <= width and len(b) <= width, (a, b)


def test_quitting_the_demo_says_what_it_is_doing_and_erases_the_line(monkeypatch):
    import os
    import pty

    from gputop.tui import launch

    master, slave = pty.openpty()
    try:
        tty = os.fdopen(slave, "w", encoding="utf-8", closefd=False)
        monkeypatch.setattr("sys.stderr", tty)
        with launch._saying_while_demo_stops() as say:
            say()  # where launch calls it: after the app has left the screen, before the demo stops
        tty.flush()
        out = os.read(master, 4096).decode()
        assert "stopping the demo's processes…" in out and out.endswith("\r\x1b[K"), repr(out)
    finally:
        os.close(master)
        os.close(slave)
