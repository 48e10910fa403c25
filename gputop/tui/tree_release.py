"""A Tree that frees what it drew for the rows that left it when it lays its lines out again, not at the
cyclic garbage collector's next pass (issue 33).

Textual's Tree leaves two reference cycles each time it changes, and under churn they held the rows that
left until the collector ran; the app runs its young generation rarely (app.GC_GEN0), and what was promoted
before it became garbage waited for a full collection, which a TUI left open may not run for many minutes:

- ``Tree._build`` lays the lines out with a recursive helper, ``add_node``, a closure that names itself:
  a cycle, which holds the list of lines that build made. When the tree changes, the list is replaced,
  and the cycle keeps the old one with every row it names: each line's path, each TreeNode, its label and
  its data (for the process tree: the Holder, its ProcInfo, ancestor chain and verdict).
- ``Tree._clear_line_cache`` clears the line cache, an LRUCache whose entries are a ring of links
  ([prev, next, key, strip]); a cleared ring is a cycle, which holds every strip drawn since the last change.

Under churn (128 of 256 holders replaced every 2 s) that was about 4,100 objects a refresh, 16 per holder
that left (tests/tui/test_churn_memory.py). ReleasingTree empties the old list of lines once the new one
is built, and takes the line cache's entries out one by one (each unlinked from the ring) before Tree
clears it: the rows that left, and their strips, are freed at once by reference counting. What is left to
the collector is the empty closure cycle and the last link, which refers to itself.

Nothing else keeps the old list: Tree reads its lines through ``_tree_lines``, which builds them when they
were dropped, and no line is read from a list held across a rebuild (a rebuild happens only after the tree
changed, never while a frame is drawn).
"""

from __future__ import annotations

from textual.widgets import Tree
from textual.widgets.tree import TreeDataType


class ReleasingTree(Tree[TreeDataType]):
    """A Tree whose previous lines and cached line strips are let go of when it changes (module doc)."""

    _lines_built: list | None = None  # the list the last build made (Tree keeps it until the tree changes)

    # Written against Textual 8.2.8 (pinned by the test extra); under a Textual whose Tree lacks one of these
    # names, the part that needs it does nothing rather than fail (the rows are then left to the collector).
    def _build(self) -> None:
        super()._build()
        new = getattr(self, "_tree_lines_cached", None)
        old, self._lines_built = self._lines_built, new if isinstance(new, list) else None
        if old is not None and old is not self._lines_built:
            old.clear()

    def _clear_line_cache(self) -> None:
        cache = getattr(self, "_line_cache", None)
        keys, discard = getattr(cache, "keys", None), getattr(cache, "discard", None)
        if keys is not None and discard is not None:
            for key in list(keys()):
                discard(key)
        super()._clear_line_cache()
