// strata/core/tensor.hpp: `Tensor<T, Space>`, a handle to a contiguous row-major buffer in a memory
// space, and `TensorView<T, Space>` (non-owning pointer + shape; `TensorView<const T>` read-only).
//
// Copying a Tensor shares its buffer (as a shared_ptr does); deep copies are explicit: `clone()`
// in the same space, `to_host(t)` / `to_device(t)` / `copy(dst, src)` across spaces (through the
// calling thread's device memory resource). `Tensor::empty(shape)` leaves elements unset,
// `Tensor::zeros(shape)` sets them to zero, and the host constructor `Tensor(shape)` zero-fills.
// Element access (`operator[]`, `span()`, `fill()`, iteration) exists only for space::host, by a
// `requires` clause: a device tensor reaching host-only code does not compile. `data()`, `shape()`,
// `numel()` and `buffer()` (a span_t) exist in every space.
//
// Deliberately minimal: layers hand raw pointers plus sizes to the backend (llm.c style) and never
// write into a tensor they were given (a saved input may share it).
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "dtype.hpp"
#include "host_memory.hpp"
#include "shape.hpp"
#include "space.hpp"

STRATA_NAMESPACE_BEGIN

template <class T, class Space = space::host>
class TensorView {
  static_assert(space::is_space_v<Space>, "TensorView's second argument must be a memory space tag (strata::space::host or space::cuda).");

 public:
  using element_type = T;
  using value_type = std::remove_const_t<T>;
  using space_type = Space;
  static constexpr bool on_host = std::is_same_v<Space, space::host>;

  constexpr TensorView() = default;
  constexpr TensorView(T* data, Shape shape) : data_(data), shape_(shape) {}
  // A view of non-const converts to a view of const.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  constexpr TensorView(TensorView<U, Space> other) : data_(other.data()), shape_(other.shape()) {}

  constexpr T* data() const { return data_; }
  constexpr const Shape& shape() const { return shape_; }
  constexpr index_t numel() const { return shape_.numel(); }
  constexpr index_t size(int d) const { return shape_[d]; }
  constexpr span_t<T, Space> buffer() const { return {data_, static_cast<std::size_t>(numel())}; }
  constexpr std::span<T> span() const
    requires on_host
  {
    return {data_, static_cast<std::size_t>(numel())};
  }
  constexpr T& operator[](index_t i) const
    requires on_host
  {
    return data_[i];
  }
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

namespace detail {

// A buffer of n elements in `Space`, zero-filled when `zero`.
template <class T, class Space>
std::shared_ptr<T> allocate_buffer(index_t n, bool zero) {
  static_assert(std::is_trivially_copyable_v<T>, "Tensor elements must be trivially copyable (they are moved as bytes between spaces).");
  if (n == 0) return {};
  const std::size_t count = static_cast<std::size_t>(n);
  if constexpr (std::is_same_v<Space, space::host>) {
    const std::size_t bytes = count * sizeof(T);
    T* p = static_cast<T*>(host_memory::allocate(bytes));  // recycled across steps (host_memory.hpp)
    if (zero) std::memset(static_cast<void*>(p), 0, bytes);
    return std::shared_ptr<T>(p, [bytes](T* q) { host_memory::deallocate(q, bytes); });
  } else {
    device_memory_resource& resource = require_device_resource("Tensor");
    const std::size_t bytes = count * sizeof(T);
    T* p = static_cast<T*>(resource.allocate(bytes));
    std::shared_ptr<T> out(p, [&resource, bytes](T* q) { resource.deallocate(q, bytes); });
    if (zero) resource.zero(p, bytes);
    return out;
  }
}

}  // namespace detail

template <class T, class Space = space::host>
class Tensor {
  static_assert(space::is_space_v<Space>, "Tensor's second argument must be a memory space tag (strata::space::host or space::cuda).");

 public:
  using value_type = T;
  using space_type = Space;
  static constexpr bool on_host = std::is_same_v<Space, space::host>;

  Tensor() = default;
  // Host: zero-filled (as a std::vector would be).
  explicit Tensor(Shape shape)
    requires on_host
      : shape_(shape), buffer_(detail::allocate_buffer<T, Space>(shape.numel(), true)) {}
  Tensor(Shape shape, T fill)
    requires on_host
      : Tensor(shape) {
    this->fill(fill);
  }
  Tensor(Shape shape, const std::vector<T>& values)
    requires on_host
      : shape_(shape), buffer_(detail::allocate_buffer<T, Space>(shape.numel(), false)) {
    if (static_cast<index_t>(values.size()) != shape.numel())
      fail<ShapeError>("Tensor of shape ", shape.str(), " needs ", shape.numel(), " values, got ", values.size());
    std::copy(values.begin(), values.end(), buffer_.get());
  }

  // Elements left unset.
  static Tensor empty(Shape shape) { return Tensor(shape, detail::allocate_buffer<T, Space>(shape.numel(), false)); }
  static Tensor zeros(Shape shape) { return Tensor(shape, detail::allocate_buffer<T, Space>(shape.numel(), true)); }
  static Tensor zeros_like(const Tensor& other) { return zeros(other.shape()); }
  // Elements [offset, offset + shape.numel()) of `owner`'s buffer as a tensor of `shape` that shares
  // (and keeps alive) that buffer: a parameter's gradient inside a contiguous gradient buffer.
  static Tensor alias(const Tensor& owner, index_t offset, Shape shape) {
    if (offset < 0 || shape.numel() < 0 || offset + shape.numel() > owner.numel())
      fail<ShapeError>("Tensor::alias: elements [", offset, ", ", offset + shape.numel(), ") are outside a buffer of ",
                       owner.numel(), " elements");
    if (shape.numel() == 0) return Tensor(shape, std::shared_ptr<T>());
    return Tensor(shape, std::shared_ptr<T>(owner.buffer_, owner.buffer_.get() + offset));
  }
  static Tensor copy_of(TensorView<const T> view)
    requires on_host
  {
    Tensor out = empty(view.shape());
    std::copy_n(view.data(), view.numel(), out.data());
    return out;
  }

  // A deep copy in the same space.
  Tensor clone() const {
    Tensor out = empty(shape_);
    if (numel() == 0) return out;
    if constexpr (on_host) std::copy_n(data(), numel(), out.data());
    else require_device_resource("Tensor::clone").copy(out.data(), data(), bytes(), copy_kind::device_to_device);
    return out;
  }

  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  index_t numel() const { return shape_.numel(); }
  index_t size(int d) const { return shape_[d]; }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * sizeof(T); }
  // True for a tensor without a buffer (default-constructed, or of zero elements).
  bool empty() const { return !buffer_; }
  // True when both handles share one buffer.
  bool shares_buffer_with(const Tensor& other) const { return buffer_ && buffer_ == other.buffer_; }

  T* data() { return buffer_.get(); }
  const T* data() const { return buffer_.get(); }
  span_t<T, Space> buffer() { return {data(), static_cast<std::size_t>(numel())}; }
  span_t<const T, Space> buffer() const { return {data(), static_cast<std::size_t>(numel())}; }

  std::span<T> span()
    requires on_host
  {
    return {data(), static_cast<std::size_t>(numel())};
  }
  std::span<const T> span() const
    requires on_host
  {
    return {data(), static_cast<std::size_t>(numel())};
  }
  T& operator[](index_t i)
    requires on_host
  {
    return data()[i];
  }
  const T& operator[](index_t i) const
    requires on_host
  {
    return data()[i];
  }
  T* begin()
    requires on_host
  {
    return data();
  }
  T* end()
    requires on_host
  {
    return data() + numel();
  }
  const T* begin() const
    requires on_host
  {
    return data();
  }
  const T* end() const
    requires on_host
  {
    return data() + numel();
  }
  void fill(T value)
    requires on_host
  {
    std::fill_n(data(), numel(), value);
  }
  void zero()
    requires on_host
  {
    fill(T{});
  }

  TensorView<T, Space> view() { return {data(), shape_}; }
  TensorView<const T, Space> view() const { return {data(), shape_}; }
  operator TensorView<T, Space>() { return view(); }
  operator TensorView<const T, Space>() const { return view(); }

  // The same buffer under another shape of as many elements.
  void reshape(Shape s) {
    if (s.numel() != numel()) fail<ShapeError>("cannot reshape ", shape_.str(), " to ", s.str());
    shape_ = s;
  }
  Tensor reshaped(Shape s) const {
    Tensor out = *this;
    out.reshape(s);
    return out;
  }

 private:
  Tensor(Shape shape, std::shared_ptr<T> buffer) : shape_(shape), buffer_(std::move(buffer)) {}

  Shape shape_{};
  std::shared_ptr<T> buffer_{};
};

// dst = src (same shape), across or within spaces; copies to the host return when the bytes arrived.
template <class T, class DstSpace, class SrcSpace>
void copy(Tensor<T, DstSpace>& dst, const Tensor<T, SrcSpace>& src) {
  check_same_shape(dst.shape(), src.shape(), "copy(dst, src)");
  if (src.numel() == 0) return;
  if constexpr (std::is_same_v<DstSpace, space::host> && std::is_same_v<SrcSpace, space::host>) {
    std::copy_n(src.data(), src.numel(), dst.data());
  } else {
    const copy_kind kind = std::is_same_v<DstSpace, space::host>   ? copy_kind::device_to_host
                           : std::is_same_v<SrcSpace, space::host> ? copy_kind::host_to_device
                                                                   : copy_kind::device_to_device;
    require_device_resource("copy(dst, src)").copy(dst.data(), src.data(), src.bytes(), kind);
  }
}

// A host copy of any tensor (a deep copy, also for a host tensor).
template <class T, class Space>
Tensor<T> to_host(const Tensor<T, Space>& t) {
  Tensor<T> out = Tensor<T>::empty(t.shape());
  copy(out, t);
  return out;
}

// A copy in space `To` (the device by default).
template <class To = space::cuda, class T, class Space>
Tensor<T, To> to_device(const Tensor<T, Space>& t) {
  Tensor<T, To> out = Tensor<T, To>::empty(t.shape());
  copy(out, t);
  return out;
}

// Element-wise conversion between element types on the host (through accumulate precision).
template <class To, class From>
Tensor<To> convert(TensorView<const From> in) {
  Tensor<To> out = Tensor<To>::empty(in.shape());
  for (index_t i = 0; i < in.numel(); ++i) out[i] = static_cast<To>(static_cast<accumulate_t<From>>(in[i]));
  return out;
}

STRATA_NAMESPACE_END
