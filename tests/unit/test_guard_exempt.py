"""guard.exempt: the config key (schema, checks, one-line errors) and the root-owned executable rule."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gputop.core.config import Config, load_config, parse_exempt
from gputop.util.errors import UsageError
from gputop.guard.exempt import Exempt, root_owned


def write(tmp_path: Path, monkeypatch, text: str) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    monkeypatch.setenv("GPUTOP_CONFIG", str(p))
    return p


def test_the_key_is_read_from_a_config_file(tmp_path, monkeypatch):
    write(tmp_path, monkeypatch, """\
guard:
  exempt:
    users: [alice, 1001]
    groups: [gpu-admins]
    units: [dcgm-exporter.service]
    cgroups: [/system.slice/dcgm-exporter.service/]
    executables: [/usr/bin/dcgm-exporter]
""")
    ex = Exempt.from_config(load_config())
    assert ex.users == ("alice", 1001) and ex.groups == ("gpu-admins",)
    assert ex.units == ("dcgm-exporter.service",)
    assert ex.cgroups == ("/system.slice/dcgm-exporter.service",)  # a trailing '/' is dropped
    assert ex.executables == ("/usr/bin/dcgm-exporter",)
    assert bool(ex) and not bool(Exempt.from_config(Config()))


@pytest.mark.parametrize("body,says", [
    ("guard: {exempt: {names: [jupyter]}}", "unknown key 'guard.exempt.names'"),
    ("guard: {exempt: {users: alice}}", "'guard.exempt.users' must be a list"),
    ("guard: {exempt: [alice]}", "'guard.exempt' must be a mapping"),
    ("guard: {exempt: {units: [foo]}}", "is not a systemd service name"),
    ("guard: {exempt: {units: [user@1000.service]}}", "exempt the user instead"),
    ("guard: {exempt: {cgroups: [system.slice/x.service]}}", "must be an absolute path"),
    ("guard: {exempt: {cgroups: [/]}}", "would exempt every process"),
    ("guard: {exempt: {cgroups: [/user.slice/user-1000.slice/user@1000.service/app.slice]}}",
     "delegated cgroup subtree"),
    ("guard: {exempt: {executables: [/opt/../tmp/x]}}", "without '.' or '..'"),
    ("guard: {exempt: {executables: [xmrig]}}", "must be an absolute path"),
    ("guard: {exempt: {users: ['a b']}}", "is not a user name or a number"),
])
def test_a_bad_exemption_is_a_one_line_error_naming_the_file(tmp_path, monkeypatch, body, says):
    p = write(tmp_path, monkeypatch, body + "\n")
    with pytest.raises(UsageError) as e:
        load_config()
    msg = str(e.value)
    assert says in msg and str(p) in msg and "\n" not in msg, msg


def test_there_is_no_key_for_a_name_argv_environment_or_ancestry():
    from gputop.core.config import EXEMPT_KEYS, SCHEMA

    assert set(SCHEMA["guard"]["exempt"]) == set(EXEMPT_KEYS) == {"users", "groups", "units", "cgroups",
                                                                   "executables"}


def test_parse_exempt_keeps_numbers_as_ids():
    assert parse_exempt({"users": ["0", 7, "bob"]})["users"] == (0, 7, "bob")
    assert parse_exempt(None) == {k: () for k in ("users", "groups", "units", "cgroups", "executables")}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make root-owned and user-owned files")
def test_root_owned_needs_root_and_no_other_writer_on_the_file_and_every_directory(tmp_path):
    base = Path("/opt") / f"gputop-rootowned-{os.getpid()}"
    base.mkdir(mode=0o755)
    try:
        os.chmod(base, 0o755)
        exe = base / "tool"
        shutil.copy2(shutil.which("sleep"), exe)
        os.chmod(exe, 0o755)
        assert root_owned(str(exe)) is None
        os.chmod(exe, 0o757)
        assert "writable by users other than root" in root_owned(str(exe))
        os.chmod(exe, 0o775)
        os.chown(exe, 0, 1)  # group-writable by a group that is not root's
        assert "writable by users other than root" in root_owned(str(exe))
        os.chown(exe, 0, 0)
        assert root_owned(str(exe)) is None  # group write for group root only
        os.chmod(exe, 0o755)
        os.chown(exe, 65534, 0)
        assert "not root" in root_owned(str(exe))
        os.chown(exe, 0, 0)
        os.chmod(base, 0o777)
        assert f"{base} is writable" in root_owned(str(exe))  # a directory above it
        os.chmod(base, 0o1777)  # sticky does not help: others may still add and rename their own files
        assert root_owned(str(exe)) is not None
        os.chmod(base, 0o755)
        link = base / "link"
        link.symlink_to(exe)
        assert "symbolic link" in root_owned(str(link))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert root_owned(str(tmp_path / "missing")) is not None
