"""Guard notifications: e-mail (SMTP), webhooks (JSON POST) and the log.

Targets, as written in a rule's ``notify`` list:
- an e-mail address: sent over SMTP when a mail transport is configured (``guard.smtp`` in the config);
  otherwise the result is recorded, visibly, as "undeliverable: no mail transport configured";
- an ``http://`` or ``https://`` URL: the hit as JSON, POSTed;
- ``log``: written to stderr (the daemon's log, e.g. the systemd journal).

Every target gets a result (``{target, ok, outcome}``) that is stored with the hit; nothing is dropped
silently, and ``send`` never raises: a target that fails in any way gets a failed result, and the hit is
recorded all the same.

The subject carries a process name, which its owner chose: it is made one line (``visible``: a newline
shows as \\x0a, as every control character does) before it becomes a mail header or a log line, so it
cannot add a header or a line of its own.

Mail transport (config file)::

    guard:
      smtp:
        host: smtp.example.com
        port: 587              # default 25 (465 with ssl: true)
        starttls: true
        ssl: false
        from: gputop@node01.example.com
        username: gputop       # optional
        password_env: GPUTOP_SMTP_PASSWORD   # the password is read from this environment variable
"""

from __future__ import annotations

import json
import os
import smtplib
import socket
import sys
import urllib.error
import urllib.request
from email.message import EmailMessage

from gputop import __version__
from gputop.core.config import Config
from gputop.util.textsafe import visible

UNDELIVERABLE = "undeliverable: no mail transport configured"


def _smtp_settings(config: Config | None) -> dict | None:
    guard = (config or Config()).extra.get("guard") or {}
    smtp = guard.get("smtp") if isinstance(guard, dict) else None
    if isinstance(smtp, dict) and smtp.get("host"):
        return smtp
    return None


def send_email(to: str, subject: str, body: str, config: Config | None = None, timeout: float = 10.0) -> dict:
    smtp = _smtp_settings(config)
    if smtp is None:
        return {"target": to, "ok": False,
                "outcome": f"{UNDELIVERABLE} (set guard.smtp.host in the gputop config)"}
    msg = EmailMessage()
    msg["Subject"] = subject
    msg["From"] = str(smtp.get("from") or f"gputop@{socket.getfqdn()}")
    msg["To"] = to
    msg.set_content(body)
    host = str(smtp["host"])
    use_ssl = bool(smtp.get("ssl"))
    port = int(smtp.get("port") or (465 if use_ssl else 25))
    try:
        cls = smtplib.SMTP_SSL if use_ssl else smtplib.SMTP
        with cls(host, port, timeout=timeout) as s:
            if smtp.get("starttls") and not use_ssl:
                s.starttls()
            if smtp.get("username"):
                s.login(str(smtp["username"]), os.environ.get(str(smtp.get("password_env") or ""), ""))
            s.send_message(msg)
    except (OSError, smtplib.SMTPException) as e:
        return {"target": to, "ok": False, "outcome": f"failed: SMTP {host}:{port}: {e}"}
    return {"target": to, "ok": True, "outcome": f"sent via SMTP {host}:{port}"}


def post_webhook(url: str, payload: dict, timeout: float = 5.0) -> dict:
    data = json.dumps(payload, default=str).encode("utf-8")
    req = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": f"gputop-guard/{__version__}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            code = resp.status
    except urllib.error.HTTPError as e:
        return {"target": url, "ok": False, "outcome": f"failed: HTTP {e.code} {e.reason}"}
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return {"target": url, "ok": False, "outcome": f"failed: {reason}"}
    return {"target": url, "ok": 200 <= code < 300, "outcome": f"delivered (HTTP {code})"}


def log_line(subject: str, payload: dict, stream=None) -> dict:
    """One line on ``stream`` (stderr by default; the guard daemon passes its journal stream)."""
    try:
        out = stream if stream is not None else sys.stderr
        out.write(f"gputop guard: {visible(subject)}\n")
        out.flush()
    except (OSError, ValueError) as e:
        return {"target": "log", "ok": False, "outcome": f"failed: {e}"}
    return {"target": "log", "ok": True, "outcome": "logged"}


def _one(target: str, subject: str, body: str, payload: dict, config: Config | None, timeout: float,
         log) -> dict:
    if target == "log":
        return log_line(subject, payload, log)
    if target.lower().startswith(("http://", "https://")):
        return post_webhook(target, payload, timeout)
    if "@" in target:
        return send_email(target, subject, body, config, timeout=max(timeout, 10.0))
    # validated at policy load; kept for callers that bypass it
    return {"target": target, "ok": False, "outcome": "undeliverable: unknown target kind"}


def send(targets, subject: str, payload: dict, config: Config | None = None, timeout: float = 5.0,
         log=None) -> list[dict]:
    """Notify every target; one result per target. Never raises (the caller records the hit next)."""
    results = []
    subject = visible(subject)  # one line: no header or log line of its own from a process name
    body = subject + "\n\n" + json.dumps(payload, indent=2, default=str)
    for t in targets:
        try:
            res = _one(t, subject, body, payload, config, timeout, log)
        except Exception as e:  # a bad address or setting must not lose the hit
            res = {"target": t, "ok": False, "outcome": f"failed: {type(e).__name__}: {e}"}
        res["outcome"] = visible(res["outcome"])  # one line in the journal and in guard status
        results.append(res)
    return results
