"""The import rules of docs/architecture.md, checked on every run of the suite: the [tool.importlinter]
contracts in pyproject.toml (rooms import downward only, the TUI and the services are independent, the data
layer has no UI library, no cycle between sibling modules). import-linter builds its graph with grimp, which
sees the imports inside functions as well as those at the top of a module."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT = ("import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())")


def contract_ids() -> list[str]:
    text = (REPO / "pyproject.toml").read_text()
    return re.findall(r'^id = "([^"]+)"', text, flags=re.M)


def test_every_import_rule_holds():
    ids = contract_ids()
    assert {"layers", "faces-independent", "data-layer-has-no-ui", "no-cycles"} <= set(ids), ids
    out = subprocess.run([sys.executable, "-c", LINT, "--no-cache", "--no-logo", str(REPO / "pyproject.toml")],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    report = out.stdout + out.stderr
    assert "No module named 'importlinter'" not in report, \
        "import-linter is missing: pip install -e '.[test]' (it is in the test extra)"
    assert out.returncode == 0, f"an import rule is broken (see docs/architecture.md):\n{report}"
    assert f"Contracts: {len(ids)} kept, 0 broken." in report, report
