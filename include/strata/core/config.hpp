// strata/core/config.hpp: version numbers and the versioned namespace.
//
// Every public name lives in `strata::v0` through an inline namespace, so two copies of strata
// built from different versions never collide in one program (the CCCL habit), while users keep
// writing `strata::Tensor`.
#pragma once

#define STRATA_VERSION_MAJOR 0
#define STRATA_VERSION_MINOR 1
#define STRATA_VERSION_PATCH 0

#define STRATA_NAMESPACE_BEGIN \
  namespace strata {           \
  inline namespace v0 {
#define STRATA_NAMESPACE_END \
  }                          \
  }

// STRATA_HOST_DEVICE marks functions that kernels call too (index arithmetic, RNG, bf16 / fp16
// conversions); empty outside nvcc.
#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif
