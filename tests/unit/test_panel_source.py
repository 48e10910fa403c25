"""The TUI's side-panel source runs the rogue audit when the holders change, else at most every 5 s."""

from __future__ import annotations

import dataclasses

from gputop.core import rogue
from gputop.core.config import Config
from gputop.tui.sampling import PanelSource
from tests.tui.helpers import frozen_snapshot


def test_audit_reruns_on_new_holders_and_is_rate_limited_otherwise(monkeypatch):
    calls = []
    real = rogue.audit
    monkeypatch.setattr(rogue, "audit", lambda snap, cfg, **kw: calls.append(snap.at) or real(snap, cfg, **kw))
    clock = [1000.0]
    monkeypatch.setattr("gputop.tui.sampling.time.monotonic", lambda: clock[0])
    source, cfg = PanelSource(), Config()
    snap = frozen_snapshot()
    first = source(snap, cfg)
    assert len(calls) == 1 and first.audit_available and first.findings
    clock[0] += 1
    again = source(dataclasses.replace(snap, at=snap.at + 1), cfg)
    assert len(calls) == 1 and again.findings == first.findings  # same holders, within 5 s: reused
    clock[0] += 0.5
    source(dataclasses.replace(snap, at=snap.at + 2, holders=snap.holders[1:]), cfg)
    assert len(calls) == 2  # a holder went away: audited at once
    clock[0] += PanelSource.AUDIT_EVERY
    source(dataclasses.replace(snap, at=snap.at + 8, holders=snap.holders[1:]), cfg)
    assert len(calls) == 3  # the interval passed


def test_guard_files_are_read_again_only_when_they_change(monkeypatch, tmp_path):
    """The side panel's guard part: mode, hits and policy come from the guard's files, which are read again
    when the state file is replaced or the hits file grows (or after GUARD_EVERY), not every second; the
    daemon's liveness is asked every time; the app's config names the policy when the state does not."""
    from gputop.guard import state as gs

    monkeypatch.setenv("GPUTOP_STATE_DIR", str(tmp_path))
    clock = [1000.0]
    monkeypatch.setattr("gputop.tui.sampling.time.monotonic", lambda: clock[0])
    reads, daemons = [], []
    real_read, real_daemon = gs.read_state, gs.daemon_status
    monkeypatch.setattr(gs, "read_state", lambda: reads.append(1) or real_read())
    monkeypatch.setattr(gs, "daemon_status", lambda: daemons.append(1) or real_daemon())
    cfg = Config(extra={"guard": {"policy": str(tmp_path / "from-config.yaml")}})
    source, snap = PanelSource(), frozen_snapshot()
    first = source(snap, cfg)
    assert first.guard_mode == "off" and first.hits == () and first.guard_policy == str(tmp_path / "from-config.yaml")
    n = len(reads)
    for _ in range(3):
        clock[0] += 1
        again = source(snap, cfg)
    assert len(reads) == n and again == first  # nothing changed: no read
    assert len(daemons) == 4  # liveness every time
    gs.set_mode("dry-run", "test")  # the state file is replaced
    clock[0] += 1
    assert source(snap, cfg).guard_mode == "dry-run" and len(reads) > n
    gs.append_hit({"time": 1.0, "rule": "r1", "pid": 1, "message": "hit"})  # the hits file grows
    clock[0] += 1
    assert [h["rule"] for h in source(snap, cfg).hits] == ["r1"]
    n = len(reads)
    clock[0] += PanelSource.GUARD_EVERY
    source(snap, cfg)
    assert len(reads) > n  # read again after GUARD_EVERY even if unchanged


def test_guard_text_shows_hostile_hit_fields_and_paths_escaped():
    """Guard hits, errors and policy paths come from files other processes write: no control character
    reaches the screen raw."""
    from gputop.tui.side_panel import PanelData, guard_text

    esc = "\x1b]0;owned\x07"
    d = PanelData(guard_available=True, guard_mode="enforce", guard_error=f"bad {esc}",
                  hits=({"time": 1.0, "rule": f"r{esc}", "pid": f"1{esc}", "action": f"kill{esc}",
                         "outcome": f"x{esc}"},),
                  guard_daemon={"alive": True, "pid": 7, "policy_file": f"/p{esc}"}, guard_policy=f"/q{esc}")
    plain = guard_text(d).plain
    assert "\x1b" not in plain and "\x07" not in plain and "owned" in plain


def test_audit_error_and_an_ancestor_rows_command_are_shown_escaped():
    """An audit error can quote what a process wrote; an ancestor row shows another process's command line."""
    from gputop.core.procs import ProcInfo
    from gputop.tui.process_tree import row_cells
    from gputop.tui.rows import Node
    from gputop.tui.side_panel import PanelData, audit_text

    esc = "\x1b]0;owned\x07"
    plain = audit_text(PanelData(audit_available=True, audit_error=f"cannot read {esc}")).plain
    assert "\x1b" not in plain and "\x07" not in plain and "owned" in plain
    parent = ProcInfo(pid=42, ppid=1, name="sh", cmdline=("sh", f"-c {esc}"), uid=0, user="root", start_time=1.0,
                      sid=42)
    cells = row_cells(Node("anc/42", "ancestor", pid=42, proc=parent), 0, 1, False, False)
    assert cells[6] == "sh -c \\x1b]0;owned\\x07"
