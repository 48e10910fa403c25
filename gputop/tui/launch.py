"""``gputop`` with no subcommand: open the sampler (and the demo, with --demo) and run the app."""

from __future__ import annotations

import contextlib
import os
import sys
import signal
import threading

from gputop.backends import close_backends, probe, read_devices
from gputop.core.config import load_config
from gputop.util.errors import UsageError
from gputop.util.units import check_interval
from gputop.tui import first_frame

EXIT_GRACE_S = 10.0  # after SIGTERM/SIGHUP, how long the normal exit may take before the process just ends
# How long, on top of twice the config's kill_timeout, one kill or reap in flight may take to finish its plan
# before the process ends anyway (a wait for another action's lock, the grace, SIGKILL, the checks after).
# Each action that ends starts the wait again: a kill of many tagged processes runs them one by one.
ACTION_GRACE_S = 180.0

# Modules the TUI process never uses that its imports would load anyway (peak RSS, issue 13). ``ssl``:
# asyncio (which Textual runs on) imports it only to offer TLS connections, and goes without it when it
# cannot be imported (``try: import ssl / except ImportError: ssl = None`` in asyncio.sslproto and
# base_events); loading it maps libcrypto and libssl, ~4.5 MiB resident. The TUI opens no connection:
# remote hosts go through ssh (a separate process), the HTTP API and the MCP server are other processes
# (``gputop serve``, ``gputop mcp``), and guard e-mail is sent by the guard daemon.
TUI_UNUSED_MODULES = ("ssl",)
M_ARENA_MAX = -8  # glibc's mallopt() parameter (malloc.h)


def require_terminal() -> None:
    """The TUI draws a full screen and reads keys: refuse, with a way out, when either end is not a terminal
    (``gputop > file``, ``gputop < /dev/null``, a cron job)."""
    ends = [name for name, f in (("input", sys.stdin), ("output", sys.stdout), ("error", sys.stderr))
            if f is None or not f.isatty()]
    if ends:
        which = ends[0] if len(ends) == 1 else ", ".join(ends[:-1]) + " and " + ends[-1]
        fix = ("keep standard error on the terminal (the TUI draws its screen there; no 2>FILE)"
               if ends == ["error"] else "run it in a terminal")
        err = UsageError(f"the full-screen TUI needs a terminal, but standard {which} "
                         f"{'is not one' if len(ends) == 1 else 'are not'}: {fix}, or use "
                         "'gputop status' (or 'gputop status --json') for output to a file or a pipe")
        if "error" in ends:  # 'gputop 2>err.log' at a terminal: the person there must see why, too
            _to_tty(f"gputop: {err}\n")
        raise err


def _to_tty(text: str) -> None:
    """``text`` on the controlling terminal (/dev/tty), if there is one; else nothing."""
    try:
        fd = os.open("/dev/tty", os.O_WRONLY | os.O_NOCTTY)
    except OSError:
        return
    try:
        os.write(fd, text.encode("utf-8", "replace"))
    except OSError:
        pass
    finally:
        os.close(fd)


def run_tui(args) -> int:
    config = load_config(getattr(args, "config", None))
    interval = getattr(args, "interval", None)
    if interval is not None:
        try:
            check_interval(interval)
        except ValueError as e:
            raise UsageError(str(e)) from None
    require_terminal()  # after the arguments (their errors first), before the demo starts anything
    stack = contextlib.ExitStack()
    with stack:
        stack.enter_context(unused_modules_left_out())
        one_malloc_arena()  # before the sampler's and Textual's threads start
        demo = None
        scenario = getattr(args, "scenario", None)
        backend = getattr(args, "backend", None)
        if getattr(args, "demo", False):
            from gputop.core.demo import Demo

            said = stack.enter_context(_saying_while_demo_stops())
            demo = stack.enter_context(Demo())
            stack.callback(said)  # LIFO: runs after the app has left the screen, just before demo.stop()
            scenario, backend = str(demo.scenario_path), "simulated"
            # A sandbox: the demo's guard switch, audit log and node trail must not touch the node's real ones.
            demo.sandbox()  # also writes env.sh, which a second shell sources (see the banner)
        # The devices first, from the backends alone: the process layer (gputop.core.sampler and what it
        # imports, ~a quarter of what the first frame needs) is imported once they are on the screen.
        found = probe(backend, scenario)
        sampler = None
        stack.callback(lambda: sampler.close() if sampler is not None else close_backends(found.backends))
        devices = _first_devices(found.backends)
        app = None
        drawn = first_frame.draw(devices, readonly=getattr(args, "readonly", False), demo=demo is not None)
        try:
            from gputop.core.sampler import Sampler

            sampler = Sampler.from_probe(found, config)
            action_grace = ACTION_GRACE_S + 2 * config.kill_timeout
            with _exit_on_signals(lambda: app, action_grace):
                from gputop.tui.app import GputopApp  # imports Textual

                app = GputopApp(sampler, config=config, interval=interval,
                                readonly=getattr(args, "readonly", False), demo=demo, devices=devices,
                                first_frame=drawn)
                app.run()
                # Textual has left the screen; an action still in its worker thread finishes its plan first.
                _wait_for_actions(action_grace)
        finally:
            if drawn and not (app is not None and app.took_screen):
                first_frame.leave()  # the app failed or was stopped before it took the screen over
        return int(app.return_code or 0)


@contextlib.contextmanager
def _saying_while_demo_stops():
    """Yields a function that puts "stopping the demo's processes…" on the terminal (standard error, when
    it is one); the line is erased once the demo has stopped, so the shell's screen comes back clean."""
    shown = []

    def say() -> None:
        if sys.stderr is not None and sys.stderr.isatty():
            sys.stderr.write("gputop: stopping the demo's processes…")
            sys.stderr.flush()
            shown.append(True)

    try:
        yield say
    finally:
        if shown:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()


@contextlib.contextmanager
def unused_modules_left_out(names=TUI_UNUSED_MODULES):
    """While the TUI runs, ``import`` of each of ``names`` raises ImportError (a None entry in sys.modules,
    the documented way to block an import), so that asyncio goes without ``ssl``. Only where asyncio is not
    imported yet (in a process that already has it, ssl is loaded or asyncio has done without it) and the
    module is not loaded; undone on the way out, so that code running after the TUI in the same process
    (tests) imports it as usual."""
    blocked = [] if "asyncio" in sys.modules else [n for n in names if n not in sys.modules]
    for name in blocked:
        sys.modules[name] = None
    try:
        yield blocked
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def one_malloc_arena() -> bool:
    """Have every thread allocate from glibc's main malloc arena (mallopt M_ARENA_MAX=1, what the
    MALLOC_ARENA_MAX=1 variable does at start-up). By default each thread that calls malloc gets an arena of
    its own (up to 8 per core): the TUI's sampler, Textual's input and output threads and the main thread
    each keep their own free lists, ~1 MiB more resident at 1,024 holders. Python threads take turns
    holding the GIL, so they seldom wait for the one arena. Process-wide and not undoable (the TUI process
    ends with the TUI); False where the C library is not glibc or the call fails."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):  # None, or ValueError, where the C library is not glibc
            return False
        import ctypes  # loaded anyway by the NVML backend

        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        return mallopt(M_ARENA_MAX, 1) == 1
    except (AttributeError, OSError, ValueError, ImportError):
        return False


def _first_devices(backends) -> tuple | None:
    """The devices alone (a few ms), read from the opened backends before the app starts so that its first
    frame shows them; None when they cannot be read (the app's first full sample then reports why)."""
    try:
        return read_devices(backends) or None
    except Exception:
        return None


def _interrupt():
    """gputop.actions.interrupt if an action ever ran in this process (imported then), else None: the TUI
    does not import the action layer before its first frame for this."""
    return sys.modules.get("gputop.actions.interrupt")


def _wait_for_actions(grace: float = ACTION_GRACE_S) -> None:
    intr = _interrupt()
    if intr is not None:
        intr.settle(grace)


def _exit_when_idle(code: int, grace: float = ACTION_GRACE_S) -> None:
    """End the process, but only once no kill or reap is in flight (or none has ended for ``grace`` s)."""
    _wait_for_actions(grace)
    os._exit(code)


@contextlib.contextmanager
def _exit_on_signals(get_app, action_grace: float = ACTION_GRACE_S):
    """SIGTERM, SIGHUP and SIGINT leave through the app's normal exit, which restores the terminal (alternate
    screen off, mouse tracking off, cursor shown). Exit status 128 + the (first) signal's number. Before the app
    runs (Textual still importing), SystemExit: run_tui then takes the first frame off the screen."""
    import asyncio

    def handler(signum, frame):
        app = get_app()
        # A kill or reap in flight (a worker thread) finishes its confirmed plan: nothing gputop stopped is
        # left stopped, and its audit record says it was interrupted, by what, and that the plan was finished.
        intr = _interrupt()
        if intr is not None:
            intr.note_for_workers(signum)
        first.append(signum)
        code = 128 + first[0]  # a second signal (SIGTERM after SIGHUP) does not change how the process ends
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not running yet (or any more): the app has nothing on screen to restore
            raise SystemExit(code) from None
        if app is None:
            raise SystemExit(code)
        loop.call_soon_threadsafe(lambda: app.exit(return_code=code))
        if timers:  # the forced exit is already on its way
            return
        # A closed terminal (SIGHUP) can leave Textual's shutdown waiting for ever on its output queue (seen when
        # a tmux window was killed during start-up): if the normal exit has not ended the process soon, end it.
        stuck = threading.Timer(EXIT_GRACE_S, _exit_when_idle, (code, action_grace))
        stuck.daemon = True
        stuck.start()
        timers.append(stuck)

    saved, timers, first = {}, [], []
    # SIGINT too: Ctrl-C in the TUI is a key (the terminal is raw), so a SIGINT comes from kill -INT. Left to
    # asyncio it cancels the app, which then ends with status 0, and an action in flight is not told.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        with contextlib.suppress(ValueError, OSError):  # not the main thread: leave the defaults
            # Under nohup SIGHUP stays ignored, and a background job's SIGINT too.
            if signal.getsignal(sig) is not signal.SIG_IGN:
                saved[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for t in timers:  # the app did exit: nothing to force (a caller that lives on is not cut short)
            t.cancel()
        for sig, old in saved.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, old)
