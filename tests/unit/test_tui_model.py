"""The TUI's plain-data parts (no Textual app): the tree model, sorting, filtering, history strips, the plot's
text, the top bar, the device pane's columns."""

from __future__ import annotations

import dataclasses
import time

from gputop.backends.base import DeviceSample
from gputop.tui.history import DeviceHistory, strip
from gputop.tui.rows import GROUP_ROOT, build, shown_chain, walk
from tests.tui.helpers import frozen_snapshot


def keys(groups):
    return [n.key for n in walk(groups)]


def test_per_gpu_tree_puts_holders_under_their_session_chain():
    groups = build(frozen_snapshot())
    k = keys(groups)
    assert k[:4] == ["gpu0", "gpu0/1000", "gpu0/1100", "gpu0/1101"]  # shell > launcher > worker
    assert "gpu0/900" not in k  # sshd is outside the holder's session
    # The orphan sits under its root (the retry loop), not under init.
    assert k.index("gpu2/2000") + 1 == k.index("gpu2/2001")
    # A holder on two GPUs is under both; the invisible holder is listed, not dropped.
    assert "gpu2/3000" in k and "gpu3/3000" in k and "gpu2/4194301" in k


def test_per_root_grouping():
    groups = build(frozen_snapshot(), grouping=GROUP_ROOT)
    assert [g.key for g in groups] == ["root2000", "rest", "unknown"]
    assert keys(groups[:1]) == ["root2000", "root2000/2000", "root2000/2001"]
    # An unknown verdict gets its own group, not "not orphaned".
    assert keys(groups[2:]) == ["unknown", "unknown/4194301"]
    assert "rest/4194301" not in keys(groups)


def test_sort_and_reverse():
    snap = frozen_snapshot()
    gpu3 = lambda groups: [n.pid for n in groups[3].children]  # noqa: E731
    assert gpu3(build(snap, sort="gpu-mem")) == [3000, 3200, 3100]  # 10, 4, 0.5 GiB
    assert gpu3(build(snap, sort="gpu-mem", reverse=True)) == [3100, 3200, 3000]
    assert gpu3(build(snap, sort="cpu")) == [3200, 3100, 3000]
    assert gpu3(build(snap, sort="pid")) == [3000, 3100, 3200]


def test_filter_matches_name_user_pid_and_chain():
    snap = frozen_snapshot()
    only = lambda text: sorted({n.pid for n in walk(build(snap, filter_text=text)) if n.kind == "holder"})  # noqa: E731
    assert only("xmrig") == [3200]
    assert only("bob") == [2001]
    assert only("torchrun") == [1101, 1102]  # matched through the chain
    assert only("3100") == [3100]
    assert only("no-such-thing") == []


def test_shown_chain_of_an_orphan_stops_at_its_root():
    snap = frozen_snapshot()
    assert [p.pid for p in shown_chain(snap.holder(2001))] == [2000]
    assert [p.pid for p in shown_chain(snap.holder(1101))] == [1000, 1100]
    assert shown_chain(snap.holder(4194301)) == []


def test_strip_is_fixed_scale_and_shows_unknown():
    assert strip([0, 50, 100], 3) == " ▄█"
    assert strip([3], 1) == " "  # 3% stays low: no auto-scaling
    assert strip([None, 100], 4) == "  ?█"


def test_history_ring_buffer():
    h = DeviceHistory(length=5)
    snap = frozen_snapshot()
    for _ in range(8):
        h.add(snap)
    assert len(h.series(0)) == 5
    assert h.last(0, 2)[-1].util == 96
    assert h.series(3)[-1].util is None  # a lost device has no utilisation, not 0


def test_pair_values_without_data_read_na():
    from gputop.backends.base import DeviceSample
    from gputop.tui.device_pane import sensors_text

    text = sensors_text(DeviceSample(0, "x"))
    assert "N/A/N/A" not in text and "clocks N/A" in text and "power N/A" in text
    assert "1980/2619MHz" in sensors_text(DeviceSample(0, "x", clock_sm_mhz=1980, clock_mem_mhz=2619))


def test_side_panel_shows_whole_severity_names():
    from gputop.core.rogue import Finding
    from gputop.tui.side_panel import PanelData, audit_text

    text = audit_text(PanelData(audit_available=True, findings=(Finding("medium", "r", 1, "why", ""),))).plain
    assert "MEDIUM" in text


def test_side_panel_lists_the_most_severe_findings_and_counts_the_rest():
    from gputop.core.rogue import Finding
    from gputop.tui.side_panel import MAX_FINDINGS, PanelData, audit_text

    findings = tuple(Finding("low", "orphaned-holder", 1000 + i, f"orphan {1000 + i}", "") for i in range(512))
    text = audit_text(PanelData(audit_available=True, findings=findings)).plain
    assert f"orphan {1000 + MAX_FINDINGS - 1}" in text and f"orphan {1000 + MAX_FINDINGS}" not in text
    assert text.endswith(f"… {512 - MAX_FINDINGS} more (gputop audit lists all)")
    few = audit_text(PanelData(audit_available=True, findings=findings[:MAX_FINDINGS])).plain
    assert "more" not in few and f"orphan {1000 + MAX_FINDINGS - 1}" in few


def test_sort_mark_for_pid_and_for_a_hidden_column():
    from gputop.tui.process_tree import COMPACT, NARROW, WIDE, header_text

    assert "PID▲" in header_text(0, WIDE, "pid", False).plain
    assert "HOST-MEM▼" in header_text(0, WIDE, "host-mem", False).plain
    assert "HOST-MEM" not in header_text(0, COMPACT, "gpu-mem", False).plain  # hidden at this width...
    compact = header_text(0, (COMPACT, "HOST-MEM"), "host-mem", False).plain  # ...unless sorted by it
    assert "HOST-MEM▼" in compact and "COMMAND" in compact
    assert "TIME▼" in header_text(0, (NARROW, "TIME"), "time", False).plain
    assert "COMMAND" in header_text(0, NARROW, "gpu-mem", False).plain


def test_history_keeps_order_across_the_wrap_and_unknowns():
    from types import SimpleNamespace

    from gputop.backends.base import DeviceSample

    h = DeviceHistory(length=4)
    for t in range(10):
        util = None if t == 8 else float(t)
        h.add(SimpleNamespace(at=float(t), devices=(DeviceSample(0, util_gpu=util, memory_used=t,
                                                                 memory_total=100),)))
    assert [p.at for p in h.series(0)] == [6.0, 7.0, 8.0, 9.0]
    assert [p.util for p in h.last(0, 3)] == [7.0, None, 9.0] and h.last(0, 3)[-1].mem == 9.0
    assert [p.at for p in h.last(0, 99)] == [6.0, 7.0, 8.0, 9.0] and h.last(0, 0) == [] and h.last(5, 3) == []


def test_history_of_an_hour_on_eight_gpus_is_small():
    # The TUI keeps an hour of samples per GPU: stored as arrays of doubles, not one object per sample.
    import tracemalloc
    from types import SimpleNamespace

    from gputop.backends.base import DeviceSample

    devices = tuple(DeviceSample(i, util_gpu=float(i), memory_used=i, memory_total=100) for i in range(8))
    tracemalloc.start()
    try:
        h = DeviceHistory()
        for t in range(3600):
            h.add(SimpleNamespace(at=1e9 + t, devices=devices))
        size, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(h.series(7)) == 3600
    assert size < 1 << 20, f"{size / 2**20:.1f} MiB for 28,800 samples"


def test_a_nan_or_out_of_range_reading_is_drawn_not_raised():
    """A backend (or a scenario's JSON) may hand a NaN: the strip shows '?' for it, and the history and the
    refresh go on; values outside 0-100 are clamped to the scale."""
    from gputop.tui.history import BLOCKS, block

    assert block(float("nan")) == "?" and block(None) == "?"
    assert block(-5.0) == BLOCKS[0] and block(250.0) == BLOCKS[8]


def test_cells_width_is_the_width_of_the_label_they_make():
    from gputop.tui.process_tree import cells_width, text_from_cells

    row = ("row", "", False, " O  12345  ", ("user", "C ", "0", "1.0GiB", "50%"), "C", "python 訓練.py", True)
    for cells in (row, ("group", "GPU 0 · NVIDIA H200"), row[:6] + ("plain ascii",) + row[7:]):
        assert cells_width(cells) == text_from_cells(cells).cell_len


def test_key_names_and_characters_written_out_are_textuals():
    """keymap answers for Textual's format_key and key_to_character (without unicodedata.lookup): the
    answers must be Textual's own, for every key bound on the main screen and for the screen's tab."""
    from textual.keys import format_key, key_to_character

    from gputop.tui import keymap

    keys = [key for k in keymap.KEYS for key in k.key.split(",")]
    shown = [key for key in keys if keymap.key_display(key) is not None]
    assert "question_mark" in shown and "slash" in shown and "q" in shown
    for key in shown:
        assert keymap.key_display(key) == format_key(key), key
    for key in keymap.KEY_CHARACTERS:
        assert keymap.KEY_CHARACTERS[key] == key_to_character(key), key
    assert {b.key for b in keymap.bindings()} == set(keys)  # one binding a key, none lost


def test_two_holders_cut_at_different_heights_share_one_row_per_ancestor():
    """The shape a real H200 node showed: holder A under 526>527>848, holder B under 527>848>915 (each chain
    cut at MAX_ANCESTORS). Each process is one row: B's 527 is folded into A's, whichever comes first."""
    from dataclasses import replace

    from gputop.backends.base import DeviceSample
    from gputop.core.model import GpuUse, Holder
    from gputop.core.orphans import NOT_ORPHAN, Verdict
    from tests.tui.helpers import AT, GiB, _p

    base = frozen_snapshot()
    p526 = _p(526, 1, "timeout", "timeout 540 bash run.sh", 526, AT - 100)
    p527 = _p(527, 526, "bash", "bash run.sh", 526, AT - 100)
    p848 = _p(848, 527, "bash", "bash run.sh", 526, AT - 90)
    p915 = _p(915, 848, "timeout", "timeout 60 python3 shot.py", 526, AT - 10)
    a = Holder(851, (GpuUse(0, "C", 3 * GiB, 1.0),), _p(851, 848, "python3", "python3 hold.py", 526, AT - 80),
               (p848, p527, p526), Verdict(NOT_ORPHAN, "session leader pid 526 is alive"), 1.0, 80.0)
    b = Holder(916, (GpuUse(0, "C", GiB, None),), _p(916, 915, "python3", "python3 shot.py", 526, AT - 9),
               (p915, p848, p527, p526), Verdict(NOT_ORPHAN, "session leader pid 526 is alive"), 1.0, 9.0)
    dev = DeviceSample(0, "NVIDIA H200", memory_total=140 * GiB, memory_used=4 * GiB, backend="simulated",
                       backend_index=0)
    for holders in ((a, b), (b, a)):
        snap = replace(base, devices=(dev,), holders=holders, roots=())
        k = keys(build(snap))
        assert k == ["gpu0", "gpu0/526", "gpu0/527", "gpu0/848", "gpu0/851", "gpu0/915", "gpu0/916"] or \
            k == ["gpu0", "gpu0/526", "gpu0/527", "gpu0/848", "gpu0/915", "gpu0/916", "gpu0/851"], k
        assert sorted(k) == sorted(set(k))


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
