"""The systemd units gputop writes: systemd's own checkers pass on them (verify, offline security score)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gputop import node_units
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
