"""gputop reset: reset a GPU; refuses while processes hold it (--force kills them first)."""

from __future__ import annotations

import sys

from gputop import actions
from gputop.commands._common import config_from, open_sampler, print_json
from gputop.util.errors import UsageError
from gputop.util.textsafe import visible
from gputop.util.units import parse_duration

NAME = "reset"
HELP = "reset a GPU (refuses while processes hold it; --force kills them first)"
DESCRIPTION = """Reset GPU N. While processes hold it, gputop refuses and lists them; --force first kills
them through the same safe path as 'gputop kill --force' (protected and unknown holders still refuse).
NVIDIA: nvidia-smi --gpu-reset (root, no display on that GPU). AMD: amdsmi. Simulated: clears the
simulated contexts and records it. The result is written to the audit log."""


def add_arguments(p) -> None:
    p.add_argument("--gpu", type=int, required=True, metavar="N", help="the GPU to reset")
    p.add_argument("--force", action="store_true", help="kill the processes holding it first")
    p.add_argument("--timeout", metavar="S", help="--force: seconds to wait after SIGTERM (default kill_timeout)")
    p.add_argument("--dry-run", action="store_true",
                   help="make every check the reset makes (holders, rights, signal permission) and say what it "
                        "would do; kill and reset nothing")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args) -> int:
    config = config_from(args)
    timeout = None
    if args.timeout is not None:
        try:
            timeout = parse_duration(args.timeout)
        except ValueError as e:
            raise UsageError(f"--timeout: {e}") from None
    sampler = open_sampler(args, config)
    try:
        r = actions.reset_gpu(args.gpu, face="cli", force=args.force, sampler=sampler, config=config,
                              kill_timeout=timeout, dry_run=args.dry_run)
    finally:
        sampler.close()
    if args.json:
        print_json(r.to_dict())
    else:
        for k in r.details.get("kills", []):
            print(f"pid {k['pid']}: {k['outcome']}: {k['message']}")
        print(r.message) if r.ok else print(f"gputop: {r.message}", file=sys.stderr)
        if not r.ok and r.outcome == "busy":
            for h in r.details.get("holders", []):
                print(f"  holder pid {h['pid']} ({visible(h['name'])}, user {visible(h['user'])}, {h['verdict']}): "
                      f"{visible((h['cmd'] or '')[:70])}")
        # an audit-log failure was already printed once, loudly, by auditlog.warn()
    return r.exit_code
