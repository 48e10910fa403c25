"""The console script's quick exit for one-shot read commands (gputop.commands.cli.QUICK): the output is all there,
atexit handlers run, and only Python's teardown is skipped; any other command exits normally."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# A module-level object whose __del__ runs in Python's teardown, and an atexit handler: the script says
# which of the two ran, and whether the cyclic collector was on when the process left.
SCRIPT = """
import atexit, gc, sys
from gputop.commands import cli

class Canary:
    def __del__(self):
        sys.stderr.write("teardown ran\\n")

canary = Canary()
atexit.register(lambda: sys.stderr.write(f"atexit ran gc={{gc.isenabled()}}\\n"))
{extra}
sys.argv = ["gputop", *{argv!r}]
{call}
"""


def _run(argv, call="cli.entry()", extra="", stdout=subprocess.PIPE, cwd=None) -> subprocess.CompletedProcess:
    code = SCRIPT.format(argv=list(argv), call=call, extra=extra)
    return subprocess.run([sys.executable, "-c", code], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=60, cwd=cwd)


@pytest.fixture
def one_gpu(scenario, procs):
    worker = procs.sleeper().pid
    return worker, str(scenario([{"pid": worker, "gpu": 0, "memory": "1GiB"}], gpus=1))


def test_status_leaves_without_teardown_after_its_output_and_atexit_handlers(one_gpu):
    worker, path = one_gpu
    r = _run(["status", "--json", "--scenario", path])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # all of it, flushed before os._exit
    assert [h["pid"] for h in doc["holders"]] == [worker]
    assert "atexit ran gc=False" in r.stderr  # the handlers ran, with the collector off for the command
    assert "teardown ran" not in r.stderr


def test_the_canary_sees_a_normal_exit(one_gpu):
    # The same command through main(), as an in-process caller runs it: a normal exit, teardown included.
    # Without this, the test above could pass with a canary that never speaks.
    _, path = one_gpu
    r = _run(["status", "--json", "--scenario", path], call="sys.exit(cli.main())")
    assert r.returncode == 0, r.stderr
    assert "atexit ran gc=True" in r.stderr and "teardown ran" in r.stderr


def test_a_command_outside_quick_exits_normally_with_the_collector_on(tmp_path):
    # "status" here is the scenario file's name, not the command: the guess is wrong, and completion
    # (not a QUICK command) runs with the collector back on and leaves normally.
    (tmp_path / "status").write_text("gpus: []\nholders: []\n")
    r = _run(["--scenario", "status", "completion", "bash"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "complete" in r.stdout
    assert "atexit ran gc=True" in r.stderr and "teardown ran" in r.stderr


def test_a_live_thread_gets_a_normal_exit(one_gpu):
    # A thread still running when the command returns: the normal exit waits for it; os._exit would not.
    # It runs until the main thread has finished (not for a fixed 0.5 s, which a command on a loaded machine
    # outlived: the thread was gone before the command returned, and the quick exit was right to be taken).
    _, path = one_gpu
    thread = ("import threading, time\n"
              "threading.Thread(target=lambda: (threading.main_thread().join(), "
              "sys.stderr.write('thread done\\n'))).start()")
    r = _run(["status", "--json", "--scenario", path], extra=thread)
    assert r.returncode == 0, r.stderr
    assert "thread done" in r.stderr and "teardown ran" in r.stderr


@pytest.mark.parametrize("fmt", [["--json"], []])
def test_output_that_cannot_be_written_is_a_one_line_error_and_exit_1(one_gpu, fmt):
    _, path = one_gpu
    with open("/dev/full", "w") as full:
        r = _run(["status", *fmt, "--scenario", path], stdout=full)
    assert r.returncode == 1
    lines = [x for x in r.stderr.splitlines() if not x.startswith("atexit ran") and x != "teardown ran"]
    assert lines == ["gputop: cannot write the output: No space left on device (free some space, or write "
                     "it elsewhere)"]
