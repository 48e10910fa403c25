"""Per-user guard rules on real processes holding simulated GPUs: the guard plans the set of kills that
brings the user under the limit, counts a signalled job that is still writing its checkpoint as going,
and kills nothing when no set can reach the limit. The user's other jobs and a bystander survive."""

from __future__ import annotations

import subprocess
import sys
import os
import textwrap
import time

from gputop.core import auditlog
from gputop.core.config import Config
from gputop.guard.engine import Engine
from gputop.guard.policy import load_policy, parse_policy
from tests.conftest import ROOT, wait_gone
from tests.functional.guard_helpers import Clock, sampler_for

BRIEF = ROOT / "examples" / "policy.yaml"  # the seed policy: limit-user-memory, 8 GiB, newest first


def spawn_sleeps(procs, n: int):
    """n real `sleep` processes with distinct start times, oldest first."""
    out = []
    for _ in range(n):
        out.append(procs.spawn(["sleep", "600"]))
        time.sleep(0.03)  # start times are kept to 0.01 s
    return out


def checkpointing(procs, *, seconds: float | None = None, release=None) -> subprocess.Popen:
    """A real job whose SIGTERM handler takes a while (writing a checkpoint) before it exits: ``seconds``,
    or until the file ``release`` exists (at most 60 s)."""
    if release is not None:
        wait = (f"    d = time.time() + 60\n    while not os.path.exists({str(release)!r}) and time.time() < d:\n"
                "        time.sleep(0.05)\n")
    else:
        wait = f"    time.sleep({seconds})\n"
    code = ("import os, signal, sys, time\ndef term(*a):\n" + wait + "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, term)\nprint('ready', flush=True)\ntime.sleep(600)\n")
    p = procs.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"ready"
    time.sleep(0.03)
    return p


def alive(p) -> bool:
    return p.poll() is None


def kill_records() -> list[dict]:
    return [r for r in auditlog.read() if r.get("action") == "kill"]


def test_newest_job_that_takes_seconds_to_exit_is_the_only_one_killed(procs, scenario):
    small_1, small_2 = spawn_sleeps(procs, 2)
    big = checkpointing(procs, seconds=4)  # the newest: 9 GiB, needs 4 s after SIGTERM; the kill waits 1 s
    bystander = procs.sleeper("gt-bystander")
    path = scenario(holders=[{"pid": small_1.pid, "gpu": 0, "memory": "1GiB"},
                             {"pid": small_2.pid, "gpu": 1, "memory": "1GiB"},
                             {"pid": big.pid, "gpu": 0, "memory": "9GiB"}])
    clock = Clock()
    cfg = Config(kill_timeout=1.0)
    sampler = sampler_for(path, clock, cfg)
    hits: list[dict] = []
    eng = Engine(load_policy(BRIEF), config=cfg, sampler=sampler, record=hits.append)
    (warn,) = eng.evaluate(sampler.sample(), "enforce")
    assert warn["outcome"] == "grace-started" and warn["rule"] == "limit-user-memory"
    clock.advance(31)
    acted = eng.evaluate(sampler.sample(), "enforce")
    # SIGTERM went to the newest; 1 s later it is still writing its checkpoint: still-alive, and going.
    assert [(h["pid"], h["outcome"]) for h in acted] == [(big.pid, "still-alive")], acted
    assert alive(small_1) and alive(small_2)
    assert [r["target"]["pid"] for r in kill_records()] == [big.pid]
    assert wait_gone(big.pid, 15)  # it ends by itself, checkpoint written
    clock.advance(5)
    assert eng.evaluate(sampler.sample(), "enforce") == []  # 2 GiB left: the rule does not hold
    time.sleep(0.2)
    assert alive(small_1) and alive(small_2) and alive(bystander)
    assert [r["target"]["pid"] for r in kill_records()] == [big.pid]


def test_no_new_victim_while_a_signalled_job_is_still_in_its_grace(procs, scenario, tmp_path):
    """Across evaluations: the rule stops holding and holds again (the user started a new job) while the
    signalled job still checkpoints. The new job must not be chosen for memory that is already going."""
    release = tmp_path / "checkpoint-done"
    a, b = spawn_sleeps(procs, 2)
    big = checkpointing(procs, release=release)
    holders = [{"pid": a.pid, "gpu": 0, "memory": "1GiB"}, {"pid": b.pid, "gpu": 1, "memory": "1GiB"},
               {"pid": big.pid, "gpu": 0, "memory": "7GiB"}]
    path = scenario(holders=holders)
    pol = parse_policy(textwrap.dedent("""\
        rules:
          - name: cap
            scope: per_user
            conditions:
              - {type: user_memory, operator: ">", value: 8GiB}
            action: kill
            timeout: 1s
    """))
    clock = Clock()
    sampler = sampler_for(path, clock)
    hits: list[dict] = []
    eng = Engine(pol, sampler=sampler, record=hits.append)
    acted = eng.evaluate(sampler.sample(), "enforce")  # 9 GiB: the newest (7 GiB) is enough
    assert [(h["pid"], h["outcome"]) for h in acted] == [(big.pid, "still-alive")], acted
    assert alive(a) and alive(b) and alive(big)
    b.terminate()  # the user frees 1 GiB: 8 GiB, the rule no longer holds
    b.wait(5)
    clock.advance(2)
    assert eng.evaluate(sampler.sample(), "enforce") == []
    c = procs.spawn(["sleep", "600"])  # ... and starts a new job: 9 GiB again; c is the newest now
    path = scenario(holders=holders + [{"pid": c.pid, "gpu": 1, "memory": "1GiB"}])
    clock.advance(2)
    assert alive(big)
    (wait,) = eng.evaluate(sampler.sample(), "enforce")
    assert wait["outcome"] == "waiting" and f"pid {big.pid}" in wait["message"], wait
    assert "no other process is chosen" in wait["message"]
    time.sleep(0.2)
    assert alive(c) and alive(a)
    release.write_text("done")
    assert wait_gone(big.pid, 15)
    clock.advance(2)
    assert eng.evaluate(sampler.sample(), "enforce") == []  # 2 GiB: under the limit
    assert alive(c) and alive(a)
    assert [r["target"]["pid"] for r in kill_records()] == [big.pid]


def test_protected_newest_job_means_nothing_is_killed_and_the_hit_says_why(procs, scenario):
    small_1, small_2 = spawn_sleeps(procs, 2)
    # the newest: a jupyter kernel (protected by the default protect_cmdline), 9 GiB
    code = "import time; time.sleep(600)"
    jupyter = procs.spawn([sys.executable, "-c", code, "-m", "ipykernel_launcher"])
    bystander = procs.sleeper("gt-bystander")
    path = scenario(holders=[{"pid": small_1.pid, "gpu": 0, "memory": "1GiB"},
                             {"pid": small_2.pid, "gpu": 1, "memory": "1GiB"},
                             {"pid": jupyter.pid, "gpu": 0, "memory": "9GiB"}])
    clock = Clock()
    sampler = sampler_for(path, clock)
    snap = sampler.sample()
    assert snap.holder(jupyter.pid).verdict.kind == "protected"
    hits: list[dict] = []
    eng = Engine(load_policy(BRIEF), sampler=sampler, record=hits.append)
    (warn,) = eng.evaluate(snap, "enforce")
    assert warn["outcome"] == "grace-started"
    clock.advance(31)
    (hit,) = eng.evaluate(sampler.sample(), "enforce")
    assert hit["outcome"] == "cannot-reach-limit" and hit["ok"] is False and hit["action"] == "kill", hit
    assert "nothing was killed" in hit["message"] and f"pid {jupyter.pid}" in hit["message"]
    assert "protected" in hit["message"]
    assert hits[-1] is hit  # in the hit log
    time.sleep(0.2)
    assert alive(small_1) and alive(small_2) and alive(jupyter) and alive(bystander)
    recs = kill_records()
    assert [r["outcome"] for r in recs] == ["cannot-reach-limit"], recs  # in the audit log; no signal sent
    assert recs[0]["face"] == "guard" and recs[0]["reason"] == "limit-user-memory" and recs[0]["signals"] == []
    assert recs[0]["details"]["skipped"][0]["pid"] == jupyter.pid
    # dry-run says the same, and kills nothing either
    eng2 = Engine(load_policy(BRIEF), sampler=sampler, record=lambda h: None)
    eng2.evaluate(sampler.sample(), "dry-run")
    clock.advance(31)
    (dry,) = eng2.evaluate(sampler.sample(), "dry-run")
    assert dry["outcome"] == "cannot-reach-limit" and dry["dry_run"] is True
    assert alive(small_1) and alive(small_2) and alive(jupyter)


def test_a_kill_refused_at_act_time_is_planned_around_and_an_unreachable_rest_is_left_alone(procs, scenario):
    """The plan takes the largest first, but its kill is refused at act time (it is the guard's own
    process: a hard rule no policy overrides). The guard plans again without it: when the rest can reach
    the limit it takes the rest; when it cannot, it kills nothing more."""
    me = os.getpid()

    def run(limit: str):
        small, mid = spawn_sleeps(procs, 2)
        bystander = procs.sleeper("gt-bystander")
        path = scenario(holders=[{"pid": me, "gpu": 0, "memory": "3GiB"},
                                 {"pid": small.pid, "gpu": 1, "memory": "1GiB"},
                                 {"pid": mid.pid, "gpu": 0, "memory": "2GiB"}])
        pol = parse_policy(textwrap.dedent(f"""\
            rules:
              - name: cap
                scope: per_user
                select: largest
                conditions:
                  - {{type: user_memory, operator: ">", value: {limit}}}
                action: kill
                timeout: 2s
        """))
        clock = Clock()
        sampler = sampler_for(path, clock, Config())
        eng = Engine(pol, config=Config(), sampler=sampler, record=lambda h: None)
        hits = eng.evaluate(sampler.sample(), "enforce")
        return hits, small, mid, bystander

    # 6 GiB, limit 3 GiB: the largest (3 GiB, refused: gputop itself) alone was the plan; then mid (2) and
    # small (1) reach it.
    hits, small, mid, bystander = run("3GiB")
    assert [(h["pid"], h["outcome"]) for h in hits] == [
        (me, "refused"), (mid.pid, "terminated"), (small.pid, "terminated")], hits
    assert wait_gone(small.pid) and wait_gone(mid.pid)
    assert alive(bystander)
    bystander.kill()
    bystander.wait(5)
    # 6 GiB, limit 1 GiB: without the largest (3 GiB) nothing can get under: only the refusal, no kill.
    hits, small, mid, bystander = run("1GiB")
    assert [(h["pid"], h["outcome"]) for h in hits] == [(me, "refused"), (None, "cannot-reach-limit")], hits
    assert "its kill was refused just now" in hits[1]["message"]
    time.sleep(0.2)
    assert alive(small) and alive(mid) and alive(bystander)
