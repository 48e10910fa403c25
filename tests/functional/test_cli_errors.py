"""Bad input on every face of the real CLI: one line on stderr that says what is wrong and what to do, the
documented exit code (README "Exit codes"), never a traceback."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from gputop.util.errors import (
    EXIT_NOT_FOUND, EXIT_OK, EXIT_PERMISSION, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE,
)
from tests.conftest import run_gputop

REPO = Path(__file__).resolve().parents[2]


def one_line(r: subprocess.CompletedProcess, code: int, *needles: str, stream: str = "stderr") -> str:
    """Assert the exit code and a single-line, traceback-free error containing every needle.

    ``stream="any"``: the message may be on stdout (kill, reap and reset print their failed results there;
    see test_action_errors_go_to_stderr)."""
    err = r.stderr.strip() if stream == "stderr" else (r.stderr.strip() or r.stdout.strip())
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    return err


@pytest.fixture
def busy_port():
    """A port on 127.0.0.1 that another program is listening on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def holder_and_bystander(procs, scenario):
    holder = procs.sleeper()
    bystander = procs.sleeper()
    scenario([{"pid": holder.pid, "gpu": 0, "memory": "4GiB", "type": "C"}], gpus=2)
    return holder, bystander


# ---- argparse: one line that points to --help -------------------------------------------------------

@pytest.mark.parametrize("argv, prog, needle", [
    (["log", "--limit", "abc"], "gputop log", "invalid int value: 'abc'"),
    (["kill", "--pid", "1", "--start-time", "x"], "gputop kill", "--start-time"),
    (["status", "--bogus"], "gputop status", "unrecognized arguments: --bogus"),
    (["guard", "status", "--bogus"], "gputop guard status", "unrecognized arguments: --bogus"),
    (["bogus"], "gputop", "invalid choice: 'bogus'"),
    (["reset"], "gputop reset", "--gpu"),
    (["audit", "--min-severity", "x"], "gputop audit", "invalid choice: 'x'"),
])
def test_argparse_errors_are_one_line_with_a_help_pointer(argv, prog, needle):
    err = one_line(run_gputop(*argv), EXIT_USAGE, needle, f"(see '{prog} --help')")
    assert err.startswith(f"{prog}: ") and "usage:" not in err


def test_help_lists_every_subcommand_and_environment_variable():
    from gputop.commands import COMMANDS

    r = run_gputop("--help")
    assert r.returncode == EXIT_OK
    for name in COMMANDS:
        assert re.search(rf"^\s+{name}\s", r.stdout, re.M), name
    for var in ("GPUTOP_CONFIG", "GPUTOP_SCENARIO", "GPUTOP_STATE_DIR", "GPUTOP_AUDIT_LOG", "GPUTOP_SSH"):
        assert var in r.stdout
    readme = (REPO / "README.md").read_text()
    for name in COMMANDS:
        assert f"`gputop {name}" in readme, f"README Subcommands table lacks {name}"


# ---- processes: unknown, not a holder, PID 1, bad signal ---------------------------------------------

def test_kill_bad_targets(holder_and_bystander):
    holder, bystander = holder_and_bystander
    one_line(run_gputop("kill", "--pid", "999999999"), EXIT_NOT_FOUND, "no process 999999999", stream="any")
    one_line(run_gputop("kill", "--pid", str(bystander.pid)), EXIT_REFUSED, "holds no GPU", "--any-process",
             stream="any")
    one_line(run_gputop("kill", "--pid", "1", "--any-process"), EXIT_REFUSED, "never signalled", stream="any")
    one_line(run_gputop("kill", "--gpu", "7"), EXIT_NOT_FOUND, "no GPU 7")
    one_line(run_gputop("kill", "--pid", str(holder.pid), "--signal", "FOO"), EXIT_USAGE, "unknown signal 'FOO'")
    one_line(run_gputop("kill", "--pid", str(holder.pid), "--timeout", "soon"), EXIT_USAGE, "--timeout")
    one_line(run_gputop("kill", "--name", "["), EXIT_USAGE, "--name", "bad regular expression")
    one_line(run_gputop("kill"), EXIT_USAGE, "--pid N")
    assert holder.poll() is None and bystander.poll() is None  # nothing was signalled


def test_reset_unknown_gpu(holder_and_bystander):
    one_line(run_gputop("reset", "--gpu", "99"), EXIT_NOT_FOUND, "no GPU 99", "gputop status", stream="any")


def test_action_errors_go_to_stderr(holder_and_bystander):
    for argv in (["kill", "--pid", "999999999"], ["reset", "--gpu", "99"], ["reap", "--apply", "--root", "999999999"]):
        r = run_gputop(*argv)
        assert r.returncode == EXIT_NOT_FOUND and r.stderr.strip() and not r.stdout.strip(), (argv, r)


def test_log_bad_since_and_limit():
    one_line(run_gputop("log", "--since", "yesterday"), EXIT_USAGE, "--since", "10m")
    one_line(run_gputop("log", "--limit", "0"), EXIT_USAGE, "--limit")


def test_guard_status_negative_hits():
    one_line(run_gputop("guard", "status", "--hits", "-1"), EXIT_USAGE, "--hits")


# ---- input files: config, scenario, policy -----------------------------------------------------------

@pytest.mark.parametrize("text, needle", [
    ("protect: [jupyter\nfoo: 1\n", "YAML syntax error"),
    ("protect: 5\n", "'protect' must be a list"),
    ("- a\n- b\n", "expected a mapping"),
    ("reap: {grace: -5}\n", "negative"),
    ("reap: {bogus: 1}\n", "unknown key 'reap.bogus'"),
])
def test_malformed_config(tmp_path, scenario, text, needle):
    scenario([], gpus=1)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    one_line(run_gputop("status", env={"GPUTOP_CONFIG": str(cfg)}), EXIT_USAGE, str(cfg), needle)


def test_missing_config_file(tmp_path, scenario):
    scenario([], gpus=1)
    one_line(run_gputop("status", "--config", str(tmp_path / "nope.yaml")), EXIT_USAGE, "does not exist")


def test_config_protect_pattern_that_is_not_a_regex(tmp_path, scenario):
    scenario([], gpus=1)
    cfg = tmp_path / "config.yaml"
    cfg.write_text('protect: ["(("]\n')
    one_line(run_gputop("status", env={"GPUTOP_CONFIG": str(cfg)}), EXIT_USAGE, "protect")


@pytest.mark.parametrize("text, needle", [
    ("gpus:\n  - name: x\n    memory_total: lots\n", "bad memory size 'lots'"),
    ("gpus:\n  - name: x\nholders:\n  - {pid: abc, gpu: 0}\n", "needs an integer 'pid'"),
    ("gpus:\n  - name: x\nholders:\n  - {pid: 1, gpu: 5}\n", "'gpu' must be an index below 1"),
    ("hello\n", "expected a mapping"),
    ("gpus: [\n", "line 2: YAML syntax error"),
])
def test_malformed_scenario_is_one_line(tmp_path, text, needle):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    r = run_gputop("status", "--scenario", str(bad))
    one_line(r, EXIT_USAGE, str(bad), needle)  # README "Exit codes": bad input is 2


def test_malformed_scenario_exit_code_is_usage(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("hello\n")
    assert run_gputop("status", "--scenario", str(bad)).returncode == EXIT_USAGE


def test_missing_scenario_file(tmp_path):
    one_line(run_gputop("status", "--scenario", str(tmp_path / "nope.yaml")), EXIT_USAGE,
             "cannot read scenario", "README")  # README "Exit codes": bad input is 2


def test_policy_with_errors_lists_each_problem(tmp_path, scenario):
    scenario([], gpus=1)
    pol = tmp_path / "policy.yaml"
    pol.write_text("rules:\n  - name: a\n    conditions: [{type: gpu_utilization, operator: '=>', value: 9}]\n"
                   "    action: explode\n")
    r = run_gputop("guard", "--policy-file", str(pol))
    assert r.returncode == EXIT_USAGE and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and all(f"{pol} line " in ln for ln in lines), lines
    assert "unknown operator '=>'" in lines[0] and "bad action 'explode'" in lines[1]
    one_line(run_gputop("guard", "--policy-file", str(tmp_path / "nope.yaml")), EXIT_USAGE, "does not exist")
    one_line(run_gputop("guard", "--test-policies"), EXIT_USAGE, "no policy file", "--policy-file")


# ---- missing library, hosts --------------------------------------------------------------------------

def test_nvml_backend_without_the_library(tmp_path):
    r = run_gputop("status", "--backend", "nvml", env={"LD_LIBRARY_PATH": str(tmp_path)})
    if r.returncode == EXIT_OK:
        pytest.skip("this machine has an NVIDIA driver")
    one_line(r, EXIT_UNAVAILABLE, "nvml:", "--scenario")


def test_no_gpu_status_exits_0_and_points_to_the_demo():
    r = run_gputop("status", "--backend", "auto")
    if "0 GPU(s)" not in r.stdout:
        pytest.skip("this machine has a GPU")
    assert r.returncode == EXIT_OK and "gputop --demo" in r.stdout + r.stderr


def test_empty_hosts_is_a_usage_error(tmp_path, scenario):
    scenario([], gpus=1)
    one_line(run_gputop("status", "--hosts", ""), EXIT_USAGE, "no hosts given")
    empty = tmp_path / "hosts"
    empty.write_text("# nobody\n")
    one_line(run_gputop("status", "--hosts-file", str(empty)), EXIT_USAGE, "no hosts given")
    one_line(run_gputop("status", "--hosts-file", str(tmp_path / "nope")), EXIT_USAGE, "cannot read hosts file")


@pytest.mark.skipif(shutil.which("ssh") is None, reason="OpenSSH client not installed")
def test_unreachable_remote_host(tmp_path):
    # A closed port: bind one, then close it so that nothing listens there.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]
    s.close()
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host closed\n  HostName 127.0.0.1\n  Port {closed}\n  BatchMode yes\n")
    env = {"GPUTOP_SSH": f"ssh -F {cfg}"}
    r = run_gputop("--remote", "closed", "status", env=env, timeout=30)
    assert r.returncode == EXIT_UNAVAILABLE and "Traceback" not in r.stderr
    assert "gputop: ssh to closed failed" in r.stderr and "check 'ssh closed' works" in r.stderr
    r = run_gputop("status", "--hosts", "closed", "--timeout", "5", "--json", env=env, timeout=30)
    assert r.returncode == EXIT_UNAVAILABLE
    host = json.loads(r.stdout)["hosts"][0]
    assert host["ok"] is False and host["error"]["kind"] == "unreachable"


# ---- servers: busy port, wrong address, --port without --http ----------------------------------------

def test_serve_port_in_use_changes_nothing(isolated_dirs, scenario, busy_port):
    scenario([], gpus=1)
    r = run_gputop("serve", "--port", str(busy_port), "--create-token", timeout=30)
    one_line(r, EXIT_UNAVAILABLE, f"127.0.0.1:{busy_port}", "choose another --port")
    assert not (Path(os.environ["GPUTOP_STATE_DIR"]) / "api-token").exists()


def test_serve_bind_address_not_on_this_machine(scenario):
    scenario([], gpus=1)
    r = run_gputop("serve", "--bind", "192.0.2.1", "--port", "0", timeout=30)  # TEST-NET-1
    one_line(r, EXIT_USAGE, "192.0.2.1", "--bind must be an address of this machine")
    one_line(run_gputop("serve", "--port", "70000"), EXIT_USAGE, "--port")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may bind a privileged port")
def test_serve_privileged_port(scenario):
    scenario([], gpus=1)
    one_line(run_gputop("serve", "--port", "80", timeout=30), EXIT_PERMISSION, "1024")


def test_mcp_port_needs_http_and_a_free_port(scenario, busy_port):
    scenario([], gpus=1)
    one_line(run_gputop("mcp", "--port", "9000", input=""), EXIT_USAGE, "--port goes with --http")
    r = run_gputop("mcp", "--http", "--port", str(busy_port), timeout=30)
    err = one_line(r, EXIT_UNAVAILABLE, f"127.0.0.1:{busy_port}", "choose another --port")
    assert "streamable HTTP on" not in err


# ---- the audit log and the example script -------------------------------------------------------------

def test_log_shows_what_guard_records_changed(tmp_path, scenario):
    scenario([], gpus=1)
    assert run_gputop("guard", "--policy-file", str(REPO / "examples" / "policy.yaml"), "--enable").returncode == 0
    r = run_gputop("log")
    assert r.returncode == EXIT_OK
    rows = {ln.split()[3]: ln for ln in r.stdout.splitlines()[1:]}
    assert "policy policy.yaml" in rows["guard-policy"]
    assert "mode off -> dry-run" in rows["guard-mode"]
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert f"cli/{me}" in rows["guard-mode"] and f"cli/{me}" in rows["guard-policy"]  # who did it
    records = json.loads(run_gputop("log", "--json").stdout)
    assert all(r["actor"]["uid"] == os.geteuid() and r["host"] for r in records)


def test_try_scenario_script(tmp_path):
    r = subprocess.run(["sh", str(REPO / "examples" / "try-scenario.sh"), str(tmp_path / "try")],
                       capture_output=True, text=True, timeout=30)
    pids = [int(p) for p in re.findall(r"Clean up: kill (\d+) (\d+)", r.stdout)[0]] if r.returncode == 0 else []
    try:
        assert r.returncode == 0 and len(pids) == 2, r.stderr
        train, orphan = pids
        scen = str(tmp_path / "try" / "scenario.yaml")
        assert f"export GPUTOP_SCENARIO={scen}" in r.stdout
        st = json.loads(run_gputop("status", "--json", "--scenario", scen).stdout)
        verdicts = {h["pid"]: h["verdict"]["kind"] for h in st["holders"]}
        assert verdicts == {train: "not-orphan", orphan: "orphan"}
        reap = run_gputop("reap", "--scenario", scen)
        assert reap.returncode == EXIT_OK and f"root {orphan}" in reap.stdout
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_reap_watch_interval_zero_is_refused():
    one_line(run_gputop("reap", "--watch", "--interval", "0"), EXIT_USAGE, "--interval 0 is under the floor of 0.1 s")


# ---- intervals: negative or under the floor (0.1 s) is refused, with the floor named ---------------

@pytest.mark.parametrize("argv,says", [
    (["--interval", "-1", "status"], "--interval must not be negative (got -1)"),
    (["--interval", "0.05", "status"], "--interval 0.05 is under the floor of 0.1 s"),
    (["--interval", "nan", "status"], "--interval must be a number of seconds"),
    (["--interval", "0", "status", "--json"], "--interval 0 is under the floor of 0.1 s"),
    (["guard", "run", "--interval", "0.01"], "--interval 0.01 is under the floor of 0.1 s"),
    (["guard", "run", "--interval", "-1"], "--interval: bad duration '-1'"),
    (["reap", "--watch", "--interval", "0.01"], "--interval 0.01 is under the floor of 0.1 s"),
])
def test_an_interval_under_the_floor_is_refused(argv, says, scenario):
    scenario()
    one_line(run_gputop(*argv), EXIT_USAGE, says)


def test_the_floor_itself_is_accepted(scenario):
    scenario()
    assert run_gputop("--interval", "0.1", "status", "--json").returncode == EXIT_OK


def test_a_bad_guard_interval_in_the_config_names_the_key(scenario, tmp_path):
    scenario()
    cfg = tmp_path / "c.yaml"
    cfg.write_text("guard:\n  interval: 0.01\n")
    one_line(run_gputop("--config", str(cfg), "guard", "run"), EXIT_USAGE, "guard.interval 0.01 is under the floor")


# ---- config: the line and the key of a bad value; a file that is not UTF-8 ------------------------

@pytest.mark.parametrize("text,line,key", [
    ("reap: {grace: sixty}\n", 1, "reap.grace"),
    ("interval: 2\nreap:\n  interval: 30\n  grace: sixty\n", 4, "reap.grace"),
    ("kill_timeout: soon\n", 1, "kill_timeout"),
    ("max_chain: many\n", 1, "max_chain"),
])
def test_a_bad_config_value_names_the_line_and_the_key(tmp_path, scenario, text, line, key):
    scenario()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    err = one_line(run_gputop("--config", str(cfg), "status"), EXIT_USAGE, f"{cfg} line {line}: {key}")
    assert "sixty" in err or "soon" in err or "many" in err


def test_a_config_that_is_not_utf8_says_so_without_a_chmod_hint(tmp_path, scenario):
    scenario()
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"# caf\xe9\nprotect: [x]\n")
    cfg.chmod(0o644)
    err = one_line(run_gputop("--config", str(cfg), "status"), EXIT_USAGE, "is not UTF-8", "line 1", "0xe9")
    assert "chmod" not in err


def test_a_scenario_and_a_policy_that_are_not_utf8_say_so(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"gpus: []\n# \xff\n")
    err = one_line(run_gputop("--scenario", str(bad), "status"), EXIT_USAGE, "is not UTF-8", "line 2")
    assert "syntax" not in err
    one_line(run_gputop("guard", "--policy-file", str(bad)), EXIT_USAGE, "is not UTF-8", "line 2")
