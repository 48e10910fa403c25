"""gputop on other hosts, through the system OpenSSH client.

``gputop --remote HOST [args ...]`` runs ``gputop args ...`` on HOST; ``gputop status --hosts a,b`` asks many
hosts at once. We only ever call ``ssh``: it reads ~/.ssh/config, the agent and known_hosts, and host-key
checking stays on (we never pass StrictHostKeyChecking=no). Arguments are shell-quoted, because ssh hands
the remote command to the remote user's shell as one string.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import selectors
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gputop.util.errors import EXIT_UNAVAILABLE, UnavailableError, UsageError
from gputop.util.textsafe import visible

ENV_REMOTE_CMD = "GPUTOP_REMOTE_CMD"  # the gputop command on the remote side (a shell string)
ENV_SSH = "GPUTOP_SSH"  # the local ssh command (e.g. "ssh -F ~/.ssh/lab_config")
DEFAULT_REMOTE_CMD = "gputop"
# Not "pip install gputop": that name on PyPI is another project. Install this one from a copy of it.
INSTALL_COMMAND = "python3 -m pip install --user /path/to/gputop"  # a copy of this project, or its wheel
SSH_FAILED = 255  # ssh's own exit status when the connection or authentication fails
NOT_FOUND = 127  # the remote shell's status for "command not found"

# Top-level options that take a value; needed to find where the global options end.
_VALUE_OPTS = {"--backend", "--scenario", "--config", "--interval", "--remote", "--remote-gputop"}

# Why a host failed, in the words `status --hosts` prints.
UNREACHABLE = "unreachable"
AUTH_FAILED = "authentication failed"
HOST_KEY_UNKNOWN = "host key unknown"
HOST_KEY_CHANGED = "host key changed"
GPUTOP_MISSING = "gputop missing"
TIMED_OUT = "timed out"
REMOTE_ERROR = "remote error"
BAD_OUTPUT = "bad output"


# ---- building the ssh command line --------------------------------------------------------------

def ssh_command() -> list[str]:
    raw = os.environ.get(ENV_SSH, "").strip()
    cmd = shlex.split(raw) if raw else ["ssh"]
    return cmd


def remote_gputop(explicit: str | None = None) -> str:
    """The remote gputop command: --remote-gputop, $GPUTOP_REMOTE_CMD, or plain ``gputop``.

    It is a shell string on purpose (``env GPUTOP_SCENARIO=/x /opt/venv/bin/gputop`` is allowed); the
    arguments after it are quoted one by one.
    """
    return (explicit or os.environ.get(ENV_REMOTE_CMD) or DEFAULT_REMOTE_CMD).strip()


def check_host(host: str) -> str:
    host = host.strip()
    if not host:
        raise UsageError("empty host name: give --remote HOST (a name from ~/.ssh/config, or user@host)")
    if host.startswith("-") or any(c.isspace() for c in host):
        raise UsageError(f"bad host name {host!r}: it must not start with '-' or contain spaces")
    return host


def build_ssh_argv(host: str, args: list[str], *, remote_cmd: str | None = None, tty: bool = False,
                   batch: bool = False, connect_timeout: float | None = None) -> list[str]:
    """``ssh [options] -- HOST 'gputop arg1 arg2'`` with every argument shell-quoted."""
    argv = ssh_command()
    if tty:
        argv.append("-t")
    else:
        argv.append("-T")
    if batch:
        argv += ["-o", "BatchMode=yes"]
    if connect_timeout is not None:
        argv += ["-o", f"ConnectTimeout={max(1, math.ceil(connect_timeout))}"]
    command = " ".join([remote_gputop(remote_cmd)] + [shlex.quote(a) for a in args])
    return argv + ["--", check_host(host), command]


# ---- gputop --remote HOST ... ------------------------------------------------------------------

@dataclass
class RemoteInvocation:
    host: str
    args: list[str]  # everything to pass to the remote gputop
    remote_cmd: str | None = None


def split_remote_argv(argv: list[str]) -> RemoteInvocation | None:
    """Find ``--remote HOST`` (and ``--remote-gputop CMD``) among the options, before the subcommand or
    after it (``gputop status --remote h``: no subcommand has an option of that name), up to ``--``.

    Everything else, in order, is for the remote gputop. None when there is no --remote.
    """
    host = cmd = None
    rest: list[str] = []
    i = 0
    after = False  # past the subcommand: only our two options are taken out, the rest passes as it is
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest.extend(argv[i:])
            break
        if not a.startswith("-") and not after:
            after = True
        name, eq, val = a.partition("=")
        if after and name not in ("--remote", "--remote-gputop"):
            rest.append(a)
            i += 1
            continue
        if name in ("--remote", "--remote-gputop"):
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{name} needs a value")
                val = argv[i + 1]
                i += 1
            if name == "--remote":
                host = val
            else:
                cmd = val
            i += 1
            continue
        rest.append(a)
        if name in _VALUE_OPTS and not eq and i + 1 < len(argv):
            rest.append(argv[i + 1])
            i += 1
        i += 1
    if host is None:  # no --remote: argparse reads the original argv (--remote-gputop serves --hosts)
        return None
    return RemoteInvocation(check_host(host), rest, cmd)


def _subcommand(args: list[str]) -> str | None:
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-h", "--help", "--version"):
            return a
        if not a.startswith("-"):
            return a
        if a.partition("=")[0] in _VALUE_OPTS and "=" not in a:
            i += 1
        i += 1
    return None


def missing_message(host: str) -> str:
    return (f"gputop is not installed on {host} (or not on the PATH of a non-interactive ssh shell): "
            f"copy this project (or a wheel from 'python3 -m pip wheel .') there and run "
            f"'{INSTALL_COMMAND}', or give its path with --remote-gputop PATH "
            f"(or ${ENV_REMOTE_CMD})")


def terminal_safe(text: str) -> str:
    """``visible`` for a stream of lines: newlines and tabs are kept, every other control character (ESC,
    CR, BEL, C1, ...) is shown as ``\\xNN``."""
    return "\n".join("\t".join(visible(part) for part in line.split("\t")) for line in text.split("\n"))


def _pump(src, dst) -> None:
    """Copy a remote stream to our terminal through terminal_safe, chunk by chunk (a prompt without a
    newline shows at once); UTF-8 split across chunks is decoded whole."""
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    fd = src.fileno()
    try:
        while True:
            chunk = os.read(fd, 65536)
            text = dec.decode(chunk, final=not chunk)
            if text:
                dst.write(terminal_safe(text))
                dst.flush()
            if not chunk:
                return
    except (OSError, ValueError):
        return


def run_remote(inv: RemoteInvocation) -> int:
    """Run gputop on the remote host; its output streams through and its exit status is ours."""
    sub = _subcommand(inv.args)
    tui = sub is None
    interactive = sys.stdin.isatty()
    argv = build_ssh_argv(inv.host, inv.args, remote_cmd=inv.remote_cmd, tty=tui and interactive,
                          batch=not interactive)
    # A subcommand's output is text from the remote host: at a terminal it goes through terminal_safe. The
    # TUI (ssh -t) is a terminal session and passes as it is; a pipe gets the remote's bytes unchanged.
    filt = [] if tui else [name for name in ("stdout", "stderr") if getattr(sys, name).isatty()]
    try:
        proc = subprocess.Popen(argv, **{name: subprocess.PIPE for name in filt})
    except FileNotFoundError:
        raise UnavailableError("the OpenSSH client 'ssh' was not found: install openssh-client "
                               "(apt install openssh-client, dnf install openssh-clients)") from None
    pumps = [threading.Thread(target=_pump, args=(getattr(proc, name), getattr(sys, name)), daemon=True)
             for name in filt]
    for t in pumps:
        t.start()
    try:
        rc = proc.wait()
        for t in pumps:
            t.join(5)
    except KeyboardInterrupt:
        # ssh got the same SIGINT (same process group); give it a moment to close the session.
        try:
            rc = proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        return 130
    if rc == NOT_FOUND:
        print(f"gputop: {missing_message(inv.host)}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if rc == SSH_FAILED:
        print(f"gputop: ssh to {inv.host} failed (see ssh's message above); check 'ssh {inv.host}' works",
              file=sys.stderr)
        return EXIT_UNAVAILABLE
    if rc < 0:  # ssh died of a signal
        return 128 - rc
    return rc


# ---- gputop status --hosts ---------------------------------------------------------------------

def classify_failure(rc: int | None, stderr: str) -> str:
    """Map ssh's exit status and messages to one reason class."""
    s = stderr.lower()
    if "remote host identification has changed" in s or ("host key for" in s and "has changed" in s):
        return HOST_KEY_CHANGED
    if "host key verification failed" in s or ("host key is known" in s and "no " in s):
        return HOST_KEY_UNKNOWN
    if rc == NOT_FOUND or "command not found" in s:
        return GPUTOP_MISSING
    if "permission denied" in s or "too many authentication failures" in s:
        return AUTH_FAILED
    if rc == SSH_FAILED and any(m in s for m in (
            "connect to host", "could not resolve", "connection refused", "no route to host",
            "network is unreachable", "connection closed", "connection reset", "name or service not known")):
        return UNREACHABLE
    if "timed out" in s:
        return TIMED_OUT
    if rc == SSH_FAILED:
        return UNREACHABLE
    return REMOTE_ERROR


@dataclass
class HostResult:
    host: str
    status: dict | None = None  # the remote `status --json`
    kind: str | None = None  # failure reason class; None when it worked
    message: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.kind is None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("Warning: Permanently")]
    return lines[-1] if lines else ""


# A host's answer is read with a cap and a deadline: an answer that never ends, or is far larger than any
# node's `status --json` (a few hundred KiB for hundreds of holders), costs at most this much memory.
MAX_ANSWER = 4 * 1024 * 1024  # bytes of stdout kept per host; more makes the host one failed row
MAX_STDERR = 64 * 1024  # the last this-many bytes of ssh's stderr (the reason is its last line)
MAX_DEPTH = 64  # JSON nesting a gputop answer never comes near (it uses under 10)


def _kill_group(proc: subprocess.Popen) -> None:
    """ssh runs in its own session (start_new_session): end it and anything it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except OSError:
        pass
    proc.wait()


def _read_capped(proc: subprocess.Popen, deadline: float) -> tuple[bytes, bytes, str | None]:
    """stdout (at most MAX_ANSWER bytes) and the tail of stderr until both close, or why we stopped:
    "timeout" or "too big". Memory stays bounded whatever the remote sends."""
    out = bytearray()
    err = bytearray()
    sel = selectors.DefaultSelector()
    for f, buf in ((proc.stdout, out), (proc.stderr, err)):
        os.set_blocking(f.fileno(), False)
        sel.register(f.fileno(), selectors.EVENT_READ, buf)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(out), bytes(err), "timeout"
            for key, _ in sel.select(left):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = key.data
                buf += chunk
                if buf is out and len(out) > MAX_ANSWER:
                    return bytes(out[:MAX_ANSWER]), bytes(err), "too big"
                if buf is err and len(err) > MAX_STDERR:
                    del err[:len(err) - MAX_STDERR]
    finally:
        sel.close()
    return bytes(out), bytes(err), None


def _depth_over(value, limit: int) -> bool:
    """True when ``value`` nests lists/objects deeper than ``limit`` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        if d > limit:
            return True
        stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return False


def parse_answer(raw: bytes) -> dict:
    """A remote's ``status --json`` answer, or ValueError with a one-line reason (not UTF-8, not JSON,
    nested too deeply, not an object)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"the answer is not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(f"the JSON is nested too deeply (over {MAX_DEPTH} levels)") from None
    except ValueError as e:
        raise ValueError(f"not gputop JSON ({e}): {text[:80]!r}") from None
    if _depth_over(data, MAX_DEPTH):
        raise ValueError(f"the JSON is nested too deeply (over {MAX_DEPTH} levels)")
    if not isinstance(data, dict):
        raise ValueError(f"not gputop JSON (not an object): {text[:80]!r}")
    return data


def query_host(host: str, *, timeout: float = 10.0, remote_cmd: str | None = None,
               args: tuple[str, ...] = ("status", "--json")) -> HostResult:
    """Run ``gputop status --json`` on one host, with BatchMode (no prompts), a hard deadline and a cap
    on the answer's size. Whatever the host sends, the result is one HostResult, never an exception."""
    t0 = time.monotonic()
    try:
        argv = build_ssh_argv(host, list(args), remote_cmd=remote_cmd, batch=True, connect_timeout=timeout)
    except UsageError as e:
        return HostResult(host, kind=REMOTE_ERROR, message=str(e))
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        return HostResult(host, kind=UNREACHABLE, message="the OpenSSH client 'ssh' was not found")
    try:
        out, err_b, stopped = _read_capped(proc, t0 + timeout)
        if stopped is not None:
            _kill_group(proc)
        else:
            try:
                proc.wait(max(0.1, t0 + timeout - time.monotonic()))
            except subprocess.TimeoutExpired:  # closed its output but did not exit
                stopped = "timeout"
                _kill_group(proc)
    finally:
        proc.stdout.close()
        proc.stderr.close()
    took = time.monotonic() - t0
    if stopped == "timeout":
        return HostResult(host, kind=TIMED_OUT, message=f"no complete answer within {timeout:g}s "
                          f"({len(out)} bytes read)", seconds=took)
    if stopped == "too big":
        return HostResult(host, kind=BAD_OUTPUT, message=f"the answer is larger than {MAX_ANSWER // 1048576} MiB; "
                          "stopped reading", seconds=took)
    err = err_b.decode("utf-8", "replace")
    if proc.returncode != 0:
        kind = classify_failure(proc.returncode, err)
        msg = _last_line(err) or f"exit status {proc.returncode}"
        if kind == GPUTOP_MISSING:
            msg = missing_message(host)
        return HostResult(host, kind=kind, message=msg, seconds=took)
    try:
        data = parse_answer(out)
    except ValueError as e:
        return HostResult(host, kind=BAD_OUTPUT, message=str(e), seconds=took)
    return HostResult(host, status=data, seconds=took)


def query_hosts(hosts: list[str], *, timeout: float = 10.0, remote_cmd: str | None = None,
                args: tuple[str, ...] = ("status", "--json"), max_workers: int = 32) -> list[HostResult]:
    """All hosts in parallel; results in the order the hosts were given."""
    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(max_workers, len(hosts))) as pool:
        futs = [pool.submit(query_host, h, timeout=timeout, remote_cmd=remote_cmd, args=args) for h in hosts]
        return [f.result() for f in futs]


def parse_hosts(spec: str | None = None, hosts_file: str | None = None) -> list[str]:
    """Hosts from "a,b c" and/or a file (one or more per line, '#' starts a comment); order kept, no repeats."""
    raw: list[str] = []
    if spec:
        raw += spec.replace(",", " ").split()
    if hosts_file:
        try:
            text = Path(hosts_file).read_text()
        except OSError as e:
            raise UsageError(f"cannot read hosts file {hosts_file}: {e.strerror}") from None
        for line in text.splitlines():
            raw += line.split("#", 1)[0].replace(",", " ").split()
    out: list[str] = []
    for h in raw:
        h = check_host(h)
        if h not in out:
            out.append(h)
    if not out:
        raise UsageError("no hosts given: use --hosts h1,h2 or --hosts-file FILE")
    return out


# ---- merging ---------------------------------------------------------------------------------

def _rows(host: str, value, what: str, bad: list[str]) -> list[dict]:
    """A remote list of objects, each with the host added; anything else is dropped with a warning."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    out = [{"host": host, **{k: v for k, v in x.items() if k != "host"}} for x in items if isinstance(x, dict)]
    if len(out) != len(items):
        bad.append(f"{len(items) - len(out)} {what} entr(ies) in its answer were not objects; dropped")
    return out


def merged_dict(results: list[HostResult]) -> dict:
    """One JSON document with the host on every row. A remote host's answer is not trusted: rows that
    are not objects are dropped (and said so), and the host field is always the name we asked."""
    hosts, gpus, holders, roots, warnings, ledger, instances = [], [], [], [], [], [], []
    for r in results:
        entry = {"host": r.host, "ok": r.ok, "seconds": round(r.seconds, 3)}
        if r.ok:
            s = r.status or {}
            entry.update({"hostname": s.get("host"), "at": s.get("at"), "version": s.get("version"),
                          "error": None})
            bad: list[str] = []
            gpu = s.get("gpu")
            gpus += _rows(r.host, gpu.get("gpus") if isinstance(gpu, dict) else gpu, "gpu", bad)
            instances += _rows(r.host, gpu.get("instances") if isinstance(gpu, dict) else None, "MIG device", bad)
            ledger += _rows(r.host, s.get("ledger"), "ledger", bad)
            holders += _rows(r.host, s.get("holders"), "holder", bad)
            roots += _rows(r.host, s.get("roots"), "root", bad)
            ws = s.get("warnings") or []
            warnings += [{"host": r.host, "message": w if isinstance(w, str) else json.dumps(w)}
                         for w in (ws if isinstance(ws, list) else [ws])]
            warnings += [{"host": r.host, "message": b} for b in bad]
        else:
            entry["error"] = {"kind": r.kind, "message": r.message}
        hosts.append(entry)
    return {"hosts": hosts, "gpus": gpus, "holders": holders, "roots": roots, "warnings": warnings,
            "ledger": ledger, "instances": instances}


def _num(v):
    """A remote number, or None when the remote sent something else (shown as N/A, never a traceback)."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def render_merged(results: list[HostResult]) -> str:
    from gputop.commands._common import table
    from gputop.util.units import fmt_bytes, fmt_opt

    merged = merged_dict(results)
    out: list[str] = []
    ok = sum(1 for r in results if r.ok)
    out.append(f"{ok}/{len(results)} host(s) answered  {len(merged['gpus'])} GPU(s)  "
               f"{len(merged['holders'])} holder(s)  {len(merged['roots'])} orphan tree(s)")
    if merged["gpus"]:
        rows = []
        for g in merged["gpus"]:
            if g.get("lost"):
                rows.append([g["host"], str(g.get("index")), str(g.get("name") or "?"), "LOST", "", "", ""])
                continue
            rows.append([
                g["host"], str(g.get("index")), str(g.get("name") or "N/A"),
                fmt_opt(_num(g.get("utilization_gpu")), "{:.0f}%"),
                f"{fmt_bytes(_num(g.get('memory_used')))} / {fmt_bytes(_num(g.get('memory_total')))}",
                fmt_opt(_num(g.get("temperature_c")), "{:.0f}C"), fmt_opt(_num(g.get("power_w")), "{:.0f}W"),
            ])
            rows.extend(_instance_rows(merged["instances"], g))
        out.append(table(rows, ["HOST", "GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER"], right={1, 3, 5, 6}))
        out.extend(_ledger_lines(merged["ledger"]))
    if merged["holders"]:
        out.append("")
        rows = []
        for h in merged["holders"]:
            argv, gl, verdict = h.get("cmdline"), h.get("gpus") or [], h.get("verdict")
            cmd = (" ".join(map(str, argv)) if isinstance(argv, list) else "") or str(h.get("name") or "(not visible)")
            rows.append([
                h["host"], str(h.get("pid")), str(h.get("user") or "?"), str(h.get("ctx") or "?"),
                ",".join(map(str, gl)) if isinstance(gl, list) else "?", fmt_bytes(_num(h.get("gpu_memory"))),
                fmt_opt(_num(h.get("sm_util")), "{:.0f}%"),
                str(verdict.get("kind", "?")) if isinstance(verdict, dict) else "?", cmd[:50],
            ])
        out.append(table(rows, ["HOST", "PID", "USER", "TYPE", "GPU", "GPU-MEM", "SM", "VERDICT", "COMMAND"],
                         right={1, 5, 6}))
    for w in merged["warnings"]:
        out.append(f"warning: {w['host']}: {visible(w['message'])}")  # the remote's text: made visible
    failed = [r for r in results if not r.ok]
    if failed:
        out.append("")
        for r in failed:
            out.append(f"{r.host}: {r.kind}: {visible(r.message)}")  # ssh's or the remote's stderr
    return "\n".join(out)


def _instance_rows(instances: list[dict], g: dict) -> list[list[str]]:
    """A row per MIG device of the host's GPU ``g``, under it, as ``status`` shows them on one node."""
    from gputop.util.units import fmt_bytes, fmt_opt

    rows = []
    for m in instances:
        if m["host"] != g["host"] or m.get("gpu") != g.get("index") or g.get("index") is None:
            continue
        label = " ".join(str(m.get(k)) for k in ("profile", "name") if isinstance(m.get(k), str))[:40]
        rows.append([g["host"], f"{g['index']}:{m.get('mig_index')}", f"- MIG {label}".rstrip(),
                     fmt_opt(_num(m.get("utilization_gpu")), "{:.0f}%"),
                     f"{fmt_bytes(_num(m.get('memory_used')))} / {fmt_bytes(_num(m.get('memory_total')))}", "", ""])
    return rows


def _ledger_lines(ledger: list[dict]) -> list[str]:
    """Each host's memory ledger lines (unexplained memory, zombies, driver-held), as ``status`` prints
    them; a ledger entry that does not parse is left out."""
    from gputop.core.ledger import GpuLedger

    out = []
    for entry in ledger:
        lg = GpuLedger.from_dict({k: v for k, v in entry.items() if k != "host"})
        line = lg.line() if lg is not None else None
        if line is not None:
            out.append(f"  {entry['host']} GPU {lg.gpu} {line}")
    return out


def run_status_hosts(args) -> int:
    """``gputop status --hosts ...``: exit 0 when every host answered, 6 when any did not."""
    from gputop.commands._common import print_json

    if args.timeout is None or args.timeout <= 0:
        raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    hosts = parse_hosts(args.hosts, args.hosts_file)
    remote_args = ["status", "--json"]
    if getattr(args, "backend", None):
        remote_args += ["--backend", args.backend]
    results = query_hosts(hosts, timeout=args.timeout, remote_cmd=getattr(args, "remote_gputop", None),
                          args=tuple(remote_args))
    if args.json:
        print_json(merged_dict(results))
    else:
        print(render_merged(results))
    return 0 if all(r.ok for r in results) else EXIT_UNAVAILABLE
