// ParallelContext's expert groups on in-process ranks: each rank gathers the world ranks of every
// group it belongs to and compares them, in order, with the groups Megatron-Core's expert rank
// generator builds (written out by hand), for world 8 with tp=2 ep=4 etp=1; tp=2 etp=2 ep=2; pp=2;
// and cp=2. Layouts that do not divide are refused with a sentence before any group is created.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include <strata/comm.hpp>
#include <strata/policy.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_expert_groups_cases {

namespace {

using namespace strata;
using Groups = std::vector<std::vector<int>>;
using Context = ParallelContext<inprocess::communicator>;

// The world ranks of `comm`'s group, in group order.
std::vector<int> members(inprocess::communicator& comm, int world_rank) {
  std::vector<std::int32_t> mine{world_rank}, all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(std::span<const std::int32_t>(mine), std::span<std::int32_t>(all));
  return {all.begin(), all.end()};
}

// The group of `groups` that holds `rank`.
std::vector<int> holding(const Groups& groups, int rank) {
  for (const auto& g : groups)
    for (int r : g)
      if (r == rank) return g;
  return {};
}

void expect_groups(const ParallelConfig& config, const std::map<std::string, Groups>& expected) {
  inprocess::run(config.world_size(), [&](inprocess::communicator& world) {
    auto ctx = Context::create(world, config);
    const int rank = world.rank();
    const std::map<std::string, inprocess::communicator*> comms = {
        {"tp", &ctx.tp},          {"dp", &ctx.dp},         {"pp", &ctx.pp},
        {"ep", &ctx.ep},          {"etp", &ctx.expert_tp}, {"edp", &ctx.expert_dp},
        {"etp-ep", &ctx.expert_tp_ep}, {"etp-ep-pp", &ctx.expert_model_parallel},
        {"tp-cp", &ctx.tp_cp},    {"tp-cp-dp", &ctx.tp_cp_dp}};
    for (const auto& [axes, groups] : expected) {
      const auto got = members(*comms.at(axes), rank);
      EXPECT_EQ(got, holding(groups, rank)) << "rank " << rank << " group " << axes;
    }
    // The expert coordinates are the positions in the expert groups.
    EXPECT_EQ(ctx.expert_coords.etp, ctx.expert_tp.rank());
    EXPECT_EQ(ctx.expert_coords.ep, ctx.ep.rank());
    EXPECT_EQ(ctx.expert_coords.edp, ctx.expert_dp.rank());
    EXPECT_EQ(ctx.expert_coords.ep, ctx.coords.ep);
  });
}

TEST(ExpertGroups, TensorParallelPairsSpannedByExperts) {  // tp=2 dp=4, ep=4 etp=1
  expect_groups(ParallelConfig{.tp = 2, .dp = 4, .ep = 4, .etp = 1},
                {{"tp", {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
                 {"dp", {{0, 2, 4, 6}, {1, 3, 5, 7}}},
                 {"etp", {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}},
                 {"ep", {{0, 1, 2, 3}, {4, 5, 6, 7}}},
                 {"edp", {{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
                 {"etp-ep", {{0, 1, 2, 3}, {4, 5, 6, 7}}},
                 {"etp-ep-pp", {{0, 1, 2, 3}, {4, 5, 6, 7}}},
                 {"tp-cp", {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
                 {"tp-cp-dp", {{0, 1, 2, 3, 4, 5, 6, 7}}}});
}

TEST(ExpertGroups, ExpertTensorParallelEqualsTensorParallel) {  // tp=2 dp=4, etp=2 ep=2
  expect_groups(ParallelConfig{.tp = 2, .dp = 4, .ep = 2, .etp = 2},
                {{"etp", {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
                 {"ep", {{0, 2}, {1, 3}, {4, 6}, {5, 7}}},
                 {"edp", {{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
                 {"etp-ep", {{0, 1, 2, 3}, {4, 5, 6, 7}}},
                 {"etp-ep-pp", {{0, 1, 2, 3}, {4, 5, 6, 7}}}});
}

TEST(ExpertGroups, PipelineStagesRegroupedSeparately) {  // tp=2 pp=2 dp=2, ep=2 etp=1
  expect_groups(ParallelConfig{.tp = 2, .pp = 2, .dp = 2, .ep = 2, .etp = 1},
                {{"tp", {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
                 {"dp", {{0, 2}, {1, 3}, {4, 6}, {5, 7}}},
                 {"pp", {{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
                 {"etp", {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}},
                 {"ep", {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
                 {"edp", {{0, 2}, {1, 3}, {4, 6}, {5, 7}}},
                 {"etp-ep", {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
                 {"etp-ep-pp", {{0, 1, 4, 5}, {2, 3, 6, 7}}},
                 {"tp-cp-dp", {{0, 1, 2, 3}, {4, 5, 6, 7}}}});
}

TEST(ExpertGroups, PipelineStagesWithExpertTensorParallel) {  // tp=2 pp=2 dp=2, etp=2 ep=2
  expect_groups(ParallelConfig{.tp = 2, .pp = 2, .dp = 2, .ep = 2, .etp = 2},
                {{"etp", {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
                 {"ep", {{0, 2}, {1, 3}, {4, 6}, {5, 7}}},
                 {"edp", {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}},
                 {"etp-ep", {{0, 1, 2, 3}, {4, 5, 6, 7}}},
                 {"etp-ep-pp", {{0, 1, 2, 3, 4, 5, 6, 7}}}});
}

TEST(ExpertGroups, ContextParallelRanksShareExperts) {  // tp=2 cp=2 dp=2, etp=2 ep=2
  expect_groups(ParallelConfig{.tp = 2, .dp = 2, .cp = 2, .ep = 2, .etp = 2},
                {{"tp-cp", {{0, 1, 2, 3}, {4, 5, 6, 7}}},
                 {"etp", {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
                 {"ep", {{0, 2}, {1, 3}, {4, 6}, {5, 7}}},
                 {"edp", {{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
                 {"tp-cp-dp", {{0, 1, 2, 3, 4, 5, 6, 7}}}});
}

// A refused layout names the values, why, and what to do, and no rank creates a group.
void expect_refused(const ParallelConfig& config, int world_size, const std::string& part) {
  try {
    inprocess::run(world_size, [&](inprocess::communicator& world) { (void)Context::create(world, config); });
    ADD_FAILURE() << "the layout was accepted; expected: " << part;
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(part), std::string::npos) << message;
    EXPECT_EQ(message.back(), '.') << message;
  }
}

TEST(ExpertGroups, LayoutsThatDoNotDivideAreRefused) {
  expect_refused(ParallelConfig{.tp = 2, .dp = 2, .ep = 4, .etp = 2}, 4,
                 "etp=2 times ep=4 is 8, which does not divide tp*cp*dp=4, the ranks of one pipeline stage");
  expect_refused(ParallelConfig{.tp = 2, .pp = 2, .dp = 1, .ep = 4}, 4,
                 "etp=1 times ep=4 is 4, which does not divide tp*cp*dp=2");
  expect_refused(ParallelConfig{.tp = 1, .dp = 6, .ep = 4}, 6, "does not divide tp*cp*dp=6");
  expect_refused(ParallelConfig{.tp = 2, .dp = 2, .ep = 2, .etp = 0}, 4, "etp=0 is not a valid size");
}

}  // namespace
}  // namespace test_expert_groups_cases
