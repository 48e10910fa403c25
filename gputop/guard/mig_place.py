"""Where a holder runs, for the guard's ``gpu`` condition (issue 30): a GPU index (0), or a MIG device of it
named as the status table names it ("0:GI5" for GPU instance 5, "0:GI5/CI0" for one compute instance of it)
or by its MIG UUID ("MIG-..."). ``gpu == 0`` still matches every instance of GPU 0."""

from __future__ import annotations

import re

_PLACE = re.compile(r"\d{1,4}:GI\d{1,4}(/CI\d{1,4})?")
_MIG_UUID = re.compile(r"MIG-[0-9A-Za-z-]{1,64}")


def parse_place(value: object) -> int | str:
    """A GPU index, or a MIG device as "N:GIg", "N:GIg/CIc" or "MIG-..."; ValueError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        v = value.strip()
        if _PLACE.fullmatch(v) or _MIG_UUID.fullmatch(v):
            return v
    raise ValueError("a GPU index (0, 1, ...) or a MIG device ('0:GI5', '0:GI5/CI0' or its MIG-... UUID)")


def places(holder, snap) -> frozenset:
    """Every name of where ``holder`` runs: its GPU indexes, and for a use on a MIG device "N:GIg",
    "N:GIg/CIc" and the device's MIG UUID."""
    out: set = set(holder.gpus)
    for u in holder.uses:
        gi = getattr(u, "gpu_instance_id", None)
        if gi is None:
            continue
        out.add(f"{u.gpu}:GI{gi}")
        if u.compute_instance_id is not None:
            out.add(f"{u.gpu}:GI{gi}/CI{u.compute_instance_id}")
        inst = snap.instance_of(u) if hasattr(snap, "instance_of") else None
        if inst is not None and inst.uuid:
            out.add(inst.uuid)
    return frozenset(out)
