// strata::cuda_kernels: layer and RMS norms, activations, and the cross-entropy pieces.
#include "instantiate.hpp"

#include "../kernels/activation.cuh"
#include "../kernels/cross_entropy.cuh"
#include "../kernels/norm.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

#define STRATA_INSTANCE(T)                                                                                           \
  template void layernorm_forward<T, accumulate_t<T>>(const T*, const T*, const T*, index_t, index_t, accumulate_t<T>, \
                                                      T*, accumulate_t<T>*, accumulate_t<T>*, const T*, T*,          \
                                                      cudaStream_t, accumulate_t<T>, Fp8Output);                    \
  template void layernorm_backward<T, accumulate_t<T>>(                                                             \
      const T*, const T*, const T*, const accumulate_t<T>*, const accumulate_t<T>*, index_t, index_t, T*,           \
      accumulate_t<T>*, accumulate_t<T>*, const T*, accumulate_t<T>*, bool, cudaStream_t, accumulate_t<T>*,         \
      accumulate_t<T>);                                                                                             \
  template void rmsnorm_forward<T, accumulate_t<T>>(const T*, const T*, index_t, index_t, accumulate_t<T>, T*,       \
                                                    accumulate_t<T>*, const T*, T*, cudaStream_t, accumulate_t<T>,  \
                                                    Fp8Output);                                                     \
  template void rmsnorm_backward<T, accumulate_t<T>>(const T*, const T*, const T*, const accumulate_t<T>*, index_t,  \
                                                     index_t, T*, accumulate_t<T>*, const T*, accumulate_t<T>*, bool, \
                                                     cudaStream_t, accumulate_t<T>);                                \
  template void gelu_forward<T>(const T*, index_t, T*, cudaStream_t);                                               \
  template void gelu_backward<T>(const T*, const T*, index_t, T*, cudaStream_t);                                    \
  template void swiglu_forward<T>(const T*, index_t, index_t, T*, cudaStream_t);                                    \
  template void swiglu_backward<T>(const T*, const T*, index_t, index_t, T*, cudaStream_t);                         \
  template void glu_forward<T>(const T*, index_t, index_t, GluActivation, T*, cudaStream_t);                        \
  template void glu_backward<T>(const T*, const T*, index_t, index_t, GluActivation, T*, cudaStream_t);             \
  template void squared_relu_forward<T>(const T*, index_t, T*, cudaStream_t);                                       \
  template void squared_relu_backward<T>(const T*, const T*, index_t, T*, cudaStream_t);                            \
  template void sigmoid_gate_forward<T>(const T*, const T*, index_t, index_t, T*, cudaStream_t);                    \
  template void sigmoid_gate_backward<T>(const T*, const T*, const T*, index_t, index_t, T*, T*, cudaStream_t);     \
  template void cross_entropy_max<T, accumulate_t<T>>(const T*, index_t, index_t, index_t, accumulate_t<T>*,        \
                                                      cudaStream_t);                                                \
  template void cross_entropy_sums<T, accumulate_t<T>>(const T*, index_t, index_t, index_t, const accumulate_t<T>*,  \
                                                       const std::int32_t*, index_t, accumulate_t<T>*, cudaStream_t); \
  template void cross_entropy_backward<T, accumulate_t<T>>(const T*, const accumulate_t<T>*, const std::int32_t*,   \
                                                           index_t, index_t, index_t, index_t, index_t, accumulate_t<T>, \
                                                           const accumulate_t<T>*, T*, cudaStream_t);               \
  template void cross_entropy_forward_backward<T, accumulate_t<T>>(T*, const std::int32_t*, index_t, index_t, index_t, \
                                                                   index_t, accumulate_t<T>, const accumulate_t<T>*, \
                                                                   accumulate_t<T>*, cudaStream_t, int);
STRATA_CUDA_FOR_EACH_ELEMENT(STRATA_INSTANCE)
#undef STRATA_INSTANCE

#define STRATA_INSTANCE(A)                                                                                   \
  template void cross_entropy_loss<A>(const A*, const A*, index_t, index_t, A, A*, A*, cudaStream_t);      \
  template void masked_loss_sum<A>(const A*, const A*, index_t, double*, cudaStream_t);
STRATA_CUDA_FOR_EACH_ACCUMULATE(STRATA_INSTANCE)
#undef STRATA_INSTANCE

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
