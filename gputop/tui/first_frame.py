"""The first frame: the header and the devices, drawn before Textual is imported.

Importing Textual and building and styling the app's first screen take most of a second on a loaded
machine (nvitop, drawing with curses, shows its devices in a third of that). The devices themselves are
read in a few milliseconds, so ``gputop`` draws them at once, as plain lines on the alternate screen, and
the app's own first frame (the devices again, in their panes, and the process tree) replaces them. Only
real readings are drawn; the top bar says the processes are still being read.

No Textual, no Rich: this module runs before either is imported.
"""

from __future__ import annotations

import os
import sys

from gputop.util.textsafe import visible
from gputop.util.units import fmt_bytes, fmt_opt

MIN_WIDTH, MIN_HEIGHT = 60, 15  # below this the app shows a too-small message instead of its screen

ENTER = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J"  # alternate screen (saves the cursor), cursor hidden, cleared
LEAVE = "\x1b[?1049l\x1b[?25h"  # back to the normal screen and its cursor, cursor shown
BOLD_REVERSE, RESET = "\x1b[1;7m", "\x1b[0m"


def device_line(d, width: int) -> str:
    """One device on one line: index, name, utilisation, memory, temperature, power."""
    head = f"GPU {d.index}  {visible(d.name or 'unknown device')}"
    if d.lost:
        return f"{head}  LOST"[:width]
    mem = f"{fmt_bytes(d.memory_used)}/{fmt_bytes(d.memory_total)}"
    rest = (f"  util {fmt_opt(d.util_gpu, '{:.0f}%')}  mem {mem}  {fmt_opt(d.temperature, '{:.0f}°C')}"
            f"  {fmt_opt(d.power_w, '{:.0f}W')}")
    return (head + rest)[:width]


def frame_lines(devices, width: int, height: int, *, readonly: bool = False, demo: bool = False) -> list[str]:
    """The frame as plain lines: the top bar, then one line per device, as many as the app's device box
    holds (about half the screen); the rest of the screen stays empty."""
    bar = " gputop " + (" READ-ONLY" if readonly else "") + (" DEMO" if demo else "")
    budget = max(4, (height - 10) // 2)
    shown = list(devices)[:budget]
    lines = [bar] + [" " + device_line(d, width - 2) for d in shown]
    if len(devices) > len(shown):
        lines.append(f" … {len(devices) - len(shown)} more GPU(s)"[:width])
    return lines


def wanted() -> bool:
    """Where Textual runs its own terminal driver (LinuxDriver, which _driver_after_first_frame extends)."""
    return os.name == "posix" and not os.environ.get("TEXTUAL_DRIVER")


def draw(devices, out=None, *, readonly: bool = False, demo: bool = False) -> bool:
    """Draw the frame on ``out`` (the terminal: standard error, where Textual draws too) and return True;
    False (nothing written) when there is nothing real to show or the terminal is too small for the app."""
    out = out or sys.__stderr__  # the stream Textual draws on
    if not devices or out is None or not wanted():
        return False
    try:
        width, height = os.get_terminal_size(out.fileno())
    except (OSError, ValueError):
        return False
    if width < MIN_WIDTH or height < MIN_HEIGHT:
        return False
    lines = frame_lines(devices, width, height, readonly=readonly, demo=demo)
    bar, rest = lines[0], lines[1:]
    text = [ENTER, BOLD_REVERSE, bar, RESET, "  reading processes…"]
    for row, line in enumerate(rest, start=2):
        text.append(f"\x1b[{row};1H{line}")
    out.write("".join(text))
    out.flush()
    return True


def leave(out=None) -> None:
    """Undo draw() when the app did not take the screen over (it failed or was stopped before it did)."""
    out = out or sys.__stderr__  # the stream Textual draws on
    try:
        out.write(LEAVE)
        out.flush()
    except (OSError, ValueError):
        pass
