"""Guard exemptions: which processes an admin's configuration exempts from the guard's rules.

Only what a local user cannot forge exempts (``guard.exempt`` in the config, checked by
gputop.core.config.parse_exempt):

- ``users`` / ``groups``: the process's real uid, its real gid or a supplementary group, as the kernel
  keeps them (/proc/PID/status). A user cannot take another uid, nor join a group the admin did not
  give them;
- ``units``: the system service systemd placed it in (a unit of the system manager: a unit a user's own
  ``systemd --user`` runs never matches, since the user names those);
- ``cgroups``: its cgroup is that path or lies under it (whole path components). Moving a process into a
  cgroup needs write access to it, which a user has only in their own delegated subtree (refused in the
  config);
- ``executables``: /proc/PID/exe is that file (same device and inode, not deleted), and the file and
  every directory above it are owned by root and writable by no one else (group write only for group
  root). A copy or a symlink in a directory the user can write never matches.

Never a name, argv, the environment, ancestry, the nohup mark or the length of the chain.

Everything is read through one pinned /proc/PID directory after its start time was checked, so the
answer is about the process the guard selected, or there is none.
"""

from __future__ import annotations

import os
import stat as _stat
from dataclasses import dataclass

from gputop.actions.common import same_start
from gputop.core.config import EXEMPT_KEYS, Config, parse_exempt
from gputop.core.ownership import owner_from_cgroup, parse_lines
from gputop.core.procs import read_proc
from gputop.util.textsafe import visible


@dataclass(frozen=True)
class Exemption:
    """One match: the config key, the value the admin wrote, and what the process showed."""

    key: str  # users | groups | units | cgroups | executables
    value: object
    evidence: str

    def describe(self) -> str:
        # A cgroup path below the admin's may hold names a service chose: never raw to a terminal.
        return f"guard.exempt.{self.key} {self.value!r} ({visible(self.evidence)})"

    def to_dict(self) -> dict:
        return {"key": f"guard.exempt.{self.key}", "value": self.value, "evidence": self.evidence}


@dataclass(frozen=True)
class Exempt:
    """The admin's ``guard.exempt`` lists."""

    users: tuple = ()
    groups: tuple = ()
    units: tuple = ()
    cgroups: tuple = ()
    executables: tuple = ()

    @classmethod
    def from_config(cls, config: Config | None) -> "Exempt":
        guard = (config or Config()).extra.get("guard") or {}
        raw = guard.get("exempt") if isinstance(guard, dict) else None
        if raw is None:
            return cls()
        if not (isinstance(raw, dict) and all(isinstance(raw.get(k, ()), tuple) for k in EXEMPT_KEYS)):
            raw = parse_exempt(raw)  # a Config built in code, not read from a file
        return cls(**{k: tuple(raw.get(k, ())) for k in EXEMPT_KEYS})

    def __bool__(self) -> bool:
        return any(getattr(self, k) for k in EXEMPT_KEYS)

    def match(self, pid: int, start_time: float | None, proc_root: str = "/proc") -> Exemption | None:
        """The first exemption that covers process (``pid``, ``start_time``), or None (none does, or the
        process is gone or is another one now: the action then says so itself)."""
        if not self:
            return None
        try:
            dfd = os.open(f"{proc_root}/{pid}", os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return None
        try:
            now = read_proc(pid, proc_root)  # after pinning: the pinned directory is this process, or gone
            if now is None or (start_time is not None and not same_start(now.start_time, start_time)):
                return None
            return (self._creds(dfd) or self._cgroup(dfd) or self._exe(dfd))
        finally:
            os.close(dfd)

    # ---- the attributes ----

    def _creds(self, dfd: int) -> Exemption | None:
        if not (self.users or self.groups):
            return None
        status = _read(dfd, "status")
        if status is None:
            return None
        fields = {}
        for line in status.decode("utf-8", "replace").splitlines():
            k, _, v = line.partition(":")
            if k in ("Uid", "Gid", "Groups"):
                fields[k] = [int(x) for x in v.split() if x.isdigit()]
        uid = (fields.get("Uid") or [None])[0]
        gids = {g for g in (fields.get("Gid") or [])[:1]} | set(fields.get("Groups") or [])
        for u in self.users:
            want = _uid(u)
            if want is not None and want == uid:
                return Exemption("users", u, f"the process runs as uid {uid}")
        for g in self.groups:
            want = _gid(g)
            if want is not None and want in gids:
                return Exemption("groups", g, f"the process has gid {want} among its groups")
        return None

    def _cgroup(self, dfd: int) -> Exemption | None:
        if not (self.units or self.cgroups):
            return None
        data = _read(dfd, "cgroup")
        if not data:
            return None
        owner = owner_from_cgroup(data)
        if owner.unit is not None and owner.manager is None:  # a unit of the system manager only
            for u in self.units:
                if owner.unit == u:
                    return Exemption("units", u, f"systemd placed it in {owner.unit}")
        paths = [p for c, p in parse_lines(data.decode("utf-8", "replace")) if c == "" or "name=systemd" in
                 c.split(",")]
        for want in self.cgroups:
            for p in paths:
                if p == want or p.startswith(want + "/"):
                    return Exemption("cgroups", want, f"its cgroup is {p}")
        return None

    def _exe(self, dfd: int) -> Exemption | None:
        if not self.executables:
            return None
        try:
            link = os.readlink("exe", dir_fd=dfd)
            st = os.stat("exe", dir_fd=dfd)  # follows the link: the file the process runs
        except OSError:
            return None  # a kernel thread, or not ours to read (not root): cannot be verified
        if link.endswith(" (deleted)"):
            return None
        for want in self.executables:
            real = os.path.realpath(want)
            if link != real:
                continue
            try:
                wst = os.stat(real)
            except OSError:
                continue
            if (wst.st_dev, wst.st_ino) != (st.st_dev, st.st_ino):
                continue  # replaced since the process started: it runs the old file
            if root_owned(real) is None:
                return Exemption("executables", want, f"it runs {real}, owned by root in root-owned directories")
        return None


def root_owned(path: str) -> str | None:
    """None when ``path`` and every directory above it are owned by root and writable by no one else
    (group write only for group root); else why not."""
    cur = path
    while True:
        try:
            st = os.lstat(cur)
        except OSError as e:
            return f"{cur}: {e.strerror}"
        if _stat.S_ISLNK(st.st_mode):
            return f"{cur} is a symbolic link"
        if st.st_uid != 0:
            return f"{cur} is owned by uid {st.st_uid}, not root"
        if st.st_mode & _stat.S_IWOTH or (st.st_mode & _stat.S_IWGRP and st.st_gid != 0):
            return f"{cur} is writable by users other than root (mode {_stat.S_IMODE(st.st_mode):o})"
        if cur == "/":
            return None
        cur = os.path.dirname(cur) or "/"


def _read(dfd: int, name: str) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY, dir_fd=dfd)
    except OSError:
        return None
    try:
        return os.read(fd, 65536)
    except OSError:
        return None
    finally:
        os.close(fd)


def _uid(u) -> int | None:
    if isinstance(u, int):
        return u
    import pwd

    try:
        return pwd.getpwnam(u).pw_uid
    except KeyError:
        return None  # no such user here: matches no one


def _gid(g) -> int | None:
    if isinstance(g, int):
        return g
    import grp

    try:
        return grp.getgrnam(g).gr_gid
    except KeyError:
        return None
