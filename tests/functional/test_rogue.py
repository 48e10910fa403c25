"""The rogue audit: one test per pattern, each on a real process holding a simulated GPU."""

from __future__ import annotations

import json
import os
import socket
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from gputop.core.config import Config
from gputop.util.errors import UsageError
from gputop.core.rogue import MINER_NAMES, AuditConfig, History, audit
from tests.conftest import run_gputop
from tests.functional.guard_helpers import Clock, PoolServer, sampler_for
from tests.functional.test_guard_engine import wait_comm


def findings_for(path, pid, config=None, clock=None, **kw):
    sampler = sampler_for(path, clock or Clock(), config)
    return [f for f in audit(sampler.sample(), config or Config(), **kw) if f.pid == pid]


def rules(fs):
    return {f.rule for f in fs}


def test_known_miner_name(procs, scenario):
    xmrig = procs.sleeper(name="xmrig")
    wait_comm(xmrig.pid, "xmrig")
    path = scenario(holders=[{"pid": xmrig.pid, "gpu": 0, "memory": "2GiB", "sm": 10}])
    (f,) = [f for f in findings_for(path, xmrig.pid) if f.rule == "miner-name"]
    assert f.severity == "high" and "known crypto-miner name (xmrig)" in f.reason
    assert f.evidence.startswith("process name: xmrig") and f.name == "xmrig" and f.gpus == (0,)
    # python calling itself xmrig is also a disguise
    assert "disguised-name" in rules(findings_for(path, xmrig.pid))


def test_stratum_url_in_cmdline(procs, scenario):
    p = procs.spawn([sys.executable, "-c", "import time; time.sleep(600)", "--donate-level", "1",
                     "-o", "stratum+tcp://pool.example.org:3333", "-u", "worker1"])
    path = scenario(holders=[{"pid": p.pid, "gpu": 0, "memory": "2GiB", "sm": 10}])
    (f,) = [f for f in findings_for(path, p.pid) if f.rule == "miner-cmdline"]
    assert f.severity == "high" and f.evidence == "stratum+tcp://pool.example.org:3333"


def test_pool_and_wallet_arguments(procs, scenario):
    wallet = "4" + "A" + "x" * 93
    p = procs.spawn([sys.executable, "-c", "import time; time.sleep(600)", "--url",
                     "eu.mypool.example:14444", "--user", wallet])
    path = scenario(holders=[{"pid": p.pid, "gpu": 0, "memory": "2GiB", "sm": 10}])
    fs = [f for f in findings_for(path, p.pid) if f.rule == "miner-cmdline"]
    ev = {f.evidence for f in fs}
    assert "eu.mypool.example:14444" in ev and wallet in ev


def test_binary_run_from_tmp_and_deleted(procs, scenario):
    d = tempfile.mkdtemp(prefix="gputop-rogue-", dir="/tmp")
    exe = os.path.join(d, "worker")
    shutil.copy("/bin/sleep", exe)
    p = procs.spawn([exe, "600"])
    time.sleep(0.1)
    os.unlink(exe)
    os.rmdir(d)
    path = scenario(holders=[{"pid": p.pid, "gpu": 0, "memory": "2GiB", "sm": 10}])
    fs = [f for f in findings_for(path, p.pid) if f.rule == "suspicious-exe"]
    reasons = {f.reason: f for f in fs}
    deleted = reasons["the executable was deleted after the process started"]
    assert deleted.severity == "high" and deleted.evidence == f"{exe} (deleted)"
    tmp = reasons["the executable runs from a world-writable temporary directory"]
    assert tmp.evidence == exe
    assert "disguised-name" not in rules(findings_for(path, p.pid))  # it is called what it runs


def test_connection_to_a_pool_port(procs, scenario):
    pool = PoolServer()
    try:
        code = (f"import socket,time; s=socket.create_connection(('127.0.0.1',{pool.port})); "
                "print('up',flush=True); time.sleep(600)")
        p = procs.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"up"
        path = scenario(holders=[{"pid": p.pid, "gpu": 0, "memory": "2GiB", "sm": 10}])
        # the port is not a pool port until the admin says so
        assert "pool-connection" not in rules(findings_for(path, p.pid))
        cfg = Config(extra={"audit": {"extra_pool_ports": [pool.port]}})
        (f,) = [f for f in findings_for(path, p.pid, cfg) if f.rule == "pool-connection"]
        assert f.evidence.endswith(f"-> 127.0.0.1:{pool.port} (ESTABLISHED)")
        assert f"port {pool.port}" in f.reason
    finally:
        pool.close()


def test_pool_connection_over_ipv6_and_the_bystander_is_not_flagged(procs, scenario):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    server = socket.socket(socket.AF_INET6)
    try:
        server.bind(("::1", 0))
    except OSError as e:
        server.close()
        pytest.skip(f"cannot bind ::1: {e}")
    server.listen(4)
    port = server.getsockname()[1]
    try:
        code = (f"import socket,time; s=socket.create_connection(('::1',{port})); "
                "print('up',flush=True); time.sleep(600)")
        miner = procs.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE)
        assert miner.stdout.readline().strip() == b"up"
        bystander = procs.spawn(["sleep", "600"])
        path = scenario(holders=[{"pid": miner.pid, "gpu": 0, "memory": "2GiB", "sm": 10},
                                 {"pid": bystander.pid, "gpu": 0, "memory": "2GiB", "sm": 10}])
        cfg = Config(extra={"audit": {"extra_pool_ports": [port]}})
        (f,) = [f for f in findings_for(path, miner.pid, cfg) if f.rule == "pool-connection"]
        assert f.evidence.endswith(f"-> ::1:{port} (ESTABLISHED)")
        assert "pool-connection" not in rules(findings_for(path, bystander.pid, cfg))
    finally:
        server.close()


def test_proc_net_tcp_addresses_decode():
    from gputop.core.rogue import _hex_addr

    assert _hex_addr("0100007F:0D05") == ("127.0.0.1", 3333)
    assert _hex_addr("00000000000000000000000001000000:1F90") == ("::1", 8080)


def test_a_kernel_thread_disguise_is_not_excused_by_its_own_argv0(procs, scenario):
    # The process picks its argv[0] and its name: neither vouches for what it runs.
    code = ("import ctypes,time;ctypes.CDLL(None).prctl(15,b'kworker/0:1',0,0,0);time.sleep(600)")
    p = procs.spawn(["kworker/0:1", "-c", code], executable=sys.executable)
    wait_comm(p.pid, "kworker/0:1")
    path = scenario(holders=[{"pid": p.pid, "gpu": 0, "memory": "1GiB", "sm": 99}])
    (f,) = [f for f in findings_for(path, p.pid) if f.rule == "disguised-name"]
    assert f.severity == "high" and "kworker/0:1" in f.reason


def test_a_binary_in_a_hidden_directory_is_flagged(procs, scenario):
    # Not under /tmp (that is a finding of its own): a hidden directory in the home directory.
    hidden = tempfile.mkdtemp(prefix=".gputop-hidden-", dir=os.path.expanduser("~"))
    try:
        exe = os.path.join(hidden, "worker")
        shutil.copy("/bin/sleep", exe)
        p = procs.spawn([exe, "600"])
        path = scenario(holders=[{"pid": p.pid, "gpu": 0, "memory": "1GiB"}])
        fs = [f for f in findings_for(path, p.pid) if f.rule == "suspicious-exe"]
        assert any(f"hidden directory ({os.path.basename(hidden)})" in f.reason for f in fs), fs
    finally:
        shutil.rmtree(hidden, ignore_errors=True)


def test_an_ordinary_job_has_no_findings_and_nothing_is_allow_listed_by_default(procs, scenario):
    job = procs.spawn(["sleep", "600"])
    path = scenario(holders=[{"pid": job.pid, "gpu": 0, "memory": "4GiB", "sm": 97}])
    assert findings_for(path, job.pid) == []
    cfg = AuditConfig.from_config(Config())
    assert cfg.allowed_users is None and cfg.allowed_hours is None
    assert set(MINER_NAMES) <= set(cfg.miner_names)


def test_allow_list_hours_orphans_and_hashing_profile(procs, scenario):
    job = procs.spawn(["sleep", "600"])
    orphan = procs.orphan("sleep 688", "sleep 688")
    path = scenario(holders=[{"pid": job.pid, "gpu": 0, "memory": "200MiB", "sm": 99},
                             {"pid": orphan, "gpu": 1, "memory": "1GiB", "sm": 5}])
    clock = Clock()
    h = time.localtime(clock()).tm_hour
    window = f"{(h + 2) % 24:02d}:00-{(h + 3) % 24:02d}:00"  # never contains now
    cfg = Config(extra={"audit": {"allowed_users": ["someone-else"], "allowed_hours": {"hours": window}}})
    fs = findings_for(path, job.pid, cfg, clock)
    byrule = {f.rule: f for f in fs}
    assert byrule["unlisted-user"].severity == "medium"
    assert "not on the allow-list" in byrule["unlisted-user"].reason
    assert byrule["outside-hours"].evidence.endswith(f"not in {{'hours': '{window}'}}")
    hp = byrule["hashing-profile"]
    assert "in the current sample (one sample, no history" in hp.reason
    assert hp.evidence == "99% (process SM%) with 200MiB GPU memory"
    assert "orphaned-holder" in rules(findings_for(path, orphan, cfg, clock))
    # with history, the profile must hold for hashing.sustain
    sampler = sampler_for(path, clock)
    hist = History()
    assert "hashing-profile" not in rules(f for f in audit(sampler.sample(), Config(), history=hist)
                                          if f.pid == job.pid)
    clock.advance(61)
    fs = [f for f in audit(sampler.sample(), Config(), history=hist) if f.pid == job.pid]
    assert "for 61s (>= 60s)" in next(f for f in fs if f.rule == "hashing-profile").reason


def test_bad_audit_config_is_a_usage_error():
    for extra, frag in (({"pool_ports": ["x"]}, "bad port"), ({"allow_users": []}, "unknown key 'audit.allow_users'"),
                        ({"hashing": {"max_memory": "lots"}}, "bad memory size")):
        with pytest.raises(UsageError) as ei:
            AuditConfig.from_config(Config(extra={"audit": extra}))
        assert frag in str(ei.value)


def test_cli_audit_rogue_json_and_table(procs, scenario):
    xmrig = procs.sleeper(name="xmrig")
    wait_comm(xmrig.pid, "xmrig")
    miner = procs.spawn([sys.executable, "-c", "import time; time.sleep(600)", "-o", "stratum+ssl://x.example:4444"])
    scenario(holders=[{"pid": xmrig.pid, "gpu": 0, "memory": "300MiB", "sm": 10},
                      {"pid": miner.pid, "gpu": 1, "memory": "2GiB", "sm": 10}])
    r = run_gputop("audit", "--rogue", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    got = {(f["pid"], f["rule"]) for f in data["findings"]}
    assert (xmrig.pid, "miner-name") in got and (miner.pid, "miner-cmdline") in got
    assert all({"severity", "rule", "pid", "reason", "evidence"} <= set(f) for f in data["findings"])
    r = run_gputop("audit", "--rogue")
    assert r.returncode == 0 and "HIGH" in r.stdout and "stratum+ssl://x.example:4444" in r.stdout
