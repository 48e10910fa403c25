"""Every key binding of the main screen, in one place: the footer, ``?`` help and the command palette
all list these. ``destructive`` bindings are hidden and disabled by ``--readonly``."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True)
class Key:
    key: str  # Textual key name(s), comma-separated
    action: str
    description: str  # short: the footer
    help: str  # one line: the help screen and the command palette
    show: bool = True  # in the footer
    # an action on processes, GPUs or the guard (or a tag, which serves one): off under --readonly
    destructive: bool = False

    @property
    def display(self) -> str:
        return " ".join(key_name(k) for k in self.key.split(","))


_NAMES = {"question_mark": "?", "slash": "/", "space": "space", "escape": "esc", "plus": "+", "minus": "-",
          "equals_sign": "=", "left": "←", "right": "→", "up": "↑", "down": "↓", "enter": "enter"}


def key_name(key: str) -> str:
    """A Textual key name as a person reads it: ``?``, ``+``, ``F5``, ``ctrl+c``."""
    if key in _NAMES:
        return _NAMES[key]
    if len(key) >= 2 and key[0] == "f" and key[1:].isdigit():
        return key.upper()
    return key


KEYS: tuple[Key, ...] = (
    # htop's function keys sit beside the letters (F1 help, F3 search, F4 filter, F5 tree, F6 sort, F9 kill,
    # F10 quit); the footer shows the first key of each.
    Key("question_mark,f1", "help", "Help", "Show every key and what the colours mean"),
    # Quit second: the footer is cut at 80 columns, and q must stay visible there.
    Key("q,f10", "quit", "Quit", "Quit gputop"),
    Key("slash,f4", "filter", "Filter", "Filter processes by pid, user, name or command (esc clears)"),
    Key("f3", "search", "Search", "Search: jump to the next row whose pid, user, name or command matches",
        show=False),
    Key("space", "toggle_tag", "Tag", "Tag or untag the selected process (k kills every tagged one)",
        destructive=True),
    Key("u", "untag_all", "Untag", "Untag every process", show=False, destructive=True),
    Key("k,f9", "kill", "Kill", "Kill the selected or tagged processes (choose TERM or KILL)", destructive=True),
    Key("r", "reap", "Reap", "Reap the orphan tree of the selected process, from its root", destructive=True),
    Key("R", "reset", "Reset", "Reset the GPU of the selected row (type its index to confirm)",
        show=False, destructive=True),
    Key("g", "guard", "Guard", "Switch the guard mode (off, dry-run, enforce)", destructive=True),
    Key("d", "details", "Details", "Details of the selected process: full chain and verdict reason",
        show=False),
    Key("o,f5", "grouping", "Group", "Group the tree per GPU, per orphan root or per Slurm job (htop's F5 tree view)"),
    Key("s,f6", "sort", "Sort", "Sort by the next column (gpu-mem, sm, cpu, host-mem, time, pid, user)"),
    Key("S", "sort_reverse", "Reverse", "Reverse the sort order", show=False),
    Key("p", "plot", "Plot", "Open the detailed plot of the selected row's GPU", show=False),
    Key("b", "panel", "Panel", "Show or hide the side panel (guard hits, audit findings)", show=False),
    Key("ctrl+l", "refresh", "Refresh", "Sample now and redraw", show=False),
    Key("ctrl+c", "quit", "Quit", "Quit gputop, as top does (ctrl+q too)", show=False),
)

DESTRUCTIVE = frozenset(k.action for k in KEYS if k.destructive)


# Textual names a key for the footer (textual.keys.format_key) and finds the character a key types
# (key_to_character, for every binding on the screen) with unicodedata.lookup, which pages in ~0.8 MiB of
# Unicode name tables (peak RSS, issue 13). For the keys bound here, and the screen's own tab, their answers
# are written out; tests/unit/test_tui_model.py checks them against Textual's.
KEY_DISPLAY = {"question_mark": "?", "slash": "/", "space": "space"}
KEY_CHARACTERS = {"question_mark": "?", "slash": None, "space": " ", "tab": "\t",
                  **{f"f{i}": None for i in range(1, 13)}}


def key_display(key: str) -> str | None:
    """What Textual's footer shows for a key without modifiers; None: let Textual work it out."""
    if key in KEY_DISPLAY:
        return KEY_DISPLAY[key]
    if (len(key) == 1 and key.isalnum()) or (key[:1] == "f" and key[1:].isdigit()):
        return key
    return None


def bindings(app_actions: frozenset[str] = frozenset()) -> list[Binding]:
    """One Binding a key (Textual splits "a,b" alike), each with the name the footer shows. The actions
    in ``app_actions`` are the app's (``app.quit``), the others those of the screen that binds them."""
    return [Binding(key, f"app.{k.action}" if k.action in app_actions else k.action, k.description, show=k.show,
                    tooltip=k.help, key_display=key_display(key))
            for k in KEYS for key in k.key.split(",")]


def install_key_characters() -> None:
    """Answer textual.screen's key_to_character from KEY_CHARACTERS where it can (see above)."""
    import textual.keys
    import textual.screen

    textual_lookup = textual.keys.key_to_character
    if textual.screen.key_to_character is not textual_lookup:
        return  # already installed, or not the Textual this was written for

    def key_to_character(key: str) -> str | None:
        if key in KEY_CHARACTERS:
            return KEY_CHARACTERS[key]
        return textual_lookup(key)

    textual.screen.key_to_character = key_to_character


# Keys inside the device plot screen.
PLOT_KEYS: tuple[Key, ...] = (
    Key("left", "prev_gpu", "Prev GPU", "Previous GPU"),
    Key("right", "next_gpu", "Next GPU", "Next GPU"),
    Key("minus", "zoom_out", "Longer", "Show a longer time range"),
    Key("plus,equals_sign", "zoom_in", "Shorter", "Show a shorter time range"),
    Key("escape,q,p", "close", "Close", "Close the plot"),
)
