// bench/bench_attention_plans.cu: every engine configuration cuDNN offers for strata's attention
// graphs (backend/cuda/cudnn_sdpa.hpp: causal, grouped-query, bf16, the backward deterministic as
// the trainers build it), timed at the shapes of the benchmark models: GPT 1.41B (seq 1024, batch 8,
// 16 heads of 128), a Llama of 3.0B (seq 4096, batch 2, 24 query heads in 8 groups, 128) and the
// Mixtral-shaped MoE model (seq 1024, batch 8, 16 heads in 8 groups, 64).
//
// For each graph: the configurations heuristics A and the fallback list give (plan 0 is heuristics
// A's choice, the one the trainers run), each timed with CUDA events: 3 warm-up calls, then the
// median of 10. TFLOP/s counts the causal half of the score and value products (forward 2 products,
// backward 5). It measures and prints; it never asserts (tests/gpu/test_attention.cu checks results).
// Built by tests/gpu/CMakeLists.txt where strata::cudnn is found.
// Usage: bench_attention_plans
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include <strata/backend/cuda/cudnn_sdpa.hpp>

namespace {

namespace sdpa = strata::cuda::sdpa;
using strata::bf16;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "bench_attention_plans: %s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

void* device_bytes(std::size_t bytes, int fill) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<std::size_t>(bytes, 16)), "cudaMalloc");
  check(cudaMemset(p, fill, std::max<std::size_t>(bytes, 16)), "cudaMemset");
  return p;
}

struct model_shape {
  const char* name;
  std::int64_t s, b, heads, groups, d;
};

// Median milliseconds of 10 calls of plan `index` after 3 warm-up calls.
double time_plan(const sdpa::graph_entry& entry, cudnnHandle_t handle, std::unordered_map<std::int64_t, void*>& pack,
                 void* workspace, std::int64_t index, cudaStream_t stream, std::string& error) {
  for (int i = 0; i < 3; ++i)
    if (auto st = entry.graph->execute_plan_at_index(handle, pack, workspace, index); !st.is_good()) {
      error = st.get_message();
      return -1;
    }
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> times;
  for (int i = 0; i < 10; ++i) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    (void)entry.graph->execute_plan_at_index(handle, pack, workspace, index);
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main() {
  cudnnHandle_t handle;
  STRATA_CUDNN_CHECK(cudnnCreate(&handle));
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  STRATA_CUDNN_CHECK(cudnnSetStream(handle, stream));
  const model_shape shapes[] = {{"GPT 1.41B", 1024, 8, 16, 16, 128},
                                {"Llama 3.0B", 4096, 2, 24, 8, 128},
                                {"Mixtral-shaped MoE", 1024, 8, 16, 8, 64}};
  std::printf("%-20s %-9s %5s %-64s %10s %9s\n", "model", "graph", "plan", "engine configuration", "ms", "TFLOP/s");
  for (const auto& m : shapes) {
    const sdpa::shape x{m.s, m.b, m.heads, m.groups, m.d,
                        strata::AttentionStrides{}.resolved(m.heads, m.groups, m.d), true};
    const std::size_t nq = static_cast<std::size_t>(m.s * m.b * m.heads * m.d), nk = static_cast<std::size_t>(m.s * m.b * m.groups * m.d);
    void* q = device_bytes(nq * 2, 0x3c);  // bf16 0x3c3c, about 0.0115: finite scores
    void* k = device_bytes(nk * 2, 0x3c);
    void* v = device_bytes(nk * 2, 0x3c);
    void* o = device_bytes(nq * 2, 0);
    void* dout = device_bytes(nq * 2, 0x3c);
    void* dq = device_bytes(nq * 2, 0);
    void* dk = device_bytes(nk * 2, 0);
    void* dv = device_bytes(nk * 2, 0);
    void* stats = device_bytes(static_cast<std::size_t>(m.b * m.heads * m.s) * 4, 0);
    float scale = 1.0f / std::sqrt(static_cast<float>(m.d));
    const double products = 2.0 * m.b * m.heads * static_cast<double>(m.s) * m.s * m.d / 2;  // one causal product
    for (const bool backward : {false, true}) {
      const sdpa::graph_entry entry = backward ? sdpa::build_backward<bf16>(handle, x, true, true)
                                               : sdpa::build_forward<bf16>(handle, x, true);
      if (!entry.refusal.empty()) {
        std::printf("%-20s %-9s refused: %s\n", m.name, backward ? "backward" : "forward", entry.refusal.c_str());
        continue;
      }
      void* workspace = device_bytes(static_cast<std::size_t>(entry.workspace_bytes), 0);
      std::unordered_map<std::int64_t, void*> pack{{sdpa::kQ, q}, {sdpa::kK, k}, {sdpa::kV, v}, {sdpa::kO, o},
                                                   {sdpa::kStats, stats}, {sdpa::kScale, &scale}};
      if (backward) {
        pack[sdpa::kDO] = dout;
        pack[sdpa::kDQ] = dq;
        pack[sdpa::kDK] = dk;
        pack[sdpa::kDV] = dv;
      }
      for (std::int64_t i = 0; i < entry.graph->get_execution_plan_count(); ++i) {
        std::string name, error;
        (void)entry.graph->get_plan_name_at_index(i, name);
        const double ms = time_plan(entry, handle, pack, workspace, i, stream, error);
        if (ms < 0) {
          std::printf("%-20s %-9s %5lld %-64s failed: %s\n", m.name, backward ? "backward" : "forward",
                      static_cast<long long>(i), name.c_str(), error.c_str());
          continue;
        }
        const double flops = (backward ? 5 : 2) * products;
        std::printf("%-20s %-9s %5lld %-64s %10.3f %9.1f\n", m.name, backward ? "backward" : "forward",
                    static_cast<long long>(i), name.c_str(), ms, flops / (ms * 1e9));
      }
      cudaFree(workspace);
    }
    for (void* p : {q, k, v, o, dout, dq, dk, dv, stats}) cudaFree(p);
  }
  cudnnDestroy(handle);
  return 0;
}
