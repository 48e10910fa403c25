"""The rogue-process audit: findings about GPU holders (and, optionally, every host process).

Each finding has a severity (high, medium, low), the rule that found it, the pid, a reason a person can
read, and evidence (the matching name or cmdline fragment, the connection, the path).

Rules:
- ``miner-name``: a known miner name (xmrig, ethminer, t-rex, ...) as the process name, its executable's
  name or argv[0];
- ``miner-cmdline``: ``stratum+tcp://`` / ``stratum+ssl://`` URLs, pool-looking arguments
  (``-o host:port``, ``--pool``, a host named ``*pool*`` with a port) and wallet-looking addresses;
- ``pool-connection``: an open TCP connection to a common mining-pool port (configurable);
- ``suspicious-exe``: an executable that was deleted, or that runs from /tmp, /var/tmp, /dev/shm or a hidden
  directory;
- ``disguised-name``: the process name differs from its executable's name (and from the script it runs);
- ``hashing-profile``: high utilisation with very little GPU memory. With no history (``gputop audit``
  samples once) this is judged on the current sample, and the reason says so; a caller that samples
  repeatedly passes a ``History`` and the profile must then hold for ``hashing.sustain`` seconds;
- ``unlisted-user``: a GPU user not on ``allowed_users`` (only when that list is configured);
- ``outside-hours``: GPU use outside ``allowed_hours`` (only when configured);
- ``orphaned-holder`` and ``invisible-holder``: GPU holders whose session is gone, or whose PID cannot
  be seen here.

Configuration is the ``audit:`` section of the gputop config. There is NO default allow-list: nothing
(not "python", not root) is exempt unless the admin writes it down::

    audit:
      miner_names: [mysteryminer]        # added to the built-in names
      pool_ports: [3333, 4444]           # replaces the built-in port list
      extra_pool_ports: [12345]          # added to it
      allowed_users: [alice, bob]        # GPU users not listed are findings
      allowed_hours: {hours: "08:00-20:00", weekdays: mon-fri}
      hashing: {min_util: 90, max_memory: 1GiB, sustain: 60s}
      all_processes: false               # also check every host process (name, cmdline, exe, connections)
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import socket
import sys
from dataclasses import dataclass

from gputop.core.config import Config
from gputop.core.disguise import INTERPRETER as _INTERPRETER
from gputop.core.disguise import exe_base as _exe_base
from gputop.core.disguise import exe_mismatch
from gputop.util.errors import UsageError
from gputop.core.orphans import ORPHAN
from gputop.core.procs import ProcInfo, ProcTable
from gputop.core.model import Holder, Snapshot
from gputop.util.units import fmt_bytes, parse_duration, parse_memory

SEVERITIES = ("high", "medium", "low")
MINER_NAMES = ("xmrig", "ethminer", "t-rex", "nbminer", "lolminer", "gminer", "phoenixminer",
               "teamredminer", "nanominer", "ccminer", "cpuminer", "bminer")
# Stratum's customary ports and the ones the big pools publish (xmrig/ethminer defaults among them).
POOL_PORTS = (3333, 3334, 3357, 4444, 5555, 6666, 7777, 9999, 14433, 14444, 45560, 45700)
SUSPICIOUS_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

_STRATUM = re.compile(r"stratum\d?\+(?:tcp|ssl|tls)://\S+", re.IGNORECASE)
_POOL_ARG = re.compile(r"(?:^|\s)(?:-o|--url|--pool|-P|--server|-F)(?:\s+|=)(\S+:\d{2,5}\b\S*)", re.IGNORECASE)
_POOL_HOST = re.compile(r"\b[\w-]*pool[\w-]*(?:\.[\w-]+)+:\d{2,5}\b", re.IGNORECASE)
_WALLETS = (
    ("Monero address", re.compile(r"\b[48][0-9AB][1-9A-HJ-NP-Za-km-z]{93}\b")),
    ("Ethereum address", re.compile(r"\b0x[0-9a-fA-F]{40}\b")),
    ("Bitcoin bech32 address", re.compile(r"\bbc1[02-9ac-hj-np-z]{25,59}\b")),
)
_WALLET_ARG = re.compile(r"(?:^|\s)(?:--wallet|--user|-u|-O|--address)(?:\s+|=)([A-Za-z0-9]{26,}(?:[.+][\w-]+)?)(?=\s|$)")
_ENV_DIRS = {".pyenv", ".venv", ".conda", ".local", ".nvm", ".rbenv", ".asdf", ".sdkman", ".julia",
             ".virtualenvs", ".cache"}
_SYSTEM_NAME = re.compile(r"^(?:\[.*\]|kworker|ksoftirqd|kthreadd|kswapd|migration|rcu_|watchdog|systemd|"
                          r"sshd|cron|crond|dbus|init|irq/|khugepaged|kdevtmpfs|kauditd|rsyslogd|agetty)",
                          re.IGNORECASE)


@dataclass(frozen=True)
class Finding:
    severity: str  # high | medium | low
    rule: str
    pid: int | None
    reason: str
    evidence: str
    name: str | None = None
    user: str | None = None
    start_time: float | None = None
    gpus: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return {"severity": self.severity, "rule": self.rule, "pid": self.pid, "reason": self.reason,
                "evidence": self.evidence, "name": self.name, "user": self.user,
                "start_time": self.start_time, "gpus": list(self.gpus)}


@dataclass(frozen=True)
class AuditConfig:
    miner_names: tuple[str, ...] = MINER_NAMES
    pool_ports: frozenset[int] = frozenset(POOL_PORTS)
    allowed_users: tuple[str, ...] | None = None  # None: not configured (no default allow-list)
    allowed_hours: object = None  # a util.timewindow.TimeWindow, or None
    hashing_min_util: float = 90.0
    hashing_max_memory: int = 1024**3
    hashing_sustain: float = 60.0
    all_processes: bool = False

    @classmethod
    def from_config(cls, config: Config | None) -> "AuditConfig":
        raw = (config or Config()).extra.get("audit") or {}
        if not isinstance(raw, dict):
            raise UsageError("config: 'audit' must be a mapping (see docs/audit.md)")
        known = {"miner_names", "pool_ports", "extra_pool_ports", "allowed_users", "allowed_hours",
                 "hashing", "all_processes"}
        for k in raw:
            if k not in known:
                raise UsageError(f"config: unknown key 'audit.{k}': use one of {', '.join(sorted(known))}")
        kw: dict = {}
        try:
            if "miner_names" in raw:
                kw["miner_names"] = MINER_NAMES + tuple(str(x).lower() for x in _list(raw, "miner_names"))
            ports = set(POOL_PORTS)
            if "pool_ports" in raw:
                ports = {_port(x) for x in _list(raw, "pool_ports")}
            ports |= {_port(x) for x in _list(raw, "extra_pool_ports")} if "extra_pool_ports" in raw else set()
            kw["pool_ports"] = frozenset(ports)
            if raw.get("allowed_users") is not None:
                kw["allowed_users"] = tuple(str(x) for x in _list(raw, "allowed_users"))
            if raw.get("allowed_hours") is not None:
                from gputop.util.timewindow import parse_window

                kw["allowed_hours"] = parse_window(raw["allowed_hours"], "audit.allowed_hours")
            h = raw.get("hashing") or {}
            if not isinstance(h, dict):
                raise ValueError("'audit.hashing' must be a mapping with min_util, max_memory, sustain")
            for k in h:
                if k not in ("min_util", "max_memory", "sustain"):
                    raise ValueError(f"unknown key 'audit.hashing.{k}': use min_util, max_memory, sustain")
            if "min_util" in h:
                v = h["min_util"]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 100:
                    raise ValueError(f"audit.hashing.min_util must be a percentage, got {v!r}")
                kw["hashing_min_util"] = float(v)
            if "max_memory" in h:
                kw["hashing_max_memory"] = parse_memory(h["max_memory"])
            if "sustain" in h:
                kw["hashing_sustain"] = parse_duration(h["sustain"])
            if "all_processes" in raw:
                if not isinstance(raw["all_processes"], bool):
                    raise ValueError("audit.all_processes must be true or false")
                kw["all_processes"] = raw["all_processes"]
        except ValueError as e:
            raise UsageError(f"config: {e}") from None
        return cls(**kw)


def _list(raw: dict, key: str) -> list:
    v = raw[key]
    if not isinstance(v, list):
        raise ValueError(f"audit.{key} must be a list, got {v!r}")
    return v


def _port(x) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or not 0 < x < 65536:
        raise ValueError(f"bad port {x!r} in the audit config: use a number from 1 to 65535")
    return x


class History:
    """Remembers, per process identity, since when the hashing profile has held (for callers that sample
    repeatedly: the TUI, the guard)."""

    def __init__(self):
        self._since: dict[tuple, float] = {}

    def held(self, key: tuple, now: float, match: bool) -> float | None:
        if not match:
            self._since.pop(key, None)
            return None
        return now - self._since.setdefault(key, now)

    def prune(self, keep: set) -> None:
        for k in [k for k in self._since if k not in keep]:
            del self._since[k]


# ---- per-process evidence ------------------------------------------------------------------

def read_exe(pid: int) -> str | None:
    """The executable path (Linux: with ' (deleted)' when it was removed); None when unreadable."""
    if sys.platform.startswith("linux"):
        try:
            return os.readlink(f"/proc/{pid}/exe")
        except OSError:
            return None
    try:
        import psutil

        return psutil.Process(pid).exe() or None
    except Exception:
        return None


@dataclass(frozen=True)
class PoolConn:
    laddr: str
    raddr: str
    port: int
    status: str


_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT"}  # the states that mean "talking to a pool"


def _hex_addr(text: str) -> tuple[str, int]:
    """``0100007F:0D05`` (a /proc/net/tcp address) -> ("127.0.0.1", 3333); IPv6 too."""
    addr, port = text.split(":")
    raw = bytes.fromhex(addr)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = socket.inet_ntop(socket.AF_INET if len(words) == 4 else socket.AF_INET6, words)
    return ip, int(port, 16)


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def pool_connections(pids: list[int], ports: frozenset[int] | set[int]) -> dict[int, list[PoolConn]]:
    """Open TCP connections from ``pids`` to any of ``ports``.

    Reads each network namespace's TCP table at most once per call (psutil's per-process call reads it
    once per process with a socket)."""
    if not ports or not pids:
        return {}
    if not sys.platform.startswith("linux"):
        return _pool_connections_psutil(pids, ports)
    # A process without sockets needs no table; reading /proc/net/tcp walks the kernel's whole socket
    # hash (milliseconds), so read it only for namespaces where some process has a socket at all.
    by_ns: dict[str, dict[int, set[int]]] = {}
    for pid in pids:
        inodes = _socket_inodes(pid)
        if not inodes:
            continue
        try:
            by_ns.setdefault(os.readlink(f"/proc/{pid}/ns/net"), {})[pid] = inodes
        except OSError:
            continue
    out: dict[int, list[PoolConn]] = {}
    for members in by_ns.values():
        conns: dict[int, PoolConn] = {}  # socket inode -> connection
        for table in ("tcp", "tcp6"):
            try:
                with open(f"/proc/{next(iter(members))}/net/{table}") as f:
                    next(f, None)
                    for line in f:
                        parts = line.split()
                        if len(parts) < 10 or parts[3] not in _TCP_STATES:
                            continue
                        rip, rport = _hex_addr(parts[2])
                        if rport not in ports:
                            continue
                        lip, lport = _hex_addr(parts[1])
                        conns[int(parts[9])] = PoolConn(f"{lip}:{lport}", f"{rip}:{rport}", rport,
                                                        _TCP_STATES[parts[3]])
            except (OSError, ValueError):
                continue
        for pid, inodes in members.items():
            hits = [conns[i] for i in inodes if i in conns]
            if hits:
                out[pid] = hits
    return out


def _pool_connections_psutil(pids: list[int], ports) -> dict[int, list[PoolConn]]:
    import psutil

    out: dict[int, list[PoolConn]] = {}
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except (psutil.Error, OSError):
            continue
        hits = [PoolConn(f"{c.laddr.ip}:{c.laddr.port}", f"{c.raddr.ip}:{c.raddr.port}", c.raddr.port, c.status)
                for c in conns if c.raddr and c.raddr.port in ports and c.status in ("ESTABLISHED", "SYN_SENT")]
        if hits:
            out[pid] = hits
    return out


class _Check:
    def __init__(self, proc: ProcInfo, gpus: tuple[int, ...], out: list[Finding]):
        self.proc = proc
        self.gpus = gpus
        self.out = out

    def add(self, severity: str, rule: str, reason: str, evidence: str) -> None:
        p = self.proc
        self.out.append(Finding(severity, rule, p.pid, reason, evidence[:300], p.name, p.user, p.start_time,
                                self.gpus))


def _check_process(proc: ProcInfo, gpus: tuple[int, ...], cfg: AuditConfig, out: list[Finding],
                   pool_conns: list[PoolConn] = ()) -> None:
    c = _Check(proc, gpus, out)
    exe = read_exe(proc.pid)
    _check_names(c, exe, cfg)
    _check_cmdline(c, " ".join(proc.cmdline))
    for conn in pool_conns[:1]:
        c.add("medium", "pool-connection", f"open TCP connection to port {conn.port}, a common mining-pool port",
              f"{conn.laddr} -> {conn.raddr} ({conn.status})")
    if exe:
        _check_exe(c, exe)


def _check_names(c: _Check, exe: str | None, cfg: AuditConfig) -> None:
    """Known miner names in the process name, argv[0] or the executable (the first hit only)."""
    proc = c.proc
    argv0 = os.path.basename(proc.cmdline[0]) if proc.cmdline else ""
    names = [("process name", proc.name), ("argv[0]", argv0)]
    if exe:
        names.append(("executable", _exe_base(exe)))
    for what, n in names:
        low = n.lower()
        hit = next((m for m in cfg.miner_names if m and m in low), None)
        if hit:
            c.add("high", "miner-name", f"{what} {n!r} is a known crypto-miner name ({hit})",
                  f"{what}: {n}" + (f"; exe: {exe}" if exe and what != "executable" else ""))
            return


def _check_cmdline(c: _Check, cmd: str) -> None:
    """A pool URL or a pool-looking host:port, and a wallet in the command line."""
    m = _STRATUM.search(cmd)
    if m:
        c.add("high", "miner-cmdline", "the command line names a stratum mining-pool URL", m.group(0))
    else:
        m = _POOL_ARG.search(cmd) or _POOL_HOST.search(cmd)
        if m:
            frag = m.group(1) if m.re is _POOL_ARG else m.group(0)
            c.add("medium", "miner-cmdline", "the command line has a pool-looking host:port argument",
                  frag)
    for label, rx in _WALLETS:
        m = rx.search(cmd)
        if m:
            c.add("medium", "miner-cmdline", f"the command line contains a {label} (a mining wallet?)",
                  m.group(0))
            return
    m = _WALLET_ARG.search(cmd)
    if m:
        c.add("low", "miner-cmdline", "the command line passes a wallet/user-looking argument",
              m.group(0).strip())


def _check_exe(c: _Check, exe: str) -> None:
    """Where the executable runs from (deleted, a temporary or a hidden directory), and a disguised name."""
    proc = c.proc
    path = exe[: -len(" (deleted)")] if exe.endswith(" (deleted)") else exe
    if exe.endswith(" (deleted)") and not os.path.exists(path):
        c.add("high", "suspicious-exe", "the executable was deleted after the process started", exe)
    d = os.path.dirname(path)
    if any(d == s or d.startswith(s + "/") for s in SUSPICIOUS_DIRS):
        c.add("high", "suspicious-exe", "the executable runs from a world-writable temporary directory",
              path)
    else:
        hidden = [part for part in d.split("/") if part.startswith(".") and part not in (".", "..")]
        interpreter = bool(_INTERPRETER.match(_exe_base(exe)))
        if hidden and not (interpreter and all(h in _ENV_DIRS for h in hidden)):
            c.add("low", "suspicious-exe", f"the executable runs from a hidden directory ({hidden[0]})",
                  path)
    why = exe_mismatch(proc.name, proc.cmdline, exe)  # the one test; protect patterns use it too
    if why is not None:
        system = bool(_SYSTEM_NAME.match(proc.name))
        c.add("high" if system else "low", "disguised-name",
              why + (" (a system/kernel-thread name: a classic miner disguise)" if system else ""),
              f"name: {proc.name}; exe: {exe}")


# ---- the audit -------------------------------------------------------------------------------

def _holder_util(h: Holder, snap: Snapshot) -> tuple[float | None, str]:
    if h.sm_util is not None:
        return h.sm_util, "process SM%"
    for g in h.gpus:
        d = snap.device(g)
        if d is not None and d.util_gpu is not None and len(snap.holders_on(g)) == 1:
            return d.util_gpu, f"GPU {g} utilization (its only process)"
    return None, ""


def audit(snapshot: Snapshot, config: Config | None = None, table: ProcTable | None = None,
          history: History | None = None, *, all_processes: bool | None = None) -> list[Finding]:
    """Every finding for ``snapshot``'s GPU holders (and every host process with ``all_processes``),
    most severe first."""
    cfg = AuditConfig.from_config(config)
    out: list[Finding] = []
    done: set[int] = set()
    seen_keys: set = set()
    pools = pool_connections([h.pid for h in snapshot.holders if h.proc is not None], set(cfg.pool_ports))
    for h in snapshot.holders:
        if h.proc is None:
            out.append(Finding("low", "invisible-holder", h.pid,
                               "a GPU holder whose PID is not visible here (another PID namespace, or the "
                               "driver still holds memory of a process that exited)",
                               f"GPU {','.join(map(str, h.gpus))}, {fmt_bytes(h.gpu_memory)}", gpus=h.gpus))
            continue
        done.add(h.pid)
        _check_process(h.proc, h.gpus, cfg, out, pools.get(h.pid, ()))
        _check_holder(_Check(h.proc, h.gpus, out), h, snapshot, cfg, history, seen_keys)
    if history is not None:
        history.prune(seen_keys)
    if cfg.all_processes if all_processes is None else all_processes:
        _audit_others(table or ProcTable(), done, cfg, out)
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    out.sort(key=lambda f: (rank.get(f.severity, 9), f.pid or 0, f.rule))
    return out


def _check_holder(c: _Check, h: Holder, snapshot: Snapshot, cfg: AuditConfig, history: History | None,
                  seen_keys: set) -> None:
    """What only a GPU holder can show: the hashing profile, the allow-list and hours, an orphan."""
    now = snapshot.at
    util, src = _holder_util(h, snapshot)
    mem = h.gpu_memory
    match = (util is not None and mem is not None and util >= cfg.hashing_min_util
             and mem <= cfg.hashing_max_memory)
    evidence = f"{util:.0f}% ({src}) with {fmt_bytes(mem)} GPU memory" if match else ""
    if history is not None:
        key = h.proc.identity
        seen_keys.add(key)
        held = history.held(key, now, match)
        if match and held is not None and held >= cfg.hashing_sustain:
            c.add("medium", "hashing-profile",
                  f"high utilisation with very little memory for {held:.0f}s (>= {cfg.hashing_sustain:g}s): "
                  "the profile of hashing", evidence)
    elif match:
        c.add("medium", "hashing-profile",
              f"utilisation >= {cfg.hashing_min_util:g}% with <= {fmt_bytes(cfg.hashing_max_memory)} in "
              "the current sample (one sample, no history: a short busy phase also matches): the "
              "profile of hashing", evidence)
    if cfg.allowed_users is not None and (h.user or "?") not in cfg.allowed_users:
        c.add("medium", "unlisted-user", f"user {h.user or '?'} is not on the allow-list (audit.allowed_users)",
              f"user {h.user}, GPU {','.join(map(str, h.gpus))}, {fmt_bytes(h.gpu_memory)}")
    if cfg.allowed_hours is not None:
        when = _dt.datetime.fromtimestamp(now)
        if not cfg.allowed_hours.contains(when):
            c.add("low", "outside-hours", "GPU use outside the allowed hours (audit.allowed_hours)",
                  f"{when.strftime('%a %H:%M')} not in {cfg.allowed_hours.text}")
    if h.verdict.kind == ORPHAN:
        c.add("low", "orphaned-holder", f"orphaned GPU holder: {h.verdict.reason}",
              f"orphan root pid {h.verdict.root}, GPU {','.join(map(str, h.gpus))}, {fmt_bytes(h.gpu_memory)}")


def _audit_others(table: ProcTable, done: set[int], cfg: AuditConfig, out: list[Finding]) -> None:
    """Every host process that is not a GPU holder (``audit.all_processes``)."""
    import psutil

    others = [pid for pid in sorted(psutil.pids()) if pid not in done and pid != os.getpid()]
    pools = pool_connections(others, set(cfg.pool_ports))
    for pid in others:
        info = table.get(pid)
        if info is None or info.kthread or info.zombie:
            continue
        _check_process(info, (), cfg, out, pools.get(pid, ()))
