"""gputop's terminal driver: Textual's LinuxDriver, with an input thread that sleeps until it has work.

Textual's input thread wakes every 0.1 s to see whether it should stop: ten wake-ups a second, measured at
0.13% of a core out of the TUI's 0.63% at 16 holders on an idle node (more than the sampling thread). This
one blocks in select() until the terminal has input, until an escape sequence's timeout is due (a lone Esc
is only a key once no more bytes follow), or until it is told to stop: ``exit_event.set()`` also writes to
a pipe that the same select() waits on.

``run_input_thread`` follows Textual's own, line for line but for the wait, in the Textual version it was
written against (pinned in pyproject.toml); under any other version Textual's own loop runs.
"""

from __future__ import annotations

import os
import selectors
import threading
from codecs import getincrementaldecoder
from functools import partial

import textual
from textual._loop import loop_last
from textual._parser import ParseError
from textual._time import get_time
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver

WRITTEN_FOR = "8.2.8"  # textual.drivers.linux_driver.LinuxDriver.run_input_thread, as of this version
_UNKNOWN = object()


class _WakingEvent(threading.Event):
    """An Event whose set() also writes a byte to ``fd`` (the input thread's wake pipe)."""

    def __init__(self, fd: int):
        super().__init__()
        self.fd: int | None = fd

    def set(self) -> None:
        super().set()
        fd = self.fd
        if fd is not None:
            try:
                os.write(fd, b"x")
            except OSError:  # the pipe is full: the thread is woken already
                pass


def textual_is(version: str) -> bool:
    """Whether the Textual imported is ``version``, by its dist-info directory beside the package: one stat.
    (``textual.__version__`` loads importlib.metadata to answer: 2.3 MiB more peak RSS in the TUI.)"""
    site = os.path.dirname(os.path.dirname(os.path.abspath(textual.__file__)))
    return os.path.isdir(os.path.join(site, f"textual-{version}.dist-info"))


def _select(selector, wake: int, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
    """select(), without the wake pipe's event (its bytes are read and dropped)."""
    events = []
    for key, mask in selector.select(timeout):
        if key.fd == wake:
            try:
                while os.read(wake, 512):
                    pass
            except OSError:  # drained (EAGAIN)
                pass
        else:
            events.append((key, mask))
    return events


def _due(parser) -> float | None:
    """Until the parser's pending timeout (a lone Esc so far), at most Textual's 0.1 s; None when nothing
    is pending (block until input or a stop)."""
    at = getattr(parser, "_timeout_time", _UNKNOWN)
    if at is _UNKNOWN:
        return 0.1
    return None if at is None else max(0.0, min(0.1, at - get_time()))


class QuietInputDriver(LinuxDriver):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.quiet = type(self.exit_event) is threading.Event and textual_is(WRITTEN_FOR)
        if self.quiet:
            self._wake_r, self._wake_w = os.pipe()  # not inherited by children (PEP 446)
            os.set_blocking(self._wake_r, False)
            os.set_blocking(self._wake_w, False)
            self.exit_event = _WakingEvent(self._wake_w)

    def close(self) -> None:
        super().close()
        if self.quiet and self.exit_event.fd is not None:
            self.exit_event.fd = None  # never a write to a descriptor number reused by another file
            os.close(self._wake_r)
            os.close(self._wake_w)

    def run_input_thread(self) -> None:
        """Wait for input and dispatch events (Textual's loop; the wait is the one change)."""
        if not self.quiet or self.exit_event.fd is None:
            return super().run_input_thread()
        selector = selectors.SelectSelector()
        selector.register(self.fileno, selectors.EVENT_READ)
        wake = self._wake_r
        selector.register(wake, selectors.EVENT_READ)

        fileno = self.fileno
        EVENT_READ = selectors.EVENT_READ

        parser = XTermParser(self._debug)
        feed = parser.feed
        tick = parser.tick

        utf8_decoder = getincrementaldecoder("utf-8")().decode
        decode = utf8_decoder
        read = os.read

        wait = partial(_select, selector, wake)
        due = partial(_due, parser)

        def process_selector_events(
            selector_events: list[tuple[selectors.SelectorKey, int]],
            final: bool = False,
        ) -> None:
            for last, (_selector_key, mask) in loop_last(selector_events):
                if mask & EVENT_READ:
                    unicode_data = decode(read(fileno, 1024 * 4), final=final and last)
                    if not unicode_data:
                        # This can occur if the stdin is piped
                        break
                    for event in feed(unicode_data):
                        self.process_message(event)
            for event in tick():
                self.process_message(event)

        try:
            while not self.exit_event.is_set():
                process_selector_events(wait(due()))
            selector.unregister(self.fileno)
            process_selector_events(wait(0.1), final=True)

        finally:
            selector.close()
            try:
                for event in feed(""):
                    pass
            except (EOFError, ParseError):
                pass
