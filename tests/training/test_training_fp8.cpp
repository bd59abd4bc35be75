// FP8 training through the trainers' loop on the CPU (emulated casts and GEMMs), with the delayed,
// tensorwise and blockwise recipes: tensor, sequence,
// data and pipeline parallel FP8 runs (also with --tp-comm-overlap) follow the single-rank FP8 run; a run resumed from a
// checkpoint (amax histories and scales included) follows the straight run bit for bit; the weight
// cache (one cast per step) equals casting per GEMM bit for bit; FP8 is in
// effect (the trajectory leaves the plain run's) and the loss falls; --first-last-layers-bf16 over
// every layer is the plain run; --fp8-param-gather is the run without it, resumed or straight;
// --fp8-recast-attention-output is the run without it; norms writing FP8 codes are the norms'
// output cast by the linear layers; evaluations leave a delayed-recipe run as it is.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "same_parameters.hpp"
#include "trainer/trainer.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_training_fp8_cases {

namespace {

trainer::TrainArgs tiny_fp8(const std::string& recipe) {
  trainer::TrainArgs a = trainer::default_args("gpt");
  a.model.num_layers = 2;
  a.model.hidden_size = 64;
  a.model.num_attention_heads = 4;
  a.model.ffn_hidden_size = 128;
  a.model.seq_length = 32;
  a.micro_batch_size = 2;
  a.global_batch_size = 8;
  a.lr = 1e-2;
  a.min_lr = 1e-3;
  a.lr_warmup_iters = 3;
  a.quiet = true;
  a.eval_interval = 100;
  a.eval_iters = 1;
  a.sample_tokens = 0;  // pipeline layouts run no sampling
  a.fp8_format = "hybrid";
  a.fp8_recipe = recipe;
  if (recipe == "delayed") {
    a.fp8_amax_history_len = 4;
    a.fp8_amax_compute_algo = "max";
    a.fp8_margin = 1;
  }
  a.fp8_block_size = 16;  // blockwise: every tensor-parallel shard of the tiny model is whole blocks
  return a;
}

// Trains `a` straight through, saving into `dir` at iteration `at` and at the end, then again from
// the checkpoint of `at` (the later one removed, the tracker pointed back): {straight, resumed}.
std::pair<trainer::TrainResult, trainer::TrainResult> straight_and_resumed(const trainer::TrainArgs& a,
                                                                          const std::filesystem::path& dir, int at) {
  auto first = a;
  first.save = dir.string();
  first.save_interval = at;
  auto straight = trainer::train<strata::models::Gpt>(first);
  std::filesystem::remove_all(strata::iteration_directory(dir, a.train_iters));
  {
    std::ofstream tracker(dir / strata::kCheckpointTrackerName, std::ios::trunc);
    tracker << at << "\n";
  }
  auto resumed = a;
  resumed.load = dir.string();
  return {std::move(straight), trainer::train<strata::models::Gpt>(resumed)};
}

double mean(const std::vector<double>& v, std::size_t begin, std::size_t end) {
  return std::accumulate(v.begin() + begin, v.begin() + end, 0.0) / static_cast<double>(end - begin);
}

TEST(TrainingFp8, ShardedRunsFollowSingleRankFp8Trajectory) {
  for (const std::string recipe : {"delayed", "tensorwise", "blockwise"}) {
    auto base = tiny_fp8(recipe);
    base.dtype = "double";
    base.train_iters = 5;
    const auto reference = trainer::train<strata::models::Gpt>(base);
    struct Layout {
      int world, tp, pp;
      bool sp;
      bool tp_comm_overlap = false;  // with dp > 1 also --overlap-grad-reduce (the FP8 layers' collectives run whole)
    };
    for (Layout l : {Layout{2, 2, 1, false}, Layout{2, 2, 1, true}, Layout{2, 1, 1, false}, Layout{2, 1, 2, false},
                     Layout{4, 2, 1, true}, Layout{4, 2, 2, true}, Layout{4, 2, 1, true, true}}) {
      auto a = base;
      a.world_size = l.world;
      a.tensor_model_parallel_size = l.tp;
      a.pipeline.pipeline_model_parallel_size = l.pp;
      a.sequence_parallel = l.sp;
      a.tp_comm_overlap = l.tp_comm_overlap;
      a.overlap_grad_reduce = l.tp_comm_overlap && l.world > l.tp;
      const auto run = trainer::train<strata::models::Gpt>(a);
      ASSERT_EQ(run.losses.size(), reference.losses.size());
      for (std::size_t i = 0; i < run.losses.size(); ++i)
        EXPECT_NEAR(run.losses[i], reference.losses[i], 1e-12 * reference.losses[i])
            << recipe << " world=" << l.world << " tp=" << l.tp << " pp=" << l.pp << " sp=" << l.sp << " tp_comm_overlap=" << l.tp_comm_overlap << " iteration " << i + 1;
    }
  }
}

// The weight cache (each FP8 weight cast once per step) against casting per GEMM: the same run bit
// for bit, with four micro-batches a step, both recipes, on one rank and at tp=2 + SP (and with
// full recompute, whose recomputed forwards read the cache too).
// The weight cache (both layouts, or W^T alone with each later forward casting W again) gives the
// bits of a cast per GEMM: four micro-batches a step, evaluations between steps, with and without
// full recompute.
TEST(TrainingFp8, WeightCacheEqualsCastPerGemm) {
  for (const std::string recipe : {"delayed", "tensorwise", "blockwise"})
    for (const int tp : {1, 2})
      for (const bool recompute : {false, true})
        for (const char* layouts : {"both", "transposed"}) {
        if (recipe == "blockwise" && std::string(layouts) == "transposed") continue;  // the tiles keep both
        auto a = tiny_fp8(recipe);
        a.fp8_weight_cache = layouts;
        a.dtype = "double";
        a.train_iters = 4;
        a.eval_interval = 2;  // evaluation forwards between steps fill the cache too
        a.world_size = tp;
        a.tensor_model_parallel_size = tp;
        a.sequence_parallel = tp > 1;
        a.keep_final_parameters = true;
        if (recompute) a.recompute_granularity = "full";
        auto per_gemm = a;
        per_gemm.fp8_cache_weights = false;
        const auto cached = trainer::train<strata::models::Gpt>(a);
        const auto reference = trainer::train<strata::models::Gpt>(per_gemm);
        const std::string what = recipe + " tp=" + std::to_string(tp) + (recompute ? " full recompute" : "") + " cache " + layouts;
        EXPECT_EQ(cached.losses, reference.losses) << what;
        EXPECT_EQ(cached.validation_losses, reference.validation_losses) << what;
        EXPECT_EQ(cached.final_parameters, reference.final_parameters) << what;
        EXPECT_EQ(cached.losses.size(), 4u) << what;
        EXPECT_EQ(cached.validation_losses.size(), 2u) << what;
      }
}

// --fp8-recast-attention-output: the output projection holds the attention's output and casts it
// again in the backward, which makes the codes its forward kept (the same values and scale; the
// delayed recipe's amax is folded twice, a max of the same value): the run is the run without the
// flag, bit for bit (losses, validation losses, every final weight), under tp 2 + SP (the input's
// amax reduced over tp again, tensorwise), pp 2 with micro-batches, dp 2 with --overlap-grad-reduce
// and selective recompute (which holds the output already).
TEST(TrainingFp8, RecastAttentionOutputIsTheRunWithoutIt) {
  for (const std::string recipe : {"delayed", "tensorwise"})
    for (const char* layout : {"tp2 sp", "pp2", "dp2 overlap", "selective"}) {
      auto a = tiny_fp8(recipe);
      a.dtype = "double";
      a.train_iters = 4;
      a.eval_interval = 2;
      a.keep_final_parameters = true;
      const std::string l = layout;
      a.world_size = l == "selective" ? 1 : 2;
      a.tensor_model_parallel_size = l == "tp2 sp" ? 2 : 1;
      a.sequence_parallel = l == "tp2 sp";
      a.pipeline.pipeline_model_parallel_size = l == "pp2" ? 2 : 1;
      a.overlap_grad_reduce = l == "dp2 overlap";
      if (l == "selective") a.recompute_granularity = "selective";
      auto recast = a;
      recast.fp8_recast_attention_output = true;
      const auto without = trainer::train<strata::models::Gpt>(a);
      const auto with = trainer::train<strata::models::Gpt>(recast);
      const std::string what = recipe + " " + l;
      ASSERT_EQ(with.losses.size(), 4u) << what;
      EXPECT_EQ(with.losses, without.losses) << what;
      EXPECT_EQ(with.validation_losses, without.validation_losses) << what;
      EXPECT_EQ(with.final_parameters, without.final_parameters) << what;
    }
}

// The norms writing the qkv projection's and fc1's FP8 codes, (Llama) the attention's merge writing
// the qkv projection's output-gradient codes (delayed recipe, the defaults) and fc1's backward cast
// writing fc2's input codes (--fp8-activation-codes-in-backward) against those tensors written in the
// element type and cast by their layers, and fc2 casting and keeping its input's codes in the forward
// (--no-fp8-norm-writes-codes, --no-fp8-attention-writes-grad-codes, the default): the
// same run bit for bit (losses, validation losses, every final weight), for GPT (LayerNorm, GELU, with
// hidden dropout) and Llama (RMSNorm, SwiGLU, GQA, no dropout), at tp 2 with and without sequence
// parallelism, pp 2 with micro-batches (1F1B, and zero-bubble, whose split backward defers the weight
// gradients), data parallelism 2 with the gradients reduced during the backward, and full recompute.
TEST(TrainingFp8, NormsWritingCodesIsTheCastRun) {
  for (const std::string model : {"gpt", "llama"})
    for (const std::string layout : {"tp2", "tp2 sp", "pp2", "pp2 zero-bubble", "dp2 overlap", "full recompute"}) {
      auto a = tiny_fp8("delayed");
      if (model == "llama") {
        const auto gpt = a;
        a = trainer::default_args("llama");
        a.model.num_layers = 2, a.model.hidden_size = 64, a.model.num_attention_heads = 4, a.model.num_query_groups = 2;
        a.model.ffn_hidden_size = 96, a.model.seq_length = 32;
        a.micro_batch_size = gpt.micro_batch_size, a.global_batch_size = gpt.global_batch_size;
        a.lr = gpt.lr, a.min_lr = gpt.min_lr, a.lr_warmup_iters = gpt.lr_warmup_iters;
        a.quiet = true, a.eval_interval = gpt.eval_interval, a.eval_iters = 1, a.sample_tokens = 0;
        a.fp8_format = "hybrid", a.fp8_recipe = "delayed";
        a.fp8_amax_history_len = 4, a.fp8_amax_compute_algo = "max";
      }
      a.dtype = "double";
      a.train_iters = 4;
      a.eval_interval = 2;
      a.keep_final_parameters = true;
      a.world_size = 2;
      a.tensor_model_parallel_size = layout.starts_with("tp2") ? 2 : 1;
      a.sequence_parallel = layout == "tp2 sp";
      a.pipeline.pipeline_model_parallel_size = layout.starts_with("pp2") ? 2 : 1;
      if (layout == "pp2 zero-bubble") a.pipeline.pipeline_schedule = "zero-bubble";
      a.overlap_grad_reduce = layout == "dp2 overlap";
      if (layout == "full recompute") a.world_size = 1, a.recompute_granularity = "full";
      a.fp8_activation_codes_in_backward = true;
      auto cast = a;
      cast.fp8_norm_writes_codes = false;
      cast.fp8_attention_writes_grad_codes = false;
      cast.fp8_activation_codes_in_backward = false;
      const auto run = [&](const trainer::TrainArgs& args) {
        return model == "gpt" ? trainer::train<strata::models::Gpt>(args) : trainer::train<strata::models::Llama>(args);
      };
      const auto written = run(a);
      const auto casting = run(cast);
      const std::string what = model + " " + layout;
      ASSERT_EQ(written.losses.size(), 4u) << what;
      EXPECT_EQ(written.losses, casting.losses) << what;
      EXPECT_EQ(written.validation_losses, casting.validation_losses) << what;
      EXPECT_EQ(written.final_parameters, casting.final_parameters) << what;
    }
}

// Evaluations do not change a delayed-recipe run: their casts' amaxes are not kept, so the scales,
// and with them every training loss and final weight, are those of the run without evaluations, bit
// for bit (one rank, tp 2 + SP, pp 2 with micro-batches; an evaluation after every step).
TEST(TrainingFp8, EvaluationsLeaveTheDelayedRunAsItIs) {
  for (const std::string layout : {"one rank", "tp2 sp", "pp2"}) {
    auto a = tiny_fp8("delayed");
    a.dtype = "double";
    a.train_iters = 4;
    a.eval_interval = 1;
    a.eval_iters = 2;
    a.keep_final_parameters = true;
    a.world_size = layout == "one rank" ? 1 : 2;
    a.tensor_model_parallel_size = layout == "tp2 sp" ? 2 : 1;
    a.sequence_parallel = layout == "tp2 sp";
    a.pipeline.pipeline_model_parallel_size = layout == "pp2" ? 2 : 1;
    auto quiet = a;
    quiet.eval_iters = 0;
    const auto evaluated = trainer::train<strata::models::Gpt>(a);
    const auto plain = trainer::train<strata::models::Gpt>(quiet);
    ASSERT_EQ(evaluated.losses.size(), 4u) << layout;
    EXPECT_EQ(evaluated.validation_losses.size(), 4u) << layout;
    EXPECT_TRUE(plain.validation_losses.empty()) << layout;
    EXPECT_EQ(evaluated.losses, plain.losses) << layout;
    EXPECT_EQ(evaluated.final_parameters, plain.final_parameters) << layout;
  }
}

TEST(TrainingFp8, RunsFp8AndTheLossFalls) {
  for (const std::string recipe : {"delayed", "blockwise"}) {
    auto a = tiny_fp8(recipe);
    a.train_iters = 30;
    const auto fp8 = trainer::train<strata::models::Gpt>(a);
    auto plain_args = a;
    plain_args.fp8_format.clear();
    plain_args.fp8_recipe = "delayed";
    const auto plain = trainer::train<strata::models::Gpt>(plain_args);
    ASSERT_EQ(fp8.losses.size(), 30u);
    EXPECT_NE(fp8.losses[1], plain.losses[1]) << recipe << ": the FP8 run is the plain run: no GEMM ran in FP8";
    EXPECT_LT(mean(fp8.losses, 20, 30), mean(fp8.losses, 0, 10) - 0.5) << recipe << ": loss did not fall";
    EXPECT_NEAR(mean(fp8.losses, 20, 30), mean(plain.losses, 20, 30), 0.1 * mean(plain.losses, 20, 30)) << recipe;
  }
}

TEST(TrainingFp8, FirstLastLayersBf16OverEveryLayerIsThePlainRun) {
  auto a = tiny_fp8("delayed");
  a.train_iters = 3;
  a.first_last_layers_bf16 = true;  // 1 first + 1 last of 2 layers: nothing left in FP8
  auto plain_args = a;
  plain_args.fp8_format.clear();
  plain_args.first_last_layers_bf16 = false;
  EXPECT_EQ(trainer::train<strata::models::Gpt>(a).losses, trainer::train<strata::models::Gpt>(plain_args).losses);
}

// The amax histories and scales travel in the checkpoint: without them the resumed run would start
// from scale 1 and an empty history.
TEST(TrainingFp8, ResumeEqualsStraightThrough) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_training_fp8_resume";
  std::filesystem::remove_all(dir);
  auto a = tiny_fp8("delayed");
  a.train_iters = 8;
  const auto [straight, second] = straight_and_resumed(a, dir, 4);
  EXPECT_EQ(second.start_iteration, 4);
  ASSERT_EQ(second.losses.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(second.losses[i], straight.losses[4 + i]) << "iteration " << 5 + i;
  std::filesystem::remove_all(dir);
}

// --fp8-param-gather: each data-parallel rank casts its shard of the FP8 weights with the step's
// weight scale and the gather moves codes. The codes are those each layer's own cast of the whole
// weight makes, so without clipping the run is the run without the flag bit for bit (losses,
// validation losses, every final weight): over dp 2 and 4, with tp 2 + SP, pp 2, small buckets (FP8
// weights and the rest in buckets of their own, several of each), the overlapped gather, and
// micro-batches that read the gathered codes several times a step. With clipping the two differ by
// the rounding of the gradient norm alone (its squares are summed over other buckets): 1e-12.
TEST(TrainingFp8, ParameterGatherIsTheRunWithoutIt) {
  struct Layout {
    int world, tp, pp;
    bool overlap;
  };
  for (const std::string recipe : {"delayed", "tensorwise"})
    for (Layout l : {Layout{2, 1, 1, false}, Layout{2, 1, 1, true}, Layout{4, 2, 1, false}, Layout{4, 1, 2, true},
                     Layout{4, 1, 1, true}}) {
      auto a = tiny_fp8(recipe);
      a.dtype = "double";
      a.train_iters = 4;
      a.eval_interval = 2;
      a.world_size = l.world;
      a.tensor_model_parallel_size = l.tp;
      a.pipeline.pipeline_model_parallel_size = l.pp;
      a.sequence_parallel = l.tp > 1;
      a.use_distributed_optimizer = true;
      a.overlap_grad_reduce = a.overlap_param_gather = l.overlap;
      a.ddp_bucket_size = 6000;  // several buckets of each kind
      a.keep_final_parameters = true;
      a.clip_grad = 0;
      auto gathered = a;
      gathered.fp8_param_gather = true;
      const auto with = trainer::train<strata::models::Gpt>(gathered);
      const auto without = trainer::train<strata::models::Gpt>(a);
      auto clipped = a;
      clipped.clip_grad = 1.0;
      clipped.keep_final_parameters = false;
      auto clipped_gathered = clipped;
      clipped_gathered.fp8_param_gather = true;
      const auto clipped_with = trainer::train<strata::models::Gpt>(clipped_gathered);
      const auto clipped_without = trainer::train<strata::models::Gpt>(clipped);
      const std::string what = recipe + " world=" + std::to_string(l.world) + " tp=" + std::to_string(l.tp) +
                               " pp=" + std::to_string(l.pp) + (l.overlap ? " overlapped" : "");
      ASSERT_EQ(with.losses.size(), 4u) << what;
      EXPECT_EQ(with.losses, without.losses) << what;
      EXPECT_EQ(with.validation_losses, without.validation_losses) << what;
      strata_training_test::expect_same_parameters(with, without, what);
      ASSERT_EQ(clipped_with.losses.size(), 4u) << what;
      for (std::size_t i = 0; i < 4; ++i)
        EXPECT_NEAR(clipped_with.losses[i], clipped_without.losses[i], 1e-12 * clipped_without.losses[i]) << what << " clipped";
    }
}

// A run with --fp8-param-gather resumed from its checkpoint (saved after the values were gathered)
// follows the straight run bit for bit: the first step after the load casts the loaded weights. The
// same checkpoint loads into one rank without the flag.
TEST(TrainingFp8, ParameterGatherResumeEqualsStraightThrough) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_training_fp8_gather_resume";
  std::filesystem::remove_all(dir);
  for (const std::string recipe : {"delayed", "tensorwise"}) {
    auto a = tiny_fp8(recipe);
    a.train_iters = 6;
    a.world_size = 2;  // dp 2
    a.tensor_model_parallel_size = 1;
    a.sequence_parallel = false;
    a.use_distributed_optimizer = true;
    a.fp8_param_gather = true;
    a.ddp_bucket_size = 6000;
    const auto [straight, second] = straight_and_resumed(a, dir, 3);
    EXPECT_EQ(second.start_iteration, 3) << recipe;
    ASSERT_EQ(second.losses.size(), 3u) << recipe;
    for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(second.losses[i], straight.losses[3 + i]) << recipe << " iteration " << 4 + i;
    // The checkpoint holds values and optimizer pieces as any other: it loads into one rank
    // without the flag (the distributed optimizer's pieces reshard), and training goes on from there.
    auto one = a;
    one.world_size = 1;
    one.fp8_param_gather = false;
    one.load = dir.string();
    const auto resharded = trainer::train<strata::models::Gpt>(one);
    EXPECT_EQ(resharded.start_iteration, 3) << recipe;
    ASSERT_EQ(resharded.losses.size(), 3u) << recipe;
    for (std::size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(resharded.losses[i], straight.losses[3 + i], 1e-3 * straight.losses[3 + i]) << recipe << " iteration " << 4 + i;
    std::filesystem::remove_all(dir);
  }
}

TEST(TrainingFp8, RecipesThatCannotRunAreRefusedBeforeTraining) {
  auto expect_error = [](trainer::TrainArgs a, const std::string& needle) {
    try {
      (void)trainer::train<strata::models::Gpt>(a);
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const strata::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto a = tiny_fp8("mxfp8");
  a.train_iters = 1;
  expect_error(a, "Blackwell");
  a.fp8_recipe = "blockwise";  // at tp = 2 each rank holds 32 of the hidden features: not whole blocks of 64
  a.fp8_block_size = 64;
  a.lr_warmup_iters = 0;
  a.world_size = 2;
  a.tensor_model_parallel_size = 2;
  expect_error(a, "not whole blocks of 64");
  a.world_size = 1;
  a.tensor_model_parallel_size = 1;
  a.fp8_recipe = "delayed";
  a.fp8_amax_history_len = 0;
  expect_error(a, "--fp8-amax-history-len 0");
  a.fp8_amax_history_len = 1;
  a.fp8_param_gather = true;  // the distributed optimizer's
  expect_error(a, "add --use-distributed-optimizer");
  a.use_distributed_optimizer = true;
  a.fp8_recipe = "blockwise";
  a.fp8_block_size = 16;
  expect_error(a, "straddle the data-parallel shards");
  a.fp8_recipe = "delayed";
  a.fp8_weight_cache = "none";
  expect_error(a, "--fp8-weight-cache none");
  a.fp8_weight_cache = "auto";
  a.fp8_param_gather = false;
  a.use_distributed_optimizer = false;
  a.fp8_recast_attention_output = true;
  a.fp8_recipe = "blockwise";
  expect_error(a, "--fp8-recast-attention-output with --fp8-recipe blockwise");
  a.fp8_recipe = "delayed";
  a.fp8_format.clear();
  expect_error(a, "--fp8-recast-attention-output without --fp8-format");
  a.fp8_recast_attention_output = false;
  a.fp8_param_gather = true;
  expect_error(a, "--fp8-param-gather without --fp8-format");
}

}  // namespace
}  // namespace test_training_fp8_cases
