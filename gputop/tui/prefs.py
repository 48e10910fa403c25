"""What the TUI remembers between runs (the theme picked in the command palette), as posting and
harlequin do: a small JSON file in the user's state dir (platformdirs), never the node's guard state."""

from __future__ import annotations

import json
import os
from pathlib import Path

import platformdirs


def prefs_path() -> Path:
    return Path(platformdirs.user_state_dir("gputop")) / "tui.json"


def load() -> dict:
    try:
        data = json.loads(prefs_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save(**values) -> None:
    """Merge ``values`` into the file (atomically). A failure to remember is not worth an error."""
    path = prefs_path()
    data = load()
    data.update(values)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
