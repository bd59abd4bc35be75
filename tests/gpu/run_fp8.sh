#!/usr/bin/env bash
# tests/gpu/run_fp8.sh [gpu-build-dir] [bench-build-dir]: FP8 on one Hopper GPU, in one command.
#
#   1. The FP8 GPU tests (built in <gpu-build-dir>, default build-gpu, configured as .ci/run does with
#      -DSTRATA_BUILD_GPU_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90; targets test_fp8 test_fp8_layers):
#      test_fp8 (each kernel against its CPU twin bit for bit, the conversion against the hardware's
#      cvt on every float, the cuBLASLt FP8 GEMM within the accumulation bound) and test_fp8_layers
#      (the FP8 linear layers on the GPU against the emulated CPU run).
#   2. GPT 1.41B (24 layers, hidden 2048, 16 heads, batch 8, seq 1024): bench/gpu_bench.sh in bf16,
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
if [[ ${STRATA_FP8_BENCH:-1} != 0 ]]; then
  for dtype in bf16 fp8; do
    echo "== GPT 1.41B, STRATA_BENCH_DTYPE=$dtype"
    STRATA_BENCH_SHAPES=1.4B STRATA_BENCH_DTYPE=$dtype bash "$repo/bench/gpu_bench.sh" "$bench_build" \
      "$bench_build/bench-logs-$dtype" | tail -n 6
  done
fi
exit $status
