// Checkpoints of a MoE model that reshard (double, CPU threads): models::MoeLlama with expert bias
// trained two steps at tp=2 (SP) x dp=2 x ep=2 with the distributed optimizer, saved, then loaded at
// ep=4, at ep=1 with plain AdamW, and at ep=2 x etp=2: the logits right after the load equal the
// saving run's, and the next training step (loss, gradient norm, every parameter after it: so the
// optimizer state and the expert bias came back too) equals the saving run's third step. The
// expert weights are written once (expert-data-parallel rank 0) under their global expert index,
// and a rank that holds some experts loads a checkpoint that holds them all.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <unistd.h>

#include <strata/checkpoint.hpp>

#include "moe_model_harness.hpp"
#include "trainer/data_parallel.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_moe_checkpoint_cases {

namespace {

using namespace moe_model_test;
using namespace strata;
constexpr int kMicroBatches = 4;  // per step, over the data-parallel ranks

models::ModelConfig checkpoint_config() {
  auto c = tiny_config(8);
  c.moe.expert_bias = true;  // aux-loss-free balancing: a bias per expert, saved and loaded
  c.moe.expert_bias_update_rate = 0.05;
  return c;
}

struct TrainingRun {
  std::vector<double> losses, norms;     // per step, summed over the ranks
  strata_test::Values logits;            // after the load (loading run) or after the save (saving run)
  std::map<std::string, strata_test::Values> parameters;  // after the last step, gathered
  std::map<std::string, strata_test::Values> expert_bias;  // after the last step
};

struct Layout {
  ParallelConfig config;
  bool distributed;
};

// steps training steps; with save: a checkpoint after step save_after; with load: start from it.
template <bool SP>
TrainingRun train(const Layout& layout, int steps, const std::filesystem::path& dir, int save_after, bool load) {
  using P = strata_test::TestPolicy<double, SP>;
  using Model = models::MoeLlama<P>;
  const auto config = checkpoint_config();
  TrainingRun run;
  std::mutex mutex;
  inprocess::run(layout.config.world_size(), [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, layout.config);
    Model model(ctx, config);
    model.init(ctx, 1234);
    trainer::DataParallelOptions o;
    o.distributed_optimizer = layout.distributed;
    o.bucket_size = 900;
    o.adam.eps = 1e-3;
    trainer::DataParallelOptimizer<double, space::host> optimizer(ctx, model, o);
    int first_step = 0;
    const auto prompt = strata_test::random_batch(config.vocab_size, 1, config.seq_length, 5).tokens;
    auto record_logits = [&] {
      const auto logits = model.next_token_logits(ctx, prompt, config.seq_length - 2);
      if (world.rank() == 0) run.logits = logits;
    };
    if (load) {
      first_step = static_cast<int>(load_checkpoint(ctx, dir, model, optimizer).iteration);
      record_logits();
    }
    const int dp = ctx.config.dp;
    const double loss_scale = 1.0 / static_cast<double>(kMicroBatches * kMicroBatch * config.seq_length);
    for (int step = first_step; step < steps; ++step) {
      optimizer.zero_gradients(ctx);
      model.reset_router_losses(ctx);
      auto loss = Tensor<double>::zeros(Shape{1});
      for (int m = ctx.coords.dp; m < kMicroBatches; m += dp) {
        const auto batch = strata_test::random_batch(config.vocab_size, kMicroBatch, config.seq_length, 1000 * step + 10 * m);
        auto [l, saved] = model.forward(ctx, batch.tokens, batch.labels, batch.mask, 7 + m, models::FusedLoss{loss_scale});
        model.backward(ctx, saved, loss_scale);
        if (ctx.tp.rank() == 0) loss[0] += l.loss_sum();
      }
      optimizer.reduce_gradients(ctx);
      ctx.dp.all_reduce(loss.buffer(), ReduceOp::sum);
      const auto norm = optimizer.unscale_and_clip(ctx, model, 1.0);
      optimizer.step(ctx, model, 1e-2, nullptr);
      optimizer.wait_parameters(ctx);
      model.update_expert_bias(ctx);
      if (world.rank() == 0) run.losses.push_back(loss[0]), run.norms.push_back(to_host(norm)[0]);
      if (!load && step + 1 == save_after) {
        save_checkpoint(ctx, dir, step + 1, model, optimizer, TrainState{step + 1, 0, 1234, {}});
        record_logits();
      }
    }
    gather_model(ctx, model, &run.parameters, nullptr, true, mutex);
    model.for_each_persistent_tensor([&](const std::string& name, Tensor<double>& bias) {
      std::lock_guard lock(mutex);
      run.expert_bias[name] = strata_test::to_values(bias);
    });
  });
  return run;
}

TrainingRun train_layout(const Layout& l, int steps, const std::filesystem::path& dir, int save_after, bool load) {
  return l.config.tp > 1 ? train<true>(l, steps, dir, save_after, load) : train<false>(l, steps, dir, save_after, load);
}

std::string describe_layout(const Layout& l) {
  return describe(l.config, l.config.tp > 1) + (l.distributed ? " distributed" : " AdamW");
}

TEST(MoeCheckpoint, SavedAtEp2LoadsAtEp4AndEp1WithIdenticalLogitsAndNextStep) {
  const auto dir = std::filesystem::temp_directory_path() / ("strata_moe_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const Layout saving{{.tp = 2, .dp = 2, .ep = 2}, true};
  const TrainingRun straight = train_layout(saving, 3, dir, 2, false);
  ASSERT_EQ(straight.losses.size(), 3u);
  ASSERT_EQ(straight.expert_bias.size(), 2u) << "one expert bias per layer";
  for (const auto& [name, bias] : straight.expert_bias) EXPECT_GT(strata_test::norm(bias), 0.0) << name << " never moved";
  // Each expert weight is in the checkpoint once, under its global index; rank 3 (edp 1) wrote none.
  {
    const StateReader rank0(dir / "iter_0000002" / "rank_00000.strata"), rank3(dir / "iter_0000002" / "rank_00003.strata");
    EXPECT_TRUE(rank0.has_tensor("model.layers.1.mlp.experts.3.fc1.weight"));
    EXPECT_TRUE(rank0.has_tensor("model.layers.0.mlp.router.expert_bias"));
    EXPECT_FALSE(rank3.has_tensor("model.layers.1.mlp.experts.3.fc1.weight"));
    EXPECT_FALSE(rank3.has_tensor("model.layers.1.mlp.experts.7.fc1.weight"));
    EXPECT_EQ(rank0.get_int("model.num_experts"), 8);
  }
  for (const Layout& l : {Layout{{.dp = 4, .ep = 4}, true}, Layout{{.dp = 2, .ep = 1}, false},
                          Layout{{.tp = 2, .dp = 2, .ep = 2, .etp = 2}, true}, Layout{{.tp = 1, .dp = 1, .ep = 1}, false}}) {
    const std::string what = "loaded at " + describe_layout(l);
    const TrainingRun resumed = train_layout(l, 3, dir, 0, true);
    EXPECT_LE(strata_test::relative_error(resumed.logits, straight.logits), 1e-12) << what << ": logits after the load";
    ASSERT_EQ(resumed.losses.size(), 1u) << what;
    EXPECT_NEAR(resumed.losses[0], straight.losses[2], 1e-12 * straight.losses[2]) << what << ": loss of step 3";
    EXPECT_NEAR(resumed.norms[0], straight.norms[2], 1e-12 * straight.norms[2]) << what << ": gradient norm of step 3";
    ASSERT_EQ(resumed.parameters.size(), straight.parameters.size()) << what;
    for (const auto& [name, v] : straight.parameters)
      EXPECT_LE(strata_test::relative_error(resumed.parameters.at(name), v), 1e-12) << what << ": " << name << " after step 3";
    for (const auto& [name, v] : straight.expert_bias)
      EXPECT_LE(strata_test::relative_error(resumed.expert_bias.at(name), v), 1e-12) << what << ": " << name;
  }
  // A model with another number of experts is refused, naming the flag.
  try {
    using P = strata_test::TestPolicy<double, false>;
    inprocess::run(1, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
      auto other = checkpoint_config();
      other.moe.num_experts = 4;
      models::MoeLlama<P> model(ctx, other);
      trainer::DataParallelOptimizer<double, space::host> optimizer(ctx, model, {});
      load_checkpoint(ctx, dir, model, optimizer);
    });
    ADD_FAILURE() << "a 4-expert model loaded an 8-expert checkpoint";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--num-experts=8"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace test_moe_checkpoint_cases
