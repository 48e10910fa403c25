"""Kubernetes allocation (issue 29) against a stand-in kubelet: a real gRPC server speaking the published
v1 PodResourcesLister (the vendored api.proto) on a Unix socket, two pods that share one GPU, and real
processes in real kubepods cgroups (made by the test, as root) holding simulated GPUs. The kubelet's pod
log directories (``namespace_pod_uid``) are a fixture directory ($GPUTOP_POD_LOG_ROOT)."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from concurrent import futures

import pytest

from tests.conftest import run_gputop
from tests.functional.test_ownership_cgroups import Cgroups

# The stand-in kubelet runs in this test process: with gRPC's fork handlers on, a later fork by any test
# of this worker (subprocess) aborted the child (SIGABRT, "epoll_wait error: Bad file descriptor").
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
grpc = pytest.importorskip("grpc", reason="the k8s extra (grpcio) is not installed")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="needs root on Linux to make cgroups")

UUID = "GPU-5140a7ed-0000-4000-8000-{:012d}"  # the simulated backend's UUIDs


def kubelet(sock: str, pods: list[tuple[str, str, str, list[str]]], delay: float = 0.0):
    """A stand-in kubelet: v1.PodResourcesLister/List answers ``pods`` (namespace, pod, container, ids)."""
    from gputop.core.podresources_v1 import api_pb2 as pb, api_pb2_grpc as pbg

    class Lister(pbg.PodResourcesListerServicer):
        def List(self, request, context):
            time.sleep(delay)
            out = pb.ListPodResourcesResponse()
            for ns, name, container, ids in pods:
                p = out.pod_resources.add(name=name, namespace=ns)
                c = p.containers.add(name=container)
                c.devices.add(resource_name="nvidia.com/gpu", device_ids=[i for i in ids if i.startswith("GPU-")])
                c.devices.add(resource_name="example.com/nic", device_ids=[i for i in ids if not i.startswith("GPU-")])
            return out

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pbg.add_PodResourcesListerServicer_to_server(Lister(), server)
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    return server


@pytest.fixture
def cgroups():
    c = Cgroups()
    yield c
    c.cleanup()


def in_pod(cgroups: Cgroups, pid: int, pod_uid: str) -> None:
    cid = uuid.uuid4().hex * 2  # a 64-hex container id
    cgroups.move("freezer", f"{cgroups.tag}/kubepods/besteffort/pod{pod_uid}/{cid}", pid)


def test_pods_sharing_a_gpu_their_processes_and_squatters(procs, scenario, cgroups, tmp_path):
    a_uid, b_uid, lost_uid = (str(uuid.uuid4()) for _ in range(3))
    logs = tmp_path / "pods"
    logs.mkdir(mode=0o755)
    for ns, name, uid in (("ml", "train-a", a_uid), ("ml", "train-b", b_uid)):
        (logs / f"{ns}_{name}_{uid}").mkdir()
    sock = str(tmp_path / "kubelet.sock")
    # GPU 0 is time-sliced between pod a and pod b; GPU 1 is b's; GPU 2 and 3 are no pod's.
    server = kubelet(sock, [("ml", "train-a", "main", [UUID.format(0) + "::0", "nic-3"]),
                            ("ml", "train-b", "worker", [UUID.format(0) + "::1", UUID.format(1)])])
    try:
        a, a2, b, b2, host, lost = (procs.sleeper(n).pid for n in ("pa", "pa2", "pb", "pb2", "host", "lost"))
        for pid, uid in ((a, a_uid), (a2, a_uid), (b, b_uid), (b2, b_uid), (lost, lost_uid)):
            in_pod(cgroups, pid, uid)
        scenario([{"pid": a, "gpu": 0, "memory": "1GiB"}, {"pid": b, "gpu": 1, "memory": "1GiB"},
                  {"pid": a2, "gpu": 1, "memory": "1GiB"}, {"pid": host, "gpu": 0, "memory": "1GiB"},
                  {"pid": b2, "gpu": 2, "memory": "1GiB"}, {"pid": lost, "gpu": 3, "memory": "1GiB"}], gpus=4)
        env = {"GPUTOP_POD_RESOURCES_SOCKET": sock, "GPUTOP_POD_LOG_ROOT": str(logs), "SLURM_CONF": "/nonexistent"}
        p = run_gputop("status", "--json", env=env)
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
    finally:
        server.stop(0).wait(10)  # its threads gone before this worker forks again
    alloc = {g["index"]: g["allocation"] for g in doc["gpu"]["gpus"]}
    assert alloc[0]["members"] == ["ml/train-a", "ml/train-b"] and alloc[0]["source"] == "kubernetes"
    assert alloc[1]["members"] == ["ml/train-b"] and "container worker" in alloc[1]["detail"]
    assert alloc[2] is None and alloc[3] is None and doc["allocation"]["source"] == "kubernetes"
    st = {h["pid"]: h["standing"] for h in doc["holders"]}
    assert st[a]["kind"] == "inside" and st[a]["job"] == "ml/train-a"  # on the GPU it shares with b
    assert st[b]["kind"] == "inside"
    assert st[a2]["kind"] == "squatter" and "pod ml/train-a's process on GPU 1" in st[a2]["reason"]
    assert st[host]["kind"] == "squatter" and "a process of no pod" in st[host]["reason"]
    assert st[b2]["kind"] == "outside"
    assert st[lost]["kind"] == "unknown", st[lost]  # a pod the kubelet's directories do not name


def test_a_kubelet_that_does_not_answer_in_time_makes_the_allocation_unknown(procs, scenario, cgroups, tmp_path):
    sock = str(tmp_path / "kubelet.sock")
    server = kubelet(sock, [("ml", "slow", "main", [UUID.format(0)])], delay=5.0)
    try:
        pid = procs.sleeper("slowpod").pid
        scenario([{"pid": pid, "gpu": 0, "memory": "1GiB"}], gpus=1)
        t0 = time.monotonic()
        p = run_gputop("status", "--json", env={"GPUTOP_POD_RESOURCES_SOCKET": sock, "SLURM_CONF": "/nonexistent",
                                               "GPUTOP_POD_LOG_ROOT": str(tmp_path)})
        took = time.monotonic() - t0
    finally:
        server.stop(0).wait(10)  # its threads gone before this worker forks again
    doc = json.loads(p.stdout)
    assert "DEADLINE_EXCEEDED" in doc["allocation"]["error"] and took < 5
    assert doc["holders"][0]["standing"]["kind"] == "unknown"
    assert any("GPU allocation unknown" in w for w in doc["warnings"])
