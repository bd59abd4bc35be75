#!/usr/bin/env bash
# tests/gpu/run_gpu_suite.sh <build-dir> [log-dir]: runs every GPU test program built under
# <build-dir>/tests/gpu (test_*), each with its full output in <log-dir>/<name>.log, then prints
# one summary line per program and exits non-zero if any failed.
set -u
build=${1:?usage: run_gpu_suite.sh <build-dir> [log-dir]}
logs=${2:-$build/gpu-logs}
mkdir -p "$logs"
status=0
summary=()
for program in "$build"/tests/gpu/test_*; do
  [[ -x $program && -f $program ]] || continue
  name=$(basename "$program")
  start=$(date +%s)
  "$program" >"$logs/$name.log" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - start ))
  line=$(grep -E '^SUMMARY' "$logs/$name.log" | tail -n 1)
  [[ $rc -ne 0 ]] && status=1
  summary+=("$(printf '%-24s rc=%-3d %4ds  %s' "$name" "$rc" "$seconds" "${line:-no summary line}")")
done
[[ ${#summary[@]} -eq 0 ]] && { echo "no GPU test programs under $build/tests/gpu"; exit 1; }
printf '%s\n' "${summary[@]}"
exit $status
