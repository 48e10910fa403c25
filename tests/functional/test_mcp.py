"""gputop mcp over stdio, driven by the official SDK's client, on the demo's real processes."""

from __future__ import annotations

import os
import sys

import anyio
import psutil
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from gputop.core import auditlog
from gputop.core.demo import Demo
from tests.conftest import wait_gone

TOOLS = {"gpu_status", "list_processes", "kill_process", "reap_orphans", "reset_gpu", "audit_rogue",
         "guard_status", "guard_set_mode"}


@pytest.fixture
def demo(tmp_path, monkeypatch):
    with Demo(tmp_path / "demo", animate=False) as d:
        monkeypatch.setenv("GPUTOP_SCENARIO", str(d.scenario_path))
        yield d


def params() -> StdioServerParameters:
    keep = ("GPUTOP_SCENARIO", "GPUTOP_STATE_DIR", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "PATH", "HOME")
    return StdioServerParameters(command=sys.executable, args=["-m", "gputop", "mcp"],
                                 env={k: os.environ[k] for k in keep if k in os.environ})


def session(fn):
    async def main():
        async with Client(params(), read_timeout_seconds=60) as client:
            return await fn(client)
    return anyio.run(main)


def data(result) -> dict:
    assert not result.is_error, result.content
    return result.structured_content


def refusal(result) -> dict:
    """A refusal comes back with isError true, and the whole result as structured content."""
    assert result.is_error, result.content
    return result.structured_content


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_tools_listed_and_gpu_status(demo):
    async def go(c):
        tools = (await c.list_tools()).tools
        status = data(await c.call_tool("gpu_status", {}))
        procs = data(await c.call_tool("list_processes", {"gpu": 3, "min_memory": "1GiB"}))
        guard = data(await c.call_tool("guard_status", {}))
        rogue = data(await c.call_tool("audit_rogue", {}))
        bad = await c.call_tool("list_processes", {"min_memory": "lots"})
        return tools, status, procs, guard, rogue, bad

    tools, status, procs, guard, rogue, bad = session(go)
    by_name = {t.name: t for t in tools}
    assert TOOLS <= set(by_name)
    assert by_name["kill_process"].annotations.destructive_hint is True
    assert by_name["gpu_status"].annotations.read_only_hint is True
    assert len(status["gpu"]["gpus"]) == 4
    assert demo.pid("worker0") in {h["pid"] for h in status["holders"]}
    assert {p["pid"] for p in procs["processes"]} == {demo.pid("miner"), demo.pid("jupyter")}
    assert guard["mode"] == "off"
    assert "findings" in rogue
    assert bad.is_error and "memory_gt" in bad.content[0].text


def test_kill_needs_confirm_and_leaves_an_audit_line(demo):
    w1, w0 = demo.pid("worker1"), demo.pid("worker0")

    async def go(c):
        preview = data(await c.call_tool("kill_process", {"pid": w1}))
        still = alive(w1)
        refused = refusal(await c.call_tool("kill_process", {"pid": demo.pid("jupyter"), "confirm": True}))
        done = data(await c.call_tool("kill_process", {"pid": w1, "confirm": True}))
        return preview, still, refused, done

    preview, still, refused, done = session(go)
    assert preview["preview"] is True and preview["ok"] is True and preview["outcome"] == "dry-run"
    assert "confirm=true" in preview["next"]
    assert still, "a preview killed the process"
    assert refused["ok"] is False and refused["outcome"] == "refused"
    assert alive(demo.pid("jupyter"))
    assert done["ok"] is True and done["confirmed"] is True
    assert wait_gone(w1)
    assert alive(w0) and alive(demo.pid("miner"))
    kills = [r for r in auditlog.read() if r.get("face") == "mcp" and r.get("action") == "kill"]
    assert [r["target"]["pid"] for r in kills if not r.get("dry_run") and r["ok"]] == [w1]
    assert any(r.get("dry_run") and r["target"]["pid"] == w1 for r in kills)


def test_reap_reset_and_guard_mode_previews(demo):
    root, w0 = demo.pid("retry-root"), demo.pid("worker0")

    async def go(c):
        prev = data(await c.call_tool("reap_orphans", {}))
        alive_after_preview = alive(root)
        reset_prev = refusal(await c.call_tool("reset_gpu", {"index": 0}))
        enforce_prev = data(await c.call_tool("guard_set_mode", {"mode": "enforce"}))
        mode_after_preview = data(await c.call_tool("guard_status", {}))["mode"]
        reap = data(await c.call_tool("reap_orphans", {"confirm": True, "roots": [root]}))
        reset = refusal(await c.call_tool("reset_gpu", {"index": 0, "confirm": True}))
        dry = data(await c.call_tool("guard_set_mode", {"mode": "dry-run"}))
        return prev, alive_after_preview, reset_prev, enforce_prev, mode_after_preview, reap, reset, dry

    prev, alive_after_preview, reset_prev, enforce_prev, mode_after_preview, reap, reset, dry = session(go)
    assert prev["preview"] and prev["results"][0]["pid"] == root and alive_after_preview
    assert reset_prev["preview"] and "would refuse" in reset_prev["message"]
    assert enforce_prev["preview"] and mode_after_preview == "off"
    assert reap["ok"] is True and wait_gone(root)
    assert reset["ok"] is False and reset["outcome"] == "busy"
    assert alive(w0)
    assert dry["mode"] == "dry-run" and dry["previous"] == "off"


def test_tool_schemas_describe_every_parameter(demo):
    async def go(c):
        return (await c.list_tools()).tools

    tools = session(go)
    for t in tools:
        assert t.title, t.name
        assert t.description and "\n    " not in t.description, (t.name, t.description)
        for pname, prop in t.input_schema.get("properties", {}).items():
            assert prop.get("description"), (t.name, pname)
        assert "ctx" not in t.input_schema.get("properties", {})
    mode = next(t for t in tools if t.name == "guard_set_mode").input_schema["properties"]["mode"]
    assert mode.get("enum") == ["off", "dry-run", "enforce"], mode


def _as_nobody(fn):
    """Run ``fn()`` in a forked child that dropped to uid/gid 65534; its return value (picklable)."""
    import multiprocessing

    def child(q):
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        q.put(fn())

    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    out = q.get(timeout=30)
    p.join(10)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to nobody")
def test_previews_say_a_signal_or_reset_would_be_refused_for_lack_of_permission(procs):
    from gputop.service import mcp_server
    from gputop.core import permissions

    victim = procs.sleeper("rootjob")
    from gputop import actions

    def preview():  # the real dry run (every check a kill makes), as the MCP preview makes it
        r = actions.kill_process(victim.pid, expected_start=None, face="mcp", dry_run=True, require_holder=False)
        return mcp_server._preview_kill(r.to_dict(), victim.pid)

    out = _as_nobody(preview)
    assert out["ok"] is False and out["outcome"] == "permission-denied", out
    assert "would be refused: permission denied" in out["message"] and "refused" in out["next"]
    assert permissions.signal_refusal(victim.pid) is None  # root may
    assert alive(victim.pid)
