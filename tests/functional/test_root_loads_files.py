"""Issue 25: root loads a policy, a config (the user's and the node's) or a scenario only when no other
user could have written it or swapped it (gputop/util/trustfile.py). Each refusal is one line, exit 2, saying
what is wrong and what to run. The other user is real (useradd/setpriv): files are chowned to it and
written by it."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputop.util.errors import EXIT_USAGE
from tests.conftest import _default_sighup, run_gputop, wait_gone
from tests.functional.actions_helpers import OtherUser, alive
from tests.functional.test_guard_daemon import KILL_VICTIMS, holders, poll
from tests.functional.test_guard_engine import named

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rule applies to root: run as root")

GOOD_CONFIG = "protect: []\nnohup_protects: false\n"
EVERYTHING_PROTECTED = 'protect: [".*"]\nnohup_protects: false\n'
KILL_BYSTANDERS = KILL_VICTIMS.replace("kill-victims", "kill-bystanders").replace("value: victim",
                                                                                  "value: bystander")


@pytest.fixture
def other(monkeypatch, request):
    o = OtherUser.make(monkeypatch, request)
    monkeypatch.delenv("GPUTOP_CONFIG")  # OtherUser.make points it at its own copy
    return o


def uid_of(other: OtherUser) -> int:
    return pwd.getpwnam(other.name).pw_uid


def one_line_refusal(r: subprocess.CompletedProcess, *needles: str) -> str:
    assert r.returncode == EXIT_USAGE, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def sane(tmp_path, scenario, monkeypatch):
    """A good scenario and a good node config: what each test then spoils one thing of."""
    scenario(holders=[], gpus=1)
    node = tmp_path / "etc" / "config.yaml"
    node.parent.mkdir()
    node.write_text(GOOD_CONFIG)
    monkeypatch.setenv("GPUTOP_SYSTEM_CONFIG", str(node))
    return node


# ---- the file itself ----------------------------------------------------------------------------

def test_world_writable_policy_is_refused(sane, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(KILL_VICTIMS)
    policy.chmod(0o666)
    for args in (["guard", "--test-policies", "--policy-file", str(policy)],
                 ["guard", "--policy-file", str(policy)],
                 ["guard", "run", "--policy-file", str(policy), "--interval", "0.3"]):
        one_line_refusal(run_gputop(*args), str(policy), "writable by others (mode 0666)",
                         f"chmod go-w {policy}")
    policy.chmod(0o644)
    r = run_gputop("guard", "--test-policies", "--policy-file", str(policy))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("which", ["user", "node"])
def test_world_writable_config_is_refused(sane, tmp_path, procs, scenario, which):
    victim = named(procs, "victim")
    scenario(holders=holders(victim), gpus=1)
    cfg = sane if which == "node" else tmp_path / "user.yaml"
    cfg.write_text(EVERYTHING_PROTECTED)
    cfg.chmod(0o666)
    extra = ["--config", str(cfg)] if which == "user" else []
    r = run_gputop(*extra, "kill", "--pid", str(victim.pid), "--force")
    one_line_refusal(r, "config file", str(cfg), "mode 0666", f"chmod go-w {cfg}")
    one_line_refusal(run_gputop(*extra, "status"), "mode 0666")
    assert alive(victim.pid)
    cfg.write_text(GOOD_CONFIG)
    cfg.chmod(0o644)
    r = run_gputop(*extra, "kill", "--pid", str(victim.pid), "--force", "--timeout", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert wait_gone(victim.pid, 5)


def test_world_writable_scenario_is_refused(sane, scenario):
    path = scenario(holders=[], gpus=1)
    path.chmod(0o666)
    one_line_refusal(run_gputop("status"), "scenario", str(path), "mode 0666", "chmod go-w")
    path.chmod(0o644)
    assert run_gputop("status").returncode == 0


def test_files_owned_by_another_user_are_refused(sane, tmp_path, scenario, other):
    uid = uid_of(other)
    policy = tmp_path / "policy.yaml"
    policy.write_text(KILL_VICTIMS)
    os.chown(policy, uid, -1)
    one_line_refusal(run_gputop("guard", "--test-policies", "--policy-file", str(policy)),
                     f"owned by user {other.name}", f"chown root {policy}")
    os.chown(sane, uid, -1)
    one_line_refusal(run_gputop("status"), "config file", f"owned by user {other.name}")
    os.chown(sane, 0, -1)
    path = scenario(holders=[], gpus=1)
    os.chown(path, uid, -1)
    one_line_refusal(run_gputop("status"), "scenario", f"owned by user {other.name}")


def test_group_writable_is_refused_too(sane):
    sane.chmod(0o664)
    one_line_refusal(run_gputop("status"), "mode 0664")


# ---- the directories on the way -------------------------------------------------------------------

def test_a_directory_the_other_user_owns_or_may_write_is_refused(sane, other):
    """The other user could replace the (root-owned, 0644) policy: their directory, or a non-sticky
    world-writable one, is refused; a sticky one (as /tmp) is not."""
    d = other.shared / "theirs"  # (the shared dir is root's, 1777: the other user can reach d)
    d.mkdir()
    d.chmod(0o755)
    policy = d / "policy.yaml"
    policy.write_text(KILL_VICTIMS)
    policy.chmod(0o644)
    os.chown(d, uid_of(other), -1)
    check = ["guard", "--test-policies", "--policy-file", str(policy)]
    one_line_refusal(run_gputop(*check), f"directory {d} is owned by user {other.name}")
    os.chown(d, 0, -1)
    d.chmod(0o777)
    one_line_refusal(run_gputop(*check), f"directory {d} is writable by others (mode 0777)",
                     f"chmod go-w {d}")
    # and the other user really can swap the file in such a directory
    swap = other.run("-c", f"import os; open('{d}/new', 'w').write('rules: []\\n'); "
                           f"os.replace('{d}/new', '{policy}')", module=False)
    assert swap.returncode == 0, swap.stderr
    d.chmod(0o1777)  # sticky: they could no longer replace root's file; the file is theirs now, though
    one_line_refusal(run_gputop(*check), f"owned by user {other.name}")
    policy.unlink()
    policy.write_text(KILL_VICTIMS)
    policy.chmod(0o644)
    assert run_gputop(*check).returncode == 0, "a root-owned file in a sticky directory is root's"


def test_a_writable_directory_higher_up_is_refused(sane, tmp_path):
    top = tmp_path / "a"
    deep = top / "b" / "c"
    deep.mkdir(parents=True)
    cfg = deep / "config.yaml"
    cfg.write_text(GOOD_CONFIG)
    top.chmod(0o777)
    one_line_refusal(run_gputop("--config", str(cfg), "status"), f"directory {top} is writable by others")
    top.chmod(0o755)
    assert run_gputop("--config", str(cfg), "status").returncode == 0


# ---- symlinks ------------------------------------------------------------------------------------

def test_a_symlink_is_followed_only_to_a_file_that_passes(sane, other):
    tmp_path = other.shared / "links"  # root's, 0755, inside the root-owned sticky dir the other user can reach
    tmp_path.mkdir()
    tmp_path.chmod(0o755)
    good = tmp_path / "real.yaml"
    good.write_text(KILL_VICTIMS)
    bad_dir = tmp_path / "open"
    bad_dir.mkdir()
    bad_dir.chmod(0o777)
    bad = bad_dir / "policy.yaml"
    bad.write_text(KILL_VICTIMS)
    link = tmp_path / "policy.yaml"
    link.symlink_to(bad)
    check = ["guard", "--test-policies", "--policy-file", str(link)]
    one_line_refusal(run_gputop(*check), f"directory {bad_dir} is writable by others")
    link.unlink()
    link.symlink_to("real.yaml")  # relative, to a good file
    assert run_gputop(*check).returncode == 0
    bad_dir.chmod(0o1777)
    theirs = bad_dir / "link.yaml"  # a symlink another user made in a sticky directory, to a good file
    made = other.run("-c", f"import os; os.symlink('{good}', '{theirs}')", module=False)
    assert made.returncode == 0, made.stderr
    one_line_refusal(run_gputop("guard", "--test-policies", "--policy-file", str(theirs)),
                     f"symlink {theirs} is owned by user {other.name}")
    # a symlinked directory on the way to a file in a world-writable one
    dlink = tmp_path / "dirlink"
    dlink.symlink_to(bad_dir)
    bad_dir.chmod(0o777)
    one_line_refusal(run_gputop("guard", "--test-policies", "--policy-file", str(dlink / "policy.yaml")),
                     f"directory {bad_dir} is writable by others")


# ---- unprivileged users: today's behaviour ----------------------------------------------------------

def test_an_unprivileged_user_still_loads_a_world_writable_file_of_their_own(other):
    other.holders([])
    other.cfg.write_text(GOOD_CONFIG)
    other.cfg.chmod(0o666)
    r = other.run("status")
    assert r.returncode == 0, r.stderr


# ---- a running guard keeps its last good configuration --------------------------------------------

def test_a_running_guard_keeps_its_last_good_policy_and_config_when_they_turn_writable(
        sane, procs, scenario, tmp_path, other):
    from gputop.core import auditlog
    from gputop.guard import state

    policy = other.shared / "policy.yaml"  # root's file (0644) in a root-owned sticky dir: accepted
    policy.write_text(KILL_VICTIMS)
    cfg = other.shared / "root-config.yaml"
    cfg.write_text(GOOD_CONFIG)
    bystander = named(procs, "bystander")
    v1 = named(procs, "victim")
    scenario(holders=holders(bystander, v1), gpus=1)
    log = open(tmp_path / "guard.log", "w+")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gputop", "--config", str(cfg), "guard", "run", "--interval", "0.3", "--enforce",
         "--policy-file", str(policy)],
        stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=_default_sighup)
    try:
        assert wait_gone(v1.pid, 30), "the guard did not kill the first victim"
        # the policy is made world-writable: the guard says so at once (a chmod alone), and keeps it
        policy.chmod(0o666)
        err = poll(lambda: state.read_state().get("last_error"), what="the daemon's refusal of the chmodded policy")
        assert "writable by others (mode 0666)" in err, err
        # the other user rewrites it to kill the bystander
        wrote = other.run("-c", f"open('{policy}', 'w').write({KILL_BYSTANDERS!r})", module=False)
        assert wrote.returncode == 0, wrote.stderr
        err = poll(lambda: state.status()["last_error"], what="the refusal in the state")
        assert "writable by others (mode 0666)" in err, err
        # and the node config too, protecting everything: SIGHUP finds it refused and keeps the old one
        cfg.write_text(EVERYTHING_PROTECTED)
        cfg.chmod(0o666)
        daemon.send_signal(signal.SIGHUP)
        poll(lambda: "config reload failed" in (tmp_path / "guard.log").read_text(), what="the config refusal")
        v2 = named(procs, "victim")
        scenario(holders=holders(bystander, v2), gpus=1)
        assert wait_gone(v2.pid, 30), "the guard stopped enforcing its last good policy"
        time.sleep(1.0)  # a few more ticks: the rewritten policy would kill the bystander now
        assert bystander.poll() is None
        assert daemon.poll() is None
        assert state.daemon_status()["rules"] == ["kill-victims"]
    finally:
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(20)
    log.seek(0)
    out = log.read()
    assert rc == 0, out
    assert "still enforcing the last valid policy" in out and "mode 0666" in out
    recs = auditlog.read()
    assert any(r.get("action") == "guard-policy" and r.get("outcome") == "rejected" and "0666" in r["message"]
               for r in recs)
    assert any(r.get("action") == "guard-config" and r.get("outcome") == "rejected" for r in recs)
    kills = [r for r in recs if r.get("action") == "kill" and r.get("face") == "guard"]
    assert {r["target"]["pid"] for r in kills} == {v1.pid, v2.pid}


# ---- the walk itself ---------------------------------------------------------------------------------

def test_dotdot_after_a_symlink_goes_where_the_kernel_goes(tmp_path):
    """'link/../f' is f beside the link's *target*, not beside the link: the check follows the kernel,
    not the spelling (a lexical clean-up would check tmp_path/f, which is fine, and read open/f)."""
    from gputop.util import trustfile

    (tmp_path / "f.yaml").write_text("rules: []\n")  # what a lexical reading would check
    bad = tmp_path / "open"
    (bad / "sub").mkdir(parents=True)
    bad.chmod(0o777)
    (bad / "f.yaml").write_text("rules: []\n")  # what the kernel reads
    (tmp_path / "link").symlink_to(bad / "sub")
    with pytest.raises(trustfile.UntrustedFile, match=f"directory {bad} is writable by others"):
        trustfile.read_text(f"{tmp_path}/link/../f.yaml", "policy")
    bad.chmod(0o755)
    assert trustfile.read_text(f"{tmp_path}/link/../f.yaml", "policy") == "rules: []\n"


def test_a_symlink_loop_is_an_error_not_a_hang(tmp_path):
    import errno

    from gputop.util import trustfile

    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError) as e:
        trustfile.read_text(tmp_path / "a", "policy")
    assert e.value.errno == errno.ELOOP
    r = run_gputop("guard", "--test-policies", "--policy-file", str(tmp_path / "a"))
    assert r.returncode == EXIT_USAGE and "Too many levels of symbolic links" in r.stderr, r.stderr
