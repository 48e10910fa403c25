"""Who owns a process, read from its cgroup: a systemd service, a logind session, a container, a
Kubernetes pod, a Slurm job, or nothing known.

``/proc/PID/cgroup`` has one line per hierarchy, ``ID:CONTROLLERS:PATH``:
- cgroup v2 (unified): one line ``0::/system.slice/foo.service``;
- cgroup v1: one line per controller (``6:freezer:/slurm/uid_1000/job_42/step_0``), and on systemd hosts
  a named hierarchy ``1:name=systemd:/user.slice/user-1000.slice/session-12.scope``; hybrid hosts have both.

systemd units and logind sessions are read from the ``name=systemd`` line (else the unified one);
containers, pods and Slurm jobs from any line (Slurm's v1 plugins use freezer, cpuset, memory, devices).
A logind session's state comes from ``RUN_ROOT/systemd/sessions/ID`` (``STATE=active|online|closing``).

Names are taken only when they match the strict forms systemd, the container runtimes and Slurm write, so a
cgroup name a user chose in a delegated subtree (any byte but ``/``) never becomes an owner's name: the raw
path is kept in ``Owner.cgroup`` for JSON, and faces must not print it raw.

Pure parsing plus small readers; no UI imports. Reading costs one small /proc file per process (plus one
/run file for a session), so the sampler reads it only for GPU holders and their ancestors, and caches
it per process identity (OwnerCache).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from collections.abc import Callable, Iterable

# Owner kinds, most specific first: a Slurm job or a pod is named even when its processes also sit in a
# systemd unit (on cgroup v1, slurmd.service holds a job's processes in the name=systemd hierarchy).
SLURM = "slurm"
POD = "pod"
CONTAINER = "container"
SESSION = "session"
SERVICE = "service"
NONE = "none"
KINDS = (SLURM, POD, CONTAINER, SESSION, SERVICE, NONE)

# logind session states. "gone": /run/systemd/sessions exists, but not this session's file.
ACTIVE, ONLINE, CLOSING, GONE = "active", "online", "closing", "gone"
LIVE_STATES = (ACTIVE, ONLINE)
ENDED_STATES = (CLOSING, GONE)

# Services that start user logins or jobs. Without pam_systemd (common on HPC nodes, and Debian's cron),
# a login's processes stay in the spawner's cgroup, and these units stop only their main process
# (KillMode=process): their leftovers are not managed by systemd, so the session test judges them.
_LOGIN_SERVICE = re.compile(
    r"(?:sshd?|sshd?@.*|dropbear(?:@.*)?|cron|crond|cronie|atd|anacron|(?:serial-|container-)?getty@.*"
    r"|console-getty|slurmd|xrdp(?:-sesman)?|gdm|lightdm|sddm|login)\.service"
)

_UNIT_CHARS = r"[A-Za-z0-9:_.\\-]+"  # what systemd allows in a unit name (plus '@' for templates below)
_SERVICE = re.compile(rf"{_UNIT_CHARS}(?:@{_UNIT_CHARS}?)?\.service")
_USER_MANAGER = re.compile(r"user@(\d+)\.service")
_USER_SLICE = re.compile(r"user-(\d+)\.slice")
_SESSION_SCOPE = re.compile(r"session-([A-Za-z0-9_]{1,64})\.scope")
_HEX_ID = r"[0-9a-f]{12,64}"
# Container scopes and cgroupfs directories, one component each: (regex, runtime).
_CONTAINER_FORMS = (
    (re.compile(rf"docker-({_HEX_ID})\.scope"), "docker"),
    (re.compile(rf"cri-containerd-({_HEX_ID})(?:\.scope)?"), "containerd"),
    (re.compile(rf"nerdctl-({_HEX_ID})\.scope"), "containerd"),
    (re.compile(rf"crio-(?:conmon-)?({_HEX_ID})(?:\.scope)?"), "cri-o"),
    (re.compile(rf"libpod-(?:conmon-)?({_HEX_ID})(?:\.scope)?"), "podman"),
)
_FULL_ID = re.compile(r"[0-9a-f]{64}")
_POD_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# systemd driver: kubepods-burstable-pod<uid_with_underscores>.slice (also kubelet-kubepods-... in kind/k3s);
# cgroupfs driver: /kubepods/burstable/pod<uid>/<container id>.
_POD_SLICE = re.compile(rf"(?:.*-)?kubepods(?:-[a-z]+)?-pod({_POD_UID})\.slice")
_POD_DIR = re.compile(rf"pod({_POD_UID})")
_QOS = ("burstable", "besteffort", "guaranteed")
_SLURM_JOB = re.compile(r"job_(\d{1,12})")
_SLURM_STEP = re.compile(r"step_([A-Za-z0-9_]{1,32})")
_SLURM_UID = re.compile(r"uid_(\d+)")
_SLURM_V1_ROOT = re.compile(r"slurm(?:_[A-Za-z0-9._-]+)?")
_SLURMSTEPD_SCOPE = re.compile(r"(?:[A-Za-z0-9._-]+_)?slurmstepd(?:_[A-Za-z0-9._-]+)?\.scope")

_MAX_READ = 65536  # /proc/PID/cgroup is a few hundred bytes; a session file well under 1 KiB
_MAX_ENVIRON = 4 << 20  # ARG_MAX-sized environments exist; read no more than this


@dataclass(frozen=True, slots=True)
class Owner:
    """Who owns one process, from its cgroup. ``kind`` is the most specific owner found; the other
    fields record everything found (a pod's container id, the user manager around a user service)."""

    kind: str  # one of KINDS
    cgroup: str = ""  # the path it was read from (raw: may hold any character; JSON only)
    unit: str | None = None  # innermost systemd service: "foo.service", "user@1000.service"
    manager: str | None = None  # "user@UID.service" when the unit runs under a user's systemd
    uid: int | None = None  # from user@UID.service, user-UID.slice or Slurm's uid_U
    session: str | None = None  # logind session id ("12", "c3")
    session_state: str | None = None  # active | online | closing | gone; None: logind not running here
    runtime: str | None = None  # docker | containerd | cri-o | podman (None: a pod's runtime is unknown)
    container: str | None = None  # container id
    pod: str | None = None  # Kubernetes pod UID (with dashes)
    job: int | None = None  # Slurm job id
    step: str | None = None  # Slurm step: "0", "batch", "extern", "interactive"

    @property
    def login_service(self) -> bool:
        """The unit is a login or job spawner (sshd, cron, getty, slurmd): its leftovers are not managed."""
        return self.kind == SERVICE and self.unit is not None and bool(_LOGIN_SERVICE.fullmatch(self.unit))

    @property
    def label(self) -> str:
        """A short cell for tables: ``foo.service``, ``session 12 closing``, ``docker 3f2a1b4c5d6e``."""
        if self.kind == SLURM:
            return f"slurm {self.job}" + (f".{self.step}" if self.step else "")
        if self.kind == POD:
            return f"pod {self.pod[:8]}" + (f"/{self.container[:12]}" if self.container else "")  # type: ignore[index]
        if self.kind == CONTAINER:
            return f"{self.runtime} {self.container[:12]}"  # type: ignore[index]
        if self.kind == SESSION:
            return f"session {self.session}" + (f" {self.session_state}" if self.session_state else "")
        if self.kind == SERVICE:
            return f"{self.unit}" + (f" (user {self.uid})" if self.manager and self.unit != self.manager else "")
        return "-"

    def describe(self) -> str:
        """One sentence for a person: the details view, verdict reasons."""
        if self.kind == SLURM:
            return (f"Slurm job {self.job}" + (f", step {self.step}" if self.step else "")
                    + (f" (uid {self.uid})" if self.uid is not None else ""))
        if self.kind == POD:
            rt = f" ({self.runtime})" if self.runtime else ""
            return f"Kubernetes pod {self.pod}" + (f", container {self.container}{rt}" if self.container else "")
        if self.kind == CONTAINER:
            return f"{self.runtime} container {self.container}"
        if self.kind == SESSION:
            state = {None: "logind state unknown (no /run/systemd/sessions)",
                     GONE: "logind no longer knows it"}.get(self.session_state, f"logind says {self.session_state}")
            who = f" of uid {self.uid}" if self.uid is not None else ""
            return f"login session {self.session}{who}: {state}"
        if self.kind == SERVICE:
            where = f"the systemd user manager of uid {self.uid} ({self.manager})" if self.manager else "systemd"
            text = f"systemd unit {self.unit}, run by {where}"
            if self.login_service:
                text += " (a login service: its sessions' leftovers are judged by the session test)"
            return text
        return "no known owner (no systemd unit, session, container or job in its cgroup)"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "label": self.label, "cgroup": self.cgroup, "unit": self.unit,
                "manager": self.manager, "uid": self.uid, "session": self.session, "session_state": self.session_state,
                "runtime": self.runtime, "container": self.container, "pod": self.pod,
                "job": self.job, "step": self.step}


@dataclass(frozen=True)
class SlurmEnv:
    """A process's Slurm job as its environment claims it (``SLURM_JOB_ID``, ``SLURM_JOB_UID``,
    ``SLURM_STEP_ID``). The process wrote its environment itself, so unlike a cgroup path it is a claim:
    check ``uid`` against the process's owner before trusting it for another user's job."""

    job: int
    uid: int | None = None
    step: str | None = None


# ---- parsing -----------------------------------------------------------------------------------

def parse_lines(text: str) -> list[tuple[str, str]]:
    """``(controllers, path)`` per line of /proc/PID/cgroup; ``""`` is the v2 unified hierarchy."""
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)  # the path may hold ':' (containerd's "slice:cri-containerd:ID")
        if len(parts) == 3 and parts[2].startswith("/"):
            out.append((parts[1], parts[2]))
    return out


def _systemd_path(lines: list[tuple[str, str]]) -> str | None:
    named = [p for c, p in lines if "name=systemd" in c.split(",")]
    unified = [p for c, p in lines if c == ""]
    for p in named + unified:
        if p != "/":
            return p
    return (named + unified or [None])[0]


def _service(parts: list[str]) -> tuple[str | None, int | None]:
    """The innermost .service in the path, and the uid when it is under a user manager."""
    unit = uid = None
    for comp in parts:
        m = _USER_MANAGER.fullmatch(comp)
        if m:
            uid = int(m.group(1))
        if _SERVICE.fullmatch(comp):
            unit = comp
    return unit, uid


def _session(parts: list[str]) -> tuple[str | None, int | None]:
    # logind creates session-N.scope directly in user-UID.slice; one found anywhere else (in a user's
    # delegated subtree) is not a login session.
    for prev, comp in zip(parts, parts[1:]):
        m = _SESSION_SCOPE.fullmatch(comp)
        u = _USER_SLICE.fullmatch(prev)
        if m and u:
            return m.group(1), int(u.group(1))
    return None, None


def _container(parts: list[str]) -> tuple[str | None, str | None]:
    found: tuple[str | None, str | None] = (None, None)
    for i, comp in enumerate(parts):
        for rx, runtime in _CONTAINER_FORMS:
            m = rx.fullmatch(comp)
            if m:
                found = (runtime, m.group(1))
                break
        else:
            if comp == "docker" and i + 1 < len(parts) and _FULL_ID.fullmatch(parts[i + 1]):
                found = ("docker", parts[i + 1])  # cgroupfs driver: /docker/ID (innermost wins)
    return found


def _pod(parts: list[str]) -> tuple[str | None, str | None, str | None]:
    """(pod UID, runtime, container id) from a kubepods path, either cgroup driver."""
    for i, comp in enumerate(parts):
        m = _POD_SLICE.fullmatch(comp)
        if m is None and "kubepods" in parts[max(0, i - 2):i]:  # cgroupfs: kubepods/[QOS/]pod<UID>
            above = parts[i - 1]
            if above == "kubepods" or (above in _QOS and parts[i - 2] == "kubepods"):
                m = _POD_DIR.fullmatch(comp)
        if m:
            rest = parts[i + 1:]
            runtime, cid = _container(rest)
            if cid is None and rest and _FULL_ID.fullmatch(rest[0]):
                cid = rest[0]  # cgroupfs driver: a bare id, runtime not named
            return m.group(1).replace("_", "-"), runtime, cid
    return None, None, None


def _slurm(parts: list[str]) -> tuple[int | None, str | None, int | None]:
    """(job, step, uid): v1 ``/slurm[_HOST]/uid_U/job_N/step_S`` (at the hierarchy's root) or v2
    ``.../slurmstepd.scope/job_N/step_S`` (not inside a user manager, where a user names cgroups)."""
    if len(parts) >= 3 and _SLURM_V1_ROOT.fullmatch(parts[0]) and _SLURM_UID.fullmatch(parts[1]):
        m = _SLURM_JOB.fullmatch(parts[2])
        if m:
            s = _SLURM_STEP.fullmatch(parts[3]) if len(parts) > 3 else None
            return int(m.group(1)), s.group(1) if s else None, int(parts[1][4:])
    for i, comp in enumerate(parts[:-1]):
        if _USER_MANAGER.fullmatch(comp):
            return None, None, None
        if _SLURMSTEPD_SCOPE.fullmatch(comp):
            m = _SLURM_JOB.fullmatch(parts[i + 1])
            if m:
                s = _SLURM_STEP.fullmatch(parts[i + 2]) if len(parts) > i + 2 else None
                return int(m.group(1)), s.group(1) if s else None, None
    return None, None, None


_SLICE_COLON = re.compile(rf"([^:]+\.slice):(cri-containerd|crio|docker):({_HEX_ID})")


def _split(path: str) -> list[str]:
    """The path's components; containerd's and cri-o's ``SLICE:PREFIX:ID`` (a systemd cgroupsPath kept as
    one directory under the runtime's service on some hosts) becomes ``SLICE``, ``PREFIX-ID.scope``."""
    out = []
    for c in path.split("/"):
        m = _SLICE_COLON.fullmatch(c) if ":" in c else None
        if m:
            out += [m.group(1), f"{m.group(2)}-{m.group(3)}.scope"]
        elif c:
            out.append(c)
    return out


def _first(paths: list[str], parts: dict[str, list[str]], hints: tuple[str, ...],
           find: Callable[[list[str]], tuple]) -> tuple[str | None, tuple]:
    """The first path in which ``find`` finds something (its first item not None), and what it found.
    A path holding none of ``hints`` is skipped unsearched (most paths name nothing)."""
    for p in paths:
        if any(h in p for h in hints):
            found = find(parts[p])
            if found[0] is not None:
                return p, found
    return None, ()


_CONTAINER_HINTS = ("docker", "containerd", "nerdctl", "crio", "libpod")


@lru_cache(maxsize=1024)
def parse_cgroup(text: str) -> Owner:
    """The owner named by the text of /proc/PID/cgroup (no session state: see read_owner).

    Memoised: the processes of one session, unit or container have the same text."""
    lines = parse_lines(text)
    sd_path = _systemd_path(lines) or ""
    # Containers, pods and jobs: the systemd line first, then the others in file order, each path once.
    paths = [p for p in dict.fromkeys([sd_path] + [p for _, p in lines]) if p not in ("", "/")]
    if not paths:
        return Owner(NONE, sd_path)
    parts = {p: _split(p) for p in paths}
    sd_parts = parts.get(sd_path, [])
    unit, manager_uid = _service(sd_parts) if ".service" in sd_path else (None, None)
    session, session_uid = _session(sd_parts) if "session-" in sd_path else (None, None)
    manager = f"user@{manager_uid}.service" if manager_uid is not None else None
    base = dict(unit=unit, manager=manager, uid=manager_uid if manager_uid is not None else session_uid,
                session=session)
    where, found = _first(paths, parts, ("job_",), _slurm)
    if where is not None:
        job, step, job_uid = found
        runtime, cid = _container(parts[where])
        uid = job_uid if job_uid is not None else base["uid"]
        return Owner(SLURM, where, **{**base, "uid": uid}, job=job, step=step, runtime=runtime, container=cid)
    where, found = _first(paths, parts, ("kubepods",), _pod)
    if where is not None:
        pod, runtime, cid = found
        return Owner(POD, where, **base, pod=pod, runtime=runtime, container=cid)
    where, found = _first(paths, parts, _CONTAINER_HINTS, lambda ps: _container(ps)[::-1])
    if where is not None:
        cid, runtime = found
        return Owner(CONTAINER, where, **base, runtime=runtime, container=cid)
    if session is not None:
        return Owner(SESSION, sd_path, **base)
    if unit is not None:
        return Owner(SERVICE, sd_path, **base)
    return Owner(NONE, sd_path)


# ---- readers -----------------------------------------------------------------------------------

def _read_bytes(path: str, limit: int = _MAX_READ) -> bytes | None:
    """A small file's bytes, at most ``limit``; None when missing, unreadable or gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        parts, left = [], limit
        while left > 0:
            want = min(left, 65536)
            chunk = os.read(fd, want)
            parts.append(chunk)
            left -= len(chunk)
            # A short read is the end: of a regular file, and of these /proc files (cgroup is a seq_file
            # that gives all that fits; environ copies until the count or its end). Not one more read
            # to see it return nothing: a sample reads two of these files a holder.
            if len(chunk) < want:
                break
        return b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)


def session_state(session: str, run_root: str = "/run") -> str | None:
    """logind's state of a session: active, online, closing, or gone (its file is missing while
    logind's directory exists); None when logind does not run here (no RUN_ROOT/systemd/sessions)."""
    base = os.path.join(run_root, "systemd", "sessions")
    if not _SESSION_SCOPE.fullmatch(f"session-{session}.scope"):
        return None
    data = _read_bytes(os.path.join(base, session))
    if data is None:
        return GONE if os.path.isdir(base) else None
    for line in data.decode("utf-8", "replace").splitlines():
        if line.startswith("STATE="):
            state = line[6:].strip()
            return state if re.fullmatch(r"[a-z]{1,16}", state) else None
    return None


def read_owner(pid: int, proc_root: str = "/proc", run_root: str = "/run") -> Owner | None:
    """The owner of ``pid`` from ``PROC_ROOT/PID/cgroup``; None when that cannot be read (gone, hidden,
    or no cgroup support); ``Owner(NONE)`` when it can but names nothing known."""
    data = _read_bytes(f"{proc_root}/{pid}/cgroup")
    if not data:
        return None
    return owner_from_cgroup(data, run_root)


def owner_from_cgroup(data: bytes, run_root: str = "/run") -> Owner:
    """The owner that a /proc/<pid>/cgroup file's bytes name (with its logind session's state)."""
    owner = parse_cgroup(data.decode("utf-8", "replace"))
    if owner.session is not None:
        owner = replace(owner, session_state=session_state(owner.session, run_root))
    return owner


def slurm_job_from_environ(pid: int, proc_root: str = "/proc") -> SlurmEnv | None:
    """``SLURM_JOB_ID`` (with ``SLURM_JOB_UID`` and ``SLURM_STEP_ID``) from PROC_ROOT/PID/environ.

    None when the file cannot be read (another user's process without root, gone, hidden) or has no
    valid job id: never an error."""
    data = _read_bytes(f"{proc_root}/{pid}/environ", _MAX_ENVIRON)
    if not data or b"SLURM_JOB_ID=" not in data:  # the common case, in one scan instead of a loop
        return None
    env: dict[bytes, bytes] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"SLURM_JOB_ID", b"SLURM_JOB_UID", b"SLURM_STEP_ID") and key not in env:
            env[key] = value
    job = env.get(b"SLURM_JOB_ID", b"")
    if not re.fullmatch(rb"\d{1,12}", job):
        return None
    uid = env.get(b"SLURM_JOB_UID", b"")
    step = env.get(b"SLURM_STEP_ID", b"")
    return SlurmEnv(int(job), int(uid) if re.fullmatch(rb"\d{1,10}", uid) else None,
                    step.decode() if re.fullmatch(rb"[A-Za-z0-9_]{1,32}", step) else None)


class OwnerCache:
    """Owners by process identity (pid, start time), re-read once older than ``ttl`` seconds (0: every
    sample). A long-lived sampler keeps one; ``prune`` after each sample forgets processes not asked for.

    ``start_of(pid)`` (the process layer's start-time reader) is checked after each read, so that a PID
    reused between the process scan and the cgroup read never lends the new process's owner to the old."""

    def __init__(self, proc_root: str = "/proc", run_root: str = "/run", ttl: float = 5.0,
                 start_of: Callable[[int], float | None] | None = None, clock: Callable[[], float] | None = None):
        import time

        self.proc_root, self.run_root, self.ttl = proc_root, run_root, ttl
        self.start_of = start_of
        self.clock = clock or time.monotonic
        self._entries: dict[tuple[int, float], tuple[float, Owner | None]] = {}
        self._seen: set[tuple[int, float]] = set()  # looked up since the last prune (in this sample)
        self._now: float | None = None  # begin()'s reading of the clock, until the next prune
        # (pid, start) -> the cgroup file's bytes, read through a /proc/<pid> dir pinned to that very
        # process (the process layer fills it, see procs.StaticCache.cgroups): parsed instead of read
        # again, with no start-time check needed. None: always read by path.
        self.pinned: dict[tuple[int, float], bytes] | None = None

    def begin(self) -> None:
        """A sample starts: its freshness checks use this one reading of the clock, until prune(). What an
        earlier sample looked up counts as unchecked again, even if that sample failed before its prune()."""
        self._now = self.clock()
        self._seen = set()

    def get(self, pid: int, start: float) -> Owner | None:
        key = (pid, start)
        if key in self._seen:  # holders share ancestors: one check per process per sample
            return self._entries[key][1]
        self._seen.add(key)
        now = self._now
        if now is None:
            now = self.clock()
        pinned = self.pinned
        raw = pinned.pop(key, None) if pinned else None
        if raw is not None:  # read this refresh, from that process: fresh and its own
            owner = self._entries[key] = (now, owner_from_cgroup(raw, self.run_root))
            return owner[1]
        e = self._entries.get(key)
        if e is not None and now - e[0] < self.ttl:
            return e[1]
        owner = read_owner(pid, self.proc_root, self.run_root)
        if owner is not None and self.start_of is not None and self.start_of(pid) != start:
            owner = None  # the PID now names another process (or none): its cgroup is not this one's
        self._entries[key] = (now, owner)
        return owner

    def of(self, proc) -> Owner | None:
        """``get`` for a ProcInfo (the ``owner_of`` callable that orphans.classify takes)."""
        return self.get(proc.pid, proc.start_time)

    def of_all(self, procs) -> tuple[Owner | None, ...]:
        """``of`` for each of ``procs`` (a holder's chain), in order."""
        seen, entries, out = self._seen, self._entries, []
        for p in procs:
            key = (p.pid, p.start_time)
            out.append(entries[key][1] if key in seen else self.get(p.pid, p.start_time))
        return tuple(out)

    def prune(self, keep: Iterable[tuple[int, float]] = ()) -> None:
        if keep or len(self._entries) != len(self._seen):  # (every lookup makes an entry: equal, all used)
            used = self._seen | set(keep)
            self._entries = {k: v for k, v in self._entries.items() if k in used}
        self._seen = set()
        self._now = None
