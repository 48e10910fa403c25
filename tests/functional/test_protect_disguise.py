"""Issue 25: protect patterns match the whole name, and never protect a disguised process.

Real orphans (``setsid sh -c 'job & exit'``), a real sampler (its ProcTable reads /proc/PID/exe), and the
interactive kill of gputop.actions: a genuine ``tmux`` is protected and refused; an ``xmrig`` reached
through a symlink called tmux (name and argv[0] say tmux, the executable is xmrig), an ``xmrig`` run
with argv[0] jupyter-lab, and an ``xmrig-tmux`` are not protected, and the kill goes through.
"""

from __future__ import annotations

import os
import shutil
import time

import psutil
import pytest

from gputop import actions
from gputop.core.config import Config
from tests.conftest import wait_gone
from tests.functional.guard_helpers import Clock, sampler_for
from tests.functional.names_helpers import orphan_named


@pytest.fixture
def bins(tmp_path):
    sleep = shutil.which("sleep")
    d = tmp_path / "bin"
    d.mkdir()
    for n in ("tmux", "xmrig", "xmrig-tmux"):
        shutil.copy2(sleep, d / n)
    (d / "lnk").mkdir()
    (d / "lnk" / "tmux").symlink_to(d / "xmrig")  # exec through it: comm and argv[0] say tmux, exe is xmrig
    return d


def test_disguised_and_substring_names_are_not_protected_a_genuine_one_is(procs, scenario, bins, monkeypatch):
    from tests.functional.actions_helpers import write_config
    from gputop.core.orphans import DEFAULT_PROTECT

    write_config(bins.parent / "c.yaml", monkeypatch, protect=list(DEFAULT_PROTECT))
    genuine = orphan_named(procs.spawn, procs, f"{bins}/tmux 600", "tmux")
    via_link = orphan_named(procs.spawn, procs, f"{bins}/lnk/tmux 600", "tmux")
    argv0 = orphan_named(procs.spawn, procs, f"bash -c 'exec -a jupyter-lab {bins}/xmrig 600'", "xmrig")
    substring = orphan_named(procs.spawn, procs, f"{bins}/xmrig-tmux 600", "xmrig-tmux")
    assert os.readlink(f"/proc/{via_link}/exe").endswith("/xmrig")
    assert open(f"/proc/{argv0}/cmdline").read().split("\0")[0] == "jupyter-lab"
    path = scenario(holders=[{"pid": p, "gpu": 0, "memory": "1GiB"} for p in (genuine, via_link, argv0, substring)])
    from gputop.core.config import load_config

    cfg = load_config()
    snap = sampler_for(path, Clock(), cfg).sample()
    v = {p: snap.holder(p).verdict for p in (genuine, via_link, argv0, substring)}
    # The reason quotes the pattern as configured (issue 32), not the text it matched: 'tmux(: .*)?'
    assert v[genuine].kind == "protected" and "protect pattern 'tmux(: .*)?'" in v[genuine].reason
    for p in (via_link, argv0, substring):
        assert v[p].kind == "orphan", v[p]
    # The interactive kill: refused for the genuine tmux, done for the others.
    res = actions.kill_process(genuine, expected_start=snap.holder(genuine).start_time, face="cli", force=True,
                               timeout=2, config=cfg)
    assert res.outcome == "refused" and "protected" in res.message
    for p in (via_link, argv0, substring):
        res = actions.kill_process(p, expected_start=snap.holder(p).start_time, face="cli", force=True,
                                   timeout=2, config=cfg)
        assert res.ok, res.message
        assert wait_gone(p)
    time.sleep(0.2)
    assert psutil.pid_exists(genuine) and psutil.Process(genuine).status() != psutil.STATUS_ZOMBIE


def test_the_rogue_audit_and_the_protect_rules_share_one_disguise_test(procs, scenario, bins):
    """The rogue audit flags the process the protect rules refuse to protect, with the same reason text."""
    from gputop.core.rogue import audit

    via_link = orphan_named(procs.spawn, procs, f"{bins}/lnk/tmux 600", "tmux")
    path = scenario(holders=[{"pid": via_link, "gpu": 0, "memory": "1GiB", "sm": 5}])
    findings = [f for f in audit(sampler_for(path, Clock(), Config()).sample(), Config())
                if f.pid == via_link and f.rule == "disguised-name"]
    assert findings and "calls itself 'tmux' but runs 'xmrig'" in findings[0].reason
