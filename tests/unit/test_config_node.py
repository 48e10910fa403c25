"""The node's /etc/gputop/config.yaml merged with a user's config, and typos that are errors with a line."""

from __future__ import annotations

import pytest

from gputop.core.config import SCHEMA, load_config
from gputop.util.errors import UsageError
from gputop.core.orphans import DEFAULT_PROTECT


@pytest.fixture
def files(tmp_path, monkeypatch):
    node, user = tmp_path / "etc.yaml", tmp_path / "user.yaml"
    monkeypatch.setenv("GPUTOP_SYSTEM_CONFIG", str(node))
    monkeypatch.setenv("GPUTOP_CONFIG", str(user))
    user.write_text("{}\n")
    return node, user


@pytest.mark.parametrize("text,line,key,guess", [
    ("kill_timeout: 5\nprotecct: [x]\n", 2, "protecct", "did you mean 'protect'?"),
    ("kill_timout: 3\n", 1, "kill_timout", "did you mean 'kill_timeout'?"),
    ("guard:\n  interval: 5\n  polcy: /etc/p.yaml\n", 3, "guard.polcy", "did you mean 'guard.policy'?"),
    ("guard:\n  smtp: {host: h, prot: 25}\n", 2, "guard.smtp.prot", "did you mean 'guard.smtp.port'?"),
    ("zzz: 1\n", 1, "zzz", "known: "),
])
def test_an_unknown_key_is_an_error_with_file_and_line(files, text, line, key, guess):
    node, user = files
    for f in (user, node):  # in either file
        f.write_text(text)
        with pytest.raises(UsageError) as e:
            load_config()
        msg = str(e.value)
        assert f"config file {f} line {line}: unknown key '{key}'" in msg and guess in msg and "\n" not in msg
        f.write_text("{}\n")


def test_protect_cmdline_is_a_known_key(files):
    _, user = files
    user.write_text("protect_cmdline: ['--keep-me']\n")
    assert load_config().protect_cmdline == ("--keep-me",)
    assert "protect_cmdline" in SCHEMA


def test_a_user_adds_protections_but_cannot_remove_the_nodes(files):
    node, user = files
    node.write_text("protect: [nodejob]\nprotect_cmdline: ['--node-keep']\nnohup_protects: true\n"
                    "kill_timeout: 9\nguard:\n  interval: 7s\n  smtp: {host: mail.node}\n")
    user.write_text("protect: [myjob]\nnohup_protects: false\nkill_timeout: 2\n"
                    "guard: {interval: 1s, smtp: {host: evil.example}}\n")
    c = load_config()
    assert c.protect == ("nodejob", "myjob")
    assert c.protect_cmdline == ("--node-keep",)
    assert c.nohup_protects is True  # the node turned it on
    assert c.kill_timeout == 2  # the user's to choose
    assert c.extra["guard"] == {"interval": "7s", "smtp": {"host": "mail.node"}}  # the node's guard wins
    user.write_text("protect: []\n")
    assert load_config().protect == ("nodejob",)


def test_without_a_node_protect_list_the_defaults_are_the_nodes(files):
    node, user = files
    node.write_text("kill_timeout: 9\n")
    user.write_text("protect: [myjob]\n")
    c = load_config()
    assert c.protect == DEFAULT_PROTECT + ("myjob",) and c.kill_timeout == 9


def test_without_a_node_file_the_user_file_is_as_before(files):
    _, user = files
    user.write_text("protect: [myjob]\n")
    assert load_config().protect == ("myjob",)


def test_a_bad_node_file_names_the_node_file(files):
    node, _ = files
    node.write_text("protect: [a\n")
    with pytest.raises(UsageError, match=f"config file {node} line"):
        load_config()
