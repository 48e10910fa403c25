"""gputop.core.disguise: one test for the rogue audit's disguised-name finding and for protect patterns."""

from __future__ import annotations

import pytest

from gputop.core.disguise import disguise, exe_mismatch


@pytest.mark.parametrize("name,cmdline,exe", [
    ("tmux: server", ("tmux", "new", "-d"), "/usr/bin/tmux"),  # tmux names itself; argv[0] and exe say tmux
    ("bash", ("-bash",), "/usr/bin/bash"),  # a login shell's '-'
    ("jupyter-lab", ("/usr/bin/python3", "/opt/venv/bin/jupyter-lab"), "/usr/bin/python3.11"),  # a script
    ("jupyter-noteboo", ("/usr/bin/jupyter-notebook",), None),  # comm cut at 15 bytes
    ("sleep", ("sleep", "600"), "/usr/bin/sleep (deleted)"),
    ("xmrig", (), "/home/u/xmrig"),  # no argv (a kernel-side exec, an unreadable one): the exe only
])
def test_names_that_agree(name, cmdline, exe):
    assert disguise(name, cmdline, exe) is None


@pytest.mark.parametrize("name,cmdline,exe,says", [
    ("xmrig", ("jupyter-lab", "--port", "8888"), "/home/u/xmrig", "argv[0] 'jupyter-lab'"),
    ("tmux", ("tmux",), "/home/u/xmrig", "executable 'xmrig'"),  # a symlink called tmux to xmrig
    ("tmux", ("/usr/bin/python3", "-c", "..."), "/usr/bin/python3.11", "argv[0] 'python3'"),  # prctl rename
    ("jupyter-lab", ("/usr/bin/python3", "/home/u/miner.py"), None, "argv[0] 'python3'"),
])
def test_names_that_disagree(name, cmdline, exe, says):
    why = disguise(name, cmdline, exe)
    assert why is not None and says in why, why


def test_the_audit_compares_the_name_with_the_executable_only():
    # argv[0] is the process's own choice: the audit does not read it (it never vouches for a name)
    assert exe_mismatch("xmrig", ("jupyter-lab",), "/home/u/xmrig") is None
    assert exe_mismatch("kworker/0:1", ("kworker/0:1",), "/tmp/.x/xmrig") == \
        "the process calls itself 'kworker/0:1' but runs 'xmrig'"
