// bench/bench_grouped_gemm.cu: the MoE experts' GEMMs (layers/moe/experts.hpp) as a loop of one
// cuBLASLt GEMM per expert (the backend's gemm, what grouped_gemm did before) against the backend's
// grouped_gemm (one cublasGemmGroupedBatchedEx call where backend/cuda/grouped_gemm.hpp says it runs),
// at Mixtral-like shapes: 8 experts, each an MLP with swiglu (fc1 [2 ffn, hidden], fc2 [hidden, ffn],
// etp 1), hidden 4096 / ffn 14336 and hidden 2048 / ffn 5632, 8192 and 16384 tokens per rank with
// top-2 routing (16384 and 32768 expert rows), balanced (rows / 8 each) and skewed (one expert 40% of
// the rows, the others an even share of the rest).
//
//   fc1      pre[rows, 2 ffn] = x[rows, hidden] fc1^T           (ta=0, tb=1)
//   fc2      y[rows, hidden] = act[rows, ffn] fc2^T             (ta=0, tb=1)
//   dX       dx[rows, hidden] = dpre[rows, 2 ffn] fc1           (ta=0, tb=0)
//   dW fc1   dfc1[2 ffn, hidden] += dpre^T x, fp32 accumulated  (ta=1, tb=0; bf16 -> fp32 is not in
//            cuBLAS's grouped table, so the grouped column runs the same loop)
//   dW bf16  the same product into a bf16 C: what the grouped call does with this shape (a reference,
//            not what the layer runs)
//
// The "device" columns time what the experts run now: the backend's grouped_gemm_rows /
// grouped_gemm_weights, whose token counts are a device array (CUTLASS's Hopper grouped kernel where
// strata::cuda_kernels was built with it; the line before the table says which). Shapes: the two
// above, and Mixtral-8x-small's (hidden 1024, ffn 3584) at 8192 tokens and at 256-2048 tokens (64-512
// rows per expert: where launches and tails matter).
//
// Each row: the median of 20 timed calls after 3 warm-up calls, with CUDA events on the backend's
// stream; TFLOP/s = 2 m n k summed over the experts / time; speedup = loop / grouped. The "grouped"
// column says how many experts went into the cuBLAS grouped call (0: the loop ran).
//
// It measures and prints; it never asserts (tests/gpu/test_moe.cu checks the results). Built by
// tests/gpu/CMakeLists.txt when STRATA_BUILD_GPU_TESTS is on, or by hand:
//   nvcc -std=c++20 -O3 -arch=sm_90 --expt-relaxed-constexpr -I include bench/bench_grouped_gemm.cu -lcublas -lcublasLt
// Usage: bench_grouped_gemm [--iterations N]   (timed calls per row, default 20)
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include <strata/backend/cuda/backend.cuh>

#include "cuda_timing.hpp"
#include "experts_bench.hpp"

using strata::bf16;
using strata::index_t;

namespace {

constexpr index_t kExperts = strata_bench::kBenchExperts;

void check(cudaError_t status, const char* what) { strata_bench::check_cuda(status, "bench_grouped_gemm", what); }

template <class V>
V* device_array(const strata::cuda::backend& device, std::size_t n, std::uint64_t key) {
  return strata_bench::normal_device_array<V>(device, n, key, "bench_grouped_gemm");
}

double median_ms(const strata::cuda::backend& device, int iterations, const std::function<void()>& call) {
  return strata_bench::median_ms(device, iterations, call, "bench_grouped_gemm");
}

using strata_bench::expert_rows;

// One grouped GEMM of the experts: sizes and pointers per expert, and the same call in the device-count
// form (rows: C[rows, n] = A op(B_e) by row groups; weights: C_e += A_e^T B_e).
template <class C>
struct problem {
  bool ta = false, tb = false, accumulate = false;
  bool weights = false, device_form = true;
  const std::int32_t* counts = nullptr;  // device
  index_t rows = 0, dn = 0, dk = 0;      // rows form: n, k; weights form: m, n
  const bf16* base_a = nullptr;
  const bf16* base_b = nullptr;
  C* base_c = nullptr;
  std::vector<index_t> m, n, k;
  std::vector<const bf16*> a, b;
  std::vector<C*> c;
  double flops() const {
    double sum = 0;
    for (std::size_t e = 0; e < m.size(); ++e) sum += 2.0 * double(m[e]) * double(n[e]) * double(k[e]);
    return sum;
  }
};

// The loop grouped_gemm ran before: one backend gemm per expert, zeros for an empty inner dimension.
template <class C>
void run_loop(const strata::cuda::backend& device, const problem<C>& p) {
  for (std::size_t e = 0; e < p.m.size(); ++e) {
    if (p.m[e] == 0 || p.n[e] == 0) continue;
    if (p.k[e] == 0) {
      if (!p.accumulate) device.fill<C>(p.c[e], p.m[e] * p.n[e], 0.0);
      continue;
    }
    device.gemm<bf16, C>(p.ta, p.tb, p.m[e], p.n[e], p.k[e], p.a[e], p.b[e], p.c[e], p.accumulate);
  }
}
template <class C>
void run_grouped(const strata::cuda::backend& device, const problem<C>& p) {
  device.grouped_gemm<bf16, C>(p.ta, p.tb, kExperts, p.m.data(), p.n.data(), p.k.data(), p.a.data(), p.b.data(), p.c.data(),
                               p.accumulate);
}

template <class C>
void run_device(const strata::cuda::backend& device, const problem<C>& p) {
  if (p.weights) {
    if constexpr (std::is_same_v<C, float>)
      device.grouped_gemm_weights<bf16, float>(kExperts, p.counts, p.rows, p.dn, p.dk, p.base_a, p.base_b, p.c.data(),
                                               p.accumulate);
  } else if constexpr (std::is_same_v<C, bf16>) {
    device.grouped_gemm_rows<bf16>(p.tb, kExperts, p.counts, p.rows, p.dn, p.dk, p.base_a, p.b.data(), p.base_c);
  }
}

struct table_row {
  std::string shape, gemm;
  double loop_ms, grouped_ms, flops;
  std::size_t grouped;
  double device_ms;  // < 0: not measured
};

template <class C>
table_row measure(const strata::cuda::backend& device, int iterations, const std::string& shape, const std::string& gemm,
                  const problem<C>& p) {
  const double loop = median_ms(device, iterations, [&] { run_loop(device, p); });
  const double grouped = median_ms(device, iterations, [&] { run_grouped(device, p); });
  const auto chosen = strata::cuda::groups_in_grouped_call<bf16, C>(kExperts, p.m.data(), p.n.data(), p.k.data(),
                                                                   p.a.data(), p.b.data(), p.c.data());
  const double on_device = p.device_form ? median_ms(device, iterations, [&] { run_device(device, p); }) : -1.0;
  return {shape, gemm, loop, grouped, p.flops(), chosen.size(), on_device};
}

// Whether this cuBLAS takes a grouped GEMM with bf16 operands and an fp32 output (its documented
// table says no); printed so a newer library that does is noticed.
void probe_bf16_to_fp32(const strata::cuda::backend& device) {
#if STRATA_CUBLAS_GROUPED_GEMM
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return;
  cublasSetStream(handle, device.stream());
  const int size = 64;
  bf16* a = device_array<bf16>(device, size * size, 1);
  bf16* b = device_array<bf16>(device, size * size, 2);
  float* c = device_array<float>(device, 2 * size * size, 3);
  void* host[6] = {a, a, b, b, c, c + size * size};
  void** table = nullptr;
  check(cudaMalloc(&table, sizeof host), "cudaMalloc");
  check(cudaMemcpy(table, host, sizeof host, cudaMemcpyHostToDevice), "cudaMemcpy");
  const cublasOperation_t op = CUBLAS_OP_N;
  const int dim = size, group_size = 2;
  const float alpha = 1, beta = 0;
  const cublasStatus_t status = cublasGemmGroupedBatchedEx(handle, &op, &op, &dim, &dim, &dim, &alpha, table, CUDA_R_16BF,
                                                           &dim, table + 2, CUDA_R_16BF, &dim, &beta, table + 4, CUDA_R_32F,
                                                           &dim, 1, &group_size, CUBLAS_COMPUTE_32F);
  check(cudaStreamSynchronize(device.stream()), "cudaStreamSynchronize");
  std::printf("cuBLAS grouped GEMM with bf16 operands and an fp32 output: %s%s\n", cublasGetStatusName(status),
              status == CUBLAS_STATUS_SUCCESS ? " (this cuBLAS takes it: grouped_gemm.hpp could send the weight gradients)"
                                              : " (the weight gradients stay a loop)");
  cudaFree(table);
  for (void* p : {(void*)a, (void*)b, (void*)c}) cudaFree(p);
  cublasDestroy(handle);
#else
  (void)device;
  std::printf("cuBLAS older than 12.5: no grouped GEMM, every grouped_gemm runs the loop\n");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 20;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--iterations") == 0) iterations = std::max(1, std::atoi(argv[i + 1]));
  strata::cuda::backend device(0);
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device.device()), "cudaGetDeviceProperties");
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  std::printf("%s, %d SMs, cuBLAS %d.%d.%d; %d experts, top-2 routing, bf16 operands; median of %d calls\n",
              properties.name, properties.multiProcessorCount, major, minor, patch, static_cast<int>(kExperts), iterations);
  probe_bf16_to_fp32(device);

  std::vector<table_row> rows_out;
  struct model {
    index_t hidden, ffn;
  };
#if defined(STRATA_WITH_CUTLASS) && STRATA_WITH_CUTLASS
  std::printf("device-count grouped GEMM: CUTLASS's Hopper grouped kernel (bf16), %s\n",
              std::getenv("STRATA_DISABLE_CUTLASS") ? "DISABLED by STRATA_DISABLE_CUTLASS" : "enabled");
#else
  std::printf("device-count grouped GEMM: strata::cuda_kernels built without CUTLASS (the counts are read on the host)\n");
#endif
  for (const model shape : {model{4096, 14336}, model{2048, 5632}, model{1024, 3584}}) {
    const index_t h = shape.hidden, f = shape.ffn, f1 = 2 * f;
    const index_t max_rows = 2 * 16384;
    const auto R = static_cast<std::size_t>(max_rows), H = static_cast<std::size_t>(h), F1 = static_cast<std::size_t>(f1);
    const auto E = static_cast<std::size_t>(kExperts), F = static_cast<std::size_t>(f);
    bf16* x = device_array<bf16>(device, R * H, 11);        // [rows, hidden]
    bf16* pre = device_array<bf16>(device, R * F1, 12);     // [rows, 2 ffn]; its first rows x ffn serve as act
    bf16* dpre = device_array<bf16>(device, R * F1, 13);    // [rows, 2 ffn]
    bf16* out = device_array<bf16>(device, R * H, 14);      // y or dx [rows, hidden]
    bf16* fc1 = device_array<bf16>(device, E * F1 * H, 15); // [experts, 2 ffn, hidden]
    bf16* fc2 = device_array<bf16>(device, E * H * F, 16);  // [experts, hidden, ffn]
    float* dfc1 = device_array<float>(device, E * F1 * H, 17);
    bf16* dfc1_bf16 = device_array<bf16>(device, E * F1 * H, 18);
    const std::vector<index_t> token_counts = h == 1024 ? std::vector<index_t>{256, 512, 1024, 2048, 8192}
                                                        : std::vector<index_t>{8192, 16384};
    std::int32_t* counts_device = nullptr;
    check(cudaMalloc(&counts_device, sizeof(std::int32_t) * kExperts), "cudaMalloc");
    for (const index_t tokens : token_counts) {
      for (const bool skewed : {false, true}) {
        if (h == 1024 && skewed) continue;
        const index_t rows = 2 * tokens;
        const auto counts = expert_rows(rows, skewed);
        const std::vector<std::int32_t> counts32(counts.begin(), counts.end());
        check(cudaMemcpy(counts_device, counts32.data(), sizeof(std::int32_t) * kExperts, cudaMemcpyHostToDevice), "cudaMemcpy");
        const std::string label = "h" + std::to_string(h) + " ffn" + std::to_string(f) + " tok" + std::to_string(tokens) +
                                  (skewed ? " skewed" : " balanced");
        problem<bf16> fc1_forward, fc2_forward, dx, dw_bf16;
        problem<float> dw;
        fc1_forward.tb = fc2_forward.tb = true;
        dw.ta = dw_bf16.ta = true;
        dw.accumulate = dw_bf16.accumulate = true;
        index_t at = 0;
        for (index_t e = 0; e < kExperts; ++e) {
          const index_t r = counts[static_cast<std::size_t>(e)];
          const auto add = [](auto& p, index_t m, index_t n, index_t k, const bf16* a, const bf16* b, auto* c) {
            p.m.push_back(m), p.n.push_back(n), p.k.push_back(k), p.a.push_back(a), p.b.push_back(b), p.c.push_back(c);
          };
          add(fc1_forward, r, f1, h, x + at * h, fc1 + e * f1 * h, pre + at * f1);
          add(fc2_forward, r, h, f, pre + at * f, fc2 + e * h * f, out + at * h);
          add(dx, r, h, f1, dpre + at * f1, fc1 + e * f1 * h, out + at * h);
          add(dw, f1, h, r, dpre + at * f1, x + at * h, dfc1 + e * f1 * h);
          add(dw_bf16, f1, h, r, dpre + at * f1, x + at * h, dfc1_bf16 + e * f1 * h);
          at += r;
        }
        const auto device_rows = [&](auto& p, index_t n, index_t k, const bf16* a, auto* c) {
          p.counts = counts_device, p.rows = rows, p.dn = n, p.dk = k, p.base_a = a, p.base_c = c;
        };
        device_rows(fc1_forward, f1, h, x, pre);
        device_rows(fc2_forward, h, f, pre, out);
        device_rows(dx, h, f1, dpre, out);
        dw.weights = true, dw.counts = counts_device, dw.rows = rows, dw.dn = f1, dw.dk = h, dw.base_a = dpre, dw.base_b = x;
        dw_bf16.device_form = false;
        rows_out.push_back(measure(device, iterations, label, "fc1", fc1_forward));
        rows_out.push_back(measure(device, iterations, label, "fc2", fc2_forward));
        rows_out.push_back(measure(device, iterations, label, "dX", dx));
        rows_out.push_back(measure(device, iterations, label, "dW fc1 fp32", dw));
        rows_out.push_back(measure(device, iterations, label, "dW fc1 bf16", dw_bf16));
      }
    }
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cudaFree(counts_device);
    for (void* p : {(void*)x, (void*)pre, (void*)dpre, (void*)out, (void*)fc1, (void*)fc2, (void*)dfc1, (void*)dfc1_bf16})
      cudaFree(p);
  }

  std::printf("\n%-34s %-12s %9s %10s %9s %10s %8s %8s %10s %10s %9s\n", "shape", "gemm", "loop ms", "grouped ms",
              "loop TF/s", "group TF/s", "speedup", "grouped", "device ms", "dev TF/s", "dev/loop");
  for (const table_row& r : rows_out) {
    std::printf("%-34s %-12s %9.3f %10.3f %9.1f %10.1f %7.2fx %5zu/%d", r.shape.c_str(), r.gemm.c_str(), r.loop_ms,
                r.grouped_ms, r.flops / (r.loop_ms * 1e9), r.flops / (r.grouped_ms * 1e9), r.loop_ms / r.grouped_ms,
                r.grouped, static_cast<int>(kExperts));
    if (r.device_ms > 0)
      std::printf(" %10.3f %10.1f %8.2fx\n", r.device_ms, r.flops / (r.device_ms * 1e9), r.loop_ms / r.device_ms);
    else
      std::printf(" %10s %10s %9s\n", "-", "-", "-");
  }
  return 0;
}
