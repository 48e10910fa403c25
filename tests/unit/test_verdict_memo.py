"""The Sampler's verdict memo: a long-lived sampler (TUI, guard) keeps a holder's verdict only while every
input of that verdict is unchanged. Each test changes one input between two samples of the same sampler
and checks that the verdict is recomputed, and equals what classify() says over a fresh table.

The host is a fixture /proc (GPUTOP_PROC_ROOT's mechanism), so that a session leader can die, a PID can be
reused and a process can exec between two samples, exactly when the test says."""

from __future__ import annotations

import ast
import dataclasses
import re
import shutil
from pathlib import Path

import pytest

import gputop.core.sampler as sampler_mod
import gputop.core.verdicts as verdicts_mod
from gputop.backends.base import Backend, DeviceSample, GpuProcess
from gputop.core.config import Config
from gputop.core.orphans import classify, compile_protect, verdict_inputs
from gputop.core.procs import IS_LINUX, ProcInfo, ProcTable
from gputop.core.sampler import Sampler

pytestmark = pytest.mark.skipif(not IS_LINUX, reason="a fixture /proc is read the Linux way")

BTIME = 1_700_000_000
INIT, LEADER, PARENT, HOLDER, OTHER = 1, 100, 200, 300, 400


class OneGpu(Backend):
    name = "fake"

    def __init__(self, pids):
        self.pids = list(pids)

    def device_count(self) -> int:
        return 1

    def sample(self, index: int) -> DeviceSample:
        return DeviceSample(index=index, name="fake")

    def processes(self, index: int) -> list[GpuProcess]:
        return [GpuProcess(pid=p, index=index) for p in self.pids]


class Host:
    """A fixture /proc and /run: write_proc() creates or replaces a process, kill() removes it."""

    def __init__(self, root: Path):
        self.proc, self.run = root / "proc", root / "run"
        self.proc.mkdir()
        (self.run / "systemd" / "sessions").mkdir(parents=True)
        (self.proc / "stat").write_text(f"cpu 0 0 0 0\nbtime {BTIME}\n")

    def write_proc(self, pid, ppid, sid, name, *, start=100, cmd=None, utime=0, state="S", uid=1000,
                   sigign=0, cgroup=None, tgid=None):
        d = self.proc / str(pid)
        d.mkdir(exist_ok=True)
        rest = [state, ppid, sid, sid, 0, -1, 0, 0, 0, 0, 0, utime, 0, 0, 0, 20, 0, 1, 0, start, 0, 10]
        rest += [0] * (30 - len(rest)) + [sigign, 0, 0]
        (d / "stat").write_text(f"{pid} ({name}) " + " ".join(map(str, rest)) + "\n")
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in (cmd or [name])) + b"\0")
        (d / "status").write_text(f"Name:\t{name}\nTgid:\t{tgid or pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        if cgroup is not None:
            (d / "cgroup").write_text(cgroup)

    def kill(self, pid):
        shutil.rmtree(self.proc / str(pid))

    def session(self, sid, state):
        (self.run / "systemd" / "sessions" / str(sid)).write_text(f"STATE={state}\n")


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    h.write_proc(INIT, 0, 1, "systemd", start=1)
    h.write_proc(LEADER, INIT, LEADER, "bash", start=50)
    h.write_proc(PARENT, LEADER, LEADER, "python", start=60, cmd=["python", "train.py"])
    h.write_proc(HOLDER, PARENT, LEADER, "python", start=70, cmd=["python", "worker.py"])
    return h


class Counting:
    """Counts classify() calls made by the sampler (a memo hit makes none)."""

    def __init__(self, monkeypatch):
        self.calls = 0

        def counted(*a, **kw):
            self.calls += 1
            return classify(*a, **kw)
        monkeypatch.setattr(verdicts_mod, "classify", counted)


def sampler(host, holders=(HOLDER,), config=None, static_ttl=60.0):
    return Sampler([OneGpu(holders)], config=config or Config(), proc_root=str(host.proc),
                   run_root=str(host.run), static_ttl=static_ttl)


def fresh(host, pid, config=None, sampler_=None):
    """What classify() says now over a new table: what the memo must agree with."""
    cfg = config or Config()
    owner_of = sampler_.lookups().owner_of if sampler_ is not None else None
    return classify(pid, ProcTable(str(host.proc)), protect=compile_protect(cfg.protect),
                    protect_cmdline=compile_protect(cfg.protect_cmdline), owner_of=owner_of)


def verdict(snap, pid=HOLDER):
    return snap.holder(pid).verdict


@pytest.fixture(params=[60.0, 0.0], ids=["static-cache", "no-static-cache"])
def ttl(request):
    return request.param


def test_an_unchanged_host_is_answered_from_the_memo(host, monkeypatch, ttl):
    count = Counting(monkeypatch)
    s = sampler(host, static_ttl=ttl)
    first = verdict(s.sample())
    assert count.calls == 1
    for _ in range(3):
        assert verdict(s.sample()) == first
    assert count.calls == 1  # the memo answered: otherwise every test below proves nothing


def test_a_busy_holder_keeps_its_verdict_and_shows_fresh_cpu(host, monkeypatch):
    count = Counting(monkeypatch)
    s = sampler(host)
    first = s.sample()
    host.write_proc(HOLDER, PARENT, LEADER, "python", start=70, cmd=["python", "worker.py"], utime=500,
                    state="R")
    second = s.sample()
    assert count.calls == 1  # CPU time and run state are not verdict inputs
    assert verdict(second) == verdict(first)
    assert second.holder(HOLDER).proc.cpu_time == 5.0  # the holder's record is this sample's


def test_session_leader_dies_between_samples(host, monkeypatch, ttl):
    count = Counting(monkeypatch)
    s = sampler(host, static_ttl=ttl)
    assert verdict(s.sample()).kind == "not-orphan"
    host.kill(LEADER)
    host.write_proc(PARENT, INIT, LEADER, "python", start=60, cmd=["python", "train.py"])  # reparented
    v = verdict(s.sample())
    assert count.calls == 2
    assert v.kind == "orphan" and v.root == PARENT
    assert v == fresh(host, HOLDER, sampler_=s)


def test_session_leader_dies_while_its_children_keep_their_parent(host, ttl):
    # Only the leader changes (it is not in the holder's chain): the memo must still notice.
    host.write_proc(PARENT, INIT, LEADER, "python", start=60, cmd=["python", "train.py"])
    s = sampler(host, static_ttl=ttl)
    assert verdict(s.sample()).kind == "not-orphan"
    host.kill(LEADER)
    v = verdict(s.sample())
    assert "session leader pid 100 is gone" in v.reason
    assert v == fresh(host, HOLDER, sampler_=s)


def test_session_leader_pid_reused_then_its_verdict_is_recomputed(host, ttl):
    host.kill(LEADER)
    host.write_proc(PARENT, INIT, LEADER, "python", start=60, cmd=["python", "train.py"])
    s = sampler(host, static_ttl=ttl)
    before = verdict(s.sample())
    assert before.kind == "orphan"
    host.write_proc(LEADER, INIT, LEADER, "bash", start=90)  # a new process with the leader's PID
    after = verdict(s.sample())
    assert after != before and "reused" in after.reason
    assert after == fresh(host, HOLDER, sampler_=s)


def test_session_leader_reappears_with_its_identity(host, ttl):
    # Seen gone, then visible again with the same (pid, start): e.g. /proc could not show it for a moment.
    saved = (host.proc / str(LEADER) / "stat").read_text()
    host.write_proc(PARENT, INIT, LEADER, "python", start=60, cmd=["python", "train.py"])
    host.kill(LEADER)
    s = sampler(host, static_ttl=ttl)
    assert verdict(s.sample()).kind == "orphan"
    host.write_proc(LEADER, INIT, LEADER, "bash", start=50)
    assert (host.proc / str(LEADER) / "stat").read_text() == saved
    v = verdict(s.sample())
    assert v.kind == "not-orphan" and v == fresh(host, HOLDER, sampler_=s)


def test_parent_replaced_by_a_new_process_with_the_same_pid(host, ttl):
    host.kill(LEADER)
    host.write_proc(PARENT, INIT, LEADER, "python", start=60, cmd=["python", "train.py"])
    s = sampler(host, static_ttl=ttl)
    before = verdict(s.sample())
    assert before.kind == "orphan" and before.root == PARENT
    # PID 200 is now another process: a shell in another session, started later.
    host.write_proc(PARENT, INIT, 555, "bash", start=95)
    after = verdict(s.sample())
    assert after.kind == "unknown" and after == fresh(host, HOLDER, sampler_=s)
    assert [c.pid for c in s.sample().holder(HOLDER).chain] == [PARENT, INIT]


def test_holder_reparented(host, ttl):
    s = sampler(host, static_ttl=ttl)
    s.sample()
    host.write_proc(OTHER, INIT, OTHER, "sshd", start=65)
    host.write_proc(HOLDER, OTHER, LEADER, "python", start=70, cmd=["python", "worker.py"])
    snap = s.sample()
    assert verdict(snap) == fresh(host, HOLDER, sampler_=s)
    assert [c.pid for c in snap.holder(HOLDER).chain] == [OTHER, INIT]


def test_session_leader_becomes_hidden(host, monkeypatch, ttl):
    host.kill(LEADER)
    host.write_proc(PARENT, INIT, LEADER, "python", start=60, cmd=["python", "train.py"])
    s = sampler(host, static_ttl=ttl)
    assert verdict(s.sample()).kind == "orphan"
    # hidepid, or another user's process: it exists but /proc does not show it. Cannot see is not gone.
    monkeypatch.setattr(ProcTable, "hidden", lambda self, pid: pid == LEADER and self.get(pid) is None)
    v = verdict(s.sample())
    assert v.kind == "unknown" and "cannot be seen" in v.reason


def test_a_new_config_brings_new_protect_rules(host, ttl):
    host.kill(LEADER)
    host.write_proc(PARENT, INIT, LEADER, "python", start=60, cmd=["python", "train.py"])
    s = sampler(host, static_ttl=ttl)
    assert verdict(s.sample()).kind == "orphan"
    s.config = Config(protect=("python",))  # a reload
    v = verdict(s.sample())
    assert v.kind == "protected" and v == fresh(host, HOLDER, config=s.config, sampler_=s)
    s.config = Config()
    assert verdict(s.sample()).kind == "orphan"


def test_a_holder_that_execs_into_a_protected_program(host):
    host.kill(LEADER)
    host.write_proc(PARENT, INIT, LEADER, "python", start=60, cmd=["python", "train.py"])
    s = sampler(host, static_ttl=0)  # command lines read every sample (the static cache re-reads after 5 s)
    assert verdict(s.sample()).kind == "orphan"
    host.write_proc(HOLDER, PARENT, LEADER, "tmux", start=70, cmd=["tmux"])  # same identity, new program
    v = verdict(s.sample())
    assert v.kind == "protected" and v == fresh(host, HOLDER, sampler_=s)


def test_a_nohup_mark_appears(host):
    host.kill(LEADER)
    host.write_proc(PARENT, INIT, LEADER, "python", start=60, cmd=["python", "train.py"])
    s = sampler(host)
    assert verdict(s.sample()).kind == "orphan"
    host.write_proc(PARENT, INIT, LEADER, "python", start=60, cmd=["python", "train.py"], sigign=1)
    assert verdict(s.sample()).kind == "protected"


def test_the_holders_login_session_state_changes(host, ttl):
    scope = "0::/user.slice/user-1000.slice/session-7.scope\n"
    for pid, ppid, name, start in ((PARENT, INIT, "python", 60), (HOLDER, PARENT, "python", 70)):
        host.write_proc(pid, ppid, LEADER, name, start=start, cmd=[name, "x.py"], cgroup=scope)
    host.kill(LEADER)
    host.session(7, "closing")
    s = Sampler([OneGpu([HOLDER])], config=Config(), proc_root=str(host.proc), run_root=str(host.run),
                static_ttl=0)  # owners re-read every sample
    before = verdict(s.sample())
    assert before.kind == "orphan" and "closing" in before.reason
    host.session(7, "active")  # (not what logind does; the memo must follow whatever it reads)
    after = verdict(s.sample())
    assert after.kind == "not-orphan" and after == fresh(host, HOLDER, sampler_=s)


def test_a_holder_that_leaves_and_comes_back_is_classified_again(host, monkeypatch):
    count = Counting(monkeypatch)
    gpu = OneGpu([HOLDER])
    s = Sampler([gpu], config=Config(), proc_root=str(host.proc), run_root=str(host.run))
    s.sample()
    gpu.pids = []
    s.sample()
    gpu.pids = [HOLDER]
    s.sample()
    assert count.calls == 2  # forgotten when it stopped holding a GPU


def test_verdict_inputs_name_every_process_field_the_verdict_reads():
    """A field that orphans.py reads but verdict_inputs() leaves out would let the memo keep a verdict
    after that field changed."""
    src = Path(verdicts_mod.__file__).with_name("orphans.py").read_text()
    fields = {f.name for f in dataclasses.fields(ProcInfo)} | {"zombie", "identity", "cmd"}
    read = {n.attr for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Attribute) and n.attr in fields}
    p = ProcInfo(pid=7, ppid=1, name="n", cmdline=("c",), start_time=1.0, uid=5, user="u", sid=7, state="S",
                 sighup_ignored=False, kthread=False, rss=1, cpu_time=1.0)
    # pgid and start_ticks are the reap executor's lineage fields (start_ticks is start_time in ticks).
    left_out = ("state", "cpu_time", "rss", "pgid", "start_ticks")
    for attr in sorted(read):
        if attr in left_out:
            pytest.fail(f"orphans.py reads ProcInfo.{attr}, which verdict_inputs() leaves out")
    # Changing any field but those left out changes the inputs.
    for f in dataclasses.fields(ProcInfo):
        if f.name in left_out:
            assert verdict_inputs(dataclasses.replace(p, **{f.name: 2.0})) == verdict_inputs(p)
            continue
        other = {"cmdline": ("d",), "half_exited": True, "kthread": True, "sighup_ignored": True}.get(
            f.name, 99 if f.type in ("int", "int | None", "float") else "other")
        if f.name == "half_exited":
            q = dataclasses.replace(p, state="Z", half_exited=True)
            assert verdict_inputs(q) != verdict_inputs(dataclasses.replace(p, state="Z"))
            continue
        assert verdict_inputs(dataclasses.replace(p, **{f.name: other})) != verdict_inputs(p), f.name
    assert verdict_inputs(dataclasses.replace(p, state="Z")) != verdict_inputs(p)  # exited counts


def test_actions_do_not_use_the_memo():
    """The destructive paths classify again over their own fresh table: no sampler memo there."""
    root = Path(verdicts_mod.__file__).parents[1] / "actions"
    for path in root.glob("*.py"):
        assert not re.search(r"\.verdicts\.(memos|verdict)\b|VerdictCache|_Memo\b", path.read_text()), path.name
    assert "classify(" in (root / "plan.py").read_text() and "classify(" in (root / "common.py").read_text()


def test_a_thread_id_is_mapped_to_its_process_on_the_first_and_later_samples(host, ttl):
    # NVML may report a thread id; the first sample takes the Tgid from the status file the table read.
    host.write_proc(301, PARENT, LEADER, "python", start=70, cmd=["python", "worker.py"], tgid=HOLDER)
    s = sampler(host, holders=(301,), static_ttl=ttl)
    for _ in range(3):
        assert [h.pid for h in s.sample().holders] == [HOLDER]


# ---- the context shared by the holders of one tree -----------------------------------------------

SIBLING = 301


@pytest.fixture
def two_holders(host):
    host.write_proc(SIBLING, PARENT, LEADER, "python", start=71, cmd=["python", "worker.py"])
    return host


def test_siblings_share_one_context_checked_once_a_sample(two_holders, monkeypatch):
    s = sampler(two_holders, holders=(HOLDER, SIBLING))
    s.sample()
    assert s.verdicts.memos[HOLDER].ctx is s.verdicts.memos[SIBLING].ctx and len(s.verdicts.contexts) == 1
    checks = []
    real = verdicts_mod._Context.holds
    monkeypatch.setattr(verdicts_mod._Context, "holds", lambda self, table: checks.append(1) or real(self, table))
    snap = s.sample()
    assert len(checks) == 1  # one check for both holders
    assert snap.holder(HOLDER).chain == snap.holder(SIBLING).chain


@pytest.mark.parametrize("change", ["leader dies", "parent execs", "parent reparented", "leader hidden"])
def test_a_change_in_the_shared_context_recomputes_every_sibling(two_holders, monkeypatch, ttl, change):
    host = two_holders
    count = Counting(monkeypatch)
    s = sampler(host, holders=(HOLDER, SIBLING), static_ttl=ttl)
    s.sample()
    assert count.calls == 2
    if change == "leader dies":
        host.kill(LEADER)
    elif change == "parent execs":
        host.write_proc(PARENT, LEADER, LEADER, "tmux", start=60, cmd=["tmux"])
    elif change == "parent reparented":
        host.write_proc(PARENT, INIT, LEADER, "python", start=60, cmd=["python", "train.py"])
    else:
        host.kill(LEADER)
        monkeypatch.setattr(ProcTable, "hidden", lambda self, pid: pid == LEADER and self.get(pid) is None)
    snap = s.sample()
    assert count.calls == 4  # both classified again
    if change != "leader hidden":
        for pid in (HOLDER, SIBLING):
            assert verdict(snap, pid) == fresh(host, pid, sampler_=s)
    else:
        assert {verdict(snap, p).kind for p in (HOLDER, SIBLING)} == {"unknown"}


def test_a_change_in_one_holder_recomputes_it_alone(two_holders, monkeypatch, ttl):
    host = two_holders
    count = Counting(monkeypatch)
    s = sampler(host, holders=(HOLDER, SIBLING), static_ttl=ttl)
    s.sample()
    host.write_proc(SIBLING, PARENT, LEADER, "tmux", start=71, cmd=["tmux"])  # execs; its tree does not
    snap = s.sample()
    assert count.calls == 3
    assert verdict(snap, SIBLING) == fresh(host, SIBLING, sampler_=s)
    assert verdict(snap, HOLDER) == fresh(host, HOLDER, sampler_=s)


def test_a_holders_owner_change_recomputes_it(host, monkeypatch):
    count = Counting(monkeypatch)
    s = sampler(host, static_ttl=0)
    s.sample()
    host.write_proc(HOLDER, PARENT, LEADER, "python", start=70, cmd=["python", "worker.py"],
                    cgroup="0::/system.slice/train.service\n")
    v = verdict(s.sample())
    assert count.calls == 2 and v == fresh(host, HOLDER, sampler_=s)


def test_contexts_are_forgotten_with_their_holders(two_holders):
    gpu = OneGpu([HOLDER, SIBLING])
    s = Sampler([gpu], config=Config(), proc_root=str(two_holders.proc), run_root=str(two_holders.run))
    s.sample()
    assert len(s.verdicts.contexts) == 1
    gpu.pids = []
    s.sample()
    assert s.verdicts.memos == {} and s.verdicts.contexts == {}


def test_a_sample_that_failed_part_way_leaves_no_context_check_for_the_next(two_holders, monkeypatch):
    """A context checked in a sample that then raised must be checked again by the next sample, not taken
    from the failed one (the tree may have changed in between)."""
    host = two_holders
    s = sampler(host, holders=(HOLDER, SIBLING))
    s.sample()
    real = sampler_mod.Sampler._holder
    built = []

    def failing(self, pid, *a, **kw):
        out = real(self, pid, *a, **kw)  # the shared context is checked here, for the first holder
        built.append(pid)
        raise RuntimeError("an owner lookup failed")
    monkeypatch.setattr(sampler_mod.Sampler, "_holder", failing)
    with pytest.raises(RuntimeError):
        s.sample()
    assert built
    monkeypatch.setattr(sampler_mod.Sampler, "_holder", real)
    host.kill(LEADER)  # the tree changes before the next sample
    host.write_proc(PARENT, INIT, LEADER, "python", start=60, cmd=["python", "train.py"])  # reparented
    snap = s.sample()
    for pid in (HOLDER, SIBLING):
        assert verdict(snap, pid) == fresh(host, pid, sampler_=s)
        assert verdict(snap, pid).kind == "orphan"


def test_a_chain_member_with_new_cpu_time_is_this_samples_record_and_kept(host):
    """The chain a memo answers with is this sample's records (CPU time, RSS), not the ones the verdict
    was computed from; once a member is a new record, the context keeps it, so that the next sample finds
    the very same objects instead of building the chain again."""
    s = sampler(host)
    first = s.sample().holder(HOLDER).chain[0]
    host.write_proc(PARENT, LEADER, LEADER, "python", start=60, cmd=["python", "train.py"], utime=500)
    snap = s.sample()
    parent = snap.holder(HOLDER).chain[0]
    assert parent is not first and parent.cpu_time > first.cpu_time  # the new record
    assert snap.holder(HOLDER).verdict == fresh(host, HOLDER, sampler_=s)
    ctx = s.verdicts.memos[HOLDER].ctx
    assert ctx.current[0] is parent and ctx.chain[0] is first  # kept; the interned answers unchanged
    again = s.sample().holder(HOLDER).chain
    assert again[0] is parent and again == snap.holder(HOLDER).chain
