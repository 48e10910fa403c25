"""Slurm: which job a process belongs to, and whether that job still runs. No UI imports.

Attribution, per process: the job id (and step) from the cgroup path (``.../job_N/step_S``, read by
gputop.core.ownership), or else ``SLURM_JOB_ID``/``SLURM_JOB_UID`` in /proc/PID/environ (readable by root and
by the process's own user). A job's state comes from ``scontrol show job -o N``, run with a timeout and
cached for one refresh; "Invalid job id" means slurmctld has forgotten the job, which ended long ago.
A missing ``scontrol``, a timeout or an unreachable slurmctld give an *unknown* state, never "ended".

A requeued job runs again under the same id. Its runs are told apart by the restart count: slurmd puts
``SLURM_RESTART_COUNT`` (the job's restart count, set only once it is above 0) in every process of a run,
and ``scontrol show job`` says ``Restarts=N`` for the current run. A process whose environment names the
job with a lower count (no ``SLURM_RESTART_COUNT`` at all: run 0) is a leftover of an earlier run, which
has ended, whatever state the job is in now (``JobState.for_ref``). See docs/slurm.md "Requeued jobs".
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable, Iterable


# Terminal states, and COMPLETING: the job's processes have ended (its epilog runs), so whatever of it is
# still alive on the node is a stray. Every other state (RUNNING, SUSPENDED, PENDING, CONFIGURING, ...)
# counts as alive.
ENDED_STATES = frozenset({
    "COMPLETED", "COMPLETING", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
    "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED",
})
FORGOTTEN = "FORGOTTEN"  # "Invalid job id": slurmctld no longer remembers the job (MinJobAge passed)
DEFAULT_TIMEOUT = 2.0


@dataclass(frozen=True)
class JobRef:
    """The Slurm job a process belongs to, and where gputop learnt it."""

    job_id: int
    step: str | None = None  # "0", "batch", "extern", ... when known
    uid: int | None = None  # the job's user, when known (SLURM_JOB_UID, or uid_U in a v1 cgroup path)
    source: str = "environ"  # "cgroup" or "environ"
    run: int | None = None  # the run of a requeued job it was started in (SLURM_RESTART_COUNT); None: unknown

    def label(self) -> str:
        return f"{self.job_id}.{self.step}" if self.step else str(self.job_id)

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "step": self.step, "uid": self.uid, "source": self.source, "run": self.run}


@dataclass(frozen=True)
class JobState:
    """What slurmctld says about one job. ``state`` None: unknown (``detail`` says why)."""

    job_id: int
    state: str | None
    detail: str = ""
    restarts: int | None = None  # the job's current run (``Restarts=`` of scontrol show job), when known
    run: int | None = None  # set by for_ref: the earlier run a process was started in

    @property
    def earlier_run(self) -> bool:
        """True when this is the state of a process started in an earlier run of a requeued job."""
        return self.run is not None and self.restarts is not None and self.run < self.restarts

    @property
    def ended(self) -> bool | None:
        if self.state is None:
            return None
        return self.earlier_run or self.state == FORGOTTEN or self.state in ENDED_STATES

    def for_ref(self, ref: JobRef) -> "JobState":
        """The state of the job as it concerns a process of it (``ref``): ended, when the process was
        started in an earlier run of the job (requeued since); else this state. Pure."""
        if ref.run is None or self.restarts is None or ref.run >= self.restarts or self.state is None:
            return self
        return JobState(self.job_id, self.state, self.detail, self.restarts, ref.run)

    def describe(self) -> str:
        if self.earlier_run:
            return (f"Slurm job {self.job_id} was requeued: this process is from run {self.run}, which ended; "
                    f"the job is {self.state} in run {self.restarts}")
        if self.state is None:
            return f"Slurm job {self.job_id}: state unknown ({self.detail})"
        if self.state == FORGOTTEN:
            return f"Slurm job {self.job_id} ended: slurmctld no longer knows it (Invalid job id)"
        if self.ended:
            return f"Slurm job {self.job_id} ended: {self.state}"
        return f"Slurm job {self.job_id} is {self.state}"

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "state": self.state, "ended": self.ended, "detail": self.detail,
                "restarts": self.restarts, "earlier_run": self.earlier_run}


# ---- attribution ---------------------------------------------------------------------------------

def process_job(pid: int, proc_root: str = "/proc", owner=None) -> JobRef | None:
    """The job of one process: its cgroup first (gputop.core.ownership; a job cannot move itself out of the
    job's path under proctrack/cgroup without leaving the job), then SLURM_JOB_ID in its environment
    (readable by root and by the process's own user). ``owner``: the Owner already read, if any."""
    from gputop.core.ownership import SLURM, read_owner, slurm_job_from_environ

    if owner is None:
        owner = read_owner(pid, proc_root)
    if owner is not None and owner.kind == SLURM and owner.job is not None:
        env = slurm_job_from_environ(pid, proc_root)
        same = env is not None and env.job == owner.job
        uid = owner.uid
        if uid is None and same:  # the v2 path has no uid: take it from the environment when that names the same job
            uid = env.uid  # type: ignore[union-attr]
        return JobRef(owner.job, owner.step, uid, "cgroup", restart_count(pid, proc_root) if same else None)
    env = slurm_job_from_environ(pid, proc_root)
    if env is not None:
        return JobRef(env.job, env.step, env.uid, "environ", restart_count(pid, proc_root))
    return None


_MAX_ENVIRON = 1 << 20
_RESTART = re.compile(rb"(?:^|\0)SLURM_RESTART_COUNT=([^\0]*)")


def restart_count(pid: int, proc_root: str = "/proc") -> int | None:
    """The run of its job a process was started in: ``SLURM_RESTART_COUNT`` in its environment (slurmd
    sets it only from the first requeue on, so 0 when absent). Call it only for a process whose
    environment names a job. None when the environment cannot be read or the value is not a number."""
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as f:
            data = f.read(_MAX_ENVIRON)
    except OSError:
        return None
    m = _RESTART.search(data)
    if m is None:
        return 0 if data else None
    return int(m.group(1)) if re.fullmatch(rb"\d{1,9}", m.group(1)) else None


# ---- job state -----------------------------------------------------------------------------------

def parse_show_job(text: str) -> dict[str, str]:
    """``scontrol show job -o`` output (``Key=Value Key=Value ...``) as a dict (first record only)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    out: dict[str, str] = {}
    for tok in line.split():
        k, sep, v = tok.partition("=")
        if sep and k not in out:
            out[k] = v
    return out


def state_from_output(job_id: int, rc: int, out: str, err: str) -> JobState:
    if rc == 0:
        fields = parse_show_job(out)
        state = fields.get("JobState")
        restarts = fields.get("Restarts", "")
        if state:
            return JobState(job_id, state.split()[0].upper(), "scontrol show job",
                            int(restarts) if restarts.isdigit() and len(restarts) < 10 else None)
        return JobState(job_id, None, "scontrol printed no JobState")
    if "invalid job id" in (err + out).lower():
        return JobState(job_id, FORGOTTEN, "slurmctld: Invalid job id")
    from gputop.util.textsafe import visible

    msg = visible((err.strip() or out.strip() or f"exit status {rc}").splitlines()[-1][:200])
    return JobState(job_id, None, f"scontrol failed: {msg}")


class JobStates:
    """Job states from ``scontrol``, cached for ``ttl`` seconds (one refresh), asked in parallel with a
    timeout. ``assume`` pins a state that gputop knows better (the epilog knows its job has ended)."""

    def __init__(self, *, scontrol: str | None = None, timeout: float = DEFAULT_TIMEOUT, ttl: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, runner=None):
        self._scontrol_path = scontrol
        self.timeout = timeout
        self.ttl = ttl
        self.clock = clock
        self._run = runner or self._scontrol
        self._cache: dict[int, tuple[float, JobState]] = {}
        self._assumed: dict[int, JobState] = {}
        self._lock = threading.Lock()

    @property
    def scontrol(self) -> str | None:
        """The scontrol to run: as given, $GPUTOP_SCONTROL, or the one on PATH (looked up when first needed)."""
        if self._scontrol_path is None:
            self._scontrol_path = os.environ.get("GPUTOP_SCONTROL") or shutil.which("scontrol") or ""
        return self._scontrol_path or None

    def assume(self, job_id: int, state: str, detail: str) -> None:
        self._assumed[job_id] = JobState(job_id, state, detail)

    def _scontrol(self, job_id: int) -> JobState:
        if not self.scontrol:
            return JobState(job_id, None, "scontrol not found (no Slurm client on this node)")
        import subprocess  # here, not at the top: a sample with no Slurm job never runs it (start-up)

        try:
            p = subprocess.run([self.scontrol, "show", "job", "-o", str(job_id)], capture_output=True,
                               text=True, timeout=self.timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return JobState(job_id, None, f"scontrol did not answer within {self.timeout:g}s")
        except OSError as e:
            return JobState(job_id, None, f"scontrol cannot run: {e.strerror or e}")
        return state_from_output(job_id, p.returncode, p.stdout, p.stderr)

    def get_many(self, job_ids: Iterable[int]) -> dict[int, JobState]:
        now = self.clock()
        out: dict[int, JobState] = {}
        todo: list[int] = []
        with self._lock:
            for j in set(job_ids):
                if j in self._assumed:
                    out[j] = self._assumed[j]
                    continue
                hit = self._cache.get(j)
                if hit is not None and now - hit[0] < self.ttl:
                    out[j] = hit[1]
                else:
                    todo.append(j)
        if todo:
            if len(todo) == 1:
                got = [self._run(todo[0])]
            else:
                from concurrent.futures import ThreadPoolExecutor  # only with several jobs (start-up time)

                with ThreadPoolExecutor(max_workers=min(8, len(todo))) as ex:
                    got = list(ex.map(self._run, todo))
            with self._lock:
                for st in got:
                    self._cache[st.job_id] = (now, st)
                    out[st.job_id] = st
                # Forget jobs no one asked about for a while.
                self._cache = {j: v for j, v in self._cache.items() if now - v[0] < max(60.0, self.ttl)}
        return out

    def get(self, job_id: int) -> JobState:
        return self.get_many([job_id])[job_id]


# ---- a job's GPUs (prolog) -----------------------------------------------------------------------

def parse_index_list(text: str) -> list[int]:
    """``0,2-3`` -> [0, 2, 3]; raises ValueError on anything else."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a GPU index list: {text!r}")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a or b - a > 4096:
            raise ValueError(f"not a GPU index list: {text!r}")
        out.update(range(a, b + 1))
    return sorted(out)


_GRES_IDX = re.compile(r"gpu[^\s]*?\(IDX:([0-9,\-]+)\)")


def gres_gpus(show_job_detail: str) -> list[int] | None:
    """GPU indexes from ``scontrol show job -d N`` (``GRES=gpu:2(IDX:0-1)``); None when it lists none."""
    found: list[int] = []
    seen = False
    for m in _GRES_IDX.finditer(show_job_detail):
        seen = True
        found.extend(parse_index_list(m.group(1)))
    return sorted(set(found)) if seen else None


def job_gpus(env: dict[str, str], job_id: int | None, states: JobStates | None = None) -> tuple[list[int] | None, str]:
    """The GPUs a job was given, and where that came from: SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES, or the
    GRES IDX of ``scontrol show job -d``. (None, why) when no source names them."""
    for var in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        v = env.get(var)
        if v:
            try:
                return parse_index_list(v), var
            except ValueError:
                continue  # CUDA_VISIBLE_DEVICES may hold UUIDs: try the next source
    scontrol = (states.scontrol if states else None) or shutil.which("scontrol")
    if job_id is None or not scontrol:
        return None, "no SLURM_JOB_GPUS or CUDA_VISIBLE_DEVICES, and no scontrol to ask"
    import subprocess

    try:
        p = subprocess.run([scontrol, "show", "job", "-d", str(job_id)], capture_output=True, text=True,
                           timeout=(states.timeout if states else DEFAULT_TIMEOUT), stdin=subprocess.DEVNULL)
    except (subprocess.TimeoutExpired, OSError) as e:
        return None, f"scontrol show job -d {job_id} failed: {e}"
    gpus = gres_gpus(p.stdout) if p.returncode == 0 else None
    if gpus is None:
        return None, f"job {job_id} has no GPU GRES (scontrol show job -d)"
    return gpus, "scontrol show job -d (GRES IDX)"


# ---- a job's processes (epilog) ------------------------------------------------------------------

@dataclass(frozen=True)
class JobProcess:
    """A process of a Slurm job, with the job it belongs to."""

    proc: "ProcInfo"
    job: JobRef


def job_processes(job_id: int, job_uid: int, table, exclude: Iterable[int] = ()) -> list[JobProcess]:
    """Every live process of job ``job_id`` (by cgroup or environ) that runs as ``job_uid``.

    A process of another user is never one of them, whatever its environment claims (a process writes its
    own environment), and neither is PID 1, a kernel thread or anything in ``exclude`` (gputop and its
    ancestors: slurmd, which runs the epilog). The processes looked at are those of ``table``'s scan
    (``ProcTable.scan_all``; scanned now if it has not been): /proc is not listed again, so a reap round
    that has scanned its table reads the membership from that same table."""
    skip = set(exclude) | {1}
    out = []
    for pid in _scanned_pids(table):
        if pid in skip:
            continue
        info = table.get(pid)
        if info is None or info.zombie or info.kthread or info.uid != job_uid:
            continue
        ref = process_job(pid, table.proc_root)
        if ref is None or ref.job_id != job_id or (ref.uid is not None and ref.uid != job_uid):
            continue
        out.append(JobProcess(info, ref))
    return out


def _scanned_pids(table) -> list[int]:
    """Every PID of ``table``'s scan of /proc, scanning it first when it has not been scanned."""
    fields = table.stat_fields()
    if not fields:
        table.scan_all()
        fields = table.stat_fields()
    return sorted(fields)


def tree_roots(members: list[JobProcess], first: Iterable[int] = ()) -> list[int]:
    """The topmost members: those whose parent is not a member. Roots above a PID in ``first`` (GPU
    holders) come first, then the rest, each group in PID order."""
    pids = {m.proc.pid for m in members}
    parent = {m.proc.pid: m.proc.ppid for m in members}

    def top(pid: int) -> int:
        seen = {pid}
        while parent.get(pid) in pids and parent[pid] not in seen:
            pid = parent[pid]
            seen.add(pid)
        return pid

    roots = sorted({top(p) for p in pids})
    lead = sorted({top(p) for p in first if p in pids})
    return lead + [r for r in roots if r not in lead]
