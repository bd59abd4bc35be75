// bench/bench_grouped_tiles_kernels.cuh: the candidate tiles of bench_grouped_tiles, instantiated for
// one operand layout by bench_grouped_tiles_nt.cu and bench_grouped_tiles_nn.cu (two units, so a
// parallel build compiles them at once).
#pragma once

#include <string>
#include <vector>

#include <strata/backend/cuda/library/cutlass/grouped_gemm_sm90_kernel.cuh>

#include "bench_grouped_tiles.hpp"

namespace strata_bench {

template <template <class> class Layout, class C>
tile_candidate candidate() {
  const std::string name = std::string(C::kPingpong ? "p" : "c") + std::to_string(C::kTileM) + "x" +
                           std::to_string(C::kTileN) + "/" + std::to_string(C::kClusterM) + "x" +
                           std::to_string(C::kClusterN);
  return {name, [](cudaStream_t stream, strata::device_memory_resource& memory, strata::index_t groups,
                   const std::int32_t* counts, strata::index_t rows, strata::index_t n, strata::index_t k,
                   const strata::bf16* a, const strata::bf16* const* b, strata::bf16* c) {
            strata::cuda::sm90::kernel::run_rows<Layout<C>>(stream, memory, groups, counts, rows, n, k, a, b, c);
          }};
}

template <template <class> class Layout>
std::vector<tile_candidate> all_candidates() {
  using strata::cuda::sm90::kernel::Config;
  return {candidate<Layout, Config<128, 256, 1, 2, false>>(),  // the library's until measured otherwise
          candidate<Layout, Config<128, 256, 2, 1, false>>(),
          candidate<Layout, Config<128, 256, 1, 1, false>>(),
          candidate<Layout, Config<256, 128, 2, 1, false>>(),
          candidate<Layout, Config<256, 128, 1, 2, false>>(),
          candidate<Layout, Config<128, 128, 1, 2, false>>(),
          candidate<Layout, Config<128, 128, 2, 1, false>>(),
          candidate<Layout, Config<128, 128, 2, 1, true>>(),
          candidate<Layout, Config<128, 128, 1, 2, true>>(),
          candidate<Layout, Config<64, 256, 1, 2, true>>()};
}

}  // namespace strata_bench
