// bench/bench_cuda_kernels.cu: the memory-bound kernels of cuda::backend at the shapes of one GPT-2
// 124M training step (32 x 1024 tokens, hidden 768, MLP 3072, vocabulary 50257 padded to 50304,
// bf16), each timed through its backend entry point with CUDA events: 3 warm-up calls, then the
// median of 20 timed calls. Then AdamW over GPT-2 124M's parameters (the 16-byte path, and the same
// tensors one element off their aligned starts: a float at a time), and the attention's RoPE split
// and merge and the SwiGLU backward's FP8 cast-transpose at the shapes of a 3.0B Llama (batch 2 x
// 4096 tokens).
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
#include <span>
#include <string>
#include <vector>

#include <strata/backend/cuda/backend.cuh>

#include "cuda_timing.hpp"

using strata::bf16;
using strata::index_t;
using T = bf16;
using A = float;

namespace {

void check(cudaError_t status, const char* what) { strata_bench::check_cuda(status, "bench_cuda_kernels", what); }

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
  return 1000.0 * strata_bench::median_ms(device, 20, call, "bench_cuda_kernels");
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
  auto time_labeled = [&](const std::string& kernel, const std::string& shape, double bytes, const std::function<void()>& call) {
    const double us = median_us(device, call);
    rows_out.push_back({kernel, shape, us, bytes / (us * 1e3)});
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
  // The FP8 casts of a linear layer's operands (E4M3, amax folded in, as the delayed recipe runs
  // them): the codes alone, x^T's codes alone, and both layouts in one pass.
  {
    std::uint8_t* q = nullptr;
    std::uint8_t* qt = nullptr;
    check(cudaMalloc(&q, R * mlp), "cudaMalloc (codes)");
    check(cudaMalloc(&qt, R * mlp), "cudaMalloc (codes)");
    A* scale_amax = device_array<A>(2);
    device.fill(scale_amax, 1, 1.0);
    float* block_scales = device_array<float>(static_cast<std::size_t>(R * mlp / 128 + mlp));
    const auto e4m3 = strata::Fp8Format::e4m3;
    for (index_t cols : {hidden, mlp}) {
      const double m = double(rows) * cols;
      time("fp8_cast", cols, m * e + m, [&] { device.fp8_cast(x, rows * cols, e4m3, scale_amax, q, scale_amax + 1); });
      time("fp8_cast_transpose (x^T alone)", cols, m * e + m,
           [&] { device.fp8_cast_transpose(x, rows, cols, e4m3, scale_amax, nullptr, qt, scale_amax + 1); });
      time("fp8_cast_transpose (both layouts)", cols, m * e + 2 * m,
           [&] { device.fp8_cast_transpose(x, rows, cols, e4m3, scale_amax, q, qt, scale_amax + 1); });
      // The blockwise recipe's casts (runs of 128, a scale each; bytes: x read once, the codes and
      // the scales written).
      const double block_bytes = m * e + m + m / 128 * 4;
      time("fp8_cast_blocks (runs of 128 along rows)", cols, block_bytes,
           [&] { device.fp8_cast_blocks(x, rows, cols, e4m3, 128, q, block_scales, nullptr, nullptr); });
      time("fp8_cast_blocks (x^T, runs of 128 along columns)", cols, block_bytes,
           [&] { device.fp8_cast_blocks(x, rows, cols, e4m3, 128, nullptr, nullptr, qt, block_scales); });
      time("fp8_cast_tiles (128 x 128, both layouts)", cols, m * e + 2 * m,
           [&] { device.fp8_cast_tiles(x, rows, cols, e4m3, 128, q, qt, block_scales, block_scales + R * mlp / 256); });
    }
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (void* p : {(void*)q, (void*)qt, (void*)scale_amax, (void*)block_scales}) cudaFree(p);
  }
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
  // The fused forward-backward (a rank holding the whole vocabulary): the max, sums, loss and
  // backward of one row in one kernel, the gradient written over the logits; bytes as the backward's
  // (read the row, write it once). Timed at a few grid sizes (blocks per multiprocessor), the first
  // being the default. Each call overwrites the logits with their gradient, so the logits of later
  // calls are small numbers: the time of the exponentials does not depend on their values.
  for (const int per_sm : {strata::cuda::kernels::kCrossEntropyFusedBlocksPerSm, 1, 3, 4, 8}) {
    time("cross_entropy_forward_backward (" + std::to_string(per_sm) + " blocks per SM)", local,
         nu * e + nl * e + 3.0 * rows * f, [&] {
           strata::cuda::kernels::cross_entropy_forward_backward<T, A>(logits, labels, rows, local, used, used, A(0),
                                                                       dloss, loss, device.stream(), per_sm);
         });
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cudaFree(logits);
  cudaFree(dlogits);

  // Gradient clipping and zeroing over the 148 fp32 gradients of GPT-2 124M (wte [50304, 768], wpe
  // [1024, 768], per layer: ln_1 and ln_2 weight and bias, qkv [768, 2304] + bias, attention
  // projection [768, 768] + bias, fc [768, 3072] + bias, projection [3072, 768] + bias; ln_f): one
  // call per tensor, as before the multi-tensor entry points, against the multi-tensor calls.
  std::vector<index_t> sizes{50304 * hidden, 1024 * hidden};
  for (int layer = 0; layer < 12; ++layer)
    for (index_t n : {hidden, hidden, hidden * qkv, qkv, hidden * hidden, hidden, hidden, hidden, hidden * mlp, mlp, mlp * hidden, hidden})
      sizes.push_back(n);
  sizes.push_back(hidden);
  sizes.push_back(hidden);
  // Each gradient starts at a 512-byte boundary, as the caching allocator hands them out.
  std::vector<index_t> offsets;
  index_t total = 0;
  for (index_t n : sizes) offsets.push_back(total), total += (n + 127) / 128 * 128;
  A* grads = nullptr;
  check(cudaMalloc(&grads, static_cast<std::size_t>(total) * sizeof(A)), "cudaMalloc (gradients)");
  device.init_normal(grads, total, strata::GlobalIndexMap{total, total, 0}, 0x6a4dull, 1e-3);
  std::vector<strata::TensorRef<A>> list;
  std::vector<strata::SquaresTensor<A>> read;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    list.push_back({grads + offsets[i], sizes[i]});
    read.push_back({grads + offsets[i], sizes[i]});
  }
  double* square_sum = device_array<double>(1);
  double* norm = device_array<double>(1);
  double* factor = device_array<double>(1);
  const std::string count = std::to_string(sizes.size()) + " tensors";
  double grad_bytes = 0;
  for (index_t n : sizes) grad_bytes += double(n) * f;
  const auto clip_one_by_one = [&] {
    device.fill(square_sum, 1, 0.0);
    for (const auto& t : read) device.sum_of_squares(t.data, t.n, square_sum);
    device.clip_factor(square_sum, 1.0, norm, factor);
    for (const auto& t : list) device.scale_by(t.data, t.n, factor);
  };
  const auto clip_many = [&] {
    device.fill(square_sum, 1, 0.0);
    device.sum_of_squares_many<A>(std::span<const strata::SquaresTensor<A>>(read), square_sum);
    device.clip_factor(square_sum, 1.0, norm, factor);
    device.scale_by_many<A>(std::span<const strata::TensorRef<A>>(list), factor);
  };
  time_labeled("clip: per tensor (sum_of_squares, scale_by)", count, 3 * grad_bytes, clip_one_by_one);
  time_labeled("clip: sum_of_squares_many, scale_by_many", count, 3 * grad_bytes, clip_many);
  time_labeled("zero gradients: fill per tensor", count, grad_bytes, [&] { for (const auto& t : list) device.fill(t.data, t.n, 0.0); });
  time_labeled("zero gradients: fill_many", count, grad_bytes, [&] { device.fill_many<A>(std::span<const strata::TensorRef<A>>(list), 0.0); });
  // AdamW over the same parameters: main, moments and gradient in fp32, the bf16 values written
  // (main, m and v read and written, the gradient read, the value written: 30 bytes an element).
  {
    std::vector<A*> state;
    T* values = nullptr;
    check(cudaMalloc(&values, static_cast<std::size_t>(total) * sizeof(T)), "cudaMalloc (values)");
    for (int j = 0; j < 3; ++j) {
      A* p = nullptr;
      check(cudaMalloc(&p, static_cast<std::size_t>(total) * sizeof(A)), "cudaMalloc (optimizer state)");
      device.init_normal(p, total, strata::GlobalIndexMap{total, total, 0}, 0x5eedull + j, 1e-2);
      state.push_back(p);
    }
    device.fill(state[2], total, 1e-4);  // exp_avg_sq > 0
    std::vector<strata::cuda::kernels::adamw_tensor<T, A>> params;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      params.push_back({state[0] + offsets[i], state[1] + offsets[i], state[2] + offsets[i], grads + offsets[i],
                        values + offsets[i], sizes[i], i % 2 == 0});
    const strata::AdamWStep<A> step{A(1e-4), A(0.9), A(0.95), A(0.1), A(0.05), A(1e-8), A(1e-5), A(0.5), A(0.3)};
    time_labeled("adamw_step_many", count, grad_bytes / f * 30.0,
                 [&] { device.adamw_step_many<T>(std::span<const strata::cuda::kernels::adamw_tensor<T, A>>(params), step); });
    // the same tensors one element past their aligned starts: a float at a time (the kernel's path
    // for pointers that do not allow 16-byte loads)
    auto shifted = params;
    for (auto& p : shifted) {
      p.main += 1, p.exp_avg += 1, p.exp_avg_sq += 1, p.value += 1;
      p.grad += 1;
      p.n -= 1;
    }
    time_labeled("adamw_step_many (unaligned: a float a time)", count, grad_bytes / f * 30.0,
                 [&] { device.adamw_step_many<T>(std::span<const strata::cuda::kernels::adamw_tensor<T, A>>(shifted), step); });
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (A* p : state) cudaFree(p);
    cudaFree(values);
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (void* p : {(void*)grads, (void*)square_sum, (void*)norm, (void*)factor}) cudaFree(p);

  // A Llama of 3B at batch 2 x 4096 tokens (hidden 3072, 24 query heads in 8 groups of 3, head 128,
  // MLP 8192): the attention's split with RoPE and its merge (into bf16, and into the output
  // gradient's E5M2 codes with amax), and the SwiGLU backward's fused cast-transpose.
  {
    const index_t s = 4096, batch = 2, groups = 8, hpg = 3, d = 128, ffn = 8192;
    const auto slots = static_cast<std::size_t>(s * batch * groups * (hpg + 2) * d);
    const auto qn = static_cast<std::size_t>(s * batch * groups * hpg * d), kn = static_cast<std::size_t>(s * batch * groups * d);
    T* packed = device_array<T>(slots);
    T* q = device_array<T>(qn);
    T* k = device_array<T>(kn);
    T* v = device_array<T>(kn);
    std::uint8_t* codes = nullptr;
    std::uint8_t* codes_t = nullptr;
    const auto tokens = static_cast<std::size_t>(s * batch);
    check(cudaMalloc(&codes, tokens * 2 * ffn), "cudaMalloc (codes)");
    check(cudaMalloc(&codes_t, tokens * 2 * ffn), "cudaMalloc (codes)");
    A* scale_amax = device_array<A>(2);
    device.fill(scale_amax, 1, 1.0);
    const std::string shape = "[" + std::to_string(s * batch) + ", " + std::to_string(groups * (hpg + 2) * d) + "]";
    const double qkv_bytes = double(slots) * e;
    time_labeled("qkv_split_rope (Llama 3B)", shape, 2 * qkv_bytes,
                 [&] { device.qkv_split_rope(packed, s, batch, groups, hpg, d, q, k, v, 500000.0, 0); });
    time_labeled("qkv_merge_rope (Llama 3B)", shape, 2 * qkv_bytes,
                 [&] { device.qkv_merge_rope(q, k, v, s, batch, groups, hpg, d, packed, 500000.0, 0); });
    time_labeled("qkv_merge_rope_fp8 (Llama 3B)", shape, qkv_bytes + double(slots),
                 [&] { device.qkv_merge_rope_fp8(q, k, v, s, batch, groups, hpg, d, 500000.0, 0, {},
                                                 strata::Fp8Output{strata::Fp8Format::e5m2, scale_amax, codes,
                                                                  scale_amax + 1}); });
    T* up = device_array<T>(tokens * 2 * ffn);
    T* dy_mlp = device_array<T>(tokens * ffn);
    const double m = double(tokens) * ffn;
    time_labeled("fp8_cast_transpose_fused swiglu_backward", "[" + std::to_string(tokens) + ", " + std::to_string(2 * ffn) + "]",
                 3 * m * e + 4 * m, [&] {
                   device.fp8_cast_transpose_fused<T, A>(strata::Fp8Producer::swiglu_backward, dy_mlp, up, tokens, 2 * ffn,
                                                         strata::Fp8Format::e5m2, scale_amax, codes, codes_t, scale_amax + 1,
                                                         nullptr);
                 });
    // the same writing fc2's input codes^T too (Fp8Options::activation_codes_in_backward), and the
    // forward's SwiGLU cast with and without its x^T (what the forward no longer writes)
    std::uint8_t* act_codes = nullptr;
    check(cudaMalloc(&act_codes, tokens * ffn), "cudaMalloc (codes)");
    time_labeled("  ... with fc2's input codes^T", "[" + std::to_string(tokens) + ", " + std::to_string(2 * ffn) + "]",
                 3 * m * e + 5 * m, [&] {
                   device.fp8_cast_transpose_fused<T, A>(strata::Fp8Producer::swiglu_backward, dy_mlp, up, tokens, 2 * ffn,
                                                         strata::Fp8Format::e5m2, scale_amax, codes, codes_t, scale_amax + 1,
                                                         nullptr, strata::Fp8Output{strata::Fp8Format::e4m3, scale_amax,
                                                                                    act_codes, nullptr});
                 });
    time_labeled("fp8_cast_transpose_fused swiglu (fc2 input)", "[" + std::to_string(tokens) + ", " + std::to_string(ffn) + "]",
                 2 * m * e + 2 * m, [&] {
                   device.fp8_cast_transpose_fused<T, A>(strata::Fp8Producer::swiglu, up, nullptr, tokens, ffn,
                                                         strata::Fp8Format::e4m3, scale_amax, codes, codes_t, scale_amax + 1,
                                                         nullptr);
                 });
    time_labeled("  ... without x^T", "[" + std::to_string(tokens) + ", " + std::to_string(ffn) + "]", 2 * m * e + m, [&] {
      device.fp8_cast_transpose_fused<T, A>(strata::Fp8Producer::swiglu, up, nullptr, tokens, ffn, strata::Fp8Format::e4m3,
                                            scale_amax, codes, nullptr, scale_amax + 1, nullptr);
    });
    cudaFree(act_codes);
    time_labeled("fp8_cast_transpose (both layouts, Llama fc1 out)", "[" + std::to_string(tokens) + ", " + std::to_string(ffn) + "]",
                 m * e + 2 * m, [&] {
                   device.fp8_cast_transpose(dy_mlp, tokens, ffn, strata::Fp8Format::e4m3, scale_amax, codes, codes_t, scale_amax + 1);
                 });
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (void* p : {(void*)packed, (void*)q, (void*)k, (void*)v, (void*)codes, (void*)codes_t, (void*)scale_amax, (void*)up, (void*)dy_mlp})
      cudaFree(p);
  }

  std::printf("%-44s %-16s %10s %10s\n", "entry point (bf16 activations, fp32 gradients)", "shape", "us", "GB/s");
  for (const auto& o : rows_out) std::printf("%-44s %-16s %10.1f %10.0f\n", o.kernel.c_str(), o.shape.c_str(), o.us, o.gbps);
  for (void* p : {(void*)g, (void*)b, (void*)mean, (void*)rstd, (void*)dg, (void*)db, (void*)labels, (void*)row_max, (void*)sums, (void*)loss, (void*)lse, (void*)dloss})
    cudaFree(p);
  return 0;
}
