"""The one-shot paths of ``gputop status --json``: the compact JSON writer that encodes each shared chain
entry once (it must write exactly what json.dumps writes), and a sampler without the verdict memo (it must
judge exactly as one with it)."""

from __future__ import annotations

import json

import pytest

from gputop.core.config import Config
from gputop.core.procs import IS_LINUX
from gputop.core.sampler import Sampler
from gputop.core.snapshot_json import snapshot_json
from tests.unit.test_verdict_memo import HOLDER, INIT, LEADER, PARENT, Counting, Host, OneGpu, fresh

pytestmark = pytest.mark.skipif(not IS_LINUX, reason="a fixture /proc is read the Linux way")


@pytest.fixture
def forest(tmp_path):
    """Two trees: one under a live session leader, one orphaned (its leader gone), with hostile names."""
    h = Host(tmp_path)
    h.write_proc(INIT, 0, 1, "systemd", start=1)
    h.write_proc(LEADER, INIT, LEADER, "bash", start=50)
    h.write_proc(PARENT, LEADER, LEADER, "python", start=60, cmd=["python", "tr\u00e4in.py", 'a"b\\c\x1b[2J'])
    for i in range(4):
        h.write_proc(HOLDER + i, PARENT, LEADER, "python", start=70 + i, cmd=["python", f"w{i}.py", "\u65e5\u672c"])
    h.write_proc(600, INIT, 555, "job\x07", start=80, cmd=["job\x07", "--x"])  # session 555 is gone
    for i in range(3):
        h.write_proc(700 + i, 600, 555, "worker", start=90 + i, cmd=["worker"])
    return h


def pids():
    return [HOLDER + i for i in range(4)] + [700, 701, 702, 9999]  # 9999: not visible here


def sampler(host, **kw):
    return Sampler([OneGpu(pids())], config=Config(), proc_root=str(host.proc), run_root=str(host.run), **kw)


def test_compact_json_is_byte_for_byte_json_dumps(forest):
    snap = sampler(forest).sample()
    assert {h.verdict.kind for h in snap.holders} == {"not-orphan", "orphan", "unknown"}
    assert snap.roots  # the orphan tree's root, with its owner
    out = snapshot_json(snap)
    assert out == json.dumps(snap.to_dict(), separators=(",", ":"), default=str)
    doc = json.loads(out)
    assert [h["pid"] for h in doc["holders"]] == sorted(pids())
    assert doc["holders"][0]["chain"][0]["cmdline"][2] == 'a"b\\c\x1b[2J'
    assert doc["holders"][-1]["chain"] == [] and doc["holders"][-1]["visible"] is False


def judged(snap):
    return [(h.pid, h.verdict, [c.identity for c in h.chain], h.owner, h.chain_owners) for h in snap.holders]


def test_a_sampler_without_the_memo_judges_as_one_with_it(forest, monkeypatch):
    count = Counting(monkeypatch)
    one_shot, kept = sampler(forest, memo=False), sampler(forest)
    for _ in range(2):
        a, b = one_shot.sample(), kept.sample()
        assert judged(a) == judged(b) and a.roots == b.roots
    assert count.calls == 2 * 7 + 7  # the one-shot sampler classifies every holder every time
    assert one_shot.verdicts.memos is None and not one_shot.verdicts.contexts
    for pid in pids()[:-1]:
        assert a.holder(pid).verdict == fresh(forest, pid, sampler_=one_shot)


@pytest.mark.parametrize("cls_path", ["gputop.core.model.Holder", "gputop.core.model.GpuUse",
                                      "gputop.backends.base.GpuProcess"])
def test_hand_written_inits_take_every_field_in_order_with_its_default(cls_path):
    """Holder, GpuUse and GpuProcess fill their fields in one update instead of the frozen dataclass's
    generated __init__: a field added to the class but not to __init__ would be missing."""
    import dataclasses
    import importlib
    import inspect

    mod, name = cls_path.rsplit(".", 1)
    cls = getattr(importlib.import_module(mod), name)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields):
        assert p.default == (f.default if f.default is not dataclasses.MISSING else inspect.Parameter.empty), f.name
    args = {f.name: object() for f in fields}
    if cls.__name__ == "Holder":
        args["uses"] = ()  # read at construction
    obj = cls(**args)
    assert all(getattr(obj, k) is v for k, v in args.items())
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, fields[0].name, 1)


@pytest.mark.parametrize("uses", [
    [(3, 100, "C", 5.0)], [(3, None, "G", None)], [(3, 1, "", None)], [(0, 5, "C", 1.0), (2, 7, "G", 3.0)],
    [(2, 5, "C", None), (0, None, "C", 2.0)], [(1, 5, "C", 1.0), (1, 6, "C+G", 0.0)], [],
])
def test_holder_gpus_memory_ctx_and_sm_are_the_same_with_one_use_or_several(uses):
    """A holder of one GPU takes them from its use at construction; the properties compute them."""
    from gputop.core.orphans import Verdict
    from gputop.core.model import GpuUse, Holder

    h = Holder(1, tuple(GpuUse(g, c, m, sm) for g, m, c, sm in uses), None, (), Verdict("unknown", "x"))
    for name in ("ctx", "gpus", "gpu_memory", "sm_util"):
        assert getattr(h, name) == getattr(Holder, name).fn(h), name
    assert h.gpus == tuple(sorted({g for g, *_ in uses}))
    assert h.gpu_memory == (None if any(m is None for _, m, *_ in uses) else sum(m for _, m, *_ in uses))
