// tests/gpu/reference.hpp: plain host loops computing each entry point of docs/DEVICE.md, the
// references the GPU kernels are compared against where backend/cpu/ has no twin yet (norms, GELU,
// SwiGLU and GEMM use backend/cpu/ itself). Sums in accumulate_t<T>, in index order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <strata/core/dtype.hpp>
#include <strata/core/rng.hpp>
#include <strata/core/shape.hpp>

namespace gpu_test::ref {

using strata::accumulate_t;
using strata::index_t;

template <class X>
void add(const X* a, const X* b, index_t n, X* out) {
  using A = accumulate_t<X>;
  for (index_t i = 0; i < n; ++i) out[i] = X(A(a[i]) + A(b[i]));
}
template <class X>
void scale(X* x, index_t n, double factor) {
  using A = accumulate_t<X>;
  for (index_t i = 0; i < n; ++i) x[i] = X(A(x[i]) * A(factor));
}
template <class From, class To>
void convert(const From* src, index_t n, To* dst) {
  for (index_t i = 0; i < n; ++i) dst[i] = To(static_cast<accumulate_t<From>>(src[i]));
}
template <class X>
void transpose(const X* in, index_t rows, index_t cols, X* out) {
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}
template <class T>
void bias_add(T* y, const T* bias, index_t rows, index_t cols) {
  using A = accumulate_t<T>;
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) y[r * cols + c] = T(A(y[r * cols + c]) + A(bias[c]));
}
template <class T, class A = accumulate_t<T>>
void bias_grad(const T* dy, index_t rows, index_t cols, A* dbias) {
  for (index_t c = 0; c < cols; ++c) {
    A sum = 0;
    for (index_t r = 0; r < rows; ++r) sum += A(dy[r * cols + c]);
    dbias[c] += sum;
  }
}
template <class T>
void slice_columns(const T* in, index_t rows, index_t cols, index_t begin, index_t width, T* out) {
  for (index_t r = 0; r < rows; ++r)
    for (index_t j = 0; j < width; ++j) out[r * width + j] = in[r * cols + begin + j];
}
template <class T>
void unstack_columns(const T* stacked, index_t parts, index_t rows, index_t width, T* out) {
  for (index_t p = 0; p < parts; ++p)
    for (index_t r = 0; r < rows; ++r)
      for (index_t w = 0; w < width; ++w) out[r * parts * width + p * width + w] = stacked[(p * rows + r) * width + w];
}
template <class T>
void qkv_split(const T* qkv, index_t rows, index_t groups, index_t hpg, index_t d, T* q, T* k, T* v) {
  for (index_t r = 0; r < rows; ++r)
    for (index_t g = 0; g < groups; ++g) {
      const T* block = qkv + (r * groups + g) * (hpg + 2) * d;
      for (index_t j = 0; j < hpg; ++j)
        for (index_t e = 0; e < d; ++e) q[((r * groups + g) * hpg + j) * d + e] = block[j * d + e];
      for (index_t e = 0; e < d; ++e) {
        k[(r * groups + g) * d + e] = block[hpg * d + e];
        v[(r * groups + g) * d + e] = block[(hpg + 1) * d + e];
      }
    }
}
template <class T>
void qkv_merge(const T* q, const T* k, const T* v, index_t rows, index_t groups, index_t hpg, index_t d, T* qkv) {
  for (index_t r = 0; r < rows; ++r)
    for (index_t g = 0; g < groups; ++g) {
      T* block = qkv + (r * groups + g) * (hpg + 2) * d;
      for (index_t j = 0; j < hpg; ++j)
        for (index_t e = 0; e < d; ++e) block[j * d + e] = q[((r * groups + g) * hpg + j) * d + e];
      for (index_t e = 0; e < d; ++e) {
        block[hpg * d + e] = k[(r * groups + g) * d + e];
        block[(hpg + 1) * d + e] = v[(r * groups + g) * d + e];
      }
    }
}
// x [s, n, d]
template <class T>
void rope(T* x, index_t s, index_t n, index_t d, double base, index_t offset, bool inverse) {
  using A = accumulate_t<T>;
  const index_t half = d / 2;
  for (index_t t = 0; t < s; ++t)
    for (index_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(offset + t) * std::pow(base, -2.0 * double(i) / double(d));
      const A c = A(std::cos(angle)), sn = A(inverse ? -std::sin(angle) : std::sin(angle));
      for (index_t h = 0; h < n; ++h) {
        T* row = x + (t * n + h) * d;
        const A a = A(row[i]), b = A(row[i + half]);
        row[i] = T(a * c - b * sn);
        row[i + half] = T(b * c + a * sn);
      }
    }
}
template <class T>
void embedding_forward(const std::int32_t* tokens, index_t n, const T* weight, index_t row_begin, index_t rows_local,
                       index_t h, T* out) {
  for (index_t i = 0; i < n; ++i) {
    const index_t row = tokens[i] - row_begin;
    for (index_t c = 0; c < h; ++c) out[i * h + c] = row >= 0 && row < rows_local ? weight[row * h + c] : T(0.0f);
  }
}
template <class T, class A = accumulate_t<T>>
void embedding_backward(const std::int32_t* tokens, index_t n, const T* dout, index_t row_begin, index_t rows_local,
                        index_t h, A* dweight) {
  std::vector<A> sums(static_cast<std::size_t>(rows_local * h), A(0));
  for (index_t i = 0; i < n; ++i) {
    const index_t row = tokens[i] - row_begin;
    if (row < 0 || row >= rows_local) continue;
    for (index_t c = 0; c < h; ++c) sums[row * h + c] += A(dout[i * h + c]);
  }
  for (std::size_t e = 0; e < sums.size(); ++e) dweight[e] += sums[e];
}
template <class T>
void position_add(T* x, const T* weight, index_t s, index_t b, index_t h, index_t first) {
  using A = accumulate_t<T>;
  for (index_t t = 0; t < s; ++t)
    for (index_t j = 0; j < b; ++j)
      for (index_t c = 0; c < h; ++c) x[(t * b + j) * h + c] = T(A(x[(t * b + j) * h + c]) + A(weight[(first + t) * h + c]));
}
template <class T, class A = accumulate_t<T>>
void position_grad(const T* dy, index_t s, index_t b, index_t h, index_t first, A* dweight) {
  for (index_t t = 0; t < s; ++t)
    for (index_t c = 0; c < h; ++c) {
      A sum = 0;
      for (index_t j = 0; j < b; ++j) sum += A(dy[(t * b + j) * h + c]);
      dweight[(first + t) * h + c] += sum;
    }
}
template <class T, class A = accumulate_t<T>>
void cross_entropy_max(const T* logits, index_t rows, index_t local, index_t used, A* row_max) {
  for (index_t r = 0; r < rows; ++r) {
    A m = -std::numeric_limits<A>::infinity();
    for (index_t j = 0; j < used; ++j) m = std::max(m, A(logits[r * local + j]));
    row_max[r] = m;
  }
}
template <class T, class A = accumulate_t<T>>
void cross_entropy_sums(const T* logits, index_t rows, index_t local, index_t used, const A* row_max,
                        const std::int32_t* labels, index_t begin, A* sums) {
  for (index_t r = 0; r < rows; ++r) {
    A sum_exp = 0, sum_z = 0;
    for (index_t j = 0; j < used; ++j) {
      const A z = A(logits[r * local + j]);
      sum_exp += std::exp(z - row_max[r]);
      sum_z += z;
    }
    const index_t column = labels[r] - begin;
    sums[3 * r] = sum_exp;
    sums[3 * r + 1] = column >= 0 && column < used ? A(logits[r * local + column]) : A(0);
    sums[3 * r + 2] = sum_z;
  }
}
template <class A>
A smoothing_factor(A smoothing, index_t vocab) {
  return smoothing > 0 ? A(double(smoothing) * double(vocab) / (double(vocab) - 1.0)) : A(0);
}
template <class A>
void cross_entropy_loss(const A* sums, const A* row_max, index_t rows, index_t vocab, A smoothing, A* loss, A* lse) {
  const A s = smoothing_factor(smoothing, vocab);
  for (index_t r = 0; r < rows; ++r) {
    const A log_sum = std::log(sums[3 * r]);
    A value = log_sum + row_max[r] - sums[3 * r + 1];
    if (s > 0) value = (A(1) - s) * value - s * (sums[3 * r + 2] / A(vocab) - row_max[r] - log_sum);
    loss[r] = value;
    lse[r] = row_max[r] + log_sum;
  }
}
template <class T, class A = accumulate_t<T>>
void cross_entropy_backward(const T* logits, const A* lse, const std::int32_t* labels, index_t begin, index_t rows,
                            index_t local, index_t used, index_t vocab, A smoothing, const A* dloss, T* dlogits) {
  const A s = smoothing_factor(smoothing, vocab);
  for (index_t r = 0; r < rows; ++r)
    for (index_t j = 0; j < local; ++j) {
      if (j >= used) {
        dlogits[r * local + j] = T(0.0f);
        continue;
      }
      A g = std::exp(A(logits[r * local + j]) - lse[r]) - s / A(vocab);
      if (j == labels[r] - begin) g -= A(1) - s;
      dlogits[r * local + j] = T(g * dloss[r]);
    }
}
template <class A>
void masked_loss_sum(const A* loss, const A* mask, index_t n, double* out) {
  double sum = 0;
  for (index_t i = 0; i < n; ++i) sum += double(mask[i]) * double(loss[i]);
  out[0] = sum;
}
template <class T, class Map>
void dropout(T* x, index_t n, Map map, double p, std::uint64_t key) {
  using A = accumulate_t<T>;
  const A keep_scale = A(1.0 / (1.0 - p));
  for (index_t i = 0; i < n; ++i)
    x[i] = strata::rng::uniform(key, static_cast<std::uint64_t>(map(i))) >= p ? T(A(x[i]) * keep_scale) : T(A(0));
}
template <class T, class Map>
void init_normal(T* x, index_t n, Map map, std::uint64_t key, double stddev) {
  for (index_t i = 0; i < n; ++i) x[i] = T(stddev * strata::rng::normal(key, static_cast<std::uint64_t>(map(i))));
}
template <class T, class Step, class A = accumulate_t<T>>
void adamw_step(A* main, A* exp_avg, A* exp_avg_sq, const A* grad, T* value, index_t n, const Step& step) {
  for (index_t i = 0; i < n; ++i) {
    A x = main[i];
    x = x - step.decay * x;
    exp_avg[i] = step.beta1 * exp_avg[i] + step.one_minus_beta1 * grad[i];
    exp_avg_sq[i] = step.beta2 * exp_avg_sq[i] + step.one_minus_beta2 * grad[i] * grad[i];
    x = x - step.lr * (exp_avg[i] / step.bias_correction1) / (std::sqrt(exp_avg_sq[i] / step.bias_correction2) + step.eps);
    main[i] = x;
    value[i] = T(x);
  }
}
template <class X>
void sum_of_squares(const X* x, index_t n, double* accumulator) {
  double sum = 0;
  for (index_t i = 0; i < n; ++i) sum += double(accumulate_t<X>(x[i])) * double(accumulate_t<X>(x[i]));
  accumulator[0] += sum;
}
inline void clip_factor(const double* square_sum, double max_norm, double* norm, double* factor) {
  norm[0] = std::sqrt(square_sum[0]);
  const double candidate = max_norm / (norm[0] + 1e-6);
  factor[0] = max_norm > 0 && candidate < 1 ? candidate : 1.0;
}

}  // namespace gpu_test::ref
