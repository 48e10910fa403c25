"""gputop kill on real processes: a paused target a failed kill leaves paused, and "cannot see" versus
"no such process" (a second real user under /proc hidepid=2; a holder the GPU lists in another PID
namespace; a PID that never existed). An innocent bystander survives each."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gputop.util.errors import EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED
from tests.conftest import run_gputop, wait_gone
from tests.functional.actions_helpers import OtherUser, alive, check_common, records, spawn_ignoring_term


def state(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return raw[raw.rindex(b")") + 2:].split()[0].decode()


def wait_state(pid: int, want: str, timeout: float = 10.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if state(pid) == want:
            return True
        time.sleep(0.02)
    return False


def paused(procs, marker: str):
    """A real process that ignores SIGTERM, paused by its owner (SIGSTOP: state T)."""
    p = spawn_ignoring_term(procs, marker)
    os.kill(p.pid, signal.SIGSTOP)
    assert wait_state(p.pid, "T")
    return p


def never_existed() -> int:
    """A PID no process can have: above the kernel's pid_max."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


# ---- a failed kill restores a paused target --------------------------------------------------------

def test_failed_kill_of_a_paused_job_pauses_it_again_and_says_so(procs, scenario, cfg):
    job = paused(procs, "gt-paused-job")
    other_paused = paused(procs, "gt-paused-bystander")  # paused too, not a target: never touched
    bystander = procs.sleeper("gt-bystander")
    scenario(holders=[{"pid": job.pid, "gpu": 0, "memory": "2GiB"},
                      {"pid": other_paused.pid, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("kill", "--pid", str(job.pid), "--timeout", "1")
    out = r.stdout + r.stderr
    assert r.returncode == EXIT_FAILURE, out
    assert "still alive" in out and "it was paused (state T) and is paused again" in out, out
    assert len(r.stderr.strip().splitlines()) == 1  # one line
    assert wait_state(job.pid, "T", 2)  # as its owner left it, not running (state S)
    time.sleep(0.3)
    assert state(job.pid) == "T"
    [rec] = records(pid=job.pid)
    check_common(rec, action="kill", outcome="still-alive")
    assert [s["signal"] for s in rec["signals"]] == ["SIGTERM", "SIGCONT", "SIGSTOP"]
    assert rec["details"]["was_paused"] is True and rec["details"]["paused_again"] is True
    assert state(other_paused.pid) == "T" and alive(bystander.pid)
    # The owner can still continue it, and it runs again.
    os.kill(job.pid, signal.SIGCONT)
    assert wait_state(job.pid, "S")


def test_paused_job_that_handles_term_still_exits_and_force_still_kills(procs, scenario, cfg):
    code = ("import signal,sys,time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
            "print('ready', flush=True); time.sleep(600)  # gt-paused-clean")
    clean = procs.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert clean.stdout.readline().strip() == b"ready"
    os.kill(clean.pid, signal.SIGSTOP)
    assert wait_state(clean.pid, "T")
    stubborn = paused(procs, "gt-paused-stubborn")
    bystander = procs.sleeper("gt-bystander")
    scenario(holders=[{"pid": clean.pid, "gpu": 0, "memory": "1GiB"},
                      {"pid": stubborn.pid, "gpu": 1, "memory": "1GiB"}])
    r = run_gputop("kill", "--pid", str(clean.pid), "--timeout", "5")
    assert r.returncode == EXIT_OK and "exited after SIGTERM" in r.stdout, r.stdout + r.stderr
    assert wait_gone(clean.pid, 5)
    r = run_gputop("kill", "--pid", str(stubborn.pid), "--timeout", "0.5", "--force")
    assert r.returncode == EXIT_OK and "killed with SIGKILL" in r.stdout, r.stdout + r.stderr
    assert wait_gone(stubborn.pid, 5)
    [rec] = records(pid=stubborn.pid)
    assert [s["signal"] for s in rec["signals"]] == ["SIGTERM", "SIGCONT", "SIGKILL"]
    assert alive(bystander.pid)


# ---- hidden is not gone -----------------------------------------------------------------------------

def _under_hidepid(other: OtherUser) -> None:
    """Run ``other``'s gputop in a private mount namespace whose /proc is mounted hidepid=2: it sees only
    its own processes, as on a node mounted that way. Skips where the namespace cannot be made."""
    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) is missing: cannot mount a private /proc with hidepid=2")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t proc -o hidepid=2 proc /proc && grep -c hidepid /proc/self/mountinfo"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount /proc with hidepid=2 in a mount namespace: {probe.stderr.strip()[-200:]}")
    plain = other.setpriv
    other.setpriv = lambda: ["unshare", "-m", "--propagation", "private", "sh", "-c",
                             'mount -t proc -o hidepid=2 proc /proc && exec "$@"', "sh"] + plain()


def test_hidden_holder_is_refused_exit_5_and_a_pid_that_never_existed_is_exit_3(procs, monkeypatch, request):
    other = OtherUser.make(monkeypatch, request)
    _under_hidepid(other)
    holder = procs.sleeper("gt-root-holder")  # root's: hidden from the other user under hidepid=2
    bystander = procs.sleeper("gt-bystander")
    ghost = never_existed()
    other.holders([{"pid": holder.pid, "gpu": 0, "memory": "1GiB"}])
    # The other user really cannot see it: /proc has no entry, yet the kernel says it exists (EPERM).
    seen = other.run("-c", f"import os; print(os.path.exists('/proc/{holder.pid}'))", module=False)
    assert seen.stdout.strip() == "False", seen.stdout + seen.stderr
    r = other.run("kill", "--pid", str(holder.pid), "--force", "--timeout", "0.5")
    out = r.stdout + r.stderr
    assert r.returncode == EXIT_REFUSED, out
    assert "exists but cannot be seen here" in out and "has exited" not in out, out
    r = other.run("kill", "--pid", str(ghost), "--json")
    res = json.loads(r.stdout)["results"][0]
    assert r.returncode == EXIT_NOT_FOUND and res["outcome"] == "not-found", r.stdout + r.stderr
    assert res["message"].startswith(f"no process {ghost} (it has exited, or never existed)"), res["message"]
    time.sleep(0.2)
    assert alive(holder.pid) and alive(bystander.pid)
    recs = {rec["target"]["pid"]: rec for rec in other.records()}
    assert recs[holder.pid]["outcome"] == "refused" and recs[holder.pid]["details"]["rule"] == "hidden"
    assert recs[holder.pid]["exit_code"] == EXIT_REFUSED and recs[holder.pid]["signals"] == []
    assert recs[ghost]["outcome"] == "not-found" and recs[ghost]["exit_code"] == EXIT_NOT_FOUND


def test_holder_the_gpu_lists_but_this_namespace_cannot_see_is_refused_not_called_exited(procs, scenario, cfg):
    """A holder in another PID namespace: the driver lists it, kill(pid, 0) says no such process here.
    status calls it unknown; kill must not call it exited."""
    ghost = never_existed()
    bystander = procs.sleeper("gt-bystander")
    scenario(holders=[{"pid": ghost, "gpu": 1, "memory": "4GiB", "visible": False},
                      {"pid": bystander.pid, "gpu": 0, "memory": "1GiB"}])
    st = json.loads(run_gputop("status", "--json").stdout)
    [h] = [h for h in st["holders"] if h["pid"] == ghost]
    assert h["visible"] is False
    r = run_gputop("kill", "--pid", str(ghost), "--force")
    out = r.stdout + r.stderr
    assert r.returncode == EXIT_REFUSED, out
    assert f"lists pid {ghost} as a holder of GPU 1" in out and "cannot be seen here" in out, out
    assert "never signals" in out
    assert "it has exited:" not in out
    [rec] = records(pid=ghost)
    assert rec["outcome"] == "refused" and rec["details"]["rule"] == "hidden" and rec["target"]["gpus"] == [1]
    assert alive(bystander.pid)


def test_a_pid_seen_with_its_start_time_that_is_gone_says_it_exited(procs, scenario, cfg):
    p = procs.sleeper("gt-short-lived")
    bystander = procs.sleeper("gt-bystander")
    t = psutil.Process(p.pid).create_time()
    p.kill()
    p.wait(5)
    scenario(holders=[{"pid": bystander.pid, "gpu": 0, "memory": "1GiB"}])
    r = run_gputop("kill", "--pid", str(p.pid), "--start-time", f"{t:.2f}")
    out = r.stdout + r.stderr
    assert r.returncode == EXIT_NOT_FOUND, out
    assert f"no process {p.pid}: the one that started at {t:.2f} has exited" in out, out
    assert alive(bystander.pid)
