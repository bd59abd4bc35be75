// strata::cuda_kernels with CUTLASS: the Hopper grouped GEMMs of grouped_gemm_sm90.hpp, whose group
// sizes are read on the device. Three kernels, one per operand layout the experts use (row-major
// storage throughout; CUTLASS names the operands' majors):
//   rows, B [n, k]  (forward)         A K-major, B K-major, D bf16
//   rows, B [k, n]  (input gradient)  A K-major, B N-major, D bf16
//   weights         (weight gradient) A M-major, B N-major, C = D float (beta 1 to accumulate)
// Compiled only when CMake finds CUTLASS 3.x headers (STRATA_CUTLASS_DIR, or the nvidia-cutlass
// Python package) and the library is built for sm_90.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>
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
namespace cuda::sm90 {
namespace {

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using Problem = typename ProblemShape::UnderlyingProblemShape;

// One grouped kernel: operands of ElementIn with layouts LayoutA / LayoutB, output ElementOut
// row-major, fp32 accumulation, 128x256x64 tiles, clusters of 2 along N (the operand shared by a
// group's row tiles is multicast), the cooperative schedule. (256x128 tiles measured 2% slower in
// Mixtral's step on an H200; the pingpong schedule with 128x128 tiles and clusters of 2 along M,
// 0.91x in it on an H100: bench/RESULTS.md.)
template <class LayoutA, class LayoutB, class ElementOut>
struct Grouped {
  using ElementIn = cutlass::bfloat16_t;
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  static constexpr int kAlignIn = 16 / sizeof(ElementIn);
  static constexpr int kAlignOut = 16 / sizeof(ElementOut);

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementOut, cutlass::layout::RowMajor*, kAlignOut,
      ElementOut, cutlass::layout::RowMajor*, kAlignOut, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementOut, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementIn, LayoutA*, kAlignIn, ElementIn, LayoutB*, kAlignIn,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
  using Out = typename Gemm::ElementD;
};

using RowsNT = Grouped<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, cutlass::bfloat16_t>;
using RowsNN = Grouped<cutlass::layout::RowMajor, cutlass::layout::RowMajor, cutlass::bfloat16_t>;
using Weights = Grouped<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float>;

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
  bool weights;   // the weight-gradient form (the reduction over a group's rows)
  int m, n, k;    // rows form: n, k; weights form: m, n
  const cutlass::bfloat16_t* a;
  const cutlass::bfloat16_t* b;  // weights form: B's rows
  typename G::Out* c;            // rows form: C's rows
  typename G::StrideA stride_a;
  typename G::StrideB stride_b;
  typename G::StrideC stride_c;
  const void* per_group[kSm90MaxGroups];  // rows form: B_g; weights form: C_g
};

template <class G>
__global__ void setup_kernel(const __grid_constant__ Setup<G> s) {
  __shared__ long long offset[kSm90MaxGroups + 1];
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

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

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

cutlass::KernelHardwareInfo hardware() {
  cutlass::KernelHardwareInfo info;
  (void)cudaGetDevice(&info.device_id);
  static int sms[64] = {};
  static std::once_flag once[64];
  const int d = info.device_id >= 0 && info.device_id < 64 ? info.device_id : 0;
  std::call_once(once[d], [d] { (void)cudaDeviceGetAttribute(&sms[d], cudaDevAttrMultiProcessorCount, d); });
  info.sm_count = sms[d];
  return info;
}

std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// Carves the tables out of one block, writes them on the device, and runs G's kernel.
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

  setup_kernel<G><<<1, 256, 0, stream>>>(setup);
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

}  // namespace

bool grouped_gemm_ready() { return on_sm90(); }

bool grouped_gemm_rows(cudaStream_t stream, device_memory_resource& memory, bool transpose_b, index_t groups,
                       const std::int32_t* counts, index_t n, index_t k, const bf16* a, const bf16* const* b, bf16* c) {
  if (groups <= 0 || groups > kSm90MaxGroups || n <= 0 || k <= 0 || n % 8 != 0 || k % 8 != 0) return false;
  if (n > INT32_MAX || k > INT32_MAX || !aligned(a) || !aligned(c) || !on_sm90()) return false;
  for (index_t g = 0; g < groups; ++g)
    if (!aligned(b[g])) return false;
  auto launch = [&](auto tag) {
    using G = decltype(tag);
    Setup<G> setup{};
    setup.counts = counts;
    setup.groups = static_cast<int>(groups);
    setup.weights = false;
    setup.n = static_cast<int>(n);
    setup.k = static_cast<int>(k);
    setup.a = reinterpret_cast<const cutlass::bfloat16_t*>(a);
    setup.c = reinterpret_cast<cutlass::bfloat16_t*>(c);
    setup.stride_a = typename G::StrideA{static_cast<int64_t>(k), cute::_1{}, cute::_0{}};
    if constexpr (std::is_same_v<G, RowsNT>) setup.stride_b = typename G::StrideB{static_cast<int64_t>(k), cute::_1{}, cute::_0{}};
    else setup.stride_b = typename G::StrideB{cute::_1{}, static_cast<int64_t>(n), cute::_0{}};
    setup.stride_c = typename G::StrideC{static_cast<int64_t>(n), cute::_1{}, cute::_0{}};
    for (index_t g = 0; g < groups; ++g) setup.per_group[g] = b[g];
    run<G>(stream, memory, setup, 0.0f);
  };
  if (transpose_b) launch(RowsNT{});
  else launch(RowsNN{});
  return true;
}

bool grouped_gemm_weights(cudaStream_t stream, device_memory_resource& memory, index_t groups, const std::int32_t* counts,
                          index_t m, index_t n, const bf16* a, const bf16* b, float* const* c, bool accumulate) {
  if (groups <= 0 || groups > kSm90MaxGroups || m <= 0 || n <= 0 || m % 8 != 0 || n % 8 != 0) return false;
  if (m > INT32_MAX || n > INT32_MAX || !aligned(a) || !aligned(b) || !on_sm90()) return false;
  for (index_t g = 0; g < groups; ++g)
    if (!aligned(c[g])) return false;
  using G = Weights;
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
