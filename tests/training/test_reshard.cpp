// Checkpoints that reshard, through the trainers' loop (double, CPU threads): a GPT saved at
// tp=2 x pp=2 continues at tp=4 x pp=1 and at tp=1 x pp=4, a GQA Llama saved at tp=2 continues at
// tp=1 x pp=2, a distributed optimizer saved at dp=4 continues at dp=2 (with and without it), a
// Llama saved at cp=2 x dp=2 continues at cp=1, cp=4 and on one rank -- each
// on the trajectory of the run that never stopped, to DESIGN.md's double bound; --no-load-optim,
// --finetune, --ckpt-step, a --load directory with no checkpoint yet, a model that differs from the
// saved one, and background saves (--async-save) that resume bit for bit.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "trainer/trainer.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_reshard_cases {

namespace {

trainer::TrainArgs tiny(const std::string& kind) {
  trainer::TrainArgs a = trainer::default_args(kind);
  a.model.num_layers = 4;
  a.model.hidden_size = 64;
  a.model.num_attention_heads = 4;
  a.model.num_query_groups = kind == "llama" ? 2 : 0;
  a.model.ffn_hidden_size = 128;
  a.model.seq_length = 32;
  a.micro_batch_size = 2;
  a.global_batch_size = 8;
  a.lr = 1e-2;
  a.min_lr = 1e-3;
  a.lr_warmup_iters = 1;
  a.lr_decay_iters = 6;
  a.train_iters = 6;
  a.quiet = true;
  a.eval_iters = 0;
  a.sample_tokens = 0;
  a.dtype = "double";
  return a;
}

trainer::TrainArgs layout(trainer::TrainArgs a, int world, int tp, int pp) {
  a.world_size = world;
  a.tensor_model_parallel_size = tp;
  a.pipeline.pipeline_model_parallel_size = pp;
  a.sequence_parallel = tp > 1;
  return a;
}

template <template <class> class Model>
trainer::TrainResult run(const trainer::TrainArgs& a) {
  return trainer::train<Model>(a);
}

class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(std::filesystem::temp_directory_path() / ("strata_reshard_" + tag + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Iterations 4..6 of `resumed` against the run that never stopped. Double: DESIGN.md's 1e-12 per
// operation; other layouts sum in other orders, and a few AdamW steps widen that to 1e-10.
void expect_continues(const trainer::TrainResult& resumed, const trainer::TrainResult& straight, const std::string& what) {
  ASSERT_EQ(resumed.start_iteration, 3) << what;
  ASSERT_EQ(resumed.losses.size(), 3u) << what;
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(resumed.losses[i], straight.losses[3 + i], 1e-10 * straight.losses[3 + i]) << what << ", iteration " << 4 + i;
}

template <template <class> class Model>
void save_at_three(trainer::TrainArgs a, const TempDir& dir) {
  a.train_iters = 3;
  a.save = dir.str();
  run<Model>(a);
}

TEST(Reshard, GptSavedAtTp2Pp2ContinuesAtTp4AndAtPp4) {
  TempDir dir("gpt");
  const auto saving = layout(tiny("gpt"), 4, 2, 2);
  const auto straight = run<strata::models::Gpt>(saving);
  save_at_three<strata::models::Gpt>(saving, dir);
  for (auto [tp, pp] : {std::pair{4, 1}, std::pair{1, 4}, std::pair{2, 2}}) {
    auto a = layout(tiny("gpt"), 4, tp, pp);
    a.load = dir.str();
    expect_continues(run<strata::models::Gpt>(a), straight, "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp));
  }
}

TEST(Reshard, ConvertedCheckpointHoldsEachRanksShardsAndContinues) {
  TempDir dir("convert_source"), converted("convert_target");
  const auto saving = layout(tiny("gpt"), 4, 2, 2);
  const auto straight = run<strata::models::Gpt>(saving);
  save_at_three<strata::models::Gpt>(saving, dir);
  strata::ShardedCheckpoint source(dir.path() / "iter_0000003");
  std::vector<strata::ConvertProgress> seen;
  strata::convert_checkpoint(source, converted.path(),
                             strata::ConvertOptions{.tp = 1, .pp = 4, .dp = 1,
                                                    .progress = [&](const strata::ConvertProgress& p) { seen.push_back(p); }});
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().tensors_done, seen.back().tensors_total);
  EXPECT_EQ(seen.back().bytes_done, seen.back().bytes_total);
  EXPECT_EQ(strata::latest_checkpointed_iteration(converted.path()), 3);
  // Rank 3 of tp=1 x pp=4 holds layer 3, the final norm and their state, and nothing of layer 0.
  strata::StateReader last(converted.path() / "iter_0000003" / "rank_00003.strata");
  EXPECT_TRUE(last.has_tensor("model.layers.3.norm1.weight"));
  EXPECT_TRUE(last.has_tensor("optimizer.final_norm.weight.exp_avg"));
  EXPECT_FALSE(last.has_tensor("model.layers.0.norm1.weight"));
  EXPECT_EQ(last.get_int("parallel.pp"), 4);
  auto a = layout(tiny("gpt"), 4, 1, 4);
  a.load = converted.str();
  expect_continues(run<strata::models::Gpt>(a), straight, "converted to tp=1 pp=4");
}

TEST(Reshard, LlamaWithGroupedQueriesSavedAtTp2ContinuesAtTp1Pp2) {
  TempDir dir("llama");
  const auto saving = layout(tiny("llama"), 2, 2, 1);
  const auto straight = run<strata::models::Llama>(saving);
  save_at_three<strata::models::Llama>(saving, dir);
  auto a = layout(tiny("llama"), 2, 1, 2);
  a.load = dir.str();
  expect_continues(run<strata::models::Llama>(a), straight, "tp=1 pp=2");
}

TEST(Reshard, DistributedOptimizerSavedAtDp4ContinuesAtDp2) {
  TempDir dir("dp");
  auto saving = layout(tiny("gpt"), 4, 1, 1);
  saving.use_distributed_optimizer = true;
  saving.ddp_bucket_size = 3000;  // buckets, and so each rank's share, cut through parameters
  const auto straight = run<strata::models::Gpt>(saving);
  save_at_three<strata::models::Gpt>(saving, dir);
  for (bool distributed : {true, false}) {
    auto a = layout(tiny("gpt"), 2, 1, 1);
    a.use_distributed_optimizer = distributed;
    a.ddp_bucket_size = 5000;
    a.load = dir.str();
    expect_continues(run<strata::models::Gpt>(a), straight, distributed ? "dp=2, distributed" : "dp=2, plain AdamW");
  }
}

// Checkpoints do not depend on context parallelism: saved at cp=2 x dp=2 with the distributed
// optimizer (its state sharded over dp x cp), a run continues at cp=1 (dp=2, distributed), at cp=4,
// and on one rank, each on the straight run's trajectory.
TEST(Reshard, ContextParallelSavedAtCp2ContinuesAtCp1AndCp4) {
  TempDir dir("cp");
  auto saving = layout(tiny("llama"), 4, 1, 1);
  saving.context_parallel_size = 2;
  saving.use_distributed_optimizer = true;
  saving.ddp_bucket_size = 3000;
  const auto straight = run<strata::models::Llama>(saving);
  save_at_three<strata::models::Llama>(saving, dir);
  struct Continue {
    int world, cp;
    bool distributed;
  };
  for (Continue c : {Continue{2, 1, true}, Continue{4, 4, true}, Continue{1, 1, false}}) {
    auto a = layout(tiny("llama"), c.world, 1, 1);
    a.context_parallel_size = c.cp;
    a.use_distributed_optimizer = c.distributed;
    a.load = dir.str();
    expect_continues(run<strata::models::Llama>(a), straight,
                     "world=" + std::to_string(c.world) + " cp=" + std::to_string(c.cp) +
                         (c.distributed ? ", distributed" : ", plain AdamW"));
  }
}

TEST(Reshard, NoLoadOptimFinetuneAndCkptStep) {
  TempDir dir("flags");
  auto a = layout(tiny("gpt"), 2, 2, 1);
  const auto straight = run<strata::models::Gpt>(a);
  auto saving = a;
  saving.save = dir.str();
  saving.save_interval = 3;
  run<strata::models::Gpt>(saving);  // iterations 3 and 6
  auto from3 = a;
  from3.load = dir.str();
  from3.ckpt_step = 3;
  const auto resumed = run<strata::models::Gpt>(from3);
  ASSERT_EQ(resumed.start_iteration, 3);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed.losses[i], straight.losses[3 + i]) << "iteration " << 4 + i;
  // The weights alone: the first loss is the same (same weights, same batch), the next ones not
  // (the moments start from zero).
  auto fresh = from3;
  fresh.no_load_optim = true;
  const auto no_optim = run<strata::models::Gpt>(fresh);
  ASSERT_EQ(no_optim.start_iteration, 3);
  EXPECT_EQ(no_optim.losses[0], straight.losses[3]);
  EXPECT_NE(no_optim.losses[1], straight.losses[4]);
  // --finetune: iteration 0, the data from its start; the weights are the checkpoint's, so the
  // first loss is below the untrained model's.
  auto tune = from3;
  tune.finetune = true;
  tune.seed = 99;  // a fine-tuning run may change the seed
  const auto tuned = run<strata::models::Gpt>(tune);
  EXPECT_EQ(tuned.start_iteration, 0);
  ASSERT_EQ(tuned.losses.size(), 6u);
  EXPECT_LT(tuned.losses[0], straight.losses[0] - 0.1);
}

// --save-hf then --load-hf is --save then --load --finetune (the weights alone, iteration 0): the
// same losses bit for bit, with the export made from the model (pp=1) and from the final
// checkpoint (pp=2), each loaded at another layout.
TEST(Reshard, HuggingFaceExportThenImportTrainsLikeFinetuningTheCheckpoint) {
  for (auto [from_tp, from_pp, to_tp, to_pp] : {std::array{2, 1, 1, 2}, std::array{1, 2, 2, 1}}) {
    const std::string what = "saved at tp=" + std::to_string(from_tp) + " pp=" + std::to_string(from_pp);
    TempDir ckpt("hf_ckpt"), hf("hf_model");
    auto saving = layout(tiny("gpt"), 2, from_tp, from_pp);
    saving.train_iters = 3;
    saving.save = ckpt.str();
    saving.save_hf = hf.str();
    run<strata::models::Gpt>(saving);
    ASSERT_TRUE(std::filesystem::exists(hf.path() / "config.json")) << what;
    ASSERT_TRUE(std::filesystem::exists(hf.path() / "model.safetensors")) << what;
    auto finetune = layout(tiny("gpt"), 2, to_tp, to_pp);
    finetune.load = ckpt.str();
    finetune.finetune = true;
    auto imported = layout(tiny("gpt"), 2, to_tp, to_pp);
    imported.load_hf = hf.str();
    const auto a = run<strata::models::Gpt>(finetune), b = run<strata::models::Gpt>(imported);
    EXPECT_EQ(b.start_iteration, 0) << what;
    EXPECT_EQ(a.losses, b.losses) << what;
  }
}

TEST(Reshard, LoadDirectoryWithoutCheckpointStartsFromScratch) {
  TempDir dir("empty");
  auto a = layout(tiny("gpt"), 1, 1, 1);
  a.train_iters = 2;
  const auto straight = run<strata::models::Gpt>(a);
  a.load = dir.str();  // missing; then created by --save and still empty of checkpoints
  a.save = dir.str();
  a.save_interval = 0;
  const auto first = run<strata::models::Gpt>(a);
  EXPECT_EQ(first.start_iteration, 0);
  EXPECT_EQ(first.losses, straight.losses);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "iter_0000002"));
}

TEST(Reshard, ModelOtherThanTheSavedOneIsRefusedNamingTheFlag) {
  TempDir dir("wrong");
  auto a = layout(tiny("gpt"), 1, 1, 1);
  save_at_three<strata::models::Gpt>(a, dir);
  auto other = a;
  other.model.num_layers = 2;
  other.load = dir.str();
  try {
    run<strata::models::Gpt>(other);
    ADD_FAILURE() << "a 2-layer model loaded a 4-layer checkpoint";
  } catch (const strata::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--num-layers=4"), std::string::npos) << m;
    EXPECT_NE(m.find("--num-layers=2"), std::string::npos) << m;
    EXPECT_NE(m.find("rank_00000.strata"), std::string::npos) << m;
  }
}

TEST(Reshard, AsyncSaveResumesBitForBit) {
  TempDir dir("async");
  auto a = layout(tiny("gpt"), 2, 2, 1);
  const auto straight = run<strata::models::Gpt>(a);
  auto saving = a;
  saving.save = dir.str();
  saving.save_interval = 3;
  saving.async_save = true;
  const auto saved = run<strata::models::Gpt>(saving);
  EXPECT_EQ(saved.losses, straight.losses) << "saving in the background changed the training";
  EXPECT_EQ(strata::latest_checkpointed_iteration(dir.path()), 6);
  auto from3 = a;
  from3.load = dir.str();
  from3.ckpt_step = 3;
  const auto resumed = run<strata::models::Gpt>(from3);
  ASSERT_EQ(resumed.start_iteration, 3);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed.losses[i], straight.losses[3 + i]) << "iteration " << 4 + i;
}

}  // namespace
}  // namespace test_reshard_cases
