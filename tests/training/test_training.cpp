// End-to-end training through the trainers' loop on the shipped corpus: the loss falls; tp=2 (with
// and without sequence parallelism) and data parallelism follow the single-rank trajectory; a run
// resumed from a checkpoint reproduces the straight run bit for bit; pipeline ranks report their
// measured bubble; bad configurations are refused before anything runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <tuple>

#include <sys/stat.h>

#include "trainer/trainer.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_training_cases {

namespace {

trainer::TrainArgs tiny(std::string kind) {
  trainer::TrainArgs a = trainer::default_args(kind);
  a.model.num_layers = 2;
  a.model.hidden_size = 64;
  a.model.num_attention_heads = 4;
  a.model.ffn_hidden_size = 128;
  a.model.seq_length = 32;
  a.micro_batch_size = 4;
  a.global_batch_size = 8;
  a.lr = 1e-2;
  a.min_lr = 1e-3;
  a.lr_warmup_iters = 3;
  a.quiet = true;
  a.eval_interval = 20;
  a.eval_iters = 2;
  return a;
}

double mean(const std::vector<double>& v, std::size_t begin, std::size_t end) {
  return std::accumulate(v.begin() + begin, v.begin() + end, 0.0) / static_cast<double>(end - begin);
}

TEST(Training, GptLossFallsOnShippedCorpus) {
  auto a = tiny("gpt");
  a.train_iters = 40;
  const auto result = trainer::train<strata::models::Gpt>(a);
  ASSERT_EQ(result.losses.size(), 40u);
  EXPECT_GT(result.losses.front(), 5.0);  // about log(vocab) at the start
  EXPECT_LT(mean(result.losses, 30, 40), mean(result.losses, 0, 10) - 1.0) << "loss did not fall";
  // validation on held-out sequences (the 3% part of --split) at iterations 20 and 40
  ASSERT_EQ(result.validation_losses.size(), 2u);
  EXPECT_EQ(result.validation_losses[0].first, 20);
  EXPECT_LT(result.validation_losses[1].second, 3.5);
  EXPECT_LT(result.validation_losses[1].second, result.validation_losses[0].second + 0.1);
}

TEST(Training, LlamaLossFallsOnShippedCorpus) {
  auto a = tiny("llama");
  a.model.num_query_groups = 2;
  a.train_iters = 40;
  const auto result = trainer::train<strata::models::Llama>(a);
  ASSERT_EQ(result.losses.size(), 40u);
  EXPECT_LT(mean(result.losses, 30, 40), mean(result.losses, 0, 10) - 1.0) << "loss did not fall";
}

TEST(Training, ShardedRunsFollowSingleRankTrajectory) {
  auto base = tiny("gpt");
  base.dtype = "double";
  base.train_iters = 5;
  base.world_size = 1;
  base.tensor_model_parallel_size = 1;
  base.sequence_parallel = false;
  const auto reference = trainer::train<strata::models::Gpt>(base);
  struct Layout {
    int world, tp;
    bool sp;
    bool tp_comm_overlap = false;  // with dp > 1 also --overlap-grad-reduce: the chained weight
                                   // gradients must be complete when the bucket hook reads them
  };
  for (Layout l : {Layout{2, 2, false}, Layout{2, 2, true}, Layout{2, 1, false}, Layout{4, 2, true},
                   Layout{2, 2, true, true}, Layout{4, 2, true, true}}) {
    auto a = base;
    a.world_size = l.world;
    a.tensor_model_parallel_size = l.tp;
    a.sequence_parallel = l.sp;
    a.tp_comm_overlap = l.tp_comm_overlap;
    a.overlap_grad_reduce = l.tp_comm_overlap && l.world > l.tp;
    const auto run = trainer::train<strata::models::Gpt>(a);
    ASSERT_EQ(run.losses.size(), reference.losses.size());
    for (std::size_t i = 0; i < run.losses.size(); ++i)
      EXPECT_NEAR(run.losses[i], reference.losses[i], 1e-10 * reference.losses[i])
          << "world=" << l.world << " tp=" << l.tp << " sp=" << l.sp << " tp_comm_overlap=" << l.tp_comm_overlap
          << " iteration " << i + 1;
  }
}

// Multi-token prediction (--mtp-num-layers 2) through the trainers' loop: tp = 2 with and without
// sequence parallelism, dp = 2, tp = 2 x dp = 2, pp = 2 (the depths on the last stage with a copy of
// the word embedding; 1F1B and zero-bubble, and with tp = 2), and cp = 2 (the whole sequences rolled
// before each rank takes its chunks; alone, with tp = 2 and with pp = 2) follow the single-rank run in double,
// the loss and each depth's logged loss; a zero weight (--mtp-loss-scaling-factor 0) trains the main
// model as without depths, bit for bit.
TEST(Training, MultiTokenPredictionFollowsSingleRankTrajectory) {
  auto base = tiny("llama");
  base.model.num_query_groups = 2;
  base.dtype = "double";
  base.train_iters = 4;
  base.world_size = 1;
  base.tensor_model_parallel_size = 1;
  base.sequence_parallel = false;
  base.model.mtp_num_layers = 2;
  base.model.mtp_loss_scaling_factor = 0.3;
  const auto reference = trainer::train<strata::models::Llama>(base);
  ASSERT_EQ(reference.mtp_losses.size(), 2 * reference.losses.size());
  for (double l : reference.mtp_losses) EXPECT_GT(l, 0.5);  // the depths' mean cross-entropy, logged
  struct Layout {
    int world, tp;
    bool sp;
    int pp = 1;
    const char* schedule = "1f1b";
    int cp = 1;
  };
  for (Layout l : {Layout{2, 2, false}, Layout{2, 2, true}, Layout{2, 1, false}, Layout{4, 2, true}, Layout{2, 1, false, 2},
                   Layout{2, 1, false, 2, "zero-bubble"}, Layout{4, 2, true, 2}, Layout{2, 1, false, 1, "1f1b", 2},
                   Layout{4, 2, true, 1, "1f1b", 2}, Layout{4, 1, false, 2, "1f1b", 2}}) {
    auto a = base;
    a.world_size = l.world;
    a.context_parallel_size = l.cp;
    a.tensor_model_parallel_size = l.tp;
    a.sequence_parallel = l.sp;
    a.pipeline.pipeline_model_parallel_size = l.pp;
    a.pipeline.pipeline_schedule = l.schedule;
    if (l.pp > 1 || l.cp > 1) a.sample_tokens = 0;  // sampling runs the whole model and sequence on a rank
    const auto run = trainer::train<strata::models::Llama>(a);
    const std::string what = "world=" + std::to_string(l.world) + " tp=" + std::to_string(l.tp) + " sp=" + std::to_string(l.sp) +
                             " pp=" + std::to_string(l.pp) + " " + l.schedule + " cp=" + std::to_string(l.cp);
    ASSERT_EQ(run.losses.size(), reference.losses.size()) << what;
    ASSERT_EQ(run.mtp_losses.size(), reference.mtp_losses.size()) << what;
    for (std::size_t i = 0; i < run.losses.size(); ++i)
      EXPECT_NEAR(run.losses[i], reference.losses[i], 1e-10 * reference.losses[i]) << what << " iteration " << i + 1;
    for (std::size_t i = 0; i < run.mtp_losses.size(); ++i)
      EXPECT_NEAR(run.mtp_losses[i], reference.mtp_losses[i], 1e-10 * reference.mtp_losses[i]) << what << " depth value " << i;
  }
  auto zero = base, none = base;
  zero.model.mtp_loss_scaling_factor = 0;
  none.model.mtp_num_layers = 0;
  EXPECT_EQ(trainer::train<strata::models::Llama>(zero).losses, trainer::train<strata::models::Llama>(none).losses);
  EXPECT_NE(trainer::train<strata::models::Llama>(none).losses, reference.losses);  // the depths move the main model
}

// Checkpoints of a model with depths: saved at pp = 2 (the last stage's copy of the word embedding
// is not written; the depths' parameters are), resumed at pp = 1 and at tp = 2 x pp = 2: the
// losses and the depths' losses continue the straight run's.
TEST(Training, MultiTokenPredictionCheckpointsResumeInOtherLayouts) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_training_mtp_resume";
  std::filesystem::remove_all(dir);
  auto a = tiny("llama");
  a.model.num_query_groups = 2;
  a.dtype = "double";
  a.train_iters = 6;
  a.sample_tokens = 0;
  a.model.mtp_num_layers = 1;
  a.model.mtp_loss_scaling_factor = 0.3;
  const auto straight = trainer::train<strata::models::Llama>(a);
  auto first = a;
  first.world_size = 2;
  first.tensor_model_parallel_size = 1;
  first.pipeline.pipeline_model_parallel_size = 2;
  first.save = dir.string();
  first.save_interval = 3;
  (void)trainer::train<strata::models::Llama>(first);
  std::filesystem::remove_all(dir / "iter_0000006");
  {
    std::ofstream tracker(dir / "latest_checkpointed_iteration.txt", std::ios::trunc);
    tracker << 3 << "\n";
  }
  for (const auto& [world, tp, pp] : {std::tuple{1, 1, 1}, std::tuple{4, 2, 2}}) {
    auto resumed = a;
    resumed.world_size = world;
    resumed.tensor_model_parallel_size = tp;
    resumed.pipeline.pipeline_model_parallel_size = pp;
    resumed.load = dir.string();
    const auto second = trainer::train<strata::models::Llama>(resumed);
    ASSERT_EQ(second.losses.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(second.losses[i], straight.losses[3 + i], 1e-10 * straight.losses[3 + i]) << "tp=" << tp << " pp=" << pp;
      EXPECT_NEAR(second.mtp_losses[i], straight.mtp_losses[3 + i], 1e-10 * straight.mtp_losses[3 + i]) << "tp=" << tp << " pp=" << pp;
    }
  }
  std::filesystem::remove_all(dir);
}

// Context parallelism (ring attention over the cp group): cp = 2 alone, with tp = 2 under sequence
// parallelism, with pp = 2 (1F1B), and with dp = 2 under the distributed optimizer (sharded over dp x cp) and
// overlapped gradient reduction, with hidden and attention dropout, follows the run of the same
// layout without cp in double (the single-rank run where dp = 1; with dp = 2 the dp = 2 run, whose
// micro-batches draw other dropout keys than one rank's).
TEST(Training, ContextParallelFollowsSingleRankTrajectory) {
  for (const std::string kind : {"gpt", "llama"}) {
    auto base = tiny(kind);
    if (kind == "llama") base.model.num_query_groups = 2;
    base.dtype = "double";
    base.train_iters = 3;
    base.world_size = 1;
    base.tensor_model_parallel_size = 1;
    base.sequence_parallel = false;
    base.sample_tokens = 0;
    base.model.hidden_dropout = 0.1;
    base.model.attention_dropout = 0.1;
    auto train = [&](const trainer::TrainArgs& a) {
      return kind == "gpt" ? trainer::train<strata::models::Gpt>(a) : trainer::train<strata::models::Llama>(a);
    };
    const auto single = train(base);
    struct Layout {
      int world, tp, cp;
      bool distributed = false;
      int pp = 1;
      int a2a_size = 0;  // > 0: --cp-comm-type a2a+p2p with --hierarchical-context-parallel-sizes a2a_size cp/a2a_size
    };
    for (Layout l : {Layout{2, 1, 2}, Layout{4, 2, 2}, Layout{4, 1, 2, true}, Layout{4, 1, 2, false, 2},
                     Layout{4, 1, 4, false, 1, 2}}) {
      if (kind == "llama" && l.world > 2 && l.a2a_size == 0) continue;  // the model tests cover the rest
      auto a = base;
      if (l.a2a_size > 0) a.cp_comm_type = "a2a+p2p", a.hierarchical_cp_sizes = {l.a2a_size, l.cp / l.a2a_size};
      a.world_size = l.world;
      a.pipeline.pipeline_model_parallel_size = l.pp;
      a.tensor_model_parallel_size = l.tp;
      a.sequence_parallel = l.tp > 1;
      a.context_parallel_size = l.cp;
      a.use_distributed_optimizer = l.distributed;
      a.overlap_grad_reduce = l.distributed;
      const bool data_parallel = l.world > l.tp * l.cp * l.pp;
      auto without_cp = a;
      without_cp.world_size = l.world / l.cp;
      without_cp.context_parallel_size = 1;
      const auto reference = data_parallel ? train(without_cp) : single;
      const auto run = train(a);
      ASSERT_EQ(run.losses.size(), reference.losses.size());
      for (std::size_t i = 0; i < run.losses.size(); ++i)
        EXPECT_NEAR(run.losses[i], reference.losses[i], 1e-10 * reference.losses[i])
            << kind << " world=" << l.world << " tp=" << l.tp << " cp=" << l.cp << " pp=" << l.pp << " distributed=" << l.distributed
            << " iteration " << i + 1;
      ASSERT_EQ(run.validation_losses.size(), reference.validation_losses.size());
      for (std::size_t i = 0; i < run.validation_losses.size(); ++i)
        EXPECT_NEAR(run.validation_losses[i].second, reference.validation_losses[i].second,
                    1e-10 * reference.validation_losses[i].second);
    }
  }
}

// pp = 2 under each schedule: every pipeline rank reports the time of its actions within the
// time of its schedule per step, and the bubble the table predicts; pp = 1 reports nothing.
TEST(Training, PipelineRanksReportTheirMeasuredBubble) {
  auto a = tiny("gpt");
  a.model.num_layers = 4;
  a.train_iters = 3;
  a.lr_warmup_iters = 1;
  a.eval_iters = 0;
  a.sample_tokens = 0;
  a.micro_batch_size = 2;  // 4 micro-batches per step
  a.world_size = 2;
  a.tensor_model_parallel_size = 1;
  const auto single = trainer::train<strata::models::Gpt>(a);
  EXPECT_TRUE(single.pipeline_busy_seconds.empty()) << "pp = 1 has no pipeline bubble to report";
  a.pipeline.pipeline_model_parallel_size = 2;
  a.world_size = 2;
  using strata::pipeline::ScheduleKind;
  for (ScheduleKind kind : {ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zero_bubble}) {
    a.pipeline.pipeline_schedule = std::string(strata::pipeline::schedule_name(kind));
    a.pipeline.num_layers_per_virtual_pipeline_stage = kind == ScheduleKind::interleaved ? 1 : 0;  // 2 chunks per rank
    const auto run = trainer::train<strata::models::Gpt>(a);
    const std::string what = a.pipeline.pipeline_schedule;
    ASSERT_EQ(run.pipeline_busy_seconds.size(), 2u) << what;
    ASSERT_EQ(run.pipeline_step_seconds.size(), 2u) << what;
    for (std::size_t r = 0; r < 2; ++r) {
      EXPECT_GT(run.pipeline_busy_seconds[r], 0.0) << what << " rank " << r;
      EXPECT_LE(run.pipeline_busy_seconds[r], run.pipeline_step_seconds[r]) << what << " rank " << r << ": busy beyond the step";
    }
    const int v = kind == ScheduleKind::interleaved ? 2 : 1;
    EXPECT_EQ(run.pipeline_predicted_bubble, strata::pipeline::verify_schedule({kind, 2, 4, v}).bubble_fraction()) << what;
    EXPECT_GT(run.pipeline_predicted_bubble, 0.0) << what;
  }
}

// Runs a trainer's main() on the flags and returns (exit status, stderr).
std::pair<int, std::string> run_main(std::vector<std::string> flags) {
  flags.insert(flags.begin(), "train_gpt");
  std::vector<char*> argv;
  for (auto& f : flags) argv.push_back(f.data());
  testing::internal::CaptureStderr();
  const int status = trainer::main_gpt(static_cast<int>(argv.size()), argv.data());
  // main() turned on the exit-on-failure of comm/failure.hpp for the process: a failure it reported
  // would end this test program 5 s later, in whatever case runs then.
  strata::failure::stand_down();
  return {status, testing::internal::GetCapturedStderr()};
}

TEST(Training, ResumeEqualsStraightThrough) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_training_resume";
  std::filesystem::remove_all(dir);
  auto a = tiny("gpt");
  a.train_iters = 12;
  const auto straight = trainer::train<strata::models::Gpt>(a);

  auto first = a;
  first.train_iters = 12;
  first.save = dir.string();
  first.save_interval = 6;
  const auto saved_run = trainer::train<strata::models::Gpt>(first);  // saves at 6 and 12
  ASSERT_EQ(saved_run.losses, straight.losses);

  auto resumed = a;
  resumed.load = dir.string();
  resumed.save.clear();
  // load the iteration-6 checkpoint: point the tracker back to it
  std::filesystem::remove_all(dir / "iter_0000012");
  {
    std::ofstream tracker(dir / "latest_checkpointed_iteration.txt", std::ios::trunc);
    tracker << 6 << "\n";
  }
  const auto second = trainer::train<strata::models::Gpt>(resumed);
  EXPECT_EQ(second.start_iteration, 6);
  ASSERT_EQ(second.losses.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(second.losses[i], straight.losses[6 + i]) << "iteration " << 7 + i;

  // Resuming the iteration-6 checkpoint with --train-iters 3: nothing to do, said in words.
  auto past = resumed;
  past.train_iters = 3;
  past.lr_warmup_iters = 1;
  const auto nothing = trainer::train<strata::models::Gpt>(past);
  EXPECT_TRUE(nothing.losses.empty());
  EXPECT_NE(nothing.nothing_to_do.find("iteration 6, already at or past --train-iters=3"), std::string::npos)
      << nothing.nothing_to_do;
  testing::internal::CaptureStdout();
  const auto [status, err] = run_main({"--load", dir.string(), "--train-iters", "3", "--lr-warmup-iters", "1", "--seq-length",
                                       "32", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
                                       "--eval-interval", "20", "--eval-iters", "2", "--lr", "1e-2", "--min-lr", "1e-3"});
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(status, 0) << err;
  EXPECT_NE(out.find("nothing to do"), std::string::npos) << out;
  EXPECT_EQ(out.find("iterations 7..3"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

TEST(Training, BadConfigurationsAreRefusedWithTheValue) {
  auto expect_error = [](trainer::TrainArgs a, const std::string& needle) {
    try {
      trainer::train<strata::models::Gpt>(a);
      ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
    } catch (const strata::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto a = tiny("gpt");
  a.tensor_model_parallel_size = 3;
  expect_error(a, "--tensor-model-parallel-size=3");
  a = tiny("gpt");
  a.global_batch_size = 6;
  expect_error(a, "--global-batch-size=6");
  a = tiny("gpt");
  a.model.num_attention_heads = 3;
  expect_error(a, "num_attention_heads=3");
  a = tiny("gpt");
  a.data_path = "/nonexistent/corpus";
  expect_error(a, "/nonexistent/corpus");
  a = tiny("gpt");
  a.split = "90,x,10";
  expect_error(a, "'x'");
}

TEST(TrainerFlags, EveryIntegerFlagIsRangeCheckedNamingTheFlag) {
  struct Case {
    const char* flag;
    void (*set)(trainer::TrainArgs&);
  };
  const Case cases[] = {
      {"--world-size=0", [](trainer::TrainArgs& a) { a.world_size = 0; }},
      {"--tensor-model-parallel-size=0", [](trainer::TrainArgs& a) { a.tensor_model_parallel_size = 0; }},
      {"--num-layers=0", [](trainer::TrainArgs& a) { a.model.num_layers = 0; }},
      {"--hidden-size=-1", [](trainer::TrainArgs& a) { a.model.hidden_size = -1; }},
      {"--num-attention-heads=0", [](trainer::TrainArgs& a) { a.model.num_attention_heads = 0; }},
      {"--num-query-groups=-1", [](trainer::TrainArgs& a) { a.model.num_query_groups = -1; }},
      {"--ffn-hidden-size=-4", [](trainer::TrainArgs& a) { a.model.ffn_hidden_size = -4; }},
      {"--seq-length=0", [](trainer::TrainArgs& a) { a.model.seq_length = 0; }},
      {"--vocab-size=0", [](trainer::TrainArgs& a) { a.model.vocab_size = 0; }},
      {"--make-vocab-size-divisible-by=0", [](trainer::TrainArgs& a) { a.model.make_vocab_size_divisible_by = 0; }},
      {"--micro-batch-size=0", [](trainer::TrainArgs& a) { a.micro_batch_size = 0; }},
      {"--global-batch-size=-8", [](trainer::TrainArgs& a) { a.global_batch_size = -8; }},
      {"--train-iters=0", [](trainer::TrainArgs& a) { a.train_iters = 0; }},
      {"--lr-warmup-iters=-1", [](trainer::TrainArgs& a) { a.lr_warmup_iters = -1; }},
      {"--lr-decay-iters=-1", [](trainer::TrainArgs& a) { a.lr_decay_iters = -1; }},
      {"--eval-interval=-1", [](trainer::TrainArgs& a) { a.eval_interval = -1; }},
      {"--eval-iters=-1", [](trainer::TrainArgs& a) { a.eval_iters = -1; }},
      {"--save-interval=-1", [](trainer::TrainArgs& a) { a.save_interval = -1; }},
      {"--ckpt-step=-2", [](trainer::TrainArgs& a) { a.ckpt_step = -2; }},
      {"--log-interval=0", [](trainer::TrainArgs& a) { a.log_interval = 0; }},
      {"--sample-tokens=-1", [](trainer::TrainArgs& a) { a.sample_tokens = -1; }},
      {"--sample-tokens=2000000", [](trainer::TrainArgs& a) { a.sample_tokens = 2000000; }},
  };
  for (const Case& c : cases) {
    auto a = tiny("gpt");
    c.set(a);
    try {
      trainer::validate(a);
      ADD_FAILURE() << c.flag << " was accepted";
    } catch (const strata::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(c.flag), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(trainer::validate(tiny("gpt")));
  auto wide = tiny("gpt");
  wide.model.hidden_size = 600000000;
  wide.model.ffn_hidden_size = 0;
  try {
    trainer::validate(wide);
    ADD_FAILURE() << "--hidden-size=600000000 with the default ffn width was accepted";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--hidden-size=600000000 makes the default --ffn-hidden-size"), std::string::npos)
        << e.what();
  }
}

TEST(TrainerMain, LogIntervalZeroExitsNonZeroNamingTheFlag) {
  const auto [status, err] = run_main({"--log-interval", "0", "--quiet"});
  EXPECT_EQ(status, 1);
  EXPECT_NE(err.find("--log-interval=0"), std::string::npos) << err;
}

TEST(TrainerFlags, NonFiniteAndOutOfRangeFloatsAreRefusedNamingTheFlag) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  struct Case {
    const char* flag;
    void (*set)(trainer::TrainArgs&, double);
    double value;
  };
  const Case cases[] = {
      {"--init-method-std=nan", [](trainer::TrainArgs& a, double v) { a.model.init_method_std = v; }, nan},
      {"--rotary-base=0", [](trainer::TrainArgs& a, double v) { a.model.rope_base = v; }, 0.0},
      {"--hidden-dropout=nan", [](trainer::TrainArgs& a, double v) { a.model.hidden_dropout = v; }, nan},
      {"--label-smoothing=nan", [](trainer::TrainArgs& a, double v) { a.model.label_smoothing = v; }, nan},
      {"--clip-grad=nan", [](trainer::TrainArgs& a, double v) { a.clip_grad = v; }, nan},
      {"--clip-grad=-1", [](trainer::TrainArgs& a, double v) { a.clip_grad = v; }, -1.0},
      {"--sample-temperature=nan", [](trainer::TrainArgs& a, double v) { a.sample_temperature = v; }, nan},
      {"--lr=inf", [](trainer::TrainArgs& a, double v) { a.lr = v; }, inf},
      {"--adam-beta2=1", [](trainer::TrainArgs& a, double v) { a.adam_beta2 = v; }, 1.0},
      {"--adam-eps=0", [](trainer::TrainArgs& a, double v) { a.adam_eps = v; }, 0.0},
      {"--weight-decay=nan", [](trainer::TrainArgs& a, double v) { a.weight_decay = v; }, nan},
  };
  for (const Case& c : cases) {
    auto a = tiny("llama");
    c.set(a, c.value);
    try {
      trainer::validate(a);
      ADD_FAILURE() << c.flag << " was accepted";
    } catch (const strata::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(c.flag), std::string::npos) << e.what();
    }
  }
  auto a = tiny("gpt");
  a.clip_grad = -1;
  try {
    trainer::validate(a);
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("0 disables clipping"), std::string::npos) << e.what();
  }
}

// ModelConfig's own validation refuses NaN too (the library path, without the trainer's flags).
TEST(TrainerFlags, ModelValidationRefusesNonFiniteNumbers) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  strata::models::ModelConfig m = tiny("gpt").model;
  const strata::ParallelConfig p{.tp = 1};
  auto refused = [&](strata::models::ModelConfig c) {
    EXPECT_THROW(strata::models::validate(c, p, false, 1), strata::ConfigError);
  };
  auto c = m;
  c.init_method_std = nan;
  refused(c);
  c = m;
  c.rope_base = 0;
  refused(c);
  c = m;
  c.hidden_dropout = nan;
  refused(c);
  c = m;
  c.label_smoothing = nan;
  refused(c);
  c = m;
  c.norm_epsilon = nan;
  refused(c);
  EXPECT_NO_THROW(strata::models::validate(m, p, false, 1));
}

// An initial std beyond float range makes the first loss non-finite: the run stops at iteration 1 naming it, and
// saves nothing; with the check off it runs to the end.
TEST(Training, NonFiniteLossStopsTheRunWithoutSaving) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_training_nan";
  std::filesystem::remove_all(dir);
  auto a = tiny("gpt");
  a.train_iters = 3;
  a.eval_iters = 0;
  a.model.init_method_std = 1e300;  // inf once rounded to float
  a.save = dir.string();
  try {
    trainer::train<strata::models::Gpt>(a);
    ADD_FAILURE() << "a non-finite loss did not stop the run";
  } catch (const strata::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("iteration 1: the loss is"), std::string::npos) << m;
    EXPECT_NE(m.find("--no-check-for-nan-in-loss-and-grad"), std::string::npos) << m;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "latest_checkpointed_iteration.txt"));
  a.save.clear();
  a.check_for_nan_in_loss_and_grad = false;
  const auto result = trainer::train<strata::models::Gpt>(a);
  ASSERT_EQ(result.losses.size(), 3u);
  EXPECT_FALSE(std::isfinite(result.losses[0]));
  std::filesystem::remove_all(dir);
}

// The check reads the device only at log steps: with --log-interval 3 a loss that is non-finite from
// iteration 1 still stops the run naming iteration 1 (the optimizer skipped every update since), at
// iteration 3, and nothing is saved.
TEST(Training, NonFiniteLossIsFoundAtTheNextLogStep) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_training_nan_interval";
  std::filesystem::remove_all(dir);
  auto a = tiny("gpt");
  a.train_iters = 5;
  a.log_interval = 3;
  a.eval_iters = 0;
  a.lr_warmup_iters = 1;
  a.model.init_method_std = 1e300;
  a.save = dir.string();
  a.save_interval = 4;
  try {
    trainer::train<strata::models::Gpt>(a);
    ADD_FAILURE() << "a non-finite loss did not stop the run";
  } catch (const strata::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("iteration 1: the loss is"), std::string::npos) << m;
    EXPECT_NE(m.find("weights are those after iteration 0"), std::string::npos) << m;
    EXPECT_NE(m.find("training stopped at iteration 3"), std::string::npos) << m;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "latest_checkpointed_iteration.txt"));
  std::filesystem::remove_all(dir);
}

// A validation loss that is not finite stops the run as a non-finite training loss does, before the
// checkpoint and the Hugging Face export of that iteration.
TEST(Training, NonFiniteValidationLossStopsTheRunBeforeAnySave) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_training_nan_validation";
  std::filesystem::remove_all(dir);
  auto a = tiny("gpt");
  a.train_iters = 1;
  a.lr = 1e18;  // iteration 1's loss is finite; its update makes every later one NaN
  a.min_lr = 0;
  a.lr_warmup_iters = 0;
  a.lr_decay_style = "constant";
  a.clip_grad = 0;
  a.save = (dir / "ck").string();
  a.save_hf = (dir / "hf").string();
  try {
    const auto result = trainer::train<strata::models::Gpt>(a);
    ADD_FAILURE() << "a non-finite validation loss did not stop the run (validation loss "
                  << (result.validation_losses.empty() ? 0.0 : result.validation_losses.back().second) << ")";
  } catch (const strata::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("iteration 1: the validation loss is"), std::string::npos) << m;
    EXPECT_NE(m.find("nothing was saved"), std::string::npos) << m;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "ck" / "latest_checkpointed_iteration.txt"));
  EXPECT_FALSE(std::filesystem::exists(dir / "hf" / "config.json"));
  std::filesystem::remove_all(dir);
}

// --log-jsonl on a full disk (/dev/full) stops the run naming the file, as --tensorboard-dir does.
TEST(Training, LogFileThatCannotBeWrittenStopsTheRunNamingIt) {
  auto a = tiny("gpt");
  a.train_iters = 2;
  a.lr_warmup_iters = 1;
  a.log_interval = 1;
  a.log_jsonl = "/dev/full";
  try {
    trainer::train<strata::models::Gpt>(a);
    ADD_FAILURE() << "writing --log-jsonl /dev/full did not fail";
  } catch (const strata::FileError& e) {
    EXPECT_NE(std::string(e.what()).find("--log-jsonl file '/dev/full'"), std::string::npos) << e.what();
  }
}

// An iteration's log line is written before its checkpoint: a save that fails (here a --save path
// under a regular file) finds the iteration already in the JSONL log.
TEST(Training, IterationIsLoggedBeforeItsCheckpoint) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_training_log_before_save";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "file") << "not a directory\n"; }
  auto a = tiny("gpt");
  a.train_iters = 2;
  a.lr_warmup_iters = 1;
  a.log_interval = 1;
  a.save_interval = 1;
  a.eval_iters = 0;
  a.log_jsonl = (dir / "log.jsonl").string();
  a.save = (dir / "file" / "ck").string();
  EXPECT_THROW(trainer::train<strata::models::Gpt>(a), std::exception);
  std::ifstream log(dir / "log.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(log, line)) << "iteration 1 was not logged before its checkpoint";
  EXPECT_EQ(line.rfind("{\"iteration\": 1, \"loss\": ", 0), 0u) << line;
  std::filesystem::remove_all(dir);
}

// The gradient norm is a pass over every gradient, taken only where something reads it: with
// --clip-grad 0 and the non-finite checks off (a run like PyTorch's without clip_grad_norm_) the
// step skips it, the losses are those of the run that takes it bit for bit (one rank, and pp 2 x
// dp 2, whose norm is a collective every rank skips together), and the JSONL log has no grad_norm.
TEST(Training, GradientNormIsTakenOnlyWhereRead) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_training_norm_unread";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (int world : {1, 4}) {
    std::filesystem::remove(dir / "taken.jsonl");  // the log appends (a resumed run goes on in it)
    std::filesystem::remove(dir / "skipped.jsonl");
    auto a = tiny("gpt");
    a.train_iters = 4;
    a.lr_warmup_iters = 1;
    a.log_interval = 1;
    a.eval_iters = 0;
    a.clip_grad = 0;
    if (world == 4) {
      a.model.num_layers = 4;
      a.world_size = 4;
      a.tensor_model_parallel_size = 1;
      a.pipeline.pipeline_model_parallel_size = 2;
      a.sample_tokens = 0;
    }
    EXPECT_TRUE(trainer::grad_norm_needed(a, false)) << "the NaN check reads the norm";
    a.log_jsonl = (dir / "taken.jsonl").string();
    const auto taken = trainer::train<strata::models::Gpt>(a);
    a.check_for_nan_in_loss_and_grad = false;
    EXPECT_FALSE(trainer::grad_norm_needed(a, false));
    EXPECT_TRUE(trainer::grad_norm_needed(a, true)) << "a loss scaler reads the norm";
    a.log_jsonl = (dir / "skipped.jsonl").string();
    const auto skipped = trainer::train<strata::models::Gpt>(a);
    ASSERT_EQ(taken.losses.size(), 4u);
    EXPECT_EQ(skipped.losses, taken.losses) << "world " << world;
    auto lines = [](const std::filesystem::path& path) {
      std::vector<std::string> out;
      std::ifstream in(path);
      for (std::string line; std::getline(in, line);) out.push_back(line);
      return out;
    };
    const auto with = lines(dir / "taken.jsonl"), without = lines(dir / "skipped.jsonl");
    ASSERT_EQ(with.size(), 4u);
    ASSERT_EQ(without.size(), 4u);
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_NE(with[i].find("\"grad_norm\": "), std::string::npos) << with[i];
      EXPECT_EQ(without[i].find("grad_norm"), std::string::npos) << without[i];
      EXPECT_NE(without[i].find("\"tokens_per_s\": "), std::string::npos) << without[i];
    }
  }
  std::filesystem::remove_all(dir);
}

// --load must name a checkpoint directory: a regular file, a FIFO, or a directory of checkpoints
// without its tracker is refused before training (the checkpoints are never overwritten).
TEST(Training, LoadThatIsNoCheckpointDirectoryIsRefused) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_training_load_kinds";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "ck" / "iter_0000002");
  std::filesystem::create_directories(dir / "ck" / "iter_0000004");
  { std::ofstream(dir / "ck" / "iter_0000002" / "marker") << "kept\n"; }
  { std::ofstream(dir / "file") << "x\n"; }
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  auto refused = [](trainer::TrainArgs a, std::vector<std::string> parts) {
    try {
      trainer::train<strata::models::Gpt>(a);
      ADD_FAILURE() << "--load " << a.load << " was accepted";
    } catch (const strata::ConfigError& e) {
      for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  auto a = tiny("gpt");
  a.train_iters = 2;
  a.lr_warmup_iters = 1;
  a.load = (dir / "file").string();
  refused(a, {"--load", "a regular file"});
  a.load = (dir / "fifo").string();
  refused(a, {"--load", "a FIFO"});
  a.load = a.save = (dir / "ck").string();
  refused(a, {"iter_0000002, iter_0000004", "latest_checkpointed_iteration.txt", "--ckpt-step"});
  EXPECT_TRUE(std::filesystem::exists(dir / "ck" / "iter_0000002" / "marker"));
  std::filesystem::remove_all(dir);
}

// Flags the trainer does not know are named, as Megatron's argparse does, with its exit status 2.
TEST(TrainerMain, UnrecognizedFlagsAreNamedWithExitStatusTwo) {
  const auto [status, err] = run_main({"--foo", "--bar", "3", "--quiet"});
  EXPECT_EQ(status, 2);
  EXPECT_NE(err.find("error: unrecognized arguments: --foo --bar 3"), std::string::npos) << err;
}

// The notes of what the run settles (sequence parallelism off at tensor parallel 1) are printed.
TEST(TrainerMain, NotesOfTheSettledRunArePrinted) {
  testing::internal::CaptureStdout();
  const auto [status, err] = run_main({"--sequence-parallel", "--tp-comm-overlap", "--world-size", "1", "--train-iters", "1",
                                       "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length",
                                       "16", "--micro-batch-size", "1", "--eval-iters", "0", "--sample-tokens", "0"});
  (void)testing::internal::GetCapturedStdout();
  EXPECT_EQ(status, 0) << err;
  EXPECT_NE(err.find("note: --sequence-parallel: disabled because tensor parallelism is 1"), std::string::npos) << err;
  EXPECT_NE(err.find("note: --tp-comm-overlap: nothing to overlap"), std::string::npos) << err;
}

// The estimate's parameter count is exactly what the models allocate on each rank.
TEST(MemoryEstimate, ParameterCountIsTheModelsOwn) {
  using Context = strata::ParallelContext<strata::inprocess::communicator>;
  for (int tp : {1, 2}) {
    for (std::string kind : {"gpt", "llama"}) {
      auto a = tiny(kind);
      if (kind == "llama") a.model.num_query_groups = 2;
      const auto shape = kind == "llama" ? strata::models::DecoderShape::llama() : strata::models::DecoderShape::gpt();
      const std::int64_t expected = strata::models::parameters_per_rank(a.model, shape, tp);
      std::vector<std::int64_t> counted(static_cast<std::size_t>(tp));
      strata::inprocess::run(tp, [&](strata::inprocess::communicator& world) {
        Context ctx = Context::create(world, strata::ParallelConfig{.tp = tp});
        std::int64_t n = 0;
        auto count = [&](auto& p) { n += p.value.numel(); };
        if (kind == "llama") {
          strata::models::Llama<trainer::TrainPolicy<float, false>> model(ctx, a.model);
          model.for_each_parameter(count);
        } else {
          strata::models::Gpt<trainer::TrainPolicy<float, false>> model(ctx, a.model);
          model.for_each_parameter(count);
        }
        counted[static_cast<std::size_t>(world.rank())] = n;
      });
      for (int r = 0; r < tp; ++r) EXPECT_EQ(counted[static_cast<std::size_t>(r)], expected) << kind << " tp=" << tp << " rank " << r;
    }
  }
}

// Under pipeline parallelism each rank's estimate counts its own stage: the parameters of its
// chunks exactly as the pipeline model allocates them (on the last stage the tied output layer's
// copy of the embedding), the activations of the micro-batch chunks its schedule keeps in flight at
// its peak, and with the distributed optimizer 1/dp of the optimizer state.
TEST(MemoryEstimate, PipelineRanksCountTheirOwnStage) {
  using Context = strata::ParallelContext<strata::inprocess::communicator>;
  using strata::models::DecoderShape;
  for (std::string kind : {"gpt", "llama"}) {
    for (int v : {1, 2}) {
      auto a = tiny(kind);
      a.model.num_layers = 4;
      a.pipeline.pipeline_model_parallel_size = 2;
      if (v == 2) {
        a.pipeline.pipeline_schedule = "interleaved";
        a.pipeline.num_layers_per_virtual_pipeline_stage = 1;
      }
      const auto shape = kind == "llama" ? DecoderShape::llama() : DecoderShape::gpt();
      const auto holdings = trainer::pipeline_holdings(a.pipeline, a.model, 4);
      ASSERT_EQ(holdings.size(), 2u);
      std::vector<std::int64_t> counted(2);
      strata::inprocess::run(2, [&](strata::inprocess::communicator& world) {
        Context ctx = Context::create(world, strata::ParallelConfig{.pp = 2});
        std::int64_t n = 0;
        auto count = [&](auto& p) { n += p.value.numel(); };
        if (kind == "llama") {
          strata::models::PipelineModel<strata::models::Llama, trainer::TrainPolicy<float, false>> model(
              ctx, a.model, trainer::layout_of(a.pipeline, a.model));
          model.for_each_parameter(count);
        } else {
          strata::models::PipelineModel<strata::models::Gpt, trainer::TrainPolicy<float, false>> model(
              ctx, a.model, trainer::layout_of(a.pipeline, a.model));
          model.for_each_parameter(count);
        }
        counted[static_cast<std::size_t>(ctx.pp.rank())] = n;
      });
      for (std::size_t r = 0; r < 2; ++r) {
        std::int64_t expected = 0;
        for (const auto& piece : holdings[r].chunks) expected += strata::models::parameters_per_rank(a.model, shape, 1, piece);
        EXPECT_EQ(counted[r], expected) << kind << " v=" << v << " pipeline rank " << r;
      }
    }
  }
  // 1F1B over pp=2 with 4 micro-batches: rank 0 keeps 2 in flight, rank 1 one; dp = 2 shards the
  // optimizer state.
  auto a = tiny("gpt");
  a.model.num_layers = 4;
  a.world_size = 4;
  a.tensor_model_parallel_size = 1;
  a.pipeline.pipeline_model_parallel_size = 2;
  a.micro_batch_size = 1;
  a.global_batch_size = 8;
  a.use_distributed_optimizer = true;
  const auto plan = trainer::plan_memory<float>(a);
  ASSERT_EQ(plan.stage_estimates.size(), 2u);
  const auto bytes = strata::models::element_bytes_of<float>();
  const auto block = static_cast<std::int64_t>(strata::ClassifierChunks{}.max_bytes);
  const auto first = strata::models::activations_of(a.model, 1, false, 1, bytes, block, {2, true, false});
  const auto last = strata::models::activations_of(a.model, 1, false, 1, bytes, block, {2, false, true});
  EXPECT_EQ(plan.stage_estimates[0].activation_bytes, 2 * first.kept + first.extra());
  EXPECT_EQ(plan.stage_estimates[1].activation_bytes, last.kept + last.extra());
  EXPECT_EQ(first.transient, 0);
  EXPECT_GT(last.transient, 0);
  for (const auto& e : plan.stage_estimates) EXPECT_EQ(2 * e.optimizer_bytes, 3 * e.gradient_bytes);
  EXPECT_EQ(plan.per_rank.total(), std::max(plan.stage_estimates[0].total(), plan.stage_estimates[1].total()));
  EXPECT_NE(trainer::describe(plan, "float").find("pipeline rank " + std::to_string(plan.per_rank_stage) + " of 2"), std::string::npos)
      << trainer::describe(plan, "float");
}

// Under context parallelism the activations are the local tokens' (seq_length / cp) plus one layer's
// attention buffers of the chosen exchange: the ring's keys, values and gradient sums (p2p), every
// rank's at once (allgather, growing with cp), the all-to-all's (a2a), or both (a2a+p2p).
TEST(MemoryEstimate, ContextParallelCountsLocalTokensAndTheAttentionBuffers) {
  auto a = tiny("llama");
  a.world_size = 4;
  a.tensor_model_parallel_size = 1;
  a.context_parallel_size = 4;
  a.micro_batch_size = 1;
  a.global_batch_size = 1;
  auto local = a;  // the same tokens per rank without cp: seq_length / 4 on one rank
  local.world_size = 1;
  local.context_parallel_size = 1;
  local.model.seq_length = a.model.seq_length / 4;
  const auto base = trainer::plan_memory<float>(local).per_rank.activation_bytes;
  const auto bytes = strata::models::element_bytes_of<float>();
  std::int64_t previous = -1;
  for (const char* comm : {"p2p", "a2a", "allgather", "a2a+p2p"}) {
    a.cp_comm_type = comm;
    if (std::string(comm) == "a2a+p2p") a.hierarchical_cp_sizes = {2, 2};
    const auto buffers = strata::models::context_parallel_attention_bytes(a.model, 1, 4, trainer::context_parallel_comm_of(a),
                                                                          1, bytes);
    EXPECT_GT(buffers, 0) << comm;
    EXPECT_EQ(trainer::plan_memory<float>(a).per_rank.activation_bytes, base + buffers) << comm;
    if (std::string(comm) == "allgather") {
      EXPECT_GT(buffers, previous) << "all-gather holds every rank's keys and values";
    }
    previous = buffers;
  }
  a.context_parallel_size = 1;
  EXPECT_EQ(strata::models::context_parallel_attention_bytes(a.model, 1, 1, strata::ContextParallelComm::p2p, 1, bytes), 0);
}

// Sizes that cannot fit are refused with the numbers before anything is allocated, instead of
// std::bad_alloc or std::system_error from deep inside the run.
TEST(TrainerMain, SizesThatCannotFitAreRefusedWithTheNumbers) {
  const std::vector<std::vector<std::string>> runs = {
      {"--vocab-size", "2000000000", "--sample-tokens", "0"},
      {"--num-layers", "1000000"},
      {"--train-iters", "2000000000"},
      {"--hidden-size", "1000000000", "--ffn-hidden-size", "512"},
      {"--hidden-size", "1000000000"},
  };
  for (auto flags : runs) {
    flags.push_back("--quiet");
    const auto [status, err] = run_main(flags);
    EXPECT_EQ(status, 1) << flags[0];
    const bool named = err.find("does not fit in memory") != std::string::npos || err.find("64-bit") != std::string::npos ||
                       err.find("32-bit") != std::string::npos;
    EXPECT_TRUE(named) << flags[0] << ": " << err;
    EXPECT_EQ(err.find("bad_alloc"), std::string::npos) << err;
  }
  const auto [status, err] = run_main({"--world-size", "3000", "--quiet"});
  EXPECT_EQ(status, 1);
  EXPECT_NE(err.find("--world-size=3000 is out of range"), std::string::npos) << err;
}

TEST(MemoryEstimate, ReportNamesEveryPartAndTheMemoryAvailable) {
  const auto plan = trainer::plan_memory<float>(tiny("gpt"));
  EXPECT_GT(plan.per_rank.parameter_bytes, 0);
  EXPECT_EQ(plan.per_rank.optimizer_bytes, 3 * plan.per_rank.gradient_bytes);
  EXPECT_GT(plan.total, plan.ranks * plan.per_rank.total());
  const std::string line = trainer::describe(plan, "float");
  for (const char* part : {"parameters", "gradients", "optimizer", "activations", "available"})
    EXPECT_NE(line.find(part), std::string::npos) << line;
  auto evaluating = tiny("gpt");
  evaluating.eval_iters = 100000000;
  EXPECT_EQ(trainer::plan_memory<float>(evaluating).validation_index_bytes, trainer::kMaxValidationIndexSamples * 24)
      << "the validation index does not grow with --eval-iters beyond its cap";
  const auto bf16 = trainer::plan_memory<strata::bf16>(tiny("gpt"));
  EXPECT_EQ(2 * bf16.per_rank.parameter_bytes, plan.per_rank.parameter_bytes);
  EXPECT_EQ(bf16.per_rank.gradient_bytes, plan.per_rank.gradient_bytes);
}

// Evaluation past the capped validation index reads it again: sample i of the evaluation is sample
// i mod (index size), and the evaluation still has exactly --eval-iters x --global-batch-size samples.
TEST(Training, EvaluationBeyondTheValidationIndexCapCyclesInsteadOfGrowing) {
  struct Source {
    std::int64_t size() const { return 3; }
    std::int64_t seq_length() const { return 2; }
    void sample(std::int64_t i, std::span<std::int32_t> out) const {
      for (std::size_t k = 0; k < out.size(); ++k) out[k] = static_cast<std::int32_t>(10 * i + static_cast<std::int64_t>(k));
    }
  } source;
  const trainer::CycledSamples<Source> cycled{&source, 7};
  EXPECT_EQ(cycled.size(), 7);
  const auto batch = strata::data::make_batch(cycled, 2, 3);  // samples 2, 3, 4 -> 2, 0, 1
  EXPECT_EQ(batch.tokens[0], 20);
  EXPECT_EQ(batch.tokens[2], 0);
  EXPECT_EQ(batch.tokens[4], 10);
  EXPECT_THROW(strata::data::make_batch(cycled, 6, 2), strata::ConfigError);
}

// A batch shorter than seq_length and not divisible by tp under sequence parallelism: the model's
// entry names sequence parallelism and the lengths, not an internal layout conversion.
TEST(Training, SequenceParallelBatchNotDivisibleByTpNamesTheLengths) {
  using Context = strata::ParallelContext<strata::inprocess::communicator>;
  const auto a = tiny("gpt");
  std::vector<std::string> messages(2);
  strata::inprocess::run(2, [&](strata::inprocess::communicator& world) {
    Context ctx = Context::create(world, strata::ParallelConfig{.tp = 2});
    strata::models::Gpt<trainer::TrainPolicy<float, true>> model(ctx, a.model);
    model.init(ctx, 1);
    const strata::Tensor<std::int32_t> tokens(strata::Shape{1, 31}, 1);
    const strata::Tensor<float> mask(strata::Shape{1, 31}, 1.0f);
    try {
      (void)model.forward(ctx, tokens, tokens, mask);
    } catch (const strata::ConfigError& e) {
      messages[static_cast<std::size_t>(world.rank())] = e.what();
    }
  });
  for (const std::string& m : messages) {
    EXPECT_NE(m.find("sequence parallelism"), std::string::npos) << m;
    EXPECT_NE(m.find("31 tokens per sequence (seq_length=32)"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace test_training_cases
