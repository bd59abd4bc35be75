// Context parallelism (ring attention over the cp group, Megatron's load-balanced split): a model on
// cp ranks, alone or with tensor (+ sequence) and data parallelism, dropout and recompute, equals
// the single-rank run in double: every micro-batch's loss (summed over the cp group), the
// validation loss, and every gradient (summed over dp x cp, gathered over tp); ring (p2p), all-gather
// and all-to-all (a2a) attention, with sliding windows and attention sinks. Lengths the split
// cannot cut, and what is not available yet, are refused with sentences.
#include "model_equivalence.hpp"

#include <strata/optim/grad_utils.hpp>
#include <strata/shard/context_parallel.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_context_parallel_cases {

namespace {

using strata::index_t;
using strata::models::ModelConfig;
using strata::models::RecomputeConfig;
using strata::models::RecomputeGranularity;

struct Layout {
  int tp = 1, cp = 1, dp = 1;
  RecomputeConfig recompute{};
  strata::ContextParallelComm comm = strata::ContextParallelComm::p2p;
  int a2a_size = 0;  // a2a+p2p: the all-to-all groups' size (the ring has cp / a2a_size ranks)
  std::string str() const {
    return "tp=" + std::to_string(tp) + " cp=" + std::to_string(cp) + " dp=" + std::to_string(dp) + " " +
           strata::context_parallel_comm_name(comm) + (a2a_size > 0 ? " " + std::to_string(a2a_size) + "x" +
                                                                          std::to_string(cp / a2a_size)
                                                                    : "") +
           (recompute.granularity == RecomputeGranularity::selective ? " selective recompute"
            : recompute.granularity == RecomputeGranularity::full    ? " full recompute"
                                                                      : "");
  }
};

// Two micro-batches (the first through the unfused head, the second through the fused one); with
// dp = 2 each data-parallel rank runs one of them. outputs[m] = {loss sum, tokens, validation loss}
// of micro-batch m, each summed over the cp group.
template <template <class> class Model, bool SP>
strata_test::Snapshot run_context_parallel(const ModelConfig& config, Layout layout) {
  using namespace strata;
  using P = strata_test::ModelPolicy<double, SP>;
  constexpr int micro_batches = 2;
  strata_test::Snapshot snapshot;
  snapshot.outputs.resize(micro_batches);
  std::mutex mutex;
  const ParallelConfig parallel{.tp = layout.tp, .dp = layout.dp, .cp = layout.cp};
  inprocess::run(parallel.world_size(), [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, parallel);
    ctx.cp_comm_type = layout.comm;
    if (layout.a2a_size > 0) ctx.split_context_parallel(layout.a2a_size);
    Model<P> model(ctx, config);
    model.init(ctx, 1234);
    model.set_recompute(layout.recompute);
    const double loss_scale = 1.0 / 30.0;
    for (int micro = 0; micro < micro_batches; ++micro) {
      if (micro % layout.dp != ctx.coords.dp) continue;
      strata_test::TokenBatch batch = strata_test::random_batch(config.vocab_size, 2, config.seq_length, 77 + 10 * micro);
      auto [loss, saved] = micro == 0 ? model.forward(ctx, batch.tokens, batch.labels, batch.mask, 99 + micro)
                                      : model.forward(ctx, batch.tokens, batch.labels, batch.mask, 99 + micro,
                                                      models::FusedLoss{loss_scale});
      const double evaluated = model.evaluate(ctx, batch.tokens, batch.labels, batch.mask, 99 + micro).loss_sum();
      model.backward(ctx, saved, loss_scale);
      double sums[3] = {loss.loss_sum(), loss.tokens, evaluated};  // this rank's tokens: sum over cp
      ctx.cp.all_reduce(std::span<double>(sums, 3), ReduceOp::sum);
      if (ctx.coords.tp == 0 && ctx.coords.cp == 0) {
        std::lock_guard lock(mutex);
        snapshot.outputs[static_cast<std::size_t>(micro)] = {sums[0], sums[1], sums[2]};
      }
    }
    all_reduce_gradients(ctx.dp_cp, model);  // parameters are replicated over dp x cp
    strata_test::gather_parameters(ctx, model, snapshot, mutex);
  });
  return snapshot;
}

template <template <class> class Model>
void expect_context_parallel_equals_single_rank(const ModelConfig& config, std::initializer_list<Layout> layouts,
                                                bool sequence_parallel_too) {
  const strata_test::Snapshot reference = run_context_parallel<Model, false>(config, {});
  ASSERT_FALSE(reference.grads.empty());
  for (const Layout& layout : layouts) {
    strata_test::expect_equivalent(run_context_parallel<Model, false>(config, layout), reference, 1e-12, layout.str());
    if (sequence_parallel_too && layout.tp > 1)
      strata_test::expect_equivalent(run_context_parallel<Model, true>(config, layout), reference, 1e-12,
                                     layout.str() + " sequence parallel");
  }
}

ModelConfig tiny_llama() {  // grouped-query attention, RoPE
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 40;
  c.vocab_size = 64;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 24;  // 2 cp divides it for cp = 2, 3, 4 (chunks of 6, 4, 3 tokens)
  c.rope_base = 500.0;
  return c;
}

ModelConfig tiny_gpt() {  // learned positions, multi-head attention
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 48;
  c.vocab_size = 64;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 24;
  return c;
}

// Odd shapes: 6 heads in 3 query groups at tp = 3, a 12-token local sequence under cp = 2, so a
// sequence-parallel rank's 4 tokens straddle the rank's two chunks of 6 (positions and dropout
// masks from both).
ModelConfig odd(ModelConfig c) {
  c.hidden_size = 48;
  c.num_attention_heads = 6;
  if (c.num_query_groups != 0) c.num_query_groups = 3;
  c.ffn_hidden_size = 36;
  c.vocab_size = 96;  // a multiple of make_vocab_size_divisible_by x tp: the same padded rows at tp = 1 and 3
  return c;
}

TEST(ContextParallel, LlamaEqualsSingleRank) {
  expect_context_parallel_equals_single_rank<strata::models::Llama>(tiny_llama(), {{.cp = 2}, {.cp = 3}, {.cp = 4}},
                                                                    false);
}
TEST(ContextParallel, GptEqualsSingleRank) {
  expect_context_parallel_equals_single_rank<strata::models::Gpt>(tiny_gpt(), {{.cp = 2}, {.cp = 3}, {.cp = 4}}, false);
}
TEST(ContextParallel, WithTensorAndDataParallelEqualsSingleRank) {
  expect_context_parallel_equals_single_rank<strata::models::Llama>(tiny_llama(), {{.tp = 2, .cp = 2}, {.cp = 2, .dp = 2}},
                                                                    true);
}
TEST(ContextParallel, OddShapesWithTensorParallelEqualSingleRank) {
  expect_context_parallel_equals_single_rank<strata::models::Llama>(odd(tiny_llama()), {{.tp = 3, .cp = 2}}, true);
  expect_context_parallel_equals_single_rank<strata::models::Gpt>(odd(tiny_gpt()), {{.tp = 3, .cp = 2}}, true);
}
// Hidden and attention dropout: every mask is keyed by global positions, so it is the cp = 1 run's.
TEST(ContextParallel, WithDropoutEqualsSingleRank) {
  auto llama = tiny_llama();
  llama.hidden_dropout = 0.2;
  llama.attention_dropout = 0.25;
  expect_context_parallel_equals_single_rank<strata::models::Llama>(llama, {{.cp = 2}, {.cp = 3}, {.tp = 2, .cp = 2}},
                                                                    true);
  auto gpt = odd(tiny_gpt());
  gpt.hidden_dropout = 0.2;
  gpt.attention_dropout = 0.25;
  expect_context_parallel_equals_single_rank<strata::models::Gpt>(gpt, {{.cp = 4}, {.tp = 3, .cp = 2}}, true);
}
TEST(ContextParallel, WithRecomputeEqualsSingleRank) {
  auto c = tiny_llama();
  c.attention_dropout = 0.25;
  expect_context_parallel_equals_single_rank<strata::models::Llama>(
      c, {{.cp = 2, .recompute = {RecomputeGranularity::selective}}, {.cp = 2, .recompute = {RecomputeGranularity::full}}},
      false);
}

// All-to-all attention (Ulysses): whole sequences of heads / cp heads on each rank.
constexpr auto a2a = strata::ContextParallelComm::a2a;
TEST(ContextParallel, AllToAllEqualsSingleRank) {
  expect_context_parallel_equals_single_rank<strata::models::Llama>(tiny_llama(), {{.cp = 2, .comm = a2a}}, false);
  auto gpt = tiny_gpt();
  gpt.hidden_dropout = 0.2;
  gpt.attention_dropout = 0.25;
  expect_context_parallel_equals_single_rank<strata::models::Gpt>(
      gpt,
      {{.cp = 2, .comm = a2a},
       {.cp = 4, .comm = a2a},
       {.tp = 2, .cp = 2, .comm = a2a},
       {.cp = 2, .dp = 2, .comm = a2a},
       {.cp = 2, .recompute = {RecomputeGranularity::selective}, .comm = a2a}},
      true);
}

// All-gather attention: the ring's blocks against every rank's keys and values gathered at once.
constexpr auto allgather = strata::ContextParallelComm::allgather;
TEST(ContextParallel, AllGatherEqualsSingleRank) {
  expect_context_parallel_equals_single_rank<strata::models::Llama>(
      tiny_llama(), {{.cp = 2, .comm = allgather}, {.cp = 3, .comm = allgather}, {.tp = 2, .cp = 2, .comm = allgather}},
      false);
  auto gpt = tiny_gpt();
  gpt.hidden_dropout = 0.2;
  gpt.attention_dropout = 0.25;
  expect_context_parallel_equals_single_rank<strata::models::Gpt>(
      gpt,
      {{.cp = 4, .comm = allgather},
       {.cp = 2, .dp = 2, .comm = allgather},
       {.cp = 2, .recompute = {RecomputeGranularity::selective}, .comm = allgather}},
      true);
}

// The run-time building blocks under context parallelism: qk norms (per token and head, before RoPE
// by global position) and a head dimension of its own, partial interleaved RoPE with Llama 3.1's
// scaling turned by each chunk's global positions; ring (p2p) and all-to-all, with tp.
TEST(ContextParallel, ArchitectureOptionsEqualSingleRank) {
  auto c = tiny_llama();
  c.qk_layernorm = true;
  c.kv_channels = 12;
  c.add_qkv_bias = true;
  c.rotary_percent = 0.5;
  c.rotary_interleaved = true;
  c.rope_scaling_factor = 8;
  c.rope_original_max_positions = 16;
  expect_context_parallel_equals_single_rank<strata::models::Llama>(
      c, {{.cp = 2}, {.tp = 2, .cp = 2}, {.cp = 2, .comm = a2a}, {.cp = 2, .recompute = {RecomputeGranularity::selective}}},
      true);
}

// Hierarchical context parallelism (a2a+p2p, Megatron's --hierarchical-context-parallel-sizes):
// all-to-all inside groups of adjacent cp ranks, the ring across them on their two runs of chunks.
// 2 x 2 and 2 x 3 (the ring of 3 over runs of 2 chunks), the degenerate 1 x 4 (the ring) and 4 x 1
// (all-to-all), with tp (+ SP), dp, dropout, a window with sinks, selective recompute, and
// multi-latent attention.
constexpr auto a2a_p2p = strata::ContextParallelComm::a2a_p2p;
TEST(ContextParallel, HierarchicalAllToAllAndRingEqualsSingleRank) {
  auto c = tiny_llama();
  c.attention_dropout = 0.25;
  expect_context_parallel_equals_single_rank<strata::models::Llama>(
      c,
      {{.cp = 4, .comm = a2a_p2p, .a2a_size = 2},
       {.cp = 6, .comm = a2a_p2p, .a2a_size = 2},
       {.cp = 4, .comm = a2a_p2p, .a2a_size = 1},
       {.cp = 2, .dp = 2, .comm = a2a_p2p, .a2a_size = 2},
       {.cp = 4, .recompute = {RecomputeGranularity::selective}, .comm = a2a_p2p, .a2a_size = 2}},
      false);
  auto gpt = tiny_gpt();  // 4 heads: tp = 2 leaves 2 per rank for the all-to-all pairs
  gpt.hidden_dropout = 0.2;
  gpt.window_size = 5;
  gpt.softmax_type = strata::SoftmaxType::learnable;
  expect_context_parallel_equals_single_rank<strata::models::Gpt>(
      gpt,
      {{.cp = 4, .comm = a2a_p2p, .a2a_size = 2},
       {.cp = 4, .comm = a2a_p2p, .a2a_size = 4},
       {.tp = 2, .cp = 4, .comm = a2a_p2p, .a2a_size = 2}},
      true);
  expect_context_parallel_equals_single_rank<strata::models::Llama>(strata_test::with_latent_attention(tiny_llama()),
                                                                    {{.cp = 4, .comm = a2a_p2p, .a2a_size = 2}}, false);
}

// Sliding windows and attention sinks (Mistral, gpt-oss) under context parallelism. A window of 5
// keys over chunks of 6, 4 and 3 tokens (cp = 2, 3, 4): the ring skips the blocks wholly before
// every window, masks a band of the others, and some rows of a block see none of its keys; layer 0
// windowed, layer 1 full (gpt-oss's alternation). The learnable sinks join the diagonal block only
// (ring, all-gather) or the rank's heads (a2a); off-by-one on GPT. With tp (+ SP), dp, dropout and
// selective recompute.
TEST(ContextParallel, SlidingWindowAndSinksEqualSingleRank) {
  auto c = tiny_llama();
  c.window_size = 5;
  c.window_layers = {1, 0};
  c.softmax_type = strata::SoftmaxType::learnable;
  c.attention_dropout = 0.25;
  expect_context_parallel_equals_single_rank<strata::models::Llama>(
      c,
      {{.cp = 2},
       {.cp = 3},
       {.cp = 4},
       {.tp = 2, .cp = 2},
       {.cp = 2, .dp = 2},
       {.cp = 3, .comm = allgather},
       {.cp = 2, .comm = a2a},
       {.cp = 2, .recompute = {RecomputeGranularity::selective}}},
      true);
  auto gpt = odd(tiny_gpt());
  gpt.window_size = 2;  // narrower than a chunk of 3 at cp = 4: most past blocks skipped
  gpt.softmax_type = strata::SoftmaxType::off_by_one;
  expect_context_parallel_equals_single_rank<strata::models::Gpt>(
      gpt, {{.cp = 4}, {.tp = 3, .cp = 2}, {.tp = 3, .cp = 2, .comm = a2a}, {.cp = 4, .comm = allgather}}, true);
}

// Multi-latent attention (DeepSeek-V2/V3): the latents per token, RoPE on the shared key part and the
// queries' part by each chunk's global positions, the attention of head dimension 10 with values of
// 5 padded to it; ring (p2p, cp 2 and 3), all-gather and all-to-all, with tp (+ SP), dp, dropout and
// selective recompute.
TEST(ContextParallel, MultiLatentAttentionEqualsSingleRank) {
  auto c = tiny_llama();
  c = strata_test::with_latent_attention(c);
  c.hidden_dropout = 0.2;
  c.attention_dropout = 0.25;
  expect_context_parallel_equals_single_rank<strata::models::Llama>(
      c,
      {{.cp = 2},
       {.cp = 3},
       {.tp = 2, .cp = 2},
       {.cp = 2, .dp = 2},
       {.cp = 2, .comm = allgather},
       {.cp = 2, .comm = a2a},
       {.tp = 2, .cp = 2, .comm = a2a},
       {.cp = 2, .recompute = {RecomputeGranularity::selective}}},
      true);
}

// The split itself: chunks r and 2 cp - 1 - r.
TEST(ContextParallel, SplitHoldsChunksRAndMirror) {
  const strata::ContextParallelSplit split = strata::context_parallel_split(24, 3, 1, "test");
  EXPECT_EQ(split.chunk, 4);
  EXPECT_EQ(split.global_position(0), 4);   // chunk 1
  EXPECT_EQ(split.global_position(3), 7);
  EXPECT_EQ(split.global_position(4), 16);  // chunk 4 = 2 * 3 - 1 - 1
  EXPECT_EQ(split.global_position(7), 19);
  strata::Tensor<std::int32_t> ids(strata::Shape{1, 8});
  for (index_t i = 0; i < 8; ++i) ids[i] = static_cast<std::int32_t>(i);
  const auto local = strata::local_sequence(ids, 2, 0, "test");  // chunks 0 and 3 of 2 tokens
  ASSERT_EQ(local.numel(), 4);
  EXPECT_EQ(local[0], 0);
  EXPECT_EQ(local[1], 1);
  EXPECT_EQ(local[2], 6);
  EXPECT_EQ(local[3], 7);
}

template <class F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const strata::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ContextParallel, UnevenLengthsAreRefusedNamingBothNumbers) {
  using namespace strata;
  using P = strata_test::ModelPolicy<double, false>;
  auto c = tiny_llama();
  c.seq_length = 10;  // 2 cp = 4 does not divide it
  const std::string model_error = config_error_of([&] {
    inprocess::run(2, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.cp = 2});
      models::Llama<P> model(ctx, c);
    });
  });
  EXPECT_NE(model_error.find("2*cp=4"), std::string::npos) << model_error;
  EXPECT_NE(model_error.find("seq_length=10"), std::string::npos) << model_error;
  // a shorter batch whose length 2 cp does not divide, refused before the layers run
  const std::string batch_error = config_error_of([&] {
    inprocess::run(2, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.cp = 2});
      models::Llama<P> model(ctx, tiny_llama());
      model.init(ctx, 1);
      strata_test::TokenBatch batch = strata_test::random_batch(64, 1, 18, 3);
      (void)model.forward(ctx, batch.tokens, batch.labels, batch.mask);
    });
  });
  EXPECT_NE(batch_error.find("2*cp=4"), std::string::npos) << batch_error;
  EXPECT_NE(batch_error.find("18 tokens"), std::string::npos) << batch_error;
}

TEST(ContextParallel, WhatIsNotAvailableIsRefused) {
  using namespace strata;
  using P = strata_test::ModelPolicy<double, false>;
  // a2a+p2p without its two groups, and an all-to-all group size that does not divide cp
  const std::string error = config_error_of([&] {
    inprocess::run(2, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.cp = 2});
      ctx.cp_comm_type = ContextParallelComm::a2a_p2p;
      models::Llama<P> model(ctx, tiny_llama());
      model.init(ctx, 1);
      strata_test::TokenBatch batch = strata_test::random_batch(64, 1, 24, 3);
      (void)model.forward(ctx, batch.tokens, batch.labels, batch.mask);
    });
  });
  EXPECT_NE(error.find("--cp-comm-type a2a+p2p"), std::string::npos) << error;
  EXPECT_NE(error.find("--hierarchical-context-parallel-sizes"), std::string::npos) << error;
  const std::string sizes_error = config_error_of([&] {
    inprocess::run(4, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.cp = 4});
      ctx.split_context_parallel(3);
    });
  });
  EXPECT_NE(sizes_error.find("group of 3 ranks does not divide --context-parallel-size 4"), std::string::npos)
      << sizes_error;
  // a2a needs whole query and key/value heads per cp rank: 2 key/value heads over cp = 4 is refused
  const std::string heads_error = config_error_of([&] {
    inprocess::run(4, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.cp = 4});
      ctx.cp_comm_type = ContextParallelComm::a2a;
      models::Llama<P> model(ctx, tiny_llama());
      model.init(ctx, 1);
      strata_test::TokenBatch batch = strata_test::random_batch(64, 1, 24, 3);
      (void)model.forward(ctx, batch.tokens, batch.labels, batch.mask);
    });
  });
  EXPECT_NE(heads_error.find("cp=4"), std::string::npos) << heads_error;
  EXPECT_NE(heads_error.find("2 key/value heads"), std::string::npos) << heads_error;
}

// cp x pp (x tp): PipelineModel's schedules over the local tokens, against the whole model on one
// rank; loss summed over the step's micro-batches and the cp group, every gradient.
struct MicroBatch {
  strata::Tensor<std::int32_t> tokens, labels;
  strata::Tensor<float> loss_mask;
};

template <template <class> class Model, bool SP>
strata_test::Snapshot pipeline_run(const ModelConfig& config, int tp, int cp, int pp, int virtual_stages,
                                   strata::pipeline::ScheduleKind kind) {
  using namespace strata;
  using P = strata_test::ModelPolicy<double, SP>;
  constexpr int micro_batches = 4;
  strata_test::Snapshot snapshot;
  std::mutex mutex;
  const ParallelConfig parallel{.tp = tp, .pp = pp, .cp = cp};
  inprocess::run(parallel.world_size(), [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, parallel);
    models::PipelineModel<Model, P> model(ctx, config, {virtual_stages, -1, -1});
    model.init(ctx, 1234);
    std::vector<MicroBatch> batches;
    std::vector<std::uint64_t> keys;
    for (int m = 0; m < micro_batches; ++m) {
      auto b = strata_test::random_batch(config.vocab_size, 2, config.seq_length, 77 + 10 * m);
      batches.push_back({b.tokens, b.labels, b.mask});
      keys.push_back(99 + static_cast<std::uint64_t>(m));
    }
    auto result = model.train_step(ctx, kind, std::span<const MicroBatch>(batches), std::span<const std::uint64_t>(keys),
                                   1.0 / 30.0);
    double sums[2] = {result.loss_sum_on_host(), result.tokens};
    ctx.cp.all_reduce(std::span<double>(sums, 2), ReduceOp::sum);
    all_reduce_gradients(ctx.dp_cp, model);
    model.for_each_parameter([&](auto& p) {
      auto value = gather_global(ctx.tp, p, p.value);
      auto grad = gather_global(ctx.tp, p, p.grad);
      if (ctx.coords.tp == 0 && ctx.coords.cp == 0 && !p.pipeline_copy) {
        std::lock_guard lock(mutex);
        snapshot.values[p.name] = strata_test::to_values(value);
        snapshot.grads[p.name] = strata_test::to_values(grad);
      }
    });
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      snapshot.outputs.push_back({sums[0], sums[1]});
    }
  });
  return snapshot;
}

TEST(ContextParallel, WithPipelineParallelEqualsSingleRank) {
  using strata::pipeline::ScheduleKind;
  auto llama = tiny_llama();
  llama.num_layers = 4;
  llama.attention_dropout = 0.25;
  const auto llama_reference = pipeline_run<strata::models::Llama, false>(llama, 1, 1, 1, 1, ScheduleKind::one_f_one_b);
  strata_test::expect_equivalent(pipeline_run<strata::models::Llama, false>(llama, 1, 2, 2, 1, ScheduleKind::one_f_one_b),
                                 llama_reference, 1e-12, "cp=2 pp=2 1F1B");
  strata_test::expect_equivalent(pipeline_run<strata::models::Llama, true>(llama, 2, 2, 2, 1, ScheduleKind::zero_bubble),
                                 llama_reference, 1e-12, "tp=2 cp=2 pp=2 zero bubble, sequence parallel");
  auto gpt = tiny_gpt();  // tied embedding: its two copies on the first and last stage
  gpt.num_layers = 4;
  gpt.hidden_dropout = 0.2;
  const auto gpt_reference = pipeline_run<strata::models::Gpt, false>(gpt, 1, 1, 1, 1, ScheduleKind::one_f_one_b);
  strata_test::expect_equivalent(pipeline_run<strata::models::Gpt, false>(gpt, 1, 2, 2, 2, ScheduleKind::interleaved),
                                 gpt_reference, 1e-12, "cp=2 pp=2 interleaved");
}

}  // namespace
}  // namespace test_context_parallel_cases
