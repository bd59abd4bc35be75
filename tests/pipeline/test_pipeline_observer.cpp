// The executor's observer (ExecutorOptions::on_action): on every pipeline rank and under every
// schedule it sees a begin and an end for each action of the rank's table, in table order, each end
// right after its own begin, and no other call (none around the transfer batches).
#include "pipeline_equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_pipeline_observer_cases {

namespace {

using strata::pipeline::Action;
using strata::pipeline::ScheduleKind;

struct Seen {
  Action action;
  bool begin = false;
};

// What the observer saw on each pipeline rank (tp rank 0) in one step of `run`.
std::vector<std::vector<Seen>> observe(const strata::models::ModelConfig& config, const strata_test::PipelineRun& run) {
  using namespace strata;
  using P = strata_test::ModelPolicy<double, false>;
  std::vector<std::vector<Seen>> seen(static_cast<std::size_t>(run.pp));
  inprocess::run(run.tp * run.pp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = run.tp, .pp = run.pp});
    models::PipelineModel<models::Gpt, P> model(ctx, config, {run.virtual_stages, -1, -1});
    model.init(ctx, 1234);
    const auto batches = strata_test::as_pipeline_batches(strata_test::micro_batches(config, run.micro_batches));
    const auto keys = strata_test::dropout_keys(run.micro_batches);
    std::vector<Seen> mine;  // this rank's thread only
    pipeline::ExecutorOptions options;
    options.on_action = [&mine](const Action& a, bool begin) { mine.push_back({a, begin}); };
    zero_gradients(ctx.device, model);
    (void)model.train_step(ctx, run.kind, std::span<const strata_test::PipelineBatch>(batches),
                           std::span<const std::uint64_t>(keys), 0.25, options);
    if (ctx.tp.rank() == 0) seen[static_cast<std::size_t>(ctx.pp.rank())] = std::move(mine);  // one writer per slot
  });
  return seen;
}

TEST(PipelineObserver, SeesBeginAndEndOfEveryActionInTableOrder) {
  const auto config = strata_test::tiny_gpt(4);
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zero_bubble})
    for (int pp : {2, 4}) {
      const int v = kind == ScheduleKind::interleaved ? 2 : 1;
      if (config.num_layers % (pp * v) != 0) continue;
      const strata_test::PipelineRun run{kind, 1, pp, v, 2 * pp};
      const auto seen = observe(config, run);
      const strata::pipeline::ScheduleShape shape{kind, pp, 2 * pp, v};
      for (int rank = 0; rank < pp; ++rank) {
        const std::vector<Action> table = strata::pipeline::rank_actions(shape, rank);
        const std::vector<Seen>& calls = seen[static_cast<std::size_t>(rank)];
        ASSERT_EQ(calls.size(), 2 * table.size()) << run.str() << " rank " << rank << ": two calls per action and no other";
        for (std::size_t i = 0; i < table.size(); ++i) {
          EXPECT_EQ(calls[2 * i].action, table[i]) << run.str() << " rank " << rank << ": begin #" << i;
          EXPECT_TRUE(calls[2 * i].begin) << run.str() << " rank " << rank << ": call " << 2 * i << " must begin action #" << i;
          EXPECT_EQ(calls[2 * i + 1].action, table[i]) << run.str() << " rank " << rank << ": end #" << i;
          EXPECT_FALSE(calls[2 * i + 1].begin) << run.str() << " rank " << rank << ": call " << 2 * i + 1 << " must end action #" << i;
        }
      }
    }
}

}  // namespace
}  // namespace test_pipeline_observer_cases
