// Data parallelism at scale through the trainers' loop: dp in {2, 4} with and without the
// distributed optimizer, with tp = 2, ends with the parameters of dp = 1 on the same global batch;
// the distributed optimizer resumes bit for bit; the printed allocation report matches what was
// allocated (18 bytes per bf16 parameter without the distributed optimizer, 6 + 12 / dp with);
// an injected overflow skips the step and backs the loss scale off; fp16 trains under the dynamic
// loss scaler; --skip-nonfinite-iterations goes on past a bad iteration; activation recompute
// trains the same numbers; overlapping the reduction with the backward trains the same bits; zeroing
// the gradients by first write trains the bits of filling them.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "same_parameters.hpp"
#include "trainer/trainer.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_data_parallel_cases {

namespace {

trainer::TrainArgs tiny() {
  trainer::TrainArgs a = trainer::default_args("gpt");
  a.model.num_layers = 2;
  a.model.hidden_size = 32;
  a.model.num_attention_heads = 4;
  a.model.ffn_hidden_size = 64;
  a.model.seq_length = 16;
  a.micro_batch_size = 2;
  a.global_batch_size = 8;
  a.lr = 1e-2;
  a.min_lr = 1e-3;
  a.lr_warmup_iters = 1;
  a.quiet = true;
  a.eval_iters = 0;
  a.sample_tokens = 0;
  a.dtype = "double";
  a.train_iters = 4;
  a.keep_final_parameters = true;
  return a;
}

using strata_training_test::expect_same_parameters;

// max over parameters of |a - b| / max|b| (the parameter's own scale)
double worst_relative_difference(const trainer::TrainResult& a, const trainer::TrainResult& b) {
  EXPECT_EQ(a.final_parameters.size(), b.final_parameters.size());
  double worst = 0;
  for (std::size_t k = 0; k < a.final_parameters.size() && k < b.final_parameters.size(); ++k) {
    const auto& x = a.final_parameters[k].second;
    const auto& y = b.final_parameters[k].second;
    EXPECT_EQ(a.final_parameters[k].first, b.final_parameters[k].first);
    EXPECT_EQ(x.size(), y.size());
    double scale = 0, diff = 0;
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      scale = std::max(scale, std::abs(y[i]));
      diff = std::max(diff, std::abs(x[i] - y[i]));
    }
    if (scale > 0) worst = std::max(worst, diff / scale);
  }
  return worst;
}

// Double on the CPU: DESIGN.md's 1e-12 holds per operation; after 4 AdamW steps (whose update
// divides by sqrt(v), amplifying the last bits of small gradients) the parameters agree to 1e-10.
TEST(DataParallel, Dp2And4WithAndWithoutDistributedOptimizerEqualDp1AtTp2) {
  auto base = tiny();
  base.world_size = 2;
  base.tensor_model_parallel_size = 2;
  base.ddp_bucket_size = 3000;  // several buckets
  const auto reference = trainer::train<strata::models::Gpt>(base);
  ASSERT_EQ(reference.losses.size(), 4u);
  for (int dp : {2, 4})
    for (bool distributed : {false, true}) {
      auto a = base;
      a.world_size = 2 * dp;
      a.use_distributed_optimizer = distributed;
      const auto run = trainer::train<strata::models::Gpt>(a);
      ASSERT_EQ(run.losses.size(), 4u);
      for (std::size_t i = 0; i < 4; ++i)
        EXPECT_NEAR(run.losses[i], reference.losses[i], 1e-10 * reference.losses[i]) << "dp=" << dp << " iteration " << i + 1;
      EXPECT_LT(worst_relative_difference(run, reference), 1e-10) << "dp=" << dp << " distributed=" << distributed;
    }
}

// --overlap-grad-reduce starts each bucket's collective from the backward as its gradients become
// final, and --overlap-param-gather moves the all-gather beside compute; the collectives are the
// same ones in the same order, so the run is bit-identical to the one without overlap, for plain
// data parallelism and the distributed optimizer, with pp = 2 (1F1B) too.
TEST(DataParallel, OverlappedReductionTrainsTheSameBits) {
  auto base = tiny();
  base.dtype = "float";
  base.ddp_bucket_size = 3000;  // several buckets, started during the backward
  for (int pp : {1, 2})
    for (bool distributed : {false, true}) {
      auto a = base;
      a.world_size = 2 * pp;
      a.pipeline.pipeline_model_parallel_size = pp;
      a.use_distributed_optimizer = distributed;
      const auto reference = trainer::train<strata::models::Gpt>(a);
      a.overlap_grad_reduce = true;
      a.overlap_param_gather = distributed;
      const auto overlapped = trainer::train<strata::models::Gpt>(a);
      ASSERT_EQ(overlapped.losses.size(), reference.losses.size());
      EXPECT_EQ(overlapped.losses, reference.losses) << "pp=" << pp << " distributed=" << distributed;
      expect_same_parameters(overlapped, reference, "pp=" + std::to_string(pp) + " distributed=" + std::to_string(distributed));
    }
}

// The linear layers' weight gradients left for their first GEMM to write (the default) against one
// fill of the whole buffer (--zero-gradients-by-fill): the same losses and parameters, bit for bit,
// with several micro-batches, over dp with overlapped buckets, tp with sequence parallelism and its
// communication overlap, and pp with the tied embedding.
TEST(DataParallel, ZeroByFirstWriteTrainsTheBitsOfTheFill) {
  auto base = tiny();
  base.dtype = "float";
  base.ddp_bucket_size = 3000;
  struct Case {
    int world, tp, pp;
    bool overlap;
  };
  for (const Case c : {Case{1, 1, 1, false}, Case{2, 1, 1, true}, Case{2, 2, 1, true}, Case{2, 1, 2, false}}) {
    auto a = base;
    a.world_size = c.world;
    a.tensor_model_parallel_size = c.tp;
    a.pipeline.pipeline_model_parallel_size = c.pp;
    a.overlap_grad_reduce = c.overlap && c.tp == 1;
    a.sequence_parallel = c.tp > 1;
    a.tp_comm_overlap = c.overlap && c.tp > 1;
    const std::string what = "world=" + std::to_string(c.world) + " tp=" + std::to_string(c.tp) + " pp=" + std::to_string(c.pp);
    a.zero_gradients_by_fill = true;
    const auto filled = trainer::train<strata::models::Gpt>(a);
    a.zero_gradients_by_fill = false;
    const auto first_write = trainer::train<strata::models::Gpt>(a);
    ASSERT_EQ(first_write.losses.size(), filled.losses.size()) << what;
    EXPECT_EQ(first_write.losses, filled.losses) << what;
    expect_same_parameters(first_write, filled, what);
  }
}

TEST(DataParallel, DistributedOptimizerResumesBitForBit) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_dp_resume";
  std::filesystem::remove_all(dir);
  auto a = tiny();
  a.dtype = "float";
  a.world_size = 4;
  a.tensor_model_parallel_size = 2;
  a.use_distributed_optimizer = true;
  a.ddp_bucket_size = 3000;
  a.train_iters = 6;
  const auto straight = trainer::train<strata::models::Gpt>(a);
  auto first = a;
  first.train_iters = 3;
  first.lr_decay_iters = 6;
  first.save = dir.string();
  auto straight_schedule = a;
  straight_schedule.lr_decay_iters = 6;
  const auto reference = trainer::train<strata::models::Gpt>(straight_schedule);
  (void)straight;
  trainer::train<strata::models::Gpt>(first);
  auto second = straight_schedule;
  second.load = dir.string();
  const auto resumed = trainer::train<strata::models::Gpt>(second);
  ASSERT_EQ(resumed.start_iteration, 3);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed.losses[i], reference.losses[3 + i]) << "iteration " << 4 + i;
  expect_same_parameters(resumed, reference, "resumed");
  std::filesystem::remove_all(dir);
}

// The report's figures are the bytes of the tensors the run allocated; for bf16 parameters with
// fp32 gradients they are Megatron's 2 + 4 + 12 bytes per parameter, and 2 + 4 + 12 / dp with the
// distributed optimizer, up to the buffer's padding (which the report counts, since it is allocated).
TEST(DataParallel, PrintedMemoryReportMatchesAllocationsAndMegatronsRule) {
  for (bool distributed : {false, true}) {
    auto a = tiny();
    a.dtype = "bf16";
    a.world_size = 4;
    a.tensor_model_parallel_size = 1;
    a.use_distributed_optimizer = distributed;
    a.train_iters = 1;
    a.quiet = false;
    testing::internal::CaptureStdout();
    const auto result = trainer::train<strata::models::Gpt>(a);
    const std::string out = testing::internal::GetCapturedStdout();
    const trainer::MemoryReport& m = result.memory;
    // what was allocated, rebuilt here: the same model and buffer layout on one rank of dp = 4
    strata::inprocess::run(1, [&](strata::inprocess::communicator& world) {
      using Policy = trainer::TrainPolicy<strata::bf16, true>;
      auto ctx = strata::context_t<Policy>::create(world, strata::ParallelConfig{});
      strata::models::Gpt<Policy> model(ctx, a.model);
      std::int64_t n = 0;
      model.for_each_parameter([&](auto& p) { n += p.value.numel(); });
      strata::GradBuffer<strata::bf16> buffer(ctx.device, model,
                                              strata::GradBufferOptions{.bucket_size = 40'000'000, .dp = 4});
      const std::int64_t padded = buffer.size();
      EXPECT_EQ(m.parameters, n);
      EXPECT_EQ(m.gradient_bytes, 4 * padded);
      if (distributed) {
        EXPECT_EQ(m.parameter_bytes, 2 * padded);
        EXPECT_EQ(m.optimizer_bytes, 12 * padded / 4);
        // Megatron's 6 + 12 / dp bytes per element of the (padded) buffer
        EXPECT_EQ(m.parameter_bytes + m.gradient_bytes + m.optimizer_bytes, (6 + 12 / 4) * padded);
        EXPECT_NEAR(m.bytes_per_parameter(), 6 + 12.0 / 4, (6 + 12.0 / 4) * static_cast<double>(padded - n) / n);
      } else {
        EXPECT_EQ(m.parameter_bytes, 2 * n);
        EXPECT_EQ(m.optimizer_bytes, 12 * n);
        // Megatron's 18 bytes per parameter, plus the gradient buffer's padding
        EXPECT_EQ(m.parameter_bytes + m.gradient_bytes + m.optimizer_bytes, 18 * n + 4 * (padded - n));
        EXPECT_NEAR(m.bytes_per_parameter(), 18, 4.0 * static_cast<double>(padded - n) / n);
      }
      EXPECT_LT(padded - n, 64 * 4 * 64) << "padding: at most one alignment per parameter and one dp x alignment per bucket";
    });
    for (std::int64_t bytes : {m.parameter_bytes, m.gradient_bytes, m.optimizer_bytes})
      EXPECT_NE(out.find("(" + std::to_string(bytes) + " B)"), std::string::npos) << bytes << " not printed in\n" << out;
    EXPECT_NE(out.find(distributed ? "distributed optimizer over dp=4" : "dp=4"), std::string::npos) << out;
  }
}

// An overflow injected into every gradient of iteration 2 (0-based 1): that step is skipped (the
// parameters after 2 iterations equal those after 1), the dynamic scale backs off at once with
// hysteresis 1, and it grows again after --loss-scale-window clean iterations.
TEST(DataParallel, LossScalerSkipsAnOverflowingStepAndBacksOff) {
  auto a = tiny();
  a.dtype = "float";
  a.world_size = 2;
  a.tensor_model_parallel_size = 1;
  a.dynamic_loss_scale = true;
  a.initial_loss_scale = 1024;
  a.hysteresis = 1;
  a.loss_scale_window = 2;
  a.train_iters = 1;
  a.lr_warmup_iters = 0;
  a.lr_decay_style = "constant";
  const auto one = trainer::train<strata::models::Gpt>(a);
  a.train_iters = 2;
  a.inject_nonfinite_gradient_at = 1;
  const auto two = trainer::train<strata::models::Gpt>(a);
  ASSERT_EQ(two.skipped_iterations, std::vector<int>{2});
  EXPECT_EQ(two.loss_scales, (std::vector<double>{1024, 512}));
  expect_same_parameters(two, one, "an injected overflow skipped");
  a.train_iters = 4;
  const auto four = trainer::train<strata::models::Gpt>(a);
  EXPECT_EQ(four.loss_scales, (std::vector<double>{1024, 512, 512, 1024}));
  // the scaled loss trains as the unscaled one (the scale is a power of two: exact in float)
  a.dynamic_loss_scale = false;
  a.inject_nonfinite_gradient_at = -1;
  a.train_iters = 1;
  const auto unscaled = trainer::train<strata::models::Gpt>(a);
  EXPECT_LT(worst_relative_difference(unscaled, one), 1e-6);
}

// --dtype fp16 (Megatron's --fp16): fp16 parameters and activations, fp32 main parameters, always
// under the dynamic loss scaler. With a scale that fits, every iteration's loss is the float run's
// within fp16 rounding (1%); with the default 2^32 the first iterations' scaled gradients overflow
// fp16: each is skipped and halves the scale (hysteresis 1) until one fits, and training goes on
// (a later overflow, as the gradients grow, halves it again).
TEST(DataParallel, Fp16TrainsUnderTheDynamicLossScaler) {
  auto a = tiny();
  a.world_size = 2;
  a.tensor_model_parallel_size = 1;
  a.lr_warmup_iters = 0;
  a.lr_decay_style = "constant";
  a.train_iters = 6;
  a.dtype = "float";
  const auto reference = trainer::train<strata::models::Gpt>(a);
  a.dtype = "fp16";
  a.initial_loss_scale = 4096;
  const auto half = trainer::train<strata::models::Gpt>(a);
  EXPECT_TRUE(half.skipped_iterations.empty());
  EXPECT_EQ(half.loss_scales, std::vector<double>(6, 4096));
  ASSERT_EQ(half.losses.size(), reference.losses.size());
  for (std::size_t i = 0; i < half.losses.size(); ++i)
    EXPECT_NEAR(half.losses[i], reference.losses[i], 0.01 * reference.losses[i]) << "iteration " << i + 1;

  a.initial_loss_scale = 4294967296.0;
  a.hysteresis = 1;
  a.train_iters = 30;
  const auto backed_off = trainer::train<strata::models::Gpt>(a);
  const std::vector<int>& skipped = backed_off.skipped_iterations;
  std::size_t lead = 0;  // the leading run of skipped iterations: 1, 2, ..., lead
  while (lead < skipped.size() && skipped[lead] == static_cast<int>(lead + 1)) ++lead;
  ASSERT_GT(lead, 0u) << "2^32 should overflow fp16 gradients";
  ASSERT_LT(lead, 20u);
  ASSERT_EQ(backed_off.loss_scales.size(), 30u);
  EXPECT_EQ(backed_off.loss_scales[lead - 1], std::ldexp(1.0, 32 - static_cast<int>(lead)));
  for (int it : skipped) {  // each overflow halves the scale (hysteresis 1); window 1000: no growth
    const double before = it >= 2 ? backed_off.loss_scales[static_cast<std::size_t>(it - 2)] : std::ldexp(1.0, 32);
    EXPECT_EQ(backed_off.loss_scales[static_cast<std::size_t>(it - 1)], before / 2) << "iteration " << it;
  }
  EXPECT_EQ(backed_off.loss_scales.back(), std::ldexp(1.0, 32 - static_cast<int>(skipped.size())));
  EXPECT_LT(backed_off.losses.back(), backed_off.losses[lead]);
}

// The learning rates the JSONL log of a run holds, one per iteration.
std::vector<double> logged_lrs(const std::filesystem::path& file) {
  std::vector<double> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("\"lr\": ");
    if (at != std::string::npos) out.push_back(std::stod(line.substr(at + 6)));
  }
  return out;
}

// As Megatron's scheduler, the learning rate steps only after an update: an iteration the loss
// scaler skips leaves it where it was, and a resumed run continues from the scheduler's count.
TEST(DataParallel, LearningRateStepsOnlyAfterAnUpdate) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_dp_lr_after_update";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto a = tiny();
  a.dtype = "float";
  a.world_size = 2;
  a.tensor_model_parallel_size = 1;
  a.dynamic_loss_scale = true;
  a.initial_loss_scale = 1024;
  a.hysteresis = 1;
  a.lr_warmup_iters = 0;
  a.lr_decay_style = "linear";
  a.train_iters = 4;
  a.lr_decay_iters = 4;  // the same schedule for the shorter first run below
  a.log_interval = 1;
  a.inject_nonfinite_gradient_at = 1;  // iteration 2 is skipped
  a.log_jsonl = (dir / "straight.jsonl").string();
  const auto straight = trainer::train<strata::models::Gpt>(a);
  ASSERT_EQ(straight.skipped_iterations, std::vector<int>{2});
  const strata::LrSchedule schedule = trainer::schedule_of(a);
  const std::vector<double> lrs = logged_lrs(dir / "straight.jsonl");
  EXPECT_EQ(lrs, (std::vector<double>{schedule.lr(0), schedule.lr(8), schedule.lr(8), schedule.lr(16)}));
  // saved after iteration 2 (the skipped one) and resumed: the same rates
  a.save = (dir / "ck").string();
  a.save_interval = 2;
  a.train_iters = 2;
  a.log_jsonl = (dir / "first.jsonl").string();
  (void)trainer::train<strata::models::Gpt>(a);
  a.load = a.save;
  a.save.clear();
  a.save_interval = 0;
  a.train_iters = 4;
  a.log_jsonl = (dir / "resumed.jsonl").string();
  const auto resumed = trainer::train<strata::models::Gpt>(a);
  EXPECT_EQ(logged_lrs(dir / "resumed.jsonl"), (std::vector<double>{schedule.lr(8), schedule.lr(16)}));
  EXPECT_EQ(resumed.losses, std::vector<double>(straight.losses.begin() + 2, straight.losses.end()));
  std::filesystem::remove_all(dir);
}

// Dropout masks are keyed by the global sample: with dropout on, dp = 2 and 4 (with and without
// the distributed optimizer) train the losses of dp = 1 (double, 1e-12 relative).
TEST(DataParallel, DropoutMasksDoNotDependOnTheDataParallelSize) {
  auto a = tiny();
  a.tensor_model_parallel_size = 1;
  a.sequence_parallel = false;
  a.model.hidden_dropout = 0.1;
  a.model.attention_dropout = 0.1;
  a.world_size = 1;
  const auto reference = trainer::train<strata::models::Gpt>(a);
  for (int world : {2, 4})
    for (bool distributed : {false, true}) {
      auto b = a;
      b.world_size = world;
      b.use_distributed_optimizer = distributed;
      const auto result = trainer::train<strata::models::Gpt>(b);
      ASSERT_EQ(result.losses.size(), reference.losses.size());
      for (std::size_t i = 0; i < reference.losses.size(); ++i)
        EXPECT_NEAR(result.losses[i], reference.losses[i], 1e-12 * std::abs(reference.losses[i]))
            << "dp=" << world << " distributed=" << distributed << " iteration " << i + 1;
    }
}

// --skip-nonfinite-iterations: the bad iteration makes no update, is reported, and training goes on.
TEST(DataParallel, SkipNonfiniteIterationsGoesOnAfterReportingTheIteration) {
  auto a = tiny();
  a.dtype = "float";
  a.world_size = 2;
  a.tensor_model_parallel_size = 1;
  a.train_iters = 3;
  a.inject_nonfinite_gradient_at = 1;
  a.skip_nonfinite_iterations = true;
  a.quiet = false;
  testing::internal::CaptureStdout();
  const auto run = trainer::train<strata::models::Gpt>(a);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(run.skipped_iterations, std::vector<int>{2});
  EXPECT_NE(out.find("iteration      2: the loss"), std::string::npos) << out;
  EXPECT_EQ(run.losses.size(), 3u);
  EXPECT_TRUE(std::isfinite(run.losses[2]));
  // without the flag the run stops, naming the iteration
  a.skip_nonfinite_iterations = false;
  a.quiet = true;
  try {
    trainer::train<strata::models::Gpt>(a);
    ADD_FAILURE() << "an infinite gradient did not stop the run";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("iteration 2: the gradient norm is inf"), std::string::npos) << e.what();
  }
}

// Recompute changes no number the run produces (bit for bit on the CPU), with dropout on.
TEST(DataParallel, RecomputeTrainsTheSameBits) {
  auto a = tiny();
  a.dtype = "float";
  a.world_size = 2;
  a.tensor_model_parallel_size = 2;
  a.model.num_layers = 3;
  a.model.hidden_dropout = 0.1;
  a.train_iters = 2;
  const auto plain = trainer::train<strata::models::Gpt>(a);
  for (const char* granularity : {"selective", "full"})
    for (const char* method : {"uniform", "block"})
      for (int layers : {1, 2}) {
        auto r = a;
        r.recompute_granularity = granularity;
        r.recompute_method = method;
        r.recompute_num_layers = layers;
        const auto run = trainer::train<strata::models::Gpt>(r);
        EXPECT_EQ(run.losses, plain.losses) << granularity << " " << method << " " << layers;
        expect_same_parameters(run, plain, std::string(granularity) + " " + method + " " + std::to_string(layers));
      }
}

}  // namespace

namespace {

// A 2-layer Llama in double for 4 AdamW steps on one rank (the tests below set its options).
trainer::TrainArgs tiny_llama_double() {
  trainer::TrainArgs base = trainer::default_args("llama");
  const trainer::TrainArgs sizes = tiny();
  base.model.num_layers = 2;
  base.model.hidden_size = 32;
  base.model.num_attention_heads = 4;
  base.model.num_query_groups = 2;
  base.model.ffn_hidden_size = 48;
  base.model.seq_length = 16;
  base.micro_batch_size = sizes.micro_batch_size;
  base.global_batch_size = sizes.global_batch_size;
  base.lr = sizes.lr, base.min_lr = sizes.min_lr, base.lr_warmup_iters = sizes.lr_warmup_iters;
  base.quiet = true, base.eval_iters = 0, base.sample_tokens = 0, base.dtype = "double", base.train_iters = 4;
  base.keep_final_parameters = true;
  base.world_size = 1;
  base.tensor_model_parallel_size = 1;
  base.sequence_parallel = false;
  return base;
}

// `base` trained over dp=2 with the distributed optimizer and over tp=2 + sequence parallelism x
// pp=2 follows `reference` (its single-rank run): every loss within `tolerance` relative, and the
// dp run's final parameters too (final_parameters hold rank 0's stage and padded vocabulary, so
// the tp x pp run's are not compared).
void expect_dp_and_tp_pp_follow(const trainer::TrainArgs& base, const trainer::TrainResult& reference, double tolerance) {
  auto dp = base;
  dp.world_size = 2;
  dp.use_distributed_optimizer = true;
  auto tp_pp = base;
  tp_pp.world_size = 4;
  tp_pp.tensor_model_parallel_size = 2;
  tp_pp.sequence_parallel = true;
  tp_pp.pipeline.pipeline_model_parallel_size = 2;
  for (const auto& [what, args] : {std::pair{"dp=2 distributed optimizer", dp}, std::pair{"tp=2 sp x pp=2", tp_pp}}) {
    const auto run = trainer::train<strata::models::Llama>(args);
    ASSERT_EQ(run.losses.size(), 4u) << what;
    for (std::size_t i = 0; i < 4; ++i)
      EXPECT_NEAR(run.losses[i], reference.losses[i], tolerance * reference.losses[i]) << what << " iteration " << i + 1;
    if (args.pipeline.pipeline_model_parallel_size == 1 && args.tensor_model_parallel_size == 1) {
      EXPECT_LT(worst_relative_difference(run, reference), tolerance) << what;
    }
  }
}

// The run-time building blocks of current models (Qwen3's qk norms and a head dimension unlike
// hidden / heads, zero-centred norms, partial interleaved RoPE with Llama 3.1's scaling, gpt-oss's
// clamped quick GeGLU), trained by the Llama model through data parallelism with the distributed
// optimizer (losses and parameters) and through tp=2 + sequence parallelism x pp=2 (losses of 4
// AdamW steps), follow the single-rank run.
TEST(DataParallel, ArchitectureOptionsTrainAlikeOverDpTpSpAndPp) {
  trainer::TrainArgs base = tiny_llama_double();
  base.model.qk_layernorm = true;
  base.model.kv_channels = 12;
  base.model.apply_layernorm_1p = true;
  base.model.rotary_percent = 0.5;
  base.model.rotary_interleaved = true;
  base.model.rope_scaling_factor = 8;
  base.model.rope_original_max_positions = 8;
  base.model.activation = strata::MlpActivation::quick_geglu;
  base.model.activation_clamp = 0.5;
  base.model.glu_linear_offset = 1.0;
  const auto reference = trainer::train<strata::models::Llama>(base);
  ASSERT_EQ(reference.losses.size(), 4u);
  expect_dp_and_tp_pp_follow(base, reference, 1e-10);
}

}  // namespace

namespace {

// gpt-oss's attention blocks: YaRN's rotary scaling and learnable attention sinks, on layers that
// alternate a sliding window and full attention, trained by the Llama model through tp=2 +
// sequence parallelism x pp=2 and through data parallelism with the distributed optimizer (4 AdamW
// steps in double), follow the single-rank run; the sink logits are trained parameters.
TEST(DataParallel, YarnAndAttentionSinksTrainAlikeOverDpTpSpAndPp) {
  trainer::TrainArgs base = tiny_llama_double();
  base.model.yarn_scaling_factor = 32;
  base.model.yarn_original_max_positions = 512;  // the correction range at pairs 0.6 .. 2.8 of 4
  base.model.yarn_round_to_int = false;
  base.model.softmax_type = strata::SoftmaxType::learnable;
  base.model.window_size = 5;
  base.model.window_layers = {1, 0};
  const auto reference = trainer::train<strata::models::Llama>(base);
  ASSERT_EQ(reference.losses.size(), 4u);
  int sinks = 0;
  for (const auto& [name, values] : reference.final_parameters) sinks += name.find(".attention.softmax_offset") != std::string::npos;
  EXPECT_EQ(sinks, 2);
  expect_dp_and_tp_pp_follow(base, reference, 1e-12);
}

}  // namespace
}  // namespace test_data_parallel_cases
