"""Fixture /proc, /sys and /dev trees for the AMD and Intel backends, in the kernel's formats.

fdinfo texts follow https://docs.kernel.org/gpu/drm-usage-stats.html and the drivers' own output
(amdgpu_fdinfo.c, i915_drm_client.c, xe_drm_client.c). Host process files (stat, cmdline, status) follow
proc(5), so the whole snapshot (ancestry, users, verdicts) runs on the fixture.

Device nodes: a fixture cannot mknod without root, so ``<root>/dev/dri/renderD128`` is a regular file
holding ``226:128`` (the format of sysfs ``dev`` attributes), and ``<proc>/<pid>/fd/<n>`` is a symlink to
it. gputop's scanner reads such files as device numbers only under a non-default proc root.

Hand-computed numbers for the two samples (2 s apart) are in EXPECTED.
"""

from __future__ import annotations

import os
from pathlib import Path

BTIME = 1764460000
HZ = os.sysconf("SC_CLK_TCK")
KIB = 1024
MIB = 1024**2
GIB = 1024**3

AMD_PCI = "0000:03:00.0"
I915_PCI = "0000:00:02.0"
XE_PCI = "0000:05:00.0"
KFD_DEV = "240:0"


def amdgpu_new(cid: int, gfx: int, compute: int = 0) -> str:
    """amdgpu on a recent kernel: drm-total/-resident per region plus the deprecated drm-memory-*."""
    text = (f"pos:\t0\nflags:\t02100002\nmnt_id:\t24\nino:\t1145\n"
            f"pasid:\t32771\ndrm-driver:\tamdgpu\ndrm-pdev:\t{AMD_PCI}\ndrm-client-id:\t{cid}\n"
            f"drm-memory-vram:\t65536 KiB\ndrm-memory-gtt: \t4096 KiB\ndrm-memory-cpu: \t0 KiB\n"
            f"drm-total-vram:\t131072 KiB\ndrm-shared-vram:\t0\ndrm-resident-vram:\t98304 KiB\n"
            f"drm-total-gtt:\t4096 KiB\ndrm-resident-gtt:\t2048 KiB\n"
            f"amd-memory-visible-vram:\t65536 KiB\namd-evicted-vram:\t0 KiB\n")
    if gfx:
        text += f"drm-engine-gfx:\t{gfx} ns\n"
    if compute:
        text += f"drm-engine-compute:\t{compute} ns\n"
    return text


def amdgpu_old(cid: int, vram: str, gfx: int = 0, compute: int = 0) -> str:
    """amdgpu before drm-total/-resident (amdgpu_fdinfo.c, 5.14..6.8): only drm-memory-*; unused engines
    are not printed at all."""
    text = (f"pos:\t0\nflags:\t02100002\nmnt_id:\t24\nino:\t1146\n"
            f"pasid:\t32772\ndrm-driver:\tamdgpu\ndrm-pdev:\t{AMD_PCI}\ndrm-client-id:\t{cid}\n"
            f"drm-memory-vram:\t{vram}\ndrm-memory-gtt: \t1024 KiB\ndrm-memory-cpu: \t0 KiB\n"
            f"amd-requested-vram:\t{vram}\n")
    if gfx:
        text += f"drm-engine-gfx:\t{gfx} ns\n"
    if compute:
        text += f"drm-engine-compute:\t{compute} ns\n"
    return text


def i915(cid: int, render: int, video: int) -> str:
    return (f"pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t284\n"
            f"drm-driver:\ti915\ndrm-client-id:\t{cid}\ndrm-pdev:\t{I915_PCI}\n"
            f"drm-total-system0:\t8192 KiB\ndrm-shared-system0:\t0\ndrm-active-system0:\t0\n"
            f"drm-resident-system0:\t6144 KiB\ndrm-purgeable-system0:\t1688 KiB\n"
            f"drm-total-stolen-system0:\t0\ndrm-resident-stolen-system0:\t0\n"
            f"drm-engine-render:\t{render} ns\ndrm-engine-copy:\t0 ns\ndrm-engine-video:\t{video} ns\n"
            f"drm-engine-capacity-video:\t2\ndrm-engine-video-enhance:\t0 ns\n")


def i915_bare(cid: int) -> str:
    """Missing keys: no memory and no engine keys (only the mandatory and id keys)."""
    return f"pos:\t0\nflags:\t02100002\ndrm-driver:\ti915\ndrm-client-id:\t{cid}\ndrm-pdev:\t{I915_PCI}\n"


def xe(cid: int, rcs: int, ccs: int, total: int) -> str:
    return (f"pos:\t0\nflags:\t02104002\nmnt_id:\t508\nino:\t975\n"
            f"drm-driver:\txe\ndrm-client-id:\t{cid}\ndrm-pdev:\t{XE_PCI}\n"
            f"drm-total-system:\t0\ndrm-shared-system:\t0\ndrm-active-system:\t0\n"
            f"drm-resident-system:\t0\ndrm-purgeable-system:\t0\n"
            f"drm-total-gtt:\t1024 KiB\ndrm-shared-gtt:\t0\ndrm-active-gtt:\t0\ndrm-resident-gtt:\t1024 KiB\n"
            f"drm-total-vram0:\t300000 KiB\ndrm-shared-vram0:\t16 MiB\ndrm-active-vram0:\t0\n"
            f"drm-resident-vram0:\t262144 KiB\ndrm-purgeable-vram0:\t0\n"
            f"drm-cycles-rcs:\t{rcs}\ndrm-total-cycles-rcs:\t{total}\n"
            f"drm-cycles-bcs:\t0\ndrm-total-cycles-bcs:\t{total}\n"
            f"drm-cycles-vcs:\t0\ndrm-total-cycles-vcs:\t{total}\ndrm-engine-capacity-vcs:\t2\n"
            f"drm-cycles-ccs:\t{ccs}\ndrm-total-cycles-ccs:\t{total}\ndrm-engine-capacity-ccs:\t4\n")


# Counters for sample 1 and sample 2 (2 s apart on the scanner's clock), and a third sample where the
# backwards amdgpu gfx counter catches up.
SAMPLES = {
    1: dict(g201=1_000_000_000, g203=3_000_000_000, c203=1_000_000_000, r301=500_000_000, v301=0,
            x401=(1000, 2000, 10_000), energy=1_000_000_000),
    2: dict(g201=2_000_000_000, g203=2_500_000_000, c203=1_500_000_000, r301=900_000_000,
            v301=2_000_000_000, x401=(4000, 10_000, 20_000), energy=1_100_000_000),
    3: dict(g201=2_000_000_000, g203=3_200_000_000, c203=1_500_000_000, r301=900_000_000,
            v301=2_000_000_000, x401=(4000, 10_000, 30_000), energy=1_100_000_000),
}

# Hand-computed results. Memory: preferred key per region (resident > memory > total), device-local
# regions only when present. Utilisation: busiest engine, from sample 2 on.
EXPECTED = {
    # pid: (pci, ctx, memory, util at sample 2, util at sample 3)
    201: (AMD_PCI, "G", 98304 * KIB, 50.0, 0.0),  # gfx +1e9 ns / 2e9 ns; resident-vram 96 MiB
    202: (AMD_PCI, "C", 4 * GIB, 0.0, 0.0),  # holds /dev/kfd, no engines printed (idle), memory-vram only
    203: (AMD_PCI, "C+G", 512 * MIB, 25.0, 10.0),  # gfx backwards -> 0, compute +0.5e9/2e9; s3: gfx
    #                                                 3.2e9 vs kept 3.0e9 -> 0.2e9/2e9 = 10%
    301: (I915_PCI, "G", 6144 * KIB, 50.0, 0.0),  # render 20%, video 2e9/(2e9*2) = 50%; resident 6 MiB
    302: (I915_PCI, "G", None, None, None),  # missing keys: nothing known but that it holds the device
    401: (XE_PCI, "C+G", 262144 * KIB, 30.0, 0.0),  # rcs 3000/10000 = 30%, ccs 8000/(10000*4) = 20%
    402: (XE_PCI, "C+G", 0, None, None),  # shares pid 401's client: counted there
}
DEVICE_UTIL = {AMD_PCI: 37.0, I915_PCI: 50.0, XE_PCI: 30.0}  # amdgpu: gpu_busy_percent; Intel: clients


class DrmTree:
    """Writes the fixture under ``root``: ``proc``, ``sys`` and ``dev``."""

    def __init__(self, root: Path, unreadable: bool = True):
        self.root = Path(root)
        self.proc = self.root / "proc"
        self.sys = self.root / "sys"
        self.dev = self.root / "dev"
        self.unreadable_pid = 500 if unreadable else None
        self._build()
        self.write_sample(1)

    # -- helpers --
    def _w(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def node(self, rel: str, devnum: str) -> Path:
        p = self.dev / rel
        self._w(p, devnum + "\n")
        return p

    def process(self, pid: int, comm: str, ppid: int, sid: int, argv: list[str], uid: int = 1000,
                start_ticks: int = 100_000) -> None:
        d = self.proc / str(pid)
        (d / "fd").mkdir(parents=True, exist_ok=True)
        (d / "fdinfo").mkdir(parents=True, exist_ok=True)
        fields = ["S", ppid, pid, sid, 0, -1, 4194560, 100, 0, 0, 0, 50 * HZ, 10 * HZ, 0, 0, 20, 0, 1, 0,
                  start_ticks, 100_000_000, 2560]
        fields += [0] * 30
        self._w(d / "stat", f"{pid} ({comm}) " + " ".join(map(str, fields)) + "\n")
        self._w(d / "cmdline", "".join(a + "\0" for a in argv))  # a kernel thread's is empty
        self._w(d / "status", f"Name:\t{comm}\nState:\tS (sleeping)\nPid:\t{pid}\nPPid:\t{ppid}\n"
                              f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                              f"SigQ:\t0/63457\nSigPnd:\t0000000000000000\nSigBlk:\t0000000000000000\n"
                              f"SigIgn:\t0000000000000000\nSigCgt:\t0000000000000000\n")

    def fd(self, pid: int, fd: int, target: Path, fdinfo: str | None = None) -> None:
        link = self.proc / str(pid) / "fd" / str(fd)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target)
        self._w(self.proc / str(pid) / "fdinfo" / str(fd), fdinfo or "pos:\t0\nflags:\t0100002\nmnt_id:\t25\n")

    def _build(self) -> None:
        self._w(self.proc / "stat", f"cpu  100 0 100 1000 0 0 0 0 0 0\nbtime {BTIME}\nprocesses 600\n")
        self.card0 = self.node("dri/card0", "226:0")
        self.render_i915 = self.node("dri/renderD128", "226:128")
        self.render_amd = self.node("dri/renderD129", "226:129")
        self.render_xe = self.node("dri/renderD130", "226:130")
        self.kfd = self.node("kfd", KFD_DEV)
        self.null = self.node("null", "1:3")
        self.plain = self.root / "data.txt"  # a regular file fd, not a device
        self._w(self.plain, "hello\n")

        self.process(1, "systemd", 0, 1, ["/sbin/init"], uid=0, start_ticks=10)
        self.process(100, "bash", 1, 100, ["-bash"])
        self.process(201, "glxgears", 100, 100, ["glxgears"])
        self.process(202, "python3", 100, 100, ["python3", "train.py"])
        self.process(203, "blender", 100, 100, ["blender", "-b", "scene.blend"])
        self.process(301, "firefox", 100, 100, ["firefox"])
        self.process(302, "vainfo", 100, 100, ["vainfo"])
        self.process(401, "ollama", 100, 100, ["ollama", "serve"])
        self.process(402, "ollama_llama", 401, 100, ["ollama_llama_server"])
        self.process(600, "sshd", 1, 600, ["sshd: alice"])
        self.fd(600, 0, self.null)
        self.fd(600, 3, self.plain)
        self.fd(202, 3, self.kfd)
        if self.unreadable_pid:
            pid = self.unreadable_pid
            self.process(pid, "secret", 1, pid, ["secret-job"], uid=0)
            self.fd(pid, 4, self.render_i915, i915(99, 0, 0))
            os.chmod(self.proc / str(pid) / "fd", 0)
            os.chmod(self.proc / str(pid) / "fdinfo", 0)
        self.process(2, "kthreadd", 0, 0, [], uid=0, start_ticks=1)  # a kernel thread: empty cmdline
        os.chmod(self.proc / "2" / "fd", 0)

        # sysfs: one amdgpu, one i915, one xe card, plus connectors and render nodes that must be skipped.
        amd = self._pci_device(AMD_PCI, "amdgpu", 0x1002, 0x744C, "card1")
        self._w(amd / "gpu_busy_percent", "37\n")
        self._w(amd / "mem_info_vram_total", f"{16 * GIB}\n")
        self._w(amd / "mem_info_vram_used", f"{5 * GIB}\n")
        self._w(amd / "pp_dpm_sclk", "0: 500Mhz \n1: 2100Mhz *\n2: 2500Mhz \n")
        self._w(amd / "pp_dpm_mclk", "0: 96Mhz \n1: 1249Mhz *\n")
        self._w(amd / "product_name", "Radeon RX 7900 XTX\n")
        self._w(amd / "unique_id", "7e5a1c2d3b4f5a6e\n")
        hw = amd / "hwmon" / "hwmon3"
        self._w(hw / "name", "amdgpu\n")
        self._w(hw / "temp1_input", "52000\n")
        self._w(hw / "temp1_label", "edge\n")
        self._w(hw / "power1_average", "120000000\n")
        self._w(hw / "power1_cap", "300000000\n")
        self._w(hw / "pwm1", "102\n")
        self._w(hw / "pwm1_max", "255\n")
        self._w(hw / "fan1_input", "1450\n")
        intel = self._pci_device(I915_PCI, "i915", 0x8086, 0x46A6, "card0")
        self._w(self.sys / "class" / "drm" / "card0" / "gt_act_freq_mhz", "1300\n")
        del intel
        xe_dev = self._pci_device(XE_PCI, "xe", 0x8086, 0xE20B, "card2")
        self._w(xe_dev / "tile0" / "gt0" / "freq0" / "act_freq", "2400\n")
        hw = xe_dev / "hwmon" / "hwmon5"
        self._w(hw / "name", "xe\n")
        self._w(hw / "temp1_input", "45000\n")
        self._w(hw / "power1_max", "190000000\n")
        self._w(self.sys / "class" / "kfd" / "kfd" / "dev", KFD_DEV + "\n")

    def _pci_device(self, pci: str, driver: str, vendor: int, device: int, card: str) -> Path:
        dev = self.sys / "devices" / "pci0000:00" / pci
        dev.mkdir(parents=True, exist_ok=True)
        drv = self.sys / "bus" / "pci" / "drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        (dev / "driver").symlink_to(os.path.relpath(drv, dev))
        self._w(dev / "vendor", f"0x{vendor:04x}\n")
        self._w(dev / "device", f"0x{device:04x}\n")
        self._w(dev / "uevent", f"DRIVER={driver}\nPCI_CLASS=30000\nPCI_ID={vendor:04X}:{device:04X}\n"
                                f"PCI_SLOT_NAME={pci}\nMODALIAS=pci:v0000{vendor:04X}d0000{device:04X}\n")
        cls = self.sys / "class" / "drm"
        minor = int(card[4:])
        for name, devnum in ((card, f"226:{minor}"), (f"renderD{128 + minor}", f"226:{128 + minor}"),
                             (f"{card}-DP-1", None)):
            d = cls / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "device").symlink_to(os.path.relpath(dev, d))
            if devnum:
                self._w(d / "dev", devnum + "\n")
        return dev

    def write_sample(self, n: int) -> None:
        """Rewrite the fdinfo counters (and energy) for sample ``n``."""
        s = SAMPLES[n]
        text201 = amdgpu_new(11, s["g201"])
        self.fd(201, 5, self.render_amd, text201)
        self.fd(201, 6, self.render_amd, text201)  # a dup of fd 5: the same client
        self.fd(201, 7, self.card0)  # the primary node, opened without a client's fdinfo keys
        self.fd(202, 4, self.render_amd, amdgpu_old(12, "4194304 KiB"))
        self.fd(203, 5, self.render_amd, amdgpu_old(13, "512 MiB", gfx=s["g203"], compute=s["c203"]))
        self.fd(301, 9, self.render_i915, i915(7, s["r301"], s["v301"]))
        self.fd(302, 3, self.render_i915, i915_bare(8))
        rcs, ccs, total = s["x401"]
        self.fd(401, 8, self.render_xe, xe(21, rcs, ccs, total))
        self.fd(402, 3, self.render_xe, xe(21, rcs, ccs, total))  # inherited: the same client as 401's
        hw = self.sys / "devices" / "pci0000:00" / XE_PCI / "hwmon" / "hwmon5"
        self._w(hw / "energy1_input", f"{s['energy']}\n")

    def make_world_readable(self) -> None:
        """So that an unprivileged user (the real permission test) can read everything but pid 500."""
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames:
                p = os.path.join(dirpath, name)
                if os.stat(p).st_mode & 0o777:
                    os.chmod(p, 0o755)
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o644)
        os.chmod(self.root, 0o755)
