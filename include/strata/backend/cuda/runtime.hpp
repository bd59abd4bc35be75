// strata/backend/cuda/runtime.hpp: error checks, device memory and streams for the CUDA backend.
//
// STRATA_CUDA_CHECK(expr) and STRATA_CUBLAS_CHECK(expr) turn a failed CUDA runtime or cuBLAS /
// cuBLASLt call into strata::Error whose message holds file:line, the call and the library's own
// name and description of the error. `device_buffer<T>` owns `count` elements of device memory
// (move-only, freed in the destructor); `stream` owns a non-blocking cudaStream_t. Destructors
// never throw: a failure while releasing is ignored, as the CUDA runtime's own wrappers do.
//
// Plain C++ (no kernels): compiles with nvcc or with a host compiler that sees the toolkit's
// include directory; link CUDA::cudart and CUDA::cublas (the strata::cuda target does).
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include "../../core/error.hpp"

STRATA_NAMESPACE_BEGIN
namespace cuda {

namespace detail {
[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* expr, const char* file, int line) {
  fail<Error>(file, ":", line, ": ", expr, " failed: ", cudaGetErrorName(status), ": ", cudaGetErrorString(status));
}
[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line) {
  fail<Error>(file, ":", line, ": ", expr, " failed: ", cublasGetStatusName(status), ": ",
              cublasGetStatusString(status));
}
}  // namespace detail

}  // namespace cuda
STRATA_NAMESPACE_END

// STRATA_CUDA_CHECK(expr): expr returns cudaError_t; throws strata::Error unless cudaSuccess.
#define STRATA_CUDA_CHECK(expr)                                                          \
  do {                                                                                   \
    const cudaError_t strata_cuda_status_ = (expr);                                      \
    if (strata_cuda_status_ != cudaSuccess)                                              \
      ::strata::cuda::detail::throw_cuda_error(strata_cuda_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// STRATA_CUBLAS_CHECK(expr): expr returns cublasStatus_t (cuBLAS and cuBLASLt alike).
#define STRATA_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                     \
    const cublasStatus_t strata_cublas_status_ = (expr);                                   \
    if (strata_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                    \
      ::strata::cuda::detail::throw_cublas_error(strata_cublas_status_, #expr, __FILE__, __LINE__); \
  } while (0)

STRATA_NAMESPACE_BEGIN
namespace cuda {

inline int device_count() {
  int n = 0;
  STRATA_CUDA_CHECK(cudaGetDeviceCount(&n));
  return n;
}
inline void set_device(int device) { STRATA_CUDA_CHECK(cudaSetDevice(device)); }
inline int current_device() {
  int device = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}
inline void synchronize_device() { STRATA_CUDA_CHECK(cudaDeviceSynchronize()); }

// A non-blocking CUDA stream (does not synchronize with the legacy default stream).
class stream {
 public:
  stream() { STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking)); }
  // Adopts nothing: a view of an existing stream is a plain cudaStream_t, not a `stream`.
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  stream(stream&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  stream& operator=(stream&& other) noexcept {
    if (this != &other) {
      release();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  ~stream() { release(); }

  cudaStream_t get() const { return handle_; }
  operator cudaStream_t() const { return handle_; }
  void synchronize() const { STRATA_CUDA_CHECK(cudaStreamSynchronize(handle_)); }

 private:
  void release() noexcept {
    if (handle_) (void)cudaStreamDestroy(handle_);
    handle_ = nullptr;
  }
  cudaStream_t handle_ = nullptr;
};

// `count` elements of T in device memory (uninitialized). T is trivially copyable: it crosses
// the host/device boundary as bytes.
template <class T>
class device_buffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "device_buffer<T> holds raw device memory, so T must be trivially copyable.");

 public:
  using value_type = T;

  device_buffer() = default;
  explicit device_buffer(std::size_t count) : count_(count) {
    if (count_ > 0) STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), bytes()));
  }
  // Allocates and copies `host` into it (synchronous).
  explicit device_buffer(std::span<const T> host) : device_buffer(host.size()) { copy_from_host(host); }

  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  device_buffer& operator=(device_buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  ~device_buffer() { release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }
  bool empty() const { return count_ == 0; }

  // Copies; the synchronous forms return when the bytes have arrived, the stream forms are
  // ordered on `on` (host memory must stay alive until then; pinned memory makes them async).
  void copy_from_host(std::span<const T> host) {
    check_size(host.size(), "copy_from_host");
    if (!host.empty()) STRATA_CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  void copy_to_host(std::span<T> host) const {
    check_size(host.size(), "copy_to_host");
    if (!host.empty()) STRATA_CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
  }
  void copy_from_host(std::span<const T> host, cudaStream_t on) {
    check_size(host.size(), "copy_from_host");
    if (!host.empty())
      STRATA_CUDA_CHECK(cudaMemcpyAsync(data_, host.data(), bytes(), cudaMemcpyHostToDevice, on));
  }
  void copy_to_host(std::span<T> host, cudaStream_t on) const {
    check_size(host.size(), "copy_to_host");
    if (!host.empty())
      STRATA_CUDA_CHECK(cudaMemcpyAsync(host.data(), data_, bytes(), cudaMemcpyDeviceToHost, on));
  }
  // Sets every byte to zero, ordered on `on`.
  void zero(cudaStream_t on = nullptr) {
    if (count_ > 0) STRATA_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes(), on));
  }

 private:
  void check_size(std::size_t host_count, const char* what) const {
    if (host_count != count_)
      fail<ShapeError>("device_buffer::", what, ": the host span has ", host_count, " elements, the buffer ", count_);
  }
  void release() noexcept {
    if (data_) (void)cudaFree(data_);
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace cuda
STRATA_NAMESPACE_END
