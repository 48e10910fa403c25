"""Intel GPUs (i915 and xe) through sysfs and DRM fdinfo; there is no vendor library to load."""

from __future__ import annotations

from gputop.backends.drm import DrmBackend


class IntelBackend(DrmBackend):
    name = "intel"
    vendor = "intel"
    vendor_label = "Intel"
    drivers = frozenset({"i915", "xe"})

    def __init__(self, proc_root: str | None = None, sys_root: str | None = None, **kw):
        super().__init__(proc_root, sys_root, **kw)
        if not self.cards:
            raise self._no_device()
