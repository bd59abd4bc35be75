// tests/gpu/allocator_test.cu: the caching allocator of cuda::backend.
//
//   - the backend installs its allocator as current_device_resource() on the creating thread, and
//     install() does so on another thread;
//   - a training-like step (allocations of several sizes, norms, GEMM with bias, bias gradient,
//     embedding backward with its sort, sum of squares, all with their scratch memory) calls
//     cudaMalloc during the first step and not at all during a second identical one;
//   - every byte handed out comes back (bytes_in_use returns to its value before the step), the peak
//     of the second step equals the first, and release_cached() returns the cache to CUDA.
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
