"""Allocation against use: whom the scheduler gave each GPU to, and each holder's standing. No UI imports.

Slurm: one ``scontrol show job -d -o`` per refresh (every job, one line each, cached for the refresh and
run with a timeout) names, for each running job, the GRES IDX it holds on each node
(``Nodes=n01 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:2)``). An IDX is a position in slurmd's list of the node's GPU
files, which is gres.conf's ``Name=gpu File=`` records sorted as slurmd sorts them (the longer type name
first, then by type, then by the file's number); each file is a char device whose minor number is the
GPU's (``nvmlDeviceGetMinorNumber``). So IDX -> file -> minor -> GPU, the way slurmd itself maps them.
Without a gres.conf that names files (``AutoDetect=nvml``), IDX N is the GPU with minor N (slurmd sorts
autodetected GPUs by minor) and the allocation says so.

Standing (``standing``), per holder, from its job (the kernel's cgroup path, or SLURM_JOB_ID in its
environment, trusted only when the process runs as the job's user) and its GPUs' allocations:

- inside: every GPU it holds is allocated to its own job;
- outside: a process of a running job on a GPU no job was given;
- squatter: a process of no job, or of another job, on a GPU allocated to a job;
- unallocated: a holder of no (running) job on a GPU no job has;
- unknown: the allocation or the holder's job could not be read.

A holder on several GPUs takes the worst of them (squatter, outside, unknown, unallocated, inside).
The pure functions (``parse_jobs``, ``gres_files``, ``standing``) are tested without Slurm.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable

INSIDE, OUTSIDE, SQUATTER, UNALLOCATED, UNKNOWN = "inside", "outside", "squatter", "unallocated", "unknown"
STANDINGS = (INSIDE, OUTSIDE, SQUATTER, UNALLOCATED, UNKNOWN)
_WORST = {SQUATTER: 4, OUTSIDE: 3, UNKNOWN: 2, UNALLOCATED: 1, INSIDE: 0}
NVIDIA_MAJOR = 195
MAX_JOBS_TEXT = 16 << 20  # scontrol's output read at most (a node's view of a big cluster's queue)
MAX_HOSTLIST = 4096  # names one hostlist expression may expand to
# Job states in which a job holds its allocation (slurmctld keeps the GRES of a suspended job).
RETRY_AFTER = 10.0  # seconds an unanswered scontrol is not asked again
HOLDING_STATES = frozenset({"RUNNING", "SUSPENDED", "CONFIGURING", "STOPPED"})


@dataclass(frozen=True)
class Allocation:
    """The job one GPU (global index) is allocated to."""

    gpu: int
    job: str  # the job's label: "42" (Slurm) or "namespace/pod/container" (Kubernetes)
    job_id: int | None  # Slurm's job id; None for a pod
    user: str | None
    uid: int | None
    since: float | None  # the job's start (epoch seconds), when known
    source: str = "slurm"  # "slurm" or "kubernetes"
    detail: str = ""  # how the GPU was matched (gres.conf file, minor, UUID)
    members: tuple[str, ...] = ()  # every job or pod a shared GPU is allocated to (empty: just ``job``)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.members or (self.job,)

    def to_dict(self) -> dict:
        return {"job": self.job, "job_id": self.job_id, "user": self.user, "uid": self.uid,
                "since": self.since, "source": self.source, "detail": self.detail, "members": list(self.labels)}


@dataclass(frozen=True)
class Standing:
    """One holder's standing against the allocation of the GPUs it holds."""

    kind: str
    reason: str
    job: str | None = None  # the holder's job (label), as trusted here

    def to_dict(self) -> dict:
        return {"kind": self.kind, "reason": self.reason, "job": self.job}


@dataclass(frozen=True)
class AllocationView:
    """A refresh's allocation of every GPU, standing of every holder, and idle allocations."""

    source: str  # "slurm", "kubernetes"
    by_gpu: dict = field(default_factory=dict)  # global GPU index -> Allocation
    standings: dict = field(default_factory=dict)  # holder pid -> Standing
    idle_since: dict = field(default_factory=dict)  # GPU -> epoch seconds since which no process held it
    error: str | None = None  # why the allocation is unknown (a timeout, no gres.conf, ...)
    unmapped: tuple[str, ...] = ()  # allocations gputop could not place on a GPU (say why)

    def of(self, gpu: int) -> Allocation | None:
        return self.by_gpu.get(gpu)

    def standing(self, pid: int) -> Standing | None:
        return self.standings.get(pid)

    def idle_for(self, gpu: int, now: float) -> float | None:
        t = self.idle_since.get(gpu)
        return max(0.0, now - t) if t is not None else None

    def to_dict(self) -> dict:
        return {"source": self.source, "error": self.error, "unmapped": list(self.unmapped)}


# ---- Slurm: parsing -------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobAlloc:
    """A running job's GPUs on this node, as GRES IDX."""

    job_id: int
    user: str | None
    uid: int | None
    state: str
    since: float | None
    idx: tuple[int, ...]


_BRACKET = re.compile(r"^(.*?)\[([^\]]*)\](.*)$")


def expand_hostlist(expr: str, limit: int = MAX_HOSTLIST) -> list[str]:
    """``n[01-03,7],m1`` -> n01 n02 n03 n7 m1 (Slurm's hostlist; zero padding kept). Bounded."""
    out: list[str] = []
    for part in _split_top(expr):
        out.extend(_expand_one(part, limit - len(out)))
        if len(out) > limit:
            raise ValueError(f"hostlist {expr[:80]!r} names more than {limit} names")
    return out


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in expr:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p]


def _expand_one(part: str, room: int) -> list[str]:
    m = _BRACKET.match(part)
    if m is None:
        return [part]
    head, body, tail = m.groups()
    rests = _expand_one(tail, room) if tail else [""]
    out = []
    for rng in body.split(","):
        lo, sep, hi = rng.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a hostlist range: {rng!r}")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a or (b - a + 1) * len(rests) > room:
            raise ValueError(f"hostlist range {rng!r} is too large")
        for n in range(a, b + 1):
            out.extend(f"{head}{n:0{len(lo)}d}{r}" for r in rests)
    return out


def _fields(line: str) -> dict[str, list[str]]:
    """``Key=Value`` tokens of one line; a key seen again (``Nodes=`` per node group) keeps each value."""
    out: dict[str, list[str]] = {}
    for tok in line.split():
        k, sep, v = tok.partition("=")
        if sep:
            out.setdefault(k, []).append(v)
    return out


_USER = re.compile(r"^([^()]*)\((\d{1,10})\)$")
_GPU_IDX = re.compile(r"(?:^|,)gpu(?::[^,(]*)*\(IDX:([0-9,\-]+)\)")


def _start(value: str | None) -> float | None:
    if not value or not value[:4].isdigit():
        return None
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def parse_jobs(text: str, node_names: Iterable[str]) -> list[JobAlloc]:
    """The jobs of ``scontrol show job -d -o`` (one line a job) that hold GPUs on this node (any of
    ``node_names``), in a state that holds an allocation. A malformed line is skipped."""
    from gputop.core.slurm_jobs import parse_index_list

    names = set(node_names)
    out = []
    for line in text.splitlines():
        f = _fields(line)
        jid, state = (f.get("JobId") or [""])[0], (f.get("JobState") or [""])[0].upper()
        if not jid.isdigit() or state not in HOLDING_STATES:
            continue
        user, uid = None, None
        m = _USER.match((f.get("UserId") or [""])[0])
        if m:
            user, uid = m.group(1) or None, int(m.group(2))
        idx: set[int] = set()
        # "Nodes=A CPU_IDs=.. Mem=.. GRES=gpu:1(IDX:0)": the node groups, each followed by its GRES.
        nodes, gres = f.get("Nodes") or [], f.get("GRES") or []
        for group, g in zip(nodes, gres):
            try:
                if not names & set(expand_hostlist(group)):
                    continue
                for mm in _GPU_IDX.finditer(g):
                    idx.update(parse_index_list(mm.group(1)))
            except ValueError:
                continue
        if idx:
            out.append(JobAlloc(int(jid), user, uid, state, _start((f.get("StartTime") or [None])[0]),
                                tuple(sorted(idx))))
    return out


@dataclass(frozen=True)
class GresFile:
    path: str
    type: str | None


def gres_files(text: str, node_names: Iterable[str]) -> list[GresFile]:
    """The GPU files of this node in IDX order: gres.conf's ``Name=gpu`` records (every line without a
    ``NodeName=``, or whose NodeName names this node), each File= expanded, sorted as slurmd sorts them
    (the longer type name first, then by type name, then by the number the file name ends with)."""
    names = set(node_names)
    files: list[GresFile] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        f = {k.lower(): v[0] for k, v in _fields(line).items()}
        if f.get("name") != "gpu" or not f.get("file"):
            continue
        if "nodename" in f and not names & set(expand_hostlist(f["nodename"])):
            continue
        for path in expand_hostlist(f["file"]):
            files.append(GresFile(path, f.get("type")))
    files.sort(key=lambda g: (-len(g.type or ""), g.type or "", _file_number(g.path)))
    return files


def _file_number(path: str) -> int:
    m = re.search(r"(\d{1,9})$", path)
    return int(m.group(1)) if m else 0


def file_minor(path: str) -> int | None:
    """The minor number of a GPU device file (a char device of NVIDIA's major), else the number its name
    ends with (the /dev/nvidiaN convention), else None."""
    import stat

    try:
        st = os.stat(path)
        if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == NVIDIA_MAJOR:
            return os.minor(st.st_rdev)
    except OSError:
        pass
    m = re.search(r"nvidia(\d{1,3})$", path)
    return int(m.group(1)) if m else None


# ---- Slurm: reading -------------------------------------------------------------------------------

def node_names() -> set[str]:
    """This node's names as Slurm may spell them: $GPUTOP_SLURM_NODE, else the host name and its short form."""
    forced = os.environ.get("GPUTOP_SLURM_NODE")
    if forced:
        return {forced}
    n = os.uname().nodename
    return {n, n.split(".", 1)[0]}


def slurm_conf_paths() -> list[str]:
    """Where scontrol finds slurm.conf: $SLURM_CONF, /etc/slurm, or the configless cache of slurmd."""
    if os.environ.get("SLURM_CONF"):
        return [os.environ["SLURM_CONF"]]
    return ["/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf", "/var/spool/slurmd/conf-cache/slurm.conf"]


def gres_conf_path() -> str:
    """gres.conf sits beside slurm.conf ($SLURM_CONF, else /etc/slurm/slurm.conf)."""
    conf = next((p for p in slurm_conf_paths() if os.path.exists(p)), slurm_conf_paths()[0])
    return os.path.join(os.path.dirname(conf), "gres.conf")


@dataclass(frozen=True)
class SlurmRead:
    """One read of the node's Slurm allocation: minor -> (job, file); or why it is unknown."""

    by_minor: dict  # minor -> (JobAlloc, how the IDX was matched)
    error: str | None = None
    unmapped: tuple[str, ...] = ()
    jobs: tuple[JobAlloc, ...] = ()  # every job holding GPUs on this node


class GresConfError(Exception):
    """gres.conf is there but cannot be used (refused as root, unreadable): the allocation is unknown."""


class SlurmAllocations:
    """The node's GPU allocation from ``scontrol show job -d -o``: one call per refresh (``ttl``), with a
    timeout, sharing the scontrol and timeout of the sampler's JobStates. ``runner`` replaces the call
    (tests); it returns (rc, stdout, stderr)."""

    def __init__(self, states, *, ttl: float = 1.0, clock: Callable[[], float] = time.monotonic, runner=None):
        self.states = states
        self.ttl = ttl
        self.clock = clock
        self._run = runner or self._scontrol
        self._cache: tuple[float, SlurmRead] | None = None
        self._lock = threading.Lock()
        self._available: bool | None = None  # looked at once per sampler

    @property
    def available(self) -> bool:
        """Whether this is a Slurm node: a Slurm client to ask and a slurm.conf it reads (else no allocation
        is read at all, and nothing is said about it)."""
        if self._available is None:
            self._available = bool(self.states.scontrol) and any(os.path.exists(p) for p in slurm_conf_paths())
        return self._available

    def _scontrol(self) -> tuple[int, str, str]:
        import subprocess

        try:
            p = subprocess.run([self.states.scontrol, "show", "job", "-d", "-o"], capture_output=True,
                               timeout=self.states.timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return -1, "", f"scontrol did not answer within {self.states.timeout:g}s"
        except OSError as e:
            return -1, "", f"scontrol cannot run: {e.strerror or e}"
        return p.returncode, p.stdout[:MAX_JOBS_TEXT].decode(errors="replace"), p.stderr.decode(errors="replace")

    def read(self) -> SlurmRead:
        now = self.clock()
        with self._lock:
            # After a failure (slurmctld slow or down) the error is kept for RETRY_AFTER: a refresh does not
            # wait for the timeout again every second.
            if self._cache is not None and now - self._cache[0] < (
                    self.ttl if self._cache[1].error is None else max(self.ttl, RETRY_AFTER)):
                return self._cache[1]
            got = self._read()
            self._cache = (now, got)
            return got

    def _read(self) -> SlurmRead:
        from gputop.util.textsafe import visible

        rc, out, err = self._run()
        if rc != 0:
            msg = visible((err.strip() or f"exit status {rc}").splitlines()[-1][:200])
            return SlurmRead({}, f"scontrol show job -d failed: {msg}")
        names = node_names()
        jobs = parse_jobs(out, names)
        try:
            files, how = self._files(names)
        except GresConfError as e:  # a wrong IDX -> GPU map would call the wrong process a squatter
            return SlurmRead({}, str(e), (), tuple(jobs))
        by_minor: dict[int, tuple[JobAlloc, str]] = {}
        unmapped = []
        for j in jobs:
            for i in j.idx:
                if files is None:
                    by_minor[i] = (j, f"IDX {i} = minor {i} ({how})")
                elif i < len(files) and files[i][1] is not None:
                    by_minor[files[i][1]] = (j, f"IDX {i} = {files[i][0]} (minor {files[i][1]})")
                else:
                    unmapped.append(f"job {j.job_id}: GRES IDX {i} matches no GPU file of {gres_conf_path()}")
        return SlurmRead(by_minor, None, tuple(unmapped), tuple(jobs))

    @staticmethod
    def _files(names: set[str]) -> tuple[list[tuple[str, int | None]] | None, str]:
        """gres.conf's GPU files with their minors, in IDX order; None (with why) when there is none or it
        names none (slurmd's minor order). Raises GresConfError when it is there but cannot be used."""
        from gputop.util import trustfile
        from gputop.util.errors import GputopError

        path = gres_conf_path()
        try:
            text = trustfile.read_text(path, "gres.conf", 1 << 20)
        except FileNotFoundError:
            return None, "no gres.conf: slurmd's minor order"
        except (OSError, ValueError, GputopError) as e:  # UntrustedFile (as root: not only root's to write)
            raise GresConfError(f"{path} cannot be used: {str(e)[:200]}") from None
        files = gres_files(text, names)
        if not files:
            return None, "gres.conf names no GPU file (AutoDetect): slurmd's minor order"
        return [(g.path, file_minor(g.path)) for g in files], "gres.conf"


# ---- standing -----------------------------------------------------------------------------------

def trusted_job(holder, jobs: dict[int, JobAlloc]) -> tuple[int | None, str | None]:
    """The running job a holder belongs to as far as standing goes, and why a claim was refused. A cgroup
    path is the kernel's; an environment claim counts only when the process runs as the job's user (a
    user writes their own environment). A job that has ended (or an earlier run of a requeued one) counts
    as none."""
    ref = holder.job
    if ref is None:
        return None, None
    st = holder.job_state.for_ref(ref) if holder.job_state is not None else None
    if st is not None and st.ended:
        return None, None
    alloc = jobs.get(ref.job_id)
    if ref.source != "cgroup" and alloc is not None and alloc.uid is not None and holder.proc is not None \
            and holder.proc.uid != alloc.uid:
        return None, (f"its environment names Slurm job {ref.job_id}, but it runs as uid {holder.proc.uid}, "
                      f"not the job's user (uid {alloc.uid})")
    return ref.job_id, None


def gpu_standing(gpu: int, alloc: Allocation | None, job: str | None, job_known: bool, refused: str | None,
                 allocation_known: bool, word: str = "job") -> tuple[str, str]:
    """The standing of one holder on one GPU; ``job``: the label of the holder's (trusted) job or pod,
    ``word``: "job" or "pod". Pure."""
    if not allocation_known:
        return UNKNOWN, f"GPU {gpu}: its allocation is unknown"
    if alloc is not None:
        if job is not None and job in alloc.labels:
            return INSIDE, f"GPU {gpu} is allocated to its {word} {job}"
        if not job_known:
            return UNKNOWN, f"GPU {gpu} is allocated to {word} {alloc.job}; this process's {word} cannot be read"
        who = f"{word} {job}'s process" if job is not None else \
            (f"a process of no {word}" + (f" ({refused})" if refused else ""))
        owner = f" of {alloc.user or alloc.uid}" if alloc.user or alloc.uid is not None else ""
        return SQUATTER, f"{who} on GPU {gpu}, allocated to {word} {', '.join(alloc.labels)}{owner}"
    if job is not None:
        return OUTSIDE, f"{word} {job}'s process on GPU {gpu}, which no {word} was given (not in its allocation)"
    if not job_known:
        return UNKNOWN, f"GPU {gpu} is allocated to no {word}; this process's {word} cannot be read"
    return UNALLOCATED, f"GPU {gpu} is allocated to no {word}"


def worst(per: list[tuple[str, str]], job: str | None) -> Standing:
    """A holder's standing over its GPUs: the worst one (squatter, outside, unknown, unallocated, inside)."""
    kind, reason = max(per, key=lambda kr: _WORST[kr[0]]) if per else (UNKNOWN, "it holds no GPU")
    return Standing(kind, reason, job)


def standing(holder, by_gpu: dict, jobs: dict[int, JobAlloc], allocation_known: bool,
             can_read: Callable[[object], bool]) -> Standing:
    """A holder's standing against Slurm's allocation of every GPU it holds (see the module's docstring)."""
    if holder.proc is None:
        return Standing(UNKNOWN, "the process is not visible here")
    job, refused = trusted_job(holder, jobs)
    label = str(job) if job is not None else None
    job_known = job is not None or holder.job is not None or can_read(holder)
    return worst([gpu_standing(g, by_gpu.get(g), label, job_known, refused, allocation_known) for g in holder.gpus],
                 label)


def environ_readable(holder) -> bool:
    """Whether gputop could have read the holder's job from its environment (root, or its own user)."""
    euid = os.geteuid()
    return euid == 0 or (holder.proc is not None and holder.proc.uid == euid)


# ---- idle allocations -----------------------------------------------------------------------------

class IdleTracker:
    """Since when each allocated GPU has had no holder, per allocation (GPU, job): since the first
    refresh that saw it idle, so a one-shot read never claims more idle time than it saw. Held by the
    sampler across refreshes; a holder, or another job, starts it again."""

    def __init__(self):
        self._since: dict[tuple[int, str], float] = {}

    def update(self, by_gpu: dict, held: set[int], now: float) -> dict[int, float]:
        out: dict[int, float] = {}
        keep: dict[tuple[int, str], float] = {}
        for gpu, a in by_gpu.items():
            if gpu in held:
                continue
            key = (gpu, a.job)
            keep[key] = out[gpu] = self._since.get(key, now)
        self._since = keep
        return out


# ---- the view a sampler adds to its snapshot ------------------------------------------------------

class AllocationSource:
    """What a sampler asks each refresh: the allocation view of its devices and holders, or None on a node
    with no scheduler to ask. ``minor_of(gpu)`` gives a GPU's minor number (None: unknown)."""

    def __init__(self, states, *, ttl: float = 1.0, slurm: SlurmAllocations | None = None):
        self.slurm = slurm or SlurmAllocations(states, ttl=ttl)
        self.idle = IdleTracker()

    def view(self, devices, holders, minor_of: Callable[[int], int | None], now: float) -> AllocationView | None:
        if not self.slurm.available:
            return None
        read = self.slurm.read()
        by_gpu, jobs, unmapped = place_slurm(read, [d.index for d in devices], minor_of)
        known = read.error is None
        standings = {h.pid: standing(h, by_gpu, jobs, known and _minor_known(h, minor_of), environ_readable)
                     for h in holders}
        held = {g for h in holders for g in h.gpus}
        idle = self.idle.update(by_gpu, held, now)
        return AllocationView("slurm", by_gpu, standings, idle, read.error, tuple(read.unmapped) + unmapped)


def _minor_known(holder, minor_of) -> bool:
    return all(minor_of(g) is not None for g in holder.gpus)


def place_slurm(read: SlurmRead, gpus: list[int], minor_of) -> tuple[dict, dict, tuple[str, ...]]:
    """Slurm's allocations by minor onto this node's GPUs (global index): (by_gpu, jobs by id, unplaced)."""
    by_minor = {}
    for g in gpus:
        m = minor_of(g)
        if m is not None:
            by_minor[m] = g
    by_gpu: dict[int, Allocation] = {}
    jobs = {j.job_id: j for j in read.jobs}
    unplaced = []
    for minor, (j, detail) in sorted(read.by_minor.items(), key=lambda kv: kv[0]):
        g = by_minor.get(minor)
        if g is None:
            unplaced.append(f"job {j.job_id}: {detail}: no GPU here has minor number {minor}")
            continue
        by_gpu[g] = Allocation(g, str(j.job_id), j.job_id, j.user, j.uid, j.since, "slurm", detail)
    return by_gpu, jobs, tuple(unplaced)
