// strata/layers/linear_common.hpp: the plain matmul pieces shared by the parallel linear layers.
//
//   forward   y[rows,out] = x[rows,in] W[out,in]^T (+ b)
//   backward  dW[out,in] += dy^T x;  db[out] += sum_rows dy;  dx[rows,in] = dy W
#pragma once

#include <type_traits>

#include "../core/tensor.hpp"
#include "parameter.hpp"

STRATA_NAMESPACE_BEGIN
namespace detail {

template <class T>
void add_bias(Tensor<T>& y, const Parameter<T>& bias) {
  const index_t cols = y.shape().cols(), rows = y.shape().rows();
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c)
      y[r * cols + c] = static_cast<T>(static_cast<accumulate_t<T>>(y[r * cols + c]) + static_cast<accumulate_t<T>>(bias.value[c]));
}

template <class Backend, class T>
Tensor<T> linear_forward(const Tensor<T>& x, const Parameter<T>& weight, const std::type_identity_t<Parameter<T>>* bias, const char* who) {
  const index_t in = weight.value.size(1), out = weight.value.size(0);
  if (x.shape().cols() != in)
    fail<ShapeError>(who, ": input ", x.shape().str(), " has ", x.shape().cols(), " features, the weight ",
                     weight.value.shape().str(), " expects ", in);
  const index_t rows = x.shape().rows();
  Tensor<T> y(x.shape().with(-1, out));  // (rows, out)
  Backend::gemm(false, true, rows, out, in, x.data(), weight.value.data(), y.data(), false);
  if (bias) add_bias(y, *bias);
  return y;
}

// Accumulates dW (and db), returns dx.
template <class Backend, class T>
Tensor<T> linear_backward(const Tensor<T>& x, const Tensor<T>& dy, Parameter<T>& weight, Parameter<T>* bias) {
  const index_t in = weight.value.size(1), out = weight.value.size(0), rows = x.shape().rows();
  if (dy.shape().rows() != rows || dy.shape().cols() != out)
    fail<ShapeError>("linear backward: output gradient ", dy.shape().str(), " does not match ", rows, " rows of ", out,
                     " features");
  Backend::gemm(true, false, out, in, rows, dy.data(), x.data(), weight.grad.data(), true);  // (out,in)
  if (bias)
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < out; ++c) bias->grad[c] += static_cast<accumulate_t<T>>(dy[r * out + c]);
  Tensor<T> dx(x.shape());  // (rows,in)
  Backend::gemm(false, false, rows, in, out, dy.data(), weight.value.data(), dx.data(), false);
  return dx;
}

}  // namespace detail
STRATA_NAMESPACE_END
