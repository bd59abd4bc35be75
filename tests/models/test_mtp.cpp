// Multi-token prediction (models/decoder.hpp, config.mtp_num_layers): the depths' gradients are
// those of the objective (central differences), every tensor-parallel layout equals one rank, a zero
// loss weight leaves the main model's gradients as they are without the depths, and the layouts it
// is not built for are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <strata/models/memory_estimate.hpp>

#include "model_equivalence.hpp"

namespace {

using namespace strata;
using strata_test::LossPath;
using strata_test::ModelPolicy;
using strata_test::TokenBatch;

models::ModelConfig tiny_llama_mtp(int depths) {
  models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 8;
  c.num_query_groups = 4;  // 2 query heads per group: tp up to 4
  c.ffn_hidden_size = 24;
  c.vocab_size = 48;
  c.make_vocab_size_divisible_by = 4;  // the same padded vocabulary on 1, 2 and 4 ranks
  c.seq_length = 8;
  c.mtp_num_layers = depths;
  c.mtp_loss_scaling_factor = 0.3;
  return c;
}

// J = main loss sum + lambda / D x the depths' loss sums (loss scale 1), by a fused forward.
template <class Model>
double objective(ParallelContext<inprocess::communicator>& ctx, Model& model, const TokenBatch& batch, const models::ModelConfig& c) {
  model.reset_mtp_losses(ctx);
  const double main = model.forward(ctx, batch.tokens, batch.labels, batch.mask, 0, models::FusedLoss{1.0}).first.loss_sum();
  double depths = 0;
  const Tensor<double> sums = to_host(model.mtp_losses(ctx));  // [sums, tokens]
  for (index_t k = 0; k < sums.numel() / 2; ++k) depths += sums[k];
  return main + c.mtp_loss_scaling_factor / c.mtp_num_layers * depths;
}

// Central differences on a sample of every parameter's elements (the depths', the shared embedding
// and output layer's, the main layers'), single rank, double.
TEST(Mtp, GradientsAreThoseOfTheObjective) {
  const models::ModelConfig config = tiny_llama_mtp(2);
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    models::Llama<ModelPolicy<double, false>> model(ctx, config);
    model.init(ctx, 4321);
    const TokenBatch batch = strata_test::random_batch(config.vocab_size, 2, config.seq_length, 5);
    auto [loss, saved] = model.forward(ctx, batch.tokens, batch.labels, batch.mask, 0, models::FusedLoss{1.0});
    ASSERT_EQ(saved.mtp.size(), 2u);
    {  // each depth counts the tokens of the mask rolled by k, the last k positions out
      const Tensor<double> report = to_host(model.mtp_losses(ctx));
      ASSERT_EQ(report.numel(), 4);
      for (index_t k = 1; k <= 2; ++k) {
        double tokens = 0;
        for (index_t r = 0; r < 2; ++r)
          for (index_t i = k; i < config.seq_length; ++i) tokens += batch.mask[r * config.seq_length + i];
        EXPECT_EQ(report[2 + k - 1], tokens) << "depth " << k;
        EXPECT_GT(report[k - 1], 0.0);
      }
    }
    model.backward(ctx, saved, 1.0);
    std::map<std::string, std::vector<double>> grads;  // the next forwards add to the output layer's
    model.for_each_parameter([&](Parameter<double>& p) {
      settle_gradient(ctx.device, p);
      grads[p.name].assign(p.grad.data(), p.grad.data() + p.grad.numel());
    });
    int checked = 0, depth_checked = 0;
    model.for_each_parameter([&](Parameter<double>& p) {
      const index_t n = p.value.numel(), stride = std::max<index_t>(1, n / 4);
      for (index_t i = (p.name.size() * 7) % stride; i < n; i += stride) {
        const double kept = p.value[i], eps = 1e-5;
        p.value[i] = kept + eps;
        const double plus = objective(ctx, model, batch, config);
        p.value[i] = kept - eps;
        const double minus = objective(ctx, model, batch, config);
        p.value[i] = kept;
        const double numeric = (plus - minus) / (2 * eps);
        EXPECT_NEAR(grads[p.name][static_cast<std::size_t>(i)], numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
            << p.name << "[" << i << "]";
        ++checked;
        if (p.name.rfind("mtp.", 0) == 0) ++depth_checked;
      }
    });
    EXPECT_GT(depth_checked, 20);
    EXPECT_GT(checked, 40);
  });
}

// Two micro-batches on tp 2 and 4, with and without sequence parallelism and with the overlapped
// collectives, against one rank: the (main) loss and every gathered gradient, the depths' included.
TEST(Mtp, TensorParallelLayoutsEqualOneRank) {
  const models::ModelConfig config = tiny_llama_mtp(2);
  const auto reference = strata_test::run_model<models::Llama, double, false>(1, config, LossPath{true, 0});
  for (int tp : {2, 4}) {
    const std::string what = "tp=" + std::to_string(tp);
    strata_test::expect_equivalent(strata_test::run_model<models::Llama, double, false>(tp, config, LossPath{true, 0}), reference,
                                   strata_test::tolerance<double>(), what);
    strata_test::expect_equivalent(strata_test::run_model<models::Llama, double, true>(tp, config, LossPath{true, 0}), reference,
                                   strata_test::tolerance<double>(), what + " sequence parallel");
    strata_test::expect_equivalent(strata_test::run_model<models::Llama, double, true>(tp, config, LossPath{true, 3, true}), reference,
                                   strata_test::tolerance<double>(), what + " sequence parallel, tp_comm_overlap, blocks of 3 rows");
  }
}

// With a zero weight the depths add nothing: every main-model gradient is the one of the same model
// without them, bit for bit.
TEST(Mtp, ZeroWeightLeavesTheMainGradients) {
  models::ModelConfig with = tiny_llama_mtp(2), without = tiny_llama_mtp(0);
  with.mtp_loss_scaling_factor = 0;
  const auto a = strata_test::run_model<models::Llama, double, false>(1, with, LossPath{true, 0});
  const auto b = strata_test::run_model<models::Llama, double, false>(1, without, LossPath{true, 0});
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  for (std::size_t i = 0; i < a.outputs.size(); ++i) EXPECT_EQ(a.outputs[i], b.outputs[i]);
  int compared = 0;
  for (const auto& [name, grad] : b.grads) {
    const auto it = a.grads.find(name);
    ASSERT_NE(it, a.grads.end()) << name;
    EXPECT_EQ(it->second, grad) << name;
    ++compared;
  }
  EXPECT_GT(compared, 10);
  EXPECT_GT(a.grads.size(), b.grads.size());  // the depths' parameters exist (their gradients zero)
}

// The memory estimate counts the depths' parameters exactly.
TEST(Mtp, ParameterCountOfTheEstimateEqualsTheModels) {
  const models::ModelConfig config = tiny_llama_mtp(2);
  for (int tp : {1, 2}) {
    std::int64_t counted = 0;
    inprocess::run(tp, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
      models::Llama<ModelPolicy<double, false>> model(ctx, config);
      std::int64_t n = 0;
      model.for_each_parameter([&](Parameter<double>& p) { n += p.value.numel(); });
      if (world.rank() == 0) counted = n;
    });
    EXPECT_EQ(models::parameters_per_rank(config, models::DecoderShape::llama(), tp), counted) << "tp=" << tp;
  }
}

TEST(Mtp, RefusesWhatItIsNotBuiltFor) {
  auto refused = [](auto make, const char* text) {
    try {
      make();
      ADD_FAILURE() << "not refused: " << text;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    models::ModelConfig gpt = tiny_llama_mtp(1);
    gpt.num_query_groups = 0;
    refused([&] { models::Gpt<ModelPolicy<double, false>> m(ctx, gpt); }, "built for RoPE models");
    refused([&] { models::ModelConfig c = tiny_llama_mtp(8); models::Llama<ModelPolicy<double, false>> m(ctx, c); },
            "below seq_length=8");
    models::Llama<ModelPolicy<double, false>> model(ctx, tiny_llama_mtp(1));
    const TokenBatch batch = strata_test::random_batch(48, 1, 8, 1);
    refused([&] { (void)model.forward(ctx, batch.tokens, batch.labels, batch.mask); }, "call the fused forward");
  });
  models::ModelConfig c = tiny_llama_mtp(1);
  c.mtp_loss_scaling_factor = -1;
  refused([&] { models::validate(c, ParallelConfig{}, false); }, "mtp_loss_scaling_factor=-1");
}

}  // namespace
