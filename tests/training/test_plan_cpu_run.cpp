// strata-plan's memory prediction beside a run on CPU threads (the in-process communicator): the
// bytes rank 0 allocated for parameters, gradients and optimizer state (the trainer's MemoryReport)
// against the plan's estimate of that pipeline rank, for a tiny GPT in bf16 at several layouts.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "tools/plan/planner.hpp"
#include "trainer/trainer.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_plan_cpu_run_cases {

#ifndef STRATA_SOURCE_DIR
#error "STRATA_SOURCE_DIR must name the source tree (the calibration file lives there)"
#endif

namespace {

using strata::models::RecomputeGranularity;

// The gradient buffer starts each parameter at a multiple of 64 elements and pads each bucket to a
// multiple of dp x 64 elements (optim/grad_buffer.hpp): at most 64 elements per tensor and dp x 64
// per bucket (one bucket here) above the parameters' own count, in fp32.
std::int64_t padding_bound(std::int64_t tensors, int dp) { return (tensors * 64 + std::int64_t{dp} * 64) * 4; }

TEST(PlanCpuRun, StateMemoryOfThreadsRunsMatchesThePlan) {
  trainer::TrainArgs model = trainer::parse_flags(
      "gpt", {"--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32", "--global-batch-size", "8",
              "--vocab-size", "257", "--train-iters", "1", "--eval-iters", "0", "--log-interval", "1"});
  model.model.vocab_size = 257;
  model.quiet = true;
  const plan::Calibration calibration = plan::load_calibration(std::string(STRATA_SOURCE_DIR) + "/bench/calibration/h100_node.json");
  struct Case {
    int world;
    plan::Layout layout;
  };
  auto layout = [](int tp, int pp, int dp, bool distributed) {
    plan::Layout l;
    l.tp = tp, l.pp = pp, l.dp = dp, l.micro_batch = 2, l.distributed_optimizer = distributed;
    return l;
  };
  for (const Case& c : {Case{1, layout(1, 1, 1, false)}, Case{2, layout(2, 1, 1, false)}, Case{4, layout(2, 1, 2, false)},
                        Case{4, layout(2, 1, 2, true)}, Case{4, layout(1, 2, 2, false)}}) {
    const plan::Cluster cluster{c.world, 1, 80};
    trainer::TrainArgs a = plan::args_of(model, cluster, c.layout);
    a.device = "cpu";  // the same flags, run as threads
    a.tokenizer.type = "NullTokenizer";
    a.tokenizer.vocab_size = 257;
    a.mock_data_random = true;
    a.data_path.clear();
    const plan::MemoryPrediction predicted = plan::predict_memory(plan::args_of(model, cluster, c.layout), calibration, c.layout.recompute);
    const trainer::TrainResult run = trainer::train<strata::models::Gpt>(a);
    const std::string name = plan::describe_layout(c.layout);
    std::printf("%-48s parameters %lld / %lld B, gradients %lld / %lld B, optimizer %lld / %lld B (measured / planned)\n", name.c_str(),
                static_cast<long long>(run.memory.parameter_bytes), static_cast<long long>(predicted.state.parameter_bytes),
                static_cast<long long>(run.memory.gradient_bytes), static_cast<long long>(predicted.state.gradient_bytes),
                static_cast<long long>(run.memory.optimizer_bytes), static_cast<long long>(predicted.state.optimizer_bytes));
    EXPECT_EQ(run.memory.parameters, predicted.state.parameters) << name;
    const std::int64_t bound = padding_bound(4 * 12 + 5, c.layout.dp);
    if (!c.layout.distributed_optimizer) {
      EXPECT_EQ(run.memory.parameter_bytes, predicted.state.parameter_bytes) << name;
      EXPECT_EQ(run.memory.optimizer_bytes, predicted.state.optimizer_bytes) << name;
    } else {  // the shard of the padded buffer
      EXPECT_GE(run.memory.parameter_bytes, predicted.state.parameter_bytes) << name;
      EXPECT_LE(run.memory.parameter_bytes, predicted.state.parameter_bytes + bound / 2) << name;
      EXPECT_GE(run.memory.optimizer_bytes, predicted.state.optimizer_bytes) << name;
      EXPECT_LE(run.memory.optimizer_bytes, predicted.state.optimizer_bytes + 3 * bound) << name;
    }
    EXPECT_GE(run.memory.gradient_bytes, predicted.state.gradient_bytes) << name;
    EXPECT_LE(run.memory.gradient_bytes, predicted.state.gradient_bytes + bound) << name;
  }
}

}  // namespace
}  // namespace test_plan_cpu_run_cases
