// Shared body of the whole-model tests: a model on tp in {1, 2, 4}, with and without sequence
// parallelism, against the single-rank run: loss and every gathered gradient; and a
// finite-difference check of the whole model in double.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include <strata/models.hpp>
#include <strata/policy.hpp>

#include "../common/equivalence.hpp"

namespace strata_test {

template <class T, bool SP>
using ModelPolicy = TestPolicy<T, SP>;

struct TokenBatch {
  strata::Tensor<std::int32_t> tokens, labels;
  strata::Tensor<float> mask;
};

// DeepSeek-V3's attention at a toy size on `c`: queries through a latent of 12, keys and values
// through one of 10 (both RMS-normalized), heads of 6 + 4 dimensions (4 turned by RoPE), values of 5.
inline strata::models::ModelConfig with_latent_attention(strata::models::ModelConfig c) {
  c.multi_latent_attention = true;
  c.qk_layernorm = true;  // the latents' RMSNorms
  c.q_lora_rank = 12;
  c.kv_lora_rank = 10;
  c.qk_head_dim = 6;
  c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 5;
  return c;
}

inline TokenBatch random_batch(int vocab, strata::index_t b, strata::index_t s, std::uint64_t key) {
  using namespace strata;
  TokenBatch batch{Tensor<std::int32_t>(Shape{b, s}), Tensor<std::int32_t>(Shape{b, s}), Tensor<float>(Shape{b, s})};
  for (index_t i = 0; i < b * s; ++i) {
    batch.tokens[i] = static_cast<std::int32_t>(rng::uniform(key, static_cast<std::uint64_t>(i)) * vocab);
    batch.labels[i] = static_cast<std::int32_t>(rng::uniform(key + 1, static_cast<std::uint64_t>(i)) * vocab);
    batch.mask[i] = (i % 7 == 3) ? 0.0f : 1.0f;  // some masked positions
  }
  return batch;
}

// How a run takes the output layer and the loss: the unfused path (logits made whole), or the
// fused chunked path with blocks of `chunk_rows` rows (0: the default byte budget).
struct LossPath {
  bool fused = false;
  strata::index_t chunk_rows = 0;
  bool tp_comm_overlap = false;  // ParallelContext::tp_comm_overlap (ring gathers, chained backward)
};

// Runs two micro-batches forward and backward (gradients accumulate) on `tp` ranks.
template <template <class> class Model, class T, bool SP>
Snapshot run_model(int tp, const strata::models::ModelConfig& config, LossPath path = {}) {
  using namespace strata;
  using P = ModelPolicy<T, SP>;
  Snapshot snapshot;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    ctx.tp_comm_overlap = path.tp_comm_overlap;
    Model<P> model(ctx, config);
    model.init(ctx, 1234);
    const double loss_scale = 1.0 / 30.0;
    for (int micro = 0; micro < 2; ++micro) {
      TokenBatch batch = random_batch(config.vocab_size, 2, config.seq_length, 77 + 10 * micro);
      auto [loss, saved] = path.fused ? model.forward(ctx, batch.tokens, batch.labels, batch.mask, 99 + micro,
                                                      models::FusedLoss{loss_scale, {path.chunk_rows}})
                                      : model.forward(ctx, batch.tokens, batch.labels, batch.mask, 99 + micro);
      if (path.fused) {  // nothing of the size of the logits is kept for backward
        EXPECT_TRUE(saved.loss.logits.empty());
        EXPECT_TRUE(saved.output.input.empty());
        EXPECT_EQ(saved.final_norm_output_gradient.tensor.numel(),
                  config.seq_length * 2 * config.hidden_size / (SP ? tp : 1));
      }
      // the forward-only loss of validation, in blocks of the same rows
      const double evaluated =
          model.evaluate(ctx, batch.tokens, batch.labels, batch.mask, 99 + micro, ClassifierChunks{path.chunk_rows}).loss_sum();
      if (config.hidden_dropout == 0 && config.attention_dropout == 0) {  // evaluation runs without dropout
        EXPECT_NEAR(evaluated, loss.loss_sum(), tolerance<T>() * std::abs(loss.loss_sum()));
      }
      model.backward(ctx, saved, loss_scale);
      if (world.rank() == 0) {
        std::lock_guard lock(mutex);
        snapshot.outputs.push_back({loss.loss_sum(), loss.tokens, evaluated});
      }
    }
    gather_parameters(ctx, model, snapshot, mutex);
  });
  return snapshot;
}

// The fused chunked classifier against the unfused path on the same ranks: losses and every
// gradient, for each tp in `tps`, with and without sequence parallelism (where the sequence divides
// over tp), with the default block (all rows of these small models), a block of one row, and a block
// that does not divide the rows.
template <template <class> class Model, class T>
void expect_fused_classifier_equals_unfused(const strata::models::ModelConfig& config, std::initializer_list<int> tps) {
  const strata::index_t rows = 2 * config.seq_length;
  for (int tp : tps) {
    for (bool sp : {false, true}) {
      if (sp && config.seq_length % tp != 0) continue;
      const Snapshot reference = sp ? run_model<Model, T, true>(tp, config) : run_model<Model, T, false>(tp, config);
      for (strata::index_t chunk : {strata::index_t{0}, strata::index_t{1}, strata::index_t{5}}) {
        if (chunk == 5) {
          EXPECT_NE(rows % chunk, 0) << "the uneven block must leave a shorter last block";
        }
        const LossPath path{true, chunk};
        const std::string what = "tp=" + std::to_string(tp) + (sp ? " sequence parallel" : "") + ", chunk_rows=" +
                                 std::to_string(chunk);
        expect_equivalent(sp ? run_model<Model, T, true>(tp, config, path) : run_model<Model, T, false>(tp, config, path),
                          reference, tolerance<T>(), what);
      }
    }
  }
}

template <template <class> class Model, class T>
void expect_model_equivalence(const strata::models::ModelConfig& config) {
  const Snapshot reference = run_model<Model, T, false>(1, config);
  ASSERT_FALSE(reference.grads.empty());
  for (int tp : {1, 2, 4}) {
    expect_equivalent(run_model<Model, T, false>(tp, config), reference, tolerance<T>(), "tp=" + std::to_string(tp));
    expect_equivalent(run_model<Model, T, true>(tp, config), reference, tolerance<T>(),
                      "tp=" + std::to_string(tp) + " sequence parallel");
    // Tensor-parallel communication beside the GEMMs: the column layers' ring gathers and the
    // chained backward, with the unfused and the fused (chunked) classifier.
    for (const bool fused : {false, true})
      expect_equivalent(run_model<Model, T, true>(tp, config, LossPath{fused, 0, true}), reference, tolerance<T>(),
                        "tp=" + std::to_string(tp) + " sequence parallel, tp_comm_overlap" + (fused ? ", fused loss" : ""));
  }
}

// Central differences on a sample of every parameter's elements, single rank, double.
template <template <class> class Model>
void expect_finite_difference_gradients(const strata::models::ModelConfig& config) {
  using namespace strata;
  using P = ModelPolicy<double, false>;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    Model<P> model(ctx, config);
    model.init(ctx, 4321);
    TokenBatch batch = random_batch(config.vocab_size, 2, config.seq_length, 5);
    auto loss = [&] { return model.forward(ctx, batch.tokens, batch.labels, batch.mask).first.loss_sum(); };
    auto [l0, saved] = model.forward(ctx, batch.tokens, batch.labels, batch.mask);
    model.backward(ctx, saved, 1.0);
    int checked = 0;
    model.for_each_parameter([&](Parameter<double>& p) {
      const index_t n = p.value.numel(), stride = std::max<index_t>(1, n / 5);
      for (index_t i = (p.name.size() * 7) % stride; i < n; i += stride) {
        const double saved_value = p.value[i], eps = 1e-5;
        p.value[i] = saved_value + eps;
        const double plus = loss();
        p.value[i] = saved_value - eps;
        const double minus = loss();
        p.value[i] = saved_value;
        const double numeric = (plus - minus) / (2 * eps);
        EXPECT_NEAR(p.grad[i], numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << p.name << "[" << i << "]";
        ++checked;
      }
    });
    EXPECT_GT(checked, 20);
  });
}

}  // namespace strata_test

namespace strata_test {

// next_token_logits agrees with the loss (-log softmax at the label = the masked per-token loss)
// and is the same on every tensor-parallel size.
template <template <class> class Model, bool SP>
std::vector<double> next_token_logits_checked(int tp, const strata::models::ModelConfig& config, strata::index_t position) {
  using namespace strata;
  using P = ModelPolicy<double, SP>;
  std::vector<double> result;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    Model<P> model(ctx, config);
    model.init(ctx, 99);
    TokenBatch batch = random_batch(config.vocab_size, 1, config.seq_length, 3);
    for (index_t i = 0; i < batch.mask.numel(); ++i) batch.mask[i] = i == position ? 1.0f : 0.0f;
    const auto logits = model.next_token_logits(ctx, batch.tokens, position);
    const double loss = model.forward(ctx, batch.tokens, batch.labels, batch.mask).first.loss_sum();
    double top = logits[0], total = 0;
    for (double z : logits) top = std::max(top, z);
    for (double z : logits) total += std::exp(z - top);
    EXPECT_NEAR(std::log(total) + top - logits[static_cast<std::size_t>(batch.labels[position])], loss, 1e-10);
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      result = logits;
    }
  });
  return result;
}

template <template <class> class Model>
void expect_next_token_logits_consistent(const strata::models::ModelConfig& config) {
  const auto reference = next_token_logits_checked<Model, false>(1, config, 5);
  ASSERT_EQ(reference.size(), static_cast<std::size_t>(config.vocab_size));
  for (int tp : {2, 4}) {
    EXPECT_LE(relative_error(next_token_logits_checked<Model, false>(tp, config, 5), reference), 1e-12) << "tp=" << tp;
    EXPECT_LE(relative_error(next_token_logits_checked<Model, true>(tp, config, 5), reference), 1e-12) << "tp=" << tp << " SP";
  }
}

}  // namespace strata_test
