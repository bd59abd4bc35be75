// FP8 in ColumnParallelLinear -> RowParallelLinear (layers/fp8_linear.hpp): sharded runs (tp, sp)
// equal the single-rank FP8 run in every output and gathered gradient over several steps of both
// recipes (delayed, tensorwise, blockwise) and both formats; the forward is the GEMM of the rounded
// operands (per tensor, per block), and the backward's GEMMs those of each micro-batch's rounded
// operands; blocks that straddle shards are refused; delayed scaling's
// histories and scales follow Transformer Engine's update; unbuildable recipes are refused; an
// attention whose output projection holds the attention's output instead of its codes
// (recast_attention_output) is the attention that keeps the codes, bit for bit; an MLP activation's
// codes made in fc1's backward cast (activation_codes_in_backward) are those the forward would have
// kept, bit for bit, and a backward that finds them unallocated is refused; the MoE experts' six
// GEMMs in FP8 are those of each group's rounded operands.
#include <gtest/gtest.h>

#include <cmath>

#include <strata/layers/attention.hpp>
#include <strata/layers/fp8_linear.hpp>
#include <strata/layers/moe/experts.hpp>

#include "../common/equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_fp8_linear_cases {

namespace {

using namespace strata;
using strata_test::Snapshot;
using strata_test::random_tensor;
using Context = ParallelContext<inprocess::communicator>;

static_assert(backend_has_fp8<cpu::backend>, "the CPU backend has the FP8 entry points (backend/cpu/fp8.hpp)");

constexpr index_t kSeq = 12, kBatch = 2, kIn = 24, kHidden = 48, kOut = 20;
constexpr int kSteps = 3;

struct Fp8Case {
  bool fp8 = true;
  Fp8Options options{};
};

// How the block's middle runs: fc1 -> fc2 (none), fc1 -> GELU -> fc2 through forward_gelu_of and
// backward_gelu_of (fused: under the delayed recipe the GELU and its backward run inside the FP8
// casts), or the same with the GELU's own kernels between the layers (between); the same two for
// SwiGLU, fc1 then a stacked [gate; up] layer (swiglu_fused: forward_swiglu_of, backward_swiglu_of).
// The *_later ones are the fused ones with fc2's input^T codes left to fc1's backward cast (as Mlp does
// under Fp8Options::activation_codes_in_backward): fc2's weight gradient deferred until after it.
enum class Middle { none, fused, between, swiglu_fused, swiglu_between, fused_later, swiglu_fused_later };

// Column -> row on `tp` ranks for kSteps steps (new inputs each step; the scaling update after each
// step); the snapshot holds every step's output and input gradient and the final gradients.
template <class T, bool SP, Middle M = Middle::none>
Snapshot run_fp8_mlp(int tp, const Fp8Case& c) {
  using P = strata_test::TestPolicy<T, SP>;
  Snapshot snapshot;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = tp});
    if (c.fp8) ctx.fp8 = std::make_shared<Fp8Scaling<space::host>>(c.options, 1);
    std::optional<ColumnParallelLinear<P>> fc1;
    std::optional<RowParallelLinear<P>> fc2;
    {
      Fp8LayerScope<space::host> scope(ctx.fp8, 0);
      if constexpr (M == Middle::swiglu_fused || M == Middle::swiglu_between || M == Middle::swiglu_fused_later)
        fc1.emplace(ctx, "fc1", kIn, 2 * kHidden, true, 2);  // [gate; up], each stack split over tp
      else
        fc1.emplace(ctx, "fc1", kIn, kHidden);
      fc2.emplace(ctx, "fc2", kHidden, kOut);
    }
    EXPECT_EQ(fc1->fp8_state() != nullptr, c.fp8);
    fc1->init(ctx, 7, 0.5);
    fc2->init(ctx, 7, 0.5);
    init_normal(ctx.device, *fc1->bias(), 8, 0.1);
    init_normal(ctx.device, *fc2->bias(), 9, 0.1);
    for (int step = 0; step < kSteps; ++step) {
      Tensor<T> x_full = random_tensor<T>(Shape{kSeq, kBatch, kIn}, 100 + step);
      Tensor<T> dy_full = random_tensor<T>(Shape{kSeq, kBatch, kOut}, 200 + step);
      for (std::size_t i = 0; i < x_full.span().size(); ++i) x_full[i] = T(double(x_full[i]) * (1 + step));  // amax moves
      using In = typename ColumnParallelLinear<P>::input_layout;
      Activation<T, layout::replicated> x_rep(x_full), dy_rep(dy_full);
      Activation<T, In> x;
      Activation<T, typename RowParallelLinear<P>::output_layout> dy;
      if constexpr (SP) {
        x = scatter_to_sequence_parallel(ctx.tp, x_rep);
        dy = scatter_to_sequence_parallel(ctx.tp, dy_rep);
      } else {
        x = x_rep;
        dy = dy_rep;
      }
      auto [h, s1] = fc1->forward(ctx, x);
      Activation<T, typename ColumnParallelLinear<P>::input_layout> dx;
      Activation<T, typename RowParallelLinear<P>::output_layout> y;
      if constexpr (M == Middle::none) {
        auto [out, s2] = fc2->forward(ctx, h);
        y = std::move(out);
        dx = fc1->backward(ctx, s1, fc2->backward(ctx, s2, dy));
      } else if constexpr (M == Middle::fused) {
        auto [out, s2] = fc2->forward_gelu_of(ctx, h);
        y = std::move(out);
        dx = fc1->backward_gelu_of(ctx, s1, fc2->backward(ctx, s2, dy), h.tensor);
      } else if constexpr (M == Middle::swiglu_fused) {
        auto [out, s2] = fc2->forward_swiglu_of(ctx, h);
        y = std::move(out);
        dx = fc1->backward_swiglu_of(ctx, s1, fc2->backward(ctx, s2, dy), h.tensor);
      } else if constexpr (M == Middle::fused_later || M == Middle::swiglu_fused_later) {
        constexpr bool gelu = M == Middle::fused_later;
        auto [out, s2] = gelu ? fc2->forward_gelu_of(ctx, h, nullptr, true) : fc2->forward_swiglu_of(ctx, h, nullptr, true);
        y = std::move(out);
        // under the delayed recipe the forward keeps no codes of its input^T, nor the input
        const bool later = c.fp8 && c.options.recipe == Fp8RecipeKind::delayed;
        EXPECT_EQ(s2.fp8_input.codes_t_later, later);
        if (later) {
          EXPECT_TRUE(s2.fp8_input.empty() && s2.input.data() == nullptr);
        }
        const Fp8Output codes = fc2->fp8_input_codes_later(s2);
        EXPECT_EQ(codes.codes != nullptr, later);
        DeferredWeightGradients after;
        auto dact = fc2->backward(ctx, s2, dy, &after);
        dx = gelu ? fc1->backward_gelu_of(ctx, s1, dact, h.tensor, nullptr, codes)
                  : fc1->backward_swiglu_of(ctx, s1, dact, h.tensor, nullptr, codes);
        after.run();
      } else if constexpr (M == Middle::swiglu_between) {
        const index_t rows = h.shape().rows(), f = h.shape().cols() / 2;
        Activation<T, layout::sharded<-1>> act(Tensor<T>::empty(h.shape().with(-1, f))), dh(Tensor<T>::empty(h.shape()));
        ctx.device.template swiglu_forward<T>(h.data(), rows, f, act.data());
        auto [out, s2] = fc2->forward(ctx, act);
        y = std::move(out);
        auto dact = fc2->backward(ctx, s2, dy);
        ctx.device.template swiglu_backward<T>(dact.data(), h.data(), rows, f, dh.data());
        dx = fc1->backward(ctx, s1, dh);
      } else {
        Activation<T, layout::sharded<-1>> act(Tensor<T>::empty(h.shape())), dh(Tensor<T>::empty(h.shape()));
        ctx.device.template gelu_forward<T>(h.data(), h.tensor.numel(), act.data());
        auto [out, s2] = fc2->forward(ctx, act);
        y = std::move(out);
        auto dact = fc2->backward(ctx, s2, dy);
        ctx.device.template gelu_backward<T>(dact.data(), h.data(), h.tensor.numel(), dh.data());
        dx = fc1->backward(ctx, s1, dh);
      }
      fp8_after_optimizer_step(ctx);
      Tensor<T> y_full, dx_full;
      if constexpr (SP) {
        y_full = gather_from_sequence_parallel(ctx.tp, y).tensor;
        dx_full = gather_from_sequence_parallel(ctx.tp, dx).tensor;
      } else {
        y_full = y.tensor;
        dx_full = dx.tensor;
      }
      if (world.rank() == 0) {
        std::lock_guard lock(mutex);
        snapshot.outputs.push_back(strata_test::to_values(y_full));
        snapshot.outputs.push_back(strata_test::to_values(dx_full));
      }
    }
    if (c.fp8 && world.rank() == 0) {  // the scaling state, the same on every rank: compared too
      std::lock_guard lock(mutex);
      snapshot.outputs.push_back(strata_test::to_values(fc1->fp8_state()->rows));
      snapshot.outputs.push_back(strata_test::to_values(fc2->fp8_state()->rows));
    }
    strata_test::gather_parameters(ctx, *fc1, snapshot, mutex);
    strata_test::gather_parameters(ctx, *fc2, snapshot, mutex);
  });
  return snapshot;
}

std::vector<Fp8Case> cases() {
  std::vector<Fp8Case> out;
  for (Fp8Formats format : {Fp8Formats::e4m3, Fp8Formats::hybrid}) {
    out.push_back({true, Fp8Options{.format = format, .recipe = Fp8RecipeKind::tensorwise}});
    out.push_back({true, Fp8Options{.format = format, .recipe = Fp8RecipeKind::delayed, .margin = 1, .amax_history_len = 2,
                                    .amax_compute_algo = Fp8AmaxAlgo::max}});
    out.push_back({true, Fp8Options{.format = format, .recipe = Fp8RecipeKind::delayed}});
    // blocks of 4: hidden 48 over tp = 1..4 is whole blocks on every rank (12, 16, 24, 48)
    out.push_back({true, Fp8Options{.format = format, .recipe = Fp8RecipeKind::blockwise, .block = 4}});
  }
  return out;
}

std::string describe(const Fp8Case& c) {
  return std::string(fp8_formats_name(c.options.format)) + " " + std::string(fp8_recipe_name(c.options.recipe)) +
         " margin " + std::to_string(c.options.margin) + " history " + std::to_string(c.options.amax_history_len) +
         (c.options.recipe == Fp8RecipeKind::blockwise ? " block " + std::to_string(c.options.block) : "");
}

template <bool SP>
void check_sharded_equals_single() {
  for (const Fp8Case& c : cases()) {
    const Snapshot reference = run_fp8_mlp<double, false>(1, c);
    for (int tp : {1, 2, 3, 4}) {
      if (SP && kSeq % tp != 0) continue;
      strata_test::expect_equivalent(run_fp8_mlp<double, SP>(tp, c), reference, 1e-12,
                                     describe(c) + " tp=" + std::to_string(tp) + (SP ? " sequence parallel" : ""));
    }
  }
}

TEST(Fp8Linear, ShardedEqualsSingleRankDouble) { check_sharded_equals_single<false>(); }

TEST(Fp8Linear, SequenceParallelEqualsSingleRankDouble) { check_sharded_equals_single<true>(); }

// An activation between fc1 and fc2 made inside the FP8 casts (delayed: fc2's input cast computes it,
// fc1's output-gradient cast its backward, with the bias gradient's column sums) gives the bits of the
// activation's kernels run between the layers, for every recipe (the others run the kernels
// themselves), and the fused block sharded over tp (with and without sequence parallelism) equals its
// single-rank run.
// With fc2's input^T codes written by fc1's backward cast instead of kept from the forward
// (Later), the same bits again.
template <Middle Fused, Middle Between, Middle Later>
void check_activation_inside_the_casts(const std::string& name) {
  for (const Fp8Case& c : cases()) {
    const Snapshot between = run_fp8_mlp<double, false, Between>(1, c);
    strata_test::expect_equivalent(run_fp8_mlp<double, false, Fused>(1, c), between, 0.0, describe(c) + " " + name);
    strata_test::expect_equivalent(run_fp8_mlp<double, false, Later>(1, c), between, 0.0,
                                   describe(c) + " " + name + ", codes in the backward");
    for (int tp : {2, 3}) {
      strata_test::expect_equivalent(run_fp8_mlp<double, false, Fused>(tp, c), between, 1e-12,
                                     describe(c) + " " + name + " tp=" + std::to_string(tp));
      strata_test::expect_equivalent(run_fp8_mlp<double, true, Fused>(tp, c), between, 1e-12,
                                     describe(c) + " " + name + " tp=" + std::to_string(tp) + " sequence parallel");
      strata_test::expect_equivalent(run_fp8_mlp<double, true, Later>(tp, c), between, 1e-12,
                                     describe(c) + " " + name + ", codes in the backward, tp=" + std::to_string(tp) +
                                         " sequence parallel");
    }
    const Snapshot bf16_between = run_fp8_mlp<bf16, false, Between>(1, c);
    strata_test::expect_equivalent(run_fp8_mlp<bf16, false, Fused>(1, c), bf16_between, 0.0, describe(c) + " " + name + " bf16");
    strata_test::expect_equivalent(run_fp8_mlp<bf16, false, Later>(1, c), bf16_between, 0.0,
                                   describe(c) + " " + name + ", codes in the backward, bf16");
  }
}
// GELU: forward_gelu_of and backward_gelu_of.
TEST(Fp8Linear, GeluInsideTheCastsIsTheGeluBetweenTheLayers) {
  check_activation_inside_the_casts<Middle::fused, Middle::between, Middle::fused_later>("gelu fused");
}
// SwiGLU between a stacked [gate; up] fc1 and fc2 (forward_swiglu_of, backward_swiglu_of; each rank
// holds its gate and up slices).
TEST(Fp8Linear, SwigluInsideTheCastsIsTheSwigluBetweenTheLayers) {
  check_activation_inside_the_casts<Middle::swiglu_fused, Middle::swiglu_between, Middle::swiglu_fused_later>("swiglu fused");
}

// A forward that left its input^T's codes for later, whose backward finds them not allocated, stops
// with a sentence naming the layer (nothing reads unwritten codes).
TEST(Fp8Linear, CodesLeftForLaterAndNeverAllocatedAreRefused) {
  using P = strata_test::TestPolicy<double, false>;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = Context::create(world, ParallelConfig{});
    ctx.fp8 = std::make_shared<Fp8Scaling<space::host>>(Fp8Options{.recipe = Fp8RecipeKind::delayed}, 1);
    std::optional<ColumnParallelLinear<P>> fc1;
    std::optional<RowParallelLinear<P>> fc2;
    {
      Fp8LayerScope<space::host> scope(ctx.fp8, 0);
      fc1.emplace(ctx, "fc1", kIn, kHidden);
      fc2.emplace(ctx, "fc2", kHidden, kOut);
    }
    fc1->init(ctx, 7, 0.5);
    fc2->init(ctx, 7, 0.5);
    Activation<double, typename ColumnParallelLinear<P>::input_layout> x =
        Activation<double, layout::replicated>(random_tensor<double>(Shape{kSeq, kBatch, kIn}, 1));
    Activation<double, typename RowParallelLinear<P>::output_layout> dy =
        Activation<double, layout::replicated>(random_tensor<double>(Shape{kSeq, kBatch, kOut}, 2));
    auto [h, s1] = fc1->forward(ctx, x);
    auto [y, s2] = fc2->forward_gelu_of(ctx, h, nullptr, true);
    ASSERT_TRUE(s2.fp8_input.codes_t_later);
    try {
      (void)fc2->backward(ctx, s2, dy);
      ADD_FAILURE() << "a backward without the codes left for later ran";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("fc2"), std::string::npos) << message;
      EXPECT_NE(message.find("fp8_input_codes_later"), std::string::npos) << message;
    }
  });
}

// FP8 is in effect: the outputs move away from the element-type run by FP8's rounding, not more.
TEST(Fp8Linear, DiffersFromTheElementTypeRunByFp8Rounding) {
  const Snapshot plain = run_fp8_mlp<double, false>(1, Fp8Case{false, {}});
  for (const Fp8Case& c : cases()) {
    const Snapshot fp8 = run_fp8_mlp<double, false>(1, c);
    for (std::size_t i = 0; i < plain.outputs.size(); ++i) {
      const double error = strata_test::relative_error(fp8.outputs[i], plain.outputs[i]);
      EXPECT_GT(error, 1e-3) << describe(c) << " output " << i;
      EXPECT_LT(error, 0.25) << describe(c) << " output " << i;
    }
  }
}

// One rank, tensorwise: y = dequantized(x) dequantized(W)^T + b, computed here from fp8_encode.
TEST(Fp8Linear, TensorwiseForwardIsTheGemmOfTheRoundedOperands) {
  using P = strata_test::TestPolicy<double, false>;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = Context::create(world, ParallelConfig{});
    ctx.fp8 = std::make_shared<Fp8Scaling<space::host>>(Fp8Options{.recipe = Fp8RecipeKind::tensorwise}, 1);
    Fp8LayerScope<space::host> scope(ctx.fp8, 0);
    ColumnParallelLinear<P> fc(ctx, "fc", kIn, kOut);
    fc.init(ctx, 3, 0.5);
    init_normal(ctx.device, *fc.bias(), 4, 0.1);
    Tensor<double> x = random_tensor<double>(Shape{kSeq, kIn}, 5);
    auto [y, saved] = fc.forward(ctx, Activation<double, layout::replicated>(x));
    auto quantized = [](const Tensor<double>& t) {
      float amax = 0;
      for (double v : t.span()) amax = std::max(amax, std::fabs(static_cast<float>(v)));
      const float scale = 448.0f / amax;
      std::vector<double> out;
      for (double v : t.span()) out.push_back(double(fp8_decode(fp8_encode(static_cast<float>(v) * scale, Fp8Format::e4m3), Fp8Format::e4m3)));
      return std::pair{out, double(1.0f / scale)};
    };
    const auto [xq, xs] = quantized(x);
    const auto [wq, ws] = quantized(fc.weight().value);
    double worst = 0;
    for (index_t r = 0; r < kSeq; ++r)
      for (index_t o = 0; o < kOut; ++o) {
        double sum = 0;
        for (index_t i = 0; i < kIn; ++i) sum += xq[r * kIn + i] * wq[o * kIn + i];
        const double want = xs * ws * sum + fc.bias()->value[o];
        worst = std::max(worst, std::fabs(y.tensor[r * kOut + o] - want) / (std::fabs(want) + 1e-3));
      }
    EXPECT_LT(worst, 1e-13);
  });
}

// One rank, tensorwise, hybrid, two micro-batches whose amaxes differ 16-fold, both forwards before
// either backward (as a pipeline runs them), the first backward's weight gradient deferred past the
// second: dx = dec(dy) dec(W) and dW = sum over micro-batches of dec(dy)^T dec(x), each operand
// with its own micro-batch's scale, computed here from fp8_encode. The forward keeps the codes of
// x^T in place of x, and the weight gradients read them.
TEST(Fp8Linear, TensorwiseBackwardIsTheGemmsOfEachMicroBatchsRoundedOperands) {
  using P = strata_test::TestPolicy<double, false>;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = Context::create(world, ParallelConfig{});
    const Fp8Options options{.recipe = Fp8RecipeKind::tensorwise};
    ctx.fp8 = std::make_shared<Fp8Scaling<space::host>>(options, 1);
    Fp8LayerScope<space::host> scope(ctx.fp8, 0);
    ColumnParallelLinear<P> fc(ctx, "fc", kIn, kOut, /*bias=*/false);
    fc.init(ctx, 3, 0.5);
    // dec(t): t rounded to FP8 with its own tensorwise scale (amax / format max), decoded, row-major
    auto dec = [](const Tensor<double>& t, Fp8Format format) {
      float amax = 0;
      for (double v : t.span()) amax = std::max(amax, std::fabs(static_cast<float>(v)));
      const float scale = fp8_max(format) / amax, inverse = 1.0f / scale;
      std::vector<double> out;
      for (double v : t.span()) out.push_back(double(fp8_decode(fp8_encode(static_cast<float>(v) * scale, format), format)) * inverse);
      return out;
    };
    const Fp8Format e4m3 = options.format_of(Fp8Role::input), e5m2 = options.format_of(Fp8Role::grad_output);
    ASSERT_EQ(e5m2, Fp8Format::e5m2);
    std::vector<Tensor<double>> xs, dys;
    std::vector<ColumnParallelLinear<P>::Saved> saved;
    for (int mb = 0; mb < 2; ++mb) {
      xs.push_back(random_tensor<double>(Shape{kSeq, kIn}, 10 + mb));
      dys.push_back(random_tensor<double>(Shape{kSeq, kOut}, 20 + mb));
      for (index_t i = 0; i < xs[mb].numel(); ++i) xs[mb][i] *= mb ? 16.0 : 1.0;
      for (index_t i = 0; i < dys[mb].numel(); ++i) dys[mb][i] *= mb ? 1.0 / 16 : 1.0;
      saved.push_back(fc.forward(ctx, Activation<double, layout::replicated>(xs[mb])).second);
      EXPECT_TRUE(saved[mb].input.empty()) << "the forward keeps x^T's codes, not x";
      EXPECT_EQ(saved[mb].fp8_input.codes_t.shape(), (Shape{kIn, kSeq}));
    }
    const std::vector<double> w = dec(fc.weight().value, e4m3);
    DeferredWeightGradients deferred;
    std::vector<Tensor<double>> dx;
    dx.push_back(fc.backward(ctx, saved[0], Activation<double, layout::sharded<-1>>(dys[0]), &deferred).tensor);
    dx.push_back(fc.backward(ctx, saved[1], Activation<double, layout::sharded<-1>>(dys[1])).tensor);
    deferred.run();
    std::vector<double> dw(static_cast<std::size_t>(kOut * kIn), 0.0);
    double worst_dx = 0, worst_dw = 0;
    for (int mb = 0; mb < 2; ++mb) {
      const std::vector<double> x = dec(xs[mb], e4m3), dy = dec(dys[mb], e5m2);
      for (index_t r = 0; r < kSeq; ++r)
        for (index_t i = 0; i < kIn; ++i) {
          double want = 0;
          for (index_t o = 0; o < kOut; ++o) want += dy[r * kOut + o] * w[o * kIn + i];
          worst_dx = std::max(worst_dx, std::fabs(dx[mb][r * kIn + i] - want) / (std::fabs(want) + 1e-3));
        }
      for (index_t o = 0; o < kOut; ++o)
        for (index_t i = 0; i < kIn; ++i)
          for (index_t r = 0; r < kSeq; ++r) dw[o * kIn + i] += dy[r * kOut + o] * x[r * kIn + i];
    }
    for (index_t j = 0; j < kOut * kIn; ++j)
      worst_dw = std::max(worst_dw, std::fabs(fc.weight().grad[j] - dw[j]) / (std::fabs(dw[j]) + 1e-3));
    EXPECT_LT(worst_dx, 1e-13);
    EXPECT_LT(worst_dw, 1e-13);
  });
}

// One rank, blockwise (blocks of 4, and of 128: one partial block per run): y = the sum over the
// inner dimension of x's codes times its 1 x B run's 1 / scale and W's codes times its B x B tile's,
// plus b, computed here from fp8_encode and fp8_block_scale.
TEST(Fp8Linear, BlockwiseForwardIsTheGemmOfTheBlockRoundedOperands) {
  using P = strata_test::TestPolicy<double, false>;
  for (const int block : {4, 128})
    inprocess::run(1, [&](inprocess::communicator& world) {
      auto ctx = Context::create(world, ParallelConfig{});
      ctx.fp8 = std::make_shared<Fp8Scaling<space::host>>(Fp8Options{.recipe = Fp8RecipeKind::blockwise, .block = block}, 1);
      Fp8LayerScope<space::host> scope(ctx.fp8, 0);
      ColumnParallelLinear<P> fc(ctx, "fc", kIn, kOut);
      fc.init(ctx, 3, 0.5);
      init_normal(ctx.device, *fc.bias(), 4, 0.1);
      Tensor<double> x = random_tensor<double>(Shape{kSeq, kIn}, 5);
      for (index_t i = 0; i < x.numel(); ++i) x[i] *= std::ldexp(1.0, static_cast<int>(i % 7));  // runs of other ranges
      auto [y, saved] = fc.forward(ctx, Activation<double, layout::replicated>(x));
      // the decoded value of element (r, c) of t [rows, cols] in blocks of br x bc
      auto decoded = [&](const Tensor<double>& t, index_t rows, index_t cols, index_t br, index_t bc) {
        std::vector<double> out(static_cast<std::size_t>(rows * cols));
        for (index_t r0 = 0; r0 < rows; r0 += br)
          for (index_t c0 = 0; c0 < cols; c0 += bc) {
            float amax = 0;
            for (index_t r = r0; r < std::min(rows, r0 + br); ++r)
              for (index_t c = c0; c < std::min(cols, c0 + bc); ++c) amax = std::max(amax, std::fabs(static_cast<float>(t[r * cols + c])));
            const float scale = fp8_block_scale(amax, 448.0f);
            for (index_t r = r0; r < std::min(rows, r0 + br); ++r)
              for (index_t c = c0; c < std::min(cols, c0 + bc); ++c)
                out[static_cast<std::size_t>(r * cols + c)] =
                    double(fp8_decode(fp8_encode(static_cast<float>(t[r * cols + c]) * scale, Fp8Format::e4m3), Fp8Format::e4m3)) /
                    scale;
          }
        return out;
      };
      const std::vector<double> xq = decoded(x, kSeq, kIn, 1, block), wq = decoded(fc.weight().value, kOut, kIn, block, block);
      double worst = 0;
      for (index_t r = 0; r < kSeq; ++r)
        for (index_t o = 0; o < kOut; ++o) {
          double sum = 0;
          for (index_t i = 0; i < kIn; ++i) sum += xq[static_cast<std::size_t>(r * kIn + i)] * wq[static_cast<std::size_t>(o * kIn + i)];
          const double want = sum + fc.bias()->value[o];
          worst = std::max(worst, std::fabs(y.tensor[r * kOut + o] - want) / (std::fabs(want) + 1e-3));
        }
      EXPECT_LT(worst, 1e-13) << "block " << block;
    });
}

// The blockwise recipe refuses a layout whose tensor-parallel shards cut a block (hidden 48 over
// tp = 2 is 24 features per rank, not whole blocks of 16), naming the layer and the numbers.
TEST(Fp8Linear, BlockwiseRefusesBlocksStraddlingShards) {
  using P = strata_test::TestPolicy<double, false>;
  std::string message;
  try {
    inprocess::run(2, [&](inprocess::communicator& world) {
      auto ctx = Context::create(world, ParallelConfig{.tp = 2});
      ctx.fp8 = std::make_shared<Fp8Scaling<space::host>>(Fp8Options{.recipe = Fp8RecipeKind::blockwise, .block = 16}, 1);
      Fp8LayerScope<space::host> scope(ctx.fp8, 0);
      ColumnParallelLinear<P> fc1(ctx, "fc1", kIn, kHidden);
    });
  } catch (const ConfigError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("fc1"), std::string::npos) << message;
  EXPECT_NE(message.find("24 output features"), std::string::npos) << message;
  EXPECT_NE(message.find("blocks of 16"), std::string::npos) << message;
}

// Transformer Engine's delayed update on one row: a window of the last L amaxes, amax by max or// Transformer Engine's delayed update on one row: a window of the last L amaxes, amax by max or
// most_recent, scale = (max / amax) / 2^margin, kept when amax is 0.
// Fp8Options::recast_attention_output: the output projection's saved state holds the attention's
// own output tensor (the same storage, no copy) and no codes, and the backward's cast of it makes
// the codes the forward kept: outputs, input gradients and every parameter gradient bit for bit,
// over two micro-batches (gradients accumulated), under the delayed and tensorwise recipes, at tp 1
// and 2 (the tensorwise amax of the sharded input reduced again).
template <bool Recast>
Snapshot run_fp8_attention(int tp, Fp8RecipeKind recipe) {
  using P = strata_test::TestPolicy<double, false>;
  Snapshot snapshot;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = tp});
    Fp8Options options{.recipe = recipe};
    options.recast_attention_output = Recast;
    ctx.fp8 = std::make_shared<Fp8Scaling<space::host>>(options, 1);
    std::optional<SelfAttention<P, no_rope, mha>> layer;
    {
      Fp8LayerScope<space::host> scope(ctx.fp8, 0);
      layer.emplace(ctx, "attention", AttentionConfig{kHidden, 8, 8, 1000.0, true});
    }
    layer->init(ctx, 11, 0.3, 0.2);
    for (int step = 0; step < 2; ++step) {
      Activation<double, layout::replicated> x(random_tensor<double>(Shape{kSeq, kBatch, kHidden}, 300 + step));
      Activation<double, layout::replicated> dy(random_tensor<double>(Shape{kSeq, kBatch, kHidden}, 400 + step));
      auto [y, saved] = layer->forward(ctx, x);
      EXPECT_EQ(saved.proj.fp8_input.empty(), Recast) << "tp=" << tp;
      if constexpr (Recast) EXPECT_EQ(saved.proj.input.data(), saved.out.data()) << "the attention's own output, not a copy";
      else EXPECT_TRUE(saved.proj.input.empty());
      auto dx = layer->backward(ctx, saved, dy);
      if (ctx.world.rank() == 0) {
        std::lock_guard lock(mutex);
        snapshot.outputs.push_back(strata_test::to_values(y.tensor));
        snapshot.outputs.push_back(strata_test::to_values(dx.tensor));
      }
    }
    strata_test::gather_parameters(ctx, *layer, snapshot, mutex);
  });
  return snapshot;
}

TEST(Fp8Linear, RecastAttentionOutputIsTheAttentionThatKeepsTheCodes) {
  for (const auto recipe : {Fp8RecipeKind::delayed, Fp8RecipeKind::tensorwise})
    for (const int tp : {1, 2}) {
      const Snapshot kept = run_fp8_attention<false>(tp, recipe), recast = run_fp8_attention<true>(tp, recipe);
      const std::string what = std::string(recipe == Fp8RecipeKind::delayed ? "delayed" : "tensorwise") + " tp=" + std::to_string(tp);
      ASSERT_EQ(recast.outputs.size(), 4u) << what;
      EXPECT_EQ(recast.outputs, kept.outputs) << what;
      EXPECT_EQ(recast.grads, kept.grads) << what;
      strata_test::expect_equivalent(recast, kept, 0.0, what);  // and no gradient is zero
    }
}

// The experts in FP8 (delayed, hybrid; the first step, whose scales are all 1): on one rank with three
// local experts of groups 5, 0 and 9 rows and two rows outside every group (one of them huge),
// y = dec(a) dec(W2_l)^T with a = gelu(dec(x) dec(W1_l)^T), dx = dec(dpre) dec(W1_l),
// dW2_l = dec(dy)^T dec(a), dW1_l = dec(dpre)^T dec(x) with dpre = gelu'(pre) dec(dy) dec(W2_l), each
// group's rows alone, computed here from fp8_encode (E4M3 forward, E5M2 gradients); rows outside the
// groups give zeros and stay out of the amaxes; the backward keeps codes, not x or the activation.
// With the weight cache of both layouts, and of W^T alone (Fp8Options::cache_forward_weights off: a
// second forward of the step casts W again, into the same output bits).
void check_fp8_experts(bool cache_forward) {
  SCOPED_TRACE(cache_forward ? "weight cache of both layouts" : "weight cache of W^T alone");
  using P = strata_test::TestPolicy<double, false>;
  constexpr index_t h = 16, f = 8, local = 3, rows = 16;
  const index_t counts[local] = {5, 0, 9};
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = Context::create(world, ParallelConfig{});
    ctx.fp8 = std::make_shared<Fp8Scaling<space::host>>(Fp8Options{.cache_forward_weights = cache_forward}, 1);  // delayed, hybrid
    std::optional<GroupedExperts<P, gelu>> experts;
    {
      Fp8LayerScope<space::host> scope(ctx.fp8, 0);
      experts.emplace(ctx, "experts", ExpertsConfig{.hidden_size = h, .ffn_hidden_size = f, .num_experts = local});
    }
    ASSERT_TRUE(experts->fp8());
    ASSERT_EQ(ctx.fp8->states.size(), 2u);
    experts->init(ctx, 5, 0.5, 0.4);
    Tensor<double> x = random_tensor<double>(Shape{rows, h}, 6), dy = random_tensor<double>(Shape{rows, h}, 7);
    x[15 * h + 3] = 1e6;  // outside every group: in no amax, no output
    Tensor<std::int32_t> group_counts = Tensor<std::int32_t>::empty(Shape{local});
    for (index_t l = 0; l < local; ++l) group_counts[l] = static_cast<std::int32_t>(counts[l]);
    auto [y, saved] = experts->forward(ctx, x, group_counts);
    EXPECT_EQ(saved.input.data(), nullptr);
    EXPECT_EQ(saved.activation.data(), nullptr);
    EXPECT_EQ(saved.input_codes.codes_t.shape(), (Shape{h, 14}));
    Tensor<double> dx = experts->backward(ctx, saved, dy);
    std::vector<const Parameter<double>*> fc1, fc2;
    int visited = 0;
    experts->for_each_parameter([&](auto& p) { (visited++ % 2 == 0 ? fc1 : fc2).push_back(&p); });
    const auto dec = [](double v, Fp8Format format) { return double(fp8_decode(fp8_encode(static_cast<float>(v), format), format)); };
    const auto e4 = [&](double v) { return dec(v, Fp8Format::e4m3); };
    const auto e5 = [&](double v) { return dec(v, Fp8Format::e5m2); };
    double worst = 0;
    const auto expect = [&](double got, double want) { worst = std::max(worst, std::fabs(got - want) / (std::fabs(want) + 1e-3)); };
    std::vector<double> dw1(local * f * h, 0.0), dw2(local * h * f, 0.0);
    index_t at = 0;
    for (index_t l = 0; l < local; ++l) {
      const auto& w1 = fc1[l]->value;  // [f, h]
      const auto& w2 = fc2[l]->value;  // [h, f]
      for (index_t r = at; r < at + counts[l]; ++r) {
        double pre[f], act[f], dact[f], dpre[f];
        for (index_t j = 0; j < f; ++j) {
          pre[j] = 0;
          for (index_t i = 0; i < h; ++i) pre[j] += e4(x[r * h + i]) * e4(w1[j * h + i]);
        }
        cpu::gelu_forward<double>(pre, f, act);
        for (index_t o = 0; o < h; ++o) {
          double sum = 0;
          for (index_t j = 0; j < f; ++j) sum += e4(act[j]) * e4(w2[o * f + j]);
          expect(y[r * h + o], sum);
        }
        for (index_t j = 0; j < f; ++j) {
          dact[j] = 0;
          for (index_t o = 0; o < h; ++o) dact[j] += e5(dy[r * h + o]) * e4(w2[o * f + j]);
        }
        cpu::gelu_backward<double>(dact, pre, f, dpre);
        for (index_t i = 0; i < h; ++i) {
          double sum = 0;
          for (index_t j = 0; j < f; ++j) sum += e5(dpre[j]) * e4(w1[j * h + i]);
          expect(dx[r * h + i], sum);
        }
        for (index_t o = 0; o < h; ++o)
          for (index_t j = 0; j < f; ++j) dw2[(l * h + o) * f + j] += e5(dy[r * h + o]) * e4(act[j]);
        for (index_t j = 0; j < f; ++j)
          for (index_t i = 0; i < h; ++i) dw1[(l * f + j) * h + i] += e5(dpre[j]) * e4(x[r * h + i]);
      }
      at += counts[l];
    }
    for (index_t r = at; r < rows; ++r)
      for (index_t c = 0; c < h; ++c) {
        EXPECT_EQ(y[r * h + c], 0.0) << "row " << r << " is outside every group";
        EXPECT_EQ(dx[r * h + c], 0.0) << "row " << r << " is outside every group";
      }
    for (index_t l = 0; l < local; ++l)
      for (index_t i = 0; i < f * h; ++i) {
        expect(fc1[l]->grad[i], dw1[l * f * h + i]);
        expect(fc2[l]->grad[i], dw2[l * h * f + i]);
      }
    EXPECT_LT(worst, 1e-12);
    float amax = 0;
    for (index_t r = 0; r < at; ++r)
      for (index_t c = 0; c < h; ++c) amax = std::max(amax, std::fabs(static_cast<float>(x[r * h + c])));
    EXPECT_EQ(ctx.fp8->states[0]->amax(Fp8Role::input)[0], amax) << "the grouped rows' amax, not the outside row's";
    EXPECT_EQ(ctx.fp8->states[0]->weight_casts, 1) << "each expert's weight cast once for the step, both layouts";
    EXPECT_EQ(ctx.fp8->states[0]->weight_cache.codes.data() == nullptr, !cache_forward) << "the cache keeps W as the options say";
    auto [again, saved_again] = experts->forward(ctx, x, group_counts);  // a second forward of the step
    for (index_t i = 0; i < y.numel(); ++i) ASSERT_EQ(again[i], y[i]) << "the second forward's output, element " << i;
    EXPECT_EQ(ctx.fp8->states[0]->weight_casts, cache_forward ? 1 : 2) << "W cast again where the cache keeps W^T alone";
  });
}

TEST(Fp8Experts, GemmsAreThoseOfEachGroupsRoundedOperands) {
  for (const bool cache_forward : {true, false}) check_fp8_experts(cache_forward);
}

TEST(Fp8Recipe, DelayedHistoryRollsAndScalesAsTransformerEngine) {
  const int L = 3;
  std::vector<float> row(L + 2, 0.0f);
  row[L] = row[L + 1] = 1.0f;
  const Fp8UpdateArgs by_max{L, Fp8AmaxAlgo::max, 1, true};
  fp8_update_row(row.data(), 448.0f, by_max);  // amax 0: the scale stays 1
  EXPECT_EQ(row[L], 1.0f);
  const float amaxes[] = {2.0f, 8.0f, 1.0f, 0.5f, 0.25f};
  const float want_max[] = {2.0f, 8.0f, 8.0f, 8.0f, 1.0f};  // the window of three steps
  for (int s = 0; s < 5; ++s) {
    row[0] = amaxes[s];  // what the step's casts fold into history[0]
    fp8_update_row(row.data(), 448.0f, by_max);
    EXPECT_EQ(row[L], 448.0f / want_max[s] / 2.0f) << "step " << s;
    EXPECT_EQ(row[L + 1], 1.0f / row[L]);
    EXPECT_EQ(row[0], 0.0f);
    EXPECT_EQ(row[L - 1], amaxes[s]) << "the newest amax is at the end after the roll";
  }
  std::vector<float> recent(L + 2, 0.0f);
  recent[L] = 1.0f;
  for (int s = 0; s < 5; ++s) {
    recent[0] = amaxes[s];
    fp8_update_row(recent.data(), 57344.0f, Fp8UpdateArgs{L, Fp8AmaxAlgo::most_recent, 0, true});
    EXPECT_EQ(recent[L], 57344.0f / amaxes[s]);
  }
}

// Through the layer: after a step, history[0] of each role held the step's amax (max over the
// ranks), and the new scale is derived from it.
TEST(Fp8Recipe, DelayedStateRecordsTheStepsAmax) {
  using P = strata_test::TestPolicy<double, false>;
  for (int tp : {1, 2}) {
    inprocess::run(tp, [&](inprocess::communicator& world) {
      auto ctx = Context::create(world, ParallelConfig{.tp = tp});
      ctx.fp8 = std::make_shared<Fp8Scaling<space::host>>(Fp8Options{.format = Fp8Formats::hybrid, .recipe = Fp8RecipeKind::delayed,
                                                                      .amax_history_len = 4, .amax_compute_algo = Fp8AmaxAlgo::max},
                                                           1);
      std::optional<ColumnParallelLinear<P>> fc;
      {
        Fp8LayerScope<space::host> scope(ctx.fp8, 0);
        fc.emplace(ctx, "fc", kIn, kOut);
      }
      ASSERT_EQ(ctx.fp8->states.size(), 1u);
      fc->init(ctx, 3, 0.5);
      Tensor<double> x = random_tensor<double>(Shape{kSeq, kIn}, 5), dy_full = random_tensor<double>(Shape{kSeq, kOut}, 6);
      auto [y, saved] = fc->forward(ctx, Activation<double, layout::replicated>(x));
      Tensor<double> dy(Shape{kSeq, kOut / tp});
      for (index_t r = 0; r < kSeq; ++r)
        for (index_t o = 0; o < kOut / tp; ++o) dy[r * (kOut / tp) + o] = dy_full[r * kOut + world.rank() * (kOut / tp) + o];
      fc->backward(ctx, saved, Activation<double, layout::sharded<-1>>(dy));
      fp8_after_optimizer_step(ctx);
      auto amax_of = [](const Tensor<double>& t) {
        float m = 0;
        for (double v : t.span()) m = std::max(m, std::fabs(static_cast<float>(v)));
        return m;
      };
      auto& state = *fc->fp8_state();
      // the full weight's amax: rank 0 of a one-rank run holds it all; compare the input and gradient roles
      EXPECT_EQ(*state.scale(Fp8Role::input), 448.0f / amax_of(x));
      EXPECT_EQ(*state.scale(Fp8Role::grad_output), 57344.0f / amax_of(dy_full));
      EXPECT_EQ(state.row(Fp8Role::input)[3], amax_of(x)) << "rolled to the end of the window";
      EXPECT_EQ(state.row(Fp8Role::input)[0], 0.0f);
    });
  }
}

// The delayed update runs once for the model: every state's rows move into one packed buffer (a
// layer built after the first update joins it at the next, its values kept), each row updated as
// the one-state update does, and each role's new 1 / scale written into the state's aligned GEMM
// slot; a forward that reads those slots equals one whose weight-cache fill copies them.
TEST(Fp8Recipe, DelayedUpdatePacksTheStatesAndWritesTheGemmScales) {
  using P = strata_test::TestPolicy<double, false>;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = Context::create(world, ParallelConfig{});
    ctx.fp8 = std::make_shared<Fp8Scaling<space::host>>(Fp8Options{.format = Fp8Formats::hybrid, .recipe = Fp8RecipeKind::delayed,
                                                                    .amax_history_len = 3, .amax_compute_algo = Fp8AmaxAlgo::max},
                                                         2);
    std::vector<std::unique_ptr<ColumnParallelLinear<P>>> layers;
    auto add_layer = [&](int index) {
      Fp8LayerScope<space::host> scope(ctx.fp8, index);
      layers.push_back(std::make_unique<ColumnParallelLinear<P>>(ctx, "fc" + std::to_string(index), kIn, kOut));
      layers.back()->init(ctx, 3 + index, 0.5);
    };
    Tensor<double> x = random_tensor<double>(Shape{kSeq, kIn}, 5), dy = random_tensor<double>(Shape{kSeq, kOut}, 6);
    auto step = [&] {
      for (auto& fc : layers) {
        auto [y, saved] = fc->forward(ctx, Activation<double, layout::replicated>(x));
        fc->backward(ctx, saved, Activation<double, layout::sharded<-1>>(dy));
      }
    };
    // What the one-state update makes of each state's rows as they are before the step's update.
    auto expected_rows = [&] {
      std::vector<std::vector<float>> out;
      const Fp8UpdateArgs args{3, Fp8AmaxAlgo::max, 0, true};
      const Fp8RoleMaxes maxes{{448.0f, 448.0f, 57344.0f}};
      for (auto& state : ctx.fp8->states) {
        std::vector<float> rows(state->rows.span().begin(), state->rows.span().end());
        cpu::fp8_update_scales(rows.data(), 1, state->row_length(), maxes, args, nullptr);
        out.push_back(rows);
      }
      return out;
    };
    auto check_packed = [&](const std::vector<std::vector<float>>& want) {
      ASSERT_EQ(ctx.fp8->packed_states, ctx.fp8->states.size());
      for (std::size_t i = 0; i < ctx.fp8->states.size(); ++i) {
        auto& state = *ctx.fp8->states[i];
        const index_t length = state.row_length();
        EXPECT_EQ(state.rows.data(), ctx.fp8->packed_rows.data() + static_cast<index_t>(i) * kFp8Roles * length) << state.name;
        EXPECT_EQ(std::vector<float>(state.rows.span().begin(), state.rows.span().end()), want[i]) << state.name;
        EXPECT_TRUE(state.gemm_scales_current) << state.name;
        for (int r = 0; r < kFp8Roles; ++r)
          EXPECT_EQ(state.gemm_scale_inv(static_cast<Fp8Role>(r))[0], *state.scale_inv(static_cast<Fp8Role>(r)))
              << state.name << " role " << r;
      }
    };
    add_layer(0);
    step();
    auto want = expected_rows();
    fp8_after_optimizer_step(ctx);
    check_packed(want);
    add_layer(1);  // a layer built after the first update
    step();
    want = expected_rows();
    fp8_after_optimizer_step(ctx);
    check_packed(want);
    // the next forward: GEMM scales from the update, then (the flag cleared) copied by the cache's fill
    auto y_written = layers[0]->forward(ctx, Activation<double, layout::replicated>(x)).first;
    fp8_drop_weight_caches(ctx);
    EXPECT_FALSE(ctx.fp8->states[0]->gemm_scales_current) << "a dropped cache copies the scales again";
    auto y_copied = layers[0]->forward(ctx, Activation<double, layout::replicated>(x)).first;
    ASSERT_EQ(y_written.tensor.numel(), y_copied.tensor.numel());
    for (index_t i = 0; i < y_written.tensor.numel(); ++i) ASSERT_EQ(y_written.tensor[i], y_copied.tensor[i]) << i;
  });
}

TEST(Fp8Recipe, RefusesWhatThisBuildCannotRun) {
  auto message = [](Fp8Options o) {
    try {
      o.validate();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(Fp8Options{.recipe = Fp8RecipeKind::mxfp8}).find("Blackwell"), std::string::npos);
  EXPECT_NE(message(Fp8Options{.recipe = Fp8RecipeKind::blockwise, .block = 0}).find("a block of 0"), std::string::npos);
  EXPECT_EQ(message(Fp8Options{.recipe = Fp8RecipeKind::blockwise}), "");
  EXPECT_NE(message(Fp8Options{.amax_history_len = 0}).find("--fp8-amax-history-len 0"), std::string::npos);
  EXPECT_EQ(message(Fp8Options{}), "");
}

// --first-last-layers-bf16: the first and last layers' linear layers are built without FP8.
TEST(Fp8Recipe, FirstAndLastLayersStayInBf16) {
  Fp8Scaling<space::host> scaling(Fp8Options{.first_last_layers_bf16 = true, .num_layers_at_start_in_bf16 = 2,
                                             .num_layers_at_end_in_bf16 = 1},
                                  6);
  std::vector<bool> fp8;
  for (int layer = 0; layer < 6; ++layer) {
    scaling.current_layer = layer;
    fp8.push_back(scaling.fp8_here());
  }
  EXPECT_EQ(fp8, (std::vector<bool>{false, false, true, true, true, false}));
  scaling.current_layer = -1;
  EXPECT_FALSE(scaling.fp8_here()) << "outside a transformer layer (the output layer) FP8 stays off";
}

}  // namespace
}  // namespace test_fp8_linear_cases
