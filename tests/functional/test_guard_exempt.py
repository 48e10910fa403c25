"""Issue 25: the guard's exemptions are the admin's, never the user's.

A second real user (created by the test helper, run with setpriv) starts miners that hide behind every
exemption a user can forge: SIGHUP ignored (the nohup mark), a parent named tmux, a chain over 64 deep,
argv[0] jupyter-lab, a name with tmux in it. An enforcing block-miners rule, evaluated as root on a real
snapshot (simulated GPUs, real processes, real signals), kills all five; the same user's innocent
process lives. Then the exemptions an admin writes in ``guard.exempt`` (uid, group, systemd unit,
cgroup, an executable in a root-owned directory) spare a miner-named process, and the look-alikes a
user could arrange (a user-manager unit of the same name, a cgroup whose name only starts the same,
a copy of the executable in a directory the user can write) do not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from gputop.core import auditlog
from gputop.core.config import Config
from gputop.guard.engine import Engine, explain
from gputop.guard.policy import parse_policy
from tests.conftest import wait_comm, wait_gone
from tests.functional.actions_helpers import OtherUser, _unprivileged
from tests.functional.guard_helpers import Clock, sampler_for
from tests.functional.names_helpers import orphan_named

BLOCK_MINERS = parse_policy(textwrap.dedent("""\
    rules:
      - name: block-miners
        conditions:
          - {type: process_name, operator: contains, value: xmrig}
        action: kill
        force: true
        timeout: 3s
"""))
PY3 = "/usr/bin/python3"
CGROUP_SYSTEMD = Path("/sys/fs/cgroup/systemd")


class Second:
    """A second real user and a directory it can write (and read), with the test's binaries in it."""

    def __init__(self, request):
        if os.geteuid() != 0:
            pytest.skip("needs root: the guard runs as root against another user's processes")
        if not shutil.which("setpriv"):
            pytest.skip("setpriv (util-linux) is missing: cannot run processes as another user")
        user = _unprivileged()  # the actions tests' helper: nobody, or a gputop-test it creates
        if user is None:
            pytest.skip("no unprivileged user exists and none can be created")
        import pwd

        self.name, self.gid = user
        self.uid = pwd.getpwnam(self.name).pw_uid
        self.dir = Path(tempfile.mkdtemp(prefix="gputop-exempt-"))
        request.addfinalizer(lambda: shutil.rmtree(self.dir, ignore_errors=True))
        os.chmod(self.dir, 0o777)  # the user's own writable directory

    def setpriv(self) -> list[str]:
        return OtherUser.setpriv(self)  # type: ignore[arg-type]  (the helper's: reuid, regid, clear groups)

    def binary(self, name: str, where: Path | None = None) -> str:
        """A copy of sleep named ``name``: a process that runs it is called ``name`` by the kernel."""
        path = (where or self.dir) / name
        shutil.copy2(shutil.which("sleep"), path)
        os.chmod(path, 0o755)
        return str(path)

    def script(self, name: str, text: str) -> str:
        path = self.dir / name
        path.write_text(text)
        os.chmod(path, 0o755)
        return str(path)

    def spawn(self, procs, cmd: list[str]):
        p = procs.spawn(self.setpriv() + cmd)
        return p


@pytest.fixture
def second(request):
    return Second(request)


def descendant(root: int, name: str, timeout: float = 30.0) -> int:
    """The PID of the process called ``name`` under ``root`` (however deep)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            for c in psutil.Process(root).children(recursive=True):
                try:
                    if c.name() == name[:15] and c.status() != psutil.STATUS_ZOMBIE:
                        return c.pid
                except psutil.Error:
                    continue
        except psutil.Error:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"no {name!r} under pid {root}")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def engine(scenario, holders, config: Config | None = None):
    clock = Clock()
    path = scenario(holders=[{"pid": pid, "gpu": i % 2, "memory": "1GiB", "sm": 99} for i, pid in enumerate(holders)])
    sampler = sampler_for(path, clock)  # default config: default protect patterns, nohup protects
    hits: list[dict] = []
    eng = Engine(BLOCK_MINERS, config=config or Config(), sampler=sampler, record=hits.append)
    return eng, sampler, hits


def five_miners(second, procs) -> dict[str, int]:
    """The five miners of the issue, each run as the second user; name -> pid."""
    out = {}
    xmrig = second.binary("xmrig")
    # 1. ignores SIGHUP (trap '' HUP, as nohup leaves it): the nohup mark
    p = second.spawn(procs, ["sh", "-c", f"trap '' HUP; exec {xmrig} 600"])
    wait_comm(p.pid, "xmrig")
    out["sighup-ignored"] = p.pid
    # 2. under a parent the user named tmux (a script called tmux: its names agree, so it is protected)
    child = second.binary("xmrig-child")
    tmux = second.script("tmux", f"#!{PY3}\nimport subprocess, sys, time\n"
                                 f"subprocess.Popen([{child!r}, '600'])\ntime.sleep(600)\n")
    p = second.spawn(procs, [tmux])
    out["parent-named-tmux"] = descendant(p.pid, "xmrig-child")
    # 3. 70 processes deep: the chain is over 64, so its verdict is unknown
    deep = second.binary("xmrig-deep")
    chain = second.script("chain", '#!/bin/sh\nif [ "$1" -gt 0 ]; then "$0" $(($1 - 1)) "$2"; exit 0; fi\n'
                                   'exec "$2" 600\n')
    p = second.spawn(procs, [chain, "70", deep])
    out["70-deep"] = descendant(p.pid, "xmrig-deep")
    # 4. argv[0] jupyter-lab, while its name (comm) stays xmrig
    p = second.spawn(procs, ["bash", "-c", f"exec -a jupyter-lab {xmrig} 600"])
    wait_comm(p.pid, "xmrig")
    out["argv0-jupyter-lab"] = p.pid
    # 5. named xmrig-tmux: 'tmux' is in its name
    p = second.spawn(procs, [second.binary("xmrig-tmux"), "600"])
    wait_comm(p.pid, "xmrig-tmux")
    out["named-xmrig-tmux"] = p.pid
    return out


def test_an_enforcing_block_miners_rule_kills_all_five_disguised_miners_and_spares_the_bystander(
        second, procs, scenario):
    miners = five_miners(second, procs)
    bystander = second.spawn(procs, [second.binary("trainer"), "600"])
    wait_comm(bystander.pid, "trainer")
    for pid in [*miners.values(), bystander.pid]:
        assert psutil.Process(pid).uids().real == second.uid  # really the second user's
    eng, sampler, hits = engine(scenario, [*miners.values(), bystander.pid])
    snap = sampler.sample()
    verdicts = {k: snap.holder(pid).verdict for k, pid in miners.items()}
    # What used to exempt them from the guard: orphan verdicts that the user chose.
    assert verdicts["sighup-ignored"].kind == "protected" and "SIGHUP" in verdicts["sighup-ignored"].reason
    assert verdicts["parent-named-tmux"].kind == "protected", verdicts["parent-named-tmux"]
    assert verdicts["70-deep"].kind == "unknown" and "longer than 64" in verdicts["70-deep"].reason
    # (argv[0] jupyter-lab and xmrig-tmux were protected by name before issue 25; now neither is.)
    assert "protect pattern" not in verdicts["argv0-jupyter-lab"].reason
    assert "protect pattern" not in verdicts["named-xmrig-tmux"].reason

    new = eng.evaluate(snap, "enforce")
    by_pid = {h["pid"]: h for h in new}
    for what, pid in miners.items():
        hit = by_pid[pid]
        assert hit["ok"] and hit["outcome"] in ("terminated", "killed"), (what, hit)
        assert wait_gone(pid), what
    assert bystander.pid not in by_pid
    time.sleep(0.3)
    assert alive(bystander.pid), "the same user's innocent process was killed"
    recs = {r["target"]["pid"]: r for r in auditlog.read() if r.get("action") == "kill" and r.get("face") == "guard"}
    for what, pid in miners.items():
        assert recs[pid]["outcome"] in ("terminated", "killed") and recs[pid]["reason"] == "block-miners", what
    assert recs[miners["70-deep"]]["details"]["policy_overrides"] == "unknown"
    assert recs[miners["sighup-ignored"]]["details"]["policy_overrides"] == "protected"


def test_dry_run_and_test_policies_say_the_miners_would_be_killed(second, procs, scenario):
    miners = five_miners(second, procs)
    eng, sampler, hits = engine(scenario, list(miners.values()))
    snap = sampler.sample()
    for h in eng.evaluate(snap, "dry-run"):
        assert h["outcome"] == "dry-run" and h["ok"], h
    targets = {t["pid"]: t for t in explain(BLOCK_MINERS, snap)[0]["targets"]}
    for what, pid in miners.items():
        assert targets[pid]["decision"] == "would-act", what
        assert "refused" not in targets[pid]["verdict"], (what, targets[pid]["verdict"])
        assert alive(pid)


# ---- exemptions an admin writes -------------------------------------------------------------------

def exempt_config(**lists) -> Config:
    return Config(extra={"guard": {"exempt": lists}})


def evaluate_one(scenario, pids, config):
    eng, sampler, hits = engine(scenario, pids, config)
    return {h["pid"]: h for h in eng.evaluate(sampler.sample(), "enforce")}


def check_exempt(hit: dict, pid: int, key: str) -> None:
    assert hit["outcome"] == "exempt" and hit["ok"] is False, hit
    assert hit["details"]["exempt"]["key"] == f"guard.exempt.{key}", hit
    assert f"guard.exempt.{key}" in hit["message"]
    assert alive(pid)
    rec = [r for r in auditlog.read() if r.get("outcome") == "exempt" and r["target"]["pid"] == pid][-1]
    assert rec["face"] == "guard" and rec["action"] == "kill" and rec["reason"] == "block-miners"
    assert rec["details"]["exempt"]["key"] == f"guard.exempt.{key}"


@pytest.mark.parametrize("key", ["users", "uid", "groups"])
def test_an_exempt_user_or_group_is_spared_and_named(second, procs, scenario, key):
    miner = second.spawn(procs, [second.binary("xmrig"), "600"])
    wait_comm(miner.pid, "xmrig")
    lists = {"users": {"users": [second.name]}, "uid": {"users": [second.uid]},
             "groups": {"groups": [int(second.gid)]}}[key]
    mine = procs.spawn([second.binary("xmrig-root"), "600"])  # root's own miner: not exempt
    wait_comm(mine.pid, "xmrig-root")
    hits = evaluate_one(scenario, [miner.pid, mine.pid], exempt_config(**lists))
    check_exempt(hits[miner.pid], miner.pid, "users" if key == "uid" else key)
    assert hits[mine.pid]["ok"] and wait_gone(mine.pid)


def _cgroup(request, path: str) -> Path:
    base = CGROUP_SYSTEMD
    if not (base / "cgroup.procs").exists():
        pytest.skip("no writable name=systemd cgroup hierarchy here (/sys/fs/cgroup/systemd)")
    d = base / path.lstrip("/")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        pytest.skip(f"cannot create a cgroup here: {e}")

    def rm():
        for p in sorted([d, *d.parents], key=lambda x: -len(str(x))):
            if p == base or base not in p.parents:
                continue
            try:  # the test's processes end after this finalizer: move them out, or rmdir waits in vain
                for pid in (p / "cgroup.procs").read_text().split():
                    (base / "cgroup.procs").write_text(pid)
            except OSError:
                pass
            deadline = time.time() + 5
            while time.time() < deadline:
                try:
                    p.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)  # a process is still leaving it
    request.addfinalizer(rm)
    return d


def _move(pid: int, d: Path) -> None:
    (d / "cgroup.procs").write_text(str(pid))
    assert any(line.endswith(":" + "/" + str(d.relative_to(CGROUP_SYSTEMD))) for line in
               Path(f"/proc/{pid}/cgroup").read_text().splitlines())


def test_an_exempt_system_unit_or_cgroup_is_spared_but_a_look_alike_is_not(second, procs, scenario, request):
    tag = f"gputop-exempt-{os.getpid()}"
    unit = f"{tag}.service"
    system = _cgroup(request, f"/{tag}.slice/{unit}")
    # The same unit name under the user's own systemd (user@UID.service): the user chose that name.
    users = _cgroup(request, f"/user.slice/user-{second.uid}.slice/user@{second.uid}.service/app.slice/"
                             f"{tag}-u/{unit}")
    # A cgroup whose name only starts like the exempt one.
    evil = _cgroup(request, f"/{tag}.slice-evil")
    pids = {}
    for name, d in (("in-unit", system), ("user-unit", users), ("prefix", evil)):
        p = second.spawn(procs, [second.binary(f"xmrig-{name}"), "600"])
        wait_comm(p.pid, f"xmrig-{name}")
        _move(p.pid, d)
        pids[name] = p.pid
    hits = evaluate_one(scenario, list(pids.values()), exempt_config(units=[unit]))
    check_exempt(hits[pids["in-unit"]], pids["in-unit"], "units")
    for name in ("user-unit", "prefix"):
        assert hits[pids[name]]["ok"] and wait_gone(pids[name]), name
    # by cgroup path: the exempt slice and what is under it, not a name that merely starts the same
    p = second.spawn(procs, [second.binary("xmrig-evil2"), "600"])
    wait_comm(p.pid, "xmrig-evil2")
    _move(p.pid, evil)
    hits = evaluate_one(scenario, [pids["in-unit"], p.pid], exempt_config(cgroups=[f"/{tag}.slice"]))
    check_exempt(hits[pids["in-unit"]], pids["in-unit"], "cgroups")
    assert hits[p.pid]["ok"] and wait_gone(p.pid)


def test_an_exempt_root_owned_executable_is_spared_but_a_user_writable_one_is_not(second, procs, scenario,
                                                                                   request):
    root_dir = Path(tempfile.mkdtemp(prefix="gputop-exempt-", dir="/opt"))
    request.addfinalizer(lambda: shutil.rmtree(root_dir, ignore_errors=True))
    os.chmod(root_dir, 0o755)
    trusted = second.binary("xmrig-exporter", root_dir)  # root's file in root's directories
    p_trusted = second.spawn(procs, [trusted, "600"])
    # The same program copied where the user can write: a user could put anything there.
    writable = second.binary("xmrig-exporter")
    p_copy = second.spawn(procs, [writable, "600"])
    own_dir = second.dir / "own"
    own_dir.mkdir()
    os.chmod(own_dir, 0o755)
    owned = second.binary("xmrig-owned", own_dir)
    os.chown(owned, second.uid, int(second.gid))  # a file the user owns, in a directory that is not 0777
    os.chown(own_dir, second.uid, int(second.gid))
    p_owned = second.spawn(procs, [owned, "600"])
    for p, n in ((p_trusted, "xmrig-exporter"), (p_copy, "xmrig-exporter"), (p_owned, "xmrig-owned")):
        wait_comm(p.pid, n)
    # The admin lists all three paths: only the root-owned one is honoured.
    hits = evaluate_one(scenario, [p_trusted.pid, p_copy.pid, p_owned.pid],
                        exempt_config(executables=[trusted, writable, owned]))
    check_exempt(hits[p_trusted.pid], p_trusted.pid, "executables")
    for p in (p_copy, p_owned):
        assert hits[p.pid]["ok"] and hits[p.pid]["outcome"] in ("terminated", "killed"), hits[p.pid]
        assert wait_gone(p.pid)
    # A root-owned file whose directory becomes writable by others is no longer trusted.
    os.chmod(root_dir, 0o777)
    hits = evaluate_one(scenario, [p_trusted.pid], exempt_config(executables=[trusted]))
    assert hits[p_trusted.pid]["ok"] and wait_gone(p_trusted.pid)


def test_exemption_is_read_from_the_live_process_not_the_snapshot(second, procs, scenario):
    """A process that matches the rule, selected from a snapshot, whose PID is another process by the time
    the guard acts: no exemption is looked up for the new process, and nothing is signalled."""
    from gputop.guard.exempt import Exempt

    miner = second.spawn(procs, [second.binary("xmrig"), "600"])
    wait_comm(miner.pid, "xmrig")
    ex = Exempt.from_config(exempt_config(users=[second.name]))
    start = psutil.Process(miner.pid).create_time()
    assert ex.match(miner.pid, round(start, 2)) is not None
    assert ex.match(miner.pid, round(start, 2) - 5.0) is None  # another identity: no answer about it
    assert ex.match(miner.pid, None) is not None
    miner.kill()
    miner.wait()
    assert ex.match(miner.pid, round(start, 2)) is None


# ---- guard reap: about abandoned trees, so the orphan verdict still decides --------------------------

REAP_MINERS = parse_policy(textwrap.dedent("""\
    rules:
      - name: reap-abandoned-miners
        conditions:
          - {type: process_name, operator: contains, value: xmrig}
          - {type: orphan, operator: ==, value: true}
        action: reap
        timeout: 2s
"""))


def test_a_guard_reap_rule_reaps_an_abandoned_miner_honours_nohup_and_the_admins_exemption(second, procs,
                                                                                           scenario):
    xmrig = second.binary("xmrig")
    as_second = lambda argv: second.spawn(procs, argv)  # noqa: E731
    plain = orphan_named(as_second, procs, f"{xmrig} 600", "xmrig")
    hup = second.binary("xmrig-hup")
    detached = orphan_named(as_second, procs, f"sh -c \"trap '' HUP; exec {hup} 600\"", "xmrig-hup")
    clock = Clock()
    path = scenario(holders=[{"pid": p, "gpu": 0, "memory": "1GiB", "sm": 99} for p in (plain, detached)])
    sampler = sampler_for(path, clock)
    snap = sampler.sample()
    assert snap.holder(plain).verdict.kind == "orphan"
    assert snap.holder(detached).verdict.kind == "protected"  # the nohup mark: not abandoned, says its user
    # With the admin's exemption of that user, nothing is reaped, and the hit says why.
    hits = {h["pid"]: h for h in Engine(REAP_MINERS, config=exempt_config(users=[second.uid]), sampler=sampler,
                                        record=lambda h: None).evaluate(snap, "enforce")}
    assert hits[plain]["outcome"] == "exempt" and hits[plain]["details"]["exempt"]["key"] == "guard.exempt.users"
    assert alive(plain)
    # Without it: the abandoned tree is reaped; the one its user detached with nohup is not a reap's to take
    # (a kill rule is how an admin stops it: see the five-miners test).
    snap = sampler.sample()
    eng = Engine(REAP_MINERS, sampler=sampler, record=lambda h: None)
    hits = {h["pid"]: h for h in eng.evaluate(snap, "enforce")}
    assert hits[plain]["action"] == "reap" and hits[plain]["ok"], hits[plain]
    assert wait_gone(plain)
    assert detached not in hits  # not an orphan by its verdict: the rule's orphan condition is false
    assert alive(detached)


def test_test_policies_names_the_exemption(second, procs, scenario):
    miner = second.spawn(procs, [second.binary("xmrig"), "600"])
    wait_comm(miner.pid, "xmrig")
    path = scenario(holders=[{"pid": miner.pid, "gpu": 0, "memory": "1GiB", "sm": 99}])
    snap = sampler_for(path, Clock()).sample()
    (t,) = explain(BLOCK_MINERS, snap, exempt_config(users=[second.name]))[0]["targets"]
    assert "exempt by guard.exempt.users" in t["verdict"] and "nothing will be done" in t["verdict"], t
    (t,) = explain(BLOCK_MINERS, snap, Config())[0]["targets"]
    assert t["decision"] == "would-act" and "exempt" not in t["verdict"]
    assert alive(miner.pid)


def test_the_real_daemon_kills_a_nohup_miner_and_spares_the_admins_exempt_executable(second, procs, scenario,
                                                                                    tmp_path, request):
    """`gputop guard run --enforce` as root, with guard.exempt in its config file."""
    from gputop.guard import state
    from tests.conftest import _default_sighup

    root_dir = Path(tempfile.mkdtemp(prefix="gputop-exempt-", dir="/opt"))
    request.addfinalizer(lambda: shutil.rmtree(root_dir, ignore_errors=True))
    os.chmod(root_dir, 0o755)
    exporter = second.spawn(procs, [second.binary("xmrig-exporter", root_dir), "600"])
    hup = second.spawn(procs, ["sh", "-c", f"trap '' HUP; exec {second.binary('xmrig')} 600"])
    bystander = second.spawn(procs, [second.binary("trainer"), "600"])
    for p, n in ((exporter, "xmrig-exporter"), (hup, "xmrig"), (bystander, "trainer")):
        wait_comm(p.pid, n)
    scenario(holders=[{"pid": p.pid, "gpu": 0, "memory": "1GiB", "sm": 99} for p in (exporter, hup, bystander)])
    policy = tmp_path / "policy.yaml"
    policy.write_text(textwrap.dedent("""\
        rules:
          - name: block-miners
            conditions:
              - {type: process_name, operator: contains, value: xmrig}
            action: kill
            force: true
            timeout: 3s
    """))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"guard:\n  exempt:\n    executables: [{root_dir}/xmrig-exporter]\n")
    log = open(tmp_path / "guard.log", "w+")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gputop", "--config", str(cfg), "guard", "run", "--interval", "0.3", "--enforce",
         "--policy-file", str(policy)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_default_sighup)
    try:
        assert wait_gone(hup.pid, 30), "the daemon did not kill the miner that ignores SIGHUP"
        deadline = time.time() + 30
        hit = None
        while time.time() < deadline and hit is None:
            hit = next((h for h in state.recent_hits() if h["pid"] == exporter.pid and h["outcome"] == "exempt"),
                       None)
            time.sleep(0.1)
        assert hit is not None, "no exempt hit for the admin's exporter"
        assert hit["details"]["exempt"]["key"] == "guard.exempt.executables"
    finally:
        daemon.send_signal(15)
        rc = daemon.wait(20)
    log.seek(0)
    out = log.read()
    assert rc == 0, out
    assert "exempt by guard.exempt.executables" in out
    assert alive(exporter.pid) and alive(bystander.pid)
