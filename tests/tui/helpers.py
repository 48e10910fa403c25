"""Helpers for the TUI tests: a frozen sampler over constructed snapshots, screen text, waiting."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest


def screen_text(app) -> str:
    """The screen as plain text, one line per row (what a user reads)."""
    strips = app.screen._compositor.render_strips()
    return "\n".join(s.text.rstrip() for s in strips)


async def wait_until(pilot, cond, timeout: float = 10.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await pilot.pause(step)
    return bool(cond())


# ---- a frozen sampler over constructed snapshots (process data is what changes between runs) ------

from gputop.backends.base import Backend, BackendStatus, DeviceSample  # noqa: E402
from gputop.core.orphans import NOT_ORPHAN, ORPHAN, PROTECTED, UNKNOWN, Verdict  # noqa: E402
from gputop.core.ownership import NONE, SESSION, Owner  # noqa: E402
from gputop.core.procs import ProcInfo  # noqa: E402
from gputop.core.model import GpuUse, Holder, OrphanRoot, Snapshot  # noqa: E402
from gputop.core.verdicts import Lookups  # noqa: E402
from gputop.tui.side_panel import PanelData  # noqa: E402

AT = 1796000000.0  # 2026-11-30 05:33:20 UTC
GiB = 1024**3


def _p(pid, ppid, name, cmd, sid, start, user="alice", rss=2 * GiB):
    return ProcInfo(pid=pid, ppid=ppid, name=name, cmdline=tuple(cmd.split()), start_time=start, uid=1000,
                    user=user, sid=sid, state="S", sighup_ignored=False, rss=rss, cpu_time=10.0)


def frozen_snapshot(at: float = AT) -> Snapshot:
    init = _p(1, 0, "systemd", "/sbin/init", 1, AT - 86400, user="root")
    sshd = _p(900, 1, "sshd", "sshd: alice [priv]", 900, AT - 7200, user="root")
    shell = _p(1000, 900, "bash", "-bash", 1000, AT - 7000)
    launcher = _p(1100, 1000, "torchrun", "torchrun --nproc-per-node 2 train.py", 1000, AT - 3600)
    w0 = _p(1101, 1100, "python", "python train.py --rank 0 --world-size 2", 1000, AT - 3599)
    w1 = _p(1102, 1100, "python", "python train.py --rank 1 --world-size 2", 1000, AT - 3599)
    loop = _p(2000, 1, "bash", "bash retry.sh", 1990, AT - 5000, user="bob")
    ow = _p(2001, 2000, "python", "python finetune.py --resume [red]ckpt[/red]", 1990, AT - 60, user="bob")
    jup = _p(3000, 1, "python", "python -m ipykernel_launcher -f jupyter/kernel-1.json", 3000, AT - 900,
             user="carol")
    gfx = _p(3100, 1, "glxgears", "glxgears -info", 3100, AT - 300, user="dave")
    miner = _p(3200, 1, "xmrig", "xmrig -o pool.example.net:3333", 3200, AT - 120, user="eve")
    not_orphan = lambda sid: Verdict(NOT_ORPHAN, f"session leader pid {sid} is alive")  # noqa: E731
    orphan_reason = "session leader pid 1990 is gone; tree root pid 2000 (bash) was reparented to init"
    bob_session = Owner(SESSION, "/user.slice/user-1001.slice/session-7.scope", uid=1001, session="7",
                        session_state="closing")
    holders = (
        Holder(1101, (GpuUse(0, "C", 61 * GiB, 96.0),), w0, (launcher, shell, sshd, init), not_orphan(1000),
               97.5, 3599.0),
        Holder(1102, (GpuUse(1, "C", 60 * GiB, 93.0),), w1, (launcher, shell, sshd, init), not_orphan(1000),
               96.0, 3599.0),
        Holder(2001, (GpuUse(2, "C", 18 * GiB, 45.0),), ow, (loop, init),
               Verdict(ORPHAN, orphan_reason, root=2000, reaper=1, orphan_reason=orphan_reason), 40.0, 60.0,
               bob_session, (bob_session, Owner(NONE, "/init.scope"))),
        Holder(3000, (GpuUse(2, "C", 9 * GiB, 0.0), GpuUse(3, "G", 1 * GiB, None)), jup, (init,),
               Verdict(PROTECTED, "pid 3000 (python) matches protect pattern 'jupyter'"), 0.5, 900.0),
        Holder(3100, (GpuUse(3, "G", GiB // 2, 3.0),), gfx, (init,),
               Verdict(NOT_ORPHAN, "session leader itself (started deliberately with setsid, a daemon or a "
                                   "service)"), 1.0, 300.0),
        Holder(3200, (GpuUse(3, "C", 4 * GiB, 99.0),), miner, (init,),
               Verdict(NOT_ORPHAN, "session leader itself"), 100.0, 120.0),
        Holder(4194301, (GpuUse(2, "C", 3 * GiB, None),), None, (),
               Verdict(UNKNOWN, "pid 4194301 is not visible here (another PID namespace, or the driver still "
                                "holds the memory of a process that exited)")),
    )
    devices = (
        DeviceSample(0, "NVIDIA H100 80GB HBM3", memory_total=80 * GiB, memory_used=61 * GiB, util_gpu=96,
                     util_mem=40, temperature=67, power_w=610, power_limit_w=700, fan_pct=None,
                     clock_sm_mhz=1980, clock_mem_mhz=2619, backend="simulated", backend_index=0),
        DeviceSample(1, "NVIDIA H100 80GB HBM3", memory_total=80 * GiB, memory_used=60 * GiB, util_gpu=93,
                     util_mem=38, temperature=65, power_w=590, power_limit_w=700, fan_pct=None,
                     clock_sm_mhz=1980, clock_mem_mhz=2619, backend="simulated", backend_index=1),
        DeviceSample(2, "NVIDIA A100-SXM4-40GB", memory_total=40 * GiB, memory_used=30 * GiB, util_gpu=45,
                     util_mem=20, temperature=52, power_w=180, power_limit_w=400, fan_pct=40,
                     clock_sm_mhz=1410, clock_mem_mhz=1593, backend="simulated", backend_index=2),
        DeviceSample(3, "NVIDIA L40S", lost=True, errors=("GPU is lost",), backend="simulated",
                     backend_index=3),
    )
    roots = (OrphanRoot(loop, (2001,), (2,), 18 * GiB, orphan_reason, 1),)
    return Snapshot(at=at, host="node01", devices=devices, holders=holders, roots=roots,
                    backends=(BackendStatus("simulated", True, "", 4),))


class FrozenBackend(Backend):
    """The backend behind FakeSampler's GPUs: named "simulated" (it resets as any user, as the simulated
    backend does), and it reads nothing: the frozen sampler hands out constructed snapshots."""

    name = "simulated"

    def device_count(self) -> int:
        return 0

    def sample(self, index: int) -> DeviceSample:
        raise RuntimeError("the frozen backend reads nothing")

    def processes(self, index: int) -> list:
        raise RuntimeError("the frozen backend reads nothing")

    def reset(self, index: int) -> str:
        raise RuntimeError("the frozen sampler cannot reset")


class FakeSampler:
    """Returns the same constructed snapshot every time (the frozen sampler of the snapshot tests); a test
    may set ``snapshot`` to another one (see switch_snapshot)."""

    def __init__(self, snapshot: Snapshot | None = None):
        self.snapshot = snapshot or frozen_snapshot()
        self.config = None
        self.platform = "posix"

    @property
    def statuses(self) -> list:
        return list(self.snapshot.backends)

    def sample(self) -> Snapshot:
        return self.snapshot

    def sample_devices(self) -> tuple:
        return self.snapshot.devices

    def locate(self, index: int) -> tuple:
        """The real Sampler's answer: the GPU's backend and its index there (a frozen backend)."""
        from gputop.util.errors import NotFoundError

        if self.snapshot.device(index) is None:
            raise NotFoundError(f"no GPU {index}")
        return FrozenBackend(), index

    def reset(self, index: int) -> str:
        raise RuntimeError("the frozen sampler cannot reset")

    def lookups(self) -> Lookups:
        return Lookups()  # the frozen snapshot's processes have no owner or Slurm job to look up

    def close(self) -> None:
        pass


def row_line(app, pid: int) -> str | None:
    """The screen line that shows ``pid`` (a tree row), or None."""
    for line in screen_text(app).splitlines():
        if f" {pid} " in line:
            return line
    return None


async def switch_snapshot(pilot, app, sampler, snap) -> None:
    """Make a FakeSampler hand out ``snap``, sample now, and wait until the app shows it."""
    sampler.snapshot = snap
    app.sample_now()
    assert await wait_until(pilot, lambda: app.snapshot is snap)
    await pilot.pause(0.2)


def frozen_panel(snapshot, config) -> PanelData:
    hits = ({"time": AT - 30, "rule": "max-runtime", "pid": 2001, "dry_run": True, "action": "kill",
             "outcome": "dry-run"},
            {"time": AT - 10, "rule": "no-miners", "pid": 3200, "dry_run": False, "action": "kill",
             "outcome": "killed"})
    from gputop.core.rogue import Finding

    findings = (Finding("high", "miner-name", 3200, "process name 'xmrig' is a known crypto miner", "comm=xmrig"),
                Finding("medium", "pool-port", 3200, "connected to a mining pool port (3333)", "tcp 3333"))
    return PanelData(guard_available=True, guard_mode="dry-run", hits=hits, audit_available=True,
                     findings=findings, guard_policy="/etc/gputop/policy.yaml",
                     guard_daemon={"alive": True, "pid": 4242, "policy_file": "/etc/gputop/policy.yaml",
                                   "mode": "dry-run"})


@contextlib.asynccontextmanager
async def frozen_app(snapshot: Snapshot, size: tuple[int, int] = (120, 40)):
    """A GputopApp on a FakeSampler handing out ``snapshot``, with a 30 s refresh (a test samples with
    switch_snapshot) and a frozen side panel, running at ``size``; yields (app, pilot, sampler)."""
    from gputop.tui.app import GputopApp

    sampler = FakeSampler(snapshot)
    app = GputopApp(sampler, interval=30, panel_source=frozen_panel)
    async with app.run_test(size=size) as pilot:
        yield app, pilot, sampler


def seed_history(app, snapshot: Snapshot, n: int = 120) -> None:
    """A fixed, varied history so that the strips and the plot show something deterministic."""
    import dataclasses

    for i in range(n):
        devs = tuple(
            dataclasses.replace(d, util_gpu=None if d.lost else (d.util_gpu or 0) * (0.5 + 0.5 * ((i * 7 + d.index * 13) % 20) / 20),
                                memory_used=None if d.memory_used is None else int(d.memory_used * min(1.0, (i + 10) / n)))
            for d in snapshot.devices)
        app.history.add(dataclasses.replace(snapshot, at=snapshot.at - (n - i), devices=devs))


# ---- real processes on simulated GPUs -------------------------------------------------------------

def open_app(scenario_path, *, readonly: bool = False, interval: float = 0.2):
    """The real app over the real simulated backend, with an empty protect list: a test runner started
    inside tmux or screen would otherwise make every process it spawns "protected"."""
    from gputop.core.config import Config
    from gputop.core.sampler import Sampler
    from gputop.tui.app import GputopApp

    config = Config(protect=())
    sampler = Sampler.open("simulated", str(scenario_path), config)
    return GputopApp(sampler, config=config, interval=interval, readonly=readonly)


async def wait_screen(pilot, name: str, timeout: float = 10.0) -> bool:
    """The screen called ``name`` is on top and ready: when it has an AUTO_FOCUS, that focus is set (Textual
    pushes a screen first and focuses it once mounted: on a loaded machine, many frames later)."""
    def ready() -> bool:
        screen = pilot.app.screen
        return type(screen).__name__ == name and (screen.focused is not None or not screen.AUTO_FOCUS)

    return await wait_until(pilot, ready, timeout)


async def wait_row(pilot, key: str, timeout: float = 10.0) -> bool:
    from gputop.tui.process_tree import ProcessTree

    return await wait_until(pilot, lambda: key in pilot.app.query_one(ProcessTree).nodes_by_key, timeout)


def audit_records(action: str | None = None) -> list[dict]:
    import json
    import os
    from pathlib import Path

    path = Path(os.environ["GPUTOP_STATE_DIR"]) / "audit.jsonl"
    if not path.exists():
        return []
    out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in out if action is None or r.get("action") == action]


def run_async(fn):
    """Run an async test body with asyncio (no async pytest plugin is needed)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


@pytest.fixture
def utc(monkeypatch):
    """The snapshot tests' clock in UTC (their screens show times); ``pytestmark = usefixtures("utc")``."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
