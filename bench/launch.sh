# bench/launch.sh: sourced by the benchmark scripts that start strata's trainers on several GPUs.
#
#   launch_ranks RUN N BINARY ARGS...
#     N = 1: BINARY ARGS --world-size 1. N > 1: N processes of BINARY ARGS, started as torchrun
#     starts them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a
#     MASTER_PORT drawn below the ephemeral range). With launch_threads=1 instead one process of N
#     threads (ARGS --world-size N), the CPU check of a script. Each process runs under
#     `timeout $run_timeout`; rank r's output goes to $out/RUN.rank<r>.log, which ends in "exit <code>",
#     and the command line to $out/RUN.cmd. Returns once every rank has ended.
#   launch_ranks_background: the same without waiting; the ranks' pids are in launch_pids and
#     launch_wait_all waits for them and appends their exit lines.
#
# The caller sets out and run_timeout.
launch_threads=${launch_threads:-0}
launch_pids=()
launch_run=""

launch_ranks_background() {
  local run=$1 n=$2 binary=$3
  shift 3
  launch_run=$run
  launch_pids=()
  rm -f "$out/$run".rank*.log
  if [[ $n == 1 || $launch_threads == 1 ]]; then
    echo "  $binary $* --world-size $n" >"$out/$run.cmd"
    timeout "$run_timeout" "$binary" "$@" --world-size "$n" >"$out/$run.rank0.log" 2>&1 &
    launch_pids=($!)
    return
  fi
  local port=$((20000 + RANDOM % 12000)) r
  echo "  RANK=r WORLD_SIZE=$n LOCAL_RANK=r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port $binary $*" >"$out/$run.cmd"
  for ((r = 0; r < n; ++r)); do
    env RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout "$run_timeout" "$binary" "$@" >"$out/$run.rank$r.log" 2>&1 &
    launch_pids+=($!)
  done
}

launch_wait_all() {
  local r
  for ((r = 0; r < ${#launch_pids[@]}; ++r)); do
    wait "${launch_pids[$r]}"
    echo "exit $?" >>"$out/$launch_run.rank$r.log"
  done
}

launch_ranks() {
  launch_ranks_background "$@"
  launch_wait_all
}
