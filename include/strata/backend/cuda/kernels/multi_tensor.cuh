// strata/backend/cuda/kernels/multi_tensor.cuh: the gradient-norm work on many tensors in a few
// launches (backend/tensor_ref.hpp): sum_of_squares_many, scale_by_many and fill_many.
//
//   sum_of_squares_many  accumulator[0] += sum_t sum_i x_t[i]^2, in double: the same bits as
//                        sum_of_squares on each tensor in list order. Three phases, no atomics:
//                        (1) one launch per 128 tensors computes the partials that sum_of_squares
//                        would (tensor t gets reduce_blocks(n_t) blocks striding over it as that
//                        kernel's grid does; block k finds its tensor in the table of first blocks),
//                        (2) one block per tensor adds its partials as add_partials does, into
//                        sums[t], (3) one thread adds sums[0], sums[1], ... to the accumulator in order.
//   scale_by_many        x_t[i] *= *factor for every tensor; fill_many  x_t[i] = value (element-wise:
//                        the same bits as scale_by / fill). A block takes one 4096-element chunk of
//                        one tensor, in 16-byte vectors when the tensor is 16-byte aligned.
//
// Up to 128 tensors travel in the kernel's argument (__grid_constant__, about 3 KiB), so nothing is
// copied to the device before a launch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../../tensor_ref.hpp"
#include "common.cuh"
#include "elementwise.cuh"
#include "optimizer.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

inline constexpr int kTensorsPerLaunch = 128;
inline constexpr index_t kMultiTensorChunk = 4096;  // elements per block of scale_by_many / fill_many

// Tensors of one launch; tensor t owns blocks [first_block[t], first_block[t + 1]).
template <class X>
struct tensor_batch {
  X* data[kTensorsPerLaunch];
  index_t n[kTensorsPerLaunch];
  index_t first_block[kTensorsPerLaunch + 1];
  int count;
};

// The tensor that owns this block: the last t with first_block[t] <= blockIdx.x (binary search).
template <class X>
__device__ __forceinline__ int owner_of_block(const tensor_batch<X>& batch) {
  const index_t block = blockIdx.x;
  int lo = 0, hi = batch.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (batch.first_block[mid] <= block) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Phase 1: partials[first_block[t] + k] = block k's share of tensor t (sum_of_squares_partials_kernel
// with reduce_blocks(n_t) blocks).
template <class X>
__global__ void __launch_bounds__(kReduceThreads) sum_of_squares_many_partials_kernel(const __grid_constant__ tensor_batch<const X> batch,
                                                                                       double* partials) {
  const int t = owner_of_block(batch);
  const X* x = batch.data[t];
  const index_t n = batch.n[t], first = batch.first_block[t], blocks = batch.first_block[t + 1] - first;
  const index_t block = blockIdx.x - first;
  double sum = 0;
  for (index_t i = block * index_t(blockDim.x) + threadIdx.x; i < n; i += blocks * blockDim.x) {
    const double v = static_cast<double>(load(x, i));
    sum += v * v;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// Phase 2: block t adds tensor t's partials (add_partials_kernel's order) into sums[t].
template <class X>
__global__ void sum_of_squares_many_tensor_kernel(const __grid_constant__ tensor_batch<const X> batch, const double* partials,
                                                  double* sums) {
  const int t = blockIdx.x;
  const index_t first = batch.first_block[t], count = batch.first_block[t + 1] - first;
  double sum = 0;
  for (index_t i = threadIdx.x; i < count; i += blockDim.x) sum += partials[first + i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) sums[t] = sum;
}

// Phase 3: accumulator[0] += sums[0], += sums[1], ... (one thread, list order).
template <class Real>
__global__ void add_in_order_kernel(const Real* sums, index_t count, Real* accumulator) {
  Real total = accumulator[0];
  for (index_t t = 0; t < count; ++t) total += sums[t];
  accumulator[0] = total;
}

// Doubles of workspace sum_of_squares_many needs: every tensor's partials, and one sum per tensor.
template <class X>
std::size_t sum_of_squares_many_workspace(const TensorRef<const X>* tensors, std::size_t count) {
  std::size_t doubles = 0;
  for (std::size_t i = 0; i < count; ++i)
    if (tensors[i].n > 0) doubles += static_cast<std::size_t>(reduce_blocks(tensors[i].n)) + 1;
  return doubles;
}

template <class X>
void sum_of_squares_many(const TensorRef<const X>* tensors, std::size_t count, double* accumulator, double* workspace,
                         cudaStream_t stream) {
  std::size_t total_blocks = 0, nonempty = 0;
  for (std::size_t i = 0; i < count; ++i)
    if (tensors[i].n > 0) total_blocks += static_cast<std::size_t>(reduce_blocks(tensors[i].n)), ++nonempty;
  if (nonempty == 0) return;
  double* partials = workspace;                // (total_blocks)
  double* sums = workspace + total_blocks;     // (nonempty)
  tensor_batch<const X> batch{};
  std::size_t partial_offset = 0, sum_offset = 0;
  const auto launch = [&] {
    if (batch.count == 0) return;
    sum_of_squares_many_partials_kernel<X><<<static_cast<unsigned>(batch.first_block[batch.count]), kReduceThreads, 0, stream>>>(
        batch, partials + partial_offset);
    check_launch("sum_of_squares_many");
    sum_of_squares_many_tensor_kernel<X><<<static_cast<unsigned>(batch.count), 1024, 0, stream>>>(batch, partials + partial_offset,
                                                                                                   sums + sum_offset);
    check_launch("sum_of_squares_many (partials)");
    partial_offset += static_cast<std::size_t>(batch.first_block[batch.count]);
    sum_offset += static_cast<std::size_t>(batch.count);
    batch = tensor_batch<const X>{};
  };
  for (std::size_t i = 0; i < count; ++i) {
    if (tensors[i].n <= 0) continue;
    if (batch.count == kTensorsPerLaunch) launch();
    batch.data[batch.count] = tensors[i].data;
    batch.n[batch.count] = tensors[i].n;
    batch.first_block[batch.count + 1] = batch.first_block[batch.count] + reduce_blocks(tensors[i].n);
    ++batch.count;
  }
  launch();
  add_in_order_kernel<double><<<1, 1, 0, stream>>>(sums, static_cast<index_t>(nonempty), accumulator);
  check_launch("sum_of_squares_many (accumulate)");
}

// x = op(x) on one 4096-element chunk per block (op: scale_by_op or fill_op of elementwise.cuh,
// called as op(x, 0, i)).
template <class X, class Op>
__global__ void map_many_kernel(const __grid_constant__ tensor_batch<X> batch, Op op, bool reads) {
  using A = accumulate_t<X>;
  constexpr int width = packed<X>::width;
  const int t = owner_of_block(batch);
  X* x = batch.data[t];
  const index_t begin = (blockIdx.x - batch.first_block[t]) * kMultiTensorChunk;
  const index_t end = begin + kMultiTensorChunk < batch.n[t] ? begin + kMultiTensorChunk : batch.n[t];
  index_t done = begin;
  if (reinterpret_cast<std::uintptr_t>(x) % 16 == 0) {  // chunks start at multiples of kMultiTensorChunk: all aligned
    const index_t vectors = (end - begin) / width;
    packed<X>* body = reinterpret_cast<packed<X>*>(x + begin);  // (vectors, width)
    for (index_t v = threadIdx.x; v < vectors; v += blockDim.x) {
      packed<X> in{}, result;
      if (reads) in = body[v];
#pragma unroll
      for (int k = 0; k < width; ++k) result.raw[k] = pack<X>(op(reads ? unpack<X>(in.raw[k]) : A(0), A(0), begin + v * width + k));
      body[v] = result;
    }
    done = begin + vectors * width;
  }
  for (index_t i = done + threadIdx.x; i < end; i += blockDim.x) store(x, i, op(reads ? load(x, i) : A(0), A(0), i));
}

template <class X, class Op>
void map_many(const TensorRef<X>* tensors, std::size_t count, Op op, bool reads, const char* name, cudaStream_t stream) {
  static_assert(std::is_trivially_copyable_v<Op>, "A kernel argument must be trivially copyable: the element operation is copied to the device.");
  tensor_batch<X> batch{};
  const auto launch = [&] {
    if (batch.count == 0) return;
    map_many_kernel<X, Op><<<static_cast<unsigned>(batch.first_block[batch.count]), kThreads, 0, stream>>>(batch, op, reads);
    check_launch(name);
    batch = tensor_batch<X>{};
  };
  for (std::size_t i = 0; i < count; ++i) {
    if (tensors[i].n <= 0) continue;
    const index_t blocks = (tensors[i].n + kMultiTensorChunk - 1) / kMultiTensorChunk;
    if (batch.count == kTensorsPerLaunch || batch.first_block[batch.count] + blocks > 0x7fffffff) launch();
    batch.data[batch.count] = tensors[i].data;
    batch.n[batch.count] = tensors[i].n;
    batch.first_block[batch.count + 1] = batch.first_block[batch.count] + blocks;
    ++batch.count;
  }
  launch();
}

template <class X>
void scale_by_many(const TensorRef<X>* tensors, std::size_t count, const double* factor, cudaStream_t stream) {
  map_many<X>(tensors, count, scale_by_op<accumulate_t<X>>{factor}, true, "scale_by_many", stream);
}
template <class X>
void fill_many(const TensorRef<X>* tensors, std::size_t count, double value, cudaStream_t stream) {
  using A = accumulate_t<X>;
  map_many<X>(tensors, count, fill_op<A>{static_cast<A>(value)}, false, "fill_many", stream);
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
