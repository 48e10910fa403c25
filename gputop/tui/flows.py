"""The four action flows of the TUI (kill, reap, reset, guard): open the dialog, and on confirm act in a
worker thread through gputop.actions (face "tui"), then report on screen and sample again.

Each flow has the same three steps: an opener (run by the app's action_* handler on the UI thread) that
refuses what cannot be done and gathers what the dialog shows, the dialog itself (tui/dialogs/), and a
worker that acts on the confirmed choice. The app supplies the snapshot, the selection and the sampler;
this module owns no widget.
"""

from __future__ import annotations

from functools import partial

from gputop.core.orphans import ORPHAN
from gputop.util.textsafe import visible

NOTIFY_ERROR_S = 8  # how long an action's failure stays on screen (a success: 4 s, GputopApp's default)

# The actions module speaks to the CLI (flags); on this screen the same way out is a button or a key.
_TUI_WORDING = (
    ("use --allow-protected for an explicit manual kill", "press Override in the kill dialog to kill it anyway"),
    ("use --force to send SIGKILL", "kill it again and choose KILL"),
    ("stop them or use --force to kill them first",
     "kill its holders first (k), or choose 'Kill holders and reset' in the reset dialog"),
    ("(sudo gputop reset --gpu", "(run gputop as root; CLI: sudo gputop reset --gpu"),
    ("(gputop reset --gpu", "(kill them with k first; CLI: gputop reset --gpu"),
)


def tui_wording(message: str) -> str:
    for cli, tui in _TUI_WORDING:
        message = message.replace(cli, tui)
    return message


def zombie_parent_target(h):
    """For a zombie holder, the kill target the TUI offers instead: its parent, whose wait or exit frees the
    memory (the kill still checks its identity, verdict and protection); None for any other holder."""
    if not h.zombie or h.notes.parent is None:
        return None
    from gputop.tui.dialogs.kill import KillTarget

    p, v = h.notes.parent, h.notes.parent_verdict
    return KillTarget(p.pid, p.start_time, p.user, p.cmd, None, h.gpus, child_count(p.pid, p.start_time),
                      v.kind if v is not None else "unknown", v.reason if v is not None else "", parent_of=h.pid)


def child_count(pid: int, start_time: float | None) -> int | None:
    """How many live descendants ``pid`` has, only if it is still the process the snapshot saw (same start
    time); None when that cannot be told (gone, reused, unreadable)."""
    from gputop.core.procs import ProcTable
    from gputop.core.procs import start_time as read_start

    if start_time is None:
        return None
    now = read_start(pid)
    if now is None or abs(now - start_time) >= 0.05:
        return None
    return len(ProcTable().descendants(pid))


class ActionFlows:
    """The kill, reap, reset and guard flows of one GputopApp (``app``)."""

    def __init__(self, app):
        self.app = app

    # ---- shared ---------------------------------------------------------------------------------

    def _worker(self, method, *args) -> None:
        """Run ``method(*args)`` in a thread worker of the "actions" group (as @work(thread=True) did)."""
        self.app.run_worker(partial(method, *args), name=method.__name__, group="actions",
                            description=f"{method.__name__}{args!r}", thread=True)

    def _refuse_readonly(self) -> bool:
        if self.app.readonly:
            self.app.notify("read-only: actions are disabled (started with --readonly)", severity="warning")
            return True
        return False

    def _report(self, result) -> None:
        sev = "information" if result.ok else "error"
        title = f"{result.action} {'done' if result.ok else 'FAILED'}"
        message = tui_wording(visible(result.message))
        audit_error = (result.details or {}).get("audit_error")
        if audit_error:  # stderr is not visible under the TUI: say it on screen, loudly
            message += f"\nAUDIT LOG NOT WRITTEN: {audit_error}"
            sev = "error"
        self._tell(self.app.notify, message, title=title, severity=sev, timeout=4 if sev != "error" else NOTIFY_ERROR_S)

    def _tell(self, callback, *args, **kwargs) -> None:
        """call_from_thread for a kill's or reap's worker, which carries on once the app has exited: a signal
        ends the app while the action finishes its confirmed plan (the audit log has what it did), and an
        outcome nobody can see must not stop the kills that come after it."""
        app = self.app
        if not app.is_running:
            return
        try:
            app.call_from_thread(callback, *args, **kwargs)
        except Exception:
            if app.is_running:
                raise

    def _after_action(self, pids: set[int] = frozenset()) -> None:
        self.app.process_tree.untag(pids)
        self.app.sample_now()

    def _cancelled(self, what: str, choice: str | None) -> bool:
        if choice is None:
            self.app.notify(what, timeout=2)
            return True
        return False

    # ---- kill -----------------------------------------------------------------------------------

    def kill(self) -> None:
        """k: the tagged holders, else the selected one."""
        app = self.app
        if self._refuse_readonly() or app.snapshot is None:
            return
        tagged = app.process_tree.tagged
        holders = [h for h in app.snapshot.holders if h.pid in tagged]
        if not holders:
            sel = app.selection()
            if sel.holder is None:
                app.notify("Select a GPU-holding process to kill (r reaps a whole orphan tree).", severity="warning")
                return
            holders = [sel.holder]
        unknown = [h for h in holders if not h.visible]
        if unknown:
            app.notify(f"pid {unknown[0].pid} is not visible here: it cannot be signalled.", severity="error")
            return
        orphaned = [h for h in holders if h.zombie and h.notes.parent is None]
        if orphaned:
            app.notify(f"pid {orphaned[0].pid} is a zombie whose parent cannot be seen: nothing can be offered.",
                       severity="error")
            return
        self._worker(self._prepare_kill, holders)

    def _prepare_kill(self, holders: list) -> None:
        from gputop.tui.dialogs.kill import KillDialog, KillTarget

        targets = [zombie_parent_target(h) or KillTarget(
                       h.pid, h.start_time, h.user, h.cmd, h.gpu_memory, h.gpus, child_count(h.pid, h.start_time),
                       h.verdict.kind, h.verdict.reason) for h in holders]
        self.app.call_from_thread(self.app.push_screen, KillDialog(targets), partial(self._kill_confirmed, targets))

    def _kill_confirmed(self, targets: list, choice: str | None) -> None:
        if not self._cancelled("kill cancelled", choice):
            self._worker(self._do_kill, targets, choice)

    def _do_kill(self, targets: list, signal_name: str) -> None:
        try:
            from gputop import actions
            from gputop.actions import interrupt
        except Exception as e:
            self.app.call_from_thread(self.app.notify, f"kill unavailable: {e}", severity="error", timeout=10)
            return
        from gputop.tui.dialogs.kill import OVERRIDE

        override = signal_name == OVERRIDE
        if override:
            signal_name = "KILL"
        config = self.app.config
        # The confirmed list is one action in flight from its first kill to its last: a SIGHUP/SIGTERM to the
        # TUI between two of them does not end the process before the rest (see gputop.tui.launch).
        with interrupt.deferred():
            for t in targets:
                try:
                    r = actions.kill_process(t.pid, expected_start=t.start_time, face="tui",
                                             signal_name=signal_name, timeout=config.kill_timeout,
                                             sampler=self.app.sampler, config=config, allow_protected=override,
                                             require_holder=t.parent_of is None)
                    self._report(r)
                except Exception as e:  # an action must never be swallowed, even a crashing one
                    self._tell(self.app.notify, f"kill {t.pid} failed: {type(e).__name__}: {e}", severity="error",
                               timeout=10)
        self._tell(self._after_action, {t.pid for t in targets})

    # ---- reap -----------------------------------------------------------------------------------

    def reap(self) -> None:
        """r: the orphan tree of the selected holder, or the selected tree's root."""
        app = self.app
        if self._refuse_readonly() or app.snapshot is None:
            return
        sel = app.selection()
        root = None
        if sel.holder is not None and sel.holder.verdict.kind == ORPHAN:
            root = sel.holder.verdict.root
        elif sel.root is not None:
            root = sel.root
        if root is None:
            if sel.holder is not None:
                app.notify(f"pid {sel.pid} is not an orphan ({sel.holder.verdict.kind}): nothing to reap. "
                           "k kills one process.", severity="warning")
            else:
                app.notify("Select an orphaned process (marked O) or its tree to reap.", severity="warning")
            return
        self._worker(self._prepare_reap, app.snapshot, root)

    def _prepare_reap(self, snapshot, root: int) -> None:
        from gputop.tui.dialogs.reap import ReapDialog

        app = self.app
        try:
            from gputop import actions

            trees = [t for t in actions.orphan_trees(snapshot, config=app.config, sampler=app.sampler)
                     if t.root.pid == root]
        except Exception as e:
            app.call_from_thread(app.notify, f"reap unavailable: {type(e).__name__}: {e}", severity="error",
                                 timeout=10)
            return
        if not trees:
            app.call_from_thread(app.notify, f"orphan tree {root} is gone or changed; nothing to reap.",
                                 severity="warning")
            app.sample_now()
            return
        app.call_from_thread(app.push_screen, ReapDialog(trees[0]), partial(self._reap_confirmed, trees[0]))

    def _reap_confirmed(self, tree, choice: str | None) -> None:
        if not self._cancelled("reap cancelled", choice):
            self._worker(self._do_reap, tree)

    def _do_reap(self, tree) -> None:
        from gputop import actions

        try:
            r = actions.reap_tree(tree.root.pid, expected_start=tree.root.start_time, face="tui",
                                  sampler=self.app.sampler, config=self.app.config)
            self._report(r)
        except Exception as e:
            self._tell(self.app.notify, f"reap {tree.root.pid} failed: {type(e).__name__}: {e}", severity="error",
                       timeout=15)
        self._tell(self._after_action, set(tree.holders))

    # ---- reset ----------------------------------------------------------------------------------

    def reset(self) -> None:
        """R: the GPU of the selected row."""
        app = self.app
        if self._refuse_readonly() or app.snapshot is None:
            return
        from gputop.tui.dialogs.reset import ResetDialog
        from gputop.util.errors import GputopError

        idx = app.selection().gpu_or_first(app.snapshot)
        if idx is None:
            app.notify("No GPU to reset.", severity="warning")
            return
        dev = app.snapshot.device(idx)
        try:
            backend = app.sampler.locate(idx)[0]
        except GputopError:  # a GPU that went away: the reset itself will say so
            backend = None
        app.push_screen(ResetDialog(idx, dev.name if dev else None, app.snapshot.holders_on(idx), backend),
                        partial(self._reset_confirmed, idx))

    def _reset_confirmed(self, index: int, choice: str | None) -> None:
        if self._cancelled("reset cancelled", choice):
            return
        from gputop.tui.dialogs.reset import FORCE

        self._worker(self._do_reset, index, choice == FORCE)

    def _do_reset(self, index: int, force: bool = False) -> None:
        app = self.app
        try:
            from gputop import actions

            r = actions.reset_gpu(index, face="tui", force=force, sampler=app.sampler, config=app.config)
            self._report(r)
        except Exception as e:
            app.call_from_thread(app.notify, f"reset GPU {index} failed: {type(e).__name__}: {e}",
                                 severity="error", timeout=15)
        app.call_from_thread(self._after_action, set())

    # ---- guard ----------------------------------------------------------------------------------

    def guard(self) -> None:
        """g: the guard's next mode (off -> dry-run -> enforce -> off)."""
        app = self.app
        if self._refuse_readonly():
            return
        try:
            from gputop.guard import state as guard_state
        except Exception:
            app.notify("The guard engine is not installed in this gputop.", severity="error")
            return
        from gputop.tui.dialogs.guard_toggle import GuardToggleDialog

        modes, panel = guard_state.MODES, app.panel
        current = panel.guard_mode if panel.guard_mode in modes else "off"
        target = modes[(modes.index(current) + 1) % len(modes)]
        app.push_screen(GuardToggleDialog(current, target, panel.guard_daemon, panel.guard_policy),
                        partial(self._guard_confirmed, target))

    def _guard_confirmed(self, target: str, choice: str | None) -> None:
        if not self._cancelled("guard mode unchanged", choice):
            self._worker(self._do_guard, target)

    def _do_guard(self, target: str) -> None:
        app = self.app
        try:
            from gputop.guard import state as guard_state

            previous = guard_state.set_mode(target, "tui")
            app.call_from_thread(app.notify, f"guard mode {previous} → {target}", title="guard")
        except Exception as e:
            app.call_from_thread(app.notify, f"cannot switch the guard mode: {e}", severity="error", timeout=15)
        app.call_from_thread(self._after_action, set())
