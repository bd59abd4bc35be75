// bench/experts_bench.hpp: what the MoE experts' GEMM benchmarks share (bench_grouped_gemm,
// bench_grouped_tiles): the expert count, device arrays of initialized-looking values, and the rows
// each expert gets, balanced or skewed. Measures nothing itself.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "cuda_timing.hpp"

namespace strata_bench {

inline constexpr strata::index_t kBenchExperts = 8;

// n elements of normal values (stddev 0.02, as initialized weights), so the tensor cores see varied
// bits; `program` names the caller in an error.
template <class V>
V* normal_device_array(const strata::cuda::backend& device, std::size_t n, std::uint64_t key, const char* program) {
  V* p = nullptr;
  check_cuda(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(V)), program, "cudaMalloc");
  const auto count = static_cast<strata::index_t>(n);
  device.init_normal(p, count, strata::GlobalIndexMap{count, count, 0}, key, 0.02);
  return p;
}

// Rows per expert: an even split, or one expert with 40% and an even split of the rest.
inline std::vector<strata::index_t> expert_rows(strata::index_t rows, bool skewed) {
  using strata::index_t;
  std::vector<index_t> out(kBenchExperts);
  const index_t first = skewed ? rows * 2 / 5 : 0, rest = rows - first;
  const index_t others = skewed ? kBenchExperts - 1 : kBenchExperts;
  for (index_t e = 0; e < others; ++e) out[static_cast<std::size_t>(e + (skewed ? 1 : 0))] = rest / others;
  if (skewed) out[0] = first;
  out.back() += rows - std::accumulate(out.begin(), out.end(), index_t{0});  // the remainder
  return out;
}

}  // namespace strata_bench
