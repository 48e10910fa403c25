"""A backend over DRM sysfs (device metrics) and DRM fdinfo (processes): the base of AMD and Intel.

Devices are the cards in ``<sys>/class/drm`` bound to the backend's drivers; processes are the DRM
clients whose ``drm-pdev`` is the card's PCI address. Nothing here assumes per-process data exists: a
device with no readable clients simply has no processes.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from gputop.backends.base import Backend, BackendUnavailable, DeviceSample, GpuProcess
from gputop.backends.drm_sysfs import CardMetrics, DrmCard, find_cards, read_card
from gputop.backends.fdinfo import FdinfoScanner, proc_root_default, shared_scanner, sys_root_default


class DrmBackend(Backend):
    needs_two_samples = True  # engine counters: utilisation is a delta between two samples
    list_source = "fdinfo"  # its holders and their memory come from DRM fdinfo

    drivers: frozenset[str] = frozenset()
    vendor_label = "GPU"  # used in names when sysfs and pci.ids give none

    def __init__(self, proc_root: str | None = None, sys_root: str | None = None, *,
                 scanner: FdinfoScanner | None = None, clock: Callable[[], float] = time.monotonic):
        self.proc_root = proc_root or proc_root_default()
        self.sys_root = sys_root or sys_root_default()
        self.scanner = scanner or shared_scanner(self.proc_root, self.sys_root)
        self.clock = clock
        self.cards: list[DrmCard] = find_cards(self.sys_root, self.drivers)
        self._energy: dict[str, tuple[int, float]] = {}

    def _no_device(self, extra: str = "") -> BackendUnavailable:
        drivers = "/".join(sorted(self.drivers))
        return BackendUnavailable(f"{self.name}: no {drivers} device in {self.sys_root.rstrip('/')}/class/drm"
                                  + (f" ({extra})" if extra else ""))

    def device_count(self) -> int:
        return len(self.cards)

    def _card(self, index: int) -> DrmCard:
        return self.cards[index]

    # -- metrics --
    def _fallback_name(self, card: DrmCard) -> str:
        ids = f"{card.vendor_id or 0:04x}:{card.device_id or 0:04x}"
        return f"{self.vendor_label} {card.driver} [{ids}]"

    def _power_from_energy(self, card: DrmCard, m: CardMetrics) -> float | None:
        if m.energy_uj is None:
            return None
        now = self.clock()
        prev = self._energy.get(card.card)
        self._energy[card.card] = (m.energy_uj, now)
        if prev is None or now <= prev[1] or m.energy_uj < prev[0]:
            return None
        return round((m.energy_uj - prev[0]) / 1e6 / (now - prev[1]), 1)

    def card_sample(self, index: int, card: DrmCard) -> DeviceSample:
        if not os.path.isdir(card.device_dir):
            return DeviceSample(index=index, name=self._fallback_name(card), pci_bus_id=card.pci, lost=True,
                                errors=("device directory vanished from sysfs",))
        m = read_card(card)
        power = m.power_w if m.power_w is not None else self._power_from_energy(card, m)
        util = m.util_gpu
        errors: tuple[str, ...] = ()
        if util is None and card.pci:
            # No busy counter in sysfs (i915, xe): the busiest engine summed over the visible clients.
            scan = self.scanner.scan()
            util = scan.device_util(card.pci)
            if util is not None and scan.unreadable:
                errors = ("utilization: from readable processes only",)
        return DeviceSample(
            index=index, name=m.name or self._fallback_name(card), uuid=m.uuid, pci_bus_id=card.pci,
            memory_total=m.memory_total, memory_used=m.memory_used, util_gpu=util,
            temperature=m.temperature, power_w=power, power_limit_w=m.power_limit_w, fan_pct=m.fan_pct,
            clock_sm_mhz=m.clock_sm_mhz, clock_mem_mhz=m.clock_mem_mhz, errors=errors,
        )

    def sample(self, index: int) -> DeviceSample:
        return self.card_sample(index, self._card(index))

    # -- processes --
    def drm_processes(self, index: int, pci: str | None) -> list[GpuProcess]:
        if not pci:
            return []
        scan = self.scanner.scan()
        return [GpuProcess(pid=u.pid, index=index, ctx=u.ctx, used_memory=u.memory, sm_util=u.util)
                for u in scan.uses.get(pci, ())]

    def processes(self, index: int) -> list[GpuProcess]:
        return self.drm_processes(index, self._card(index).pci)

    def warnings(self) -> list[str]:
        return self.scanner.warnings(once=True)
