"""A snapshot as JSON: ``snapshot_to_dict`` (the document of ``gputop status --json``, /v1/status and the MCP
tools) and ``snapshot_json``, the same document as compact text, made faster.

The annotations name gputop.core.model's values, which are not imported here: the model imports this module
(``Snapshot.to_dict``), and this module only reads their fields.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (gputop status does not)

from gputop import __version__

if TYPE_CHECKING:
    from gputop.backends.base import DeviceSample, MigInstance
    from gputop.core.orphans import Verdict
    from gputop.core.ownership import Owner
    from gputop.core.procs import ProcInfo


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds")


def proc_to_dict(p: ProcInfo) -> dict:
    return {"pid": p.pid, "ppid": p.ppid, "start_time": p.start_time, "name": p.name,
            "cmdline": list(p.cmdline), "user": p.user}


def device_to_dict(d: DeviceSample) -> dict:
    return {
        "index": d.index, "backend": d.backend, "backend_index": d.backend_index, "name": d.name,
        "uuid": d.uuid, "pci_bus_id": d.pci_bus_id, "lost": d.lost,
        "memory_total": d.memory_total, "memory_used": d.memory_used,
        "utilization_gpu": d.util_gpu, "utilization_memory": d.util_mem,
        "temperature_c": d.temperature, "power_w": d.power_w, "power_limit_w": d.power_limit_w,
        "fan_percent": d.fan_pct, "clock_sm_mhz": d.clock_sm_mhz, "clock_mem_mhz": d.clock_mem_mhz,
        "errors": list(d.errors), "mig_enabled": getattr(d, "mig_enabled", None),
    }


def verdict_to_dict(v: Verdict) -> dict:
    return {"kind": v.kind, "reason": v.reason, "root": v.root, "reaper": v.reaper,
            "orphan_reason": v.orphan_reason}


def owner_to_dict(o: Owner | None) -> dict | None:
    return o.to_dict() if o is not None else None


def use_to_dict(u: GpuUse) -> dict:
    # Not dataclasses.asdict(): it deep-copies field by field (~10 us a use; 1,024 holders in one status).
    return {"gpu": u.gpu, "ctx": u.ctx, "used_memory": u.used_memory, "sm_util": u.sm_util,
            "gpu_instance_id": u.gpu_instance_id, "compute_instance_id": u.compute_instance_id, "source": u.source}


def instance_to_dict(m: MigInstance, s: Snapshot) -> dict:
    """One MIG device: its parent GPU (global index and UUID), ids, profile, MIG UUID, memory, utilisation
    (None: NVML says NOT_SUPPORTED on MIG) with its source, and the PIDs that hold it."""
    parent = s.device(m.gpu)
    return {"gpu": m.gpu, "parent_uuid": parent.uuid if parent is not None else None, "mig_index": m.mig_index,
            "gpu_instance_id": m.gpu_instance_id, "compute_instance_id": m.compute_instance_id,
            "profile": m.profile, "uuid": m.uuid, "name": m.name,
            "memory_total": m.memory_total, "memory_used": m.memory_used,
            "utilization_gpu": m.util_gpu, "utilization_source": m.util_source,
            "holders": [h.pid for h in s.holders_on_instance(m)], "errors": list(m.errors)}


def holder_to_dict(h: Holder, _entries: dict | None = None, standing: dict | None = None) -> dict:
    """``_entries``: chain entries already made in this document, by (process, owner) object; the
    holders of one tree share their ancestors, so a node's JSON makes each one once."""
    p = h.proc
    owners = h.chain_owners or (None,) * len(h.chain)
    d = {
        "pid": h.pid, "visible": h.visible, "start_time": h.start_time,
        "user": h.user, "name": h.name if p else None, "cmdline": list(p.cmdline) if p else None,
        "ppid": p.ppid if p else None, "sid": p.sid if p else None,
        "ctx": h.ctx, "gpus": list(h.gpus), "gpu_memory": h.gpu_memory, "sm_util": h.sm_util,
        "cpu_percent": round(h.cpu_percent, 1) if h.cpu_percent is not None else None,
        "rss": h.rss, "runtime": round(h.runtime, 1) if h.runtime is not None else None,
        "uses": [use_to_dict(u) for u in h.uses],
        "verdict": verdict_to_dict(h.verdict),
        "owner": owner_to_dict(h.owner),
        "slurm": slurm_to_dict(h),
        "standing": standing,
        "chain": [_chain_entry(c, o, _entries) for c, o in zip(h.chain, owners)],
    }
    # The memory ledger (docs/memory-ledger.md): how it was found, and its notes (NSpid, zombie, MPS); the
    # chain stays the last key (snapshot_json splices it in there).
    chain = d.pop("chain")
    d["source"] = h.source
    d["ledger"] = h.notes.to_dict() if h.notes is not None else None
    d["chain"] = chain
    return d


def _chain_entry(c: ProcInfo, o: Owner | None, entries: dict | None) -> dict:
    if entries is None:
        return {**proc_to_dict(c), "owner": owner_to_dict(o)}
    key = (id(c), id(o))  # both alive (held by the snapshot) while the document is made
    e = entries.get(key)
    if e is None:
        e = entries[key] = {**proc_to_dict(c), "owner": owner_to_dict(o)}
    return e


def slurm_to_dict(h: Holder) -> dict | None:
    """The holder's Slurm job: id, step, uid, where it was read, and slurmctld's state; None: no job."""
    if h.job is None:
        return None
    st = h.job_state
    return {**h.job.to_dict(), "state": st.state if st else None, "ended": st.ended if st else None,
            "state_detail": st.detail if st else None}


def snapshot_to_dict(s: Snapshot) -> dict:
    """The snapshot as JSON-ready data. Chain entries of holders that share an ancestor are one dict
    object (made once): serialise it, do not edit it in place."""
    entries: dict = {}
    gpu_holders = [
        {"gpu": u.gpu, "pid": h.pid, "ctx": u.ctx, "used_memory": u.used_memory, "sm_util": u.sm_util,
         "gpu_instance_id": u.gpu_instance_id, "compute_instance_id": u.compute_instance_id}
        for h in s.holders for u in h.uses
    ]
    return {
        "at": _iso(s.at),
        "at_epoch": s.at,
        "host": s.host,
        "platform": s.platform,
        "version": __version__,
        "gpu": {"gpus": [_with_allocation(device_to_dict(d), s) for d in s.devices], "holders": gpu_holders,
                "instances": [instance_to_dict(m, s) for m in getattr(s, "instances", ())]},
        "holders": [holder_to_dict(h, entries, standing_to_dict(s, h.pid)) for h in s.holders],
        "roots": [
            {**proc_to_dict(r.proc), "holders": list(r.holders), "gpus": list(r.gpus),
             "gpu_memory": r.gpu_memory, "reason": r.reason, "reaper": r.reaper,
             "owner": owner_to_dict(s.owner(r.pid))}
            for r in s.roots
        ],
        "warnings": list(s.warnings),
        "backends": [dataclasses.asdict(b) for b in s.backends],
        "allocation": s.allocation.to_dict() if s.allocation is not None else None,
        "ledger": _ledgers(s),
    }


def _with_allocation(d: dict, s: Snapshot) -> dict:
    """A GPU's entry with its allocation (job, user, since) and idle time; null where no scheduler is read."""
    a = s.allocation
    if a is None:
        d["allocation"] = None
        return d
    got = a.of(d["index"])
    d["allocation"] = got.to_dict() if got is not None else None
    if got is not None:
        d["allocation"]["idle_for"] = a.idle_for(d["index"], s.at)
    return d


def standing_to_dict(s: Snapshot, pid: int) -> dict | None:
    """A holder's standing against its GPUs' allocation (gputop.core.allocation); None: none read."""
    st = s.allocation.standing(pid) if s.allocation is not None else None
    return st.to_dict() if st is not None else None


def _ledgers(s: Snapshot) -> list[dict]:
    """Each GPU's memory ledger (gputop.core.ledger), as in docs/status-json.md."""
    from gputop.core.ledger import gpu_ledgers

    return [{"gpu": lg.gpu, **lg.to_dict()} for lg in gpu_ledgers(s)]


_COMPACT = None  # a json.JSONEncoder, made on first use (json.dumps makes one a call with these options)


def snapshot_json(s: Snapshot) -> str:
    """``snapshot_to_dict(s)`` as compact JSON: exactly what ``json.dumps(..., separators=(",", ":"),
    default=str)`` writes, made faster. The holders of one tree share their chain entries (about two
    thirds of the document at a thousand holders), and each is encoded once and spliced in."""
    global _COMPACT
    import json

    if _COMPACT is None:
        _COMPACT = json.JSONEncoder(separators=(",", ":"), default=str)
    enc = _COMPACT.encode
    doc = snapshot_to_dict(s)
    keys = list(doc)
    cut = keys.index("holders")
    head = enc({k: doc[k] for k in keys[:cut]})
    tail = enc({k: doc[k] for k in keys[cut + 1:]})
    done: dict[int, str] = {}  # id(chain entry) -> its JSON; the entries are held by doc meanwhile
    parts = []
    for h in doc["holders"]:
        chain = h.pop("chain")  # the last key: the rest of the holder, then the chain
        links = []
        for e in chain:
            text = done.get(id(e))
            if text is None:
                text = done[id(e)] = enc(e)
            links.append(text)
        parts.append(f'{enc(h)[:-1]},"chain":[{",".join(links)}]}}')
    return f'{head[:-1]},"holders":[{",".join(parts)}],{tail[1:]}'
