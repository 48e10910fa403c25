"""gputop status: every GPU and every GPU-holding process, with ancestry and orphan verdicts."""

from __future__ import annotations

import sys
import time

from gputop.backends import no_gpu_message
from gputop.commands._common import fit_last, open_sampler, print_json, table, to_terminal, write_stdout
from gputop.util.errors import UsageError
from gputop.core.ownership import NONE, Owner
from gputop.util.textsafe import visible
from gputop.core.model import Snapshot, place_label
from gputop.core.ledger import holder_note, ledger_lines
from gputop.core.snapshot_json import snapshot_json
from gputop.util.units import fmt_bytes, fmt_duration, fmt_opt

NAME = "status"
HELP = "show GPUs and the processes holding them (table, or --json)"
DESCRIPTION = """Show every GPU and every GPU-holding process with its ancestor chain, owner (systemd unit, login
session, container, pod or Slurm job, from its cgroup) and orphan verdict.
With no GPU, lists each backend with the reason it is unavailable and exits 0."""


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print JSON: {at, gpu: {gpus, holders}, holders, roots, warnings, ...}; "
                                                        "indented at a terminal, one line to a pipe or file")
    p.add_argument("--chains", action="store_true", help="table: print each holder's ancestor chain")
    p.add_argument("--sample-time", type=float, default=None, metavar="S",
                   help="where utilisation is a counter delta (AMD/Intel DRM fdinfo), sample twice, S seconds "
                        "apart (default 0.5; 0: one sample, utilisation N/A)")
    p.add_argument("--hosts", metavar="H1,H2", help="ask these hosts through ssh, in parallel, and merge")
    p.add_argument("--hosts-file", metavar="FILE", help="hosts to ask, one per line ('#' comments)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="--hosts: seconds to wait for each host (default 10)")


DEFAULT_SAMPLE_TIME = 0.5


def run(args) -> int:
    if args.hosts is not None or args.hosts_file is not None:  # an empty --hosts is an error, not local
        from gputop.commands.remote import run_status_hosts

        return run_status_hosts(args)
    if args.sample_time is not None and not 0 <= args.sample_time <= 60:
        raise UsageError(f"--sample-time must be between 0 and 60 seconds (got {args.sample_time:g})")
    sampler = open_sampler(args, memo=False)  # one or two samples: no verdict memo to keep
    try:
        snap = sampler.sample()
        wait = DEFAULT_SAMPLE_TIME if args.sample_time is None else args.sample_time
        if wait > 0 and any(b.needs_two_samples for b in sampler.backends):
            time.sleep(wait)  # the second sample turns engine counters into utilisation
            snap = sampler.sample()
    finally:
        sampler.close()
    if args.json and not to_terminal():  # one line to a pipe or a file, indented at a terminal
        write_stdout(snapshot_json(snap) + "\n")
    elif args.json:
        print_json(snap.to_dict())
    else:
        write_stdout(render(snap, chains=args.chains) + "\n")
        note = unavailable_note(snap)
        if note:
            print(f"gputop: note: {note}", file=sys.stderr)
    return 0


OWNER_WIDTH = 28
FLAGGED = ("squatter", "outside", "unknown")  # standings that get a line under the holder table


def gpu_cell(h) -> str:
    """The GPU column: the holder's GPUs ("0,1"), each use on a MIG device with its instance ("0:GI2/CI0")."""
    if all(u.gpu_instance_id is None for u in h.uses):
        return ",".join(map(str, h.gpus))
    return ",".join(dict.fromkeys(place_label(u) for u in h.uses))


def owner_cell(owner: Owner | None) -> str:
    """The OWNER cell: a short label ('?' when the cgroup could not be read), cut to OWNER_WIDTH."""
    text = owner.label if owner is not None else "?"
    return text if len(text) <= OWNER_WIDTH else text[: OWNER_WIDTH - 1] + "~"


def _pct(v) -> str:
    return fmt_opt(v, "{:.0f}%")


def job_cell(h) -> str:
    """The JOB column: Slurm job id (.step) and its state, e.g. ``42.batch RUNNING``; ``-``: no job.
    A process of an earlier run of a requeued job shows ``REQUEUED``: its run ended, whatever the job's
    current state is."""
    if h.job is None:
        return "-"
    st = h.job_state.for_ref(h.job) if h.job_state is not None else None
    if st is not None and st.earlier_run:  # a leftover of a run that ended; the job itself runs again
        return f"{h.job.label()} REQUEUED"
    return f"{h.job.label()} {st.state if st is not None and st.state else 'state?'}"


def alloc_cell(snap: Snapshot, gpu: int) -> str:
    """The GPU table's JOB cell: the job the scheduler gave the GPU to and its user, and how long it has
    been idle (no holder) if it is; ``-``: allocated to no job."""
    a = snap.allocation.of(gpu) if snap.allocation is not None else None
    if a is None:
        return "-" if snap.allocation is not None and not snap.allocation.error else "?"
    idle = snap.allocation.idle_for(gpu, snap.at)
    return f"{visible(a.job)} ({visible(a.user or str(a.uid))})" + (f" idle {fmt_duration(idle)}" if idle is not None else "")


def standing_cell(snap: Snapshot, pid: int) -> str:
    st = snap.allocation.standing(pid) if snap.allocation is not None else None
    return st.kind if st is not None else "?"


def render(snap: Snapshot, chains: bool = False) -> str:
    out: list[str] = [f"{snap.host}  {len(snap.devices)} GPU(s)  {len(snap.holders)} holder(s)  "
                      f"{len(snap.roots)} orphan tree(s)"]
    if not snap.devices:
        out.append(no_gpu_message(list(snap.backends)))
    else:
        out.extend(_gpu_table(snap))
    if snap.holders:
        out.append("")
        out.extend(_holder_table(snap, chains))
    if snap.roots:
        out.append("")
        out.append("orphan trees (reap with 'gputop reap --apply'):")
        for r in snap.roots:
            out.append(f"  root {r.pid} ({visible(r.proc.name)}, {visible(r.proc.user)}): holders {list(r.holders)} on GPU "
                       f"{','.join(map(str, r.gpus))}, {fmt_bytes(r.gpu_memory)}; {visible(r.reason)}")
    for w in snap.warnings:
        out.append(f"warning: {visible(w)}")
    return "\n".join(out)


def _gpu_table(snap: Snapshot) -> list[str]:
    """The GPU table (a row per MIG device under its GPU, a JOB column on a scheduler's node), then the
    memory ledger's lines (docs/memory-ledger.md)."""
    rows = []
    for d in snap.devices:
        if d.lost:
            rows.append([str(d.index), d.name or "?", "LOST", "", "", "", "", d.backend])
            continue
        mem = f"{fmt_bytes(d.memory_used)} / {fmt_bytes(d.memory_total)}"
        power = ("N/A" if d.power_w is None and d.power_limit_w is None else
                 f"{fmt_opt(d.power_w, '{:.0f}W')}/{fmt_opt(d.power_limit_w, '{:.0f}W')}")
        rows.append([str(d.index), d.name or "N/A", _pct(d.util_gpu), mem,
                     fmt_opt(d.temperature, "{:.0f}C"), power, _pct(d.fan_pct), d.backend])
        rows.extend(instance_rows(snap, d))
    alloc = snap.allocation is not None  # a scheduler's node: whom each GPU is allocated to
    if alloc:  # the JOB cell on each GPU's row; a MIG device's row under it has none of its own
        jobs = {str(d.index): alloc_cell(snap, d.index) for d in snap.devices}
        for r in rows:
            r.append(jobs.get(r[0], ""))
    return [table(rows, ["GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER", "FAN", "BACKEND",
                         *(["JOB"] if alloc else [])], right={0, 2, 4, 6}),
            *(f"  {line}" for line in ledger_lines(snap))]


def _holder_table(snap: Snapshot, chains: bool) -> list[str]:
    """The holder table, then a line per holder with something to say: its verdict's reason, its standing,
    the ledger's note, its chain (``chains``)."""
    out = []
    owners = any(h.owner is not None for h in snap.holders)  # not read off Linux: no column
    jobs = any(getattr(h, "job", None) is not None for h in snap.holders)  # a Slurm node: a JOB column
    rows = []
    for h in snap.holders:
        rows.append([
            str(h.pid), h.user or "?", *([job_cell(h)] if jobs else []), h.ctx, gpu_cell(h), fmt_bytes(h.gpu_memory),
            _pct(h.sm_util), fmt_opt(h.cpu_percent, "{:.0f}%"), fmt_duration(h.runtime),
            h.verdict.kind, *([standing_cell(snap, h.pid)] if snap.allocation is not None else []),
            *([owner_cell(h.owner)] if owners else []), h.cmd,
        ])
    headers = ["PID", "USER", *(["JOB"] if jobs else []), "TYPE", "GPU", "GPU-MEM", "SM", "CPU", "TIME",
               "VERDICT", *(["STANDING"] if snap.allocation is not None else []),
               *(["OWNER"] if owners else []), "COMMAND"]
    shift = 1 if jobs else 0
    out.append(table(fit_last(rows, headers), headers, right={0, 4 + shift, 5 + shift, 6 + shift, 7 + shift}))
    for h in snap.holders:
        # Not-orphan with an orphan test on record: an ownership rule (systemd unit, live login) overruled it.
        if h.verdict.kind != "not-orphan" or h.verdict.orphan_reason:
            out.append(f"  pid {h.pid}: {h.verdict.kind}: {visible(h.verdict.reason)}")
        st = snap.allocation.standing(h.pid) if snap.allocation is not None else None
        if st is not None and st.kind in FLAGGED:
            out.append(f"  pid {h.pid}: {st.kind}: {visible(st.reason)}")
        note = holder_note(h)
        if note is not None:
            out.append(f"  pid {h.pid}: {visible(note)}")
        if chains and h.chain:
            owned = h.chain_owners or (None,) * len(h.chain)
            out.append(f"  pid {h.pid} chain: " + " <- ".join(
                f"{c.pid}({visible(c.name)})" + (f"[{visible(o.label)}]" if o is not None and o.kind != NONE else "")
                for c, o in zip(h.chain, owned)))
    return out


def instance_rows(snap: Snapshot, d) -> list[list[str]]:
    """A row per MIG device of GPU ``d``, under it: "0:1" (GPU:MIG index), its ids and profile, memory;
    utilisation N/A where NVML does not give it (never 0), else with its source."""
    rows = []
    if getattr(d, "mig_enabled", None) and not snap.instances_on(d.index):  # MIG on, nothing carved out
        rows.append([f"{d.index}:-", "- MIG on, no MIG devices", "", "", "", "", "", d.backend])
    for m in snap.instances_on(d.index) if getattr(snap, "instances", ()) else ():
        util = "N/A" if m.util_gpu is None else f"{m.util_gpu:.0f}%" + (f" ({m.util_source})" if m.util_source else "")
        rows.append([f"{d.index}:{m.mig_index}", f"- MIG {visible(m.label)}", util,
                     f"{fmt_bytes(m.memory_used)} / {fmt_bytes(m.memory_total)}", "", "", "", d.backend])
    return rows


def unavailable_note(snap: Snapshot) -> str | None:
    """Backends that could not be opened while others work: a note for stderr, never in the table."""
    unavailable = [s for s in snap.backends if not s.available]
    if unavailable and snap.devices:
        return "backends unavailable: " + "; ".join(s.reason for s in unavailable)
    return None
