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
// The pool counts the bytes handed out and not yet returned, and their peak (process-wide: every
// rank thread together), so a test or a report can measure what a step holds at most
// (bytes_in_use, peak_bytes_in_use, reset_peak).
//
// Buffers come from the global operator new (so a program that replaces it sees them) and have its
// alignment; the kernels use unaligned vector loads. Contents are whatever the previous user left:
// callers that need zeros clear them.
#pragma once

#include <atomic>
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

struct counters {
  std::atomic<std::size_t> in_use{0};
  std::atomic<std::size_t> peak{0};
};
inline counters& usage() {
  static counters c;
  return c;
}
inline void count_allocation(std::size_t size) {
  counters& c = usage();
  const std::size_t now = c.in_use.fetch_add(size, std::memory_order_relaxed) + size;
  std::size_t peak = c.peak.load(std::memory_order_relaxed);
  while (now > peak && !c.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
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
      detail::count_allocation(size);
      return out;
    }
  }
  void* out = ::operator new(size);
  detail::count_allocation(size);
  return out;
}

// Returns memory from allocate(bytes) (the same `bytes`).
inline void deallocate(void* pointer, std::size_t bytes) noexcept {
  if (!pointer) return;
  const std::size_t size = detail::rounded(bytes == 0 ? 1 : bytes);
  detail::usage().in_use.fetch_sub(size, std::memory_order_relaxed);
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

// Bytes handed out by allocate() and not yet deallocated, and the most there were at once since
// the start or the last reset_peak() (which sets the peak to the bytes in use now).
inline std::size_t bytes_in_use() { return detail::usage().in_use.load(std::memory_order_relaxed); }
inline std::size_t peak_bytes_in_use() { return detail::usage().peak.load(std::memory_order_relaxed); }
inline void reset_peak() { detail::usage().peak.store(bytes_in_use(), std::memory_order_relaxed); }

}  // namespace host_memory
STRATA_NAMESPACE_END
