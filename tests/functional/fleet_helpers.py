"""A real Prometheus for the fleet tests (Debian's `prometheus`, started in tmp_path on a free port), the
exporters it scrapes (live `gputop serve --metrics-only` on simulated GPUs, a static dcgm-exporter page),
an auth/slow reverse proxy in front of it, and the OpenMetrics backfill of a 1,000-node TSDB."""

from __future__ import annotations

import http.client
import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import yaml

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
WHY_NOT = None if PROMETHEUS and PROMTOOL else "Debian's prometheus package is not installed (.ci/run installs it)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0, ok=(200,)) -> None:
    u = urlparse(url)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=2)
            c.request("GET", u.path or "/")
            if c.getresponse().status in ok:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} never answered")


class Prometheus:
    """``prometheus`` on 127.0.0.1:<free port> with its TSDB in ``dir``; ``jobs``: {job: (target, Hostname)}
    scraped every second, each job's Hostname label set by relabelling (every local exporter says this
    machine's name; a cluster's would each say their own)."""

    def __init__(self, dir: Path, jobs: dict[str, tuple[str, str]] | None = None, tsdb: Path | None = None,
                 web_config: Path | None = None, rules: Path | None = None, lookback: str | None = None):
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        scrape = [{"job_name": job, "scrape_interval": "1s", "scrape_timeout": "1s",
                   "static_configs": [{"targets": [target]}],
                   "metric_relabel_configs": [{"target_label": "Hostname", "replacement": host}]}
                  for job, (target, host) in (jobs or {}).items()]
        cfg = self.dir / "prometheus.yml"
        conf = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": scrape}
        if rules is not None:
            conf["rule_files"] = [str(rules)]
        cfg.write_text(yaml.safe_dump(conf))
        argv = [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tsdb or self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
                "--storage.tsdb.retention.time=30d"]
        if web_config:
            argv.append(f"--web.config.file={web_config}")
        if lookback:  # how old an instant query's newest sample may be (5m by default)
            argv.append(f"--query.lookback-delta={lookback}")
        self.log = open(self.dir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        try:
            if web_config is None:
                wait_http(self.url + "/-/ready", 60)
        except TimeoutError:
            self.stop()
            raise RuntimeError("prometheus did not start: " + (self.dir / "prometheus.log").read_text()[-2000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _reply(h: http.server.BaseHTTPRequestHandler, status: int, body: bytes, ctype: str | None = None) -> None:
    h.send_response(status)
    if ctype is not None:
        h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def _serve(handler) -> http.server.ThreadingHTTPServer:
    """A threaded HTTP server on a free local port, serving ``handler`` from a daemon thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class StaticExporter:
    """An HTTP server whose /metrics is ``text`` (a stand-in dcgm-exporter: the series, as it writes them)."""

    def __init__(self, text: str):
        body = text.encode()

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                _reply(self, 200, body, "text/plain; version=0.0.4")

            def log_message(self, *a):
                pass

        self.server = _serve(H)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def dcgm_text(host: str, gpus: int, util: float = 30.0, used_mib: int = 1000, free_mib: int = 80000) -> str:
    lines = []
    for name, value in (("DCGM_FI_DEV_GPU_UTIL", util), ("DCGM_FI_DEV_FB_USED", used_mib),
                        ("DCGM_FI_DEV_FB_FREE", free_mib), ("DCGM_FI_DEV_GPU_TEMP", 60)):
        lines.append(f"# TYPE {name} gauge")
        for i in range(gpus):
            lines.append(f'{name}{{gpu="{i}",UUID="GPU-{host}-{i}",device="nvidia{i}",'
                         f'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}"}} {value}')
    return "\n".join(lines) + "\n"


class Proxy:
    """A reverse proxy in front of a Prometheus, as a cluster puts an auth proxy there: ``token`` makes it
    demand ``Authorization: Bearer <token>`` (401 otherwise); ``mode`` "hang" holds every request open
    (a slow server), "forward" passes it on."""

    def __init__(self, upstream: str, token: str | None = None):
        self.upstream = urlparse(upstream)
        self.token = token
        self.mode = "forward"
        proxy = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if proxy.mode == "hang":
                    time.sleep(30)
                    return
                if proxy.token and self.headers.get("Authorization") != f"Bearer {proxy.token}":
                    _reply(self, 401, b"unauthorized")
                    return
                c = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                c.request("GET", self.path)
                r = c.getresponse()
                _reply(self, r.status, r.read(), r.getheader("Content-Type", "application/json"))

            def log_message(self, *a):
                pass

        self.server = _serve(H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


# ---- scale: a backfilled TSDB --------------------------------------------------------------------------

def scale_openmetrics(path: Path, nodes: int = 1000, gpus: int = 8, dcgm_only_every: int = 10,
                      orphan_every: int = 97, end: float | None = None, samples: int = 5, step: float = 30.0) -> dict:
    """OpenMetrics for ``nodes`` nodes x ``gpus`` GPUs ending at ``end``: every ``dcgm_only_every``-th node
    has only DCGM series, the others gputop's (and DCGM's), every ``orphan_every``-th an orphan holding
    memory. Returns what was written ({"nodes", "dcgm_only", "orphans"}: host names)."""
    end = time.time() if end is None else end
    times = [end - step * (samples - 1 - k) for k in range(samples)]
    fams: dict[str, list[str]] = {}

    def add(name, labels, value, kind="gauge"):
        lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
        sample = name + "_total" if kind == "counter" else name
        fams.setdefault(f"{name}\x00{kind}", []).extend(f"{sample}{{{lab}}} {value} {t:.3f}" for t in times)

    dcgm_only, orphans, names = [], [], []
    for n in range(nodes):
        host = f"gpu{n:04d}"
        names.append(host)
        inst = {"job": "gputop", "instance": f"{host}:9400"}
        for g in range(gpus):
            dl = {"gpu": str(g), "UUID": f"GPU-{n:04d}-{g}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": host}
            add("DCGM_FI_DEV_GPU_UTIL", {"job": "dcgm", "instance": f"{host}:9401", **dl}, (n + g) % 100)
            add("DCGM_FI_DEV_FB_USED", {"job": "dcgm", "instance": f"{host}:9401", **dl}, 1000 * g)
            add("DCGM_FI_DEV_FB_FREE", {"job": "dcgm", "instance": f"{host}:9401", **dl}, 80000 - 1000 * g)
            if n % dcgm_only_every == 0:
                continue
            add("gputop_gpu_info", {**inst, **dl, "backend": "nvml", "pci_bus_id": f"0000:{g:02x}:00.0"}, 1)
            add("gputop_gpu_lost", {**inst, **dl}, 0)
            add("gputop_gpu_utilization_ratio", {**inst, **dl}, ((n + g) % 100) / 100)
            add("gputop_gpu_memory_used_bytes", {**inst, **dl}, 1000 * g * 1048576)
            add("gputop_gpu_memory_total_bytes", {**inst, **dl}, 80 * 1024 ** 3)
            if g < 6:  # a holder on GPUs 0-5
                pl = {**inst, "pid": str(1000 + g), "gpu": str(g), "UUID": dl["UUID"], "Hostname": host,
                      "name": "python", "user": f"u{n % 50}", "ctx": "C"}
                add("gputop_process_gpu_memory_bytes", pl, 2 * 1024 ** 3)
                verdict = "orphan" if (n % orphan_every == 0 and g == 0) else "not-orphan"
                add("gputop_process_verdict_info", {**inst, "pid": str(1000 + g), "Hostname": host, "name": "python",
                                                    "user": f"u{n % 50}", "verdict": verdict}, 1)
        if n % dcgm_only_every == 0:
            dcgm_only.append(host)
            continue
        if n % orphan_every == 0:
            orphans.append(host)
        add("gputop_up", inst, 1)
        add("gputop_snapshot_timestamp_seconds", inst, f"{end:.3f}")
        add("gputop_guard_hits", {**inst, "rule": "r", "action": "kill", "dry_run": "true"}, n % 3, "counter")
    with open(path, "w") as f:
        for key, lines in fams.items():
            name, kind = key.split("\x00")
            f.write(f"# TYPE {name} {kind}\n")
            f.write("\n".join(lines))
            f.write("\n")
        f.write("# EOF\n")
    return {"nodes": names, "dcgm_only": dcgm_only, "orphans": orphans}


def backfill(openmetrics: Path, tsdb: Path) -> None:
    tsdb.mkdir(parents=True, exist_ok=True)
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(tsdb)],
                   check=True, capture_output=True, timeout=600)


def env_without_proxy() -> dict:
    """requests honours $http_proxy: the tests talk to 127.0.0.1 only."""
    return {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}


# ---- the TUI's first refresh in a forked child (gputop/fleet/first.py), driven in a fresh process -------------
# (a process without threads: this test process has the exporters' and proxies' threads, and FirstRefresh
# does not fork in a process with threads)

FIRST_SCRIPT = r"""
import json, os, sys
from gputop.fleet.client import Prometheus
from gputop.fleet.first import FirstRefresh
from gputop.fleet.source import FleetSource

url, timeout, action = sys.argv[1], float(sys.argv[2]), sys.argv[3]
source = FleetSource(Prometheus(url, timeout=timeout))
first = FirstRefresh(source)
out = {"forked": first.pid is not None, "child": first.pid}
if action == "kill":  # the child dies before it answers: the parent refreshes itself
    os.kill(first.pid, 9)
    print("killed", flush=True)
    sys.stdin.readline()  # the test lets the server answer again
elif action == "close":
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
    first.close()
    out["child_left"] = os.path.exists(f"/proc/{out['child']}")
    print(json.dumps(out), flush=True)
    sys.exit(0)
frame = first.result()
out.update(hosts=[r.host for r in frame.rows], error=str(frame.error) if frame.error else None,
           stale=frame.stale, queries=frame.queries, counted=source.prom.queries, recorded=source.recorded,
           last=source.last is frame, again=first.result() is frame,
           child_left=os.path.exists(f"/proc/{out['child']}") if out["child"] else None)
nxt = source.refresh()  # the parent goes on refreshing, with the child's state (recorded or not)
out.update(next_hosts=[r.host for r in nxt.rows], next_queries=nxt.queries)
first.close()
source.close()
print(json.dumps(out), flush=True)
"""


def first_refresh_process(url: str, timeout: float, action: str) -> subprocess.Popen:
    import sys

    return subprocess.Popen([sys.executable, "-c", FIRST_SCRIPT, url, str(timeout), action], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_proxy())
