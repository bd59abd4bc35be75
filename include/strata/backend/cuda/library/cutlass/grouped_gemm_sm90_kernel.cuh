// strata/backend/cuda/library/cutlass/grouped_gemm_sm90_kernel.cuh: the parts of the Hopper grouped
// GEMMs (grouped_gemm_sm90.hpp) that do not depend on which tile runs: one CUTLASS ptr-array grouped
// kernel per Config (tile, cluster, schedule) and operand layout, the small kernel that writes the
// problem tables on the device from the counts, and the launch. Included by grouped_gemm_sm90.cu (the
// configurations the library runs) and by bench/bench_grouped_tiles (every candidate, timed); needs
// the CUTLASS 3.x headers and sm_90a.
//
// Layouts (row-major storage throughout; CUTLASS names the operands' majors):
//   RowsNT   rows, B [n, k]  (forward)         A K-major, B K-major, D bf16
//   RowsNN   rows, B [k, n]  (input gradient)  A K-major, B N-major, D bf16
//   Weights  weight gradient                    A M-major, B N-major, C = D float (beta 1 to accumulate)
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.hpp"

#include "../../grouped_gemm_sm90.hpp"
#include "../../runtime.hpp"

STRATA_NAMESPACE_BEGIN
namespace cuda::sm90::kernel {

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using Problem = typename ProblemShape::UnderlyingProblemShape;

// A tile of TileM x TileN x 64 (bf16), clusters of ClusterM x ClusterN CTAs (a cluster along M
// multicasts the B tile its CTAs share, along N the A tile), and a schedule: cooperative (both consumer
// warp groups on one tile) or pingpong (each consumer warp group on a tile of its own, one's epilogue
// overlapping the other's main loop).
template <int TileM, int TileN, int ClusterM, int ClusterN, bool Pingpong>
struct Config {
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::_64>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using KernelSchedule = std::conditional_t<Pingpong, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                                            cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = std::conditional_t<Pingpong, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                                              cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
  static constexpr int kTileM = TileM, kTileN = TileN, kClusterM = ClusterM, kClusterN = ClusterN;
  static constexpr bool kPingpong = Pingpong;
};

// One grouped kernel: bf16 operands with layouts LayoutA / LayoutB, output ElementOut row-major, fp32
// accumulation, the tile and schedule of C.
template <class LayoutA, class LayoutB, class ElementOut, class C>
struct Grouped {
  using ElementIn = cutlass::bfloat16_t;
  using TileShape = typename C::TileShape;
  using ClusterShape = typename C::ClusterShape;
  static constexpr bool kBKMajor = std::is_same_v<LayoutB, cutlass::layout::ColumnMajor>;  // B [n, k]
  static constexpr int kAlignIn = 16 / sizeof(ElementIn);
  static constexpr int kAlignOut = 16 / sizeof(ElementOut);

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementOut, cutlass::layout::RowMajor*, kAlignOut,
      ElementOut, cutlass::layout::RowMajor*, kAlignOut, typename C::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementOut, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementIn, LayoutA*, kAlignIn, ElementIn, LayoutB*, kAlignIn,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename C::KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
  using Out = typename Gemm::ElementD;
};

template <class C>
using RowsNT = Grouped<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, cutlass::bfloat16_t, C>;
template <class C>
using RowsNN = Grouped<cutlass::layout::RowMajor, cutlass::layout::RowMajor, cutlass::bfloat16_t, C>;
template <class C>
using Weights = Grouped<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float, C>;

// What the setup kernel writes for every group (device arrays, one block of memory).
template <class G>
struct Tables {
  Problem* problems;
  const cutlass::bfloat16_t** a;
  const cutlass::bfloat16_t** b;
  const typename G::Out** c;
  typename G::Out** d;
  typename G::StrideA* stride_a;
  typename G::StrideB* stride_b;
  typename G::StrideC* stride_c;
  typename G::StrideD* stride_d;
};

// Everything the setup kernel reads, in its argument (no host buffer outlives the call).
template <class G>
struct Setup {
  Tables<G> tables;
  const std::int32_t* counts;
  int groups;
  bool weights;     // the weight-gradient form (the reduction over a group's rows)
  int m, n, k;      // rows form: n, k; weights form: m, n
  long long rows;   // rows form: the rows of A and C (an upper bound of the counts' total)
  const cutlass::bfloat16_t* a;
  const cutlass::bfloat16_t* b;  // weights form: B's rows
  typename G::Out* c;            // rows form: C's rows
  typename G::StrideA stride_a;
  typename G::StrideB stride_b;
  typename G::StrideC stride_c;
  const void* per_group[kSm90MaxGroups];  // rows form: B_g; weights form: C_g
};

// Block 0 writes the tables. In the rows form the other blocks zero C's rows past the counts' total
// (what no group's tile writes), each adding up the counts itself: the GEMM writes only rows before
// the total, so the two never touch the same bytes.
template <class G>
__global__ void setup_kernel(const __grid_constant__ Setup<G> s) {
  __shared__ long long offset[kSm90MaxGroups + 1];
  if (blockIdx.x > 0) {
    if (threadIdx.x == 0) {
      long long at = 0;
      for (int g = 0; g < s.groups; ++g) at += s.counts[g];
      offset[0] = at;
    }
    __syncthreads();
    // 16-byte stores: n is a multiple of 8 and C 16-byte aligned (checked by the callers).
    const long long first = offset[0] * s.n / 8, end = s.rows * s.n / 8;
    auto* c = reinterpret_cast<uint4*>(s.c);
    for (long long i = first + static_cast<long long>(blockIdx.x - 1) * blockDim.x + threadIdx.x; i < end;
         i += static_cast<long long>(gridDim.x - 1) * blockDim.x)
      c[i] = make_uint4(0, 0, 0, 0);
    return;
  }
  if (threadIdx.x == 0) {
    long long at = 0;
    for (int g = 0; g < s.groups; ++g) offset[g] = at, at += s.counts[g];
    offset[s.groups] = at;
  }
  __syncthreads();
  for (int g = threadIdx.x; g < s.groups; g += blockDim.x) {
    const int rows = static_cast<int>(offset[g + 1] - offset[g]);
    const long long first = offset[g];
    if (s.weights) {
      // C_g[m, n] = A_g^T B_g: M = m, N = n, K = the group's rows; an empty group has no tiles.
      s.tables.problems[g] = Problem(rows > 0 ? s.m : 0, s.n, rows);
      s.tables.a[g] = s.a + first * s.m;
      s.tables.b[g] = s.b + first * s.n;
      auto* out = static_cast<typename G::Out*>(const_cast<void*>(s.per_group[g]));
      s.tables.c[g] = out;
      s.tables.d[g] = out;
    } else {
      s.tables.problems[g] = Problem(rows, s.n, s.k);
      s.tables.a[g] = s.a + first * s.k;
      s.tables.b[g] = static_cast<const cutlass::bfloat16_t*>(s.per_group[g]);
      s.tables.c[g] = s.c + first * s.n;
      s.tables.d[g] = s.c + first * s.n;
    }
    s.tables.stride_a[g] = s.stride_a;
    s.tables.stride_b[g] = s.stride_b;
    s.tables.stride_c[g] = s.stride_c;
    s.tables.stride_d[g] = s.stride_c;
  }
}

inline bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

inline int sm_count() {
  int device = 0;
  (void)cudaGetDevice(&device);
  static int sms[64] = {};
  static std::once_flag once[64];
  const int d = device >= 0 && device < 64 ? device : 0;
  std::call_once(once[d], [d] { (void)cudaDeviceGetAttribute(&sms[d], cudaDevAttrMultiProcessorCount, d); });
  return sms[d];
}

inline cutlass::KernelHardwareInfo hardware() {
  cutlass::KernelHardwareInfo info;
  (void)cudaGetDevice(&info.device_id);
  info.sm_count = sm_count();
  return info;
}

inline std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// Carves the tables out of one block, writes them on the device (and, in the rows form, zeroes the rows
// past the counts), and runs G's kernel.
template <class G>
void run(cudaStream_t stream, device_memory_resource& memory, Setup<G>& setup, float beta) {
  const std::size_t groups = static_cast<std::size_t>(setup.groups);
  const std::size_t sizes[] = {sizeof(Problem),           sizeof(void*),           sizeof(void*),
                               sizeof(void*),             sizeof(void*),           sizeof(typename G::StrideA),
                               sizeof(typename G::StrideB), sizeof(typename G::StrideC), sizeof(typename G::StrideD)};
  std::size_t table_bytes = 0;
  for (std::size_t s : sizes) table_bytes += round_up(s * groups);

  typename G::Gemm gemm;
  typename G::Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion{};
  fusion.alpha = 1.0f;
  fusion.beta = beta;
  fusion.alpha_ptr = nullptr;
  fusion.beta_ptr = nullptr;
  fusion.alpha_ptr_array = nullptr;
  fusion.beta_ptr_array = nullptr;
  fusion.dAlpha = {cute::_0{}, cute::_0{}, 0};
  fusion.dBeta = {cute::_0{}, cute::_0{}, 0};

  // The tables' addresses are needed for the arguments and the workspace size for the block: size the
  // workspace with placeholder tables first (it depends on the group count and the GPU alone).
  auto arguments = [&](const Tables<G>& t) {
    return typename G::Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                       {setup.groups, t.problems, nullptr},
                                       {t.a, t.stride_a, t.b, t.stride_b},
                                       {fusion, t.c, t.stride_c, t.d, t.stride_d},
                                       hardware()};
  };
  const std::size_t workspace_bytes = G::Gemm::get_workspace_size(arguments(Tables<G>{}));
  const std::size_t total = table_bytes + round_up(workspace_bytes);
  auto* block = static_cast<char*>(memory.allocate(total));
  char* at = block;
  auto take = [&](auto*& pointer, std::size_t element) {
    pointer = reinterpret_cast<std::remove_reference_t<decltype(pointer)>>(at);
    at += round_up(element * groups);
  };
  Tables<G>& t = setup.tables;
  take(t.problems, sizeof(Problem));
  take(t.a, sizeof(void*));
  take(t.b, sizeof(void*));
  take(t.c, sizeof(void*));
  take(t.d, sizeof(void*));
  take(t.stride_a, sizeof(typename G::StrideA));
  take(t.stride_b, sizeof(typename G::StrideB));
  take(t.stride_c, sizeof(typename G::StrideC));
  take(t.stride_d, sizeof(typename G::StrideD));
  void* workspace = workspace_bytes > 0 ? at : nullptr;

  // Rows form: blocks past the first zero the rows past the counts, at most one an SM (usually there
  // are none, and each block adds up the counts).
  long long zero_blocks = 0;
  if (!setup.weights && setup.rows > 0)
    zero_blocks = std::min<long long>((setup.rows * setup.n / 8 + 255) / 256, sm_count());
  setup_kernel<G><<<static_cast<unsigned>(1 + zero_blocks), 256, 0, stream>>>(setup);
  STRATA_CUDA_CHECK(cudaGetLastError());
  args = arguments(t);
  cutlass::Status status = gemm.initialize(args, workspace, stream);
  if (status == cutlass::Status::kSuccess) status = gemm.run(stream);
  memory.deallocate(block, total);
  if (status != cutlass::Status::kSuccess)
    fail<Error>("cuda::sm90 grouped GEMM: CUTLASS answered '", cutlassGetStatusString(status), "' for ", setup.groups,
                " groups");
  STRATA_CUDA_CHECK(cudaGetLastError());
}

// The rows form with G's kernel: C[rows, n] = A[rows, k] op(B_g) over consecutive groups of counts[g]
// rows, C's rows past the counts' total zero. The caller checked sizes and alignment.
template <class G>
void run_rows(cudaStream_t stream, device_memory_resource& memory, index_t groups, const std::int32_t* counts,
              index_t rows, index_t n, index_t k, const bf16* a, const bf16* const* b, bf16* c) {
  Setup<G> setup{};
  setup.counts = counts;
  setup.groups = static_cast<int>(groups);
  setup.weights = false;
  setup.n = static_cast<int>(n);
  setup.k = static_cast<int>(k);
  setup.rows = static_cast<long long>(rows);
  setup.a = reinterpret_cast<const cutlass::bfloat16_t*>(a);
  setup.c = reinterpret_cast<cutlass::bfloat16_t*>(c);
  setup.stride_a = typename G::StrideA{static_cast<int64_t>(k), cute::_1{}, cute::_0{}};
  if constexpr (G::kBKMajor) setup.stride_b = typename G::StrideB{static_cast<int64_t>(k), cute::_1{}, cute::_0{}};
  else setup.stride_b = typename G::StrideB{cute::_1{}, static_cast<int64_t>(n), cute::_0{}};
  setup.stride_c = typename G::StrideC{static_cast<int64_t>(n), cute::_1{}, cute::_0{}};
  for (index_t g = 0; g < groups; ++g) setup.per_group[g] = b[g];
  run<G>(stream, memory, setup, 0.0f);
}

}  // namespace cuda::sm90::kernel
STRATA_NAMESPACE_END
