// tests/training/same_parameters.hpp: the training tests' check that two runs end with the same
// parameters, bit for bit (TrainArgs::keep_final_parameters on both).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "trainer/trainer.hpp"

namespace strata_training_test {

// Every final parameter of `a` is bit for bit that of `b` (same names, same order, at least one).
inline void expect_same_parameters(const trainer::TrainResult& a, const trainer::TrainResult& b, const std::string& what) {
  ASSERT_EQ(a.final_parameters.size(), b.final_parameters.size()) << what;
  ASSERT_FALSE(b.final_parameters.empty()) << what << ": no parameters kept (keep_final_parameters)";
  for (std::size_t k = 0; k < b.final_parameters.size(); ++k) {
    const auto& [name, values] = a.final_parameters[k];
    EXPECT_EQ(name, b.final_parameters[k].first) << what;
    EXPECT_TRUE(values == b.final_parameters[k].second) << what << ": " << name << " differs";
  }
}

}  // namespace strata_training_test
