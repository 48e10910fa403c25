"""The verdict cache of a long-lived sampler, and the lookups a verdict reads.

A holder's verdict (gputop.core.orphans.classify) is a pure function of the process records it reads, its
owner and the rules. ``VerdictCache`` keeps each holder's verdict with every input it was computed from and
answers from it while every input gives the same answer again; else it classifies over the sample's table.
The memo is only ever a faster way to the verdict classify() would return now, never an older one.

``Lookups`` are classify()'s ownership and Slurm inputs as one sampler reads them (``Sampler.lookups()``): an
action that classifies again (the reap planner) passes them on, so that it judges a process as the
snapshot did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gputop.core.config import Config
from gputop.core.orphans import Verdict, classify, compile_protect, verdict_inputs
from gputop.core.ownership import Owner, OwnerCache
from gputop.core.procs import ProcInfo, ProcTable
from gputop.core.slurm_jobs import JobRef, JobState


@dataclass(frozen=True)
class Lookups:
    """classify()'s ownership and Slurm inputs (its keyword arguments of the same names); None: not read
    (off Linux, or a sampler that reads no owners). ``classify(pid, table, ..., **lookups.kwargs())``."""

    owner_of: Callable[[ProcInfo], Owner | None] | None = None
    job_of: Callable[[ProcInfo], JobRef | None] | None = None
    job_state: Callable[[int], JobState | None] | None = None

    def kwargs(self) -> dict:
        """The lookups that are set, as classify()'s keyword arguments."""
        return {k: v for k, v in (("owner_of", self.owner_of), ("job_of", self.job_of),
                                  ("job_state", self.job_state)) if v is not None}


class _Recording:
    """A view of a ProcTable that records every answer classify() gets from it (get and hidden)."""

    __slots__ = ("_table", "gets", "hides")

    def __init__(self, table: ProcTable):
        self._table = table
        self.gets: dict[int, ProcInfo | None] = {}
        self.hides: dict[int, bool] = {}

    def get(self, pid: int) -> ProcInfo | None:
        info = self.gets[pid] = self._table.get(pid)
        return info

    def hidden(self, pid: int) -> bool:
        answer = self.hides[pid] = self._table.hidden(pid)
        return answer

    def exe(self, pid: int) -> str | None:
        # Not recorded: the executable changes only with an exec, which changes the name and the command
        # line the memo compares (verdict_inputs).
        return self._table.exe(pid)


class _Context:
    """The part of a verdict's inputs that the holders of one tree share: each process-table answer
    classify() got for a PID other than the holder's own (its ancestors, their session leaders, init),
    each "hidden" answer, and the chain it walked. Sibling holders classified over the same table get
    the same answers (the same ProcInfo objects), so the VerdictCache keeps one _Context for all of them
    (interned by the identity of those objects) and checks it once per sample instead of once a holder."""

    __slots__ = ("gets", "hides", "chain", "same", "current")

    def __init__(self, gets: tuple[tuple[int, ProcInfo | None], ...], hides: tuple[tuple[int, bool], ...],
                 chain: tuple[ProcInfo, ...]):
        self.gets, self.hides, self.chain = gets, hides, chain
        # Per answer in gets, the newest record found to have the same verdict inputs (a record re-read
        # once its command line was old, an exited process's): compared by identity from then on.
        self.same: list[ProcInfo | None] = [info for _, info in gets]
        self.current = chain  # the chain as the newest sample that checked this context read it

    def key(self) -> tuple:
        """Equal for two contexts made of the very same answers (the objects are held by the context)."""
        return (tuple((pid, id(info)) for pid, info in self.gets), self.hides, tuple(map(id, self.chain)))

    def holds(self, table: ProcTable) -> bool:
        """Whether the current table answers every recorded question as before."""
        same = self.same
        for i, (pid, old) in enumerate(self.gets):
            cur = table.get(pid)
            if cur is old or cur is same[i]:
                continue
            if cur is None or old is None or verdict_inputs(cur) != verdict_inputs(old):
                return False  # gone, appeared, replaced (pid, start), reparented, renamed, exec'd, exited...
            same[i] = cur
        for pid, was in self.hides:
            if table.hidden(pid) != was:
                return False
        return True


@dataclass(slots=True)
class _Memo:
    """One holder's verdict, with every input it was computed from: the holder's own record (its
    verdict inputs), its owner, and the answers it shares with its tree (_Context). classify() is a pure
    function of these and of the rules (config), so while every one of them gives the same answer
    again, it would return the same verdict. ``info`` is the newest record found to have those inputs
    (moved on by VerdictCache.verdict, so that the next sample's identity check usually answers)."""

    info: ProcInfo
    inputs: tuple  # verdict_inputs(info)
    ctx: _Context
    owner: Owner | None
    verdict: Verdict


class VerdictCache:
    """The verdicts of one sampler's holders: from the memo while every input of a verdict gives the same
    answer, else from classify() over the sample's table. ``memo=False``: classify every holder every time
    (a one-shot sampler, which would only pay to record the inputs).

    A sample calls ``begin`` (the rules of this sample), ``verdict`` for each visible holder, then ``end``
    with the holders it found. Faces only: actions classify again on a fresh table."""

    def __init__(self, owners: OwnerCache | None, job_of: Callable[[ProcInfo], JobRef | None], memo: bool = True):
        self._owners = owners
        self._job_of = job_of
        self.config: Config | None = None
        self.platform = ""
        self._protect = self._protect_cmdline = None  # compiled by begin()
        # holder pid -> _Memo, kept while every input of the verdict is unchanged, for the rules of begin().
        self.memos: dict[int, _Memo] | None = {} if memo else None
        # The memos' shared parts, interned (_Context.key -> _Context), and this sample's check of each
        # one checked so far (id -> (the context, None or (chain now, its owners))).
        self.contexts: dict[tuple, _Context] = {}
        self._ctx_now: dict[int, tuple[_Context, tuple | None]] = {}
        self._changed = False  # a memo was made or dropped since the last end()

    def begin(self, config: Config, platform: str) -> None:
        """A new sample, under ``config``'s rules. A new config (a reload) or platform brings new protect
        rules: compile them, and forget every verdict."""
        self._ctx_now = {}  # this sample's context checks only, even when the last sample failed part-way
        if config is not self.config or platform != self.platform:
            self._protect = compile_protect(config.protect)
            self._protect_cmdline = compile_protect(config.protect_cmdline)
            self.config, self.platform = config, platform
            if self.memos is not None:
                self.memos.clear()
            self.contexts.clear()

    def end(self, holders: dict) -> None:
        """Keep the memos of this sample's holders (``holders``: by pid), and the contexts they share;
        end this sample's checks. A refresh that made no memo and whose holders kept theirs changes
        neither (the usual refresh: nothing to rebuild)."""
        memo = self.memos
        self._ctx_now = {}
        if memo is None:
            return
        changed, self._changed = self._changed, False
        if not memo.keys() <= holders.keys():  # some holder of an earlier sample is gone
            self.memos = memo = {pid: m for pid, m in memo.items() if pid in holders}
            changed = True
        if changed:
            live = {id(m.ctx) for m in memo.values()}
            if len(live) < len(self.contexts):
                self.contexts = {k: c for k, c in self.contexts.items() if id(c) in live}

    def verdict(self, pid: int, info: ProcInfo, table: ProcTable, owner: Owner | None,
                jobs: dict[int, JobRef], job_states: dict[int, JobState]
                ) -> tuple[Verdict, tuple[ProcInfo, ...], tuple[Owner | None, ...] | None]:
        """The holder's verdict, its chain (parent, ... up to init) and, when known, the chain's owners:
        from the memo while every input of the verdict gives the same answer, else from classify() over
        this sample's table.

        Not memoised: a holder in a Slurm job (its job's state changes without any process changing)
        and a chain that could not be walked (unknown, and cheap)."""
        memos = self.memos
        if memos is None:
            verdict, chain, _ = self._classify(pid, table, table, jobs, job_states)
            return verdict, chain, None
        memo = memos.get(pid)
        if memo is not None and pid not in jobs and (owner is memo.owner or owner == memo.owner):
            if info is not memo.info and verdict_inputs(info) == memo.inputs:
                memo.info = info  # the same inputs: compare by identity next time
            if info is memo.info:
                ctx = memo.ctx  # _context_now, its usual answer (checked already this sample) inlined
                seen = self._ctx_now.get(id(ctx))
                shared = seen[1] if seen is not None and seen[0] is ctx else self._context_now(ctx, table)
                if shared is not None:
                    return memo.verdict, shared[0], shared[1]
        rec = _Recording(table)
        rec.get(pid)  # the holder first: its answer is the memo's own, the rest are the tree's
        verdict, chain, walked = self._classify(pid, rec, table, jobs, job_states)
        self._changed = True
        if pid in jobs or not walked:
            memos.pop(pid, None)
            return verdict, chain, None
        ctx = _Context(tuple(item for item in rec.gets.items() if item[0] != pid), tuple(rec.hides.items()),
                       chain)
        ctx = self.contexts.setdefault(ctx.key(), ctx)
        memos[pid] = _Memo(info, verdict_inputs(info), ctx, owner, verdict)
        return verdict, chain, None

    def judge(self, pid: int, table: ProcTable, jobs: dict[int, JobRef], job_states: dict[int, JobState]) -> Verdict:
        """classify() of a process that is not itself a holder (a zombie holder's parent), not memoised."""
        return self._classify(pid, table, table, jobs, job_states)[0]

    def _classify(self, pid: int, view, table: ProcTable, jobs: dict[int, JobRef],
                  job_states: dict[int, JobState]) -> tuple[Verdict, tuple[ProcInfo, ...], bool]:
        """classify() over ``view`` (the table, or a recording of it), the chain up to init, and whether
        that is the chain the verdict walked (False: the walk failed, the verdict is unknown)."""
        walked: list = []
        owners, cfg = self._owners, self.config
        verdict = classify(pid, view, platform=self.platform, protect=self._protect,
                           nohup_protects=cfg.nohup_protects, max_chain=cfg.max_chain,
                           walked=walked, owner_of=owners.of if owners is not None else None,
                           job_of=self._job_of if jobs else None, job_state=job_states.get,
                           protect_cmdline=self._protect_cmdline)
        if not walked:  # the walk failed (unknown): the chain as far as it goes
            return verdict, tuple(table.ancestors(pid, limit=cfg.max_chain)), False
        # The chain the verdict walked, up to init: the same as table.ancestors(pid).
        init = view.get(1) if walked[-1].ppid == 1 else None
        return verdict, tuple(walked[1:]) + ((init,) if init is not None else ()), True

    def _context_now(self, ctx: _Context, table: ProcTable
                     ) -> tuple[tuple[ProcInfo, ...], tuple[Owner | None, ...]] | None:
        """Once per sample per shared context: None if any of its answers changed, else the chain as
        this sample read it (new CPU time or RSS, the same verdict inputs) and the chain's owners."""
        seen = self._ctx_now.get(id(ctx))
        if seen is not None and seen[0] is ctx:
            return seen[1]
        out = None
        if ctx.holds(table):
            chain = ctx.current
            for c in chain:
                if table.get(c.pid) is not c:
                    # Kept for the next sample (as ``same`` keeps the newest records): a record re-read
                    # once its command line aged is a new object, and the same one ever after.
                    chain = ctx.current = tuple(table.get(c.pid) for c in chain)  # type: ignore[misc]
                    break
            owners = self._owners
            out = (chain, owners.of_all(chain) if owners is not None else ())
        self._ctx_now[id(ctx)] = (ctx, out)
        return out
