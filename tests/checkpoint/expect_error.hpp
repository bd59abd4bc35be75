// expect_error and same_bytes: the checks the checkpoint and Hugging Face tests share (a header
// without the model types, so the format tests compile light).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <string>

#include <strata/core/tensor.hpp>

namespace strata_test {

// The two tensors have the same shape and the same bytes.
template <class X>
bool same_bytes(const strata::Tensor<X>& a, const strata::Tensor<X>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

// Runs `f`, expects an exception of type E whose message holds every one of `parts`.
template <class E>
void expect_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected an exception; none was thrown (wanted: " << *parts.begin() << ")";
  } catch (const E& e) {
    const std::string m = e.what();
    for (const std::string& part : parts) EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' not in: " << m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

}  // namespace strata_test
