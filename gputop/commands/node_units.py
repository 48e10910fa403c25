"""systemd units for a node: the guard daemon (root, hardened) and the metrics listener.

``render(name, exe)`` gives a unit's text with ``ExecStart`` pointing at ``exe`` (the running gputop, so a
venv or pipx install verifies). ``gputop install-units`` writes them; packaging/ holds copies rendered for
/usr/local/bin/gputop (a test keeps them in step).

What the guard must still be able to do, and what allows it:
- signal other users' processes: root with CAP_KILL;
- read every /proc/PID (fdinfo, environ of others: ptrace access mode): CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH;
  no ProtectProc=invisible, no PrivateUsers;
- open /dev/nvidia*, /dev/dri, /dev/kfd: no PrivateDevices, no DevicePolicy;
- send mail and webhooks: AF_INET/AF_INET6 allowed, no PrivateNetwork;
- write /var/lib/gputop (StateDirectory), /var/log/gputop (LogsDirectory: the node audit trail) and
  /run/gputop (RuntimeDirectory: the audit socket); CAP_CHOWN gives the trail to group adm.
Everything else is closed (ProtectSystem=strict, ProtectHome=read-only, ...).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

HARDENING = """\
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM
"""

GUARD = """\
# gputop guard as a systemd service: the node's policy guard and its audit trail.
# Written by 'gputop install-units'; see README "Running on a node" and docs/node.md.
#   systemctl reload gputop-guard   -> SIGHUP: re-read /etc/gputop/config.yaml and the policy
#                                      (a bad file keeps the last valid one)
#   journalctl -p warning -u gputop-guard   -> errors and rule hits only
# The policy: guard.policy in /etc/gputop/config.yaml, or 'sudo gputop guard --policy-file FILE'.
[Unit]
Description=gputop guard: enforce the GPU node policy and keep the node audit trail
Documentation=https://github.com/gputop/gputop#running-on-a-node
After=network-online.target nvidia-persistenced.service
Wants=network-online.target

[Service]
Type=simple
Environment=PYTHONUNBUFFERED=1
# the guard's shared state (mode, policy path, hits) and root's own audit log
Environment=GPUTOP_STATE_DIR=/var/lib/gputop
ExecStart={exe} guard run --interval 5
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure
RestartSec=10
# Exit 2 (an invalid policy at start-up) and 5 (another guard daemon runs): fix it, do not retry.
RestartPreventExitStatus=2 5
KillSignal=SIGTERM
TimeoutStopSec=30
UMask=0022
# /var/lib/gputop: readable by every user, so their TUIs show the guard's hits.
StateDirectory=gputop
StateDirectoryMode=0755
# /var/log/gputop/audit.jsonl: the node audit trail (0640, group adm)
LogsDirectory=gputop
LogsDirectoryMode=0755
# /run/gputop/audit.sock: every face sends its records here
RuntimeDirectory=gputop
RuntimeDirectoryMode=0755
ConfigurationDirectory=gputop
CapabilityBoundingSet=CAP_KILL CAP_SYS_PTRACE CAP_DAC_READ_SEARCH CAP_CHOWN
{hardening}
[Install]
WantedBy=multi-user.target
"""

SERVE = """\
# gputop metrics for Prometheus: 'gputop serve --metrics-only' (no action API, nothing to authenticate).
# Written by 'gputop install-units'. It listens on every address so Prometheus can scrape it from
# another host: change --bind to limit that. Grafana dashboard and alert rules: packaging/.
[Unit]
Description=gputop metrics: Prometheus /metrics for the node's GPUs and their processes
Documentation=https://github.com/gputop/gputop#running-on-a-node
After=network-online.target nvidia-persistenced.service
Wants=network-online.target

[Service]
Type=simple
Environment=PYTHONUNBUFFERED=1
ExecStart={exe} serve --metrics-only --bind 0.0.0.0 --port 9407
Restart=on-failure
RestartSec=10
RestartPreventExitStatus=2
DynamicUser=yes
UMask=0077
CapabilityBoundingSet=
PrivateUsers=yes
ProtectProc=default
MemoryDenyWriteExecute=no
{hardening}
[Install]
WantedBy=multi-user.target
"""

UNITS = {"gputop-guard.service": GUARD, "gputop-serve.service": SERVE}
DEFAULT_PREFIX = Path("/etc/systemd/system")


def gputop_exe() -> str:
    """The running gputop's command: its console script next to this Python (venv, pipx), the one on
    PATH, or this Python with -m gputop."""
    here = Path(sys.executable).parent / "gputop"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("gputop")
    if found:
        return str(Path(found).resolve())
    return f"{sys.executable} -m gputop"


def render(name: str, exe: str | None = None) -> str:
    return UNITS[name].format(exe=exe or gputop_exe(), hardening=HARDENING)


def _current(path: Path) -> str | None:
    """The text of the unit at ``path`` if it is a regular file of ours that only we can write; None
    otherwise (missing, a symlink, another user's file): such a path is replaced, never trusted or
    written through."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # missing, or a symlink (ELOOP)
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        try:
            return f.read(1 << 20).decode("utf-8")
        except UnicodeDecodeError:
            return None


def _replace(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``path`` atomically: a new file with a random name in the same directory (mkstemp: O_EXCL,
    never through a symlink someone planted there), then rename over ``path`` (which replaces a symlink
    at ``path`` itself, not its target)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def install(prefix: Path, exe: str | None = None) -> list[tuple[Path, str]]:
    """Write every unit under ``prefix``; returns (path, 'created'|'replaced'|'unchanged')."""
    prefix.mkdir(parents=True, exist_ok=True)
    out = []
    for name in UNITS:
        path = prefix / name
        text = render(name, exe)
        old = _current(path)
        if old == text:
            out.append((path, "unchanged"))
            continue
        existed = os.path.lexists(path)
        _replace(path, text)
        out.append((path, "replaced" if existed else "created"))
    return out
