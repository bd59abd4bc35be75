// bench/bench_gemm_algorithms.cu: how much faster than cuBLASLt's first heuristic choice is the
// best of its top-N heuristic candidates, for the GEMMs of one GPT-2 training step?
//
// backend/cuda/gemm.hpp asks cublasLtMatmulAlgoGetHeuristic for one algorithm per problem and runs
// it. This program asks for up to 16 (--candidates N; at least 16 are requested), times every
// candidate the heuristic returns, and reports what an autotuner that kept the fastest one would
// save. It uses cuBLASLt directly, with gemm.hpp's setup: bf16 operands, CUBLAS_COMPUTE_32F, fp32
// alpha / beta, a 32 MiB workspace, the same MIN_ALIGNMENT preferences (taken from the pointers),
// and the row-major product C[m,n] = op(A) op(B) computed as the column-major C^T = op(B)^T op(A)^T
// (the first cuBLASLt operand is the B buffer with TRANSA = transpose_b, the second the A buffer
// with TRANSB = transpose_a; C and D the same buffer). Epilogues, as gemm.hpp sets them up:
//   BIAS           bias[n] (bf16) on every row of C                    linear forward (qkv, proj, fc2)
//   GELU_AUX_BIAS  C = gelu(product + bias), aux = pre-activation      fc1 forward (aux ld = n)
//   DGELU          C = product * gelu'(aux)                            fc2's input gradient (aux ld = n)
//   f32 acc        C fp32 (CUDA_R_32F for C and D), beta = 1           weight gradients, dW += dy^T x
// When the heuristic has no algorithm with an epilogue, the program falls back the way gemm.hpp's
// callers do (GELU_AUX_BIAS -> BIAS, then none; DGELU -> none; BIAS -> none) and says so in the
// table's epilogue column (the separate bias / GELU kernel the library would then run is not timed).
//
// The problems, per transformer layer (x [M, in], W [out, in], M = tokens of one step):
//   <linear> fwd    y = x W^T        ta=0 tb=1  m=M    n=out  k=in   (BIAS; fc1: GELU_AUX_BIAS)
//   <linear> dx     dx = dy W        ta=0 tb=0  m=M    n=in   k=out  (fc2: DGELU, m=M n=4D k=D)
//   <linear> dW     dW += dy^T x     ta=1 tb=0  m=out  n=in   k=M    (fp32 C, beta = 1)
// for qkv (D -> 3D), proj (D -> D), fc1 (D -> 4D) and fc2 (4D -> D), each run once per layer per
// step; and the tied-embedding classifier (no bias, vocabulary V = 50304), once per step, unchunked:
//   logits = x E^T (m=M n=V k=D), dx = dlogits E (m=M n=D k=V), dE += dlogits^T x (m=V n=D k=M, fp32).
// Shapes: GPT-2 124M (M = 32768 tokens, D = 768, 12 layers) and 350M (M = 16384, D = 1024, 24 layers).
// Not included: attention's own products (QK^T, PV: the attention kernel), the bias gradients and
// every non-GEMM kernel.
//
// Timing: for each candidate, its first launch is checked (a candidate whose launch returns an
// error, whose heuristic state is not SUCCESS or whose workspace exceeds 32 MiB is skipped), 2 more
// warm-up launches follow (3 in all), then 10 timed launches on one stream, each between its own
// pair of CUDA events (all 10 enqueued back to back, one synchronize at the end); a candidate's time
// is the median of the 10 (the mean of the 5th and 6th). Weight-gradient outputs are zeroed before
// each candidate so the accumulation stays small. TFLOP/s = 2 m n k / time (the epilogue's work is
// not counted). Per shape, the step total weights each problem by how many times it runs in a step
// (the number of layers, or 1 for the classifier): default (index 0) against best per problem is
// the time per step an autotuner picking among the heuristic's own candidates would save.
// The "lib" column says whether index 0 is the algorithm gemm.hpp gets (it requests one result):
// "=" when the single-result query returns the same algorithm, "!=" when not.
// The algo columns read id/tile/stages/splitK/cluster/custom/swizzle (cublasLtMatmulAlgoConfigGetAttribute
// enums and values).
// --variants adds fc1's forward with GELU_BIAS (no aux), BIAS and no epilogue, and fc2's input gradient
// with DGELU_BGRAD and none (timed like the rest, not summed). --search S also enumerates every
// configuration of every algorithm id cuBLASLt lists for the types (cublasLtMatmulAlgoGetIds, then tiles x
// stages x 7 cluster shapes x custom options x swizzle, split-K off), keeps those cublasLtMatmulAlgoCheck
// accepts, and times them (median of 5) for at most S seconds per problem. --only limits the problems
// by name ("fc1 fwd,fc2 dx").
//
// Inputs are a deterministic hashed pattern in [-1, 1] stored as bf16 (no NaN or inf); every CUDA and
// cuBLASLt call is checked and a failure names the call. It measures and prints a markdown table;
// it never asserts. It needs a GPU (sm_90 build by default; the 124M classifier alone needs about
// 3.5 GB of device memory). Built by tests/gpu/CMakeLists.txt when STRATA_BUILD_GPU_TESTS is on, or
// by hand from the repository root:
//   nvcc -std=c++20 -O3 -arch=sm_90 -I include bench/bench_gemm_algorithms.cu -lcublasLt -o bench_gemm_algorithms
// Usage: bench_gemm_algorithms [--shape 124M|350M|all] [--candidates N] [--verbose] [--variants]
//                              [--search SECONDS] [--only NAMES]
//   --shape       which model's GEMMs (default all)
//   --candidates  how many heuristic candidates to time, 1..64 (default 16)
//   --verbose     also print every candidate's time
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr const char* kProgram = "bench_gemm_algorithms";
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;
constexpr int kMinRequested = 16;  // requestedAlgoCount is at least this
constexpr int kWarmup = 3;         // launches before timing (the checked first launch included)
constexpr int kTimed = 10;         // timed launches per candidate

// ---- status checks -----------------------------------------------------------------------------

void check_cuda(cudaError_t status, const char* call, int line) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: line %d: %s failed: %s (%s)\n", kProgram, line, call, cudaGetErrorName(status),
                 cudaGetErrorString(status));
    std::exit(2);
  }
}
void check_lt(cublasStatus_t status, const char* call, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: line %d: %s failed: %s (%s)\n", kProgram, line, call, cublasLtGetStatusName(status),
                 cublasLtGetStatusString(status));
    std::exit(2);
  }
}
#define CUDA_CHECK(call) check_cuda((call), #call, __LINE__)
#define LT_CHECK(call) check_lt((call), #call, __LINE__)

// ---- owned handles -----------------------------------------------------------------------------

template <class Handle, cublasStatus_t (*Destroy)(Handle)>
struct lt_owned {
  Handle handle = nullptr;
  lt_owned() = default;
  lt_owned(const lt_owned&) = delete;
  lt_owned& operator=(const lt_owned&) = delete;
  ~lt_owned() { reset(); }
  void reset() {
    if (handle) (void)Destroy(handle);
    handle = nullptr;
  }
};
using matmul_desc = lt_owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using matrix_layout = lt_owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using matmul_preference = lt_owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// Device memory, freed when it goes out of scope.
struct device_memory {
  void* p = nullptr;
  device_memory() = default;
  void allocate(std::size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMalloc(&p, bytes));
  }
  device_memory(const device_memory&) = delete;
  device_memory& operator=(const device_memory&) = delete;
  ~device_memory() {
    if (p) (void)cudaFree(p);
  }
};

// ---- inputs ------------------------------------------------------------------------------------

// A hashed pattern in [-1, 1] (splitmix64 of the index and a seed), rounded to bf16.
__global__ void fill_pattern(__nv_bfloat16* p, std::size_t n, std::uint64_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    const float unit = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = __float2bfloat16(2.0f * unit - 1.0f);
  }
}

void fill(void* p, std::size_t n, std::uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>((n + 255) / 256, 8192));
  fill_pattern<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  CUDA_CHECK(cudaGetLastError());
}

// The largest power of two (at most 256) dividing the address, as gemm.hpp's pointer_alignment.
std::uint32_t pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// ---- problems ----------------------------------------------------------------------------------

// What runs after the product. wgrad: no epilogue, fp32 C accumulated with beta = 1.
enum class epi { none, bias, gelu_aux_bias, dgelu, wgrad, gelu_bias, dgelu_bgrad };

const char* epi_name(epi e) {
  switch (e) {
    case epi::none: return "none";
    case epi::bias: return "BIAS";
    case epi::gelu_aux_bias: return "GELU_AUX_BIAS";
    case epi::dgelu: return "DGELU";
    case epi::wgrad: return "f32 acc";
    case epi::gelu_bias: return "GELU_BIAS";
    case epi::dgelu_bgrad: return "DGELU_BGRAD";
  }
  return "?";
}

struct problem {
  std::string name;
  bool ta = false, tb = false;
  std::int64_t m = 0, n = 0, k = 0;
  epi epilogue = epi::none;
  int per_step = 1;      // how many times it runs in one training step
  bool variant = false;  // an epilogue gemm.hpp does not use, timed for comparison (no fallback, not summed)
};

struct model_shape {
  const char* name;
  std::int64_t tokens, hidden, vocab;
  int layers;
};

constexpr model_shape kShapes[] = {
    {"124M", 32768, 768, 50304, 12},
    {"350M", 16384, 1024, 50304, 24},
};

std::vector<problem> step_problems(const model_shape& s) {
  const std::int64_t M = s.tokens, D = s.hidden, V = s.vocab;
  const int L = s.layers;
  struct linear {
    const char* name;
    std::int64_t in, out;
    epi forward, input_grad;
  };
  const linear linears[] = {
      {"qkv", D, 3 * D, epi::bias, epi::none},
      {"proj", D, D, epi::bias, epi::none},
      {"fc1", D, 4 * D, epi::gelu_aux_bias, epi::none},
      {"fc2", 4 * D, D, epi::bias, epi::dgelu},  // dx of fc2 is d(gelu output): times gelu'(pre)
  };
  std::vector<problem> out;
  for (const linear& l : linears) {
    const std::string name = l.name;
    out.push_back({name + " fwd", false, true, M, l.out, l.in, l.forward, L});
    out.push_back({name + " dx", false, false, M, l.in, l.out, l.input_grad, L});
    out.push_back({name + " dW", true, false, l.out, l.in, M, epi::wgrad, L});
  }
  out.push_back({"cls fwd", false, true, M, V, D, epi::none, 1});
  out.push_back({"cls dx", false, false, M, D, V, epi::none, 1});
  out.push_back({"cls dE", true, false, V, D, M, epi::wgrad, 1});
  return out;
}

// --variants: fc1's forward and fc2's input gradient with the other epilogues cuBLASLt offers, to
// see what the GELU epilogues cost (GELU_BIAS: no aux output; BIAS and none: no GELU at all;
// DGELU_BGRAD: fc1's bias gradient written by the same GEMM).
std::vector<problem> variant_problems(const model_shape& s) {
  const std::int64_t M = s.tokens, D = s.hidden;
  const int L = s.layers;
  std::vector<problem> out;
  for (const epi e : {epi::gelu_bias, epi::bias, epi::none})
    out.push_back({"fc1 fwd", false, true, M, 4 * D, D, e, L, true});
  for (const epi e : {epi::dgelu_bgrad, epi::none}) out.push_back({"fc2 dx", false, false, M, 4 * D, D, e, L, true});
  return out;
}

struct options {
  std::string shape = "all";
  int candidates = 16;
  bool verbose = false;
  bool variants = false;
  double search_seconds = 0;       // > 0: --search, the time budget per problem
  std::vector<std::string> only;  // --only: problem names to run (all when empty)
};

// ---- one problem's descriptors -----------------------------------------------------------------

struct buffers {
  device_memory a, b, c, bias, aux;
};

struct plan {
  matmul_desc desc;
  matrix_layout first, second, out_c, out_d;
  matmul_preference preference;
};

// The matmul descriptor for `e` (the epilogue actually requested from cuBLASLt), as gemm.hpp's describe().
void describe(plan& p, epi e, const problem& pr, const buffers& buf) {
  p.desc.reset();
  LT_CHECK(cublasLtMatmulDescCreate(&p.desc.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_first = pr.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = pr.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  const void* bias_pointer = buf.bias.p;
  const void* aux_pointer = buf.aux.p;
  if (e == epi::gelu_aux_bias || e == epi::dgelu || e == epi::dgelu_bgrad) {
    const cublasLtEpilogue_t kind = e == epi::dgelu         ? CUBLASLT_EPILOGUE_DGELU
                                    : e == epi::dgelu_bgrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD
                                                            : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE, &kind, sizeof(kind)));
    const std::int64_t ld = pr.n;  // aux has D's column-major layout [n, m]
    LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux_pointer,
                                            sizeof(aux_pointer)));
    // GELU_AUX_BIAS reads bias[n]; DGELU_BGRAD writes the bias gradient (the column sums of D) there.
    if (e != epi::dgelu)
      LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer,
                                              sizeof(bias_pointer)));
  } else if (e == epi::bias || e == epi::gelu_bias) {
    const cublasLtEpilogue_t kind = e == epi::bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
    LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_EPILOGUE, &kind, sizeof(kind)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer,
                                            sizeof(bias_pointer)));
  }
}

// Layouts and the preference (workspace limit, operand alignments), as gemm.hpp builds them.
void lay_out(plan& p, const problem& pr, const buffers& buf) {
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  const cudaDataType_t data = CUDA_R_16BF;
  const cudaDataType_t output = pr.epilogue == epi::wgrad ? CUDA_R_32F : CUDA_R_16BF;
  if (pr.tb)
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.first.handle, data, u(pr.k), u(pr.n), pr.k));
  else
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.first.handle, data, u(pr.n), u(pr.k), pr.n));
  if (pr.ta)
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.second.handle, data, u(pr.m), u(pr.k), pr.m));
  else
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.second.handle, data, u(pr.k), u(pr.m), pr.k));
  LT_CHECK(cublasLtMatrixLayoutCreate(&p.out_c.handle, output, u(pr.n), u(pr.m), pr.n));
  LT_CHECK(cublasLtMatrixLayoutCreate(&p.out_d.handle, output, u(pr.n), u(pr.m), pr.n));

  LT_CHECK(cublasLtMatmulPreferenceCreate(&p.preference.handle));
  const std::size_t workspace = kWorkspaceBytes;
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(p.preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace, sizeof(workspace)));
  const std::uint32_t align_first = pointer_alignment(buf.b.p), align_second = pointer_alignment(buf.a.p),
                      align_c = pointer_alignment(buf.c.p);
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(p.preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &align_first, sizeof(align_first)));
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(p.preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &align_second, sizeof(align_second)));
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(p.preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &align_c, sizeof(align_c)));
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(p.preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &align_c, sizeof(align_c)));
}

// The heuristic's answers, in a fixed array: nvcc 13's front end crashes (internal error) on a
// std::vector of cuBLASLt's unnamed result struct under -std=c++20.
constexpr int kMaxCandidates = 64;
struct heuristic_results {
  cublasLtMatmulHeuristicResult_t at[kMaxCandidates];
  int count = 0;
};

heuristic_results heuristic(cublasLtHandle_t lt, const plan& p, int requested) {
  heuristic_results results{};
  requested = std::min(requested, kMaxCandidates);
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(lt, p.desc.handle, p.first.handle, p.second.handle, p.out_c.handle,
                                     p.out_d.handle, p.preference.handle, requested, results.at, &found);
  // NOT_SUPPORTED: no algorithm for this configuration (an epilogue the GPU's kernels lack), as 0 found.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;
  else LT_CHECK(status);
  results.count = std::clamp(found, 0, requested);
  return results;
}

// "id/tile/stages/splitK/cluster" of an algorithm (the cuBLASLt enum values).
std::string algo_text(const cublasLtMatmulAlgo_t& algo) {
  std::int32_t id = -1, split_k = -1;
  std::uint32_t tile = 0, stages = 0;
  std::uint16_t cluster = 0;
  std::uint32_t custom = 0, swizzle = 0;
  std::size_t written = 0;
  LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written));
  LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written));
  LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages),
                                                &written));
  LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k, sizeof(split_k),
                                                &written));
  LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                                sizeof(cluster), &written));
  LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof(custom),
                                                &written));
  LT_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle,
                                                sizeof(swizzle), &written));
  char text[128];
  std::snprintf(text, sizeof(text), "%d/%u/%u/%d/%u/%u/%u", id, tile, stages, split_k, static_cast<unsigned>(cluster),
                custom, swizzle);
  return text;
}

// ---- timing ------------------------------------------------------------------------------------

struct context {
  cublasLtHandle_t lt = nullptr;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  cudaEvent_t start[kTimed] = {}, stop[kTimed] = {};
};

cublasStatus_t launch(const context& ctx, const plan& p, const problem& pr, const buffers& buf,
                      const cublasLtMatmulAlgo_t& algo) {
  const float alpha = 1.0f, beta = pr.epilogue == epi::wgrad ? 1.0f : 0.0f;
  return cublasLtMatmul(ctx.lt, p.desc.handle, &alpha, buf.b.p, p.first.handle, buf.a.p, p.second.handle, &beta,
                        buf.c.p, p.out_c.handle, buf.c.p, p.out_d.handle, &algo, ctx.workspace, kWorkspaceBytes,
                        ctx.stream);
}

// The median time in microseconds of one candidate, or a negative value (and `why`) when skipped.
// `timed` launches (at most kTimed) are timed; the median is returned.
double time_algorithm(const context& ctx, const plan& p, const problem& pr, const buffers& buf,
                      const cublasLtMatmulAlgo_t& algo, int timed, std::string& why) {
  if (pr.epilogue == epi::wgrad)
    CUDA_CHECK(cudaMemsetAsync(buf.c.p, 0, static_cast<std::size_t>(pr.m * pr.n) * sizeof(float), ctx.stream));
  const cublasStatus_t first = launch(ctx, p, pr, buf, algo);
  if (first != CUBLAS_STATUS_SUCCESS) {
    why = std::string("first launch: ") + cublasLtGetStatusName(first);
    (void)cudaGetLastError();  // a launch error that is not sticky
    return -1;
  }
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) {
    why = std::string("first launch: ") + cudaGetErrorName(launched);
    return -1;
  }
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream));  // an error here is sticky: nothing more can run
  for (int i = 1; i < kWarmup; ++i) LT_CHECK(launch(ctx, p, pr, buf, algo));
  timed = std::clamp(timed, 1, kTimed);
  for (int i = 0; i < timed; ++i) {
    CUDA_CHECK(cudaEventRecord(ctx.start[i], ctx.stream));
    LT_CHECK(launch(ctx, p, pr, buf, algo));
    CUDA_CHECK(cudaEventRecord(ctx.stop[i], ctx.stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  std::vector<double> us(static_cast<std::size_t>(timed));
  for (int i = 0; i < timed; ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ctx.start[i], ctx.stop[i]));
    us[static_cast<std::size_t>(i)] = 1e3 * static_cast<double>(ms);
  }
  std::sort(us.begin(), us.end());
  const std::size_t half = us.size() / 2;
  return us.size() % 2 ? us[half] : 0.5 * (us[half - 1] + us[half]);
}

// A heuristic candidate's median time, or a negative value (and `why`) when skipped.
double time_candidate(const context& ctx, const plan& p, const problem& pr, const buffers& buf,
                      const cublasLtMatmulHeuristicResult_t& result, std::string& why) {
  if (result.state != CUBLAS_STATUS_SUCCESS) {
    why = std::string("heuristic state ") + cublasLtGetStatusName(result.state);
    return -1;
  }
  if (result.workspaceSize > kWorkspaceBytes) {
    why = "workspace " + std::to_string(result.workspaceSize) + " B > 32 MiB";
    return -1;
  }
  return time_algorithm(ctx, p, pr, buf, result.algo, kTimed, why);
}

// ---- search beyond the heuristic (--search SECONDS) -------------------------------------------------

// cublasLtMatmulAlgo_t's words in a named struct (nvcc 13 rejects containers of the unnamed one).
struct algo_words {
  std::uint64_t data[8] = {};
};

struct search_outcome {
  int ids = 0;             // algorithm ids cuBLASLt lists for these types
  long checked = 0;        // configurations passed to cublasLtMatmulAlgoCheck
  int accepted = 0;        // configurations the check accepted (and within the workspace)
  int timed = 0;           // of those, timed before the time budget ran out
  double best_us = -1;     // fastest configuration's median
  std::string best_algo;
};

template <class T>
std::vector<T> algo_cap_array(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attribute) {
  std::size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attribute, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0)
    return {};
  std::vector<T> values(bytes / sizeof(T));
  std::size_t written = 0;
  LT_CHECK(cublasLtMatmulAlgoCapGetAttribute(&algo, attribute, values.data(), values.size() * sizeof(T), &written));
  values.resize(written / sizeof(T));
  return values;
}

template <class T>
T algo_cap(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attribute) {
  T value{};
  std::size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attribute, &value, sizeof(value), &written) != CUBLAS_STATUS_SUCCESS)
    return T{};
  return value;
}

template <class T>
void set_config(cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute, T value) {
  LT_CHECK(cublasLtMatmulAlgoConfigSetAttribute(&algo, attribute, &value, sizeof(value)));
}

// Every configuration cuBLASLt's algorithm ids offer for this problem and epilogue (split-K off;
// tiles x stages x a few cluster shapes x custom options x CTA swizzling), each checked with
// cublasLtMatmulAlgoCheck, then timed (median of 5) until `seconds` have passed. The tuner in
// gemm.hpp times only the heuristic's candidates; this says what the rest of the space holds.
search_outcome search_configurations(const context& ctx, const plan& p, const problem& pr, const buffers& buf,
                                     double seconds, bool verbose) {
  search_outcome out;
  const cudaDataType_t data = CUDA_R_16BF;
  const cudaDataType_t output = pr.epilogue == epi::wgrad ? CUDA_R_32F : CUDA_R_16BF;
  int ids[256];
  int found = 0;
  LT_CHECK(cublasLtMatmulAlgoGetIds(ctx.lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, data, data, output, output, 256, ids,
                                    &found));
  out.ids = found;
  const std::uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                    CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1,
                                    CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
                                    CUBLASLT_CLUSTER_SHAPE_1x4x1};
  std::vector<algo_words> accepted;
  for (int i = 0; i < found; ++i) {
    cublasLtMatmulAlgo_t algo{};
    if (cublasLtMatmulAlgoInit(ctx.lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, data, data, output, output, ids[i], &algo) !=
        CUBLAS_STATUS_SUCCESS)
      continue;
    std::vector<std::uint32_t> tiles = algo_cap_array<std::uint32_t>(algo, CUBLASLT_ALGO_CAP_TILE_IDS);
    std::vector<std::uint32_t> stages = algo_cap_array<std::uint32_t>(algo, CUBLASLT_ALGO_CAP_STAGES_IDS);
    if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
    if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
    const int custom_max = std::min(algo_cap<std::int32_t>(algo, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX), 7);
    const bool swizzle = algo_cap<std::int32_t>(algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) != 0;
    for (const std::uint32_t tile : tiles)
      for (const std::uint32_t stage : stages)
        for (const std::uint16_t cluster : clusters)
          for (int custom = 0; custom <= custom_max; ++custom)
            for (std::uint32_t swz = 0; swz <= (swizzle ? 1u : 0u); ++swz) {
              cublasLtMatmulAlgo_t config = algo;
              set_config(config, CUBLASLT_ALGO_CONFIG_TILE_ID, tile);
              set_config(config, CUBLASLT_ALGO_CONFIG_STAGES_ID, stage);
              set_config(config, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, std::int32_t{1});
              set_config(config, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, swz);
              set_config(config, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, static_cast<std::uint32_t>(custom));
              if (cublasLtMatmulAlgoConfigSetAttribute(&config, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                                       sizeof(cluster)) != CUBLAS_STATUS_SUCCESS)
                continue;
              ++out.checked;
              cublasLtMatmulHeuristicResult_t result{};
              if (cublasLtMatmulAlgoCheck(ctx.lt, p.desc.handle, p.first.handle, p.second.handle, p.out_c.handle,
                                          p.out_d.handle, &config, &result) != CUBLAS_STATUS_SUCCESS ||
                  result.state != CUBLAS_STATUS_SUCCESS || result.workspaceSize > kWorkspaceBytes)
                continue;
              algo_words words;
              std::memcpy(words.data, &config, sizeof(config));
              accepted.push_back(words);
            }
  }
  out.accepted = static_cast<int>(accepted.size());
  const auto started = std::chrono::steady_clock::now();
  for (const algo_words& words : accepted) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() > seconds) break;
    cublasLtMatmulAlgo_t config{};
    std::memcpy(&config, words.data, sizeof(config));
    std::string why;
    const double us = time_algorithm(ctx, p, pr, buf, config, 5, why);
    if (us < 0) continue;
    ++out.timed;
    if (verbose) std::printf("    %-8s search %10.1f us  %s\n", pr.name.c_str(), us, algo_text(config).c_str());
    if (out.best_us < 0 || us < out.best_us) {
      out.best_us = us;
      out.best_algo = algo_text(config);
    }
  }
  return out;
}

struct outcome {
  epi ran = epi::none;
  int returned = 0, timed = 0;
  bool lib_same = false;
  double default_us = -1, best_us = -1;
  int best_index = -1;
  std::string default_algo, best_algo, note;
  search_outcome search;
};

outcome run_problem(const context& ctx, const problem& pr, const options& opt) {
  const int candidates = opt.candidates;
  const bool verbose = opt.verbose;
  const bool wgrad = pr.epilogue == epi::wgrad;
  const bool with_bias = pr.epilogue == epi::bias || pr.epilogue == epi::gelu_aux_bias ||
                         pr.epilogue == epi::gelu_bias || pr.epilogue == epi::dgelu_bgrad;
  const bool with_aux =
      pr.epilogue == epi::gelu_aux_bias || pr.epilogue == epi::dgelu || pr.epilogue == epi::dgelu_bgrad;
  const auto count = [](std::int64_t r, std::int64_t c) { return static_cast<std::size_t>(r * c); };
  buffers buf;
  buf.a.allocate(count(pr.m, pr.k) * 2);
  buf.b.allocate(count(pr.k, pr.n) * 2);
  buf.c.allocate(count(pr.m, pr.n) * (wgrad ? 4 : 2));
  if (with_bias) buf.bias.allocate(static_cast<std::size_t>(pr.n) * 4);  // room for an fp32 bias gradient
  if (with_aux) buf.aux.allocate(count(pr.m, pr.n) * 2);
  fill(buf.a.p, count(pr.m, pr.k), 0x1234 + static_cast<std::uint64_t>(pr.m), ctx.stream);
  fill(buf.b.p, count(pr.k, pr.n), 0x5678 + static_cast<std::uint64_t>(pr.n), ctx.stream);
  if (!wgrad) fill(buf.c.p, count(pr.m, pr.n), 0x9abc, ctx.stream);
  if (with_bias) fill(buf.bias.p, static_cast<std::size_t>(pr.n), 0xdef0, ctx.stream);
  if (with_aux) fill(buf.aux.p, count(pr.m, pr.n), 0x4242, ctx.stream);
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream));

  plan p;
  lay_out(p, pr, buf);
  const int requested = std::max(candidates, kMinRequested);
  // The epilogue requested, then gemm.hpp's callers' fallbacks when the heuristic finds nothing.
  std::vector<epi> tries{pr.epilogue};
  if (!pr.variant && pr.epilogue == epi::gelu_aux_bias) tries = {epi::gelu_aux_bias, epi::bias, epi::none};
  if (!pr.variant && (pr.epilogue == epi::dgelu || pr.epilogue == epi::bias)) tries.push_back(epi::none);
  outcome out;
  heuristic_results results{};
  for (const epi e : tries) {
    describe(p, e, pr, buf);  // wgrad: no epilogue
    results = heuristic(ctx.lt, p, requested);
    out.ran = e;
    if (results.count > 0) break;
  }
  if (out.ran != pr.epilogue) out.note = std::string("fell back from ") + epi_name(pr.epilogue);
  out.returned = results.count;
  if (results.count == 0) {
    out.note = "no algorithm";
    return out;
  }
  const auto single = heuristic(ctx.lt, p, 1);  // what gemm.hpp asks for
  out.lib_same = single.count > 0 &&
                 std::memcmp(&single.at[0].algo, &results.at[0].algo, sizeof(cublasLtMatmulAlgo_t)) == 0;

  const int n = std::min(candidates, out.returned);
  for (int i = 0; i < n; ++i) {
    const auto& result = results.at[i];
    std::string why;
    const double us = time_candidate(ctx, p, pr, buf, result, why);
    if (verbose) {
      if (us >= 0)
        std::printf("    %-8s #%-2d %10.1f us  %s\n", pr.name.c_str(), i, us, algo_text(result.algo).c_str());
      else
        std::printf("    %-8s #%-2d skipped: %s\n", pr.name.c_str(), i, why.c_str());
    }
    if (us < 0) {
      if (i == 0) out.note += (out.note.empty() ? "" : "; ") + ("#0 " + why);
      continue;
    }
    ++out.timed;
    if (i == 0) {
      out.default_us = us;
      out.default_algo = algo_text(result.algo);
    }
    if (out.best_index < 0 || us < out.best_us) {
      out.best_us = us;
      out.best_index = i;
      out.best_algo = algo_text(result.algo);
    }
  }
  if (opt.search_seconds > 0 && !pr.variant) out.search = search_configurations(ctx, p, pr, buf, opt.search_seconds, verbose);
  return out;
}

double tflops(const problem& pr, double us) {
  return 2.0 * static_cast<double>(pr.m) * static_cast<double>(pr.n) * static_cast<double>(pr.k) / (us * 1e-6) / 1e12;
}

void run_shape(const context& ctx, const model_shape& s, const options& opt) {
  std::printf("\n### GPT-2 %s: %lld tokens, hidden %lld, %d layers, vocabulary %lld\n\n", s.name,
              static_cast<long long>(s.tokens), static_cast<long long>(s.hidden), s.layers,
              static_cast<long long>(s.vocab));
  std::vector<problem> problems;
  std::vector<problem> all = step_problems(s);
  if (opt.variants) {
    const std::vector<problem> extra = variant_problems(s);
    all.insert(all.end(), extra.begin(), extra.end());
  }
  for (const problem& pr : all)
    if (opt.only.empty() || std::find(opt.only.begin(), opt.only.end(), pr.name) != opt.only.end())
      problems.push_back(pr);
  std::vector<outcome> outcomes;
  for (const problem& pr : problems) {
    if (opt.search_seconds > 0 && !pr.variant) std::fprintf(stderr, "%s %s %s ...\n", s.name, pr.name.c_str(), epi_name(pr.epilogue));
    outcomes.push_back(run_problem(ctx, pr, opt));
    std::fflush(stdout);
  }
  std::printf("| problem | ta tb | m | n | k | epilogue | x/step | timed/returned | lib | default us | default TFLOP/s "
              "| best # | best us | best TFLOP/s | speedup | default algo | best algo | note |\n");
  std::printf("|---|---|--:|--:|--:|---|--:|--:|---|--:|--:|--:|--:|--:|--:|---|---|---|\n");
  double default_ms = 0, best_ms = 0;
  std::string left_out;
  for (std::size_t i = 0; i < problems.size(); ++i) {
    const problem& pr = problems[i];
    const outcome& o = outcomes[i];
    std::printf("| %s | %d %d | %lld | %lld | %lld | %s | %d | %d/%d | %s |", pr.name.c_str(), pr.ta ? 1 : 0,
                pr.tb ? 1 : 0, static_cast<long long>(pr.m), static_cast<long long>(pr.n),
                static_cast<long long>(pr.k), epi_name(o.ran), pr.per_step, o.timed, o.returned,
                o.returned == 0 ? "-" : (o.lib_same ? "=" : "!="));
    if (o.default_us >= 0)
      std::printf(" %.1f | %.1f |", o.default_us, tflops(pr, o.default_us));
    else
      std::printf(" - | - |");
    if (o.best_index >= 0)
      std::printf(" %d | %.1f | %.1f |", o.best_index, o.best_us, tflops(pr, o.best_us));
    else
      std::printf(" - | - | - |");
    if (o.default_us >= 0 && o.best_us > 0)
      std::printf(" %.3f |", o.default_us / o.best_us);
    else
      std::printf(" - |");
    std::printf(" %s | %s | %s |\n", o.default_algo.empty() ? "-" : o.default_algo.c_str(),
                o.best_algo.empty() ? "-" : o.best_algo.c_str(), o.note.c_str());
    if (pr.variant) continue;
    if (o.default_us >= 0 && o.best_us >= 0) {
      default_ms += pr.per_step * o.default_us * 1e-3;
      best_ms += pr.per_step * o.best_us * 1e-3;
    } else {
      left_out += (left_out.empty() ? "" : ", ") + pr.name;
    }
  }
  const double saved = default_ms - best_ms;
  std::printf("\n| GPT-2 %s step GEMMs | default (#0) ms | best-of-candidates ms | saved ms/step | saved %% |\n",
              s.name);
  std::printf("|---|--:|--:|--:|--:|\n");
  std::printf("| %d layers + classifier | %.3f | %.3f | %.3f | %.2f |\n", s.layers, default_ms, best_ms, saved,
              default_ms > 0 ? 100.0 * saved / default_ms : 0.0);
  if (!left_out.empty()) std::printf("\n(left out of the sums, no timed default: %s)\n", left_out.c_str());
  if (opt.search_seconds <= 0) return;
  std::printf("\n#### Search beyond the heuristic: every configuration of every algorithm id (%.0f s per problem)\n\n",
              opt.search_seconds);
  std::printf("| problem | epilogue | ids | checked | accepted | timed | heuristic best us | search best us | "
              "search TFLOP/s | gain over heuristic best | search best algo |\n");
  std::printf("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n");
  double heuristic_ms = 0, search_ms = 0;
  for (std::size_t i = 0; i < problems.size(); ++i) {
    const problem& pr = problems[i];
    const search_outcome& so = outcomes[i].search;
    const double heuristic_us = outcomes[i].best_us;
    std::printf("| %s | %s | %d | %ld | %d | %d |", pr.name.c_str(), epi_name(outcomes[i].ran), so.ids, so.checked,
                so.accepted, so.timed);
    if (heuristic_us > 0) std::printf(" %.1f |", heuristic_us);
    else std::printf(" - |");
    if (so.best_us > 0)
      std::printf(" %.1f | %.1f | %s | %s |\n", so.best_us, tflops(pr, so.best_us),
                  heuristic_us > 0 ? std::to_string(heuristic_us / so.best_us).substr(0, 5).c_str() : "-",
                  so.best_algo.c_str());
    else
      std::printf(" - | - | - | - |\n");
    if (!pr.variant && heuristic_us > 0 && so.best_us > 0) {
      heuristic_ms += pr.per_step * heuristic_us * 1e-3;
      search_ms += pr.per_step * std::min(heuristic_us, so.best_us) * 1e-3;
    }
  }
  std::printf("\n| GPT-2 %s step GEMMs searched | heuristic best ms | with the search ms | saved ms/step |\n|---|--:|--:|--:|\n"
              "| | %.3f | %.3f | %.3f |\n",
              s.name, heuristic_ms, search_ms, heuristic_ms - search_ms);
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: %s [--shape 124M|350M|all] [--candidates N (1..64)] [--verbose] [--variants]\n"
               "       [--search SECONDS] [--only 'fc1 fwd,fc2 dx,...']\n",
               kProgram);
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--shape" && i + 1 < argc) {
      opt.shape = argv[++i];
    } else if (arg == "--candidates" && i + 1 < argc) {
      char* end = nullptr;
      const long value = std::strtol(argv[++i], &end, 10);
      if (!end || *end != '\0' || value < 1 || value > kMaxCandidates) usage();
      opt.candidates = static_cast<int>(value);
    } else if (arg == "--search" && i + 1 < argc) {
      char* end = nullptr;
      opt.search_seconds = std::strtod(argv[++i], &end);
      if (!end || *end != '\0' || !(opt.search_seconds > 0) || opt.search_seconds > 3600) usage();
    } else if (arg == "--only" && i + 1 < argc) {
      const std::string list = argv[++i];
      std::size_t begin = 0;
      while (begin <= list.size()) {
        const std::size_t comma = std::min(list.find(',', begin), list.size());
        if (comma > begin) opt.only.push_back(list.substr(begin, comma - begin));
        begin = comma + 1;
      }
    } else if (arg == "--verbose") {
      opt.verbose = true;
    } else if (arg == "--variants") {
      opt.variants = true;
    } else {
      usage();
    }
  }
  const std::string shape = opt.shape;
  const int candidates = opt.candidates;
  if (shape != "all" && shape != "124M" && shape != "350M") usage();

  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  int runtime = 0;
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("## cuBLASLt heuristic candidates: index 0 against the best of the top %d\n\n", candidates);
  std::printf("%s (sm_%d%d, %d SMs), CUDA runtime %d, cuBLASLt %zu; bf16 in, fp32 compute, 32 MiB workspace; "
              "per candidate: %d warm-up launches, median of %d timed launches (one event pair each)\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount, runtime, cublasLtGetVersion(), kWarmup,
              kTimed);

  context ctx;
  LT_CHECK(cublasLtCreate(&ctx.lt));
  CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaMalloc(&ctx.workspace, kWorkspaceBytes));
  for (int i = 0; i < kTimed; ++i) {
    CUDA_CHECK(cudaEventCreate(&ctx.start[i]));
    CUDA_CHECK(cudaEventCreate(&ctx.stop[i]));
  }

  for (const model_shape& s : kShapes)
    if (shape == "all" || shape == s.name) run_shape(ctx, s, opt);

  for (int i = 0; i < kTimed; ++i) {
    CUDA_CHECK(cudaEventDestroy(ctx.start[i]));
    CUDA_CHECK(cudaEventDestroy(ctx.stop[i]));
  }
  CUDA_CHECK(cudaFree(ctx.workspace));
  CUDA_CHECK(cudaStreamDestroy(ctx.stream));
  LT_CHECK(cublasLtDestroy(ctx.lt));
  return 0;
}
