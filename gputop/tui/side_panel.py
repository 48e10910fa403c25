"""The side panel: guard-rule hits (time, rule, pid, action) and audit findings (severity, pid, reason).

The data arrives with each snapshot (read or computed off the UI thread); until an engine is installed,
its section says in one line what will appear there.
"""

from __future__ import annotations

import datetime as _dt
from gputop.util.textsafe import visible
from dataclasses import dataclass, field

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

GUARD_PENDING = "reading the guard state…"
AUDIT_PENDING = "auditing processes…"

# Findings listed in the panel (most severe first); the rest are counted on one line. A node with hundreds of
# orphaned holders has a finding each: laid out in full they are thousands of wrapped lines (~2 MiB at
# 1,024 holders, peak RSS, issue 13) that nobody scrolls through; `gputop audit` lists them all.
MAX_FINDINGS = 50

SEVERITY_STYLE = {"critical": "bold reverse red", "high": "bold red", "medium": "yellow", "low": "cyan",
                  "info": "dim"}


@dataclass(frozen=True)
class PanelData:
    guard_available: bool = False
    guard_mode: str | None = None
    guard_error: str | None = None
    hits: tuple[dict, ...] = ()
    audit_available: bool = False
    audit_error: str | None = None
    findings: tuple = field(default=())
    guard_daemon: dict | None = None  # {alive, pid, policy_file, mode}: None when not read
    guard_policy: str | None = None  # the policy file the guard state names


def daemon_line(d: PanelData) -> Text:
    """Whether a guard daemon runs on this node and which policy it uses (as `gputop guard status`)."""
    daemon = d.guard_daemon
    if daemon is None:
        return Text("")
    if daemon.get("alive"):
        policy = daemon.get("policy_file") or d.guard_policy or "?"
        return Text(visible(f"daemon running, pid {daemon.get('pid')}, policy {policy}"))
    t = Text("no guard daemon running", style="bold yellow")
    t.append(" (gputop guard run): the mode is stored, nothing acts on it", style="")
    if d.guard_policy:
        t.append(visible(f"; policy {d.guard_policy}"))
    return t


def _hhmmss(t) -> str:
    try:
        return _dt.datetime.fromtimestamp(float(t)).strftime("%H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return "--:--:--"


def guard_text(d: PanelData) -> Text:
    t = Text()
    t.append("GUARD", style="bold underline")
    if not d.guard_available:
        t.append("\n")
        t.append(GUARD_PENDING, style="dim")
        return t
    mode = d.guard_mode or "off"
    t.append("  mode ")
    t.append(mode, style={"enforce": "bold reverse red", "dry-run": "bold yellow"}.get(mode, "bold"))
    line = daemon_line(d)
    if line.plain:
        t.append("\n")
        t.append(line)
    if d.guard_error:
        t.append("\n")
        t.append(Text(visible(d.guard_error), style="red"))
    if not d.hits:
        t.append("\n")
        t.append("no rule hits yet", style="dim")
    for h in d.hits:
        t.append("\n")
        t.append(_hhmmss(h.get("time")) + " ", style="dim")
        t.append(Text(visible(str(h.get("rule") or "?")), style="bold"))
        t.append(visible(f" {h.get('pid') if h.get('pid') is not None else '-'} "))
        action = str(h.get("action") or "")
        if h.get("dry_run"):
            action = f"would {action}" if action else "would act"
        outcome = h.get("outcome")
        t.append(Text(visible(action + (f" ({outcome})" if outcome and outcome != "dry-run" else "")),
                      style="yellow" if h.get("dry_run") else "red"))
    return t


def audit_text(d: PanelData) -> Text:
    t = Text()
    t.append("AUDIT", style="bold underline")
    if not d.audit_available:
        t.append("\n")
        t.append(AUDIT_PENDING, style="dim")
        return t
    if d.audit_error:
        t.append("\n")
        t.append(Text(visible(d.audit_error), style="red"))
    if not d.findings:
        t.append("\n")
        t.append("no findings", style="dim")
    for f in d.findings[:MAX_FINDINGS]:
        sev = str(getattr(f, "severity", "?"))
        t.append("\n")
        t.append(sev.upper().ljust(6), style=SEVERITY_STYLE.get(sev.lower(), "bold"))  # MEDIUM, not MEDI
        pid = getattr(f, "pid", None)
        t.append(f" {pid if pid is not None else '-':>7} ")
        t.append(Text(visible(getattr(f, "reason", "") or getattr(f, "rule", ""))))
    more = len(d.findings) - MAX_FINDINGS
    if more > 0:
        t.append("\n")
        t.append(f"… {more} more (gputop audit lists all)", style="dim")
    return t


class SidePanel(VerticalScroll):
    def compose(self):
        yield Static(guard_text(PanelData()), id="guard-hits")
        yield Static(audit_text(PanelData()), id="audit-findings")

    def show(self, data: PanelData) -> None:
        self.query_one("#guard-hits", Static).update(guard_text(data))
        self.query_one("#audit-findings", Static).update(audit_text(data))
