// strata::cuda_kernels with CUTLASS: the Hopper grouped GEMMs of grouped_gemm_sm90.hpp, whose group
// sizes are read on the device (the kernels, tables and launch: grouped_gemm_sm90_kernel.cuh).
// Compiled only when CMake finds CUTLASS 3.x headers (STRATA_CUTLASS_DIR, or the nvidia-cutlass
// Python package) and the library is built for sm_90.
#include <cstdlib>
#include <string>

#include "grouped_gemm_sm90_kernel.cuh"

STRATA_NAMESPACE_BEGIN
namespace cuda::sm90 {
namespace {

using namespace kernel;

// The rows forms' tiles (rows_tile; automatic_rows_tile chooses by size). For large groups: 128x256x64
// tiles, clusters of 2 along N (the A tile shared by a row tile's two N tiles is multicast), the
// cooperative schedule. (256x128 tiles measured 2% slower in Mixtral's step on an H200; the pingpong
// schedule with 128x128 tiles and clusters of 2 along M, 0.91x in it on an H100: bench/RESULTS.md.)
// For groups of up to 256 rows: the same with 128x128 tiles. The others are compiled to be measured
// beside them (bench/bench_grouped_tiles.cu times a wider set at the experts' shapes).
using Wide = Config<128, 256, 1, 2, false>;
using WideShareB = Config<128, 256, 2, 1, false>;
using Square = Config<128, 128, 1, 2, false>;
using SquarePingpong = Config<128, 128, 2, 1, true>;

// The tile STRATA_SM90_ROWS_TILE names (read once), or automatic when it is unset.
rows_tile chosen_tile() {
  static const rows_tile chosen = [] {
    const char* v = std::getenv("STRATA_SM90_ROWS_TILE");
    if (v == nullptr || *v == '\0') return rows_tile::automatic;
    std::string names;
    for (rows_tile t : kRowsTiles) {
      if (std::string(v) == rows_tile_name(t)) return t;
      names += std::string(names.empty() ? "" : ", ") + rows_tile_name(t);
    }
    fail<ConfigError>("STRATA_SM90_ROWS_TILE='", v, "' names no tile of the Hopper grouped GEMM; use one of ", names,
                      " (or unset it for the default)");
  }();
  return chosen;
}

// The weight gradients: the same tile.
using WeightsKernel = Weights<Wide>;

// The weights form written rather than added to (beta 0, so C_g is not read): the GEMM has no tile
// for an empty group, whose C_g this kernel zeroes instead. blockIdx.y is the group; the blocks of a
// group with rows return at once. C_g is 16-byte aligned and m * n a multiple of 64 (checked).
struct EmptyGroups {
  const std::int32_t* counts;
  long long vectors;  // float4s in each C_g
  float* c[kSm90MaxGroups];
};

__global__ void zero_empty_groups_kernel(const __grid_constant__ EmptyGroups e) {
  if (e.counts[blockIdx.y] != 0) return;
  auto* c = reinterpret_cast<float4*>(e.c[blockIdx.y]);
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < e.vectors; i += stride)
    c[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// Whether this GPU runs sm_90a code (the kernels are compiled for it alone), and the kernels are not
// switched off by STRATA_DISABLE_CUTLASS=1 (to measure the fallback in the same build).
bool on_sm90() {
  static const bool disabled = [] {
    const char* v = std::getenv("STRATA_DISABLE_CUTLASS");
    return v != nullptr && std::string(v) == "1";
  }();
  if (disabled) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  static int major[64] = {}, minor[64] = {};
  static std::once_flag once[64];
  if (device < 0 || device >= 64) return false;
  std::call_once(once[device], [device] {
    (void)cudaDeviceGetAttribute(&major[device], cudaDevAttrComputeCapabilityMajor, device);
    (void)cudaDeviceGetAttribute(&minor[device], cudaDevAttrComputeCapabilityMinor, device);
  });
  return major[device] == 9 && minor[device] == 0;
}

}  // namespace

bool grouped_gemm_ready() { return on_sm90(); }

bool grouped_gemm_rows(cudaStream_t stream, device_memory_resource& memory, bool transpose_b, index_t groups,
                       const std::int32_t* counts, index_t rows, index_t n, index_t k, const bf16* a,
                       const bf16* const* b, bf16* c, rows_tile tile) {
  if (groups <= 0 || groups > kSm90MaxGroups || rows <= 0 || n <= 0 || k <= 0 || n % 8 != 0 || k % 8 != 0) return false;
  if (n > INT32_MAX || k > INT32_MAX || !aligned(a) || !aligned(c) || !on_sm90()) return false;
  for (index_t g = 0; g < groups; ++g)
    if (!aligned(b[g])) return false;
  auto launch = [&](auto config) {
    using C = decltype(config);
    if (transpose_b) run_rows<RowsNT<C>>(stream, memory, groups, counts, rows, n, k, a, b, c);
    else run_rows<RowsNN<C>>(stream, memory, groups, counts, rows, n, k, a, b, c);
  };
  if (tile == rows_tile::automatic) tile = chosen_tile();
  if (tile == rows_tile::automatic) tile = automatic_rows_tile(rows, groups);
  switch (tile) {
    case rows_tile::c128x256_2x1: launch(WideShareB{}); break;
    case rows_tile::c128x128_1x2: launch(Square{}); break;
    case rows_tile::p128x128_2x1: launch(SquarePingpong{}); break;
    default: launch(Wide{}); break;
  }
  return true;
}

bool grouped_gemm_weights(cudaStream_t stream, device_memory_resource& memory, index_t groups, const std::int32_t* counts,
                          index_t m, index_t n, const bf16* a, const bf16* b, float* const* c, bool accumulate) {
  if (groups <= 0 || groups > kSm90MaxGroups || m <= 0 || n <= 0 || m % 8 != 0 || n % 8 != 0) return false;
  if (m > INT32_MAX || n > INT32_MAX || !aligned(a) || !aligned(b) || !on_sm90()) return false;
  for (index_t g = 0; g < groups; ++g)
    if (!aligned(c[g])) return false;
  using G = WeightsKernel;
  Setup<G> setup{};
  setup.counts = counts;
  setup.groups = static_cast<int>(groups);
  setup.weights = true;
  setup.m = static_cast<int>(m);
  setup.n = static_cast<int>(n);
  setup.a = reinterpret_cast<const cutlass::bfloat16_t*>(a);
  setup.b = reinterpret_cast<const cutlass::bfloat16_t*>(b);
  setup.stride_a = typename G::StrideA{cute::_1{}, static_cast<int64_t>(m), cute::_0{}};
  setup.stride_b = typename G::StrideB{cute::_1{}, static_cast<int64_t>(n), cute::_0{}};
  setup.stride_c = typename G::StrideC{static_cast<int64_t>(n), cute::_1{}, cute::_0{}};
  for (index_t g = 0; g < groups; ++g) setup.per_group[g] = c[g];
  if (!accumulate) {
    EmptyGroups empty{};
    empty.counts = counts;
    empty.vectors = static_cast<long long>(m * n / 4);
    for (index_t g = 0; g < groups; ++g) empty.c[g] = c[g];
    const long long blocks = std::max<long long>(1, std::min<long long>((empty.vectors + 255) / 256, 2LL * hardware().sm_count));
    zero_empty_groups_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(groups)), 256, 0, stream>>>(empty);
    STRATA_CUDA_CHECK(cudaGetLastError());
  }
  run<G>(stream, memory, setup, accumulate ? 1.0f : 0.0f);
  return true;
}

}  // namespace cuda::sm90
STRATA_NAMESPACE_END
