// tests/gpu/check.hpp: the small harness of the GPU test programs (no GoogleTest on the GPU
// machines): device buffers from the backend's allocator, random inputs, NaN-filled outputs,
// relative errors and one printed line per check.
//
//   relative error = ||gpu - reference|| / ||reference||   (the absolute norm when the reference is 0)
//   tolerance: 1e-12 (double), 1e-5 (float), 1e-2 (bf16), by the kernel's element type
//
// A suite prints "PASS|FAIL <check> ..." per check and "SUITE <name>: <passed> passed, <failed>
// failed" at the end; main returns non-zero when any check failed.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <strata/backend/cuda/backend.cuh>

namespace gpu_test {

using strata::bf16;
using strata::index_t;
using strata::accumulate_t;

template <class T>
constexpr double tolerance() {
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  else if constexpr (std::is_same_v<T, float>) return 1e-5;
  else return 1e-2;
}

template <class T>
std::string type_name() {
  if constexpr (std::is_same_v<T, double>) return "double";
  else if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, bf16>) return "bf16";
  else return "int32";
}

template <class T>
double as_double(T v) {
  if constexpr (std::is_same_v<T, bf16>) return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}

// Device memory of n elements from the calling thread's device resource (the backend's allocator).
template <class T>
class device_vector {
 public:
  explicit device_vector(std::size_t n) : n_(n) {
    data_ = static_cast<T*>(strata::require_device_resource("gpu test").allocate(bytes()));
  }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  ~device_vector() { strata::current_device_resource()->deallocate(data_, bytes()); }
  T* data() const { return data_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }

 private:
  std::size_t n_;
  T* data_ = nullptr;
};

class suite {
 public:
  explicit suite(std::string name, bool verbose = true) : name_(std::move(name)), verbose_(verbose) {}

  void record(bool ok, const std::string& line) {
    (ok ? passed_ : failed_)++;
    if (verbose_ || !ok) std::printf("%s %s\n", ok ? "PASS" : "FAIL", line.c_str());
    std::fflush(stdout);
  }
  int finish() const {
    std::printf("SUITE %s: %d passed, %d failed\n", name_.c_str(), passed_, failed_);
    return failed_ == 0 ? 0 : 1;
  }
  int failed() const { return failed_; }

 private:
  std::string name_;
  bool verbose_;
  int passed_ = 0, failed_ = 0;
};

struct host_rng {
  std::mt19937_64 engine;
  explicit host_rng(std::uint64_t seed) : engine(seed) {}
  template <class T>
  std::vector<T> uniform(std::size_t n, double lo = -1.0, double hi = 1.0) {
    std::uniform_real_distribution<double> dist(lo, hi);
    std::vector<T> out(n);
    for (auto& v : out) v = T(dist(engine));
    return out;
  }
  std::vector<std::int32_t> integers(std::size_t n, std::int32_t lo, std::int32_t hi) {
    std::uniform_int_distribution<std::int32_t> dist(lo, hi);
    std::vector<std::int32_t> out(n);
    for (auto& v : out) v = dist(engine);
    return out;
  }
};

// The relative error of `gpu` against `reference` (infinite when a value is NaN or the sizes differ).
template <class T>
double relative_error(const std::vector<T>& gpu, const std::vector<T>& reference) {
  if (gpu.size() != reference.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    const double g = as_double(gpu[i]), r = as_double(reference[i]);
    if (std::isnan(g) != std::isnan(r)) return std::numeric_limits<double>::infinity();
    if (std::isnan(r)) continue;
    if (std::isinf(g) || std::isinf(r)) {  // equal infinities agree (an attention row that saw no key: lse -inf)
      if (g != r) return std::numeric_limits<double>::infinity();
      continue;
    }
    diff += (g - r) * (g - r);
    norm += r * r;
  }
  if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// A device vector's values on the host, and host values into a device vector (through the backend).
template <class Device, class T>
std::vector<T> to_host(Device& device, const device_vector<T>& d) {
  std::vector<T> out(d.size());
  device.copy_to_host(d.data(), static_cast<index_t>(d.size()), out.data());
  return out;
}
template <class Device, class T>
void upload(Device& device, const std::vector<T>& h, device_vector<T>& d) {
  device.copy_from_host(h.data(), static_cast<index_t>(h.size()), d.data());
}

inline std::string format(const char* fmt, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, fmt, value);
  return buffer;
}

// The message of the ConfigError `read()` throws while the environment variable `name` holds
// `value` (empty when it throws none); the variable is unset afterwards.
template <class Read>
std::string config_error_under(const char* name, const char* value, Read&& read) {
  ::setenv(name, value, 1);
  std::string message;
  try {
    (void)read();
  } catch (const strata::ConfigError& e) {
    message = e.what();
  }
  ::unsetenv(name);
  return message;
}

}  // namespace gpu_test
