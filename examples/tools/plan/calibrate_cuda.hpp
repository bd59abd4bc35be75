// examples/tools/plan/calibrate_cuda.hpp: `strata-plan --calibrate` on a GPU (built where strata::cuda
// exists: plain C++ against the CUDA runtime and cuBLASLt, no CUDA compiler). It times, on GPU 0:
//   - each linear layer's three GEMMs as the layers call them, over the shapes of transformer layers
//     of hidden 1024 to 16384 at 4096, 8192 and 16384 tokens (rows m = tokens, n = outputs, k = inputs):
//     the forward y[m, n] = x W^T, the input gradient dx[m, k] = dy W and the weight gradient
//     dW[n, k] = dy^T x (into fp32, as the first micro-batch of a step writes it);
//       bf16 (strata::cuda::gemm, cuBLASLt): `gemm_tflops`;
//       FP8 (strata::cuda::fp8_gemm, cuBLASLt with per-tensor scales, where strata::cuda_kernels is
//       linked): the forward E4M3 x E4M3 into bf16, the gradients E5M2 x E4M3 (the hybrid format),
//       every GEMM in the TN layout the FP8 layers hand it (their casts write the transposed codes):
//       `fp8_gemm_tflops`;
//     each entry is the shape's 3 x 2 m n k FLOPs over the three GEMMs' summed time, keyed by the
//     forward's m x n x k, as the planner prices a layer (planner.hpp: 3 x the forward's FLOPs at the
//     rate of the forward's shape);
//   - a device-to-device copy of 1 GiB (read + write bytes over time): `elementwise_gbps` and
//     `optimizer_gbps`;
//   - with a second GPU that GPU 0 can reach directly, a 256 MiB peer copy (bytes over time) and a
//     4 KiB one (latency): `links.nvlink`;
//   - where strata::cudnn is built in, causal attention through cuDNN as the trainers call it (the
//     graphs of backend/cuda/cudnn_sdpa.hpp that attention_forward / attention_backward build:
//     forward and backward, bf16, q, k, v in the contiguous [s, b, heads, d] layout the grouped-query
//     layers hand it, 16 heads in 8 key/value groups, heads of 64 and of 128, 16K tokens a call or one
//     sequence beyond; the atomic backward of --no-deterministic-attention, and the deterministic one
//     of --deterministic-attention, the trainers' default, wherever its dP scratch fits in memory)
//     at sequence lengths 1K to 64K: `attention_tflops_by_length` (each entry with its head_dim and
//     backward), and `attention_tflops` at 1K with heads of 128 and the deterministic backward.
// Operands hold random values (bf16 in [-1, 1); FP8 codes below 2 in magnitude), which the tensor
// cores run slower than zeros. The rest (InfiniBand, overheads, reserve; NVLink on one GPU; FP8
// without the kernels library, attention without cuDNN) is kept from the base calibration, and
// `source` says which fields were measured. Times are the median of CUDA-event timings after warm-up
// calls; with a log stream, every GEMM's and attention call's time is written there as measured.
#pragma once

#ifdef STRATA_WITH_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <strata/backend/cuda/gemm.hpp>
#include <strata/backend/cuda/runtime.hpp>
#include <strata/core/dtype.hpp>

#if defined(STRATA_CUDA_KERNELS_LIBRARY) && STRATA_CUDA_KERNELS_LIBRARY
#include <strata/backend/cuda/fp8_gemm.hpp>
#define STRATA_PLAN_TIMES_FP8 1
#else
#define STRATA_PLAN_TIMES_FP8 0
#endif

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

// `bytes` of `to` filled with the bytes `pattern(i)` gives, i < 1 << 24, repeated (the pattern is
// copied up once, then doubled on the device).
template <class Pattern>
void fill_repeating(void* to, std::size_t bytes, cudaStream_t stream, Pattern&& pattern) {
  const std::size_t chunk = std::min<std::size_t>(bytes, std::size_t{1} << 24);
  std::vector<std::uint8_t> host(chunk);
  for (std::size_t i = 0; i < chunk; ++i) host[i] = pattern(i);
  auto* out = static_cast<std::uint8_t*>(to);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(out, host.data(), chunk, cudaMemcpyHostToDevice, stream));
  for (std::size_t done = chunk; done < bytes; done *= 2)
    STRATA_CUDA_CHECK(cudaMemcpyAsync(out + done, out, std::min(done, bytes - done), cudaMemcpyDeviceToDevice, stream));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// A 32-bit hash of i (splitmix-style): the random values of the operands.
inline std::uint32_t hash32(std::uint64_t i) {
  i += 0x9e3779b97f4a7c15ull;
  i = (i ^ (i >> 30)) * 0xbf58476d1ce4e5b9ull;
  i = (i ^ (i >> 27)) * 0x94d049bb133111ebull;
  return static_cast<std::uint32_t>((i ^ (i >> 31)) >> 16);
}

// bf16 values uniform in [-1, 1) (little-endian bytes).
inline void fill_random_bf16(strata::bf16* to, std::size_t count, cudaStream_t stream) {
  fill_repeating(to, count * sizeof(strata::bf16), stream, [](std::size_t byte) {
    const float x = static_cast<float>(hash32(byte / 2) & 0xffff) / 32768.0f - 1.0f;
    const std::uint16_t bits = strata::bf16(x).bits;
    return static_cast<std::uint8_t>(byte % 2 == 0 ? bits & 0xff : bits >> 8);
  });
}

// FP8 codes with the exponent's top bit clear: finite, below 2 in magnitude in E4M3 and E5M2 alike.
inline void fill_random_codes(std::uint8_t* to, std::size_t count, cudaStream_t stream) {
  fill_repeating(to, count, stream, [](std::size_t byte) { return static_cast<std::uint8_t>(hash32(byte) & 0xbf); });
}

inline std::string fixed(double x, int digits) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << x;
  return s.str();
}
}  // namespace detail

// Measures GPU 0 (and its link to GPU 1) over `base`; see the top. `log`: where each timing goes as
// it is measured (none without one).
inline Calibration calibrate_cuda(const Calibration& base, int iterations = 10, std::ostream* log = nullptr) {
  Calibration c = base;
  STRATA_CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp properties{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  c.name = std::string(properties.name) + " (strata-plan --calibrate)";
  strata::cuda::stream stream;
  strata::cuda::blas_handle blas;
  const auto say = [&](const std::string& line) {
    if (log) *log << line << std::endl;
  };

  // ---- GEMMs: a linear layer's forward, input gradient and weight gradient per shape ----
  // (outputs, inputs) of the qkv, output projection, fc1 and fc2 layers of hidden sizes 1024 to 16384
  const std::int64_t tokens[] = {4096, 8192, 16384};
  const std::int64_t widths[][2] = {{1024, 1024},   {3072, 1024},  {4096, 1024},  {1024, 4096},  {2048, 2048},
                                    {6144, 2048},   {8192, 2048},  {2048, 8192},  {3072, 3072},  {5120, 3072},
                                    {16384, 3072},  {3072, 8192},  {4096, 4096},  {12288, 4096}, {16384, 4096},
                                    {4096, 16384},  {8192, 8192},  {28672, 8192}, {8192, 28672}, {16384, 16384}};
  std::size_t largest = 0;  // elements of the largest operand or output of any shape
  for (std::int64_t m : tokens)
    for (const auto& [n, k] : widths)
      largest = std::max({largest, static_cast<std::size_t>(m * k), static_cast<std::size_t>(m * n), static_cast<std::size_t>(n * k)});
  std::vector<GemmPoint> bf16_points, fp8_points;
  {
    // Every operand is read from one random pool (the first at its start, the second at its middle).
    strata::cuda::device_buffer<strata::bf16> pool(2 * largest), out16(largest);
    strata::cuda::device_buffer<float> out32(largest);
    detail::fill_random_bf16(pool.data(), pool.size(), stream);
    const strata::bf16 *first = pool.data(), *second = pool.data() + largest;
#if STRATA_PLAN_TIMES_FP8
    strata::cuda::device_buffer<std::uint8_t> codes(2 * largest);
    detail::fill_random_codes(codes.data(), codes.size(), stream);
    const std::uint8_t *first8 = codes.data(), *second8 = codes.data() + largest;
    // Per-tensor inverse scales, 16-byte aligned as the layers' are (cudaMalloc aligns to 256).
    strata::cuda::device_buffer<float> scales(8);
    {
      const std::vector<float> ones(8, 1.0f);
      STRATA_CUDA_CHECK(cudaMemcpy(scales.data(), ones.data(), 8 * sizeof(float), cudaMemcpyHostToDevice));
    }
    const float *scale_a = scales.data(), *scale_b = scales.data() + 4;
    using strata::Fp8Format;
#endif
    for (std::int64_t m : tokens)
      for (const auto& [n, k] : widths) {
        const double flops = 2.0 * m * n * k;
        const auto rate = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
        const double forward = detail::median_ms(stream, iterations, [&] {
          strata::cuda::gemm<strata::bf16>(blas, stream, false, true, m, n, k, first, second, out16.data(), false);
        });
        const double input_gradient = detail::median_ms(stream, iterations, [&] {
          strata::cuda::gemm<strata::bf16>(blas, stream, false, false, m, k, n, first, second, out16.data(), false);
        });
        const double weight_gradient = detail::median_ms(stream, iterations, [&] {
          strata::cuda::gemm<strata::bf16, float>(blas, stream, true, false, n, k, m, first, second, out32.data(), false);
        });
        const double sum = forward + input_gradient + weight_gradient;
        bf16_points.push_back({m, n, k, std::min(c.peak_tflops, 3 * rate(sum))});
        say("gemm bf16 m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + ": forward " +
            detail::fixed(forward, 4) + " ms (" + detail::fixed(rate(forward), 0) + " TFLOP/s), input gradient " +
            detail::fixed(input_gradient, 4) + " ms (" + detail::fixed(rate(input_gradient), 0) + "), weight gradient " +
            detail::fixed(weight_gradient, 4) + " ms (" + detail::fixed(rate(weight_gradient), 0) + "); the three " +
            detail::fixed(3 * rate(sum), 0) + " TFLOP/s");
#if STRATA_PLAN_TIMES_FP8
        try {  // a shape cuBLASLt has no FP8 algorithm for is left out, and said
          const double forward8 = detail::median_ms(stream, iterations, [&] {
            strata::cuda::fp8_gemm<strata::bf16>(blas, stream, false, true, m, n, k, first8, Fp8Format::e4m3, scale_a, second8,
                                                 Fp8Format::e4m3, scale_b, out16.data(), false);
          });
          const double input_gradient8 = detail::median_ms(stream, iterations, [&] {  // dy [m, n] x (W^T) [k, n]
            strata::cuda::fp8_gemm<strata::bf16>(blas, stream, false, true, m, k, n, first8, Fp8Format::e5m2, scale_a, second8,
                                                 Fp8Format::e4m3, scale_b, out16.data(), false);
          });
          const double weight_gradient8 = detail::median_ms(stream, iterations, [&] {  // dy^T [n, m] x (x^T) [k, m]
            strata::cuda::fp8_gemm<float>(blas, stream, false, true, n, k, m, first8, Fp8Format::e5m2, scale_a, second8,
                                          Fp8Format::e4m3, scale_b, out32.data(), false);
          });
          const double sum8 = forward8 + input_gradient8 + weight_gradient8;
          fp8_points.push_back({m, n, k, std::min(2 * c.peak_tflops, 3 * rate(sum8))});
          say("gemm fp8 m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + ": forward " +
              detail::fixed(forward8, 4) + " ms (" + detail::fixed(rate(forward8), 0) + " TFLOP/s), input gradient " +
              detail::fixed(input_gradient8, 4) + " ms (" + detail::fixed(rate(input_gradient8), 0) + "), weight gradient " +
              detail::fixed(weight_gradient8, 4) + " ms (" + detail::fixed(rate(weight_gradient8), 0) + "); the three " +
              detail::fixed(3 * rate(sum8), 0) + " TFLOP/s");
        } catch (const std::exception& e) {
          say("gemm fp8 m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + ": left out (" + e.what() + ")");
        }
#endif
      }
  }
  c.gemm = bf16_points;
  std::string measured = "gemm_tflops (cuBLASLt bf16, a linear layer's forward, input and weight gradients at " +
                         std::to_string(c.gemm.size()) + " shapes)";
  if (!fp8_points.empty()) {
    c.fp8_gemm = fp8_points;
    measured += ", fp8_gemm_tflops (cuBLASLt FP8 with per-tensor scales, the same three GEMMs: E4M3 forward, E5M2 x E4M3 "
                "gradients, " + std::to_string(c.fp8_gemm.size()) + " shapes)";
  }
  {
    const std::size_t bytes = std::size_t{1} << 30;
    strata::cuda::device_buffer<std::uint8_t> from(bytes), to(bytes);
    const double ms = detail::median_ms(stream, iterations, [&] {
      STRATA_CUDA_CHECK(cudaMemcpyAsync(to.data(), from.data(), bytes, cudaMemcpyDeviceToDevice, stream));
    });
    c.elementwise_gbps = c.optimizer_gbps = 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
    measured += ", elementwise_gbps and optimizer_gbps (a 1 GiB device copy)";
    say("copy 1 GiB: " + detail::fixed(ms, 4) + " ms (" + detail::fixed(c.elementwise_gbps, 0) + " GB/s read + written)");
  }
#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
  {
    namespace sdpa = strata::cuda::sdpa;
    cudnnHandle_t handle = nullptr;
    STRATA_CUDNN_CHECK(cudnnCreate(&handle));
    STRATA_CUDNN_CHECK(cudnnSetStream(handle, stream));
    const std::int64_t heads = 16, groups = 8, per_call = 16384, longest = 65536;
    std::vector<AttentionPoint> points;
    int deterministic_lengths = 0, atomic_lengths = 0;
    for (const std::int64_t d : {64, 128}) {
      for (std::int64_t seq = 1024; seq <= longest; seq *= 2) {
        const std::int64_t b = std::max<std::int64_t>(1, per_call / seq), tokens = b * seq;
        const sdpa::shape x{seq, b, heads, groups, d, strata::AttentionStrides{}.resolved(heads, groups, d), true};
        const auto q_size = static_cast<std::size_t>(tokens * heads * d), kv_size = static_cast<std::size_t>(tokens * groups * d);
        // Both backwards as the trainers run them: the atomic one (--no-deterministic-attention), and the
        // deterministic one (the default) where its dP scratch (b heads s s bf16 on Hopper) fits beside
        // the tensors.
        std::size_t free_bytes = 0, total_bytes = 0;
        STRATA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        const double tensors = (4.0 * q_size + 4.0 * kv_size) * sizeof(strata::bf16) + 4.0 * b * heads * seq;
        sdpa::graph_entry forward, atomic, deterministic;
        try {
          forward = sdpa::build_forward<strata::bf16>(handle, x);
          atomic = sdpa::build_backward<strata::bf16>(handle, x, /*deterministic=*/false);
          deterministic = sdpa::build_backward<strata::bf16>(handle, x, /*deterministic=*/true);
          if (deterministic.refusal.empty() && double(deterministic.workspace_bytes) + tensors > 0.85 * double(free_bytes))
            deterministic.refusal = "its dP scratch (" + detail::fixed(double(deterministic.workspace_bytes) / (1 << 30), 1) +
                                    " GiB) does not fit";
        } catch (const std::exception& e) {
          forward.refusal = e.what();
        }
        if (!forward.refusal.empty() || !atomic.refusal.empty()) {  // cuDNN has no plan for this length here
          say("attention d=" + std::to_string(d) + " s=" + std::to_string(seq) + ": refused (" +
              (forward.refusal.empty() ? atomic.refusal : forward.refusal) + ")");
          continue;
        }
        if (!deterministic.refusal.empty())
          say("attention d=" + std::to_string(d) + " s=" + std::to_string(seq) + ": deterministic backward left out (" +
              deterministic.refusal + ")");
        const std::int64_t workspace_bytes = std::max<std::int64_t>(
            {forward.workspace_bytes, atomic.workspace_bytes, deterministic.refusal.empty() ? deterministic.workspace_bytes : 0, 1});
        strata::cuda::device_buffer<strata::bf16> q(q_size), k(kv_size), v(kv_size), o(q_size), dout(q_size), dq(q_size),
            dk(kv_size), dv(kv_size);
        strata::cuda::device_buffer<float> stats(static_cast<std::size_t>(b * heads * seq));
        strata::cuda::device_buffer<std::uint8_t> workspace(static_cast<std::size_t>(workspace_bytes));
        for (auto* buffer : {&q, &k, &v, &dout}) detail::fill_random_bf16(buffer->data(), buffer->size(), stream);
        try {  // a length cuDNN fails to run is left out, and said
          float scale = 1.0f / std::sqrt(static_cast<float>(d));
          std::unordered_map<std::int64_t, void*> pack = {
              {sdpa::kQ, q.data()},     {sdpa::kK, k.data()},         {sdpa::kV, v.data()},   {sdpa::kO, o.data()},
              {sdpa::kStats, stats.data()}, {sdpa::kScale, &scale},   {sdpa::kDO, dout.data()}, {sdpa::kDQ, dq.data()},
              {sdpa::kDK, dk.data()},   {sdpa::kDV, dv.data()}};
          const double forward_ms =
              detail::median_ms(stream, iterations, [&] { sdpa::execute(forward, handle, pack, workspace.data()); });
          const double flops = 2.0 * static_cast<double>(tokens) * seq * heads * d;  // causal forward: the planner's count
          for (const bool exact : {false, true}) {
            const sdpa::graph_entry& backward = exact ? deterministic : atomic;
            if (!backward.refusal.empty()) continue;
            const double backward_ms =
                detail::median_ms(stream, iterations, [&] { sdpa::execute(backward, handle, pack, workspace.data()); });
            const double tflops = 3.5 * flops / ((forward_ms + backward_ms) * 1e-3) / 1e12;
            points.push_back({seq, std::min(c.peak_tflops, tflops), d,
                              exact ? AttentionBackward::deterministic : AttentionBackward::atomic});
            (exact ? deterministic_lengths : atomic_lengths) += 1;
            say("attention d=" + std::to_string(d) + " s=" + std::to_string(seq) + " b=" + std::to_string(b) + ": forward " +
                detail::fixed(forward_ms, 4) + " ms (" + detail::fixed(flops / (forward_ms * 1e-3) / 1e12, 0) + " TFLOP/s), " +
                (exact ? "deterministic" : "atomic") + " backward " + detail::fixed(backward_ms, 4) + " ms (" +
                detail::fixed(2.5 * flops / (backward_ms * 1e-3) / 1e12, 0) + ", workspace " +
                detail::fixed(double(backward.workspace_bytes) / (1 << 20), 0) + " MiB); both " + detail::fixed(tflops, 0) +
                " TFLOP/s");
          }
        } catch (const std::exception& e) {
          say("attention d=" + std::to_string(d) + " s=" + std::to_string(seq) + ": left out (" + e.what() + ")");
        }
      }
    }
    cudnnDestroy(handle);
    if (!points.empty()) {
      // The table ascends in length within each head size and backward (the file's order).
      std::stable_sort(points.begin(), points.end(), [](const AttentionPoint& l, const AttentionPoint& r) {
        return std::make_tuple(l.head_dim, int(l.backward), l.seq) < std::make_tuple(r.head_dim, int(r.backward), r.seq);
      });
      c.attention_by_length = points;
      // The one rate: the trainers' default (deterministic) at heads of 128, the shortest length measured.
      c.attention_tflops = c.attention_tflops_at(1024, 128, /*deterministic=*/true);
      measured += ", attention_tflops and attention_tflops_by_length (cuDNN causal attention as the trainers call it, 16 heads in 8 "
                  "groups of 64 and of 128, lengths from 1K: " + std::to_string(atomic_lengths) + " with the atomic backward, " +
                  std::to_string(deterministic_lengths) + " with the deterministic one, where its dP scratch fits)";
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
