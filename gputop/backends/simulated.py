"""The simulated backend: GPUs and holders described by a YAML scenario file that names live PIDs.

It is what the tests and the demo run on, and a way to try gputop without a GPU. The file is re-read when
it changes. A holder whose process has exited disappears, as the driver frees a dead process's context.

Scenario format::

    gpus:
      - name: Simulated H100 80GB     # every field but name is optional; a missing one is unknown
        memory_total: 80GiB
        memory_used: 2GiB             # optional; default: the sum of the live holders' memory
        utilization: 40               # optional; default: the live holders' SM%, capped at 100;
                                      # either way 0 once no holder is left (killed, or the GPU reset)
        memory_utilization: 20        # 0 too once no holder is left
        temperature: 55
        power: 250                    # watts
        power_limit: 700
        fan: 30
        clock_sm: 1980
        clock_mem: 2619
        lost: false                   # true: the device fell off the bus
        minor: 0                      # optional: the node /dev/nvidia0 (char 195:0): Slurm's gres.conf File=
                                      # maps to it, and its device-file holders are found (default: no node;
                                      # Slurm's IDX then maps by position)
        mig:                          # optional: MIG on, these MIG devices (GPU utilisation is then N/A)
          - {gi: 1, ci: 0, profile: 3g.71gb, memory_total: 71GiB}
          - {gi: 5, ci: 0, profile: 1g.18gb, memory_total: 18GiB, uuid: MIG-..., utilization: 30}
    holders:
      - pid: 12345
        gpu: 0
        memory: 4GiB                  # or null: unknown (as under WDDM or MIG)
        type: C                       # C, G or C+G
        sm: 95                        # per-process SM%, optional
        start_time: 1764470000.12     # optional: pins the identity, so a reused PID is not a holder
        visible: true                 # false: a PID this namespace cannot see (kept, reported as such)
        gi: 5                         # MIG: its GPU instance (and ci: compute instance, default 0);
                                      # its SM% is then N/A, as NVML says NOT_SUPPORTED
        keep_zombie: false            # true: still listed once the process is a zombie (as NVML may do)
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from gputop.backends.base import (
    CONTEXT_TYPES, Backend, BackendUnavailable, DeviceSample, GpuProcess, MigInstance, ResetError,
)
from gputop.util.errors import UsageError
from gputop.util.units import parse_memory

ENV_SCENARIO = "GPUTOP_SCENARIO"


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True)
class _Holder:
    pid: int
    gpu: int
    memory: int | None
    ctx: str
    sm: float | None
    start_time: float | None
    visible: bool
    gi: int | None = None  # MIG: GPU instance and compute instance
    ci: int | None = None
    keep_zombie: bool = False


def _num(d: dict, key: str, where: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ScenarioError(f"{where}: '{key}' must be a number, got {v!r}")
    return v


def _minor(g: dict, where: str) -> int | None:
    v = g.get("minor")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < (1 << 20):
        raise ScenarioError(f"{where}: 'minor' must be a device minor number (0..1048575), got {v!r}")
    return v


def _parse_mig(mig: object, where: str, gpu: int) -> list[MigInstance] | None:
    """A GPU's ``mig`` list: its MIG devices (None: MIG off)."""
    if mig is None:
        return None
    if not isinstance(mig, list):
        raise ScenarioError(f"{where}: 'mig' must be a list of MIG devices")
    out = []
    for k, m in enumerate(mig):
        at = f"{where}.mig[{k}]"
        if not isinstance(m, dict) or not isinstance(m.get("gi"), int) or not isinstance(m.get("ci", 0), int):
            raise ScenarioError(f"{at}: needs an integer 'gi' (and 'ci', default 0)")
        try:
            total = parse_memory(m["memory_total"]) if m.get("memory_total") is not None else None
        except ValueError as e:
            raise ScenarioError(f"{at}: {e}") from None
        util = _num(m, "utilization", at)
        out.append(MigInstance(gpu=gpu, mig_index=k, gpu_instance_id=m["gi"], compute_instance_id=m.get("ci", 0),
                               profile=str(m["profile"]) if m.get("profile") is not None else None,
                               uuid=str(m.get("uuid", f"MIG-5140a7ed-{gpu:04x}-4000-8000-{k:012d}")),
                               name=f"Simulated MIG {m.get('profile', '')}".strip(), memory_total=total,
                               util_gpu=util, util_source="scenario" if util is not None else None))
    return out


def _instance_of(h: dict, mig: list[MigInstance] | None, where: str) -> tuple[int | None, int | None]:
    """A holder's (gi, ci): None, None off MIG; one of its GPU's MIG devices when given."""
    if h.get("gi") is None:
        return None, None
    gi, ci = h.get("gi"), h.get("ci", 0)
    if not mig or not any(m.gpu_instance_id == gi and m.compute_instance_id == ci for m in mig):
        raise ScenarioError(f"{where}: 'gi: {gi}, ci: {ci}' is not a MIG device of its GPU")
    return gi, ci


def _zombie(h: _Holder) -> bool:
    """The holder's process has exited and its parent has not waited for it yet (same start time). psutil:
    a backend does not import core (the layers contract)."""
    import psutil

    try:
        p = psutil.Process(h.pid)
        return (p.status() == psutil.STATUS_ZOMBIE
                and (h.start_time is None or abs(p.create_time() - h.start_time) < 0.05))
    except (psutil.Error, OSError):
        return False


def parse_scenario(data: object, source: str = "scenario") -> tuple[list[dict], list[_Holder]]:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping with 'gpus' and 'holders'")
    gpus = data.get("gpus") or []
    if not isinstance(gpus, list):
        raise ScenarioError(f"{source}: 'gpus' must be a list")
    out_gpus = []
    for i, g in enumerate(gpus):
        where = f"{source}: gpus[{i}]"
        if not isinstance(g, dict):
            raise ScenarioError(f"{where}: expected a mapping")
        try:
            mt = parse_memory(g["memory_total"]) if g.get("memory_total") is not None else None
            mu = parse_memory(g["memory_used"]) if g.get("memory_used") is not None else None
        except ValueError as e:
            raise ScenarioError(f"{where}: {e}") from None
        out_gpus.append({
            "name": str(g.get("name", f"Simulated GPU {i}")),
            "uuid": str(g.get("uuid", f"GPU-5140a7ed-0000-4000-8000-{i:012d}")),
            "pci_bus_id": str(g.get("pci_bus_id", f"00000000:{0x10 + i:02X}:00.0")),
            "memory_total": mt, "memory_used": mu,
            "utilization": _num(g, "utilization", where),
            "memory_utilization": _num(g, "memory_utilization", where),
            "temperature": _num(g, "temperature", where),
            "power": _num(g, "power", where), "power_limit": _num(g, "power_limit", where),
            "fan": _num(g, "fan", where),
            "clock_sm": _num(g, "clock_sm", where), "clock_mem": _num(g, "clock_mem", where),
            "lost": bool(g.get("lost", False)),
            "minor": _minor(g, where),
            "mig": _parse_mig(g.get("mig"), where, i),
        })
    holders = data.get("holders") or []
    if not isinstance(holders, list):
        raise ScenarioError(f"{source}: 'holders' must be a list")
    out_h = []
    for i, h in enumerate(holders):
        where = f"{source}: holders[{i}]"
        if not isinstance(h, dict) or not isinstance(h.get("pid"), int):
            raise ScenarioError(f"{where}: needs an integer 'pid'")
        gpu = h.get("gpu", 0)
        if not isinstance(gpu, int) or not 0 <= gpu < len(out_gpus):
            raise ScenarioError(f"{where}: 'gpu' must be an index below {len(out_gpus)}")
        ctx = str(h.get("type", "C"))
        if ctx not in CONTEXT_TYPES:
            raise ScenarioError(f"{where}: 'type' must be one of C, G, C+G")
        try:
            mem = parse_memory(h["memory"]) if h.get("memory") is not None else None
        except ValueError as e:
            raise ScenarioError(f"{where}: {e}") from None
        st = h.get("start_time")
        gi, ci = _instance_of(h, out_gpus[gpu]["mig"], where)
        out_h.append(_Holder(
            pid=h["pid"], gpu=gpu, memory=mem, ctx=ctx, sm=_num(h, "sm", where),
            start_time=float(st) if st is not None else None, visible=bool(h.get("visible", True)),
            gi=gi, ci=ci,
            keep_zombie=bool(h.get("keep_zombie", False)),
        ))
    return out_gpus, out_h


class SimulatedBackend(Backend):
    name = "simulated"
    vendor = "simulated"

    def __init__(self, path: str | os.PathLike | None = None):
        path = path or os.environ.get(ENV_SCENARIO)
        if not path:
            raise BackendUnavailable(f"simulated: no scenario file (use --scenario FILE or ${ENV_SCENARIO})")
        self.path = Path(path)
        self._lock = threading.Lock()
        self._mtime: int | None = None
        self._gpus: list[dict] = []
        self._holders: list[_Holder] = []
        # index -> time of the last reset; holders that started before it are gone. Resets are kept in
        # a file beside the scenario, so that a reset by one gputop process is seen by every other.
        self._resets: dict[int, float] = {}
        self._resets_log = self.path.with_name(self.path.name + ".resets.jsonl")
        self._resets_mtime: int | None = None
        self._reload(initial=True)

    # The scenario is re-read whenever its mtime changes; a bad edit keeps the last good scenario.
    def _reload(self, initial: bool = False) -> None:
        try:
            st = self.path.stat()
        except OSError as e:
            if initial:  # a scenario file the user named and that is not there is bad input (exit 2)
                raise UsageError(f"simulated: cannot read scenario {self.path}: {e.strerror} "
                                 "(see README: 'Trying gputop without a GPU')") from None
            return
        if st.st_mtime_ns == self._mtime:
            return
        from gputop.util import safeyaml, trustfile  # bounded: size, aliases, nodes (a scenario may come from anyone)

        try:  # as root, only a file only root can change (gputop.util.trustfile)
            gpus, holders = parse_scenario(safeyaml.load(trustfile.read_text(self.path, "scenario")), str(self.path))
        except trustfile.UntrustedFile:  # refused at start (exit 2); later, the last good scenario stays
            if initial:
                raise
            return
        except ScenarioError as e:
            if initial:
                raise UsageError(f"bad scenario: {str(e).splitlines()[0]}") from None
            return
        except (yaml.YAMLError, ValueError) as e:
            if initial:  # bad input: exit 2 with the file and line, like a bad config or policy
                mark = getattr(e, "problem_mark", None)
                where = f" line {mark.line + 1}" if mark is not None else ""
                if isinstance(e, safeyaml.NotUtf8):  # not a syntax error: the bytes are not text
                    raise UsageError(f"scenario {self.path}: {e}") from None
                raise UsageError(f"scenario {self.path}{where}: YAML syntax error: "
                                 f"{getattr(e, 'problem', None) or e}") from None
            return
        except OSError as e:
            if initial:  # a scenario file the user named and that is not there is bad input (exit 2)
                raise UsageError(f"simulated: cannot read scenario {self.path}: {e.strerror} "
                                 "(see README: 'Trying gputop without a GPU')") from None
            return
        with self._lock:
            self._gpus, self._holders, self._mtime = gpus, holders, st.st_mtime_ns

    def _reload_resets(self) -> None:
        try:
            mtime = self._resets_log.stat().st_mtime_ns
        except OSError:
            return
        if mtime == self._resets_mtime:
            return
        from gputop.util import trustfile

        resets: dict[int, float] = {}
        try:  # as root, only a file only root can change: else the last resets read stay
            for line in trustfile.read_text(self._resets_log, "scenario resets log", 16 << 20).splitlines():
                try:
                    rec = json.loads(line)
                    resets[int(rec["gpu"])] = max(resets.get(int(rec["gpu"]), 0.0), float(rec["at"]))
                except (ValueError, KeyError, TypeError):
                    continue
        except (OSError, ValueError, trustfile.UntrustedFile):
            return
        self._resets, self._resets_mtime = resets, mtime

    def device_count(self) -> int:
        self._reload()
        return len(self._gpus)

    def _live(self, index: int) -> list[_Holder]:
        self._reload_resets()
        out = []
        reset_at = self._resets.get(index)
        for h in self._holders:
            if h.gpu != index:
                continue
            if not h.visible:  # cannot be checked here; a reset clears its context too
                if reset_at is None or (h.start_time is not None and h.start_time > reset_at):
                    out.append(h)
                continue
            st = self._start_of(h.pid)
            alive = st is not None and (h.start_time is None or st == h.start_time)
            if not alive and not (h.keep_zombie and _zombie(h)):
                continue
            if reset_at is not None and not self._started_after(h, reset_at):
                continue
            out.append(h)
        return out

    def _started_after(self, h: _Holder, t: float) -> bool:
        st = self._start_of(h.pid)
        return st is not None and st > t

    def _start_of(self, pid: int) -> float | None:
        return (self.host_start_time or _start_time)(pid)

    def device_node(self, index: int) -> int | None:
        self._reload()
        minor = self._gpus[index].get("minor") if 0 <= index < len(self._gpus) else None
        return os.makedev(195, minor) if minor is not None else None

    def sample(self, index: int) -> DeviceSample:
        self._reload()
        g = self._gpus[index]
        if g["lost"]:
            return DeviceSample(index=index, name=g["name"], uuid=g["uuid"], pci_bus_id=g["pci_bus_id"],
                                lost=True, errors=("GPU is lost",))
        live = self._live(index)
        used = g["memory_used"]
        if used is None and g["memory_total"] is not None:
            used = sum(h.memory or 0 for h in live)
        util, util_mem = g["utilization"], g["memory_utilization"]
        if g["mig"] is not None:  # with MIG on, NVML has no GPU-wide utilisation: the scenario's, else N/A
            pass
        elif util is None or (not live and index in self._resets):
            # From the live holders' SM% (0 with none left); a reset idles the GPU whatever the scenario
            # said. A scenario's own figure with no holder stands: a GPU busy with no process it can see
            # (another PID namespace, a miner) is a case gputop must show.
            sms = [h.sm for h in live if h.sm is not None]
            util = min(100.0, sum(sms)) if sms else (0.0 if not live else None)
            if not live and util_mem is not None:
                util_mem = 0.0
        return DeviceSample(
            index=index, name=g["name"], uuid=g["uuid"], pci_bus_id=g["pci_bus_id"],
            memory_total=g["memory_total"], memory_used=used, util_gpu=util,
            util_mem=util_mem, temperature=g["temperature"], power_w=g["power"],
            power_limit_w=g["power_limit"], fan_pct=g["fan"],
            clock_sm_mhz=int(g["clock_sm"]) if g["clock_sm"] is not None else None,
            clock_mem_mhz=int(g["clock_mem"]) if g["clock_mem"] is not None else None,
            backend=self.name, backend_index=index, mig_enabled=True if g["mig"] is not None else None,
        )

    def processes(self, index: int) -> list[GpuProcess]:
        self._reload()
        if self._gpus[index]["lost"]:
            return []
        merged: dict[object, GpuProcess] = {}  # by pid; by (pid, gi, ci) on a MIG device
        from gputop.backends.base import merge_ctx

        for h in self._live(index):
            prev = merged.get(h.pid)
            if h.gi is not None:  # on a MIG device: one entry per instance, SM% N/A (NOT_SUPPORTED)
                key = (h.pid, h.gi, h.ci)
                merged[key] = GpuProcess(h.pid, index, h.ctx, h.memory, None, h.visible, h.gi, h.ci)
                continue
            if prev is None:
                merged[h.pid] = GpuProcess(pid=h.pid, index=index, ctx=h.ctx, used_memory=h.memory,
                                           sm_util=h.sm, visible=h.visible)
            else:
                mem = None if prev.used_memory is None or h.memory is None else prev.used_memory + h.memory
                merged[h.pid] = GpuProcess(pid=h.pid, index=index, ctx=merge_ctx(prev.ctx, h.ctx),
                                           used_memory=mem, sm_util=prev.sm_util, visible=prev.visible)
        return list(merged.values())

    def minor_number(self, index: int) -> int | None:
        """The scenario's ``minor``, else the GPU's position (as NVIDIA numbers /dev/nvidiaN by default)."""
        self._reload()
        if not 0 <= index < len(self._gpus):
            return None
        minor = self._gpus[index]["minor"]
        return index if minor is None else minor

    def mig_instances(self, index: int) -> list[MigInstance]:
        self._reload()
        g = self._gpus[index]
        if g["lost"] or not g["mig"]:
            return []
        live = self._live(index)
        out = []
        for m in g["mig"]:
            on = [h for h in live if (h.gi, h.ci) == (m.gpu_instance_id, m.compute_instance_id)]
            known = [h.memory for h in on if h.memory is not None]
            out.append(dataclasses.replace(m, gpu=index, memory_used=sum(known)))
        return out

    def reset(self, index: int) -> str:
        self._reload()
        if not 0 <= index < len(self._gpus):
            raise ResetError(f"simulated: no GPU {index}", kind="failed")
        record = {"at": time.time(), "gpu": index, "scenario": str(self.path)}
        try:
            with open(self._resets_log, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:
            raise ResetError(f"simulated: cannot record the reset in {self._resets_log}: {e.strerror}") from None
        self._resets[index] = record["at"]
        return f"simulated GPU {index} reset: contexts cleared, recorded in {self._resets_log}"


def _start_time(pid: int) -> float | None:
    """The start time of a live process (None: gone, or a zombie), where no sampler has set
    ``host_start_time`` (a backend used on its own). psutil's create_time is /proc/stat's btime plus the
    start ticks, the same figure as core.procs.start_time (rounded alike, so a scenario's pinned start_time
    compares equal), at twice its cost. psutil is imported here: it imports subprocess, which a one-shot
    status run does without (tests/unit/test_cli_lazy.py)."""
    import psutil

    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return round(p.create_time(), 2)
    except (psutil.Error, OSError):
        return None
