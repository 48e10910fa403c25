"""The owner in every face: the status table and JSON, the TUI details text."""

from __future__ import annotations

import json

from gputop.commands.status import OWNER_WIDTH, owner_cell, render
from gputop.core.ownership import NONE, SERVICE, Owner, parse_cgroup
from gputop.core.snapshot_json import snapshot_to_dict
from gputop.tui.details import details_text
from tests.tui.helpers import frozen_snapshot


def _holder_rows(text: str) -> dict[str, str]:
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.split()[:1] == ["PID"])
    rows = {line.split()[0]: line for line in lines[i + 1:] if line.strip() and line.split()[0].isdigit()}
    return {"header": lines[i], **rows}


def test_status_table_has_an_owner_column_when_owners_were_read():
    rows = _holder_rows(render(frozen_snapshot()))
    assert "OWNER" in rows["header"]
    assert "session 7 closing" in rows["2001"]
    assert " ? " in rows["1101"]  # not read: unknown, not "none"


def test_status_table_has_no_owner_column_where_none_were_read():
    import dataclasses

    snap = frozen_snapshot()
    snap = dataclasses.replace(snap, holders=tuple(dataclasses.replace(h, owner=None) for h in snap.holders))
    assert "OWNER" not in _holder_rows(render(snap))["header"]


def test_owner_cell_is_cut_to_fit():
    long = Owner(SERVICE, unit="a-very-long-unit-name-for-a-trainer-daemon.service")
    assert len(owner_cell(long)) == OWNER_WIDTH and owner_cell(long).endswith("~")
    assert owner_cell(None) == "?" and owner_cell(Owner(NONE)) == "-"


def test_status_chains_name_each_members_owner():
    text = render(frozen_snapshot(), chains=True)
    assert "pid 2001 chain: 2000(bash)[session 7 closing] <- 1(systemd)" in text


def test_json_has_owner_per_holder_chain_member_and_root():
    d = json.loads(json.dumps(snapshot_to_dict(frozen_snapshot())))
    h = next(x for x in d["holders"] if x["pid"] == 2001)
    assert h["owner"]["kind"] == "session" and h["owner"]["session_state"] == "closing"
    assert h["owner"]["cgroup"] == "/user.slice/user-1001.slice/session-7.scope"
    assert [c["owner"]["kind"] for c in h["chain"]] == ["session", "none"]
    assert next(x for x in d["holders"] if x["pid"] == 1101)["owner"] is None
    assert d["roots"][0]["owner"]["session"] == "7"


def test_details_shows_owner_and_escapes_the_raw_cgroup():
    snap = frozen_snapshot()
    h = snap.holder(2001)
    text = details_text(h, h.proc, 2000).plain
    assert "owner: login session 7 of uid 1001: logind says closing" in text
    assert "bash retry.sh  [session 7 closing]  orphan root" in text
    lie = parse_cgroup("0::/user.slice/user-1000.slice/user@1000.service/\x1b]0;pwn\x07/x.scope\n")
    text = details_text(None, h.chain[0], 2000, lie).plain
    assert "owner: systemd unit user@1000.service" in text
    assert "\x1b" not in text and "\x07" not in text and "\\x1b]0;pwn\\x07" in text


def test_details_of_an_unreadable_owner_says_so():
    import dataclasses

    h = frozen_snapshot().holder(1101)
    assert "owner: unknown (its cgroup could not be read)" in details_text(h, h.proc, None).plain
    assert "owner:" not in details_text(dataclasses.replace(h, proc=None), None, None).plain
