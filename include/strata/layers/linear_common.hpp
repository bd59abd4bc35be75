// strata/layers/linear_common.hpp: the matmul pieces shared by the parallel linear layers, on the
// backend object (`device`); tensors live in the backend's space.
//
//   forward   y[rows,out] = x[rows,in] W[out,in]^T (+ b, fused into the GEMM)
//   backward  dW[out,in] += dy^T x;  db[out] += sum_rows dy;  dx[rows,in] = dy W
// and the GELU fusions of the MLP (backend gemm_gelu / gemm_gelu_backward, one GEMM each where the
// backend can fuse them):
//   linear_forward_gelu   pre = x W^T (+ b), y = gelu(pre)
//   linear_backward with gelu_pre: dx = (dy W) * gelu'(gelu_pre), the gradient before the GELU that
//                         produced this layer's input
#pragma once

#include <type_traits>

#include "../core/tensor.hpp"
#include "parameter.hpp"

STRATA_NAMESPACE_BEGIN

namespace detail {

template <class Device, class T, class Space>
void add_bias(Device& device, Tensor<T, Space>& y, const Parameter<T, Space>& bias) {
  device.template bias_add<T>(y.data(), bias.value.data(), y.shape().rows(), y.shape().cols());
}

template <class Device, class T, class Space>
Tensor<T, Space> linear_forward(Device& device, const Tensor<T, Space>& x, const Parameter<T, Space>& weight,
                                const std::type_identity_t<Parameter<T, Space>>* bias, const char* who) {
  const index_t in = weight.value.size(1), out = weight.value.size(0);
  if (x.shape().cols() != in)
    fail<ShapeError>(who, ": input ", x.shape().str(), " has ", x.shape().cols(), " features, the weight ",
                     weight.value.shape().str(), " expects ", in);
  const index_t rows = x.shape().rows();
  auto y = Tensor<T, Space>::empty(x.shape().with(-1, out));  // (rows, out)
  device.template gemm<T>(false, true, rows, out, in, x.data(), weight.value.data(), y.data(), false,
                          bias ? bias->value.data() : nullptr);
  return y;
}

// y = gelu(x W^T + b); `pre` receives x W^T + b (same shape as y).
template <class Device, class T, class Space>
Tensor<T, Space> linear_forward_gelu(Device& device, const Tensor<T, Space>& x, const Parameter<T, Space>& weight,
                                     const std::type_identity_t<Parameter<T, Space>>* bias, Tensor<T, Space>& pre,
                                     const char* who) {
  const index_t in = weight.value.size(1), out = weight.value.size(0);
  if (x.shape().cols() != in)
    fail<ShapeError>(who, ": input ", x.shape().str(), " has ", x.shape().cols(), " features, the weight ",
                     weight.value.shape().str(), " expects ", in);
  const index_t rows = x.shape().rows();
  pre = Tensor<T, Space>::empty(x.shape().with(-1, out));  // (rows, out)
  auto y = Tensor<T, Space>::empty(x.shape().with(-1, out));
  device.template gemm_gelu<T>(false, true, rows, out, in, x.data(), weight.value.data(),
                               bias ? bias->value.data() : nullptr, pre.data(), y.data());
  return y;
}

// Accumulates dW (and db), returns dx (times gelu'(*gelu_pre) when gelu_pre is given).
template <class Device, class T, class Space>
Tensor<T, Space> linear_backward(Device& device, const Tensor<T, Space>& x, const Tensor<T, Space>& dy,
                                 Parameter<T, Space>& weight, Parameter<T, Space>* bias,
                                 const Tensor<T, Space>* gelu_pre = nullptr) {
  using A = accumulate_t<T>;
  const index_t in = weight.value.size(1), out = weight.value.size(0), rows = x.shape().rows();
  if (dy.shape().rows() != rows || dy.shape().cols() != out)
    fail<ShapeError>("linear backward: output gradient ", dy.shape().str(), " does not match ", rows, " rows of ", out,
                     " features");
  device.template gemm<T, A>(true, false, out, in, rows, dy.data(), x.data(), weight.grad.data(), true);  // (out,in)
  if (bias) device.template bias_grad<T>(dy.data(), rows, out, bias->grad.data());
  auto dx = Tensor<T, Space>::empty(x.shape());  // (rows,in)
  if (gelu_pre) {
    if (!(gelu_pre->shape() == x.shape()))
      fail<ShapeError>("linear backward: the GELU pre-activation ", gelu_pre->shape().str(), " does not match the input ",
                       x.shape().str());
    device.template gemm_gelu_backward<T>(false, false, rows, in, out, dy.data(), weight.value.data(), gelu_pre->data(),
                                          dx.data());
  } else {
    device.template gemm<T>(false, false, rows, in, out, dy.data(), weight.value.data(), dx.data(), false);
  }
  return dx;
}

}  // namespace detail

STRATA_NAMESPACE_END
