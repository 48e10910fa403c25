"""The NVML backend's minor numbers (nvmlDeviceGetMinorNumber), which map Slurm's GRES IDX to GPUs
(gputop.core.allocation), read from the fake libnvidia-ml through the real ctypes path."""

from __future__ import annotations

import pytest

from tests.fakenvml.build import compiler
from tests.functional.test_nvml_backend import fake_libs, nvml, run_py  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(compiler() is None, reason="gcc is needed to build the fake NVML library")


def test_minor_numbers_come_from_nvml_and_a_lost_gpu_has_none(nvml):  # noqa: F811
    env = nvml([{}, {}, {"lost": True}])
    out = run_py("""
        import json
        from gputop.backends.nvml import NvmlBackend
        b = NvmlBackend()
        print(json.dumps({"minors": [b.minor_number(i) for i in range(b.device_count())]}))
        b.close()
    """, env)
    assert out["minors"] == [0, 1, None]  # the fake's minor is the device's index
