"""The process tree: GPU holders under their ancestor chains, reconciled in place on every snapshot.

Nodes are kept in a key -> node map and updated, inserted or removed one by one, so the cursor and the
expansion of every node survive a refresh. Names and command lines are wrapped in Text (never markup).
"""

from __future__ import annotations

import re
from functools import lru_cache

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.strip import Strip
from textual.widgets import Static, Tree
from textual.widgets.tree import TreeNode

from gputop.core.orphans import ORPHAN, PROTECTED, UNKNOWN
from gputop.tui.rows import SORTS, Node
from gputop.tui.tree_release import ReleasingTree
from gputop.tui.tree_lines import LINE_CACHE_ROWS, TreeLines  # noqa: F401 -- LINE_CACHE_ROWS: the tests' bound
from gputop.util.units import fmt_bytes, fmt_duration
from gputop.util.textsafe import visible

GUIDE = 2  # cells per tree level (Textual's minimum)
EXPANDER = 2  # the "▼ " in front of every label (blank for leaves, so columns line up)

VERDICT_FLAG = {ORPHAN: "O", PROTECTED: "P", UNKNOWN: "?"}
_COLOR = {"ctx": {"C": "cyan", "G": "magenta", "C+G": "yellow"}, "orphan": "bold red", "root": "bold red",
          "protected": "dim", "unknown": "italic yellow"}
# NO_COLOR: Textual turns colours to grey, so orphans stand out by reverse video instead.
_MONO = {"ctx": {"C": "", "G": "underline", "C+G": "bold"}, "orphan": "bold reverse",
         "root": "bold underline", "protected": "dim", "unknown": "italic"}
CTX_STYLE: dict[str, str] = {}
ORPHAN_STYLE = ROOT_STYLE = PROTECTED_STYLE = UNKNOWN_STYLE = ""


def use_palette(no_color: bool) -> None:
    """Pick the row styles: colours, or (NO_COLOR) text attributes that read without colour."""
    global ORPHAN_STYLE, ROOT_STYLE, PROTECTED_STYLE, UNKNOWN_STYLE
    pal = _MONO if no_color else _COLOR
    CTX_STYLE.clear()
    CTX_STYLE.update(pal["ctx"])
    ORPHAN_STYLE, ROOT_STYLE = pal["orphan"], pal["root"]
    PROTECTED_STYLE, UNKNOWN_STYLE = pal["protected"], pal["unknown"]


use_palette(False)


WIDE, COMPACT, NARROW = 0, 1, 2  # how many columns fit (``compact``: False/True read as WIDE/COMPACT)


def _make_cols(level: int) -> tuple[tuple[str, int, str], ...]:
    """(title, width, align) of the columns after PID. NARROW (under 80 columns) drops CPU% and TIME so
    that the command keeps some room."""
    cols = [("USER", 8 if level == WIDE else 6, "<"), ("T", 3, "<"), ("GPU", 3, ">"), ("GPU-MEM", 8, ">"),
            ("SM%", 4, ">")]
    if level != NARROW:
        cols.append(("CPU%", 5, ">"))
    if level == WIDE:
        cols.append(("HOST-MEM", 9, ">"))
    if level != NARROW:
        cols.append(("TIME", 7, ">"))
    cols.append(("COMMAND", 0, "<"))
    return tuple(cols)


_LEVEL_COLS = {c: _make_cols(c) for c in (WIDE, COMPACT, NARROW)}  # level -> columns
_WIDTHS = {title: (width, align) for title, width, align in _LEVEL_COLS[WIDE]}
_WIDTHS_JOB = ("JOB", 10, "<")  # a Slurm node's job id (.step), shown only when some holder has one


class _Columns(dict):
    """layout -> columns. A layout is a level, or (level, sort title): the column sorted by is shown even
    when the level hides it, in place of the last optional column (TIME; SM% when narrow)."""

    def __missing__(self, layout):
        level, sort_title, jobs = (tuple(layout) + (False,))[:3] if isinstance(layout, tuple) else (layout, None, False)
        cols = list(_LEVEL_COLS[level])
        if jobs:  # JOB goes just before COMMAND
            cols.insert(len(cols) - 1, _WIDTHS_JOB)
        titles = [c[0] for c in cols]
        if sort_title in _WIDTHS and sort_title not in titles:
            i = titles.index("TIME" if "TIME" in titles else "SM%")
            cols[i] = (sort_title, *_WIDTHS[sort_title])
        self[layout] = out = tuple(cols)
        return out


_COLS = _Columns()


def column_level(width: int, side_panel: bool, sort: str | None = None, jobs: bool = False):
    """Which columns fit a terminal ``width`` columns wide (the side panel takes its own 38); with ``sort``,
    a layout that also shows the column sorted by; with ``jobs``, a JOB column too (a Slurm node)."""
    if width < 80:
        level = NARROW
    else:
        level = COMPACT if width < 100 or (side_panel and width < 140) else WIDE
    if sort is None and not jobs:
        return level
    return (level, SORTS[sort][0] if sort is not None else None, jobs)


def _cell(text: str, width: int, align: str) -> str:
    if width <= 0:
        return text
    text = text if len(text) <= width else text[: width - 1] + "…"
    return text.rjust(width) if align == ">" else text.ljust(width)


def header_text(depth_pad: int, compact: bool, sort: str, reverse: bool) -> Text:
    """The column header, aligned with rows at depth 1 under a pad of ``depth_pad`` cells."""
    arrow = "▲" if (SORTS[sort][1] == reverse) else "▼"
    sort_title = SORTS[sort][0]
    cols = _COLS[compact]
    out = Text(" " * (GUIDE + EXPANDER) + "  ", style="bold")
    pid = "PID" + arrow if sort_title == "PID" else "PID"
    out.append(pid.rjust(7), style="bold reverse" if pid != "PID" else "bold")
    out.append(" " * depth_pad)
    for title, width, align in cols:
        t = title + arrow if title == sort_title else title
        out.append(" ")
        out.append(_cell(t, width, align), style="bold reverse" if t != title else "bold")
    return out


ROW_MARKS = {"squatter": "[squatter] ", "outside": "[outside its allocation] "}


def row_cells(node: Node, depth: int, max_depth: int, tagged: bool, compact: bool) -> tuple:
    """What a row shows, as plain values: cheap to compute and compare on every refresh."""
    if node.kind == "group":
        return ("group", node.title)
    h = node.holder
    p = node.proc
    flag, style = " ", ""
    if h is not None:
        flag = VERDICT_FLAG.get(h.verdict.kind, " ")
        style = {ORPHAN: ORPHAN_STYLE, PROTECTED: PROTECTED_STYLE, UNKNOWN: UNKNOWN_STYLE}.get(h.verdict.kind, "")
    elif node.root is not None and node.pid == node.root:
        flag, style = "R", ROOT_STYLE
    user = visible((h.user if h else (p.user if p else None)) or "?")
    if h is not None:
        sm, cpu = h.sm_util, h.cpu_percent
        values = {
            "USER": user, "T": h.ctx, "GPU": ",".join(str(g) for g in h.gpus),
            "GPU-MEM": fmt_bytes(h.gpu_memory), "SM%": "N/A" if sm is None else f"{sm:.0f}%",
            "CPU%": "N/A" if cpu is None else f"{cpu:.0f}%", "HOST-MEM": fmt_bytes(h.rss),
            "TIME": fmt_duration(h.runtime),
            "JOB": h.job.label() if h.job is not None else "-",
        }
        cmd = visible(h.cmd)
        # Short flags before the command: a squatter or a process outside its job's allocation, and a
        # zombie (the details pane, d, says why and names the parent that must wait for it; a holder found
        # only through a device file says "dev" in the T column)
        mark = ROW_MARKS.get(node.standing or "", "") + ("[zombie] " if h.notes is not None and h.notes.zombie else "")
        if mark:
            cmd = mark + cmd
    else:
        values = {"USER": user, "HOST-MEM": fmt_bytes(p.rss) if p is not None else ""}
        cmd = visible(p.cmd) if p is not None else ""
    head = ("*" if tagged else " ") + flag + str(node.pid).rjust(7) + " " * max(0, (max_depth - depth) * GUIDE)
    cells = tuple([_cell(values.get(title, ""), width, align) for title, width, align in _COLS[compact][:-1]])
    return ("row", style, tagged, head, cells, h.ctx if h is not None else None, cmd, h is not None)


def value_offset(cells: tuple, i: int) -> int:
    """Where the ``i``-th value of a row's cells starts in its label text (see text_from_cells)."""
    return len(cells[3]) + 1 + sum(len(v) + 1 for v in cells[4][:i])


def text_from_cells(cells: tuple) -> Text:
    if cells[0] == "group":
        return Text(cells[1], style="bold")
    _, style, tagged, head, values, ctx, cmd, is_holder = cells
    plain = head + " " + " ".join(values) + " "
    out = Text(plain, style=style)
    if tagged:
        out.stylize("bold reverse", 0, 1)
    if ctx is not None:  # the T column: the second value
        start = value_offset(cells, 1)
        out.stylize(CTX_STYLE.get(ctx, ""), start, start + len(values[1]))
    else:  # an ancestor row: its few values are secondary
        out.stylize("dim", len(head) + 1, len(plain))
    out.append(Text(cmd, style="" if is_holder else "dim"))  # a command line is never parsed as markup
    return out


def _width(text: str) -> int:
    # Not rich's cell_len for ASCII: its cache would keep every row's string alive (thousands of them).
    return len(text) if text.isascii() else cell_len(text)


def cells_width(cells: tuple) -> int:
    """The cells of text_from_cells(cells) (what a label is drawn in), without building the Text."""
    if cells[0] == "group":
        return _width(cells[1])
    head, values, cmd = cells[3], cells[4], cells[6]
    return _width(head) + 1 + sum(_width(v) + 1 for v in values) + _width(cmd)


# The label of a row not drawn yet: its Text is built from its cells when it is first drawn (see label_text),
# so that a thousand rows off screen hold no Text (peak RSS, issue 13).
_UNDRAWN = Text()


def row_text(node: Node, depth: int, max_depth: int, tagged: bool, compact: bool) -> Text:
    """One row: tag and verdict flags, PID, the aligned columns, and the command."""
    return text_from_cells(row_cells(node, depth, max_depth, tagged, compact))


@lru_cache(maxsize=64)
def _time_column(layout) -> tuple[int, int, str] | None:
    """(index among the cells, width, align) of TIME in a layout; None when it is not shown."""
    for i, (title, width, align) in enumerate(_COLS[layout][:-1]):
        if title == "TIME":
            return i, width, align
    return None


class ColumnHeader(Static):
    """The header over the tree (kept separate so the tree can scroll under it)."""

    shown: Text | None = None

    def show(self, max_depth: int, compact, sort: str, reverse: bool) -> None:
        """The header for rows laid out ``max_depth`` deep; redrawn only when its text changed."""
        text = header_text(max(0, (max_depth - 1) * GUIDE), compact, sort, reverse)
        if text != self.shown:
            self.shown = text
            self.update(text, layout=False)


_GPU_GROUP = re.compile(r"gpu\d+")  # the key of a GPU's group (rows.build)


def node_depth(node: TreeNode) -> int:
    """How deep a node is under the (hidden) root: 0 for a group."""
    d = -1
    while node.parent is not None:
        d += 1
        node = node.parent
    return d


class ProcessTree(ReleasingTree[Node]):
    """A Tree of groups, ancestor chains and holders, reconciled by key."""

    # Tree binds space to toggle_node, and a focused widget's keys run before the screen's: space tags here
    # as in htop and nvitop (enter still toggles a branch). Left and right collapse and expand.
    BINDINGS = [
        Binding("space", "toggle_tag", "Tag"),
        Binding("left", "collapse_or_parent", "Collapse", show=False),
        Binding("right", "expand_or_child", "Expand", show=False),
    ]

    def __init__(self, **kw):
        super().__init__("processes", **kw)
        self.show_root = False
        self.guide_depth = GUIDE
        self.nodes_by_key: dict[str, TreeNode[Node]] = {}
        self._labels: dict[str, tuple] = {}  # key -> the cells its label shows
        self._inputs: dict[str, tuple] = {}  # key -> what a holder row shows but its TIME (see _time_only)
        self._collapsed: set[str] = set()
        self.cursor_key: str | None = None
        self.tagged: set[int] = set()
        self.compact = True
        self._max_depth = 1
        self._changed: list[TreeNode[Node]] = []  # nodes whose label changed in this reconcile
        self._pending: dict[int, tuple] = {}  # id(node) -> cells whose Text is built when the line is drawn
        # id(node) -> (node, depth): rows off screen whose data changed; their cells are worked out only
        # when the line is drawn (scrolled into view), so a refresh costs per row in view, not per row.
        self._stale: dict[int, tuple[TreeNode[Node], int]] = {}
        self._updated: list[tuple[TreeNode[Node], int]] = []  # (node, depth) given new data in this reconcile
        self._structural = False  # a node was added or removed: every line may have moved
        self._texts: dict[int, Text] = {}  # id(node) -> its label's Text, built when it is first drawn
        # The lines: drawn here (Tree's own rendering is not used; its line cache of 1,024 strips piled up
        # stale ones, ~1 MiB of peak RSS: issue 13). This keeps LINE_CACHE_ROWS or the tree's height.
        self.lines = TreeLines(self, self._labels, self._stale, width_of=_width, time_column=_time_column,
                               value_offset=value_offset)

    # Every label gets a 2-cell expander slot, blank on leaves, so that columns line up.
    def render_label(self, node: TreeNode[Node], base_style: Style, style: Style) -> Text:
        label = self.label_text(node).copy()
        label.stylize(style)
        if node.allow_expand:
            prefix = (self.ICON_NODE_EXPANDED if node.is_expanded else self.ICON_NODE, base_style)
        else:
            prefix = (" " * EXPANDER, base_style)
        return Text.assemble(prefix, label)

    # ---- line rendering: gputop.tui.tree_lines ------------------------------------------------------

    def render_lines(self, crop):
        return self.lines.render_lines(crop, super().render_lines)

    def render_line(self, y: int) -> Strip:
        return self.lines.render_line(y)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        if "lines" in self.__dict__:  # (not yet inside Tree.__init__)
            self.lines.styles_changed()

    def label_text(self, tnode: TreeNode[Node]) -> Text:
        """A row's label (without the expander), its Text built from its cells if they changed since."""
        stale = self.__dict__.get("_stale")  # get_label_width runs inside Tree.__init__, before it is set
        if stale:
            entry = stale.pop(id(tnode), None)
            if entry is not None:
                self._cells(tnode, tnode.data, entry[1])
        pending = self.__dict__.get("_pending")
        cells = pending.pop(id(tnode), None) if pending else None
        texts = self.__dict__.get("_texts")
        if cells is not None:
            texts[id(tnode)] = text = text_from_cells(cells)
            return text
        text = texts.get(id(tnode)) if texts is not None else None
        return text if text is not None else tnode.label

    def get_label_width(self, node: TreeNode[Node]) -> int:  # what render_label would draw, without drawing it
        pending = self.__dict__.get("_pending")
        cells = pending.get(id(node)) if pending else None
        if cells is not None:  # not drawn since its cells changed (or ever): its width is theirs
            return EXPANDER + cells_width(cells)
        stale = self.__dict__.get("_stale")
        if stale and id(node) in stale:
            # An off-screen row whose values changed: its width is that of its columns and command, which
            # do not change with the values; the width only sizes the (hidden) horizontal scroll range.
            return EXPANDER + _width(self._texts.get(id(node), _UNDRAWN).plain)
        return EXPANDER + _width(self.label_text(node).plain)  # (not Text.cell_len: see _width)

    def process_label(self, label) -> Text:  # never parse markup; keep one line
        if isinstance(label, str):
            label = Text(label)
        return label

    def action_collapse_or_parent(self) -> None:
        """Collapse the branch under the cursor; on a leaf or a collapsed branch, go to its parent."""
        node = self.cursor_node
        if node is None:
            return
        if node.allow_expand and node.is_expanded:
            node.collapse()
        elif node.parent is not None and node.parent is not self.root:
            self.move_cursor(node.parent)

    def action_expand_or_child(self) -> None:
        """Expand the branch under the cursor; on an expanded one, go to its first child."""
        node = self.cursor_node
        if node is None or not node.allow_expand:
            return
        if not node.is_expanded:
            node.expand()
        elif node.children:
            self.move_cursor(node.children[0])

    @property
    def selected(self) -> Node | None:
        node = self.cursor_node
        return node.data if node is not None else None

    def retained_sizes(self) -> dict[str, int]:
        """How many entries each per-row structure holds (each is at most one per row: issue 33's check that
        rows of processes that left are dropped)."""
        return {"nodes": len(self.nodes_by_key), "labels": len(self._labels), "inputs": len(self._inputs),
                "pending": len(self._pending), "stale": len(self._stale), "drawn": len(self.lines.drawn),
                "texts": len(self._texts), "versions": len(self.lines.versions),
                "collapsed": len(self._collapsed), "lines": self.last_line + 1}

    @property
    def max_depth(self) -> int:
        """The deepest level the rows are laid out for (the header is padded to it)."""
        return self._max_depth

    def select_key(self, key: str) -> bool:
        """Put the cursor on the row with this key (e.g. "gpu2/2001"); False if there is none."""
        node = self.nodes_by_key.get(key)
        if node is None:
            return False
        self.move_cursor(node)
        self.cursor_key = key
        return True

    def find(self, text: str, after_cursor: bool) -> bool:
        """Move the cursor to the next row shown (after the cursor, wrapping) that matches ``text``."""
        from gputop.tui.rows import row_matches

        count = self.last_line + 1
        if not text or count <= 0:
            return False
        start = self.cursor_line + 1 if after_cursor else 0
        for i in range(count):
            node = self.get_node_at_line((start + i) % count)
            if node is not None and node.data is not None and row_matches(node.data, text):
                self.move_cursor(node)
                return True
        return False

    # ---- tags -----------------------------------------------------------------------------------

    class TagsChanged(Message):
        """The set of tagged processes changed (the top bar counts them)."""

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        return self.app.check_action(action, parameters)  # space waits under a dialog, as the main keys do

    def action_toggle_tag(self) -> None:
        """Tag or untag the selected holder, then move down (as top and nvitop do)."""
        node = self.selected
        if node is None or node.holder is None:
            self.notify("Only GPU holders can be tagged (select a process row).", severity="warning")
            return
        if node.pid in self.tagged:
            self.untag({node.pid})
        else:
            self.tagged.add(node.pid)
            self.relabel()
            self.post_message(self.TagsChanged())
        self.action_cursor_down()

    def untag(self, pids=None) -> None:
        """Untag ``pids`` (every process when None)."""
        if pids is None:
            self.tagged.clear()
        else:
            self.tagged -= set(pids)
        self.relabel()
        self.post_message(self.TagsChanged())

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        if event.node.data is not None:
            self.cursor_key = event.node.data.key

    def on_tree_node_collapsed(self, event: Tree.NodeCollapsed) -> None:
        if event.node.data is not None:
            self._collapsed.add(event.node.data.key)

    def on_tree_node_expanded(self, event: Tree.NodeExpanded) -> None:
        if event.node.data is not None:
            self._collapsed.discard(event.node.data.key)

    # ---- reconcile ------------------------------------------------------------------------------
    # A reconcile walks every node (cheap: keys and identity), but works out a row's cells (formatting of
    # its values) only for rows in view; a row off screen is marked stale and formatted when it is drawn.

    def reconcile(self, groups: list[Node], max_depth: int, compact: bool) -> None:
        relabel = max_depth != self._max_depth or compact != self.compact
        self._max_depth, self.compact = max_depth, compact
        if relabel:
            self._labels.clear()
        self._changed, self._structural, self._updated = [], False, []
        self._reconcile_children(self.root, groups, 0)
        structural = self._structural
        if structural and self._collapsed:
            # Drop the collapsed state of rows that left (a process, an orphan root or a job: they come and
            # go for as long as the TUI is open), keeping that of the GPU groups (a few, and shown again when
            # the grouping comes back to GPUs).
            keep = self.nodes_by_key
            self._collapsed = {k for k in self._collapsed if k in keep or _GPU_GROUP.fullmatch(k)}
        self.last_line  # noqa: B018 -- lay the lines out now (Tree does on first use), so node.line is current
        self._label_updated()
        self.lines.repaint(self._changed, structural)
        self._changed = []
        # Put the cursor back on the same row (by key) if inserts or removals above moved it.
        if self.cursor_key is not None:
            node = self.nodes_by_key.get(self.cursor_key)
            if node is not None and self.cursor_node is not node and node.line >= 0:
                self.move_cursor(node)
        if self.cursor_node is None and self.root.children:
            self.move_cursor(self.root.children[0])

    def relabel(self) -> None:
        """Re-render every label (tags or width changed)."""
        self._labels.clear()
        self._changed, self._structural = [], False
        self._updated = [(node, node_depth(node)) for node in self.nodes_by_key.values()]
        self.last_line  # noqa: B018 -- lay the lines out now
        self._label_updated()
        self.lines.repaint(self._changed, False)
        self._changed = []

    def _label_updated(self) -> None:
        """Format the rows in view (on screen) that were given new data; mark the others stale (formatted
        when drawn)."""
        top = self.scroll_offset.y
        view = range(top, top + self.size.height)
        stale, bump = self._stale, self.lines.bump
        for tnode, depth in self._updated:
            if tnode.line in view:
                stale.pop(id(tnode), None)
                if self._cells(tnode, tnode.data, depth):
                    self._changed.append(tnode)
            else:
                stale[id(tnode)] = (tnode, depth)
                bump(tnode)  # no cached line of it is drawn again
        self._updated = []

    def _cells(self, tnode: TreeNode[Node], node: Node, depth: int) -> bool:
        """Work out a row's cells; if they changed, queue its Text (built when drawn). True if changed."""
        tagged = node.pid in self.tagged and node.kind == "holder"
        old = self._labels.get(node.key)
        cells = self._time_only(node, depth, tagged, old)
        if cells is None:
            cells = row_cells(node, depth, self._max_depth, tagged, self.compact)
        if old == cells:
            return False
        self._labels[node.key] = cells
        # Batched: TreeNode.set_label schedules one refresh per node; here the tree repaints once after
        # the whole reconcile (the line cache is keyed on each row's version).
        self._pending[id(tnode)] = cells
        self.lines.bump(tnode)
        return True

    def _time_only(self, node: Node, depth: int, tagged: bool, old: tuple | None) -> tuple | None:
        """A holder row's cells from its last ones when all it shows but TIME is as it was (most rows, every
        second): only TIME is formatted. None: work them out again (row_cells)."""
        h = node.holder
        at = _time_column(self.compact)
        if h is None:
            return None
        inputs = (h.verdict.kind, h.user, h.ctx, h.gpus, h.gpu_memory, h.sm_util, h.cpu_percent, h.rss, h.job,
                  h.cmd, node.pid, depth, self._max_depth, tagged, self.compact)
        same = self._inputs.get(node.key) == inputs
        self._inputs[node.key] = inputs
        if not same or at is None or old is None or old[0] != "row":
            return None
        i, width, align = at
        values = old[4]
        time_cell = _cell(fmt_duration(h.runtime), width, align)
        if values[i] == time_cell:
            return old
        return old[:4] + (values[:i] + (time_cell,) + values[i + 1:],) + old[5:]

    def _replace_children(self, parent: TreeNode[Node], wanted_list: list[str]) -> None:
        """Remove the children that are no longer wanted; if the rest are out of order, remove them all
        (they are added back in order, their expansion kept by key)."""
        wanted_keys = set(wanted_list)
        for child in list(parent.children):
            if child.data is None or child.data.key not in wanted_keys:
                self._forget(child)
                child.remove()
                self._structural = True
        present = [c.data.key for c in parent.children]
        present_set = set(present)
        in_order = [k for k in wanted_list if k in present_set]
        if present != in_order:  # the sort order changed: re-add (expansion is kept by key)
            self._structural = True
            for child in list(parent.children):
                self._forget(child)
                child.remove()

    def _forget(self, tnode: TreeNode[Node]) -> None:
        stack = [tnode]
        while stack:
            n = stack.pop()
            if n.data is not None:
                self.nodes_by_key.pop(n.data.key, None)
                self._labels.pop(n.data.key, None)
                self._inputs.pop(n.data.key, None)
            self._pending.pop(id(n), None)
            self._stale.pop(id(n), None)
            self._texts.pop(id(n), None)
            self.lines.forget(n)
            stack.extend(n.children)

    def _reconcile_children(self, parent: TreeNode[Node], wanted: list[Node], depth: int) -> None:
        children = parent.children
        if not wanted and not children:  # a leaf stays a leaf (most rows)
            return
        wanted_list = [w.key for w in wanted]
        present = [c.data.key if c.data is not None else None for c in children]
        if present == wanted_list:  # the same rows in the same order (most refreshes): update in place
            existing = dict(zip(present, children))
        else:
            self._replace_children(parent, wanted_list)
            existing = {c.data.key: c for c in parent.children}
        updated = self._updated
        for i, w in enumerate(wanted):
            tnode = existing.get(w.key)
            if tnode is None:
                cells = row_cells(w, depth, self._max_depth, w.pid in self.tagged and w.kind == "holder",
                                  self.compact)
                tnode = parent.add(_UNDRAWN, data=w, before=i,
                                   expand=w.key not in self._collapsed, allow_expand=bool(w.children))
                self._pending[id(tnode)] = cells  # its Text is built when it is drawn
                self.lines.bump(tnode)
                self.nodes_by_key[w.key] = tnode
                self._labels[w.key] = cells
                self._structural = True
            else:
                tnode.data = w
                updated.append((tnode, depth))
                if tnode.allow_expand != bool(w.children):
                    tnode.allow_expand = bool(w.children)
                    self._changed.append(tnode)
            self._reconcile_children(tnode, w.children, depth + 1)
