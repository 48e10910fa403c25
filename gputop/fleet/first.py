"""The TUI's first refresh, in a forked child while the parent imports and starts Textual.

The first frame waits for two things that each cost a few hundred milliseconds of CPU: Textual's import and
start-up, and the first refresh (importing requests, the answer's JSON, building 1,000 rows). In one
process they take turns on the GIL; in two, they run at once on two cores, and on a loaded machine each
gets its own share of the CPU. The child is forked before any thread exists, does exactly what
``FleetSource.refresh`` does, and hands the frame back through a pipe (pickled: the parent and the child
are the same program, and the pipe is ours alone). When the child fails (killed, out of memory), the parent
refreshes itself: the first frame is late, never wrong."""

from __future__ import annotations

import os
import pickle
import select
import signal
import threading

from gputop.fleet.source import FleetSource, Frame
from gputop.util.errors import UnavailableError


class FirstRefresh:
    def __init__(self, source: FleetSource):
        self.source = source
        self.pid: int | None = None
        self._frame: Frame | None = None
        self._lock = threading.Lock()  # the app's refresh thread reaps; close() (the main thread) may kill
        self._closed = False
        if threading.active_count() > 1:  # a fork would copy locks that other threads hold
            return
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: refresh, write, exit without running the parent's exit handlers
            code = 1
            try:
                os.close(r)
                frame = source.refresh()
                data = pickle.dumps((frame, source.recorded), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(w, "wb") as f:
                    f.write(data)
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        self.pid, self._r = pid, r

    def ready(self) -> bool:
        """Whether result() would answer at once (the child has written, or is gone)."""
        if self._frame is not None or self.pid is None:
            return self._frame is not None
        return bool(select.select([self._r], [], [], 0)[0])

    def result(self) -> Frame:
        """The first frame (blocks until the child answers). Call it once, from one thread."""
        if self._frame is not None:
            return self._frame
        frame = self._from_child() if self.pid is not None else None
        if frame is None:
            if self._closed:
                return Frame(rows=(), at=None, queries=0, took=0.0, error=UnavailableError("the view quit"),
                             stale=True)
            frame = self.source.refresh()
        self._frame = frame
        return frame

    def _from_child(self) -> Frame | None:
        chunks = []
        with os.fdopen(self._r, "rb") as f:
            while chunk := f.read(1 << 20):
                chunks.append(chunk)
        self._reap()
        try:
            frame, recorded = pickle.loads(b"".join(chunks))
        except Exception:  # noqa: BLE001 - the child died before it wrote (or wrote half): refresh here
            return None
        if not isinstance(frame, Frame):
            return None
        src = self.source
        src.recorded = recorded
        src.prom.queries += frame.queries
        if frame.error is None:
            src.last = frame
        return frame

    def _reap(self, kill: bool = False) -> None:
        with self._lock:
            if self.pid is None:
                return
            if kill:  # ours and not yet reaped: the pid is still the child's
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = None

    def close(self) -> None:
        """The view quit (maybe before the first frame came): end the child and reap it."""
        self._closed = True
        self._reap(kill=True)
