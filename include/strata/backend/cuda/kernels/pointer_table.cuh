// strata/backend/cuda/kernels/pointer_table.cuh: store_pointers, a table of device pointers written
// to device memory by a kernel that receives them in its own argument.
//
//   table[i] = pointers[i]   for i < count (host array in, device array out)
//
// The batched and grouped cuBLAS GEMMs read their A / B / C pointer arrays from device memory. Up
// to 448 pointers travel in one launch's argument (__grid_constant__, 3.5 KiB, within the 4 KiB of
// kernel parameters every GPU takes), so nothing waits for the host, no host buffer has to outlive
// the call (a cudaMemcpyAsync from pageable memory may wait for the stream; one from pinned memory
// needs the buffer kept until the copy has run), and the launch can be captured in a CUDA graph.
// The CPU twin is a plain copy.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "common.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::kernels {

inline constexpr int kPointersPerLaunch = 448;

// The pointers of one launch (Pointer: a pointer type, such as void*).
template <class Pointer>
struct pointer_batch {
  static_assert(std::is_pointer_v<Pointer>, "pointer_batch holds pointers.");
  Pointer pointers[kPointersPerLaunch];
  int count;
};
static_assert(std::is_trivially_copyable_v<pointer_batch<void*>>, "pointer_batch travels in a kernel argument.");
static_assert(sizeof(pointer_batch<void*>) <= 4000, "pointer_batch must fit the 4 KiB of kernel parameters with room to spare.");

template <class Pointer>
__global__ void store_pointers_kernel(const __grid_constant__ pointer_batch<Pointer> batch, Pointer* table) {
  for (int i = threadIdx.x; i < batch.count; i += blockDim.x) table[i] = batch.pointers[i];
}

// table[0, count) = pointers[0, count), enqueued on `stream` (one launch per 448 pointers).
template <class Pointer>
void store_pointers(const Pointer* pointers, std::size_t count, Pointer* table, cudaStream_t stream) {
  for (std::size_t first = 0; first < count; first += kPointersPerLaunch) {
    pointer_batch<Pointer> batch{};
    batch.count = static_cast<int>(std::min<std::size_t>(kPointersPerLaunch, count - first));
    std::copy_n(pointers + first, batch.count, batch.pointers);
    store_pointers_kernel<Pointer><<<1, 128, 0, stream>>>(batch, table + first);
    check_launch("store_pointers");
  }
}

}  // namespace cuda::kernels
STRATA_NAMESPACE_END
