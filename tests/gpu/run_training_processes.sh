#!/usr/bin/env bash
# tests/gpu/run_training_processes.sh: the tp=2 + sequence-parallel training of test_training as a
# job of one process per GPU, started the way torchrun does (RANK, WORLD_SIZE, LOCAL_RANK,
# MASTER_ADDR, MASTER_PORT), compared with the same training in threads mode.
#
#   tests/gpu/run_training_processes.sh <path to test_training> <threads-mode log> [--data-path PREFIX]
#
# The threads-mode log is test_training's output (its `LOSSES ...` line). Rank 0 of the job prints
# its own LOSSES line; every loss must be within 2e-2 relative of the threads-mode one (the script
# also says whether they are bit-identical). Each process's output goes to
# <log dir>/training-rank<r>.log (STRATA_TEST_LOG_DIR, else a temporary folder); exits non-zero when
# a process failed or did not finish within STRATA_TEST_JOB_TIMEOUT seconds (default 300).
set -uo pipefail
binary=${1:?usage: run_training_processes.sh <test_training> <threads-mode log> [--data-path PREFIX]}
threads_log=${2:?usage: run_training_processes.sh <test_training> <threads-mode log> [--data-path PREFIX]}
shift 2
log_dir=${STRATA_TEST_LOG_DIR:-$(mktemp -d)}
job_timeout=${STRATA_TEST_JOB_TIMEOUT:-300}
mkdir -p "$log_dir"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
unset NCCL_COMM_ID STRATA_NCCL_ID_FILE

status=0
port=$((20000 + RANDOM % 20000))
pids=()
for r in 0 1; do
  env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout "$job_timeout" "$binary" --process "$@" >"$log_dir/training-rank$r.log" 2>&1 &
  pids+=($!)
done
for r in 0 1; do
  if ! wait "${pids[$r]}"; then
    echo "rank $r failed (exit $?): $(tail -n 2 "$log_dir/training-rank$r.log" | tr '\n' ' ')"
    status=1
  fi
done
threads=$(grep -m1 '^LOSSES' "$threads_log" | cut -d' ' -f2-)
processes=$(grep -m1 '^LOSSES' "$log_dir/training-rank0.log" | cut -d' ' -f2-)
if [[ -z $threads || -z $processes ]]; then
  echo "missing LOSSES line: threads-mode log '$threads_log' or rank 0's log"
  status=1
else
  verdict=$(awk -v a="$processes" -v b="$threads" 'BEGIN {
    n = split(a, x, " "); m = split(b, y, " "); if (n != m) { print "FAIL different counts " n " vs " m; exit }
    worst = 0; same = 1
    for (i = 1; i <= n; i++) { e = (x[i] - y[i]) / y[i]; if (e < 0) e = -e; if (e > worst) worst = e; if (x[i] != y[i]) same = 0 }
    printf "%s %d losses, worst relative difference %.3e%s\n", (worst <= 2e-2 ? "PASS" : "FAIL"), n, worst, (same ? " (bit-identical)" : "")
  }')
  echo "processes vs threads: $verdict"
  [[ $verdict == PASS* ]] || status=1
fi
echo "SUITE training processes: $([[ $status == 0 ]] && echo passed || echo FAILED), tp=2 + sequence parallel as 2 processes (logs in $log_dir)"
exit $status
