"""/etc/gputop/config.yaml on a real kill: the node's protections hold whatever a user's config says."""

from __future__ import annotations

import shutil

from gputop.util.errors import EXIT_REFUSED, EXIT_USAGE
from tests.conftest import run_gputop, wait_comm
from tests.functional.actions_helpers import alive


def test_the_nodes_protect_list_holds_against_a_users_config(procs, scenario, tmp_path):
    node, user = tmp_path / "etc.yaml", tmp_path / "user.yaml"
    node.write_text("protect: [gt15-nodejob]\n")
    user.write_text("protect: []\n")  # a user trying to drop every protection
    # Programs that are called so (a copy of sleep): a python that only renames itself is a disguise,
    # which no name protects since issue 25.
    shutil.copy2(shutil.which("sleep"), tmp_path / "gt15-nodejob")
    job = procs.spawn([str(tmp_path / "gt15-nodejob"), "600"])
    other = procs.sleeper("gt15-plainjob")
    wait_comm(job.pid, "gt15-nodejob")
    scenario(holders=[{"pid": job.pid, "gpu": 0, "memory": "1GiB"}, {"pid": other.pid, "gpu": 0, "memory": "1GiB"}])
    env = {"GPUTOP_SYSTEM_CONFIG": str(node)}
    r = run_gputop("--config", str(user), "kill", "--pid", str(job.pid), "--force", env=env)
    assert r.returncode == EXIT_REFUSED and "protect" in r.stderr, r.stdout + r.stderr
    assert alive(job.pid)
    # the same user config leaves a process the node does not name unprotected
    r = run_gputop("--config", str(user), "kill", "--pid", str(other.pid), "--force", env=env)
    assert r.returncode == 0, r.stderr
    assert alive(job.pid)


def test_a_typo_in_the_node_file_is_exit_2_with_file_and_line(scenario, tmp_path):
    node = tmp_path / "etc.yaml"
    node.write_text("protect: [a]\nkill_timout: 3\n")
    scenario(holders=[])
    r = run_gputop("status", env={"GPUTOP_SYSTEM_CONFIG": str(node)})
    assert r.returncode == EXIT_USAGE
    assert f"config file {node} line 2: unknown key 'kill_timout': did you mean 'kill_timeout'?" in r.stderr
