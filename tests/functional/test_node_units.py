"""The systemd units gputop writes: systemd's own checkers pass on them (verify, offline security score)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gputop.commands import node_units
from tests.conftest import ROOT, run_gputop

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed (Debian package "
                                   "systemd; .ci/run installs it)")


@pytest.fixture(scope="module")
def units(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("units")
    r = run_gputop("install-units", "--prefix", str(d))
    assert r.returncode == 0, r.stderr
    for name in node_units.UNITS:
        assert f"created: {d / name}" in r.stdout
    return {name: d / name for name in node_units.UNITS}


def test_execstart_is_the_running_gputop(units):
    exe = Path(sys.executable).parent / "gputop"
    want = str(exe) if exe.exists() else f"{sys.executable} -m gputop"
    for path in units.values():
        (line,) = [x for x in path.read_text().splitlines() if x.startswith("ExecStart=")]
        assert line.startswith(f"ExecStart={want} ")


def test_guard_unit_reloads_does_not_retry_refusals_and_keeps_what_the_guard_needs(units):
    text = units["gputop-guard.service"].read_text()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in text
    assert "RestartPreventExitStatus=2 5" in text
    assert "CapabilityBoundingSet=CAP_KILL CAP_SYS_PTRACE CAP_DAC_READ_SEARCH" in text
    for bad in ("PrivateUsers", "ProtectProc=invisible", "DynamicUser", "PrivateDevices", "PrivateNetwork",
                "DevicePolicy", "User="):
        assert bad not in text, bad
    for d in ("StateDirectory=gputop", "LogsDirectory=gputop", "RuntimeDirectory=gputop"):
        assert d in text


@needs_analyze
@pytest.mark.parametrize("name", sorted(node_units.UNITS))
def test_systemd_analyze_verify_passes(units, name):
    r = subprocess.run([ANALYZE, "verify", str(units[name])], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


@needs_analyze
@pytest.mark.parametrize("name", sorted(node_units.UNITS))
def test_offline_security_score_is_at_most_5(units, name):
    r = subprocess.run([ANALYZE, "security", "--offline=true", str(units[name])], capture_output=True,
                       text=True, cwd="/")
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 5.0, r.stdout


def test_packaging_copies_are_the_rendered_units():
    for name in node_units.UNITS:
        assert (ROOT / "packaging" / name).read_text() == node_units.render(name, "/usr/local/bin/gputop"), (
            f"packaging/{name} is stale: regenerate it with node_units.render")


def test_install_units_print_writes_nothing(tmp_path):
    r = run_gputop("install-units", "--print")
    assert r.returncode == 0 and "# ---- gputop-guard.service" in r.stdout and "[Service]" in r.stdout


# ---- another user's planted symlinks in the directory install-units writes --------------------------

def _as_other(user, *cmd: str) -> None:
    r = subprocess.run(user.setpriv() + list(cmd), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_install_units_never_writes_through_a_symlink_another_user_planted(monkeypatch, request, tmp_path):
    """A directory another user can write (here 0777, not sticky, so the kernel's protected_symlinks
    does not step in): they plant the old fixed temp name as a symlink to a file of root's, and the unit
    itself as a symlink to their own copy of the exact unit text (which an "unchanged" check that follows
    links would keep, leaving them the unit to edit later). Root's install-units clobbers nothing and
    leaves two regular root-owned 0644 files."""
    import os
    import stat

    from tests.functional.actions_helpers import OtherUser

    other = OtherUser.make(monkeypatch, request)
    units_dir = other.shared / "units"
    units_dir.mkdir()
    os.chmod(units_dir, 0o777)
    precious = tmp_path / "precious.conf"  # root's file, in a directory only root can enter
    precious.write_text("root's own settings\n")
    their_copy = other.shared / "their-unit"
    _as_other(other, sys.executable, "-c", f"open({str(their_copy)!r}, 'w').write("
              f"{node_units.render('gputop-serve.service')!r})")
    for name in node_units.UNITS:
        _as_other(other, "ln", "-s", str(precious), str(units_dir / f"{name}.tmp"))
    _as_other(other, "ln", "-s", str(their_copy), str(units_dir / "gputop-serve.service"))

    r = run_gputop("install-units", "--prefix", str(units_dir))
    assert r.returncode == 0, r.stderr
    assert precious.read_text() == "root's own settings\n", "install-units wrote through a planted symlink"
    assert f"created: {units_dir / 'gputop-guard.service'}" in r.stdout
    assert f"replaced: {units_dir / 'gputop-serve.service'}" in r.stdout, r.stdout
    for name in node_units.UNITS:
        st = os.lstat(units_dir / name)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o644, (name, st)
        assert (units_dir / name).read_text() == node_units.render(name)
    # a second run finds its own files unchanged
    r = run_gputop("install-units", "--prefix", str(units_dir))
    assert r.stdout.count("unchanged: ") == 2, r.stdout
    # the other user's files were only replaced in the directory listing, not written
    assert their_copy.read_text() == node_units.render("gputop-serve.service")
    assert sorted(p.name for p in units_dir.iterdir() if not p.name.endswith(".tmp")) == sorted(node_units.UNITS)


def test_install_units_over_a_directory_is_a_one_line_error(tmp_path):
    (tmp_path / "gputop-guard.service").mkdir()
    r = run_gputop("install-units", "--prefix", str(tmp_path))
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "cannot write the units in" in r.stderr
