"""How the process tree draws its lines: one line cache, the last strip of each holder row, and the styled
lines, through Textual's public API only (issue 27; the fast path is issue 13's).

Every second the TIME column of each visible holder changes, so its line is rendered again. Tree's own
line rendering looks up six component styles, builds a guides Text, copies the label twice and appends it
for every such line; here the styles are worked out once per style change, and a line is guide segments
plus the label rendered once. The output is the same (tests/tui/test_render_lines.py compares every line
with Tree's own, and the snapshot tests check the screen).

A row whose only change is its TIME is not rendered again: the characters of its TIME cell are replaced in
the strip drawn last time (same styles, same cell widths), and in the line Textual styled from that strip
last time (kept here, with what it was styled under), so it is neither rendered nor styled again.

What a line shows is worked out from the tree's public state: the node at a line (``get_node_at_line``),
its ancestors (``parent``), whether each is the last of its siblings (``is_last``), the node under the mouse
(``hover_line``) and the cursor's (``cursor_node``), expansion (``is_expanded``, ``allow_expand``). Each row
has a version, new whenever its label changes (``bump``), so a cached line is never one of another row.
"""

from __future__ import annotations

import itertools

from rich.segment import Segment
from rich.style import Style
from textual.cache import LRUCache
from textual.geometry import Region
from textual.strip import Strip

LABEL_META = Style(meta={"label": True})  # what marks a row's label (see TreeLines.build)
LINE_CACHE_ROWS = 64  # drawn lines kept (at least the tree's height: grown to it)


def splice(strip: Strip, at: int, text: str) -> Strip:
    """``strip`` with the characters from offset ``at`` replaced by ``text`` (same length and cells)."""
    out, pos, end = [], 0, at + len(text)
    for seg in strip:
        seg_text = seg.text
        seg_end = pos + len(seg_text)
        if seg_end > at and pos < end and not seg.control:
            a, b = max(at, pos), min(end, seg_end)
            seg = Segment(seg_text[: a - pos] + text[a - at: b - at] + seg_text[b - pos:], seg.style, seg.control)
        out.append(seg)
        pos = seg_end
    return Strip(out, strip.cell_length)


class Line:
    """One line of the tree: its node, the path from the top level down to it, and the flags its guides
    and label are drawn with."""

    __slots__ = ("node", "path", "last", "hover", "cursor", "is_hover")

    def __init__(self, node, hover, cursor):
        path = [node]
        parent = node.parent
        while parent is not None and parent.parent is not None:  # up to the (hidden) root, not it
            path.append(parent)
            parent = parent.parent
        path.reverse()
        self.node, self.path = node, path
        self.last = len(path) == 1 or node.is_last  # the top level: always drawn as last (as Tree does)
        self.hover, self.cursor = hover, cursor
        self.is_hover = hover is not None and any(n is hover for n in path)


class TreeLines:
    """The line rendering and caches of one ProcessTree. ``labels`` (key -> cells) and ``stale`` (rows whose
    cells are worked out when drawn) are the tree's own."""

    def __init__(self, tree, labels: dict, stale: dict, *, width_of, time_column, value_offset):
        self.tree = tree
        self.labels, self.stale = labels, stale
        # the tree module's measures: a string's cells, where TIME is in a layout, where a value starts
        self.width_of, self.time_column, self.value_offset = width_of, time_column, value_offset
        self.cache: LRUCache[tuple, Strip] = LRUCache(LINE_CACHE_ROWS)
        # id(node) -> (cells, shape, strip, offset of TIME in the strip's text, index of TIME in the cells)
        self.drawn: dict[int, tuple] = {}
        self.versions: dict[int, int] = {}  # id(node) -> its label's version (unique over all rows)
        self._counter = itertools.count(1)
        self.style_version = 0  # new when the tree's styles change (notify_style_update)
        self.frame_style: Style | None = None  # the tree's rich_style, read once per frame
        self.pseudo: frozenset | None = None  # its pseudo classes (focus, hover), read once per frame
        self.dirty: set[int] = set()  # lines repainted for a changed row, not drawn since
        self.styled: dict[int, tuple] = {}  # screen line -> (context, strip it was styled from, styled strip)
        self.fresh: dict[int, Strip] = {}  # screen line -> the strip drawn for it in this frame
        self._styles: dict | None = None  # see line_styles

    # ---- versions ---------------------------------------------------------------------------------

    def bump(self, tnode) -> None:
        """The row's label changed (or is to be worked out again): no cached line of it is drawn again."""
        self.versions[id(tnode)] = next(self._counter)

    def forget(self, tnode) -> None:
        key = id(tnode)
        self.drawn.pop(key, None)
        self.versions.pop(key, None)

    def clear(self) -> None:
        """Drop every drawn and styled line (the next frame renders all from scratch)."""
        self.cache.clear()
        self.drawn.clear()
        self.styled.clear()

    def styles_changed(self) -> None:
        self.style_version += 1
        self.styled.clear()

    # ---- repaint ----------------------------------------------------------------------------------

    def repaint(self, changed: list, structural: bool) -> None:
        """Repaint what changed: the whole tree after an insert or removal, else only the changed lines.

        Most refreshes change a few columns of some rows (TIME, CPU%); repainting only those lines keeps
        Textual's compositor from re-rendering every visible row every second.
        """
        tree = self.tree
        if structural:
            self.dirty.clear()
            self.styled.clear()
            tree.refresh()
        elif changed:
            top, height = tree.scroll_offset.y, tree.size.height
            width = tree.scrollable_content_region.width  # not the scroll bar: it did not change
            lines = sorted({tnode.line for tnode in changed})
            regions = [Region(0, line - top, width, 1) for line in lines if top <= line < top + height]
            if regions:
                self.dirty.update(line for line in lines if top <= line < top + height)
                tree.refresh(*regions)  # one call (each refresh walks Textual's dirty-region bookkeeping)

    # ---- a frame ----------------------------------------------------------------------------------

    def render_lines(self, crop: Region, render) -> list[Strip]:
        """The styled lines of ``crop``: rows whose only change is TIME spliced in the lines styled last
        time, the others rendered and styled by ``render`` (Textual's)."""
        tree = self.tree
        self.frame_style = tree.rich_style
        self.pseudo = tree.get_pseudo_class_state()
        if self.cache.maxsize < tree.size.height:
            self.cache.grow(tree.size.height)
        self.fresh = {}
        try:
            full = crop.column_span == (0, tree.size.width) and not any(tree.styles.gutter) \
                and not tree.scroll_offset.x
            context = self._context() if full else None
            quick = self._splice_styled(crop, context) if full and self.dirty else {}
            out = self._render_rest(crop, quick, render)
            if full:
                for y, strip in self.fresh.items():
                    if crop.y <= y < crop.bottom:
                        self.styled[y] = (context, strip, out[y - crop.y])
            top = tree.scroll_offset.y
            self.dirty.difference_update(range(crop.y + top, crop.bottom + top))
            return out
        finally:
            self.frame_style = None
            self.fresh = {}

    def _context(self) -> tuple:
        """What Textual styles a line under: a styled line is reused only under the same."""
        tree = self.tree
        return (tree.size, tree.scroll_offset, self.frame_style, self.pseudo, tree.has_focus, self.style_version,
                tree.background_colors, tree.opacity, tree.virtual_size.width)

    @staticmethod
    def _render_rest(crop: Region, quick: dict[int, Strip], render) -> list[Strip]:
        if not quick:
            return render(crop)
        out: list[Strip] = []
        start = None
        for y in [*crop.line_range, crop.bottom]:
            if y < crop.bottom and y not in quick:
                start = y if start is None else start
                continue
            if start is not None:
                out.extend(render(Region(crop.x, start, crop.width, y - start)))
                start = None
            if y < crop.bottom:
                out.append(quick[y])
        return out

    def _splice_styled(self, crop: Region, context: tuple) -> dict[int, Strip]:
        """Lines whose only change is TIME, spliced in the line styled last time: {screen line: strip}."""
        tree = self.tree
        top, width = tree.scroll_offset.y, tree.size.width
        out = {}
        for y in crop.line_range:
            entry = self.styled.get(y)
            if y + top not in self.dirty or entry is None or entry[0] != context:
                continue
            line = self.line_at(y + top)
            drawn = self.drawn.get(id(line.node)) if line is not None else None
            if drawn is None or entry[1] is not drawn[2] or (self.stale and id(line.node) in self.stale):
                continue
            old = entry[2]
            shape = self.shape(y + top, line, width)
            key = (shape, self.versions.get(id(line.node)))
            if key in self.cache or old.text != drawn[2].text[:width]:
                continue
            strip = self.respliced(line, shape)
            if strip is None:
                continue
            at, text = drawn[3], strip.text
            if at + 8 > width:  # TIME (7 cells) reaches past the edge: cropped there
                continue
            self.cache[key] = strip
            out[y] = styled = splice(old, at, text[at:at + len(drawn[0][4][drawn[4]])])
            self.styled[y] = (context, strip, styled)
        return out

    # ---- one line ---------------------------------------------------------------------------------

    def line_at(self, y: int) -> Line | None:
        tree = self.tree
        node = tree.get_node_at_line(y)
        if node is None:
            return None
        hover = tree.get_node_at_line(tree.hover_line) if tree.hover_line >= 0 else None
        return Line(node, hover, tree.cursor_node)

    def render_line(self, y: int) -> Strip:
        """Screen line ``y`` of the tree (Tree.render_line, with this module's caches)."""
        tree = self.tree
        scroll_x, scroll_y = tree.scroll_offset
        width = tree.size.width
        style = self.frame_style or tree.rich_style
        strip = self.line(y + scroll_y, width, style)
        if self.frame_style is not None:
            self.fresh[y] = strip
        return strip.crop(scroll_x, scroll_x + width)

    def line(self, y: int, width: int, base_style: Style) -> Strip:
        """Line ``y`` of the tree (counted from its top, not the screen's), uncropped."""
        line = self.line_at(y)
        if line is None:
            return Strip.blank(width, base_style)
        if self.stale and id(line.node) in self.stale:
            self.tree.label_text(line.node)  # format a stale row now, before its version is read
        shape = self.shape(y, line, width)
        key = (shape, self.versions.get(id(line.node)))
        strip = self.cache.get(key)
        if strip is None:
            strip = self.respliced(line, shape)
            if strip is None:
                strip = self.build(y, line, width, base_style, shape)
            self.cache[key] = strip
        return strip

    def shape(self, y: int, line: Line, width: int) -> tuple:
        """Everything a drawn row depends on but its own cells (compared before reusing its strip)."""
        tree, node, hover, cursor = self.tree, line.node, line.hover, line.cursor
        return (y, line.is_hover, width, self.style_version, self.pseudo, tree.has_focus, line.last,
                tree.cursor_line == y, tree.hover_line == y, node.allow_expand, node.is_expanded,
                tuple((n is hover, n is cursor, n.is_last) for n in line.path[:-1]),
                node is hover, node is cursor, self.frame_style, tree.compact, tree.virtual_size.width)

    def respliced(self, line: Line, shape: tuple) -> Strip | None:
        """The row's last strip with only its TIME cell rewritten, when that is all that changed."""
        node = line.node
        drawn = self.drawn.get(id(node))
        if drawn is None or node.data is None:
            return None
        cells = self.labels.get(node.data.key)
        old_cells, old_shape, strip, at, ti = drawn
        if cells is None or cells[0] != "row" or ti is None or len(cells[4]) != len(old_cells[4]):
            return None
        old_values, values = old_cells[4], cells[4]
        if cells[:4] != old_cells[:4] or cells[5:] != old_cells[5:] or \
                values[:ti] != old_values[:ti] or values[ti + 1:] != old_values[ti + 1:]:
            return None
        new, old = values[ti], old_values[ti]
        if len(new) != len(old) or not (new.isascii() and old.isascii()) or shape != old_shape:
            return None
        strip = splice(strip, at, new)
        self.drawn[id(node)] = (cells, shape, strip, at, ti)
        return strip

    def line_styles(self) -> dict:
        tree = self.tree
        key = (self.style_version, self.pseudo, tree.has_focus)
        cached = self._styles
        if cached is not None and cached["key"] == key:
            return cached
        base = tree.get_component_rich_style("tree--guides", partial=True)
        st = {
            "key": key,
            "base_hidden": tree.get_component_styles("tree--guides").color.a == 0,
            "hover_hidden": tree.get_component_styles("tree--guides-hover").color.a == 0,
            "selected_hidden": tree.get_component_styles("tree--guides-selected").color.a == 0,
            "guide": base,
            "guide_hover": base + tree.get_component_rich_style("tree--guides-hover", partial=True),
            "guide_selected": base + tree.get_component_rich_style("tree--guides-selected", partial=True),
            "highlight_line": tree.get_component_rich_style("tree--highlight-line"),
            "label": tree.get_component_rich_style("tree--label", partial=True),
            "highlight": tree.get_component_rich_style("tree--highlight", partial=True),
            "cursor": tree.get_component_rich_style("tree--cursor", partial=False),
            "guides": {},
        }
        self._styles = st
        return st

    def guides(self, st: dict, style: Style, hidden: bool) -> tuple[str, str, str, str]:
        key = (style, hidden)
        out = st["guides"].get(key)
        if out is None:
            tree = self.tree
            if tree.show_guides and not hidden:
                lines = tree.LINES["bold"] if style.bold else (
                    tree.LINES["double"] if style.underline2 else tree.LINES["default"])
            else:
                lines = ("  ", "  ", "  ", "  ")
            depth = max(0, tree.guide_depth - 2)
            out = st["guides"][key] = tuple(f"{c[0]}{c[1] * depth} " for c in lines)  # type: ignore[assignment]
        return out  # type: ignore[return-value]

    def _guide_segments(self, line: Line, st: dict, line_style: Style) -> list[Segment]:
        """The guides in front of a row's label (Tree's, with the same styles)."""
        has_focus = self.tree.has_focus
        path, hover_node, cursor_node = line.path, line.hover, line.cursor
        hover = path[0] is hover_node
        selected = path[0] is cursor_node and has_focus
        segments: list[Segment] = []
        guide_style, hidden = st["guide"], True
        for node in path[1:]:
            hidden = st["base_hidden"]
            if hover:
                guide_style, hidden = st["guide_hover"], st["hover_hidden"]
            if selected:
                guide_style, hidden = st["guide_selected"], st["selected_hidden"]
            if node is not path[-1]:
                space, vertical, _, _ = self.guides(st, guide_style, hidden)
                segments.append(Segment(space if node.is_last else vertical, line_style + guide_style))
            hover = hover or node is hover_node
            selected = (selected or node is cursor_node) and has_focus
        if len(path) > 1:
            _, _, terminator, cross = self.guides(st, guide_style, hidden)
            segments.append(Segment(terminator if line.last else cross, line_style + guide_style))
        return segments

    def build(self, y: int, line: Line, width: int, base_style: Style, shape: tuple) -> Strip:
        tree = self.tree
        st = self.line_styles()
        line_style = (st["highlight_line"] if line.is_hover else base_style) + Style(meta={"line": y})
        segments = self._guide_segments(line, st, line_style)
        label_style = st["label"]
        if tree.hover_line == y:
            label_style += st["highlight"]
        if tree.cursor_line == y:
            label_style += st["cursor"]
        label = tree.render_label(line.node, line_style, label_style)
        # What Tree's guides Text gives the label it appends. Its {"line": y} meta makes a click anywhere on the
        # row select it (Tree's click handler reads only "line"). Tree's own render_line also marks the label
        # {"node": id}; node ids are never reused, so under churn every new row made new Styles, which
        # Textual's ANSI cache (16,384 entries) and Rich's kept: +12 MiB in ten minutes (issue 33). The label
        # is marked with a fixed meta instead (its segments stay apart from the guides' as in Tree's).
        label.style = line_style
        label.stylize(LABEL_META)
        label_at = sum(len(seg.text) for seg in segments) + len(label.plain) - len(
            tree.label_text(line.node).plain)
        segments.extend(label.render(tree.app.console))
        pad_width = max(tree.virtual_size.width, width)
        # Not Segment.cell_length (Rich's cell_len): its cache (4,096 entries) would keep every new row's
        # strings, and under churn every row is new (issue 33). No control segments here.
        width_of = self.width_of
        used = sum(width_of(seg.text) for seg in segments)
        if pad_width > used:
            segments.append(Segment(" " * (pad_width - used), line_style))
            used = pad_width
        strip = Strip(segments, used)
        self._remember(line, shape, strip, label_at)
        return strip

    def _remember(self, line: Line, shape: tuple, strip: Strip, label_at: int) -> None:
        """Keep a holder row's strip, its cells and where its TIME cell starts (see respliced)."""
        node = line.node
        cells = self.labels.get(node.data.key) if node.data is not None else None
        time_at = self.time_column(self.tree.compact) if cells is not None and cells[0] == "row" else None
        if time_at is None:
            self.drawn.pop(id(node), None)
            return
        ti = time_at[0]
        at = label_at + self.value_offset(cells, ti)
        self.drawn[id(node)] = (cells, shape, strip, at, ti)
