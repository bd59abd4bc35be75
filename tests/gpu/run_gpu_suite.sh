#!/usr/bin/env bash
# tests/gpu/run_gpu_suite.sh <build-dir> [log-dir]: runs every GPU test program built under
# <build-dir>/tests/gpu (test_*), each with its full output in <log-dir>/<name>.log (default
# <build-dir>/gpu-logs), then the kernel and GEMM tests again at small sizes under
# compute-sanitizer's memcheck and racecheck (racecheck on strata's own kernels: cuDNN's generated
# attention kernels are not ours to check; when compute-sanitizer is found), and prints one
# summary line per suite. A new suite is picked up by its name (test_*.cu). With 2+ GPUs test_training
# runs with --threads (tp=2 with and without SP, dp=2 from threads of one process). test_training (and its
# 2-process twin) reads the corpus at STRATA_DATA_PATH when set (a .bin/.idx prefix). Each run is stopped after
# STRATA_GPU_SUITE_TIMEOUT seconds (default 300; rc 124 = timed out), and none runs past
# STRATA_GPU_SUITE_DEADLINE (seconds since the epoch) when set: later ones are reported skipped.
# Exits non-zero if any failed or was skipped; on one GPU, test_nccl (2 GPUs or more) is listed as
# not run and does not count as a failure.
set -u
build=${1:?usage: run_gpu_suite.sh <build-dir> [log-dir]}
logs=${2:-$build/gpu-logs}
mkdir -p "$logs"
limit=${STRATA_GPU_SUITE_TIMEOUT:-300}
status=0
summary=()

# run <name> <command...>: one suite, its log, its summary line.
run() {
  local name=$1
  shift
  local start rc line step_limit=$limit
  start=$(date +%s)
  if [[ -n ${STRATA_GPU_SUITE_DEADLINE:-} ]]; then  # an overall end time (seconds since the epoch)
    local left=$(( STRATA_GPU_SUITE_DEADLINE - start ))
    if (( left < 10 )); then
      status=1
      summary+=("$(printf '%-28s skipped: STRATA_GPU_SUITE_DEADLINE reached' "$name")")
      return
    fi
    (( left < step_limit )) && step_limit=$left
  fi
  timeout "$step_limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  line=$(grep -E '^(SUMMARY|SUITE)' "$logs/$name.log" | tail -n 1)
  if [[ $rc -ne 0 ]]; then
    status=1
    [[ -z $line ]] && line=$(grep -E 'ERROR SUMMARY|error' "$logs/$name.log" | tail -n 1)
  fi
  summary+=("$(printf '%-28s rc=%-3d %4ds  %s' "$name" "$rc" "$(( $(date +%s) - start ))" "${line:-no summary line}")")
}

dir="$build/tests/gpu"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
for program in "$dir"/test_*; do
  [[ -x $program && -f $program ]] || continue
  name=$(basename "$program")
  if [[ $name == test_nccl && ${gpus:-0} -lt 2 ]]; then  # the communicator needs 2 GPUs: said, not failed
    summary+=("$(printf '%-28s not run: needs 2 GPUs, this machine has %s' "$name" "${gpus:-0}")")
  elif [[ $name == test_kernels ]]; then run "$name" "$program" --quiet
  elif [[ $name == test_training && $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') -ge 2 ]]; then run "$name" "$program" --threads
  else run "$name" "$program"; fi
done
[[ ${#summary[@]} -eq 0 ]] && { echo "no GPU test programs under $dir"; exit 1; }
# The NCCL suite again as a job of one process per GPU (torchrun-style variables), when 2+ GPUs.
if [[ -x $dir/test_nccl && ${gpus:-0} -ge 2 ]]; then
  run "test_nccl.processes" env STRATA_TEST_LOG_DIR="$logs" bash "$(dirname "$0")/run_nccl_processes.sh" "$dir/test_nccl" 2
fi
# The 2-GPU training again as 2 processes, against test_training's threads-mode losses.
if [[ -x $dir/test_training && ${gpus:-0} -ge 2 && -f $logs/test_training.log ]]; then
  run "test_training.processes" env STRATA_TEST_LOG_DIR="$logs" bash "$(dirname "$0")/run_training_processes.sh" \
    "$dir/test_training" "$logs/test_training.log"
fi
# Mixtral through train_mixtral: ep=2 on 2 GPUs against ep=1 (fp32), and its tokens/s beside the dense
# model of the same active parameters (run_moe_gpus.sh), when the trainers were built.
if [[ -x $build/examples/train_mixtral && -x $build/examples/train_llama ]]; then
  run "moe_gpus" bash "$(dirname "$0")/run_moe_gpus.sh" "$build" "$logs/moe"
fi
# The architecture presets of docs/MEGATRON.md through train_llama: fp32 on the GPU against CPU
# threads, and bf16 training (run_architecture_trainers.sh), when the trainers were built.
if [[ -x $build/examples/train_llama ]]; then
  run "architecture_trainers" bash "$(dirname "$0")/run_architecture_trainers.sh" "$build" "$logs/architecture"
fi

sanitizer=$(command -v compute-sanitizer || true)
for candidate in ${CUDA_HOME:+$CUDA_HOME/bin/compute-sanitizer} /usr/local/cuda/bin/compute-sanitizer; do
  [[ -z $sanitizer && -x $candidate ]] && sanitizer=$candidate
done
if [[ -n $sanitizer ]]; then
  if [[ -x $dir/test_kernels ]]; then
    run "test_kernels.memcheck" "$sanitizer" --tool memcheck --leak-check full --error-exitcode 3 "$dir/test_kernels" --small --quiet
    run "test_kernels.racecheck" "$sanitizer" --tool racecheck --racecheck-report all --kernel-name kns=strata --error-exitcode 3 "$dir/test_kernels" --small --quiet
  fi
  if [[ -x $dir/test_gemm ]]; then
    run "test_gemm.memcheck" "$sanitizer" --tool memcheck --error-exitcode 3 "$dir/test_gemm" --small
  fi
else
  summary+=("compute-sanitizer not found: memcheck and racecheck skipped")
fi
printf '%s\n' "${summary[@]}"
exit $status
