"""The playing field: the same GPUs and holders for gputop's NVML backend, nvitop and the simulated backend.

The fake ``libnvidia-ml.so.1`` is built by tests/fakenvml/build.py (owned by the NVML work); it reads its
GPUs and holders (real PIDs) from the file named by ``$FAKE_NVML_CONFIG``. It must be on
``LD_LIBRARY_PATH`` when a process starts, so every NVML measurement runs in a subprocess.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT, gpu_specs, write_scenario

_LIB_DIR: Path | None = None
_LIB_ERROR: str | None = None


def fake_nvml_dir() -> Path | None:
    """Build the fake NVML library once per run; None (and ``fake_nvml_error()``) when it cannot be."""
    global _LIB_DIR, _LIB_ERROR
    if _LIB_DIR is not None or _LIB_ERROR is not None:
        return _LIB_DIR
    try:
        import importlib.util
        import sys

        if importlib.util.find_spec("gputop.backends.nvml") is None:
            raise RuntimeError("gputop.backends.nvml is not there yet")
        sys.path.insert(0, str(ROOT))
        from tests.fakenvml.build import build_fake_nvml  # noqa: PLC0415

        # A fixed directory: the build is cached by source hash, so later runs reuse it.
        _LIB_DIR = Path(build_fake_nvml(Path(tempfile.gettempdir()) / "gputop-bench-fakenvml"))
    except Exception as e:  # not landed yet, or no C compiler
        _LIB_ERROR = f"fake NVML library unavailable: {type(e).__name__}: {e}"
    return _LIB_DIR


def fake_nvml_error() -> str | None:
    fake_nvml_dir()
    return _LIB_ERROR


@dataclass
class Field:
    """Files describing one set of GPUs + holders, and the environments that select them."""

    gpus: int
    holders: list[tuple[int, int]]  # (gpu, pid)
    dir: Path

    @property
    def scenario(self) -> Path:
        return self.dir / "scenario.yaml"

    @property
    def nvml_config(self) -> Path:
        return self.dir / "fake_nvml.json"

    def write(self) -> "Field":
        write_scenario(self.scenario, self.gpus, self.holders)
        if fake_nvml_dir() is not None:
            from tests.fakenvml.build import write_fake_nvml_config  # noqa: PLC0415

            gpus = gpu_specs(self.gpus)
            holders = [{"pid": pid, "gpu": gpu, "memory": 1 << 30, "type": "C", "sm": 5}
                       for gpu, pid in self.holders]
            write_fake_nvml_config(self.nvml_config, gpus, holders)
        return self

    def env(self, backend: str) -> dict[str, str]:
        """A full environment for a subprocess that uses ``backend`` ('nvml' or 'simulated')."""
        env = dict(os.environ)
        for var in ("GPUTOP_SCENARIO", "GPUTOP_BACKEND", "GPUTOP_CONFIG", "PYTHONDONTWRITEBYTECODE"):
            env.pop(var, None)
        # A user with no config file: the user's own config and state stay out of the measurements.
        env["XDG_CONFIG_HOME"] = str(self.dir / "config")
        env["XDG_STATE_HOME"] = str(self.dir / "state")
        env["GPUTOP_STATE_DIR"] = str(self.dir / "state")
        if backend == "simulated":
            env["GPUTOP_BACKEND"] = "simulated"
            env["GPUTOP_SCENARIO"] = str(self.scenario)
        else:
            lib = fake_nvml_dir()
            if lib is None:
                raise RuntimeError(fake_nvml_error())
            env["GPUTOP_BACKEND"] = "nvml"
            env["FAKE_NVML_CONFIG"] = str(self.nvml_config)
            env["LD_LIBRARY_PATH"] = f"{lib}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else str(lib)
        return env


def make_field(gpus: int, holders: list[tuple[int, int]]) -> Field:
    return Field(gpus, holders, Path(tempfile.mkdtemp(prefix="gputop-bench-field-"))).write()
