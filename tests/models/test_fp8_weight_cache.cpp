// The FP8 weight cache (core/fp8_recipe.hpp, layers/fp8_linear.hpp) through a whole GPT model: a
// step of several micro-batches (gradient accumulation) casts each FP8 layer's weight once, with
// and without activation recompute; the run equals the run that casts per GEMM bit for bit (double,
// both recipes, tp=1 and tp=2 with sequence parallelism); after an optimizer step the next forward
// casts the new weights again, and without the drop it would not. The norms' FP8 codes (delayed
// recipe) are those of the cast of their output in T, through the same model.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include <strata/models.hpp>
#include <strata/optim.hpp>
#include <strata/policy.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_fp8_weight_cache_cases {

namespace {

using namespace strata;
using Context = ParallelContext<inprocess::communicator>;

template <bool SP>
struct Policy : default_policy {
  using element = double;
  static constexpr bool sequence_parallel = SP;
};

constexpr int kMicroBatches = 3, kSteps = 3;

models::ModelConfig small() {
  models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 64;
  c.seq_length = 16;
  c.vocab_size = 97;
  return c;
}

struct Batch {
  Tensor<std::int32_t> tokens, labels;
  Tensor<float> mask;
};
Batch batch_of(int vocab, index_t b, index_t s, std::uint64_t key) {
  Batch x{Tensor<std::int32_t>(Shape{b, s}), Tensor<std::int32_t>(Shape{b, s}), Tensor<float>(Shape{b, s}, 1.0f)};
  for (index_t i = 0; i < b * s; ++i) {
    x.tokens[i] = static_cast<std::int32_t>(rng::uniform(key, static_cast<std::uint64_t>(i)) * vocab);
    x.labels[i] = static_cast<std::int32_t>(rng::uniform(key + 1, static_cast<std::uint64_t>(i)) * vocab);
  }
  return x;
}

struct Run {
  std::vector<double> losses;                     // rank 0: each micro-batch's loss sum
  std::vector<std::vector<double>> parameters;    // rank 0's local parameters after the last step
  std::vector<std::vector<float>> scaling;        // rank 0's scaling rows after the last step
  std::vector<std::vector<std::int64_t>> casts;   // rank 0: per step, each FP8 layer's weight casts so far
  std::vector<std::int64_t> written;              // rank 0: each FP8 layer's forwards whose input codes a norm wrote
  std::vector<std::int64_t> grads_written;        // rank 0: each FP8 layer's backwards whose dy codes the merge wrote
};

// kSteps steps of kMicroBatches micro-batches each (forward, backward; gradients accumulate), then
// AdamW and fp8_after_optimizer_step, on `tp` ranks.
template <bool SP, template <class> class Model = models::Gpt>
Run train(int tp, Fp8Options options, models::RecomputeConfig recompute) {
  Run run;
  std::mutex mutex;
  const models::ModelConfig config = small();
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = tp});
    ctx.fp8 = std::make_shared<Fp8Scaling<space::host>>(options, static_cast<int>(config.num_layers));
    Model<Policy<SP>> model(ctx, config);
    model.init(ctx, 7);
    model.set_recompute(recompute);
    AdamW<double> optimizer(model);
    EXPECT_EQ(ctx.fp8->states.size(), 4u * static_cast<std::size_t>(config.num_layers)) << "QKV, projection, fc1, fc2 per layer";
    for (int step = 0; step < kSteps; ++step) {
      zero_gradients(model);
      for (int micro = 0; micro < kMicroBatches; ++micro) {
        const Batch b = batch_of(config.vocab_size, 2, config.seq_length, 31 + 10 * static_cast<std::uint64_t>(step * kMicroBatches + micro));
        auto [loss, saved] = model.forward(ctx, b.tokens, b.labels, b.mask, 1234, models::FusedLoss{1.0 / 64});
        model.backward(ctx, saved, 1.0 / 64);
        if (world.rank() == 0) {
          std::lock_guard lock(mutex);
          run.losses.push_back(loss.loss_sum());
        }
      }
      if (world.rank() == 0) {
        std::lock_guard lock(mutex);
        std::vector<std::int64_t> casts;
        for (const auto& state : ctx.fp8->states) casts.push_back(state->weight_casts);
        run.casts.push_back(std::move(casts));
      }
      optimizer.step(model, 1e-2);
      fp8_after_optimizer_step(ctx);
    }
    if (world.rank() != 0) return;
    std::lock_guard lock(mutex);
    model.for_each_parameter([&](auto& p) { run.parameters.emplace_back(p.value.begin(), p.value.end()); });
    for (const auto& state : ctx.fp8->states) {
      run.scaling.emplace_back(state->rows.begin(), state->rows.end());
      run.written.push_back(state->inputs_written);
      run.grads_written.push_back(state->grads_written);
    }
  });
  return run;
}

Fp8Options options_of(Fp8RecipeKind recipe, bool cache) {
  Fp8Options o{.format = Fp8Formats::hybrid, .recipe = recipe};
  if (recipe == Fp8RecipeKind::delayed) {
    o.amax_history_len = 3;
    o.amax_compute_algo = Fp8AmaxAlgo::max;
  }
  o.cache_weights = cache;
  return o;
}

std::vector<models::RecomputeConfig> recomputes() {
  using G = models::RecomputeGranularity;
  using M = models::RecomputeMethod;
  return {{}, {G::selective, M::uniform, 1}, {G::full, M::uniform, 1}};
}

std::string describe(Fp8RecipeKind recipe, const models::RecomputeConfig& r, int tp) {
  return std::string(fp8_recipe_name(recipe)) + " tp=" + std::to_string(tp) + " recompute " +
         (r.granularity == models::RecomputeGranularity::none   ? "off"
          : r.granularity == models::RecomputeGranularity::full ? "full"
                                                               : "selective");
}

// Each FP8 layer casts its weight once per step, whatever the micro-batches and the recompute; the
// run equals the run that casts per GEMM bit for bit (losses, parameters, amax histories, scales).
template <bool SP>
void check_cache(int tp) {
  for (Fp8RecipeKind recipe : {Fp8RecipeKind::delayed, Fp8RecipeKind::tensorwise})
    for (const auto& recompute : recomputes()) {
      const std::string what = describe(recipe, recompute, tp) + (SP ? " sequence parallel" : "");
      const Run cached = train<SP>(tp, options_of(recipe, true), recompute);
      const Run per_gemm = train<SP>(tp, options_of(recipe, false), recompute);
      ASSERT_EQ(cached.casts.size(), static_cast<std::size_t>(kSteps)) << what;
      for (int step = 0; step < kSteps; ++step)
        for (std::size_t layer = 0; layer < cached.casts[step].size(); ++layer) {
          EXPECT_EQ(cached.casts[step][layer], step + 1) << what << ": step " << step << ", FP8 layer " << layer;
          // without the cache: the forward and the input gradient of every micro-batch (and the recomputed forward)
          EXPECT_GE(per_gemm.casts[step][layer], 2 * kMicroBatches * (step + 1)) << what << ": step " << step << ", FP8 layer " << layer;
        }
      EXPECT_EQ(cached.losses, per_gemm.losses) << what;
      EXPECT_EQ(cached.parameters, per_gemm.parameters) << what;
      EXPECT_EQ(cached.scaling, per_gemm.scaling) << what;
    }
}

TEST(Fp8WeightCache, OneCastPerStepAndEqualsCastPerGemmOnOneRank) { check_cache<false>(1); }
TEST(Fp8WeightCache, OneCastPerStepAndEqualsCastPerGemmAtTp2WithSequenceParallel) { check_cache<true>(2); }

// Under the delayed recipe the norms write the qkv projection's and fc1's input codes themselves
// (Fp8Options::norm_writes_codes): every forward of those two layers, recomputed ones included, takes
// the norm's codes, the others cast their input; and the run is the run whose norms write T and
// whose linear layers cast it, bit for bit (losses, parameters, amax histories, scales), on one rank
// and at tp=2 with sequence parallelism (each rank's codes gathered).
template <bool SP>
void check_norm_codes(int tp) {
  for (const auto& recompute : recomputes()) {
    const std::string what = describe(Fp8RecipeKind::delayed, recompute, tp) + (SP ? " sequence parallel" : "");
    Fp8Options cast = options_of(Fp8RecipeKind::delayed, true);
    cast.norm_writes_codes = false;
    const Run written = train<SP>(tp, options_of(Fp8RecipeKind::delayed, true), recompute);
    const Run casting = train<SP>(tp, cast, recompute);
    ASSERT_EQ(written.written.size(), 8u) << what;
    const std::int64_t forwards = kSteps * kMicroBatches * (recompute.granularity == models::RecomputeGranularity::full ? 2 : 1);
    for (std::size_t layer = 0; layer < written.written.size(); ++layer) {
      const bool qkv_or_fc1 = layer % 2 == 0;  // QKV, projection, fc1, fc2 per layer
      EXPECT_EQ(written.written[layer], qkv_or_fc1 ? forwards : 0) << what << ": FP8 layer " << layer;
      EXPECT_EQ(casting.written[layer], 0) << what << ": FP8 layer " << layer;
    }
    EXPECT_EQ(written.losses, casting.losses) << what;
    EXPECT_EQ(written.parameters, casting.parameters) << what;
    EXPECT_EQ(written.scaling, casting.scaling) << what;
  }
}

TEST(Fp8WeightCache, NormsWriteQkvAndFc1CodesAsTheCastOnOneRank) { check_norm_codes<false>(1); }
TEST(Fp8WeightCache, NormsWriteQkvAndFc1CodesAsTheCastAtTp2WithSequenceParallel) { check_norm_codes<true>(2); }

// Llama (RoPE, so q, k, v are split and merged): the merge with RoPE's backward writes the qkv
// projection's output-gradient codes (Fp8Options::attention_writes_grad_codes) in every backward, and
// the norms the qkv and fc1 input codes; the run is the run in which every one of those tensors is
// written in T and cast by its layer, bit for bit, on one rank and at tp=2 with sequence parallelism,
// with no, selective and full recompute (whose backward merges as well).
template <bool SP>
void check_llama_codes(int tp) {
  for (const auto& recompute : recomputes()) {
    const std::string what = "llama " + describe(Fp8RecipeKind::delayed, recompute, tp) + (SP ? " sequence parallel" : "");
    Fp8Options cast = options_of(Fp8RecipeKind::delayed, true);
    cast.norm_writes_codes = false;
    cast.attention_writes_grad_codes = false;
    const Run written = train<SP, models::Llama>(tp, options_of(Fp8RecipeKind::delayed, true), recompute);
    const Run casting = train<SP, models::Llama>(tp, cast, recompute);
    ASSERT_EQ(written.grads_written.size(), 8u) << what;
    const std::int64_t backwards = kSteps * kMicroBatches;
    const std::int64_t forwards = backwards * (recompute.granularity == models::RecomputeGranularity::full ? 2 : 1);
    for (std::size_t layer = 0; layer < written.grads_written.size(); ++layer) {
      EXPECT_EQ(written.grads_written[layer], layer % 4 == 0 ? backwards : 0) << what << ": FP8 layer " << layer;
      EXPECT_EQ(written.written[layer], layer % 2 == 0 ? forwards : 0) << what << ": FP8 layer " << layer;
      EXPECT_EQ(casting.grads_written[layer] + casting.written[layer], 0) << what << ": FP8 layer " << layer;
    }
    EXPECT_EQ(written.losses, casting.losses) << what;
    EXPECT_EQ(written.parameters, casting.parameters) << what;
    EXPECT_EQ(written.scaling, casting.scaling) << what;
  }
}

TEST(Fp8WeightCache, LlamaMergeWritesQkvGradientCodesAsTheCastOnOneRank) { check_llama_codes<false>(1); }
TEST(Fp8WeightCache, LlamaMergeWritesQkvGradientCodesAsTheCastAtTp2WithSequenceParallel) { check_llama_codes<true>(2); }

// After a weight change the next forward casts the new weights: with the drop
// (fp8_after_optimizer_step, or fp8_drop_weight_caches after a write of one's own) the forward
// equals the cast-per-GEMM run; without it the cached codes of the old weights would be used.
TEST(Fp8WeightCache, ANewWeightIsCastAgainAfterTheDrop) {
  enum class After { optimizer_step_hook, drop_only, nothing };
  auto second_loss = [](bool cache, After after) {
    double loss_after = 0;
    std::int64_t casts = 0;
    const models::ModelConfig config = small();
    inprocess::run(1, [&](inprocess::communicator& world) {
      auto ctx = Context::create(world, ParallelConfig{});
      // tensorwise: no scale changes at the step, so only the weight change moves the second forward
      ctx.fp8 = std::make_shared<Fp8Scaling<space::host>>(options_of(Fp8RecipeKind::tensorwise, cache),
                                                          static_cast<int>(config.num_layers));
      models::Gpt<Policy<false>> model(ctx, config);
      model.init(ctx, 7);
      AdamW<double> optimizer(model);
      const Batch b = batch_of(config.vocab_size, 2, config.seq_length, 5);
      auto [loss, saved] = model.forward(ctx, b.tokens, b.labels, b.mask, 1234, models::FusedLoss{1.0 / 64});
      model.backward(ctx, saved, 1.0 / 64);
      optimizer.step(model, 1e-1);
      if (after == After::optimizer_step_hook) fp8_after_optimizer_step(ctx);
      if (after == After::drop_only) fp8_drop_weight_caches(ctx);
      auto [again, saved_again] = model.forward(ctx, b.tokens, b.labels, b.mask, 1234, models::FusedLoss{1.0 / 64});
      loss_after = again.loss_sum();
      casts = ctx.fp8->states.front()->weight_casts;
    });
    return std::pair{loss_after, casts};
  };
  const auto [reference, reference_casts] = second_loss(false, After::nothing);  // casts the new weights, always
  const auto [hooked, hooked_casts] = second_loss(true, After::optimizer_step_hook);
  const auto [dropped, dropped_casts] = second_loss(true, After::drop_only);
  const auto [stale, stale_casts] = second_loss(true, After::nothing);
  EXPECT_EQ(hooked, reference);
  EXPECT_EQ(hooked_casts, 2);
  EXPECT_EQ(dropped, reference);
  EXPECT_EQ(dropped_casts, 2);
  EXPECT_NE(stale, reference) << "the step changed no weight the FP8 layers read";
  EXPECT_EQ(stale_casts, 1) << "without a drop the cache is kept";
  EXPECT_GE(reference_casts, 3);
}

}  // namespace
}  // namespace test_fp8_weight_cache_cases
