#!/usr/bin/env bash
# The compile-time report of .ci/run from a clone whose path is long: thousands of long lines used
# to make `sort | head` exit 141 (SIGPIPE) under pipefail. Passes when the report exits 0, lists ten
# units and strips the clone's path. Usage: compile_report_deep_path.sh <compile-report> <scratch dir>
set -euo pipefail
report=$1
deep=$2/ci-deep
for i in $(seq 1 40); do deep+=/a-directory-name-long-enough-to-fill-the-pipe-buffer-$i; done
rm -rf "$2/ci-deep" && mkdir -p "$deep"
for i in $(seq 1 3000); do printf '%d.%03d\t%s/tests/unit_%04d.cpp\n' $((i % 61)) $((i % 997)) "$deep" "$i"; done >"$deep/times.tsv"
status=0
output=$("$report" "$deep/times.tsv" "$deep") || status=$?
rm -rf "$2/ci-deep"
if [[ $status -ne 0 ]]; then echo "compile-report exited $status from a ${#deep}-character path"; exit 1; fi
listed=$(grep -c '^  [0-9.]*	tests/unit_' <<<"$output" || true)
if [[ $listed -ne 10 ]]; then echo "expected ten units with the clone's path stripped, got $listed:"; echo "$output"; exit 1; fi
grep -q '3000 translation units' <<<"$output" || { echo "missing the total: $output"; exit 1; }
echo "compile-report: exit 0 from a ${#deep}-character path, ten units listed"
