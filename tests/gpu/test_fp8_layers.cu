// tests/gpu/test_fp8_layers.cu: ColumnParallelLinear -> RowParallelLinear with FP8 GEMMs on one GPU
// (cuda::backend, NCCL communicator of one rank) against the same layers on the CPU twin
// (cpu::backend, emulated FP8), three steps with the scaling update after each, for both recipes:
// outputs, input gradients, weight gradients and the scaling states (amax histories and scales).
//
// fc2 takes a residual: on the GPU it is added in the FP8 GEMM's epilogue (fp8_gemm_add), on the CPU
// after the product, as the two steps the twin emulates.
//
// Float elements: every cast is bit for bit the CPU's as long as its input is, so the first layer's
// output differs only by the GEMMs' summation order; the second layer's input may then round to a
// neighbouring FP8 code here and there. Tolerance 2e-2 relative, float on the GPU against float on
// the CPU and bf16 against bf16.
//
// Then the MoE experts in FP8 (delayed recipe; layers/moe/experts.hpp), three local experts of
// SwiGLU with groups of 37, 0 and 91 rows and rows outside every group (so the weight gradients'
// groups of transposed codes are padded to 16 columns), three steps, the same comparison.
#include <cmath>
#include <cstdio>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <strata/backend/cpu/backend.hpp>
#include <strata/backend/cuda/backend.cuh>
#include <strata/comm/nccl.hpp>
#include <strata/layers.hpp>
#include <strata/layers/moe/experts.hpp>
#include <strata/policy.hpp>

#include "check.hpp"

namespace {

using namespace strata;
using gpu_test::suite;

template <class T, class Backend, class Comm>
struct Fp8Policy : default_policy {
  using element = T;
  using backend = Backend;
  using comm = Comm;
  static constexpr bool sequence_parallel = false;
};

static_assert(backend_has_fp8<strata::cuda::backend>, "the CUDA backend has the FP8 entry points");

constexpr index_t kRows = 64, kIn = 128, kHidden = 256, kOut = 96;
constexpr int kSteps = 3;

using Values = std::vector<std::vector<double>>;

template <class X, class Space>
std::vector<double> values(const Tensor<X, Space>& t) {
  const Tensor<X> host = to_host(t);
  std::vector<double> out;
  for (index_t i = 0; i < host.numel(); ++i) out.push_back(static_cast<double>(static_cast<float>(host.data()[i])));
  return out;
}

template <class T, class Backend, class Comm>
Values run(Comm& world, Backend device, const Fp8Options& options) {
  using P = Fp8Policy<T, Backend, Comm>;
  using Space = space_t<P>;
  auto ctx = context_t<P>::create(world, ParallelConfig{}, device);
  ctx.fp8 = std::make_shared<Fp8Scaling<Space>>(options, 1);
  std::optional<ColumnParallelLinear<P>> fc1;
  std::optional<RowParallelLinear<P>> fc2;
  {
    Fp8LayerScope<Space> scope(ctx.fp8, 0);
    fc1.emplace(ctx, "fc1", kIn, kHidden);
    fc2.emplace(ctx, "fc2", kHidden, kOut);
  }
  fc1->init(ctx, 7, 0.05);
  fc2->init(ctx, 8, 0.05);
  Values out;
  for (int step = 0; step < kSteps; ++step) {
    Tensor<T> x_host(Shape{kRows, kIn}), dy_host(Shape{kRows, kOut}), r_host(Shape{kRows, kOut});
    for (index_t i = 0; i < x_host.numel(); ++i) x_host[i] = T(float((1 + step) * (rng::normal(100 + step, i))));
    for (index_t i = 0; i < dy_host.numel(); ++i) dy_host[i] = T(float(1e-3 * rng::normal(200 + step, i)));
    for (index_t i = 0; i < r_host.numel(); ++i) r_host[i] = T(float(rng::normal(300 + step, i)));
    Activation<T, layout::replicated, Space> x(to_device<Space>(x_host)), dy(to_device<Space>(dy_host)),
        residual(to_device<Space>(r_host));
    auto [h, s1] = fc1->forward(ctx, x);
    auto [y, s2] = fc2->forward(ctx, h, &residual);  // the GPU adds it in the FP8 GEMM's epilogue
    auto dx = fc1->backward(ctx, s1, fc2->backward(ctx, s2, dy));
    fp8_after_optimizer_step(ctx);
    out.push_back(values(y.tensor));
    out.push_back(values(dx.tensor));
  }
  out.push_back(values(fc1->weight().grad));
  out.push_back(values(fc2->weight().grad));
  out.push_back(values(fc1->fp8_state()->rows));
  out.push_back(values(fc2->fp8_state()->rows));
  ctx.device.synchronize();
  return out;
}

// The experts: three local experts [2 x 256 | 128] -> [128 | 256], groups of 37, 0 and 91 rows of 136.
template <class T, class Backend, class Comm>
Values run_experts(Comm& world, Backend device, const Fp8Options& options) {
  using P = Fp8Policy<T, Backend, Comm>;
  using Space = space_t<P>;
  constexpr index_t h = 128, f = 256, local = 3, rows = 136;
  const std::int32_t counts[local] = {37, 0, 91};
  auto ctx = context_t<P>::create(world, ParallelConfig{}, device);
  ctx.fp8 = std::make_shared<Fp8Scaling<Space>>(options, 1);
  std::optional<GroupedExperts<P, swiglu>> experts;
  {
    Fp8LayerScope<Space> scope(ctx.fp8, 0);
    experts.emplace(ctx, "experts", ExpertsConfig{.hidden_size = h, .ffn_hidden_size = f, .num_experts = local});
  }
  if (!experts->fp8()) throw std::runtime_error("the experts did not take FP8 under the delayed recipe");
  experts->init(ctx, 9, 0.05, 0.05);
  Tensor<std::int32_t> counts_host(Shape{local});
  for (index_t l = 0; l < local; ++l) counts_host[l] = counts[l];
  const auto group_counts = to_device<Space>(counts_host);
  Values out;
  for (int step = 0; step < kSteps; ++step) {
    Tensor<T> x_host(Shape{rows, h}), dy_host(Shape{rows, h});
    for (index_t i = 0; i < x_host.numel(); ++i) x_host[i] = T(float((1 + step) * rng::normal(300 + step, i)));
    for (index_t i = 0; i < dy_host.numel(); ++i) dy_host[i] = T(float(1e-3 * rng::normal(400 + step, i)));
    auto [y, saved] = experts->forward(ctx, to_device<Space>(x_host), group_counts);
    auto dx = experts->backward(ctx, saved, to_device<Space>(dy_host));
    fp8_after_optimizer_step(ctx);
    out.push_back(values(y));
    out.push_back(values(dx));
  }
  experts->for_each_parameter([&](auto& p) { out.push_back(values(p.grad)); });
  out.push_back(values(ctx.fp8->states[0]->rows));
  out.push_back(values(ctx.fp8->states[1]->rows));
  ctx.device.synchronize();
  return out;
}

double relative(const std::vector<double>& a, const std::vector<double>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - ref[i]) * (a[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The four runs of one check: float and bf16, on the CPU twin and on the GPU.
struct Runs {
  Values cpu, cpu_bf16, gpu, gpu_bf16;
};

// `run_one.template operator()<T>(world, device)` for float and bf16 on the CPU twin (cpu::backend,
// one in-process rank) and on the GPU (cuda::backend, one NCCL rank); records that each GPU run's
// worst tensor lies within 2e-2 of its CPU twin's.
template <class RunOne>
Runs run_both_ways(suite& results, const std::string& what, RunOne run_one) {
  Runs r;
  inprocess::run(1, [&](inprocess::communicator& world) {
    r.cpu = run_one.template operator()<float>(world, cpu::backend{});
    r.cpu_bf16 = run_one.template operator()<bf16>(world, cpu::backend{});
  });
  nccl::run(1, [&](nccl::communicator& world) {
    r.gpu = run_one.template operator()<float>(world, strata::cuda::backend(world.device(), world.stream()));
    r.gpu_bf16 = run_one.template operator()<bf16>(world, strata::cuda::backend(world.device(), world.stream()));
  });
  double worst_float = 0, worst_bf16 = 0;
  for (std::size_t i = 0; i < r.cpu.size(); ++i) {
    worst_float = std::max(worst_float, relative(r.gpu[i], r.cpu[i]));
    worst_bf16 = std::max(worst_bf16, relative(r.gpu_bf16[i], r.cpu_bf16[i]));
  }
  results.record(worst_float <= 2e-2, what + ": float on the GPU against the CPU twin, worst tensor " +
                                          gpu_test::format("%.3g", worst_float));
  results.record(worst_bf16 <= 2e-2, what + ": bf16 on the GPU against the bf16 CPU twin, worst tensor " +
                                         gpu_test::format("%.3g", worst_bf16));
  return r;
}

}  // namespace

int main() {
  try {
    suite results("fp8 layers");
    const std::vector<std::pair<std::string, Fp8Options>> recipes = {
        {"hybrid tensorwise", Fp8Options{.format = Fp8Formats::hybrid, .recipe = Fp8RecipeKind::tensorwise}},
        {"hybrid delayed", Fp8Options{.format = Fp8Formats::hybrid, .recipe = Fp8RecipeKind::delayed, .amax_history_len = 4,
                                      .amax_compute_algo = Fp8AmaxAlgo::max}},
        {"e4m3 delayed", Fp8Options{.format = Fp8Formats::e4m3, .recipe = Fp8RecipeKind::delayed}}};
    for (const auto& [name, options] : recipes) {
      const auto dense = run_both_ways(results, name, [&]<class T>(auto& world, auto device) {
        return run<T>(world, device, options);
      });
      const std::size_t last = dense.cpu.size() - 1;
      results.record(relative(dense.gpu[last - 1], dense.cpu[last - 1]) <= 1e-3,
                     name + ": the first layer's scaling state (amax history, scales) matches the CPU's");
      if (options.recipe != Fp8RecipeKind::delayed) continue;  // the experts run FP8 under delayed scaling only
      run_both_ways(results, name + ": MoE experts in FP8", [&]<class T>(auto& world, auto device) {
        return run_experts<T>(world, device, options);
      });
    }
    return results.finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_fp8_layers: %s\n", e.what());
    return 2;
  }
}
