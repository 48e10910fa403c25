"""The TUI's shape (issue 27): the app is layout and message routing, tui/ reads processes only through
gputop.core, and no function grows past a screenful. Read from the source (imports inside functions too)."""

from __future__ import annotations

import ast
from pathlib import Path

import gputop.tui

TUI = Path(gputop.tui.__file__).parent
MAX_FUNCTION_LINES = 60
MAX_APP_METHODS = 30


def _modules():
    for path in sorted(TUI.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def test_no_module_of_the_tui_imports_psutil():
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(TUI)}:{node.lineno}" for n in names if n.split(".")[0] == "psutil"]
    assert found == [], f"psutil in gputop/tui (read processes through gputop.core): {found}"


def test_no_function_of_the_tui_is_over_a_screenful():
    long = [f"{path.relative_to(TUI)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, tree in _modules() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_the_app_is_layout_and_message_routing():
    tree = ast.parse((TUI / "app.py").read_text())
    app = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GputopApp")
    methods = [n.name for n in app.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert len(methods) <= MAX_APP_METHODS, methods
    # The keys live on the main screen, the action flows in tui/flows.py.
    assert not [m for m in methods if m.startswith("action_") or m.startswith("_do_")], methods
