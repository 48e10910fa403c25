"""The helpers that keep tests apart when they run in parallel (docs/testing.md, "Writing tests that run in
parallel"): each fails on the helper as it was before the suite ran under pytest-xdist."""

from __future__ import annotations

import os
import pwd
import shutil
import threading

import pytest

from tests.conftest import Procs, add_user, del_user, unique_name


def test_wait_for_takes_this_tests_process_not_anothers_with_the_same_command_line(procs):
    # Another test (another Procs) runs the same command first: a lower PID, found first by a /proc scan.
    other = Procs()
    try:
        theirs = other.spawn(["sleep", "7301"])
        mine = procs.spawn(["sleep", "7301"])
        assert procs.wait_for("sleep 7301") == mine.pid
        assert other.wait_for("sleep 7301") == theirs.pid
    finally:
        other.cleanup()


def test_an_orphan_is_found_by_the_test_that_made_it(procs):
    other = Procs()
    try:
        theirs = other.orphan("sleep 7302", "sleep 7302")
        mine = procs.orphan("sleep 7302", "sleep 7302")
        assert mine != theirs
        assert os.getsid(mine) != os.getsid(theirs)  # two sessions, each test its own
    finally:
        other.cleanup()


def test_no_terminal_size_comes_from_the_environment():
    # xdist's workers have COLUMNS and LINES: a TUI started from a test would never see a resize.
    assert "COLUMNS" not in os.environ and "LINES" not in os.environ


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"), reason="needs root and useradd")
def test_users_added_at_once_all_exist_then_are_removed():
    # Four at once contend for the passwd lock (useradd exit 10): add_user retries.
    names = [unique_name(f"gtpar{i}") for i in range(4)]
    errors: list[BaseException] = []

    def add(name: str) -> None:
        try:
            add_user(name)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=add, args=(n,)) for n in names]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert len({pwd.getpwnam(n).pw_uid for n in names}) == 4
    finally:
        for n in names:
            del_user(n)
    for n in names:
        with pytest.raises(KeyError):
            pwd.getpwnam(n)
