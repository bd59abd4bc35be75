// strata/backend/cuda/kernels/random.cuh: dropout and normal initialization from the counter-based
// generator of core/rng.hpp, at each element's global index.
//
//   dropout_forward   x[i] = rng::uniform(key, map(i)) >= p ? x[i] / (1 - p) : 0      (in place)
//   dropout_backward  the same mask on dy, recomputed from (key, map(i)) (nothing is stored)
//   init_normal       x[i] = T(stddev * rng::normal(key, map(i)))
//
// map(i) turns a local index into the element's index in the global (unsharded) tensor
// (GlobalIndexMap for activations, ShardIndexMap for parameters); any trivially copyable callable
// with a __host__ __device__ operator()(index_t) works. The values are a pure function of
// (key, global index), so the GPU draws the CPU twin's numbers bit for bit.
#pragma once

#include <type_traits>

#include "../../../core/rng.hpp"
#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

template <class T, class Map, class A = accumulate_t<T>>
__global__ void dropout_kernel(T* x, index_t n, Map map, double p, A keep_scale, std::uint64_t key) {
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x) {
    const bool kept = rng::uniform(key, static_cast<std::uint64_t>(map(i))) >= p;
    store(x, i, kept ? load(x, i) * keep_scale : A(0));
  }
}

// Forward and backward are the same operation (the mask and the scale are recomputed).
template <class T, class Map>
void dropout(T* x, index_t n, Map map, double p, std::uint64_t key, cudaStream_t stream) {
  static_assert(std::is_trivially_copyable_v<Map>, "A kernel argument must be trivially copyable: the index map is copied to the device.");
  if (n <= 0 || p <= 0.0) return;
  if (p >= 1.0) fail<ConfigError>("cuda::dropout: the drop probability ", p, " must be below 1");
  using A = accumulate_t<T>;
  dropout_kernel<T, Map, A><<<grid_for(n), kThreads, 0, stream>>>(x, n, map, p, static_cast<A>(1.0 / (1.0 - p)), key);
  check_launch("dropout");
}

template <class T, class Map>
__global__ void init_normal_kernel(T* x, index_t n, Map map, std::uint64_t key, double stddev) {
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x) {
    const double value = stddev * rng::normal(key, static_cast<std::uint64_t>(map(i)));
    if constexpr (std::is_same_v<T, double>) x[i] = value;
    else store(x, i, static_cast<float>(value));  // T(double) rounds through float, as bf16(double) does
  }
}
template <class T, class Map>
void init_normal(T* x, index_t n, Map map, std::uint64_t key, double stddev, cudaStream_t stream) {
  static_assert(std::is_trivially_copyable_v<Map>, "A kernel argument must be trivially copyable: the index map is copied to the device.");
  if (n <= 0) return;
  init_normal_kernel<T, Map><<<grid_for(n), kThreads, 0, stream>>>(x, n, map, key, stddev);
  check_launch("init_normal");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
