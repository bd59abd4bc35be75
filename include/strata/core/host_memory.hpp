// strata/core/host_memory.hpp: the host twin of the device caching allocator.
//
// A training step allocates the same buffers step after step (activations, saved tensors,
// gradients of activations). Taking each from the operating system again costs page faults and
// the kernel's zeroing of fresh pages, which on the CPU path is a noticeable share of a small
// model's step. Buffers of at least kMinCachedBytes are therefore returned to a process-wide pool
// binned by exact size and handed out again for the next request of that size; smaller ones go to
// the ordinary heap, which already recycles them. At most kMaxCachedBytes are kept idle: a buffer
// freed beyond that goes back to the system. Ranks are threads that may free each other's buffers,
// so the pool is one structure under a mutex (a few hundred operations per step).
//
// Buffers come from the global operator new (so a program that replaces it sees them) and have its
// alignment; the kernels use unaligned vector loads. Contents are whatever the previous user left:
// callers that need zeros clear them.
#pragma once

#include <cstddef>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "config.hpp"

STRATA_NAMESPACE_BEGIN
namespace host_memory {

inline constexpr std::size_t kGranule = 64;  // sizes are binned in multiples of this
inline constexpr std::size_t kMinCachedBytes = std::size_t{64} << 10;  // 64 KiB
inline constexpr std::size_t kMaxCachedBytes = std::size_t{1} << 30;   // 1 GiB idle at most

namespace detail {

struct pool {
  std::mutex mutex;
  std::unordered_map<std::size_t, std::vector<void*>> idle;  // bytes -> free buffers of that size
  std::size_t idle_bytes = 0;

  ~pool() {
    for (auto& [bytes, buffers] : idle)
      for (void* p : buffers) ::operator delete(p);
  }
};

inline pool& instance() {
  static pool p;
  return p;
}

inline std::size_t rounded(std::size_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; }

}  // namespace detail

// `bytes` of host memory; throws std::bad_alloc when the system has none.
inline void* allocate(std::size_t bytes) {
  const std::size_t size = detail::rounded(bytes == 0 ? 1 : bytes);
  if (size >= kMinCachedBytes) {
    detail::pool& p = detail::instance();
    std::lock_guard lock(p.mutex);
    auto it = p.idle.find(size);
    if (it != p.idle.end() && !it->second.empty()) {
      void* out = it->second.back();
      it->second.pop_back();
      p.idle_bytes -= size;
      return out;
    }
  }
  return ::operator new(size);
}

// Returns memory from allocate(bytes) (the same `bytes`).
inline void deallocate(void* pointer, std::size_t bytes) noexcept {
  if (!pointer) return;
  const std::size_t size = detail::rounded(bytes == 0 ? 1 : bytes);
  if (size >= kMinCachedBytes) {
    detail::pool& p = detail::instance();
    std::lock_guard lock(p.mutex);
    if (p.idle_bytes + size <= kMaxCachedBytes) {
      try {
        p.idle[size].push_back(pointer);
        p.idle_bytes += size;
        return;
      } catch (...) {  // no room to remember it: give it back below
      }
    }
  }
  ::operator delete(pointer);
}

// Bytes held idle in the pool (for tests and reports).
inline std::size_t idle_bytes() {
  detail::pool& p = detail::instance();
  std::lock_guard lock(p.mutex);
  return p.idle_bytes;
}

}  // namespace host_memory
STRATA_NAMESPACE_END
