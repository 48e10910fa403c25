"""Whether a process's names agree: its name (comm), argv[0]'s basename and its executable's basename.

A local user chooses all three (``prctl(PR_SET_NAME)``, ``exec -a``, a copy or a symlink of any binary), so a
name never proves what a program is. When they *disagree*, though, the process says one thing and runs
another: the rogue audit reports that (``disguised-name``), and a protect pattern never protects it
(gputop.core.orphans). One test, used by both.
"""

from __future__ import annotations

import os
import re

# Interpreters: a process running one is rightly named after its script (argv[1..]), and they are often
# installed under version managers' hidden directories (~/.pyenv, ~/.nvm, ...).
INTERPRETER = re.compile(r"^(?:python[\d.]*|pypy[\d.]*|node|nodejs|perl[\d.]*|ruby[\d.]*|java|php[\d.]*|"
                         r"lua[\d.]*|bash|sh|dash|zsh|R|Rscript|julia)$")


def exe_base(exe: str) -> str:
    """The basename of an executable path as /proc/PID/exe gives it (' (deleted)' dropped)."""
    if exe.endswith(" (deleted)"):
        exe = exe[: -len(" (deleted)")]
    return os.path.basename(exe)


def same_name(name: str, other: str) -> bool:
    a, b = name.lower(), other.lower()
    if not a or not b:
        return False
    return a == b or b.startswith(a) or a.startswith(b)  # comm is cut at 15 bytes; python3 vs python3.11


def agrees(name: str, base: str, cmdline: tuple[str, ...] | list[str]) -> bool:
    """Whether process name ``name`` agrees with ``base`` (an executable's or argv[0]'s basename): the same
    name, or ``base`` is an interpreter and ``name`` is that of the script it runs (argv[1] or argv[2])."""
    if same_name(name, base):
        return True
    if not INTERPRETER.match(base):
        return False
    scripts = [os.path.basename(a) for a in cmdline[1:3] if a and not a.startswith("-")]
    return any(same_name(name, s) for s in scripts)


def exe_mismatch(name: str, cmdline, exe: str) -> str | None:
    """The rogue audit's test: the process calls itself ``name`` but runs another executable. argv[0] is
    not consulted here: the process chooses it, so it never vouches for the name."""
    base = exe_base(exe)
    if agrees(name, base, cmdline):
        return None
    return f"the process calls itself {name!r} but runs {base!r}"


def disguise(name: str, cmdline, exe: str | None) -> str | None:
    """Why a process's names disagree (name vs argv[0]'s basename, and name vs its executable's basename
    where ``exe`` is known), or None. A login shell's leading '-' on argv[0] is not a disagreement."""
    if cmdline:
        argv0 = os.path.basename(cmdline[0]).lstrip("-")
        if argv0 and not agrees(name, argv0, cmdline):
            return f"its name {name!r} and argv[0] {argv0!r} disagree"
    if exe:
        why = exe_mismatch(name, cmdline or (), exe)
        if why is not None:
            return f"its name {name!r} and executable {exe_base(exe)!r} disagree"
    return None
