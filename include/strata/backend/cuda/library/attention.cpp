// strata::cuda_kernels: attention's entry points (cuDNN SDPA for bf16 and fp16 when built with
// STRATA_WITH_CUDNN, else the flash kernels) and attention_plans, for float, double, bf16 and fp16.
// Plain C++ for the host compiler: the flash kernels it calls are compiled in flash_attention.cu, so
// nvcc never parses the cuDNN frontend (its device pass took as long as the host compile).
#include "instantiate.hpp"

#include "../attention_impl.cuh"

// The attention entry points (backend/cuda/attention.hpp) for element type T.
#define STRATA_CUDA_ATTENTION_INSTANCES(T)                                                                      \
  template void prepare_attention<T>(attention_plans&, index_t, index_t, index_t, index_t, index_t, bool,        \
                                     AttentionOptions);                                                           \
  template void attention_forward<T>(attention_plans&, cudaStream_t, const T*, const T*, const T*, index_t,      \
                                     index_t, index_t, index_t, index_t, accumulate_t<T>, T*, accumulate_t<T>*,  \
                                     AttentionOptions);                                                           \
  template void attention_backward<T>(attention_plans&, cudaStream_t, const T*, const T*, const T*, const T*,    \
                                      const T*, const accumulate_t<T>*, index_t, index_t, index_t, index_t,      \
                                      index_t, accumulate_t<T>, T*, T*, T*, AttentionOptions);

STRATA_NAMESPACE_BEGIN
namespace cuda {
STRATA_CUDA_FOR_EACH_ELEMENT(STRATA_CUDA_ATTENTION_INSTANCES)
}  // namespace cuda
STRATA_NAMESPACE_END
