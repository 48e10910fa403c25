"""Reading one process from a /proc tree written in the kernel's format (no live processes)."""

from __future__ import annotations

from gputop.core.procs import read_proc

PF_KTHREAD = 0x00200000


def _proc(root, pid: int, comm: str, ppid: int, flags: int, argv: list[str]) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    fields = ["S", ppid, pid, pid, 0, -1, flags, 0, 0, 0, 0, 100, 100, 0, 0, 20, 0, 1, 0, 5000, 0, 0] + [0] * 30
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(map(str, fields)) + "\n")
    (d / "cmdline").write_text("".join(a + "\0" for a in argv))
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t0\t0\t0\t0\nSigIgn:\t0000000000000000\n")


def test_kernel_threads_are_known_by_pf_kthread_not_by_their_parent(tmp_path):
    (tmp_path / "stat").write_text("cpu  1 0 1 1 0 0 0 0 0 0\nbtime 1700000000\n")
    _proc(tmp_path, 2, "kthreadd", 0, 0x00208040, [])
    _proc(tmp_path, 9, "kworker/0:1", 2, 0x04208060, [])
    # In a PID namespace (a container, `unshare --pid`), PID 2 is an ordinary process, and so are its
    # children: they must not be refused as kernel threads.
    _proc(tmp_path, 3, "python", 2, 0x00400100, ["python", "train.py"])
    root = str(tmp_path)
    assert read_proc(2, root).kthread and read_proc(9, root).kthread
    assert not read_proc(3, root).kthread
    assert read_proc(3, root).cmdline == ("python", "train.py")
