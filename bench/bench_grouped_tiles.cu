// bench/bench_grouped_tiles.cu: which tile the Hopper device-count grouped GEMM (the MoE experts' rows
// form, backend/cuda/library/cutlass/grouped_gemm_sm90_kernel.cuh) should run at which size. Every
// candidate of bench_grouped_tiles_kernels.cuh (schedule, tile, cluster) against a loop of one
// cuBLASLt GEMM per expert (the backend's gemm, the counts known on the host) at the shapes of
// bench_grouped_gemm: 8 experts, top-2, swiglu experts (fc1 [2 ffn, hidden], fc2 [hidden, ffn]),
// hidden 4096 / ffn 14336, 2048 / 5632 and 1024 / 3584 (Mixtral-shaped; 256 to 16384 tokens, so 64 to
// 4096 rows per expert), balanced, and skewed (one expert 40% of the rows) at the two large shapes.
//
//   fc1   pre[rows, 2 ffn] = x[rows, hidden] fc1_e^T   (B [n, k])
//   fc2   y[rows, hidden] = act[rows, ffn] fc2_e^T     (B [n, k])
//   dX    dx[rows, hidden] = dpre[rows, 2 ffn] fc1_e   (B [k, n])
//
// Time: `--calls` calls (default 20) enqueued back to back between two CUDA events, divided by the
// count, the median of 5 such windows after warm-up: the GPU's time when the host runs ahead, as in a
// training step. Each cell is loop / candidate (above 1: the candidate is faster); the last columns
// name the fastest candidate. It measures and prints; it never asserts (tests/gpu/test_moe_grouped
// checks the library's kernels). Built by tests/gpu/CMakeLists.txt where CUTLASS was found.
// Usage: bench_grouped_tiles [--calls N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <strata/backend/cuda/backend.cuh>

#include "bench_grouped_tiles.hpp"
#include "cuda_timing.hpp"
#include "experts_bench.hpp"

using strata::bf16;
using strata::index_t;

namespace {

constexpr index_t kExperts = strata_bench::kBenchExperts;

void check(cudaError_t status, const char* what) { strata_bench::check_cuda(status, "bench_grouped_tiles", what); }

template <class V>
V* device_array(const strata::cuda::backend& device, std::size_t n, std::uint64_t key) {
  return strata_bench::normal_device_array<V>(device, n, key, "bench_grouped_tiles");
}

// `calls` calls back to back between two events, per call; the median of 5 windows after 3 calls.
double back_to_back_ms(const strata::cuda::backend& device, int calls, const std::function<void()>& call) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) call();
  std::vector<double> windows;
  for (int w = 0; w < 5; ++w) {
    check(cudaEventRecord(start, device.stream()), "cudaEventRecord");
    for (int i = 0; i < calls; ++i) call();
    check(cudaEventRecord(stop, device.stream()), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    windows.push_back(ms / calls);
  }
  std::sort(windows.begin(), windows.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return windows[2];
}

using strata_bench::expert_rows;

struct gemm_case {
  const char* name;
  bool tb;        // B [n, k]
  index_t n, k;
  const bf16* a;  // [rows, k]
  std::vector<const bf16*> b;
  bf16* c;        // [rows, n]
};

}  // namespace

int main(int argc, char** argv) {
  int calls = 20;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--calls") == 0) calls = std::max(1, std::atoi(argv[i + 1]));
  strata::cuda::backend device(0);
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device.device()), "cudaGetDeviceProperties");
  const auto nt = strata_bench::candidates_nt(), nn = strata_bench::candidates_nn();
  std::printf("%s, %d SMs; %d experts, top-2, bf16; %d calls back to back per window, median of 5 windows\n",
              properties.name, properties.multiProcessorCount, static_cast<int>(kExperts), calls);
  std::printf("cells: loop ms / candidate ms (candidates: c cooperative, p pingpong; tile M x N; cluster M x N)\n\n");
  std::printf("%-30s %-4s %8s %8s", "shape", "gemm", "loop ms", "TF/s");
  for (const auto& c : nt) std::printf(" %12s", c.name.c_str());
  std::printf("  %-14s %8s\n", "best", "best TF/s");

  struct model {
    index_t hidden, ffn;
    std::vector<index_t> tokens;
  };
  for (const model& shape : {model{4096, 14336, {8192}}, model{2048, 5632, {8192}},
                            model{1024, 3584, {256, 512, 1024, 2048, 4096, 8192, 16384}}}) {
    const index_t h = shape.hidden, f = shape.ffn, f1 = 2 * f;
    const index_t max_rows = 2 * *std::max_element(shape.tokens.begin(), shape.tokens.end());
    const auto R = static_cast<std::size_t>(max_rows), H = static_cast<std::size_t>(h), F1 = static_cast<std::size_t>(f1);
    const auto E = static_cast<std::size_t>(kExperts), F = static_cast<std::size_t>(f);
    bf16* x = device_array<bf16>(device, R * H, 11);
    bf16* pre = device_array<bf16>(device, R * F1, 12);
    bf16* dpre = device_array<bf16>(device, R * F1, 13);
    bf16* out = device_array<bf16>(device, R * H, 14);
    bf16* fc1 = device_array<bf16>(device, E * F1 * H, 15);
    bf16* fc2 = device_array<bf16>(device, E * H * F, 16);
    std::int32_t* counts_device = nullptr;
    check(cudaMalloc(&counts_device, sizeof(std::int32_t) * kExperts), "cudaMalloc");
    for (const index_t tokens : shape.tokens) {
      for (const bool skewed : {false, true}) {
        if (skewed && h == 1024) continue;
        const index_t rows = 2 * tokens;
        const auto counts = expert_rows(rows, skewed);
        const std::vector<std::int32_t> counts32(counts.begin(), counts.end());
        check(cudaMemcpy(counts_device, counts32.data(), sizeof(std::int32_t) * kExperts, cudaMemcpyHostToDevice),
              "cudaMemcpy");
        char label[96];
        std::snprintf(label, sizeof label, "h%lld tok%lld (%lld/e)%s", static_cast<long long>(h),
                      static_cast<long long>(tokens), static_cast<long long>(rows / kExperts), skewed ? " skewed" : "");
        std::vector<gemm_case> cases = {{"fc1", true, f1, h, x, {}, pre},
                                        {"fc2", true, h, f, pre, {}, out},
                                        {"dX", false, h, f1, dpre, {}, out}};
        for (index_t e = 0; e < kExperts; ++e) {
          cases[0].b.push_back(fc1 + e * f1 * h);
          cases[1].b.push_back(fc2 + e * h * f);
          cases[2].b.push_back(fc1 + e * f1 * h);
        }
        for (const gemm_case& g : cases) {
          double flops = 0;
          for (index_t r : counts) flops += 2.0 * double(r) * double(g.n) * double(g.k);
          const double loop = back_to_back_ms(device, calls, [&] {
            index_t at = 0;
            for (index_t e = 0; e < kExperts; ++e) {
              const index_t r = counts[static_cast<std::size_t>(e)];
              if (r > 0)
                device.gemm<bf16, bf16>(false, g.tb, r, g.n, g.k, g.a + at * g.k, g.b[static_cast<std::size_t>(e)],
                                        g.c + at * g.n, false);
              at += r;
            }
          });
          std::printf("%-30s %-4s %8.4f %8.1f", label, g.name, loop, flops / (loop * 1e9));
          const auto& list = g.tb ? nt : nn;
          double best = 1e30;
          std::string best_name;
          for (const auto& c : list) {
            const double ms = back_to_back_ms(device, calls, [&] {
              c.run(device.stream(), device.allocator(), kExperts, counts_device, rows, g.n, g.k, g.a, g.b.data(), g.c);
            });
            if (ms < best) best = ms, best_name = c.name;
            std::printf(" %11.3fx", loop / ms);
          }
          std::printf("  %-14s %8.1f\n", best_name.c_str(), flops / (best * 1e9));
          std::fflush(stdout);
        }
      }
    }
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cudaFree(counts_device);
    for (void* p : {(void*)x, (void*)pre, (void*)dpre, (void*)out, (void*)fc1, (void*)fc2}) cudaFree(p);
  }
  return 0;
}
