// Pipeline training beyond one step: AdamW steps under every schedule follow the single-rank
// trajectory (losses of every step, final values), the tied embedding copies stay bit-identical
// (checked inside pipeline_run), uneven first/last stages split as asked, and splits that leave a
// stage empty or do not add up are refused with a sentence.
#include "pipeline_equivalence.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <vector>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_pipeline_training_cases {

namespace {

using strata::pipeline::ScheduleKind;

TEST(PipelineTraining, StepsFollowTheSingleRankTrajectory) {
  const auto config = strata_test::tiny_gpt(4);
  const strata_test::Snapshot reference = strata_test::reference_run<strata::models::Gpt, double>(config, 4, 3);
  ASSERT_EQ(reference.outputs.size(), 4u);
  EXPECT_NE(reference.outputs.front()[0], reference.outputs.back()[0]) << "the steps must change the loss";
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zero_bubble}) {
    const strata_test::PipelineRun run{kind, 2, 2, kind == ScheduleKind::interleaved ? 2 : 1, 4, -1, -1, 3};
    strata_test::expect_equivalent(strata_test::pipeline_run<strata::models::Gpt, double, true>(config, run), reference, 1e-10,
                                   run.str() + " SP, 3 AdamW steps");
  }
}

TEST(PipelineTraining, UnevenFirstAndLastStages) {
  const auto config = strata_test::tiny_gpt(6);
  const strata_test::Snapshot reference = strata_test::reference_run<strata::models::Gpt, double>(config, 4);
  // pp=3: 1 + 4 + 1 layers; pp=2: 2 + 4.
  strata_test::expect_equivalent(strata_test::pipeline_run<strata::models::Gpt, double, false>(
                                     config, {ScheduleKind::one_f_one_b, 1, 3, 1, 4, 1, 1}),
                                 reference, 1e-12, "pp=3 with 1 + 4 + 1 layers");
  strata_test::expect_equivalent(strata_test::pipeline_run<strata::models::Gpt, double, false>(
                                     config, {ScheduleKind::zero_bubble, 1, 2, 1, 4, 2, -1}),
                                 reference, 1e-12, "pp=2 with 2 + 4 layers");
  EXPECT_EQ(strata::pipeline::stage_layers_of(6, 3, 1, 1, 0, 1, 1).layers, (strata::Range{1, 5}));
  EXPECT_EQ(strata::pipeline::stage_layers_of(8, 2, 2, 1, 1).layers, (strata::Range{6, 8}));  // virtual stage 3 of 4
  EXPECT_TRUE(strata::pipeline::stage_layers_of(8, 2, 2, 1, 1).has_head);
  EXPECT_FALSE(strata::pipeline::stage_layers_of(8, 2, 2, 1, 0).has_head);
}

// The gradient-ready hook (what starts the data-parallel buckets during the backward) reports every
// parameter of the rank exactly once per step, holding its final gradient at that moment, under
// every schedule, with recompute too; on the stage with the embedding the first report comes
// before the position embedding's gradient is complete (the reports run during the backward, not after),
// except under zero-bubble, whose chunks are reported whole after their last weight pass.
TEST(PipelineTraining, GradientReadyReportsEachParameterOnceWithItsFinalGradient) {
  using namespace strata;
  using T = double;
  using P = strata_test::ModelPolicy<T, false>;
  const auto config = strata_test::tiny_gpt(4);
  struct Case {
    ScheduleKind kind;
    int pp, v, m;
    bool recompute;
  };
  for (const Case c : {Case{ScheduleKind::one_f_one_b, 1, 1, 2, false}, Case{ScheduleKind::one_f_one_b, 1, 1, 2, true},
                       Case{ScheduleKind::gpipe, 2, 1, 3, false}, Case{ScheduleKind::one_f_one_b, 2, 1, 4, true},
                       Case{ScheduleKind::interleaved, 2, 2, 4, false}, Case{ScheduleKind::zero_bubble, 2, 1, 4, false}}) {
    const std::string label = std::string(pipeline::schedule_name(c.kind)) + " pp=" + std::to_string(c.pp) +
                              " v=" + std::to_string(c.v) + (c.recompute ? " recompute" : "");
    inprocess::run(c.pp, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.pp = c.pp});
      models::PipelineModel<models::Gpt, P> model(ctx, config, {c.v, -1, -1});
      model.init(ctx, 1234);
      if (c.recompute) model.set_recompute(models::RecomputeConfig{models::RecomputeGranularity::full, models::RecomputeMethod::uniform, 1});
      const auto batches = strata_test::as_pipeline_batches(strata_test::micro_batches(config, c.m));
      const auto keys = strata_test::dropout_keys(c.m);
      double tokens = 0;
      for (const auto& b : batches)
        for (index_t i = 0; i < b.loss_mask.numel(); ++i) tokens += b.loss_mask[i];
      Parameter<T>* positions = nullptr;
      model.for_each_parameter([&](Parameter<T>& p) {
        if (p.name.find("position") != std::string::npos) positions = &p;
      });
      std::map<const Parameter<T>*, int> reports;
      std::map<const Parameter<T>*, std::vector<double>> at_report;
      std::vector<double> positions_at_first_report;
      const GradientReady<T> ready = [&](Parameter<T>& p) {
        if (reports.empty() && positions != nullptr)
          positions_at_first_report.assign(positions->grad.data(), positions->grad.data() + positions->grad.numel());
        ++reports[&p];
        at_report[&p] = std::vector<double>(p.grad.data(), p.grad.data() + p.grad.numel());
      };
      zero_gradients(ctx.device, model);
      (void)model.train_step(ctx, c.kind, std::span<const strata_test::PipelineBatch>(batches), std::span<const std::uint64_t>(keys),
                             1.0 / tokens, {}, &ready);
      int parameters = 0;
      model.for_each_parameter([&](Parameter<T>& p) {
        ++parameters;
        EXPECT_EQ(reports[&p], 1) << label << ": " << p.name << " on pipeline rank " << ctx.pp.rank();
        const std::vector<double> final_grad(p.grad.data(), p.grad.data() + p.grad.numel());
        EXPECT_TRUE(at_report[&p] == final_grad) << label << ": " << p.name << " was reported before its gradient was final";
      });
      EXPECT_EQ(static_cast<int>(reports.size()), parameters) << label;
      if (positions != nullptr && c.kind != ScheduleKind::zero_bubble) {
        const std::vector<double> final_grad(positions->grad.data(), positions->grad.data() + positions->grad.numel());
        EXPECT_TRUE(positions_at_first_report != final_grad) << label << ": the first report came after the embedding's backward";
      }
    });
  }
}

// The parameter-needed hook (where the forward waits for the overlapped parameter all-gather of the
// distributed optimizer) announces every parameter before the forward first reads it: with every
// value poisoned (NaN) and restored only when the hook announces it, a step gives the losses and
// gradients of the unpoisoned step bit for bit, under every schedule and with recompute, for GPT
// (tied output layer, learned positions) and Llama (untied output layer). Every parameter of the
// rank is announced.
template <template <class> class Model>
void expect_parameters_announced_before_read(const strata::models::ModelConfig& config, const char* model_name) {
  using namespace strata;
  using T = double;
  using P = strata_test::ModelPolicy<T, false>;
  struct Case {
    ScheduleKind kind;
    int pp, v, m;
    bool recompute;
  };
  struct Outcome {
    double loss = 0;
    std::vector<std::vector<double>> grads;
  };
  for (const Case c : {Case{ScheduleKind::one_f_one_b, 1, 1, 2, false}, Case{ScheduleKind::one_f_one_b, 1, 1, 2, true},
                       Case{ScheduleKind::gpipe, 2, 1, 3, false}, Case{ScheduleKind::one_f_one_b, 2, 1, 4, true},
                       Case{ScheduleKind::interleaved, 2, 2, 4, false}, Case{ScheduleKind::zero_bubble, 2, 1, 4, false}}) {
    const std::string label = std::string(model_name) + " " + std::string(pipeline::schedule_name(c.kind)) + " pp=" + std::to_string(c.pp) +
                              " v=" + std::to_string(c.v) + (c.recompute ? " recompute" : "");
    inprocess::run(c.pp, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.pp = c.pp});
      const auto batches = strata_test::as_pipeline_batches(strata_test::micro_batches(config, c.m));
      const auto keys = strata_test::dropout_keys(c.m);
      double tokens = 0;
      for (const auto& b : batches)
        for (index_t i = 0; i < b.loss_mask.numel(); ++i) tokens += b.loss_mask[i];
      auto run = [&](bool poison) {
        models::PipelineModel<Model, P> model(ctx, config, {c.v, -1, -1});
        model.init(ctx, 1234);
        if (c.recompute) model.set_recompute(models::RecomputeConfig{models::RecomputeGranularity::full, models::RecomputeMethod::uniform, 1});
        std::map<const Parameter<T>*, std::vector<double>> stash;
        std::map<const Parameter<T>*, Parameter<T>*> writable;
        std::map<const Parameter<T>*, int> announced;
        model.for_each_parameter([&](Parameter<T>& p) {
          writable[&p] = &p;
          if (!poison) return;
          stash[&p].assign(p.value.data(), p.value.data() + p.value.numel());
          std::fill(p.value.data(), p.value.data() + p.value.numel(), std::numeric_limits<double>::quiet_NaN());
        });
        const ParameterNeeded<T> needed = [&](const Parameter<T>& p) {
          if (announced[&p]++ > 0 || !poison) return;
          const std::vector<double>& values = stash.at(&p);
          std::copy(values.begin(), values.end(), writable.at(&p)->value.data());
        };
        zero_gradients(ctx.device, model);
        const auto result = model.train_step(ctx, c.kind, std::span<const strata_test::PipelineBatch>(batches),
                                             std::span<const std::uint64_t>(keys), 1.0 / tokens, {}, nullptr, &needed);
        Outcome out;
        out.loss = result.loss_sum_on_host();
        model.for_each_parameter([&](Parameter<T>& p) {
          EXPECT_GE(announced[&p], 1) << label << ": " << p.name << " was never announced on pipeline rank " << ctx.pp.rank();
          out.grads.emplace_back(p.grad.data(), p.grad.data() + p.grad.numel());
        });
        return out;
      };
      const Outcome reference = run(false), poisoned = run(true);
      EXPECT_EQ(poisoned.loss, reference.loss) << label << ": a poisoned value was read before the hook announced it";
      EXPECT_TRUE(poisoned.grads == reference.grads) << label << ": the gradients differ from the unpoisoned step";
    });
  }
}

TEST(PipelineTraining, ParameterNeededAnnouncesEachParameterBeforeTheForwardReadsIt) {
  expect_parameters_announced_before_read<strata::models::Gpt>(strata_test::tiny_gpt(4), "GPT");
  expect_parameters_announced_before_read<strata::models::Llama>(strata_test::tiny_llama(), "Llama");
}

TEST(PipelineTraining, RefusesSplitsThatCannotWork) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const strata::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // 4 layers over pp=2 x 2 chunks with a first stage of 3 leaves 1 layer for 3 pieces.
  EXPECT_NE(message([] { (void)strata::pipeline::stage_layers_of(4, 2, 2, 0, 0, 3, -1); }).find("every stage needs at least one layer"),
            std::string::npos);
  EXPECT_NE(message([] { (void)strata::pipeline::stage_layers_of(4, 2, 2, 0, 0, 3, -1); }).find("pp x virtual_stages = 4"),
            std::string::npos);
  // 5 layers do not split evenly over 2 stages.
  EXPECT_NE(message([] { (void)strata::pipeline::stage_layers_of(5, 2, 1, 0, 0); }).find("does not divide num_layers=5"),
            std::string::npos);
  // 2 + 3 leave nothing over and the sum is not 6.
  EXPECT_NE(message([] { (void)strata::pipeline::stage_layers_of(6, 2, 1, 0, 0, 2, 3); }).find("hold all num_layers=6"),
            std::string::npos);
  // The executor refuses a micro-batch count the interleaved schedule cannot run, before any transfer.
  const auto config = strata_test::tiny_gpt(4);
  EXPECT_NE(message([&] {
              (void)strata_test::pipeline_run<strata::models::Gpt, double, false>(config, {ScheduleKind::interleaved, 1, 2, 2, 3});
            }).find("needs the number of micro-batches to be a multiple of pp=2"),
            std::string::npos);
}

}  // namespace
}  // namespace test_pipeline_training_cases
