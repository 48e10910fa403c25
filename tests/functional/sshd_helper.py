"""A throwaway OpenSSH server on 127.0.0.1 for the remote tests: its own host key, user key and config.

Nothing here touches ~/.ssh: the client side is an ssh config file passed with ``-F`` (through
$GPUTOP_SSH), with its own known_hosts holding the throwaway host key.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
ROOT = Path(__file__).resolve().parents[2]
VENV_GPUTOP = Path(sys.executable).parent / "gputop"


def why_no_sshd() -> str | None:
    if not os.path.exists(SSHD):
        return f"{SSHD} not found (install openssh-server; .ci/run does so when run as root)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "the OpenSSH client (ssh, ssh-keygen) is not installed"
    if os.geteuid() != 0:
        return "sshd on a spare port needs root here (to log in as the test user without PAM)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gputop-test", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)


@dataclass
class Sshd:
    dir: Path
    port: int
    proc: subprocess.Popen
    ssh_config: Path
    closed_port: int

    @property
    def ssh_env(self) -> str:
        """The value for $GPUTOP_SSH."""
        return f"ssh -F {self.ssh_config}"

    def remote_cmd(self, **env: str) -> str:
        """A remote gputop command running the venv's gputop with this environment."""
        parts = ["env"] + [f"{k}={v}" for k, v in env.items()] + [str(VENV_GPUTOP)]
        return " ".join(parts)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_sshd(base: Path) -> Sshd:
    d = base / "sshd"
    d.mkdir()
    os.chmod(d, 0o700)
    _keygen(d / "host_key")
    _keygen(d / "user_key")
    _keygen(d / "other_host_key")  # a key the server does not have: for "host key changed"
    _keygen(d / "wrong_user_key")  # a key the server does not accept: for "authentication failed"
    shutil.copy(d / "user_key.pub", d / "authorized_keys")
    port = free_port()
    closed = free_port()  # nothing listens there
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    (d / "sshd_config").write_text(f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {d}/host_key
AuthorizedKeysFile {d}/authorized_keys
StrictModes no
PidFile {d}/sshd.pid
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AcceptEnv GPUTOP_*
LogLevel ERROR
""")
    host_pub = (d / "host_key.pub").read_text().split()
    other_pub = (d / "other_host_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    (d / "known_hosts_changed").write_text(f"[127.0.0.1]:{port} {other_pub[0]} {other_pub[1]}\n")
    (d / "known_hosts_empty").write_text("")
    user = os.environ.get("USER") or "root"
    common = f"""\
  HostName 127.0.0.1
  User {user if os.geteuid() else 'root'}
  IdentitiesOnly yes
  IdentityAgent none
  GlobalKnownHostsFile /dev/null
  LogLevel ERROR
"""
    (d / "ssh_config").write_text(f"""\
Host gpunode
  Port {port}
  IdentityFile {d}/user_key
  UserKnownHostsFile {d}/known_hosts
{common}
Host stranger
  Port {port}
  IdentityFile {d}/user_key
  UserKnownHostsFile {d}/known_hosts_empty
{common}
Host impostor
  Port {port}
  IdentityFile {d}/user_key
  UserKnownHostsFile {d}/known_hosts_changed
{common}
Host wrongkey
  Port {port}
  IdentityFile {d}/wrong_user_key
  UserKnownHostsFile {d}/known_hosts
{common}
Host deadhost
  Port {closed}
  IdentityFile {d}/user_key
  UserKnownHostsFile {d}/known_hosts
{common}
""")
    log = open(d / "sshd.log", "w")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log)
    deadline = time.time() + 10
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {(d / 'sshd.log').read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("sshd did not listen within 10s")
    return Sshd(d, port, proc, d / "ssh_config", closed)
