// strata/core/space.hpp: memory spaces, the tag that says where a tensor's elements live.
//
//   space::host   ordinary memory; elements are readable and writable from C++ (std::span)
//   space::cuda   device memory of the current CUDA device; only kernels touch the elements, so
//                 the view type is `device_span<T>`, which has a pointer and a size and no
//                 operator[] (a device tensor handed to host-only code does not compile)
//
// `span_t<T, Space>` is the view a communicator or a kernel entry point takes for that space
// (std::span<T> for host, so host code written before spaces existed keeps compiling).
//
// Core knows nothing of CUDA. Device memory comes from a `device_memory_resource` that the CUDA
// backend installs for the calling thread (`current_device_resource()`); allocating a device tensor
// on a thread with none installed is an Error naming the fix.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>

#include "error.hpp"

STRATA_NAMESPACE_BEGIN

// A view of `size` elements of device memory: pointer arithmetic only, no element access.
template <class T>
class device_span {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  constexpr device_span() = default;
  constexpr device_span(T* data, std::size_t size) : data_(data), size_(size) {}
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  constexpr device_span(device_span<U> other) : data_(other.data()), size_(other.size()) {}

  constexpr T* data() const { return data_; }
  constexpr std::size_t size() const { return size_; }
  constexpr std::size_t size_bytes() const { return size_ * sizeof(T); }
  constexpr bool empty() const { return size_ == 0; }
  constexpr device_span subspan(std::size_t offset, std::size_t count) const {
    if (offset > size_ || count > size_ - offset)
      fail<ShapeError>("device_span::subspan(", offset, ", ", count, ") is outside a span of ", size_, " elements");
    return {data_ + offset, count};
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// The kinds of copy a device memory resource performs (host pointers are ordinary memory).
enum class copy_kind { host_to_device, device_to_host, device_to_device };

// Where device memory comes from. The CUDA backend installs one per thread (a caching allocator
// on the rank's device, ordered on the rank's compute stream). Copies and zeroing are ordered on
// the same stream; copies to the host return when the bytes have arrived.
class device_memory_resource {
 public:
  virtual ~device_memory_resource() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  // A block that lives across steps (a workspace kept by a backend), returned with deallocate. A
  // caching resource takes it fresh rather than from the blocks the step frees and reuses, so that
  // holding it does not leave the next step one block short.
  virtual void* allocate_long_lived(std::size_t bytes) { return allocate(bytes); }
  virtual void deallocate(void* pointer, std::size_t bytes) noexcept = 0;
  virtual void copy(void* destination, const void* source, std::size_t bytes, copy_kind kind) = 0;
  virtual void zero(void* pointer, std::size_t bytes) = 0;
  virtual std::string_view name() const = 0;
};

// The calling thread's device memory resource (nullptr until a device backend installs one).
inline device_memory_resource*& current_device_resource() {
  thread_local device_memory_resource* resource = nullptr;
  return resource;
}

inline device_memory_resource& require_device_resource(const char* who) {
  device_memory_resource* resource = current_device_resource();
  if (!resource)
    fail<Error>(who, ": no device memory resource on this thread; create the rank's cuda::backend (it installs "
                     "its allocator) on this thread before allocating device tensors");
  return *resource;
}

namespace space {

struct host {
  static constexpr std::string_view name = "host";
  static constexpr bool host_accessible = true;
  template <class T>
  using span = std::span<T>;
};

struct cuda {
  static constexpr std::string_view name = "cuda";
  static constexpr bool host_accessible = false;
  template <class T>
  using span = device_span<T>;
};

template <class S>
inline constexpr bool is_space_v = std::is_same_v<S, host> || std::is_same_v<S, cuda>;

}  // namespace space

template <class T, class Space>
using span_t = typename Space::template span<T>;

STRATA_NAMESPACE_END
