// tests/gpu/test_attention_dropout.cu: cuda::attention_forward / attention_backward with dropout on
// the attention probabilities (backend/attention_options.hpp) against the CPU twin.
//
// For every case: random inputs rounded to the element type; the CPU twin (cpu::attention_forward /
// attention_backward in double on the same values, the same AttentionOptions: key, probability,
// head offset) as the reference; relative errors of out, lse, dq, dk, dv within 1e-12 (double),
// 1e-5 (float), 1e-2 (bf16, fp16), which a different mask would miss by far (at s = 1, where dq
// and dk are 0 in exact arithmetic, their size against dout's instead); the engine is the
// flash kernels even where cuDNN is preferred (bf16/fp16: cuDNN cannot draw our mask) and the
// refusal names dropout; two runs give the same bits. Also: the mask itself read off the output
// (q = 0, v_j = e_j, so out_i[j] = Z_ij / (i + 1)) is the CPU twin's, element for element; strided
// views of a packed qkv projection with dropout against the CPU twin; a probability of 0 gives the
// bits of the call without options (and on bf16 with cuDNN still runs cuDNN).
//
// Context parallelism's blocks (AttentionOptions::causal, query_offset, key_offset): non-causal
// blocks (every key seen) and diagonal blocks at an offset, with and without dropout (the mask of
// the global positions), on the flash kernels and, for bf16 without dropout, on cuDNN, against
// the CPU twin with the same options, within the same tolerances; a non-causal block is far from
// the causal one. A sliding window (flash kernels, bf16 too) likewise, far from no window: on the
// diagonal, at an offset, and as a band of a block in the past where some rows see no key (out 0,
// lse -inf); an off-by-one sink on a diagonal and on a past block. And the merge of two blocks'
// outputs (cuda backend's attention_merge kernel) against cpu::attention_merge, rows with lse -inf
// on either side or both among them: within 4 ulps of the element type per element.
//
// Plain main(): one line per check, a summary line, exit status 1 on any failure. `--quick` runs
// only the small shapes (for compute-sanitizer).
#include <cuda_runtime.h>

#include <strata/backend/cpu/attention.hpp>
#include <strata/backend/cpu/elementwise.hpp>
#include <strata/backend/cuda/attention.hpp>
#include <strata/backend/cuda/kernels/attention_merge.cuh>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace cu = strata::cuda;
using strata::AttentionDropout;
using strata::AttentionOptions;
using strata::AttentionStrides;
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

std::string dropout_str(const AttentionDropout& x) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "p=%.2f head_offset=%lld", x.probability, (long long)x.head_offset);
  return buf;
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
    if (std::isinf(ref[i]) && g == ref[i]) continue;  // a row that saw no key of its block: lse -inf on both
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

// Random values rounded to T, and the same values in double.
template <class T>
void random_values(std::mt19937_64& gen, std::size_t n, std::vector<T>& t, std::vector<double>& ref) {
  std::normal_distribution<double> normal(0.0, 1.0);
  t.resize(n);
  ref.resize(n);
  for (std::size_t i = 0; i < n; ++i) ref[i] = to_double(t[i] = T(normal(gen)));
}

// A case's random q, k, v and dout rounded to T (h*) and the same values in double (r*), their
// sizes (q and out, k and v, lse) and the softmax scale 1 / sqrt(d).
template <class T>
struct CaseInputs {
  std::size_t nq, nk, nl;
  std::vector<T> hq, hk, hv, hdo;
  std::vector<double> rq, rk, rv, rdo;
  double scale;
};
template <class T>
CaseInputs<T> random_inputs(const Shape& x, std::uint64_t seed) {
  CaseInputs<T> in;
  in.nq = static_cast<std::size_t>(x.s * x.b * x.heads * x.d);
  in.nk = static_cast<std::size_t>(x.s * x.b * x.groups * x.d);
  in.nl = static_cast<std::size_t>(x.b * x.heads * x.s);
  std::mt19937_64 gen(seed);
  random_values(gen, in.nq, in.hq, in.rq);
  random_values(gen, in.nk, in.hk, in.rk);
  random_values(gen, in.nk, in.hv, in.rv);
  random_values(gen, in.nq, in.hdo, in.rdo);
  in.scale = 1.0 / std::sqrt(static_cast<double>(x.d));
  return in;
}

// One contiguous case against the CPU twin in double with the same options.
template <class T>
void run_case(cu::attention_plans& plans, cudaStream_t stream, const Shape& x, const AttentionDropout& dropout,
              bool prefer_cudnn, std::uint64_t seed) {
  using A = strata::accumulate_t<T>;
  plans.prefer_cudnn(prefer_cudnn);
  const std::string name = std::string(type_name<T>()) + (prefer_cudnn ? " cudnn-preferred " : " ") + x.str() + " " +
                           dropout_str(dropout);
  auto [nq, nk, nl, hq, hk, hv, hdo, rq, rk, rv, rdo, scale] = random_inputs<T>(x, seed);
  const AttentionOptions options{AttentionStrides{}, dropout};

  std::vector<double> rout(nq), rlse(nl), rdq(nq), rdk(nk), rdv(nk), plain_out(nq), plain_lse(nl);
  strata::cpu::attention_forward<double>(rq.data(), rk.data(), rv.data(), x.s, x.b, x.heads, x.groups, x.d, scale,
                                         rout.data(), rlse.data(), options);
  strata::cpu::attention_backward<double>(rdo.data(), rq.data(), rk.data(), rv.data(), rout.data(), rlse.data(), x.s,
                                          x.b, x.heads, x.groups, x.d, scale, rdq.data(), rdk.data(), rdv.data(), options);
  strata::cpu::attention_forward<double>(rq.data(), rk.data(), rv.data(), x.s, x.b, x.heads, x.groups, x.d, scale,
                                         plain_out.data(), plain_lse.data());

  DeviceArray<T> q(nq), k(nk), v(nk), dout(nq), out(nq), dq(nq), dk(nk), dv(nk);
  DeviceArray<A> lse(nl);
  q.upload(hq), k.upload(hk), v.upload(hv), dout.upload(hdo);
  struct Result {
    std::vector<T> out, dq, dk, dv;
    std::vector<A> lse;
    cu::attention_engine forward_engine, backward_engine;
    std::string forward_refusal, backward_refusal;
  };
  auto run = [&] {
    out.poison(), lse.poison(), dq.poison(), dk.poison(), dv.poison();
    Result r;
    cu::attention_forward<T>(plans, stream, q.ptr, k.ptr, v.ptr, x.s, x.b, x.heads, x.groups, x.d, A(scale), out.ptr,
                             lse.ptr, options);
    r.forward_engine = plans.last_engine(), r.forward_refusal = plans.last_refusal();
    cu::attention_backward<T>(plans, stream, dout.ptr, q.ptr, k.ptr, v.ptr, out.ptr, lse.ptr, x.s, x.b, x.heads,
                              x.groups, x.d, A(scale), dq.ptr, dk.ptr, dv.ptr, options);
    r.backward_engine = plans.last_engine(), r.backward_refusal = plans.last_refusal();
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
    r.out = out.download(), r.lse = lse.download(), r.dq = dq.download(), r.dk = dk.download(), r.dv = dv.download();
    return r;
  };
  const Result first = run();
  const Result second = run();

  const bool cudnn_possible = prefer_cudnn && cu::attention_plans::has_cudnn() && strata::is_half_v<T>;
  const bool names_dropout = !cudnn_possible || (first.forward_refusal.find("dropout") != std::string::npos &&
                                                 first.backward_refusal.find("dropout") != std::string::npos);
  check(first.forward_engine == cu::attention_engine::flash && first.backward_engine == cu::attention_engine::flash &&
            names_dropout,
        name + " engine forward=" + std::string(cu::engine_name(first.forward_engine)) +
            " backward=" + std::string(cu::engine_name(first.backward_engine)) +
            (first.forward_refusal.empty() ? "" : " (" + first.forward_refusal + ")"));
  const double tol = tolerance<T>();
  auto report = [&](const char* what, double err) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s rel=%.3e (<= %.0e)", what, err, tol);
    check(err <= tol, name + buf);
  };
  report("out", relative_error(first.out, rout));
  report("lse", relative_error(first.lse, rlse));
  if (x.s == 1) {
    // one key: dS = P (Z dO.v - dO.O) = 0 exactly, so dq and dk are rounding noise in both; their
    // size against dout's is what there is to check
    const std::vector<double> zero_q(nq, 0.0), zero_k(nk, 0.0);
    const double dout_norm = std::sqrt(std::inner_product(rdo.begin(), rdo.end(), rdo.begin(), 0.0));
    report("dq (0 at s = 1) |dq|/|dout|", relative_error(first.dq, zero_q) / dout_norm);
    report("dk (0 at s = 1) |dk|/|dout|", relative_error(first.dk, zero_k) / dout_norm);
  } else {
    report("dq", relative_error(first.dq, rdq));
    report("dk", relative_error(first.dk, rdk));
  }
  report("dv", relative_error(first.dv, rdv));
  // the comparison has teeth: the output without dropout is far from the one with it
  const double apart = relative_error(first.out, plain_out);
  char buf[96];
  std::snprintf(buf, sizeof buf, " dropout changed out: rel to undropped=%.3e (> 10 x tolerance)", apart);
  check(apart > 10 * tol, name + buf);
  check(same_bits(first.out, second.out) && same_bits(first.lse, second.lse) && same_bits(first.dq, second.dq) &&
            same_bits(first.dk, second.dk) && same_bits(first.dv, second.dv),
        name + " two runs bit-identical");
}

// One context-parallel block (causal or not, at offsets) against the CPU twin with the same
// options; the engine is cuDNN for bf16/fp16 without dropout where it is built in and preferred.
template <class T>
void run_block_case(cu::attention_plans& plans, cudaStream_t stream, const Shape& x, AttentionOptions options,
                    bool prefer_cudnn, std::uint64_t seed) {
  using A = strata::accumulate_t<T>;
  plans.prefer_cudnn(prefer_cudnn);
  char tag[128];
  std::snprintf(tag, sizeof tag, " block causal=%d query_offset=%lld key_offset=%lld window=%lld%s ", options.causal ? 1 : 0,
                (long long)options.query_offset, (long long)options.key_offset, (long long)options.window,
                options.has_sink() ? " off-by-one sink" : "");
  const std::string name = std::string(type_name<T>()) + (prefer_cudnn ? " cudnn-preferred" : "") + tag + x.str() +
                           " " + dropout_str(options.dropout);
  auto [nq, nk, nl, hq, hk, hv, hdo, rq, rk, rv, rdo, scale] = random_inputs<T>(x, seed);
  std::vector<double> rout(nq), rlse(nl), rdq(nq), rdk(nk), rdv(nk), other_out(nq), other_lse(nl);
  strata::cpu::attention_forward<double>(rq.data(), rk.data(), rv.data(), x.s, x.b, x.heads, x.groups, x.d, scale,
                                         rout.data(), rlse.data(), options);
  strata::cpu::attention_backward<double>(rdo.data(), rq.data(), rk.data(), rv.data(), rout.data(), rlse.data(), x.s,
                                          x.b, x.heads, x.groups, x.d, scale, rdq.data(), rdk.data(), rdv.data(), options);
  AttentionOptions other = options;  // the other kind of block at offset 0 (or no window): the teeth
  if (options.window >= 0) other.window = -1;
  else other.causal = !options.causal, other.query_offset = other.key_offset = 0;
  strata::cpu::attention_forward<double>(rq.data(), rk.data(), rv.data(), x.s, x.b, x.heads, x.groups, x.d, scale,
                                         other_out.data(), other_lse.data(), other);

  DeviceArray<T> q(nq), k(nk), v(nk), dout(nq), out(nq), dq(nq), dk(nk), dv(nk);
  DeviceArray<A> lse(nl);
  q.upload(hq), k.upload(hk), v.upload(hv), dout.upload(hdo);
  out.poison(), lse.poison(), dq.poison(), dk.poison(), dv.poison();
  cu::attention_forward<T>(plans, stream, q.ptr, k.ptr, v.ptr, x.s, x.b, x.heads, x.groups, x.d, A(scale), out.ptr,
                           lse.ptr, options);
  const cu::attention_engine forward_engine = plans.last_engine();
  const std::string refusal = plans.last_refusal();
  cu::attention_backward<T>(plans, stream, dout.ptr, q.ptr, k.ptr, v.ptr, out.ptr, lse.ptr, x.s, x.b, x.heads, x.groups,
                            x.d, A(scale), dq.ptr, dk.ptr, dv.ptr, options);
  const cu::attention_engine backward_engine = plans.last_engine();
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const bool cudnn_expected = prefer_cudnn && cu::attention_plans::has_cudnn() && strata::is_half_v<T> &&
                              !options.dropout.active() && options.window < 0;
  const cu::attention_engine expected = cudnn_expected ? cu::attention_engine::cudnn : cu::attention_engine::flash;
  check(forward_engine == expected && (x.s == 1 || backward_engine == expected),
        name + " engine forward=" + std::string(cu::engine_name(forward_engine)) + " backward=" +
            std::string(cu::engine_name(backward_engine)) + (refusal.empty() ? "" : " (" + refusal + ")"));
  const double tol = tolerance<T>();
  auto report = [&](const char* what, double err) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s rel=%.3e (<= %.0e)", what, err, tol);
    check(err <= tol, name + buf);
  };
  const std::vector<T> got_out = out.download();
  report("out", relative_error(got_out, rout));
  report("lse", relative_error(lse.download(), rlse));
  report("dq", relative_error(dq.download(), rdq));
  report("dk", relative_error(dk.download(), rdk));
  report("dv", relative_error(dv.download(), rdv));
  const double apart = relative_error(got_out, other_out);
  char buf[96];
  std::snprintf(buf, sizeof buf, " the other kind of block differs: rel=%.3e (> 10 x tolerance)", apart);
  check(apart > 10 * tol, name + buf);
}

// cuda backend's attention_merge against cpu::attention_merge on the same values: each output
// element within 4 ulps of T of the size of its two terms (|out| + |block_out|: the sum of two
// weighted terms may cancel, and a fused multiply-add on one side rounds the terms differently),
// each lse within 4 ulps of the accumulate type.
template <class T>
void run_merge_case(cudaStream_t stream, index_t s, index_t b, index_t heads, index_t d, std::uint64_t seed) {
  using A = strata::accumulate_t<T>;
  const std::size_t n = static_cast<std::size_t>(s * b * heads * d), nl = static_cast<std::size_t>(b * heads * s);
  std::mt19937_64 gen(seed);
  std::vector<T> out, block_out;
  std::vector<double> ignore;
  random_values(gen, n, out, ignore);
  random_values(gen, n, block_out, ignore);
  std::uniform_real_distribution<double> spread(-6.0, 6.0);
  std::vector<A> lse(nl), block_lse(nl);
  for (std::size_t i = 0; i < nl; ++i) lse[i] = A(spread(gen)), block_lse[i] = A(spread(gen));
  for (std::size_t i = 0; i < nl; i += 7) lse[i] = -std::numeric_limits<A>::infinity();  // rows that saw no key:
  for (std::size_t i = 0; i < nl; i += 5) block_lse[i] = -std::numeric_limits<A>::infinity();  // one side, or both
  std::vector<T> cpu_out = out;
  std::vector<A> cpu_lse = lse;
  strata::cpu::attention_merge<T>(cpu_out.data(), cpu_lse.data(), block_out.data(), block_lse.data(), s, b, heads, d);
  DeviceArray<T> g_out(n), g_block(n);
  DeviceArray<A> g_lse(nl), g_block_lse(nl);
  g_out.upload(out), g_block.upload(block_out), g_lse.upload(lse), g_block_lse.upload(block_lse);
  strata::cuda::kernels::attention_merge<T>(g_out.ptr, g_lse.ptr, g_block.ptr, g_block_lse.ptr, s, b, heads, d, stream);
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<T> got = g_out.download();
  const std::vector<A> got_lse = g_lse.download();
  const double ulp_t = std::is_same_v<T, double> ? 0x1p-52 : std::is_same_v<T, float> ? 0x1p-23 : 0x1p-7;
  const double ulp_a = std::is_same_v<A, double> ? 0x1p-52 : 0x1p-23;
  double worst = 0, worst_lse = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double ref = to_double(cpu_out[i]), g = to_double(got[i]);
    const double terms = std::abs(to_double(out[i])) + std::abs(to_double(block_out[i]));
    worst = std::max(worst, std::isfinite(g) ? std::abs(g - ref) / std::max(terms, 1e-300) / ulp_t : INFINITY);
  }
  for (std::size_t i = 0; i < nl; ++i) {
    const double ref = cpu_lse[i], g = got_lse[i];
    if (g == ref) continue;  // both -inf included
    worst_lse = std::max(worst_lse, std::isfinite(g) ? std::abs(g - ref) / std::max(std::abs(ref), 1.0) / ulp_a : INFINITY);
  }
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s attention_merge s=%lld b=%lld heads=%lld d=%lld: out within %.2f ulps, lse within %.2f "
                "ulps of the CPU twin (<= 4)", type_name<T>(), (long long)s, (long long)b, (long long)heads, (long long)d,
                worst, worst_lse);
  check(worst <= 4 && worst_lse <= 4, buf);
}

// q = 0 and v_j = e_j (d = s): out_i[j] = Z_ij / (i + 1), so the zeros of out are the mask.
void run_mask_case(cu::attention_plans& plans, cudaStream_t stream, index_t s, index_t b, index_t heads,
                   const AttentionDropout& dropout) {
  plans.prefer_cudnn(false);
  const index_t d = s;
  const std::size_t n = static_cast<std::size_t>(s * b * heads * d), nl = static_cast<std::size_t>(b * heads * s);
  std::vector<float> hq(n, 0.0f), hkv(n, 0.0f);
  for (index_t j = 0; j < s; ++j)
    for (index_t bi = 0; bi < b; ++bi)
      for (index_t g = 0; g < heads; ++g) hkv[static_cast<std::size_t>(((j * b + bi) * heads + g) * d + j)] = 1.0f;
  const AttentionOptions options{AttentionStrides{}, dropout};
  std::vector<float> cpu_out(n), cpu_lse(nl);
  strata::cpu::attention_forward<float>(hq.data(), hkv.data(), hkv.data(), s, b, heads, heads, d, 1.0f, cpu_out.data(),
                                        cpu_lse.data(), options);
  DeviceArray<float> q(n), kv(n), out(n), lse(nl);
  q.upload(hq), kv.upload(hkv);
  out.poison();
  cu::attention_forward<float>(plans, stream, q.ptr, kv.ptr, kv.ptr, s, b, heads, heads, d, 1.0f, out.ptr, lse.ptr, options);
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<float> gpu_out = out.download();
  std::size_t pairs = 0, disagree = 0, dropped = 0;
  for (index_t bi = 0; bi < b; ++bi)
    for (index_t h = 0; h < heads; ++h)
      for (index_t i = 0; i < s; ++i)
        for (index_t j = 0; j <= i; ++j) {
          const std::size_t at = static_cast<std::size_t>(((i * b + bi) * heads + h) * d + j);
          ++pairs;
          dropped += cpu_out[at] == 0.0f;
          disagree += (gpu_out[at] == 0.0f) != (cpu_out[at] == 0.0f) || !std::isfinite(gpu_out[at]);
        }
  char buf[200];
  std::snprintf(buf, sizeof buf, "mask s=%lld b=%lld heads=%lld %s: %zu of %zu pairs disagree with the CPU twin, dropped %.4f",
                (long long)s, (long long)b, (long long)heads, dropout_str(dropout).c_str(), disagree, pairs,
                static_cast<double>(dropped) / static_cast<double>(pairs));
  const double fraction = static_cast<double>(dropped) / static_cast<double>(pairs);
  const double sigma = std::sqrt(dropout.probability * (1 - dropout.probability) / static_cast<double>(pairs));
  check(disagree == 0 && std::abs(fraction - dropout.probability) <= 5 * sigma, buf);
}

// Views of a packed qkv projection (groups == heads or groups == 1) with dropout, against the CPU
// twin on split copies; the packed gradient NaN-filled first, so every element must be written.
template <class T>
void run_packed_case(cu::attention_plans& plans, cudaStream_t stream, const Shape& x, const AttentionDropout& dropout,
                     std::uint64_t seed) {
  using A = strata::accumulate_t<T>;
  plans.prefer_cudnn(true);
  const index_t hpg = x.heads / x.groups, rows = x.s * x.b, width = x.groups * (hpg + 2) * x.d;
  const strata::PackedQkvView view = strata::packed_qkv_view(x.groups, hpg, x.d);
  const std::string name = std::string(type_name<T>()) + " packed " + x.str() + " " + dropout_str(dropout);
  if (!view.is_view) {
    check(false, name + " is not a strided view of the packed projection");
    return;
  }
  const std::size_t np = static_cast<std::size_t>(rows * width), nq = static_cast<std::size_t>(rows * x.heads * x.d),
                    nk = static_cast<std::size_t>(rows * x.groups * x.d), nl = static_cast<std::size_t>(x.b * x.heads * x.s);
  std::mt19937_64 gen(seed);
  std::vector<T> hpacked, hdo;
  std::vector<double> rpacked, rdo;
  random_values(gen, np, hpacked, rpacked);
  random_values(gen, nq, hdo, rdo);
  const double scale = 1.0 / std::sqrt(static_cast<double>(x.d));
  const AttentionOptions contiguous{AttentionStrides{}, dropout};
  std::vector<double> rq(nq), rk(nk), rv(nk), rout(nq), rlse(nl), rdq(nq), rdk(nk), rdv(nk), rdpacked(np);
  strata::cpu::qkv_split<double>(rpacked.data(), rows, x.groups, hpg, x.d, rq.data(), rk.data(), rv.data());
  strata::cpu::attention_forward<double>(rq.data(), rk.data(), rv.data(), x.s, x.b, x.heads, x.groups, x.d, scale,
                                         rout.data(), rlse.data(), contiguous);
  strata::cpu::attention_backward<double>(rdo.data(), rq.data(), rk.data(), rv.data(), rout.data(), rlse.data(), x.s,
                                          x.b, x.heads, x.groups, x.d, scale, rdq.data(), rdk.data(), rdv.data(),
                                          contiguous);
  strata::cpu::qkv_merge<double>(rdq.data(), rdk.data(), rdv.data(), rows, x.groups, hpg, x.d, rdpacked.data());

  DeviceArray<T> packed(np), dpacked(np), dout(nq), out(nq);
  DeviceArray<A> lse(nl);
  packed.upload(hpacked), dout.upload(hdo);
  out.poison(), lse.poison(), dpacked.poison();
  const AttentionOptions options{view.strides, dropout};
  const T* p = packed.ptr;
  T* g = dpacked.ptr;
  cu::attention_forward<T>(plans, stream, p, p + view.k_offset, p + view.v_offset, x.s, x.b, x.heads, x.groups, x.d,
                           A(scale), out.ptr, lse.ptr, options);
  const cu::attention_engine forward_engine = plans.last_engine();
  cu::attention_backward<T>(plans, stream, dout.ptr, p, p + view.k_offset, p + view.v_offset, out.ptr, lse.ptr, x.s,
                            x.b, x.heads, x.groups, x.d, A(scale), g, g + view.k_offset, g + view.v_offset, options);
  const cu::attention_engine backward_engine = plans.last_engine();
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  check(forward_engine == cu::attention_engine::flash && backward_engine == cu::attention_engine::flash,
        name + " runs on the flash kernels");
  const double tol = tolerance<T>();
  auto report = [&](const char* what, double err) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s rel=%.3e (<= %.0e)", what, err, tol);
    check(err <= tol, name + buf);
  };
  report("out", relative_error(out.download(), rout));
  report("lse", relative_error(lse.download(), rlse));
  report("dqkv", relative_error(dpacked.download(), rdpacked));  // infinite if an element stayed NaN
}

// Probability 0 (any key) is the call without options: the same bits, and the same engine.
template <class T>
void run_zero_case(cu::attention_plans& plans, cudaStream_t stream, const Shape& x, bool prefer_cudnn, std::uint64_t seed) {
  using A = strata::accumulate_t<T>;
  plans.prefer_cudnn(prefer_cudnn);
  const std::string name = std::string(type_name<T>()) + (prefer_cudnn ? " cudnn-preferred " : " ") + x.str() + " p=0";
  const std::size_t nq = static_cast<std::size_t>(x.s * x.b * x.heads * x.d);
  const std::size_t nk = static_cast<std::size_t>(x.s * x.b * x.groups * x.d);
  const std::size_t nl = static_cast<std::size_t>(x.b * x.heads * x.s);
  std::mt19937_64 gen(seed);
  std::vector<T> hq, hk, hv, hdo;
  std::vector<double> unused;
  random_values(gen, nq, hq, unused);
  random_values(gen, nk, hk, unused);
  random_values(gen, nk, hv, unused);
  random_values(gen, nq, hdo, unused);
  DeviceArray<T> q(nq), k(nk), v(nk), dout(nq), out(nq), dq(nq), dk(nk), dv(nk);
  DeviceArray<A> lse(nl);
  q.upload(hq), k.upload(hk), v.upload(hv), dout.upload(hdo);
  const A scale = A(1.0 / std::sqrt(static_cast<double>(x.d)));
  struct Result {
    std::vector<T> out, dq, dk, dv;
    std::vector<A> lse;
    cu::attention_engine engine;
  };
  auto run = [&](const AttentionOptions* options) {
    out.poison(), lse.poison(), dq.poison(), dk.poison(), dv.poison();
    if (options) {
      cu::attention_forward<T>(plans, stream, q.ptr, k.ptr, v.ptr, x.s, x.b, x.heads, x.groups, x.d, scale, out.ptr,
                               lse.ptr, *options);
      cu::attention_backward<T>(plans, stream, dout.ptr, q.ptr, k.ptr, v.ptr, out.ptr, lse.ptr, x.s, x.b, x.heads,
                                x.groups, x.d, scale, dq.ptr, dk.ptr, dv.ptr, *options);
    } else {
      cu::attention_forward<T>(plans, stream, q.ptr, k.ptr, v.ptr, x.s, x.b, x.heads, x.groups, x.d, scale, out.ptr,
                               lse.ptr);
      cu::attention_backward<T>(plans, stream, dout.ptr, q.ptr, k.ptr, v.ptr, out.ptr, lse.ptr, x.s, x.b, x.heads,
                                x.groups, x.d, scale, dq.ptr, dk.ptr, dv.ptr);
    }
    Result r;
    r.engine = plans.last_engine();
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
    r.out = out.download(), r.lse = lse.download(), r.dq = dq.download(), r.dk = dk.download(), r.dv = dv.download();
    return r;
  };
  const AttentionOptions zero{AttentionStrides{}, AttentionDropout{0.0, 0x5eed, 3}};
  const Result with = run(&zero), without = run(nullptr);
  check(with.engine == without.engine && same_bits(with.out, without.out) && same_bits(with.lse, without.lse) &&
            same_bits(with.dq, without.dq) && same_bits(with.dk, without.dk) && same_bits(with.dv, without.dv),
        name + " gives the bits and engine (" + std::string(cu::engine_name(with.engine)) + ") of the call without options");
}

}  // namespace

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
  std::printf("cuDNN: %s\n", cu::attention_plans::has_cudnn() ? "built in (dropout must still run the flash kernels)" : "not built in");

  try {
    cu::stream stream;
    cu::attention_plans plans(0);
    std::uint64_t seed = 1;
    const AttentionDropout light{0.1, 0x0123456789abcdefull, 0}, heavy{0.5, 0xfeedbeefull, 4};

    // head sizes 32 .. 256, MHA, GQA and MQA, one query, odd lengths, a head offset
    std::vector<Shape> shapes = {{1, 2, 4, 4, 32}, {7, 3, 8, 2, 48}, {129, 2, 12, 12, 64}, {65, 1, 8, 2, 128},
                                 {33, 2, 4, 1, 256}};
    if (!quick) shapes.insert(shapes.end(), {{1024, 1, 4, 4, 64}, {513, 2, 8, 2, 128}});
    for (const Shape& x : shapes)
      for (const AttentionDropout& dropout : {light, heavy}) {
        run_case<double>(plans, stream, x, dropout, false, seed++);
        run_case<float>(plans, stream, x, dropout, false, seed++);
      }
    // bf16 and fp16, cuDNN preferred: the flash kernels must run anyway
    for (const Shape& x : {Shape{7, 3, 8, 2, 64}, Shape{129, 2, 12, 12, 64}, Shape{quick ? 65 : 1024, 1, 8, 2, 128}})
      for (const AttentionDropout& dropout : {light, heavy}) run_case<bf16>(plans, stream, x, dropout, true, seed++);
    run_case<bf16>(plans, stream, Shape{65, 2, 4, 4, 48}, heavy, false, seed++);
    run_case<fp16>(plans, stream, Shape{129, 2, 8, 2, 64}, light, true, seed++);

    // the mask, element for element
    run_mask_case(plans, stream, 64, 2, 4, light);
    run_mask_case(plans, stream, 128, 2, 4, heavy);
    run_mask_case(plans, stream, 256, 1, 2, AttentionDropout{0.3, 7, 11});

    // strided views with dropout
    for (const Shape& x : {Shape{7, 3, 4, 4, 48}, Shape{129, 2, 12, 12, 64}, Shape{65, 3, 4, 1, 128}}) {
      run_packed_case<double>(plans, stream, x, heavy, seed++);
      run_packed_case<float>(plans, stream, x, light, seed++);
      run_packed_case<bf16>(plans, stream, x, heavy, seed++);
    }

    // context parallelism's blocks: non-causal (keys wholly in the past) and diagonal at an offset,
    // with and without dropout, on both engines
    std::vector<Shape> blocks = {{7, 3, 8, 2, 48}, {129, 2, 4, 4, 64}, {64, 2, 8, 2, 128}};
    if (!quick) blocks.push_back({512, 1, 8, 8, 64});
    for (const Shape& x : blocks) {
      AttentionOptions past;
      past.causal = false, past.query_offset = 3 * x.s, past.key_offset = x.s;
      AttentionOptions diagonal;
      diagonal.query_offset = diagonal.key_offset = 2 * x.s;
      AttentionOptions window;  // sliding window (Mistral, gpt-oss), on the flash kernels
      window.window = x.s > 40 ? 37 : 2;
      // a window over a block one chunk in the past: rows i < s - s / 2 see a band of its keys, the
      // others none (out 0, lse -inf)
      AttentionOptions band;
      band.causal = false, band.query_offset = 2 * x.s, band.key_offset = x.s, band.window = x.s / 2;
      AttentionOptions diagonal_window = diagonal;  // a diagonal block at an offset, windowed, with a sink
      diagonal_window.window = x.s / 3, diagonal_window.softmax = strata::SoftmaxType::off_by_one;
      AttentionOptions past_sink = past;  // a sink on a block wholly in the past
      past_sink.softmax = strata::SoftmaxType::off_by_one;
      for (AttentionOptions options : {past, diagonal, window, band, diagonal_window, past_sink})
        for (const AttentionDropout& dropout : {AttentionDropout{}, light}) {
          options.dropout = dropout;
          run_block_case<double>(plans, stream, x, options, false, seed++);
          run_block_case<float>(plans, stream, x, options, false, seed++);
          run_block_case<bf16>(plans, stream, x, options, true, seed++);
        }
    }
    run_block_case<fp16>(plans, stream, Shape{65, 2, 8, 2, 64}, [] {
      AttentionOptions o;
      o.causal = false, o.key_offset = 0, o.query_offset = 65;
      return o;
    }(), true, seed++);
    for (index_t s : {1, 37, 256}) {
      run_merge_case<double>(stream, s, 2, 4, 64, seed++);
      run_merge_case<float>(stream, s, 3, 8, 128, seed++);
      run_merge_case<bf16>(stream, s, 2, 4, 64, seed++);
    }

    // probability 0: untouched paths
    run_zero_case<float>(plans, stream, Shape{65, 2, 8, 2, 64}, false, seed++);
    run_zero_case<bf16>(plans, stream, Shape{129, 2, 8, 2, 64}, true, seed++);
    run_zero_case<bf16>(plans, stream, Shape{129, 2, 8, 2, 64}, false, seed++);
  } catch (const std::exception& e) {
    check(false, std::string("exception: ") + e.what());
  }

  std::printf("SUMMARY test_attention_dropout: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
