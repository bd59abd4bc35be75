// AdamW against a scalar reference written here: one and several steps, weight decay only where
// the parameter asks for it, and the fp32 master copy of bf16 parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include <strata/backend/cpu/backend.hpp>
#include <strata/layers/parameter.hpp>
#include <strata/optim.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_adamw_cases {

namespace {

using namespace strata;

template <class T>
struct ToyModule {
  Parameter<T> weight{"toy.weight", Shape{3, 4}, ShardSpec::replicated(), true};
  Parameter<T> bias{"toy.bias", Shape{4}, ShardSpec::replicated(), false};

  explicit ToyModule(std::uint64_t seed) {
    strata::cpu::backend device;
    init_normal(device, weight, seed, 1.0);
    init_normal(device, bias, seed + 1, 0.5);
  }
  template <class V>
  void for_each_parameter(V&& visit) {
    visit(weight);
    visit(bias);
  }
  // A deterministic gradient for step `step` (grad = sin of something), accumulated in A.
  void set_gradients(int step) {
    int k = 0;
    for_each_parameter([&](auto& p) {
      for (index_t i = 0; i < p.grad.numel(); ++i, ++k) p.grad[i] = static_cast<accumulate_t<T>>(std::sin(0.7 * k + 1.3 * step) * (1 + k % 3));
    });
  }
};

// Scalar AdamW on one element, in precision A, in the order the header documents.
template <class A>
struct ReferenceAdamW {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  A w, m = 0, v = 0;
  int t = 0;
  void step(A g, double lr, bool decay) {
    ++t;
    const A bc1 = static_cast<A>(1.0 - std::pow(beta1, t)), bc2 = static_cast<A>(1.0 - std::pow(beta2, t));
    if (decay) w = w - static_cast<A>(lr * weight_decay) * w;
    m = static_cast<A>(beta1) * m + static_cast<A>(1.0 - beta1) * g;
    v = static_cast<A>(beta2) * v + static_cast<A>(1.0 - beta2) * g * g;
    const A m_hat = m / bc1, v_hat = v / bc2;
    w = w - static_cast<A>(lr) * m_hat / (std::sqrt(v_hat) + static_cast<A>(eps));
  }
};

TEST(AdamW, FirstStepMovesEachWeightByLearningRate) {
  // After one step mhat = g and vhat = g^2, so without decay the update is lr * g / (|g| + eps).
  ToyModule<double> module(1);
  AdamW<double> optimizer(module, AdamWConfig{.weight_decay = 0});
  std::vector<double> before(module.weight.value.span().begin(), module.weight.value.span().end());
  module.set_gradients(0);
  optimizer.step(module, 1e-3);
  EXPECT_EQ(optimizer.steps(), 1);
  for (index_t i = 0; i < module.weight.value.numel(); ++i) {
    const double g = module.weight.grad[i];
    EXPECT_NEAR(module.weight.value[i], before[i] - 1e-3 * g / (std::abs(g) + 1e-8), 1e-15);
  }
}

// skip_unless_finite: a NaN or infinite value leaves every weight as it was (the kernel reads it,
// the host does not); a finite one lets the step run exactly as without it.
TEST(AdamW, NonFiniteGateLeavesWeightsUnchanged) {
  strata::cpu::backend device;
  ToyModule<double> gated(1), plain(1);
  AdamW<double> gated_optimizer(device, gated), plain_optimizer(device, plain);
  gated.set_gradients(0);
  plain.set_gradients(0);
  const std::vector<double> before(gated.weight.value.span().begin(), gated.weight.value.span().end());
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
    gated_optimizer.step(device, gated, 1e-2, &bad);
    for (index_t i = 0; i < gated.weight.value.numel(); ++i) ASSERT_EQ(gated.weight.value[i], before[static_cast<std::size_t>(i)]);
  }
  const double good = 12.5;
  AdamW<double> fresh(device, gated);  // same starting point as plain_optimizer, moments still zero
  fresh.step(device, gated, 1e-2, &good);
  plain_optimizer.step(device, plain, 1e-2);
  for (index_t i = 0; i < gated.weight.value.numel(); ++i) EXPECT_EQ(gated.weight.value[i], plain.weight.value[i]);
  for (index_t i = 0; i < gated.bias.value.numel(); ++i) EXPECT_EQ(gated.bias.value[i], plain.bias.value[i]);
}

TEST(AdamW, SeveralStepsMatchScalarReferenceDouble) {
  const AdamWConfig config{.beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  ToyModule<double> module(2);
  std::vector<ReferenceAdamW<double>> reference;
  module.for_each_parameter([&](auto& p) {
    for (index_t i = 0; i < p.value.numel(); ++i)
      reference.push_back({config.beta1, config.beta2, config.eps, config.weight_decay, p.value[i]});
  });
  AdamW<double> optimizer(module, config);
  for (int step = 0; step < 5; ++step) {
    const double lr = 0.01 * (step + 1);
    module.set_gradients(step);
    optimizer.step(module, lr);
    std::size_t k = 0;
    module.for_each_parameter([&](auto& p) {
      for (index_t i = 0; i < p.value.numel(); ++i, ++k) {
        reference[k].step(p.grad[i], lr, p.weight_decay);
        EXPECT_DOUBLE_EQ(p.value[i], reference[k].w) << p.name << "[" << i << "] step " << step;
      }
    });
  }
  // The state visible through for_each_state matches too.
  std::size_t k = 0;
  int visited = 0;
  optimizer.for_each_state([&](const std::string& name, Tensor<double>& tensor) {
    ++visited;
    if (!name.ends_with(".exp_avg_sq")) return;
    for (index_t i = 0; i < tensor.numel(); ++i, ++k) EXPECT_DOUBLE_EQ(tensor[i], reference[k].v) << name;
  });
  EXPECT_EQ(visited, 6);
  EXPECT_EQ(k, reference.size());
}

// Megatron's --decoupled-lr: parameters flagged decoupled_lr (the word embedding and the output
// layer) step with their own rate, weight decay included; the others with the main rate, as the
// scalar reference says for each. Without a decoupled rate the flag changes nothing.
TEST(AdamW, DecoupledRateStepsTheFlaggedParameters) {
  const AdamWConfig config{.beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  for (const bool decoupled : {false, true}) {
    ToyModule<double> module(4), plain(4);
    module.weight.decoupled_lr = true;
    std::vector<ReferenceAdamW<double>> reference;
    module.for_each_parameter([&](auto& p) {
      for (index_t i = 0; i < p.value.numel(); ++i)
        reference.push_back({config.beta1, config.beta2, config.eps, config.weight_decay, p.value[i]});
    });
    AdamW<double> optimizer(module, config), plain_optimizer(plain, config);
    strata::cpu::backend device;
    for (int step = 0; step < 3; ++step) {
      const double lr = 0.01 * (step + 1), own = 0.07 / (step + 1);
      module.set_gradients(step);
      plain.set_gradients(step);
      optimizer.step(device, module, lr, nullptr, decoupled ? own : -1.0);
      plain_optimizer.step(device, plain, lr);
      std::size_t k = 0;
      module.for_each_parameter([&](auto& p) {
        for (index_t i = 0; i < p.value.numel(); ++i, ++k) {
          reference[k].step(p.grad[i], decoupled && p.decoupled_lr ? own : lr, p.weight_decay);
          EXPECT_DOUBLE_EQ(p.value[i], reference[k].w) << p.name << "[" << i << "] step " << step;
        }
      });
      if (!decoupled) {  // the flag alone: the bits of an unflagged run
        for (index_t i = 0; i < plain.weight.value.numel(); ++i) EXPECT_EQ(module.weight.value[i], plain.weight.value[i]);
      }
    }
  }
}

TEST(AdamW, WeightDecayOnlyWhereParameterAsksForIt) {
  // Zero gradients: Adam's update is 0, so only decoupled decay moves a weight: w *= 1 - lr * wd.
  ToyModule<double> module(3);
  const Tensor<double> weight0 = module.weight.value.clone(), bias0 = module.bias.value.clone();  // snapshots
  AdamW<double> optimizer(module, AdamWConfig{.weight_decay = 0.5});
  zero_gradients(module);
  optimizer.step(module, 0.1);
  for (index_t i = 0; i < weight0.numel(); ++i) EXPECT_DOUBLE_EQ(module.weight.value[i], weight0[i] - 0.05 * weight0[i]);
  for (index_t i = 0; i < bias0.numel(); ++i) EXPECT_EQ(module.bias.value[i], bias0[i]);
}

TEST(AdamW, Bf16KeepsFloatMasterCopy) {
  ToyModule<bf16> module(4);
  module.for_each_parameter([](auto& p) {
    for (index_t i = 0; i < p.value.numel(); ++i) p.value[i] = bf16(1.0f + 0.25f * static_cast<float>(i % 4));
  });
  std::vector<ReferenceAdamW<float>> reference;
  module.for_each_parameter([&](auto& p) {
    for (index_t i = 0; i < p.value.numel(); ++i) reference.push_back({.w = static_cast<float>(p.value[i])});
  });
  AdamW<bf16> optimizer(module);
  static_assert(std::is_same_v<AdamW<bf16>::state_type, float>);
  const double lr = 1e-4;  // far below bf16's spacing near 1 (2^-7): values stay put, the master moves
  for (int step = 0; step < 3; ++step) {
    module.set_gradients(step);
    optimizer.step(module, lr);
  }
  // Replay the reference with the same gradients.
  std::size_t k = 0;
  for (int step = 0; step < 3; ++step) {
    module.set_gradients(step);
    k = 0;
    module.for_each_parameter([&](auto& p) {
      for (index_t i = 0; i < p.value.numel(); ++i, ++k) reference[k].step(p.grad[i], lr, p.weight_decay);
    });
  }
  int differing = 0;
  k = 0;
  optimizer.for_each_state([&](const std::string& name, Tensor<float>& tensor) {
    if (!name.ends_with(".main")) return;
    const Parameter<bf16>& p = name.starts_with("toy.weight") ? module.weight : module.bias;
    for (index_t i = 0; i < tensor.numel(); ++i, ++k) {
      EXPECT_FLOAT_EQ(tensor[i], reference[k].w) << name << "[" << i << "]";
      EXPECT_EQ(p.value[i].bits, bf16(tensor[i]).bits) << "value must be the rounded master, " << name << "[" << i << "]";
      if (static_cast<float>(p.value[i]) != tensor[i]) ++differing;
    }
  });
  EXPECT_EQ(k, reference.size());
  EXPECT_GT(differing, 0) << "the master copy should hold what bf16 cannot";
}

struct OtherModule {
  Parameter<double> p{"other", Shape{2}, ShardSpec::replicated()};
  template <class V>
  void for_each_parameter(V&& visit) {
    visit(p);
  }
};

TEST(AdamW, RejectsAnotherModule) {
  ToyModule<double> module(5);
  AdamW<double> optimizer(module);
  OtherModule other;
  EXPECT_THROW(optimizer.step(other, 0.1), ConfigError);
  EXPECT_THROW((AdamW<double>(module, AdamWConfig{.beta1 = 1.0})), ConfigError);
}

TEST(AdamW, SetStepsControlsBiasCorrection) {
  // An optimizer resumed at step 7 corrects its first moments with t = 8.
  ToyModule<double> module(6);
  AdamW<double> resumed(module);
  resumed.set_steps(7);
  module.set_gradients(1);
  const double w0 = module.weight.value[0], g = module.weight.grad[0];
  resumed.step(module, 0.1);
  EXPECT_EQ(resumed.steps(), 8);
  const double m_hat = 0.1 * g / (1 - std::pow(0.9, 8)), v_hat = 0.001 * g * g / (1 - std::pow(0.999, 8));
  const double expected = (w0 - 0.1 * 0.01 * w0) - 0.1 * m_hat / (std::sqrt(v_hat) + 1e-8);
  EXPECT_NEAR(module.weight.value[0], expected, 1e-14);
  EXPECT_THROW(resumed.set_steps(-1), ConfigError);
}

}  // namespace
}  // namespace test_adamw_cases
