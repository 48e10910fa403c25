"""The epilog clears a finished job's leftovers as one group (no Slurm needed: `slurm epilog --job N --uid U`,
job membership faked through SLURM_JOB_ID / SLURM_JOB_UID in the real processes' environment).

All of the job's processes are stopped together, signalled together, waited on within one grace, killed
together; what the job starts meanwhile (a supervisor's new child, a detached spawn) is caught; a process of
another job of the same user survives. Real processes throughout."""

from __future__ import annotations

import json
import os
import sys
import time

import psutil
import pytest

from tests.conftest import run_gputop
from tests.functional.actions_helpers import alive as _alive, write_config
from tests.functional.test_guard_daemon import poll as _wait

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and pidfds")

SUPERVISOR = """
import signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a supervisor that outlives SIGTERM and restarts its worker
dfl = lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)
while True:
    subprocess.Popen(["sh", "-c", "sleep 600; : " + sys.argv[1] + "-child"], preexec_fn=dfl).wait()
"""

# Ignores SIGTERM and keeps starting detached workers (a double fork into a new session: reparented to
# init, out of reach of a walk down the tree; only the job's environment says whose they are).
SPAWNER = """trap '' TERM
while :; do
  ( setsid sh -c "sleep 600; : $1-late" </dev/null >/dev/null 2>&1 & )
  sleep 0.2
done
"""


def _marked(marker: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["status"] != psutil.STATUS_ZOMBIE and marker in cmd and p.pid != os.getpid():
            out.append(p.pid)
    return out


@pytest.fixture
def marker():
    m = f"gti-epilog-{os.getpid()}-{time.monotonic_ns()}"
    yield m
    for pid in _marked(m):  # detached leftovers the procs fixture does not know
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def _job_env(job: int) -> dict:
    return {**os.environ, "SLURM_JOB_ID": str(job), "SLURM_JOB_UID": str(os.getuid())}


def _ignorers(procs, job: int, marker: str, n: int) -> list[int]:
    """``n`` leftovers of ``job`` that ignore SIGTERM, left behind in a dead session."""
    loops = " ".join(f"sh -c \"trap '' TERM; while :; do sleep 1; done; : {marker}-ign{i}\" &" for i in range(n))
    procs.spawn(["setsid", "sh", "-c", f"{loops} exit 0"], env=_job_env(job)).wait(10)
    return [procs.wait_for(f"sh -c trap '' TERM; while :; do sleep 1; done; : {marker}-ign{i}") for i in range(n)]


def _epilog(job: int, *extra) -> tuple[int, dict, str, float]:
    t = time.monotonic()
    p = run_gputop("slurm", "epilog", "--job", str(job), "--uid", str(os.getuid()), "--json", *extra)
    took = time.monotonic() - t
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {}, p.stderr, took


def _signalled(audit_path) -> set[int]:
    out = set()
    for line in audit_path.read_text().splitlines():
        for s in json.loads(line).get("signals") or []:
            out.update(s.get("pids") or [])
    return out


def test_ten_term_ignoring_leftovers_and_a_supervisor_are_cleared_in_one_grace(procs, scenario, tmp_path,
                                                                                 monkeypatch, marker):
    write_config(tmp_path / "config.yaml", monkeypatch)
    audit = tmp_path / "audit.jsonl"
    monkeypatch.setenv("GPUTOP_AUDIT_LOG", str(audit))
    job, other_job = 4261, 4262
    ign = _ignorers(procs, job, marker, 10)
    procs.spawn(["setsid", "sh", "-c", f"{sys.executable} -c '{SUPERVISOR}' {marker} & exit 0"],
                env=_job_env(job)).wait(10)
    child = procs.wait_for(f"sh -c sleep 600; : {marker}-child")
    sup = psutil.Process(child).ppid()
    # The same user's process in another job, which ignores SIGTERM too: never touched.
    by = _ignorers(procs, other_job, marker + "-by", 1)[0]
    scenario(holders=[{"pid": ign[0], "gpu": 0, "memory": "1GiB"}, {"pid": child, "gpu": 1, "memory": "1GiB"},
                      {"pid": by, "gpu": 1, "memory": "1GiB"}])
    grace = 1.5
    rc, out, err, took = _epilog(job, "--grace", str(grace))
    assert rc == 0, err
    assert {m["pid"] for m in out["members"]} >= {*ign, sup, child}
    for pid in [*ign, sup, child]:
        assert not _alive(pid), pid
    left = [p for p in _marked(marker) if p not in _marked(f"{marker}-by")]
    assert not left, f"leftovers of the job survived: {left}"
    assert _alive(by) and by not in _signalled(audit)
    # One grace for all of them (the old one-by-one kill took 11 x grace here): shown by the audit below (one
    # SIGTERM event naming them all, no per-process kill), not by the wall time, which a loaded machine stretches.
    print(f"epilog cleared {len(out['members'])} leftovers in {took:.2f}s (grace {grace}s)")
    rec = [json.loads(x) for x in audit.read_text().splitlines()]
    group = [r for r in rec if r["action"] == "reap-group"]
    assert len(group) == 1 and group[0]["ok"] and group[0]["target"]["slurm_job"] == job
    sigs = [s["signal"] for s in group[0]["signals"]]
    assert sigs.index("SIGSTOP") < sigs.index("SIGTERM") < sigs.index("SIGKILL")
    term = next(s for s in group[0]["signals"] if s["signal"] == "SIGTERM")
    assert set(term["pids"]) >= {*ign, sup}  # signalled together, in one event
    assert not [r for r in rec if r["action"] == "kill"]
    summary = [r for r in rec if r["action"] == "slurm-epilog"][-1]
    assert summary["ok"] and summary["survivors"] == []


def test_a_process_the_job_starts_during_the_grace_is_caught(procs, scenario, tmp_path, monkeypatch, marker):
    write_config(tmp_path / "config.yaml", monkeypatch)
    audit = tmp_path / "audit.jsonl"
    monkeypatch.setenv("GPUTOP_AUDIT_LOG", str(audit))
    job = 4263
    script = tmp_path / "spawner.sh"
    script.write_text(SPAWNER)
    procs.spawn(["setsid", "sh", "-c", f"sh {script} {marker} & exit 0"], env=_job_env(job)).wait(10)
    spawner = procs.wait_for(f"sh {script} {marker}")
    _wait(lambda: len(_marked(f"{marker}-late")) >= 2, 10, "the spawner's first workers")
    procs.spawn(["setsid", "sh", "-c", f"sh -c 'sleep 600; : {marker}-gpu' & exit 0"], env=_job_env(job)).wait(10)
    holder = procs.wait_for(f"sh -c sleep 600; : {marker}-gpu")  # the job's GPU holder; the spawner holds none
    bystander = procs.orphan(f"sh -c 'sleep 600; : {marker}-nojob'", f"sh -c sleep 600; : {marker}-nojob")
    scenario(holders=[{"pid": holder, "gpu": 0, "memory": "1GiB"}, {"pid": bystander, "gpu": 0, "memory": "1GiB"}])
    rc, out, err, took = _epilog(job, "--grace", "2")
    assert rc == 0, err
    time.sleep(0.5)  # a worker the epilog missed would be running now
    left = [p for p in _marked(marker) if p != bystander]
    assert not left, f"leftovers of the job survived the epilog: {left}; {err}"
    assert _alive(bystander) and bystander not in _signalled(audit)
    group = [json.loads(x) for x in audit.read_text().splitlines() if '"reap-group"' in x][-1]
    late = set(group["details"]["started_during_reap"]) | set(group["details"]["joined_by_session"])
    assert late, "the spawner's workers started during the grace were not stopped and killed with the rest"


def test_a_protected_leftover_is_left_alone_and_reported(procs, scenario, tmp_path, monkeypatch, marker):
    write_config(tmp_path / "config.yaml", monkeypatch, protect_cmdline=[f"{marker}-keep"])
    job = 4264
    env = _job_env(job)
    for kind in ("keep", "go"):
        procs.spawn(["setsid", "sh", "-c", f"sh -c 'sleep 600; : {marker}-{kind}' & exit 0"], env=env).wait(10)
    keep = procs.wait_for(f"sh -c sleep 600; : {marker}-keep")
    go = procs.wait_for(f"sh -c sleep 600; : {marker}-go")
    scenario(holders=[{"pid": keep, "gpu": 0, "memory": "1GiB"}])
    rc, out, err, _ = _epilog(job, "--grace", "1")
    assert rc == 1 and f"GPU holder pid {keep}" in err, err  # it survives, named: Slurm drains the node
    assert "left alone (protected)" in err, err
    assert _alive(keep) and not _alive(go)
    left = out["results"][0]["details"]["left_alone"]
    assert [e["pid"] for e in left] == [keep] and left[0]["rule"] == "protected"


# A protected leftover of the job (its command line names "-keep"). It starts, through a helper outside
# the job (its environment has no SLURM_JOB_ID), a process of the job again at once (x1), and another (x2)
# once it sees the job's other leftover ($3) stopped, that is while the epilog reaps. Both are under the
# protected process: left alone with it, as the first plan leaves its subtree.
KEEPER = """job=$1; m=$2; g=$3; out=$4; inner=$5
env -u SLURM_JOB_ID sh "$inner" "$job" "$m-x1" &
while :; do
  s=; read -r _p _c s _r < /proc/$g/stat 2>/dev/null
  case "$s" in T) echo T > "$out"; break;; ""|Z) echo gone > "$out"; break;; esac
  sleep 0.01
done
env -u SLURM_JOB_ID sh "$inner" "$job" "$m-x2" &
wait
"""
# The helper outside the job: its child is in the job again (SLURM_JOB_ID set back).
INNER = """SLURM_JOB_ID=$1 sh -c "while :; do sleep 1; done; : $2"
:
"""


def test_members_under_a_protected_leftover_survive_the_group_reap_and_every_round(procs, scenario, tmp_path,
                                                                                   monkeypatch, marker):
    write_config(tmp_path / "config.yaml", monkeypatch, protect_cmdline=[f"{marker}-keep"])
    audit = tmp_path / "audit.jsonl"
    monkeypatch.setenv("GPUTOP_AUDIT_LOG", str(audit))
    job, other_job = 4265, 4266
    go = _ignorers(procs, job, marker, 1)[0]  # the job's leftover that is reaped (it ignores SIGTERM)
    keeper, inner, seen = tmp_path / "keeper.sh", tmp_path / "inner.sh", tmp_path / "seen"
    keeper.write_text(KEEPER)
    inner.write_text(INNER)
    procs.spawn(["setsid", "sh", "-c", f"sh {keeper} {job} {marker} {go} {seen} {inner} {marker}-keep & exit 0"],
                env=_job_env(job)).wait(10)
    keep = procs.wait_for(f"sh {keeper} {job}")
    x1 = procs.wait_for(f"sh -c while :; do sleep 1; done; : {marker}-x1")
    by = _ignorers(procs, other_job, marker + "-by", 1)[0]  # the same user's process in another job
    nojob = procs.orphan(f"sh -c 'sleep 600; : {marker}-nojob'", f"sh -c sleep 600; : {marker}-nojob")
    scenario(holders=[{"pid": go, "gpu": 0, "memory": "1GiB"}, {"pid": by, "gpu": 1, "memory": "1GiB"}])
    rc, out, err, _ = _epilog(job, "--grace", "2")
    assert seen.read_text().strip() == "T", "the keeper did not start x2 while the reap held the job stopped"
    x2 = procs.wait_for(f"sh -c while :; do sleep 1; done; : {marker}-x2")
    assert not _alive(go), err
    signalled = _signalled(audit)
    for pid in (keep, x1, x2, by, nojob):
        assert _alive(pid) and pid not in signalled, (pid, err)
    assert rc == 0, err  # nothing it targeted survived; the protected subtree is a warning
    group = [json.loads(x) for x in audit.read_text().splitlines() if '"reap-group"' in x][-1]
    assert {m["pid"] for m in group["details"]["members"]}.isdisjoint({keep, x1, x2})
    left = group["details"]["left_alone"]
    assert [e["pid"] for e in left] == [keep] and x1 in left[0]["subtree"]


def test_the_group_reap_lists_proc_once_per_round(procs, scenario, tmp_path, monkeypatch, marker):
    # Membership is read from each round's own table (the one the executor scanned), and the plan's scan is
    # also the lineage baseline: every listing of /proc is a table scan, one at the start and one a round.
    import dataclasses

    from gputop.core import slurm_jobs as sl
    from gputop.actions import executor
    from gputop.backends.simulated import SimulatedBackend
    from gputop.commands.slurm import _reap_job
    from gputop.core.config import Config
    from gputop.core.procs import ProcTable, self_and_ancestors
    from gputop.core.sampler import Sampler

    monkeypatch.setenv("GPUTOP_AUDIT_LOG", str(tmp_path / "audit.jsonl"))
    job, other_job = 4267, 4268
    ign = _ignorers(procs, job, marker, 3)
    by = _ignorers(procs, other_job, marker + "-by", 1)[0]
    path = scenario(holders=[{"pid": ign[0], "gpu": 0, "memory": "1GiB"}, {"pid": by, "gpu": 1, "memory": "1GiB"}])
    config = dataclasses.replace(Config(), protect=(), protect_cmdline=(), nohup_protects=False)
    members = sl.job_processes(job, os.getuid(), ProcTable(), exclude=self_and_ancestors())
    sampler = Sampler([SimulatedBackend(str(path))], config=config)
    sampler.job_states.assume(job, "COMPLETING", "its epilog is running")
    snap = sampler.sample()
    counts = {"listdir": 0, "scan": 0, "round": 0}
    real_listdir, real_scan, real_round = os.listdir, ProcTable.scan_all, executor.Executor.new_members

    def listdir(path="."):
        counts["listdir"] += str(path) == "/proc"
        return real_listdir(path)

    def scan_all(self):
        counts["scan"] += 1
        return real_scan(self)

    def new_members(self):
        counts["round"] += 1
        return real_round(self)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(ProcTable, "scan_all", scan_all)
    monkeypatch.setattr(executor.Executor, "new_members", new_members)
    try:
        (result,) = _reap_job(sampler, config, snap, members, job, os.getuid(), 1.0, time.monotonic() + 60)
    finally:
        monkeypatch.undo()
        sampler.close()
    assert result.ok, result.message
    assert not any(_alive(p) for p in ign) and _alive(by)
    print(f"group reap: {counts['round']} rounds, {counts['scan']} scans, {counts['listdir']} listings of /proc")
    assert counts["round"] >= 3
    assert counts["listdir"] == counts["scan"] == counts["round"] + 1, counts
