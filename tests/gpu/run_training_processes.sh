#!/usr/bin/env bash
# tests/gpu/run_training_processes.sh: the 2-GPU training checks of test_training as jobs of one
# process per GPU, started the way torchrun does (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
# MASTER_PORT): tp=2 + sequence parallel (also with --tp-comm-overlap, and with its copy-engine all-gathers), dp=2, dp=2 with the distributed optimizer and both
# overlaps, pp=2 (1F1B), cp=2 (ring and all-to-all attention), each compared with the tp=1 run on 1 GPU.
#
#   tests/gpu/run_training_processes.sh <path to test_training> <its log> [--data-path PREFIX]
#
# <its log> is test_training's output, whose `LOSSES ...` line holds the 20 losses of tp=1 on 1 GPU.
# Rank 0 of each job prints its own LOSSES line; every loss must be within 2e-2 relative of the
# 1-GPU one. Each process's output goes to <log dir>/training-<layout>-rank<r>.log
# (STRATA_TEST_LOG_DIR, else a temporary folder); STRATA_TEST_LAYOUTS picks layouts (default all).
# Exits non-zero when a process failed, did not finish within STRATA_TEST_JOB_TIMEOUT seconds
# (default 300), or a loss is off.
set -uo pipefail
binary=${1:?usage: run_training_processes.sh <test_training> <test_training log> [--data-path PREFIX]}
reference_log=${2:?usage: run_training_processes.sh <test_training> <test_training log> [--data-path PREFIX]}
shift 2
log_dir=${STRATA_TEST_LOG_DIR:-$(mktemp -d)}
job_timeout=${STRATA_TEST_JOB_TIMEOUT:-300}
mkdir -p "$log_dir"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
unset NCCL_COMM_ID STRATA_NCCL_ID_FILE

status=0
reference=$(grep -m1 '^LOSSES' "$reference_log" | cut -d' ' -f2-)
[[ -z $reference ]] && { echo "no LOSSES line in '$reference_log' (the 1-GPU run)"; status=1; }
for layout in ${STRATA_TEST_LAYOUTS:-tp2 tp2-overlap tp2-engines dp2 dp2-zero pp2 cp2 cp2-a2a}; do
  port=$((20000 + RANDOM % 12000))
  pids=()
  for r in 0 1; do
    env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout "$job_timeout" "$binary" --process --process-layout $layout "$@" >"$log_dir/training-$layout-rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do
    if ! wait "${pids[$r]}"; then
      echo "$layout rank $r failed (exit $?): $(tail -n 2 "$log_dir/training-$layout-rank$r.log" | tr '\n' ' ')"
      status=1
    fi
  done
  losses=$(grep -m1 '^LOSSES' "$log_dir/training-$layout-rank0.log" | cut -d' ' -f2-)
  if [[ -z $losses || -z $reference ]]; then
    echo "$layout: no LOSSES line from rank 0"
    status=1
    continue
  fi
  verdict=$(awk -v a="$losses" -v b="$reference" 'BEGIN {
    n = split(a, x, " "); m = split(b, y, " "); if (n != m) { print "FAIL different counts " n " vs " m; exit }
    worst = 0
    for (i = 1; i <= n; i++) { e = (x[i] - y[i]) / y[i]; if (e < 0) e = -e; if (e > worst) { worst = e; at = i } }
    printf "%s %d losses within 2e-2 of tp=1 on 1 GPU (worst iteration %d: %.3e; last %.4f vs %.4f)\n", (worst <= 2e-2 ? "PASS" : "FAIL"), n, at, worst, x[n], y[n]
  }')
  echo "$layout as 2 processes: $verdict"
  [[ $verdict == PASS* ]] || status=1
done
echo "SUITE training processes: $([[ $status == 0 ]] && echo passed || echo FAILED), tp=2 + sequence parallel (plain, --tp-comm-overlap and its copy-engine gathers), dp=2, dp=2 + ZeRO-1 overlapped, pp=2, cp=2 (p2p, a2a) as 2 processes (logs in $log_dir)"
exit $status
