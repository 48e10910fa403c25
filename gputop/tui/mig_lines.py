"""The device board's line for a MIG device (issue 30), under its GPU's lines: its place (GPU:MIG index),
profile and ids, utilisation (N/A where NVML answers NOT_SUPPORTED, never 0; else with its source) and
memory. Pieces as device_pane's: (text, style) tuples."""

from __future__ import annotations

from gputop.backends.base import MigInstance
from gputop.util.textsafe import visible
from gputop.util.units import fmt_bytes, fmt_opt


def _style(v: float | None) -> str:
    if v is None:
        return "dim"
    return "bold red" if v >= 90 else "yellow" if v >= 60 else "green"


def instance_pieces(m: MigInstance, width: int) -> tuple:
    """One line: ``  └ 0:1 MIG 1g.18gb  GI 5/CI 0   UTIL N/A   MEM 3.0GiB/18GiB``."""
    profile = visible(m.profile or "?")
    gi = "?" if m.gpu_instance_id is None else m.gpu_instance_id
    ci = "?" if m.compute_instance_id is None else m.compute_instance_id
    head = f"  └ {m.gpu}:{m.mig_index} MIG {profile:<8} GI {gi}/CI {ci}"
    util = fmt_opt(m.util_gpu, "{:.0f}%")
    if m.util_gpu is not None and m.util_source:
        util += f" ({visible(m.util_source)})"
    pct = 100.0 * m.memory_used / m.memory_total if m.memory_used is not None and m.memory_total else None
    mem = f"{fmt_bytes(m.memory_used)}/{fmt_bytes(m.memory_total)}"
    line = ((head, "bold"), ("   UTIL ", ""), (util, _style(m.util_gpu)), ("   MEM ", ""), (mem, _style(pct)))
    if width and sum(len(t) for t, _ in line) > width:  # a narrow screen: the ids go first
        line = ((f"  └ {m.gpu}:{m.mig_index} MIG {profile}", "bold"),) + line[1:]
    return line


def by_gpu(instances) -> dict[int, list[MigInstance]]:
    """The MIG devices of each GPU (global index), in NVML's order."""
    out: dict[int, list[MigInstance]] = {}
    for m in instances:
        out.setdefault(m.gpu, []).append(m)
    return out
