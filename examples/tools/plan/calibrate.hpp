// examples/tools/plan/calibrate.hpp: `strata-plan --calibrate` on the CPU backend: times GEMM shapes
// (strata::cpu::gemm, float), causal attention's two GEMM shapes, a memory-bound pass, and the
// in-process communicator's all-gather between threads (its bus bandwidth and latency, standing
// for both link kinds), and writes them as a calibration (calibration.hpp). It describes the CPU
// path that CI runs; calibrate_cuda.hpp measures a GPU.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <strata/backend/cpu/gemm.hpp>
#include <strata/comm.hpp>

#include "calibration.hpp"

namespace plan {

struct CalibrateOptions {
  int ranks = 2;                                        // threads of the collective measurements
  std::vector<std::int64_t> sizes{64, 128, 256};        // GEMM dimensions (every m x n x k of them)
  std::int64_t elementwise_elements = std::int64_t{1} << 22;
  std::vector<std::int64_t> collective_bytes{std::int64_t{1} << 12, std::int64_t{1} << 22};  // small (latency) and large (bandwidth)
  double seconds_per_measurement = 0.05;
};

namespace detail {
// The best of repeated timings of `f` over about `budget` seconds (at least 3 runs).
template <class F>
double best_seconds(F&& f, double budget) {
  using clock = std::chrono::steady_clock;
  double best = 1e300, spent = 0;
  for (int i = 0; i < 3 || spent < budget; ++i) {
    const auto start = clock::now();
    f();
    const double s = std::chrono::duration<double>(clock::now() - start).count();
    best = std::min(best, s);
    spent += s;
    if (i > 1000) break;
  }
  return best;
}
}  // namespace detail

inline Calibration calibrate_cpu(const CalibrateOptions& o = {}) {
  Calibration c;
  c.name = "CPU backend (Eigen, float) and the in-process communicator, threads of one process";
  c.source = "strata-plan --calibrate on this machine";
  double peak = 0;
  for (std::int64_t m : o.sizes)
    for (std::int64_t n : o.sizes)
      for (std::int64_t k : o.sizes) {
        std::vector<float> a(static_cast<std::size_t>(m * k), 0.5f), b(static_cast<std::size_t>(k * n), 0.25f),
            out(static_cast<std::size_t>(m * n));
        const double s = detail::best_seconds(
            [&] { strata::cpu::gemm<float>(false, false, m, n, k, a.data(), b.data(), out.data(), false); }, o.seconds_per_measurement);
        const double tflops = 2.0 * m * n * k / s / 1e12;
        c.gemm.push_back({m, n, k, tflops});
        peak = std::max(peak, tflops);
      }
  c.peak_tflops = peak;
  // Attention: its score and value products (t x t x d and t x d x t) at the largest size, causal
  // half of the work, forward + backward as 3.5 forwards of the same rate.
  {
    const std::int64_t t = o.sizes.back(), d = std::max<std::int64_t>(16, o.sizes.front());
    std::vector<float> q(static_cast<std::size_t>(t * d), 0.5f), k(static_cast<std::size_t>(t * d), 0.5f),
        scores(static_cast<std::size_t>(t * t)), out(static_cast<std::size_t>(t * d));
    const double s = detail::best_seconds(
        [&] {
          strata::cpu::gemm<float>(false, true, t, t, d, q.data(), k.data(), scores.data(), false);
          strata::cpu::gemm<float>(false, false, t, d, t, scores.data(), k.data(), out.data(), false);
        },
        o.seconds_per_measurement);
    c.attention_tflops = std::min(peak, 4.0 * t * t * d / s / 1e12);
  }
  // Memory-bound: y = x + y over a buffer larger than the caches (12 bytes per element moved).
  {
    std::vector<float> x(static_cast<std::size_t>(o.elementwise_elements), 1.0f), y(x.size(), 2.0f);
    const double s = detail::best_seconds(
        [&] {
          for (std::size_t i = 0; i < y.size(); ++i) y[i] += x[i];
        },
        o.seconds_per_measurement);
    c.elementwise_gbps = 12.0 * static_cast<double>(x.size()) / s / 1e9;
    c.optimizer_gbps = c.elementwise_gbps;
  }
  // All-gather over `ranks` threads: latency from the small size, bus bandwidth from the large one.
  std::vector<double> seconds;
  for (std::int64_t bytes : o.collective_bytes) {
    const std::size_t total = static_cast<std::size_t>(bytes) / sizeof(float);
    const std::size_t block = std::max<std::size_t>(1, total / static_cast<std::size_t>(o.ranks));
    double measured = 0;
    strata::inprocess::run(o.ranks, [&](strata::inprocess::communicator& comm) {
      // Every rank runs the same number of collectives: rank 0 decides it from a first timing.
      std::vector<float> in(block, 1.0f), out(block * static_cast<std::size_t>(o.ranks));
      const auto start = std::chrono::steady_clock::now();
      comm.all_gather(std::span<const float>(in), std::span<float>(out));
      std::vector<double> first{std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
      comm.broadcast(std::span<double>(first), 0);
      const int rounds = std::clamp(static_cast<int>(o.seconds_per_measurement / std::max(first[0], 1e-9)), 3, 1000);
      double best = 1e300;
      for (int i = 0; i < rounds; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        comm.all_gather(std::span<const float>(in), std::span<float>(out));
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      if (comm.rank() == 0) measured = best;
    });
    seconds.push_back(measured);
  }
  const double latency = seconds.front();
  const double large = static_cast<double>(o.collective_bytes.back());
  const double transfer = std::max(seconds.back() - latency, seconds.back() * 0.1);
  c.nvlink.latency_us = c.infiniband.latency_us = latency * 1e6;
  c.nvlink.bus_gbps = c.infiniband.bus_gbps = large * (o.ranks - 1) / o.ranks / transfer / 1e9;
  c.step_overhead_ms = 0;
  c.moe_host_ms_per_layer = 0;
  c.runtime_reserve_gib = 0;
  return c;
}

}  // namespace plan
