// examples/tools/plan/calibrate_cuda.hpp: `strata-plan --calibrate` on a GPU (built where strata::cuda
// exists: plain C++ against the CUDA runtime and cuBLASLt, no CUDA compiler). It times, on GPU 0:
//   - bf16 GEMMs (strata::cuda::gemm, cuBLASLt) over the shapes of transformer layers from hidden
//     1024 to 16384 at 4096 and 16384 tokens: the `gemm_tflops` table;
//   - a device-to-device copy of 1 GiB (read + write bytes over time): `elementwise_gbps` and
//     `optimizer_gbps`;
//   - with a second GPU that GPU 0 can reach directly, a 256 MiB peer copy (bytes over time) and a
//     4 KiB one (latency): `links.nvlink`.
//   - where strata::cudnn is built in, causal attention through cuDNN (forward and backward, bf16,
//     16 heads in 8 key/value groups of 128, the non-deterministic backward, 64K tokens a call) at
//     sequence lengths 1K to 64K: `attention_tflops_by_length` (and `attention_tflops` at 1K).
// The rest (InfiniBand, overheads, reserve; NVLink on one GPU; attention without cuDNN) is kept
// from the base calibration, and `source` says which fields were measured. Times are the median of
// CUDA-event timings after warm-up calls. Run on one H200 (bench/calibration/h200_measured.json).
#pragma once

#ifdef STRATA_WITH_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <strata/backend/cuda/gemm.hpp>
#include <strata/backend/cuda/runtime.hpp>
#include <strata/core/dtype.hpp>

#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
#include <unordered_map>

#include <strata/backend/cuda/cudnn_sdpa.hpp>
#endif

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
#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
  {
    namespace sdpa = strata::cuda::sdpa;
    cudnnHandle_t handle = nullptr;
    STRATA_CUDNN_CHECK(cudnnCreate(&handle));
    STRATA_CUDNN_CHECK(cudnnSetStream(handle, stream));
    const std::int64_t heads = 16, groups = 8, d = 128, tokens = 65536;
    std::vector<AttentionPoint> points;
    for (std::int64_t seq = 1024; seq <= tokens; seq *= 2) {
      const std::int64_t b = tokens / seq;
      const sdpa::shape x{seq, b, heads, groups, d, strata::AttentionStrides{}.resolved(heads, groups, d), true};
      sdpa::graph_entry forward, backward;
      try {
        forward = sdpa::build_forward<strata::bf16>(handle, x);
        backward = sdpa::build_backward<strata::bf16>(handle, x, /*deterministic=*/false);
      } catch (const std::exception& e) {
        forward.refusal = e.what();
      }
      if (!forward.refusal.empty() || !backward.refusal.empty()) continue;  // cuDNN has no plan for this length here
      const auto q_size = static_cast<std::size_t>(tokens * heads * d), kv_size = static_cast<std::size_t>(tokens * groups * d);
      strata::cuda::device_buffer<strata::bf16> q(q_size), k(kv_size), v(kv_size), o(q_size), dout(q_size), dq(q_size),
          dk(kv_size), dv(kv_size);
      strata::cuda::device_buffer<float> stats(static_cast<std::size_t>(b * heads * seq));
      strata::cuda::device_buffer<std::uint8_t> workspace(
          static_cast<std::size_t>(std::max<std::int64_t>({forward.workspace_bytes, backward.workspace_bytes, 1})));
      for (auto* buffer : {&q, &k, &v, &dout})
        STRATA_CUDA_CHECK(cudaMemsetAsync(buffer->data(), 0, buffer->size() * sizeof(strata::bf16), stream));
      float scale = 1.0f / std::sqrt(static_cast<float>(d));
      std::unordered_map<std::int64_t, void*> pack = {
          {sdpa::kQ, q.data()},     {sdpa::kK, k.data()},         {sdpa::kV, v.data()},   {sdpa::kO, o.data()},
          {sdpa::kStats, stats.data()}, {sdpa::kScale, &scale},   {sdpa::kDO, dout.data()}, {sdpa::kDQ, dq.data()},
          {sdpa::kDK, dk.data()},   {sdpa::kDV, dv.data()}};
      const double ms = detail::median_ms(stream, iterations, [&] {
        sdpa::execute(forward, handle, pack, workspace.data());
        sdpa::execute(backward, handle, pack, workspace.data());
      });
      const double flops = 3.5 * 2.0 * static_cast<double>(tokens) * seq * heads * d;  // the planner's count (causal)
      points.push_back({seq, std::min(c.peak_tflops, flops / (ms * 1e-3) / 1e12)});
    }
    cudnnDestroy(handle);
    if (!points.empty()) {
      c.attention_by_length = points;
      c.attention_tflops = points.front().tflops;
      measured += ", attention_tflops and attention_tflops_by_length (cuDNN causal attention, 16 heads of 128 in 8 groups, " +
                  std::to_string(points.size()) + " lengths from " + std::to_string(points.front().seq) + ")";
    }
  }
#endif
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
