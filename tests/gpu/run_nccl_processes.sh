#!/usr/bin/env bash
# tests/gpu/run_nccl_processes.sh: starts test_nccl as a job of one process per GPU, the way
# torchrun does (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), twice:
#   1. NCCL's bootstrap at MASTER_ADDR:MASTER_PORT+1 (NCCL_COMM_ID derived by the launcher code)
#   2. the unique id exchanged through a file (STRATA_NCCL_ID_FILE)
#
#   tests/gpu/run_nccl_processes.sh <path to test_nccl> [number of processes, default 2]
#
# Each process's output goes to <log dir>/nccl-<mode>-rank<r>.log (STRATA_TEST_LOG_DIR, else a
# temporary folder); the script prints each process's summary line and exits non-zero when any
# process failed or did not finish within STRATA_TEST_JOB_TIMEOUT seconds (default 300).
set -uo pipefail

binary=${1:?usage: run_nccl_processes.sh <test_nccl> [processes]}
processes=${2:-2}
log_dir=${STRATA_TEST_LOG_DIR:-$(mktemp -d)}
job_timeout=${STRATA_TEST_JOB_TIMEOUT:-300}
mkdir -p "$log_dir"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
unset NCCL_COMM_ID STRATA_NCCL_ID_FILE

status=0
run_job() {  # run_job <mode> [VAR=value ...]: one job of $processes processes
  local mode=$1
  shift
  local port=$((20000 + RANDOM % 12000))
  local pids=()
  for ((r = 0; r < processes; r++)); do
    env "$@" RANK=$r WORLD_SIZE=$processes LOCAL_RANK=$r LOCAL_WORLD_SIZE=$processes MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port timeout "$job_timeout" "$binary" --process >"$log_dir/nccl-$mode-rank$r.log" 2>&1 &
    pids+=($!)
  done
  for ((r = 0; r < processes; r++)); do
    if wait "${pids[$r]}"; then
      echo "job '$mode' rank $r: exit 0: $(tail -n 1 "$log_dir/nccl-$mode-rank$r.log")"
    else
      local rc=$?
      echo "job '$mode' rank $r: exit $rc: $(tail -n 1 "$log_dir/nccl-$mode-rank$r.log")"
      grep -m 5 '^FAIL' "$log_dir/nccl-$mode-rank$r.log" || true
      status=1
    fi
  done
}

run_job bootstrap
id_file="$log_dir/nccl-id.$$"
rm -f "$id_file"
run_job idfile STRATA_NCCL_ID_FILE="$id_file"
if [[ -e $id_file ]]; then
  echo "job 'idfile': rank 0 left $id_file behind"
  status=1
fi
echo "SUITE nccl processes: $([[ $status == 0 ]] && echo passed || echo FAILED), 2 jobs of $processes processes (logs in $log_dir)"
exit $status
