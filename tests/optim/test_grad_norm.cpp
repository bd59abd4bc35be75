// Gradient utilities across ranks: the global norm of a tensor-parallel model equals the unsharded
// model's (sharded weights counted on every rank, replicated biases once), clipping, the
// data-parallel sum, and AdamW + clipping + schedule at tp=2 following the tp=1 trajectory.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <mutex>
#include <string>
#include <vector>

#include <strata/optim.hpp>
#include <strata/policy.hpp>

#include "../common/equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_grad_norm_cases {

namespace {

using namespace strata;
using Comm = inprocess::communicator;
using Context = ParallelContext<Comm>;

struct Policy : default_policy {
  using element = double;
};

constexpr index_t kRows = 4, kIn = 6, kHidden = 8, kOut = 4;

Tensor<double> random_tensor(Shape shape, std::uint64_t key, double scale = 1.0) {
  Tensor<double> t(shape);
  for (index_t i = 0; i < t.numel(); ++i) t[i] = scale * rng::normal(key, static_cast<std::uint64_t>(i));
  return t;
}

// Column -> Row, the pair every tensor-parallel MLP is made of: the column layer's weight and bias
// are sharded, the row layer's weight is sharded and its bias replicated.
struct TwoLayer {
  ColumnParallelLinear<Policy> fc1;
  RowParallelLinear<Policy> fc2;

  explicit TwoLayer(Context& ctx) : fc1(ctx, "fc1", kIn, kHidden), fc2(ctx, "fc2", kHidden, kOut) {
    fc1.init(ctx, 11, 0.5);
    fc2.init(ctx, 11, 0.5);
    init_normal(ctx.device, *fc1.bias(), 12, 0.1);
    init_normal(ctx.device, *fc2.bias(), 13, 0.1);
  }
  template <class V>
  void for_each_parameter(V&& visit) {
    fc1.for_each_parameter(visit);
    fc2.for_each_parameter(visit);
  }
  // loss = 0.5 * ||y - target||^2 on the batch of `step`; accumulates gradients, returns the loss.
  double forward_backward(Context& ctx, int step) {
    Activation<double, layout::replicated> x(random_tensor(Shape{kRows, kIn}, 100 + static_cast<std::uint64_t>(step)));
    const Tensor<double> target = random_tensor(Shape{kRows, kOut}, 200 + static_cast<std::uint64_t>(step));
    auto [h, s1] = fc1.forward(ctx, x);
    auto [y, s2] = fc2.forward(ctx, h);
    Tensor<double> dy(y.shape());
    double loss = 0;
    for (index_t i = 0; i < dy.numel(); ++i) {
      dy[i] = y.tensor[i] - target[i];
      loss += 0.5 * dy[i] * dy[i];
    }
    fc1.backward(ctx, s1, fc2.backward(ctx, s2, Activation<double, layout::replicated>(std::move(dy))));
    return loss;
  }
};

double direct_norm(TwoLayer& model) {
  double sum = 0;
  model.for_each_parameter([&](auto& p) {
    for (double g : p.grad.span()) sum += g * g;
  });
  return std::sqrt(sum);
}

TEST(GradNorm, TensorParallelEqualsUnsharded) {
  double reference = 0;
  inprocess::run(1, [&](Comm& world) {
    auto ctx = Context::single(world);
    TwoLayer model(ctx);
    model.forward_backward(ctx, 0);
    reference = global_grad_norm(ctx, model);
    EXPECT_EQ(reference, direct_norm(model));
  });
  ASSERT_GT(reference, 0);
  for (int tp : {2, 4}) {
    inprocess::run(tp, [&](Comm& world) {
      auto ctx = Context::create(world, ParallelConfig{.tp = tp});
      TwoLayer model(ctx);
      model.forward_backward(ctx, 0);
      const double norm = global_grad_norm(ctx, model);
      EXPECT_NEAR(norm, reference, 1e-12 * reference) << "tp=" << tp;
      // Counting the replicated bias on every rank would be wrong: check it differs.
      EXPECT_GT(local_grad_square_sum(model, 0), local_grad_square_sum(model, 1));
    });
  }
}

TEST(GradNorm, ClippingScalesToMaxNorm) {
  strata_test::Snapshot clipped_reference;
  std::mutex mutex;
  double reference_norm = 0;
  for (int tp : {1, 2}) {
    strata_test::Snapshot snapshot;
    inprocess::run(tp, [&](Comm& world) {
      auto ctx = Context::create(world, ParallelConfig{.tp = tp});
      TwoLayer model(ctx);
      model.forward_backward(ctx, 1);
      const double norm = global_grad_norm(ctx, model);
      // Disabled (max_norm <= 0) and not needed (max_norm above the norm): nothing changes.
      EXPECT_EQ(clip_grad_norm(ctx, model, 0.0), norm);
      EXPECT_EQ(clip_grad_norm(ctx, model, 2 * norm), norm);
      EXPECT_EQ(global_grad_norm(ctx, model), norm);
      const double max_norm = norm / 4;
      EXPECT_EQ(clip_grad_norm(ctx, model, max_norm), norm);
      EXPECT_NEAR(global_grad_norm(ctx, model), max_norm * norm / (norm + 1e-6), 1e-12 * norm);
      if (world.rank() == 0) reference_norm = norm;
      strata_test::gather_parameters(ctx, model, snapshot, mutex);
    });
    if (tp == 1) clipped_reference = snapshot;
    else strata_test::expect_equivalent(snapshot, clipped_reference, 1e-12, "clipped gradients at tp=2");
  }
  EXPECT_GT(reference_norm, 0);
}

struct Stage {
  Parameter<double> sharded, replicated;
  template <class V>
  void for_each_parameter(V&& visit) {
    visit(sharded);
    visit(replicated);
  }
};

TEST(GradNorm, ReducesOverTensorAndPipelineGroups) {
  // tp=2 x pp=2: each stage holds other parameters (one sharded, one replicated); the norm covers
  // both stages and counts each replicated parameter once.
  double expected = 0;
  for (int stage = 0; stage < 2; ++stage) {
    for (int i = 0; i < 8; ++i) expected += (stage + 1.0) * (stage + 1.0) * (i + 1.0) * (i + 1.0);  // sharded, global
    expected += 3 * (stage + 2.0) * (stage + 2.0);                                                 // replicated
  }
  expected = std::sqrt(expected);
  std::vector<double> norms = inprocess::run_and_collect(4, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2, .pp = 2});
    const int stage = ctx.coords.pp, r = ctx.tp.rank();
    Stage s{Parameter<double>("stage" + std::to_string(stage) + ".w", Shape{8}, ShardSpec::split(0, r, 2)),
            Parameter<double>("stage" + std::to_string(stage) + ".b", Shape{3}, ShardSpec::replicated())};
    for (index_t i = 0; i < 4; ++i) s.sharded.grad[i] = (stage + 1.0) * static_cast<double>(global_index(Shape{8}, s.sharded.shard, i, r) + 1);
    s.replicated.grad.fill(stage + 2.0);
    return global_grad_norm(ctx, s);
  });
  for (double n : norms) EXPECT_NEAR(n, expected, 1e-13 * expected);
}

TEST(GradUtils, AllReduceSumsOverDataParallelAndZeroClears) {
  inprocess::run(4, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2, .dp = 2});
    TwoLayer model(ctx);
    model.for_each_parameter([&](auto& p) { p.grad.fill(ctx.coords.dp + 1.0); });
    all_reduce_gradients(ctx.dp, model);
    model.for_each_parameter([&](auto& p) {
      for (double g : p.grad.span()) EXPECT_EQ(g, 3.0);
    });
    // Different values per rank (1 and 5), so a no-op (1 or 5) or a sum (6) cannot pass for the mean (3).
    model.for_each_parameter([&](auto& p) { p.grad.fill(ctx.coords.dp == 0 ? 1.0 : 5.0); });
    all_reduce_gradients(ctx.dp, model, ReduceOp::avg);
    model.for_each_parameter([&](auto& p) {
      for (double g : p.grad.span()) EXPECT_EQ(g, 3.0);
    });
    scale_gradients(model, 0.5);
    model.for_each_parameter([&](auto& p) {
      for (double g : p.grad.span()) EXPECT_EQ(g, 1.5);
    });
    zero_gradients(model);
    model.for_each_parameter([&](auto& p) {
      for (double g : p.grad.span()) EXPECT_EQ(g, 0.0);
    });
  });
}

// A module whose gradients mix float and double (runs float, float | double | float, float | double,
// with empty tensors and replicated parameters in between), and two backends: the CPU one with the
// multi-tensor forms and one that has only the one-tensor calls. Both count their calls.
Tensor<float> as_float(const Tensor<double>& t) {
  Tensor<float> out(t.shape());
  for (index_t i = 0; i < t.numel(); ++i) out[i] = static_cast<float>(t[i]);
  return out;
}
template <class G>
struct MixedParameter {
  Tensor<G> grad;
  bool sharded;
  bool tensor_parallel() const { return sharded; }
};
struct MixedModule {
  MixedParameter<float> a{as_float(random_tensor(Shape{100}, 1)), true};
  MixedParameter<float> b{Tensor<float>(Shape{0}), false};
  MixedParameter<float> c{as_float(random_tensor(Shape{7}, 2)), false};
  MixedParameter<double> d{random_tensor(Shape{33}, 3), true};
  MixedParameter<float> e{as_float(random_tensor(Shape{1000}, 4)), true};
  MixedParameter<float> f{as_float(random_tensor(Shape{5}, 5)), false};
  MixedParameter<double> g{random_tensor(Shape{1}, 6), false};
  template <class V>
  void for_each_parameter(V&& visit) {
    visit(a), visit(b), visit(c), visit(d), visit(e), visit(f), visit(g);
  }
};
struct OneByOneBackend {
  int calls = 0;
  template <class X>
  void fill(X* x, index_t n, double value) { ++calls, cpu::backend::fill<X>(x, n, value); }
  template <class X>
  void sum_of_squares(const X* x, index_t n, double* accumulator) { ++calls, cpu::backend::sum_of_squares<X>(x, n, accumulator); }
  template <class X>
  void scale_by(X* x, index_t n, const double* factor) { ++calls, cpu::backend::scale_by<X>(x, n, factor); }
};
struct ManyBackend : OneByOneBackend {
  template <class X>
  void sum_of_squares_many(std::span<const SquaresTensor<X>> list, double* accumulator) { ++calls, cpu::backend::sum_of_squares_many<X>(list, accumulator); }
  template <class X>
  void scale_by_many(std::span<const TensorRef<X>> list, const double* factor) { ++calls, cpu::backend::scale_by_many<X>(list, factor); }
  template <class X>
  void fill_many(std::span<const TensorRef<X>> list, double value) { ++calls, cpu::backend::fill_many<X>(list, value); }
};
static_assert(!has_sum_of_squares_many<OneByOneBackend, float> && has_sum_of_squares_many<ManyBackend, float> &&
                  has_scale_by_many<cpu::backend, double> && has_fill_many<cpu::backend, float>,
              "The multi-tensor forms are detected on the backends that have them and only there.");

TEST(GradUtils, MultiTensorFormsGiveTheSameBitsInFewerCalls) {
  for (int tp_rank : {0, 1}) {
    MixedModule one, many;
    OneByOneBackend plain;
    ManyBackend batched;
    double sum_one = 0.5, sum_many = 0.5;
    accumulate_grad_squares(plain, one, tp_rank, &sum_one);
    accumulate_grad_squares(batched, many, tp_rank, &sum_many);
    EXPECT_EQ(std::bit_cast<std::uint64_t>(sum_one), std::bit_cast<std::uint64_t>(sum_many)) << "tp rank " << tp_rank;
    // Counted on tp rank 0: every parameter (runs a b c | d | e f | g); on rank 1 the sharded ones (a | d | e).
    EXPECT_EQ(plain.calls, tp_rank == 0 ? 7 : 3);
    EXPECT_EQ(batched.calls, tp_rank == 0 ? 4 : 3);
    const double factor = 0.375;
    plain.calls = batched.calls = 0;
    scale_gradients_by(plain, one, &factor);
    scale_gradients_by(batched, many, &factor);
    EXPECT_EQ(plain.calls, 7);
    EXPECT_EQ(batched.calls, 4);
    auto bits = [](MixedModule& m) {
      std::vector<std::uint64_t> out;
      m.for_each_parameter([&](auto& p) {
        for (auto v : p.grad.span()) out.push_back(std::bit_cast<std::uint64_t>(static_cast<double>(v)));
      });
      return out;
    };
    EXPECT_EQ(bits(one), bits(many));
    zero_gradients(batched, many);
    for (auto v : bits(many)) EXPECT_EQ(v, 0u);
  }
}

// Trains `steps` steps on `tp` ranks: zero, forward/backward, clip, AdamW with a warmup + cosine
// schedule. Returns losses and gradient norms as outputs, final parameters gathered. clip_in_step:
// the clipping factor goes to the step (grad_scale) instead of scaling the gradients first.
strata_test::Snapshot train(int tp, int steps, bool clip_in_step = false) {
  strata_test::Snapshot snapshot;
  std::mutex mutex;
  const LrSchedule schedule{.max_lr = 0.05, .min_lr = 0.005, .warmup_iters = 2, .decay_iters = 6};
  inprocess::run(tp, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = tp});
    TwoLayer model(ctx);
    AdamW<double> optimizer(model, AdamWConfig{.weight_decay = 0.1});
    std::vector<double> losses, norms;
    for (int it = 0; it < steps; ++it) {
      zero_gradients(model);
      losses.push_back(model.forward_backward(ctx, it));
      if (clip_in_step) {
        const double before = direct_norm(model);
        auto [norm, factor] = clip_factor_device(ctx, model, 1.0);
        EXPECT_EQ(direct_norm(model), before) << "clip_factor_device must leave the gradients as they are";
        norms.push_back(norm[0]);
        optimizer.step(ctx.device, model, schedule.lr(it + 1), nullptr, -1, factor.data());
      } else {
        norms.push_back(clip_grad_norm(ctx, model, 1.0));
        optimizer.step(model, schedule.lr(it + 1));
      }
    }
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      snapshot.outputs = {losses, norms};
    }
    strata_test::gather_parameters(ctx, model, snapshot, mutex);
  });
  return snapshot;
}

// The clipping factor applied by the step as it reads each gradient gives the bits of clipping the
// gradients first (the trainers' path), at tp = 1 and 2, with the norm above max_norm on some steps.
TEST(AdamW, ClipFactorInTheStepGivesTheBitsOfClippingFirst) {
  for (int tp : {1, 2}) {
    const strata_test::Snapshot clipped_first = train(tp, 6), in_step = train(tp, 6, true);
    ASSERT_GT(*std::max_element(clipped_first.outputs[1].begin(), clipped_first.outputs[1].end()), 1.0)
        << "some step must clip";
    // The parameters and the losses and norms of every step: the same bits. (The gradients left after
    // the last step differ by design: clipped in place on one path, untouched on the other.)
    EXPECT_EQ(in_step.outputs, clipped_first.outputs) << "tp=" << tp;
    ASSERT_EQ(in_step.values.size(), clipped_first.values.size());
    for (const auto& [name, want] : clipped_first.values) EXPECT_EQ(in_step.values.at(name), want) << name << ", tp=" << tp;
  }
}

TEST(AdamW, TensorParallelFollowsUnshardedTrajectory) {
  const strata_test::Snapshot reference = train(1, 6);
  ASSERT_LT(reference.outputs[0].back(), reference.outputs[0].front()) << "the loss should go down";
  strata_test::expect_equivalent(train(2, 6), reference, 1e-10, "AdamW at tp=2");
}

}  // namespace
}  // namespace test_grad_norm_cases
