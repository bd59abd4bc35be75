// LrSchedule against hand-computed values: warmup, each decay style, after decay, validation.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <strata/optim.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_lr_schedule_cases {

namespace {

using namespace strata;

constexpr double kTolerance = 1e-15;

LrSchedule schedule(LrDecayStyle style) {
  return LrSchedule{.max_lr = 1.0, .min_lr = 0.1, .warmup_iters = 10, .decay_iters = 110, .style = style};
}

TEST(LrSchedule, WarmupIsLinearFromZero) {
  for (LrDecayStyle style : {LrDecayStyle::constant, LrDecayStyle::linear, LrDecayStyle::cosine}) {
    const LrSchedule s = schedule(style);
    EXPECT_EQ(s.lr(0), 0.0);
    EXPECT_NEAR(s.lr(1), 0.1, kTolerance);
    EXPECT_NEAR(s.lr(5), 0.5, kTolerance);
    EXPECT_EQ(s.lr(10), 1.0);
  }
}

// Megatron's --lr-warmup-init: warmup runs linearly from that value to max_lr; decay is unchanged.
TEST(LrSchedule, WarmupStartsFromWarmupInit) {
  LrSchedule s = schedule(LrDecayStyle::cosine);
  s.warmup_init = 0.2;
  EXPECT_EQ(s.lr(0), 0.2);
  EXPECT_NEAR(s.lr(5), 0.6, kTolerance);
  EXPECT_EQ(s.lr(10), 1.0);
  EXPECT_EQ(s.lr(60), schedule(LrDecayStyle::cosine).lr(60));
  s.warmup_init = -1;
  EXPECT_THROW(s.lr(1), ConfigError);
}

TEST(LrSchedule, CosineDecay) {
  const LrSchedule s = schedule(LrDecayStyle::cosine);
  // ratio = (it - 10) / 100; lr = 0.1 + 0.9 * 0.5 * (cos(pi * ratio) + 1)
  EXPECT_NEAR(s.lr(35), 0.1 + 0.45 * (1.0 + std::sqrt(0.5)), kTolerance);  // ratio 0.25
  EXPECT_NEAR(s.lr(60), 0.55, kTolerance);                                  // ratio 0.5
  EXPECT_NEAR(s.lr(85), 0.1 + 0.45 * (1.0 - std::sqrt(0.5)), kTolerance);  // ratio 0.75
  EXPECT_NEAR(s.lr(110), 0.1, kTolerance);
  EXPECT_EQ(s.lr(111), 0.1);
  EXPECT_EQ(s.lr(1000), 0.1);
}

TEST(LrSchedule, LinearDecay) {
  const LrSchedule s = schedule(LrDecayStyle::linear);
  EXPECT_NEAR(s.lr(35), 0.775, kTolerance);
  EXPECT_NEAR(s.lr(60), 0.55, kTolerance);
  EXPECT_NEAR(s.lr(85), 0.325, kTolerance);
  EXPECT_NEAR(s.lr(110), 0.1, kTolerance);
  EXPECT_EQ(s.lr(500), 0.1);
}

TEST(LrSchedule, ConstantStaysAtMaxAfterWarmup) {
  const LrSchedule s = schedule(LrDecayStyle::constant);
  EXPECT_EQ(s.lr(11), 1.0);
  EXPECT_EQ(s.lr(110), 1.0);
  EXPECT_EQ(s.lr(100000), 1.0);
  // Without warmup or decay iterations.
  EXPECT_EQ((LrSchedule{.max_lr = 0.5, .style = LrDecayStyle::constant}.lr(0)), 0.5);
}

TEST(LrSchedule, NoWarmupStartsAtMax) {
  const LrSchedule s{.max_lr = 2.0, .min_lr = 0.0, .decay_iters = 4, .style = LrDecayStyle::linear};
  EXPECT_EQ(s.lr(0), 2.0);
  EXPECT_EQ(s.lr(1), 1.5);
  EXPECT_EQ(s.lr(2), 1.0);
  EXPECT_EQ(s.lr(4), 0.0);
  EXPECT_EQ(s.lr(5), 0.0);
}

TEST(LrSchedule, DecayItersDefaultToTrainIters) {
  LrSchedule s = schedule(LrDecayStyle::cosine);
  s.decay_iters = 0;
  s.train_iters = 110;
  EXPECT_EQ(s.effective_decay_iters(), 110);
  EXPECT_NEAR(s.lr(60), 0.55, kTolerance);
  EXPECT_EQ(s.lr(111), 0.1);
}

TEST(LrSchedule, WarmupEqualToDecayEndsAtMaxThenMin) {
  const LrSchedule s{.max_lr = 1.0, .min_lr = 0.25, .warmup_iters = 4, .decay_iters = 4, .style = LrDecayStyle::cosine};
  EXPECT_EQ(s.lr(2), 0.5);
  EXPECT_EQ(s.lr(4), 1.0);
  EXPECT_EQ(s.lr(5), 0.25);
}

TEST(LrSchedule, ValidationNamesTheBadValue) {
  auto message = [](const LrSchedule& s) -> std::string {
    try {
      s.validate();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message({.max_lr = 0.1, .min_lr = 0.2, .decay_iters = 10}).find("minimum learning rate"), std::string::npos);
  EXPECT_NE(message({.max_lr = -1, .decay_iters = 10}).find("maximum learning rate"), std::string::npos);
  EXPECT_NE(message({.max_lr = 1, .warmup_iters = 20, .decay_iters = 10}).find("warmup_iters = 20"), std::string::npos);
  EXPECT_NE(message({.max_lr = 1, .style = LrDecayStyle::cosine}).find("decay_iters"), std::string::npos);
  EXPECT_EQ(message({.max_lr = 1, .style = LrDecayStyle::constant}), "");
  EXPECT_THROW(schedule(LrDecayStyle::linear).lr(-1), ConfigError);
}

TEST(LrSchedule, ParseDecayStyle) {
  EXPECT_EQ(parse_lr_decay_style("constant"), LrDecayStyle::constant);
  EXPECT_EQ(parse_lr_decay_style("linear"), LrDecayStyle::linear);
  EXPECT_EQ(parse_lr_decay_style("cosine"), LrDecayStyle::cosine);
  try {
    parse_lr_decay_style("wsd");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'wsd'"), std::string::npos) << m;
    EXPECT_NE(m.find("constant, linear, cosine"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace test_lr_schedule_cases
