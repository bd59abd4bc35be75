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
// and the residual add in the epilogue (backend gemm_add, optional: has_gemm_add):
//   linear_forward_add    y = x W^T (+ b) + addend, one rounding where the backend fuses it, else
//                         the GEMM, then y += addend (the bits of the layer followed by an add)
//
// The `_rows` forms take pointers to a block of rows, so a caller may run a layer over its rows in
// pieces (the chunked classifier); the tensor forms check shapes and run them on every row.
#pragma once

#include <type_traits>
#include <utility>

#include "../core/tensor.hpp"
#include "deferred_weight_gradients.hpp"
#include "parameter.hpp"

STRATA_NAMESPACE_BEGIN

namespace detail {

// Throws ShapeError naming `who` unless an input of shape x has the weight's input features.
template <class T, class Space>
void check_linear_input(const Shape& x, const Parameter<T, Space>& weight, const char* who) {
  const index_t in = weight.value.size(1);
  if (x.cols() != in)
    fail<ShapeError>(who, ": input ", x.str(), " has ", x.cols(), " features, the weight ", weight.value.shape().str(),
                     " expects ", in);
}

// dx[rows, in] = dy W, or (dy W) * gelu'(gelu_pre) when gelu_pre (rows x in) is given.
template <class Device, class T, class Space>
void linear_input_gradient_rows(Device& device, const T* dy, index_t rows, const Parameter<T, Space>& weight, T* dx,
                                const T* gelu_pre = nullptr) {
  const index_t in = weight.value.size(1), out = weight.value.size(0);
  if (gelu_pre)
    device.template gemm_gelu_backward<T>(false, false, rows, in, out, dy, weight.value.data(), gelu_pre, dx);
  else
    device.template gemm<T>(false, false, rows, in, out, dy, weight.value.data(), dx, false);  // (rows, in)
}

// A backend whose GEMM can add a tensor of the output's shape in its epilogue (cuda::backend):
// gemm_add(ta, tb, m, n, k, a, b, bias, addend, out) writes out = op(a) op(b) (+ bias) + addend.
template <class Device, class T>
concept has_gemm_add = requires(Device& d, const T* ct, T* t, index_t n) {
  d.template gemm_add<T>(false, true, n, n, n, ct, ct, ct, ct, t);
};

template <class Device, class T, class Space>
void add_bias(Device& device, Tensor<T, Space>& y, const Parameter<T, Space>& bias) {
  device.template bias_add<T>(y.data(), bias.value.data(), y.shape().rows(), y.shape().cols());
}

// y[rows, out] = x[rows, in] W^T (+ b): `rows` rows starting at x and y (the whole tensor, or a
// block of rows of it, as the chunked classifier runs it).
template <class Device, class T, class Space>
void linear_forward_rows(Device& device, const T* x, index_t rows, const Parameter<T, Space>& weight,
                         const std::type_identity_t<Parameter<T, Space>>* bias, T* y) {
  const index_t in = weight.value.size(1), out = weight.value.size(0);
  device.template gemm<T>(false, true, rows, out, in, x, weight.value.data(), y, false,  // (rows, out)
                          bias ? bias->value.data() : nullptr);
}

template <class Device, class T, class Space>
Tensor<T, Space> linear_forward(Device& device, const Tensor<T, Space>& x, const Parameter<T, Space>& weight,
                                const std::type_identity_t<Parameter<T, Space>>* bias, const char* who) {
  check_linear_input(x.shape(), weight, who);
  auto y = Tensor<T, Space>::empty(x.shape().with(-1, weight.value.size(0)));  // (rows, out)
  linear_forward_rows(device, x.data(), x.shape().rows(), weight, bias, y.data());
  return y;
}

// y = x W^T (+ b) + addend (addend of y's shape): in the GEMM's epilogue where the backend has
// gemm_add, else linear_forward then y += addend.
template <class Device, class T, class Space>
Tensor<T, Space> linear_forward_add(Device& device, const Tensor<T, Space>& x, const Parameter<T, Space>& weight,
                                    const std::type_identity_t<Parameter<T, Space>>* bias, const Tensor<T, Space>& addend,
                                    const char* who) {
  check_linear_input(x.shape(), weight, who);
  const Shape shape = x.shape().with(-1, weight.value.size(0));  // (rows, out)
  if (addend.shape() != shape)
    fail<ShapeError>(who, ": the addend ", addend.shape().str(), " does not have the output's shape ", shape.str());
  if constexpr (has_gemm_add<Device, T>) {
    auto y = Tensor<T, Space>::empty(shape);
    const index_t in = weight.value.size(1), out = weight.value.size(0);
    device.template gemm_add<T>(false, true, shape.rows(), out, in, x.data(), weight.value.data(),
                                bias ? bias->value.data() : nullptr, addend.data(), y.data());
    return y;
  } else {
    auto y = linear_forward(device, x, weight, bias, who);
    device.template add<T>(y.data(), addend.data(), y.numel(), y.data());
    return y;
  }
}

// y = gelu(x W^T + b); `pre` receives x W^T + b (same shape as y).
template <class Device, class T, class Space>
Tensor<T, Space> linear_forward_gelu(Device& device, const Tensor<T, Space>& x, const Parameter<T, Space>& weight,
                                     const std::type_identity_t<Parameter<T, Space>>* bias, Tensor<T, Space>& pre,
                                     const char* who) {
  const index_t in = weight.value.size(1), out = weight.value.size(0);
  check_linear_input(x.shape(), weight, who);
  const index_t rows = x.shape().rows();
  pre = Tensor<T, Space>::empty(x.shape().with(-1, out));  // (rows, out)
  auto y = Tensor<T, Space>::empty(x.shape().with(-1, out));
  device.template gemm_gelu<T>(false, true, rows, out, in, x.data(), weight.value.data(),
                               bias ? bias->value.data() : nullptr, pre.data(), y.data());
  return y;
}

// dW[out, in] += dy^T x and db[out] += sum_rows dy; dW = dy^T x when the weight's gradient is
// stale (the first write after a zero by first write: layers/parameter.hpp).
template <class Device, class T, class Space>
void linear_weight_gradient_rows(Device& device, const T* x, const T* dy, index_t rows, Parameter<T, Space>& weight,
                                 Parameter<T, Space>* bias) {
  using A = accumulate_t<T>;
  const index_t in = weight.value.size(1), out = weight.value.size(0);
  const bool overwrite = std::exchange(weight.grad_stale, false);
  device.template gemm<T, A>(true, false, out, in, rows, dy, x, weight.grad.data(), !overwrite);  // (out, in)
  if (bias) device.template bias_grad<T>(dy, rows, out, bias->grad.data());
}

// The backward of linear_forward_rows on `rows` rows: accumulates dW[out, in] += dy^T x (and
// db[out] += sum_rows dy), writes dx[rows, in] = dy W, or (dy W) * gelu'(gelu_pre) when gelu_pre
// (rows x in, the pre-activation of the GELU that produced x) is given.
template <class Device, class T, class Space>
void linear_backward_rows(Device& device, const T* x, const T* dy, index_t rows, Parameter<T, Space>& weight,
                          Parameter<T, Space>* bias, T* dx, const T* gelu_pre = nullptr) {
  linear_weight_gradient_rows(device, x, dy, rows, weight, bias);
  linear_input_gradient_rows(device, dy, rows, weight, dx, gelu_pre);
}

// Appends linear_weight_gradient_rows over every row of x and dy to `deferred`: the closure keeps x
// and dy (shared handles) and the device, which must outlive it.
template <class Device, class T, class Space>
void defer_weight_gradient(Device& device, const Tensor<T, Space>& x, const Tensor<T, Space>& dy,
                           Parameter<T, Space>& weight, Parameter<T, Space>* bias, DeferredWeightGradients& deferred) {
  deferred.add([&device, x, dy, rows = x.shape().rows(), &weight, bias] {
    linear_weight_gradient_rows(device, x.data(), dy.data(), rows, weight, bias);
  });
}

// Accumulates dW (and db), returns dx (times gelu'(*gelu_pre) when gelu_pre is given). With
// `deferred`, dx is computed now and the dW (and db) accumulation is appended to the list: the
// closure keeps x and dy (shared handles) and the device, which must outlive it.
template <class Device, class T, class Space>
Tensor<T, Space> linear_backward(Device& device, const Tensor<T, Space>& x, const Tensor<T, Space>& dy,
                                 Parameter<T, Space>& weight, Parameter<T, Space>* bias,
                                 const std::type_identity_t<Tensor<T, Space>>* gelu_pre = nullptr,
                                 DeferredWeightGradients* deferred = nullptr) {
  const index_t out = weight.value.size(0), rows = x.shape().rows();
  if (dy.shape().rows() != rows || dy.shape().cols() != out)
    fail<ShapeError>("linear backward: output gradient ", dy.shape().str(), " does not match ", rows, " rows of ", out,
                     " features");
  if (gelu_pre && !(gelu_pre->shape() == x.shape()))
    fail<ShapeError>("linear backward: the GELU pre-activation ", gelu_pre->shape().str(), " does not match the input ",
                     x.shape().str());
  auto dx = Tensor<T, Space>::empty(x.shape());  // (rows, in)
  if (!deferred) {
    linear_backward_rows(device, x.data(), dy.data(), rows, weight, bias, dx.data(), gelu_pre ? gelu_pre->data() : nullptr);
    return dx;
  }
  linear_input_gradient_rows(device, dy.data(), rows, weight, dx.data(), gelu_pre ? gelu_pre->data() : nullptr);
  defer_weight_gradient(device, x, dy, weight, bias, *deferred);
  return dx;
}

}  // namespace detail

STRATA_NAMESPACE_END
