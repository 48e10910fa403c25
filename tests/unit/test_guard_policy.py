"""Guard policy loading: the brief's policy loads exactly as written; every kind of invalid policy is
reported with the file, the line and the rule name; a bad policy is exit code 2 (UsageError)."""

from __future__ import annotations

import datetime as dt
import textwrap

import pytest

from gputop.util.errors import EXIT_USAGE
from gputop.guard.policy import PolicyError, load_policy, parse_policy, parse_window
from tests.conftest import ROOT

BRIEF = (ROOT / "examples" / "policy.yaml").read_text()


def test_brief_policy_is_shipped_verbatim_and_loads_exactly():
    assert BRIEF.startswith("rules:\n  - name: \"block-crypto-miners\"")
    pol = load_policy(ROOT / "examples" / "policy.yaml")
    miners, memory = pol.rules
    assert miners.name == "block-crypto-miners" and miners.action == "kill" and miners.force is True
    assert miners.notify == ("admin@company.com",) and miners.match == "all" and miners.scope == "process"
    name, util = miners.conditions
    assert (name.type, name.operator, name.value) == ("process_name", "contains_any",
                                                     ("xmrig", "ethminer", "cpuminer"))
    assert (util.type, util.operator, util.value, util.duration) == ("gpu_utilization", ">", 95.0, 300.0)
    assert memory.name == "limit-user-memory" and memory.force is False and memory.grace_period == 30.0
    (um,) = memory.conditions
    assert (um.type, um.operator, um.value, um.scope) == ("user_memory", ">", 8 * 1024**3, "per_user")
    assert memory.per_user and memory.select == "newest"


def test_units_durations_and_windows():
    pol = parse_policy(textwrap.dedent("""\
        rules:
          - name: big
            match: any
            conditions:
              - {type: gpu_memory, operator: ">=", value: 8GiB}
              - {type: user_memory, operator: ">", value: 8GB}
              - {type: runtime, operator: ">", value: 2h}
              - {type: gpu_utilization, operator: ">", value: 50, duration: 90s}
              - {type: time_window, operator: in, value: {hours: "22:00-06:00", weekdays: mon-fri}}
            action: log
            repeat: 1m
    """))
    c = pol.rules[0].conditions
    assert c[0].value == 8 * 1024**3 and c[1].value == 8 * 1000**3 and c[2].value == 7200.0
    assert c[3].duration == 90.0 and pol.rules[0].repeat == 60.0
    w = c[4].value
    assert w.contains(dt.datetime(2026, 11, 30, 23, 0))  # Monday 23:00
    assert w.contains(dt.datetime(2026, 12, 1, 5, 59))  # Tuesday 05:59: Monday night's window
    assert not w.contains(dt.datetime(2026, 11, 30, 12, 0))  # Monday noon
    assert not w.contains(dt.datetime(2026, 12, 5, 23, 0))  # Saturday night
    assert not w.contains(dt.datetime(2026, 11, 30, 5, 0))  # Monday 05:00 belongs to Sunday night
    assert parse_window({"weekdays": ["sat", "sunday"]}).weekdays == (5, 6)


RULE_HEAD = """\
rules:
  - name: ok-rule
    conditions:
      - {type: process_name, operator: contains, value: xmrig}
    action: log
  - name: bad-rule
"""

# (kind, text appended after the bad rule's name, expected line, expected message fragment)
INVALID = [
    ("unknown condition type",
     "    conditions:\n      - type: gpu_temperature\n        operator: '>'\n        value: 80\n    action: kill\n",
     8, "unknown condition type 'gpu_temperature'"),
    ("unknown operator",
     "    conditions:\n      - type: gpu_utilization\n        operator: '=>'\n        value: 80\n    action: kill\n",
     9, "unknown operator '=>'"),
    ("operator not for this type",
     "    conditions:\n      - type: gpu_utilization\n        operator: contains\n        value: 80\n    action: kill\n",
     9, "operator 'contains' does not apply to gpu_utilization"),
    ("bad duration",
     "    conditions:\n      - type: gpu_utilization\n        operator: '>'\n        value: 80\n"
     "        duration: 5 minutes\n    action: kill\n", 11, "bad duration '5 minutes'"),
    ("wrong value type",
     "    conditions:\n      - type: gpu_utilization\n        operator: '>'\n        value: high\n    action: kill\n",
     10, "needs a number of percent"),
    ("unknown key",
     "    conditions:\n      - {type: orphan, operator: '==', value: true}\n    action: kill\n    forse: true\n",
     10, "unknown key 'forse'"),
    ("missing field",
     "    conditions:\n      - {type: orphan, operator: '=='}\n    action: kill\n", 8, "missing field 'value'"),
    ("missing action",
     "    conditions:\n      - {type: orphan, operator: '==', value: true}\n", 6, "missing field 'action'"),
    ("bad action",
     "    conditions:\n      - {type: orphan, operator: '==', value: true}\n    action: explode\n",
     9, "bad action 'explode'"),
    ("bad regex",
     "    conditions:\n      - {type: cmdline, operator: matches, value: 'miner(['}\n    action: kill\n",
     8, "bad regex 'miner(['"),
    ("bad memory unit",
     "    conditions:\n      - {type: gpu_memory, operator: '>', value: 8XB}\n    action: kill\n",
     8, "bad memory size '8XB'"),
    ("bad notify target",
     "    conditions:\n      - {type: orphan, operator: '==', value: true}\n    action: kill\n"
     "    notify: [admin-at-company]\n", 10, "bad notify target 'admin-at-company'"),
    ("bad time window",
     "    conditions:\n      - {type: time_window, operator: in, value: {hours: '25-99'}}\n    action: log\n",
     8, "bad hours '25-99'"),
    ("per_user without a limit",
     "    scope: per_user\n    conditions:\n      - {type: process_name, operator: contains, value: x}\n"
     "    action: kill\n", 6, "scope per_user needs a user_memory or process_count condition"),
    ("empty conditions", "    conditions: []\n    action: kill\n", 7, "conditions must be a non-empty list"),
    ("bad force type",
     "    conditions:\n      - {type: orphan, operator: '==', value: true}\n    action: kill\n    force: yes please\n",
     10, "force must be true or false"),
]


@pytest.mark.parametrize("kind,body,line,fragment", INVALID, ids=[k for k, *_ in INVALID])
def test_invalid_policy_names_rule_and_line(tmp_path, kind, body, line, fragment):
    path = tmp_path / "policy.yaml"
    path.write_text(RULE_HEAD + body)
    with pytest.raises(PolicyError) as ei:
        load_policy(path)
    err = ei.value
    assert err.exit_code == EXIT_USAGE
    msg = str(err)
    assert f"{path} line {line}: rule 'bad-rule': " in msg, msg
    assert fragment in msg, msg
    assert "ok-rule" not in msg  # the valid rule is not blamed


def test_yaml_syntax_error_has_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("rules:\n  - name: x\n    conditions: [\n      {type: orphan\n    action: kill\n")
    with pytest.raises(PolicyError) as ei:
        load_policy(path)
    assert "YAML syntax error" in str(ei.value) and f"{path} line " in str(ei.value)
    assert ei.value.first.line is not None and ei.value.first.line >= 4


@pytest.mark.parametrize("text,fragment", [
    ("", "empty policy"),
    ("rules: []\n", "empty rules"),
    ("rules:\n", "empty rules"),
    ("version: 1\n", "missing field 'rules'"),
    ("rulez: []\n", "unknown top-level key 'rulez'"),
    ("- a\n- b\n", "expected a mapping with 'rules:'"),
    ('rules:\n  - name: "a\0b"\n', "not a YAML text file"),
    ("a: &x [*x]\nrules: *x\n", "recursive alias"),
])
def test_top_level_problems(text, fragment):
    with pytest.raises(PolicyError) as ei:
        parse_policy(text, "p.yaml")
    assert fragment in str(ei.value)


def test_every_problem_is_listed_and_duplicates_are_caught():
    text = textwrap.dedent("""\
        rules:
          - name: twin
            conditions:
              - {type: foo, operator: '>', value: 1}
            action: kill
          - name: twin
            conditions:
              - {type: orphan, operator: '==', value: maybe}
            action: kill
    """)
    with pytest.raises(PolicyError) as ei:
        parse_policy(text, "p.yaml")
    lines = str(ei.value).splitlines()
    assert lines[0].startswith("p.yaml line 4: rule 'twin': condition 1: unknown condition type 'foo'")
    assert any("line 6: rule 'twin': duplicate rule name 'twin'" in ln for ln in lines)
    assert any("line 8: rule 'twin': condition 1: orphan needs true or false" in ln for ln in lines)


def test_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(PolicyError) as ei:
        load_policy(tmp_path / "nope.yaml")
    assert "does not exist" in str(ei.value) and ei.value.exit_code == EXIT_USAGE


@pytest.mark.parametrize("cond,extra,line,fragment", [
    ("{type: gpu_memory, operator: '>', value: .inf}", "", 4, "gpu_memory must be a finite number, got inf"),
    ("{type: gpu_utilization, operator: '>', value: .nan}", "", 4, "gpu_utilization must be a finite number"),
    ("{type: runtime, operator: '>', value: 5, duration: .nan}", "", 4, "duration must be a finite number"),
    ("{type: orphan, operator: '==', value: true}", "    timeout: .inf\n", 6, "timeout must be a finite number"),
])
def test_non_finite_numbers_are_rejected_with_the_line(cond, extra, line, fragment):
    text = f"rules:\n  - name: r\n    conditions:\n      - {cond}\n    action: kill\n{extra}"
    with pytest.raises(PolicyError) as ei:
        parse_policy(text)
    assert f"line {line}: rule 'r': " in str(ei.value) and fragment in str(ei.value), str(ei.value)
    assert "Traceback" not in str(ei.value)
