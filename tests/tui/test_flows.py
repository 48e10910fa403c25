"""Pilot tests, one per flow, on real processes (only the GPU is simulated)."""

from __future__ import annotations

import sys

import psutil

from gputop.tui.process_tree import ProcessTree
from tests.conftest import wait_gone
from tests.functional.names_helpers import spawn_named
from tests.tui.helpers import audit_records, open_app, run_async, screen_text, wait_row, wait_screen, wait_until


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _open_kill_dialog(pilot, gpu: int, pid: int) -> None:
    assert await wait_row(pilot, f"gpu{gpu}/{pid}")
    assert pilot.app.select_key(f"gpu{gpu}/{pid}")
    await pilot.press("k")
    assert await wait_screen(pilot, "KillDialog")
    assert pilot.app.screen.focused.id == "cancel"  # every dialog starts on Cancel


@run_async
async def test_confirming_a_kill_makes_the_process_die(procs, scenario):
    victim = procs.sleeper("victimproc")
    bystander = procs.sleeper("bystander")
    path = scenario([{"pid": victim.pid, "gpu": 0, "memory": "4GiB"},
                     {"pid": bystander.pid, "gpu": 1, "memory": "2GiB"}])
    app = open_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_kill_dialog(pilot, 0, victim.pid)
        await pilot.press("tab", "enter")  # Cancel -> TERM
        assert await wait_until(pilot, lambda: victim.poll() is not None, timeout=10)
        assert await wait_until(pilot, lambda: f"gpu0/{victim.pid}" not in app.query_one(ProcessTree).nodes_by_key)
        assert await wait_until(pilot, lambda: any("done" in (n.title or "") for n in app._notifications))
    assert alive(bystander.pid)
    recs = audit_records("kill")
    assert any(r.get("face") == "tui" and r.get("ok") for r in recs), recs


@run_async
async def test_cancelling_a_kill_leaves_the_process_alive(procs, scenario):
    victim = procs.sleeper("victimproc")
    path = scenario([{"pid": victim.pid, "gpu": 0, "memory": "4GiB"}])
    app = open_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_kill_dialog(pilot, 0, victim.pid)
        await pilot.press("escape")
        assert await wait_until(pilot, lambda: type(app.screen).__name__ != "KillDialog")
        # Enter on the focused Cancel button cancels too.
        assert app.select_key(f"gpu0/{victim.pid}")
        await pilot.press("k")
        assert await wait_screen(pilot, "KillDialog")
        await pilot.press("enter")
        assert await wait_until(pilot, lambda: type(app.screen).__name__ != "KillDialog")
        await pilot.pause(0.5)
    assert victim.poll() is None and alive(victim.pid)
    assert audit_records("kill") == []


@run_async
async def test_reap_removes_the_whole_tree(procs, scenario, tmp_path):
    # A retry loop (the orphan root) restarting a python worker (the GPU holder), as a real orphan.
    worker = tmp_path / "reapholder"
    worker.symlink_to(sys.executable)
    holder = procs.orphan(f"sh -c 'while :; do {worker} -c \"import time; time.sleep(600)\"; "
                          f"sleep 1; done'", marker=str(worker))
    root = psutil.Process(holder).ppid()
    assert root > 1
    bystander = procs.sleeper("bystander")
    path = scenario([{"pid": holder, "gpu": 0, "memory": "8GiB"},
                     {"pid": bystander.pid, "gpu": 1, "memory": "2GiB"}])
    app = open_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_row(pilot, f"gpu0/{holder}")
        h = app.snapshot.holder(holder)
        assert h.verdict.kind == "orphan" and h.verdict.root == root
        assert app.select_key(f"gpu0/{holder}")
        await pilot.press("r")
        assert await wait_screen(pilot, "ReapDialog")
        dialog = app.screen
        assert dialog.focused.id == "cancel"
        assert {root, holder} <= {m.pid for m in dialog.orphan_tree.members}
        await pilot.press("tab", "enter")
        assert await wait_until(pilot, lambda: wait_gone(root, 0.01) and wait_gone(holder, 0.01), timeout=15)
        # The result is logged (face "tui") and shown once the action has finished.
        assert await wait_until(pilot, lambda: any(r.get("face") == "tui" for r in audit_records("reap")))
        assert await wait_until(pilot, lambda: any("reap done" in (n.title or "") for n in app._notifications))
    assert alive(bystander.pid)


@run_async
async def test_readonly_makes_no_action_possible(procs, scenario):
    victim = procs.sleeper("victimproc")
    path = scenario([{"pid": victim.pid, "gpu": 0, "memory": "4GiB"}])
    app = open_app(path, readonly=True)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_row(pilot, f"gpu0/{victim.pid}")
        assert app.select_key(f"gpu0/{victim.pid}")
        for key in ("k", "r", "R", "g"):
            await pilot.press(key)
            await pilot.pause(0.2)
            assert type(app.screen).__name__ == "MainScreen", key
        for action in ("kill", "reap", "reset", "guard"):
            assert app.check_action(action, ()) is False
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert not any(t.startswith(("Kill", "Reap", "Reset", "Guard")) for t in titles), titles
        shown = {ab.binding.action for ab in app.screen.active_bindings.values() if ab.enabled}
        assert "help" in shown and not shown & {"kill", "reap", "reset", "guard"}, shown
        text = screen_text(app)
        assert "READ-ONLY" in text and "Kill" not in text and "Reap" not in text
        # Called directly, the actions still refuse.
        await app.run_action("screen.kill")
        await pilot.pause(0.3)
        assert type(app.screen).__name__ == "MainScreen"
    assert alive(victim.pid)
    assert audit_records() == []


@run_async
async def test_guard_toggle_changes_the_mode(scenario, procs):
    from gputop.guard import state as guard_state

    victim = procs.sleeper("victimproc")
    path = scenario([{"pid": victim.pid, "gpu": 0, "memory": "4GiB"}])
    assert guard_state.get_mode() == "off"
    app = open_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_until(pilot, lambda: app.snapshot is not None and app.panel.guard_available)
        await pilot.press("g")
        assert await wait_screen(pilot, "GuardToggleDialog")
        assert app.screen.target == "dry-run" and app.screen.focused.id == "cancel"
        await pilot.press("tab", "enter")
        assert await wait_until(pilot, lambda: guard_state.get_mode() == "dry-run")
        assert await wait_until(pilot, lambda: app.panel.guard_mode == "dry-run")
    assert alive(victim.pid)


@run_async
async def test_cursor_and_expansion_survive_refreshes(procs, scenario):
    a = procs.sleeper("aaa")
    path = scenario([{"pid": a.pid, "gpu": 0, "memory": "1GiB"}], gpus=2)
    app = open_app(path, interval=0.1)
    async with app.run_test(size=(100, 30)) as pilot:
        assert await wait_row(pilot, f"gpu0/{a.pid}")
        tree = app.query_one(ProcessTree)
        assert app.select_key(f"gpu0/{a.pid}")
        tree.nodes_by_key["gpu1"].collapse()
        # A new holder that sorts above the selected one (more memory), on both GPUs.
        b = procs.sleeper("bbb")
        scenario([{"pid": a.pid, "gpu": 0, "memory": "1GiB"}, {"pid": b.pid, "gpu": 0, "memory": "9GiB"},
                  {"pid": b.pid, "gpu": 1, "memory": "9GiB"}], gpus=2)
        assert await wait_row(pilot, f"gpu0/{b.pid}")
        await pilot.pause(0.3)
        assert tree.cursor_node.data.key == f"gpu0/{a.pid}"
        assert not tree.nodes_by_key["gpu1"].is_expanded
        assert tree.nodes_by_key["gpu0"].is_expanded


@run_async
async def test_a_refused_kill_is_shown_as_a_failure(procs, scenario):
    from gputop.core.config import Config
    from gputop.core.sampler import Sampler
    from gputop.tui.app import GputopApp

    victim = spawn_named(procs, "keepme")  # its names agree: a renamed python is a disguise (issue 25)
    path = scenario([{"pid": victim.pid, "gpu": 0, "memory": "4GiB"}])
    config = Config(protect=("keepme",))  # the victim is protected: the actions module refuses
    app = GputopApp(Sampler.open("simulated", str(path), config), config=config, interval=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_kill_dialog(pilot, 0, victim.pid)
        await pilot.press("tab", "tab", "enter")  # KILL
        assert await wait_until(pilot, lambda: any(n.severity == "error" for n in app._notifications))
        note = next(n for n in app._notifications if n.severity == "error")
        assert "FAILED" in (note.title or "") and "protect" in note.message
        # The way out on this screen is the Override button, not a CLI flag.
        assert "--allow-protected" not in note.message and "Override" in note.message, note.message
    assert alive(victim.pid)
    assert any(r.get("face") == "tui" and not r.get("ok") for r in audit_records("kill"))


@run_async
async def test_protected_process_dies_only_through_the_explicit_override(procs, scenario):
    from gputop.core.config import Config
    from gputop.core.sampler import Sampler
    from gputop.tui.app import GputopApp
    from gputop.tui.dialogs.kill import OVERRIDE

    victim = spawn_named(procs, "keepme")  # its names agree: a renamed python is a disguise (issue 25)
    bystander = procs.sleeper("bystander")
    path = scenario([{"pid": victim.pid, "gpu": 0, "memory": "4GiB"},
                     {"pid": bystander.pid, "gpu": 0, "memory": "1GiB"}])
    config = Config(protect=("keepme",))
    app = GputopApp(Sampler.open("simulated", str(path), config), config=config, interval=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        await _open_kill_dialog(pilot, 0, victim.pid)
        assert "is protected" in screen_text(app)
        assert app.screen.query_one(f"#{OVERRIDE}")  # only offered because the target is protected
        await pilot.press("tab", "tab", "tab", "enter")  # Cancel -> TERM -> KILL -> Override
        assert await wait_until(pilot, lambda: victim.poll() is not None, timeout=10)
    assert alive(bystander.pid)
    rec = [r for r in audit_records("kill") if r.get("face") == "tui"][-1]
    assert rec.get("ok") and rec["target"]["pid"] == victim.pid


@run_async
async def test_unprotected_kill_dialog_has_no_override(procs, scenario):
    from gputop.tui.dialogs.kill import OVERRIDE

    victim = procs.sleeper("victimproc")
    app = open_app(scenario([{"pid": victim.pid, "gpu": 0, "memory": "4GiB"}]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_kill_dialog(pilot, 0, victim.pid)
        assert not app.screen.query(f"#{OVERRIDE}")
        await pilot.press("escape")
    assert alive(victim.pid)


@run_async
async def test_an_unwritable_audit_log_is_shown_on_screen(procs, scenario, monkeypatch):
    # Under the TUI stderr is not visible: the failure to log must reach the screen.
    monkeypatch.setenv("GPUTOP_AUDIT_LOG", "/dev/null/audit.jsonl")  # cannot be created, even by root
    victim = procs.sleeper("victimproc")
    app = open_app(scenario([{"pid": victim.pid, "gpu": 0, "memory": "4GiB"}]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_kill_dialog(pilot, 0, victim.pid)
        await pilot.press("tab", "enter")  # TERM
        assert await wait_until(pilot, lambda: victim.poll() is not None, timeout=10)
        assert await wait_until(pilot, lambda: any("AUDIT LOG NOT WRITTEN" in n.message
                                                   for n in app._notifications))
        note = next(n for n in app._notifications if "AUDIT LOG NOT WRITTEN" in n.message)
        assert note.severity == "error"


@run_async
async def test_reset_needs_the_typed_gpu_index(procs, scenario):
    path = scenario([], gpus=2)
    app = open_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_row(pilot, "gpu1")
        assert app.select_key("gpu1")
        await pilot.press("R")
        assert await wait_screen(pilot, "ResetDialog")
        dialog = app.screen
        assert dialog.focused.id == "confirm-index"  # typing works at once; the button stays disarmed
        button = dialog.query_one("#reset")
        await pilot.press("0")
        assert button.disabled  # the wrong index does not arm it
        await pilot.press("enter")  # and enter with it cancels
        assert await wait_until(pilot, lambda: type(app.screen).__name__ == "MainScreen")
        assert audit_records("reset") == []
        await pilot.press("R")
        assert await wait_screen(pilot, "ResetDialog")
        await pilot.press("enter")  # an empty answer cancels too
        assert await wait_until(pilot, lambda: type(app.screen).__name__ == "MainScreen")
        assert audit_records("reset") == []
        await pilot.press("R")
        assert await wait_screen(pilot, "ResetDialog")
        await pilot.press("1")
        assert not app.screen.query_one("#reset").disabled
        await pilot.press("enter")
        assert await wait_until(pilot, lambda: any("reset" in (n.title or "") for n in app._notifications))
    assert any(r.get("face") == "tui" and (r.get("target") or {}).get("gpu") == 1 and r.get("ok")
               for r in audit_records("reset")), audit_records("reset")


@run_async
async def test_reset_dialog_offers_only_what_would_be_done(procs, scenario):
    from gputop.core.config import Config
    from gputop.core.sampler import Sampler
    from gputop.tui.app import GputopApp

    keep = spawn_named(procs, "keepme")  # its names agree: a renamed python is a disguise (issue 25)
    held = procs.sleeper("heldjob")
    path = scenario([{"pid": keep.pid, "gpu": 0, "memory": "4GiB"}, {"pid": held.pid, "gpu": 1, "memory": "1GiB"}],
                    gpus=2)
    config = Config(protect=("keepme",))
    app = GputopApp(Sampler.open("simulated", str(path), config), config=config, interval=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        assert await wait_row(pilot, f"gpu1/{held.pid}")
        assert app.select_key("gpu0")  # held by a protected process: the reset would be refused
        await pilot.press("R")
        assert await wait_screen(pilot, "ResetDialog")
        assert not app.screen.query("#reset") and not app.screen.query("#force")
        assert "would be refused" in screen_text(app) and app.screen.focused.id == "cancel"
        await pilot.press("escape")
        assert await wait_until(pilot, lambda: type(app.screen).__name__ == "MainScreen")
        assert app.select_key("gpu1")  # held by an ordinary process: kill it first, then reset
        await pilot.press("R")
        assert await wait_screen(pilot, "ResetDialog")
        assert not app.screen.query("#reset") and app.screen.query("#force")
        await pilot.press("1", "enter")
        assert await wait_until(pilot, lambda: held.poll() is not None, timeout=15)
        assert await wait_until(pilot, lambda: any(r.get("ok") and r.get("force")
                                                   for r in audit_records("reset")))
    assert alive(keep.pid)


@run_async
async def test_reset_dialog_says_the_core_refusal_before_offering_a_reset(procs, scenario, monkeypatch):
    # a vendor backend resets only as root: the dialog asks the core reset's own check and offers no button
    from gputop.actions import reset as core_reset
    from gputop.backends.simulated import SimulatedBackend
    from gputop.core.config import Config
    from gputop.core.sampler import Sampler
    from gputop.tui.app import GputopApp

    class Vendor(SimulatedBackend):
        name = "vendorx"

    held = procs.sleeper("heldjob")
    path = scenario([{"pid": held.pid, "gpu": 0, "memory": "1GiB"}], gpus=1)
    monkeypatch.setattr(core_reset.os, "geteuid", lambda: 1000)  # what an ordinary user's TUI sees
    app = GputopApp(Sampler([Vendor(str(path))], config=Config()), config=Config(), interval=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        assert await wait_row(pilot, f"gpu0/{held.pid}")
        assert app.select_key("gpu0")
        await pilot.press("R")
        assert await wait_screen(pilot, "ResetDialog")
        assert not app.screen.query("#reset") and not app.screen.query("#force")
        assert "needs root" in screen_text(app) and app.screen.focused.id == "cancel"
        await pilot.press("escape")
    assert alive(held.pid)


@run_async
async def test_help_and_palette_list_every_binding(scenario):
    from gputop.tui.keymap import KEYS

    app = open_app(scenario([], gpus=1))
    async with app.run_test(size=(120, 60)) as pilot:
        titles = " ".join(c.title for c in app.get_system_commands(app.screen))
        assert all(k.description in titles for k in KEYS if k.action != "quit")
        await pilot.press("question_mark")
        assert await wait_screen(pilot, "HelpScreen")
        await pilot.pause(0.2)
        help_text = " ".join(screen_text(app).split())
        missing = [k.help for k in KEYS if " ".join(k.help.split()) not in help_text]
        assert not missing
        await pilot.press("escape")
        assert await wait_until(pilot, lambda: type(app.screen).__name__ == "MainScreen")


def test_bad_interval_is_a_usage_error():
    from tests.conftest import run_gputop

    r = run_gputop("--interval", "0", "--scenario", "/nonexistent.yaml")
    assert r.returncode == 2 and "--interval" in r.stderr and "Traceback" not in r.stderr


@run_async
async def test_ctrl_c_quits_like_top(scenario):
    app = open_app(scenario([], gpus=1))
    async with app.run_test(size=(80, 24)) as pilot:
        assert await wait_until(pilot, lambda: app.snapshot is not None)
        await pilot.press("ctrl+c")
        assert await wait_until(pilot, lambda: not app.is_running)


@run_async
async def test_devices_show_before_the_first_full_sample(procs, scenario):
    # The first full sample reads and classifies every holder (most of a second at a thousand); the device
    # panes must not wait for it, and until it lands the screen says so instead of showing an empty tree
    # that reads like "no holders".
    import threading

    worker = procs.sleeper("slowfirst")
    app = open_app(scenario([{"pid": worker.pid, "gpu": 0, "memory": "4GiB"}]))
    gate = threading.Event()
    inner = app.sampler.inner
    real = inner.sample

    def slow_sample():
        gate.wait(20)
        return real()

    inner.sample = slow_sample
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            assert await wait_until(pilot, lambda: "Simulated H100" in screen_text(app))
            text = screen_text(app)
            assert "reading processes" in text and str(worker.pid) not in text and "0 holder" not in text
            gate.set()
            assert await wait_until(pilot, lambda: str(worker.pid) in screen_text(app))
            assert "reading processes" not in screen_text(app)
    finally:
        gate.set()


def _parent_of_two(procs):
    """A real shell with two real children (sleeps), and its start time once both run."""
    import time

    from gputop.core.procs import start_time

    sh = procs.spawn("sleep 600 & sleep 600 & wait")
    deadline = time.monotonic() + 10
    while len(psutil.Process(sh.pid).children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    return sh, start_time(sh.pid)


def test_child_count_reads_the_process_the_snapshot_saw(procs):
    from gputop.tui.flows import child_count

    sh, started = _parent_of_two(procs)
    assert child_count(sh.pid, started) == 2
    assert child_count(sh.pid, started - 5) is None  # another process now has this pid: no count
    assert child_count(sh.pid, None) is None
    dead = procs.sleeper("gonesoon")
    dead_start = psutil.Process(dead.pid).create_time()
    dead.kill()
    dead.wait()
    assert child_count(dead.pid, dead_start) is None


@run_async
async def test_the_kill_dialog_counts_the_children_of_a_real_holder(procs, scenario):
    sh, _ = _parent_of_two(procs)
    app = open_app(scenario([{"pid": sh.pid, "gpu": 0, "memory": "4GiB"}]))
    async with app.run_test(size=(120, 40)) as pilot:
        await _open_kill_dialog(pilot, 0, sh.pid)
        assert await wait_until(pilot, lambda: "2 child process(es)" in screen_text(app)), screen_text(app)
        await pilot.press("escape")  # cancelled: nothing is signalled
        assert await wait_until(pilot, lambda: type(app.screen).__name__ != "KillDialog")
    assert alive(sh.pid) and len(psutil.Process(sh.pid).children()) == 2
    assert audit_records("kill") == []
