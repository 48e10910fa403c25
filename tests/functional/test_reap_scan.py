"""One read of /proc per reap round: the lineage fields (ppid, process group, session, start ticks) that the
escape check needs come from the table's own scan (ProcTable.stat_fields), not from a second stat scan.
They must be exactly what a second scan (actions_helpers.scan_stats, the reference reader) reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gputop.actions.executor import Executor
from gputop.actions import identity
from gputop.actions.identity import Handle, wait_gone
from gputop.actions.plan import ReapPlan
from gputop.core.config import load_config
from gputop.core.procs import IS_LINUX, ProcTable, read_proc, start_time, stat_state
from tests.functional.actions_helpers import scan_stats, unique
from tests.functional.test_reap_safety import find, half_exited

pytestmark = pytest.mark.skipif(not IS_LINUX, reason="reads /proc")
PY = sys.executable


def _stat(pid: int, comm: str, state: str, ppid: int, pgid: int, sid: int, start: int, extra: int = 30) -> str:
    rest = [state, ppid, pgid, sid, 0, -1, 4194560, *range(7, 19), start, *range(20, 20 + extra)]
    return f"{pid} ({comm}) " + " ".join(str(x) for x in rest) + "\n"


def fake_proc(root: Path) -> Path:
    """A /proc with a plain process, a command name full of parentheses and spaces, a zombie, a line too
    short for the start field, a malformed one, an empty (unreadable) one, and non-process entries."""
    lines = {
        1: _stat(1, "init", "S", 0, 1, 1, 5),
        40: _stat(40, "a) (b) 1 2 3 (c", "S", 1, 40, 40, 700),
        41: _stat(41, "w", "Z", 40, 40, 40, 710),
        42: _stat(42, "x", "T", 40, 42, 40, 720),
        43: "43 (short) S 1 43 43 0\n",
        44: "44 (bad) S one 44 44",
        45: "",
    }
    for pid, text in lines.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(text)
    (root / "self").mkdir()
    (root / "stat").write_text("btime 1000\n")
    return root


def test_the_table_reads_the_lineage_fields_scan_stats_reads(tmp_path):
    root = str(fake_proc(tmp_path / "proc"))
    table = ProcTable(proc_root=root)
    table.scan_all()
    ref = scan_stats(root)
    assert table.stat_fields() == ref
    assert set(ref) == {1, 40, 41, 42}  # the zombie counts; the short, bad and empty lines do not
    assert ref[40] == (1, 40, 40, 700) and ref[42] == (40, 42, 40, 720)
    assert sorted(table.children(40)) == [41, 42] and sorted(table.children(1)) == [40, 43]  # the same scan


def test_live_processes_the_table_and_scan_stats_agree_and_procinfo_has_the_fields(procs):
    """Real processes in a new session, a new process group and a zombie (same scan, so same set)."""
    own = procs.spawn([PY, "-c", "import time; time.sleep(60)"], start_new_session=True)
    grp = procs.spawn([PY, "-c", "import os, time; os.setpgid(0, 0); time.sleep(60)"])
    dead = subprocess.Popen(["true"])  # not waited for: a zombie until the test ends
    try:
        deadline = time.time() + 10
        while (os.getpgid(grp.pid) != grp.pid or (read_proc(dead.pid) or SimpleNamespace(zombie=1)).zombie
               is False) and time.time() < deadline:
            time.sleep(0.02)
        mine = [os.getpid(), own.pid, grp.pid, dead.pid, 1]
        table = ProcTable()
        table.scan_all()
        fields, ref = table.stat_fields(), scan_stats()
        for pid in mine:
            assert fields[pid] == ref[pid], pid
            st = fields[pid]
            assert (st.ppid, st.pgid, st.sid) == (os.getppid() if pid == os.getpid() else st.ppid,
                                                  os.getpgid(pid), os.getsid(pid))
        assert fields[own.pid].sid == own.pid and fields[grp.pid].pgid == grp.pid
        for pid in (own.pid, grp.pid, os.getpid()):  # the ProcInfo the table makes carries them too
            info = table.get(pid)
            assert (info.pgid, info.sid, info.start_ticks) == (fields[pid].pgid, fields[pid].sid, fields[pid].start)
        assert table.get(dead.pid).zombie and dead.pid in fields
    finally:
        dead.wait()


# On SIGUSR1: start a worker through a shell that exits at once (the worker is reparented away, keeping
# this process's dead session and group), and a bystander in a dead session of its own.
LAUNCHER = ("import signal, subprocess, sys, time\n"
            "SLEEP = sys.executable + ' -c \"import time; time.sleep(60)\" ' + sys.argv[1]\n"
            "def go(*a):\n"
            "    subprocess.Popen(['sh', '-c', SLEEP + '-j & exit 0'])\n"
            "    subprocess.Popen(['setsid', 'sh', '-c', SLEEP + '-b & exit 0'])\n"
            "signal.signal(signal.SIGUSR1, go)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")


def _wait_handler(pid: int, sig: int, timeout: float = 20.0) -> None:
    """Wait until ``pid`` catches ``sig`` (SigCgt in /proc/PID/status)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        caught = next(int(line.split()[1], 16) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if line.startswith("SigCgt:"))
        if caught & (1 << (sig - 1)):
            return
        time.sleep(0.02)
    raise TimeoutError(f"pid {pid} does not catch signal {sig}")


def _executor(member_pid: int) -> Executor:
    info = read_proc(member_pid)
    ctx = SimpleNamespace(config=load_config(), platform="posix", sampler=None)  # as Ctx: no sampler given
    run = SimpleNamespace(info=info, details={}, signals=[], root_pid=member_pid)
    plan = ReapPlan(member_pid, info, (info,), (), ())
    return Executor(ctx, run, plan, SimpleNamespace(holders=[]))


def test_a_round_reads_proc_once_and_still_finds_a_joiner(procs, cfg, tmp_path, monkeypatch):
    """new_members() lists /proc once (the table's scan; before, scan_stats listed it a second time), and
    with that one scan it still finds a worker that joined the member's dead session and group after its
    parent exited, and leaves a bystander started at the same moment in another dead session."""
    m = unique("gtreapscan")
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    member = procs.orphan(f"{PY} {script} {m}", f"{PY} {script} {m}")  # only this one: it gets SIGUSR1
    assert read_proc(member).cmdline[1:] == (str(script), m)
    _wait_handler(member, signal.SIGUSR1)  # else SIGUSR1's default action would end it
    ex = _executor(member)  # the lineage baseline: before the worker exists
    try:
        ex.adopt([read_proc(member)], [])  # tracked, not signalled
        os.kill(member, signal.SIGUSR1)
        [joiner] = find(f"{m}-j")
        [by] = find(f"{m}-b")
        procs.pids.extend([joiner, by])
        assert read_proc(joiner).ppid != member and os.getsid(joiner) == os.getsid(member)
        listed = []
        real = os.listdir

        def counting(path="."):
            if str(path) == "/proc":
                listed.append(path)
            return real(path)

        monkeypatch.setattr(os, "listdir", counting)
        found = {p.pid for p in ex.new_members()}
        monkeypatch.setattr(os, "listdir", real)
        assert len(listed) == 1, f"one round listed /proc {len(listed)} times"
        assert joiner in found and joiner in ex.joined, (found, ex.run.details)
        assert by not in found
        assert read_proc(by).state not in ("T", "t") and not ex.run.signals  # new_members signals nothing
    finally:
        ex.close()


def test_handle_alive_and_wait_gone_keep_identity_semantics(procs, tmp_path, monkeypatch):
    """alive() reads only the stat line: a half-exited process (state Z, a thread still running) is alive,
    wait_gone does not call it gone; a process that exits is reported gone at once, not after a poll."""
    parent, holder = half_exited(procs, tmp_path, ["setsid"])
    h = Handle(read_proc(parent))
    short = procs.spawn([PY, "-c", "import time; time.sleep(0.3)"])
    s = Handle(read_proc(short.pid))
    monkeypatch.setattr(identity, "_POLL", 5.0)  # a /proc poll would now sleep seconds: only the pidfd wakes
    try:
        assert h.alive() and stat_state(parent)[0] == "Z" and start_time(parent) == h.info.start_time
        assert wait_gone([h], 0.3) == [h]
        t0 = time.monotonic()
        assert wait_gone([s], 10.0) == [] and not s.alive()
        assert time.monotonic() - t0 < 2.0
    finally:
        h.close()
        s.close()
    assert read_proc(holder) is not None  # nothing here signals anything


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs pidfd_open (Linux 5.3+)")
def test_a_live_process_whose_proc_entry_cannot_be_read_is_never_gone(procs, monkeypatch):
    """Cannot see is never gone: a live process whose /proc/PID/stat cannot be read (hidepid, or it turned
    unreadable) is refused as a permission problem when its handle is opened, is alive for a handle opened
    before, and the executor lists it as denied, not gone; it is never signalled."""
    victim = procs.spawn(["sleep", "60"])
    info = read_proc(victim.pid)
    before = Handle(info)  # opened while /proc could still be read
    monkeypatch.setattr(identity, "stat_state", lambda pid, *a: None)  # what an unreadable stat line gives
    monkeypatch.setattr(identity, "start_time", lambda pid, *a: None)
    try:
        with pytest.raises(PermissionError):
            Handle(info)
        assert before.alive() and wait_gone([before], 0.2) == [before]
        ex = Executor.__new__(Executor)
        ex.handles, ex.gone, ex.denied, ex.pre_stopped = {}, set(), [], set()
        assert ex.adopt([info], [signal.SIGSTOP]) == []
        assert ex.denied == [victim.pid] and victim.pid not in ex.gone
    finally:
        before.close()
    monkeypatch.undo()
    assert read_proc(victim.pid).state not in ("T", "t", "Z")  # alive, never stopped


def _thread_states(pid: int) -> list[str]:
    tasks = os.listdir(f"/proc/{pid}/task")
    return [Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(") ", 1)[1][0] for t in tasks]


def test_wait_stopped_sees_a_half_exited_member_stop_without_waiting_out_its_timeout(procs, tmp_path):
    """A half-exited member (main thread exited: state Z, a thread still running) never shows T itself; it
    is stopped once its live thread is. Before, wait_stopped waited its whole timeout (2 s) for it."""
    parent, holder = half_exited(procs, tmp_path, ["setsid"])
    ex = _executor(parent)
    try:
        assert ex.adopt([read_proc(parent)], []) == [parent]
        t0 = time.monotonic()
        ex.send_all(signal.SIGSTOP, [parent])
        ex.wait_stopped([parent], timeout=5.0)
        took = time.monotonic() - t0
        states = _thread_states(parent)
        assert "T" in states and all(s in "TZ" for s in states), states
        assert took < 2.0, f"waited {took:.2f} s for a half-exited process that stopped"
    finally:
        os.kill(parent, signal.SIGCONT)
        ex.close()
    assert read_proc(holder) is not None  # the member's child was never signalled


def test_wait_stopped_waits_for_a_half_exited_member_that_runs(procs, tmp_path):
    """A half-exited process is alive: while its live thread runs it is not stopped, so the wait goes on
    until its timeout (state Z alone is never taken for stopped, nor for gone)."""
    parent, _ = half_exited(procs, tmp_path, ["setsid"])
    ex = _executor(parent)
    try:
        ex.adopt([read_proc(parent)], [])
        t0 = time.monotonic()
        ex.wait_stopped([parent], timeout=0.4)
        assert time.monotonic() - t0 >= 0.4
        assert "S" in _thread_states(parent) and ex.handles[parent].alive()
    finally:
        ex.close()


def test_wait_stopped_waits_until_every_thread_of_a_member_is_stopped(procs):
    """A group stop reaches each thread in turn: a member is stopped when all its threads are (one still
    running could fork), and a member with several threads that is stopped is seen as stopped."""
    many = procs.spawn([PY, "-c", "import threading, time\n"
                        "for _ in range(8): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
                        "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    assert many.stdout.readline().strip() == b"ready"
    plain = procs.spawn(["sleep", "60"])
    ex = _executor(many.pid)
    try:
        ex.adopt([read_proc(many.pid), read_proc(plain.pid)], [])
        t0 = time.monotonic()
        ex.wait_stopped([many.pid, plain.pid], timeout=0.3)  # not stopped: the wait runs its course
        assert time.monotonic() - t0 >= 0.3
        ex.send_all(signal.SIGSTOP, [many.pid, plain.pid])
        t0 = time.monotonic()
        ex.wait_stopped([many.pid, plain.pid], timeout=5.0)
        assert time.monotonic() - t0 < 2.0
        assert set(_thread_states(many.pid)) == {"T"} and len(_thread_states(many.pid)) == 9
        assert _thread_states(plain.pid) == ["T"]
    finally:
        for p in (many.pid, plain.pid):
            os.kill(p, signal.SIGCONT)
        ex.close()
