#!/usr/bin/env bash
# tests/gpu/run_fp8.sh [gpu-build-dir] [bench-build-dir]: FP8 on one Hopper GPU, in one command.
#
#   1. The FP8 GPU tests (built in <gpu-build-dir>, default build-gpu, configured as .ci/run does with
#      -DSTRATA_BUILD_GPU_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90; targets test_fp8 test_fp8_layers):
#      test_fp8 (each kernel against its CPU twin bit for bit, the conversion against the hardware's
#      cvt on every float, the cuBLASLt FP8 GEMM within the accumulation bound) and test_fp8_layers
#      (the FP8 linear layers on the GPU against the emulated CPU run).
#   2. Resume on the GPU (needs <bench-build-dir>/examples/train_gpt with CUDA): a small GPT in bf16
#      with FP8 delayed scaling (history 16, max) trains 20 iterations straight, then again stopped
#      by --exit-interval 10 (saving the checkpoint, with the scaling states) and resumed with --load
#      to 20; the two runs' losses must be the same bits at every iteration (the amax histories and
#      scales come back from the checkpoint). Then the FP8 parameter gather: the same run with the
#      distributed optimizer and no clipping, with and without --fp8-param-gather (the optimizer casts
#      the updated weights, the layers read those codes), must log the same loss bits at every
#      iteration. Then fc2's input codes made in fc1's backward cast (--fp8-activation-codes-in-backward):
#      the small GPT (GELU) and, where <bench-build-dir>/examples/train_llama exists, a small Llama
#      (SwiGLU) with and without the flag must log the same loss bits at every iteration (the peaks are
#      printed). STRATA_FP8_RESUME=0 skips the three.
#   3. GPT 1.41B (24 layers, hidden 2048, 16 heads, batch 8, seq 1024): bench/gpu_bench.sh in bf16,
#      then with STRATA_BENCH_DTYPE=fp8 (strata --fp8-format hybrid --fp8-recipe tensorwise beside
#      the peer's --float8 tensorwise); STRATA_FP8_BENCH=0 skips this part, STRATA_BENCH_FP8_RECIPE
#      picks strata's recipe (tensorwise | delayed).
# Prints the tests' summaries and the two tables; exits non-zero when a test failed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
gpu_build=${1:-$repo/build-gpu}
bench_build=${2:-$repo/build-bench}
status=0
for test in test_fp8 test_fp8_layers; do
  program=$gpu_build/tests/gpu/$test
  if [[ ! -x $program ]]; then
    echo "missing $program: cmake --build $gpu_build --target test_fp8 test_fp8_layers"
    status=1
    continue
  fi
  echo "== $test"
  "$program" || status=1
done
# same_losses <a.jsonl> <b.jsonl>: "yes" when both logged the same 20 iterations with the same loss bits.
same_losses() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def losses(path):
    out = {}
    try:
        for line in open(path):
            r = json.loads(line)
            if "loss" in r:
                out[r["iteration"]] = r["loss"]
    except OSError:
        pass
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
keys = sorted(a)
print("yes" if len(keys) == 20 and keys == sorted(b) and all(a[k] == b[k] for k in keys) else
      "no: %d and %d iterations logged" % (len(a), len(b)))
PY
}
if [[ ${STRATA_FP8_RESUME:-1} != 0 ]]; then
  echo "== FP8 resume on the GPU"
  trainer=$bench_build/examples/train_gpt
  dir=$bench_build/fp8-resume
  rm -rf "$dir" && mkdir -p "$dir"
  small=(--device cuda --mock-data-random --num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 256
         --vocab-size 4096 --micro-batch-size 4 --global-batch-size 8 --train-iters 20 --log-interval 1 --eval-iters 0
         --sample-tokens 0 --lr 6e-4 --lr-warmup-iters 2 --seed 1234 --dtype bf16 --hidden-dropout 0 --attention-dropout 0
         --fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 16 --fp8-amax-compute-algo max)
  if [[ ! -x $trainer ]]; then
    echo "missing $trainer: build train_gpt with CUDA in $bench_build"
    status=1
  else
    "$trainer" "${small[@]}" --log-jsonl "$dir/straight.jsonl" >"$dir/straight.log" 2>&1 &&
      "$trainer" "${small[@]}" --save "$dir/ck" --exit-interval 10 --log-jsonl "$dir/resumed.jsonl" >"$dir/first.log" 2>&1 &&
      "$trainer" "${small[@]}" --save "$dir/ck" --load "$dir/ck" --log-jsonl "$dir/resumed.jsonl" >"$dir/second.log" 2>&1
    trained=$?
    same=$(same_losses "$dir/straight.jsonl" "$dir/resumed.jsonl")
    echo "FP8 resume: runs exit $trained, the same losses at every iteration: $same (logs: $dir)"
    [[ $trained -eq 0 && $same == yes ]] || status=1
    echo "== FP8 parameter gather on the GPU"
    sharded=("${small[@]}" --use-distributed-optimizer --clip-grad 0)
    "$trainer" "${sharded[@]}" --log-jsonl "$dir/values.jsonl" >"$dir/values.log" 2>&1 &&
      "$trainer" "${sharded[@]}" --fp8-param-gather --log-jsonl "$dir/codes.jsonl" >"$dir/codes.log" 2>&1
    trained=$?
    same=$(same_losses "$dir/values.jsonl" "$dir/codes.jsonl")
    echo "FP8 parameter gather: runs exit $trained, the same losses at every iteration: $same (logs: $dir)"
    [[ $trained -eq 0 && $same == yes ]] || status=1
    echo "== FP8 activation codes made in the backward on the GPU"
    for model in gpt llama; do
      program=$bench_build/examples/train_$model
      [[ -x $program ]] || { echo "($model: $program not built, skipped)"; continue; }
      args=("${small[@]}")
      [[ $model == llama ]] && args+=(--group-query-attention --num-query-groups 4 --ffn-hidden-size 1408)
      "$program" "${args[@]}" --log-jsonl "$dir/$model-kept.jsonl" >"$dir/$model-kept.log" 2>&1 &&
        "$program" "${args[@]}" --fp8-activation-codes-in-backward --log-jsonl "$dir/$model-later.jsonl" \
          >"$dir/$model-later.log" 2>&1
      trained=$?
      same=$(same_losses "$dir/$model-kept.jsonl" "$dir/$model-later.jsonl")
      peaks=$(for f in kept later; do grep -E '^peak device memory' "$dir/$model-$f.log" | tail -n1 | sed 's/.*: //'; done | tr '\n' ' ')
      echo "FP8 activation codes in the backward, $model: runs exit $trained, the same losses at every iteration: $same (peaks kept / later: $peaks; logs: $dir)"
      [[ $trained -eq 0 && $same == yes ]] || status=1
    done
  fi
fi
if [[ ${STRATA_FP8_BENCH:-1} != 0 ]]; then
  for dtype in bf16 fp8; do
    echo "== GPT 1.41B, STRATA_BENCH_DTYPE=$dtype"
    STRATA_BENCH_SHAPES=1.4B STRATA_BENCH_DTYPE=$dtype bash "$repo/bench/gpu_bench.sh" "$bench_build" \
      "$bench_build/bench-logs-$dtype" | tail -n 6
  done
fi
exit $status
