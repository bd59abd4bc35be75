// strata::cuda_kernels: the flash attention kernels (flash_attention.hpp) for float, double, bf16
// and fp16; attention.cpp dispatches to them.
#include "instantiate.hpp"

#include "../flash_attention.hpp"

STRATA_NAMESPACE_BEGIN
namespace cuda {

#define STRATA_INSTANCE(T)                                                                                       \
  template void flash_attention_forward<T>(cudaStream_t, const T*, const T*, const T*, index_t, index_t, index_t, \
                                           index_t, index_t, accumulate_t<T>, T*, accumulate_t<T>*,              \
                                           AttentionOptions);                                                    \
  template void flash_attention_backward<T>(cudaStream_t, const T*, const T*, const T*, const T*, const T*,      \
                                            const accumulate_t<T>*, index_t, index_t, index_t, index_t, index_t, \
                                            accumulate_t<T>, T*, T*, T*, accumulate_t<T>*, AttentionOptions);
STRATA_CUDA_FOR_EACH_ELEMENT(STRATA_INSTANCE)
#undef STRATA_INSTANCE

}  // namespace cuda
STRATA_NAMESPACE_END
