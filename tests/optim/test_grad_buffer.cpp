// Gradient buffers and buckets: the documented layout (reverse parameter order, aligned starts,
// buckets closed at bucket_size and padded to dp x alignment), gradients as views into the buffer,
// bucketed all-reduce and reduce-scatter against the per-parameter reduction, buckets started in
// order as their parameters become ready; zeroing by first write (the marked gradients left for the
// weight-gradient GEMM to write, the rest filled, a gradient no GEMM wrote settled to zero before
// its bucket's reduction, the GEMM writing the bits the fill-then-add gives).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <strata/comm.hpp>
#include <strata/comm/parallel_context.hpp>
#include <strata/layers/linear_common.hpp>
#include <strata/optim.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_grad_buffer_cases {

namespace {

using namespace strata;

// A module of float parameters of the given sizes ("p0", "p1", ...), values i + 1000 * index.
struct Flat {
  std::vector<std::unique_ptr<Parameter<float>>> params;
  explicit Flat(const std::vector<index_t>& sizes) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      params.push_back(std::make_unique<Parameter<float>>("p" + std::to_string(k), Shape{sizes[k]}, ShardSpec::replicated()));
      for (index_t i = 0; i < sizes[k]; ++i) params.back()->value[i] = static_cast<float>(i + 1000 * static_cast<index_t>(k));
    }
  }
  template <class V>
  void for_each_parameter(V&& visit) {
    for (auto& p : params) visit(*p);
  }
};

TEST(GradBuffer, LayoutReversesOrderAlignsStartsAndPadsBucketsToDpShards) {
  Flat m({100, 7, 300, 50});
  m.params[2]->grad[5] = 3.5f;  // an existing gradient moves into the buffer
  cpu::backend device;
  GradBuffer<float> buffer(device, m, GradBufferOptions{.bucket_size = 256, .dp = 4, .alignment = 64});
  // reverse order: p3 (50) at 0, p2 (300) at 64 -> 364 >= 256 closes bucket 0 at round_up(364, 4 x 64) = 512;
  // p1 (7) at 512, p0 (100) at round_up(519, 64) = 576 -> 676, the last bucket padded to 768.
  const auto& e = buffer.entries();
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0].param, m.params[3].get());
  EXPECT_EQ(e[0].offset, 0);
  EXPECT_EQ(e[1].offset, 64);
  EXPECT_EQ(e[2].offset, 512);
  EXPECT_EQ(e[3].offset, 576);
  ASSERT_EQ(buffer.buckets().size(), 2u);
  EXPECT_EQ(buffer.buckets()[0].offset, 0);
  EXPECT_EQ(buffer.buckets()[0].numel, 512);
  EXPECT_EQ(buffer.buckets()[0].used, 364);
  EXPECT_EQ(buffer.buckets()[1].offset, 512);
  EXPECT_EQ(buffer.buckets()[1].numel, 256);
  EXPECT_EQ(buffer.size(), 768);
  for (std::size_t b = 0; b < 2; ++b) {
    EXPECT_EQ(buffer.buckets()[b].numel % (4 * 64), 0);
    EXPECT_EQ(buffer.shard_size(b) % 64, 0);
  }
  for (const auto& entry : e) EXPECT_EQ(entry.param->grad.data(), buffer.grads().data() + entry.offset) << entry.param->name;
  EXPECT_EQ(m.params[2]->grad[5], 3.5f);
  EXPECT_EQ(m.params[1]->value[3], 1003.f);  // values stay where they were without param_buffer
  // zero() clears every gradient at once
  buffer.zero(device);
  EXPECT_EQ(m.params[2]->grad[5], 0.f);
  // bucket_size 0: one bucket
  Flat one({100, 7});
  GradBuffer<float> single(device, one, GradBufferOptions{.bucket_size = 0, .dp = 3, .alignment = 64});
  ASSERT_EQ(single.buckets().size(), 1u);
  EXPECT_EQ(single.buckets()[0].numel, 192);  // 64 + 100 = 164 -> a multiple of 3 x 64
}

TEST(GradBuffer, ParamBufferHoldsTheValuesAndTheParametersViewIt) {
  Flat m({10, 20});
  cpu::backend device;
  GradBuffer<float> buffer(device, m,
                           GradBufferOptions{.bucket_size = 0, .dp = 2, .distributed = true, .param_buffer = true});
  for (const auto& entry : buffer.entries()) {
    EXPECT_EQ(entry.param->value.data(), buffer.params().data() + entry.offset);
  }
  EXPECT_EQ(m.params[0]->value[9], 9.f);
  EXPECT_EQ(m.params[1]->value[0], 1000.f);
  EXPECT_THROW(GradBuffer<float>(device, m, GradBufferOptions{.distributed = true}), ConfigError);
}

// dp = 4 ranks: rank r's gradient element i of parameter k is (r + 1) * (i + 1) + k. The bucketed
// all-reduce equals the per-parameter all-reduce bit for bit; the reduce-scatter leaves the same
// sums in each rank's shard.
TEST(GradBuffer, BucketedReductionEqualsPerParameterSums) {
  const std::vector<index_t> sizes{33, 70, 5, 129, 64};
  for (bool distributed : {false, true}) {
    inprocess::run(4, [&](inprocess::communicator& dp) {
      cpu::backend device;
      Flat reference(sizes), m(sizes);
      for (Flat* f : {&reference, &m})
        for (std::size_t k = 0; k < sizes.size(); ++k)
          for (index_t i = 0; i < sizes[k]; ++i)
            f->params[k]->grad[i] = static_cast<float>((dp.rank() + 1) * (i + 1)) * 0.37f + static_cast<float>(k);
      all_reduce_gradients(dp, reference);
      GradBuffer<float> buffer(device, m,
                               GradBufferOptions{.bucket_size = 100, .dp = 4, .alignment = 8, .distributed = distributed,
                                                 .param_buffer = distributed});
      EXPECT_GT(buffer.buckets().size(), 1u);
      buffer.finish_reduction(device, dp);
      for (const auto& e : buffer.entries()) {
        const Parameter<float>& ref = *reference.params[static_cast<std::size_t>(
            std::find_if(m.params.begin(), m.params.end(), [&](auto& p) { return p.get() == e.param; }) - m.params.begin())];
        const index_t first = distributed ? buffer.shard_begin(e.bucket, dp.rank()) : 0;
        const index_t last = distributed ? first + buffer.shard_size(e.bucket) : buffer.size();
        for (index_t i = 0; i < e.numel; ++i) {
          if (e.offset + i < first || e.offset + i >= last) continue;  // another rank's shard
          EXPECT_EQ(e.param->grad[i], ref.grad[i]) << e.param->name << "[" << i << "] distributed=" << distributed;
        }
      }
    });
  }
}

// A bucket's collective starts when its last parameter is reported ready, not before, and buckets
// start in order.
TEST(GradBuffer, MarkReadyStartsEachBucketWhenItsParametersAreDone) {
  inprocess::run(2, [&](inprocess::communicator& dp) {
    cpu::backend device;
    Flat m({64, 64, 64});  // reverse order: p2, p1 | p0 with bucket_size 128
    for (auto& p : m.params) p->grad.fill(1.f);
    GradBuffer<float> buffer(device, m, GradBufferOptions{.bucket_size = 128, .dp = 2, .alignment = 64});
    ASSERT_EQ(buffer.buckets().size(), 2u);
    buffer.mark_ready(device, dp, *m.params[2]);
    EXPECT_EQ(m.params[2]->grad[0], 1.f);  // bucket 0 still waits for p1
    buffer.mark_ready(device, dp, *m.params[0]);
    EXPECT_EQ(m.params[0]->grad[0], 1.f);  // bucket 1 is complete but waits for bucket 0
    buffer.mark_ready(device, dp, *m.params[1]);
    EXPECT_EQ(m.params[2]->grad[0], 2.f);  // both reduced, in order
    EXPECT_EQ(m.params[0]->grad[0], 2.f);
    EXPECT_THROW(buffer.mark_ready(device, dp, *m.params[1]), Error);
    buffer.zero(device);
    buffer.finish_reduction(device, dp);
    EXPECT_EQ(m.params[1]->grad[0], 0.f);
  });
}

// zero(device, true) fills everything but the gradients marked grad_first_write, which it marks
// stale and leaves as they were; a stale gradient nobody wrote reads zero once its bucket is
// reduced; zero(device) fills everything again.
TEST(GradBuffer, ZeroByFirstWriteLeavesMarkedGradientsStaleAndSettlesThemAtTheReduction) {
  inprocess::run(2, [&](inprocess::communicator& dp) {
    cpu::backend device;
    Flat m({64, 10, 64, 7});
    m.params[0]->grad_first_write = m.params[2]->grad_first_write = true;
    GradBuffer<float> buffer(device, m, GradBufferOptions{.bucket_size = 70, .dp = 2, .alignment = 64});
    ASSERT_GT(buffer.buckets().size(), 1u);
    buffer.grads().fill(5.f);  // the last iteration's gradients, padding included
    buffer.zero(device, true);
    for (std::size_t k : {0u, 2u}) {
      EXPECT_TRUE(m.params[k]->grad_stale) << k;
      EXPECT_EQ(m.params[k]->grad[3], 5.f) << k;  // not filled
    }
    for (std::size_t k : {1u, 3u}) {
      EXPECT_FALSE(m.params[k]->grad_stale) << k;
      for (index_t i = 0; i < m.params[k]->grad.numel(); ++i) EXPECT_EQ(m.params[k]->grad[i], 0.f) << k;
    }
    // Everything outside the stale gradients (padding included) is zero.
    index_t outside = 0;
    for (index_t i = 0; i < buffer.size(); ++i) {
      bool stale = false;
      for (const auto& e : buffer.entries())
        stale = stale || (e.param->grad_stale && i >= e.offset && i < e.offset + e.numel);
      if (!stale) {
        ++outside;
        EXPECT_EQ(buffer.grads()[i], 0.f) << "element " << i;
      }
    }
    EXPECT_GT(outside, 17);
    // p2 written by its GEMM (stand-in: the flag cleared and a value stored), p0 never written.
    m.params[2]->grad_stale = false;
    m.params[2]->grad.fill(1.f);
    buffer.finish_reduction(device, dp);
    EXPECT_FALSE(m.params[0]->grad_stale);
    for (index_t i = 0; i < 64; ++i) {
      EXPECT_EQ(m.params[0]->grad[i], 0.f);
      EXPECT_EQ(m.params[2]->grad[i], 2.f);  // summed over the two ranks
    }
    buffer.grads().fill(5.f);
    buffer.zero(device, true);
    buffer.zero(device);  // a plain zero leaves nothing stale, whatever came before
    for (index_t i = 0; i < buffer.size(); ++i) EXPECT_EQ(buffer.grads()[i], 0.f);
    for (auto& p : m.params) EXPECT_FALSE(p->grad_stale);
  });
}

// The weight-gradient GEMM on a stale gradient writes dW (the stale values ignored) with the bits
// of adding dW to zeros, clears the flag, and adds from then on.
TEST(GradBuffer, WeightGradientOnAStaleGradientWritesWhatTheFillThenAddGives) {
  cpu::backend device;
  const index_t rows = 13, in = 9, out = 11;
  Parameter<float> stale("w", Shape{out, in}, ShardSpec::replicated()), filled("w", Shape{out, in}, ShardSpec::replicated());
  std::vector<float> x(static_cast<std::size_t>(rows * in)), dy(static_cast<std::size_t>(rows * out));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 1.3f;
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = std::cos(0.91f * static_cast<float>(i)) * 0.7f;
  stale.grad.fill(123.f);
  stale.grad_stale = true;
  filled.grad.fill(0.f);
  for (int call = 0; call < 2; ++call) {
    detail::linear_weight_gradient_rows(device, x.data(), dy.data(), rows, stale, static_cast<Parameter<float>*>(nullptr));
    detail::linear_weight_gradient_rows(device, x.data(), dy.data(), rows, filled, static_cast<Parameter<float>*>(nullptr));
    EXPECT_FALSE(stale.grad_stale);
    for (index_t i = 0; i < out * in; ++i) EXPECT_EQ(stale.grad[i], filled.grad[i]) << "call " << call << " element " << i;
  }
}

// The in-process communicator with the overlap interface recorded: overlapped_mark() counts up,
// and each join (up to a mark, or of everything) is logged. The operations themselves are the
// in-process ones, done when they return.
struct MarkingComm : inprocess::communicator {
  struct Log {
    std::uint64_t marks = 0;
    std::vector<std::uint64_t> joins;  // the mark of each join_overlapped(mark)
    int full_joins = 0;
  };
  std::shared_ptr<Log> log = std::make_shared<Log>();
  explicit MarkingComm(const inprocess::communicator& c) : inprocess::communicator(c) {}
  MarkingComm overlapped() const { return *this; }
  void join_overlapped() { ++log->full_joins; }
  std::uint64_t overlapped_mark() { return log->marks++; }
  void join_overlapped(std::uint64_t mark) { log->joins.push_back(mark); }
};

// An overlapped parameter all-gather marks each bucket's gather, the last bucket first; the
// forward's hook waits up to the mark of the bucket it needs, once, and never for a later one;
// wait_gathered() waits for the rest; a gather still pending is waited for before the next one.
TEST(GradBuffer, OverlappedParameterGatherIsWaitedForBucketByBucket) {
  inprocess::run(2, [&](inprocess::communicator& world) {
    cpu::backend device;
    MarkingComm dp(world);
    Flat m({64, 64, 64});  // one bucket each: bucket 0 = p2, bucket 1 = p1, bucket 2 = p0
    GradBuffer<float> buffer(device, m,
                             GradBufferOptions{.bucket_size = 64, .dp = 2, .alignment = 32, .distributed = true, .param_buffer = true});
    ASSERT_EQ(buffer.buckets().size(), 3u);
    for (std::size_t b = 0; b < 3; ++b)  // this rank's shard of every bucket: its rank + 1
      std::fill_n(buffer.params().data() + buffer.shard_begin(b, dp.rank()), buffer.shard_size(b), float(dp.rank() + 1));
    buffer.all_gather_parameters(dp, /*overlapped=*/true);
    EXPECT_EQ(dp.log->marks, 3u);  // one mark per bucket
    EXPECT_TRUE(buffer.gather_pending());
    EXPECT_EQ(buffer.gathers_waited(), 0u);
    EXPECT_EQ(m.params[1]->value[0], 1.f);  // gathered: rank 0's shard first, then rank 1's
    EXPECT_EQ(m.params[1]->value[63], 2.f);
    const auto needed = buffer.needed_hook(dp);
    needed(*m.params[0]);  // bucket 2, gathered first: its mark is 0
    EXPECT_EQ(dp.log->joins, (std::vector<std::uint64_t>{0}));
    EXPECT_EQ(buffer.gathers_waited(), 1u);
    needed(*m.params[0]);  // waited already
    EXPECT_EQ(dp.log->joins.size(), 1u);
    needed(*m.params[2]);  // bucket 0, gathered last: mark 2 (bucket 1's gather ends before it)
    EXPECT_EQ(dp.log->joins, (std::vector<std::uint64_t>{0, 2}));
    EXPECT_FALSE(buffer.gather_pending());
    needed(*m.params[1]);
    EXPECT_EQ(dp.log->joins.size(), 2u);
    buffer.all_gather_parameters(dp, true);  // marks 3, 4, 5
    buffer.wait_gathered(dp);
    EXPECT_EQ(dp.log->joins.back(), 5u);
    EXPECT_FALSE(buffer.gather_pending());
    buffer.all_gather_parameters(dp, true);  // marks 6, 7, 8, never waited for ...
    buffer.all_gather_parameters(dp, true);  // ... so the next gather waits for mark 8 before writing
    EXPECT_EQ(dp.log->joins.back(), 8u);
    EXPECT_EQ(dp.log->marks, 12u);
    buffer.wait_gathered(dp);
    buffer.all_gather_parameters(dp, false);  // on the compute stream: no marks, nothing pending
    EXPECT_EQ(dp.log->marks, 12u);
    EXPECT_FALSE(buffer.gather_pending());
    EXPECT_EQ(dp.log->full_joins, 0);
  });
}

// The FP8 parameter gather's layout: the weights an FP8 layer casts (Parameter::fp8) fill buckets
// of their own, two buckets open at a time and each placed when closed; every bucket holds one kind;
// the code buckets' codes lie in a buffer of their own laid out as the bucket, and each FP8 weight's
// state points at its codes. The gather moves a code bucket's codes and leaves its values alone
// outside the rank's shard, until gather_values() gathers them too.
TEST(GradBuffer, Fp8ParameterGatherPutsFp8WeightsInCodeBuckets) {
  inprocess::run(2, [&](inprocess::communicator& dp) {
    cpu::backend device;
    Flat m({100, 7, 300, 50, 40});
    Fp8State<space::host> s0, s2;
    m.params[0]->fp8 = &s0;
    m.params[2]->fp8 = &s2;
    GradBuffer<float> buffer(device, m,
                             GradBufferOptions{.bucket_size = 256, .dp = 2, .alignment = 64, .distributed = true,
                                               .param_buffer = true, .fp8_param_gather = true});
    // reverse order p4 p3 p2 p1 p0; p2 (300) closes the FP8 stream's first bucket; at the end the
    // plain stream (last parameter p1) closes before the FP8 one (p0)
    const auto& b = buffer.buckets();
    ASSERT_EQ(b.size(), 3u);
    EXPECT_TRUE(b[0].codes);
    EXPECT_FALSE(b[1].codes);
    EXPECT_TRUE(b[2].codes);
    EXPECT_EQ(b[0].offset, 0);
    EXPECT_EQ(b[0].numel, 384);  // 300 padded to 2 x 64
    EXPECT_EQ(b[1].offset, 384);
    EXPECT_EQ(b[1].numel, 256);  // p4 at 0, p3 at 64, p1 at 128: 135
    EXPECT_EQ(b[2].offset, 640);
    EXPECT_EQ(b[2].numel, 128);
    EXPECT_EQ(b[0].code_offset, 0);
    EXPECT_EQ(b[2].code_offset, 384);
    EXPECT_EQ(buffer.codes().numel(), 512);
    EXPECT_EQ(buffer.size(), 768);
    for (const auto& e : buffer.entries()) EXPECT_EQ(b[e.bucket].codes, e.param->fp8 != nullptr) << e.param->name;
    EXPECT_EQ(m.params[2]->value.data(), buffer.params().data() + 0);
    EXPECT_EQ(m.params[4]->value.data(), buffer.params().data() + 384);
    EXPECT_EQ(m.params[1]->value.data(), buffer.params().data() + 512);
    EXPECT_EQ(m.params[0]->value.data(), buffer.params().data() + 640);
    EXPECT_EQ(s2.gathered_codes, buffer.codes().data());
    EXPECT_EQ(s0.gathered_codes, buffer.codes().data() + 384);
    EXPECT_EQ(m.params[1]->value[3], 1003.f);
    // each rank's shards: codes rank + 1, values 10 x (rank + 1)
    for (std::size_t k = 0; k < b.size(); ++k) {
      std::fill_n(buffer.params().data() + buffer.shard_begin(k, dp.rank()), buffer.shard_size(k), 10.f * (dp.rank() + 1));
      if (b[k].codes)
        std::fill_n(buffer.codes().data() + b[k].code_offset + dp.rank() * buffer.shard_size(k), buffer.shard_size(k),
                    std::uint8_t(dp.rank() + 1));
    }
    buffer.all_gather_parameters(dp);
    const float other = 10.f * (2 - dp.rank());  // the other rank's values
    EXPECT_EQ(m.params[4]->value[0], 10.f);  // a plain bucket: values gathered (384.. rank 0's shard, 512.. rank 1's)
    EXPECT_EQ(m.params[1]->value[0], 20.f);
    EXPECT_EQ(m.params[1]->value[6], 20.f);
    EXPECT_EQ(s2.gathered_codes[0], 1);      // a code bucket: codes gathered
    EXPECT_EQ(s2.gathered_codes[299], 2);
    EXPECT_EQ(s0.gathered_codes[0], 1);
    EXPECT_EQ(s0.gathered_codes[99], 2);
    const float mine = 10.f * (dp.rank() + 1);
    EXPECT_EQ(m.params[2]->value[dp.rank() == 0 ? 0 : 299], mine);  // its own shard
    EXPECT_NE(m.params[2]->value[dp.rank() == 0 ? 299 : 0], other);  // not gathered
    EXPECT_TRUE(buffer.values_stale());
    buffer.gather_values(dp);
    EXPECT_FALSE(buffer.values_stale());
    EXPECT_EQ(m.params[2]->value[0], 10.f);
    EXPECT_EQ(m.params[2]->value[299], 20.f);
    // without the option, FP8 weights are laid out as any other
    Flat plain({100, 7, 300, 50, 40});
    plain.params[0]->fp8 = &s0;
    GradBuffer<float> mixed(device, plain, GradBufferOptions{.bucket_size = 256, .dp = 2, .alignment = 64,
                                                             .distributed = true, .param_buffer = true});
    EXPECT_FALSE(mixed.has_codes());
    EXPECT_EQ(mixed.entries()[1].offset, 64);
    EXPECT_THROW(GradBuffer<float>(device, plain, GradBufferOptions{.dp = 2, .fp8_param_gather = true}), ConfigError);
  });
}

// The distributed optimizer updates exactly as AdamW on the all-reduced gradients (the same math
// element by element), and its gradient norm equals the unsharded one to rounding.
TEST(DistributedOptimizer, StepEqualsAdamWOnAllReducedGradients) {
  const std::vector<index_t> sizes{33, 70, 5, 129};
  for (int dp_size : {2, 4}) {
    inprocess::run(dp_size, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.dp = dp_size});
      Flat reference(sizes), m(sizes);
      reference.params[1]->weight_decay = m.params[1]->weight_decay = false;
      AdamWConfig config{0.9, 0.95, 1e-8, 0.1};
      AdamW<float> adamw(ctx.device, reference, config);
      GradBuffer<float> buffer(ctx.device, m,
                               GradBufferOptions{.bucket_size = 96, .dp = dp_size, .alignment = 4, .distributed = true,
                                                 .param_buffer = true});
      DistributedOptimizer<float> sharded(ctx.device, buffer, ctx.dp.rank(), config);
      for (int step = 0; step < 3; ++step) {
        zero_gradients(ctx.device, reference);
        buffer.zero(ctx.device);
        for (Flat* f : {&reference, &m})
          for (std::size_t k = 0; k < sizes.size(); ++k)
            for (index_t i = 0; i < sizes[k]; ++i)
              f->params[k]->grad[i] =
                  std::sin(static_cast<float>((world.rank() + 1) * (i + 3) + step)) * static_cast<float>(k + 1);
        all_reduce_gradients(ctx.dp, reference);
        buffer.finish_reduction(ctx.device, ctx.dp);
        const double expected_norm = global_grad_norm(ctx, reference);
        const double norm = std::sqrt(to_host(sharded.global_grad_square_sum(ctx, ctx.dp))[0]);
        EXPECT_NEAR(norm, expected_norm, 1e-6 * expected_norm);
        adamw.step(reference, 1e-2);
        sharded.step(ctx.device, ctx.dp, 1e-2);
      }
      for (std::size_t k = 0; k < sizes.size(); ++k)
        for (index_t i = 0; i < sizes[k]; ++i)
          ASSERT_EQ(m.params[k]->value[i], reference.params[k]->value[i]) << "p" << k << "[" << i << "] dp=" << dp_size;
      // 12 bytes per owned element: the state is 1/dp of AdamW's (plus padding)
      EXPECT_EQ(sharded.state_bytes(), 12 * buffer.size() / dp_size);
    });
  }
}

TEST(LossScaler, InfSkipsTheStepAndBacksOffAfterHysteresis) {
  LossScalerConfig c;
  c.initial_scale = 1024;
  c.hysteresis = 2;
  c.growth_interval = 3;
  c.min_scale = 256;
  LossScaler s(c);
  EXPECT_TRUE(s.update(true));  // skipped; hysteresis 2 -> 1, scale kept
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(true));  // second overflow: backs off
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 256);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 256);  // never below min_scale
}

TEST(LossScaler, GrowsAfterTheWindowOfCleanIterations) {
  LossScalerConfig c;
  c.initial_scale = 8;
  c.growth_interval = 3;
  c.hysteresis = 1;
  LossScaler s(c);
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 8);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 16);  // after 3 clean iterations
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 8);   // hysteresis 1: at once
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 8);   // an overflow restarts the window
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 16);
  LossScaler fixed = LossScaler::constant(128);
  EXPECT_TRUE(fixed.update(true));
  EXPECT_EQ(fixed.scale(), 128);
  c.backoff_factor = 1.5;
  EXPECT_THROW(LossScaler{c}, ConfigError);
}

}  // namespace
}  // namespace test_grad_buffer_cases
