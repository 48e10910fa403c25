"""User configuration (YAML) and the XDG paths gputop uses.

Lookup order for the config file: ``--config``, ``$GPUTOP_CONFIG``, ``<XDG config>/gputop/config.yaml``.
State (audit log, guard state) lives in ``$GPUTOP_STATE_DIR`` or ``<XDG state>/gputop``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import platformdirs

from gputop import saferegex
from gputop.errors import UsageError
from gputop.orphans import DEFAULT_MAX_CHAIN, DEFAULT_PROTECT
from gputop.units import parse_duration


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
    protect: tuple[str, ...] = DEFAULT_PROTECT  # case-insensitive regexes over name and cmdline
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


_KNOWN = {f.name for f in fields(Config)} - {"extra"}
_NESTED = {"reap": {"interval": "reap_interval", "grace": "reap_grace", "protect": "protect"}}


def load_config(path: str | None = None) -> Config:
    """Load the config file; a missing default file means defaults. Bad content raises UsageError."""
    p = config_path(path)
    if not p.exists():
        if path or os.environ.get("GPUTOP_CONFIG"):
            raise UsageError(f"config file {p} does not exist: create it or drop --config/GPUTOP_CONFIG")
        return Config()
    import yaml  # only when there is a file: it costs ~10 ms of start-up

    from gputop import safeyaml

    try:  # bounded: a regular file of at most 1 MiB, aliases and nodes capped (safeyaml)
        data = safeyaml.load(safeyaml.read_regular(p)) or {}
    except (OSError, ValueError) as e:
        raise UsageError(f"config file {p}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"config file {p}{where}: YAML syntax error: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file {p}: expected a mapping at the top level")
    kw: dict = {}
    extra: dict = {}
    for key, value in data.items():
        key_ = str(key).replace("-", "_")
        if key_ in _NESTED and isinstance(value, dict):
            for sub, sv in value.items():
                if sub not in _NESTED[key_]:
                    raise UsageError(f"config file {p}: unknown key '{key}.{sub}'")
                kw[_NESTED[key_][sub]] = sv
        elif key_ in _KNOWN:
            kw[key_] = value
        else:
            extra[key_] = value  # e.g. 'guard', 'audit' sections read by their own modules
    try:
        if "protect" in kw:
            if isinstance(kw["protect"], str) or not isinstance(kw["protect"], list):
                raise ValueError("'protect' must be a list of patterns")
            kw["protect"] = tuple(str(x) for x in kw["protect"])
            for pat in kw["protect"]:
                try:
                    saferegex.compile(pat, ignore_case=True)
                except saferegex.PatternError as e:
                    raise ValueError(f"protect pattern {pat!r} is not a regular expression: {e}") from None
        for k in ("reap_interval", "reap_grace", "kill_timeout", "interval"):
            if k in kw:
                kw[k] = parse_duration(kw[k])
        if "max_chain" in kw:
            kw["max_chain"] = int(kw["max_chain"])
        if "nohup_protects" in kw and not isinstance(kw["nohup_protects"], bool):
            raise ValueError("'nohup_protects' must be true or false")
    except (TypeError, ValueError) as e:
        raise UsageError(f"config file {p}: {e}") from None
    return Config(**kw, extra=extra)
