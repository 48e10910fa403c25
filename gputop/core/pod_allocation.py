"""Kubernetes: which pod each GPU is allocated to (the kubelet's pod-resources API), and each holder's
standing from its container's cgroup. No UI imports; grpc is imported only here and only when the
kubelet's socket is there (the optional extra ``gputop[k8s]``).

- The allocation: ``v1.PodResourcesLister/List`` on the kubelet's Unix socket
  (``/var/lib/kubelet/pod-resources/kubelet.sock``; ``$GPUTOP_POD_RESOURCES_SOCKET``) names the device ids
  of each pod's containers. An NVIDIA device id is the GPU's UUID, with ``::N`` appended for a shared
  (time-sliced) replica; a GPU is matched by UUID, and a GPU two pods share is allocated to both. One call
  per refresh, cached, with a timeout.
- A holder's pod: the pod UID of its cgroup (gputop.core.ownership; the kernel's word) named through
  the kubelet's pod log directories, ``/var/log/pods/<namespace>_<pod>_<uid>`` (``$GPUTOP_POD_LOG_ROOT``),
  which the kubelet makes as root and no container mounts. A process's own claims (its hostname, its
  environment, /etc/hosts, which a container may rewrite) are never used.
- Standing as for Slurm (gputop.core.allocation), with "pod" for "job", at pod level: any container of
  the pod the GPU is allocated to is inside.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable

from gputop.core.allocation import (
    Allocation, AllocationView, IdleTracker, Standing, UNKNOWN, gpu_standing, worst,
)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_POD_LOGS = "/var/log/pods"
DEFAULT_TIMEOUT = 2.0
MAX_PODS = 10000  # pod log directories read at most


def socket_path() -> str:
    return os.environ.get("GPUTOP_POD_RESOURCES_SOCKET") or DEFAULT_SOCKET


def pod_log_root() -> str:
    return os.environ.get("GPUTOP_POD_LOG_ROOT") or DEFAULT_POD_LOGS


@dataclass(frozen=True)
class PodDevice:
    """One device id the kubelet assigned to a container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.pod}"

    @property
    def uuid(self) -> str:
        """The GPU UUID: a time-sliced replica's id is ``UUID::N``."""
        return self.device_id.split("::", 1)[0]


def list_devices(path: str, timeout: float = DEFAULT_TIMEOUT) -> list[PodDevice]:
    """Every (pod, container, device id) of ``v1.PodResourcesLister/List`` on the Unix socket ``path``.
    Raises RuntimeError (one line) when grpc is missing or the call fails."""
    # gRPC's fork handlers abort a process that forks while gRPC's threads run ("epoll_wait error: Bad file
    # descriptor", SIGABRT), and gputop forks (scontrol, ssh) from a process that read the kubelet; its
    # children exec at once and never use gRPC, so the handlers are not wanted. Read when grpc is imported.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    try:
        import grpc

        from gputop.core.podresources_v1 import api_pb2, api_pb2_grpc
    except ImportError as e:
        raise RuntimeError(f"the kubelet's pod-resources socket is there but grpc is not installed "
                           f"({e.name}): pip install 'gputop[k8s]'") from None
    try:
        with grpc.insecure_channel(f"unix://{path}") as channel:
            resp = api_pb2_grpc.PodResourcesListerStub(channel).List(api_pb2.ListPodResourcesRequest(),
                                                                      timeout=timeout)
    except grpc.RpcError as e:
        code = e.code().name if hasattr(e, "code") and e.code() is not None else "error"
        raise RuntimeError(f"pod-resources List on {path} failed: {code}") from None
    out = []
    for p in resp.pod_resources:
        for c in p.containers:
            for d in c.devices:
                for dev_id in d.device_ids:
                    out.append(PodDevice(p.namespace, p.name, c.name, d.resource_name, dev_id))
    return out


def pod_names(root: str) -> dict[str, tuple[str, str]]:
    """pod UID -> (namespace, name), from the kubelet's ``<namespace>_<name>_<uid>`` log directories
    (namespace and pod names are DNS labels: no ``_``). As root, only a root-owned directory that no one
    else may write is read (a user could otherwise make entries)."""
    try:
        st = os.stat(root)
        if os.geteuid() == 0 and (st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
            return {}
        names = os.listdir(root)[:MAX_PODS]
    except OSError:
        return {}
    out = {}
    for n in names:
        parts = n.split("_")
        if len(parts) == 3 and all(parts):
            out[parts[2]] = (parts[0], parts[1])
    return out


@dataclass(frozen=True)
class PodRead:
    devices: tuple[PodDevice, ...]
    error: str | None = None


class PodAllocations:
    """The node's GPU allocation from the kubelet, read once per refresh (``ttl``) with a timeout."""

    def __init__(self, *, ttl: float = 1.0, timeout: float = DEFAULT_TIMEOUT,
                 clock: Callable[[], float] = time.monotonic):
        self.ttl, self.timeout, self.clock = ttl, timeout, clock
        self._cache: tuple[float, PodRead] | None = None
        self._lock = threading.Lock()
        self.idle = IdleTracker()

    @property
    def available(self) -> bool:
        """A kubelet pod-resources socket is there (looked at each refresh: the kubelet may start later)."""
        try:
            return stat.S_ISSOCK(os.stat(socket_path()).st_mode)
        except OSError:
            return False

    def read(self) -> PodRead:
        now = self.clock()
        with self._lock:
            if self._cache is not None and now - self._cache[0] < self.ttl:
                return self._cache[1]
            try:
                got = PodRead(tuple(list_devices(socket_path(), self.timeout)))
            except RuntimeError as e:
                got = PodRead((), str(e))
            self._cache = (now, got)
            return got

    def view(self, devices, holders, now: float) -> AllocationView:
        read = self.read()
        by_gpu, unmapped = place_pods(read.devices, devices)
        names = pod_names(pod_log_root())
        known = read.error is None
        standings = {h.pid: pod_standing(h, by_gpu, names, known) for h in holders}
        idle = self.idle.update(by_gpu, {g for h in holders for g in h.gpus}, now)
        return AllocationView("kubernetes", by_gpu, standings, idle, read.error, unmapped)


def place_pods(pod_devices, devices) -> tuple[dict, tuple[str, ...]]:
    """The pods' device ids onto this node's GPUs by UUID: GPU -> Allocation (every pod that shares it)."""
    by_uuid = {d.uuid: d.index for d in devices if d.uuid}
    pods: dict[int, list[PodDevice]] = {}
    unmapped = []
    for pd in pod_devices:
        g = by_uuid.get(pd.uuid)
        if g is None:
            if pd.uuid.startswith(("GPU-", "MIG-")):
                unmapped.append(f"pod {pd.label} container {pd.container}: {pd.device_id} is no GPU here")
            continue  # another kind of device (a NIC, an FPGA): not a GPU
        pods.setdefault(g, []).append(pd)
    by_gpu = {}
    for g, pds in pods.items():
        labels = tuple(dict.fromkeys(p.label for p in pds))
        detail = "; ".join(f"{p.label} container {p.container} ({p.resource} {p.device_id})" for p in pds)
        by_gpu[g] = Allocation(g, labels[0], None, None, None, None, "kubernetes", detail,
                               labels if len(labels) > 1 else ())
    return by_gpu, tuple(unmapped)


def holder_pod(holder, names: dict[str, tuple[str, str]]) -> tuple[str | None, bool]:
    """(namespace/pod of the holder's cgroup, or None; whether that is known): a process in no pod is
    known to be in none; one in a pod whose UID the kubelet's log directories do not name is unknown."""
    owner = holder.owner
    uid = owner.pod if owner is not None and owner.kind == "pod" else None
    if owner is None:
        return None, False
    if uid is None:
        return None, True
    ns_name = names.get(uid)
    return (f"{ns_name[0]}/{ns_name[1]}", True) if ns_name else (None, False)


def pod_standing(holder, by_gpu: dict, names: dict[str, tuple[str, str]], allocation_known: bool) -> Standing:
    if holder.proc is None:
        return Standing(UNKNOWN, "the process is not visible here")
    pod, known = holder_pod(holder, names)
    return worst([gpu_standing(g, by_gpu.get(g), pod, known, None, allocation_known, "pod") for g in holder.gpus],
                 pod)
