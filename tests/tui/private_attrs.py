"""Find uses of Textual's private names in source (issue 27): an attribute ``x._name`` (or getattr/setattr/
hasattr/delattr(x, "_name"), or ``x.__dict__`` indexed with "_name"), an override of a Textual base class's
private method, and an import from a private Textual module (``textual._compositor``).

Textual's privates: the private names that Textual's classes and modules define (a function or method, a
class or module level name, or an attribute assigned on ``self``/``cls``; read from its installed source).
Ours: the private names that the module itself, or a gputop module it imports, defines the same ways.

- ``self._n`` / ``cls._n`` / ``super()._n`` in a class with Textual bases: flagged when ``_n`` is a private of
  one of them (its MRO, resolved at run time), even if the class assigns it too (it would overwrite
  Textual's). In a class of ours without Textual bases, ``self`` is ours.
- any other ``x._n`` (including ``self`` outside a class): flagged when ``_n`` is one of Textual's privates
  and not one of ours. An alias (``t = self; t._line_cache``) is caught. What is not: a name that is both
  ours and Textual's, used on a Textual object outside a class of ours (no types here to tell them apart);
  ``os._exit`` and the like are not Textual's and not flagged.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
from pathlib import Path

import gputop
import textual

_ACCESSORS = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_names(tree: ast.AST) -> dict[str, set[str]]:
    """Private names a module defines: {class name (or "" for the module): names}."""
    out: dict[str, set[str]] = {"": set()}

    def visit(node: ast.AST, cls: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                out.setdefault(child.name, set())
                if _private(child.name):
                    out[cls].add(child.name)
                visit(child, child.name)
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(child.name):
                out[cls].add(child.name)
            targets = (child.targets if isinstance(child, ast.Assign)
                       else [child.target] if isinstance(child, (ast.AnnAssign, ast.AugAssign)) else [])
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and _private(n.id) and isinstance(node, (ast.Module, ast.ClassDef)):
                        out[cls].add(n.id)
                    if (isinstance(n, ast.Attribute) and _private(n.attr) and isinstance(n.value, ast.Name)
                            and n.value.id in ("self", "cls")):
                        out[cls].add(n.attr)
            visit(child, cls)

    visit(tree, "")
    return out


def _package_names(root: Path) -> dict[tuple[str, str], set[str]]:
    """{(module, class): private names} over every module under ``root``."""
    out = {}
    base = root.parent
    for path in root.rglob("*.py"):
        module = ".".join(path.relative_to(base).with_suffix("").parts)
        module = module[: -len(".__init__")] if module.endswith(".__init__") else module
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for cls, names in _defined_names(tree).items():
            out[(module, cls)] = names
    return out


@functools.lru_cache(maxsize=1)
def textual_names() -> dict[tuple[str, str], set[str]]:
    return _package_names(Path(textual.__file__).parent)


@functools.lru_cache(maxsize=1)
def gputop_names() -> dict[str, set[str]]:
    """{module: the private names it defines, in any of its classes or at module level}."""
    out: dict[str, set[str]] = {}
    for (module, _cls), names in _package_names(Path(gputop.__file__).parent).items():
        out.setdefault(module, set()).update(names)
    return out


def ours(tree: ast.AST, module: str) -> set[str]:
    """The private names of ``module`` and of the gputop modules it imports (anywhere in it)."""
    by_module = gputop_names()
    out = set(by_module.get(module, ()))
    for node in ast.walk(tree):
        mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if isinstance(node, ast.ImportFrom) and node.level:  # from . import x / from .rows import y
            base = module.split(".")[: -node.level]
            mods = [".".join(base + ([node.module] if node.module else []))]
        for m in mods:
            out |= by_module.get(m, set())
            if isinstance(node, ast.ImportFrom):  # from gputop.tui import rows: the module rows
                for a in node.names:
                    out |= by_module.get(f"{m}.{a.name}", set())
    return out


@functools.lru_cache(maxsize=1)
def textual_all() -> frozenset[str]:
    return frozenset(n for names in textual_names().values() for n in names)


def base_privates(cls: type) -> set[str]:
    """The private names of ``cls``'s Textual bases (in their class dicts or assigned on self in their source)."""
    out: set[str] = set()
    names = textual_names()
    for base in inspect.getmro(cls):
        if base.__module__.split(".")[0] != "textual":
            continue
        out |= {n for n in vars(base) if _private(n)}
        out |= names.get((base.__module__, base.__qualname__), set())
    return out


def _private_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "textual" and any(p.startswith("_") for p in parts[1:])


def _str_arg(call: ast.Call, i: int) -> str | None:
    if len(call.args) > i and isinstance(call.args[i], ast.Constant) and isinstance(call.args[i].value, str):
        return call.args[i].value
    return None


def find(source: str, namespace: dict, where: str, module: str = "") -> list[str]:
    """Every use of a Textual private in ``source`` (module ``module``, whose classes are in ``namespace``),
    as "where:line what"."""
    tree = ast.parse(source)
    found: list[str] = []
    mine, theirs = ours(tree, module), textual_all()
    modules = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
               for a in n.names if a.name.split(".")[0] != "textual"}  # os, sys: not Textual's objects

    def flag(node: ast.AST, what: str) -> None:
        found.append(f"{where}:{node.lineno} {what}")

    def check(obj: ast.AST, name: str, node: ast.AST, privates: set[str] | None) -> None:
        if not _private(name):
            return
        is_self = (isinstance(obj, ast.Name) and obj.id in ("self", "cls")) or (
            isinstance(obj, ast.Call) and isinstance(obj.func, ast.Name) and obj.func.id == "super")
        if isinstance(obj, ast.Name) and obj.id in modules:
            return
        if is_self and privates is not None:  # in a class: ours, but for its Textual bases' privates
            if name in privates:
                flag(node, f"{name} (a private of a Textual base class)")
        elif name in theirs and name not in mine:
            flag(node, f"{name} (Textual's)")

    def visit(node: ast.AST, privates: set[str] | None) -> None:
        for child in ast.iter_child_nodes(node):
            p = privates
            if isinstance(child, ast.ClassDef):
                cls = namespace.get(child.name)
                p = base_privates(cls) if isinstance(cls, type) else set()
                for item in child.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in p:
                        flag(item, f"{item.name} (overrides a private of a Textual base class)")
            elif isinstance(child, ast.ImportFrom) and _private_module(child.module or ""):
                flag(child, f"import from {child.module}")
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if _private_module(alias.name):
                        flag(child, f"import {alias.name}")
            elif isinstance(child, ast.Attribute):
                check(child.value, child.attr, child, privates)
            elif isinstance(child, ast.Call):
                f = child.func
                if isinstance(f, ast.Name) and f.id in _ACCESSORS and (name := _str_arg(child, 1)):
                    check(child.args[0], name, child, privates)
                if (isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault")
                        and isinstance(f.value, ast.Attribute) and f.value.attr == "__dict__"
                        and (name := _str_arg(child, 0))):
                    check(f.value.value, name, child, privates)
            elif (isinstance(child, ast.Subscript) and isinstance(child.value, ast.Attribute)
                  and child.value.attr == "__dict__" and isinstance(child.slice, ast.Constant)
                  and isinstance(child.slice.value, str)):
                check(child.value.value, child.slice.value, child, privates)
            visit(child, p)

    visit(tree, None)
    return found


def find_in_package(package) -> list[str]:
    """Every use of a Textual private in the modules of ``package`` (e.g. gputop.tui)."""
    root = Path(package.__file__).parent
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        module = importlib.import_module(name)
        out += find(path.read_text(encoding="utf-8"), vars(module), str(path.relative_to(root)), name)
    return out
