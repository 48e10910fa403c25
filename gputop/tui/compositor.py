"""A partial screen update that renders only the widgets and lines that are repainted.

Textual's compositor (8.2) answers a partial update by rendering, in full, every widget that overlaps the
box around all dirty regions. Each second the top bar (the top line) and the process tree's TIME column
(near the bottom) change, so that box is the whole screen and every widget (the screen's own background,
the containers, the side panel, the scroll bars) renders all its lines, of which only the dirty spans are
written to the terminal. Here a widget renders only the lines where a dirty span crosses its columns and
widgets in front do not already cover it; a widget that no dirty span crosses renders nothing. What is
written is byte for byte the same (``tests/tui/test_compositor.py`` compares it with Textual's own
update on every frame).

Installed on the main screen only, and only when Textual's compositor has the shape this was written for;
otherwise Textual's own update runs.
"""

from __future__ import annotations

import inspect
from bisect import bisect_left

from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region
from textual.strip import Strip


def _compatible() -> bool:
    try:
        params = list(inspect.signature(ChopsUpdate.__init__).parameters)
        return (params == ["self", "chops", "spans", "chop_ends"]
                and callable(getattr(Compositor, "_regions_to_spans", None))
                and isinstance(getattr(Compositor, "visible_widgets", None), property)
                and isinstance(getattr(Compositor, "cuts", None), property)
                and hasattr(Compositor(), "_dirty_regions"))
    except (TypeError, ValueError):
        return False


_NOTHING = Strip([])


class SpanCompositor(Compositor):
    """Compositor whose partial update renders only what the dirty spans cross (see the module doc)."""

    def render_partial_update(self) -> ChopsUpdate | None:
        update_regions = self._dirty_regions.copy()
        self._dirty_regions.clear()
        if not update_regions:
            return None
        spans = list(self._regions_to_spans(update_regions))
        chops = self._span_chops(spans)
        return ChopsUpdate(chops, spans, [cut_set[1:] for cut_set in self.cuts])

    def _span_chops(self, spans: list[tuple[int, int, int]]) -> list[dict]:
        """Textual's _render_chops, front widget first, for the lines and columns the spans cross."""
        cuts = self.cuts
        chops: list[dict] = [{}] * len(cuts)  # ChopsUpdate reads only the lines of the spans
        by_row: dict[int, list[tuple[int, int]]] = {}
        for y, x1, x2 in spans:
            by_row.setdefault(y, []).append((x1, x2))
        for y, row_spans in by_row.items():
            # A chop that no span on its line reaches into is written as nothing, or as one cursor move
            # (a chop starting where a span ends), whatever it holds: an empty strip, rendered by nobody.
            cut_set = cuts[y]
            chops[y] = line = dict.fromkeys(cut_set[:-1])
            for cut, end in zip(cut_set, cut_set[1:]):
                if not any(x1 < end and x2 > cut for x1, x2 in row_spans):
                    line[cut] = _NOTHING
        dirty_rows = sorted(by_row)
        for widget, (region, clip) in self.visible_widgets.items():
            x, y0, width, height = region.intersection(clip)
            if not (width and height):
                continue
            right = x + width
            # A line where a chop of this widget's columns is still wanted: crossed by a dirty span and
            # not already covered by the widgets in front (a container behind its children, the screen
            # behind everything, draws nothing there).
            rows = [y for y in dirty_rows[bisect_left(dirty_rows, y0):bisect_left(dirty_rows, y0 + height)]
                    if any(chops[y][cut] is None for cut in cuts[y] if x <= cut < right)]
            if not rows:
                continue
            first = rows[0]
            strips = widget.render_lines(Region(x - region.x, first - region.y, width, rows[-1] - first + 1))
            for y in rows:
                strip = strips[y - first]
                line = chops[y]
                final_cuts = [cut for cut in cuts[y] if right >= cut >= x]
                get = line.get
                if len(final_cuts) == 2 and final_cuts[1] - x == strip.cell_length:
                    # One chop: the strip itself. Strip.divide([width]) would answer [strip] and keep that
                    # list in the strip's own cache, a cycle that only the cyclic GC frees (~5 strips a
                    # second, each with its seven caches, at 16 holders).
                    if get(final_cuts[0]) is None:
                        line[final_cuts[0]] = strip
                    continue
                for cut, part in zip(final_cuts, strip.divide([cut - x for cut in final_cuts[1:]])):
                    if get(cut) is None:  # painting front to back: the first widget at a cut wins
                        line[cut] = part
        return chops


COMPATIBLE = _compatible()


def install(screen) -> bool:
    """Use SpanCompositor for this screen's partial updates; False (nothing changed) when Textual's
    compositor is not the one it was written for."""
    compositor = getattr(screen, "_compositor", None)
    if not COMPATIBLE or type(compositor) is not Compositor:
        return False
    compositor.__class__ = SpanCompositor
    return True
