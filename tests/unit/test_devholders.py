"""The device-file scan (gputop.core.devholders) over a fixture /proc: descriptors matched by st_rdev, maps
matched by the node's (st_dev, st_ino), and a process read again only when new or its descriptor count
changed (or on the full pass)."""

from __future__ import annotations

import os

import pytest

from gputop.core.devholders import DeviceScan

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a char device node needs root")
MINOR = 201


@pytest.fixture
def host(tmp_path):
    node = tmp_path / "dev" / "nvidia201"
    node.parent.mkdir()
    os.mknod(node, 0o666 | 0o020000, os.makedev(195, MINOR))
    other = tmp_path / "dev" / "null-ish"
    os.mknod(other, 0o666 | 0o020000, os.makedev(1, 3))
    regular = tmp_path / "dev" / "nvidia201.txt"
    regular.write_text("")
    proc = tmp_path / "proc"

    def process(pid: int, fds: dict[int, os.PathLike] = {}, maps: str = "") -> None:
        d = proc / str(pid) / "fd"
        d.mkdir(parents=True, exist_ok=True)
        for f in d.iterdir():
            f.unlink()
        for n, target in fds.items():
            (d / str(n)).symlink_to(target)
        (proc / str(pid) / "maps").write_text(maps)

    return node, other, regular, proc, process


def maps_line(path) -> str:
    st = os.stat(path)
    return (f"7f0000000000-7f0000001000 rw-s 00000000 {os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} "
            f"{st.st_ino}                    {path}\n")


def test_descriptors_match_by_device_number_and_maps_by_the_nodes_inode(host):
    """pid 100 holds the node; 101 a regular file named like it and an unrelated node; 102 maps it and holds
    nvidiactl; 104 maps it with no NVIDIA descriptor (not looked for: see the module's note)."""
    node, other, regular, proc, process = host
    process(100, {3: node, 4: other})
    process(101, {3: regular, 5: other})  # named like the node, a regular file: holds nothing
    ctl = node.parent / "nvidiactl"
    os.mknod(ctl, 0o666 | 0o020000, os.makedev(195, 255))
    # A mapping of the node, its descriptor closed, nvidiactl still open (as a CUDA process keeps it)
    process(102, {3: ctl}, maps="00400000-00401000 r-xp 00000000 08:01 1234 /usr/bin/python\n" + maps_line(node))
    process(104, {3: other}, maps=maps_line(node))  # no NVIDIA descriptor at all: its maps are not read
    scan = DeviceScan(str(proc), full_every=0)
    want = frozenset({os.makedev(195, MINOR)})
    scan.scan(want)  # the first pass learns the node's inode from pid 100's descriptor
    assert scan.scan(want) == {100: want, 102: want}


def test_a_process_is_read_again_only_when_new_or_its_descriptor_count_changed(host):
    node, other, _, proc, process = host
    process(100, {3: node})
    process(101, {3: other})
    want = frozenset({os.makedev(195, MINOR)})
    scan = DeviceScan(str(proc), full_every=3600)
    assert scan.scan(want) == {100: want} and scan.rescanned == 2
    assert scan.scan(want) == {100: want} and scan.rescanned == 0
    process(101, {3: other, 4: node})  # one more descriptor: read again
    assert scan.scan(want) == {100: want, 101: want} and scan.rescanned == 1
    process(100, {})  # closed: read again (count changed), no longer a holder
    assert scan.scan(want) == {101: want} and scan.rescanned == 1
    process(103, {7: node})  # new
    assert scan.scan(want) == {101: want, 103: want} and scan.rescanned == 1


def test_the_full_pass_catches_a_descriptor_swapped_at_the_same_count(host):
    node, other, _, proc, process = host
    process(100, {3: other})
    want = frozenset({os.makedev(195, MINOR)})
    now = [0.0]
    scan = DeviceScan(str(proc), full_every=30, clock=lambda: now[0])
    assert scan.scan(want) == {}
    process(100, {3: node})  # same count: not seen until the full pass
    now[0] = 10
    assert scan.scan(want) == {}
    now[0] = 31
    assert scan.scan(want) == {100: want}
