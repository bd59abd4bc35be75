// Test helpers: run a function on N in-process ranks, gather every parameter's global value and
// gradient, and compare runs by relative error ||a - b|| / ||b||.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <strata/comm.hpp>
#include <strata/layers.hpp>
#include <strata/policy.hpp>

namespace strata_test {

using Values = std::vector<double>;

// The policy the tests instantiate layers and models with.
template <class T, bool SP>
struct TestPolicy : strata::default_policy {
  using element = T;
  static constexpr bool sequence_parallel = SP;
};

// Standard-normal values from the counter-based generator (key, element index).
template <class T>
strata::Tensor<T> random_tensor(strata::Shape shape, std::uint64_t key) {
  strata::Tensor<T> t(shape);
  for (strata::index_t i = 0; i < t.numel(); ++i)
    t[i] = static_cast<T>(strata::rng::normal(key, static_cast<std::uint64_t>(i)));
  return t;
}

struct Snapshot {
  std::map<std::string, Values> values;  // global parameter values by name
  std::map<std::string, Values> grads;   // global gradients by name
  std::vector<Values> outputs;           // whatever the test records (losses, outputs)
};

template <class X>
Values to_values(const strata::Tensor<X>& t) {
  Values out(static_cast<std::size_t>(t.numel()));
  for (strata::index_t i = 0; i < t.numel(); ++i) out[i] = static_cast<double>(static_cast<strata::accumulate_t<X>>(t[i]));
  return out;
}

inline double relative_error(const Values& a, const Values& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    ref += b[i] * b[i];
  }
  return ref == 0 ? std::sqrt(diff) : std::sqrt(diff / ref);
}

// Collective: gathers every parameter of `module` over ctx.tp into `snapshot` (written by tp rank 0
// of the first data/pipeline group only).
template <class Context, class Module>
void gather_parameters(Context& ctx, Module& module, Snapshot& snapshot, std::mutex& mutex) {
  module.for_each_parameter([&](auto& p) {
    auto value = strata::gather_global(ctx.tp, p, p.value);
    auto grad = strata::gather_global(ctx.tp, p, p.grad);
    if (ctx.world.rank() == 0) {
      std::lock_guard lock(mutex);
      snapshot.values[p.name] = to_values(value);
      snapshot.grads[p.name] = to_values(grad);
    }
  });
}

inline double norm(const Values& v) {
  double sum = 0;
  for (double x : v) sum += x * x;
  return std::sqrt(sum);
}

// Every parameter, gradient and output of `got` within `tolerance` of `want`. relative_error falls
// back to the absolute error when the reference is zero, so a gradient that is zero in both runs
// (a backward that never ran, or never reached a parameter) would pass: every reference gradient
// must also be non-zero, and so must the compared one.
inline void expect_equivalent(const Snapshot& got, const Snapshot& want, double tolerance, const std::string& what) {
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (const auto& [name, w] : want.grads) {
    ASSERT_TRUE(got.grads.count(name)) << what << ": missing parameter " << name;
    EXPECT_GT(norm(w), 0.0) << what << ": the reference gradient of " << name << " is zero, so comparing it proves nothing";
    EXPECT_GT(norm(got.grads.at(name)), 0.0) << what << ": the gradient of " << name << " is zero";
    EXPECT_LE(relative_error(got.values.at(name), want.values.at(name)), tolerance) << what << ": value of " << name;
    EXPECT_LE(relative_error(got.grads.at(name), w), tolerance) << what << ": gradient of " << name;
  }
  ASSERT_EQ(got.outputs.size(), want.outputs.size()) << what;
  for (std::size_t i = 0; i < want.outputs.size(); ++i)
    EXPECT_LE(relative_error(got.outputs[i], want.outputs[i]), tolerance) << what << ": output " << i;
}

template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}

}  // namespace strata_test
