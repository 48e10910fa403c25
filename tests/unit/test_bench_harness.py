"""The benchmark harness's honesty rules (benchmarks/, issue 13): a ratio's spread decides, and a missing
tool is one line that names the extra to install, never a traceback."""

from __future__ import annotations

from benchmarks.common import Ratio


def test_a_spread_that_crosses_the_goal_is_not_shown():
    assert Ratio([0.40, 0.45, 0.48]).verdict(0.5) == "PASS"
    assert Ratio([0.42, 0.49, 0.61]).verdict(0.5) == "not shown"  # the median passes, the spread does not
    assert Ratio([0.55, 0.60, 0.70]).verdict(0.5) == "MISS"
    assert Ratio([]).verdict(0.5) == "not measured"


def test_the_spread_is_the_middle_half_from_eight_rounds():
    r = Ratio([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 9.0])  # one round under a burst of load
    lo, hi = r.spread
    assert 1.1 < lo < 1.3 and 1.4 < hi < 1.6
    assert r.cell().startswith("1.35x (")


def test_missing_nvitop_is_one_line_naming_the_extra(monkeypatch, capsys):
    import benchmarks.__main__ as bench
    import benchmarks.common as common
    import benchmarks.tui as tui

    monkeypatch.setattr(common, "missing_tools", lambda *names: [n for n in names if n == "nvitop"])
    monkeypatch.setattr(tui, "missing_tools", lambda *names: [n for n in names if n == "nvitop"])
    monkeypatch.setattr(tui, "fake_nvml_dir", lambda: "/nonexistent")  # no C compiler needed here
    monkeypatch.setattr("benchmarks.fake_gpus.fake_nvml_dir", lambda: "/nonexistent")
    monkeypatch.setattr(tui.shutil, "which", lambda name: "/usr/bin/" + name)
    assert bench.main(["--only", "2,3"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [l for l in err.splitlines() if "cannot run here" in l]
    assert len(lines) == 2 and all("nvitop" in l and "'.[bench]'" in l for l in lines)


def test_the_cpu_table_shows_every_window_when_the_spread_is_the_middle_half():
    from benchmarks.tui import _with_range

    assert _with_range(Ratio([0.40, 0.45, 0.48])) == "0.45x (0.40-0.48)"  # min-max already
    eight = Ratio([0.38, 0.40, 0.41, 0.42, 0.43, 0.44, 0.45, 0.53])
    assert _with_range(eight).endswith("; all 0.38-0.53")
    assert eight.verdict(0.5) == "PASS"  # the middle half decides; the table still shows the 0.53 window
