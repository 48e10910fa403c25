"""The memory ledger's part of a sample: device-file holders, zombie holders, the MPS server's clients.

The sampler (gputop.core.sampler) hands it each device's node (``node``), then the uses its backends
listed (``add_device_file_uses`` adds a use with source "device file" and unknown memory for every process
holding a GPU's node that the list does not name on that GPU), then asks for each holder's notes
(``notes_for``) and for the holder of a zombie the list still names (``zombie_holder``).
"""

from __future__ import annotations

import os
import time

from gputop.core.devholders import DeviceScan, nvidia_control_nodes
from gputop.core.ledger import (
    CTX_DEVICE_FILE, MPS_SERVER, NOISE_BYTES, SOURCE_DEVICE_FILE, HolderNotes, zombie_text,
)
from gputop.core.model import GpuUse, Holder
from gputop.core.orphans import UNKNOWN, Verdict
from gputop.core.procs import ProcTable, ns_pids


NVIDIA_MAJOR = 195
MPS_COMM = MPS_SERVER[:15]  # comm holds 15 characters: "nvidia-cuda-mps"


def own_pid(proc_root: str) -> int | None:
    """This process's PID as ``proc_root`` numbers it (``self`` of a procfs resolves in the PID namespace
    that procfs belongs to, so a host's /proc mounted in a container names our host PID); None when it has
    no ``self`` (a fixture tree)."""
    try:
        return int(os.readlink(os.path.join(proc_root, "self")))
    except (OSError, ValueError):
        return None


def _runs_mps(info) -> bool:
    """Its argv[0] names the MPS server too (comm alone is cut, and the user's to set). Only a note rests
    on it (the clients named): no action trusts it."""
    return bool(info.cmdline) and os.path.basename(info.cmdline[0]) == MPS_SERVER


class LedgerSampling:
    """``scan_every``: seconds between two device-file scans while some GPU's used memory is not explained
    by its listed holders (or is unknown); ``quiet_every`` while every GPU's is, as on most refreshes of a
    healthy node: a scan stats every host process's descriptors (87 ms at 10,000 processes), which at
    5 s would cost a monitor left open more than the rest of its refresh. A refresh in between keeps the
    holders the last scan found that still run (same PID and start time). ``full_every``: see DeviceScan."""

    def __init__(self, proc_root: str, verdicts, full_every: float = 30.0, scan_every: float = 5.0,
                 clock=time.monotonic, quiet_every: float = 60.0):
        self.proc_root = proc_root
        self.verdicts = verdicts  # the sampler's VerdictCache: a zombie's parent is judged by the same rules
        self.full_every, self.scan_every, self.clock = full_every, scan_every, clock
        self.quiet_every = quiet_every
        self._used: dict[int, int | None] = {}  # GPU -> its used memory, this sample
        self.scan: DeviceScan | None = None  # made on the first sample that has a device node
        self._found: dict[int, tuple[frozenset[int], float]] = {}  # the last scan: pid -> (rdevs, start time)
        self._found_for: frozenset[int] = frozenset()  # the nodes it looked for
        self._scanned_at = float("-inf")
        self._ctl: frozenset[int] | None = None  # nvidiactl and nvidia-uvm's nodes, once read
        self.searched: tuple[int, ...] = ()  # GPUs whose node the last scan looked for in every process
        self._nodes: dict[int, int] = {}  # rdev -> global GPU index, this sample
        self._holding: dict[int, set[int]] = {}  # GPU -> the processes holding its node, this sample
        self._file_only: set[int] = set()  # processes with a use found only through a device file
        # gputop itself: NVML opens every GPU's node (a real H200: /dev/nvidia0 three times), so without
        # this each face would list itself as a holder of every GPU (docs/hardware.md, 2026-12-04).
        self.own_pid = own_pid(proc_root)

    def node(self, gi: int, backend, local: int, used: int | None = None) -> None:
        """Note GPU ``gi``'s device node, if its backend knows it, and its used memory."""
        self._used[gi] = used
        try:
            rdev = backend.device_node(local)
        except Exception:  # a backend that cannot say: no device-file holders for this GPU
            rdev = None
        if rdev is not None:
            self._nodes[rdev] = gi

    def _unexplained(self, nodes: dict[int, int], uses: dict[int, list[GpuUse]]) -> bool:
        """Whether some GPU's used memory is unknown, or more than its listed holders' (by NOISE_BYTES)."""
        listed: dict[int, int] = {}
        unknown: set[int] = set()
        for have in uses.values():
            for u in have:
                if u.used_memory is None:
                    unknown.add(u.gpu)
                else:
                    listed[u.gpu] = listed.get(u.gpu, 0) + u.used_memory
        for gi in nodes.values():
            used = self._used.get(gi)
            if used is None or gi in unknown or used - listed.get(gi, 0) >= NOISE_BYTES:
                return True
        return False

    def _holders(self, rdevs: frozenset[int], table: ProcTable, every: float) -> dict[int, frozenset[int]]:
        """pid -> the nodes it holds: a new scan every ``every`` seconds (or when the nodes change), else
        the last scan's holders that still run as the same process."""
        now = self.clock()
        if rdevs == self._found_for and now - self._scanned_at < every:
            out = {}
            for pid, (held, start) in self._found.items():
                info = table.get(pid)
                if info is not None and not info.zombie and info.start_time == start:
                    out[pid] = held
            return out
        if self.scan is None:
            self.scan = DeviceScan(self.proc_root, self.full_every)
        found = self.scan.scan(rdevs)
        self._found, self._found_for, self._scanned_at = {}, rdevs, now
        for pid, held in found.items():
            info = table.get(pid)
            if info is not None and not info.zombie:
                self._found[pid] = (held, info.start_time)
        return {pid: held for pid, (held, _) in self._found.items()}

    def add_device_file_uses(self, uses: dict[int, list[GpuUse]], visible: dict[int, bool],
                             warnings: list[str], table: ProcTable) -> None:
        nodes, self._nodes = self._nodes, {}
        self._holding, self._file_only, self.searched = {}, set(), ()
        if not nodes:
            self._used = {}
            return
        every = self.scan_every if self._unexplained(nodes, uses) else self.quiet_every
        self._used = {}
        holding, file_only = self._holding, self._file_only
        ctl = self._control_nodes(nodes)
        cuda_only = []
        for pid, held in self._holders(frozenset(nodes) | ctl, table, every).items():
            if pid == self.own_pid:
                continue
            if pid not in uses and held <= ctl:
                cuda_only.append(pid)
            for rdev in held:
                gi = nodes.get(rdev)
                if gi is None:
                    continue  # nvidiactl or nvidia-uvm: of no one GPU
                holding.setdefault(gi, set()).add(pid)
                have = uses.get(pid)
                if have is not None and any(u.gpu == gi for u in have):
                    continue  # the list names it on this GPU: its memory is known there
                use = GpuUse(gi, CTX_DEVICE_FILE, None, None, source=SOURCE_DEVICE_FILE)
                if have is None:
                    uses[pid], visible[pid] = [use], True
                else:
                    have.append(use)
                file_only.add(pid)
        if not self.scan.unreadable:  # every process's descriptors examined: "no holder" means none
            self.searched = tuple(sorted(nodes.values()))
        if cuda_only:
            cuda_only.sort()
            warnings.append(f"{len(cuda_only)} process(es) hold /dev/nvidiactl or /dev/nvidia-uvm but no GPU's device "
                            f"node, and no GPU lists them: CUDA processes of some GPU, counted on none (pid "
                            f"{', '.join(map(str, cuda_only[:8]))}{', ...' if len(cuda_only) > 8 else ''})")
        if self.scan.unreadable and os.geteuid() != 0:
            warnings.append(f"the descriptors of {self.scan.unreadable} process(es) cannot be read as this user: "
                            "holders of a GPU's device file among them are not seen (run gputop as root)")

    def _control_nodes(self, nodes: dict[int, int]) -> frozenset[int]:
        """nvidiactl and nvidia-uvm, looked for beside the GPUs' nodes when one of them is NVIDIA's (195)."""
        if not any(os.major(r) == NVIDIA_MAJOR for r in nodes):
            return frozenset()
        if self._ctl is None:
            self._ctl = nvidia_control_nodes(self.proc_root)
        return self._ctl - frozenset(nodes)

    def notes_for(self, pid: int, info) -> HolderNotes | None:
        """A visible holder's notes: its NSpid when found through a device file; the MPS server's clients."""
        file_only = pid in self._file_only
        mps = info is not None and info.name in (MPS_SERVER, MPS_COMM) and _runs_mps(info)
        if not file_only and not mps:
            return None
        nspid = ns_pids(pid, self.proc_root) if file_only else None
        clients: tuple[int, ...] = ()
        if mps:
            pids = set()
            for gi, holders in self._holding.items():
                if pid in holders:
                    pids.update(holders)
            pids.discard(pid)
            clients = tuple(sorted(pids))
        return HolderNotes(nspid=nspid if nspid and len(nspid) > 1 else None, mps_clients=clients)

    def zombie_holder(self, pid: int, uses: tuple[GpuUse, ...], table: ProcTable, jobs: dict, job_states: dict,
                      warnings: list[str]) -> Holder | None:
        """The holder of a zombie the GPU's list still names: its parent must wait for it (or exit) to free
        its memory. Its verdict is unknown: nothing signals a zombie. None when ``pid`` is not a zombie."""
        info = table.get(pid)
        if info is None or not info.zombie:
            return None
        parent = table.get(info.ppid) if info.ppid > 0 else None
        parent_verdict = None
        if parent is not None:
            try:
                parent_verdict = self.verdicts.judge(parent.pid, table, jobs, job_states)
            except Exception:  # a parent that cannot be judged: unknown, said so
                parent_verdict = Verdict(UNKNOWN, "its ancestry could not be followed")
        notes = HolderNotes(zombie=True, parent=parent, parent_verdict=parent_verdict)
        chain = tuple(table.ancestors(pid))
        h = Holder(pid, uses, info, chain, Verdict(UNKNOWN, "a zombie: it has exited; " + (
            f"its memory goes when its parent pid {parent.pid} ({parent.name}) waits for it or exits"
            if parent is not None else "its parent cannot be seen")), notes=notes)
        warnings.append(zombie_text(h) or f"GPU holder pid {pid} is a zombie")
        return h
