#!/usr/bin/env bash
# tests/gpu/run_on_gpu_machine.sh <build-dir> [log-dir]: everything a GPU machine checks, in one
# call. Build first with the GPU tests and the CUDA trainers (README, third command):
#   1. the whole GPU suite (tests/gpu/run_gpu_suite.sh): kernels, GEMM, allocator, attention, NCCL
#      (threads and processes), models against the CPU path, multi-GPU training (threads and
#      processes), and the sanitizer runs;
#   2. the demo GPT trained on one GPU (build/examples/train_gpt --device cuda) for
#      STRATA_DEMO_ITERS iterations (default 300), as the README's GPU command does.
# Logs go to <log-dir> (default <build-dir>/gpu-logs); a short table comes last. Libraries: CUDA's
# lib64, and cuDNN / NCCL from a Python environment's nvidia-* packages when the system has none
# (LD_LIBRARY_PATH is extended only with folders that exist). NCCL_NVLS_ENABLE=0 unless set.
# The corpus: STRATA_DATA_PATH, else examples/data/corpus_text_document of this checkout.
# STRATA_GPU_BUDGET=<seconds> bounds the whole call: the suite skips what would run past it less
# STRATA_DEMO_RESERVE seconds (default 60) kept for the demo (STRATA_DEMO_TIMEOUT, default 300).
# Exits non-zero when any step failed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: run_on_gpu_machine.sh <build-dir> [log-dir]}" && pwd)
logs=${2:-$build/gpu-logs}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
source "$here/gpu_env.sh"  # LD_LIBRARY_PATH, NCCL_NVLS_ENABLE=0
export STRATA_DATA_PATH=${STRATA_DATA_PATH:-$repo/examples/data/corpus_text_document}
iters=${STRATA_DEMO_ITERS:-300}
{
  nvidia-smi -L
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "STRATA_DATA_PATH=$STRATA_DATA_PATH"
  for program in "$build"/tests/gpu/test_* "$build"/examples/train_gpt; do
    [[ -x $program && -f $program ]] && ldd "$program" | grep -E 'not found|cudnn|nccl|cublas|cudart' | sed "s|^|$(basename "$program"): |"
  done
} >"$logs/environment.log" 2>&1

status=0
start=$(date +%s)
demo_timeout=${STRATA_DEMO_TIMEOUT:-300}
if [[ -n ${STRATA_GPU_BUDGET:-} ]]; then  # seconds for everything: the suite stops in time for the demo
  export STRATA_GPU_SUITE_DEADLINE=$(( start + STRATA_GPU_BUDGET - ${STRATA_DEMO_RESERVE:-60} ))
fi
bash "$here/run_gpu_suite.sh" "$build" "$logs" >"$logs/suite.log" 2>&1 || status=1
if [[ -n ${STRATA_GPU_BUDGET:-} ]]; then
  left=$(( start + STRATA_GPU_BUDGET - $(date +%s) - 5 ))
  (( left < demo_timeout )) && demo_timeout=$(( left > 1 ? left : 1 ))
fi
suite_s=$(( $(date +%s) - start ))

demo_line="train_gpt not built ($build/examples/train_gpt)"
if [[ -x $build/examples/train_gpt ]]; then
  start=$(date +%s)
  timeout "$demo_timeout" "$build/examples/train_gpt" --device cuda --world-size 1 --tensor-model-parallel-size 1 --train-iters "$iters" \
    --hidden-dropout 0 --attention-dropout 0 --lr-decay-style cosine --lr-warmup-iters 10 --min-lr 2e-4 --weight-decay 0.1 \
    --adam-beta2 0.95 --log-interval 10 --eval-interval 100 --eval-iters 5 --global-batch-size 8 \
    --data-path "$STRATA_DATA_PATH" --log-jsonl "$logs/train_gpt.jsonl" >"$logs/train_gpt.log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && status=1
  done_line=$(grep -E '^done:' "$logs/train_gpt.log" | tail -n1)
  peak=$(grep -E '^peak device memory' "$logs/train_gpt.log" | tail -n1 | sed 's/.*: //')
  speed=$(grep -E '^iteration' "$logs/train_gpt.log" | tail -n1 | grep -oE '[0-9]+ tokens/s')
  demo_line=$(printf 'train_gpt --device cuda        rc=%-3d %4ds  %s | %s | peak %s' "$rc" "$(( $(date +%s) - start ))" \
    "${done_line:-$(tail -n1 "$logs/train_gpt.log")}" "${speed:-?}" "${peak:-?}")
fi

echo "==== failures"
grep -h '^FAIL' "$logs"/*.log 2>/dev/null | head -30
echo "==== summary (logs in $logs; suite ${suite_s}s)"
grep -vE '^(PASS|FAIL) ' "$logs/suite.log" | tail -n 20
echo "$demo_line"
exit $status
