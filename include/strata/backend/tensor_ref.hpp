// strata/backend/tensor_ref.hpp: `TensorRef<X>`, one tensor of a multi-tensor entry point (a pointer
// in the backend's space and an element count), as a list of them reaches a backend's
// sum_of_squares_many, scale_by_many and fill_many (where it has them). The gradient utilities
// (optim/grad_utils.hpp) hand every gradient of a model to one such call instead of one call each.
//
//   sum_of_squares_many(std::span<const SquaresTensor<X>>, double* accumulator)
//       the same as sum_of_squares on each tensor in list order
//   scale_by_many(std::span<const TensorRef<X>>, const double* factor), fill_many(..., double value)
//       the same as scale_by / fill on each tensor
#pragma once

#include <type_traits>

#include "../core/config.hpp"
#include "../core/shape.hpp"

STRATA_NAMESPACE_BEGIN

template <class X>
struct TensorRef {
  using element_type = X;
  X* data;
  index_t n;
};
// A tensor that a multi-tensor reduction reads.
template <class X>
using SquaresTensor = TensorRef<const X>;

static_assert(std::is_trivially_copyable_v<TensorRef<float>>, "TensorRef is copied into kernel arguments, so it must be trivially copyable.");

STRATA_NAMESPACE_END
