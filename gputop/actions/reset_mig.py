"""A reset of a MIG-enabled GPU (issue 30): refused while any of its MIG devices is held, even with --force
and in a dry run, naming the holders per instance. Each instance is another user's slice of the GPU: a reset
destroys every slice's work, so gputop leaves it to the holders (or an admin) to empty the instances first."""

from __future__ import annotations

from gputop.util.textsafe import visible


def mig_refusal(snap, index: int, holders) -> tuple[str, list[dict]] | None:
    """(message, per-instance details) when GPU ``index`` has MIG devices and any holder; None otherwise."""
    instances = snap.instances_on(index) if getattr(snap, "instances", ()) else []
    if not instances or not holders:
        return None
    parts, details, placed = [], [], set()
    for m in instances:
        on = snap.holders_on_instance(m)
        placed.update(h.pid for h in on)
        details.append({"gpu_instance_id": m.gpu_instance_id, "compute_instance_id": m.compute_instance_id,
                        "profile": m.profile, "uuid": m.uuid, "holders": [h.pid for h in on]})
        if on:
            parts.append(f"{visible(m.label)}: " + ", ".join(_who(h) for h in on))
    rest = [h for h in holders if h.pid not in placed]
    if rest:  # a holder NVML did not place on an instance: named too, never left out
        parts.append("no instance known: " + ", ".join(_who(h) for h in rest))
    return (f"GPU {index} has MIG on and {len(holders)} process(es) hold its instances: " + "; ".join(parts)
            + f"; a reset ends every instance's work, so gputop refuses it (even with --force) until they stop",
            details)


def _who(h) -> str:
    return f"{h.pid} ({visible(h.name)}, {visible(h.user or '?')})"
