// strata::cuda_kernels: attention in float and double, which always runs on the flash kernels; built
// apart from the bf16 and fp16 sources so that it does not parse the cuDNN frontend; attention_plans'
// members are defined in attention_bf16.cu.
#include "instantiate.hpp"

#undef STRATA_WITH_CUDNN
#define STRATA_CUDA_ATTENTION_TEMPLATES_ONLY 1
#include "../attention_impl.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda {
STRATA_CUDA_ATTENTION_INSTANCES(float)
STRATA_CUDA_ATTENTION_INSTANCES(double)
}  // namespace cuda
STRATA_NAMESPACE_END
