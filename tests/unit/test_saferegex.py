"""Patterns from requests, policies and configs are matched in bounded time (gputop.util.saferegex, RE2)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from gputop.util import saferegex
from gputop.core.config import load_config
from gputop.util.errors import UsageError
from gputop.guard.conditions import compare
from gputop.guard.policy import PolicyError, parse_policy
from gputop.core.orphans import compile_protect
from gputop.core.model import select_holders
from tests.tui.helpers import frozen_snapshot

EVIL = ["(.*)*Q", "(a+)+$", "(a|aa)+$", "(x+x+)+y", "(.*a){20}"]
TEXT = "a" * 5000 + "!"


@pytest.mark.parametrize("pattern", EVIL)
def test_catastrophic_patterns_match_in_linear_time(pattern):
    r = saferegex.compile(pattern, ignore_case=True)
    t = time.monotonic()
    for _ in range(10):
        r.search(TEXT)
    assert time.monotonic() - t < 2.0


@pytest.mark.parametrize("pattern,why", [
    (r"(a)\1", "backreferences"), ("foo(?=bar)", "lookaround"), ("(?<!x)y", "lookaround"),
    ("[", "missing ]"), ("x" * 5000, "at most 1024"),
])
def test_unboundable_or_bad_patterns_are_refused_with_a_reason(pattern, why):
    with pytest.raises(saferegex.PatternError, match=why.replace("]", r"\]")):
        saferegex.compile(pattern)


def test_the_text_searched_is_capped():
    r = saferegex.compile("END$")
    assert r.search("x" * 10 + "END")
    assert not r.search("x" * saferegex.MAX_TEXT + "END")  # past the cap: not searched


def test_request_filter_with_a_hostile_pattern_returns_at_once():
    snap = frozen_snapshot()
    evil = dataclasses.replace(snap.holders[0], proc=dataclasses.replace(snap.holders[0].proc, cmdline=(
        "python", "a" * 40 + "!")))
    snap = dataclasses.replace(snap, holders=(evil,) + snap.holders[1:])
    t = time.monotonic()
    assert select_holders(snap, name="(.*)*Q") == []
    assert select_holders(snap, name="(a+)+$") == []
    assert time.monotonic() - t < 2.0
    with pytest.raises(UsageError, match="backreferences"):
        select_holders(snap, name=r"(a)\1")


def test_policy_regex_is_bounded_and_unboundable_ones_are_refused_with_the_line():
    pol = parse_policy("rules:\n  - name: r\n    conditions:\n"
                       "      - {type: cmdline, operator: matches, value: '(a+)+$'}\n    action: log\n")
    cond = pol.rules[0].conditions[0]
    t = time.monotonic()
    assert compare(cond, "python " + "a" * 40 + "!") is False
    assert compare(cond, "python aaaa") is True
    assert time.monotonic() - t < 2.0
    with pytest.raises(PolicyError, match=r"line 4: rule 'r': .*lookaround"):
        parse_policy("rules:\n  - name: r\n    conditions:\n"
                     "      - {type: cmdline, operator: matches, value: 'x(?!y)'}\n    action: log\n")


def test_config_protect_patterns_are_bounded(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("protect: ['(a)\\1']\n")
    with pytest.raises(UsageError, match="backreferences"):
        load_config(cfg)
    r = compile_protect(["(a+)+$"])
    t = time.monotonic()
    assert not r.search("a" * 5000 + "!")
    assert time.monotonic() - t < 2.0
