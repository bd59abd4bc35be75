#!/usr/bin/env bash
# tests/gpu/run_gpu_suite.sh: runs every GPU test program and prints one summary line per suite.
#
#   tests/gpu/run_gpu_suite.sh [BIN_DIR] [LOG_DIR]
#
# BIN_DIR holds the strata_gpu_*_test programs (default: the directory of this script, which is
# where the build copies it: <build>/gpu); full logs go to LOG_DIR (default: BIN_DIR/logs). A suite
# whose program was not built (no NCCL, fewer than 2 GPUs for the NCCL suites) is reported as
# skipped. To add a suite, append it to `suites`. Exits non-zero when any suite failed.
set -uo pipefail

bin=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
logs=${2:-$bin/logs}
mkdir -p "$logs"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)

# name | program that must exist | command (relative to BIN_DIR) | GPUs needed
suites=(
  "nccl threads|strata_gpu_nccl_test|./strata_gpu_nccl_test|2"
  "nccl processes|strata_gpu_nccl_test|STRATA_TEST_LOG_DIR=$logs ./run_nccl_processes.sh ./strata_gpu_nccl_test 2|2"
)

summary=()
failed=0
for entry in "${suites[@]}"; do
  IFS='|' read -r name program command needed <<<"$entry"
  if [[ ! -x $bin/$program ]]; then
    summary+=("$(printf '%-4s %-20s %s' SKIP "$name" "$program not built")")
    continue
  fi
  if (( gpus < needed )); then
    summary+=("$(printf '%-4s %-20s %s' SKIP "$name" "needs $needed GPUs, found $gpus")")
    continue
  fi
  log="$logs/$(echo "$name" | tr ' ' '_').log"
  start=$(date +%s%N)
  (cd "$bin" && eval "$command") >"$log" 2>&1
  status=$?
  elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  seconds=$(printf '%d.%d' $((elapsed_ms / 1000)) $((elapsed_ms % 1000 / 100)))
  checks=$(grep -E '^SUITE ' "$log" | tail -n1)
  [[ -z $checks ]] && checks="no summary line (crashed?)"
  if [[ $status -eq 0 ]]; then verdict=PASS; else verdict=FAIL; failed=$((failed + 1)); fi
  summary+=("$(printf '%-4s %-20s %6ss  exit %-3s %s' "$verdict" "$name" "$seconds" "$status" "$checks")")
done

echo "==== GPU suites (logs in $logs)"
for line in "${summary[@]}"; do echo "$line"; done
exit $(( failed > 0 ? 1 : 0 ))
