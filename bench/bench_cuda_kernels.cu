// bench/bench_cuda_kernels.cu: the memory-bound kernels of cuda::backend at the shapes of one GPT-2
// 124M training step (32 x 1024 tokens, hidden 768, MLP 3072, vocabulary 50257 padded to 50304,
// bf16), each timed through its backend entry point with CUDA events: 3 warm-up calls, then the
// median of 20 timed calls.
//
// GB/s is the bytes the entry point must move at least (every input read once, every output written
// once; the small fp32 statistics and weight gradients included) divided by the median time; an
// H100's HBM3 reaches about 3000 GB/s in practice, so a kernel near that is at its roofline.
//
// It measures and prints; it never asserts (tests/gpu/test_kernels.cu checks the results). Built by
// tests/gpu/CMakeLists.txt when STRATA_BUILD_GPU_TESTS is on, or by hand:
//   nvcc -std=c++20 -O3 -arch=sm_90 --expt-relaxed-constexpr -I include bench/bench_cuda_kernels.cu -lcublas -lcublasLt
// Usage: bench_cuda_kernels [--rows N]   (default 32768 rows)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <strata/backend/cuda/backend.cuh>

using strata::bf16;
using strata::index_t;
using T = bf16;
using A = float;

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda_kernels: %s failed: %s\n", what, cudaGetErrorString(status));
    std::exit(2);
  }
}

// Device memory filled with small values (a bf16 pattern in [-1, 1)), so no kernel sees NaN or inf.
template <class V>
V* device_array(std::size_t n) {
  V* p = nullptr;
  check(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(V)), "cudaMalloc");
  std::vector<V> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = V(static_cast<float>(static_cast<int>((i * 2654435761u) % 2001) - 1000) / 1000.0f);
  check(cudaMemcpy(p, host.data(), n * sizeof(V), cudaMemcpyHostToDevice), "cudaMemcpy");
  return p;
}

struct row {
  std::string kernel, shape;
  double us, gbps;
};

double median_us(const strata::cuda::backend& device, const std::function<void()>& call) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) call();
  std::vector<double> times;
  for (int i = 0; i < 20; ++i) {
    check(cudaEventRecord(start, device.stream()), "cudaEventRecord");
    call();
    check(cudaEventRecord(stop, device.stream()), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(1000.0 * ms);
  }
  std::sort(times.begin(), times.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  index_t rows = 32 * 1024;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--rows") == 0) rows = std::atol(argv[i + 1]);
  const index_t hidden = 768, mlp = 3072, qkv = 3 * hidden;
  strata::cuda::backend device(0);
  const auto R = static_cast<std::size_t>(rows);

  T* x = device_array<T>(R * mlp);
  T* r = device_array<T>(R * mlp);
  T* dy = device_array<T>(R * mlp);
  T* out = device_array<T>(R * mlp);
  T* g = device_array<T>(mlp);
  T* b = device_array<T>(mlp);
  A* mean = device_array<A>(R);
  A* rstd = device_array<A>(R);
  A* dg = device_array<A>(mlp);
  A* db = device_array<A>(mlp);
  const double e = sizeof(T), f = sizeof(A);

  std::vector<row> rows_out;
  auto time = [&](const std::string& kernel, index_t cols, double bytes, const std::function<void()>& call) {
    const double us = median_us(device, call);
    rows_out.push_back({kernel, "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]", us, bytes / (us * 1e3)});
  };
  const double n = double(rows) * hidden, nm = double(rows) * mlp;
  // The forward statistics (mean, rstd) were computed for these inputs, so the backward is realistic.
  device.layernorm_forward(x, g, b, rows, hidden, A(1e-5), out, mean, rstd);
  time("layernorm_forward", hidden, 2 * n * e + 2 * rows * f, [&] { device.layernorm_forward(x, g, b, rows, hidden, A(1e-5), out, mean, rstd); });
  time("layernorm_backward", hidden, 3 * n * e + 2 * rows * f, [&] {
    device.layernorm_backward(dy, x, g, mean, rstd, rows, hidden, out, dg, db);
  });
  time("rmsnorm_forward", hidden, 2 * n * e + rows * f, [&] { device.rmsnorm_forward(x, g, rows, hidden, A(1e-5), out, rstd); });
  time("rmsnorm_backward", hidden, 3 * n * e + rows * f, [&] { device.rmsnorm_backward(dy, x, g, rstd, rows, hidden, out, dg); });
  for (index_t cols : {hidden, qkv, mlp})
    time("bias_grad", cols, double(rows) * cols * e, [&] { device.bias_grad(dy, rows, cols, db); });
  for (index_t cols : {hidden, qkv}) time("bias_add", cols, 2.0 * rows * cols * e, [&] { device.bias_add(out, b, rows, cols); });
  time("add (residual)", hidden, 3 * n * e, [&] { device.add(x, r, rows * hidden, out); });
  time("gelu_forward", mlp, 2 * nm * e, [&] { device.gelu_forward(x, rows * mlp, out); });
  time("gelu_backward", mlp, 3 * nm * e, [&] { device.gelu_backward(dy, x, rows * mlp, out); });
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (void* p : {(void*)x, (void*)r, (void*)dy, (void*)out}) cudaFree(p);

  // Cross-entropy on the [rows, 50304] logits (50257 real columns): normal logits of stddev 2, labels
  // spread over the vocabulary, one tensor-parallel rank holding everything (begin = 0).
  const index_t local = 50304, used = 50257;
  const double nl = double(rows) * local, nu = double(rows) * used;
  T* logits = nullptr;
  T* dlogits = nullptr;
  check(cudaMalloc(&logits, R * local * sizeof(T)), "cudaMalloc (logits)");
  check(cudaMalloc(&dlogits, R * local * sizeof(T)), "cudaMalloc (dlogits)");
  device.init_normal(logits, rows * local, strata::GlobalIndexMap{local, local, 0}, 0x10917ull, 2.0);
  std::int32_t* labels = nullptr;
  {
    std::vector<std::int32_t> host(R);
    for (std::size_t i = 0; i < R; ++i) host[i] = static_cast<std::int32_t>((i * 7919u) % used);
    check(cudaMalloc(&labels, R * sizeof(std::int32_t)), "cudaMalloc (labels)");
    check(cudaMemcpy(labels, host.data(), R * sizeof(std::int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  A* row_max = device_array<A>(R);
  A* sums = device_array<A>(3 * R);
  A* loss = device_array<A>(R);
  A* lse = device_array<A>(R);
  A* dloss = device_array<A>(R);
  device.fill(dloss, rows, 1.0 / double(rows));
  const A smoothing = A(0.1 * double(used) / double(used - 1));
  time("cross_entropy_max", local, nu * e + rows * f, [&] { device.cross_entropy_max(logits, rows, local, used, row_max); });
  time("cross_entropy_sums", local, nu * e + 5.0 * rows * f, [&] {
    device.cross_entropy_sums(logits, rows, local, used, row_max, labels, 0, sums);
  });
  device.cross_entropy_loss(sums, row_max, rows, used, A(0), loss, lse);
  time("cross_entropy_backward", local, nu * e + nl * e + 3.0 * rows * f, [&] {
    device.cross_entropy_backward(logits, lse, labels, 0, rows, local, used, used, A(0), dloss, dlogits);
  });
  time("cross_entropy_backward (smoothing 0.1)", local, nu * e + nl * e + 3.0 * rows * f, [&] {
    device.cross_entropy_backward(logits, lse, labels, 0, rows, local, used, used, smoothing, dloss, dlogits);
  });
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  std::printf("%-40s %-16s %10s %10s\n", "kernel (bf16)", "shape", "us", "GB/s");
  for (const auto& o : rows_out) std::printf("%-40s %-16s %10.1f %10.0f\n", o.kernel.c_str(), o.shape.c_str(), o.us, o.gbps);
  for (void* p : {(void*)g, (void*)b, (void*)mean, (void*)rstd, (void*)dg, (void*)db, (void*)logits, (void*)dlogits,
                  (void*)labels, (void*)row_max, (void*)sums, (void*)loss, (void*)lse, (void*)dloss})
    cudaFree(p);
  return 0;
}
