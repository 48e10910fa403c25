"""--remote argument splitting, ssh command lines, and failure classification (no ssh needed)."""

from __future__ import annotations

import json
import shlex
import stat
import sys

import pytest

from gputop.commands import remote
from gputop.util.errors import UsageError
from tests.conftest import run_gputop


def test_split_finds_remote_among_global_options():
    inv = remote.split_remote_argv(["--backend", "simulated", "--remote", "node01", "status", "--json"])
    assert inv.host == "node01"
    assert inv.args == ["--backend", "simulated", "status", "--json"]
    inv = remote.split_remote_argv(["--remote=me@node02", "--remote-gputop", "/opt/gputop", "--interval", "2"])
    assert (inv.host, inv.remote_cmd, inv.args) == ("me@node02", "/opt/gputop", ["--interval", "2"])
    # After the subcommand too (issue 32: "gputop status --remote h" said "unrecognized arguments")
    inv = remote.split_remote_argv(["status", "--remote", "x", "--json"])
    assert (inv.host, inv.args) == ("x", ["status", "--json"])
    assert remote.split_remote_argv(["status", "--", "--remote", "x"]) is None  # after --: not ours
    assert remote.split_remote_argv(["status"]) is None
    # Without --remote, --remote-gputop is left for argparse (status --hosts uses it).
    assert remote.split_remote_argv(["--remote-gputop", "/x", "status", "--hosts", "a"]) is None


@pytest.mark.parametrize("argv", [["--remote"], ["--remote", "-oProxyCommand=sh"], ["--remote", "a b"]])
def test_split_rejects_bad_input(argv):
    with pytest.raises(UsageError):
        remote.split_remote_argv(argv)


def test_tui_detection():
    assert remote._subcommand([]) is None
    assert remote._subcommand(["--interval", "2", "--readonly"]) is None
    assert remote._subcommand(["--scenario", "s.yaml", "kill", "--pid", "3"]) == "kill"


def test_ssh_argv_quotes_arguments_and_keeps_host_key_checking(monkeypatch):
    monkeypatch.delenv(remote.ENV_SSH, raising=False)
    monkeypatch.delenv(remote.ENV_REMOTE_CMD, raising=False)
    argv = remote.build_ssh_argv("node01", ["kill", "--name", "a b; rm -rf ~"], batch=True, connect_timeout=2.5)
    assert argv[0] == "ssh" and "-T" in argv
    assert argv[argv.index("--") + 1] == "node01"
    assert ["-o", "BatchMode=yes"] == argv[argv.index("BatchMode=yes") - 1:argv.index("BatchMode=yes") + 1]
    assert "ConnectTimeout=3" in argv
    assert not any("StrictHostKeyChecking" in a for a in argv)
    assert shlex.split(argv[-1]) == ["gputop", "kill", "--name", "a b; rm -rf ~"]
    tui = remote.build_ssh_argv("node01", [], tty=True)
    assert "-t" in tui and "-T" not in tui


def test_remote_command_override(monkeypatch):
    monkeypatch.setenv(remote.ENV_REMOTE_CMD, "env GPUTOP_BACKEND=simulated /opt/venv/bin/gputop")
    monkeypatch.setenv(remote.ENV_SSH, "ssh -F /tmp/cfg")
    argv = remote.build_ssh_argv("h", ["status"])
    assert argv[:3] == ["ssh", "-F", "/tmp/cfg"]
    assert argv[-1] == "env GPUTOP_BACKEND=simulated /opt/venv/bin/gputop status"
    assert remote.build_ssh_argv("h", ["status"], remote_cmd="/x/gputop")[-1] == "/x/gputop status"


@pytest.mark.parametrize("rc,err,kind", [
    (255, "ssh: connect to host 10.0.0.9 port 22: Connection refused", remote.UNREACHABLE),
    (255, "ssh: Could not resolve hostname nowhere: Name or service not known", remote.UNREACHABLE),
    (255, "ssh: connect to host 10.0.0.9 port 22: Connection timed out", remote.UNREACHABLE),
    (255, "root@127.0.0.1: Permission denied (publickey).", remote.AUTH_FAILED),
    (255, "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.\n"
          "Host key verification failed.", remote.HOST_KEY_UNKNOWN),
    (255, "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.",
     remote.HOST_KEY_CHANGED),
    (127, "bash: line 1: gputop: command not found", remote.GPUTOP_MISSING),
    (127, "sh: 1: /opt/gputop: not found", remote.GPUTOP_MISSING),
    (1, "gputop: something broke", remote.REMOTE_ERROR),
])
def test_classify_failure(rc, err, kind):
    assert remote.classify_failure(rc, err) == kind


def test_parse_hosts(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# nodes\nnode01\nnode02, node03  # rack 2\n\nnode01\n")
    assert remote.parse_hosts("a,b", str(f)) == ["a", "b", "node01", "node02", "node03"]
    with pytest.raises(UsageError):
        remote.parse_hosts(None, str(tmp_path / "missing"))
    with pytest.raises(UsageError):
        remote.parse_hosts(" , ", None)


def test_merged_rows_carry_the_host():
    ok = remote.HostResult("n1", status={"host": "n1", "gpu": {"gpus": [{"index": 0}]},
                                         "holders": [{"pid": 5}], "roots": [], "warnings": ["w"]})
    bad = remote.HostResult("n2", kind=remote.UNREACHABLE, message="Connection refused")
    m = remote.merged_dict([ok, bad])
    assert m["gpus"] == [{"host": "n1", "index": 0}]
    assert m["holders"] == [{"host": "n1", "pid": 5}]
    assert m["warnings"] == [{"host": "n1", "message": "w"}]
    assert m["hosts"][1]["error"] == {"kind": "unreachable", "message": "Connection refused"}
    text = remote.render_merged([ok, bad])
    assert "1/2 host(s) answered" in text and "n2: unreachable: Connection refused" in text


def test_status_hosts_shows_each_nodes_ledger_and_mig_devices():
    """`status --hosts` prints the lines one node's `status` prints under its GPU table: MIG devices under
    their GPU, and the memory ledger's (unexplained memory, driver-held). A remote's ledger entry with a
    wrong type is left out, not a traceback."""
    G = 1 << 30
    led = {"gpu": 0, "used": 10 * G, "listed": 4 * G, "listed_pids": [7], "listed_unknown_pids": [],
           "device_file_pids": [9], "unexplained": 6 * G, "zombies": [], "searched": True}
    held = {"gpu": 1, "used": 3 * G, "listed": 0, "listed_pids": [], "listed_unknown_pids": [],
            "device_file_pids": [], "unexplained": 3 * G, "zombies": [], "searched": True}
    mig = {"gpu": 1, "mig_index": 0, "profile": "3g.71gb", "name": "NVIDIA H200 MIG 3g.71gb\x1b[2J",
           "memory_total": 71 * G, "memory_used": G, "utilization_gpu": None}
    ok = remote.HostResult("n1", status={"host": "n1", "gpu": {"gpus": [{"index": 0}, {"index": 1}],
                                                               "instances": [mig, "junk"]},
                                         "holders": [], "roots": [], "warnings": [],
                                         "ledger": [led, held, {"gpu": "0", "used": "x"}]})
    m = remote.merged_dict([ok])
    assert [x["gpu"] for x in m["ledger"]] == [0, 1, "0"] and len(m["instances"]) == 1
    text = remote.render_merged([ok])
    assert "n1 GPU 0 ledger: 10GiB used = 4.0GiB by 1 listed + ? by 1 device-file holder(s) (pid 9) + " \
           "6.0GiB unexplained" in text, text
    assert "n1 GPU 1 ledger: 3.0GiB used and no process holds GPU 1: held by the driver" in text, text
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("n1") and " 1:0 " in line)
    assert "- MIG 3g.71gb" in lines[row] and "\x1b" not in text and "N/A" in lines[row]
    assert lines[row - 1].split()[:2] == ["n1", "1"]  # under its GPU
    assert "entr(ies)" in text  # the junk instance was dropped and said so


# ---- --remote after the subcommand ----------------------------------------------------------------

def test_remote_after_the_subcommand_runs_it_there(tmp_path):
    seen = tmp_path / "argv.json"
    fake = tmp_path / "ssh"  # stands in for ssh: records what it was asked to run
    fake.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(seen)!r}, 'w'))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    for argv in (["status", "--remote", "node07", "--json"], ["status", "--json", "--remote=node07"]):
        r = run_gputop(*argv, env={"GPUTOP_SSH": str(fake)})
        assert r.returncode == 0, r.stderr
        got = json.loads(seen.read_text())
        assert "node07" in got and got[-2:] == ["status", "--json"] or " ".join(got).endswith("status --json"), got
        assert "--remote" not in " ".join(got), got
