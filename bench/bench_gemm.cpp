// bench_gemm: strata::cpu::gemm (Eigen underneath) in GFLOP/s, float and double, for square
// problems and the GEMMs of a GPT-2-small-sized transformer layer (hidden 768, 4x MLP,
// 1024 tokens per micro-batch), forward and the two backward forms.
//
// FLOPs per call: 2*m*n*k. The counter "FLOP/s" is printed with SI prefixes (G/s = GFLOP/s).
// Eigen runs on one thread here unless the program is built with OpenMP.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include <strata/backend/cpu.hpp>
#include <strata/core.hpp>

namespace {

struct Problem {
  const char* name;
  bool transpose_a, transpose_b;
  strata::index_t m, n, k;
};

// The transformer shapes, with T tokens, hidden D = 768, MLP width 4D:
//   qkv      Y[T,3D] = X[T,D] W[D,3D]
//   mlp_up   Y[T,4D] = X[T,D] W[D,4D]
//   mlp_down Y[T,D]  = X[T,4D] W[4D,D]
//   dX       dX[T,D] = dY[T,4D] W[D,4D]^T   (transpose_b)
//   dW       dW[D,4D] += X[T,D]^T dY[T,4D]  (transpose_a, accumulating as gradients do)
constexpr strata::index_t T = 1024, D = 768;
const Problem kProblems[] = {
    {"square_256", false, false, 256, 256, 256},
    {"square_512", false, false, 512, 512, 512},
    {"square_1024", false, false, 1024, 1024, 1024},
    {"qkv", false, false, T, 3 * D, D},
    {"mlp_up", false, false, T, 4 * D, D},
    {"mlp_down", false, false, T, D, 4 * D},
    {"mlp_up_dX", false, true, T, D, 4 * D},
    {"mlp_up_dW", true, false, D, 4 * D, T},
};

template <class T>
void gemm(benchmark::State& state, Problem p) {
  const bool accumulate = p.transpose_a;  // the weight-gradient form accumulates
  std::vector<T> a(static_cast<std::size_t>(p.m * p.k)), b(static_cast<std::size_t>(p.k * p.n)),
      c(static_cast<std::size_t>(p.m * p.n), T(0));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<T>(strata::rng::uniform(1, i) - 0.5);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<T>(strata::rng::uniform(2, i) - 0.5);
  for (auto _ : state) {
    strata::cpu::gemm<T>(p.transpose_a, p.transpose_b, p.m, p.n, p.k, a.data(), b.data(), c.data(), accumulate);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::to_string(p.m) + "x" + std::to_string(p.n) + "x" + std::to_string(p.k) +
                 (p.transpose_a ? " A^T" : "") + (p.transpose_b ? " B^T" : ""));
}

const bool registered = [] {
  for (const Problem& p : kProblems) {
    benchmark::RegisterBenchmark((std::string("gemm<float>/") + p.name).c_str(), gemm<float>, p)
        ->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("gemm<double>/") + p.name).c_str(), gemm<double>, p)
        ->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
