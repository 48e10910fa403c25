"""gputop under a REAL single-node Slurm, started by these tests (see /work/shared/slurm.md for the setup).

One bring-up per session (munged, slurmctld, slurmd; about 1 s), stopped in order at the end. The GPUs are
simulated: a scenario file names the live PIDs that the jobs leave behind. slurmd runs gputop's epilog and
prolog through small wrapper scripts in the temp dir, which point gputop at the test's scenario, config and
audit log, and which a test can hold (so that it sees the leftovers before the epilog removes them).
"""

from __future__ import annotations

import json
import os
import re
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import ROOT, add_user, del_user, unique_name

# One real Slurm (and the node's one munged) per run: every test here runs on one xdist worker, one after another
# (`--dist loadgroup`); the session fixture below then starts it once. A new test file that starts Slurm joins it.
pytestmark = pytest.mark.xdist_group("slurm")

BINARIES = ("munged", "munge", "unmunge", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "scancel")
USER = unique_name("gti16a")  # unique to this test process (parallel workers and runs)


def _missing() -> list[str]:
    return [b for b in BINARIES if not (shutil.which(b) or os.path.exists(f"/usr/sbin/{b}"))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, timeout: float, what: str, step: float = 0.05):
    """Poll ``cond`` until it is true. The timeouts below only bound a failure: they are generous because
    slurmctld and slurmd, like every test, run slowly on a loaded machine (a parallel suite)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(step)
    raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")


WRAPPER = """#!/bin/sh
# {kind} for the test's Slurm: run the worktree's gputop on the test's scenario, config and audit log.
export PYTHONPATH={root} GPUTOP_SCENARIO={d}/scenario.yaml GPUTOP_CONFIG={d}/config.yaml
export GPUTOP_AUDIT_LOG={d}/audit.jsonl GPUTOP_STATE_DIR={d}/gstate SLURM_CONF={d}/slurm.conf
[ -e {d}/skip.{kind}.$SLURM_JOB_ID ] && exit 0
n=0
while [ -e {d}/hold.{kind}.$SLURM_JOB_ID ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done
{python} -m gputop slurm {kind} --json > {d}/{kind}.$SLURM_JOB_ID.out 2> {d}/{kind}.$SLURM_JOB_ID.err
rc=$?
echo $rc > {d}/{kind}.$SLURM_JOB_ID.rc
exit $rc
"""


class SlurmNode:
    """munged + slurmctld + slurmd on this host, configured in a temp dir."""

    def __init__(self, base: Path):
        self.dir = base
        self.host = socket.gethostname()
        self.env = {**os.environ, "SLURM_CONF": str(base / "slurm.conf")}
        self.own_munged = False
        self.seen: list[int] = []  # every marked process a test found: their trees are killed at the end

    # -- bring-up
    def write(self, proctrack: str = "linuxproc") -> None:
        d = self.dir
        self.proctrack = proctrack
        for sub in ("state", "spool", "run", "log", "gstate"):
            (d / sub).mkdir(exist_ok=True)
        for kind in ("epilog", "prolog"):
            p = d / f"{kind}.sh"
            p.write_text(WRAPPER.format(kind=kind, d=d, root=ROOT, python=sys.executable))
            p.chmod(0o755)
        task = "task/cgroup" if proctrack == "cgroup" else "task/none"
        conf = f"""ClusterName=gti16
SlurmctldHost={self.host}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
MpiDefault=none
ProctrackType=proctrack/{proctrack}
TaskPlugin={task}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
SchedulerParameters=sched_min_interval=100000
Prolog={d}/prolog.sh
Epilog={d}/epilog.sh
GresTypes=gpu
NodeName={self.host} CPUs=2 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""
        (d / "slurm.conf").write_text(conf)
        for i in range(2):
            (d / f"gpu{i}").touch()
        (d / "gres.conf").write_text(f"Name=gpu File={d}/gpu[0-1]\n")
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=yes\nConstrainCores=yes\n")
        (d / "config.yaml").write_text(yaml.safe_dump({"protect": [], "nohup_protects": True}))
        self.scenario([])

    def munge_ok(self) -> bool:
        try:
            cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=5)
            return cred.returncode == 0 and subprocess.run(
                ["unmunge"], input=cred.stdout, capture_output=True, timeout=5).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def start(self) -> None:
        if not self.munge_ok():
            subprocess.run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "755", "/run/munge"], check=True)
            subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], check=True)
            self.own_munged = True
            _wait(self.munge_ok, 30, "munged")
        conf = str(self.dir / "slurm.conf")
        subprocess.run(["slurmctld", "-f", conf], check=True, env=self.env)
        subprocess.run(["slurmd", "-f", conf], check=True, env=self.env)
        _wait(lambda: self.node_state() == "idle", 90, "the node to be idle (see " + str(self.dir / "log") + ")",
              step=0.1)

    def stop(self) -> None:
        # In order, by pid file: slurmd, slurmctld, then munged (munged first makes slurmctld slow to stop).
        for name in ("slurmd", "slurmctld"):
            pidfile = self.dir / "run" / f"{name}.pid"
            try:
                pid = int(pidfile.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
                _wait(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", 15, name)
            except (OSError, ValueError, TimeoutError, psutil.Error):
                pass
        if self.own_munged:
            try:
                pid = int(Path("/run/munge/munged.pid").read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError):
                pass

    # -- use
    def run(self, *cmd, user: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        argv = list(cmd)
        if user is not None:
            pw = pwd.getpwnam(user)
            argv = ["setpriv", "--reuid", str(pw.pw_uid), "--regid", str(pw.pw_gid), "--clear-groups"] + argv
        p = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=30, cwd="/tmp")
        if check and p.returncode != 0:
            raise AssertionError(f"{argv}: exit {p.returncode}: {p.stderr.strip()}")
        return p

    def node_state(self) -> str:
        p = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
        return p.stdout.strip()

    def job_state(self, job: int) -> str:
        p = self.run("scontrol", "show", "job", "-o", str(job), check=False)
        for tok in p.stdout.split():
            if tok.startswith("JobState="):
                return tok[9:]
        return "FORGOTTEN" if "Invalid job id" in p.stderr else "?"

    def submit(self, script: str, user: str | None = None, gres: str | None = None, hold_epilog: bool = False,
               skip_epilog: bool = False) -> int:
        path = self.dir / f"job-{time.monotonic_ns()}.sh"
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)
        args = ["sbatch", "--parsable", "-o", "/dev/null", "-e", "/dev/null", "--chdir=/tmp"]
        if gres:
            args.append(f"--gres={gres}")
        job = int(self.run(*args, str(path), user=user).stdout.strip().split(";")[0])
        if hold_epilog:
            self.hold("epilog", job)
        if skip_epilog:
            self.skip("epilog", job)
        return job

    def hold(self, kind: str, job: int) -> None:
        (self.dir / f"hold.{kind}.{job}").touch()

    def skip(self, kind: str, job: int) -> None:
        (self.dir / f"skip.{kind}.{job}").touch()

    def restart(self, proctrack: str) -> None:
        self.stop()
        self.write(proctrack)
        self.start()

    def release(self, kind: str, job: int) -> None:
        (self.dir / f"hold.{kind}.{job}").unlink(missing_ok=True)

    def hook_result(self, kind: str, job: int, timeout: float = 60) -> tuple[int, dict | None, str]:
        rc = _wait(lambda: (self.dir / f"{kind}.{job}.rc").exists(), timeout, f"the {kind} of job {job}")
        rc = int((self.dir / f"{kind}.{job}.rc").read_text().strip() or -1)
        out = (self.dir / f"{kind}.{job}.out").read_text()
        err = (self.dir / f"{kind}.{job}.err").read_text()
        return rc, json.loads(out) if out.strip() else None, err

    def scenario(self, holders: list[dict]) -> None:
        tmp = self.dir / "scenario.tmp"
        tmp.write_text(yaml.safe_dump({"gpus": [{"name": "Sim H100", "memory_total": "80GiB"},
                                                {"name": "Sim H100", "memory_total": "80GiB"}],
                                       "holders": holders}))
        tmp.chmod(0o644)
        os.replace(tmp, self.dir / "scenario.yaml")

    def go(self, tag: str) -> None:
        (self.dir / f"go.{tag}").touch()

    def gputop(self, *args) -> subprocess.CompletedProcess:
        env = {**self.env, "GPUTOP_SCENARIO": str(self.dir / "scenario.yaml"),
               "GPUTOP_CONFIG": str(self.dir / "config.yaml"), "GPUTOP_AUDIT_LOG": str(self.dir / "audit.jsonl"),
               "PYTHONPATH": str(ROOT)}
        return subprocess.run([sys.executable, "-m", "gputop", *args], capture_output=True, text=True, env=env,
                              timeout=60)

    def audit(self) -> list[dict]:
        p = self.dir / "audit.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


@pytest.fixture(scope="session")
def slurm_node():
    if os.geteuid() != 0:
        pytest.skip("needs root: starts munged, slurmctld and slurmd, and reads other users' environ")
    missing = _missing()
    if missing:
        pytest.skip(f"Slurm or munge is not installed (missing {', '.join(missing)}); "
                    "apt-get install slurmctld slurmd slurm-client munge")
    base = Path(tempfile.mkdtemp(prefix="gti16-slurm-"))
    base.chmod(0o755)
    node = SlurmNode(base)
    node.write()
    add_user(USER, shell="/bin/sh")
    try:
        node.start()
    except Exception as e:
        node.stop()
        pytest.skip(f"could not start Slurm here: {e}")
    yield node
    node.run("scancel", "--full", "-u", "root", check=False)
    node.run("scancel", "--full", "-u", USER, check=False)
    node.stop()
    for pid in node.seen:
        kill_tree(pid)
    _kill_marked(str(base))
    del_user(USER)
    shutil.rmtree(base, ignore_errors=True)


# ---- job scripts ---------------------------------------------------------------------------------

def escapees(node: SlurmNode, tag: str, kinds=("setsid", "nohup", "dfork")) -> str:
    """A batch script that leaves a setsid, a nohup and a double-forked process (each a `sh` whose command
    line holds a marker, with a `sleep` child), then waits for the test's go file (bounded)."""
    d = node.dir
    lines = {"setsid": f"setsid sh -c 'sleep 600; : {d} {tag}-setsid' </dev/null >/dev/null 2>&1 &",
             "nohup": f"nohup sh -c 'sleep 600; : {d} {tag}-nohup' </dev/null >/dev/null 2>&1 &",
             "dfork": f"( sh -c 'sleep 600; : {d} {tag}-dfork' </dev/null >/dev/null 2>&1 & )",
             "plain": f"sh -c 'sleep 600; : {d} {tag}-plain' </dev/null >/dev/null 2>&1 &"}
    return "\n".join([lines[k] for k in kinds]
                     + [f"n=0; while [ ! -e {d}/go.{tag} ] && [ $n -lt 900 ]; do sleep 0.1; n=$((n+1)); done", ""])


def marked(marker: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if p.info["status"] != psutil.STATUS_ZOMBIE and cmd[:2] == ["sh", "-c"] and cmd[2].endswith(marker):
            out.append(p.pid)
    return out


def _kill_marked(text: str) -> None:
    for p in psutil.process_iter(["pid", "cmdline"]):
        if text in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid():
            try:
                family = [p] + p.children(recursive=True)
            except psutil.Error:  # it exited meanwhile (its PID maybe reused): nothing of ours to kill
                continue
            for q in family:
                try:
                    q.kill()
                except psutil.Error:
                    pass


def wait_marked(node: SlurmNode, tag: str, kinds=("setsid", "nohup", "dfork")) -> dict[str, int]:
    def find():
        got = {k: marked(f"{node.dir} {tag}-{k}") for k in kinds}
        return {k: v[0] for k, v in got.items() if len(v) == 1} if all(len(v) == 1 for v in got.values()) else None

    got = _wait(find, 90, f"the processes of job {tag}")
    node.seen.extend(got.values())
    return got


def kill_tree(pid: int) -> None:
    try:
        p = psutil.Process(pid)
        procs = [p] + p.children(recursive=True)
    except psutil.Error:
        return
    for q in procs:
        try:
            q.kill()
        except psutil.Error:
            pass


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def status_json(node: SlurmNode) -> dict:
    p = node.gputop("status", "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def holders_by_pid(snap: dict) -> dict[int, dict]:
    return {h["pid"]: h for h in snap["holders"]}


def bystander(node: SlurmNode, tag: str) -> int:
    """A GPU holder started outside Slurm (an orphan of a login session, as the tests make them)."""
    subprocess.Popen(["setsid", "sh", "-c", f"sh -c 'sleep 600; : {node.dir} {tag}-by' & exit 0"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait(10)
    return wait_marked(node, tag, ("by",))["by"]


# ---- tests ---------------------------------------------------------------------------------------

def test_job_leftovers_are_named_then_orphans_then_reaped_by_the_epilog(slurm_node):
    node = slurm_node
    other = node.submit(escapees(node, "b", ("setsid",)))
    job = node.submit(escapees(node, "a", ("setsid", "nohup", "dfork", "plain")), hold_epilog=True)
    a = wait_marked(node, "a")
    plain = wait_marked(node, "a", ("plain",))["plain"]  # a leftover that holds no GPU
    b = wait_marked(node, "b", ("setsid",))["setsid"]
    by = bystander(node, "a")
    node.scenario([{"pid": a["setsid"], "gpu": 0, "memory": "1GiB"}, {"pid": a["nohup"], "gpu": 0, "memory": "1GiB"},
                   {"pid": a["dfork"], "gpu": 1, "memory": "1GiB"}, {"pid": b, "gpu": 1, "memory": "1GiB"},
                   {"pid": by, "gpu": 1, "memory": "1GiB"}])
    # While the job runs: status names it, and none of its holders is an orphan.
    hs = holders_by_pid(status_json(node))
    for kind, pid in a.items():
        assert hs[pid]["slurm"]["job_id"] == job, (kind, hs[pid])
        assert hs[pid]["slurm"]["state"] == "RUNNING"
        assert hs[pid]["verdict"]["kind"] != "orphan", (kind, hs[pid]["verdict"])
    table = node.gputop("status").stdout
    assert f"{job} RUNNING" in table
    # The job ends (its epilog is held): every leftover is an orphan, with the job's id in the reason.
    node.go("a")
    _wait(lambda: node.job_state(job) in ("COMPLETING", "COMPLETED"), 90, f"job {job} to end")
    hs = holders_by_pid(status_json(node))
    for kind, pid in a.items():
        v = hs[pid]["verdict"]
        assert v["kind"] == "orphan", (kind, v)
        assert f"Slurm job {job} ended" in v["reason"]
        assert v["root"] == pid
    assert hs[b]["verdict"]["kind"] == "not-orphan" and hs[b]["slurm"]["state"] == "RUNNING"
    # The epilog, run by slurmd, removes exactly them.
    node.release("epilog", job)
    rc, out, err = node.hook_result("epilog", job)
    assert rc == 0, err
    assert set(out["holders"]) == set(a.values())
    for pid in [*a.values(), plain]:
        _wait(lambda pid=pid: not alive(pid), 30, f"pid {pid} to be gone")
    assert alive(b) and alive(by)
    # Every leftover, GPU holder or not, went through the reap executor as one group (action "reap-group"),
    # stopped and signalled together; nothing else was signalled.
    group = [r for r in node.audit() if r.get("action") == "reap-group" and r["target"]["slurm_job"] == job]
    assert len(group) == 1 and group[0]["ok"] and f"job {job}" in group[0]["reason"]
    assert {m["pid"] for m in group[0]["details"]["members"]} >= {*a.values(), plain}
    signalled = {p for r in node.audit() for s in r.get("signals") or [] for p in s["pids"]}
    assert not signalled & {b, by}
    assert not [r for r in node.audit() if r.get("action") == "kill"]
    summary = [r for r in node.audit() if r.get("action") == "slurm-epilog" and r["slurm"]["job_id"] == job]
    assert summary and summary[-1]["ok"] and summary[-1]["slurm"]["uid"] == 0
    # Job b ends too; its epilog removes its leftover, and the bystander still survives.
    node.go("b")
    rc, out, err = node.hook_result("epilog", other)
    assert rc == 0, err
    _wait(lambda: not alive(b), 30, "job b's leftover to be gone")
    assert alive(by)
    kill_tree(by)


def test_epilog_of_another_users_job_reaps_only_that_users_leftovers(slurm_node):
    node = slurm_node
    uid = pwd.getpwnam(USER).pw_uid
    job = node.submit(escapees(node, "u", ("setsid", "nohup")), user=USER, hold_epilog=True)
    mine = wait_marked(node, "u", ("setsid", "nohup"))
    assert all(psutil.Process(p).uids().real == uid for p in mine.values())
    # A root process that claims the same job in its environment: another user, so never the job's.
    env = {**os.environ, "SLURM_JOB_ID": str(job), "SLURM_JOB_UID": str(uid)}
    subprocess.Popen(["setsid", "sh", "-c", f"sh -c 'sleep 600; : {node.dir} u-forged' & exit 0"], env=env,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait(10)
    forged = wait_marked(node, "u", ("forged",))["forged"]
    node.scenario([{"pid": p, "gpu": 0, "memory": "1GiB"} for p in [*mine.values(), forged]])
    hs = holders_by_pid(status_json(node))
    assert hs[mine["setsid"]]["slurm"]["uid"] == uid and hs[mine["setsid"]]["user"] == USER
    node.go("u")
    node.release("epilog", job)
    rc, out, err = node.hook_result("epilog", job)
    assert rc == 0, err
    assert set(out["holders"]) == set(mine.values())
    for pid in mine.values():
        _wait(lambda pid=pid: not alive(pid), 30, f"pid {pid} to be gone")
    assert alive(forged)
    group = [r for r in node.audit() if r.get("action") == "reap-group" and r["target"]["slurm_job"] == job]
    assert len(group) == 1 and group[0]["ok"] and group[0]["target"]["uid"] == uid
    assert f"job {job} (uid {uid})" in group[0]["reason"]
    assert {m["pid"] for m in group[0]["details"]["members"]} >= set(mine.values())
    assert forged not in {p for r in node.audit() for s in r.get("signals") or [] for p in s["pids"]}
    summary = [r for r in node.audit() if r.get("action") == "slurm-epilog" and r["slurm"]["job_id"] == job][-1]
    assert summary["slurm"]["uid"] == uid and summary["ok"]
    assert {m["pid"] for m in summary["members"]} >= set(mine.values())
    assert forged not in {m["pid"] for m in summary["members"]}
    kill_tree(forged)


def test_prolog_reaps_an_ended_jobs_stray_before_the_next_job_starts(slurm_node):
    node = slurm_node
    old = node.submit(escapees(node, "s", ("setsid",)), skip_epilog=True)
    stray = wait_marked(node, "s", ("setsid",))["setsid"]
    node.scenario([{"pid": stray, "gpu": 0, "memory": "1GiB"}])
    node.go("s")
    _wait(lambda: node.job_state(old) == "COMPLETED", 90, f"job {old} to complete")
    assert alive(stray)
    # Read-only checks see the stray and change nothing.
    chk = node.gputop("slurm", "check")
    assert chk.returncode == 1 and f"pid {stray}" in chk.stderr and f"Slurm job {old} ended" in chk.stderr
    assert node.gputop("slurm", "check", "--job", "999999", "--gpus", "0").returncode == 1
    assert node.gputop("slurm", "check", "--job", "999999", "--gpus", "1").returncode == 0
    assert alive(stray)
    seen = node.dir / "seen.n"
    # A zombie is gone (init here reaps late): the job looks at the state, not at kill -0.
    job = node.submit(f"st=$(cut -d' ' -f3 /proc/{stray}/stat 2>/dev/null)\n"
                      f"case \"$st\" in ''|Z|X) echo gone > {seen};; *) echo alive > {seen};; esac\n", gres="gpu:2")
    rc, out, err = node.hook_result("prolog", job)
    assert rc == 0, err
    assert out["gpus"] == [0, 1]  # Slurm 22.05 gives the prolog no SLURM_JOB_GPUS: from the GRES IDX
    assert out["source"] in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "scontrol show job -d (GRES IDX)")
    assert [r["outcome"] for r in out["results"]] == ["reaped"]
    _wait(seen.exists, 90, "the next job to run")
    assert seen.read_text().strip() == "gone"
    assert not alive(stray)
    rec = [r for r in node.audit() if r.get("action") == "reap" and r["target"]["pid"] == stray][-1]
    assert rec["ok"] and f"prolog of job {job}" in rec["reason"]


def test_prolog_fails_on_a_running_jobs_holder_and_slurm_drains_the_node(slurm_node):
    node = slurm_node
    running = node.submit(escapees(node, "r", ("setsid",)))
    holder = wait_marked(node, "r", ("setsid",))["setsid"]
    node.scenario([{"pid": holder, "gpu": 1, "memory": "1GiB"}])
    try:
        job = node.submit("true\n", gres="gpu:2")
        rc, out, err = node.hook_result("prolog", job)
        assert rc == 1
        assert f"pid {holder}" in err and f"Slurm job {running}" in err and "RUNNING" in err
        assert alive(holder)
        _wait(lambda: "drain" in node.node_state(), 90, "sinfo to show the node draining")
        reason = node.run("sinfo", "-h", "-N", "-o", "%E").stdout
        assert "prolog" in reason.lower(), reason
        node.run("scancel", str(job))
    finally:
        node.go("r")
        node.run("scontrol", "update", f"nodename={node.host}", "state=resume", check=False)
    _wait(lambda: node.node_state() == "idle", 120, "the node to be idle again", step=0.2)
    _wait(lambda: not alive(holder), 90, "job r's leftover to be reaped by its epilog")


def test_cgroup_variant_attributes_by_cgroup_path(slurm_node):
    node = slurm_node
    node.restart("cgroup")
    d = node.dir
    job = node.submit(f"sh -c 'sleep 600; : {d} c-plain' </dev/null >/dev/null 2>&1 &\n"
                      f"n=0; while [ ! -e {d}/go.c ] && [ $n -lt 900 ]; do sleep 0.1; n=$((n+1)); done\n")
    pid = wait_marked(node, "c", ("plain",))["plain"]
    assert f"/job_{job}/" in Path(f"/proc/{pid}/cgroup").read_text()
    node.scenario([{"pid": pid, "gpu": 0, "memory": "1GiB"}])
    h = holders_by_pid(status_json(node))[pid]
    assert h["slurm"]["source"] == "cgroup" and h["slurm"]["job_id"] == job and h["slurm"]["step"] == "batch"
    assert h["slurm"]["state"] == "RUNNING" and h["verdict"]["kind"] != "orphan"
    node.go("c")
    rc, out, err = node.hook_result("epilog", job)
    assert rc == 0, err
    _wait(lambda: not alive(pid), 30, "the job's process to be gone")


def test_without_scontrol_a_jobs_holder_is_unknown_never_an_orphan(procs, scenario, tmp_path, monkeypatch):
    """No Slurm needed: a holder whose environment names a job, on a node where scontrol is missing."""
    from tests.conftest import run_gputop
    from tests.functional.actions_helpers import write_config

    write_config(tmp_path / "config.yaml", monkeypatch)
    marker = f"gti16-noscontrol-{os.getpid()}"
    env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_JOB_UID": str(os.getuid())}
    procs.spawn(["setsid", "sh", "-c", f"sh -c 'sleep 600; : {marker}' & exit 0"], env=env).wait(10)
    pid = procs.wait_for(f"sh -c sleep 600; : {marker}")
    scenario(holders=[{"pid": pid, "gpu": 0, "memory": "1GiB"}])
    plain = run_gputop("status", "--json", env={"GPUTOP_SCONTROL": str(tmp_path / "no-scontrol")})
    snap = json.loads(plain.stdout)
    h = holders_by_pid(snap)[pid]
    assert h["slurm"]["job_id"] == 4242 and h["slurm"]["source"] == "environ" and h["slurm"]["state"] is None
    assert h["verdict"]["kind"] == "unknown" and "state unknown" in h["verdict"]["reason"]
    assert any("Slurm job 4242: state unknown" in w for w in snap["warnings"])
    table = run_gputop("status", env={"GPUTOP_SCONTROL": str(tmp_path / "no-scontrol")}).stdout
    assert "4242 state?" in table
    # The reap never takes it.
    no_scontrol = {"GPUTOP_SCONTROL": str(tmp_path / "no-scontrol")}
    assert run_gputop("reap", "--apply", "--json", env=no_scontrol).returncode == 0
    assert alive(pid)


def test_epilog_by_hand_deadline_reports_survivors_then_reaps(procs, scenario, tmp_path, monkeypatch):
    """No Slurm needed: `slurm epilog --job N --uid U`. Past its deadline it starts on nothing and names the
    job's GPU holder (exit 1, so Slurm would drain the node); run again, it reaps the job's leftovers."""
    from tests.conftest import run_gputop
    from tests.functional.actions_helpers import write_config

    write_config(tmp_path / "config.yaml", monkeypatch)
    marker = f"gti16-byhand-{os.getpid()}"
    env = {**os.environ, "SLURM_JOB_ID": "4243", "SLURM_JOB_UID": str(os.getuid())}
    for kind in ("gpu", "cpu"):
        procs.spawn(["setsid", "sh", "-c", f"sh -c 'sleep 600; : {marker}-{kind}' & exit 0"], env=env).wait(10)
    holder = procs.wait_for(f"sh -c sleep 600; : {marker}-gpu")
    other = procs.wait_for(f"sh -c sleep 600; : {marker}-cpu")
    by = procs.orphan(f"sh -c 'sleep 600; : {marker}-by'", f"sh -c sleep 600; : {marker}-by")  # no job
    scenario(holders=[{"pid": holder, "gpu": 0, "memory": "1GiB"}, {"pid": by, "gpu": 0, "memory": "1GiB"}])
    uid = str(os.getuid())
    late = run_gputop("slurm", "epilog", "--job", "4243", "--uid", uid, "--deadline", "0")
    assert late.returncode == 1 and f"GPU holder pid {holder}" in late.stderr, late.stderr
    assert alive(holder) and alive(other)
    t = time.monotonic()
    done = run_gputop("slurm", "epilog", "--job", "4243", "--uid", uid, "--json")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - t < 60  # inside its own deadline (60 s); a loaded parallel suite took 47 s here
    out = json.loads(done.stdout)
    assert out["holders"] == [holder] and {m["pid"] for m in out["members"]} >= {holder, other}
    for pid in (holder, other):
        _wait(lambda pid=pid: not alive(pid), 30, f"pid {pid} to be gone")
    assert alive(by)
    # Nothing of the job is left: exit 0 again, saying so.
    again = run_gputop("slurm", "epilog", "--job", "4243", "--uid", uid)
    assert again.returncode == 0 and "left no process" in again.stdout
    assert run_gputop("slurm", "epilog").returncode == 2  # no SLURM_JOB_ID: bad usage


def test_requeued_job_leftovers_of_the_earlier_run_are_orphans(slurm_node):
    """A requeued job runs again under the same id. A leftover of the first run (no SLURM_RESTART_COUNT)
    is an orphan while the second run (SLURM_RESTART_COUNT=1, scontrol Restarts=1) runs; the second run's
    own process is not."""
    node = slurm_node
    if node.proctrack != "linuxproc":  # under proctrack/cgroup, Slurm kills a run's processes when it ends
        node.restart("linuxproc")
    d = node.dir
    job = node.submit(f"r=${{SLURM_RESTART_COUNT:-0}}\n"
                      f"( sh -c \"sleep 600; : {d} q-run$r\" </dev/null >/dev/null 2>&1 & )\n"
                      f"n=0; while [ ! -e {d}/go.q$r ] && [ $n -lt 900 ]; do sleep 0.1; n=$((n+1)); done\n",
                      skip_epilog=True)  # as if the first run's epilog had missed it
    first = wait_marked(node, "q", ("run0",))["run0"]
    node.run("scontrol", "requeue", str(job))
    _wait(lambda: node.job_state(job) == "PENDING", 90, f"job {job} to be requeued")
    node.run("scontrol", "update", f"jobid={job}", "StartTime=now")  # skip the requeue delay (about 120 s)
    second = wait_marked(node, "q", ("run1",))["run1"]
    _wait(lambda: node.job_state(job) == "RUNNING", 90, f"job {job} to run again")
    try:
        assert alive(first)
        node.scenario([{"pid": first, "gpu": 0, "memory": "1GiB"}, {"pid": second, "gpu": 0, "memory": "1GiB"}])
        hs = holders_by_pid(status_json(node))
        assert hs[first]["slurm"]["job_id"] == hs[second]["slurm"]["job_id"] == job
        assert hs[first]["slurm"]["run"] == 0 and hs[second]["slurm"]["run"] == 1
        v = hs[first]["verdict"]
        assert v["kind"] == "orphan" and f"Slurm job {job} was requeued" in v["reason"], v
        assert hs[second]["verdict"]["kind"] == "not-orphan", hs[second]["verdict"]
        # The JOB column says which run ended: the job is RUNNING again, its earlier run's leftover is not.
        table = {ln.split()[0]: ln for ln in node.gputop("status").stdout.splitlines() if ln.split()[:1]}
        assert re.search(rf"\b{job}(\.\S+)? REQUEUED", table[str(first)]), table
        assert re.search(rf"\b{job}(\.\S+)? RUNNING", table[str(second)]), table
        # The job's own GPU check names the earlier run's leftover as a stray on its GPU.
        chk = node.gputop("slurm", "check", "--job", str(job), "--gpus", "0")
        assert chk.returncode == 1 and f"pid {first}" in chk.stderr and f"pid {second}" not in chk.stderr
        # The reap takes the earlier run's leftover, and leaves the running job's process alone.
        assert node.gputop("reap", "--apply").returncode == 0
        _wait(lambda: not alive(first), 30, "the first run's leftover to be gone")
        assert alive(second)
    finally:
        node.go("q1")
        kill_tree(second)
        kill_tree(first)
