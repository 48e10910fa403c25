"""DRM devices and their metrics from sysfs, for GPUs no vendor library serves (amdgpu, i915, xe).

Read per card (``<sys>/class/drm/cardN/device`` is the PCI device directory):

- PCI address: the name of the device directory (``0000:03:00.0``); driver: ``device/driver`` link name
  (or ``DRIVER=`` in ``device/uevent``); ids: ``device/vendor``, ``device/device``.
- amdgpu: ``gpu_busy_percent``, ``mem_info_vram_used``, ``mem_info_vram_total`` (bytes),
  ``pp_dpm_sclk``/``pp_dpm_mclk`` (the line marked ``*``), ``product_name``, ``unique_id``.
- i915: ``cardN/gt_act_freq_mhz``; xe: ``device/tile0/gt0/freq0/act_freq``.
- hwmon (``device/hwmon/hwmon*``): ``temp1_input`` (m°C), ``power1_average`` or ``power1_input`` (µW),
  else the ``energy1_input`` (µJ) delta between two samples; ``power1_cap`` or ``power1_max`` (µW);
  ``pwm1``/``pwm1_max`` for the fan percentage.

A file that is missing or unreadable gives None (unknown), never 0.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class DrmCard:
    card: str  # "card0"
    device_dir: str  # <sys>/class/drm/card0/device (kept as a path under the sys root)
    pci: str | None  # "0000:03:00.0"
    driver: str | None  # amdgpu, i915, xe
    vendor_id: int | None = None
    device_id: int | None = None


def read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return None


def read_int(path: str, base: int = 10) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


def _uevent(device_dir: str) -> dict[str, str]:
    text = read_text(f"{device_dir}/uevent") or ""
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition("=")
        out[k] = v
    return out


def find_cards(sys_root: str, drivers: set[str] | frozenset[str]) -> list[DrmCard]:
    """DRM cards bound to one of ``drivers``, one per PCI device, ordered by PCI address."""
    base = f"{sys_root.rstrip('/')}/class/drm"
    try:
        names = os.listdir(base)
    except OSError:
        return []
    by_pci: dict[str, DrmCard] = {}
    for name in sorted(names, key=lambda n: (len(n), n)):
        if not (name.startswith("card") and name[4:].isdigit()):
            continue  # connectors (card0-DP-1) and render nodes
        device_dir = f"{base}/{name}/device"
        if not os.path.isdir(device_dir):
            continue
        uevent = _uevent(device_dir)
        driver = None
        try:
            driver = os.path.basename(os.readlink(f"{device_dir}/driver"))
        except OSError:
            driver = uevent.get("DRIVER")
        if driver not in drivers:
            continue
        pci = uevent.get("PCI_SLOT_NAME") or os.path.basename(os.path.realpath(device_dir)) or None
        card = DrmCard(name, device_dir, pci, driver, read_int(f"{device_dir}/vendor", 16),
                       read_int(f"{device_dir}/device", 16))
        by_pci.setdefault(pci or name, card)
    return sorted(by_pci.values(), key=lambda c: c.pci or c.card)


@lru_cache(maxsize=64)
def pci_name(vendor_id: int | None, device_id: int | None) -> str | None:
    """The device's name from the system's pci.ids, if installed."""
    if vendor_id is None or device_id is None:
        return None
    ven, dev = f"{vendor_id:04x}", f"\t{device_id:04x}"
    for path in ("/usr/share/hwdata/pci.ids", "/usr/share/misc/pci.ids", "/usr/share/pci.ids"):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                in_vendor = False
                for line in f:
                    if not line.startswith("\t"):
                        if in_vendor and line.strip() and not line.startswith("#"):
                            return None
                        in_vendor = line.startswith(ven + " ")
                    elif in_vendor and line.startswith(dev + " "):
                        return line.strip()[4:].strip()
        except OSError:
            continue
    return None


def _dpm_current(path: str) -> int | None:
    """``pp_dpm_sclk``: lines like ``1: 2100Mhz *``; the starred one is current."""
    text = read_text(path)
    if not text:
        return None
    for line in text.splitlines():
        if line.rstrip().endswith("*"):
            value = line.split(":", 1)[-1].replace("*", "").strip().lower()
            try:
                return int(value.removesuffix("mhz").strip())
            except ValueError:
                return None
    return None


def hwmon_dirs(card: DrmCard) -> list[str]:
    return sorted(glob.glob(f"{card.device_dir}/hwmon/hwmon*"))


@dataclass
class CardMetrics:
    name: str | None = None
    uuid: str | None = None
    util_gpu: float | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    temperature: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_pct: float | None = None
    clock_sm_mhz: int | None = None
    clock_mem_mhz: int | None = None
    energy_uj: int | None = None  # raw counter, for a power estimate from two samples


def read_card(card: DrmCard) -> CardMetrics:
    d = card.device_dir
    m = CardMetrics()
    if card.driver == "amdgpu":
        m.util_gpu = _float(read_int(f"{d}/gpu_busy_percent"))
        m.memory_total = read_int(f"{d}/mem_info_vram_total")
        m.memory_used = read_int(f"{d}/mem_info_vram_used")
        m.clock_sm_mhz = _dpm_current(f"{d}/pp_dpm_sclk")
        m.clock_mem_mhz = _dpm_current(f"{d}/pp_dpm_mclk")
        m.name = read_text(f"{d}/product_name") or None
        uid = read_text(f"{d}/unique_id")
        m.uuid = uid or None
    elif card.driver == "i915":
        m.clock_sm_mhz = read_int(f"{os.path.dirname(d)}/gt_act_freq_mhz")
    elif card.driver == "xe":
        m.clock_sm_mhz = read_int(f"{d}/tile0/gt0/freq0/act_freq")
    for hw in hwmon_dirs(card):
        if m.temperature is None:
            t = read_int(f"{hw}/temp1_input")
            m.temperature = t / 1000.0 if t is not None else None
        if m.power_w is None:
            p = read_int(f"{hw}/power1_average")
            if p is None:
                p = read_int(f"{hw}/power1_input")
            m.power_w = p / 1e6 if p is not None else None
        if m.power_limit_w is None:
            cap = read_int(f"{hw}/power1_cap")
            if cap is None:
                cap = read_int(f"{hw}/power1_max")
            m.power_limit_w = cap / 1e6 if cap else None
        if m.fan_pct is None:
            pwm = read_int(f"{hw}/pwm1")
            if pwm is not None:
                top = read_int(f"{hw}/pwm1_max") or 255
                m.fan_pct = round(pwm / top * 100.0, 1)
        if m.energy_uj is None:
            m.energy_uj = read_int(f"{hw}/energy1_input")
    if m.name is None:
        m.name = pci_name(card.vendor_id, card.device_id)
    return m


def _float(v: int | None) -> float | None:
    return float(v) if v is not None else None
