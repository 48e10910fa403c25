"""AMD GPUs: amdsmi when it loads, else sysfs; processes from DRM fdinfo, united per PID with amdsmi's.

amdsmi (``pip install gputop[amd]`` plus ROCm's libamd_smi.so) gives device metrics, reset and the list of
ROCm (KFD) compute processes. Its process list holds only KFD processes, so graphics clients come from
DRM fdinfo; the two are merged per PID (context types merged, memory: the larger of the two, since both
count the same VRAM). ``import amdsmi`` raises KeyError, not ImportError, when libamd_smi.so is missing:
any exception from the import or from init means "amdsmi unavailable", with the reason.

amdsmi is used only with the real /sys: under a fixture sys root ($GPUTOP_SYS_ROOT) it would describe the
host, not the fixture.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from gputop.backends.base import (
    CTX_COMPUTE, BackendUnavailable, DeviceSample, GpuProcess, ResetError, merge_ctx,
)
from gputop.backends.drm import DrmBackend
from gputop.backends.drm_sysfs import DrmCard


def load_amdsmi() -> Any:
    """Import and initialise amdsmi; raise BackendUnavailable with the reason if either fails."""
    try:
        import amdsmi  # type: ignore[import-not-found]
    except ModuleNotFoundError as e:
        if e.name == "amdsmi":
            raise BackendUnavailable("amd: amdsmi not installed") from None
        raise BackendUnavailable(f"amd: amdsmi failed to import: {e}") from None
    except KeyError:  # amdsmi looks libamd_smi.so up in a dict of found libraries
        raise BackendUnavailable("amd: libamd_smi.so not found (install ROCm's amd-smi library)") from None
    except Exception as e:
        raise BackendUnavailable(f"amd: amdsmi failed to load: {type(e).__name__}: {e}") from None
    try:
        flags = getattr(getattr(amdsmi, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
        amdsmi.amdsmi_init(flags) if flags is not None else amdsmi.amdsmi_init()
    except Exception as e:
        raise BackendUnavailable(f"amd: amdsmi init failed: {type(e).__name__}: {e}") from None
    return amdsmi


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None  # amdsmi reports "N/A" strings for unsupported values
    return float(v)


def _norm_bdf(bdf: str | None) -> str | None:
    return bdf.lower() if bdf else None


class AmdBackend(DrmBackend):
    name = "amd"
    vendor = "amd"
    vendor_label = "AMD"
    drivers = frozenset({"amdgpu"})

    def __init__(self, proc_root: str | None = None, sys_root: str | None = None, *,
                 smi: Any = None, use_amdsmi: bool | None = None, **kw):
        super().__init__(proc_root, sys_root, **kw)
        self.smi = smi
        self.smi_reason = ""
        self.handles: list[Any] = []
        if use_amdsmi is None:
            use_amdsmi = smi is not None or self.sys_root.rstrip("/") == "/sys"
        if use_amdsmi and self.smi is None:
            try:
                self.smi = load_amdsmi()
            except BackendUnavailable as e:
                self.smi_reason = str(e).removeprefix("amd: ")
        if self.smi is not None:
            try:
                self.handles = list(self.smi.amdsmi_get_processor_handles())
            except Exception as e:
                self.smi_reason = f"amdsmi found no devices: {e}"
                self._shutdown()
        if self.handles:
            by_pci = {c.pci: c for c in self.cards}
            self.device_cards: list[DrmCard | None] = []
            self.device_pci: list[str | None] = []
            for h in self.handles:
                pci = _norm_bdf(self._smi(self.smi.amdsmi_get_gpu_device_bdf, h))
                self.device_pci.append(pci)
                self.device_cards.append(by_pci.get(pci))
        else:
            self._shutdown()
            if not self.cards:
                raise self._no_device(self.smi_reason)
            self.device_cards = list(self.cards)
            self.device_pci = [c.pci for c in self.cards]

    @property
    def mode(self) -> str:
        return "amdsmi" if self.handles else "sysfs"

    def _shutdown(self) -> None:
        if self.smi is not None:
            try:
                self.smi.amdsmi_shut_down()
            except Exception:
                pass
        self.smi = None
        self.handles = []

    def _smi(self, fn, *args) -> Any:
        try:
            return fn(*args)
        except Exception:
            return None

    def device_count(self) -> int:
        return len(self.device_pci)

    # -- metrics --
    def sample(self, index: int) -> DeviceSample:
        card = self.device_cards[index]
        base = self.card_sample(index, card) if card is not None else DeviceSample(
            index=index, pci_bus_id=self.device_pci[index])
        if not self.handles:
            return base
        return self._smi_sample(index, base)

    def _smi_sample(self, index: int, base: DeviceSample) -> DeviceSample:
        smi, h = self.smi, self.handles[index]
        fields: dict[str, Any] = {}
        asic = self._smi(smi.amdsmi_get_gpu_asic_info, h) or {}
        name = asic.get("market_name") if isinstance(asic, dict) else None
        if name and name != "N/A":
            fields["name"] = name
        uuid = self._smi(smi.amdsmi_get_gpu_device_uuid, h)
        if uuid:
            fields["uuid"] = uuid
        activity = self._smi(smi.amdsmi_get_gpu_activity, h)
        lost = activity is None and base.lost
        if isinstance(activity, dict):
            if _num(activity.get("gfx_activity")) is not None:
                fields["util_gpu"] = _num(activity.get("gfx_activity"))
            if _num(activity.get("umc_activity")) is not None:
                fields["util_mem"] = _num(activity.get("umc_activity"))
        vram = getattr(getattr(smi, "AmdSmiMemoryType", None), "VRAM", None)
        if vram is not None:
            total = _num(self._smi(smi.amdsmi_get_gpu_memory_total, h, vram))
            used = _num(self._smi(smi.amdsmi_get_gpu_memory_usage, h, vram))
            if total is not None:
                fields["memory_total"] = int(total)
            if used is not None:
                fields["memory_used"] = int(used)
        temp_t = getattr(getattr(smi, "AmdSmiTemperatureType", None), "EDGE", None)
        temp_m = getattr(getattr(smi, "AmdSmiTemperatureMetric", None), "CURRENT", None)
        if temp_t is not None and temp_m is not None:
            t = _num(self._smi(smi.amdsmi_get_temp_metric, h, temp_t, temp_m))
            if t is not None:
                fields["temperature"] = t
        power = self._smi(smi.amdsmi_get_power_info, h)
        if isinstance(power, dict):
            p = _num(power.get("current_socket_power"))
            if p is None:
                p = _num(power.get("average_socket_power"))
            if p is not None:
                fields["power_w"] = p
            lim = _num(power.get("power_limit"))
            if lim:
                fields["power_limit_w"] = lim / 1e6 if lim > 1e5 else lim  # µW in some versions
        merged = {k: v for k, v in fields.items() if v is not None}
        return dataclasses.replace(base, **merged, index=index, lost=lost)

    # -- processes --
    def processes(self, index: int) -> list[GpuProcess]:
        procs = {p.pid: p for p in self.drm_processes(index, self.device_pci[index])}
        if not self.handles:
            return list(procs.values())
        plist = self._smi(self.smi.amdsmi_get_gpu_process_list, self.handles[index]) or []
        for entry in plist:
            info = entry
            if not isinstance(info, dict):  # older amdsmi: handles, details from a second call
                info = self._smi(self.smi.amdsmi_get_gpu_process_info, self.handles[index], entry)
                if not isinstance(info, dict):
                    continue
            pid = info.get("pid")
            if not isinstance(pid, int) or pid <= 0:
                continue
            mem_usage = info.get("memory_usage") or {}
            mem = _num(mem_usage.get("vram_mem")) if isinstance(mem_usage, dict) else None
            if mem is None:
                mem = _num(info.get("mem"))
            mem_i = int(mem) if mem is not None else None
            prev = procs.get(pid)
            if prev is None:
                visible = os.path.isdir(f"{self.proc_root}/{pid}")
                procs[pid] = GpuProcess(pid=pid, index=index, ctx=CTX_COMPUTE, used_memory=mem_i, visible=visible)
            else:
                known = [m for m in (prev.used_memory, mem_i) if m is not None]
                procs[pid] = GpuProcess(pid=pid, index=index, ctx=merge_ctx(prev.ctx, CTX_COMPUTE),
                                        used_memory=max(known) if known else None, sm_util=prev.sm_util,
                                        visible=prev.visible)
        return [procs[p] for p in sorted(procs)]

    # -- reset --
    def reset(self, index: int) -> str:
        pci = self.device_pci[index]
        if not self.handles:
            raise ResetError(f"amd: reset needs amdsmi ({self.smi_reason or 'not loaded'}); "
                             "install it with: pip install 'gputop[amd]'", kind="unsupported")
        if hasattr(os, "geteuid") and os.geteuid() != 0:
            raise ResetError(f"amd: resetting GPU {pci} needs root (amdsmi_reset_gpu); run with sudo",
                             kind="permission")
        try:
            self.smi.amdsmi_reset_gpu(self.handles[index])
        except Exception as e:
            raise ResetError(f"amd: amdsmi_reset_gpu failed on {pci}: {e}", kind="failed") from None
        return f"reset AMD GPU {pci} with amdsmi_reset_gpu"

    def close(self) -> None:
        self._shutdown()
