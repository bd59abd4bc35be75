// bench/bench_activation_dispatch.cpp: what choosing an option at run time costs a step, on the
// MLP activation: a Llama-style TransformerLayer (RMSNorm, GQA attention with RoPE, SwiGLU MLP) in
// float on one CPU rank, forward + backward of a [s=128, b=4, h=256] input, built once with the
// static tag Mlp<P, swiglu> (the other activations not compiled) and once with
// Mlp<P, configured_activation<swiglu>> (the activation read from MlpConfig at construction, every
// activation compiled, one branch per call of the block). Also the same layer with the run-time
// options the compiled models gained (qk norms, kv-channels, Llama 3.1 scaling) to show what each
// option costs when used. Results: bench/RESULTS.md.
#include <benchmark/benchmark.h>

#include <strata/layers.hpp>
#include <strata/policy.hpp>

namespace {

struct Policy : strata::default_policy {
  using element = float;
};
using Context = strata::context_t<Policy>;

template <class MlpBlock>
void layer_step(benchmark::State& state, strata::AttentionConfig attention) {
  using namespace strata;
  using Layer = TransformerLayer<Policy, RmsNorm, SelfAttention<Policy, rope, gqa>, MlpBlock>;
  constexpr index_t s = 128, b = 4, h = 256;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    Layer layer(ctx, "layer", TransformerLayerConfig{h, 1e-5, 0.0}, attention, MlpConfig{h, 704, false});
    layer.init(ctx, 7, 0.02, 0.02);
    typename Layer::Act x(Tensor<float>(Shape{s, b, h}));
    for (index_t i = 0; i < x.tensor.numel(); ++i) x.tensor[i] = static_cast<float>(rng::normal(3, static_cast<std::uint64_t>(i)));
    for (auto _ : state) {
      auto [y, saved] = layer.forward(ctx, x);
      auto dx = layer.backward(ctx, saved, y);
      benchmark::DoNotOptimize(dx.tensor.data());
    }
    state.SetItemsProcessed(state.iterations() * s * b);
  });
}

strata::AttentionConfig plain() { return strata::AttentionConfig{256, 8, 4, 10000.0, false, 0.0}; }

void BM_LayerStaticSwiglu(benchmark::State& state) { layer_step<strata::Mlp<Policy, strata::swiglu>>(state, plain()); }
void BM_LayerConfiguredSwiglu(benchmark::State& state) {
  layer_step<strata::Mlp<Policy, strata::configured_activation<strata::swiglu>>>(state, plain());
}
void BM_LayerConfiguredSwigluQkNormKvChannels(benchmark::State& state) {
  auto a = plain();
  a.qk_norm = strata::QkNorm::rmsnorm;
  a.kv_channels = 48;
  layer_step<strata::Mlp<Policy, strata::configured_activation<strata::swiglu>>>(state, a);
}
void BM_LayerConfiguredSwigluLlama31Rope(benchmark::State& state) {
  auto a = plain();
  a.rope.scaling_factor = 8;
  layer_step<strata::Mlp<Policy, strata::configured_activation<strata::swiglu>>>(state, a);
}

BENCHMARK(BM_LayerStaticSwiglu)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_LayerConfiguredSwiglu)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_LayerConfiguredSwigluQkNormKvChannels)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_LayerConfiguredSwigluLlama31Rope)->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
