// tests/gpu/allocator_test.cu: the caching allocator of cuda::backend.
//
//   - the backend installs its allocator as current_device_resource() on the creating thread, and
//     install() does so on another thread;
//   - a training-like step (allocations of several sizes, norms, GEMM with bias, bias gradient,
//     embedding backward with its sort, sum of squares, all with their scratch memory) calls
//     cudaMalloc during the first step and not at all during a second identical one;
//   - every byte handed out comes back (bytes_in_use returns to its value before the step), the peak
//     of the second step equals the first, and release_cached() returns the cache to CUDA;
//   - a small copy from the host returns while the stream is still busy (it is staged in pinned
//     memory, not waited for), the caller may overwrite its host memory at once, and the device sees
//     the bytes of the call in stream order, through more copies than there are staging slots; a copy
//     larger than a slot still waits for its bytes.
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"

using namespace gpu_test;
using strata::cuda::backend;

namespace {

void step(const backend& device, index_t rows, index_t h, index_t vocab) {
  using T = bf16;
  using A = float;
  const auto R = static_cast<std::size_t>(rows), H = static_cast<std::size_t>(h), V = static_cast<std::size_t>(vocab);
  device_vector<T> x(R * H), y(R * H), dy(R * H), dx(R * H), g(H), b(H), w(H * H), out(R * H), table(V * H);
  device_vector<A> mean(R), rstd(R), dg(H), db(H), dw(H * H), dtable(V * H);
  device_vector<std::int32_t> tokens(R);
  device_vector<double> norm(1);
  device.fill(x.data(), rows * h, 0.5);
  device.fill(dy.data(), rows * h, 0.25);
  device.fill(g.data(), h, 1.0);
  device.fill(b.data(), h, 0.0);
  device.fill(w.data(), h * h, 0.01);
  device.fill(dw.data(), h * h, 0.0);
  device.fill(dtable.data(), vocab * h, 0.0);
  device.fill(norm.data(), 1, 0.0);
  STRATA_CUDA_CHECK(cudaMemsetAsync(tokens.data(), 0, R * sizeof(std::int32_t), device.stream()));
  device.layernorm_forward(x.data(), g.data(), b.data(), rows, h, A(1e-5), y.data(), mean.data(), rstd.data());
  device.gemm<T>(false, true, rows, h, h, y.data(), w.data(), out.data(), false, b.data());
  device.gemm<T, A>(true, false, h, h, rows, dy.data(), y.data(), dw.data(), true);
  device.bias_grad(dy.data(), rows, h, db.data());
  device.layernorm_backward(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), rows, h, dx.data(), dg.data(), db.data());
  device.embedding_backward(tokens.data(), rows, dy.data(), 0, vocab, h, dtable.data());
  device.sum_of_squares(dw.data(), h * h, norm.data());
  device.synchronize();
}

// Keeps the stream busy for about `ms` milliseconds.
__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

void busy(const backend& device, double ms) {
  int khz = 0;
  STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device.device()));
  spin_kernel<<<1, 1, 0, device.stream()>>>(static_cast<long long>(ms * khz));
  STRATA_CUDA_CHECK(cudaGetLastError());
}

// Staged copies from the host: they return before the stream has run, the host memory is free at
// once, and each copy's bytes are the ones of its call, in stream order.
void check_staged_copies(suite& results, const backend& device) {
  using strata::cuda::caching_allocator;
  constexpr std::size_t kCopies = 3 * caching_allocator::kStagingSlots + 1, kInts = 4096;
  device_vector<std::int32_t> landed(kCopies * kInts);
  std::vector<std::int32_t> host(kInts);
  busy(device, 200.0);
  const auto t0 = std::chrono::steady_clock::now();
  host.assign(kInts, 7);
  device.copy_from_host(host.data(), static_cast<index_t>(kInts), landed.data());
  const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const bool still_busy = cudaStreamQuery(device.stream()) == cudaErrorNotReady;
  results.record(still_busy && first_ms < 100.0,
                 "a copy from the host of " + std::to_string(kInts * 4) + " bytes returns while the stream is busy (" +
                     std::to_string(first_ms) + " ms; the stream " + (still_busy ? "still runs" : "had finished") + ")");
  // Overwrite the host memory right after each call; every copy must still land its own values.
  for (std::size_t c = 1; c < kCopies; ++c) {
    for (std::size_t i = 0; i < kInts; ++i) host[i] = static_cast<std::int32_t>(c * 100000 + i);
    device.copy_from_host(host.data(), static_cast<index_t>(kInts), landed.data() + c * kInts);
    host.assign(kInts, -1);
  }
  std::vector<std::int32_t> back(kCopies * kInts);
  device.copy_to_host(landed.data(), static_cast<index_t>(kCopies * kInts), back.data());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < kInts; ++i) wrong += back[i] != 7;
  for (std::size_t c = 1; c < kCopies; ++c)
    for (std::size_t i = 0; i < kInts; ++i) wrong += back[c * kInts + i] != static_cast<std::int32_t>(c * 100000 + i);
  results.record(wrong == 0, std::to_string(kCopies) + " staged copies through " +
                                 std::to_string(caching_allocator::kStagingSlots) + " slots, the host memory overwritten " +
                                 "after each call: " + std::to_string(wrong) + " wrong values on the device");
  // A copy larger than a slot waits for its bytes (and so for the work before it).
  const std::size_t large = caching_allocator::kStagingBytes / sizeof(std::int32_t) + 1;
  device_vector<std::int32_t> big(large);
  std::vector<std::int32_t> big_host(large, 3);
  busy(device, 50.0);
  device.copy_from_host(big_host.data(), static_cast<index_t>(large), big.data());
  results.record(cudaStreamQuery(device.stream()) == cudaSuccess,
                 "a copy from the host larger than a staging slot returns after the stream's earlier work and its bytes");
}

}  // namespace

int main() {
  try {
    suite results("allocator");
    backend device(0);
    results.record(strata::current_device_resource() == &device.allocator(),
                   "the backend installs its allocator as the creating thread's current_device_resource()");
    bool other_thread = false;
    std::thread worker([&] {
      device.install();
      other_thread = strata::current_device_resource() == &device.allocator();
    });
    worker.join();
    results.record(other_thread, "install() makes the allocator current on another thread");

    const auto before = device.memory_stats();
    step(device, 1000, 769, 300);
    const auto first = device.memory_stats();
    step(device, 1000, 769, 300);
    const auto second = device.memory_stats();
    results.record(first.malloc_calls > before.malloc_calls,
                   "first step: " + std::to_string(first.malloc_calls - before.malloc_calls) + " cudaMalloc calls fill the cache");
    results.record(second.malloc_calls == first.malloc_calls,
                   "second identical step: " + std::to_string(second.malloc_calls - first.malloc_calls) +
                       " cudaMalloc calls (expected 0), " + std::to_string(second.allocations - first.allocations) +
                       " allocations served from the cache");
    results.record(first.bytes_in_use == before.bytes_in_use && second.bytes_in_use == before.bytes_in_use,
                   "every byte handed out during a step comes back (" + std::to_string(second.bytes_in_use) +
                       " bytes in use after, " + std::to_string(before.bytes_in_use) + " before)");
    results.record(second.peak_bytes_in_use == first.peak_bytes_in_use && first.peak_bytes_in_use > before.bytes_in_use,
                   "peak bytes in use: " + std::to_string(first.peak_bytes_in_use) + " after step 1, " +
                       std::to_string(second.peak_bytes_in_use) + " after step 2");
    results.record(second.bytes_reserved == first.bytes_reserved,
                   "bytes reserved from CUDA unchanged by the second step (" + std::to_string(second.bytes_reserved) + ")");
    // A long-lived block (a backend's workspace) never takes a cached block a step will want again.
    {
      auto& memory = device.allocator();
      void* cached = memory.allocate(4096);
      memory.deallocate(cached, 4096);  // a 4096-byte block now waits in the cache
      const auto ahead = device.memory_stats();
      void* kept = memory.allocate_long_lived(4096);
      void* again = memory.allocate(4096);
      const auto after = device.memory_stats();
      results.record(kept != cached && again == cached && after.malloc_calls == ahead.malloc_calls + 1,
                     "allocate_long_lived takes a fresh block (" + std::to_string(after.malloc_calls - ahead.malloc_calls) +
                         " cudaMalloc) and leaves the cached block of its size to the next allocate");
      memory.deallocate(again, 4096);
      memory.deallocate(kept, 4096);
    }
    check_staged_copies(results, device);
    // A different shape needs new blocks; the old ones stay cached until released.
    step(device, 333, 129, 50);
    device.allocator().release_cached();
    const auto released = device.memory_stats();
    results.record(released.bytes_reserved == released.bytes_in_use && released.free_calls > 0,
                   "release_cached() returns every cached block (" + std::to_string(released.free_calls) + " cudaFree calls, " +
                       std::to_string(released.bytes_reserved) + " bytes still reserved)");
    return results.finish();
  } catch (const std::exception& e) {
    std::printf("FAIL allocator: exception: %s\nSUITE allocator: aborted\n", e.what());
    return 2;
  }
}
