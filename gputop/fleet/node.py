"""The drill-down into one node: its GPUs and their holders, from the same series (two queries, sent only
while the node is open)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from gputop.fleet import queries
from gputop.fleet.client import Prometheus


@dataclass(frozen=True)
class GpuRow:
    gpu: str  # the index label
    uuid: str
    model: str
    util: float | None = None  # 0-1
    mem_used: float | None = None  # bytes
    mem_total: float | None = None
    temp: float | None = None
    lost: bool | None = None
    source: str = "gputop"


@dataclass(frozen=True)
class HolderRow:
    pid: int
    name: str
    user: str
    verdict: str
    gpus: tuple[str, ...]
    memory: float | None  # bytes, summed over its GPUs
    start_time: float | None  # the identity a kill is checked against on the node
    owner: str = ""
    standing: str = ""


@dataclass(frozen=True)
class NodeDetail:
    host: str
    gpus: tuple[GpuRow, ...]
    holders: tuple[HolderRow, ...]

    def to_dict(self) -> dict:
        return {"host": self.host, "gpus": [asdict(g) for g in self.gpus],
                "holders": [{**asdict(h), "gpus": list(h.gpus)} for h in self.holders]}


def _num(raw) -> float | None:
    try:
        v = float(raw)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _series(result):
    for s in result or ():
        m, v = s.get("metric"), s.get("value")
        if isinstance(m, dict) and isinstance(v, (list, tuple)) and len(v) == 2:
            yield {k: str(x) for k, x in m.items()}, _num(v[1])


_GPU_FIELDS = {"gputop_gpu_utilization_ratio": ("util", 1.0), "gputop_gpu_memory_used_bytes": ("mem_used", 1.0),
               "gputop_gpu_memory_total_bytes": ("mem_total", 1.0), "gputop_gpu_temperature_celsius": ("temp", 1.0),
               "DCGM_FI_DEV_GPU_UTIL": ("util", 0.01), "DCGM_FI_DEV_FB_USED": ("mem_used", 1048576.0),
               "DCGM_FI_DEV_GPU_TEMP": ("temp", 1.0)}


def gpus_from(result) -> tuple[GpuRow, ...]:
    acc: dict[str, dict] = {}
    free: dict[str, float] = {}
    for m, v in _series(result):
        name, gpu = m.get("__name__", ""), m.get("gpu", "?")
        g = acc.setdefault(gpu, {"gpu": gpu, "uuid": m.get("UUID", ""), "model": m.get("modelName", ""),
                                 "source": "dcgm" if name.startswith("DCGM") else "gputop"})
        if not name.startswith("DCGM"):
            g["source"] = "gputop"
        if name == "gputop_gpu_lost":
            g["lost"] = bool(v)
        elif name == "DCGM_FI_DEV_FB_FREE" and v is not None:
            free[gpu] = v * 1048576.0
        elif name in _GPU_FIELDS and v is not None:
            key, scale = _GPU_FIELDS[name]
            if name.startswith("DCGM") and key in g:  # gputop's own number wins
                continue
            g[key] = v * scale
    for gpu, f in free.items():
        g = acc[gpu]
        if g.get("mem_total") is None and g.get("mem_used") is not None:
            g["mem_total"] = g["mem_used"] + f
    return tuple(GpuRow(**g) for g in sorted(acc.values(), key=lambda g: (len(g["gpu"]), g["gpu"])))


def holders_from(result) -> tuple[HolderRow, ...]:
    acc: dict[int, dict] = {}
    for m, v in _series(result):
        try:
            pid = int(m.get("pid", ""))
        except ValueError:
            continue
        h = acc.setdefault(pid, {"pid": pid, "name": m.get("name", ""), "user": m.get("user", ""),
                                 "verdict": "?", "gpus": [], "memory": None, "start_time": None})
        name = m.get("__name__")
        if name == "gputop_process_verdict_info":
            h["verdict"] = m.get("verdict", "?")
        elif name == "gputop_process_gpu_memory_bytes":
            h["gpus"].append(m.get("gpu", "?"))
            if v is not None:
                h["memory"] = (h["memory"] or 0.0) + v
        elif name == "gputop_process_start_time_seconds":
            h["start_time"] = v
        elif name == "gputop_process_owner_info":
            h["owner"] = m.get("slurm_job") or m.get("pod") or m.get("unit") or m.get("owner_kind", "")
        elif name == queries.STANDING:
            h["standing"] = m.get("standing", "")
    return tuple(HolderRow(**{**h, "gpus": tuple(sorted(set(h["gpus"])))})
                 for h in sorted(acc.values(), key=lambda h: -(h["memory"] or 0.0)))


def node_detail(prom: Prometheus, host: str) -> NodeDetail:
    devices = prom.query(queries.node_devices_query(host))
    procs = prom.query(queries.node_processes_query(host))
    return NodeDetail(host=host, gpus=gpus_from(devices), holders=holders_from(procs))
