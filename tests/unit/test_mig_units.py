"""MIG (issue 30) without a library: the profile in a MIG device's name, where a use runs, the snapshot's
instance lookups, and NvmlBackend's size (issue 27: no class over ~30 methods)."""

from __future__ import annotations

import ast
from pathlib import Path

from gputop.backends.base import MigInstance, mig_profile
from gputop.core.model import GpuUse, Holder, Snapshot, place_label
from gputop.core.orphans import Verdict

ROOT = Path(__file__).resolve().parents[2]


def test_profile_comes_from_the_driver_name():
    assert mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb") == "1g.10gb"
    assert mig_profile("NVIDIA A100-SXM4-40GB MIG 3g.20gb") == "3g.20gb"
    assert mig_profile("NVIDIA H100 80GB HBM3") is None and mig_profile(None) is None


def test_a_use_names_its_instance():
    assert place_label(GpuUse(0, "C", 1, None)) == "0"
    assert place_label(GpuUse(2, "C", 1, None, 5, 0)) == "2:GI5/CI0"
    assert GpuUse(2, "C", 1, None).instance_key is None and GpuUse(2, "C", 1, None, 5, 1).instance_key == (2, 5, 1)


def test_snapshot_finds_the_instance_and_its_holders():
    a, b = MigInstance(0, 0, 1, 0, "3g.71gb"), MigInstance(0, 1, 5, 0, "1g.18gb")
    on_b = GpuUse(0, "C", 1, None, 5, 0)
    h = Holder(10, (on_b,), None, (), Verdict("unknown", "test"))
    plain = Holder(11, (GpuUse(1, "C", 1, None),), None, (), Verdict("unknown", "test"))
    snap = Snapshot(0.0, "h", (), (h, plain), (), (), instances=(a, b))
    assert snap.instance_of(on_b) is b and snap.instance_of(plain.uses[0]) is None
    assert snap.holders_on_instance(b) == [h] and snap.holders_on_instance(a) == []
    assert snap.instances_on(0) == [a, b] and snap.instances_on(1) == []
    assert b.label == "GI 5/CI 0 1g.18gb"


def test_nvml_backend_has_at_most_30_methods():
    tree = ast.parse((ROOT / "gputop/backends/nvml.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "NvmlBackend"]
    methods = [n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert len(methods) <= 30, methods


def test_instance_text_never_reaches_a_terminal_raw():
    """A MIG device's profile is shown through textsafe.visible on the status table, the TUI's board line and
    tree group, and the reset refusal."""
    from gputop.actions.reset_mig import mig_refusal
    from gputop.backends.base import DeviceSample
    from gputop.commands.status import instance_rows
    from gputop.tui.mig_lines import instance_pieces
    from gputop.tui.rows import build

    bad = MigInstance(0, 0, 1, 0, "1g\x1b[2J.18gb\x07", "MIG-x", None, 18 << 30, 1 << 30)
    use = GpuUse(0, "C", 1 << 30, None, 1, 0)
    h = Holder(10, (use,), None, (), Verdict("unknown", "test"))
    snap = Snapshot(0.0, "h", (DeviceSample(0, "GPU"),), (h,), (), (), instances=(bad,))
    texts = [" ".join(instance_rows(snap, snap.devices[0])[0]),
             "".join(t for t, _ in instance_pieces(bad, 80)),
             mig_refusal(snap, 0, [h])[0],
             build(snap)[0].children[0].title]
    for t in texts:
        assert "\x1b" not in t and "\x07" not in t, repr(t)
        assert "18gb" in t, t
