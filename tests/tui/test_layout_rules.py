"""The TUI's shape (issue 27): the app is layout and message routing, tui/ reads processes only through
gputop.core, and uses no Textual private. Read from the source (imports inside functions too). The length of
functions and the methods of classes, here as everywhere in gputop: tests/unit/test_code_shape.py."""

from __future__ import annotations

import ast
from pathlib import Path

import gputop.tui

from tests.unit.test_code_shape import modules

TUI = Path(gputop.tui.__file__).parent
MAX_APP_METHODS = 30


def _modules():
    return modules(TUI)


def test_no_module_of_the_tui_imports_psutil():
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(TUI)}:{node.lineno}" for n in names if n.split(".")[0] == "psutil"]
    assert found == [], f"psutil in gputop/tui (read processes through gputop.core): {found}"


def test_the_app_is_layout_and_message_routing():
    tree = ast.parse((TUI / "app.py").read_text())
    app = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GputopApp")
    methods = [n.name for n in app.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert len(methods) <= MAX_APP_METHODS, methods
    # The keys live on the main screen, the action flows in tui/flows.py.
    assert not [m for m in methods if m.startswith("action_") or m.startswith("_do_")], methods


# ---- Textual's private names (issue 27) ------------------------------------------------------------
# What tui/ still reads or overrides of Textual's privates, per module: (module, name or import).
# compositor.py and driver.py subclass Textual's private Compositor and XTermParser-based driver.
# ProcessTree's render fast path (issue 13) uses only Textual's public API since issue 27 (tui/tree_lines.py).
# Each entry is to go (see docs/tui.md); a new one fails the test, and so does an entry that is no longer
# needed (take it out of the list).
KNOWN_TEXTUAL_PRIVATES = {
    ("compositor.py", "_compositor"), ("compositor.py", "_dirty_regions"), ("compositor.py", "_regions_to_spans"),
    ("compositor.py", "import from textual._compositor"),
    ("driver.py", "_debug"), ("driver.py", "_timeout_time"), ("driver.py", "import from textual._loop"),
    ("driver.py", "import from textual._parser"), ("driver.py", "import from textual._time"),
    ("driver.py", "import from textual._xterm_parser"),
    # issue 33: ReleasingTree lets go of what Tree's _build and line cache leave in reference cycles (no
    # public hook for either; see the module doc)
    ("tree_release.py", "_build"), ("tree_release.py", "_clear_line_cache"), ("tree_release.py", "_line_cache"),
    ("tree_release.py", "_tree_lines_cached"),
}


def _kind(found: str) -> tuple[str, str]:
    where, what = found.split(" ", 1)
    return where.split(":")[0], what if what.startswith("import") else what.split(" ")[0]


def test_no_new_textual_private_is_used_in_the_tui():
    from tests.tui.private_attrs import find_in_package

    found = find_in_package(gputop.tui)
    new = [f for f in found if _kind(f) not in KNOWN_TEXTUAL_PRIVATES]
    assert new == [], f"Textual private names used in gputop/tui (use Textual's public API): {new}"
    gone = KNOWN_TEXTUAL_PRIVATES - {_kind(f) for f in found}
    assert gone == set(), f"no longer used: take these out of KNOWN_TEXTUAL_PRIVATES: {sorted(gone)}"


_SAMPLE = '''
import os
from textual.widgets import Tree, Static
from textual._compositor import Compositor
import textual._loop


class Mine(Tree):
    def __init__(self):
        super().__init__("x")
        self._rows = {}                      # ours
        self._line_cache = None              # Textual's (Tree), even assigned here

    def _render_line(self, y, x1, x2, style):  # overrides Tree's private
        return self._rows, self._tree_lines   # ours; Tree's

    def alias(self, node):
        t = self
        return t._line_cache, node._hover, getattr(self, "_updates"), self.__dict__.get("_cursor_node"), \\
            self.__dict__["_rows"], super()._refresh_line(0)


class Plain:
    def __init__(self):
        self._stop = 1                       # a class of ours: self is ours

    def go(self):
        os._exit(self._stop)                 # not Textual's objects
'''


def test_the_private_check_catches_aliases_strings_overrides_and_imports_but_not_our_own():
    from tests.tui.private_attrs import find

    namespace: dict = {}
    exec(compile(_SAMPLE.replace("from textual._compositor import Compositor\nimport textual._loop\n", ""),
                 "sample", "exec"), namespace)
    found = sorted(f.split(" ", 1)[1].split(" (")[0] for f in find(_SAMPLE, namespace, "sample", "sample"))
    assert found == sorted(["import from textual._compositor", "import textual._loop", "_line_cache",
                            "_render_line", "_tree_lines", "_line_cache", "_hover", "_updates",
                            "_cursor_node", "_refresh_line"]), found
