// strata/backend/cuda/kernels/rope.cuh: rotary position embedding, forward and backward, in place.
//
//   x [s, n, d] (n = batch * heads), half = d / 2; for position t and pair i < half:
//     angle = (position_offset + t) * base^(-2i / d)
//     forward:  (x_i, x_{i+half}) <- (x_i cos - x_{i+half} sin,  x_{i+half} cos + x_i sin)
//     backward: the inverse (transposed) rotation, the same with -sin
//
// The angle and its sine and cosine are computed in double, as the CPU twin does: positions reach
// thousands of radians, where a float angle would already be wrong in the fourth digit. A thread
// per pair; the rotation itself runs in A = accumulate_t<T>.
#pragma once

#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

template <class T, class A = accumulate_t<T>>
__global__ void rope_kernel(T* x, index_t s, index_t n, index_t d, double base, index_t position_offset, double sign) {
  const index_t half = d / 2;
  const index_t pairs = s * n * half;
  for (index_t p = blockIdx.x * index_t(blockDim.x) + threadIdx.x; p < pairs; p += index_t(gridDim.x) * blockDim.x) {
    const index_t i = p % half, row = p / half, t = row / n;  // pairs (s, n, half); row = t * n + head
    const double angle = static_cast<double>(position_offset + t) * pow(base, -2.0 * double(i) / double(d));
    double sin_angle, cos_angle;
    sincos(angle, &sin_angle, &cos_angle);
    const A c = A(cos_angle), sn = A(sign * sin_angle);
    T* pair = x + row * d;  // x (s, n, d)
    const A a = load(pair, i), b = load(pair, i + half);
    store(pair, i, a * c - b * sn);
    store(pair, i + half, b * c + a * sn);
  }
}

template <class T>
void rope(T* x, index_t s, index_t n, index_t d, double base, index_t position_offset, bool inverse,
          cudaStream_t stream) {
  const index_t pairs = s * n * (d / 2);
  if (pairs <= 0) return;
  rope_kernel<T><<<grid_for(pairs), kThreads, 0, stream>>>(x, s, n, d, base, position_offset, inverse ? -1.0 : 1.0);
  check_launch(inverse ? "rope_backward" : "rope_forward");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
