#!/usr/bin/env bash
# Hardware check for gputop on a real NVIDIA machine (cannot run in CI: it needs a GPU and torch).
#
#   scripts/hardware-check.sh            # uses `gputop` from PATH, else `python3 -m gputop` from this checkout
#   GPU=1 HOLD_GIB=4 PYTHON=/opt/venv/bin/python3 scripts/hardware-check.sh
#
# 1. starts a CUDA process (the machine's own torch) holding HOLD_GIB GiB, and checks that
#    `gputop status --json` lists its PID with its memory and context type C;
# 2. kills it with `gputop kill --pid` and checks that the memory was released;
# 3. starts an orphaned CUDA job (a shell that exits, leaving its worker behind) and an orphaned bash
#    retry loop around a CUDA worker, and reaps both with `gputop reap --apply`;
# 4. checks with nvidia-smi and `gputop status` that the memory was freed, and that the audit log
#    (`gputop log --json`) recorded every action.
# Prints PASS/FAIL lines; exits 0 when every check passed, 1 if any check failed, and 2 with a SKIP line
# (not a failure) when this machine cannot run the check at all: no nvidia-smi or GPU, no torch with CUDA,
# or no gputop to run.
set -u

GPU=${GPU:-0}
HOLD_GIB=${HOLD_GIB:-2}
PY=${PYTHON:-python3}
STEP_TIMEOUT=${STEP_TIMEOUT:-120}   # seconds for any one gputop call
READY_TIMEOUT=${READY_TIMEOUT:-180} # seconds for a CUDA process to allocate its memory

HERE=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${GPUTOP:-}" ]; then
    read -r -a GT <<<"$GPUTOP"
elif command -v gputop >/dev/null 2>&1; then
    GT=(gputop)
else
    GT=("$PY" -m gputop)
    export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gputop-hwcheck.XXXXXX")
# A private state dir (audit log) and config: no protect patterns, so that running this script from
# tmux/screen or under nohup does not make its own CUDA jobs "protected".
export GPUTOP_STATE_DIR="$WORK/state"
export GPUTOP_CONFIG="$WORK/config.yaml"
printf 'protect: []\nnohup_protects: false\n' >"$GPUTOP_CONFIG"
unset GPUTOP_SCENARIO GPUTOP_AUDIT_LOG
export GPUTOP_BACKEND=${GPUTOP_BACKEND:-nvml}

FAILS=0
PIDS=()
# The start time (field 22 of /proc/PID/stat) of a live process; empty when it is gone or a zombie (exited,
# not yet waited for by init): with the PID, the process's identity (a PID reused since is not it).
start_of() {
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 0
    set -- $st
    [ "$1" = Z ] || [ "$1" = X ] || echo "${20}"
}

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }

cleanup() {
    local p
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] || continue
        pkill -KILL -P "$p" 2>/dev/null
        kill -KILL "$p" 2>/dev/null
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "FAIL interrupted"; exit 1' INT TERM

gt() { timeout "$STEP_TIMEOUT" "${GT[@]}" "$@"; }

# python3 snippet that holds HOLD_GIB GiB on GPU and reports readiness (its own PID) in a file.
hold_code() { # $1: ready file, $2: marker
    cat <<PYEOF
import os, time, torch
x = torch.empty(int($HOLD_GIB * 2**30), dtype=torch.uint8, device="cuda:$GPU")
x.fill_(1); torch.cuda.synchronize()
open("$1.tmp", "w").write(str(os.getpid())); os.replace("$1.tmp", "$1")
time.sleep(3600)  # $2
PYEOF
}

wait_ready() { # $1: ready file -> prints the PID
    local i
    for ((i = 0; i < READY_TIMEOUT * 10; i++)); do
        [ -s "$1" ] && { cat "$1"; return 0; }
        sleep 0.1
    done
    return 1
}

gone_from_gpu() { # $1: pid; true once nvidia-smi no longer lists it (waits up to 30 s)
    local i
    for ((i = 0; i < 60; i++)); do
        if ! nvidia-smi --query-compute-apps=pid --format=csv,noheader,nounits -i "$GPU" 2>/dev/null \
                | tr -d ' ' | grep -qx "$1"; then
            return 0
        fi
        sleep 0.5
    done
    return 1
}

json_check() { # $1: json file, $2: python expression over `d` (the parsed JSON) that must be true
    "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if eval(sys.argv[2], {"d": d}) else 1)
PYEOF
}

# ---- prerequisites ----------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "SKIP hardware check: nvidia-smi not found (this check needs an NVIDIA GPU)"; exit 2
fi
# MIG: reported, never changed (no 'nvidia-smi -mig' and no 'nvidia-smi mig' here). With MIG on, gputop lists
# each MIG device under its GPU and places holders on them (docs/mig.md).
MIG_MODE=$(timeout 30 nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader -i "$GPU" 2>/dev/null | head -n 1 | tr -d '[:space:]')
case "$MIG_MODE" in
    Enabled) echo "INFO MIG is enabled on GPU $GPU: $(timeout 30 nvidia-smi -L 2>/dev/null | grep -c 'MIG ') MIG device(s) on this node; 'gputop status' lists them (this check never changes the MIG mode)" ;;
    Disabled) echo "INFO MIG is disabled on GPU $GPU (this check never changes the MIG mode)" ;;
    *) echo "INFO MIG: not supported on GPU $GPU, or not reported by nvidia-smi" ;;
esac
if ! timeout 120 "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "SKIP hardware check: '$PY' has no torch with CUDA (set PYTHON=/path/to/python3)"; exit 2
fi
if ! gt --version >/dev/null 2>&1; then
    echo "SKIP hardware check: cannot run gputop as '${GT[*]}'"; exit 2
fi
pass "prerequisites: nvidia-smi, torch with CUDA, ${GT[*]}"

MIN_BYTES=$((HOLD_GIB * 1024 * 1024 * 1024))

# ---- 1. status lists a CUDA holder -------------------------------------------------------------
"$PY" -c "$(hold_code "$WORK/holder.ready" gputop-hwcheck-holder)" >"$WORK/holder.log" 2>&1 &
HOLDER_SH=$!
PIDS+=("$HOLDER_SH")
if HOLDER=$(wait_ready "$WORK/holder.ready"); then
    pass "started a CUDA process, pid $HOLDER, holding ${HOLD_GIB} GiB on GPU $GPU"
else
    fail "CUDA process did not allocate its memory within ${READY_TIMEOUT}s: $(tail -n 3 "$WORK/holder.log")"
    exit 1
fi
PIDS+=("$HOLDER")
if gt status --json >"$WORK/status1.json" 2>"$WORK/status1.err"; then
    if json_check "$WORK/status1.json" \
        "any(h['pid']==$HOLDER and h['ctx']=='C' and $GPU in h['gpus'] and (h['gpu_memory'] or 0)>=$MIN_BYTES for h in d['holders'])"; then
        pass "gputop status --json lists pid $HOLDER on GPU $GPU with >= ${HOLD_GIB} GiB and context type C"
    else
        fail "gputop status --json does not list pid $HOLDER with its memory and type C: $(grep -o "\"pid\": $HOLDER[^}]*" "$WORK/status1.json" | head -c 400)"
    fi
    if json_check "$WORK/status1.json" "any(h['pid']==$HOLDER and h['user'] and h['cmdline'] for h in d['holders'])"; then
        pass "the holder has a user and a command line (not 'unknown')"
    else
        fail "the holder's user or command line is missing"
    fi
else
    fail "gputop status --json failed: $(tail -n 2 "$WORK/status1.err")"
fi

# ---- 2. kill it --------------------------------------------------------------------------------
if gt kill --pid "$HOLDER" --timeout 15 --force --json >"$WORK/kill.json" 2>"$WORK/kill.err"; then
    if json_check "$WORK/kill.json" "d['results'][0]['outcome'] in ('terminated','killed') and d['results'][0]['memory_released'] is True"; then
        pass "gputop kill --pid $HOLDER: $(json_check "$WORK/kill.json" "d['results'][0]['outcome']=='terminated'" && echo terminated || echo killed), memory released (gputop re-sampled)"
    else
        fail "gputop kill --pid $HOLDER did not report the memory as released: $(head -c 400 "$WORK/kill.json")"
    fi
else
    fail "gputop kill --pid $HOLDER failed (rc $?): $(cat "$WORK/kill.err" "$WORK/kill.json" | head -c 400)"
fi
if gone_from_gpu "$HOLDER"; then pass "nvidia-smi no longer lists pid $HOLDER"; else fail "nvidia-smi still lists pid $HOLDER"; fi

# ---- 3. reap an orphaned CUDA job, and an orphaned retry loop around one -------------------------
CODE1=$(hold_code "$WORK/orphan.ready" gputop-hwcheck-orphan)
printf '%s\n' "$CODE1" >"$WORK/orphan.py"
setsid sh -c "\"$PY\" \"$WORK/orphan.py\" >\"$WORK/orphan.log\" 2>&1 & exit 0" </dev/null
if ORPHAN=$(wait_ready "$WORK/orphan.ready"); then
    PIDS+=("$ORPHAN")
    pass "started an orphaned CUDA job, pid $ORPHAN (its shell exited)"
else
    fail "orphaned CUDA job did not start: $(tail -n 3 "$WORK/orphan.log" 2>/dev/null)"
    ORPHAN=
fi

CODE2=$(hold_code "$WORK/loop.ready" gputop-hwcheck-loop)
printf '%s\n' "$CODE2" >"$WORK/loop.py"
# A retry loop: when the worker dies, the loop starts a new one (it removes the ready file first).
setsid sh -c "bash -c 'while true; do rm -f \"$WORK/loop.ready\"; \"$PY\" \"$WORK/loop.py\"; sleep 0.2; done' >\"$WORK/loop.log\" 2>&1 & exit 0" </dev/null
if LOOPW=$(wait_ready "$WORK/loop.ready"); then
    LOOP=$(ps -o ppid= -p "$LOOPW" | tr -d ' ')
    LOOP_START=$(start_of "$LOOP")
    PIDS+=("$LOOP" "$LOOPW")
    pass "started an orphaned retry loop, pid $LOOP, with CUDA worker pid $LOOPW"
else
    fail "orphaned retry loop did not start: $(tail -n 3 "$WORK/loop.log" 2>/dev/null)"
    LOOP=
fi

if gt reap --json >"$WORK/preview.json" 2>"$WORK/preview.err"; then
    for root in $ORPHAN $LOOP; do
        if json_check "$WORK/preview.json" "any(t['root']['pid']==$root and $GPU in t['gpus'] for t in d['trees'])"; then
            pass "gputop reap (preview) lists the orphan tree with root $root on GPU $GPU"
        else
            fail "gputop reap (preview) does not list root $root: $(head -c 600 "$WORK/preview.json")"
        fi
    done
else
    fail "gputop reap failed: $(tail -n 2 "$WORK/preview.err")"
fi

for root in $ORPHAN $LOOP; do
    if gt reap --apply --root "$root" --grace 10 --json >"$WORK/reap.$root.json" 2>"$WORK/reap.$root.err" &&
        json_check "$WORK/reap.$root.json" "d['results'][0]['outcome']=='reaped' and d['results'][0]['memory_released'] is True"; then
        pass "gputop reap --apply --root $root: reaped, memory released"
    else
        fail "gputop reap --apply --root $root: $(cat "$WORK/reap.$root.err" "$WORK/reap.$root.json" 2>/dev/null | head -c 600)"
    fi
done
[ -n "$ORPHAN" ] && { if gone_from_gpu "$ORPHAN"; then pass "nvidia-smi no longer lists pid $ORPHAN"; else fail "nvidia-smi still lists pid $ORPHAN"; fi; }
if [ -n "$LOOP" ]; then
    sleep 3  # a surviving loop would have started a new worker by now
    if [ -n "$LOOP_START" ] && [ "$(start_of "$LOOP")" = "$LOOP_START" ]; then fail "retry loop pid $LOOP survived"
    else pass "retry loop pid $LOOP is gone"; fi
    NEWW=$(cat "$WORK/loop.ready" 2>/dev/null)
    if [ -n "$NEWW" ] && [ "$NEWW" != "$LOOPW" ]; then
        PIDS+=("$NEWW")
        fail "the retry loop started a new CUDA worker, pid $NEWW"
    elif pgrep -f gputop-hwcheck-loop >/dev/null 2>&1; then
        fail "a process of the retry loop is still running: $(pgrep -af gputop-hwcheck-loop | head -n 3)"
    else
        pass "no new CUDA worker was started"
    fi
    if gone_from_gpu "$LOOPW"; then pass "nvidia-smi no longer lists pid $LOOPW"; else fail "nvidia-smi still lists pid $LOOPW"; fi
fi

# ---- 4. memory freed, audit trail ---------------------------------------------------------------
if gt status --json >"$WORK/status2.json" 2>/dev/null &&
    json_check "$WORK/status2.json" "not any(h['pid'] in ($HOLDER, ${ORPHAN:-0}, ${LOOPW:-0}) for h in d['holders'])"; then
    pass "gputop status no longer lists any of the killed or reaped processes"
else
    fail "gputop status still lists a killed or reaped process"
fi
if gt log --json >"$WORK/log.json" 2>/dev/null &&
    json_check "$WORK/log.json" "any(r.get('action')=='kill' and r['target']['pid']==$HOLDER for r in d) and sum(r.get('action')=='reap' and r.get('outcome')=='reaped' for r in d) >= len('${ORPHAN:+x}${LOOP:+x}')"; then
    pass "gputop log recorded the kill and the reaps"
else
    fail "gputop log is missing the kill or a reap"
fi

if [ "$FAILS" -gt 0 ]; then
    echo "hardware check: $FAILS check(s) FAILED"
    exit 1
fi
echo "hardware check: all checks passed"
