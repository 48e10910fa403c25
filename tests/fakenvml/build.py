"""Build the fake NVML library (libnvidia-ml.so.1) and write its config file.

    libdir = build_fake_nvml(tmp_dir)                 # put libdir on LD_LIBRARY_PATH
    write_fake_nvml_config(cfg, gpus=[{...}, {...}], holders=[{"pid": p.pid, "gpu": 0, "memory": 2 << 30}])
    env = {"LD_LIBRARY_PATH": str(libdir), "FAKE_NVML_CONFIG": str(cfg)}

The library is the only fake in the project: pynvml, gputop's NVML backend and nvitop load it through
the real ctypes bindings. See fakenvml.c for the config format and the knobs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fakenvml.c"
LIBNAME = "libnvidia-ml.so.1"

# variant -> extra compiler flags. no_v3: the _v3 process-list symbols are absent (an older driver);
# v1: an old driver: no _v3/_v2 process calls, no nvmlDeviceGetMemoryInfo_v2 or nvmlDeviceGetTemperatureV.
VARIANTS = {"default": [], "no_v3": ["-DNO_V3"], "v1": ["-DNO_V3", "-DNO_V2"]}

GiB = 1 << 30
DEFAULT_GPU = {
    "name": "NVIDIA H100 80GB HBM3",
    "memory_total": 80 * GiB,
    "memory_used": "auto",  # the sum of the live holders' memory
    "utilization": "auto",  # the live holders' SM%, capped at 100
    "memory_utilization": 5,
    "temperature": 40,
    "power": 120.0,  # W
    "power_limit": 700.0,  # W
    "fan": 30,
    "clock_sm": 1980,
    "clock_mem": 2619,
    "max_clock_sm": 1980,
    "max_clock_mem": 2619,
    "pstate": 0,
}


class FakeNvmlBuildError(RuntimeError):
    pass


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")


def build_fake_nvml(outdir: str | os.PathLike, variant: str = "default") -> Path:
    """Compile fakenvml.c into ``<outdir>/<variant>-<hash>/libnvidia-ml.so.1``; return that directory.

    The build is cached by the hash of the source and flags, and is atomic (safe to call from
    several processes at once). Raises FakeNvmlBuildError when there is no C compiler or it fails.
    """
    flags = VARIANTS[variant]
    src = SOURCE.read_bytes()
    digest = hashlib.sha256(src + " ".join(flags).encode()).hexdigest()[:16]
    libdir = Path(outdir) / f"{variant}-{digest}"
    lib = libdir / LIBNAME
    if lib.exists():
        return libdir
    cc = compiler()
    if cc is None:
        raise FakeNvmlBuildError("no C compiler (gcc) on PATH: install gcc to build the fake NVML library")
    libdir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=libdir)
    os.close(fd)
    cmd = [cc, "-O2", "-g", "-Wall", "-Wextra", "-std=gnu11", "-shared", "-fPIC",
           "-fvisibility=hidden", f"-Wl,-soname,{LIBNAME}", *flags, "-o", tmp, str(SOURCE), "-lpthread"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        os.unlink(tmp)
        raise FakeNvmlBuildError(f"building the fake NVML library failed:\n{' '.join(cmd)}\n{r.stderr}")
    os.replace(tmp, lib)
    return libdir


def _bytes(v) -> int:
    if isinstance(v, str):
        from gputop.util.units import parse_memory

        return int(parse_memory(v))
    return int(v)


def _clean(s: str) -> str:
    return str(s).replace("\t", " ").replace("\n", " ")


def _gpu_line(i: int, g: dict) -> str:
    g = {**DEFAULT_GPU, **g}
    fields = [f"name={_clean(g['name'])}"]
    fields.append(f"uuid={_clean(g.get('uuid') or f'GPU-fa4e{i:04x}-0000-4000-8000-{i:012d}')}")
    fields.append(f"pci={_clean(g.get('pci_bus_id') or g.get('pci') or f'00000000:{0x10 + i:02X}:00.0')}")

    def num(key: str, out: str, conv=int):
        v = g.get(key)
        if v is None:  # explicitly None: the field is not supported (NVML_ERROR_NOT_SUPPORTED)
            return
        fields.append(f"{out}={v}" if v == "auto" else f"{out}={conv(v)}")

    num("memory_total", "mem_total", _bytes)
    num("memory_used", "mem_used", _bytes)
    num("memory_reserved", "mem_reserved", _bytes)
    num("utilization", "util")
    num("memory_utilization", "mem_util")
    num("temperature", "temp")
    num("power", "power_mw", lambda w: round(float(w) * 1000))
    num("power_limit", "power_limit_mw", lambda w: round(float(w) * 1000))
    num("fan", "fan")
    num("clock_sm", "clock_sm")
    num("clock_mem", "clock_mem")
    num("max_clock_sm", "max_clock_sm")
    num("max_clock_mem", "max_clock_mem")
    num("pstate", "pstate")
    lost = g.get("lost", False)
    fields.append(f"lost={2 if lost == 'handle' else 1 if lost else 0}")
    fields.append(f"display={1 if g.get('display') else 0}")
    if "display_mode" in g:
        fields.append(f"display_mode={1 if g['display_mode'] else 0}")
    if g.get("minor") is not None:  # the device node's minor (nvmlDeviceGetMinorNumber); absent: the index
        fields.append(f"minor={int(g['minor'])}")
    errors = g.get("errors") or {}
    if errors:
        fields.append("errors=" + ",".join(f"{k}:{v}" for k, v in errors.items()))
    if g.get("mig") is not None:  # MIG-capable: True/False is the current mode
        fields.append(f"mig={1 if g['mig'] else 0}")
        if g.get("mig_pending") is not None:
            fields.append(f"mig_pending={1 if g['mig_pending'] else 0}")
        if g.get("mig_denied"):
            fields.append("mig_denied=1")
        if g.get("mig_procs_error"):
            fields.append(f"mig_procs_error={g['mig_procs_error']}")
    return "gpu\t" + "\t".join(fields)


def _mig_line(gpu: int, m: dict) -> str:
    fields = [f"gpu={gpu}", f"gi={int(m['gi'])}", f"ci={int(m.get('ci', 0))}",
              f"profile={_clean(m.get('profile', '1g.10gb'))}"]
    if m.get("uuid"):
        fields.append(f"uuid={_clean(m['uuid'])}")
    fields.append(f"mem_total={_bytes(m.get('memory_total', 10 * GiB))}")
    used = m.get("memory_used", "auto")
    fields.append(f"mem_used={used if used == 'auto' else _bytes(used)}")
    return "mig\t" + "\t".join(fields)


def _holder_line(h: dict) -> str:
    mem = h.get("memory")
    sm = h.get("sm")
    ghost = h.get("ghost", not h.get("visible", True))
    ctx = str(h.get("type", "C"))
    if ctx not in ("C", "G", "C+G"):
        raise ValueError(f"holder type must be C, G or C+G, got {ctx!r}")
    return "\t".join([
        "proc", f"gpu={int(h.get('gpu', 0))}", f"pid={int(h['pid'])}",
        f"mem={'na' if mem is None else _bytes(mem)}", f"type={ctx}",
        f"sm={'none' if sm is None else int(sm)}", f"ghost={1 if ghost else 0}",
        *([f"gi={int(h['gi'])}", f"ci={int(h.get('ci', 0))}"] if h.get("gi") is not None else []),
    ])


def write_fake_nvml_config(path: str | os.PathLike, gpus: list[dict], holders: list[dict], *,
                           init_error: str | int | None = None, driver: str | None = None,
                           cuda: int | None = None) -> Path:
    """Write the fake library's config atomically (it re-reads the file when it changes).

    ``gpus``: one dict per GPU (or an int: that many default GPUs). Keys, all optional: name, uuid,
    pci_bus_id, memory_total / memory_used / memory_reserved (bytes or "80GiB"; memory_used "auto" = the
    holders' sum), utilization ("auto" = holders' SM%), memory_utilization, temperature, power and
    power_limit (watts), fan, clock_sm, clock_mem, max_clock_sm, max_clock_mem, pstate, lost (True: calls
    return GPU_IS_LOST; "handle": getting the handle fails too), display (True: drives a display: DisplayActive), display_mode (DisplayMode;
    default True, as a headless H200 answers),
    errors ({field: NVML error name or code}, e.g. {"temp": "UNKNOWN"}), minor (the node's minor number). A key given as None makes that
    field NOT_SUPPORTED; a missing key takes a default. MIG: mig (True/False: MIG-capable, mode on/off;
    absent: not capable), mig_pending, mig_denied (True: the parent's process lists answer NO_PERMISSION),
    mig_procs_error (an NVML error name: the MIG handles' process lists answer it),
    mig_devices ([{gi, ci, profile ("1g.10gb"), uuid, memory_total, memory_used ("auto": its holders')}],
    in MigDeviceHandleByIndex order).
    ``holders``: {pid, gpu=0, memory (bytes, "4GiB", or None = NVML_VALUE_NOT_AVAILABLE), type C|G|C+G,
    sm (percent or None = no samples), visible (False: keep listing it even though the PID is not in this
    namespace), gi and ci (its MIG GPU and compute instance)}. A holder whose process exited is not listed, as the driver frees its contexts.
    """
    if isinstance(gpus, int):
        gpus = [{} for _ in range(gpus)]
    lines = ["# fake NVML config, written by tests/fakenvml/build.py"]
    opt = []
    if init_error is not None:
        opt.append(f"init_error={init_error}")
    if driver is not None:
        opt.append(f"driver={_clean(driver)}")
    if cuda is not None:
        opt.append(f"cuda={int(cuda)}")
    if opt:
        lines.append("opt\t" + "\t".join(opt))
    lines += [_gpu_line(i, g) for i, g in enumerate(gpus)]
    lines += [_mig_line(i, m) for i, g in enumerate(gpus) for m in g.get("mig_devices") or ()]
    for h in holders:
        if not 0 <= int(h.get("gpu", 0)) < len(gpus):
            raise ValueError(f"holder {h} names a GPU that is not in the config")
        lines.append(_holder_line(h))
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return path


if __name__ == "__main__":  # python tests/fakenvml/build.py OUTDIR [variant]
    import sys

    print(build_fake_nvml(sys.argv[1], *(sys.argv[2:3])))
