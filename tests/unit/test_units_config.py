from __future__ import annotations

import pytest

from gputop.core.config import Config, load_config
from gputop.util.errors import UsageError
from gputop.util.units import fmt_bytes, fmt_duration, parse_duration, parse_memory


@pytest.mark.parametrize("text,expected", [
    (8589934592, 8589934592), ("8GiB", 8 * 1024**3), ("8GB", 8 * 1000**3), ("512MiB", 512 * 1024**2),
    ("1.5 GiB", int(1.5 * 1024**3)), ("100", 100),
])
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["8 bananas", "-1", True, None, "GiB"])
def test_parse_memory_rejects(bad):
    with pytest.raises(ValueError):
        parse_memory(bad)


@pytest.mark.parametrize("text,expected", [("30s", 30), ("5m", 300), ("2h", 7200), (45, 45), ("1.5m", 90)])
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


def test_parse_duration_rejects():
    with pytest.raises(ValueError):
        parse_duration("5 minutes")


def test_formatting_unknown_is_na_not_zero():
    assert fmt_bytes(None) == "N/A" and fmt_duration(None) == "N/A"
    assert fmt_bytes(0) == "0B" and fmt_bytes(4 * 1024**3) == "4.0GiB"
    assert fmt_duration(3725) == "1:02:05"


def test_config_defaults_without_file():
    c = load_config()
    # the default protect patterns are anchored (issue 25): tmux's is "tmux(: .*)?"
    assert c == Config() and "tmux(: .*)?" in c.protect and c.reap_grace == 60


def test_config_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("protect: [myjob]\nnohup_protects: false\nreap:\n  interval: 10s\n  grace: 2m\n"
                 "guard: {interval: 1}\n")
    c = load_config(str(p))
    assert c.protect == ("myjob",) and not c.nohup_protects
    assert c.reap_interval == 10 and c.reap_grace == 120 and c.extra == {"guard": {"interval": 1}}


@pytest.mark.parametrize("text,msg", [
    ("protect: [a\n", "line"), ("reap: {grace: soon}\n", "bad duration"), ("protect: tmux\n", "list"),
    ("- 1\n", "mapping"), ("reap: {bogus: 1}\n", "unknown key"),
    ('protect: ["(("]\n', "not a regular expression"),
    ('protect: [/opt/lab/bin/keep]\n', "put patterns for paths in 'protect_cmdline'"),
    ('reap: {protect: [tmux, "bin/screen"]}\n', "contains '/'"),
])
def test_config_errors_are_one_line(tmp_path, text, msg):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(UsageError) as e:
        load_config(str(p))
    assert msg in str(e.value) and "\n" not in str(e.value) and str(p) in str(e.value)


def test_guard_dir_is_node_wide_once_the_service_dir_exists(tmp_path, monkeypatch):
    import gputop.core.config as config

    node = tmp_path / "var-lib-gputop"
    monkeypatch.setattr(config, "NODE_GUARD_DIR", node)
    monkeypatch.delenv("GPUTOP_STATE_DIR")
    assert config.guard_dir() == config.state_dir()  # no service dir: the user's own state dir
    node.mkdir()
    assert config.guard_dir() == node  # the daemon's directory: every face shares it
    monkeypatch.setenv("GPUTOP_STATE_DIR", str(tmp_path / "mine"))
    assert config.guard_dir() == tmp_path / "mine"  # an explicit choice wins


def test_a_path_is_fine_in_protect_cmdline(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("protect_cmdline: [/opt/lab/bin/keep]\n")
    assert load_config(str(p)).protect_cmdline == ("/opt/lab/bin/keep",)
