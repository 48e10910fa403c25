"""User configuration (YAML) and the XDG paths gputop uses.

Lookup order for the user's config file: ``--config``, ``$GPUTOP_CONFIG``, ``<XDG config>/gputop/config.yaml``.
The node's file ``/etc/gputop/config.yaml`` (``$GPUTOP_SYSTEM_CONFIG``) is read first and merged: a user
may add protections but not remove the node's, and the node's ``guard`` settings win (see ``_merge``).
Unknown keys are an error naming the file and line.
State (audit log, guard state) lives in ``$GPUTOP_STATE_DIR`` or ``<XDG state>/gputop``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from gputop.util import saferegex
from gputop.util.errors import UsageError
from gputop.core.defaults import DEFAULT_MAX_CHAIN, DEFAULT_PROTECT, DEFAULT_PROTECT_CMDLINE
from gputop.util.units import parse_duration


def config_path(explicit: str | None = None) -> Path:
    if explicit:
        return Path(explicit)
    env = os.environ.get("GPUTOP_CONFIG")
    if env:
        return Path(env)
    return Path(platformdirs.user_config_dir("gputop")) / "config.yaml"


def state_dir() -> Path:
    env = os.environ.get("GPUTOP_STATE_DIR")
    return Path(env) if env else Path(platformdirs.user_state_dir("gputop"))


NODE_GUARD_DIR = Path("/var/lib/gputop")


def guard_dir() -> Path:
    """Where the guard's shared state lives (mode, policy path, hits, daemon status).

    The guard is node-wide: the service (packaging/gputop-guard.service) keeps it in /var/lib/gputop, and
    every TUI, CLI, API or MCP server on the node must read and switch the same files. So: $GPUTOP_STATE_DIR
    when set, else /var/lib/gputop when it exists, else the user's own state dir."""
    if os.environ.get("GPUTOP_STATE_DIR"):
        return state_dir()
    if NODE_GUARD_DIR.is_dir():
        return NODE_GUARD_DIR
    return state_dir()


@dataclass(frozen=True)
class Config:
    """The configuration: the node's file merged with the user's (see the module docstring); immutable."""

    protect: tuple[str, ...] = DEFAULT_PROTECT  # case-insensitive regexes over name and argv[0]'s basename (no '/')
    protect_cmdline: tuple[str, ...] = DEFAULT_PROTECT_CMDLINE  # regexes over the whole command line
    nohup_protects: bool = True  # a chain member that ignores SIGHUP counts as protected
    max_chain: int = DEFAULT_MAX_CHAIN
    reap_interval: float = 60.0  # seconds between watchdog scans
    reap_grace: float = 60.0  # seconds a tree must stay orphaned before the watchdog reaps it
    kill_timeout: float = 5.0  # seconds to wait after SIGTERM
    audit_log: str | None = None  # default: <state dir>/audit.jsonl
    interval: float = 1.0  # TUI refresh
    extra: dict = field(default_factory=dict, compare=False)  # sections owned by other modules

    def audit_log_path(self) -> Path:
        if self.audit_log:
            return Path(os.path.expanduser(self.audit_log))
        env = os.environ.get("GPUTOP_AUDIT_LOG")
        return Path(env) if env else state_dir() / "audit.jsonl"


# Every key a config file may hold. A leaf is None; a section is a dict of its keys; OPEN marks a section
# whose module checks its own keys (rogue.AuditConfig checks 'audit'). To add a key: add it here (and to
# Config, or read it from Config.extra in its module).
OPEN = "open"
SCHEMA: dict = {
    "protect": None, "protect_cmdline": None, "nohup_protects": None, "max_chain": None,
    "reap_interval": None, "reap_grace": None, "kill_timeout": None, "audit_log": None, "interval": None,
    "reap": {"interval": None, "grace": None, "protect": None, "protect_cmdline": None},
    "guard": {"policy": None, "policy_file": None, "interval": None,
              "smtp": {"host": None, "port": None, "ssl": None, "starttls": None, "from": None,
                       "username": None, "password_env": None},
              "exempt": {"users": None, "groups": None, "units": None, "cgroups": None, "executables": None}},
    "audit": OPEN,
}
_NESTED = {"reap": {"interval": "reap_interval", "grace": "reap_grace", "protect": "protect",
                    "protect_cmdline": "protect_cmdline"}}
_FLAT = {k for k, v in SCHEMA.items() if v is None}
MAX_CONFIG_BYTES = 1024 * 1024
SYSTEM_CONFIG = Path("/etc/gputop/config.yaml")


def system_config_path() -> Path:
    """The node's config (``$GPUTOP_SYSTEM_CONFIG``, default /etc/gputop/config.yaml)."""
    env = os.environ.get("GPUTOP_SYSTEM_CONFIG")
    return Path(env) if env else SYSTEM_CONFIG


def _unknown_keys(node, schema: dict, prefix: str, p: Path) -> None:
    """Raise UsageError (file, line, the key and a guess) for the first key the schema does not know."""
    import difflib

    import yaml

    if not isinstance(node, yaml.MappingNode):
        return
    for knode, vnode in node.value:
        if not isinstance(knode, yaml.ScalarNode):
            continue
        key = str(knode.value).replace("-", "_")
        if key not in schema:
            close = difflib.get_close_matches(key, list(schema), n=1, cutoff=0.6)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else f"known: {', '.join(sorted(schema))}"
            raise UsageError(f"config file {p} line {knode.start_mark.line + 1}: unknown key "
                             f"'{prefix}{knode.value}': {hint}")
        if isinstance(schema[key], dict):
            _unknown_keys(vnode, schema[key], f"{prefix}{key}.", p)


def _key_lines(node, prefix: str = "", out: dict | None = None) -> dict[str, int]:
    """``{"reap.grace": 3, ...}``: the line (1-based) of each key of a mapping, nested ones dotted."""
    import yaml

    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for knode, vnode in node.value:
            if isinstance(knode, yaml.ScalarNode):
                key = f"{prefix}{str(knode.value).replace('-', '_')}"
                out[key] = knode.start_mark.line + 1
                _key_lines(vnode, key + ".", out)
    return out


def _read_yaml(p: Path) -> tuple[dict, dict[str, int]]:
    """The file's top-level mapping, every key checked against SCHEMA, and the line of each key
    (_key_lines). Bad content raises UsageError."""
    import yaml  # only when there is a file: it costs ~10 ms of start-up

    from gputop.util import safeyaml, trustfile

    try:  # a regular file (a FIFO never blocks) of at most 1 MiB; as root, only one only root can change
        text = trustfile.read_text(p, "config file", MAX_CONFIG_BYTES)
    except ValueError as e:  # not a regular file, too big, not UTF-8: what is wrong is in the message
        raise UsageError(f"config file {p} cannot be read: {e}") from None
    except OSError as e:
        raise UsageError(f"config file {p} cannot be read: {e.strerror or e} (make it a "
                         "readable regular file; /etc/gputop/config.yaml must be readable by every user: "
                         "chmod 644)") from None
    try:  # bounded: aliases, nodes and nesting are capped while the document is composed (safeyaml)
        loader = safeyaml.BoundedLoader(text)
        try:
            node = loader.get_single_node()
            data = (loader.construct_document(node) if node is not None else None) or {}
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"config file {p}{where}: YAML syntax error: {getattr(e, 'problem', e)}") from None
    except RecursionError:
        raise UsageError(f"config file {p}: nested too deeply") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file {p}: expected a mapping at the top level")
    _unknown_keys(node, SCHEMA, "", p)
    return data, _key_lines(node)


def _patterns(value, key: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list):
        raise ValueError(f"'{key}' must be a list of patterns")
    out = tuple(str(x) for x in value)
    for pat in out:
        try:
            saferegex.compile(pat, ignore_case=True)
        except saferegex.PatternError as e:
            raise ValueError(f"{key} pattern {pat!r} is not a regular expression: {e}") from None
        if key == "protect" and "/" in pat:
            # A protect pattern is matched against the process name and argv[0]'s basename, where a '/'
            # never appears: such a pattern would silently protect nothing.
            raise ValueError(f"protect pattern {pat!r} contains '/', but 'protect' matches only the process "
                             "name and argv[0]'s basename; put patterns for paths in 'protect_cmdline'")
    return out


def _parse(doc: tuple[dict, dict[str, int]], p: Path) -> tuple[dict, dict]:
    """(Config keyword arguments, extra sections) from one file's mapping and its key lines."""
    data, lines = doc
    kw: dict = {}
    extra: dict = {}
    where: dict[str, str] = {}  # a Config field -> the key it came from ("reap.grace"), for errors
    for key, value in data.items():
        key_ = str(key).replace("-", "_")
        if key_ in _NESTED:
            if not isinstance(value, dict):
                raise UsageError(f"config file {p}{_line(lines, key_)}: '{key}' must be a mapping")
            for sub, sv in value.items():
                field = _NESTED[key_][str(sub).replace("-", "_")]
                kw[field] = sv
                where[field] = f"{key_}.{str(sub).replace('-', '_')}"
        elif key_ in _FLAT:
            kw[key_] = value
        else:
            extra[key_] = value  # 'guard', 'audit': read by their own modules
    for k in ("protect", "protect_cmdline"):
        if k in kw:
            kw[k] = _checked(lambda v, k=k: _patterns(v, k), kw[k], where.get(k, k), lines, p)
    for k in ("reap_interval", "reap_grace", "kill_timeout", "interval"):
        if k in kw:
            kw[k] = _checked(parse_duration, kw[k], where.get(k, k), lines, p)
    if "max_chain" in kw:
        kw["max_chain"] = _checked(_whole_number, kw["max_chain"], "max_chain", lines, p)
    if "nohup_protects" in kw:
        kw["nohup_protects"] = _checked(_bool, kw["nohup_protects"], "nohup_protects", lines, p)
    for k in ("guard", "audit"):
        if k in extra and not isinstance(extra[k], dict):
            raise UsageError(f"config file {p}{_line(lines, k)}: '{k}' must be a mapping")
    if isinstance(extra.get("guard"), dict) and "exempt" in extra["guard"]:
        exempt = _checked(parse_exempt, extra["guard"]["exempt"], "guard.exempt", lines, p)
        extra["guard"] = {**extra["guard"], "exempt": exempt}
    return kw, extra


def _line(lines: dict[str, int], key: str) -> str:
    return f" line {lines[key]}" if key in lines else ""


def _checked(parse, value, key: str, lines: dict[str, int], p: Path):
    """``parse(value)``; a TypeError or ValueError becomes a UsageError naming the file, the key's line
    and the key (``config file F line 3: reap.grace: bad duration 'sixty': ...``)."""
    try:
        return parse(value)
    except (TypeError, ValueError) as e:
        msg = str(e)
        if not msg.startswith((f"'{key}'", f"{key} ", f"{key}:", f"'{key.rsplit('.', 1)[-1]}'")):
            msg = f"{key}: {msg}"
        raise UsageError(f"config file {p}{_line(lines, key)}: {msg}") from None


def _whole_number(v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"must be a whole number, got {v!r}")
    return int(v)


def _bool(v) -> bool:
    if not isinstance(v, bool):
        raise ValueError("'nohup_protects' must be true or false")
    return v


# ---- guard.exempt: what an admin exempts from the guard's rules --------------------------------
# Only attributes a local user cannot forge (docs/guard.md "Who is exempt from what"): a uid or a group
# (the kernel's credentials), a systemd unit or a cgroup (placing a process there needs root), an
# executable in a root-owned directory (checked when the guard acts: gputop.guard.exempt). Never a name,
# argv, the environment, ancestry, the nohup mark or chain length: every one of those is the user's to choose.
EXEMPT_KEYS = ("users", "groups", "units", "cgroups", "executables")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\$?")
_UNIT = re.compile(r"[A-Za-z0-9:_.\\-]+(?:@[A-Za-z0-9:_.\\-]*)?\.service")
_USER_MANAGER = re.compile(r"user@\d+\.service")


def parse_exempt(value) -> dict[str, tuple]:
    """``guard.exempt`` checked: ``{users: [name | uid], groups: [name | gid], units: [NAME.service],
    cgroups: [/absolute/path], executables: [/absolute/path]}`` -> a dict of tuples. Raises ValueError
    with what to write."""
    if value is None:
        return {k: () for k in EXEMPT_KEYS}
    if not isinstance(value, dict):
        raise ValueError("'guard.exempt' must be a mapping with users, groups, units, cgroups, executables")
    out: dict[str, tuple] = {}
    for key in EXEMPT_KEYS:
        items = value.get(key) or []
        if not isinstance(items, list):
            raise ValueError(f"'guard.exempt.{key}' must be a list")
        vals: list = []
        for x in items:
            vals.append(_exempt_item(key, x))
        out[key] = tuple(vals)
    return out


def _exempt_item(key: str, x):
    where = f"guard.exempt.{key}"
    if key in ("users", "groups"):
        if isinstance(x, int) and not isinstance(x, bool) and x >= 0:
            return x
        if isinstance(x, str) and _NAME.fullmatch(x):
            return int(x) if x.isdigit() else x
        raise ValueError(f"{where}: {x!r} is not a {key[:-1]} name or a number")
    if not isinstance(x, str) or not x:
        raise ValueError(f"{where}: {x!r} must be a string")
    if key == "units":
        if not _UNIT.fullmatch(x):
            raise ValueError(f"{where}: {x!r} is not a systemd service name (NAME.service)")
        if _USER_MANAGER.fullmatch(x):
            raise ValueError(f"{where}: {x!r} is a user's own systemd manager, where that user starts what "
                             "they like: exempt the user instead")
        return x
    if not x.startswith("/") or "\0" in x or any(part in (".", "..") for part in x.split("/")):
        raise ValueError(f"{where}: {x!r} must be an absolute path without '.' or '..'")
    if key == "cgroups":
        x = x.rstrip("/") or "/"
        if x == "/":
            raise ValueError(f"{where}: '/' would exempt every process: name a unit's or a slice's cgroup")
        if any(_USER_MANAGER.fullmatch(part) for part in x.split("/")):
            raise ValueError(f"{where}: {x!r} lies in a user's delegated cgroup subtree (user@UID.service), "
                             "where that user can move any of their processes: exempt the user instead")
    return x


def _merge(node: tuple[dict, dict], user: tuple[dict, dict]) -> tuple[dict, dict]:
    """The node's file and a user's file together (docs/node.md 'Configuration: which file wins').

    Protections only grow: ``protect`` and ``protect_cmdline`` are the node's list plus the user's, and
    ``nohup_protects`` is on if either file turns it on. The ``guard`` section (policy, interval, smtp)
    is the node's: its keys win. Everything else is the user's to choose."""
    (nkw, nextra), (ukw, uextra) = node, user
    kw = {**nkw, **ukw}
    for k in ("protect", "protect_cmdline"):
        if k in ukw:
            base = nkw.get(k, DEFAULT_PROTECT if k == "protect" else DEFAULT_PROTECT_CMDLINE)
            kw[k] = base + tuple(x for x in ukw[k] if x not in base)
    if nkw.get("nohup_protects") is True:
        kw["nohup_protects"] = True
    extra = {**nextra, **uextra}
    for sec, node_wins in (("guard", True), ("audit", False)):
        n, u = nextra.get(sec) or {}, uextra.get(sec) or {}
        if n or u:
            extra[sec] = {**u, **n} if node_wins else {**n, **u}
            if node_wins and isinstance(n.get("smtp"), dict) and isinstance(u.get("smtp"), dict):
                extra[sec]["smtp"] = n["smtp"]  # the node's mail settings, whole
    return kw, extra


def _exists(p: Path) -> bool:
    """Whether ``p`` is there; a directory on the way we may not search counts as "not there" (a file we
    may see but not read is an error from _read_yaml, naming it)."""
    try:
        p.stat()
    except OSError:
        return False
    return True


def load_config(path: str | None = None) -> Config:
    """The node's config (/etc/gputop/config.yaml) merged with the user's (see _merge); a missing default
    file means defaults. Bad content raises UsageError naming the file and line."""
    p = config_path(path)
    user: tuple[dict, dict] = ({}, {})
    if _exists(p):
        user = _parse(_read_yaml(p), p)
    elif path or os.environ.get("GPUTOP_CONFIG"):
        raise UsageError(f"config file {p} does not exist: create it or drop --config/GPUTOP_CONFIG")
    sp = system_config_path()
    if _exists(sp) and sp.resolve() != p.resolve():
        kw, extra = _merge(_parse(_read_yaml(sp), sp), user)
    else:
        kw, extra = user
    return Config(**kw, extra=extra)
