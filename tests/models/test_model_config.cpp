// ModelConfig's arithmetic and validation, and the memory estimate built on it: sizes derived from
// the configuration never overflow silently, non-finite numbers are refused, and the estimate's
// parameter count is the models' own.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include <strata/models/config.hpp>
#include <strata/models/memory_estimate.hpp>

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

}  // namespace
