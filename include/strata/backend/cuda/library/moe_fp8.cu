// strata::cuda_kernels: the MoE router and token movement, the FP8 casts, the merge of context
// parallelism's attention blocks, and attention sinks.
#include "instantiate.hpp"

#include "../kernels/attention_merge.cuh"
#include "../kernels/attention_sink.cuh"
#include "../kernels/fp8.cuh"
#include "../kernels/moe.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

#define STRATA_INSTANCE(T)                                                                                        \
  template void moe_gather_rows<T>(const T*, index_t, const std::int32_t*, index_t, T*, cudaStream_t);           \
  template void moe_combine<T, accumulate_t<T>>(const T*, const std::int32_t*, const accumulate_t<T>*, index_t,  \
                                                index_t, index_t, T*, cudaStream_t);                             \
  template void moe_combine_backward<T, accumulate_t<T>>(const T*, const T*, const std::int32_t*,                \
                                                         const accumulate_t<T>*, index_t, index_t, index_t, index_t, \
                                                         T*, accumulate_t<T>*, cudaStream_t);                    \
  template void fp8_amax<T>(const T*, index_t, float*, cudaStream_t);                                            \
  template void fp8_cast<T>(const T*, index_t, Fp8Format, const float*, std::uint8_t*, float*, cudaStream_t);    \
  template void fp8_cast_transpose<T>(const T*, index_t, index_t, Fp8Format, const float*, std::uint8_t*,        \
                                      std::uint8_t*, float*, cudaStream_t);                                      \
  template void fp8_cast_transpose_fused<T, accumulate_t<T>>(Fp8Producer, const T*, const T*, index_t, index_t,    \
                                                             Fp8Format, const float*, std::uint8_t*, std::uint8_t*, \
                                                             float*, accumulate_t<T>*, accumulate_t<T>*, Fp8Output, \
                                                             cudaStream_t);                                        \
  template void fp8_cast_blocks<T>(const T*, index_t, index_t, Fp8Format, index_t, std::uint8_t*, float*,       \
                                   std::uint8_t*, float*, cudaStream_t);                                         \
  template void fp8_cast_tiles<T>(const T*, index_t, index_t, Fp8Format, index_t, std::uint8_t*, std::uint8_t*, \
                                  float*, float*, cudaStream_t);                                                 \
  template void attention_merge<T, accumulate_t<T>>(T*, accumulate_t<T>*, const T*, const accumulate_t<T>*, index_t, \
                                                    index_t, index_t, index_t, cudaStream_t);                    \
  template void attention_sink_forward<T, accumulate_t<T>>(T*, accumulate_t<T>*, const T*, index_t, index_t,      \
                                                           index_t, index_t, cudaStream_t);                      \
  template void attention_sink_backward<T, accumulate_t<T>>(const T*, const T*, const accumulate_t<T>*, const T*, \
                                                            index_t, index_t, index_t, index_t, accumulate_t<T>*, \
                                                            cudaStream_t);
STRATA_CUDA_FOR_EACH_ELEMENT(STRATA_INSTANCE)
#undef STRATA_INSTANCE

#define STRATA_INSTANCE(A)                                                                                        \
  template void moe_router_forward<A>(const A*, index_t, index_t, index_t, MoeRouting, const A*, std::int32_t*,  \
                                      A*, A*, A*, cudaStream_t);                                                  \
  template void moe_router_backward<A>(const A*, index_t, index_t, index_t, MoeRouting, const std::int32_t*,     \
                                       const A*, const A*, index_t, double, double, A*, cudaStream_t);            \
  template void moe_drop<A>(const std::int32_t*, const A*, index_t, index_t, bool, std::int32_t*, cudaStream_t); \
  template void moe_count<A>(const std::int32_t*, index_t, index_t, index_t, index_t, A*, bool, cudaStream_t);   \
  template void moe_aux_loss<A>(const A*, const A*, index_t, double, double*, A*, cudaStream_t);                 \
  template void moe_expert_bias_update<A>(const A*, index_t, double, A*, cudaStream_t);
STRATA_CUDA_FOR_EACH_ACCUMULATE(STRATA_INSTANCE)
#undef STRATA_INSTANCE
template void fp8_decode_blocks<bf16>(const std::uint8_t*, index_t, index_t, Fp8Format, const float*, bool, index_t, bf16*,
                                      cudaStream_t);
template void moe_count<std::int32_t>(const std::int32_t*, index_t, index_t, index_t, index_t, std::int32_t*, bool,
                                      cudaStream_t);

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
