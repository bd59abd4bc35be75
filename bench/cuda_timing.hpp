// bench/cuda_timing.hpp: what the CUDA benchmark programs share: a CUDA status check that names the
// program and the call, and the median time of a call on the backend's stream (CUDA events, 3
// warm-up calls). Benchmarks measure; nothing here asserts a time.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include <strata/backend/cuda/backend.cuh>

namespace strata_bench {

// Exits with status 2, naming `program` and `what`, when `status` is not cudaSuccess.
inline void check_cuda(cudaError_t status, const char* program, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s failed: %s\n", program, what, cudaGetErrorString(status));
    std::exit(2);
  }
}

// The median over `iterations` calls of `call`'s time on the device's stream, in milliseconds.
inline double median_ms(const strata::cuda::backend& device, int iterations, const std::function<void()>& call,
                        const char* program) {
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), program, "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), program, "cudaEventCreate");
  for (int i = 0; i < 3; ++i) call();
  std::vector<double> times;
  for (int i = 0; i < iterations; ++i) {
    check_cuda(cudaEventRecord(start, device.stream()), program, "cudaEventRecord");
    call();
    check_cuda(cudaEventRecord(stop, device.stream()), program, "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), program, "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), program, "cudaEventElapsedTime");
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return times[times.size() / 2];
}

}  // namespace strata_bench
