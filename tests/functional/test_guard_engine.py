"""The guard engine on real processes holding simulated GPUs, with a controllable clock.

Only the GPU is simulated. The processes are real, kills are real signals through gputop.actions, and
durations and grace periods run on a clock the test moves.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from gputop.core import auditlog
from gputop.core.config import Config
from gputop.guard import state
from gputop.guard.engine import Engine, explain, render_explanation
from gputop.guard.policy import load_policy, parse_policy
from gputop.core.rogue import audit
from tests.conftest import ROOT, wait_comm, wait_gone  # noqa: F401 - wait_comm: other tests import it from here
from tests.functional.guard_helpers import Clock, SmtpSink, Webhook, sampler_for

BRIEF = ROOT / "examples" / "policy.yaml"


def named(procs, name: str, *args: str):
    """A real process whose name (comm) is ``name``, with extra argv."""
    code = f"import ctypes,time;ctypes.CDLL(None).prctl(15,{name!r}.encode(),0,0,0);time.sleep(600)"
    p = procs.spawn([sys.executable, "-c", code, *args])
    wait_comm(p.pid, name)
    return p


def alive(p) -> bool:
    return p.poll() is None


def spawn_sleeps(procs, n: int):
    """n real `sleep` processes with distinct start times, oldest first."""
    out = []
    for _ in range(n):
        out.append(procs.spawn(["sleep", "600"]))
        time.sleep(0.03)  # start times are kept to 0.01 s
    return out


@pytest.fixture
def clock():
    return Clock()


def test_brief_policy_kills_a_busy_xmrig_after_five_minutes_and_spares_training(procs, scenario, clock):
    xmrig = procs.sleeper(name="xmrig")
    wait_comm(xmrig.pid, "xmrig")
    train = procs.spawn([sys.executable, "-c", "import time; time.sleep(600)", "train.py"])
    path = scenario(holders=[{"pid": xmrig.pid, "gpu": 0, "memory": "300MiB", "sm": 99},
                             {"pid": train.pid, "gpu": 1, "memory": "6GiB", "sm": 99}])
    sampler = sampler_for(path, clock)
    hits: list[dict] = []
    eng = Engine(load_policy(BRIEF), sampler=sampler, record=hits.append)
    for minute in range(5):  # t = 0, 1, 2, 3, 4 minutes: busy, but not for 5 minutes yet
        assert eng.evaluate(sampler.sample(), "enforce") == []
        assert alive(xmrig), f"killed after only {minute} simulated minutes"
        clock.advance(60)
    clock.advance(1)  # 5m01s of continuous > 95%
    new = eng.evaluate(sampler.sample(), "enforce")
    assert wait_gone(xmrig.pid)
    (hit,) = new
    assert hit["rule"] == "block-crypto-miners" and hit["action"] == "kill" and hit["pid"] == xmrig.pid
    assert hit["outcome"] in ("terminated", "killed") and hit["dry_run"] is False and hit["ok"]
    assert hit["target"] == "xmrig"
    assert "held for 5m1s (>= 5m)" in hit["reason"]
    (mail,) = hit["notify"]
    assert mail["target"] == "admin@company.com"
    assert mail["outcome"].startswith("undeliverable: no mail transport configured")
    # the legitimate training job at 99% for just as long is untouched
    assert alive(train)
    clock.advance(600)
    assert eng.evaluate(sampler.sample(), "enforce") == []
    assert alive(train)
    # the kill went through gputop.actions: audit-logged with the guard face and the rule as reason
    recs = [r for r in auditlog.read() if r.get("action") == "kill"]
    assert recs[-1]["face"] == "guard" and recs[-1]["reason"] == "block-crypto-miners"
    assert recs[-1]["target"]["pid"] == xmrig.pid and recs[-1]["force"] is True


@pytest.mark.xdist_group("pid-reuse")  # rewinds the node's PID counter: one such test at a time
def test_a_new_process_on_a_reused_pid_starts_its_own_duration(procs, scenario, clock):
    from tests.functional.actions_helpers import spawn_at_pid

    first = procs.sleeper(name="xmrig")
    wait_comm(first.pid, "xmrig")
    path = scenario(holders=[{"pid": first.pid, "gpu": 0, "memory": "300MiB", "sm": 99}])
    sampler = sampler_for(path, clock)
    eng = Engine(load_policy(BRIEF), sampler=sampler, record=lambda h: None)
    for _ in range(5):  # 4 simulated minutes of > 95%
        assert eng.evaluate(sampler.sample(), "enforce") == []
        clock.advance(60)
    # It exits; another process (same name, same load) gets its PID: the 4 minutes were not its own.
    first.kill()
    first.wait()
    code = "import ctypes,time;ctypes.CDLL(None).prctl(15,b'xmrig',0,0,0);time.sleep(600)"
    second = spawn_at_pid(procs, first.pid, [sys.executable, "-c", code])
    wait_comm(second.pid, "xmrig")
    clock.advance(61)
    assert eng.evaluate(sampler.sample(), "enforce") == []
    assert alive(second), "killed on the previous process's 5 minutes"
    for _ in range(4):  # its own 5 minutes: 1, 2, 3, 4 minutes, not yet ...
        clock.advance(60)
        assert eng.evaluate(sampler.sample(), "enforce") == []
    clock.advance(61)  # ... 5m01s
    (hit,) = eng.evaluate(sampler.sample(), "enforce")
    assert hit["pid"] == second.pid and hit["ok"] and wait_gone(second.pid)


def test_xmrig_at_low_load_is_not_killed_but_is_in_the_audit(procs, scenario, clock):
    xmrig = procs.sleeper(name="xmrig")
    wait_comm(xmrig.pid, "xmrig")
    path = scenario(holders=[{"pid": xmrig.pid, "gpu": 0, "memory": "300MiB", "sm": 10}])
    sampler = sampler_for(path, clock)
    hits: list[dict] = []
    eng = Engine(load_policy(BRIEF), sampler=sampler, record=hits.append)
    for _ in range(8):
        eng.evaluate(sampler.sample(), "enforce")
        clock.advance(60)
    assert hits == [] and alive(xmrig)
    findings = audit(sampler.sample(), Config())
    assert any(f.rule == "miner-name" and f.pid == xmrig.pid and f.severity == "high" for f in findings)


def test_user_over_8gib_loses_newest_process_after_the_grace(procs, scenario, clock):
    old, mid, new = spawn_sleeps(procs, 3)
    path = scenario(holders=[{"pid": old.pid, "gpu": 0, "memory": "5GiB", "sm": 50},
                             {"pid": mid.pid, "gpu": 1, "memory": "3GiB", "sm": 50},
                             {"pid": new.pid, "gpu": 0, "memory": "2GiB", "sm": 50}])
    sampler = sampler_for(path, clock)
    hits: list[dict] = []
    eng = Engine(load_policy(BRIEF), sampler=sampler, record=hits.append)
    (warn,) = eng.evaluate(sampler.sample(), "enforce")
    assert warn["action"] == "warn" and warn["outcome"] == "grace-started" and warn["rule"] == "limit-user-memory"
    assert "will kill in 30s" in warn["message"] and "10GiB" in warn["message"]
    clock.advance(15)
    assert eng.evaluate(sampler.sample(), "enforce") == []
    assert all(alive(p) for p in (old, mid, new))
    clock.advance(16)
    (kill,) = eng.evaluate(sampler.sample(), "enforce")
    assert kill["action"] == "kill" and kill["pid"] == new.pid and kill["outcome"] == "terminated"
    assert "selected pid" in kill["reason"] and "newest" in kill["reason"]
    assert wait_gone(new.pid)
    assert alive(old) and alive(mid)  # 8 GiB left is not above the limit: one process was enough
    rec = [r for r in auditlog.read() if r.get("action") == "kill"][-1]
    assert [s["signal"] for s in rec["signals"]] == ["SIGTERM"] and rec["force"] is False
    clock.advance(60)
    assert eng.evaluate(sampler.sample(), "enforce") == []


def test_nothing_is_killed_when_the_user_drops_below_during_the_grace(procs, scenario, clock):
    old, mid, new = spawn_sleeps(procs, 3)
    path = scenario(holders=[{"pid": old.pid, "gpu": 0, "memory": "5GiB"},
                             {"pid": mid.pid, "gpu": 1, "memory": "3GiB"},
                             {"pid": new.pid, "gpu": 0, "memory": "2GiB"}])
    sampler = sampler_for(path, clock)
    hits: list[dict] = []
    eng = Engine(load_policy(BRIEF), sampler=sampler, record=hits.append)
    (warn,) = eng.evaluate(sampler.sample(), "enforce")
    assert warn["outcome"] == "grace-started"
    new.terminate()  # the user frees memory themselves
    new.wait(5)
    clock.advance(31)
    (cleared,) = eng.evaluate(sampler.sample(), "enforce")
    assert cleared["action"] == "warn" and cleared["outcome"] == "cleared"
    assert "nothing done" in cleared["message"]
    clock.advance(60)
    assert eng.evaluate(sampler.sample(), "enforce") == []
    assert alive(old) and alive(mid)
    assert not [r for r in auditlog.read() if r.get("action") == "kill"]


def test_selected_process_that_already_exited_counts_as_gone_and_no_other_is_killed(procs, scenario, clock):
    old, mid, new = spawn_sleeps(procs, 3)
    path = scenario(holders=[{"pid": old.pid, "gpu": 0, "memory": "5GiB"},
                             {"pid": mid.pid, "gpu": 1, "memory": "3GiB"},
                             {"pid": new.pid, "gpu": 0, "memory": "2GiB"}])
    sampler = sampler_for(path, clock)
    hits: list[dict] = []
    eng = Engine(load_policy(BRIEF), sampler=sampler, record=hits.append)
    (warn,) = eng.evaluate(sampler.sample(), "enforce")
    assert warn["outcome"] == "grace-started"
    clock.advance(31)
    snap = sampler.sample()  # the guard sees all three ...
    new.terminate()  # ... and the newest exits on its own before the guard acts on it
    new.wait(5)
    acted = eng.evaluate(snap, "enforce")
    assert [(h["pid"], h["outcome"]) for h in acted] == [(new.pid, "not-found")]
    # Without it the user holds 8 GiB, not more than the limit: nobody else may be selected.
    time.sleep(0.2)
    assert alive(old) and alive(mid)
    assert [r["target"]["pid"] for r in auditlog.read() if r.get("action") == "kill"] == [new.pid]


def test_select_largest_kills_the_biggest_first(procs, scenario, clock):
    small, big, medium = spawn_sleeps(procs, 3)
    path = scenario(holders=[{"pid": small.pid, "gpu": 0, "memory": "1GiB"},
                             {"pid": big.pid, "gpu": 0, "memory": "6GiB"},
                             {"pid": medium.pid, "gpu": 1, "memory": "3GiB"}])
    pol = parse_policy(textwrap.dedent("""\
        rules:
          - name: cap
            scope: per_user
            select: largest
            conditions:
              - {type: user_memory, operator: ">", value: 5GiB}
            action: kill
            timeout: 2s
    """))
    sampler = sampler_for(path, clock)
    hits: list[dict] = []
    eng = Engine(pol, sampler=sampler, record=hits.append)
    (kill,) = eng.evaluate(sampler.sample(), "enforce")
    assert kill["pid"] == big.pid and wait_gone(big.pid)
    assert alive(small) and alive(medium)  # 4 GiB left: under the limit


def test_a_kill_the_audit_log_could_not_record_says_so_in_the_hit(procs, scenario, clock, tmp_path, monkeypatch,
                                                                    capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("GPUTOP_AUDIT_LOG", str(blocker / "audit.jsonl"))
    victim = spawn_sleeps(procs, 1)[0]
    path = scenario(holders=[{"pid": victim.pid, "gpu": 0, "memory": "6GiB"}])
    pol = parse_policy(textwrap.dedent("""\
        rules:
          - name: cap
            conditions:
              - {type: gpu_memory, operator: ">", value: 5GiB}
            action: kill
            timeout: 2s
    """))
    sampler = sampler_for(path, clock)
    hits: list[dict] = []
    (kill,) = Engine(pol, sampler=sampler, record=hits.append).evaluate(sampler.sample(), "enforce")
    assert kill["outcome"] == "terminated" and wait_gone(victim.pid)
    assert "could not be written" in kill["details"]["audit_error"]
    assert "NOT recorded" in capsys.readouterr().err


def test_dry_run_kills_nothing_but_records_what_it_would_do(procs, scenario, clock):
    xmrig = procs.sleeper(name="xmrig")
    wait_comm(xmrig.pid, "xmrig")
    path = scenario(holders=[{"pid": xmrig.pid, "gpu": 0, "memory": "300MiB", "sm": 99}])
    sampler = sampler_for(path, clock)
    eng = Engine(load_policy(BRIEF), sampler=sampler)  # records into the shared hits file
    eng.evaluate(sampler.sample(), "dry-run")
    clock.advance(301)
    (hit,) = eng.evaluate(sampler.sample(), "dry-run")
    assert hit["dry_run"] is True and hit["outcome"] == "dry-run" and hit["ok"]
    assert "would send SIGTERM" in hit["message"] and "SIGKILL after the timeout" in hit["message"]
    time.sleep(0.2)
    assert alive(xmrig)
    clock.advance(10)
    assert eng.evaluate(sampler.sample(), "dry-run") == []  # once per 'repeat', not every interval
    # every hit is in the shared channel the TUI reads: time, rule, target, dry_run, action, outcome
    (shared,) = state.recent_hits()
    for key in ("time", "rule", "pid", "target", "dry_run", "action", "outcome", "message"):
        assert shared[key] == hit[key]
    rec = [r for r in auditlog.read() if r.get("action") == "kill"][-1]
    assert rec["dry_run"] is True and rec["outcome"] == "dry-run" and rec["signals"] == []
    # switching to enforce acts at once: the duration was already observed, a dry-run does not re-arm it
    eng.mode_changed()
    (real,) = eng.evaluate(sampler.sample(), "enforce")
    assert real["dry_run"] is False and wait_gone(xmrig.pid)


def test_webhook_notification_reaches_a_loopback_server(procs, scenario, clock):
    hook = Webhook()
    try:
        victim = named(procs, "victim")
        path = scenario(holders=[{"pid": victim.pid, "gpu": 0, "memory": "1GiB", "sm": 40}])
        pol = parse_policy(textwrap.dedent(f"""\
            rules:
              - name: tell-ops
                conditions:
                  - {{type: process_name, operator: "==", value: victim}}
                action: notify
                notify: ["{hook.url}", "ops@example.com", log]
        """))
        sampler = sampler_for(path, clock)
        hits: list[dict] = []
        (hit,) = Engine(pol, sampler=sampler, record=hits.append).evaluate(sampler.sample(), "enforce")
        (got,) = hook.received
        assert got["type"] == "application/json" and got["path"] == "/hook"
        body = got["json"]
        assert body["rule"] == "tell-ops" and body["pid"] == victim.pid and body["process"]["name"] == "victim"
        results = {n["target"]: n["outcome"] for n in hit["notify"]}
        assert results[hook.url] == "delivered (HTTP 200)"
        assert results["ops@example.com"].startswith("undeliverable: no mail transport configured")
        assert results["log"] == "logged"
        assert alive(victim)  # notify never kills
    finally:
        hook.close()


def test_reap_rule_takes_a_real_orphan_tree_and_spares_a_normal_holder(procs, scenario, clock):
    worker = procs.orphan("sleep 677", "sleep 677")
    normal = procs.spawn(["sleep", "600"])
    path = scenario(holders=[{"pid": worker, "gpu": 0, "memory": "2GiB"},
                             {"pid": normal.pid, "gpu": 0, "memory": "2GiB"}])
    pol = parse_policy(textwrap.dedent("""\
        rules:
          - name: reap-orphans
            conditions:
              - {type: orphan, operator: "==", value: true}
            action: reap
            timeout: 2s
    """))
    sampler = sampler_for(path, clock)
    hits: list[dict] = []
    (hit,) = Engine(pol, sampler=sampler, record=hits.append).evaluate(sampler.sample(), "enforce")
    assert hit["action"] == "reap" and hit["outcome"] == "reaped", hit
    assert wait_gone(worker)
    assert alive(normal)


def test_guard_kill_ignores_a_forgeable_protection_but_never_the_hard_safety_rules(procs, scenario, clock):
    """A miner-named process whose argv claims a jupyter kernel (the default protect_cmdline) was refused
    before issue 25: the user chose that protection. A kill rule that matches the process itself kills it
    now. What a user cannot arrange still stops the guard: gputop itself and its ancestors are refused."""
    prot = named(procs, "xmrig", "-m", "ipykernel_launcher")
    path = scenario(holders=[{"pid": prot.pid, "gpu": 0, "memory": "1GiB", "sm": 99},
                             {"pid": os.getpid(), "gpu": 1, "memory": "1GiB", "sm": 99},
                             {"pid": os.getppid(), "gpu": 1, "memory": "1GiB", "sm": 99}])
    pol = parse_policy(textwrap.dedent("""\
        rules:
          - name: kill-miners
            conditions:
              - {type: process_name, operator: contains, value: xmrig}
            action: kill
            force: true
          - name: kill-gpu1
            conditions:
              - {type: gpu, operator: ==, value: 1}
            action: kill
            force: true
    """))
    sampler = sampler_for(path, clock)
    snap = sampler.sample()
    assert snap.holder(prot.pid).verdict.kind == "protected"  # still protected from reap
    hits = {h["pid"]: h for h in Engine(pol, sampler=sampler, record=lambda h: None).evaluate(snap, "enforce")}
    assert hits[prot.pid]["outcome"] in ("terminated", "killed") and hits[prot.pid]["ok"], hits[prot.pid]
    assert wait_gone(prot.pid)
    assert hits[prot.pid]["details"]["policy_overrides"] == "protected"
    for pid in (os.getpid(), os.getppid()):
        assert hits[pid]["outcome"] == "refused" and hits[pid]["ok"] is False, hits[pid]
    recs = {r["target"]["pid"]: r for r in auditlog.read() if r.get("action") == "kill"}
    assert recs[os.getpid()]["details"]["rule"] == "self" and recs[os.getppid()]["details"]["rule"] == "ancestor"
    assert recs[prot.pid]["face"] == "guard" and recs[prot.pid]["details"]["policy_overrides"] == "protected"


def test_test_policies_explains_each_rule_and_target(procs, scenario, clock):
    xmrig = procs.sleeper(name="xmrig")
    wait_comm(xmrig.pid, "xmrig")
    old, new = spawn_sleeps(procs, 2)
    path = scenario(holders=[{"pid": xmrig.pid, "gpu": 0, "memory": "300MiB", "sm": 99},
                             {"pid": old.pid, "gpu": 0, "memory": "6GiB", "sm": 10},
                             {"pid": new.pid, "gpu": 1, "memory": "3GiB", "sm": 10}])
    sampler = sampler_for(path, clock)
    items = explain(load_policy(BRIEF), sampler.sample())
    text = render_explanation(items, "dry-run")
    miners = {t["pid"]: t for t in items[0]["targets"]}
    assert miners[xmrig.pid]["decision"] == "pending-duration"
    assert "must hold continuously (gpu_utilization for 5m)" in miners[xmrig.pid]["verdict"]
    assert miners[old.pid]["decision"] == "none"
    (user,) = items[1]["targets"]
    assert user["decision"] == "would-act"
    assert f"wait 30s, re-check, then kill (SIGTERM only) -> pid {new.pid}" in user["verdict"]
    assert "process_name 'sleep' contains_any ['xmrig', 'ethminer', 'cpuminer']: false" in text
    assert all(alive(p) for p in (xmrig, old, new))


def test_email_goes_out_over_smtp_when_a_transport_is_configured(procs, scenario, clock):
    sink = SmtpSink()
    try:
        victim = named(procs, "victim")
        path = scenario(holders=[{"pid": victim.pid, "gpu": 0, "memory": "1GiB", "sm": 40}])
        pol = parse_policy(textwrap.dedent("""\
            rules:
              - name: mail-admin
                conditions:
                  - {type: process_name, operator: "==", value: victim}
                action: notify
                notify: [admin@company.com]
        """))
        cfg = Config(extra={"guard": {"smtp": {"host": "127.0.0.1", "port": sink.port,
                                               "from": "gputop@node.test"}}})
        sampler = sampler_for(path, clock, cfg)
        (hit,) = Engine(pol, config=cfg, sampler=sampler, record=lambda h: None).evaluate(
            sampler.sample(), "enforce")
        (res,) = hit["notify"]
        assert res["ok"] and res["outcome"] == f"sent via SMTP 127.0.0.1:{sink.port}"
        (msg,) = sink.messages
        assert msg["from"] == "<gputop@node.test>" and msg["to"] == ["<admin@company.com>"]
        assert b"Subject: [gputop guard]" in msg["data"] and b"mail-admin" in msg["data"]
    finally:
        sink.close()


def test_per_user_process_count_limit_kills_newest_until_back_under(procs, scenario, clock):
    ps = spawn_sleeps(procs, 4)
    path = scenario(holders=[{"pid": p.pid, "gpu": i % 2, "memory": "1GiB"} for i, p in enumerate(ps)])
    pol = parse_policy(textwrap.dedent("""\
        rules:
          - name: two-jobs-each
            conditions:
              - {type: process_count, operator: ">", value: 2, scope: per_user}
            action: kill
            timeout: 2s
    """))
    sampler = sampler_for(path, clock)
    hits = Engine(pol, sampler=sampler, record=lambda h: None).evaluate(sampler.sample(), "enforce")
    assert [h["pid"] for h in hits] == [ps[3].pid, ps[2].pid]
    assert wait_gone(ps[3].pid) and wait_gone(ps[2].pid)
    assert alive(ps[0]) and alive(ps[1])
