// strata/backend/cuda/grouped_gemm_sm90.hpp: the MoE experts' grouped GEMMs on Hopper whose group
// sizes stay in device memory (CUTLASS's sm90 ptr-array grouped kernels, TMA + warp-specialized
// GMMA), so a dropless dispatch never waits for the host. bf16 operands, fp32 accumulation.
//
//   rows     C[rows, n] = A[rows, k] op(B_g), the rows taken in consecutive groups of counts[g]
//            (B_g [n, k] with transpose_b, else [k, n]; C bf16), C's rows past the counts' total
//            zero: the experts' forward and the gradient of their inputs
//   weights  C_g[m, n] (+)= A_g^T B_g, A_g and B_g group g's rows of A [rows, m] and B [rows, n]
//            (C_g float): the experts' weight gradients, the reduction over a group's tokens
//
// `counts` is a device array of `groups` int32; the sizes of the problems, their pointers and strides
// are written on the device by one small kernel (whose other blocks zero the rows form's rows past
// the total), then CUTLASS's persistent group scheduler walks the tiles (an empty group has none). The
// GEMM of `rows` reads no row past the counts' total. `weights` with
// `accumulate` leaves an empty group's C_g alone; without, it writes every C_g without reading it
// (beta 0), an empty group's with zeros (a small kernel reads the counts on the device).
//
// Each returns false, enqueuing nothing, when it does not take the call: strata::cuda_kernels built
// without CUTLASS (STRATA_WITH_CUTLASS unset), a GPU other than sm_90, more than kSm90MaxGroups
// groups, sizes that are not multiples of 8 or pointers that are not 16-byte aligned (TMA's rules).
// The caller (cuda::grouped_gemm_rows / grouped_gemm_weights in grouped_gemm.hpp) then runs its
// fallback. Memory (the problem tables and CUTLASS's workspace) comes from `memory`, given back once
// the work is enqueued (reuse is ordered on the stream).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../../core/dtype.hpp"
#include "../../core/shape.hpp"
#include "allocator.hpp"

STRATA_NAMESPACE_BEGIN
namespace cuda::sm90 {

inline constexpr index_t kSm90MaxGroups = 256;

#if defined(STRATA_WITH_CUTLASS) && STRATA_WITH_CUTLASS
// Whether the kernels run here: compiled in, the current GPU is sm_90, and STRATA_DISABLE_CUTLASS=1
// is not set (the switch that measures the fallback in the same build).
bool grouped_gemm_ready();
#else
inline bool grouped_gemm_ready() { return false; }
#endif

// The tiles the rows form is compiled with (c: cooperative schedule, p: pingpong; tile M x N; cluster
// M x N). `automatic` takes STRATA_SM90_ROWS_TILE when it names one (to measure them in one build;
// any other value fails, naming the choices), else automatic_rows_tile's choice by size.
enum class rows_tile { automatic, c128x256_1x2, c128x256_2x1, c128x128_1x2, p128x128_2x1 };
inline constexpr rows_tile kRowsTiles[] = {rows_tile::c128x256_1x2, rows_tile::c128x256_2x1, rows_tile::c128x128_1x2,
                                           rows_tile::p128x128_2x1};
inline const char* rows_tile_name(rows_tile tile) {
  switch (tile) {
    case rows_tile::automatic: return "automatic";
    case rows_tile::c128x256_1x2: return "c128x256_1x2";
    case rows_tile::c128x256_2x1: return "c128x256_2x1";
    case rows_tile::c128x128_1x2: return "c128x128_1x2";
    case rows_tile::p128x128_2x1: return "p128x128_2x1";
  }
  return "?";
}

// The tile `automatic` runs without STRATA_SM90_ROWS_TILE, by the mean rows a group holds (`rows`,
// the rows the GEMM covers, over the groups): 128 x 128 tiles in clusters of 2 along N up to 256 rows
// a group, where a 128 x 256 tile's second half would mostly compute rows past a group's end; the
// 128 x 256 tiles above. Measured on an H100 with the experts' three GEMMs at hidden 1024 and 8
// experts (bench_grouped_tiles; bench/RESULTS.md): at 64, 128 and 256 rows a group the 128 x 128
// tile ran 1.2-2.2x the per-expert cuBLASLt loop, and up to 1.4x the 128 x 256 tile (fc2 and dX);
// at 512 rows and more the 128 x 256 tile was the faster (fc1 1.03x against 0.95x the loop at 512).
inline rows_tile automatic_rows_tile(index_t rows, index_t groups) {
  return groups > 0 && rows <= 256 * groups ? rows_tile::c128x128_1x2 : rows_tile::c128x256_1x2;
}

bool grouped_gemm_rows(cudaStream_t stream, device_memory_resource& memory, bool transpose_b, index_t groups,
                       const std::int32_t* counts, index_t rows, index_t n, index_t k, const bf16* a,
                       const bf16* const* b, bf16* c, rows_tile tile = rows_tile::automatic);

bool grouped_gemm_weights(cudaStream_t stream, device_memory_resource& memory, index_t groups, const std::int32_t* counts,
                          index_t m, index_t n, const bf16* a, const bf16* b, float* const* c, bool accumulate);

}  // namespace cuda::sm90
STRATA_NAMESPACE_END
