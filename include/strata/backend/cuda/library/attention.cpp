// strata::cuda_kernels: attention's entry points (cuDNN SDPA for bf16 and fp16 when built with
// STRATA_WITH_CUDNN, else the flash kernels) and attention_plans, for float, double, bf16 and fp16.
// Plain C++ for the host compiler: the flash kernels it calls are compiled in flash_attention.cu, so
// nvcc never parses the cuDNN frontend (its device pass took as long as the host compile).
#include "instantiate.hpp"

#include "../attention_impl.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda {
STRATA_CUDA_FOR_EACH_ELEMENT(STRATA_CUDA_ATTENTION_INSTANCES)
}  // namespace cuda
STRATA_NAMESPACE_END
