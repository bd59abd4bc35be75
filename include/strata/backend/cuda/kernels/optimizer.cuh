// strata/backend/cuda/kernels/optimizer.cuh: the AdamW step, the deterministic sum of squares and
// the clipping factor.
//
//   adamw_step       per element, in A = accumulate_t<T> (the math of optim/adamw.hpp):
//                      x = main - decay * main;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//                      main = x - lr * (m / bc1) / (sqrt(v / bc2) + eps);  value = T(main)
//   adamw_step_many  the same step on many parameters in a few launches: up to 24 tensors per launch
//                    travel in the kernel's argument; block k finds its tensor in the table of first
//                    blocks and updates one 4096-element chunk of it (decay per tensor: step.decay
//                    or 0), 16 bytes of each stream of A a load where the tensor's pointers are
//                    aligned (a float a time reached 78% of an H200's bandwidth)
//   Both do nothing when step.skip_unless_finite points at a non-finite value, and read each gradient
//   times *step.grad_scale when that is set (adamw_step.hpp).
//   sum_of_squares   accumulator[0] += sum_i x_i^2, in double
//   clip_factor      norm = sqrt(square_sum); factor = max_norm / (norm + 1e-6) when max_norm > 0 and
//                    that is < 1, else 1
//
// sum_of_squares runs in two phases with no atomics: a block count that depends on n only, each
// block striding over the elements in a fixed pattern and summing its share (block_sum), one partial
// per block; then one block adds the partials in order into the accumulator. Same bits every run.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../../adamw_step.hpp"
#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

// One element's step in registers: x (the main copy), m and v updated in place from the gradient g
// (already times the gradient scale).
template <class A>
__device__ __forceinline__ void adamw_update(A& x, A& m, A& v, A g, A decay, A lr, A beta1, A beta2, A one_minus_beta1,
                                             A one_minus_beta2, A eps, A bias_correction1, A bias_correction2) {
  x = x - decay * x;
  m = beta1 * m + one_minus_beta1 * g;
  v = beta2 * v + one_minus_beta2 * g * g;
  x = x - lr * (m / bias_correction1) / (sqrt_(v / bias_correction2) + eps);
}

template <class A>
__device__ __forceinline__ void adamw_element(A* main, A* exp_avg, A* exp_avg_sq, const A* grad, index_t i, A decay,
                                              A lr, A beta1, A beta2, A one_minus_beta1, A one_minus_beta2, A eps,
                                              A bias_correction1, A bias_correction2, A grad_scale, A& out) {
  const A g = grad[i] * grad_scale;  // rounded to A, as a scale_by pass would store it (x 1 is exact)
  A x = main[i], m = exp_avg[i], v = exp_avg_sq[i];
  adamw_update<A>(x, m, v, g, decay, lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, bias_correction1,
                  bias_correction2);
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
  main[i] = x;
  out = x;
}

template <class T, class Step, class A = accumulate_t<T>>
__global__ void adamw_kernel(A* main, A* exp_avg, A* exp_avg_sq, const A* grad, T* value, index_t n, Step step) {
  if (step.skip_unless_finite != nullptr && !isfinite(*step.skip_unless_finite)) return;
  const A scale = step.grad_scale != nullptr ? static_cast<A>(*step.grad_scale) : A(1);
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x) {
    A x;
    adamw_element<A>(main, exp_avg, exp_avg_sq, grad, i, step.decay, step.lr, step.beta1, step.beta2,
                     step.one_minus_beta1, step.one_minus_beta2, step.eps, step.bias_correction1,
                     step.bias_correction2, scale, x);
    store(value, i, x);
  }
}
// Step: AdamWStep (lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, decay, bias_correction1,
// bias_correction2 in A), passed by value.
template <class T, class Step, class A>
void adamw_step(A* main, A* exp_avg, A* exp_avg_sq, const A* grad, T* value, index_t n, const Step& step,
                cudaStream_t stream) {
  static_assert(std::is_trivially_copyable_v<Step>, "A kernel argument must be trivially copyable: the AdamW step is copied to the device.");
  if (n <= 0) return;
  adamw_kernel<T, Step, A><<<grid_for(n), kThreads, 0, stream>>>(main, exp_avg, exp_avg_sq, grad, value, n, step);
  check_launch("adamw_step");
}

// adamw_tensor (launchers.hpp): one parameter of adamw_step_many.

inline constexpr int kAdamWTensorsPerLaunch = 24;
inline constexpr index_t kAdamWChunk = 4096;  // elements per block

template <class T, class A>
struct adamw_batch {
  adamw_tensor<T, A> tensors[kAdamWTensorsPerLaunch];
  index_t first_block[kAdamWTensorsPerLaunch + 1];  // tensor t owns blocks [first_block[t], first_block[t + 1])
  int count;
};

// 16 bytes of A (four floats, two doubles), and as many elements of T, for the vector loads and
// stores of adamw_many_kernel.
template <class A>
struct alignas(16) adamw_vector {
  static constexpr int width = 16 / sizeof(A);
  A e[width];
};
template <class T, int W>
struct alignas(W * sizeof(T)) adamw_values {
  storage_t<T> raw[W];
};

template <class T, class Step, class A>
__global__ void adamw_many_kernel(const __grid_constant__ adamw_batch<T, A> batch, Step step) {
  if (step.skip_unless_finite != nullptr && !isfinite(*step.skip_unless_finite)) return;
  const A scale = step.grad_scale != nullptr ? static_cast<A>(*step.grad_scale) : A(1);
  const index_t block = blockIdx.x;
  int t = 0;
  while (t + 1 < batch.count && batch.first_block[t + 1] <= block) ++t;
  const adamw_tensor<T, A>& p = batch.tensors[t];
  const index_t begin = (block - batch.first_block[t]) * kAdamWChunk;
  const index_t end = begin + kAdamWChunk < p.n ? begin + kAdamWChunk : p.n;
  const A decay = p.weight_decay ? step.decay : A(0);
  // 16-byte loads of the four fp32 streams and one store of the values per W elements, where every
  // pointer allows it (chunks start at multiples of 4096 elements, so aligned tensors stay aligned);
  // the same expression per element as adamw_element, so the same bits.
  constexpr int W = adamw_vector<A>::width;
  using V = adamw_vector<A>;
  using O = adamw_values<T, W>;
  const bool vector = (reinterpret_cast<std::uintptr_t>(p.main) | reinterpret_cast<std::uintptr_t>(p.exp_avg) |
                       reinterpret_cast<std::uintptr_t>(p.exp_avg_sq) | reinterpret_cast<std::uintptr_t>(p.grad)) % 16 == 0 &&
                      reinterpret_cast<std::uintptr_t>(p.value) % alignof(O) == 0;
  index_t scalar_from = begin;
  if (vector) {
    V* __restrict__ main = reinterpret_cast<V*>(p.main);
    V* __restrict__ exp_avg = reinterpret_cast<V*>(p.exp_avg);
    V* __restrict__ exp_avg_sq = reinterpret_cast<V*>(p.exp_avg_sq);
    const V* __restrict__ grad = reinterpret_cast<const V*>(p.grad);
    O* __restrict__ value = reinterpret_cast<O*>(p.value);
    const index_t first = begin / W, last = first + (end - begin) / W;
#pragma unroll 4
    for (index_t j = first + threadIdx.x; j < last; j += blockDim.x) {
      V x = main[j], m = exp_avg[j], v = exp_avg_sq[j];
      const V g = grad[j];
      O out;
#pragma unroll
      for (int e = 0; e < W; ++e) {
        adamw_update<A>(x.e[e], m.e[e], v.e[e], g.e[e] * scale, decay, step.lr, step.beta1, step.beta2,
                        step.one_minus_beta1, step.one_minus_beta2, step.eps, step.bias_correction1,
                        step.bias_correction2);
        out.raw[e] = pack<T>(static_cast<accumulate_t<T>>(x.e[e]));
      }
      exp_avg[j] = m;
      exp_avg_sq[j] = v;
      main[j] = x;
      value[j] = out;
    }
    scalar_from = last * W;
  }
  for (index_t i = scalar_from + threadIdx.x; i < end; i += blockDim.x) {
    A x;
    adamw_element<A>(p.main, p.exp_avg, p.exp_avg_sq, p.grad, i, decay, step.lr, step.beta1, step.beta2,
                     step.one_minus_beta1, step.one_minus_beta2, step.eps, step.bias_correction1,
                     step.bias_correction2, scale, x);
    store(p.value, i, x);
  }
}

template <class T, class Step, class A>
void adamw_step_many(const adamw_tensor<T, A>* tensors, std::size_t count, const Step& step, cudaStream_t stream) {
  static_assert(std::is_trivially_copyable_v<Step>, "A kernel argument must be trivially copyable: the AdamW step is copied to the device.");
  adamw_batch<T, A> batch{};
  const auto launch = [&] {
    if (batch.count == 0 || batch.first_block[batch.count] == 0) return;
    adamw_many_kernel<T, Step, A><<<static_cast<unsigned>(batch.first_block[batch.count]), kThreads, 0, stream>>>(batch, step);
    check_launch("adamw_step_many");
    batch = adamw_batch<T, A>{};
  };
  for (std::size_t i = 0; i < count; ++i) {
    if (tensors[i].n <= 0) continue;
    const index_t blocks = (tensors[i].n + kAdamWChunk - 1) / kAdamWChunk;
    if (batch.count == kAdamWTensorsPerLaunch || batch.first_block[batch.count] + blocks > 0x7fffffff) launch();
    batch.tensors[batch.count] = tensors[i];
    batch.first_block[batch.count + 1] = batch.first_block[batch.count] + blocks;
    ++batch.count;
  }
  launch();
}

inline constexpr int kReduceThreads = 512;
// Partials of the two-phase sums: one per 16 Ki elements, at most 1024 (depends on n only).
STRATA_CUDA_INLINE index_t reduce_blocks(index_t n) {
  const index_t blocks = (n + 16383) / 16384;
  return blocks < 1 ? 1 : (blocks > 1024 ? 1024 : blocks);
}

template <class X>
__global__ void sum_of_squares_partials_kernel(const X* x, index_t n, double* partials) {
  double sum = 0;
  for (index_t i = blockIdx.x * index_t(blockDim.x) + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x) {
    const double v = static_cast<double>(load(x, i));
    sum += v * v;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}
// accumulator[0] += sum of partials[0 .. count), in order.
template <class Real>
__global__ void add_partials_kernel(const Real* partials, index_t count, Real* accumulator) {
  Real sum = 0;
  for (index_t i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) accumulator[0] += sum;
}
// workspace: reduce_blocks(n) doubles.
template <class X>
void sum_of_squares(const X* x, index_t n, double* accumulator, double* workspace, cudaStream_t stream) {
  if (n <= 0) return;
  const index_t blocks = reduce_blocks(n);
  sum_of_squares_partials_kernel<X><<<static_cast<unsigned>(blocks), kReduceThreads, 0, stream>>>(x, n, workspace);
  check_launch("sum_of_squares");
  add_partials_kernel<double><<<1, 1024, 0, stream>>>(workspace, blocks, accumulator);
  check_launch("sum_of_squares (partials)");
}

template <class Real>
__global__ void clip_factor_kernel(const Real* square_sum, Real max_norm, Real* norm, Real* factor) {
  const Real value = sqrt(square_sum[0]);
  norm[0] = value;
  const Real candidate = max_norm / (value + Real(1e-6));
  factor[0] = max_norm > 0 && candidate < 1 ? candidate : Real(1);
}
STRATA_CUDA_INLINE void clip_factor(const double* square_sum, double max_norm, double* norm, double* factor, cudaStream_t stream) {
  clip_factor_kernel<double><<<1, 1, 0, stream>>>(square_sum, max_norm, norm, factor);
  check_launch("clip_factor");
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
