// strata/core/tensor.hpp: `Tensor<T>` (owning, contiguous, row-major) and `TensorView<T>`
// (non-owning pointer + shape; `TensorView<const T>` for read-only).
//
// Deliberately minimal: layers do their own indexing with shape comments beside the code; the
// backend receives raw pointers plus sizes (llm.c style). Element access checks nothing in hot
// loops; shape-level operations check and throw ShapeError.
#pragma once

#include <algorithm>
#include <span>
#include <type_traits>
#include <vector>

#include "dtype.hpp"
#include "shape.hpp"

STRATA_NAMESPACE_BEGIN

template <class T>
class TensorView {
 public:
  using element_type = T;
  using value_type = std::remove_const_t<T>;

  constexpr TensorView() = default;
  constexpr TensorView(T* data, Shape shape) : data_(data), shape_(shape) {}
  // A view of non-const converts to a view of const.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  constexpr TensorView(TensorView<U> other) : data_(other.data()), shape_(other.shape()) {}

  constexpr T* data() const { return data_; }
  constexpr const Shape& shape() const { return shape_; }
  constexpr index_t numel() const { return shape_.numel(); }
  constexpr index_t size(int d) const { return shape_[d]; }
  constexpr std::span<T> span() const { return {data_, static_cast<std::size_t>(numel())}; }
  constexpr T& operator[](index_t i) const { return data_[i]; }
  // Rows [begin, end) of the leading dimension, as a view.
  TensorView slice_rows(index_t begin, index_t end) const {
    if (begin < 0 || end < begin || end > shape_[0])
      fail<ShapeError>("slice_rows [", begin, ", ", end, ") is outside ", shape_.str());
    index_t inner = shape_[0] == 0 ? 0 : numel() / shape_[0];
    return {data_ + begin * inner, shape_.with(0, end - begin)};
  }
  TensorView reshaped(Shape s) const {
    if (s.numel() != numel()) fail<ShapeError>("cannot view ", shape_.str(), " as ", s.str());
    return {data_, s};
  }

 private:
  T* data_ = nullptr;
  Shape shape_{};
};

template <class T>
class Tensor {
 public:
  using value_type = T;

  Tensor() = default;
  explicit Tensor(Shape shape) : shape_(shape), data_(static_cast<std::size_t>(shape.numel())) {}
  Tensor(Shape shape, T fill) : shape_(shape), data_(static_cast<std::size_t>(shape.numel()), fill) {}
  Tensor(Shape shape, std::vector<T> values) : shape_(shape), data_(std::move(values)) {
    if (static_cast<index_t>(data_.size()) != shape.numel())
      fail<ShapeError>("Tensor of shape ", shape.str(), " needs ", shape.numel(), " values, got ", data_.size());
  }
  static Tensor zeros(Shape shape) { return Tensor(shape); }
  static Tensor zeros_like(const Tensor& other) { return Tensor(other.shape()); }
  static Tensor copy_of(TensorView<const T> view) {
    return Tensor(view.shape(), std::vector<T>(view.data(), view.data() + view.numel()));
  }

  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  index_t numel() const { return shape_.numel(); }
  index_t size(int d) const { return shape_[d]; }
  bool empty() const { return data_.empty(); }

  T* data() { return data_.data(); }
  const T* data() const { return data_.data(); }
  std::span<T> span() { return data_; }
  std::span<const T> span() const { return data_; }
  T& operator[](index_t i) { return data_[static_cast<std::size_t>(i)]; }
  const T& operator[](index_t i) const { return data_[static_cast<std::size_t>(i)]; }

  TensorView<T> view() { return {data(), shape_}; }
  TensorView<const T> view() const { return {data(), shape_}; }
  operator TensorView<T>() { return view(); }
  operator TensorView<const T>() const { return view(); }

  void reshape(Shape s) {
    if (s.numel() != numel()) fail<ShapeError>("cannot reshape ", shape_.str(), " to ", s.str());
    shape_ = s;
  }
  Tensor reshaped(Shape s) const& {
    Tensor out = *this;
    out.reshape(s);
    return out;
  }
  Tensor reshaped(Shape s) && {
    reshape(s);
    return std::move(*this);
  }
  void fill(T value) { std::fill(data_.begin(), data_.end(), value); }
  void zero() { fill(T{}); }

 private:
  Shape shape_{};
  std::vector<T> data_{};
};

// Element-wise conversion between element types (through accumulate precision).
template <class To, class From>
Tensor<To> convert(TensorView<const From> in) {
  Tensor<To> out(in.shape());
  for (index_t i = 0; i < in.numel(); ++i) out[i] = static_cast<To>(static_cast<accumulate_t<From>>(in[i]));
  return out;
}

STRATA_NAMESPACE_END
