"""The memory ledger: who holds every byte of a GPU's used memory, including what the driver's list leaves out.

Per GPU: the used memory the backend reports (NVML's v2 "used" already leaves out the driver-reserved
memory) = the memory of the listed holders (NVML's list, or DRM fdinfo's totals on AMD and Intel)
+ the holders found only through the device file (gputop.core.devholders), whose memory is unknown
+ the unexplained rest, in bytes. A GPU with memory in use and no holder at all is held by the driver:
only a reset frees it.

``gpu_ledgers(snapshot)`` is the one computation; every face (status, --json, the TUI, /metrics, the
guard, the API and MCP) shows what it returns. ``HolderNotes`` is what the sampler adds to a holder:
its PIDs in nested namespaces, and for a zombie its parent and the parent's verdict, and for the MPS
server its clients.
"""

from __future__ import annotations

# Holder and Snapshot in annotations are gputop.core.model's.

from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # not gputop.core.model: it imports snapshot_json, which imports this module
    from gputop.core.orphans import Verdict
    from gputop.core.procs import ProcInfo

# Where a holder's use of a GPU was found.
SOURCE_NVML = "nvml"
SOURCE_DEVICE_FILE = "device file"
SOURCE_FDINFO = "fdinfo"
# The context type of a use found only through a device file: unknown (not C, G or C+G), shown as "dev" in
# the TYPE/T columns, which is how the tree and the tables mark these holders.
CTX_DEVICE_FILE = "dev"
MPS_SERVER = "nvidia-cuda-mps-server"
# An idle GPU reports a few MiB used that no process holds (the driver's own): below this the rest is
# still counted, but not called out in the status line, nor called "held by the driver".
NOISE_BYTES = 64 << 20


@dataclass(frozen=True)
class HolderNotes:
    """What the memory ledger adds to a holder (None on a holder it has nothing to say of)."""

    nspid: tuple[int, ...] | None = None  # NSpid: its PID in each nested PID namespace, the host's first
    zombie: bool = False  # it has exited; its parent has not waited for it
    parent: ProcInfo | None = None  # a zombie's parent: its wait (or exit) frees the memory
    parent_verdict: Verdict | None = None  # that parent's orphan verdict
    mps_clients: tuple[int, ...] = ()  # the MPS server's clients: the processes holding its GPUs' nodes

    def to_dict(self) -> dict:
        p, v = self.parent, self.parent_verdict
        return {"nspid": list(self.nspid) if self.nspid else None, "zombie": self.zombie,
                "parent": ({"pid": p.pid, "start_time": p.start_time, "name": p.name, "user": p.user}
                           if p is not None else None),
                "parent_verdict": {"kind": v.kind, "reason": v.reason} if v is not None else None,
                "mps_clients": list(self.mps_clients)}


def zombie_text(h: Holder) -> str | None:
    """"zombie: its parent pid P (name, user) must wait for it ..." for a zombie holder, else None."""
    n = h.notes
    if n is None or not n.zombie:
        return None
    p = n.parent
    if p is None:
        return (f"pid {h.pid} is a zombie whose parent cannot be seen: its memory goes when that parent "
                "waits for it or exits")
    v = n.parent_verdict
    return (f"pid {h.pid} is a zombie: only its parent pid {p.pid} ({p.name}, user {p.user}) frees its memory, "
            f"by waiting for it or by exiting; the parent is {v.kind if v else 'unknown'}"
            + (f" ({v.reason})" if v is not None and v.reason else ""))


@dataclass(frozen=True)
class GpuLedger:
    """One GPU's used memory, split: listed holders + device-file holders (unknown) + the unexplained rest."""

    gpu: int
    used: int | None  # bytes; None: the backend does not say
    listed: int  # bytes held by the listed holders whose memory is known
    listed_pids: tuple[int, ...]
    listed_unknown: tuple[int, ...]  # listed holders whose memory is unknown (MIG, WDDM)
    device_file_pids: tuple[int, ...]  # found only through the device file: memory unknown
    zombies: tuple[int, ...]
    unexplained: int | None  # used - listed, at least 0; None when used or a listed amount is unknown
    searched: bool = False  # its device node was looked for in every host process

    @property
    def unheld(self) -> bool:
        """Memory in use, and no process listed or seen holds the GPU."""
        return (self.used is not None and self.used >= NOISE_BYTES and not self.listed_pids
                and not self.device_file_pids)

    @property
    def driver_held(self) -> bool:
        """Memory in use and no process holds the GPU: only a reset frees it. Said only when every
        process was searched: a holder gputop cannot see is not "no holder"."""
        return self.unheld and self.searched

    @property
    def reset_command(self) -> str | None:
        return f"gputop reset --gpu {self.gpu}" if self.driver_held else None

    @property
    def notable(self) -> bool:
        """Worth a line under the GPU: an unexplained rest above the noise, or a zombie holder."""
        return bool(self.zombies) or (self.unexplained is not None and self.unexplained >= NOISE_BYTES)

    def line(self) -> str | None:
        """The status line under this GPU, or None when there is nothing to explain."""
        if not self.notable:
            return None
        from gputop.util.units import fmt_bytes

        if self.driver_held:
            return (f"ledger: {fmt_bytes(self.used)} used and no process holds GPU {self.gpu}: held by the "
                    f"driver: only a reset frees it ({self.reset_command})")
        if self.unheld:
            return (f"ledger: {fmt_bytes(self.used)} used and no process listed or seen holds GPU {self.gpu}; not "
                    "every process could be searched for its device file (its node is unknown, or some "
                    "processes cannot be read), so it is not called held by the driver")
        parts = [f"ledger: {fmt_bytes(self.used)} used = {fmt_bytes(self.listed)} by "
                 f"{len(self.listed_pids)} listed"]
        if self.device_file_pids:
            parts.append(f"? by {len(self.device_file_pids)} device-file holder(s) (pid "
                         f"{', '.join(map(str, self.device_file_pids[:8]))}"
                         f"{', ...' if len(self.device_file_pids) > 8 else ''})")
        parts.append(f"{fmt_bytes(self.unexplained)} unexplained" if self.unexplained is not None
                     else "an unknown rest")
        text = " + ".join(parts)
        if self.zombies:
            text += f"; zombie holder(s): pid {', '.join(map(str, self.zombies))}"
        return text

    @classmethod
    def from_dict(cls, d) -> "GpuLedger | None":
        """A ledger from its JSON (``{"gpu": N, **to_dict()}``), as another node's ``status --json`` sends
        it (not trusted): None unless every field has its type."""
        if not isinstance(d, dict):
            return None

        def whole(v, none_ok=False):
            return (v is None and none_ok) or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)

        def pids(key):
            v = d.get(key, [])
            return tuple(v) if isinstance(v, list) and all(whole(x) for x in v) else None

        listed_pids, unknown, files, zombies = (pids(k) for k in (
            "listed_pids", "listed_unknown_pids", "device_file_pids", "zombies"))
        if (not whole(d.get("gpu")) or not whole(d.get("used"), True) or not whole(d.get("listed"))
                or not whole(d.get("unexplained"), True) or None in (listed_pids, unknown, files, zombies)):
            return None
        return cls(d["gpu"], d["used"], d["listed"], listed_pids, unknown, files, zombies, d["unexplained"],
                   d.get("searched") is True)

    def to_dict(self) -> dict:
        return {"used": self.used, "listed": self.listed, "listed_pids": list(self.listed_pids),
                "listed_unknown_pids": list(self.listed_unknown),
                "device_file_pids": list(self.device_file_pids), "unexplained": self.unexplained,
                "zombies": list(self.zombies), "driver_held": self.driver_held,
                "reset_command": self.reset_command, "searched": self.searched}


def gpu_ledger(snap: Snapshot, gpu: int) -> GpuLedger | None:
    """The ledger of one GPU (global index), or None for a GPU the snapshot does not have or lost."""
    for lg in gpu_ledgers(snap):
        if lg.gpu == gpu:
            return lg
    return None


_LAST: tuple = (None, ())  # (the snapshot last asked about, its ledgers): the TUI asks twice a refresh


def gpu_ledgers(snap: Snapshot) -> tuple[GpuLedger, ...]:
    """The ledger of every GPU the snapshot reads (lost ones left out): one pass over the holders, made
    once per snapshot (a snapshot never changes). Threads share the last answer: one tuple, rebound whole."""
    global _LAST
    last = _LAST
    if last[0] is snap:
        return last[1]
    out = _ledgers(snap)
    _LAST = (snap, out)
    return out


def _ledgers(snap: Snapshot) -> tuple[GpuLedger, ...]:
    acc: dict[int, tuple[list, list, list, list, list]] = {}  # gpu -> listed bytes, pids, unknown, files, zombies
    for d in snap.devices:
        if not d.lost:
            acc[d.index] = ([0], [], [], [], [])
    for h in snap.holders:
        notes = h.notes
        for u in h.uses:
            a = acc.get(u.gpu)
            if a is None:
                continue
            if u.source == SOURCE_DEVICE_FILE:
                a[3].append(h.pid)
                continue
            a[1].append(h.pid)
            if u.used_memory is None:
                a[2].append(h.pid)
            else:
                a[0][0] += u.used_memory
            if notes is not None and notes.zombie:
                a[4].append(h.pid)
    out = []
    searched = getattr(snap, "searched", ())
    for d in snap.devices:
        a = acc.get(d.index)
        if a is None:
            continue
        listed, pids, unknown, files, zombies = a[0][0], a[1], a[2], a[3], a[4]
        used = d.memory_used
        rest = None if used is None or unknown else max(0, used - listed)
        out.append(GpuLedger(d.index, used, listed, tuple(pids), tuple(unknown), tuple(files), tuple(zombies),
                             rest, d.index in searched))
    return tuple(out)


def ledger_lines(snap: Snapshot) -> list[str]:
    """The status lines of the GPUs whose ledger has something to explain ("GPU N ledger: ...")."""
    out = []
    for lg in gpu_ledgers(snap):
        line = lg.line()
        if line is not None:
            out.append(f"GPU {lg.gpu} {line}")
    return out


def holder_note(h: Holder) -> str | None:
    """One line on how a holder was found and what the ledger knows of it, or None for a listed holder
    with nothing to add. Text from processes (names) is the caller's to make safe for a terminal."""
    n = h.notes
    parts = []
    if h.source == SOURCE_DEVICE_FILE:
        gpus = ",".join(str(u.gpu) for u in h.uses if u.source == SOURCE_DEVICE_FILE)
        parts.append(f"holds GPU {gpus}'s device file, not in the driver's list (memory unknown)")
    if n is not None and n.nspid:
        parts.append(f"NSpid {' '.join(map(str, n.nspid))} (pid {n.nspid[-1]} in its own PID namespace)")
    if n is not None and n.mps_clients:
        parts.append(f"MPS server; clients: pid {', '.join(map(str, n.mps_clients))}")
    return "; ".join(parts) if parts else None
