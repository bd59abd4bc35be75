// strata::cuda_kernels: attention in bf16 (cuDNN SDPA when built with STRATA_WITH_CUDNN, else the
// flash kernels) and attention_plans' members. fp16: attention_fp16.cu; float and double:
// attention_float.cu. Each parses the cuDNN frontend once, so the three compile side by side.
#include "instantiate.hpp"

#include "../attention_impl.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda {
STRATA_CUDA_ATTENTION_INSTANCES(::strata::bf16)
}  // namespace cuda
STRATA_NAMESPACE_END
