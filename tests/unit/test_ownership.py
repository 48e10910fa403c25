"""Cgroup ownership: every fixture layout parses to its owner; the readers; the owner cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gputop.core.ownership import (
    CONTAINER, NONE, POD, SERVICE, SESSION, SLURM, Owner, OwnerCache, SlurmEnv, parse_cgroup, parse_lines,
    read_owner, session_state, slurm_job_from_environ,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cgroup"
PID = 4242
C = "3f2a1b4c5d6e" + "7" * 52
POD_UID = "1a2b3c4d-1111-2222-3333-444455556666"


def owner_of(layout: str) -> Owner | None:
    base = FIXTURES / layout
    return read_owner(PID, str(base / "proc"), str(base / "run"))


# layout -> the fields its owner must have (all others at their defaults, except cgroup and label).
EXPECTED: dict[str, dict] = {
    "systemd-service": dict(kind=SERVICE, unit="foo.service"),
    "systemd-service-template": dict(kind=SERVICE, unit="trainer@gpu0.service"),
    "user-service": dict(kind=SERVICE, unit="train.service", manager="user@1000.service", uid=1000),
    "user-manager-scope": dict(kind=SERVICE, unit="user@1000.service", manager="user@1000.service", uid=1000),
    "login-service-ssh": dict(kind=SERVICE, unit="ssh.service"),
    "session-active": dict(kind=SESSION, session="12", uid=1000, session_state="active"),
    "session-online": dict(kind=SESSION, session="c3", uid=1000, session_state="online"),
    "session-closing": dict(kind=SESSION, session="12", uid=1000, session_state="closing"),
    "session-gone": dict(kind=SESSION, session="12", uid=1000, session_state="gone"),
    "session-no-logind": dict(kind=SESSION, session="12", uid=1000, session_state=None),
    "v1-hybrid-session": dict(kind=SESSION, session="12", uid=1000, session_state="closing"),
    "v1-hybrid-service": dict(kind=SERVICE, unit="foo.service"),
    "docker-systemd": dict(kind=CONTAINER, runtime="docker", container=C),
    "docker-cgroupfs": dict(kind=CONTAINER, runtime="docker", container=C),
    "containerd-colon": dict(kind=POD, pod=POD_UID, runtime="containerd", container=C, unit="containerd.service"),
    "containerd-nerdctl": dict(kind=CONTAINER, runtime="containerd", container=C),
    "crio-systemd": dict(kind=CONTAINER, runtime="cri-o", container=C),
    "crio-conmon": dict(kind=CONTAINER, runtime="cri-o", container=C),
    "podman": dict(kind=CONTAINER, runtime="podman", container=C),
    "podman-rootless": dict(kind=CONTAINER, runtime="podman", container=C, unit="user@1000.service",
                            manager="user@1000.service", uid=1000),
    "kubepods-systemd": dict(kind=POD, pod=POD_UID, runtime="containerd", container=C),
    "kubepods-systemd-guaranteed-crio": dict(kind=POD, pod=POD_UID, runtime="cri-o", container=C),
    "kubepods-kind": dict(kind=POD, pod=POD_UID, runtime="containerd", container=C),
    "kubepods-cgroupfs": dict(kind=POD, pod=POD_UID, container=C),
    "kubepods-cgroupfs-guaranteed": dict(kind=POD, pod=POD_UID, container=C),
    "slurm-v1": dict(kind=SLURM, job=42, step="0", uid=1000, unit="slurmd.service"),
    "slurm-v1-host": dict(kind=SLURM, job=43, step="batch", uid=1001),
    "slurm-v2": dict(kind=SLURM, job=44, step="0"),
    "slurm-v2-extern": dict(kind=SLURM, job=45, step="extern"),
    "slurm-v2-stepd": dict(kind=NONE),  # slurmstepd itself, no job below the scope
    "plain-v2": dict(kind=NONE),
    "plain-v1": dict(kind=NONE),
    "sandbox-v1": dict(kind=NONE),
    # A user names cgroups in their delegated subtree: no session, job or unit name comes from there.
    "user-delegated-lies": dict(kind=SERVICE, unit="user@1000.service", manager="user@1000.service", uid=1000),
}

LABELS = {
    "systemd-service": "foo.service",
    "user-service": "train.service (user 1000)",
    "session-closing": "session 12 closing",
    "session-no-logind": "session 12",
    "docker-systemd": "docker 3f2a1b4c5d6e",
    "kubepods-systemd": "pod 1a2b3c4d/3f2a1b4c5d6e",
    "slurm-v1": "slurm 42.0",
    "slurm-v1-host": "slurm 43.batch",
    "plain-v2": "-",
}


def test_every_fixture_has_an_expectation():
    on_disk = {p.name for p in FIXTURES.iterdir() if p.is_dir()}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("layout", sorted(EXPECTED))
def test_fixture_layout_parses_to_its_owner(layout):
    owner = owner_of(layout)
    assert owner is not None
    want = dict(EXPECTED[layout])
    got = {k: v for k, v in owner.to_dict().items() if k not in ("cgroup", "label")}
    defaults = {k: v for k, v in Owner(NONE).to_dict().items() if k not in ("cgroup", "label")}
    assert got == {**defaults, **want}
    if layout in LABELS:
        assert owner.label == LABELS[layout]
    # Nothing a process or user controls reaches a label or a sentence raw.
    assert all(c.isprintable() for c in owner.label + owner.describe())


def test_owner_records_the_path_it_came_from():
    assert owner_of("slurm-v1").cgroup == "/slurm/uid_1000/job_42/step_0/task_0"
    assert owner_of("systemd-service").cgroup == "/system.slice/foo.service"
    assert "\x1b" in owner_of("user-delegated-lies").cgroup  # JSON keeps the exact value


def test_login_services_are_marked():
    assert owner_of("login-service-ssh").login_service
    assert not owner_of("systemd-service").login_service
    for unit in ("sshd.service", "cron.service", "getty@tty1.service", "slurmd.service",
                 "sshd@3-10.0.0.1:22-10.0.0.2:51234.service"):
        assert parse_cgroup(f"0::/system.slice/{unit}\n").login_service, unit
    assert not parse_cgroup("0::/system.slice/sshguard.service\n").login_service


def test_describe_reads_like_a_sentence():
    assert owner_of("session-closing").describe() == "login session 12 of uid 1000: logind says closing"
    assert owner_of("session-gone").describe().endswith("logind no longer knows it")
    assert owner_of("user-service").describe() == (
        "systemd unit train.service, run by the systemd user manager of uid 1000 (user@1000.service)")
    assert owner_of("slurm-v1").describe() == "Slurm job 42, step 0 (uid 1000)"
    assert owner_of("kubepods-cgroupfs").describe() == f"Kubernetes pod {POD_UID}, container {C}"


def test_parse_lines_keeps_colons_in_paths_and_skips_garbage():
    text = "1:name=systemd:/a:b:c\n0::/x\nnot a line\n3:cpu:relative\n"
    assert parse_lines(text) == [("name=systemd", "/a:b:c"), ("", "/x")]


def test_name_systemd_wins_over_unified_when_both_say_something():
    text = "1:name=systemd:/system.slice/a.service\n0::/system.slice/b.service\n"
    assert parse_cgroup(text).unit == "a.service"
    # v1 name=systemd at the root (no systemd): the unified line is used.
    assert parse_cgroup("1:name=systemd:/\n0::/system.slice/b.service\n").unit == "b.service"


def test_docker_cgroupfs_needs_a_full_id():
    assert parse_cgroup("0::/docker/abc\n").kind == NONE
    assert parse_cgroup("0::/docker/" + "a" * 63 + "\n").kind == NONE


def test_session_scope_only_directly_in_a_user_slice():
    assert parse_cgroup("0::/system.slice/session-3.scope\n").kind == NONE
    assert parse_cgroup("0::/user.slice/user-7.slice/session-3.scope\n").session == "3"


def test_slurm_v1_only_at_the_hierarchy_root():
    assert parse_cgroup("4:freezer:/x/slurm/uid_1/job_2/step_0\n").kind == NONE
    assert parse_cgroup("4:freezer:/slurm/uid_1/job_2\n").job == 2  # no step yet (the job's own cgroup)


def test_unreadable_cgroup_is_none(tmp_path):
    assert read_owner(PID, str(tmp_path)) is None
    (tmp_path / str(PID)).mkdir()
    (tmp_path / str(PID) / "cgroup").write_text("")
    assert read_owner(PID, str(tmp_path)) is None  # empty: no cgroup support (or a kernel thread race)


def test_session_state_values(tmp_path):
    assert session_state("1", str(tmp_path)) is None  # no logind here
    d = tmp_path / "systemd" / "sessions"
    d.mkdir(parents=True)
    assert session_state("1", str(tmp_path)) == "gone"
    (d / "1").write_text("UID=0\nSTATE=closing\n")
    assert session_state("1", str(tmp_path)) == "closing"
    (d / "2").write_text("UID=0\n")
    assert session_state("2", str(tmp_path)) is None
    (d / "3").write_text("STATE=\x1b[2J\n")
    assert session_state("3", str(tmp_path)) is None
    assert session_state("../../etc", str(tmp_path)) is None  # an id never leaves the directory


def test_slurm_job_from_environ_fixtures():
    assert slurm_job_from_environ(PID, str(FIXTURES / "slurm-v2" / "proc")) == SlurmEnv(44, 1000, "0")
    assert slurm_job_from_environ(PID, str(FIXTURES / "slurm-v1" / "proc")) == SlurmEnv(42, 1000, "batch")
    assert slurm_job_from_environ(PID, str(FIXTURES / "plain-v2" / "proc")) is None  # no environ file


def test_slurm_job_from_environ_rejects_junk(tmp_path):
    d = tmp_path / str(PID)
    d.mkdir()
    for raw, want in [
        (b"SLURM_JOB_ID=abc\0", None),
        (b"SLURM_JOB_ID=\0", None),
        (b"XSLURM_JOB_ID=5\0", None),
        (b"SLURM_JOB_ID=5\0SLURM_JOB_UID=x\0SLURM_STEP_ID=\x1b\0", SlurmEnv(5)),
        (b"SLURM_JOB_ID=5\0SLURM_JOB_ID=6\0", SlurmEnv(5)),  # the first one, as getenv
        (b"", None),
    ]:
        (d / "environ").write_bytes(raw)
        assert slurm_job_from_environ(PID, str(tmp_path)) == want, raw


def test_real_process_cgroup_reads():
    """This process's own /proc/PID/cgroup parses (whatever this machine's layout is)."""
    if not os.path.exists(f"/proc/{os.getpid()}/cgroup"):
        pytest.skip("no /proc/PID/cgroup here")
    owner = read_owner(os.getpid())
    assert owner is not None and owner.kind in (SERVICE, SESSION, CONTAINER, POD, SLURM, NONE)
    assert read_owner(2**22 + 7) is None  # no such process


def test_cache_rereads_after_ttl_and_checks_identity(tmp_path):
    d = tmp_path / str(PID)
    d.mkdir()
    (d / "cgroup").write_text("0::/system.slice/a.service\n")
    now = [0.0]
    starts = {PID: 100.0}
    cache = OwnerCache(str(tmp_path), str(tmp_path), ttl=5.0, start_of=starts.get, clock=lambda: now[0])
    assert cache.get(PID, 100.0).unit == "a.service"
    (d / "cgroup").write_text("0::/system.slice/b.service\n")
    cache.prune()  # the sampler prunes after each sample
    now[0] = 4.0
    assert cache.get(PID, 100.0).unit == "a.service"  # cached
    cache.prune()
    now[0] = 5.5
    assert cache.get(PID, 100.0).unit == "b.service"  # re-read
    # The PID now names a process that started later: the old identity gets no owner.
    starts[PID] = 200.0
    assert cache.get(PID, 100.0 + 0.01) is None
    cache.prune()
    cache.prune()
    assert cache._entries == {}


def test_cache_with_ttl_zero_reads_once_per_sample(tmp_path):
    d = tmp_path / str(PID)
    d.mkdir()
    (d / "cgroup").write_text("0::/system.slice/a.service\n")
    cache = OwnerCache(str(tmp_path), str(tmp_path), ttl=0)
    assert cache.get(PID, 1.0).unit == "a.service"
    (d / "cgroup").write_text("0::/system.slice/b.service\n")
    assert cache.get(PID, 1.0).unit == "a.service"  # same sample
    cache.prune()
    assert cache.get(PID, 1.0).unit == "b.service"  # next sample


def test_read_bytes_stops_at_a_short_read_and_reads_a_long_file_whole(tmp_path, monkeypatch):
    from gputop.core import ownership

    big = tmp_path / "big"
    big.write_bytes(b"x" * 200_000)
    assert ownership._read_bytes(str(big), limit=1 << 20) == b"x" * 200_000  # several reads
    assert ownership._read_bytes(str(big), limit=70_000) == b"x" * 70_000
    assert ownership._read_bytes(str(big)) == b"x" * ownership._MAX_READ
    small = tmp_path / "small"
    small.write_bytes(b"0::/user.slice\n")
    reads = []
    real = os.read
    monkeypatch.setattr(ownership.os, "read", lambda fd, n: reads.append(n) or real(fd, n))
    assert ownership._read_bytes(str(small)) == b"0::/user.slice\n"
    assert len(reads) == 1  # no second read to see the end


def test_a_sample_that_failed_before_its_prune_leaves_nothing_unchecked(tmp_path):
    d = tmp_path / str(PID)
    d.mkdir()
    (d / "cgroup").write_text("0::/system.slice/a.service\n")
    cache = OwnerCache(str(tmp_path), str(tmp_path), ttl=0)
    cache.begin()
    assert cache.get(PID, 1.0).unit == "a.service"
    (d / "cgroup").write_text("0::/system.slice/b.service\n")  # that sample raised: no prune()
    cache.begin()
    assert cache.get(PID, 1.0).unit == "b.service"


def test_a_pinned_cgroup_is_taken_only_for_its_own_identity(tmp_path):
    # The process layer hands over cgroup bytes it read through a dir pinned to (pid, start). They
    # answer for that identity alone; another start time (a reused PID) is read by path and checked.
    d = tmp_path / str(PID)
    d.mkdir()
    (d / "cgroup").write_text("0::/system.slice/by-path.service\n")
    starts = {PID: 200.0}
    cache = OwnerCache(str(tmp_path), str(tmp_path), ttl=5.0, start_of=starts.get)
    cache.pinned = {(PID, 100.0): b"0::/system.slice/pinned.service\n"}
    assert cache.get(PID, 200.0).unit == "by-path.service"
    assert cache.get(PID, 100.0).unit == "pinned.service"  # no start check: it was read from that process
    assert cache.pinned == {}  # taken once
    cache.prune()
    (d / "cgroup").write_text("0::/system.slice/moved.service\n")
    cache.pinned[(PID, 200.0)] = b"0::/system.slice/moved.service\n"
    assert cache.get(PID, 200.0).unit == "moved.service"  # fresh bytes win over a fresh entry
