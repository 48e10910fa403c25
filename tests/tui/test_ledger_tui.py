"""The memory ledger in the TUI, on real processes: the device pane's ledger line, device-file holders
marked in the tree ("dev" in the T column, the group title), and k on a zombie offering its parent."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from tests.functional.actions_helpers import unique
from tests.functional.ledger_helpers import claim_minor, release_minors
from tests.tui.helpers import audit_records, open_app, run_async, screen_text, wait_row, wait_screen, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a char device node needs root")
GiB = 1 << 30


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(autouse=True)
def _minors():
    yield
    release_minors()


@run_async
async def test_the_device_pane_and_the_tree_show_the_ledger(procs, scenario, tmp_path):
    minor = claim_minor()
    node = tmp_path / f"nvidia{minor}"
    os.mknod(node, 0o666 | 0o020000, os.makedev(195, minor))
    code = f"import os,sys,time; fd=os.open(sys.argv[1], os.O_PATH); print(1, flush=True); time.sleep(600)  # {unique('tui-dev')}"
    h = procs.spawn([sys.executable, "-c", code, str(node)], stdout=subprocess.PIPE)
    assert h.stdout.readline().strip()
    listed = procs.sleeper("listedproc")
    path = scenario([{"pid": listed.pid, "gpu": 0, "memory": "4GiB"}],
                    gpus=[{"name": "Sim", "memory_total": "80GiB", "memory_used": "10GiB", "minor": minor}])
    app = open_app(path)
    async with app.run_test(size=(160, 40)) as pilot:
        assert await wait_row(pilot, f"gpu0/{h.pid}")
        assert await wait_until(pilot, lambda: "GPU 0 ledger:" in screen_text(app))
        text = screen_text(app)
        assert "6.0GiB unexplained" in text and f"(pid {h.pid})" in text
        assert "1 via device file (dev)" in text  # the GPU group's title
        # ... which still sums the listed holders: a device-file holder (any nvidia-smi on a real node) does
        # not turn it into N/A
        assert "GPU 0 Sim · 2 holders · 4.0GiB" in text, text
        row = next(line for line in text.splitlines() if f" {h.pid} " in line and "python" in line)
        assert " dev " in row and "N/A" in row  # T column: found through the device file; memory unknown


@run_async
async def test_k_on_a_zombie_offers_its_parent_and_a_bystander_survives(procs, scenario):
    code = f"import subprocess,time; p=subprocess.Popen(['true']); print(p.pid, flush=True); time.sleep(600)  # {unique('tui-zparent')}"
    parent = procs.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE)
    z = int(parent.stdout.readline())
    deadline = time.time() + 10
    while psutil.Process(z).status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
        time.sleep(0.02)
    bystander = procs.sleeper("bystander")
    path = scenario([{"pid": z, "gpu": 0, "memory": "4GiB", "keep_zombie": True},
                     {"pid": bystander.pid, "gpu": 1, "memory": "2GiB"}])
    app = open_app(path)
    async with app.run_test(size=(120, 30)) as pilot:
        assert await wait_row(pilot, f"gpu0/{z}")
        assert "[zombie] [true]" in screen_text(app)  # the zombie's row is flagged (its command ends in <defunct>, as ps shows)
        assert app.select_key(f"gpu0/{z}")
        await pilot.press("k")
        assert await wait_screen(pilot, "KillDialog")
        (target,) = app.screen.targets
        assert (target.pid, target.parent_of) == (parent.pid, z)
        assert "is a zombie: no signal ends it" in screen_text(app)
        await pilot.press("tab", "enter")  # Cancel -> TERM
        assert await wait_until(pilot, lambda: parent.poll() is not None, timeout=10)
    assert alive(bystander.pid)
    recs = [r for r in audit_records("kill") if r.get("face") == "tui"]
    assert any(r["target"]["pid"] == parent.pid and r["ok"] for r in recs), recs
