"""Make control characters visible before a process-controlled string reaches a terminal.

Other users choose their command lines and process names. ``ESC ] 0 ; ... BEL`` retitles a terminal and
``ESC [ 2 J`` clears it; a C1 byte (U+009B) starts a sequence on some terminals by itself. Every face that
writes a name, argv, user, cwd or exe to a terminal passes it through ``visible``. JSON keeps the exact
value (the JSON encoder escapes control characters itself).
"""

from __future__ import annotations

# C0 (U+0000-U+001F), DEL (U+007F) and C1 (U+0080-U+009F), each as a \xNN escape.
_TABLE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_ANY = frozenset(_TABLE)


def visible(s: object) -> str:
    """``s`` as text with every control character shown as ``\\xNN`` (ESC becomes ``\\x1b``)."""
    if s is None:
        return ""
    text = s if isinstance(s, str) else str(s)
    if text.isprintable():  # the common case: nothing to do (also false for many harmless chars)
        return text
    if not any(ord(ch) in _ANY for ch in text):
        return text
    return text.translate(_TABLE)


def has_control(s: str) -> bool:
    return any(ord(ch) in _ANY for ch in s)
