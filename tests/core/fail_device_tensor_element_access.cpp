// Must fail to compile, with the compiler naming the unsatisfied `on_host` constraint: host-only
// code (operator[] and span()) given a Tensor<float, space::cuda>. With STRATA_FAILTEST_CONTROL
// the tensor is a host one and the same code compiles.
#include <span>

#include <strata/core/tensor.hpp>

namespace {

#ifdef STRATA_FAILTEST_CONTROL
using Checked = strata::Tensor<float, strata::space::host>;
#else
using Checked = strata::Tensor<float, strata::space::cuda>;
#endif

[[maybe_unused]] float first_element(const Checked& t) { return t[0]; }
[[maybe_unused]] std::span<const float> elements(const Checked& t) { return t.span(); }

}  // namespace
