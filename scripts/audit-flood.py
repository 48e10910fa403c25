#!/usr/bin/env python3
"""Issue 25's full check: one user floods the node audit trail for 60 s while root acts.

    sudo python3 scripts/audit-flood.py                   # 60 s, 19 records/s of 64 kB, trail rotating at 4 MiB
    sudo python3 scripts/audit-flood.py --seconds 100 --max-bytes 16777216    # the production size

It creates a second real user (gti25flood, removed afterwards), starts a real root ``gputop guard run``
serving the node trail in a temporary directory, runs the user's flood (just under the 200 records per
10 s limit) and, meanwhile, has root kill a real process with ``gputop kill --force`` about every second.
It prints the figures as JSON, and exits 0 when none of root's records was lost and the trail kept its
guard-start, 1 otherwise, 2 when it cannot run (not root, no useradd or setpriv). The test suite runs
the same thing for 10 s (tests/functional/test_audit_hostile.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.functional.audit_helpers import make_user, run_flood  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the user floods (default 60)")
    ap.add_argument("--rate", type=float, default=19.0, help="the user's records per second (default 19)")
    ap.add_argument("--size", type=int, default=64_000, help="bytes per record (default 64000)")
    ap.add_argument("--max-bytes", type=int, default=4 * 1024 * 1024,
                    help="the main trail rotates beyond this (default 4 MiB; production: 16 MiB)")
    ap.add_argument("--quiet", action="store_true", help="no line per root kill")
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        print("audit-flood: needs root, useradd and setpriv (it creates a second user)", file=sys.stderr)
        return 2
    say = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    with make_user("gti25flood") as pw:
        got = run_flood(pw, args.seconds, rate=args.rate, size=args.size, max_bytes=args.max_bytes, say=say)
    got.pop("guard_err", None)
    old_capacity = 6 * args.max_bytes
    got["flood_bytes_vs_whole_old_trail"] = round(got["flood"]["bytes"] / old_capacity, 1)
    print(json.dumps(got, indent=2))
    ok = (got["root_kills_in_trail"] == got["root_kills"] and not got["root_failures"]
          and got["guard_start_kept"] and got["guard_stop_kept"])
    print(f"{'PASS' if ok else 'FAIL'}: {got['root_kills_in_trail']}/{got['root_kills']} of root's kills in the "
          f"trail, guard-start {'kept' if got['guard_start_kept'] else 'LOST'}; the user sent "
          f"{got['flood']['sent']} records ({got['flood']['bytes'] / 1e6:.0f} MB, "
          f"{got['flood_bytes_vs_whole_old_trail']}x the whole old trail of 6 x {args.max_bytes} bytes)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
