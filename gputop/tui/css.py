"""Where the TUI's stylesheet is: the node view and the fleet view (which must not import the node view's app,
a tenth of a second of start-up) both load it."""

from __future__ import annotations

from pathlib import Path


def css_path() -> Path:
    """The stylesheet: shipped in the package (gputop/styles), which in the source tree links to styles/."""
    here = Path(__file__).resolve().parent
    for p in (here.parent / "styles" / "gputop.tcss", here.parent.parent / "styles" / "gputop.tcss"):
        if p.is_file():
            return p
    raise FileNotFoundError("gputop.tcss not found: reinstall gputop (pip install gputop)")
