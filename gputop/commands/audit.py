"""gputop audit --rogue: miners and other rogue GPU use, each finding with a reason and evidence."""

from __future__ import annotations

from gputop.commands._common import config_from, open_sampler, print_json, table
from gputop.core.rogue import SEVERITIES, AuditConfig, audit

NAME = "audit"
HELP = "rogue-process audit (--rogue): miner names, stratum/pool/wallet args, pool ports, odd executables"
DESCRIPTION = """Audit the GPU holders (and with --all-processes every host process) for rogue use:
known miner names, stratum+tcp:// URLs and pool/wallet-looking arguments, TCP connections to common
mining-pool ports, deleted executables or executables in /tmp, /dev/shm or hidden directories, disguised
names, the hashing profile (high utilisation, very little memory; judged on this one sample), users not on
audit.allowed_users, GPU use outside audit.allowed_hours, and orphaned holders. Nothing is allow-listed by
default. Configure in the 'audit:' section of the config (docs/audit.md). Exit code 0 whether or
not there are findings."""


def add_arguments(p) -> None:
    p.add_argument("--rogue", action="store_true", help="the rogue-process audit (the default and only audit)")
    p.add_argument("--json", action="store_true", help="print JSON: {host, at, findings: [...]}")
    p.add_argument("--all-processes", action="store_true",
                   help="also check every host process, not only GPU holders (name, cmdline, exe, connections)")
    p.add_argument("--min-severity", choices=SEVERITIES, default="low", help="hide findings below this")


def run(args) -> int:
    config = config_from(args)
    AuditConfig.from_config(config)  # a bad audit: section is a usage error before sampling
    sampler = open_sampler(args, config)
    try:
        snap = sampler.sample()
    finally:
        sampler.close()
    findings = audit(snap, config, all_processes=True if args.all_processes else None)
    keep = SEVERITIES[: SEVERITIES.index(args.min_severity) + 1]
    findings = [f for f in findings if f.severity in keep]
    if args.json:
        print_json({"host": snap.host, "at": snap.at, "holders": len(snap.holders),
                    "findings": [f.to_dict() for f in findings]})
        return 0
    if not findings:
        print(f"{snap.host}: no rogue findings among {len(snap.holders)} GPU holder(s)")
        return 0
    rows = [[f.severity.upper(), f.rule, str(f.pid) if f.pid is not None else "-", f.user or "?",
             (f.name or "?")[:20], f.reason] for f in findings]
    print(table(rows, ["SEVERITY", "RULE", "PID", "USER", "NAME", "REASON"], right={2}))
    print()
    print("evidence:")
    for f in findings:
        print(f"  pid {f.pid} {f.rule}: {f.evidence}")
    return 0
