#!/usr/bin/env bash
# Fault injection on 2 GPUs: a rank that is killed (SIGKILL), stopped (SIGSTOP), calls exit(1),
# or stops inside a collective (sleeps before its iteration's collectives), at random iterations,
# also during a checkpoint save; the same in threads mode (one process, 2 GPUs); and torchrun
# --max-restarts 1 with a rank killed at a random iteration, which must finish with the losses of a
# run that never failed. For each case: the survivor (rank 0) must exit non-zero within the
# timeout plus 10 s of the fault, with a message naming the peer and the operation. Prints a table:
# case, trials, ended in time, worst time to end, message seen.
#
#   tests/gpu/run_fault_injection.sh <build-dir> <log-dir> [trials]      (needs 2 GPUs)
#
# STRATA_FAULT_CASES="kill exit stop sleep kill-save sleep-save threads-throw threads-sleep restart"
# picks the cases (all by default). The trainer is <build-dir>/examples/train_gpt, built for CUDA.
set -uo pipefail
build=$1
logs=$2
trials=${3:-10}
trainer=$build/examples/train_gpt
mkdir -p "$logs"
source "$(dirname "$0")/gpu_env.sh"  # LD_LIBRARY_PATH, NCCL_NVLS_ENABLE=0
export STRATA_EXIT_GRACE_SECONDS=5
cases=${STRATA_FAULT_CASES:-"kill exit stop sleep kill-save sleep-save threads-throw threads-sleep restart"}
timeout_minutes=${STRATA_FAULT_TIMEOUT_MINUTES:-0.15}   # 9 s: stop and sleep end at the collective timeout
bound=$(awk -v m="$timeout_minutes" 'BEGIN { print m * 60 + 10 }')
small=(--device cuda --mock-data --num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 512
       --vocab-size 8192 --micro-batch-size 4 --global-batch-size 4 --log-interval 1
       --tensor-model-parallel-size 2 --sequence-parallel --distributed-timeout-minutes "$timeout_minutes" --sample-tokens 0
       --eval-iters 1)
port=29600
table=()

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# One trial of process mode: rank 1 gets the fault; rank 0 must end. Sets trial_ok, trial_seconds, trial_message.
process_trial() {
  local name=$1 fault=$2 dir=$3
  shift 3
  port=$((port + 7))
  local out="$dir"
  rm -rf "$out" && mkdir -p "$out"
  local common=(MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 STRATA_FAULT_INJECT=$fault)
  env "${common[@]}" RANK=0 LOCAL_RANK=0 "$trainer" "${small[@]}" --train-iters 100000 "$@" >"$out/rank0.out" 2>"$out/rank0.err" &
  local p0=$!
  env "${common[@]}" RANK=1 LOCAL_RANK=1 "$trainer" "${small[@]}" --train-iters 100000 "$@" >"$out/rank1.out" 2>"$out/rank1.err" &
  local p1=$!
  local fault_at="" start
  start=$(now)
  while kill -0 "$p0" 2>/dev/null; do
    if [[ -z $fault_at ]] && grep -q "fault injection" "$out/rank1.err" 2>/dev/null; then fault_at=$(now); fi
    if [[ -n $fault_at ]] && awk -v a="$fault_at" -v b="$(now)" -v l="$bound" 'BEGIN { exit !(b - a > l + 30) }'; then
      break  # far past the bound: stop waiting
    fi
    if [[ -z $fault_at ]] && awk -v a="$start" -v b="$(now)" 'BEGIN { exit !(b - a > 240) }'; then break; fi
    sleep 0.1
  done
  local end
  end=$(now)
  local alive=0
  kill -0 "$p0" 2>/dev/null && alive=1
  kill -KILL "$p0" "$p1" 2>/dev/null
  wait "$p0"
  local status=$?
  wait "$p1" 2>/dev/null
  [[ -z $fault_at ]] && fault_at=$end
  trial_seconds=$(elapsed "$fault_at" "$end")
  trial_ok=0
  if [[ $alive -eq 0 && $status -ne 0 ]] && awk -v s="$trial_seconds" -v l="$bound" 'BEGIN { exit !(s <= l) }'; then trial_ok=1; fi
  # The message: the peer (rank 1) and an operation, in rank 0's own words.
  trial_message=0
  if grep -q "rank 1" "$out/rank0.err" && grep -Eq "all_reduce|all_gather|reduce_scatter|send|recv|barrier|broadcast" "$out/rank0.err"; then
    trial_message=1
  fi
  echo "$name: fault '$fault', rank 0 exit $status (alive $alive) $trial_seconds s after the fault, message $trial_message" >>"$logs/trials.txt"
}

record() {  # record <case> <trials> <in time> <worst> <message seen>
  table+=("$(printf '%-16s %6s %12s %14s %14s' "$1" "$2" "$3" "$4" "$5")")
}

run_process_case() {
  local name=$1 action=$2 save=$3
  local ok=0 seen=0 worst=0 n=0
  for ((t = 0; t < trials; t++)); do
    local iteration extra=()
    if [[ $save == 1 ]]; then
      iteration=$(( (RANDOM % 6 + 1) * 5 ))  # a save step (every 5)
      extra=(--save "$logs/$name.$t.ckpt" --save-interval 5)
      process_trial "$name" "$action@1:$iteration:save" "$logs/$name.$t" "${extra[@]}"
      # nothing half-done: the tracker names a complete earlier save, never this one
      local tracked
      tracked=$(cat "$logs/$name.$t.ckpt/latest_checkpointed_iteration.txt" 2>/dev/null || echo 0)
      if [[ $tracked -ge $iteration ]]; then trial_ok=0; echo "$name: the save of iteration $iteration was committed" >>"$logs/trials.txt"; fi
      rm -rf "$logs/$name.$t.ckpt"
    else
      iteration=$((RANDOM % 40 + 3))
      process_trial "$name" "$action@1:$iteration" "$logs/$name.$t"
    fi
    n=$((n + 1))
    ok=$((ok + trial_ok))
    seen=$((seen + trial_message))
    worst=$(awk -v a="$worst" -v b="$trial_seconds" 'BEGIN { print (b > a ? b : a) }')
  done
  record "$name" "$n" "$ok/$n" "${worst} s" "$seen/$n"
}

run_threads_case() {
  local name=$1 action=$2
  local ok=0 seen=0 worst=0 n=0
  for ((t = 0; t < trials; t++)); do
    local iteration=$((RANDOM % 40 + 3)) dir="$logs/$name.$t"
    rm -rf "$dir" && mkdir -p "$dir"
    local start end status
    start=$(now)
    STRATA_FAULT_INJECT="$action@1:$iteration" timeout 300 "$trainer" "${small[@]}" --world-size 2 --train-iters 100000 \
      >"$dir/out" 2>"$dir/err"
    status=$?
    end=$(now)
    # from the fault line's iteration on: the run's own time minus the time to reach it is not
    # known here, so the bound is checked from launch minus the start-up and iterations before it
    local reached
    reached=$(grep -n "iteration *$((iteration - 1))/" "$dir/out" | head -n1 | cut -d: -f1)
    local seconds
    seconds=$(elapsed "$start" "$end")
    n=$((n + 1))
    local in_time=0
    if [[ $status -ne 0 && $status -ne 124 && -n $reached ]]; then
      # time after the fault: total minus the first-iteration start-up and the iterations before
      local first
      first=$(sed -n 's/^first iteration finished \([0-9.]*\) s after launch/\1/p' "$dir/out")
      local after
      after=$(awk -v s="$seconds" -v f="${first:-0}" 'BEGIN { printf "%.2f", s - f }')
      seconds=$after
      awk -v s="$seconds" -v l="$bound" 'BEGIN { exit !(s <= l) }' && in_time=1
    fi
    ok=$((ok + in_time))
    if grep -q "rank 1" "$dir/err"; then seen=$((seen + 1)); fi
    worst=$(awk -v a="$worst" -v b="$seconds" 'BEGIN { print (b > a ? b : a) }')
    echo "$name: fault '$action@1:$iteration', exit $status, $seconds s after the first iteration" >>"$logs/trials.txt"
  done
  record "$name" "$n" "$ok/$n" "${worst} s" "$seen/$n"
}

# torchrun --max-restarts 1: a rank killed at a random iteration; the job resumes from the last
# checkpoint and ends with the uninterrupted run's losses (bit for bit, same layout).
run_restart_case() {
  local runs=$(( trials < 3 ? trials : 3 )) ok=0 n=0 worst="-"
  local iters=40
  local args=("${small[@]}" --train-iters "$iters" --save-interval 5 --distributed-timeout-minutes 1)
  rm -rf "$logs/restart.ref" && mkdir -p "$logs/restart.ref"
  torchrun --nproc-per-node 2 --no-python --standalone "$trainer" "${args[@]}" --save "$logs/restart.ref/ck" \
    --log-jsonl "$logs/restart.ref/log.jsonl" >"$logs/restart.ref/out" 2>&1
  for ((t = 0; t < runs; t++)); do
    local dir="$logs/restart.$t" iteration=$((RANDOM % 30 + 6))
    rm -rf "$dir" && mkdir -p "$dir"
    STRATA_FAULT_INJECT="kill@1:$iteration" torchrun --nproc-per-node 2 --no-python --standalone --max-restarts 1 \
      "$trainer" "${args[@]}" --save "$dir/ck" --load "$dir/ck" --log-jsonl "$dir/log.jsonl" >"$dir/out" 2>&1
    local status=$?
    n=$((n + 1))
    # the last logged loss of every iteration, as 17-digit text, against the reference
    local same
    same=$(python3 - "$logs/restart.ref/log.jsonl" "$dir/log.jsonl" <<'PY'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "loss" in r:
            out[r["iteration"]] = r["loss"]
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
keys = sorted(a)
print("yes" if keys and keys == sorted(b) and all(a[k] == b[k] for k in keys) else
      "no: %d vs %d iterations, max diff %g" % (len(a), len(b), max([abs(a[k] - b.get(k, float("nan"))) for k in keys] or [0])))
PY
)
    echo "restart: kill at $iteration, torchrun exit $status, same losses: $same" >>"$logs/trials.txt"
    if [[ $status -eq 0 && $same == yes ]]; then ok=$((ok + 1)); fi
  done
  record "restart" "$n" "$ok/$n" "$worst" "(same losses)"
}

: >"$logs/trials.txt"
for c in $cases; do
  case $c in
    kill) run_process_case kill kill 0 ;;
    exit) run_process_case exit exit 0 ;;
    stop) run_process_case stop stop 0 ;;
    sleep) run_process_case sleep sleep 0 ;;
    kill-save) run_process_case kill-save kill 1 ;;
    sleep-save) run_process_case sleep-save sleep 1 ;;
    threads-throw) run_threads_case threads-throw throw ;;
    threads-sleep) run_threads_case threads-sleep sleep ;;
    restart) run_restart_case ;;
    *) echo "unknown case $c" >&2; exit 2 ;;
  esac
done

echo
echo "fault injection on 2 GPUs (timeout ${timeout_minutes} min, bound = timeout + 10 s = ${bound} s)"
printf '%-16s %6s %12s %14s %14s\n' case trials "ended in time" "worst to end" "message seen"
for line in "${table[@]}"; do echo "$line"; done
