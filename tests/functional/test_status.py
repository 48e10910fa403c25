"""Orphan verdicts on real process trees, and `gputop status` on the simulated backend."""

from __future__ import annotations

import json
import os
import time


from gputop.backends.simulated import SimulatedBackend
from gputop.core.config import Config
from gputop.core.orphans import NOT_ORPHAN, ORPHAN, PROTECTED
from gputop.core.procs import read_proc
from gputop.core.sampler import Sampler
from tests.conftest import run_gputop, run_on_pty, wait_gone


def sample(path) -> "Sampler":
    s = Sampler([SimulatedBackend(path)], config=Config())
    return s.sample()


def test_job_whose_session_leader_exited_is_orphan(procs, scenario):
    worker = procs.orphan("sleep 611", "sleep 611")
    snap = sample(scenario([{"pid": worker, "gpu": 0, "memory": "2GiB"}]))
    h = snap.holder(worker)
    assert h.verdict.kind == ORPHAN, h.verdict
    assert "session leader" in h.verdict.reason and "gone" in h.verdict.reason
    assert [r.pid for r in snap.roots] == [worker]


def test_setsid_daemon_is_not_orphan(procs, scenario):
    daemon = procs.spawn(["setsid", "sleep", "612"]).pid
    time.sleep(0.1)
    snap = sample(scenario([{"pid": daemon, "gpu": 0, "memory": "1GiB"}]))
    v = snap.holder(daemon).verdict
    assert v.kind == NOT_ORPHAN and "session leader itself" in v.reason
    assert snap.roots == ()


def test_child_of_live_shell_is_not_orphan(procs, scenario):
    shell = procs.spawn(["setsid", "sh", "-c", "sleep 613; true"])
    worker = procs.wait_for("sleep 613")
    v = sample(scenario([{"pid": worker, "gpu": 0}])).holder(worker).verdict
    assert v.kind == NOT_ORPHAN and f"pid {shell.pid}" in v.reason


def test_two_level_orphan_tree_root_is_the_top(procs, scenario):
    # The backgrounded inner shell is a retry-loop-like parent; the worker sleeps under it.
    worker = procs.orphan('sh -c "sleep 614; true"', "sleep 614")
    parent = read_proc(worker).ppid
    assert "sh" in read_proc(parent).name
    snap = sample(scenario([{"pid": worker, "gpu": 1, "memory": "3GiB"}]))
    h = snap.holder(worker)
    assert h.verdict.kind == ORPHAN and h.verdict.root == parent
    assert [c.pid for c in h.chain][0] == parent
    (root,) = snap.roots
    assert root.pid == parent and root.holders == (worker,) and root.gpus == (1,)
    assert root.gpu_memory == 3 * 1024**3


def test_protected_chain(procs, scenario):
    # The orphan root is a program called jupyter-kernel (a copy of sh): the whole chain is protected.
    # (A word in an argument would not protect: see tests/functional/test_reap_safety.py. Until issue 25
    # this was a sh run with argv[0] jupyter-kernel, which is a disguise now: see test_protect_disguise.py.)
    from tests.functional.names_helpers import binary

    worker = procs.orphan(f"""{binary('jupyter-kernel', 'sh')} -c "sleep 615; :" """, "sleep 615")
    v = sample(scenario([{"pid": worker, "gpu": 0}])).holder(worker).verdict
    assert v.kind == PROTECTED and "jupyter" in v.reason
    assert v.orphan_reason and "gone" in v.orphan_reason


def test_nohup_detached_job_is_protected(procs, scenario):
    worker = procs.orphan("nohup sleep 616 >/dev/null 2>&1", "sleep 616")
    assert read_proc(worker).sighup_ignored is True
    v = sample(scenario([{"pid": worker, "gpu": 0}])).holder(worker).verdict
    assert v.kind == PROTECTED and "detached with nohup" in v.reason


def test_status_json_field_by_field(procs, scenario):
    orphan = procs.orphan('sh -c "sleep 617; true"', "sleep 617")
    graphics = procs.spawn(["setsid", "sleep", "618"]).pid
    time.sleep(0.1)
    path = scenario([
        {"pid": orphan, "gpu": 0, "memory": "4GiB", "type": "C", "sm": 97},
        {"pid": graphics, "gpu": 1, "memory": "512MiB", "type": "G"},
        {"pid": graphics, "gpu": 1, "memory": "512MiB", "type": "C"},
        {"pid": 4_000_000, "gpu": 1, "memory": "1GiB", "visible": False},
    ], utilization=None)
    r = run_gputop("status", "--json", "--scenario", str(path))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) >= {"at", "gpu", "holders", "roots", "warnings", "host", "backends"}
    assert set(doc["gpu"]) == {"gpus", "holders", "instances"}  # instances: MIG devices (issue 30)
    g0, g1 = doc["gpu"]["gpus"]
    assert g0["index"] == 0 and g0["backend"] == "simulated" and g0["memory_total"] == 80 * 1024**3
    assert g0["memory_used"] == 4 * 1024**3 and g0["utilization_gpu"] == 97
    assert g0["temperature_c"] == 50 and g0["power_limit_w"] == 700 and g0["fan_percent"] == 30
    assert g1["memory_used"] == 2 * 1024**3  # 1 GiB merged for `graphics` + 1 GiB for the invisible pid
    by_pid = {h["pid"]: h for h in doc["holders"]}
    o = by_pid[orphan]
    assert o["visible"] and o["ctx"] == "C" and o["gpus"] == [0] and o["gpu_memory"] == 4 * 1024**3
    assert o["sm_util"] == 97 and o["user"] and o["cmdline"] == ["sleep", "617"]
    assert o["start_time"] == read_proc(orphan).start_time
    assert o["verdict"]["kind"] == "orphan" and o["verdict"]["root"] == read_proc(orphan).ppid
    assert o["chain"][0]["pid"] == read_proc(orphan).ppid and o["chain"][0]["name"] == "sh"
    assert {"pid", "start_time", "name", "cmdline"} <= set(o["chain"][0])
    assert o["chain"][-1]["pid"] == 1 or o["verdict"]["reaper"] != 1
    g = by_pid[graphics]
    assert g["ctx"] == "C+G" and g["gpu_memory"] == 1024**3 and g["verdict"]["kind"] == "not-orphan"
    ghost = by_pid[4_000_000]
    assert not ghost["visible"] and ghost["verdict"]["kind"] == "unknown" and ghost["cmdline"] is None
    assert any("4000000" in w for w in doc["warnings"])
    (root,) = doc["roots"]
    assert root["pid"] == read_proc(orphan).ppid and root["holders"] == [orphan] and root["gpus"] == [0]
    rows = {(h["gpu"], h["pid"], h["ctx"]) for h in doc["gpu"]["holders"]}
    assert (0, orphan, "C") in rows and (1, graphics, "C+G") in rows


def test_unknown_memory_is_null_not_zero(procs, scenario):
    p = procs.sleeper()
    path = scenario([{"pid": p.pid, "gpu": 0, "memory": None}], gpus=1)
    doc = json.loads(run_gputop("status", "--json", "--scenario", str(path)).stdout)
    assert doc["holders"][0]["gpu_memory"] is None and doc["gpu"]["holders"][0]["used_memory"] is None


def test_exited_holder_disappears_and_scenario_is_reread(procs, scenario):
    a, b = procs.sleeper(), procs.sleeper()
    path = scenario([{"pid": a.pid, "gpu": 0, "memory": "1GiB"}])
    backend = SimulatedBackend(path)
    sampler = Sampler([backend])
    assert [h.pid for h in sampler.sample().holders] == [a.pid]
    # Edit the file: the backend notices without a restart.
    time.sleep(0.01)
    scenario([{"pid": a.pid, "gpu": 0, "memory": "1GiB"}, {"pid": b.pid, "gpu": 1, "memory": "2GiB"}])
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert sorted(h.pid for h in sampler.sample().holders) == sorted([a.pid, b.pid])
    a.kill()
    a.wait()
    snap = sampler.sample()
    assert [h.pid for h in snap.holders] == [b.pid]
    assert snap.device(0).memory_used == 0  # the dead process's memory is freed


def test_reused_pid_is_not_a_holder(procs, scenario):
    p = procs.sleeper()
    path = scenario([{"pid": p.pid, "gpu": 0, "start_time": read_proc(p.pid).start_time - 50}])
    assert sample(path).holders == ()


def test_status_table_lists_verdicts(procs, scenario):
    worker = procs.orphan("sleep 619", "sleep 619")
    r = run_gputop("status", "--scenario", str(scenario([{"pid": worker, "gpu": 0, "memory": "2GiB"}])))
    assert r.returncode == 0
    assert str(worker) in r.stdout and "orphan" in r.stdout and "orphan trees" in r.stdout


def test_status_without_gpu_exits_zero_and_says_why():
    r = run_gputop("status", env={"LD_LIBRARY_PATH": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    assert "no GPU found" in r.stdout and "nvml" in r.stdout.lower() and "--demo" in r.stdout
    doc = json.loads(run_gputop("status", "--json").stdout)
    assert doc["gpu"]["gpus"] == [] and any(not b["available"] and b["reason"] for b in doc["backends"])


def test_bad_scenario_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [{name: x}]\nholders: [{pid: notanumber}]\n")
    r = run_gputop("status", "--scenario", str(bad))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "holders[0]" in r.stderr and "pid" in r.stderr
    r = run_gputop("status", "--scenario", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "cannot read scenario" in r.stderr  # bad input (README "Exit codes")


def test_status_does_not_import_textual(scenario):
    path = scenario([], gpus=1)
    code = ("import sys; from gputop.commands.cli import main; main(['status','--json','--scenario',%r]);"
            "sys.stderr.write(str(any(m.startswith('textual') for m in sys.modules)))") % str(path)
    import subprocess, sys
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stderr.strip().endswith("False")


def test_kill_and_wait_gone_helper_sanity(procs):
    # wait_gone must report a live process as alive: guards every test that relies on it.
    p = procs.sleeper()
    assert not wait_gone(p.pid, timeout=0.2)
    p.kill()
    assert wait_gone(p.pid, timeout=5)


def test_status_json_is_compact_to_a_pipe_and_indented_at_a_terminal(procs, scenario):
    # A pipe gets one line (the C encoder; a third of the time at 1,024 holders), a person the indented form.
    import sys

    worker = procs.sleeper().pid
    path = str(scenario([{"pid": worker, "gpu": 0, "memory": "1GiB"}]))
    piped = run_gputop("status", "--json", "--scenario", path)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.count("\n") == 1 and '"pid":' in piped.stdout
    doc = json.loads(piped.stdout)
    rc, shown, stderr = run_on_pty([sys.executable, "-m", "gputop", "status", "--json", "--scenario", path],
                                   merge_stderr=False)
    assert rc == 0, stderr
    assert '\n  "at": ' in shown
    assert json.loads(shown)["holders"][0]["pid"] == doc["holders"][0]["pid"] == worker


def test_sample_devices_reads_no_processes(procs, scenario, tmp_path):
    # The TUI's first frame shows the devices before the first full sample; that pass must not read /proc.
    worker = procs.sleeper().pid
    s = Sampler([SimulatedBackend(scenario([{"pid": worker, "gpu": 1, "memory": "1GiB"}], gpus=2))],
                config=Config(), proc_root=str(tmp_path / "no-proc"))
    devs = s.sample_devices()
    assert [d.index for d in devs] == [0, 1] and all(d.backend == "simulated" and not d.lost for d in devs)
    assert [(d.index, d.name) for d in devs] == [(d.index, d.name) for d in s.sample().devices]


def test_a_holder_reported_by_thread_id_is_its_process_in_every_sample(procs, scenario):
    # The thread-group check is remembered per process (pid, start time): the second sample must still
    # map a thread id to its process, and a process that leads its group must stay itself.
    p, tid = procs.threaded()
    leader = procs.sleeper().pid
    s = Sampler([SimulatedBackend(scenario([{"pid": tid, "gpu": 0}, {"pid": leader, "gpu": 1}]))], config=Config())
    for _ in range(3):
        snap = s.sample()
        assert sorted(h.pid for h in snap.holders) == sorted([p.pid, leader])
        assert all(h.visible for h in snap.holders)
