"""Slurm: which job a process belongs to, and whether that job still runs. No UI imports.

Attribution, per process: the job id (and step) from the cgroup path (``.../job_N/step_S``, read by
gputop.ownership), or else ``SLURM_JOB_ID``/``SLURM_JOB_UID`` in /proc/PID/environ (readable by root and
by the process's own user). A job's state comes from ``scontrol show job -o N``, run with a timeout and
cached for one refresh; "Invalid job id" means slurmctld has forgotten the job, which ended long ago.
A missing ``scontrol``, a timeout or an unreachable slurmctld give an *unknown* state, never "ended".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable

from gputop.procs import _read

# Terminal states, and COMPLETING: the job's processes have ended (its epilog runs), so whatever of it is
# still alive on the node is a stray. Every other state (RUNNING, SUSPENDED, PENDING, CONFIGURING, ...)
# counts as alive.
ENDED_STATES = frozenset({
    "COMPLETED", "COMPLETING", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
    "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED",
})
FORGOTTEN = "FORGOTTEN"  # "Invalid job id": slurmctld no longer remembers the job (MinJobAge passed)
DEFAULT_TIMEOUT = 2.0
_ENVIRON_MAX = 1 << 20  # a process's environment is at most a few hundred KiB; read no more than this


@dataclass(frozen=True)
class JobRef:
    """The Slurm job a process belongs to, and where gputop learnt it."""

    job_id: int
    step: str | None = None  # "0", "batch", "extern", ... when known
    uid: int | None = None  # the job's user, when known (SLURM_JOB_UID, or uid_U in a v1 cgroup path)
    source: str = "environ"  # "cgroup" or "environ"

    def label(self) -> str:
        return f"{self.job_id}.{self.step}" if self.step else str(self.job_id)

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "step": self.step, "uid": self.uid, "source": self.source}


@dataclass(frozen=True)
class JobState:
    """What slurmctld says about one job. ``state`` None: unknown (``detail`` says why)."""

    job_id: int
    state: str | None
    detail: str = ""

    @property
    def ended(self) -> bool | None:
        if self.state is None:
            return None
        return self.state == FORGOTTEN or self.state in ENDED_STATES

    def describe(self) -> str:
        if self.state is None:
            return f"Slurm job {self.job_id}: state unknown ({self.detail})"
        if self.state == FORGOTTEN:
            return f"Slurm job {self.job_id} ended: slurmctld no longer knows it (Invalid job id)"
        if self.ended:
            return f"Slurm job {self.job_id} ended: {self.state}"
        return f"Slurm job {self.job_id} is {self.state}"

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "state": self.state, "ended": self.ended, "detail": self.detail}


# ---- attribution ---------------------------------------------------------------------------------

def parse_environ(raw: bytes) -> dict[str, str]:
    """The SLURM_* variables of a /proc/PID/environ blob (NUL-separated ``KEY=value``)."""
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if item.startswith(b"SLURM_"):
            k, _, v = item.partition(b"=")
            out[k.decode("ascii", "replace")] = v.decode("utf-8", "replace")
    return out


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None and v.strip().isdigit() else None
    except ValueError:
        return None


def job_from_environ(env: dict[str, str]) -> JobRef | None:
    job = _int(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))
    if job is None:
        return None
    step = env.get("SLURM_STEP_ID") or None
    return JobRef(job, step, _int(env.get("SLURM_JOB_UID")), "environ")


def environ_job(pid: int, proc_root: str = "/proc") -> JobRef | None:
    """The job named in /proc/PID/environ; None when it names none or cannot be read (another user's
    process needs root)."""
    raw = _read(f"{proc_root}/{pid}/environ")
    if not raw:
        return None
    return job_from_environ(parse_environ(raw[:_ENVIRON_MAX]))


_CGROUP_JOB = re.compile(r"/(?:uid_(\d+)/)?job_(\d+)(?:/step_([A-Za-z0-9_]+))?")


def cgroup_job(text: str) -> JobRef | None:
    """The job in /proc/PID/cgroup text (v1 ``/slurm*/uid_U/job_N/step_S``, v2 ``.../job_N/step_S``).

    Used only where gputop.ownership has not parsed the cgroup already."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "slurm" not in path:
            continue
        m = _CGROUP_JOB.search(path)
        if m:
            uid, job, step = m.group(1), m.group(2), m.group(3)
            return JobRef(int(job), step, int(uid) if uid else None, "cgroup")
    return None


def process_job(pid: int, proc_root: str = "/proc", owner=None) -> JobRef | None:
    """The job of one process: the cgroup first (it cannot be changed by the job), then the environment."""
    ref = _owner_job(owner) if owner is not None else None
    if ref is None and owner is None:
        raw = _read(f"{proc_root}/{pid}/cgroup")
        ref = cgroup_job(raw.decode("utf-8", "replace")) if raw else None
    if ref is not None:
        if ref.uid is None:  # the v2 path has no uid: take it from the environment when it agrees
            env = environ_job(pid, proc_root)
            if env is not None and env.job_id == ref.job_id and env.uid is not None:
                ref = JobRef(ref.job_id, ref.step, env.uid, ref.source)
        return ref
    return environ_job(pid, proc_root)


def _owner_job(owner) -> JobRef | None:
    """A JobRef from a gputop.ownership Owner (its Slurm fields), when it names a job."""
    job = getattr(owner, "slurm_job", None)
    if job is None:
        return None
    return JobRef(int(job), getattr(owner, "slurm_step", None), getattr(owner, "slurm_uid", None), "cgroup")


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
        if state:
            return JobState(job_id, state.split()[0].upper(), "scontrol show job")
        return JobState(job_id, None, "scontrol printed no JobState")
    if "invalid job id" in (err + out).lower():
        return JobState(job_id, FORGOTTEN, "slurmctld: Invalid job id")
    msg = (err.strip() or out.strip() or f"exit status {rc}").splitlines()[-1][:200]
    return JobState(job_id, None, f"scontrol failed: {msg}")


class JobStates:
    """Job states from ``scontrol``, cached for ``ttl`` seconds (one refresh), asked in parallel with a
    timeout. ``assume`` pins a state that gputop knows better (the epilog knows its job has ended)."""

    def __init__(self, *, scontrol: str | None = None, timeout: float = DEFAULT_TIMEOUT, ttl: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, runner=None):
        self.scontrol = scontrol or os.environ.get("GPUTOP_SCONTROL") or shutil.which("scontrol")
        self.timeout = timeout
        self.ttl = ttl
        self.clock = clock
        self._run = runner or self._scontrol
        self._cache: dict[int, tuple[float, JobState]] = {}
        self._assumed: dict[int, JobState] = {}
        self._lock = threading.Lock()

    def assume(self, job_id: int, state: str, detail: str) -> None:
        self._assumed[job_id] = JobState(job_id, state, detail)

    def _scontrol(self, job_id: int) -> JobState:
        if not self.scontrol:
            return JobState(job_id, None, "scontrol not found (no Slurm client on this node)")
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
    try:
        p = subprocess.run([scontrol, "show", "job", "-d", str(job_id)], capture_output=True, text=True,
                           timeout=(states.timeout if states else DEFAULT_TIMEOUT), stdin=subprocess.DEVNULL)
    except (subprocess.TimeoutExpired, OSError) as e:
        return None, f"scontrol show job -d {job_id} failed: {e}"
    gpus = gres_gpus(p.stdout) if p.returncode == 0 else None
    if gpus is None:
        return None, f"job {job_id} has no GPU GRES (scontrol show job -d)"
    return gpus, "scontrol show job -d (GRES IDX)"
