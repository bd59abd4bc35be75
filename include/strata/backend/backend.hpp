// strata/backend/backend.hpp: the compute `Backend` concept.
//
// A backend is a type with static kernel entry points (the duck-typed device object of Eigen's
// DefaultDevice/GpuDevice, made a concept). Layers call `typename Policy::backend::gemm(...)` and
// friends and never touch Eigen or CUDA directly. The CPU backend is the reference every other
// backend is tested against.
#pragma once

#include <string_view>

#include "../core/shape.hpp"

STRATA_NAMESPACE_BEGIN

template <class B>
concept Backend = requires(const float* cf, float* f, const double* cd, double* d, index_t n) {
  { B::name } -> std::convertible_to<std::string_view>;
  B::template gemm<float>(false, false, n, n, n, cf, cf, f, false);
  B::template gemm<double>(false, false, n, n, n, cd, cd, d, false);
  B::template gelu_forward<double>(cd, n, d);
  B::template layernorm_forward<double>(cd, cd, cd, n, n, 1e-5, d, d, d);
  B::template rmsnorm_forward<double>(cd, cd, n, n, 1e-5, d, d);
};

template <class B>
constexpr bool check_backend() {
  static_assert(Backend<B>,
                "The policy's backend does not model strata::Backend: it needs a static `name` and static "
                "template kernels gemm, gelu_forward, layernorm_forward, rmsnorm_forward, ... (see "
                "strata/backend/cpu/backend.hpp for the full list).");
  return true;
}

STRATA_NAMESPACE_END
