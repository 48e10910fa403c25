"""A light install: serve and mcp are extras, and a missing one is a one-line message naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

BLOCK = "import sys; sys.modules[{mod!r}] = None; from gputop.commands.cli import main; sys.exit(main({argv!r}))"


@pytest.mark.parametrize("mod,argv,extra", [
    ("uvicorn", ["serve", "--port", "0"], "serve"),
    ("prometheus_client", ["serve", "--port", "0"], "serve"),
    ("mcp", ["mcp"], "mcp"),
    ("prometheus_api_client", ["fleet", "--prometheus", "http://127.0.0.1:9", "--json"], "fleet"),
])
def test_a_missing_extra_is_named_in_one_line_with_exit_6(mod, argv, extra, scenario):
    scenario(holders=[])
    r = subprocess.run([sys.executable, "-c", BLOCK.format(mod=mod, argv=argv)], capture_output=True, text=True,
                       cwd=ROOT, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 6, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("gputop: ") and f"pip install 'gputop[{extra}]'" in lines[-1], r.stderr
    assert "Traceback" not in r.stderr


def test_the_base_install_does_not_need_the_extras():
    tomllib = pytest.importorskip("tomllib")

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(meta["dependencies"])
    for pkg in ("mcp", "prometheus", "starlette", "uvicorn", "==8"):
        assert pkg not in base
    assert "textual>=8.2,<9" in meta["dependencies"]
    assert "textual==8.2.8" in meta["optional-dependencies"]["test"]
    assert meta["dynamic"] == ["version"] and (ROOT / "LICENSE").read_text().startswith("MIT License")
