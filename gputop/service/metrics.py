"""Prometheus metrics for ``gputop serve``: a collector that renders every series from the latest snapshot."""

from __future__ import annotations

import json
import socket

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gputop.service import faces
from gputop.service.faces import LiveSnapshot
from gputop.service.metrics_mig import mig_families


# ---- Prometheus ------------------------------------------------------------------------------

class GuardHitCounter:
    """Per-rule counts of the guard's hit log, read incrementally (new lines only, rotation-aware)."""

    def __init__(self):
        self.counts: dict[tuple[str, str, str], int] = {}
        self._ino = None
        self._offset = 0
        self._rest = b""

    def update(self) -> None:
        from gputop.guard import state

        p = state.hits_path()
        try:
            st = p.stat()
        except OSError:
            return
        if st.st_ino != self._ino or st.st_size < self._offset:  # new or rotated file
            self._ino, self._offset, self._rest = st.st_ino, 0, b""
        if st.st_size == self._offset:
            return
        try:
            with open(p, "rb") as f:
                f.seek(self._offset)
                data = f.read(st.st_size - self._offset)
        except OSError:
            return
        self._offset += len(data)
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                key = (str(rec.get("rule") or "?"), str(rec.get("action") or "?"),
                       "true" if rec.get("dry_run") else "false")
                self.counts[key] = self.counts.get(key, 0) + 1


class FindingCounter:
    """Counts each audit finding once, when it first appears (rule, severity, pid, start time)."""

    def __init__(self):
        self.seen: set[tuple] = set()
        self.counts: dict[tuple[str, str], int] = {}
        self.current: dict[tuple[str, str], int] = {}

    def __call__(self, snap, findings) -> None:
        now_keys: set[tuple] = set()
        current: dict[tuple[str, str], int] = {}
        for f in findings:
            d = faces.finding_to_dict(f)
            rule, sev, pid = str(d.get("rule")), str(d.get("severity")), d.get("pid")
            h = snap.holder(pid) if isinstance(pid, int) else None
            key = (rule, sev, pid, h.start_time if h else None)
            now_keys.add(key)
            current[(rule, sev)] = current.get((rule, sev), 0) + 1
            if key not in self.seen:
                self.counts[(rule, sev)] = self.counts.get((rule, sev), 0) + 1
        self.seen = now_keys  # a finding that goes away and comes back counts again
        self.current = current


def _num(v):
    return None if v is None else float(v)


# Device series: (key, metric name, help, value from a Device). Units are base units (Prometheus
# conventions): ratios 0-1, bytes, hertz, celsius, watts. An unknown value is left out, never 0.
_DEVICE = (
    ("gputop_gpu_utilization_ratio", "GPU utilisation (0-1)", lambda d: _pct(d.util_gpu)),
    ("gputop_gpu_memory_utilization_ratio", "GPU memory controller utilisation (0-1)", lambda d: _pct(d.util_mem)),
    ("gputop_gpu_memory_used_bytes", "GPU memory in use", lambda d: _num(d.memory_used)),
    ("gputop_gpu_memory_total_bytes", "GPU memory size", lambda d: _num(d.memory_total)),
    ("gputop_gpu_temperature_celsius", "GPU temperature", lambda d: _num(d.temperature)),
    ("gputop_gpu_power_watts", "GPU power draw", lambda d: _num(d.power_w)),
    ("gputop_gpu_power_limit_watts", "GPU power limit", lambda d: _num(d.power_limit_w)),
    ("gputop_gpu_fan_speed_ratio", "GPU fan speed (0-1 of its maximum)", lambda d: _pct(d.fan_pct)),
    ("gputop_gpu_sm_clock_hertz", "GPU SM clock", lambda d: _mhz(d.clock_sm_mhz)),
    ("gputop_gpu_memory_clock_hertz", "GPU memory clock", lambda d: _mhz(d.clock_mem_mhz)),
)
# What DCGM exporter series carry, so Grafana dashboards can join gputop's series with theirs.
DEVICE_LABELS = ["gpu", "UUID", "modelName", "Hostname"]
PROCESS_LABELS = ["pid", "gpu", "UUID", "Hostname", "name", "user", "ctx"]


def _pct(v):
    return None if v is None else float(v) / 100.0


def _mhz(v):
    return None if v is None else float(v) * 1e6


def _device_labels(d, host: str) -> list[str]:
    return [str(d.index), d.uuid or "", d.name or "", host]


def _device_families(snap, host: str):
    info = GaugeMetricFamily("gputop_gpu_info", "GPU identity (value 1)",
                             labels=DEVICE_LABELS + ["backend", "pci_bus_id"])
    lost = GaugeMetricFamily("gputop_gpu_lost", "1 when the GPU is lost or unreachable", labels=DEVICE_LABELS)
    fams = [(GaugeMetricFamily(name, doc, labels=DEVICE_LABELS), fn) for name, doc, fn in _DEVICE]
    for d in snap.devices:
        labels = _device_labels(d, host)
        info.add_metric(labels + [d.backend or "", d.pci_bus_id or ""], 1)
        lost.add_metric(labels, 1 if d.lost else 0)
        if d.lost:
            continue
        for fam, fn in fams:
            v = fn(d)
            if v is not None:
                fam.add_metric(labels, v)
    yield info
    yield lost
    for fam, _ in fams:
        yield fam


def _process_families(snap, host: str):
    """Per-process series keep one identity (labels without the verdict); the verdict is its own info
    series, so a process turning orphan does not end one series and start another."""
    pmem = GaugeMetricFamily("gputop_process_gpu_memory_bytes", "GPU memory held by a process on one GPU",
                             labels=PROCESS_LABELS)
    psm = GaugeMetricFamily("gputop_process_sm_utilization_ratio", "A process's SM utilisation on one GPU (0-1)",
                            labels=PROCESS_LABELS)
    pinfo = GaugeMetricFamily("gputop_process_verdict_info", "A GPU-holding process's orphan verdict (value 1)",
                              labels=["pid", "Hostname", "name", "user", "verdict"])
    pstart = GaugeMetricFamily("gputop_process_start_time_seconds", "When a GPU-holding process started",
                               labels=["pid", "Hostname", "name", "user"])
    powner = GaugeMetricFamily("gputop_process_owner_info",
                               "Who owns a GPU-holding process: its Slurm job, pod, container or systemd unit (value 1)",
                               labels=["pid", "Hostname", "owner_kind", "slurm_job", "pod", "container", "unit"])
    uuids = {d.index: d.uuid or "" for d in snap.devices}
    for h in snap.holders:
        ident = [str(h.pid), host, h.name, h.user or ""]
        pinfo.add_metric(ident + [h.verdict.kind], 1)
        owner, job = getattr(h, "owner", None), getattr(h, "job", None)
        if owner is not None or job is not None:
            powner.add_metric([str(h.pid), host, owner.kind if owner is not None else "none",
                               job.label() if job is not None else "",
                               (owner.pod or "") if owner is not None else "",
                               (owner.container or "") if owner is not None else "",
                               (owner.unit or "") if owner is not None else ""], 1)
        if getattr(h, "start_time", None) is not None:
            pstart.add_metric(ident, float(h.start_time))
        for u in h.uses:
            labels = [str(h.pid), str(u.gpu), uuids.get(u.gpu, ""), host, h.name, h.user or "", u.ctx]
            if u.used_memory is not None:
                pmem.add_metric(labels, float(u.used_memory))
            if u.sm_util is not None:
                psm.add_metric(labels, float(u.sm_util) / 100.0)
    yield from (pmem, psm, pinfo, pstart, powner)


def _allocation_families(snap, host: str):
    """Issue 29: whom the scheduler gave each GPU to (info, and its idle seconds) and each holder's standing
    against it. Nothing where no scheduler is read (snap.allocation None)."""
    alloc = getattr(snap, "allocation", None)
    if alloc is None:
        return
    ainfo = GaugeMetricFamily("gputop_gpu_allocation_info", "The job a GPU is allocated to (value 1)",
                              labels=DEVICE_LABELS + ["job", "user", "source"])
    aidle = GaugeMetricFamily("gputop_gpu_allocation_idle_seconds",
                              "How long an allocated GPU has had no process (absent while one holds it)",
                              labels=DEVICE_LABELS + ["job"])
    for d in snap.devices:
        a = alloc.of(d.index)
        if a is None:
            continue
        labels = _device_labels(d, host)
        ainfo.add_metric(labels + [a.job, a.user or "", a.source], 1)
        idle = alloc.idle_for(d.index, snap.at)
        if idle is not None:
            aidle.add_metric(labels + [a.job], idle)
    pst = GaugeMetricFamily("gputop_process_standing_info",
                            "A GPU-holding process's standing against its GPUs' allocation (value 1)",
                            labels=["pid", "Hostname", "name", "user", "standing"])
    for h in snap.holders:
        st = alloc.standing(h.pid)
        if st is not None:
            pst.add_metric([str(h.pid), host, h.name, h.user or "", st.kind], 1)
    yield from (ainfo, aidle, pst)


def _ledger_families(snap, host: str):
    """The memory ledger (gputop.core.ledger): per GPU, the bytes no listed process accounts for, and how
    many processes hold its device file without being listed."""
    from gputop.core.ledger import gpu_ledgers

    unexplained = GaugeMetricFamily("gputop_gpu_memory_unexplained_bytes",
                                    "GPU memory in use that no listed process accounts for", labels=DEVICE_LABELS)
    files = GaugeMetricFamily("gputop_gpu_device_file_holders",
                              "Processes holding a GPU's device file that the driver does not list",
                              labels=DEVICE_LABELS)
    devices = {d.index: d for d in snap.devices}
    for lg in gpu_ledgers(snap):
        labels = _device_labels(devices[lg.gpu], host)
        if lg.unexplained is not None:
            unexplained.add_metric(labels, float(lg.unexplained))
        files.add_metric(labels, len(lg.device_file_pids))
    yield unexplained
    yield files


class SnapshotCollector:
    """Renders every metric from the latest snapshot, so an exited process's series simply disappear."""

    def __init__(self, live: LiveSnapshot, findings: FindingCounter, hits: GuardHitCounter):
        self.live = live
        self.findings = findings
        self.hits = hits

    def describe(self):
        return []  # do not collect at registration time

    def collect(self):
        snap = self.live.latest()
        host = snap.host or socket.gethostname()
        yield GaugeMetricFamily("gputop_up", "1 while the last sample succeeded", value=0 if self.live.error else 1)
        yield GaugeMetricFamily("gputop_snapshot_timestamp_seconds", "When the latest snapshot was taken",
                                value=snap.at)
        yield from _device_families(snap, host)
        yield from _process_families(snap, host)
        yield from _allocation_families(snap, host)
        yield from mig_families(snap, host, _device_labels)  # MIG devices, with DCGM's GPU_I_* labels
        yield from _ledger_families(snap, host)
        yield GaugeMetricFamily("gputop_holders", "Processes holding a GPU", value=len(snap.holders))
        yield GaugeMetricFamily("gputop_orphan_trees", "Orphan trees holding a GPU", value=len(snap.roots))
        yield from self._findings()
        yield from self._guard()

    def _findings(self):
        fc = CounterMetricFamily("gputop_audit_findings", "Rogue-audit findings, counted when first seen",
                                 labels=["rule", "severity"])
        for (rule, sev), n in sorted(self.findings.counts.items()):
            fc.add_metric([rule, sev], n)
        yield fc
        fg = GaugeMetricFamily("gputop_audit_findings_current", "Rogue-audit findings in the latest snapshot",
                               labels=["rule", "severity"])
        for (rule, sev), n in sorted(self.findings.current.items()):
            fg.add_metric([rule, sev], n)
        yield fg

    def _guard(self):
        self.hits.update()
        hc = CounterMetricFamily("gputop_guard_hits", "Guard rule hits recorded in the hit log (dry_run: "
                                 "\"true\" when nothing was done)", labels=["rule", "action", "dry_run"])
        for (rule, action, dry), n in sorted(self.hits.counts.items()):
            hc.add_metric([rule, action, dry], n)
        yield hc
        try:
            from gputop.guard import state

            mode = state.get_mode()
            alive = bool(state.daemon_status().get("alive"))
        except Exception:
            return
        gm = GaugeMetricFamily("gputop_guard_mode", "The guard mode (1 for the current one)", labels=["mode"])
        for m in state.MODES:
            gm.add_metric([m], 1 if m == mode else 0)
        yield gm
        yield GaugeMetricFamily("gputop_guard_daemon_up", "1 while a guard daemon runs on this node",
                                value=1 if alive else 0)


# ---- exposition ------------------------------------------------------------------------------

def exposition(registry, accept: str | None) -> tuple[bytes, str]:
    """The scrape body and its content type: OpenMetrics when the scraper's Accept asks for it."""
    from prometheus_client.exposition import choose_encoder

    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


def make_registry(live: LiveSnapshot):
    from prometheus_client import CollectorRegistry

    findings = FindingCounter()
    live.add_listener(findings)
    if live._latest is not None:  # the snapshot taken before the listener was added counts too
        findings(live._latest, live._findings)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(live, findings, GuardHitCounter()))
    return registry


def create_metrics_app(live: LiveSnapshot):
    """``serve --metrics-only``: GET /metrics (and an index at /), no action API, nothing to authorize."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    registry = make_registry(live)

    async def metrics(request):
        data, ctype = await run_in_threadpool(exposition, registry, request.headers.get("accept"))
        return Response(data, media_type=ctype)

    async def root(request):
        from gputop import __version__

        return JSONResponse({"service": "gputop", "version": __version__, "metrics_only": True,
                             "endpoints": ["/metrics"]})

    async def not_found(request, exc):
        return JSONResponse({"ok": False, "error": "not found: this gputop serve has only /metrics "
                                                   "(--metrics-only)"}, status_code=404)

    app = Starlette(routes=[Route("/", root), Route("/metrics", metrics)], exception_handlers={404: not_found})
    app.state.live = live
    return app
