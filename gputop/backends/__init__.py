"""Backend probing and selection.

``--backend`` / ``$GPUTOP_BACKEND`` picks one of: auto (default), nvml, amd, intel, simulated.
``--scenario FILE`` / ``$GPUTOP_SCENARIO`` implies simulated. Auto opens every vendor backend that
works here and records, for each one that does not, why.
"""

from __future__ import annotations

import dataclasses
import importlib
import os

from gputop.backends.base import Backend, BackendStatus, BackendUnavailable, DeviceSample, ProbeResult
from gputop.util.errors import GputopError, UnavailableError, UsageError

ENV_BACKEND = "GPUTOP_BACKEND"

# name -> "module:Class". Vendor backends are imported only when probed.
REGISTRY: dict[str, str] = {
    "nvml": "gputop.backends.nvml:NvmlBackend",
    "amd": "gputop.backends.amd:AmdBackend",
    "intel": "gputop.backends.intel:IntelBackend",
    "simulated": "gputop.backends.simulated:SimulatedBackend",
}
# What "auto" probes, in this order (their devices are numbered in this order too).
AUTO_ORDER: list[str] = ["nvml", "amd", "intel"]
CHOICES = ("auto", "nvml", "amd", "intel", "simulated")


def device_map(backends: list[Backend]) -> list[tuple[Backend, int]]:
    """Global device index -> (backend, backend's own index), in the backends' order; a backend that cannot
    count its devices now is left out."""
    out: list[tuple[Backend, int]] = []
    for b in backends:
        try:
            n = b.device_count()
        except Exception:
            continue
        out.extend((b, i) for i in range(n))
    return out


def read_device(gi: int, backend: Backend, local: int) -> DeviceSample:
    """One device's sample, numbered ``gi`` (global); a backend that fails makes that device lost."""
    try:
        dev = backend.sample(local)
    except Exception as e:  # a backend bug must degrade one device, not the program
        dev = DeviceSample(index=local, lost=True, errors=(f"sample failed: {e}",))
    if dev.index == gi and dev.backend == backend.name and dev.backend_index == local:
        return dev  # the backend filled them in (replace() costs ~20 us a device)
    return dataclasses.replace(dev, index=gi, backend=backend.name, backend_index=local)


def mig_instances(gi: int, backend: Backend, local: int, warnings: list[str]) -> list:
    """The MIG devices of one device, their parent numbered ``gi`` (global); a backend that fails adds a
    warning and shows none."""
    try:
        found = backend.mig_instances(local)
    except Exception as e:  # a backend bug must not stop the sample
        warnings.append(f"GPU {gi}: MIG devices could not be read: {e}")
        return []
    return [m if m.gpu == gi else dataclasses.replace(m, gpu=gi) for m in found]


def close_backends(backends: list[Backend]) -> None:
    """Close each backend; one that fails to close does not keep the others open."""
    for b in backends:
        try:
            b.close()
        except Exception:
            pass


def read_devices(backends: list[Backend]) -> tuple[DeviceSample, ...]:
    """Every device (no processes, no /proc): what a screen can show before the first full sample."""
    return tuple(read_device(gi, b, local) for gi, (b, local) in enumerate(device_map(backends)))


def _open(name: str, **kwargs) -> Backend:
    target = REGISTRY.get(name)
    if target is None:
        raise BackendUnavailable(f"{name}: not built into this gputop")
    mod_name, cls_name = target.split(":")
    try:
        cls = getattr(importlib.import_module(mod_name), cls_name)
    except ImportError as e:
        raise BackendUnavailable(f"{name}: {e}") from None
    return cls(**kwargs)


def probe(choice: str | None = None, scenario: str | None = None) -> ProbeResult:
    """Open the chosen backend(s). For 'auto', unavailable backends are reported, not fatal."""
    choice = choice or os.environ.get(ENV_BACKEND) or "auto"
    if scenario or (choice == "auto" and os.environ.get("GPUTOP_SCENARIO")):
        choice = "simulated"
    if choice not in CHOICES:
        raise UsageError(f"unknown backend '{choice}': choose one of {', '.join(CHOICES)}")
    result = ProbeResult()
    names = AUTO_ORDER if choice == "auto" else [choice]
    for name in names:
        kwargs = {"path": scenario} if name == "simulated" else {}
        try:
            backend = _open(name, **kwargs)
        except BackendUnavailable as e:
            result.statuses.append(BackendStatus(name, False, str(e)))
            continue
        except GputopError:  # bad input (a malformed scenario): the user must fix it, not "unavailable"
            raise
        except Exception as e:  # a vendor library failing in an unexpected way must not stop gputop
            result.statuses.append(BackendStatus(name, False, f"{name}: {type(e).__name__}: {e}"))
            continue
        try:
            count = backend.device_count()
        except Exception as e:
            backend.close()
            result.statuses.append(BackendStatus(name, False, f"{name}: cannot count devices: {e}"))
            continue
        result.backends.append(backend)
        result.statuses.append(BackendStatus(name, True, "", count))
    if choice != "auto" and not result.backends:
        raise UnavailableError(result.statuses[0].reason + _hint(choice))
    return result


def _hint(choice: str) -> str:
    if choice == "simulated":
        return " (see README: 'Trying gputop without a GPU')"
    return " (try --backend auto, or --scenario FILE for the simulated backend)"


def no_gpu_message(statuses: list[BackendStatus]) -> str:
    """One line that says why there is no GPU and points to the simulated backend."""
    reasons = "; ".join(s.reason for s in statuses if not s.available) or "no backend found a GPU"
    return (f"no GPU found ({reasons}). To try gputop without a GPU: gputop --demo, "
            f"or gputop --scenario FILE (see README).")
