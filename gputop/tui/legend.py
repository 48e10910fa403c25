"""What the colours and marks of the process tree mean (the marks also work without colour)."""

from __future__ import annotations

from rich.text import Text

from gputop.tui import process_tree as pt


def legend_text(long: bool = False) -> Text:
    t = Text()
    CTX_STYLE, ORPHAN_STYLE, PROTECTED_STYLE, UNKNOWN_STYLE = (pt.CTX_STYLE, pt.ORPHAN_STYLE, pt.PROTECTED_STYLE,
                                                              pt.UNKNOWN_STYLE)
    if long:
        t.append("\nColours and marks\n", style="bold underline")
    t.append("C", style=CTX_STYLE["C"])
    t.append(" compute " if long else " ")
    t.append("G", style=CTX_STYLE["G"])
    t.append(" graphics " if long else " ")
    t.append("C+G", style=CTX_STYLE["C+G"])
    t.append(" both" if long else "")
    t.append("  │  " if not long else "\n")
    t.append("O orphan", style=ORPHAN_STYLE)
    t.append("  ")
    t.append("R orphan root", style=pt.ROOT_STYLE)
    t.append("  ")
    t.append("P protected", style=PROTECTED_STYLE)
    t.append("  ")
    t.append("? unknown", style=UNKNOWN_STYLE)
    t.append("  ")
    t.append("*", style="bold reverse")
    t.append(" tagged")
    if long:
        t.append("\n\nO orphan: its session is gone and its tree was handed to init or a subreaper;"
                 " r reaps the whole tree from its root (R).\nP protected: matches the protect list or was"
                 " detached with nohup; never reaped.\n? unknown: ancestry unreadable or PID not visible here;"
                 " never killed.\nA history strip runs on a fixed 0-100% scale; N/A means the device did not"
                 " report the value.")
    return t
