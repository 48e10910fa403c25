"""Prometheus series of MIG devices (issue 30), labelled as DCGM exporter labels them: the parent GPU's
``gpu``, ``UUID``, ``modelName`` and ``Hostname``, plus ``GPU_I_ID`` and ``GPU_I_PROFILE``, so a dashboard
that joins gputop's series with DCGM's per-instance series joins on the same labels. ``mig_uuid`` (the MIG
device's own UUID) and ``GPU_CI_ID`` (its compute instance) tell instances of one GPU instance apart.
An unknown value (instance utilisation, which NVML answers NOT_SUPPORTED) is left out, never 0."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

MIG_LABELS = ["gpu", "UUID", "modelName", "Hostname", "GPU_I_ID", "GPU_I_PROFILE", "GPU_CI_ID", "mig_uuid"]
MIG_PROCESS_LABELS = ["pid", "name", "user", "ctx"] + MIG_LABELS


def _opt(v) -> str:
    return "" if v is None else str(v)


def mig_labels(snap, m, device_labels, host: str) -> list[str] | None:
    """One MIG device's labels: its parent's DCGM labels (``device_labels(parent, host)``), then its own."""
    parent = snap.device(m.gpu)
    if parent is None:
        return None
    return device_labels(parent, host) + [_opt(m.gpu_instance_id), m.profile or "", _opt(m.compute_instance_id),
                                          m.uuid or ""]


def mig_families(snap, host: str, device_labels):
    """The MIG series of a snapshot; none on a node without MIG devices."""
    info = GaugeMetricFamily("gputop_mig_info", "A MIG device (value 1)", labels=MIG_LABELS)
    used = GaugeMetricFamily("gputop_mig_memory_used_bytes", "Memory in use on a MIG device", labels=MIG_LABELS)
    total = GaugeMetricFamily("gputop_mig_memory_total_bytes", "A MIG device's memory size", labels=MIG_LABELS)
    util = GaugeMetricFamily("gputop_mig_utilization_ratio", "A MIG device's utilisation (0-1), where the "
                             "vendor gives it (NVML does not: the series is then absent)", labels=MIG_LABELS)
    holders = GaugeMetricFamily("gputop_mig_holders", "Processes holding a MIG device", labels=MIG_LABELS)
    pmem = GaugeMetricFamily("gputop_mig_process_gpu_memory_bytes", "GPU memory held by a process on a MIG "
                             "device", labels=MIG_PROCESS_LABELS)
    by_key = {}
    for m in getattr(snap, "instances", ()):
        labels = mig_labels(snap, m, device_labels, host)
        if labels is None:
            continue
        by_key[m.key] = labels
        info.add_metric(labels, 1)
        for fam, v in ((used, m.memory_used), (total, m.memory_total),
                       (util, None if m.util_gpu is None else m.util_gpu / 100.0)):
            if v is not None:
                fam.add_metric(labels, float(v))
        holders.add_metric(labels, len(snap.holders_on_instance(m)))
    for h in snap.holders:
        for u in h.uses:
            labels = by_key.get(u.instance_key)
            if labels is not None and u.used_memory is not None:
                pmem.add_metric([str(h.pid), h.name, h.user or "", u.ctx] + labels, float(u.used_memory))
    yield from (info, used, total, util, holders, pmem)
