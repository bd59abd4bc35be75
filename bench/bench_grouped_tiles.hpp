// bench/bench_grouped_tiles.hpp: what bench_grouped_tiles.cu and its kernel units share (no CUTLASS
// here): a candidate kernel of the Hopper device-count grouped GEMM, rows form, by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <strata/backend/cuda/allocator.hpp>

namespace strata_bench {

using rows_call = void (*)(cudaStream_t stream, strata::device_memory_resource& memory, strata::index_t groups,
                           const std::int32_t* counts, strata::index_t rows, strata::index_t n, strata::index_t k,
                           const strata::bf16* a, const strata::bf16* const* b, strata::bf16* c);

struct tile_candidate {
  std::string name;  // e.g. "c128x256/1x2": schedule (c cooperative, p pingpong), tile, cluster
  rows_call run;
};

// The candidates for B [n, k] (the forward: fc1, fc2) and B [k, n] (the input gradient).
std::vector<tile_candidate> candidates_nt();
std::vector<tile_candidate> candidates_nn();

}  // namespace strata_bench
