// ModelConfig's arithmetic and validation, and the memory estimate built on it: sizes derived from
// the configuration never overflow silently, non-finite numbers are refused, and the estimate's
// parameter count is the models' own.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include <strata/models/config.hpp>
#include <strata/models/memory_estimate.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_model_config_cases {

namespace {

using strata::ConfigError;
using strata::ParallelConfig;
using strata::models::ModelConfig;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

TEST(ModelConfig, DefaultFfnThatOverflowsIntIsAnErrorNotANegativeWidth) {
  ModelConfig m;
  m.hidden_size = 600000000;
  m.ffn_hidden_size = 0;
  const std::string message = error_of([&] { (void)m.ffn(); });
  EXPECT_NE(message.find("ffn_hidden_size"), std::string::npos) << message;
  EXPECT_NE(message.find("2400000000"), std::string::npos) << message;
  m.hidden_size = 768;
  EXPECT_EQ(m.ffn(), 3072);
  m.ffn_hidden_size = 100;
  EXPECT_EQ(m.ffn(), 100);
}

// The fused classifier's estimate keeps one block of logits (and the final norm's output gradient)
// where the unfused one keeps the logits and their softmax: GPT-2 124M, micro-batch 32 x 1024, bf16.
TEST(MemoryEstimate, FusedClassifierKeepsOneBlockOfLogits) {
  const auto m = ModelConfig::gpt2_124m();
  const auto bytes = strata::models::element_bytes_of<strata::bf16>();
  const auto shape = strata::models::DecoderShape::gpt();
  const std::int64_t block = std::int64_t{256} << 20, tokens = 32 * 1024, vocab = 50304, hidden = 768;
  EXPECT_EQ(strata::models::estimate_training_memory(m, shape, 1, false, 32, bytes, block).parameter_bytes,
            strata::models::estimate_training_memory(m, shape, 1, false, 32, bytes).parameter_bytes);
  // what the model keeps and the logits while the output layer runs (a layer's backward, which never
  // runs beside them, is the estimate's other transient)
  auto held = [&](std::int64_t budget) {
    const auto a = strata::models::activations_of(m, 1, false, 32, bytes, budget, {});
    return a.kept + a.transient;
  };
  const std::int64_t block_rows = 2560;  // 2668 rows of bf16 logits fit, rounded down to whole 256-row tiles
  EXPECT_EQ(held(0) - held(block), 2 * tokens * vocab * 4 - block_rows * vocab * 2 - tokens * hidden * 2);
  // a budget above the whole logits holds every row in one block
  EXPECT_EQ(held(std::int64_t{1} << 40) - held(block), (tokens - block_rows) * vocab * 2);
}

}  // namespace
}  // namespace test_model_config_cases
