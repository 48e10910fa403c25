"""Guard policies: YAML load and validation.

Every problem is reported with the file, the line and the rule it belongs to, for example::

    policy.yaml line 9: rule 'block-crypto-miners': condition 2: unknown operator '=>': use one of >, >=, ...

All problems in a file are collected, not only the first. Line numbers come from the composed YAML node
tree (``yaml.compose``), so they point at the offending key or value.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from gputop.guard.mig_place import parse_place
from gputop.util import safeyaml, saferegex
from gputop.util.errors import UsageError, type_name as _type_name
from gputop.util.timewindow import TimeWindow, parse_window  # noqa: F401 (part of this module's interface)
from gputop.util.units import parse_duration, parse_memory

NUMERIC_OPS = (">", ">=", "<", "<=", "==", "!=")
OPERATORS = (">", ">=", "<", "<=", "==", "!=", "contains", "contains_any", "matches", "in", "not_in")
ACTIONS = ("log", "notify", "kill", "reap")
MATCHES = ("all", "any")
SCOPES = ("process", "per_user")
SELECTS = ("newest", "largest")

# type -> (kind, allowed operators). kind decides how ``value`` is parsed.
CONDITION_TYPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "process_name": ("string", ("==", "!=", "contains", "contains_any", "matches", "in", "not_in")),
    "cmdline": ("string", ("==", "!=", "contains", "contains_any", "matches", "in", "not_in")),
    "user": ("string", ("==", "!=", "contains", "contains_any", "matches", "in", "not_in")),
    "gpu_utilization": ("percent", NUMERIC_OPS),
    "gpu_memory": ("memory", NUMERIC_OPS),
    "user_memory": ("memory", NUMERIC_OPS),
    "process_count": ("count", NUMERIC_OPS),
    "runtime": ("duration", NUMERIC_OPS),
    "orphan": ("bool", ("==", "!=")),
    "gpu": ("gpu", ("==", "!=", "in", "not_in")),
    "time_window": ("window", ("in", "not_in")),
    "standing": ("standing", ("==", "!=", "in", "not_in")),
    "allocation_idle": ("duration", NUMERIC_OPS),
    # The memory ledger (docs/memory-ledger.md): the bytes of the holder's GPU(s) no listed process accounts for.
    "unexplained_memory": ("memory", NUMERIC_OPS),
    # How the holder was found: "nvml", "fdinfo" or "device file" (its memory unknown).
    "source": ("string", ("==", "!=", "in", "not_in")),
}
# Conditions measured on a user rather than on one process: they make sense for scope: per_user.
USER_LEVEL = ("user_memory", "process_count", "user", "time_window")
LIMIT_TYPES = ("user_memory", "process_count")  # what "back under the limit" is measured by
# A rule with allocation_idle is evaluated on each allocated GPU, not on a process (docs/allocation.md):
# only these conditions apply to such a target, and it can only be logged or notified.
ALLOCATION_LEVEL = ("allocation_idle", "user", "time_window")
STANDING_VALUES = ("inside", "outside", "squatter", "unallocated")  # unknown never matches: not a value

TOP_KEYS = ("rules", "description", "version")
RULE_KEYS = ("name", "description", "conditions", "match", "action", "force", "timeout", "notify",
             "grace_period", "scope", "select", "repeat", "enabled")
CONDITION_KEYS = ("type", "operator", "value", "duration", "scope")
DEFAULT_REPEAT = 300.0  # while a rule keeps holding for a target, act again at most this often

_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_URL_RE = re.compile(r"^https?://[^\s/]+", re.IGNORECASE)


# ---- the model -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Condition:
    type: str
    operator: str
    value: object  # parsed: bytes, seconds, float, bool, tuple, compiled regex or TimeWindow
    raw: object  # as written
    duration: float | None = None
    scope: str | None = None
    line: int = 0

    def describe(self) -> str:
        raw = self.raw if not isinstance(self.raw, (list, tuple)) else list(self.raw)
        text = f"{self.type} {self.operator} {raw!r}"
        if self.duration:
            text += f" for {_fmt_secs(self.duration)}"
        return text


@dataclass(frozen=True)
class Rule:
    name: str
    conditions: tuple[Condition, ...]
    action: str
    description: str = ""
    match: str = "all"
    force: bool = False
    timeout: float | None = None  # TERM -> KILL wait; None: the config's kill_timeout
    notify: tuple[str, ...] = ()
    grace_period: float | None = None
    scope: str = "process"
    select: str = "newest"
    repeat: float = DEFAULT_REPEAT
    enabled: bool = True
    line: int = 0

    @property
    def per_user(self) -> bool:
        return self.scope == "per_user"

    @property
    def per_allocation(self) -> bool:
        """Evaluated on each allocated GPU (an allocation_idle condition), not on a process."""
        return any(c.type == "allocation_idle" for c in self.conditions)


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]
    path: str | None = None
    description: str = ""

    def rule(self, name: str) -> Rule | None:
        for r in self.rules:
            if r.name == name:
                return r
        return None


@dataclass(frozen=True)
class Issue:
    line: int | None
    rule: str | None
    message: str

    def format(self, source: str) -> str:
        where = f"{source} line {self.line}" if self.line else source
        who = f"rule '{self.rule}': " if self.rule else ""
        return f"{where}: {who}{self.message}"


class PolicyError(UsageError):
    """An invalid policy. ``issues`` lists every problem; str() gives one line per problem."""

    def __init__(self, issues: list[Issue], source: str):
        self.issues = issues
        self.source = source
        super().__init__("\n".join(i.format(source) for i in issues))

    @property
    def first(self) -> Issue:
        return self.issues[0]


# ---- YAML with line numbers ------------------------------------------------------------------

class _Map(dict):
    line: int = 0

    def __init__(self):
        super().__init__()
        self.key_lines: dict = {}


class _Seq(list):
    line: int = 0

    def __init__(self):
        super().__init__()
        self.item_lines: list[int] = []


def _convert(node: yaml.Node, loader: yaml.SafeLoader, issues: list[Issue]):
    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        m = _Map()
        m.line = line
        for knode, vnode in node.value:
            if not isinstance(knode, yaml.ScalarNode):
                issues.append(Issue(knode.start_mark.line + 1, None, "a key must be a plain word"))
                continue
            key = loader.construct_object(knode, deep=True)
            if not isinstance(key, str):
                key = str(key)
            if key in m:
                issues.append(Issue(knode.start_mark.line + 1, None, f"duplicate key '{key}'"))
            m[key] = _convert(vnode, loader, issues)
            m.key_lines[key] = knode.start_mark.line + 1
        return m
    if isinstance(node, yaml.SequenceNode):
        s = _Seq()
        s.line = line
        for item in node.value:
            s.append(_convert(item, loader, issues))
            s.item_lines.append(item.start_mark.line + 1)
        return s
    return loader.construct_object(node, deep=True)


def _compose(text: str, source: str):
    issues: list[Issue] = []
    try:
        # Bounded: size, node count, alias expansion and depth are capped while composing (billion laughs).
        loader = safeyaml.BoundedLoader(text)  # the reader rejects control characters (e.g. NUL) right here
    except safeyaml.YamlLimitError as e:
        raise PolicyError([Issue(None, None, f"invalid policy: {e}")], source) from None
    except yaml.YAMLError as e:
        raise PolicyError([Issue(None, None, f"not a YAML text file: {str(e).splitlines()[0]}")], source) from None
    try:
        node = loader.get_single_node()
        data = _convert(node, loader, issues) if node is not None else None
    except safeyaml.YamlLimitError as e:
        raise PolicyError([Issue(None, None, f"invalid policy: {e}")], source) from None
    except RecursionError:
        raise PolicyError([Issue(None, None, "YAML nesting too deep (a recursive alias?)")], source) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = e.problem or e.context or "invalid YAML"
        raise PolicyError([Issue(line, None, f"YAML syntax error: {problem}")], source) from None
    except yaml.YAMLError as e:
        raise PolicyError([Issue(None, None, f"YAML error: {e}")], source) from None
    finally:
        loader.dispose()
    return data, issues


# ---- validation ------------------------------------------------------------------------------

def _fmt_secs(s: float) -> str:
    if s >= 3600 and s % 3600 == 0:
        return f"{int(s // 3600)}h"
    if s >= 60 and s % 60 == 0:
        return f"{int(s // 60)}m"
    return f"{s:g}s"


class _Ctx:
    """Collects issues for one rule, with the rule's name."""

    def __init__(self, issues: list[Issue], rule: str | None):
        self.issues = issues
        self.rule = rule
        self.count = 0

    def err(self, line: int | None, message: str) -> None:
        self.issues.append(Issue(line, self.rule, message))
        self.count += 1


def _line(m, key: str, default: int = 0) -> int:
    return getattr(m, "key_lines", {}).get(key, getattr(m, "line", default))


def _finite(value: object, what: str) -> object:
    """Refuse .inf and .nan (YAML floats) with a message that says what to write."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value}: write a number, a size such as 8GiB "
                         "or a duration such as 5m")
    return value


def _parse_value(kind: str, op: str, value: object, ctype: str):
    """Return the parsed value or raise ValueError with a message that says what to write."""
    _finite(value, ctype)
    listy = op in ("contains_any", "in", "not_in")
    if kind == "string":
        return _parse_string(op, value, ctype, listy)
    if kind == "percent":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{ctype} needs a number of percent (0-100), got {_type_name(value)}")
        if not 0 <= value <= 100:
            raise ValueError(f"{ctype} must be between 0 and 100, got {value}")
        return float(value)
    if kind == "memory":
        if isinstance(value, (list, dict)) or value is None or isinstance(value, bool):
            raise ValueError(f"{ctype} needs a memory size (bytes, or a unit such as 8GiB, 8GB), "
                             f"got {_type_name(value)}")
        return parse_memory(value)
    if kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{ctype} needs a whole number of processes, got {_type_name(value)}")
        return value
    if kind == "duration":
        if isinstance(value, (list, dict)) or value is None:
            raise ValueError(f"{ctype} needs a duration such as 30s, 5m, 2h; got {_type_name(value)}")
        return parse_duration(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{ctype} needs true or false, got {_type_name(value)}")
        return value
    if kind == "gpu":
        return _parse_gpu(op, value, listy)
    if kind == "window":
        return parse_window(value)
    if kind == "standing":
        return _parse_standing(op, value)
    raise ValueError(f"internal: unknown kind {kind}")  # pragma: no cover


def _parse_string(op: str, value: object, ctype: str, listy: bool):
    """A string condition's value: a tuple of strings for a list operator, a bounded regex for matches."""
    if listy:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(x, (str, int)) and
                                                               not isinstance(x, bool) for x in value):
            raise ValueError(f"{ctype} {op} needs a non-empty list of strings, got {_type_name(value)}")
        return tuple(str(x) for x in value)
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise ValueError(f"{ctype} {op} needs a string, got {_type_name(value)}")
    if op == "matches":
        try:  # bounded (RE2): a command line is chosen by another user
            return saferegex.compile(str(value))
        except saferegex.PatternError as e:
            raise ValueError(f"bad regex {value!r}: {e}") from None
    return str(value)


def _parse_gpu(op: str, value: object, listy: bool):
    """A gpu condition's value: a place, or a tuple of places for a list operator (gputop.guard.mig_place)."""
    if listy:
        if isinstance(value, (int, str)) and not isinstance(value, bool):
            value = [value]
        try:  # GPU indexes, or MIG devices ("0:GI5", "0:GI5/CI0", "MIG-..."): gputop.guard.mig_place
            if not isinstance(value, list) or not value:
                raise ValueError
            return tuple(parse_place(x) for x in value)
        except ValueError:
            raise ValueError(f"gpu {op} needs a list of GPU indexes such as [0, 1] (or MIG devices such as "
                             f"'0:GI5'), got {_type_name(value)}") from None
    try:
        return parse_place(value)
    except ValueError as e:
        raise ValueError(f"gpu {op} needs {e}, got {_type_name(value)}") from None


def _parse_standing(op: str, value: object) -> object:
    """standing == squatter, or standing in [squatter, outside]."""
    values = value if op in ("in", "not_in") else [value]
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v in STANDING_VALUES
                                                              for v in values):
        what = "a list of" if op in ("in", "not_in") else "one of"
        raise ValueError(f"standing {op} needs {what} {', '.join(STANDING_VALUES)}; got {_type_name(value)}")
    return tuple(values) if op in ("in", "not_in") else value


def _condition(c: object, idx: int, line: int, ctx: _Ctx) -> Condition | None:
    where = f"condition {idx}"
    if not isinstance(c, dict):
        ctx.err(line, f"{where}: expected a mapping with type, operator and value, got {_type_name(c)}")
        return None
    before = ctx.count
    for k in c:
        if k not in CONDITION_KEYS:
            ctx.err(_line(c, k, line), f"{where}: unknown key '{k}': use one of {', '.join(CONDITION_KEYS)}")
    for k in ("type", "operator", "value"):
        if k not in c:
            ctx.err(getattr(c, "line", line), f"{where}: missing field '{k}'")
    ctype, op = c.get("type"), c.get("operator")
    kind = allowed = None
    if "type" in c:
        if ctype not in CONDITION_TYPES:
            ctx.err(_line(c, "type", line), f"{where}: unknown condition type {ctype!r}: use one of "
                                            f"{', '.join(CONDITION_TYPES)}")
        else:
            kind, allowed = CONDITION_TYPES[ctype]
    if "operator" in c:
        if op not in OPERATORS:
            ctx.err(_line(c, "operator", line), f"{where}: unknown operator {op!r}: use one of "
                                                f"{', '.join(OPERATORS)}")
            op = None
        elif allowed is not None and op not in allowed:
            ctx.err(_line(c, "operator", line), f"{where}: operator '{op}' does not apply to {ctype}: "
                                                f"use one of {', '.join(allowed)}")
            op = None
    value = None
    if kind and op and "value" in c:
        try:
            value = _parse_value(kind, op, c["value"], ctype)
        except ValueError as e:
            ctx.err(_line(c, "value", line), f"{where}: {e}")
    duration = None
    if "duration" in c:
        try:
            if isinstance(c["duration"], (list, dict)) or c["duration"] is None:
                raise ValueError(f"bad duration {c['duration']!r}: use seconds or a unit such as 30s, 5m, 2h")
            duration = parse_duration(_finite(c["duration"], "duration"))
        except ValueError as e:
            ctx.err(_line(c, "duration", line), f"{where}: {e}")
    scope = c.get("scope")
    if "scope" in c and scope not in SCOPES:
        ctx.err(_line(c, "scope", line), f"{where}: bad scope {scope!r}: use process or per_user")
    if ctx.count != before:
        return None
    raw = c["value"]
    return Condition(ctype, op, value, tuple(raw) if isinstance(raw, list) else raw, duration, scope,
                     getattr(c, "line", line))


def _notify_targets(v: object, line: int, ctx: _Ctx) -> tuple[str, ...]:
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list):
        ctx.err(line, f"notify must be a list of e-mail addresses, http(s) URLs or 'log', got {_type_name(v)}")
        return ()
    out = []
    for t in items:
        if not isinstance(t, str) or not (t == "log" or _EMAIL_RE.match(t) or _URL_RE.match(t)):
            ctx.err(line, f"bad notify target {t!r}: use an e-mail address, an http(s):// URL or 'log'")
            continue
        out.append(t)
    return tuple(out)


def _rule(r: object, idx: int, line: int, issues: list[Issue], names: set[str]) -> Rule | None:
    name = r.get("name") if isinstance(r, dict) else None
    label = name if isinstance(name, str) and name.strip() else f"rules[{idx}]"
    ctx = _Ctx(issues, label)
    if not isinstance(r, dict):
        ctx.err(line, f"expected a mapping with name, conditions and action, got {_type_name(r)}")
        return None
    rline = getattr(r, "line", line)
    for k in r:
        if k not in RULE_KEYS:
            ctx.err(_line(r, k, rline), f"unknown key '{k}': use one of {', '.join(RULE_KEYS)}")
    for k in ("name", "conditions", "action"):
        if k not in r:
            ctx.err(rline, f"missing field '{k}'")
    _rule_name(r, name, rline, ctx, names)
    conds = _rule_conditions(r, rline, ctx)
    choice = _rule_choices(r, rline, ctx, ("action", "match", "force", "enabled"))
    durations = _rule_durations(r, rline, ctx)
    choice.update(_rule_choices(r, rline, ctx, ("description",)))
    notify = _rule_notify(r, choice["action"], rline, ctx)
    choice.update(_rule_choices(r, rline, ctx, ("scope", "select")))
    scope = _rule_scope(conds, choice["scope"], rline, ctx)
    _rule_allocation(conds, choice["action"], scope, rline, ctx)
    if ctx.count:
        return None
    return Rule(
        name=name, conditions=tuple(conds), action=choice["action"], description=choice["description"],
        match=choice["match"], force=choice["force"], timeout=durations.get("timeout"), notify=notify,
        grace_period=durations.get("grace_period") or None, scope=scope, select=choice["select"],
        repeat=durations.get("repeat", DEFAULT_REPEAT), enabled=choice["enabled"], line=rline,
    )


def _rule_name(r: dict, name, rline: int, ctx: _Ctx, names: set[str]) -> None:
    if "name" not in r:
        return
    if not isinstance(name, str) or not name.strip():
        ctx.err(_line(r, "name", rline), f"name must be a non-empty string, got {_type_name(name)}")
    elif name in names:
        ctx.err(_line(r, "name", rline), f"duplicate rule name '{name}'")
    else:
        names.add(name)


def _rule_conditions(r: dict, rline: int, ctx: _Ctx) -> list[Condition]:
    conds: list[Condition] = []
    if "conditions" not in r:
        return conds
    cs = r["conditions"]
    if not isinstance(cs, list) or not cs:
        ctx.err(_line(r, "conditions", rline), "conditions must be a non-empty list")
        return conds
    for i, c in enumerate(cs, 1):
        cl = cs.item_lines[i - 1] if isinstance(cs, _Seq) else rline
        cond = _condition(c, i, cl, ctx)
        if cond is not None:
            conds.append(cond)
    return conds


# key: (default, the values allowed, how the error names them); a type for a bool or a string field
_CHOICES = {
    "action": (None, ACTIONS, "one of " + ", ".join(ACTIONS)),
    "match": ("all", MATCHES, "all or any"),
    "scope": ("process", SCOPES, "process or per_user"),
    "select": ("newest", SELECTS, "newest or largest"),
    "force": (False, bool, "true or false"),
    "enabled": (True, bool, "true or false"),
    "description": ("", str, "a string"),
}


def _rule_choices(r: dict, rline: int, ctx: _Ctx, keys: tuple[str, ...]) -> dict:
    """The rule's one-of and typed fields ``keys``, each with its default; an error for each bad one."""
    out = {}
    for key in keys:
        default, allowed, words = _CHOICES[key]
        value = out[key] = r.get(key, default)
        if key not in r:
            continue
        if isinstance(allowed, type):
            if not isinstance(value, allowed):
                ctx.err(_line(r, key, rline), f"{key} must be {words}, got {_type_name(value)}")
        elif value not in allowed:
            ctx.err(_line(r, key, rline), f"bad {key} {value!r}: use {words}")
    return out


def _rule_durations(r: dict, rline: int, ctx: _Ctx) -> dict[str, float | None]:
    durations: dict[str, float | None] = {}
    for key in ("timeout", "grace_period", "repeat"):
        if key in r:
            try:
                if isinstance(r[key], (list, dict)) or r[key] is None:
                    raise ValueError(f"bad duration {r[key]!r}: use seconds or a unit such as 30s, 5m, 2h")
                durations[key] = parse_duration(_finite(r[key], key))
            except ValueError as e:
                ctx.err(_line(r, key, rline), f"{key}: {e}")
    return durations


def _rule_notify(r: dict, action, rline: int, ctx: _Ctx) -> tuple:
    notify = _notify_targets(r["notify"], _line(r, "notify", rline), ctx) if "notify" in r else ()
    if action == "notify" and "notify" in r and not notify and ctx.count == 0:
        ctx.err(_line(r, "notify", rline), "action notify needs at least one notify target")
    elif action == "notify" and "notify" not in r:
        ctx.err(_line(r, "action", rline), "action notify needs a 'notify' list (e-mail addresses, URLs, 'log')")
    return notify


def _rule_scope(conds: list[Condition], scope, rline: int, ctx: _Ctx):
    if any(c.scope == "per_user" for c in conds):
        scope = "per_user"
    if scope == "per_user" and conds and not any(c.type in LIMIT_TYPES for c in conds):
        ctx.err(rline, "scope per_user needs a user_memory or process_count condition (the limit to get "
                       "the user back under)")
    return scope


def _rule_allocation(conds: list[Condition], action, scope, rline: int, ctx: _Ctx) -> None:
    """A rule on idle allocations is about a GPU, not a process: it only logs or notifies."""
    if not any(c.type == "allocation_idle" for c in conds):
        return
    other = sorted({c.type for c in conds if c.type not in ALLOCATION_LEVEL})
    if other:
        ctx.err(rline, f"allocation_idle is measured on an allocated GPU, not on a process: it combines only "
                       f"with {', '.join(ALLOCATION_LEVEL)}, not {', '.join(other)}")
    if action not in (None, "log", "notify"):
        ctx.err(rline, f"allocation_idle rules can only log or notify (an idle allocation has no process to "
                       f"{action}); use action: notify")
    if scope == "per_user":
        ctx.err(rline, "allocation_idle rules are evaluated per allocated GPU: drop scope per_user")


def parse_policy(text: str, source: str = "policy") -> Policy:
    """Parse and validate policy text. Raises PolicyError listing every problem."""
    data, issues = _compose(text, source)
    if data is None:
        raise PolicyError([Issue(1, None, "empty policy: add a 'rules:' list (see examples/policy.yaml)")],
                          source)
    if not isinstance(data, dict):
        raise PolicyError([Issue(getattr(data, "line", 1), None,
                                 f"expected a mapping with 'rules:' at the top, got {_type_name(data)}")], source)
    for k in data:
        if k not in TOP_KEYS:
            issues.append(Issue(_line(data, k), None, f"unknown top-level key '{k}': use one of "
                                                      f"{', '.join(TOP_KEYS)}"))
    rules_raw = data.get("rules")
    rules: list[Rule] = []
    if "rules" not in data:
        issues.append(Issue(data.line, None, "missing field 'rules'"))
    elif rules_raw is None:
        issues.append(Issue(_line(data, "rules"), None, "empty rules: 'rules:' has no rules under it"))
    elif not isinstance(rules_raw, list):
        issues.append(Issue(_line(data, "rules"), None, f"'rules' must be a list, got {_type_name(rules_raw)}"))
    elif not rules_raw:
        issues.append(Issue(_line(data, "rules"), None, "empty rules: the policy has no rules"))
    else:
        names: set[str] = set()
        for i, r in enumerate(rules_raw):
            rule = _rule(r, i, rules_raw.item_lines[i], issues, names)
            if rule is not None:
                rules.append(rule)
    desc = data.get("description", "")
    if issues:
        issues.sort(key=lambda i: (i.line or 0))
        raise PolicyError(issues, source)
    return Policy(tuple(rules), None, desc if isinstance(desc, str) else "")


def load_policy(path: str | os.PathLike) -> Policy:
    """Read and validate a policy file. Raises PolicyError (a UsageError, exit code 2)."""
    from gputop.util import trustfile

    p = Path(os.path.expanduser(str(path)))
    try:  # a regular file only (a FIFO must not block the daemon), and at most safeyaml.MAX_BYTES;
        # as root, only a file only root can change (gputop.util.trustfile)
        text = trustfile.read_text(p, "policy")
    except trustfile.UntrustedFile as e:
        raise PolicyError([Issue(None, None, f"policy refused: {e.problem}; {e.fix}")], str(p)) from None
    except ValueError as e:
        raise PolicyError([Issue(None, None, f"invalid policy: {e}")], str(p)) from None
    except FileNotFoundError:
        raise PolicyError([Issue(None, None, "policy file does not exist: check the path "
                                             "(see examples/policy.yaml)")], str(p)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError([Issue(None, None, f"cannot read the policy file: {getattr(e, 'strerror', None) or e}")],
                          str(p)) from None
    pol = parse_policy(text, str(p))
    return Policy(pol.rules, str(p), pol.description)
