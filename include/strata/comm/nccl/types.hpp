// strata/comm/nccl/types.hpp: how strata's element types, reductions and options map onto NCCL.
//
//   float -> ncclFloat32, double -> ncclFloat64, bf16 -> ncclBfloat16, fp16 -> ncclFloat16,
//   int32_t -> ncclInt32, int64_t -> ncclInt64 (every CommElement; the 16-bit types are bit
//   copies of CUDA's __nv_bfloat16 / __half, so device buffers of them are what NCCL expects).
//   ReduceOp::sum / max / min / avg -> ncclSum / ncclMax / ncclMin / ncclAvg. NCCL computes avg as a
//   sum of inputs premultiplied by 1/size for floating types and as a sum divided by size
//   (truncating) for integers.
//
// `Options` configures a communicator and `default_timeout()` reads STRATA_NCCL_TIMEOUT. Plain C++
// over nccl.h and the CUDA runtime API: compiles with nvcc or a host compiler that sees both.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "../../core/dtype.hpp"
#include "../../core/error.hpp"
#include "../communicator.hpp"

#if !defined(NCCL_MAJOR) || (NCCL_MAJOR * 100 + NCCL_MINOR) < 218
#error "strata's NCCL communicator needs NCCL 2.18 or newer (non-blocking communicators, ncclCommSplit, ncclCommFinalize)."
#endif

STRATA_NAMESPACE_BEGIN

namespace cuda {
class backend;  // backend/cuda/backend.hpp: the rank's device, compute stream, allocator and libraries
}  // namespace cuda

namespace nccl {

// Thrown on the ranks that did not fail themselves but were stopped because another rank (or
// another communicator of this rank) failed.
struct AbortedError : CommError {
  using CommError::CommError;
};

struct Options {
  // How long an operation may stay incomplete (enqueue, then completion on the stream) before the
  // watchdog aborts the rank's communicators; unset: STRATA_NCCL_TIMEOUT seconds, else 600 s.
  std::optional<std::chrono::duration<double>> timeout{};
  // Name of the group in messages.
  std::string name = "world";
  // The rank's compute stream, on which every operation is enqueued (the cuda::backend's). Null:
  // the communicator creates a non-blocking stream of its own, returned by stream().
  cudaStream_t stream = nullptr;
};

// STRATA_NCCL_TIMEOUT if set (a positive number of seconds), else 600 s.
inline std::chrono::duration<double> default_timeout() {
  const char* env = std::getenv("STRATA_NCCL_TIMEOUT");
  if (env == nullptr || *env == '\0') return std::chrono::duration<double>(600.0);
  char* end = nullptr;
  double seconds = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(seconds > 0))
    fail<ConfigError>("STRATA_NCCL_TIMEOUT must be a positive number of seconds, got '", env, "'");
  return std::chrono::duration<double>(seconds);
}

namespace detail {

using strata::detail::concat;

inline constexpr std::string_view kBackend = "nccl communicator";

template <class T>
constexpr ncclDataType_t data_type() {
  static_assert(CommElement<T>, "The NCCL communicator moves float, double, bf16, fp16, int32_t, int64_t and uint8_t only.");
  static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2, "bf16 and fp16 must be 16-bit storage types to reach NCCL.");
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, bf16>) return ncclBfloat16;
  else if constexpr (std::is_same_v<T, fp16>) return ncclFloat16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return ncclUint8;
  else return ncclInt64;
}

inline ncclRedOp_t reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::avg: return ncclAvg;
  }
  fail<ConfigError>("nccl communicator: unknown ReduceOp ", static_cast<int>(op));
}

// "ncclInternalError (internal error - please report this issue to the NCCL developers): <last error>"
inline std::string describe_result(ncclResult_t result) {
  std::string s = concat(ncclGetErrorString(result), " (NCCL result ", static_cast<int>(result), ")");
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') s += concat("; NCCL's last error: ", last);
  return s;
}

inline std::string describe_cuda(cudaError_t status) {
  return concat(cudaGetErrorName(status), ": ", cudaGetErrorString(status));
}

// Sets the calling thread's current device for the guard's lifetime and restores it afterwards.
class device_guard {
 public:
  explicit device_guard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) {
      cudaError_t status = cudaSetDevice(device);
      if (status != cudaSuccess)
        fail<Error>("nccl communicator: cudaSetDevice(", device, ") failed: ", describe_cuda(status));
    }
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() {
    int current = -1;
    if (previous_ >= 0 && cudaGetDevice(&current) == cudaSuccess && current != previous_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

}  // namespace detail
}  // namespace nccl
STRATA_NAMESPACE_END
