// strata/backend/cuda/allocator.hpp: `caching_allocator`, the device memory resource a
// cuda::backend installs for its rank's threads.
//
// A training step allocates and frees the same sizes in the same order every iteration, so the
// allocator keeps every freed block in a bin of its exact (rounded) size and hands it out again
// instead of calling cudaFree / cudaMalloc:
//
//   request <= 1 MiB   rounded up to a multiple of 512 bytes
//   request >  1 MiB   rounded up to a multiple of 2 MiB
//
// After the first step has filled the bins, a step makes no cudaMalloc at all; a block kept across
// steps (allocate_long_lived: the attention workspace) is always a fresh cudaMalloc, so holding it
// never leaves the bins one block short in the next step. `stats()` counts
// the cudaMalloc calls, the bytes handed out (in use, and the peak) and the bytes held from CUDA
// (reserved), so a test can prove it.
//
// Stream order: every block is used on the backend's compute stream only, so a block freed after
// its last kernel was enqueued may be reused by the next kernel on the same stream without an
// event (the CUDA stream orders the two). Memory handed to another stream (a communicator's) must
// be synchronized with the compute stream by its user, as with any stream-ordered allocator.
// When cudaMalloc fails, the cached blocks are returned to CUDA and the call is retried once.
//
// Copies from the host (a step's token ids, labels and loss mask) of at most kStagingBytes do not
// wait for the GPU: the bytes are copied on the host into one of kStagingSlots pinned buffers and the
// transfer from there is enqueued on the compute stream, so the caller may reuse its memory at once
// and the host keeps running ahead of the GPU instead of draining it at every upload. A slot is
// reused once its previous transfer has run (an event; normally long done). Larger copies, and all
// copies to the host, wait for their bytes. The pinned slots are allocated by prepare_staging(),
// which cuda::backend calls when it starts (cudaHostAlloc in the middle of a step could wait on the
// device).
//
// To find the allocation that makes a steady-state step call cudaMalloc, set the environment
// variable STRATA_CUDA_MALLOC_TRACE=1: every cudaMalloc then prints its size, the allocator's
// counters and the calling stack to stderr, followed by the stacks that allocated the blocks of the
// same size still in use (one of them is usually held longer than it was in the previous step).
// Function names need the executable linked with -rdynamic; static functions show as offsets for
// addr2line.
#pragma once

#include <execinfo.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <array>
#include <unordered_map>
#include <vector>

#include "../../core/space.hpp"
#include "runtime.hpp"

STRATA_NAMESPACE_BEGIN
namespace cuda {

struct allocator_stats {
  std::uint64_t malloc_calls = 0;      // cudaMalloc calls made so far
  std::uint64_t last_malloc_bytes = 0; // the (rounded) size of the most recent cudaMalloc
  std::uint64_t free_calls = 0;        // cudaFree calls made so far
  std::uint64_t allocations = 0;       // allocate() calls served
  std::size_t bytes_in_use = 0;        // rounded bytes handed out and not yet returned
  std::size_t peak_bytes_in_use = 0;   // the largest bytes_in_use seen
  std::size_t bytes_reserved = 0;      // bytes held from cudaMalloc (in use + cached)
};

class caching_allocator final : public device_memory_resource {
 public:
  static constexpr std::size_t kSmallLimit = std::size_t{1} << 20;
  static constexpr std::size_t kSmallGranule = 512;
  static constexpr std::size_t kLargeGranule = std::size_t{2} << 20;

  caching_allocator(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;
  ~caching_allocator() override {
    (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(stream_);
    for (auto& slot : staging_) {
      if (slot.done) (void)cudaEventDestroy(slot.done);
      if (slot.host) (void)cudaFreeHost(slot.host);
    }
    for (auto& [bytes, blocks] : free_)
      for (void* p : blocks) (void)cudaFree(p);
    // Blocks still in use when the backend goes away are released by CUDA at process exit.
  }

  static constexpr std::size_t round_size(std::size_t bytes) {
    if (bytes == 0) bytes = 1;
    const std::size_t granule = bytes <= kSmallLimit ? kSmallGranule : kLargeGranule;
    return (bytes + granule - 1) / granule * granule;
  }

  void* allocate(std::size_t bytes) override { return allocate_from(bytes, /*cached=*/true); }

  // A workspace kept across steps: always a fresh cudaMalloc, so it never takes a block that a
  // step frees and needs again (which would make the next step call cudaMalloc once more).
  void* allocate_long_lived(std::size_t bytes) override { return allocate_from(bytes, /*cached=*/false); }

 private:
  bool staged(void* destination, const void* source, std::size_t bytes) {
    std::lock_guard lock(staging_mutex_);
    auto& slot = staging_[next_slot_];
    if (!slot.host) return false;
    next_slot_ = (next_slot_ + 1) % kStagingSlots;
    STRATA_CUDA_CHECK(cudaEventSynchronize(slot.done));  // its previous transfer has run
    std::memcpy(slot.host, source, bytes);
    STRATA_CUDA_CHECK(cudaMemcpyAsync(destination, slot.host, bytes, cudaMemcpyHostToDevice, stream_));
    STRATA_CUDA_CHECK(cudaEventRecord(slot.done, stream_));
    return true;
  }

  void* allocate_from(std::size_t bytes, bool cached) {
    const std::size_t rounded = round_size(bytes);
    std::lock_guard lock(mutex_);
    void* p = nullptr;
    auto bin = cached ? free_.find(rounded) : free_.end();
    if (bin != free_.end() && !bin->second.empty()) {
      p = bin->second.back();
      bin->second.pop_back();
    } else {
      p = malloc_locked(rounded);
    }
    if (trace_mallocs()) {
      traced& t = live_[p];
      t.bytes = rounded;
      t.depth = backtrace(t.frames.data(), static_cast<int>(t.frames.size()));
    }
    ++stats_.allocations;
    stats_.bytes_in_use += rounded;
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
    return p;
  }

 public:
  void deallocate(void* pointer, std::size_t bytes) noexcept override {
    if (!pointer) return;
    const std::size_t rounded = round_size(bytes);
    std::lock_guard lock(mutex_);
    if (trace_mallocs()) live_.erase(pointer);
    free_[rounded].push_back(pointer);
    stats_.bytes_in_use -= rounded;
  }

  static constexpr std::size_t kStagingBytes = std::size_t{512} << 10;
  static constexpr std::size_t kStagingSlots = 8;

  // The pinned buffers of the staged copies from the host (idempotent). Without them every copy
  // from the host waits for its bytes.
  void prepare_staging() {
    std::lock_guard lock(staging_mutex_);
    for (auto& slot : staging_) {
      if (slot.host) continue;
      STRATA_CUDA_CHECK(cudaHostAlloc(&slot.host, kStagingBytes, cudaHostAllocDefault));
      STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
    }
  }

  // Ordered on the compute stream. Copies to the host, and large ones from it, return when the bytes
  // have arrived; a copy from the host of at most kStagingBytes returns once the bytes are staged
  // (the caller may reuse its memory; the device sees them before the stream's next work).
  void copy(void* destination, const void* source, std::size_t bytes, copy_kind kind) override {
    if (bytes == 0) return;
    if (kind == copy_kind::host_to_device && bytes <= kStagingBytes && staged(destination, source, bytes)) return;
    const cudaMemcpyKind direction = kind == copy_kind::host_to_device   ? cudaMemcpyHostToDevice
                                     : kind == copy_kind::device_to_host ? cudaMemcpyDeviceToHost
                                                                         : cudaMemcpyDeviceToDevice;
    STRATA_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, direction, stream_));
    if (kind != copy_kind::device_to_device) STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void zero(void* pointer, std::size_t bytes) override {
    if (bytes > 0) STRATA_CUDA_CHECK(cudaMemsetAsync(pointer, 0, bytes, stream_));
  }

  std::string_view name() const override { return "cuda caching allocator"; }

  allocator_stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  // Returns every cached (free) block to CUDA, after the stream has finished with them.
  void release_cached() {
    std::lock_guard lock(mutex_);
    release_cached_locked();
  }

 private:
  void* malloc_locked(std::size_t rounded) {
    void* p = nullptr;
    cudaError_t status = cudaMalloc(&p, rounded);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the error before retrying
      release_cached_locked();
      status = cudaMalloc(&p, rounded);
    }
    if (status != cudaSuccess)
      fail<Error>("cuda::caching_allocator: cudaMalloc of ", rounded, " bytes on device ", device_,
                  " failed (", cudaGetErrorString(status), ") with ", stats_.bytes_in_use, " bytes in use and ",
                  stats_.bytes_reserved, " reserved; reduce the micro-batch size or the sequence length, or "
                  "enable activation recomputation");
    ++stats_.malloc_calls;
    if (trace_mallocs()) print_trace(rounded);
    stats_.last_malloc_bytes = rounded;
    stats_.bytes_reserved += rounded;
    return p;
  }
  static bool trace_mallocs() {
    static const bool on = [] {
      const char* v = std::getenv("STRATA_CUDA_MALLOC_TRACE");
      return v && *v && *v != '0';
    }();
    return on;
  }
  void print_trace(std::size_t rounded) const {
    std::fprintf(stderr, "cudaMalloc #%llu of %zu bytes on device %d (%zu bytes in use, %zu reserved), from:\n",
                 static_cast<unsigned long long>(stats_.malloc_calls), rounded, device_, stats_.bytes_in_use,
                 stats_.bytes_reserved);
    void* frames[32];
    const int depth = backtrace(frames, 32);
    backtrace_symbols_fd(frames, depth, 2);
    int held = 0;
    for (const auto& [pointer, t] : live_) {
      if (t.bytes != rounded) continue;
      std::fprintf(stderr, "  block %p of %zu bytes in use (#%d), allocated from:\n", pointer, rounded, ++held);
      backtrace_symbols_fd(const_cast<void* const*>(t.frames.data()), t.depth, 2);
    }
  }
  void release_cached_locked() {
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (auto& [bytes, blocks] : free_) {
      for (void* p : blocks) {
        (void)cudaFree(p);
        ++stats_.free_calls;
        stats_.bytes_reserved -= bytes;
      }
      blocks.clear();
    }
  }

  int device_;
  cudaStream_t stream_;
  mutable std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;  // rounded size -> cached blocks
  allocator_stats stats_;
  struct traced {
    std::size_t bytes = 0;
    std::array<void*, 24> frames{};
    int depth = 0;
  };
  std::unordered_map<void*, traced> live_;  // blocks in use and their stacks (STRATA_CUDA_MALLOC_TRACE only)
  struct staging_slot {
    void* host = nullptr;        // kStagingBytes of pinned memory
    cudaEvent_t done = nullptr;  // recorded after the slot's last transfer
  };
  std::mutex staging_mutex_;
  std::array<staging_slot, kStagingSlots> staging_{};
  std::size_t next_slot_ = 0;
};

// A block of `count` T from a device memory resource, returned to it on destruction (scratch space
// of the kernels that need a workspace).
template <class T>
class scratch {
 public:
  scratch(device_memory_resource& resource, std::size_t count)
      : resource_(&resource), count_(count), data_(static_cast<T*>(resource.allocate(count * sizeof(T)))) {}
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  ~scratch() { resource_->deallocate(data_, count_ * sizeof(T)); }
  T* data() const { return data_; }
  std::size_t size() const { return count_; }

 private:
  device_memory_resource* resource_;
  std::size_t count_;
  T* data_;
};

}  // namespace cuda
STRATA_NAMESPACE_END
