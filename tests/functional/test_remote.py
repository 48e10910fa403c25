"""--remote and status --hosts against a real sshd on 127.0.0.1 (throwaway keys; host-key checking on)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import run_gputop, wait_gone
from tests.functional.sshd_helper import start_sshd, why_no_sshd

_why = why_no_sshd()
pytestmark = pytest.mark.skipif(_why is not None, reason=f"no sshd: {_why}")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = start_sshd(tmp_path_factory.mktemp("ssh"))
    yield server
    server.stop()


@pytest.fixture
def remote(sshd, scenario, procs, isolated_dirs):
    """A 'remote' node: the venv's gputop over ssh, on a simulated scenario with two real holders."""
    worker = procs.sleeper("rtrain")
    bystander = procs.sleeper("rbystander")
    path = scenario(holders=[{"pid": worker.pid, "gpu": 0, "memory": "4GiB", "sm": 90},
                             {"pid": bystander.pid, "gpu": 1, "memory": "1GiB", "sm": 5}])
    cmd = sshd.remote_cmd(GPUTOP_SCENARIO=str(path), GPUTOP_STATE_DIR=str(isolated_dirs / "remote-state"))
    env = {"GPUTOP_SSH": sshd.ssh_env, "GPUTOP_REMOTE_CMD": cmd}
    return {"worker": worker, "bystander": bystander, "env": env, "scenario": path, "cmd": cmd}


def test_remote_status_json(remote):
    r = run_gputop("--remote", "gpunode", "status", "--json", env=remote["env"])
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    pids = {h["pid"] for h in data["holders"]}
    assert {remote["worker"].pid, remote["bystander"].pid} <= pids
    assert len(data["gpu"]["gpus"]) == 2


def test_remote_table_and_exit_code_pass_through(remote):
    r = run_gputop("--remote", "gpunode", "status", env=remote["env"])
    assert r.returncode == 0, r.stderr
    assert "GPU" in r.stdout
    assert any(ln.split()[:1] == [str(remote["worker"].pid)] for ln in r.stdout.splitlines())
    # The remote gputop's own usage error (exit 2) comes back as our exit status.
    r = run_gputop("--remote", "gpunode", "status", "--backend", "nosuch", env=remote["env"])
    assert r.returncode == 2
    assert "nosuch" in r.stderr


def test_remote_arguments_are_shell_quoted(remote, tmp_path):
    marker = tmp_path / "injected"
    r = run_gputop("--remote", "gpunode", "status", "--config", f"x; touch {marker}; #", env=remote["env"])
    assert r.returncode != 0
    assert not marker.exists(), "an argument was run by the remote shell"


def test_remote_gputop_missing(remote):
    r = run_gputop("--remote", "gpunode", "--remote-gputop", "/nonexistent/bin/gputop", "status",
                   env=remote["env"])
    assert r.returncode == 6
    assert "not installed on gpunode" in r.stderr and "pip install" in r.stderr


def test_unknown_host_key_is_refused(remote):
    r = run_gputop("--remote", "stranger", "status", "--json", env=remote["env"])
    assert r.returncode == 6
    assert "Host key verification failed" in r.stderr
    assert r.stdout == ""


def test_hosts_merged_json_with_failures_reported(remote):
    r = run_gputop("status", "--hosts", "gpunode,deadhost,stranger,impostor,wrongkey", "--json",
                   "--timeout", "20", env=remote["env"])
    assert r.returncode == 6, r.stderr  # not every host answered
    data = json.loads(r.stdout)
    by_host = {h["host"]: h for h in data["hosts"]}
    assert by_host["gpunode"]["ok"] is True
    assert by_host["deadhost"]["error"]["kind"] == "unreachable"
    assert by_host["stranger"]["error"]["kind"] == "host key unknown"
    assert by_host["impostor"]["error"]["kind"] == "host key changed"
    assert by_host["wrongkey"]["error"]["kind"] == "authentication failed"
    # The host that answered is still shown, with the host on every row.
    assert data["holders"] and all(h["host"] == "gpunode" for h in data["holders"])
    assert remote["worker"].pid in {h["pid"] for h in data["holders"]}
    assert len(data["gpus"]) == 2 and all(g["host"] == "gpunode" for g in data["gpus"])


def test_hosts_table_and_hosts_file(remote, tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# lab nodes\ngpunode\ndeadhost  # switched off\n")
    r = run_gputop("status", "--hosts-file", str(f), env=remote["env"])
    assert r.returncode == 6
    assert "1/2 host(s) answered" in r.stdout
    assert "deadhost: unreachable:" in r.stdout
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("gpunode")]
    assert any(ln.split()[1] == str(remote["worker"].pid) for ln in rows)


def test_hosts_gputop_missing_and_timeout(remote, sshd):
    env = dict(remote["env"])
    r = run_gputop("--remote-gputop", "/nonexistent/bin/gputop", "status", "--hosts", "gpunode", "--json", env=env)
    assert json.loads(r.stdout)["hosts"][0]["error"]["kind"] == "gputop missing"
    env["GPUTOP_REMOTE_CMD"] = f"sleep 8; {remote['cmd']}"
    r = run_gputop("status", "--hosts", "gpunode,deadhost", "--timeout", "2", "--json", env=env)
    kinds = {h["host"]: (h["error"] or {}).get("kind") for h in json.loads(r.stdout)["hosts"]}
    assert kinds == {"gpunode": "timed out", "deadhost": "unreachable"}


def test_hosts_all_ok_exit_zero(remote):
    r = run_gputop("status", "--hosts", "gpunode", "--json", env=remote["env"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hosts"][0]["ok"] is True


def test_remote_kill_kills_on_the_remote_side(remote):
    worker, bystander = remote["worker"], remote["bystander"]
    r = run_gputop("--remote", "gpunode", "kill", "--pid", str(worker.pid), "--json", env=remote["env"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert wait_gone(worker.pid)
    assert bystander.poll() is None, "the bystander was killed"
    # The remote side refuses what it must refuse, and its exit code comes back (5: refused by a safety rule).
    r = run_gputop("--remote", "gpunode", "kill", "--pid", "1", env=remote["env"])
    assert r.returncode in (3, 5), (r.stdout, r.stderr)
    assert bystander.poll() is None


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (needed for a real terminal)")
def test_remote_tui_gets_a_terminal(remote, tmp_path):
    """`gputop --remote HOST` with no subcommand runs the TUI there, through `ssh -t`, in a real terminal."""
    sock = str(tmp_path / "tmux.sock")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in remote["env"].items())
    cmd = f"env {env} {shlex.quote(sys.executable)} -m gputop --remote gpunode; echo EXIT=$?; sleep 30"
    tmux = ["tmux", "-S", sock, "-f", "/dev/null"]
    subprocess.run(tmux + ["new-session", "-d", "-x", "160", "-y", "45", cmd], check=True)
    try:
        deadline = time.time() + 30
        screen = ""
        while time.time() < deadline:
            screen = subprocess.run(tmux + ["capture-pane", "-p"], capture_output=True, text=True).stdout
            if str(remote["worker"].pid) in screen:
                break
            time.sleep(0.3)
        assert str(remote["worker"].pid) in screen, screen
        subprocess.run(tmux + ["send-keys", "q"], check=True)
        while time.time() < deadline:
            screen = subprocess.run(tmux + ["capture-pane", "-p"], capture_output=True, text=True).stdout
            if "EXIT=" in screen:
                break
            time.sleep(0.3)
        assert "EXIT=0" in screen, screen
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)
