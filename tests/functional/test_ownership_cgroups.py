"""Ownership on real processes in real cgroups: the tests make cgroups in this machine's hierarchies (as
root), move real GPU holders (simulated backend) into them, and check the owner, the verdict, `status`
and what `reap --apply` does. logind's /run is a fixture directory ($GPUTOP_RUN_ROOT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gputop.backends.simulated import SimulatedBackend
from gputop.core.config import Config
from gputop.core.orphans import NOT_ORPHAN, ORPHAN
from gputop.core.ownership import SERVICE, SESSION, SLURM, SlurmEnv, read_owner, slurm_job_from_environ
from gputop.core.sampler import Sampler
from tests.conftest import run_gputop, wait_gone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="needs root on Linux to make cgroups")


def _mounts() -> dict[str, str]:
    """'name=systemd', 'freezer', 'unified' -> a mount point of that hierarchy."""
    out: dict[str, str] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _src, opts = (right.split() + ["", ""])[:3]
            point = left.split()[4]
            if fstype == "cgroup2":
                out.setdefault("unified", point)
            elif fstype == "cgroup":
                for o in opts.split(","):
                    if o in ("name=systemd", "freezer"):
                        out.setdefault(o, point)
    return out


class Cgroups:
    """Makes cgroup directories under a hierarchy and moves processes into them; undoes it all."""

    def __init__(self):
        self.mounts = _mounts()
        self.made: list[tuple[Path, Path]] = []  # (hierarchy root, directory)
        self.tag = f"gtown{uuid.uuid4().hex[:8]}"

    @property
    def systemd(self) -> str:
        """Where systemd's units and sessions are: name=systemd (v1, hybrid), else the unified hierarchy."""
        return "name=systemd" if "name=systemd" in self.mounts else "unified"

    def need(self, hierarchy: str) -> Path:
        if hierarchy not in self.mounts:
            pytest.skip(f"no {hierarchy} cgroup hierarchy mounted here")
        return Path(self.mounts[hierarchy])

    def move(self, hierarchy: str, rel: str, pid: int) -> str:
        """Put ``pid`` in ``ROOT/rel`` (made as needed); the path /proc/PID/cgroup will show."""
        root = self.need(hierarchy)
        d = root / rel
        for parent in reversed([d, *d.parents]):
            if parent != root and root in parent.parents and not parent.exists():
                parent.mkdir()
                self.made.append((root, parent))
        (d / "cgroup.procs").write_text(f"{pid}\n")
        return "/" + rel

    def cleanup(self):
        for root, d in reversed(self.made):
            try:
                for pid in (d / "cgroup.procs").read_text().split():
                    try:
                        (root / "cgroup.procs").write_text(pid)
                    except OSError:
                        pass
                d.rmdir()
            except OSError:
                pass


@pytest.fixture
def cgroups():
    c = Cgroups()
    yield c
    c.cleanup()


@pytest.fixture
def run_root(tmp_path, monkeypatch):
    """A /run with logind's session directory; sessions[N] = state writes its file."""
    d = tmp_path / "run" / "systemd" / "sessions"
    d.mkdir(parents=True)
    monkeypatch.setenv("GPUTOP_RUN_ROOT", str(tmp_path / "run"))

    class Sessions:
        root = str(tmp_path / "run")

        def __setitem__(self, sid, state):
            (d / str(sid)).write_text(f"UID=0\nUSER=root\nSTATE={state}\nSCOPE=session-{sid}.scope\n")

    return Sessions()


def sample(path, run_root: str):
    return Sampler([SimulatedBackend(path)], config=Config(protect=[], nohup_protects=False),
                   run_root=run_root).sample()


def test_double_forked_daemon_in_a_service_is_not_an_orphan(procs, scenario, cgroups, run_root, cfg):
    daemon = procs.orphan("sleep 711", "sleep 711")  # its session leader is gone, reparented to init
    stray = procs.orphan("sleep 712", "sleep 712")
    unit = f"{cgroups.tag}-train.service"
    path = cgroups.move(cgroups.systemd, f"{cgroups.tag}/system.slice/{unit}", daemon)
    assert f":{path}\n" in Path(f"/proc/{daemon}/cgroup").read_text()
    scen = scenario([{"pid": daemon, "gpu": 0, "memory": "2GiB"}, {"pid": stray, "gpu": 1, "memory": "1GiB"}])

    snap = sample(scen, run_root.root)
    d, s = snap.holder(daemon), snap.holder(stray)
    assert d.owner.kind == SERVICE and d.owner.unit == unit and d.owner.cgroup == path
    assert d.verdict.kind == NOT_ORPHAN and d.verdict.reason.startswith(f"managed by systemd unit {unit}; ")
    assert s.verdict.kind == ORPHAN  # the same layout outside the unit: the session test decides
    assert [r.pid for r in snap.roots] == [stray]

    out = run_gputop("status", "--scenario", str(scen))
    assert out.returncode == 0, out.stderr
    header, *rows = _holder_table(out.stdout)
    assert "OWNER" in header
    assert any(r.startswith(str(daemon)) and unit in r and "not-orphan" in r for r in rows)
    assert f"pid {daemon}: not-orphan: managed by systemd unit {unit}" in out.stdout

    data = json.loads(run_gputop("status", "--json", "--scenario", str(scen)).stdout)
    h = next(x for x in data["holders"] if x["pid"] == daemon)
    assert h["owner"]["kind"] == "service" and h["owner"]["unit"] == unit and h["owner"]["cgroup"] == path
    assert all("owner" in c for c in h["chain"])

    # The destructive path: reap --apply takes the stray and leaves the unit's daemon alive.
    out = run_gputop("reap", "--apply", "--scenario", str(scen))
    assert out.returncode == 0, out.stdout + out.stderr
    assert wait_gone(stray)
    assert Path(f"/proc/{daemon}").exists() and read_owner(daemon).unit == unit


def test_a_long_lived_sampler_sees_a_cgroup_move_once_its_owners_are_due(procs, scenario, cgroups, run_root):
    # The owner of a known process is re-read with its command line (through the pinned dir) every
    # static_ttl: a move into a unit shows then, and not before.
    daemon = procs.orphan("sleep 714", "sleep 714")
    scen = scenario([{"pid": daemon, "gpu": 0, "memory": "2GiB"}])
    s = Sampler([SimulatedBackend(scen)], config=Config(protect=[], nohup_protects=False),
                run_root=run_root.root)
    now = [1000.0]
    s._static.clock = s._owners.clock = lambda: now[0]
    assert s.sample().holder(daemon).verdict.kind == ORPHAN
    unit = f"{cgroups.tag}-late.service"
    cgroups.move(cgroups.systemd, f"{cgroups.tag}/system.slice/{unit}", daemon)
    now[0] += 2.0
    assert s.sample().holder(daemon).owner.kind != SERVICE  # within the ttl: the owner read before
    now[0] += 4.0
    h = s.sample().holder(daemon)
    assert h.owner.kind == SERVICE and h.owner.unit == unit and h.verdict.kind == NOT_ORPHAN


def _holder_table(text: str) -> list[str]:
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.split()[:1] == ["PID"])
    out = [lines[i]]
    for line in lines[i + 1:]:
        if not line.strip() or not line.lstrip()[0].isdigit():
            break
        out.append(line)
    return out


def test_session_scope_follows_logind(procs, scenario, cgroups, run_root, cfg):
    worker = procs.orphan("sleep 713", "sleep 713")
    cgroups.move(cgroups.systemd, f"{cgroups.tag}/user.slice/user-0.slice/session-77.scope", worker)
    scen = scenario([{"pid": worker, "gpu": 0}])

    run_root[77] = "closing"
    h = sample(scen, run_root.root).holder(worker)
    assert h.owner.kind == SESSION and h.owner.session == "77" and h.owner.session_state == "closing"
    assert h.verdict.kind == ORPHAN
    assert h.verdict.reason.startswith("logind session 77 is closing (its user logged out); session leader pid")

    run_root[77] = "active"
    h = sample(scen, run_root.root).holder(worker)
    assert h.verdict.kind == NOT_ORPHAN and h.verdict.reason.startswith("logind session 77 is active")
    # The CLI reads $GPUTOP_RUN_ROOT: reap finds nothing to take while the user is logged in.
    out = run_gputop("reap", "--scenario", str(scen))
    assert "no orphan tree" in out.stdout and f"skipped: pid {worker} would be an orphan" in out.stdout

    os.unlink(os.path.join(run_root.root, "systemd", "sessions", "77"))
    h = sample(scen, run_root.root).holder(worker)
    assert h.owner.session_state == "gone" and h.verdict.kind == ORPHAN
    assert "logind session 77 is gone" in h.verdict.reason


def test_slurm_job_v1_freezer(procs, scenario, cgroups, run_root, cfg):
    env = dict(os.environ, SLURM_JOB_ID="4242", SLURM_JOB_UID="0", SLURM_STEP_ID="0")
    job = procs.spawn(["sleep", "714"], env=env).pid
    cgroups.move("freezer", f"slurm_{cgroups.tag}/uid_0/job_4242/step_0", job)
    scen = scenario([{"pid": job, "gpu": 0}])
    h = sample(scen, run_root.root).holder(job)
    assert (h.owner.kind, h.owner.job, h.owner.step, h.owner.uid) == (SLURM, 4242, "0", 0)
    assert slurm_job_from_environ(job) == SlurmEnv(4242, 0, "0")
    out = run_gputop("status", "--scenario", str(scen))
    assert "slurm 4242.0" in out.stdout


def test_slurm_job_v2_unified(procs, cgroups):
    step = procs.spawn(["sleep", "715"]).pid
    cgroups.move("unified", f"{cgroups.tag}/system.slice/slurmstepd.scope/job_4243/step_batch/user/task_0", step)
    owner = read_owner(step)
    assert (owner.kind, owner.job, owner.step) == (SLURM, 4243, "batch")
    assert slurm_job_from_environ(step) is None  # no SLURM_JOB_ID in its environment


def test_environ_of_another_users_process_is_none_not_an_error(procs):
    env = dict(os.environ, SLURM_JOB_ID="4244")
    job = procs.spawn(["sleep", "716"], env=env).pid
    code = ("import sys; from gputop.core.ownership import slurm_job_from_environ as f; "
            f"print(f({job}), f({job}, '/nonexistent'))")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=30, cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "None"]
    assert slurm_job_from_environ(job) == SlurmEnv(4244)  # root reads it
