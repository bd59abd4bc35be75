#!/usr/bin/env bash
# A failing rank ends the whole run, on CPU threads (the in-process communicator), and nothing
# half-done is committed. Each case runs the trainer with STRATA_FAULT_INJECT and checks the exit
# status, the time to end (the collective timeout plus the exit grace plus start-up) and the message,
# and for saves, that the tracker still names the last complete checkpoint.
#
#   fault_injection_cpu.sh <train_gpt> <work directory>
set -uo pipefail
trainer=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
failures=0
small=(--device cpu --world-size 2 --tensor-model-parallel-size 2 --num-layers 2 --hidden-size 64 --num-attention-heads 4
       --seq-length 32 --micro-batch-size 2 --global-batch-size 4 --train-iters 6 --sample-tokens 0 --eval-iters 1
       --log-interval 1 --distributed-timeout-minutes 0.05)  # 3 s
export STRATA_EXIT_GRACE_SECONDS=2

# run <name> <bound seconds> <fault> <trainer args...>: runs, records status, seconds and output.
run() {
  local name=$1 bound=$2 fault=$3
  shift 3
  local start end
  start=$(date +%s.%N)
  STRATA_FAULT_INJECT=$fault timeout 120 "$trainer" "$@" >"$work/$name.out" 2>&1
  status=$?
  end=$(date +%s.%N)
  seconds=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
  printf '%-28s exit %3d after %6.2f s (bound %s s)\n' "$name" "$status" "$seconds" "$bound"
  if [[ $status -eq 0 || $status -eq 124 ]]; then
    echo "FAIL $name: exit status $status (expected a failure, and no hang)"; failures=$((failures + 1))
  fi
  if awk -v s="$seconds" -v b="$bound" 'BEGIN { exit !(s > b) }'; then
    echo "FAIL $name: took $seconds s, more than $bound s"; failures=$((failures + 1))
  fi
}
expect() {  # expect <name> <text>: the output names it
  if ! grep -qF -- "$2" "$work/$1.out"; then
    echo "FAIL $1: the output does not contain: $2"; sed 's/^/    | /' "$work/$1.out" | tail -n 15; failures=$((failures + 1))
  fi
}
tracker_is() {  # tracker_is <name> <dir> <iteration>
  local got
  got=$(cat "$2/latest_checkpointed_iteration.txt" 2>/dev/null || echo none)
  if [[ $got != "$3" ]]; then echo "FAIL $1: the tracker says '$got', expected $3"; failures=$((failures + 1)); fi
  if [[ -d $2/iter_$(printf '%07d' 4) ]]; then echo "FAIL $1: iter_0000004 was committed"; failures=$((failures + 1)); fi
}

# 1. A rank that throws: the other stops (an aborted collective) and the process exits non-zero.
run throw 30 "throw@1:3" "${small[@]}"
expect throw "fault injection: rank 1: throw at iteration 3"
expect throw "error: fault injection: rank 1 throws at iteration 3"

# 2. A rank that stops taking part (sleeps for good before its iteration's collectives): the other
#    times out in its collective naming the rank it waits for, and the process ends although the
#    sleeping thread never returns (the exit grace).
run sleep 30 "sleep@1:3" "${small[@]}"
expect sleep "timed out after 3 s"
expect sleep "waiting for rank 1"
expect sleep "did not end within 2 s of the failure"

# 3. A rank that throws inside a save, after writing its file: the save is never committed.
run save_throw 30 "throw@1:4:save" "${small[@]}" --save "$work/ck_throw" --save-interval 2
expect save_throw "inside the checkpoint save"
tracker_is save_throw "$work/ck_throw" 2

# 4. The same with a rank stuck inside the save (never reaches the commit barrier).
run save_sleep 30 "sleep@1:4:save" "${small[@]}" --save "$work/ck_sleep" --save-interval 2
expect save_sleep "timed out after 3 s"
tracker_is save_sleep "$work/ck_sleep" 2

# 5. --async-save: a background write that fails is abandoned, not committed.
run async_throw 30 "throw@1:4:save" "${small[@]}" --save "$work/ck_async" --save-interval 2 --async-save
expect async_throw "background save of iteration 4"
tracker_is async_throw "$work/ck_async" 2

# 6. A whole run stuck on the host (one rank, so no collective waits): --progress-timeout-minutes
#    ends it, naming where the rank was.
one=(--device cpu --world-size 1 --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32
     --micro-batch-size 2 --global-batch-size 2 --train-iters 6 --sample-tokens 0 --eval-iters 1 --log-interval 1)
run progress 40 "sleep@0:3" "${one[@]}" --progress-timeout-minutes 0.05
expect progress "no iteration finished for"
expect progress "rank 0: iteration 3: forward and backward"

# 7. --log-straggler: one line per log step with the spread and the slowest rank.
STRATA_FAULT_INJECT="" "$trainer" "${small[@]}" --log-straggler --straggler-minmax-count 1 >"$work/straggler.out" 2>&1
status=$?
if [[ $status -ne 0 ]]; then echo "FAIL straggler: exit $status"; tail -n 5 "$work/straggler.out"; failures=$((failures + 1)); fi
expect straggler "step time over 2 ranks: min"
expect straggler "| slowest: rank "
lines=$(grep -c '^straggler ' "$work/straggler.out")
if [[ $lines -ne 6 ]]; then echo "FAIL straggler: $lines straggler lines for 6 log steps"; failures=$((failures + 1)); fi

# 8. A malformed STRATA_FAULT_INJECT is refused, naming the variable.
STRATA_FAULT_INJECT="explode@1" "$trainer" "${small[@]}" >"$work/bad_fault.out" 2>&1 && failures=$((failures + 1))
expect bad_fault "STRATA_FAULT_INJECT='explode@1' is not"

if [[ $failures -ne 0 ]]; then echo "$failures check(s) failed"; exit 1; fi
echo "all fault-injection checks passed"
