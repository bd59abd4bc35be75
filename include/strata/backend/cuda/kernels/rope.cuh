// strata/backend/cuda/kernels/rope.cuh: rotary position embedding, forward and backward, in place
// (variants: backend/rope_options.hpp).
//
//   x [s, n, d] (n = batch * heads); of each head the first rotary_dim dimensions turn, half =
//   rotary_dim / 2; for position t and pair i < half:
//     angle = (position_offset + t) * rope_inverse_frequency(i)
//     forward:  (x_a, x_b) <- (x_a cos - x_b sin,  x_b cos + x_a sin),  (a, b) = (i, i + half), or
//               (2i, 2i + 1) when interleaved
//     backward: the inverse (transposed) rotation, the same with -sin
//   cos and sin are multiplied by rope_attention_factor(options) (YaRN's concentration, else 1)
//
// The angle and its sine and cosine are computed in double, as the CPU twin does: positions reach
// thousands of radians, where a float angle would already be wrong in the fourth digit. A thread
// per pair; the rotation itself runs in A = accumulate_t<T>.
#pragma once

#include "../../rope_options.hpp"
#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

template <class T, class A = accumulate_t<T>>
__global__ void rope_kernel(T* x, index_t s, index_t n, index_t d, double base, index_t position_offset, double sign,
                            RopeOptions options) {
  const index_t rotary_dim = rope_rotary_dim(options, d), half = rotary_dim / 2;
  const index_t pairs = s * n * half;
  for (index_t p = blockIdx.x * index_t(blockDim.x) + threadIdx.x; p < pairs; p += index_t(gridDim.x) * blockDim.x) {
    const index_t i = p % half, row = p / half, t = row / n;  // pairs (s, n, half); row = t * n + head
    const double angle = static_cast<double>(position_offset + t) * rope_inverse_frequency(i, rotary_dim, base, options);
    double sin_angle, cos_angle;
    sincos(angle, &sin_angle, &cos_angle);
    const double factor = rope_attention_factor(options);
    const A c = A(factor * cos_angle), sn = A(factor * (sign * sin_angle));
    T* pair = x + row * d;  // x (s, n, d)
    const index_t first = options.interleaved ? 2 * i : i, second = options.interleaved ? 2 * i + 1 : i + half;
    const A a = load(pair, first), b = load(pair, second);
    store(pair, first, a * c - b * sn);
    store(pair, second, b * c + a * sn);
  }
}

template <class T>
void rope(T* x, index_t s, index_t n, index_t d, double base, index_t position_offset, bool inverse,
          cudaStream_t stream, RopeOptions options) {
  const index_t pairs = s * n * (rope_rotary_dim(options, d) / 2);
  if (pairs <= 0) return;
  rope_kernel<T><<<grid_for(pairs), kThreads, 0, stream>>>(x, s, n, d, base, position_offset, inverse ? -1.0 : 1.0,
                                                           options);
  check_launch(inverse ? "rope_backward" : "rope_forward");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
