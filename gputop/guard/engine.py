"""The guard engine: evaluates a policy against each Snapshot and acts through gputop.actions.

Time is the snapshot's own clock (``Snapshot.at``, from the Sampler's injectable clock), so durations and
grace periods are tested with a controllable clock and real processes.

Per rule and per target (a process, or a user with ``scope: per_user``):
- each condition is measured now; a condition with ``duration`` is satisfied only after it has held at
  every evaluation for that long (a miss resets it);
- conditions are ANDed (``match: any`` ORs them); the rule *holds* when the combination is true;
- with ``grace_period``, the first time a rule holds the guard notifies and records a warning, waits, and
  acts only if the rule still holds when the grace is over (a miss in between clears the warning);
- the action (log, notify, kill, reap) runs at most once per ``repeat`` while the rule keeps holding;
- kill and reap go through gputop.actions (identity and safety re-checked there; dry-run there too);
- ``scope: per_user`` first plans (``plan_user_kills``, a pure function) the processes whose end brings
  the user back under the limit: newest first (or ``select: largest``), skipping the admin's exemptions
  and processes a protect pattern matches themselves (not their ancestry, nohup or chain length),
  counting a process the guard signalled earlier and that is still in its grace as going; it kills
  nothing when no such set exists (a ``cannot-reach-limit`` hit), then kills the planned set.
Every hit (warning, action, refusal, would-do) is recorded: time, rule, target, dry_run, action, outcome.
"""

from __future__ import annotations

import os
import socket
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from gputop import actions
from gputop.actions.common import log_record, record as audit_record, same_start
from gputop.core.config import Config
from gputop.guard import notify as _notify
from gputop.guard import state as _state
from gputop.guard.conditions import Facts, Outcome, Target, evaluate
from gputop.guard.exempt import Exempt, Exemption
from gputop.guard.policy import USER_LEVEL, Condition, Policy, Rule
from gputop.core.orphans import ORPHAN, PROTECTED, UNKNOWN, compile_protect, protect_reason
from gputop.core.model import Holder, Snapshot
from gputop.util.textsafe import visible
from gputop.util.units import fmt_bytes


# kill/reap outcomes that mean the selected process is no longer the one the snapshot counted.
_GONE = ("not-found", "identity-changed")
# kill/reap outcomes that mean the process got its signal and is still alive: it is going (a job that
# writes a checkpoint after SIGTERM), or another gputop is killing it.
_SIGNALLED = ("still-alive", "busy")


@dataclass(frozen=True)
class UserPlan:
    """Which of a user's processes a per-user kill/reap takes, decided before any signal."""

    chosen: tuple[Holder, ...]  # to kill, in this order; () when nothing is needed or nothing can reach
    going: tuple[Holder, ...]  # signalled before and still in their grace: counted as gone, not signalled
    skipped: tuple[tuple[Holder, str], ...]  # candidates that cannot be selected, with why
    reachable: bool  # with ``going`` and ``chosen`` gone the user is under the limit

    @property
    def needed(self) -> bool:
        return bool(self.chosen)


def unselectable(h: Holder, action: str = "kill",
                 protected_itself: Callable[[Holder], str | None] | None = None) -> str | None:
    """Why a per-user rule may not take ``h``, or None.

    Kill: only what the process itself is (issue 25): a protect pattern matching its own name or command
    line (anchored; a disguise never matches), and not what its ancestry, the nohup mark or a chain too
    long to follow say: those decide whether a tree is abandoned, not whether an admin's limit applies.
    Reap: the orphan verdict decides (protected and unknown trees are never reaped)."""
    if h.proc is None:
        return "cannot be seen here"
    if action != "kill":
        if h.verdict.kind == PROTECTED:
            return f"protected ({h.verdict.reason})"
        if h.verdict.kind == UNKNOWN:
            return f"unknown verdict ({h.verdict.reason})"
        return None
    if protected_itself is None:
        return f"protected ({h.verdict.reason})" if h.verdict.kind == PROTECTED else None
    why = protected_itself(h)
    return f"protected ({why})" if why else None


def _exe_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except (OSError, ValueError):
        return None


def plan_user_kills(ordered, still_over: Callable[[frozenset], bool], going=(),
                    why_not: Callable[[Holder], str | None] = unselectable) -> UserPlan:
    """The processes to kill to bring a user under the limit; pure (no process is touched).

    ``ordered``: the selectable candidates in the rule's order (newest first, or largest first);
    ``still_over(excluded_pids)``: whether the user is still over the limit with those PIDs gone;
    ``going``: holders signalled earlier and still in their grace, counted as gone. The plan takes the
    shortest prefix of the order (skipping what ``why_not`` names) that brings the user under; when even
    every selectable process would not, it takes none (``reachable`` False)."""
    going = tuple(going)
    gone = {h.pid for h in going}
    skipped: list[tuple[Holder, str]] = []
    if not still_over(frozenset(gone)):
        return UserPlan((), going, (), True)
    chosen: list[Holder] = []
    for h in ordered:
        if h.pid in gone:
            continue
        why = why_not(h)
        if why is not None:
            skipped.append((h, why))
            continue
        chosen.append(h)
        gone.add(h.pid)
        if not still_over(frozenset(gone)):
            return UserPlan(tuple(chosen), going, tuple(skipped), True)
    return UserPlan((), going, tuple(skipped), False)


def _secs(s: float) -> str:
    s = float(s)
    if s >= 3600 and s % 3600 == 0:
        return f"{int(s // 3600)}h"
    if s >= 3600:
        return f"{int(s // 3600)}h{int(s % 3600 // 60)}m"
    if s >= 60 and s % 60 == 0:
        return f"{int(s // 60)}m"
    if s >= 60:
        return f"{int(s // 60)}m{int(s % 60)}s"
    return f"{s:.0f}s" if s == int(s) else f"{s:.1f}s"


@dataclass(frozen=True)
class CondState:
    cond: Condition
    outcome: Outcome
    held: float | None  # seconds the condition has held (None when false now)
    satisfied: bool  # true now AND held for its duration

    @property
    def ok_now(self) -> bool:
        return self.outcome.ok

    def text(self) -> str:
        t = self.outcome.detail
        c = self.cond
        if c.duration:
            if not self.ok_now:
                t += f"; must hold for {_secs(c.duration)}"
            elif self.satisfied:
                t += f"; held for {_secs(self.held or 0)} (>= {_secs(c.duration)})"
            else:
                t += f"; held for {_secs(self.held or 0)} of the {_secs(c.duration)} required: not yet"
        return t


@dataclass(frozen=True)
class Assessment:
    """One rule on one target at one evaluation."""

    rule: Rule
    target: Target
    states: tuple[CondState, ...]
    holds: bool  # the rule holds, durations included
    holds_now: bool  # the conditions are true now, durations not counted
    candidates: tuple[Holder, ...] = ()  # per_user: the user's processes that can be selected
    candidate_states: dict = field(default_factory=dict)  # per_user: pid -> tuple[CondState] (process-level)

    @property
    def reason(self) -> str:
        return "; ".join(s.text() for s in self.states)


def _combine(match: str, values: list[bool]) -> bool:
    if not values:
        return True
    return any(values) if match == "any" else all(values)


def _holder_dict(h: Holder) -> dict:
    return {"pid": h.pid, "start_time": h.start_time, "name": h.name, "user": h.user,
            "cmdline": list(h.proc.cmdline) if h.proc else None, "gpus": list(h.gpus),
            "gpu_memory": h.gpu_memory, "sm_util": h.sm_util}


class Engine:
    """Keeps per-target timing between evaluations. One engine per running guard."""

    def __init__(self, policy: Policy, *, config: Config | None = None, sampler=None,
                 record: Callable[[dict], None] | None = None,
                 notifier: Callable[..., list[dict]] | None = None, out=None):
        self.policy = policy
        self.config = config or Config()
        self.sampler = sampler
        self.record = record if record is not None else _state.append_hit
        self.notifier = notifier or _notify.send
        self.out = out  # a text stream for one line per hit (the daemon's stderr); None: quiet
        self.host = socket.gethostname()
        self._since: dict[tuple, float] = {}
        self._pending: dict[tuple, tuple[float, Target]] = {}
        self._acted: dict[tuple, float] = {}
        # per_user: pid -> (start time, until): signalled by a per-user kill, not gone yet, counted as going
        # until ``until`` (the snapshot clock); see _going_now.
        self._going: dict[int, tuple[float | None, float]] = {}
        self.counts: Counter = Counter()
        self._snap: Snapshot | None = None
        self._exempt: tuple[Config, Exempt] | None = None
        self._protects: tuple | None = None

    @property
    def exempt(self) -> Exempt:
        """The admin's guard.exempt lists of the current config (the daemon swaps ``config`` on SIGHUP)."""
        if self._exempt is None or self._exempt[0] is not self.config:
            self._exempt = (self.config, Exempt.from_config(self.config))
        return self._exempt[1]

    # ---- policy and mode changes ----

    def set_policy(self, policy: Policy) -> None:
        """Swap in a new policy; timing is kept only for rules that did not change."""
        old = {r.name: r for r in self.policy.rules}
        keep = {r.name for r in policy.rules if old.get(r.name) == r}
        for d in (self._since, self._pending, self._acted):
            for k in [k for k in d if k[0] not in keep]:
                del d[k]
        self.policy = policy

    def mode_changed(self) -> None:
        """A mode switch re-arms actions (a dry-run 'would kill' must not delay a real kill)."""
        self._acted.clear()
        self._pending.clear()

    def reset(self) -> None:
        self._since.clear()
        self._pending.clear()
        self._acted.clear()
        self._going.clear()

    # ---- assessment (no side effects but timing) ----

    def _cond_state(self, rule: Rule, i: int, cond: Condition, target: Target, snap: Snapshot,
                    facts: Facts, now: float, seen: set) -> CondState:
        out = evaluate(cond, target, snap, facts)
        key = (rule.name, i, target.key)
        if not out.ok:
            self._since.pop(key, None)
            return CondState(cond, out, None, False)
        seen.add(key)
        since = self._since.setdefault(key, now)
        held = max(0.0, now - since)
        return CondState(cond, out, held, cond.duration is None or held >= cond.duration)

    def assess(self, rule: Rule, snap: Snapshot, facts: Facts | None = None,
               seen: set | None = None) -> list[Assessment]:
        facts = facts or Facts.of(snap)
        seen = seen if seen is not None else set()
        now = snap.at
        out: list[Assessment] = []
        if rule.per_allocation:
            return self._assess_allocations(rule, snap, facts, seen)
        if not rule.per_user:
            for h in snap.holders:
                if h.proc is None:
                    continue  # not visible here: no identity to act on (reported by status/audit)
                t = Target.process(h)
                states = tuple(self._cond_state(rule, i, c, t, snap, facts, now, seen)
                               for i, c in enumerate(rule.conditions))
                out.append(Assessment(rule, t, states, _combine(rule.match, [s.satisfied for s in states]),
                                      _combine(rule.match, [s.ok_now for s in states]), (h,)))
            return out
        user_conds = [(i, c) for i, c in enumerate(rule.conditions) if c.type in USER_LEVEL]
        proc_conds = [(i, c) for i, c in enumerate(rule.conditions) if c.type not in USER_LEVEL]
        for user in sorted(facts.user_holders):
            t = Target.for_user(user)
            states = tuple(self._cond_state(rule, i, c, t, snap, facts, now, seen) for i, c in user_conds)
            cands = []
            cstates = {}
            for h in facts.user_holders[user]:
                if h.proc is None:
                    continue
                ht = Target.process(h)
                ps = tuple(self._cond_state(rule, i, c, ht, snap, facts, now, seen) for i, c in proc_conds)
                cstates[h.pid] = ps
                if all(s.satisfied for s in ps):
                    cands.append(h)
            holds = _combine(rule.match, [s.satisfied for s in states]) and bool(cands)
            holds_now = _combine(rule.match, [s.ok_now for s in states]) and any(
                all(s.ok_now for s in cstates[h.pid]) for h in facts.user_holders[user] if h.pid in cstates)
            out.append(Assessment(rule, t, states, holds, holds_now, tuple(cands), cstates))
        return out

    def _assess_allocations(self, rule: Rule, snap: Snapshot, facts: Facts, seen: set) -> list[Assessment]:
        """A rule on idle allocations: one target per allocated GPU (gputop.core.allocation)."""
        out: list[Assessment] = []
        by_gpu = snap.allocation.by_gpu if snap.allocation is not None else {}
        for gpu, alloc in sorted(by_gpu.items()):
            t = Target.for_allocation(gpu, alloc.job, alloc.user)
            states = tuple(self._cond_state(rule, i, c, t, snap, facts, snap.at, seen)
                           for i, c in enumerate(rule.conditions))
            out.append(Assessment(rule, t, states, _combine(rule.match, [s.satisfied for s in states]),
                                  _combine(rule.match, [s.ok_now for s in states]), ()))
        return out

    def order(self, rule: Rule, candidates) -> list[Holder]:
        if rule.select == "largest":
            return sorted(candidates, key=lambda h: (-(h.gpu_memory if h.gpu_memory is not None else -1),
                                                     -(h.start_time or 0)))
        return sorted(candidates, key=lambda h: -(h.start_time or 0))

    def _user_still_over(self, rule: Rule, target: Target, snap: Snapshot, excluded: set[int]) -> bool:
        facts = Facts.of(snap, frozenset(excluded))
        conds = [c for c in rule.conditions if c.type in USER_LEVEL]
        return _combine(rule.match, [evaluate(c, target, snap, facts).ok for c in conds])

    # ---- evaluation with actions ----

    def evaluate(self, snap: Snapshot, mode: str) -> list[dict]:
        """Evaluate every enabled rule on ``snap``; act per ``mode`` ('dry-run' or 'enforce').
        Returns the hits (each also passed to ``record``)."""
        if mode not in ("dry-run", "enforce"):
            return []
        now = snap.at
        self._snap = snap
        facts = Facts.of(snap)
        hits: list[dict] = []
        seen: set = set()
        present: set = set()
        for rule in self.policy.rules:
            if not rule.enabled:
                continue
            for a in self.assess(rule, snap, facts, seen):
                key = (rule.name, a.target.key)
                present.add(key)
                hits.extend(self._step(rule, a, key, snap, mode, now))
        for k in [k for k in self._since if k not in seen]:
            del self._since[k]
        for key in [k for k in self._pending if k not in present]:
            started, target = self._pending.pop(key)
            rule = self.policy.rule(key[0])
            if rule is not None:
                hits.append(self._emit(rule, target, mode, "warn", "cleared",
                                       f"{target.label} is gone; the warning is cleared, nothing done", now))
        for k in [k for k in self._acted if k not in present]:
            del self._acted[k]
        self.counts["evaluations"] += 1
        return hits

    def _step(self, rule: Rule, a: Assessment, key: tuple, snap: Snapshot, mode: str, now: float) -> list[dict]:
        if not a.holds:
            self._acted.pop(key, None)
            if key in self._pending:
                del self._pending[key]
                return [self._emit(rule, a.target, mode, "warn", "cleared",
                                   f"rule no longer holds for {a.target.label} after the warning: nothing "
                                   f"done ({a.reason})", now)]
            return []
        last = self._acted.get(key)
        if last is not None and now - last < rule.repeat:
            return []
        hits: list[dict] = []
        if rule.grace_period:
            pending = self._pending.get(key)
            if pending is None:
                self._pending[key] = (now, a.target)
                msg = (f"rule holds for {a.target.label}: will {rule.action} in {_secs(rule.grace_period)} "
                       f"if it still holds then ({a.reason})")
                hit = self._emit(rule, a.target, mode, "warn", "grace-started", msg, now, notify_now=True)
                return [hit]
            if now - pending[0] < rule.grace_period:
                return []
            del self._pending[key]
        self._acted[key] = now
        hits.extend(self._act(rule, a, snap, mode, now))
        return hits

    def _act(self, rule: Rule, a: Assessment, snap: Snapshot, mode: str, now: float) -> list[dict]:
        if rule.action in ("log", "notify") or not rule.per_user:
            victims = [a.target.holder] if a.target.holder is not None else []
            if rule.action in ("log", "notify"):
                return [self._emit(rule, a.target, mode, rule.action,
                                   "logged" if rule.action == "log" else "notified",
                                   f"rule holds for {a.target.label}: {a.reason}", now,
                                   notify_now=True)]
            return [self._do(rule, a.target, h, a.reason, mode, now) for h in victims]
        return self._act_per_user(rule, a, snap, mode, now)

    def _going_now(self, snap: Snapshot, now: float) -> dict[int, Holder]:
        """The holders signalled earlier by a per-user kill that are the same process still, and still in
        their grace; the others are forgotten."""
        out = {}
        for pid, (start, until) in list(self._going.items()):
            h = snap.holder(pid)
            if h is None or not same_start(h.start_time, start) or now >= until:
                del self._going[pid]
            else:
                out[pid] = h
        return out

    def plan(self, rule: Rule, a: Assessment, snap: Snapshot, going: dict[int, Holder] | None = None,
             refused: frozenset = frozenset()) -> UserPlan:
        """The per-user plan for ``a`` on ``snap`` (``refused``: PIDs whose kill was refused this pass)."""
        going = going if going is not None else self._going_now(snap, snap.at)
        mine = [h for h in going.values() if h.user == a.target.user]
        def why_not(h: Holder) -> str | None:
            if h.pid in refused:
                return "its kill was refused just now"
            ex = self.exempt.match(h.pid, h.start_time) if self.exempt else None
            if ex is not None:
                return f"exempt by {ex.describe()}"
            return unselectable(h, rule.action, self._protected_itself)

        return plan_user_kills(
            self.order(rule, a.candidates), lambda gone: self._user_still_over(rule, a.target, snap, set(gone)),
            mine, why_not)

    def _protected_itself(self, h: Holder) -> str | None:
        """Whether the process itself matches a protect pattern of the current config (its name or argv[0]
        anchored, not disguised; or its command line): what a per-user kill skips."""
        if self._protects is None or self._protects[0] is not self.config:
            self._protects = (self.config, compile_protect(self.config.protect),
                              compile_protect(self.config.protect_cmdline))
        _, names, cmdline = self._protects
        return protect_reason(h.proc, names, False, cmdline, _exe_of)

    def _act_per_user(self, rule: Rule, a: Assessment, snap: Snapshot, mode: str, now: float) -> list[dict]:
        """Plan the set that brings the user under the limit, then kill it; none when no set can."""
        going = self._going_now(snap, now)
        grace = max(rule.repeat, rule.timeout if rule.timeout is not None else self.config.kill_timeout)
        hits: list[dict] = []
        refused: set[int] = set()
        while True:
            plan = self.plan(rule, a, snap, going, frozenset(refused))
            if not plan.reachable:
                hits.append(self._cannot_reach(rule, a, plan, mode, now, after_kills=bool(hits)))
                return hits
            if not plan.needed:
                if not hits and plan.going:
                    hits.append(self._waiting(rule, a, plan, mode, now))
                break
            failed = False
            for h in plan.chosen:
                why = (f"{a.reason}; selected pid {h.pid} as the {rule.select} of user {a.target.user}'s "
                       f"{len(a.candidates)} process(es) ({fmt_bytes(h.gpu_memory)})")
                if plan.going:
                    why += "; counted as going: " + ", ".join(f"pid {g.pid}" for g in plan.going)
                hit = self._do(rule, a.target, h, why, mode, now)
                hits.append(hit)
                if hit["ok"] or hit["outcome"] in _GONE:
                    # Killed, or already gone (it exited, or its PID is another process now): it no longer
                    # counts towards the user's total. (Dry-run: counted as gone, to show what enforce
                    # would do.)
                    going[h.pid] = h
                elif hit["outcome"] in _SIGNALLED:
                    # Signalled and still alive (a checkpoint after SIGTERM, say): going. Until its grace
                    # is over no other process of the user is chosen for its memory, here or later.
                    going[h.pid] = h
                    if mode == "enforce":
                        self._going[h.pid] = (h.start_time, now + grace)
                else:  # refused, no permission, failed: plan again without it
                    refused.add(h.pid)
                    failed = True
                    break
            if not failed:
                break
        if hits and not self._user_still_over(rule, a.target, snap, set(going)):
            for hit in hits:
                hit.setdefault("details", {})["user_back_under_limit"] = True
        return hits

    def _waiting(self, rule: Rule, a: Assessment, plan: UserPlan, mode: str, now: float) -> dict:
        pids = ", ".join(f"pid {h.pid} ({visible(h.name)}, {fmt_bytes(h.gpu_memory)})" for h in plan.going)
        return self._emit(rule, a.target, mode, rule.action, "waiting",
                          f"{a.target.label} is over the limit only by what was already signalled and is "
                          f"still in its grace ({pids}): no other process is chosen meanwhile", now,
                          reason=a.reason)

    def _cannot_reach(self, rule: Rule, a: Assessment, plan: UserPlan, mode: str, now: float,
                      after_kills: bool) -> dict:
        """No set of the user's selectable processes brings the user under the limit: kill nothing (more),
        say so, in the hits and in the audit log."""
        left = ", ".join(f"pid {h.pid} ({visible(h.name)}, {fmt_bytes(h.gpu_memory)}): {why}"
                         for h, why in plan.skipped)
        msg = (f"{a.target.label} stays over the limit even if every process the guard may take were killed"
               + (f" (it may not take {left})" if left else "")
               + (": nothing more was signalled after the refusal above" if after_kills else ": nothing was killed"))
        hit = self._emit(rule, a.target, mode, rule.action, "cannot-reach-limit", msg, now, ok=False,
                         reason=a.reason, notify_now=True)
        details = {"rule": rule.name, "user": a.target.user,
                   "skipped": [{"pid": h.pid, "start_time": h.start_time, "gpu_memory": h.gpu_memory, "why": why}
                               for h, why in plan.skipped],
                   "going": [h.pid for h in plan.going]}
        rec = audit_record(rule.action, "guard", "cannot-reach-limit", False, msg,
                           {"pid": None, "user": a.target.user, "start_time": None, "uid": None, "name": None,
                            "cmdline": None, "gpus": []},
                           [], rule.name, dry_run=mode != "enforce", details=details)
        log_record(rec, self.config, hit.setdefault("details", {}))
        return hit

    def _do(self, rule: Rule, target: Target, h: Holder, why: str, mode: str, now: float) -> dict:
        dry = mode != "enforce"
        timeout = rule.timeout if rule.timeout is not None else self.config.kill_timeout
        ptarget = Target.process(h)
        root_pid, root_start = h.pid, h.start_time
        if rule.action == "reap":  # the holder's whole orphan tree, from its root
            snap = self._snap
            if h.verdict.kind == ORPHAN and snap is not None:
                root = next((r for r in snap.roots if h.pid in r.holders), None)
                if root is not None:
                    root_pid, root_start = root.pid, root.proc.start_time
        # The admin's exemptions, read from the live process right before acting (gputop.guard.exempt):
        # only what a user cannot forge. A name, ancestry, the nohup mark or chain length never exempts.
        ex = self._exemption(h, root_pid, root_start)
        if ex is not None:
            return self._exempt_hit(rule, ptarget if rule.per_user else target, h, ex, why, mode, now)
        if rule.action == "kill":
            # The rule matched the process itself: its orphan verdict (protected, unknown) does not exempt it.
            res = actions.kill_process(h.pid, expected_start=h.start_time, face="guard", force=rule.force,
                                       timeout=timeout, dry_run=dry, sampler=self.sampler,
                                       config=self.config, reason=rule.name, policy=True)
        else:  # reap is about abandoned trees: the orphan verdict decides, protect rules and nohup included
            res = actions.reap_tree(root_pid, expected_start=root_start, face="guard", grace=timeout,
                                    dry_run=dry, sampler=self.sampler, config=self.config, reason=rule.name)
        hit = self._emit(rule, ptarget if rule.per_user else target, mode, rule.action, res.outcome,
                         res.message, now, ok=res.ok, reason=why, result=res, notify_now=True, holder=h)
        return hit

    def _exemption(self, h: Holder, root_pid: int, root_start: float | None) -> Exemption | None:
        exempt = self.exempt
        if not exempt:
            return None
        ex = exempt.match(h.pid, h.start_time)
        if ex is None and root_pid != h.pid:  # a reap signals the whole tree: its root too
            ex = exempt.match(root_pid, root_start)
            if ex is not None:
                ex = Exemption(ex.key, ex.value, f"its tree root pid {root_pid}: {ex.evidence}")
        return ex

    def _exempt_hit(self, rule: Rule, target: Target, h: Holder, ex: Exemption, why: str, mode: str,
                    now: float) -> dict:
        """The rule holds, but the admin exempted the process: nothing done, in the hits and the audit log."""
        from gputop.actions.common import log_record, record

        msg = (f"pid {h.pid} ({visible(h.name)}, user {h.user or '?'}) is exempt by {ex.describe()}: "
               f"no {rule.action}")
        details: dict = {"exempt": ex.to_dict(), "rule": "exempt"}
        tgt = {"pid": h.pid, "start_time": h.start_time, "user": h.user, "name": h.name,
               "cmdline": list(h.proc.cmdline) if h.proc else None, "gpus": sorted(set(h.gpus))}
        log_record(record(rule.action, "guard", "exempt", False, msg, tgt, [], rule.name, dry_run=mode != "enforce",
                          details=details), self.config, details)
        return self._emit(rule, target, mode, rule.action, "exempt", msg, now, ok=False, reason=why,
                          notify_now=False, holder=h, details=details)

    def _emit(self, rule: Rule, target: Target, mode: str, action: str, outcome: str, message: str,
              now: float, *, ok: bool = True, reason: str | None = None, result=None,
              notify_now: bool = False, holder: Holder | None = None, details: dict | None = None) -> dict:
        h = holder or target.holder
        hit = {
            "time": now, "rule": rule.name, "pid": h.pid if h else None,
            "target": h.name if h else (target.label if target.kind == "allocation" else f"user {target.user}"),
            "user": target.user if h is None else h.user,
            "dry_run": mode != "enforce", "action": action, "outcome": outcome, "message": message,
            "ok": ok, "mode": mode, "scope": rule.scope, "start_time": h.start_time if h else None,
            "gpus": list(h.gpus) if h else ([target.key[1]] if target.kind == "allocation" else []), "reason": reason,
        }
        if result is not None:
            hit["details"] = {"exit_code": result.exit_code, "memory_released": result.memory_released}
            if result.details.get("audit_error"):
                hit["details"]["audit_error"] = result.details["audit_error"]  # shown with the hit, not lost
            if result.details.get("policy_overrides"):
                hit["details"]["policy_overrides"] = result.details["policy_overrides"]
        if details:
            hit.setdefault("details", {}).update(details)
        if notify_now and rule.notify:
            subject = (f"[gputop guard] {self.host}: rule '{rule.name}' {action} {outcome}"
                       f"{' (dry-run)' if hit['dry_run'] else ''}: "
                       f"{target.label if h is None else Target.process(h).label}")
            payload = {"host": self.host, "rule": rule.name, "description": rule.description, **{
                k: hit[k] for k in ("time", "pid", "target", "user", "dry_run", "action", "outcome",
                                    "message", "reason", "gpus")}}
            if h is not None:
                payload["process"] = _holder_dict(h)
            hit["notify"] = self.notifier(rule.notify, subject, payload, self.config)
        self.counts["hits"] += 1
        self.counts[f"{action}:{outcome}"] += 1
        self.record(hit)
        if self.out is not None:
            tag = "DRY-RUN " if hit["dry_run"] and action in ("kill", "reap") else ""
            line = f"gputop guard: {tag}[{rule.name}] {action} {outcome}: {message}"
            for n in hit.get("notify") or []:
                line += f"\n  notify {n['target']}: {n['outcome']}"
            try:
                self.out.write(line + "\n")
                self.out.flush()
            except OSError:
                pass
        return hit


# ---- --test-policies -------------------------------------------------------------------------

def _action_text(rule: Rule, config: Config) -> str:
    if rule.action == "kill":
        t = rule.timeout if rule.timeout is not None else config.kill_timeout
        return (f"kill (SIGTERM, then SIGKILL after {_secs(t)})" if rule.force else "kill (SIGTERM only)")
    if rule.action == "reap":
        return "reap (the holder's whole orphan tree)"
    return rule.action


def _refusal_note(h: Holder, rule: Rule | None = None, exempt: Exempt | None = None) -> str:
    if exempt:
        ex = exempt.match(h.pid, h.start_time)
        if ex is not None:
            return f"; exempt by {ex.describe()}: nothing will be done"
    if rule is not None and rule.action == "kill":
        # A kill rule matched the process itself: its orphan verdict does not exempt it (kill_process policy).
        if h.proc is None:
            return "; not visible here: the kill will be refused"
        return ""
    if h.verdict.kind in ("protected", "unknown"):
        return f"; {h.verdict.kind}: the {rule.action if rule else 'kill'} will be refused"
    return ""


def explain(policy: Policy, snap: Snapshot, config: Config | None = None) -> list[dict]:
    """What the policy would do on ``snap`` and why, per rule and per target (one sample: no history)."""
    config = config or Config()
    eng = Engine(policy, config=config, record=lambda h: None)
    facts = Facts.of(snap)
    out = []
    for rule in policy.rules:
        entry = {"rule": rule.name, "action": _action_text(rule, config), "match": rule.match,
                 "scope": rule.scope, "enabled": rule.enabled, "targets": []}
        if not rule.enabled:
            entry["note"] = "disabled (enabled: false)"
        for a in eng.assess(rule, snap, facts):
            waiting = [s for s in a.states if s.ok_now and not s.satisfied]
            if rule.per_user:
                for ps in a.candidate_states.values():
                    waiting += [s for s in ps if s.ok_now and not s.satisfied]
            if not a.holds_now:
                verdict = "no action"
                decision = "none"
            else:
                what = _action_text(rule, config)
                victims = ""
                if rule.per_user and rule.action in ("kill", "reap"):
                    # The guard's own plan (plan_user_kills): what it would take, and what it may not.
                    plan = eng.plan(rule, a, snap, going={})
                    skipped = "".join(f"; may not take pid {h.pid} ({visible(h.name)}): {why}"
                                      for h, why in plan.skipped)
                    if plan.reachable:
                        victims = " -> " + ", then ".join(
                            f"pid {h.pid} ({visible(h.name)}, {fmt_bytes(h.gpu_memory)}"
                            f"{_refusal_note(h, rule, eng.exempt)})"
                            for h in plan.chosen) + f" ({rule.select} first, until back under the limit){skipped}"
                    else:
                        victims = (" -> nothing: the user stays over the limit even if every process the guard "
                                   f"may take were killed{skipped}")
                grace = (f"warn{' and notify ' + ', '.join(rule.notify) if rule.notify else ''}, wait "
                         f"{_secs(rule.grace_period)}, re-check, then " if rule.grace_period else "")
                if waiting:
                    need = ", ".join(f"{s.cond.type} for {_secs(s.cond.duration)}" for s in waiting)
                    verdict = (f"not yet: conditions are true now but must hold continuously ({need}); "
                               f"once they have: {grace}{what}{victims}")
                    decision = "pending-duration"
                else:
                    note = _refusal_note(a.target.holder, rule, eng.exempt) if a.target.holder is not None \
                        and rule.action in ("kill", "reap") else ""
                    verdict = f"would {grace}{what}{victims}{note}"
                    decision = "would-act"
            conds = [s.text() for s in a.states]
            if rule.per_user:
                for pid, ps in a.candidate_states.items():
                    conds += [f"pid {pid}: {s.text()}" for s in ps]
            entry["targets"].append({"target": a.target.label, "pid": a.target.pid, "user": a.target.user,
                                     "decision": decision, "verdict": verdict, "conditions": conds})
        out.append(entry)
    return out


def render_explanation(items: list[dict], mode: str) -> str:
    lines = [f"guard mode: {mode} (--test-policies evaluates one sample and changes nothing)"]
    for e in items:
        lines.append("")
        lines.append(f"rule '{e['rule']}': action {e['action']}, match {e['match']}, scope {e['scope']}"
                     + (f" [{e['note']}]" if e.get("note") else ""))
        if not e["targets"]:
            lines.append("  no targets (no GPU-holding process visible here)")
        for t in e["targets"]:
            lines.append(f"  {t['target']}: {t['verdict']}")
            for c in t["conditions"]:
                lines.append(f"    - {c}")
    return "\n".join(lines)


def print_hit(hit: dict, stream=None) -> None:
    stream = stream or sys.stderr
    stream.write(f"{hit['rule']}: {hit['action']} {hit['outcome']}: {hit['message']}\n")
