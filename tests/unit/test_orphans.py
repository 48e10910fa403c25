"""Orphan verdicts on constructed process tables (pure logic, no processes)."""

from __future__ import annotations

import pytest

from gputop.core.orphans import (
    DEFAULT_PROTECT, DEFAULT_PROTECT_CMDLINE, NOT_ORPHAN, ORPHAN, PROTECTED, UNKNOWN, classify, compile_protect,
)
from gputop.core.procs import ProcInfo

PROTECT = compile_protect(DEFAULT_PROTECT)
PROTECT_CMDLINE = compile_protect(DEFAULT_PROTECT_CMDLINE)


def P(pid, ppid, name="python", start=100.0, sid=None, cmd=None, sighup=False):
    return ProcInfo(pid=pid, ppid=ppid, name=name, cmdline=tuple((cmd or name).split()),
                    start_time=start, sid=sid, sighup_ignored=sighup, user="alice", uid=1000)


class Table(dict):
    def __init__(self, *procs):
        super().__init__({p.pid: p for p in procs})


INIT = P(1, 0, "systemd", start=1.0, sid=1, cmd="/sbin/init")


def test_worker_of_live_login_shell_is_not_orphan():
    t = Table(INIT, P(50, 1, "sshd", 10, 50), P(60, 50, "bash", 20, 60), P(70, 60, "python", 30, 60))
    v = classify(70, t, protect=PROTECT)
    assert v.kind == NOT_ORPHAN
    assert "session leader pid 60 (bash) is alive" in v.reason
    assert v.root is None


def test_session_leader_gone_makes_orphan_with_topmost_root():
    # setsid sh -c 'loop & exit': sh (80) exited; loop (81) reparented to init; worker 82 under it.
    t = Table(INIT, P(81, 1, "bash", 50, 80, "bash -c while true"), P(82, 81, "python", 60, 80))
    v = classify(82, t, protect=PROTECT)
    assert v.kind == ORPHAN
    assert v.root == 81 and v.reaper == 1
    assert "session leader pid 80 is gone" in v.reason


def test_reused_session_leader_pid_counts_as_gone():
    # PID 80 now belongs to a process that started after the worker.
    t = Table(INIT, P(80, 1, "cron", 500, 80), P(81, 1, "bash", 50, 80), P(82, 81, "python", 60, 80))
    v = classify(82, t, protect=PROTECT)
    assert v.kind == ORPHAN and "reused" in v.reason


def test_session_leader_itself_is_not_orphan():
    # A daemon started with setsid: its parent is init and it leads its own session.
    t = Table(INIT, P(90, 1, "python", 50, 90))
    assert classify(90, t, protect=PROTECT).kind == NOT_ORPHAN


def test_subreaper_adoption_is_detected_by_session_boundary():
    # systemd --user (pid 40, session 40) adopted the orphan; it is not PID 1.
    t = Table(INIT, P(40, 1, "systemd", 5, 40, "/lib/systemd/systemd --user"),
              P(81, 40, "bash", 50, 80), P(82, 81, "python", 60, 80))
    v = classify(82, t, protect=PROTECT)
    assert v.kind == ORPHAN and v.root == 81 and v.reaper == 40
    assert "subreaper pid 40 (systemd)" in v.reason


def test_container_exec_job_is_not_orphan():
    # Inside a PID namespace, `docker exec` starts a process whose parent and session leader live
    # outside: ppid 0, sid 0. Its parent is alive (an orphan would have been reparented to PID 1).
    t = Table(P(1, 0, "tini", 1, 1), P(50, 0, "python", 50, 0), P(60, 50, "python", 60, 0))
    for pid in (50, 60):
        v = classify(pid, t, protect=PROTECT)
        assert v.kind == NOT_ORPHAN and "outside this PID namespace" in v.reason and v.root is None


def test_reparented_job_whose_session_leader_is_outside_the_namespace_is_unknown():
    # The exec'd shell exited and its job went to the namespace's init; its session leader is outside,
    # so whether that leader is gone cannot be known: unknown, never reaped.
    t = Table(P(1, 0, "tini", 1, 1), P(70, 1, "python", 60, 0))
    v = classify(70, t, protect=PROTECT)
    assert v.kind == UNKNOWN and "outside this PID namespace" in v.reason


def test_job_in_the_session_of_a_container_started_without_a_tty_is_not_orphan():
    # docker run without -t, a Kubernetes pod, a CI runner: PID 1 never called setsid, so it and every
    # process under it share one session whose leader is outside the namespace (sid 0 everywhere).
    t = Table(P(1, 0, "bash", 1, 0), P(70, 1, "python", 60, 0), P(71, 70, "python", 61, 0))
    for pid in (70, 71):
        v = classify(pid, t, protect=PROTECT)
        assert v.kind == NOT_ORPHAN and "container's own session" in v.reason and v.root is None
    # A job there that started its own session, and lost its leader, is still an orphan.
    t = Table(P(1, 0, "bash", 1, 0), P(81, 1, "bash", 50, 80), P(82, 81, "python", 60, 80))
    v = classify(82, t, protect=PROTECT)
    assert v.kind == ORPHAN and v.root == 81


def test_protect_pattern_on_chain_member():
    t = Table(INIT, P(81, 1, "tmux: server", 50, 80, "tmux new -d"), P(82, 81, "python", 60, 80))
    v = classify(82, t, protect=PROTECT)
    assert v.kind == PROTECTED
    assert "tmux" in v.reason and v.orphan_reason and v.root == 81


def test_protect_is_case_insensitive_and_cmdline_patterns_are_a_separate_list():
    t = Table(INIT, P(81, 1, "python", 50, 80, "python -m JupyterLab"), P(82, 81, "python", 60, 80))
    assert classify(82, t, protect=PROTECT).kind == ORPHAN  # a word in an argument protects nothing ...
    v = classify(82, t, protect=PROTECT, protect_cmdline=PROTECT_CMDLINE)  # ... unless a cmdline pattern says so
    assert v.kind == PROTECTED and "protect_cmdline" in v.reason
    t = Table(INIT, P(81, 1, "JUPYTER-lab", 50, 80, "/opt/bin/JUPYTER-lab"), P(82, 81, "python", 60, 80))
    assert classify(82, t, protect=PROTECT).kind == PROTECTED


def test_a_protect_word_inside_an_argument_or_path_protects_nothing():
    t = Table(INIT, P(81, 1, "python", 50, 80, "python train.py --out=/data/screenshots"),
              P(82, 81, "python", 60, 80, "python /home/tmux/w.py"))
    v = classify(82, t, protect=PROTECT, protect_cmdline=PROTECT_CMDLINE)
    assert v.kind == ORPHAN, v.reason


def test_protect_matches_argv0_basename_and_the_name():
    # The names a real tmux server and screen session have: comm "tmux: server" (argv[0] "tmux"), and
    # comm "screen" with argv[0] "SCREEN". (Before issue 25 this test used a name "server" under argv[0]
    # tmux, and a name "screen" under argv[0] "run": names that disagree are a disguise now, never protected.)
    t = Table(INIT, P(81, 1, "tmux: server", 50, 80, "/usr/bin/tmux new -d"), P(82, 81, "python", 60, 80))
    assert "'tmux" in classify(82, t, protect=PROTECT).reason
    t = Table(INIT, P(81, 1, "screen", 50, 80, "/usr/bin/SCREEN -dmS x"), P(82, 81, "python", 60, 80))
    assert classify(82, t, protect=PROTECT).kind == PROTECTED
    t = Table(INIT, P(81, 1, "run", 50, 80, "/srv/screen/bin/run --x"), P(82, 81, "python", 60, 80))
    assert classify(82, t, protect=PROTECT).kind == ORPHAN  # a directory named screen is not screen


def test_the_jupyter_kernel_is_protected_by_the_default_cmdline_pattern():
    kernel = "/usr/bin/python3 -m ipykernel_launcher -f /run/user/1000/jupyter/kernel-1.json"
    t = Table(INIT, P(81, 1, "python3", 50, 80, kernel))
    assert classify(81, t, protect=PROTECT, protect_cmdline=PROTECT_CMDLINE).kind == PROTECTED


def test_init_and_subreaper_are_not_checked_for_protection():
    # The subreaper's cmdline matches "screen", but it must not protect the orphans it adopted.
    t = Table(P(1, 0, "systemd", 1, 1, "/sbin/init splash screen"),
              P(40, 1, "tini", 5, 40, "/usr/bin/screen-tini --"),
              P(81, 40, "bash", 50, 80), P(82, 81, "python", 60, 80))
    assert classify(82, t, protect=PROTECT).kind == ORPHAN


def test_a_live_parent_in_another_session_that_is_no_known_subreaper_gives_unknown():
    # m (pid 40) started the job in session 80, then called setsid: the job's session leader is gone, but its
    # parent is alive and was never a subreaper that adopted it. gputop cannot tell the two apart: unknown.
    t = Table(INIT, P(40, 1, "python", 5, 40, "python launcher.py"),
              P(81, 40, "bash", 50, 80), P(82, 81, "python", 60, 80))
    v = classify(82, t, protect=PROTECT)
    assert v.kind == UNKNOWN and "pid 40 (python) is alive in another session" in v.reason


@pytest.mark.parametrize("name,cmd", [("systemd", "/lib/systemd/systemd --user"), ("tini", "/sbin/tini --"),
                                      ("containerd-shim", "/usr/bin/containerd-shim-runc-v2 -id x"),
                                      ("bash", "/usr/bin/dumb-init bash")])
def test_a_known_subreaper_adopts(name, cmd):
    t = Table(INIT, P(40, 1, name, 5, 40, cmd), P(81, 40, "bash", 50, 80), P(82, 81, "python", 60, 80))
    v = classify(82, t, protect=PROTECT)
    assert v.kind == ORPHAN and v.reaper == 40


def test_nohup_mark_protects_and_can_be_turned_off():
    t = Table(INIT, P(82, 1, "python", 60, 80, sighup=True))
    v = classify(82, t, protect=PROTECT)
    assert v.kind == PROTECTED and "detached with nohup" in v.reason
    assert classify(82, t, protect=PROTECT, nohup_protects=False).kind == ORPHAN


def test_cycle_is_unknown():
    t = Table(P(10, 11, "a", 1, 5), P(11, 10, "b", 1, 5))
    v = classify(10, t, protect=PROTECT)
    assert v.kind == UNKNOWN and "cycle" in v.reason


def test_overlong_chain_is_unknown():
    procs = [INIT] + [P(100 + i, 100 + i - 1 if i else 1, "sh", 10 + i, 100) for i in range(80)]
    v = classify(179, Table(*procs), protect=PROTECT, max_chain=64)
    assert v.kind == UNKNOWN and "longer than 64" in v.reason


def test_invisible_holder_and_vanished_parent_are_unknown():
    assert classify(5, Table(INIT), protect=PROTECT).kind == UNKNOWN
    v = classify(82, Table(INIT, P(82, 81, "python", 60, 80)), protect=PROTECT)
    assert v.kind == UNKNOWN and "vanished" in v.reason


def test_empty_protect_list_protects_nothing():
    assert compile_protect([]) is None
    t = Table(INIT, P(81, 1, "tmux", 50, 80), P(82, 81, "python", 60, 80))
    assert classify(82, t, protect=None, nohup_protects=False).kind == ORPHAN


# ---- Windows: the PPID of a dead parent stays; the parent is missing, or the PID was reused -----

def W(pid, ppid, name="python.exe", start=100.0):
    return ProcInfo(pid=pid, ppid=ppid, name=name, cmdline=(name,), start_time=start)


WIN_BASE = (W(4, 0, "System", 1), W(600, 4, "services.exe", 2), W(900, 600, "svchost.exe", 3))


def test_windows_missing_parent_is_orphan_rooted_at_topmost():
    t = Table(*WIN_BASE, W(2000, 1500, "python.exe", 50), W(2100, 2000, "python.exe", 60))
    v = classify(2100, t, platform="windows", protect=PROTECT)
    assert v.kind == ORPHAN and v.root == 2000 and "1500" in v.reason and "missing" in v.reason


def test_windows_reused_parent_pid_is_orphan():
    # PID 1500 exists but started after its "child": it is a different process.
    t = Table(*WIN_BASE, W(1500, 900, "notepad.exe", 300), W(2000, 1500, "python.exe", 50))
    v = classify(2000, t, platform="windows", protect=PROTECT)
    assert v.kind == ORPHAN and v.root == 2000 and "reused" in v.reason


def test_windows_live_parent_chain_is_not_orphan():
    t = Table(*WIN_BASE, W(1500, 900, "cmd.exe", 40), W(2000, 1500, "python.exe", 50))
    # svchost.exe in the chain matches the default protect list: a service-hosted process is protected.
    assert classify(2000, t, platform="windows", protect=PROTECT).kind == PROTECTED
    assert classify(2000, t, platform="windows", protect=None).kind == NOT_ORPHAN


def test_windows_explorer_children_are_protected():
    t = Table(W(3000, 2900, "explorer.exe", 10), W(3100, 3000, "python.exe", 50))
    v = classify(3100, t, platform="windows", protect=PROTECT)
    assert v.kind == PROTECTED and "explorer.exe" in v.reason


def test_windows_cycle_is_unknown():
    t = Table(W(10, 11, "a.exe", 5), W(11, 10, "b.exe", 5))
    assert classify(10, t, platform="windows", protect=PROTECT).kind == UNKNOWN


# ---- issue 25: protect patterns match the whole name, and never a disguised process ----------------

def _alone(name, cmd):
    """One orphan (its session leader 80 is gone) named ``name`` running ``cmd``."""
    return Table(INIT, P(81, 1, name, 50, 80, cmd))


@pytest.mark.parametrize("name,cmd", [
    ("xmrig-tmux", "./xmrig-tmux -o pool:3333"),  # 'tmux' matched as a substring before
    ("tmuxminer", "tmuxminer"),
    ("my-screen-job", "my-screen-job"),
    ("notjupyter", "notjupyter"),
    ("python", "/home/u/tmux/miner.py"),  # a directory named tmux in argv[0]'s path
])
def test_a_protect_pattern_matches_only_the_whole_name(name, cmd):
    v = classify(81, _alone(name, cmd), protect=PROTECT)
    assert v.kind == ORPHAN, v.reason


@pytest.mark.parametrize("name,cmd", [
    ("tmux", "tmux new -d"), ("tmux: server", "tmux new -d"), ("jupyter-lab", "/opt/venv/bin/jupyter-lab"),
    ("jupyter", "/usr/local/bin/jupyter lab"), ("jupyter-noteboo", "/usr/bin/jupyter-notebook"),
    ("screen", "SCREEN -dmS x"), ("code-server", "/usr/bin/code-server"),
    # a shebang script: comm is the script's name, argv[0] the interpreter (python3 /opt/bin/jupyter-lab)
    ("jupyter-lab", "/usr/bin/python3 /opt/venv/bin/jupyter-lab --no-browser"),
])
def test_the_default_patterns_still_protect_what_they_meant(name, cmd):
    v = classify(81, _alone(name, cmd), protect=PROTECT)
    assert v.kind == PROTECTED, v.reason


def test_user_patterns_are_anchored_too():
    prot = compile_protect(["train", "keep-.*"])
    assert classify(81, _alone("train", "train"), protect=prot).kind == PROTECTED
    assert classify(81, _alone("keep-me", "keep-me"), protect=prot).kind == PROTECTED
    assert classify(81, _alone("xmrig-train", "xmrig-train"), protect=prot).kind == ORPHAN
    assert classify(81, _alone("trainer", "trainer"), protect=prot).kind == ORPHAN


@pytest.mark.parametrize("name,cmd", [
    ("xmrig", "jupyter-lab --port 8888"),  # exec -a jupyter-lab: argv[0] lies, comm stays xmrig
    ("tmux", "/home/u/xmrig -o pool:3333"),  # prctl(PR_SET_NAME, "tmux"): comm lies
    ("jupyter-lab", "/usr/bin/python3 /home/u/miner.py"),  # comm lies about the script an interpreter runs
])
def test_a_disguised_process_is_never_protected_by_a_name(name, cmd):
    v = classify(81, _alone(name, cmd), protect=PROTECT)
    assert v.kind == ORPHAN, v.reason


class ExeTable(Table):
    """A table that also says which executable each process runs (as ProcTable.exe does)."""

    def __init__(self, exes, *procs):
        super().__init__(*procs)
        self.exes = exes

    def exe(self, pid):
        return self.exes.get(pid)


def test_name_and_argv0_agreeing_is_not_enough_when_the_executable_disagrees():
    # comm and argv[0] both say tmux, but the executable is xmrig: a disguise (the rogue audit's test).
    proc = P(81, 1, "tmux", 50, 80, "tmux new -d")
    assert classify(81, ExeTable({81: "/home/u/.cache/xmrig"}, INIT, proc), protect=PROTECT).kind == ORPHAN
    assert classify(81, ExeTable({81: "/usr/bin/tmux"}, INIT, proc), protect=PROTECT).kind == PROTECTED
    assert classify(81, ExeTable({}, INIT, proc), protect=PROTECT).kind == PROTECTED  # exe unreadable


def test_a_refusal_quotes_the_protect_cmdline_pattern_not_the_text_it_matched():
    kernel = "/usr/bin/python3 -m ipykernel_launcher -f /run/user/1000/jupyter/kernel-1.json"
    t = Table(INIT, P(81, 1, "python3", 50, 80, kernel))
    v = classify(81, t, protect=compile_protect(DEFAULT_PROTECT),
                 protect_cmdline=compile_protect(DEFAULT_PROTECT_CMDLINE))
    assert v.kind == PROTECTED
    assert f"protect_cmdline pattern '{DEFAULT_PROTECT_CMDLINE[0]}'" in v.reason, v.reason
    assert "'-m ipykernel_launcher '" not in v.reason


def test_a_refusal_quotes_the_users_protect_pattern():
    t = Table(INIT, P(81, 1, "jupyter-lab", 50, 80, "/opt/jupyter-lab"), P(82, 81, "python", 60, 80))
    v = classify(82, t, protect=compile_protect(["tmux", "jup.*-lab"]))
    assert v.kind == PROTECTED and "protect pattern 'jup.*-lab'" in v.reason, v.reason
