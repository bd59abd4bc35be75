#!/usr/bin/env bash
# tests/gpu/run_architecture_checks.sh <gpu-build-dir> [hf_crosscheck]: the GPU side of the
# architecture options (qkv bias, qk norms, 1p norms, kv-channels, rotary variants, squared ReLU,
# quick GeGLU) in one call, on a machine with a GPU (and, for the last step, PyTorch and transformers):
#   1. test_architecture_kernels: glu / squared ReLU / rope variants / norms with a weight offset
#      against their CPU twins;
#   2. test_kernels --quiet: every other kernel (the rope and norm kernels changed signature);
#   3. test_models: GPT and Llama on the GPU against the CPU path, with the Qwen2, Qwen3, Llama 3.1 /
#      gpt-oss MLP and GPT squared-ReLU / 1p cases;
#   4. with an hf_crosscheck program (a CPU build with the tests: cmake --build build --target
#      hf_crosscheck), tests/hf/check_transformers.py against transformers (GPT-2, Llama, Llama 3.1
#      scaling, Qwen2, Qwen3, both directions); skipped with a line when python3 lacks torch or
#      transformers.
# Build the GPU programs as .ci/run does (sm_90):
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF \
#     -DSTRATA_BUILD_EXAMPLES=ON -DSTRATA_BUILD_GPU_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90
#   cmake --build build-gpu --target test_architecture_kernels test_kernels test_models -j
# Exits non-zero when any step failed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: run_architecture_checks.sh <gpu-build-dir> [hf_crosscheck]}" && pwd)
crosscheck=${2:-}
source "$here/gpu_env.sh"
status=0
step() {
  local name=$1; shift
  echo "==== $name"
  if "$@"; then echo "==== $name: ok"; else echo "==== $name: FAILED (exit $?)"; status=1; fi
}
step test_architecture_kernels "$build/tests/gpu/test_architecture_kernels" --quiet
step test_kernels "$build/tests/gpu/test_kernels" --quiet
step test_models "$build/tests/gpu/test_models"
if [[ -n $crosscheck ]]; then
  if python3 -c 'import numpy, torch, transformers' 2>/dev/null; then
    step check_transformers python3 "$repo/tests/hf/check_transformers.py" --binary "$crosscheck"
  else
    echo "==== check_transformers: skipped (python3 has no numpy, torch or transformers)"
  fi
fi
exit $status
