#!/bin/sh
# Try gputop's CLI without a GPU: start two real (sleeping) processes, write a simulated-GPU scenario that
# names them as GPU holders, and print the commands to try. The simulated backend needs live PIDs, which
# is why examples/scenario.yaml cannot list holders itself. For the TUI, `gputop --demo` does all this.
#
#   sh examples/try-scenario.sh [DIR]      # DIR defaults to a new temporary directory
#
# Processes started:
# - a "training" job: a child of this script, in your login session, so it is not an orphan;
# - an orphaned job: started with `setsid sh -c 'job & exit'`, so its session leader is gone and it was
#   handed to init, as happens to a job whose SSH session died. `gputop reap` lists it.
set -eu

dir=${1:-$(mktemp -d "${TMPDIR:-/tmp}/gputop-try-XXXXXX")}
mkdir -p "$dir"
rm -f "$dir/orphan.pid"

sleep 3600 </dev/null >/dev/null 2>&1 &
train=$!
setsid sh -c 'sleep 3600 </dev/null >/dev/null 2>&1 & echo $! >"$1"; exit 0' sh "$dir/orphan.pid"
i=0
while [ ! -s "$dir/orphan.pid" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
orphan=$(cat "$dir/orphan.pid")

cat >"$dir/scenario.yaml" <<EOF
# Written by examples/try-scenario.sh: two simulated GPUs held by real processes.
gpus:
  - {name: Simulated H100 80GB, memory_total: 80GiB, temperature: 55, power: 350, power_limit: 700,
     fan: 40, clock_sm: 1980, clock_mem: 2619}
  - {name: Simulated A100 40GB, memory_total: 40GiB, temperature: 48, power: 180, power_limit: 400}
holders:
  - {pid: $train, gpu: 0, memory: 30GiB, type: C, sm: 85}
  - {pid: $orphan, gpu: 1, memory: 12GiB, type: C, sm: 99}
EOF

cat <<EOF
Started pid $train (a training-like job) and pid $orphan (an orphaned job) on simulated GPUs 0 and 1.
Try (or pass --scenario $dir/scenario.yaml to each command):

  export GPUTOP_SCENARIO=$dir/scenario.yaml
  gputop status --chains
  gputop reap                         # lists pid $orphan's tree; nothing is signalled
  gputop kill --pid $train --dry-run   # every safety check, no signal
  gputop audit --rogue
  gputop                              # the TUI on them (q quits)
  gputop reap --apply                 # really reaps the orphaned job
  gputop log                          # the audit log of what you did

Clean up: kill $train $orphan
EOF
