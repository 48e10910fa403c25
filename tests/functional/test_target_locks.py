"""Issue 25: another local user binds gputop's per-target lock names (abstract Unix sockets, which anyone
can bind). Root's kill, reap and guard obey a taken name only when the kernel (SO_PEERCRED) says its
holder is root or themselves: a squatter never makes them answer "busy" and send nothing.

Every test runs the squatter as a second real user (setpriv), against real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from gputop.actions.identity import TargetLock
from gputop.core.procs import read_proc
from tests.conftest import add_user, del_user, run_gputop, unique_name, wait_gone
from tests.functional.actions_helpers import (
    OtherUser, alive, orphan_python, records, spawn_ignoring_term, unique,
)

PY = sys.executable
# One test here makes root's lock directory (/run/gputop/locks, the whole node's) world-writable for a moment;
# root then stops trusting it, and a squatted name no longer keeps root's invocations apart. Run on one xdist
# worker, one after another, so no squatted-name test runs inside that moment (seen: two SIGTERMs under -n 4).
pytestmark = pytest.mark.xdist_group("root-locks")
# Binds the abstract name given in hex (listening on it or not), says "bound", then holds it.
SQUAT = ("import socket,sys,time; s=socket.socket(socket.AF_UNIX); s.bind(bytes.fromhex(sys.argv[1])); "
         "sys.argv[2]=='listen' and s.listen(1); print('bound', flush=True); time.sleep(600)")


def squat(procs, other: OtherUser, name: str, listen: bool) -> subprocess.Popen:
    """The other user holds the abstract socket ``name`` (a str starting with NUL)."""
    p = procs.spawn(other.setpriv() + [PY, "-c", SQUAT, name.encode().hex(), "listen" if listen else "no"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = p.stdout.readline()
    assert line.strip() == b"bound", p.stderr.read()
    return p


def lock_name(action: str, pid: int) -> str:
    return TargetLock(action, pid, read_proc(pid).start_time).name


@pytest.fixture
def other(monkeypatch, request):
    return OtherUser.make(monkeypatch, request)


@pytest.mark.parametrize("listen", [True, False], ids=["listening", "bound-only"])
def test_root_kill_force_goes_through_a_lock_name_another_user_holds(procs, scenario, other, monkeypatch,
                                                                     tmp_path, listen):
    from tests.functional.actions_helpers import write_config

    write_config(tmp_path / "config.yaml", monkeypatch)
    miner = spawn_ignoring_term(procs, unique("gt25-miner"))  # needs the SIGKILL of --force
    bystander = procs.sleeper("gt25-bystander")
    scenario(holders=[{"pid": miner.pid, "gpu": 0, "memory": "1GiB"},
                      {"pid": bystander.pid, "gpu": 1, "memory": "1GiB"}])
    squatter = squat(procs, other, lock_name("kill", miner.pid), listen)
    r = run_gputop("kill", "--pid", str(miner.pid), "--force", "--timeout", "1", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    [res] = json.loads(r.stdout)["results"]
    assert res["outcome"] == "killed", res
    assert wait_gone(miner.pid, 5)
    assert alive(bystander.pid) and squatter.poll() is None
    [rec] = records(action="kill", pid=miner.pid)
    assert any(s["signal"] == "SIGKILL" for s in rec["signals"])


def test_root_reap_apply_goes_through_a_lock_name_another_user_holds(procs, scenario, other, monkeypatch,
                                                                     tmp_path):
    from tests.functional.actions_helpers import write_config

    write_config(tmp_path / "config.yaml", monkeypatch)
    job = orphan_python(procs, "gt25-orphan")
    bystander = orphan_python(procs, "gt25-bystander")  # an orphan too, but holds no GPU
    scenario(holders=[{"pid": job, "gpu": 0, "memory": "1GiB"}])
    squatter = squat(procs, other, lock_name("reap", job), listen=True)
    r = run_gputop("reap", "--apply", "--grace", "0.5", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    [res] = json.loads(r.stdout)["results"]
    assert res["outcome"] == "reaped", res
    assert wait_gone(job, 5)
    assert alive(bystander) and squatter.poll() is None


def test_the_lock_obeys_only_root_or_the_same_uid(procs, other):
    """The rule itself, on real sockets: a name another uid holds is not "busy"; a name this uid holds is,
    and it is ours once freed."""
    target = procs.sleeper("gt25-target")
    name = lock_name("kill", target.pid)
    squatter = squat(procs, other, name, listen=True)
    lock = TargetLock("kill", target.pid, read_proc(target.pid).start_time)
    assert lock.acquire() is True and lock.sock is None  # acts, without holding the name
    assert lock.foreign_holder["pid"] == squatter.pid and lock.foreign_holder["uid"] != 0
    lock.release()
    squatter.kill()
    squatter.wait()
    mine = TargetLock("kill", target.pid, read_proc(target.pid).start_time)
    assert mine.acquire() is True and mine.sock is not None
    again = TargetLock("kill", target.pid, read_proc(target.pid).start_time)
    assert again.acquire() is False  # root's own holder is obeyed
    t0 = time.monotonic()
    assert again.wait(target.pid, read_proc(target.pid).start_time, 0.3) is False
    assert time.monotonic() - t0 >= 0.25  # it did wait for root's holder
    mine.release()
    assert again.acquire() is True and again.sock is not None
    again.release()


def test_an_unprivileged_gputop_obeys_roots_lock(procs, other):
    """Root's holder counts for everyone: a user's gputop waits for root's kill of the user's process."""
    me = procs.spawn(other.setpriv() + [PY, "-c", "import time; time.sleep(600)"])
    deadline = time.time() + 10
    while read_proc(me.pid) is None or read_proc(me.pid).uid == 0:
        assert time.time() < deadline
        time.sleep(0.02)
    probe = ("import sys; from gputop.actions.identity import TargetLock; "
             "l = TargetLock('kill', int(sys.argv[1]), float(sys.argv[2])); print(l.acquire(), l.foreign_holder)")
    start = str(read_proc(me.pid).start_time)
    held = TargetLock("kill", me.pid, read_proc(me.pid).start_time)
    assert held.acquire() and held.sock is not None  # root holds it: the user obeys
    r = other.run("-c", probe, str(me.pid), start, module=False)
    assert r.stdout.split()[0] == "False", r.stdout + r.stderr
    held.release()


def test_ten_concurrent_root_kills_under_a_squatted_name_still_signal_once(procs, scenario, other, monkeypatch,
                                                                          tmp_path):
    """Root's own lock (a flock in /run/gputop/locks) keeps root's invocations apart when another user
    holds the abstract name: one kills, the others report the exit and send nothing."""
    from tests.functional.actions_helpers import write_config

    write_config(tmp_path / "config.yaml", monkeypatch)
    miner = spawn_ignoring_term(procs, unique("gt25-conc"))
    bystander = procs.sleeper("gt25-bystander")
    scenario(holders=[{"pid": miner.pid, "gpu": 0, "memory": "1GiB"},
                      {"pid": bystander.pid, "gpu": 1, "memory": "1GiB"}])
    squatter = squat(procs, other, lock_name("kill", miner.pid), listen=True)
    # --any-process: a late invocation must not be refused for "holds no GPU" once the miner is gone
    cmd = [PY, "-m", "gputop", "kill", "--pid", str(miner.pid), "--force", "--timeout", "1", "--any-process",
           "--json"]
    runs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(10)]
    results = [json.loads(p.communicate(timeout=60)[0])["results"][0] for p in runs]
    outcomes = sorted(r["outcome"] for r in results)
    assert outcomes.count("killed") == 1, outcomes
    # a kill that looks after the SIGKILL and before the parent's wait finds a zombie: refused, naming the
    # parent (issue 28: a zombie's kill never claims success), never a second signal
    late = [r for r in results if r["outcome"] == "refused"]
    assert all(r.get("details", {}).get("rule") == "zombie" or "is a zombie" in r["message"] for r in late), late
    assert set(outcomes) <= {"killed", "exited", "not-found", "refused"}, [r["message"] for r in results]
    assert wait_gone(miner.pid, 5) and alive(bystander.pid) and squatter.poll() is None
    recs = records(action="kill", pid=miner.pid)
    assert sum(1 for r in recs if any(s["signal"] in ("SIGTERM", "SIGKILL") for s in r["signals"])) == 1


def test_the_enforcing_guard_kills_through_a_squatted_name(procs, scenario, other, tmp_path):
    from gputop.core import auditlog
    from tests.conftest import _default_sighup
    from tests.functional.test_guard_daemon import KILL_VICTIMS, holders
    from tests.functional.test_guard_engine import named

    policy = tmp_path / "policy.yaml"
    policy.write_text(KILL_VICTIMS)
    bystander = named(procs, "bystander")
    victim = named(procs, "victim")
    scenario(holders=holders(bystander, victim), gpus=1)
    squatter = squat(procs, other, lock_name("kill", victim.pid), listen=False)
    daemon = subprocess.Popen([PY, "-m", "gputop", "guard", "run", "--interval", "0.3", "--enforce",
                               "--policy-file", str(policy)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL, preexec_fn=_default_sighup)
    try:
        assert wait_gone(victim.pid, 30), "the guard did not kill the victim whose lock name was squatted"
    finally:
        daemon.terminate()
        daemon.wait(20)
    assert alive(bystander.pid) and squatter.poll() is None
    kills = [r for r in auditlog.read() if r.get("action") == "kill" and r.get("face") == "guard"]
    assert kills and {r["outcome"] for r in kills} <= {"terminated", "killed"}, [r["message"] for r in kills]


FLOCK = ("import fcntl,os,sys,time; fd=os.open(sys.argv[1], os.O_RDWR|os.O_CREAT, 0o644); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(600)")


def test_root_ignores_its_lock_directory_once_others_may_write_it(procs, scenario, other, monkeypatch, tmp_path):
    """/run/gputop/locks made world-writable: the other user creates and flocks root's lock file there;
    root no longer trusts the directory (it falls back to the checked abstract name) and kills."""
    import os

    from gputop.actions.identity import ROOT_LOCK_DIR
    from tests.functional.actions_helpers import write_config

    write_config(tmp_path / "config.yaml", monkeypatch)
    miner = spawn_ignoring_term(procs, unique("gt25-dir"))
    bystander = procs.sleeper("gt25-bystander")
    scenario(holders=[{"pid": miner.pid, "gpu": 0, "memory": "1GiB"},
                      {"pid": bystander.pid, "gpu": 1, "memory": "1GiB"}])
    probe = TargetLock("kill", bystander.pid, read_proc(bystander.pid).start_time)
    assert probe.acquire() and probe.file_fd is not None  # root's directory exists and is used
    probe.release()
    path = os.path.join(ROOT_LOCK_DIR, lock_name("kill", miner.pid).lstrip("\0"))
    mode = os.stat(ROOT_LOCK_DIR).st_mode & 0o7777
    os.chmod(ROOT_LOCK_DIR, 0o777)
    try:
        holder = procs.spawn(other.setpriv() + [PY, "-c", FLOCK, path], stdout=subprocess.PIPE)
        assert holder.stdout.readline().strip() == b"locked"
        r = run_gputop("kill", "--pid", str(miner.pid), "--force", "--timeout", "1", "--json")
    finally:
        os.chmod(ROOT_LOCK_DIR, mode)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["results"][0]["outcome"] == "killed"
    assert wait_gone(miner.pid, 5) and alive(bystander.pid)
    holder.kill()
    holder.wait()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@pytest.fixture
def third_user(request):
    """A second unprivileged user (useradd), besides OtherUser's: squats against an unprivileged gputop."""
    import shutil

    if not shutil.which("useradd"):
        pytest.skip("useradd is missing")
    name = unique_name("gt25sq")  # unique to this test process (parallel workers and runs)
    pw = add_user(name)
    request.addfinalizer(lambda: del_user(name))
    return ["setpriv", "--reuid", name, "--regid", str(pw.pw_gid), "--clear-groups"], pw.pw_uid


def test_an_unprivileged_gputop_obeys_only_itself_and_root(procs, other, third_user):
    """The abstract-name path, as a user: a name held by yet another user is not "busy" (listening or
    bound only), a name held by the same user is."""
    setpriv3, uid3 = third_user
    job = procs.spawn(other.setpriv() + [PY, "-c", "import time; time.sleep(600)"])
    deadline = time.time() + 10
    while read_proc(job.pid) is None or read_proc(job.pid).uid == 0:
        assert time.time() < deadline
        time.sleep(0.02)
    start = read_proc(job.pid).start_time
    name = lock_name("kill", job.pid)
    probe = ("import sys,time; from gputop.actions.identity import TargetLock; "
             "l = TargetLock('kill', int(sys.argv[1]), float(sys.argv[2])); t = time.monotonic(); "
             "print(l.acquire(), l.foreign_holder, l.file_fd, round(time.monotonic() - t, 3))")
    for listen in (True, False):
        sq = procs.spawn(setpriv3 + [PY, "-c", SQUAT, name.encode().hex(), "listen" if listen else "no"],
                         stdout=subprocess.PIPE)
        assert sq.stdout.readline().strip() == b"bound"
        r = other.run("-c", probe, str(job.pid), str(start), module=False)
        acquired, rest = r.stdout.split(" ", 1)
        assert acquired == "True", r.stdout + r.stderr
        assert (f"'uid': {uid3}" if listen else "'uid': None") in rest and " None " in rest, r.stdout
        sq.kill()
        sq.wait()
    # the same user's own holder is obeyed
    own = procs.spawn(other.setpriv() + [PY, "-c", SQUAT, name.encode().hex(), "listen"], stdout=subprocess.PIPE)
    assert own.stdout.readline().strip() == b"bound"
    r = other.run("-c", probe, str(job.pid), str(start), module=False)
    assert r.stdout.startswith("False"), r.stdout + r.stderr
