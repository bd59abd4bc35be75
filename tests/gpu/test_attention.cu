// tests/gpu/test_attention.cu: cuda::attention_forward / attention_backward against a double-
// precision CPU reference of the same contract (docs/DEVICE.md): causal, grouped-query, q/out
// [s, b, heads, d], k/v [s, b, groups, d], lse [b, heads, s] natural-log log-sum-exp.
//
// For every case: random inputs rounded to the element type (the reference sees the same values),
// outputs NaN-poisoned before each run, relative errors ||x - ref|| / ||ref|| of out, lse, dq, dk
// and dv within 1e-12 (double), 1e-5 (float), 1e-2 (bf16, fp16); the engine that ran (cuDNN for
// bf16/fp16 at d = 64 and 128 when built with cuDNN, else the flash kernels); two runs give the same
// bits; a second call of a shape builds no new cuDNN graph. cuDNN's backward refuses s = 1: there the
// backward must run the flash kernels and name the refusal.
//
// Strided views (backend/attention_strides.hpp): q, k, v read from one packed qkv projection
// [s, b, groups, heads/groups + 2, d] (multi-head: one query head per group; multi-query: one
// group) and dq, dk, dv written into one packed gradient, on both engines, against the CPU twin
// (cpu::attention_forward / attention_backward in double on the split copies, the gradients merged
// with cpu::qkv_merge); the packed gradient NaN-filled first, so every element must be written;
// two runs bit-identical; on the flash kernels also the same bits as the contiguous call on the
// split copies, since only addresses change.
//
// Plain main(): one line per check, a summary line, exit status 1 on any failure. `--quick` runs
// only the small shapes (for compute-sanitizer).
#include <cuda_runtime.h>

#include <strata/backend/cpu/attention.hpp>
#include <strata/backend/cpu/elementwise.hpp>
#include <strata/backend/cuda/attention.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace cu = strata::cuda;
using strata::bf16;
using strata::fp16;
using strata::index_t;

namespace {

int g_checks = 0, g_failures = 0;

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) ++g_failures;
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
}

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, double>) return "double";
  else if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, bf16>) return "bf16";
  else return "fp16";
}

template <class T>
double tolerance() {
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  else if constexpr (std::is_same_v<T, float>) return 1e-5;
  else return 1e-2;
}

struct Shape {
  index_t s, b, heads, groups, d;
  std::string str() const {
    char buf[128];
    std::snprintf(buf, sizeof buf, "s=%lld b=%lld heads=%lld groups=%lld d=%lld", (long long)s, (long long)b,
                  (long long)heads, (long long)groups, (long long)d);
    return buf;
  }
};

// The reference: everything in double, straight from the definitions.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

Reference reference(const Shape& x, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout, double scale) {
  const index_t s = x.s, b = x.b, H = x.heads, G = x.groups, d = x.d, per_group = H / G;
  Reference r;
  r.out.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(k.size(), 0.0);
  r.lse.assign(static_cast<std::size_t>(b * H * s), 0.0);
  auto qo = [&](index_t i, index_t bi, index_t h) { return ((i * b + bi) * H + h) * d; };   // [s, b, H, d]
  auto ko = [&](index_t j, index_t bi, index_t g) { return ((j * b + bi) * G + g) * d; };   // [s, b, G, d]
  // One task per (batch, kv head): it owns dk, dv of that head and the out/dq/lse of its query heads.
  auto task = [&](index_t bi, index_t g) {
    std::vector<double> p(static_cast<std::size_t>(s)), dp(static_cast<std::size_t>(s));
    for (index_t h = g * per_group; h < (g + 1) * per_group; ++h)
      for (index_t i = 0; i < s; ++i) {
        double mx = -INFINITY;
        for (index_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (index_t c = 0; c < d; ++c) dot += q[qo(i, bi, h) + c] * k[ko(j, bi, g) + c];
          p[j] = scale * dot;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (index_t j = 0; j <= i; ++j) sum += std::exp(p[j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[(bi * H + h) * s + i] = lse;
        for (index_t j = 0; j <= i; ++j) p[j] = std::exp(p[j] - lse);
        double* o = &r.out[qo(i, bi, h)];
        for (index_t j = 0; j <= i; ++j)
          for (index_t c = 0; c < d; ++c) o[c] += p[j] * v[ko(j, bi, g) + c];
        // backward of this row: dP = dO V^T, D = rowsum(dP * P), dS = P (dP - D)
        const double* go = &dout[qo(i, bi, h)];
        double delta = 0;
        for (index_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (index_t c = 0; c < d; ++c) dot += go[c] * v[ko(j, bi, g) + c];
          dp[j] = dot;
          delta += dot * p[j];
        }
        for (index_t j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - delta);
          for (index_t c = 0; c < d; ++c) {
            r.dq[qo(i, bi, h) + c] += scale * ds * k[ko(j, bi, g) + c];
            r.dk[ko(j, bi, g) + c] += scale * ds * q[qo(i, bi, h) + c];
            r.dv[ko(j, bi, g) + c] += p[j] * go[c];
          }
        }
      }
  };
  std::vector<std::thread> workers;
  const unsigned n_threads = std::max(1u, std::thread::hardware_concurrency());
  const index_t tasks = b * G;
  for (unsigned w = 0; w < n_threads; ++w)
    workers.emplace_back([&, w] {
      for (index_t t = w; t < tasks; t += n_threads) task(t / G, t % G);
    });
  for (auto& w : workers) w.join();
  return r;
}

template <class X>
struct DeviceArray {
  X* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceArray(std::size_t count) : n(count) { STRATA_CUDA_CHECK(cudaMalloc(&ptr, std::max<std::size_t>(1, n) * sizeof(X))); }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  void poison() { STRATA_CUDA_CHECK(cudaMemset(ptr, 0xff, n * sizeof(X))); }  // all-ones bytes: NaN
  void upload(const std::vector<X>& h) { STRATA_CUDA_CHECK(cudaMemcpy(ptr, h.data(), n * sizeof(X), cudaMemcpyHostToDevice)); }
  std::vector<X> download() const {
    std::vector<X> h(n);
    STRATA_CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(X), cudaMemcpyDeviceToHost));
    return h;
  }
};

template <class X>
double to_double(X x) {
  return static_cast<double>(static_cast<float>(x));
}
template <>
double to_double<double>(double x) {
  return x;
}

template <class X>
double relative_error(const std::vector<X>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double g = to_double(got[i]);
    if (!std::isfinite(g)) return INFINITY;
    num += (g - ref[i]) * (g - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

template <class X>
bool same_bits(const std::vector<X>& a, const std::vector<X>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(X)) == 0;
}

// Runs one case; expect_cudnn: the engine every call must report.
template <class T>
void run_case(cu::attention_plans& plans, cudaStream_t stream, const Shape& x, bool use_cudnn, std::uint64_t seed) {
  using A = strata::accumulate_t<T>;
  plans.prefer_cudnn(use_cudnn);
  const bool expect_cudnn = use_cudnn && cu::attention_plans::has_cudnn() && strata::is_half_v<T>;
  const std::string name = std::string(type_name<T>()) + (expect_cudnn ? " cudnn " : " flash ") + x.str();

  const std::size_t nq = static_cast<std::size_t>(x.s * x.b * x.heads * x.d);
  const std::size_t nk = static_cast<std::size_t>(x.s * x.b * x.groups * x.d);
  const std::size_t nl = static_cast<std::size_t>(x.b * x.heads * x.s);
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto random = [&](std::size_t n, std::vector<T>& t, std::vector<double>& ref) {
    t.resize(n);
    ref.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      t[i] = T(normal(gen));
      ref[i] = to_double(t[i]);
    }
  };
  std::vector<T> hq, hk, hv, hdo;
  std::vector<double> rq, rk, rv, rdo;
  random(nq, hq, rq);
  random(nk, hk, rk);
  random(nk, hv, rv);
  random(nq, hdo, rdo);
  const double scale = 1.0 / std::sqrt(static_cast<double>(x.d));
  const Reference ref = reference(x, rq, rk, rv, rdo, scale);

  DeviceArray<T> q(nq), k(nk), v(nk), dout(nq), out(nq), dq(nq), dk(nk), dv(nk);
  DeviceArray<A> lse(nl);
  q.upload(hq);
  k.upload(hk);
  v.upload(hv);
  dout.upload(hdo);

  struct Result {
    std::vector<T> out, dq, dk, dv;
    std::vector<A> lse;
    cu::attention_engine forward_engine, backward_engine;
    std::string refusal;
  };
  auto run = [&] {
    out.poison(), lse.poison(), dq.poison(), dk.poison(), dv.poison();
    Result r;
    cu::attention_forward<T>(plans, stream, q.ptr, k.ptr, v.ptr, x.s, x.b, x.heads, x.groups, x.d, A(scale), out.ptr,
                             lse.ptr);
    r.forward_engine = plans.last_engine();
    r.refusal = plans.last_refusal();
    cu::attention_backward<T>(plans, stream, dout.ptr, q.ptr, k.ptr, v.ptr, out.ptr, lse.ptr, x.s, x.b, x.heads,
                              x.groups, x.d, A(scale), dq.ptr, dk.ptr, dv.ptr);
    r.backward_engine = plans.last_engine();
    if (r.refusal.empty()) r.refusal = plans.last_refusal();
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
    r.out = out.download(), r.lse = lse.download(), r.dq = dq.download(), r.dk = dk.download(), r.dv = dv.download();
    return r;
  };

  const Result first = run();
  const std::size_t graphs_after_first = plans.graphs_built();
  const Result second = run();

  // cuDNN's backward refuses s_q = s_kv = 1; that call must then run the flash kernels and say why.
  const cu::attention_engine want = expect_cudnn ? cu::attention_engine::cudnn : cu::attention_engine::flash;
  const bool backward_ok = first.backward_engine == want ||
                           (expect_cudnn && x.s == 1 && first.backward_engine == cu::attention_engine::flash &&
                            first.refusal.find("cuDNN refused") != std::string::npos);
  check(first.forward_engine == want && backward_ok,
        name + " engine forward=" + std::string(cu::engine_name(first.forward_engine)) +
            " backward=" + std::string(cu::engine_name(first.backward_engine)) +
            (first.refusal.empty() ? "" : " (" + first.refusal + ")"));
  const double tol = tolerance<T>();
  auto report = [&](const char* what, double err) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s rel=%.3e (<= %.0e)", what, err, tol);
    check(err <= tol, name + buf);
  };
  report("out", relative_error(first.out, ref.out));
  report("lse", relative_error(first.lse, ref.lse));
  report("dq", relative_error(first.dq, ref.dq));
  report("dk", relative_error(first.dk, ref.dk));
  report("dv", relative_error(first.dv, ref.dv));
  check(same_bits(first.out, second.out) && same_bits(first.lse, second.lse) && same_bits(first.dq, second.dq) &&
            same_bits(first.dk, second.dk) && same_bits(first.dv, second.dv),
        name + " two runs bit-identical");
  if (expect_cudnn)
    check(plans.graphs_built() == graphs_after_first,
          name + " second call built no graph (" + std::to_string(plans.graphs_built()) + " graphs)");
}

// Views of a packed qkv projection; x.groups == x.heads (multi-head) or x.groups == 1 (multi-query).
template <class T>
void run_packed_case(cu::attention_plans& plans, cudaStream_t stream, const Shape& x, bool use_cudnn,
                     std::uint64_t seed) {
  using A = strata::accumulate_t<T>;
  plans.prefer_cudnn(use_cudnn);
  const bool expect_cudnn = use_cudnn && cu::attention_plans::has_cudnn() && strata::is_half_v<T>;
  const index_t hpg = x.heads / x.groups, rows = x.s * x.b, width = x.groups * (hpg + 2) * x.d;
  const strata::PackedQkvView view = strata::packed_qkv_view(x.groups, hpg, x.d);
  const std::string name = std::string(type_name<T>()) + (expect_cudnn ? " cudnn " : " flash ") +
                           (x.groups == 1 ? "packed-mqa " : "packed-mha ") + x.str();
  if (!view.is_view) {
    check(false, name + " is not a strided view of the packed projection");
    return;
  }
  const std::size_t np = static_cast<std::size_t>(rows * width), nq = static_cast<std::size_t>(rows * x.heads * x.d),
                    nk = static_cast<std::size_t>(rows * x.groups * x.d), nl = static_cast<std::size_t>(x.b * x.heads * x.s);
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<T> hpacked(np), hdo(nq);
  std::vector<double> rpacked(np), rdo(nq);
  for (std::size_t i = 0; i < np; ++i) rpacked[i] = to_double(hpacked[i] = T(normal(gen)));
  for (std::size_t i = 0; i < nq; ++i) rdo[i] = to_double(hdo[i] = T(normal(gen)));
  const double scale = 1.0 / std::sqrt(static_cast<double>(x.d));

  // the CPU twin in double on the split copies; its gradients merged into the packed layout
  std::vector<double> rq(nq), rk(nk), rv(nk), rout(nq), rlse(nl), rdq(nq), rdk(nk), rdv(nk), rdpacked(np);
  strata::cpu::qkv_split<double>(rpacked.data(), rows, x.groups, hpg, x.d, rq.data(), rk.data(), rv.data());
  strata::cpu::attention_forward<double>(rq.data(), rk.data(), rv.data(), x.s, x.b, x.heads, x.groups, x.d, scale,
                                         rout.data(), rlse.data());
  strata::cpu::attention_backward<double>(rdo.data(), rq.data(), rk.data(), rv.data(), rout.data(), rlse.data(), x.s,
                                          x.b, x.heads, x.groups, x.d, scale, rdq.data(), rdk.data(), rdv.data());
  strata::cpu::qkv_merge<double>(rdq.data(), rdk.data(), rdv.data(), rows, x.groups, hpg, x.d, rdpacked.data());

  DeviceArray<T> packed(np), dpacked(np), dout(nq), out(nq);
  DeviceArray<A> lse(nl);
  packed.upload(hpacked);
  dout.upload(hdo);
  struct Result {
    std::vector<T> out, dpacked;
    std::vector<A> lse;
    cu::attention_engine forward_engine, backward_engine;
    std::string refusal;
  };
  auto run = [&] {
    out.poison(), lse.poison(), dpacked.poison();
    Result r;
    const T* p = packed.ptr;
    cu::attention_forward<T>(plans, stream, p, p + view.k_offset, p + view.v_offset, x.s, x.b, x.heads, x.groups, x.d,
                             A(scale), out.ptr, lse.ptr, view.strides);
    r.forward_engine = plans.last_engine();
    r.refusal = plans.last_refusal();
    T* g = dpacked.ptr;
    cu::attention_backward<T>(plans, stream, dout.ptr, p, p + view.k_offset, p + view.v_offset, out.ptr, lse.ptr, x.s,
                              x.b, x.heads, x.groups, x.d, A(scale), g, g + view.k_offset, g + view.v_offset,
                              view.strides);
    r.backward_engine = plans.last_engine();
    if (r.refusal.empty()) r.refusal = plans.last_refusal();
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
    r.out = out.download(), r.lse = lse.download(), r.dpacked = dpacked.download();
    return r;
  };
  const Result first = run();
  const std::size_t graphs_after_first = plans.graphs_built();
  const Result second = run();

  const cu::attention_engine want = expect_cudnn ? cu::attention_engine::cudnn : cu::attention_engine::flash;
  const bool backward_ok = first.backward_engine == want ||
                           (expect_cudnn && x.s == 1 && first.backward_engine == cu::attention_engine::flash &&
                            first.refusal.find("cuDNN refused") != std::string::npos);
  check(first.forward_engine == want && backward_ok,
        name + " engine forward=" + std::string(cu::engine_name(first.forward_engine)) +
            " backward=" + std::string(cu::engine_name(first.backward_engine)) +
            (first.refusal.empty() ? "" : " (" + first.refusal + ")"));
  const double tol = tolerance<T>();
  auto report = [&](const char* what, double err) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s rel=%.3e (<= %.0e)", what, err, tol);
    check(err <= tol, name + buf);
  };
  report("out", relative_error(first.out, rout));
  report("lse", relative_error(first.lse, rlse));
  report("dqkv", relative_error(first.dpacked, rdpacked));  // infinite if an element stayed NaN
  check(same_bits(first.out, second.out) && same_bits(first.lse, second.lse) && same_bits(first.dpacked, second.dpacked),
        name + " two runs bit-identical");
  if (expect_cudnn)
    check(plans.graphs_built() == graphs_after_first,
          name + " second call built no graph (" + std::to_string(plans.graphs_built()) + " graphs)");

  if (!expect_cudnn) {  // the flash kernels: the views give the bits of the contiguous call on copies
    std::vector<T> hq(nq), hk(nk), hv(nk);
    strata::cpu::qkv_split<T>(hpacked.data(), rows, x.groups, hpg, x.d, hq.data(), hk.data(), hv.data());
    DeviceArray<T> q(nq), k(nk), v(nk), dq(nq), dk(nk), dv(nk);
    q.upload(hq), k.upload(hk), v.upload(hv);
    out.poison(), lse.poison();
    cu::attention_forward<T>(plans, stream, q.ptr, k.ptr, v.ptr, x.s, x.b, x.heads, x.groups, x.d, A(scale), out.ptr,
                             lse.ptr);
    cu::attention_backward<T>(plans, stream, dout.ptr, q.ptr, k.ptr, v.ptr, out.ptr, lse.ptr, x.s, x.b, x.heads,
                              x.groups, x.d, A(scale), dq.ptr, dk.ptr, dv.ptr);
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto cq = dq.download(), ck = dk.download(), cv = dv.download();
    std::vector<T> merged(np);
    strata::cpu::qkv_merge<T>(cq.data(), ck.data(), cv.data(), rows, x.groups, hpg, x.d, merged.data());
    check(same_bits(first.out, out.download()) && same_bits(first.lse, lse.download()) &&
              same_bits(first.dpacked, merged),
          name + " views give the bits of the contiguous call on split copies");
  }
}

}  // namespace

// Attention sinks (off-by-one and learnable, backend/attention_options.hpp) on either engine, with
// and without a sliding window: out, lse, dq, dk, dv and the learnable sinks' gradient against
// cpu::attention_forward / attention_backward in double on the same (rounded) inputs and sinks. The
// sink gradient is added to what the buffer holds (checked from a nonzero start).
template <class T>
void run_sink_case(cu::attention_plans& plans, cudaStream_t stream, const Shape& x, bool use_cudnn,
                   strata::SoftmaxType softmax, index_t window, std::uint64_t seed) {
  using A = strata::accumulate_t<T>;
  plans.prefer_cudnn(use_cudnn);
  const bool learnable = softmax == strata::SoftmaxType::learnable;
  const std::string name = std::string(type_name<T>()) + (learnable ? " learnable sink " : " off-by-one sink ") +
                           (use_cudnn ? "cudnn-preferred " : "flash ") +
                           (window >= 0 ? "window=" + std::to_string(window) + " " : "") + x.str();
  const std::size_t nq = static_cast<std::size_t>(x.s * x.b * x.heads * x.d);
  const std::size_t nk = static_cast<std::size_t>(x.s * x.b * x.groups * x.d);
  const std::size_t nl = static_cast<std::size_t>(x.b * x.heads * x.s);
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto random = [&](std::size_t n, double stddev, std::vector<T>& t, std::vector<double>& ref) {
    t.resize(n);
    ref.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      t[i] = T(stddev * normal(gen));
      ref[i] = to_double(t[i]);
    }
  };
  std::vector<T> hq, hk, hv, hdo, hsink;
  std::vector<double> rq, rk, rv, rdo, rsink;
  random(nq, 1.0, hq, rq);
  random(nk, 1.0, hk, rk);
  random(nk, 1.0, hv, rv);
  random(nq, 1.0, hdo, rdo);
  random(static_cast<std::size_t>(x.heads), 2.0, hsink, rsink);  // logits around the rows' lse
  const double scale = 1.0 / std::sqrt(static_cast<double>(x.d));

  strata::AttentionOptions ref_options;
  ref_options.softmax = softmax;
  ref_options.window = window;
  std::vector<double> rout(nq), rlse(nl), rdq(nq), rdk(nk), rdv(nk), rdsink(static_cast<std::size_t>(x.heads), 0.5);
  ref_options.sinks = rsink.data();
  ref_options.sink_gradient = rdsink.data();
  strata::cpu::attention_forward<double>(rq.data(), rk.data(), rv.data(), x.s, x.b, x.heads, x.groups, x.d, scale,
                                         rout.data(), rlse.data(), ref_options);
  strata::cpu::attention_backward<double>(rdo.data(), rq.data(), rk.data(), rv.data(), rout.data(), rlse.data(), x.s,
                                          x.b, x.heads, x.groups, x.d, scale, rdq.data(), rdk.data(), rdv.data(),
                                          ref_options);

  DeviceArray<T> q(nq), k(nk), v(nk), dout(nq), out(nq), dq(nq), dk(nk), dv(nk), sinks(static_cast<std::size_t>(x.heads));
  DeviceArray<A> lse(nl), dsink(static_cast<std::size_t>(x.heads));
  q.upload(hq), k.upload(hk), v.upload(hv), dout.upload(hdo), sinks.upload(hsink);
  dsink.upload(std::vector<A>(static_cast<std::size_t>(x.heads), A(0.5)));
  out.poison(), lse.poison(), dq.poison(), dk.poison(), dv.poison();
  strata::AttentionOptions options;
  options.softmax = softmax;
  options.window = window;
  options.sinks = sinks.ptr;
  options.sink_gradient = dsink.ptr;
  cu::attention_forward<T>(plans, stream, q.ptr, k.ptr, v.ptr, x.s, x.b, x.heads, x.groups, x.d, A(scale), out.ptr,
                           lse.ptr, options);
  const cu::attention_engine forward_engine = plans.last_engine();
  cu::attention_backward<T>(plans, stream, dout.ptr, q.ptr, k.ptr, v.ptr, out.ptr, lse.ptr, x.s, x.b, x.heads,
                            x.groups, x.d, A(scale), dq.ptr, dk.ptr, dv.ptr, options);
  const cu::attention_engine backward_engine = plans.last_engine();
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  // The sink runs around the engine the call would run without it: cuDNN for bf16 / fp16 without a
  // window (where built in), the flash kernels otherwise.
  const bool expect_cudnn = use_cudnn && window < 0 && cu::attention_plans::has_cudnn() && strata::is_half_v<T>;
  const cu::attention_engine want = expect_cudnn ? cu::attention_engine::cudnn : cu::attention_engine::flash;
  check(forward_engine == want && backward_engine == want,
        name + " engine forward=" + std::string(cu::engine_name(forward_engine)) +
            " backward=" + std::string(cu::engine_name(backward_engine)));
  const double tol = tolerance<T>();
  auto report = [&](const char* what, double err) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s rel=%.3e (<= %.0e)", what, err, tol);
    check(err <= tol, name + buf);
  };
  report("out", relative_error(out.download(), rout));
  report("lse", relative_error(lse.download(), rlse));
  report("dq", relative_error(dq.download(), rdq));
  report("dk", relative_error(dk.download(), rdk));
  report("dv", relative_error(dv.download(), rdv));
  if (learnable) report("d sink", relative_error(dsink.download(), rdsink));
  else check(same_bits(dsink.download(), std::vector<A>(static_cast<std::size_t>(x.heads), A(0.5))),
             name + " off-by-one leaves the sink gradient alone");
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("FAIL no CUDA device found\n");
    return 1;
  }
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN
  std::printf("cuDNN: library %zu, headers %d, frontend %d\n", cudnnGetVersion(), CUDNN_VERSION,
              CUDNN_FRONTEND_VERSION);
#else
  std::printf("cuDNN: not built in; bf16/fp16 run on the flash kernels\n");
#endif

  try {
    cu::stream stream;
    cu::attention_plans plans(0);
    std::uint64_t seed = 1;

    // The flash kernels: head sizes 32, 48, 64, 128, 256; MHA and GQA; one query, odd lengths, 1024.
    std::vector<Shape> flash_shapes = {{1, 2, 4, 4, 32},    {7, 3, 8, 2, 48},  {129, 2, 12, 12, 64},
                                       {129, 1, 8, 2, 128}, {65, 1, 4, 2, 256}};
    if (!quick) flash_shapes.insert(flash_shapes.end(), {{1024, 1, 4, 4, 64}, {1024, 2, 8, 2, 128}});
    for (const Shape& x : flash_shapes) run_case<double>(plans, stream, x, false, seed++);
    for (const Shape& x : flash_shapes) run_case<float>(plans, stream, x, false, seed++);
    for (const Shape& x : {Shape{7, 3, 8, 2, 48}, Shape{129, 2, 12, 12, 64}, Shape{quick ? 33 : 1024, 1, 8, 2, 128}})
      run_case<bf16>(plans, stream, x, false, seed++);

    // cuDNN (or the flash kernels when built without it): s in {1, 7, 129, 1024}, heads/groups in
    // {4/4, 8/2, 12/12}, d in {64, 128}.
    const std::vector<index_t> lengths = quick ? std::vector<index_t>{1, 7, 129} : std::vector<index_t>{1, 7, 129, 1024};
    for (index_t s : lengths)
      for (auto [heads, groups] : {std::pair<index_t, index_t>{4, 4}, {8, 2}, {12, 12}})
        for (index_t d : {64, 128})
          run_case<bf16>(plans, stream, Shape{s, s == 1024 ? 1 : 2, heads, groups, d}, true, seed++);
    run_case<fp16>(plans, stream, Shape{129, 2, 8, 2, 64}, true, seed++);
    if (!quick) run_case<fp16>(plans, stream, Shape{1024, 1, 12, 12, 128}, true, seed++);

    // Strided views of a packed qkv projection: multi-head (groups = heads) and multi-query
    // (groups = 1), odd lengths, b = 1..3, on the flash kernels (float, double, bf16) and cuDNN.
    const std::vector<Shape> packed_flash = {{7, 3, 4, 4, 48},  {129, 2, 12, 12, 64}, {1, 1, 2, 2, 32},
                                             {7, 2, 8, 1, 48},  {65, 3, 4, 1, 128},   {129, 1, 8, 1, 64}};
    for (const Shape& x : packed_flash) run_packed_case<double>(plans, stream, x, false, seed++);
    for (const Shape& x : packed_flash) run_packed_case<float>(plans, stream, x, false, seed++);
    for (const Shape& x : {Shape{7, 3, 4, 4, 48}, Shape{33, 2, 4, 1, 64}}) run_packed_case<bf16>(plans, stream, x, false, seed++);
    std::vector<Shape> packed_cudnn = {{7, 3, 4, 4, 64},  {129, 2, 12, 12, 64}, {1, 2, 4, 4, 64}, {129, 1, 8, 8, 128},
                                       {7, 2, 8, 1, 64},  {129, 3, 8, 1, 128},  {33, 1, 4, 1, 64}, {1, 3, 4, 1, 64}};
    if (!quick) packed_cudnn.insert(packed_cudnn.end(), {{1023, 1, 12, 12, 64}, {1023, 2, 8, 1, 128}});
    for (const Shape& x : packed_cudnn) run_packed_case<bf16>(plans, stream, x, true, seed++);
    for (const Shape& x : {Shape{129, 2, 8, 8, 64}, Shape{65, 2, 4, 1, 64}}) run_packed_case<fp16>(plans, stream, x, true, seed++);

    // Attention sinks around either engine: off-by-one and learnable, MHA and GQA, one query and odd
    // lengths, with a sliding window (gpt-oss's alternating layers) on the flash kernels.
    for (strata::SoftmaxType softmax : {strata::SoftmaxType::off_by_one, strata::SoftmaxType::learnable}) {
      for (const Shape& x : {Shape{1, 2, 4, 4, 32}, Shape{7, 3, 8, 2, 48}, Shape{129, 2, 8, 2, 64}}) {
        run_sink_case<double>(plans, stream, x, false, softmax, -1, seed++);
        run_sink_case<float>(plans, stream, x, false, softmax, -1, seed++);
      }
      run_sink_case<double>(plans, stream, Shape{129, 2, 8, 2, 64}, false, softmax, 16, seed++);
      run_sink_case<float>(plans, stream, Shape{65, 1, 4, 4, 128}, false, softmax, 7, seed++);
      for (const Shape& x : {Shape{7, 3, 8, 2, 64}, Shape{129, 2, 12, 12, 64}, Shape{129, 1, 8, 2, 128}})
        run_sink_case<bf16>(plans, stream, x, true, softmax, -1, seed++);
      run_sink_case<bf16>(plans, stream, Shape{129, 2, 8, 2, 64}, false, softmax, 16, seed++);
      run_sink_case<fp16>(plans, stream, Shape{129, 2, 8, 2, 64}, true, softmax, -1, seed++);
    }
  } catch (const std::exception& e) {
    check(false, std::string("exception: ") + e.what());
  }

  std::printf("SUMMARY test_attention: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
