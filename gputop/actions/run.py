"""One action run: what it acts on, the signals it sent, its details, and the one record and result it ends with.

Every action (kill, reap, the reap of a group, reset) is an ``ActionRun``. A run collects the signals it
sends (``signals``) and what it found (``details``) as it goes; ``done`` ends it: it builds the audit record
(``common.record``, which also notes a SIGHUP/SIGTERM that came meanwhile), writes it (``common.log_record``;
a record that cannot be written is said in ``details["audit_error"]``), and returns the ``ActionResult``.
``interrupted`` ends a run cut short (a second SIGHUP/SIGTERM, Ctrl-C, a bug) the same way, before the
exception goes on. What differs between the kinds is only what their record and result name: ``target``,
``record_fields`` and ``result_fields``.
"""

from __future__ import annotations

from gputop.actions.common import ActionResult, log_record, record, target_dict
from gputop.core.config import Config
from gputop.util.errors import EXIT_FAILURE


class ActionRun:
    """The state of one action and the audit record and result it ends with."""

    action = ""  # the record's and the result's "action": kill | reap | reap-group | reset

    def __init__(self, face: str, reason: str | None, cfg: Config | None):
        self.face, self.reason, self.cfg = face, reason, cfg
        self.details: dict = {}
        self.signals: list[dict] = []
        self.recorded = False  # done() has run: the audit record is out

    def target(self) -> dict:
        """The record's "target"."""
        raise NotImplementedError

    def record_fields(self, code: int, mem: bool | None) -> dict:
        """The record's fields after "message" (and "reason"), in their order; "details" follows them."""
        return {"exit_code": code}

    def result_fields(self, mem: bool | None) -> dict:
        """The result's fields besides action, ok, outcome, message, exit_code and details."""
        return {}

    def done(self, ok: bool, outcome: str, message: str, code: int, mem: bool | None = None) -> ActionResult:
        """End the run: write its audit record and return its result."""
        self.recorded = True
        rec = record(self.action, self.face, outcome, ok, message, self.target(), self.signals, self.reason,
                     **self.record_fields(code, mem), details=dict(self.details))
        log_record(rec, self.cfg, self.details)
        return ActionResult(self.action, ok, outcome, message, exit_code=code, details=self.details,
                            **self.result_fields(mem))

    def interrupted(self, e: BaseException, message: str, found: dict | None = None) -> ActionResult:
        """End a run cut short by ``e`` (the caller raises it again): ``found`` (what was done so far, for the
        details) and the error go into the record, whose outcome is "interrupted"."""
        if found:
            self.details.update(found)
        self.details["error"] = f"{type(e).__name__}: {e}"
        return self.done(False, "interrupted", message, EXIT_FAILURE)


class ProcessRun(ActionRun):
    """A run on one process (a kill, or the reap of the tree under it): ``pid``, as it was seen (``info``)
    and as the caller saw it (``expected_start``), and the GPUs it holds."""

    def __init__(self, pid, expected_start: float | None, face: str, reason: str | None, cfg: Config | None):
        super().__init__(face, reason, cfg)
        self.pid, self.expected_start = pid, expected_start
        self.info = None
        self.gpus: list[int] = []

    def target(self) -> dict:
        return target_dict(self.pid, self.info, self.gpus, self.expected_start)

    def result_fields(self, mem: bool | None) -> dict:
        return {"pid": self.pid, "gpu": self.gpus[0] if len(self.gpus) == 1 else None, "memory_released": mem}
