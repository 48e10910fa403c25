"""The memory ledger (issue 28) on real processes: holders of a GPU's device node (mknod'ed char 195:N,
held through O_PATH descriptors), one inside its own PID namespace, a real zombie whose parent never waits,
the driver-held advice, kill and reap of a device-file holder with a bystander surviving, and every face
(status text, --json, /v1/status, /metrics, MCP) showing the same ledger.

Each test makes its own node with a minor in 100..250 that no other running test holds (ledger_helpers):
the scan reads the whole host's /proc, so tests running in parallel must not share a device number.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import run_gputop, wait_gone
from tests.functional.actions_helpers import alive, records, unique
from tests.functional.ledger_helpers import claim_minor, release_minors

GiB = 1 << 30
HOLD = ("import os,sys,time; fd=os.open(sys.argv[1], os.O_PATH); print(os.getpid(), flush=True); "
        "time.sleep(600)  # {marker}")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a char device node needs root")


@pytest.fixture(autouse=True)
def _minors():
    yield
    release_minors()


def make_node(tmp_path, minor: int | None = None):
    minor = claim_minor() if minor is None else minor
    path = tmp_path / f"nvidia{minor}"
    os.mknod(path, 0o666 | 0o020000, os.makedev(195, minor))  # S_IFCHR
    os.chmod(path, 0o666)
    return path, minor


def holder(procs, node, marker="ledger-holder", prefix=()) -> subprocess.Popen:
    """A real process that holds ``node`` open (O_PATH); returns once it does."""
    p = procs.spawn([*prefix, sys.executable, "-c", HOLD.format(marker=unique(marker)), str(node)],
                    stdout=subprocess.PIPE)
    assert p.stdout.readline().strip()
    return p


def gpus(*minors, used=(10 * GiB,)):
    return [{"name": f"Sim {i}", "memory_total": "80GiB", "memory_used": u, **({"minor": m} if m is not None else {})}
            for i, (m, u) in enumerate(zip(minors, used))]


def status_json(env=None) -> dict:
    r = run_gputop("status", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def ledger_of(doc: dict, gpu: int) -> dict:
    return next(lg for lg in doc["ledger"] if lg["gpu"] == gpu)


def test_a_device_file_holder_is_a_holder_with_unknown_memory_and_the_rest_is_unexplained(procs, scenario, tmp_path):
    node, minor = make_node(tmp_path)
    listed = procs.sleeper("listed")
    h = holder(procs, node)
    scenario(holders=[{"pid": listed.pid, "gpu": 0, "memory": "4GiB"}], gpus=gpus(minor, used=(10 * GiB,)))
    doc = status_json()
    lg = ledger_of(doc, 0)
    assert lg["used"] == 10 * GiB and lg["listed"] == 4 * GiB and lg["unexplained"] == 6 * GiB
    assert lg["listed_pids"] == [listed.pid] and lg["device_file_pids"] == [h.pid]
    assert not lg["driver_held"]
    by_pid = {x["pid"]: x for x in doc["holders"]}
    assert by_pid[h.pid]["source"] == "device file" and by_pid[h.pid]["gpu_memory"] is None
    assert by_pid[h.pid]["ctx"] == "dev"  # context type unknown: the TYPE column marks it
    assert by_pid[h.pid]["uses"] == [{"gpu": 0, "ctx": "dev", "used_memory": None, "sm_util": None,
                                      "gpu_instance_id": None, "compute_instance_id": None,
                                      "source": "device file"}]
    assert by_pid[listed.pid]["source"] == "nvml"
    text = run_gputop("status").stdout
    assert "GPU 0 ledger: 10GiB used = 4.0GiB by 1 listed + ? by 1 device-file holder(s) " \
           f"(pid {h.pid}) + 6.0GiB unexplained" in text, text
    assert f"pid {h.pid}: holds GPU 0's device file, not in the driver's list (memory unknown)" in text


def test_a_file_that_only_looks_like_the_node_holds_nothing(procs, scenario, tmp_path):
    """By device number, not by path: a regular file named like the node, and a node of another minor."""
    node, minor = make_node(tmp_path)
    fake = tmp_path / "fake" / node.name
    fake.parent.mkdir()
    fake.write_text("")
    other, _ = make_node(tmp_path / "fake")
    a, b = holder(procs, fake, "ledger-fake"), holder(procs, other, "ledger-other")
    real = holder(procs, node)
    scenario(holders=[], gpus=gpus(minor))
    lg = ledger_of(status_json(), 0)
    assert lg["device_file_pids"] == [real.pid]
    assert a.pid not in lg["device_file_pids"] and b.pid not in lg["device_file_pids"]


def test_a_holder_in_another_pid_namespace_is_found_with_its_nspid(procs, scenario, tmp_path):
    if not __import__("shutil").which("unshare"):
        pytest.skip("unshare (util-linux) is missing")
    node, minor = make_node(tmp_path)
    outer = holder(procs, node, "ledger-ns", prefix=("unshare", "--pid", "--fork"))
    kids = psutil.Process(outer.pid).children()
    assert len(kids) == 1
    inner = kids[0].pid  # the python, PID 1 inside its namespace
    scenario(holders=[], gpus=gpus(minor))
    doc = status_json()
    assert ledger_of(doc, 0)["device_file_pids"] == [inner]
    h = next(x for x in doc["holders"] if x["pid"] == inner)
    assert h["source"] == "device file" and h["visible"] is True
    assert h["ledger"]["nspid"] == [inner, 1]
    assert h["user"] == "root" and h["owner"] is not None
    assert f"NSpid {inner} 1 (pid 1 in its own PID namespace)" in run_gputop("status").stdout


def zombie(procs, marker="ledger-zombie-parent") -> tuple[int, int]:
    """A real zombie: its parent (a python that never waits) forks 'true' and sleeps. (zombie, parent)"""
    code = (f"import subprocess,time; p=subprocess.Popen(['true']); print(p.pid, flush=True); "
            f"time.sleep(600)  # {unique(marker)}")
    parent = procs.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE)
    z = int(parent.stdout.readline())
    deadline = time.time() + 10
    while psutil.Process(z).status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
        time.sleep(0.02)
    assert psutil.Process(z).status() == psutil.STATUS_ZOMBIE
    return z, parent.pid


def test_a_zombie_holder_names_its_parent_and_kill_never_claims_success(procs, scenario, cfg):
    z, parent = zombie(procs)
    scenario(holders=[{"pid": z, "gpu": 0, "memory": "4GiB", "keep_zombie": True}], gpus=gpus(None))
    doc = status_json()
    h = next(x for x in doc["holders"] if x["pid"] == z)
    assert h["ledger"]["zombie"] is True and h["ledger"]["parent"]["pid"] == parent
    assert h["ledger"]["parent_verdict"]["kind"] == "not-orphan"  # a child of this test: a live session
    assert h["verdict"]["kind"] == "unknown"
    assert ledger_of(doc, 0)["zombies"] == [z]
    assert any(f"only its parent pid {parent}" in w for w in doc["warnings"])
    assert "[true] <defunct>" in run_gputop("status").stdout
    r = run_gputop("kill", "--pid", str(z), "--force")
    assert r.returncode == 5, (r.stdout, r.stderr)
    out = r.stdout + r.stderr
    assert f"pid {z} is a zombie" in out and f"gputop kill --pid {parent}" in out
    rec = records(pid=z, action="kill")[-1]
    assert rec["outcome"] == "refused" and not rec["ok"]
    assert "zombie" in json.dumps(rec) and str(parent) in rec["message"]
    assert alive(parent)  # nothing was sent to the parent either
    assert psutil.Process(z).status() == psutil.STATUS_ZOMBIE


def fixture_proc(tmp_path, unreadable: bool = False):
    """A /proc with two processes and no GPU holder; with ``unreadable``, one whose descriptors cannot be
    read (gputop then runs without CAP_DAC_OVERRIDE, as a user would)."""
    proc = tmp_path / "proc"
    for pid in (4242, 4243):
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "fd" / "0").symlink_to("/dev/null")
    if unreadable:
        os.chmod(proc / "4243" / "fd", 0)
    return proc


def drm_like_status(proc, *args):
    from tests.functional.test_amd_intel import _without_dac_override

    env = dict(os.environ, GPUTOP_PROC_ROOT=str(proc))
    r = subprocess.run([sys.executable, "-m", "gputop", "status", *args], capture_output=True, text=True, env=env,
                       timeout=60, preexec_fn=_without_dac_override)
    if r.returncode == 97:
        pytest.skip("cannot drop CAP_DAC_OVERRIDE here")
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_memory_and_no_holder_is_held_by_the_driver_with_the_reset_command(scenario, tmp_path):
    _, minor = make_node(tmp_path)
    scenario(holders=[], gpus=gpus(minor, None, used=(3 * GiB, 0)))
    proc = fixture_proc(tmp_path)
    doc = json.loads(drm_like_status(proc, "--json"))
    lg = ledger_of(doc, 0)
    assert lg["driver_held"] is True and lg["reset_command"] == "gputop reset --gpu 0" and lg["searched"]
    assert ledger_of(doc, 1)["driver_held"] is False  # nothing used: nothing to say
    text = drm_like_status(proc)
    assert ("GPU 0 ledger: 3.0GiB used and no process holds GPU 0: held by the driver: only a reset frees it "
            "(gputop reset --gpu 0)") in text
    assert "GPU 1 ledger" not in text


def test_a_process_that_cannot_be_read_is_not_no_holder(scenario, tmp_path):
    """Cannot see is never gone: with one process's descriptors unreadable, and on a GPU whose node is
    unknown, no holder seen is not called "held by the driver"."""
    _, minor = make_node(tmp_path)
    scenario(holders=[], gpus=gpus(minor, None, used=(3 * GiB, 3 * GiB)))
    proc = fixture_proc(tmp_path, unreadable=True)
    doc = json.loads(drm_like_status(proc, "--json"))
    for gpu in (0, 1):  # 0: a process unreadable; 1: no minor, its node never searched
        lg = ledger_of(doc, gpu)
        assert (lg["driver_held"], lg["searched"], lg["reset_command"]) == (False, False, None), lg
    text = drm_like_status(proc)
    assert "held by the driver: only a reset" not in text
    assert "GPU 0 ledger: 3.0GiB used and no process listed or seen holds GPU 0; not every process could be " \
           "searched" in text


def test_the_mps_server_names_its_clients(procs, scenario, tmp_path):
    node, minor = make_node(tmp_path)
    code = (f"import ctypes,os,sys,time; ctypes.CDLL(None).prctl(15,b'nvidia-cuda-mps-server',0,0,0); "
            f"fd=os.open(sys.argv[1], os.O_PATH); print(os.getpid(), flush=True); time.sleep(600)  # "
            f"{unique('ledger-mps')}")
    server = procs.spawn(["bash", "-c", 'exec -a nvidia-cuda-mps-server "$0" -c "$1" "$2"', sys.executable, code,
                          str(node)], stdout=subprocess.PIPE)
    assert server.stdout.readline().strip()
    c1, c2 = holder(procs, node, "ledger-client"), holder(procs, node, "ledger-client")
    scenario(holders=[{"pid": server.pid, "gpu": 0, "memory": "1GiB"}], gpus=gpus(minor))
    doc = status_json()
    s = next(x for x in doc["holders"] if x["pid"] == server.pid)
    assert s["ledger"]["mps_clients"] == sorted([c1.pid, c2.pid])
    assert f"MPS server; clients: pid {', '.join(map(str, sorted([c1.pid, c2.pid])))}" in run_gputop("status").stdout


def test_kill_of_a_device_file_holder_ends_it_and_a_bystander_survives(procs, scenario, cfg, tmp_path):
    node, minor = make_node(tmp_path)
    target = holder(procs, node, "ledger-target")
    bystander = holder(procs, node, "ledger-bystander")  # holds the same node: a holder too, not chosen
    scenario(holders=[], gpus=gpus(minor))
    r = run_gputop("kill", "--pid", str(target.pid), "--force")
    assert r.returncode == 0, (r.stdout, r.stderr)
    target.wait(10)
    assert alive(bystander.pid)
    rec = records(pid=target.pid, action="kill")[-1]
    assert rec["ok"] and rec["target"]["gpus"] == [0]


def test_reap_of_an_orphaned_device_file_holder_spares_the_bystanders(procs, scenario, cfg, tmp_path):
    node, minor = make_node(tmp_path)
    marker = unique("ledger-orphan")
    procs.spawn(["setsid", "sh", "-c", f"{sys.executable} -c '{HOLD.format(marker=marker)}' {node} >/dev/null & exit 0"]
                ).wait(10)
    orphan = procs.wait_for(sys.executable + " -c " + HOLD.format(marker=marker)[:20])
    attached = holder(procs, node, "ledger-attached")  # holds the node, not an orphan
    plain = unique("ledger-plain-orphan")
    procs.spawn(["setsid", "sh", "-c", f"{sys.executable} -c 'import time; time.sleep(600)  # {plain}' & exit 0"]
                ).wait(10)
    loose = procs.wait_for(f"{sys.executable} -c import time; time.sleep(600)  # {plain}")  # holds no GPU
    scenario(holders=[], gpus=gpus(minor))
    deadline = time.time() + 10
    while time.time() < deadline:
        doc = status_json()
        if orphan in {r["pid"] for r in doc["roots"]}:
            break
        time.sleep(0.2)
    assert orphan in {r["pid"] for r in doc["roots"]}, doc["holders"]
    r = run_gputop("reap", "--apply", "--grace", "0")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert wait_gone(orphan, 10)
    assert alive(attached.pid) and alive(loose)


def test_every_face_shows_the_same_ledger(procs, scenario, tmp_path):
    from tests.functional.servehelp import Served

    node, minor = make_node(tmp_path)
    listed = procs.sleeper("listed")
    h = holder(procs, node)
    scenario(holders=[{"pid": listed.pid, "gpu": 0, "memory": "4GiB"}], gpus=gpus(minor, used=(10 * GiB,)))
    cli = ledger_of(status_json(), 0)
    s = Served("--interval", "0.3")
    try:
        import httpx

        api = ledger_of(httpx.get(s.url + "/v1/status", timeout=30).json(), 0)
        own = httpx.get(s.url + "/v1/ledger", timeout=30).json()
        metrics = httpx.get(s.url + "/metrics", timeout=30).text
    finally:
        s.stop()
    assert api == cli == ledger_of(own, 0)
    assert [h["pid"] for h in own["holders"]] == [h.pid] and own["lines"][0].startswith("GPU 0 ledger: 10GiB used")
    line = next(x for x in metrics.splitlines() if x.startswith("gputop_gpu_memory_unexplained_bytes{") and 'gpu="0"' in x)
    assert float(line.rsplit(" ", 1)[1]) == cli["unexplained"] == 6 * GiB
    files = next(x for x in metrics.splitlines() if x.startswith("gputop_gpu_device_file_holders{") and 'gpu="0"' in x)
    assert float(files.rsplit(" ", 1)[1]) == 1

    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    keep = ("GPUTOP_SCENARIO", "GPUTOP_STATE_DIR", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "PATH", "HOME")
    params = StdioServerParameters(command=sys.executable, args=["-m", "gputop", "mcp"],
                                   env={k: os.environ[k] for k in keep if k in os.environ})

    async def main():
        async with Client(params, read_timeout_seconds=60) as client:
            return ((await client.call_tool("gpu_status", {})).structured_content,
                    (await client.call_tool("memory_ledger", {})).structured_content)

    status, ledger = anyio.run(main)
    assert ledger_of(status, 0) == ledger_of(ledger, 0) == cli
    assert [x["pid"] for x in ledger["holders"]] == [h.pid]
    assert h.pid in cli["device_file_pids"]


def test_the_fake_nvml_reports_memory_no_list_shows_and_the_minor_finds_the_holder(procs, tmp_path, tmp_path_factory):
    """Through the NVML backend: nvmlDeviceGetMinorNumber names the node, the used memory is more than
    the listed process holds, and the device-file holder is named."""
    from tests.fakenvml.build import FakeNvmlBuildError, build_fake_nvml, compiler, write_fake_nvml_config

    if compiler() is None:
        pytest.skip("gcc is needed to build the fake NVML library")
    try:
        lib = build_fake_nvml(tmp_path_factory.mktemp("fakenvml"))
    except FakeNvmlBuildError as e:
        pytest.fail(str(e))
    node, minor = make_node(tmp_path)
    listed = procs.sleeper("listed")
    h = holder(procs, node)
    cfg = write_fake_nvml_config(tmp_path / "fakenvml.conf", [{"memory_used": 20 * GiB, "minor": minor},
                                                              {"minor": 251}],
                                 [{"pid": listed.pid, "gpu": 0, "memory": 4 * GiB}])
    env = {"LD_LIBRARY_PATH": str(lib), "FAKE_NVML_CONFIG": str(cfg), "GPUTOP_BACKEND": "nvml"}
    doc = status_json(env)
    lg = ledger_of(doc, 0)
    assert (lg["used"], lg["listed"], lg["unexplained"]) == (20 * GiB, 4 * GiB, 16 * GiB)
    assert lg["listed_pids"] == [listed.pid] and lg["device_file_pids"] == [h.pid]
    assert ledger_of(doc, 1)["device_file_pids"] == []  # nobody holds 195:251 (the tests use 100..250)
    assert "16GiB unexplained" in run_gputop("status", env=env).stdout


def test_between_scans_a_refresh_keeps_only_the_holders_that_still_run(procs, scenario, tmp_path):
    """The scan runs every scan_every seconds; a refresh in between drops a holder that exited (never shown
    as "not visible") and sees a new one at the next scan."""
    from gputop.backends.simulated import SimulatedBackend
    from gputop.core.config import Config
    from gputop.core.sampler import Sampler

    node, minor = make_node(tmp_path)
    first = holder(procs, node, "ledger-first")
    path = scenario(holders=[], gpus=gpus(minor))
    sampler = Sampler([SimulatedBackend(path)], config=Config())
    now = [100.0]
    sampler._ledger.clock = lambda: now[0]
    try:
        assert [h.pid for h in sampler.sample().holders] == [first.pid]
        first.kill()
        first.wait(10)
        second = holder(procs, node, "ledger-second")
        now[0] += 1  # within scan_every: the last scan's holders, those that still run
        snap = sampler.sample()
        assert snap.holders == () and not any("not visible" in w for w in snap.warnings)
        now[0] += sampler._ledger.scan_every
        assert [h.pid for h in sampler.sample().holders] == [second.pid]
    finally:
        sampler.close()


def test_amd_and_intel_build_the_ledger_from_the_fdinfo_totals(tmp_path):
    """The same ledger on DRM: the used VRAM (sysfs) against the sum of the fdinfo totals gputop reads."""
    from tests.drm_tree import AMD_PCI, DrmTree
    from tests.functional.test_amd_intel import status_json as drm_status

    data, _ = drm_status(DrmTree(tmp_path), "--sample-time", "0")
    gpu = next(g["index"] for g in data["gpu"]["gpus"] if g["pci_bus_id"] == AMD_PCI)
    uses = [u for h in data["holders"] for u in h["uses"] if u["gpu"] == gpu]
    listed = sum(u["used_memory"] for u in uses)
    assert uses and {u["source"] for u in uses} == {"fdinfo"}
    assert {h["source"] for h in data["holders"]} == {"fdinfo"}
    lg = ledger_of(data, gpu)
    assert (lg["used"], lg["listed"], lg["unexplained"]) == (5 * GiB, listed, 5 * GiB - listed)
    assert lg["device_file_pids"] == [] and lg["listed_unknown_pids"] == []


def test_a_second_user_cannot_forge_or_hide_a_holder(procs, monkeypatch, request):
    """A real second user: a file of theirs named like the node holds nothing; their descriptor of the real
    node makes them a holder, named by the kernel's uid; as that user, gputop says it cannot read root's
    descriptors (never that nothing holds the GPU), and its kill of root's holder is refused."""
    import yaml

    from tests.functional.actions_helpers import OtherUser

    user = OtherUser.make(monkeypatch, request)
    minor = claim_minor()
    node = user.shared / f"nvidia{minor}"
    os.mknod(node, 0o666 | 0o020000, os.makedev(195, minor))
    os.chmod(node, 0o666)
    fake = user.shared / "fakedev" / f"nvidia{minor}"
    fake.parent.mkdir()
    os.chmod(fake.parent, 0o777)
    spoof = procs.spawn([*user.setpriv(), sys.executable, "-c",
                         f"import os,sys,time; open(sys.argv[1], 'w'); fd=os.open(sys.argv[1], os.O_PATH); "
                         f"print(1, flush=True); time.sleep(600)  # {unique('ledger-spoof')}", str(fake)],
                        stdout=subprocess.PIPE)
    assert spoof.stdout.readline().strip()
    theirs = holder(procs, node, "ledger-theirs", prefix=tuple(user.setpriv()))
    mine = holder(procs, node, "ledger-mine")
    user.scenario.write_text(yaml.safe_dump({"gpus": gpus(minor), "holders": []}))
    os.chmod(user.scenario, 0o644)
    monkeypatch.setenv("GPUTOP_SCENARIO", str(user.scenario))
    doc = status_json()  # as root: both real holders, the forged file none
    lg = ledger_of(doc, 0)
    assert sorted(lg["device_file_pids"]) == sorted([theirs.pid, mine.pid])
    assert spoof.pid not in lg["device_file_pids"]
    assert next(h for h in doc["holders"] if h["pid"] == theirs.pid)["user"] == user.name
    r = user.run("status", "--json")  # as the second user: root's descriptors cannot be read
    assert r.returncode == 0, r.stderr
    as_user = json.loads(r.stdout)
    assert ledger_of(as_user, 0)["device_file_pids"] == [theirs.pid]  # their own, and not root's
    assert any("cannot be read as this user" in w for w in as_user["warnings"]), as_user["warnings"]
    k = user.run("kill", "--pid", str(mine.pid), "--force")
    assert k.returncode != 0 and alive(mine.pid), (k.stdout, k.stderr)


def test_a_process_holding_only_nvidiactl_is_a_cuda_process_of_some_gpu(procs, scenario, tmp_path):
    """nvidiactl (195:255) marks a CUDA process without naming its GPU: a warning, counted on no GPU."""
    ctl = tmp_path / "nvidiactl"
    os.mknod(ctl, 0o666 | 0o020000, os.makedev(195, 255))
    only_ctl = holder(procs, ctl, "ledger-ctl")
    node, minor = make_node(tmp_path)
    both = holder(procs, node, "ledger-both")
    scenario(holders=[], gpus=gpus(minor))
    doc = status_json()
    assert ledger_of(doc, 0)["device_file_pids"] == [both.pid]
    assert only_ctl.pid not in {h["pid"] for h in doc["holders"]}
    assert any("hold /dev/nvidiactl or /dev/nvidia-uvm but no GPU's device node" in w and str(only_ctl.pid) in w
               for w in doc["warnings"]), doc["warnings"]


def test_a_hostile_parent_name_reaches_no_terminal_raw(procs, scenario, cfg):
    """The zombie's parent names itself with control characters: status, the warning and kill's refusal
    show them escaped."""
    code = ("import ctypes,subprocess,time; ctypes.CDLL(None).prctl(15,b'\\x1b[2Jevil\\x07',0,0,0); "
            f"p=subprocess.Popen(['true']); print(p.pid, flush=True); time.sleep(600)  # {unique('ledger-hostile')}")
    parent = procs.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE)
    z = int(parent.stdout.readline())
    deadline = time.time() + 10
    while psutil.Process(z).status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
        time.sleep(0.02)
    scenario(holders=[{"pid": z, "gpu": 0, "memory": "4GiB", "keep_zombie": True}], gpus=gpus(None))
    text = run_gputop("status").stdout
    assert f"pid {z} is a zombie" in text and "\x1b" not in text and "\x07" not in text
    k = run_gputop("kill", "--pid", str(z))
    assert k.returncode == 5 and str(parent.pid) in k.stdout + k.stderr
    assert "\x1b" not in k.stdout + k.stderr


def test_the_guard_kills_a_device_file_holder_on_unexplained_memory_and_spares_the_rest(procs, scenario, tmp_path):
    """A guard rule on unexplained memory and the holder's name: the device-file holder it names is killed
    through the same kill path; a listed holder on the same GPU and a device-file holder of another name
    survive."""
    import textwrap

    from gputop.guard.engine import Engine
    from gputop.guard.policy import parse_policy
    from tests.functional.guard_helpers import Clock, sampler_for

    node, minor = make_node(tmp_path)
    code = (f"import ctypes,os,sys,time; ctypes.CDLL(None).prctl(15,b'leaker',0,0,0); fd=os.open(sys.argv[1], "
            f"os.O_PATH); print(1, flush=True); time.sleep(600)  # {unique('ledger-leaker')}")
    leaker = procs.spawn([sys.executable, "-c", code, str(node)], stdout=subprocess.PIPE)
    assert leaker.stdout.readline().strip()
    other = holder(procs, node, "ledger-other-holder")
    listed = procs.sleeper("leaker")  # named like it, but listed with its memory: not a device-file holder
    path = scenario(holders=[{"pid": listed.pid, "gpu": 0, "memory": "4GiB"}], gpus=gpus(minor))
    pol = parse_policy(textwrap.dedent("""\
        rules:
          - name: unexplained
            conditions:
              - {type: unexplained_memory, operator: ">", value: 4GiB}
              - {type: process_name, operator: "==", value: leaker}
              - {type: source, operator: "==", value: device file}
            action: kill
            force: true
            timeout: 2s
    """))
    sampler = sampler_for(path, Clock())
    hits: list[dict] = []
    out = Engine(pol, sampler=sampler, record=hits.append).evaluate(sampler.sample(), "enforce")
    assert [(h["pid"], h["outcome"]) for h in out] == [(leaker.pid, "terminated")], out
    assert wait_gone(leaker.pid)
    assert alive(other.pid) and alive(listed.pid)


def test_gputop_itself_is_never_a_device_file_holder(procs, scenario, tmp_path):
    """NVML opens every GPU's node in the process that asks it (a real H200: /dev/nvidia0 three times, so
    `gputop status` listed itself as a holder, docs/hardware.md). The sampler's own process is left out;
    another process holding the same node is still found."""
    from gputop.core.config import Config
    from gputop.core.sampler import Sampler

    node, minor = make_node(tmp_path)
    other = holder(procs, node, "ledger-other")
    path = scenario(gpus=gpus(minor, used=(2 * GiB,)))
    fd = os.open(node, os.O_PATH)  # this process holds the node, as NVML's handle would
    try:
        sampler = Sampler.open("simulated", str(path), Config())
        try:
            snap = sampler.sample()
        finally:
            sampler.close()
    finally:
        os.close(fd)
    pids = {h.pid for h in snap.holders}
    assert other.pid in pids
    assert os.getpid() not in pids
