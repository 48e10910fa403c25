"""Allocation against use (issue 29) under a REAL single-node Slurm with GPU GRES.

One Slurm for the module (about 1 s to start). Its GPUs are stand-in char devices (mknod 195:N) named by
gres.conf ``File=`` (AutoDetect=off), listed out of order and with minors that are not the GPUs' positions,
so that only the IDX -> file -> minor -> GPU path puts each job on the right GPU. The simulated GPUs carry
the same minors (scenario ``minor``); the holders are real processes of real jobs, of no job, and of a
second real user who claims a job in its environment.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.functional.test_slurm import SlurmNode, _kill_marked, _missing, _wait, alive, escapees, kill_tree, \
    wait_marked

pytestmark = pytest.mark.xdist_group("slurm")

USER = f"gal{os.getpid() % 100000}"
# Scenario GPU i has minor MINORS[i]: GPU 0 is /dev/nvidia3, and so on.
MINORS = [3, 1, 0, 2]


class AllocNode(SlurmNode):
    """The test Slurm with 4 GPU GRES on mknod'd nodes and no prolog or epilog (leftovers stay)."""

    def write(self, proctrack: str = "linuxproc") -> None:
        super().write(proctrack)
        d = self.dir
        conf = (d / "slurm.conf").read_text()
        conf = "\n".join(line for line in conf.splitlines() if not line.startswith(("Prolog=", "Epilog=")))
        (d / "slurm.conf").write_text(conf.replace("Gres=gpu:2", "Gres=gpu:4") + "\n")
        for m in range(4):
            node = d / f"nvidia{m}"
            if not node.exists():
                os.mknod(node, 0o666 | 0o020000, os.makedev(195, m))
        # Out of order on purpose: slurmd sorts them by the number the file name ends with.
        (d / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={d}/nvidia[2-3]\nName=gpu File={d}/nvidia1\n"
                                     f"Name=gpu File={d}/nvidia0\n")
        self.scenario([])

    def scenario(self, holders: list[dict]) -> None:
        tmp = self.dir / "scenario.tmp"
        tmp.write_text(yaml.safe_dump({"gpus": [{"name": f"Sim {i}", "memory_total": "80GiB", "minor": m}
                                                for i, m in enumerate(MINORS)], "holders": holders}))
        tmp.chmod(0o644)
        os.replace(tmp, self.dir / "scenario.yaml")

    def job_idx(self, job: int) -> list[int]:
        out = self.run("scontrol", "show", "job", "-d", str(job)).stdout
        from gputop.core.slurm_jobs import gres_gpus

        return gres_gpus(out) or []


def gpu_of_idx(idx: int) -> int:
    """The scenario GPU that Slurm's IDX names: IDX i is /dev/nvidia<i> (sorted files), minor i."""
    return MINORS.index(idx)


@pytest.fixture(scope="module")
def node():
    if os.geteuid() != 0:
        pytest.skip("needs root: starts munged, slurmctld and slurmd, and reads other users' environ")
    missing = _missing()
    if missing:
        pytest.skip(f"Slurm or munge is not installed (missing {', '.join(missing)})")
    base = Path(tempfile.mkdtemp(prefix="gal-slurm-"))
    base.chmod(0o755)
    n = AllocNode(base)
    n.write()
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", "-K", "UID_MIN=61400",
                    "-K", "UID_MAX=61499", USER], capture_output=True)
    try:
        n.start()
    except Exception as e:
        n.stop()
        pytest.skip(f"could not start Slurm here: {e}")
    yield n
    n.run("scancel", "--full", "-u", "root", check=False)
    n.stop()
    for pid in n.seen:
        kill_tree(pid)
    _kill_marked(str(base))
    subprocess.run(["userdel", USER], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


def status(n: AllocNode, *extra) -> dict:
    p = n.gputop("status", "--json", *extra)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def running(n: AllocNode, job: int) -> None:
    _wait(lambda: n.job_state(job) == "RUNNING", 30, f"job {job} to run")


def outsider(n: AllocNode, tag: str, user: str | None = None, env: dict | None = None) -> int:
    """A process started outside Slurm (setsid, its own session), as root or as ``user``."""
    pre = []
    if user is not None:
        pw = pwd.getpwnam(user)
        pre = ["setpriv", "--reuid", str(pw.pw_uid), "--regid", str(pw.pw_gid), "--clear-groups"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    subprocess.Popen([*pre, "setsid", "sh", "-c", f"sleep 600; : {n.dir} {tag}-by"], env={**clean, **(env or {})},
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/tmp")
    return wait_marked(n, tag, ("by",))["by"]


def test_each_gpu_names_its_job_and_each_holder_its_standing(node):
    n = node
    a = n.submit(escapees(n, "a", ("setsid", "nohup")), gres="gpu:1")
    b = n.submit(escapees(n, "b", ("setsid",)), gres="gpu:2")
    running(n, a), running(n, b)
    pa, pb = wait_marked(n, "a", ("setsid", "nohup")), wait_marked(n, "b", ("setsid",))
    (ia,), ib = n.job_idx(a), n.job_idx(b)
    ga, gb = gpu_of_idx(ia), [gpu_of_idx(i) for i in ib]
    free = ({0, 1, 2, 3} - {ga, *gb}).pop()
    squat = outsider(n, "sq")  # root, outside Slurm, on b's GPU
    forged = outsider(n, "fg", USER, {"SLURM_JOB_ID": str(b), "SLURM_JOB_UID": "0"})  # claims job b
    n.scenario([{"pid": pa["setsid"], "gpu": ga, "memory": "1GiB"},  # inside
                {"pid": pa["nohup"], "gpu": free, "memory": "1GiB"},  # outside: a GPU no job has
                {"pid": pb["setsid"], "gpu": gb[0], "memory": "1GiB"},  # inside
                {"pid": squat, "gpu": gb[0], "memory": "1GiB"},  # squatter: no job, b's GPU
                {"pid": forged, "gpu": gb[1], "memory": "1GiB"}])  # squatter: claims b, not b's user
    doc = status(n)
    gpus = {g["index"]: g for g in doc["gpu"]["gpus"]}
    assert gpus[ga]["allocation"]["job_id"] == a and gpus[ga]["allocation"]["user"] == "root"
    assert {gpus[g]["allocation"]["job_id"] for g in gb} == {b}
    assert gpus[free]["allocation"] is None
    assert f"nvidia{ia} (minor {ia})" in gpus[ga]["allocation"]["detail"]
    assert gpus[ga]["allocation"]["since"] is not None and doc["allocation"]["error"] is None
    st = {h["pid"]: h["standing"] for h in doc["holders"]}
    assert st[pa["setsid"]]["kind"] == "inside" and st[pb["setsid"]]["kind"] == "inside"
    assert st[pa["nohup"]]["kind"] == "outside", st[pa["nohup"]]
    assert st[squat]["kind"] == "squatter" and f"allocated to job {b}" in st[squat]["reason"]
    assert st[forged]["kind"] == "squatter" and "not the job's user" in st[forged]["reason"], st[forged]
    # The table: each GPU line names its job; the flagged holders have a line each.
    text = n.gputop("status").stdout
    gpu_line = next(line for line in text.splitlines() if line.strip().startswith(f"{ga} "))
    assert f"{a} (root)" in gpu_line
    assert f"pid {squat}: squatter" in text and f"pid {pa['nohup']}: outside" in text
    assert f"pid {pa['setsid']}: inside" not in text  # only the flagged standings get a line
    # gputop slurm check reports the squatters and the process outside its allocation (and does not fail:
    # it drains the node only for strays of ended jobs).
    chk = n.gputop("slurm", "check", "--json")
    assert chk.returncode == 0, chk.stderr
    rep = json.loads(chk.stdout)
    assert sorted(rep["squatters"]) == sorted([squat, forged]) and rep["outside"] == [pa["nohup"]]
    assert f"squatter: pid {squat} " in chk.stderr and f"outside: pid {pa['nohup']} " in chk.stderr
    n.go("a"), n.go("b")


def test_an_allocated_gpu_nobody_holds_is_idle_and_a_finished_jobs_leftover_is_an_orphan(node):
    n = node
    job = n.submit(escapees(n, "c", ("setsid",)), gres="gpu:1")
    running(n, job)
    left = wait_marked(n, "c", ("setsid",))["setsid"]
    (idx,) = n.job_idx(job)
    g = gpu_of_idx(idx)
    n.scenario([])
    doc = status(n)
    alloc = {x["index"]: x["allocation"] for x in doc["gpu"]["gpus"]}
    assert alloc[g]["job_id"] == job and alloc[g]["idle_for"] is not None
    # The job ends; its leftover holds the GPU it had: an orphan as before, on a GPU no job has now.
    n.scenario([{"pid": left, "gpu": g, "memory": "1GiB"}])
    n.go("c")
    _wait(lambda: n.job_state(job) in ("COMPLETED", "COMPLETING"), 30, f"job {job} to end")
    _wait(lambda: status(n)["gpu"]["gpus"][g]["allocation"] is None, 20, "the allocation to go")
    h = {x["pid"]: x for x in status(n)["holders"]}[left]
    assert h["verdict"]["kind"] == "orphan" and f"Slurm job {job} ended" in h["verdict"]["reason"]
    assert h["standing"]["kind"] == "unallocated", h["standing"]
    assert alive(left)


def test_a_slurmctld_that_does_not_answer_makes_the_allocation_unknown_not_empty(node):
    n = node
    job = n.submit(escapees(n, "d", ("setsid",)), gres="gpu:1")
    running(n, job)
    pid = wait_marked(n, "d", ("setsid",))["setsid"]
    n.scenario([{"pid": pid, "gpu": gpu_of_idx(n.job_idx(job)[0]), "memory": "1GiB"}])
    ctld = int((n.dir / "run" / "slurmctld.pid").read_text().split()[0])
    os.kill(ctld, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        doc = status(n)
        took = time.monotonic() - t0
    finally:
        os.kill(ctld, signal.SIGCONT)
    assert doc["allocation"]["error"] and "did not answer" in doc["allocation"]["error"]
    assert all(g["allocation"] is None for g in doc["gpu"]["gpus"])
    assert {h["pid"]: h["standing"]["kind"] for h in doc["holders"]}[pid] == "unknown"
    assert took < 12, took  # the timeouts bound it (2 s each), nothing hangs
    n.go("d")


def test_the_guard_kills_a_squatter_after_its_duration_and_notes_an_idle_allocation(node, monkeypatch, tmp_path):
    from gputop.core.sampler import Sampler
    from gputop.guard.engine import Engine
    from gputop.guard.policy import parse_policy

    n = node
    job = n.submit(escapees(n, "e", ("setsid",)), gres="gpu:1")
    idle_job = n.submit(escapees(n, "f", ("setsid",)), gres="gpu:1")
    running(n, job), running(n, idle_job)
    mine = wait_marked(n, "e", ("setsid",))["setsid"]
    g = gpu_of_idx(n.job_idx(job)[0])
    g_idle = gpu_of_idx(n.job_idx(idle_job)[0])
    free = ({0, 1, 2, 3} - {g, g_idle}).pop()
    squat = outsider(n, "sq2")
    loner = outsider(n, "ln")  # no job, on a GPU no job has: unallocated, left alone
    n.scenario([{"pid": mine, "gpu": g, "memory": "1GiB"}, {"pid": squat, "gpu": g, "memory": "1GiB"},
                {"pid": loner, "gpu": free, "memory": "1GiB"}])
    for k, v in {"SLURM_CONF": str(n.dir / "slurm.conf"), "GPUTOP_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
                 "GPUTOP_STATE_DIR": str(tmp_path / "state")}.items():
        monkeypatch.setenv(k, v)
    policy = parse_policy(yaml.safe_dump({"rules": [
        {"name": "kill squatters", "conditions": [{"type": "standing", "operator": "==", "value": "squatter",
                                                   "duration": "1s"}], "action": "kill", "force": True},
        {"name": "idle allocations", "conditions": [{"type": "allocation_idle", "operator": ">=", "value": 0}],
         "action": "log"}]}))
    hits: list[dict] = []
    sampler = Sampler.open("simulated", str(n.dir / "scenario.yaml"))
    try:
        eng = Engine(policy, sampler=sampler, record=hits.append)
        eng.evaluate(sampler.sample(), "enforce")
        assert not [h for h in hits if h["rule"] == "kill squatters"]  # not yet: 1 s to hold
        time.sleep(1.2)
        eng.evaluate(sampler.sample(), "enforce")
    finally:
        sampler.close()
    kills = [h for h in hits if h["rule"] == "kill squatters"]
    assert [h["pid"] for h in kills] == [squat] and kills[0]["ok"], kills
    _wait(lambda: not alive(squat), 10, "the squatter to be gone")
    assert alive(mine) and alive(loner)  # the job's own process and an unallocated holder survive
    idle = [h for h in hits if h["rule"] == "idle allocations"]
    assert idle and {h["gpus"][0] for h in idle} == {g_idle}, idle
    assert f"allocated to job {idle_job}" in idle[0]["target"]
    audit = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert any(r["action"] == "kill" and r["target"]["pid"] == squat and r["ok"] for r in audit)
    # --test-policies explains the idle-allocation rule per allocated GPU, and changes nothing.
    (n.dir / "policy.yaml").write_text(yaml.safe_dump({"rules": [
        {"name": "idle", "conditions": [{"type": "allocation_idle", "operator": ">=", "value": 0}],
         "action": "log"}]}))
    p = n.gputop("guard", "--test-policies", "--policy-file", str(n.dir / "policy.yaml"))
    assert p.returncode == 0, p.stderr
    assert f"GPU {g_idle} (allocated to job {idle_job}, user root): would log" in p.stdout, p.stdout
    assert f"GPU {g} (allocated to job {job}, user root): no action" in p.stdout
    assert alive(mine)
    n.go("e"), n.go("f")


def test_metrics_carry_each_gpus_allocation_and_each_processs_standing(node):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from tests.functional.servehelp import Served

    n = node
    job = n.submit(escapees(n, "m", ("setsid",)), gres="gpu:1")
    running(n, job)
    mine = wait_marked(n, "m", ("setsid",))["setsid"]
    g = gpu_of_idx(n.job_idx(job)[0])
    squat = outsider(n, "msq")
    n.scenario([{"pid": mine, "gpu": g, "memory": "1GiB"}, {"pid": squat, "gpu": g, "memory": "1GiB"}])
    s = Served("--interval", "0.3", "--metrics-only", env={
        "GPUTOP_SCENARIO": str(n.dir / "scenario.yaml"), "SLURM_CONF": str(n.dir / "slurm.conf"),
        "GPUTOP_STATE_DIR": str(n.dir / "mstate"), "GPUTOP_AUDIT_LOG": str(n.dir / "maudit.jsonl"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        def fams():
            text = httpx.get(s.url + "/metrics").text
            got = {f.name: f for f in text_string_to_metric_families(text)}
            return got if got.get("gputop_process_standing_info") and got["gputop_process_standing_info"].samples \
                else None

        got = _wait(fams, 20, "the standing series")
    finally:
        s.stop()
    alloc = [x.labels for x in got["gputop_gpu_allocation_info"].samples]
    assert {"gpu": str(g), "job": str(job), "user": "root", "source": "slurm"}.items() <= alloc[0].items()
    standing = {x.labels["pid"]: x.labels["standing"] for x in got["gputop_process_standing_info"].samples}
    assert standing == {str(mine): "inside", str(squat): "squatter"}
    n.go("m")
    kill_tree(squat)
