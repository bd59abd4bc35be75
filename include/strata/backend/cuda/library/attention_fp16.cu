// strata::cuda_kernels: attention in fp16 (cuDNN SDPA when built with STRATA_WITH_CUDNN, else the
// flash kernels); attention_plans' members are defined in attention_bf16.cu.
#include "instantiate.hpp"

#define STRATA_CUDA_ATTENTION_TEMPLATES_ONLY 1
#include "../attention_impl.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda {
STRATA_CUDA_ATTENTION_INSTANCES(::strata::fp16)
}  // namespace cuda
STRATA_NAMESPACE_END
