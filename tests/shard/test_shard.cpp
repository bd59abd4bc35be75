// Runtime suite for the sharding arithmetic: the same functions as the static checks, with inputs
// that arrive at run time, their error messages, and rank groups compared with an independent
// implementation of Megatron-Core's group enumeration over many layouts.
#include <strata/shard.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {
using strata::ConfigError;
using strata::Coordinates;
using strata::ModelDims;
using strata::ParallelConfig;
using strata::Range;
using strata::RankGenerator;
using Groups = std::vector<std::vector<int>>;

// Values parsed from text, as a launcher reads them from flags or the environment.
int runtime(const char* text) { return std::stoi(text); }

// Runs `body`, expects a ConfigError whose message contains `part`, and returns the message.
std::string expect_config_error(const std::function<void()>& body, const std::string& part) {
  try {
    body();
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(part), std::string::npos) << "message: " << message << "\nexpected to contain: " << part;
    EXPECT_EQ(message.back(), '.') << "message is not a whole sentence: " << message;
    return message;
  }
  ADD_FAILURE() << "no ConfigError thrown; expected one containing: " << part;
  return {};
}

ModelDims llama7b() {
  return {.num_layers = runtime("32"),
          .hidden_size = runtime("4096"),
          .num_attention_heads = runtime("32"),
          .num_query_groups = runtime("8"),
          .ffn_hidden_size = runtime("11008"),
          .vocab_size = runtime("32000"),
          .seq_length = runtime("4096")};
}

// ---- Megatron-Core's group enumeration, written out independently as a reference. ----------
// sizes: name -> size; order: fastest first; token: the names the groups vary.
Groups megatron_get_ranks(std::map<std::string, int> sizes, std::string order, const std::string& token) {
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    std::stringstream in(s);
    for (std::string part; std::getline(in, part, '-');) out.push_back(part);
    return out;
  };
  for (const auto& [name, size] : sizes)
    if (order.find(name) == std::string::npos) order += "-" + name;
  const std::vector<std::string> names = split(order), wanted = split(token);
  std::vector<int> shape, masked_shape, unmasked_shape, masked_stride, unmasked_stride;
  int stride = 1, world = 1;
  for (const std::string& name : names) {
    const int size = sizes.at(name);
    const bool masked = std::find(wanted.begin(), wanted.end(), name) != wanted.end();
    (masked ? masked_shape : unmasked_shape).push_back(size);
    (masked ? masked_stride : unmasked_stride).push_back(stride);
    stride *= size;
    world *= size;
  }
  auto decompose = [](int index, const std::vector<int>& dims) {
    std::vector<int> idx;
    int prefix = 1;
    for (int d : dims) {
      idx.push_back(index / prefix % d);
      prefix *= d;
    }
    return idx;
  };
  auto inner = [](const std::vector<int>& a, const std::vector<int>& b) {
    int sum = 0;
    for (std::size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
    return sum;
  };
  int group_size = 1;
  for (int d : masked_shape) group_size *= d;
  Groups out;
  for (int g = 0; g < world / group_size; ++g) {
    std::vector<int> ranks;
    for (int i = 0; i < group_size; ++i)
      ranks.push_back(inner(decompose(i, masked_shape), masked_stride) + inner(decompose(g, unmasked_shape), unmasked_stride));
    out.push_back(ranks);
  }
  return out;
}

// Megatron's two generators for a layout: dense (ep = 1) and expert (tp = etp, dp = expert dp, cp = 1).
Groups megatron_dense(const ParallelConfig& c, const std::string& order, const std::string& token) {
  return megatron_get_ranks({{"tp", c.tp}, {"cp", c.cp}, {"ep", 1}, {"dp", c.dp}, {"pp", c.pp}}, order, token);
}
Groups megatron_expert(const ParallelConfig& c, const std::string& order, const std::string& token) {
  return megatron_get_ranks({{"tp", c.etp}, {"cp", 1}, {"ep", c.ep}, {"dp", c.expert_dp()}, {"pp", c.pp}}, order, token);
}

// Every valid layout with world size up to 48 built from these sizes.
std::vector<ParallelConfig> many_configs() {
  std::vector<ParallelConfig> out;
  for (int tp : {1, 2, 4})
    for (int cp : {1, 2})
      for (int dp : {1, 2, 3, 4})
        for (int pp : {1, 2, 3})
          for (int ep : {1, 2, 4})
            for (int etp : {1, 2}) {
              const ParallelConfig c{.tp = tp, .pp = pp, .dp = dp, .cp = cp, .ep = ep, .etp = etp};
              if (c.world_size() <= 48 && strata::validate(c).ok()) out.push_back(c);
            }
  return out;
}

std::string describe(const ParallelConfig& c) {
  std::ostringstream s;
  s << "tp=" << c.tp << " pp=" << c.pp << " dp=" << c.dp << " cp=" << c.cp << " ep=" << c.ep << " etp=" << c.etp;
  return s.str();
}

const std::vector<std::string> kDenseAxes = {"tp", "cp", "dp", "pp", "tp-cp", "tp-pp", "dp-cp", "tp-dp",
                                             "tp-dp-cp", "tp-cp-dp-pp", "cp-pp"};
const std::vector<std::string> kExpertAxes = {"etp", "ep", "edp", "etp-ep", "etp-ep-pp", "ep-edp"};

// strata's expert axis names in Megatron's expert-generator spelling.
std::string megatron_token(const std::string& axes) {
  std::string out;
  std::stringstream in(axes);
  for (std::string part; std::getline(in, part, '-');) {
    if (part == "etp") part = "tp";
    if (part == "edp") part = "dp";
    out += (out.empty() ? "" : "-") + part;
  }
  return out;
}

// ---- ParallelConfig ---------------------------------------------------------------------------

TEST(ParallelConfig, RuntimeValidConfigPasses) {
  const ParallelConfig c{.tp = runtime("8"), .pp = runtime("4"), .dp = runtime("2")};
  EXPECT_TRUE(strata::validate(c, llama7b()).ok());
  EXPECT_NO_THROW(strata::check(c, llama7b(), 64));
  EXPECT_EQ(strata::checked(c, llama7b()), c);
  EXPECT_EQ(c.world_size(), 64);
}

TEST(ParallelConfig, MessagesNameTheValueAndTheReason) {
  const ModelDims m = llama7b();
  const std::string message =
      expect_config_error([&] { strata::check(ParallelConfig{.tp = runtime("3")}, m); },
                          "tp=3 does not divide num_attention_heads=32");
  EXPECT_EQ(message, std::string(strata::validate(ParallelConfig{.tp = 3}, m).message()));
  expect_config_error([&] { strata::check(ParallelConfig{.tp = runtime("16")}, m); },
                      "num_query_groups=8 is smaller than tp=16; query groups must be a multiple of tp");
  ModelDims twelve_groups = m;
  twelve_groups.num_attention_heads = 48;
  twelve_groups.hidden_size = 6144;
  twelve_groups.num_query_groups = 12;
  expect_config_error([&] { strata::check(ParallelConfig{.tp = runtime("8")}, twelve_groups); },
                      "tp=8 does not divide num_query_groups=12; query groups must be a multiple of tp");
  ModelDims bad_groups = m;
  bad_groups.num_query_groups = 6;
  expect_config_error([&] { strata::check(ParallelConfig{}, bad_groups); },
                      "num_query_groups=6 does not divide num_attention_heads=32");
  ModelDims bad_ffn = m;
  bad_ffn.ffn_hidden_size = 11006;
  expect_config_error([&] { strata::check(ParallelConfig{.tp = 4}, bad_ffn); }, "tp=4 does not divide ffn_hidden_size=11006");
  expect_config_error([&] { strata::check(ParallelConfig{.pp = runtime("5")}, m); }, "pp=5 does not divide num_layers=32");
  expect_config_error([&] { strata::check(ParallelConfig{.pp = runtime("33")}, m); }, "pp=33 exceeds num_layers=32");
  expect_config_error([&] { strata::check(ParallelConfig{.cp = runtime("3")}, m); }, "2*cp=6 does not divide seq_length=4096");
  expect_config_error([&] { strata::check(ParallelConfig{.tp = 0}); }, "tp=0 is not a valid size");
  expect_config_error([&] { strata::check(ParallelConfig{.etp = -1}); }, "etp=-1 is not a valid size");
  ModelDims bad_hidden = m;
  bad_hidden.hidden_size = 4100;
  expect_config_error([&] { strata::check(ParallelConfig{}, bad_hidden); },
                      "num_attention_heads=32 does not divide hidden_size=4100");
  bad_hidden.kv_channels = 128;  // explicit head size: no divisibility needed
  EXPECT_NO_THROW(strata::check(ParallelConfig{}, bad_hidden));
  ModelDims no_layers = m;
  no_layers.num_layers = 0;
  expect_config_error([&] { strata::check(ParallelConfig{}, no_layers); }, "num_layers=0 is not valid");
}

TEST(ParallelConfig, SequenceParallelNeedsTpToDivideTheSequence) {
  ModelDims m = llama7b();
  m.seq_length = 4100;
  m.hidden_size = 4096;
  EXPECT_NO_THROW(strata::check(ParallelConfig{.tp = 8}, m));  // off: no constraint
  m.sequence_parallel = true;
  expect_config_error([&] { strata::check(ParallelConfig{.tp = 8}, m); }, "tp=8 does not divide seq_length=4100");
  m.seq_length = 4096;
  EXPECT_NO_THROW(strata::check(ParallelConfig{.tp = 8, .cp = 2}, m));
  m.seq_length = 4 * 6;  // 2*cp=4 divides it, but seq/cp = 12 is not a multiple of tp=8
  expect_config_error([&] { strata::check(ParallelConfig{.tp = 8, .cp = 2}, m); }, "tp=8 does not divide seq_length/cp=12");
}

TEST(ParallelConfig, ExpertRules) {
  ModelDims moe = llama7b();
  moe.num_experts = 8;
  EXPECT_NO_THROW(strata::check(ParallelConfig{.tp = 2, .dp = 4, .ep = 4, .etp = 2}, moe, 8));
  EXPECT_NO_THROW(strata::check(ParallelConfig{.tp = 2, .dp = 4, .ep = 8, .etp = 1}, moe, 8));
  expect_config_error([&] { strata::check(ParallelConfig{.tp = 2, .dp = 2, .ep = 4, .etp = 2}, moe); },
                      "etp=2 times ep=4 is 8, which does not divide tp*cp*dp=4");
  expect_config_error([&] { strata::check(ParallelConfig{.dp = 3, .ep = 3}, moe); }, "ep=3 does not divide num_experts=8");
  expect_config_error([&] { strata::check(ParallelConfig{.dp = 2, .ep = 2}, llama7b()); },
                      "ep=2 needs a mixture-of-experts model, but num_experts=0");
  moe.expert_ffn_hidden_size = 1407;
  expect_config_error([&] { strata::check(ParallelConfig{.tp = 2, .dp = 2, .ep = 2, .etp = 2}, moe); },
                      "etp=2 does not divide the expert ffn hidden size 1407");
}

TEST(ParallelConfig, WorldSizeMustMatch) {
  const ParallelConfig c{.tp = 2, .pp = 2};
  EXPECT_NO_THROW(strata::check(c, 4));
  expect_config_error([&] { strata::check(c, runtime("16")); }, "needs 4 ranks, but world_size=16; set dp=4");
  expect_config_error([&] { strata::check(c, llama7b(), runtime("6")); }, "needs 4 ranks, but world_size=6");
}

TEST(ParallelConfig, UnevenPipelineSplitInModelDims) {
  ModelDims m = llama7b();
  m.num_layers = 30;
  expect_config_error([&] { strata::check(ParallelConfig{.pp = 4}, m); }, "pp=4 does not divide num_layers=30");
  m.first_stage_layers = 6;
  EXPECT_NO_THROW(strata::check(ParallelConfig{.pp = 4}, m));
  m.first_stage_layers = 5;
  expect_config_error([&] { strata::check(ParallelConfig{.pp = 4}, m); }, "do not split evenly over the 3 other pipeline stages");
}

// ---- Partitions ------------------------------------------------------------------------------

TEST(Partition, PiecesTileTheRangeAndDifferByAtMostOne) {
  for (strata::index_t n : {0, 1, 7, 64, 1000, 50257})
    for (int parts = 1; parts <= 17; ++parts) {
      strata::index_t next = 0;
      for (int i = 0; i < parts; ++i) {
        const Range r = strata::partition(n, parts, i);
        EXPECT_EQ(r.begin, next);
        EXPECT_EQ(r.size(), n / parts + (i < n % parts ? 1 : 0));
        next = r.end;
      }
      EXPECT_EQ(next, n);
    }
}

TEST(Partition, EvenPartitionRejectsARemainder) {
  EXPECT_EQ(strata::partition_even(runtime("12"), 4, 1), (Range{3, 6}));
  expect_config_error([] { strata::partition_even(runtime("10"), 3, 0); }, "parts=3 does not divide n=10");
  expect_config_error([] { strata::partition(10, 3, 3); }, "part index i=3 is outside a partition into parts=3 pieces");
  expect_config_error([] { strata::partition(-1, 3, 0); }, "cannot partition n=-1 elements");
}

TEST(Partition, StageLayersFollowMegatronFirstAndLastCounts) {
  const int layers = runtime("30"), pp = runtime("4");
  auto all = [&](int first, int last) {
    std::vector<Range> out;
    for (int s = 0; s < pp; ++s) out.push_back(strata::stage_layers(layers, pp, s, first, last));
    return out;
  };
  EXPECT_EQ(all(6, -1), (std::vector<Range>{{0, 6}, {6, 14}, {14, 22}, {22, 30}}));
  EXPECT_EQ(all(-1, 3), (std::vector<Range>{{0, 9}, {9, 18}, {18, 27}, {27, 30}}));
  EXPECT_EQ(all(2, 4), (std::vector<Range>{{0, 2}, {2, 14}, {14, 26}, {26, 30}}));
  EXPECT_EQ(strata::stage_layers(32, 4, 2), (Range{16, 24}));
  expect_config_error([&] { strata::stage_layers(layers, pp, 0); }, "pp=4 does not divide num_layers=30");
  expect_config_error([&] { strata::stage_layers(layers, pp, 0, 5); },
                      "the 25 layers left after first_stage_layers=5 and last_stage_layers=-1");
  expect_config_error([&] { strata::stage_layers(layers, pp, 0, 15, 14); }, "leave 1 of num_layers=30 for the 2 other");
  expect_config_error([&] { strata::stage_layers(10, 2, 0, 4, 4); }, "with pp=2 these two stages hold all num_layers=10");
  expect_config_error([&] { strata::stage_layers(32, 4, 4); }, "stage=4 is outside a pipeline of pp=4 stages");
  expect_config_error([&] { strata::stage_layers(32, 4, 0, 0); }, "first_stage_layers=0 is not valid");
  EXPECT_TRUE(strata::stage_has_embedding(0, pp));
  EXPECT_FALSE(strata::stage_has_embedding(1, pp));
  EXPECT_TRUE(strata::stage_has_output(pp - 1, pp));
  EXPECT_FALSE(strata::stage_has_output(0, pp));
}

TEST(Partition, VocabPaddingAndRanges) {
  EXPECT_EQ(strata::padded_vocab_size(runtime("50257"), 1), 50304);
  EXPECT_EQ(strata::padded_vocab_size(runtime("50257"), 8), 51200);
  EXPECT_EQ(strata::padded_vocab_size(runtime("128256"), 8), 129024);  // 126 * 1024
  EXPECT_EQ(strata::padded_vocab_size(runtime("128256"), 4), 128512);  // 251 * 512
  for (int tp : {1, 2, 3, 4, 8}) {
    const strata::index_t padded = strata::padded_vocab_size(50257, tp);
    EXPECT_EQ(padded % (128 * tp), 0);
    EXPECT_GE(padded, 50257);
    EXPECT_LT(padded - 50257, 128 * tp);
    strata::index_t next = 0;
    for (int r = 0; r < tp; ++r) {
      const Range rows = strata::vocab_range(padded, tp, r);
      EXPECT_EQ(rows.begin, next);
      EXPECT_EQ(rows.size(), padded / tp);
      next = rows.end;
    }
    EXPECT_EQ(next, padded);
  }
  expect_config_error([] { strata::vocab_range(50257, 2, 0); }, "tp=2 does not divide the vocabulary size 50257");
  expect_config_error([] { strata::padded_vocab_size(50257, 2, 0); }, "make_vocab_size_divisible_by=0 is not valid");
}

TEST(Partition, HeadsAndQueryGroupsPerRank) {
  EXPECT_EQ(strata::heads_per_rank(runtime("32"), 8), 4);
  EXPECT_EQ(strata::query_groups_per_rank(runtime("8"), 4), 2);
  expect_config_error([] { strata::heads_per_rank(runtime("32"), 3); }, "tp=3 does not divide num_attention_heads=32");
  expect_config_error([] { strata::query_groups_per_rank(runtime("4"), 8); },
                      "num_query_groups=4 is smaller than tp=8; query groups must be a multiple of tp");
  expect_config_error([] { strata::query_groups_per_rank(runtime("12"), 8); }, "tp=8 does not divide num_query_groups=12");
}

// ---- RankGenerator -----------------------------------------------------------------------------

TEST(RankGenerator, MegatronDocumentedExample) {
  const RankGenerator gen(ParallelConfig{.tp = runtime("2"), .pp = runtime("4"), .dp = runtime("2")});
  EXPECT_EQ(gen.groups("tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(gen.groups("pp"), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(gen.groups("dp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(gen.groups("tp-pp"), (Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}}));
}

TEST(RankGenerator, ContextAndExpertGroupsMatchMegatron) {
  const RankGenerator cp(ParallelConfig{.tp = 2, .dp = 2, .cp = runtime("2")});
  EXPECT_EQ(cp.groups("cp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(cp.groups("dp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(cp.groups("dp-cp"), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(cp.groups("tp-cp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));

  const RankGenerator big_cp(ParallelConfig{.pp = 2, .dp = 2, .cp = 4});
  EXPECT_EQ(big_cp.groups("dp-cp"), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  EXPECT_EQ(big_cp.groups("cp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));

  const RankGenerator ep(ParallelConfig{.tp = 2, .dp = 4, .ep = runtime("2"), .etp = 2});
  EXPECT_EQ(ep.groups("ep"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(ep.groups("edp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(ep.groups("etp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(ep.groups("etp-ep"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));

  const RankGenerator wide_ep(ParallelConfig{.tp = 2, .dp = 4, .ep = 4, .etp = 1});
  EXPECT_EQ(wide_ep.groups("ep"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(wide_ep.groups("edp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));

  const RankGenerator ep_pp(ParallelConfig{.tp = 2, .pp = 2, .dp = 4, .ep = 2, .etp = 2});
  EXPECT_EQ(ep_pp.groups("ep"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(ep_pp.groups("etp-ep-pp"), (Groups{{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}}));

  const RankGenerator other_order(ParallelConfig{.tp = 2, .pp = 2, .dp = 2, .etp = 2}, "tp-pp-dp");
  EXPECT_EQ(other_order.groups("pp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(other_order.groups("dp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(RankGenerator, GroupsMatchMegatronForManyLayouts) {
  const std::vector<std::string> orders = {"tp-cp-ep-dp-pp", "tp-dp-pp-cp-ep", "cp-tp-dp-ep-pp", "tp-pp-dp", "pp-tp-cp-ep-dp"};
  int compared = 0;
  for (const ParallelConfig& c : many_configs())
    for (const std::string& order : orders) {
      std::optional<RankGenerator> gen;
      try {
        gen.emplace(c, order);
      } catch (const ConfigError&) {
        continue;  // the order leaves out an axis of size > 1, or the pipeline groups would disagree
      }
      for (const std::string& axes : kDenseAxes)
        EXPECT_EQ(gen->groups(axes), megatron_dense(c, order, axes)) << describe(c) << " order " << order << " axes " << axes;
      for (const std::string& axes : kExpertAxes)
        EXPECT_EQ(gen->groups(axes), megatron_expert(c, order, megatron_token(axes)))
            << describe(c) << " order " << order << " axes " << axes;
      EXPECT_EQ(megatron_dense(c, order, "pp"), megatron_expert(c, order, "pp")) << describe(c) << " order " << order;
      ++compared;
    }
  EXPECT_GT(compared, 200);
}

TEST(RankGenerator, CoordinatesRoundTrip) {
  for (const ParallelConfig& c : many_configs()) {
    const RankGenerator gen(c);
    for (int rank = 0; rank < c.world_size(); ++rank) {
      const Coordinates at = gen.coordinates(rank);
      ASSERT_EQ(gen.rank_of(at), rank) << describe(c);
      ASSERT_EQ(gen.rank_of(gen.expert_coordinates(rank)), rank) << describe(c);
      EXPECT_EQ(at.tp, gen.position_in_group(rank, "tp"));
      EXPECT_EQ(at.cp, gen.position_in_group(rank, "cp"));
      EXPECT_EQ(at.dp, gen.position_in_group(rank, "dp"));
      EXPECT_EQ(at.pp, gen.position_in_group(rank, "pp"));
      EXPECT_EQ(at.ep, gen.position_in_group(rank, "ep"));
      // Default order: the expert index is the position of the rank among the stage's etp blocks.
      const int in_stage = rank % (c.world_size() / c.pp);
      EXPECT_EQ(at.ep, in_stage / c.etp % c.ep) << describe(c) << " rank " << rank;
      EXPECT_EQ(gen.rank_of(Coordinates{.tp = at.tp, .cp = at.cp, .ep = 0, .dp = at.dp, .pp = at.pp}), rank);
    }
  }
}

TEST(RankGenerator, GroupsPartitionTheWorldAndLookupsAgree) {
  std::vector<std::string> all = kDenseAxes;
  all.insert(all.end(), kExpertAxes.begin(), kExpertAxes.end());
  for (const ParallelConfig& c : many_configs()) {
    const RankGenerator gen(c);
    for (const std::string& axes : all) {
      const Groups groups = gen.groups(axes);
      ASSERT_EQ(static_cast<int>(groups.size()), gen.group_count(axes));
      std::vector<int> seen(static_cast<std::size_t>(c.world_size()), 0);
      for (int g = 0; g < gen.group_count(axes); ++g) {
        ASSERT_EQ(static_cast<int>(groups[g].size()), gen.group_size(axes));
        for (int i = 0; i < gen.group_size(axes); ++i) {
          const int rank = groups[g][i];
          ++seen[rank];
          EXPECT_EQ(gen.group_index_of(rank, axes), g);
          EXPECT_EQ(gen.position_in_group(rank, axes), i);
          EXPECT_EQ(gen.group_of(rank, axes), groups[g]);
        }
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; })) << describe(c) << " " << axes;
    }
  }
}

TEST(RankGenerator, PipelineNeighboursWrap) {
  for (const ParallelConfig& c : many_configs()) {
    const RankGenerator gen(c);
    for (int rank = 0; rank < c.world_size(); ++rank) {
      const Coordinates at = gen.coordinates(rank);
      Coordinates next = at, prev = at;
      next.pp = (at.pp + 1) % c.pp;
      prev.pp = (at.pp + c.pp - 1) % c.pp;
      EXPECT_EQ(gen.next_pipeline_rank(rank), gen.rank_of(next));
      EXPECT_EQ(gen.prev_pipeline_rank(rank), gen.rank_of(prev));
      EXPECT_EQ(gen.prev_pipeline_rank(gen.next_pipeline_rank(rank)), rank);
    }
  }
}

TEST(RankGenerator, ErrorsNameTheOffendingInput) {
  const RankGenerator gen(ParallelConfig{.tp = 2, .pp = 2, .dp = 2});
  expect_config_error([&] { gen.groups(std::string("xp-dp")); }, "names 'xp', which is not a parallel axis");
  expect_config_error([&] { gen.group_size("tp-tp"); }, "names tp twice");
  expect_config_error([&] { gen.group_size("tp-ep"); }, "mixes dense-layer axes");
  expect_config_error([&] { gen.group_size(""); }, "is not a list of axes");
  expect_config_error([&] { gen.group_size("tp-"); }, "is not a list of axes");
  expect_config_error([&] { gen.coordinates(runtime("8")); }, "rank=8 is outside the world of 8 ranks");
  expect_config_error([&] { gen.rank_of(Coordinates{.tp = 2}); }, "coordinate tp=2 is outside the axis of size 2");
  expect_config_error([&] { gen.group_member("tp", 4, 0); }, "group=4 is outside the 4 groups of 'tp'");
  expect_config_error([] { RankGenerator(ParallelConfig{.tp = 2, .pp = 2}, "tp-dp"); }, "leaves out pp, whose size is 2");
  expect_config_error([] { RankGenerator(ParallelConfig{.tp = 2}, "tp-qp"); }, "names 'qp', which is not an axis");
  expect_config_error([] { RankGenerator(ParallelConfig{.tp = 2}, "tp-tp"); }, "names tp twice");
  expect_config_error([] { RankGenerator(ParallelConfig{.tp = 0}); }, "tp=0 is not a valid size");
  // Megatron's rule for orders that do not end with pp.
  expect_config_error([] { RankGenerator(ParallelConfig{.tp = 2, .pp = 2, .dp = 2, .etp = 1}, "tp-pp-dp"); },
                      "expert_dp=4 and dp=2");
}
}  // namespace
