"""Prometheus metrics for ``gputop serve``: a collector that renders every series from the latest snapshot."""

from __future__ import annotations

import json

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gputop import faces
from gputop.faces import LiveSnapshot


# ---- Prometheus ------------------------------------------------------------------------------

class GuardHitCounter:
    """Per-rule counts of the guard's hit log, read incrementally (new lines only, rotation-aware)."""

    def __init__(self):
        self.counts: dict[tuple[str, str], int] = {}
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
                key = (str(rec.get("rule") or "?"), str(rec.get("action") or "?"))
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
        up = GaugeMetricFamily("gputop_up", "1 while the last sample succeeded", value=0 if self.live.error else 1)
        yield up
        yield GaugeMetricFamily("gputop_snapshot_timestamp_seconds", "When the latest snapshot was taken",
                                value=snap.at)
        gl = ["gpu"]
        info = GaugeMetricFamily("gputop_gpu_info", "GPU identity (value 1)",
                                 labels=["gpu", "name", "uuid", "backend", "pci_bus_id"])
        fams = {
            "util": GaugeMetricFamily("gputop_gpu_utilization_percent", "GPU utilisation", labels=gl),
            "mem": GaugeMetricFamily("gputop_gpu_memory_used_bytes", "GPU memory in use", labels=gl),
            "memt": GaugeMetricFamily("gputop_gpu_memory_total_bytes", "GPU memory size", labels=gl),
            "temp": GaugeMetricFamily("gputop_gpu_temperature_celsius", "GPU temperature", labels=gl),
            "power": GaugeMetricFamily("gputop_gpu_power_watts", "GPU power draw", labels=gl),
            "plim": GaugeMetricFamily("gputop_gpu_power_limit_watts", "GPU power limit", labels=gl),
            "lost": GaugeMetricFamily("gputop_gpu_lost", "1 when the GPU is lost or unreachable", labels=gl),
        }
        for d in snap.devices:
            g = [str(d.index)]
            info.add_metric([str(d.index), d.name or "", d.uuid or "", d.backend or "", d.pci_bus_id or ""], 1)
            fams["lost"].add_metric(g, 1 if d.lost else 0)
            # An unknown value is left out, never exported as 0.
            for key, v in (("util", d.util_gpu), ("mem", d.memory_used), ("memt", d.memory_total),
                           ("temp", d.temperature), ("power", d.power_w), ("plim", d.power_limit_w)):
                if v is not None and not d.lost:
                    fams[key].add_metric(g, float(v))
        yield info
        yield from fams.values()

        pl = ["pid", "gpu", "name", "user", "ctx", "verdict"]
        pmem = GaugeMetricFamily("gputop_process_gpu_memory_bytes", "GPU memory held by a process on one GPU",
                                 labels=pl)
        psm = GaugeMetricFamily("gputop_process_sm_utilization_percent", "A process's SM utilisation on one GPU",
                                labels=pl)
        for h in snap.holders:
            for u in h.uses:
                labels = [str(h.pid), str(u.gpu), h.name, h.user or "", u.ctx, h.verdict.kind]
                if u.used_memory is not None:
                    pmem.add_metric(labels, float(u.used_memory))
                if u.sm_util is not None:
                    psm.add_metric(labels, float(u.sm_util))
        yield pmem
        yield psm
        yield GaugeMetricFamily("gputop_holders", "Processes holding a GPU", value=len(snap.holders))
        yield GaugeMetricFamily("gputop_orphan_trees", "Orphan trees holding a GPU", value=len(snap.roots))

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

        self.hits.update()
        hc = CounterMetricFamily("gputop_guard_hits", "Guard rule hits recorded in the hit log",
                                 labels=["rule", "action"])
        for (rule, action), n in sorted(self.hits.counts.items()):
            hc.add_metric([rule, action], n)
        yield hc
        try:
            from gputop.guard import state

            mode = state.get_mode()
            gm = GaugeMetricFamily("gputop_guard_mode", "The guard mode (1 for the current one)", labels=["mode"])
            for m in state.MODES:
                gm.add_metric([m], 1 if m == mode else 0)
            yield gm
        except Exception:
            pass
