#!/usr/bin/env bash
# tests/gpu/gpu_env.sh, sourced by the GPU scripts: the libraries of a GPU machine on
# LD_LIBRARY_PATH (CUDA's lib64, and cuDNN / NCCL / cuBLAS / the CUDA runtime from a Python
# environment's nvidia-* packages when the system has none; only folders that exist) and
# NCCL_NVLS_ENABLE=0 unless set.
strata_gpu_libs=()
for strata_dir in ${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64; do [[ -d $strata_dir ]] && strata_gpu_libs+=("$strata_dir"); done
for strata_py in python3 python; do
  command -v "$strata_py" >/dev/null || continue
  for strata_module in nvidia.cudnn nvidia.nccl nvidia.cublas nvidia.cuda_runtime; do
    strata_dir=$("$strata_py" -c "import $strata_module as m; print(list(m.__path__)[0])" 2>/dev/null) &&
      [[ -d $strata_dir/lib ]] && strata_gpu_libs+=("$strata_dir/lib")
  done
  break
done
LD_LIBRARY_PATH=$(IFS=:; echo "${strata_gpu_libs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
unset strata_gpu_libs strata_dir strata_py strata_module
