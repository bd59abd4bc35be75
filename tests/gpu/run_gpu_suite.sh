#!/usr/bin/env bash
# tests/gpu/run_gpu_suite.sh: runs every GPU test program and prints one summary line per suite.
#
#   tests/gpu/run_gpu_suite.sh [BIN_DIR] [LOG_DIR]
#
# BIN_DIR holds the strata_gpu_*_test programs (default: the directory of this script, which is
# where the build copies it: <build>/gpu); full logs go to LOG_DIR (default: BIN_DIR/logs). Each
# suite runs once as is; the kernel test runs again, at small sizes, under compute-sanitizer's
# memcheck and racecheck when compute-sanitizer is found. To add a suite, append it to `suites`.
# Each suite is stopped after STRATA_GPU_SUITE_TIMEOUT seconds (default 300; exit 124 = timed out).
# Exits non-zero when any suite failed.
set -uo pipefail

bin=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
logs=${2:-$bin/logs}
mkdir -p "$logs"

# name | command (relative to BIN_DIR)
suites=(
  "kernels|./strata_gpu_kernels_test --quiet"
  "gemm|./strata_gpu_gemm_test"
  "allocator|./strata_gpu_allocator_test"
)

sanitizer=$(command -v compute-sanitizer || true)
for candidate in ${CUDA_HOME:+$CUDA_HOME/bin/compute-sanitizer} /usr/local/cuda/bin/compute-sanitizer \
                 /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  if [[ -z $sanitizer && -x $candidate ]]; then sanitizer=$candidate; fi
done
if [[ -n $sanitizer ]]; then
  suites+=(
    "kernels memcheck|SANITIZER --tool memcheck --leak-check full --error-exitcode 3 ./strata_gpu_kernels_test --small --quiet"
    "kernels racecheck|SANITIZER --tool racecheck --racecheck-report all --error-exitcode 3 ./strata_gpu_kernels_test --small --quiet"
    "gemm memcheck|SANITIZER --tool memcheck --error-exitcode 3 ./strata_gpu_gemm_test --small"
  )
fi

summary=()
failed=0
for entry in "${suites[@]}"; do
  name=${entry%%|*}
  command=${entry#*|}
  command=${command//SANITIZER/$sanitizer}
  log="$logs/$(echo "$name" | tr ' ' '_').log"
  start=$(date +%s%N)
  (cd "$bin" && eval "timeout ${STRATA_GPU_SUITE_TIMEOUT:-300} $command") >"$log" 2>&1
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
if [[ -z $sanitizer ]]; then echo "note: compute-sanitizer not found, memcheck / racecheck skipped"; fi
exit $(( failed > 0 ? 1 : 0 ))
