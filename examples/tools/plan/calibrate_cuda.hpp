// examples/tools/plan/calibrate_cuda.hpp: `strata-plan --calibrate` on a GPU (built where strata::cuda
// exists: plain C++ against the CUDA runtime and cuBLASLt, no CUDA compiler). It times, on GPU 0:
//   - bf16 GEMMs (strata::cuda::gemm, cuBLASLt) over the shapes of transformer layers from hidden
//     1024 to 16384 at 4096 and 16384 tokens: the `gemm_tflops` table;
//   - a device-to-device copy of 1 GiB (read + write bytes over time): `elementwise_gbps` and
//     `optimizer_gbps`;
//   - with a second GPU that GPU 0 can reach directly, a 256 MiB peer copy (bytes over time) and a
//     4 KiB one (latency): `links.nvlink`.
// The rest (attention, InfiniBand, overheads, reserve; NVLink on one GPU) is kept from the base
// calibration, and `source` says which fields were measured. Times are the median of CUDA-event
// timings after warm-up calls. Run on one H200 (bench/calibration/h200_measured.json).
#pragma once

#ifdef STRATA_WITH_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <strata/backend/cuda/gemm.hpp>
#include <strata/backend/cuda/runtime.hpp>
#include <strata/core/dtype.hpp>

#include "calibration.hpp"

namespace plan {

inline int visible_cuda_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

namespace detail {
// Median milliseconds of `call` enqueued on `stream`, after 3 warm-up calls.
inline double median_ms(cudaStream_t stream, int iterations, const std::function<void()>& call) {
  cudaEvent_t start = nullptr, stop = nullptr;
  STRATA_CUDA_CHECK(cudaEventCreate(&start));
  STRATA_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) call();
  std::vector<double> times;
  for (int i = 0; i < iterations; ++i) {
    STRATA_CUDA_CHECK(cudaEventRecord(start, stream));
    call();
    STRATA_CUDA_CHECK(cudaEventRecord(stop, stream));
    STRATA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}
}  // namespace detail

// Measures GPU 0 (and its link to GPU 1) over `base`; see the top.
inline Calibration calibrate_cuda(const Calibration& base, int iterations = 10) {
  Calibration c = base;
  STRATA_CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp properties{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  c.name = std::string(properties.name) + " (strata-plan --calibrate)";
  strata::cuda::stream stream;
  strata::cuda::blas_handle blas;
  c.gemm.clear();
  const std::int64_t tokens[] = {4096, 16384};
  const std::int64_t widths[][2] = {{1024, 1024}, {3072, 1024}, {4096, 1024}, {4096, 4096}, {12288, 4096}, {16384, 4096},
                                    {4096, 16384}, {8192, 8192}, {28672, 8192}, {8192, 28672}, {16384, 16384}};
  for (std::int64_t m : tokens)
    for (const auto& [n, k] : widths) {
      strata::cuda::device_buffer<strata::bf16> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)),
          out(static_cast<std::size_t>(m * n));
      STRATA_CUDA_CHECK(cudaMemsetAsync(a.data(), 0, a.size() * sizeof(strata::bf16), stream));
      STRATA_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, b.size() * sizeof(strata::bf16), stream));
      const double ms = detail::median_ms(stream, iterations, [&] {
        strata::cuda::gemm<strata::bf16>(blas, stream, false, false, m, n, k, a.data(), b.data(), out.data(), false);
      });
      c.gemm.push_back({m, n, k, std::min(c.peak_tflops, 2.0 * m * n * k / (ms * 1e-3) / 1e12)});
    }
  std::string measured = "gemm_tflops (cuBLASLt bf16, " + std::to_string(c.gemm.size()) + " shapes)";
  {
    const std::size_t bytes = std::size_t{1} << 30;
    strata::cuda::device_buffer<std::uint8_t> from(bytes), to(bytes);
    const double ms = detail::median_ms(stream, iterations, [&] {
      STRATA_CUDA_CHECK(cudaMemcpyAsync(to.data(), from.data(), bytes, cudaMemcpyDeviceToDevice, stream));
    });
    c.elementwise_gbps = c.optimizer_gbps = 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
    measured += ", elementwise_gbps and optimizer_gbps (a 1 GiB device copy)";
  }
  int can_reach = 0;
  if (visible_cuda_devices() > 1 && cudaDeviceCanAccessPeer(&can_reach, 0, 1) == cudaSuccess && can_reach) {
    (void)cudaDeviceEnablePeerAccess(1, 0);
    (void)cudaGetLastError();  // already enabled is fine
    const std::size_t large = std::size_t{256} << 20, small = 4096;
    strata::cuda::device_buffer<std::uint8_t> here(large);
    STRATA_CUDA_CHECK(cudaSetDevice(1));
    strata::cuda::device_buffer<std::uint8_t> there(large);
    STRATA_CUDA_CHECK(cudaSetDevice(0));
    auto copy = [&](std::size_t bytes) {
      return detail::median_ms(stream, iterations, [&] {
        STRATA_CUDA_CHECK(cudaMemcpyPeerAsync(there.data(), 1, here.data(), 0, bytes, stream));
      });
    };
    const double latency_ms = copy(small), large_ms = copy(large);
    c.nvlink.latency_us = latency_ms * 1e3;
    c.nvlink.bus_gbps = static_cast<double>(large) / (std::max(large_ms - latency_ms, large_ms * 0.1) * 1e-3) / 1e9;
    measured += ", links.nvlink (a 256 MiB and a 4 KiB peer copy from GPU 0 to GPU 1)";
  }
  c.source = "strata-plan --calibrate on this machine: " + measured + "; every other field from " + base.name;
  return c;
}

}  // namespace plan

#endif  // STRATA_WITH_CUDA
