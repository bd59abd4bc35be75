// strata::cuda_kernels: fill, convert, add, scale, transpose, the multi-tensor operations, the
// optimizer, columns, bias, RoPE, embeddings, randomness and the pointer table.
#include "instantiate.hpp"

#include "../../backend.hpp"  // GlobalIndexMap, ShardIndexMap
#include "../kernels/bias.cuh"
#include "../kernels/columns.cuh"
#include "../kernels/elementwise.cuh"
#include "../kernels/embedding.cuh"
#include "../kernels/multi_tensor.cuh"
#include "../kernels/optimizer.cuh"
#include "../kernels/pointer_table.cuh"
#include "../kernels/random.cuh"
#include "../kernels/rope.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

#define STRATA_CONVERT_TO(From, To) template void convert<From, To>(const From*, index_t, To*, cudaStream_t);
#define STRATA_CONVERT_FROM(From)                                                                  \
  STRATA_CONVERT_TO(From, float) STRATA_CONVERT_TO(From, double) STRATA_CONVERT_TO(From, ::strata::bf16) \
  STRATA_CONVERT_TO(From, ::strata::fp16)
STRATA_CUDA_FOR_EACH_ELEMENT(STRATA_CONVERT_FROM)
#undef STRATA_CONVERT_FROM
#undef STRATA_CONVERT_TO

#define STRATA_INSTANCE(T)                                                                                       \
  template void fill<T>(T*, index_t, double, cudaStream_t);                                                     \
  template void add<T>(const T*, const T*, index_t, T*, cudaStream_t);                                          \
  template void scale<T>(T*, index_t, double, cudaStream_t);                                                    \
  template void scale_by<T>(T*, index_t, const double*, cudaStream_t);                                          \
  template void transpose<T>(const T*, index_t, index_t, T*, cudaStream_t);                                     \
  template std::size_t sum_of_squares_many_workspace<T>(const TensorRef<const T>*, std::size_t);                \
  template void sum_of_squares_many<T>(const TensorRef<const T>*, std::size_t, double*, double*, cudaStream_t); \
  template void scale_by_many<T>(const TensorRef<T>*, std::size_t, const double*, cudaStream_t);                \
  template void fill_many<T>(const TensorRef<T>*, std::size_t, double, cudaStream_t);                           \
  template void sum_of_squares<T>(const T*, index_t, double*, double*, cudaStream_t);                           \
  template void adamw_step<T, AdamWStep<accumulate_t<T>>, accumulate_t<T>>(                                    \
      accumulate_t<T>*, accumulate_t<T>*, accumulate_t<T>*, const accumulate_t<T>*, T*, index_t,                \
      const AdamWStep<accumulate_t<T>>&, cudaStream_t);                                                         \
  template void adamw_step_many<T, AdamWStep<accumulate_t<T>>, accumulate_t<T>>(                               \
      const adamw_tensor<T, accumulate_t<T>>*, std::size_t, const AdamWStep<accumulate_t<T>>&, cudaStream_t);   \
  template void slice_columns<T>(const T*, index_t, index_t, index_t, index_t, T*, cudaStream_t);               \
  template void copy_columns<T>(const T*, index_t, index_t, index_t, T*, index_t, cudaStream_t);               \
  template void unstack_columns<T>(const T*, index_t, index_t, index_t, T*, cudaStream_t);                      \
  template void qkv_split<T>(const T*, index_t, index_t, index_t, index_t, T*, T*, T*, cudaStream_t);           \
  template void qkv_merge<T>(const T*, const T*, const T*, index_t, index_t, index_t, index_t, T*, cudaStream_t); \
  template void bias_add<T>(T*, const T*, index_t, index_t, cudaStream_t);                                      \
  template void bias_grad<T, accumulate_t<T>>(const T*, index_t, index_t, accumulate_t<T>*, accumulate_t<T>*,   \
                                              cudaStream_t, unsigned*, index_t);                                \
  template void dropout<T, GlobalIndexMap>(T*, index_t, GlobalIndexMap, double, std::uint64_t, cudaStream_t);   \
  template void init_normal<T, ShardIndexMap>(T*, index_t, ShardIndexMap, std::uint64_t, double, cudaStream_t); \
  template void init_normal<T, GlobalIndexMap>(T*, index_t, GlobalIndexMap, std::uint64_t, double, cudaStream_t); \
  template void rope<T>(T*, index_t, index_t, index_t, double, index_t, bool, cudaStream_t, RopeOptions);       \
  template void qkv_rope<T>(T*, T*, T*, T*, index_t, index_t, index_t, index_t, index_t, double, index_t, bool,  \
                            cudaStream_t, RopeOptions, Fp8Output);                                            \
  template void embedding_forward<T>(const std::int32_t*, index_t, const T*, index_t, index_t, index_t, T*,    \
                                     cudaStream_t);                                                             \
  template void embedding_backward<T, accumulate_t<T>>(const std::int32_t*, index_t, const T*, index_t, index_t, \
                                                       index_t, accumulate_t<T>*, void*, std::size_t, cudaStream_t); \
  template void position_add<T>(T*, const T*, index_t, index_t, index_t, index_t, cudaStream_t);                \
  template void position_grad<T, accumulate_t<T>>(const T*, index_t, index_t, index_t, index_t, accumulate_t<T>*, \
                                                  cudaStream_t);
STRATA_CUDA_FOR_EACH_ELEMENT(STRATA_INSTANCE)
#undef STRATA_INSTANCE

template void store_pointers<void*>(void* const*, std::size_t, void**, cudaStream_t);
template void transpose<std::int32_t>(const std::int32_t*, index_t, index_t, std::int32_t*, cudaStream_t);  // tokens
template void fill<std::int32_t>(std::int32_t*, index_t, double, cudaStream_t);  // the MoE counts when padding
// the FP8 experts' groups of transposed codes (layers/moe/experts.hpp)
template void copy_columns<std::uint8_t>(const std::uint8_t*, index_t, index_t, index_t, std::uint8_t*, index_t, cudaStream_t);

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
