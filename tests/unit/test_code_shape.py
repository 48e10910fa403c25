"""The code's shape (issue 27): no function over a screenful (60 lines), no class over 30 methods, in any
module of gputop. Read from the source with ast; nested functions and methods count on their own."""

from __future__ import annotations

import ast
from pathlib import Path

import gputop

ROOT = Path(gputop.__file__).parent
MAX_FUNCTION_LINES = 60
MAX_CLASS_METHODS = 30


def modules(root: Path = ROOT):
    """(path, syntax tree) of every module under ``root``."""
    for path in sorted(root.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def long_functions(root: Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    return [f"{path.relative_to(root)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, tree in modules(root) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


def big_classes(root: Path = ROOT, limit: int = MAX_CLASS_METHODS) -> dict[str, int]:
    big = {}
    for path, tree in modules(root):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                n = sum(isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) for m in node.body)
                if n > limit:
                    big[f"{path.relative_to(root)}:{node.name}"] = n
    return big


def test_no_function_is_over_a_screenful():
    assert long_functions() == [], f"functions over {MAX_FUNCTION_LINES} lines (split them)"


def test_no_class_has_over_30_methods():
    assert big_classes() == {}, f"classes over {MAX_CLASS_METHODS} methods (split them)"
