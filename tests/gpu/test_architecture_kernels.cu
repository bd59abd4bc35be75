// tests/gpu/test_architecture_kernels.cu: the kernels of the architecture options against their CPU
// twins (the same entry points of cpu::backend): the gated activations beyond SwiGLU (quick GeGLU,
// gpt-oss's clamp and linear offset), squared ReLU, the shared experts' sigmoid gate (Qwen2-MoE), the
// rotary variants (partial, interleaved,
// Llama 3.1 scaling; the attention's split with RoPE in one pass and the merge with its backward, also
// bit for bit against the two steps, and the merge writing FP8 codes against the merge then fp8_cast), and LayerNorm / RMSNorm with a weight offset (--apply-layernorm-1p) on the
// warp-per-row and the block-per-row paths. Each check runs the GPU entry point twice on fresh
// uploads with NaN-filled outputs: the same bits both times, and ||gpu - cpu|| / ||cpu|| within
// 1e-12 (double), 1e-5 (float), 1e-2 (bf16).
//
// Usage: test_architecture_kernels [--quiet]
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <strata/backend/cpu/backend.hpp>

#include "check.hpp"

using namespace gpu_test;
using strata::cuda::backend;
using twin = strata::cpu::backend;

namespace {

template <class T>
std::vector<T> download(const backend& device, const device_vector<T>& d) {
  std::vector<T> host(d.size());
  device.copy_to_host(d.data(), static_cast<index_t>(d.size()), host.data());
  return host;
}
template <class T>
void upload(const backend& device, const std::vector<T>& host, const device_vector<T>& d) {
  device.copy_from_host(host.data(), static_cast<index_t>(host.size()), d.data());
}
template <class T>
void nan_fill(const backend& device, const device_vector<T>& d) {
  device.fill(d.data(), static_cast<index_t>(d.size()), std::numeric_limits<double>::quiet_NaN());
}
template <class V>
void compare(suite& results, const std::string& label, const std::vector<V>& first, const std::vector<V>& second,
             const std::vector<V>& reference, double tol) {
  const bool repeat = same_bits(first, second);
  const double error = relative_error(first, reference);
  results.record(repeat && error <= tol, label + ": rel " + format("%.2e", error) + " (tol " + format("%.0e", tol) + "), " +
                                             (repeat ? "same bits twice" : "DIFFERENT bits on the second run"));
}

std::string glu_name(const strata::GluActivation& a) {
  return std::string(a.kind == strata::GluKind::quick_gelu ? "quick_gelu" : "silu") + " clamp=" + format("%.1f", a.clamp) +
         " offset=" + format("%.1f", a.linear_offset);
}

template <class T>
void test_activations(backend& dev, suite& results, host_rng& rng, index_t rows, index_t f) {
  const double tol = tolerance<T>();
  const auto N = static_cast<std::size_t>(rows * f);
  const std::string dims = type_name<T>() + " rows=" + std::to_string(rows) + " f=" + std::to_string(f);
  for (const strata::GluActivation a : {strata::GluActivation{strata::GluKind::quick_gelu, 0, 0},
                                        strata::GluActivation{strata::GluKind::quick_gelu, 1.5, 1.0},
                                        strata::GluActivation{strata::GluKind::silu, 1.5, 0.5}}) {
    auto vgu = rng.template uniform<T>(2 * N, -3, 3), vdy = rng.template uniform<T>(N);
    std::vector<T> ry(N), rdgu(2 * N);
    twin::glu_forward(vgu.data(), rows, f, a, ry.data());
    twin::glu_backward(vdy.data(), vgu.data(), rows, f, a, rdgu.data());
    device_vector<T> gu(2 * N), dy(N), y(N), dgu(2 * N);
    auto run = [&] {
      upload(dev, vgu, gu); upload(dev, vdy, dy); nan_fill(dev, y); nan_fill(dev, dgu);
      dev.glu_forward(gu.data(), rows, f, a, y.data());
      dev.glu_backward(dy.data(), gu.data(), rows, f, a, dgu.data());
      return std::pair{download(dev, y), download(dev, dgu)};
    };
    auto r1 = run(), r2 = run();
    compare(results, "glu_forward<" + dims + "> " + glu_name(a) + " y", r1.first, r2.first, ry, tol);
    compare(results, "glu_backward<" + dims + "> " + glu_name(a) + " dgate_up", r1.second, r2.second, rdgu, tol);
  }
  {
    auto vx = rng.template uniform<T>(N, -2, 2), vdy = rng.template uniform<T>(N);
    std::vector<T> ry(N), rdx(N);
    twin::squared_relu_forward(vx.data(), static_cast<index_t>(N), ry.data());
    twin::squared_relu_backward(vdy.data(), vx.data(), static_cast<index_t>(N), rdx.data());
    device_vector<T> x(N), dy(N), y(N), dx(N);
    auto run = [&] {
      upload(dev, vx, x); upload(dev, vdy, dy); nan_fill(dev, y); nan_fill(dev, dx);
      dev.squared_relu_forward(x.data(), static_cast<index_t>(N), y.data());
      dev.squared_relu_backward(dy.data(), x.data(), static_cast<index_t>(N), dx.data());
      return std::pair{download(dev, y), download(dev, dx)};
    };
    auto r1 = run(), r2 = run();
    compare(results, "squared_relu_forward<" + dims + "> y", r1.first, r2.first, ry, tol);
    compare(results, "squared_relu_backward<" + dims + "> dx", r1.second, r2.second, rdx, tol);
  }
  {  // the shared experts' gate: rows (rows, f) scaled by sigmoid(z[r])
    auto vx = rng.template uniform<T>(N, -2, 2), vz = rng.template uniform<T>(static_cast<std::size_t>(rows), -4, 4),
         vdy = rng.template uniform<T>(N);
    std::vector<T> ry(N), rdx(N), rdz(static_cast<std::size_t>(rows));
    twin::sigmoid_gate_forward(vx.data(), vz.data(), rows, f, ry.data());
    twin::sigmoid_gate_backward(vdy.data(), vx.data(), vz.data(), rows, f, rdx.data(), rdz.data());
    device_vector<T> x(N), z(static_cast<std::size_t>(rows)), dy(N), y(N), dx(N), dz(static_cast<std::size_t>(rows));
    auto run = [&] {
      upload(dev, vx, x); upload(dev, vz, z); upload(dev, vdy, dy); nan_fill(dev, y); nan_fill(dev, dx); nan_fill(dev, dz);
      dev.sigmoid_gate_forward(x.data(), z.data(), rows, f, y.data());
      dev.sigmoid_gate_backward(dy.data(), x.data(), z.data(), rows, f, dx.data(), dz.data());
      return std::tuple{download(dev, y), download(dev, dx), download(dev, dz)};
    };
    auto r1 = run(), r2 = run();
    compare(results, "sigmoid_gate_forward<" + dims + "> y", std::get<0>(r1), std::get<0>(r2), ry, tol);
    compare(results, "sigmoid_gate_backward<" + dims + "> dx", std::get<1>(r1), std::get<1>(r2), rdx, tol);
    compare(results, "sigmoid_gate_backward<" + dims + "> dz", std::get<2>(r1), std::get<2>(r2), rdz, tol);
  }
}

template <class T>
void test_rope(backend& dev, suite& results, host_rng& rng, index_t s, index_t heads, index_t d) {
  const double tol = tolerance<T>();
  const auto total = static_cast<std::size_t>(s * heads * d);
  struct variant { const char* name; strata::RopeOptions options; };
  strata::RopeOptions partial, interleaved, scaled, all, yarn;
  partial.rotary_dim = d / 2 - (d / 2) % 2;
  interleaved.interleaved = true;
  scaled.scaling_factor = 8, scaled.original_max_positions = 64;  // all three frequency regimes at these sizes
  all = scaled, all.interleaved = true, all.rotary_dim = partial.rotary_dim;
  // YaRN: kept, ramped and interpolated pairs at these sizes, cos and sin times the attention factor
  yarn.yarn_factor = 32, yarn.yarn_original_max_positions = 4096, yarn.yarn_round_to_int = false;
  for (const variant& v : {variant{"partial", partial}, variant{"interleaved", interleaved}, variant{"llama3 scaled", scaled},
                           variant{"partial interleaved scaled", all}, variant{"yarn", yarn}}) {
    auto vx = rng.template uniform<T>(total);
    std::vector<T> rf = vx, rb = vx;
    twin::rope_forward(rf.data(), s, heads, d, 500000.0, 7, v.options);
    twin::rope_backward(rb.data(), s, heads, d, 500000.0, 7, v.options);
    device_vector<T> x(total);
    auto run = [&](bool inverse) {
      upload(dev, vx, x);
      if (inverse) dev.rope_backward(x.data(), s, heads, d, 500000.0, 7, v.options);
      else dev.rope_forward(x.data(), s, heads, d, 500000.0, 7, v.options);
      return download(dev, x);
    };
    auto f1 = run(false), f2 = run(false), b1 = run(true), b2 = run(true);
    const std::string dims = type_name<T>() + " s=" + std::to_string(s) + " n=" + std::to_string(heads) + " d=" +
                             std::to_string(d) + " " + v.name;
    compare(results, "rope_forward<" + dims + "> x", f1, f2, rf, tol);
    compare(results, "rope_backward<" + dims + "> dx", b1, b2, rb, tol);
  }
}

// The attention's split with RoPE in one pass (qkv_split_rope) and the merge with RoPE's backward
// (qkv_merge_rope) against the GPU's own two steps (qkv_split then rope_forward on q and k;
// rope_backward on copies of dq and dk then qkv_merge) bit for bit, and against the CPU twin within
// the tolerance; the merge leaves dq and dk as they were. Packed rows [s * b, groups, hpg + 2, d].
template <class T>
void test_qkv_rope(backend& dev, suite& results, host_rng& rng, index_t s, index_t b, index_t groups, index_t hpg, index_t d) {
  const double tol = tolerance<T>();
  const index_t heads = groups * hpg;
  const auto nq = static_cast<std::size_t>(s * b * heads * d), nk = static_cast<std::size_t>(s * b * groups * d),
             np = nq + 2 * nk;
  strata::RopeOptions plain, partial, interleaved, yarn;
  partial.rotary_dim = d / 2 - (d / 2) % 2;
  interleaved.interleaved = true;
  yarn.yarn_factor = 32, yarn.yarn_original_max_positions = 4096, yarn.yarn_round_to_int = false;
  struct variant { const char* name; strata::RopeOptions options; };
  for (const variant& v : {variant{"plain", plain}, variant{"partial", partial}, variant{"interleaved", interleaved},
                           variant{"yarn", yarn}}) {
    const auto vqkv = rng.template uniform<T>(np), vdq = rng.template uniform<T>(nq), vdk = rng.template uniform<T>(nk),
               vdv = rng.template uniform<T>(nk);
    std::vector<T> rq(nq), rk(nk), rv(nk), rd(np);
    twin::qkv_split_rope(vqkv.data(), s, b, groups, hpg, d, rq.data(), rk.data(), rv.data(), 500000.0, 3, v.options);
    twin::qkv_merge_rope(vdq.data(), vdk.data(), vdv.data(), s, b, groups, hpg, d, rd.data(), 500000.0, 3, v.options);
    device_vector<T> qkv(np), q(nq), k(nk), vv(nk), dq(nq), dk(nk), dv(nk), dqkv(np);
    auto fused = [&] {
      upload(dev, vqkv, qkv); upload(dev, vdq, dq); upload(dev, vdk, dk); upload(dev, vdv, dv);
      nan_fill(dev, q); nan_fill(dev, k); nan_fill(dev, vv); nan_fill(dev, dqkv);
      dev.qkv_split_rope(qkv.data(), s, b, groups, hpg, d, q.data(), k.data(), vv.data(), 500000.0, 3, v.options);
      dev.qkv_merge_rope(dq.data(), dk.data(), dv.data(), s, b, groups, hpg, d, dqkv.data(), 500000.0, 3, v.options);
      std::vector<T> split = download(dev, q), kk = download(dev, k), v2 = download(dev, vv);
      split.insert(split.end(), kk.begin(), kk.end());
      split.insert(split.end(), v2.begin(), v2.end());
      const bool inputs_kept = same_bits(download(dev, dq), vdq) && same_bits(download(dev, dk), vdk);
      return std::tuple{split, download(dev, dqkv), inputs_kept};
    };
    auto unfused = [&] {
      upload(dev, vqkv, qkv); upload(dev, vdq, dq); upload(dev, vdk, dk); upload(dev, vdv, dv);
      dev.qkv_split(qkv.data(), s * b, groups, hpg, d, q.data(), k.data(), vv.data());
      dev.rope_forward(q.data(), s, b * heads, d, 500000.0, 3, v.options);
      dev.rope_forward(k.data(), s, b * groups, d, 500000.0, 3, v.options);
      dev.rope_backward(dq.data(), s, b * heads, d, 500000.0, 3, v.options);
      dev.rope_backward(dk.data(), s, b * groups, d, 500000.0, 3, v.options);
      dev.qkv_merge(dq.data(), dk.data(), dv.data(), s * b, groups, hpg, d, dqkv.data());
      std::vector<T> split = download(dev, q), kk = download(dev, k), v2 = download(dev, vv);
      split.insert(split.end(), kk.begin(), kk.end());
      split.insert(split.end(), v2.begin(), v2.end());
      return std::pair{split, download(dev, dqkv)};
    };
    // the merge writing FP8 codes (E5M2, as an output gradient) against the merge into T then fp8_cast
    bool codes_same = false;
    {
      device_vector<std::uint8_t> codes(np), codes_ref(np);
      device_vector<float> scale(1), amax(2);
      const float sc = 3.0f, zero[2] = {0.0f, 0.0f};
      dev.copy_from_host(&sc, 1, scale.data());
      dev.copy_from_host(zero, 2, amax.data());
      upload(dev, vdq, dq); upload(dev, vdk, dk); upload(dev, vdv, dv);
      dev.qkv_merge_rope(dq.data(), dk.data(), dv.data(), s, b, groups, hpg, d, dqkv.data(), 500000.0, 3, v.options);
      dev.fp8_cast<T>(dqkv.data(), static_cast<index_t>(np), strata::Fp8Format::e5m2, scale.data(), codes_ref.data(), amax.data());
      dev.qkv_merge_rope_fp8(dq.data(), dk.data(), dv.data(), s, b, groups, hpg, d, 500000.0, 3, v.options,
                             strata::Fp8Output{strata::Fp8Format::e5m2, scale.data(), codes.data(), amax.data() + 1});
      float a[2];
      dev.copy_to_host(amax.data(), 2, a);
      codes_same = same_bits(download(dev, codes), download(dev, codes_ref)) && std::memcmp(&a[0], &a[1], sizeof(float)) == 0 &&
                   a[0] > 0.0f;
    }
    const auto [f1, m1, kept] = fused();
    const auto [f2, m2, kept2] = fused();
    const auto [u, um] = unfused();
    std::vector<T> reference = rq;
    reference.insert(reference.end(), rk.begin(), rk.end());
    reference.insert(reference.end(), rv.begin(), rv.end());
    const std::string dims = type_name<T>() + " s=" + std::to_string(s) + " b=" + std::to_string(b) + " groups=" +
                             std::to_string(groups) + " hpg=" + std::to_string(hpg) + " d=" + std::to_string(d) + " " + v.name;
    compare(results, "qkv_split_rope<" + dims + "> q k v", f1, f2, reference, tol);
    compare(results, "qkv_merge_rope<" + dims + "> dqkv", m1, m2, rd, tol);
    results.record(same_bits(f1, u) && same_bits(m1, um),
                   "qkv_split_rope / qkv_merge_rope<" + dims + ">: the bits of qkv_split + rope_forward, rope_backward + qkv_merge");
    results.record(kept && kept2, "qkv_merge_rope<" + dims + ">: dq and dk unchanged");
    results.record(codes_same, "qkv_merge_rope_fp8<" + dims + ">: codes and amax == qkv_merge_rope then fp8_cast");
  }
}

// Norms with weight offset 1 (the stored weight is gamma - 1, near zero).
template <class T>
void test_norm_offset(backend& dev, suite& results, host_rng& rng, index_t rows, index_t cols) {
  using A = accumulate_t<T>;
  const double tol = tolerance<T>();
  const auto R = static_cast<std::size_t>(rows), C = static_cast<std::size_t>(cols), N = R * C;
  const A eps = A(1e-5), offset = A(1);
  const std::string dims = type_name<T>() + " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + " offset=1";
  auto vx = rng.template uniform<T>(N, -2, 3), vw = rng.template uniform<T>(C, -0.1, 0.1), vb = rng.template uniform<T>(C),
       vdy = rng.template uniform<T>(N);
  {
    std::vector<T> ry(N), rdx(N);
    std::vector<A> rmean(R), rrstd(R), rdg(C), rdb(C);
    twin::layernorm_forward<T>(vx.data(), vw.data(), vb.data(), rows, cols, eps, ry.data(), rmean.data(), rrstd.data(),
                               nullptr, nullptr, offset);
    twin::layernorm_backward<T>(vdy.data(), vx.data(), vw.data(), rmean.data(), rrstd.data(), rows, cols, rdx.data(),
                                rdg.data(), rdb.data(), nullptr, false, static_cast<A*>(nullptr), offset);
    device_vector<T> x(N), w(C), b(C), dy(N), y(N), dx(N);
    device_vector<A> mean(R), rstd(R), dg(C), db(C);
    auto run = [&] {
      upload(dev, vx, x); upload(dev, vw, w); upload(dev, vb, b); upload(dev, vdy, dy);
      nan_fill(dev, y); nan_fill(dev, dx); nan_fill(dev, mean); nan_fill(dev, rstd); nan_fill(dev, dg); nan_fill(dev, db);
      dev.template layernorm_forward<T>(x.data(), w.data(), b.data(), rows, cols, eps, y.data(), mean.data(), rstd.data(), nullptr,
                            nullptr, offset);
      dev.template layernorm_backward<T>(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), rows, cols, dx.data(), dg.data(),
                             db.data(), nullptr, false, static_cast<A*>(nullptr), offset);
      return std::tuple{download(dev, y), download(dev, dx), download(dev, dg), download(dev, db)};
    };
    auto r1 = run(), r2 = run();
    compare(results, "layernorm_forward<" + dims + "> y", std::get<0>(r1), std::get<0>(r2), ry, tol);
    compare(results, "layernorm_backward<" + dims + "> dx", std::get<1>(r1), std::get<1>(r2), rdx, tol);
    compare(results, "layernorm_backward<" + dims + "> dg", std::get<2>(r1), std::get<2>(r2), rdg, tol);
    compare(results, "layernorm_backward<" + dims + "> db", std::get<3>(r1), std::get<3>(r2), rdb, tol);
  }
  {
    std::vector<T> ry(N), rdx(N);
    std::vector<A> rrstd(R), rdg(C);
    twin::rmsnorm_forward<T>(vx.data(), vw.data(), rows, cols, eps, ry.data(), rrstd.data(), nullptr, nullptr, offset);
    twin::rmsnorm_backward<T>(vdy.data(), vx.data(), vw.data(), rrstd.data(), rows, cols, rdx.data(), rdg.data(), nullptr,
                              false, offset);
    device_vector<T> x(N), w(C), dy(N), y(N), dx(N);
    device_vector<A> rstd(R), dg(C);
    auto run = [&] {
      upload(dev, vx, x); upload(dev, vw, w); upload(dev, vdy, dy);
      nan_fill(dev, y); nan_fill(dev, dx); nan_fill(dev, rstd); nan_fill(dev, dg);
      dev.template rmsnorm_forward<T>(x.data(), w.data(), rows, cols, eps, y.data(), rstd.data(), nullptr, nullptr, offset);
      dev.template rmsnorm_backward<T>(dy.data(), x.data(), w.data(), rstd.data(), rows, cols, dx.data(), dg.data(), nullptr, false, offset);
      return std::tuple{download(dev, y), download(dev, dx), download(dev, dg)};
    };
    auto r1 = run(), r2 = run();
    compare(results, "rmsnorm_forward<" + dims + "> y", std::get<0>(r1), std::get<0>(r2), ry, tol);
    compare(results, "rmsnorm_backward<" + dims + "> dx", std::get<1>(r1), std::get<1>(r2), rdx, tol);
    compare(results, "rmsnorm_backward<" + dims + "> dg", std::get<2>(r1), std::get<2>(r2), rdg, tol);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quiet = false;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--quiet") == 0) quiet = true;
  try {
    backend device(0);
    suite results("architecture kernels", !quiet);
    host_rng rng(0xa5c4);
    for (const auto& [rows, f] : std::vector<std::pair<index_t, index_t>>{{1, 7}, {33, 65}, {1000, 769}}) {
      test_activations<float>(device, results, rng, rows, f);
      test_activations<double>(device, results, rng, rows, f);
      test_activations<strata::bf16>(device, results, rng, rows, f);
    }
    // n = 50 heads of 128: a position's pairs outnumber a block's threads
    for (const auto& [s, n, d] : std::vector<std::tuple<index_t, index_t, index_t>>{{5, 3, 12}, {129, 3, 64}, {300, 3, 128}, {40, 50, 128}}) {
      test_rope<float>(device, results, rng, s, n, d);
      test_rope<double>(device, results, rng, s, n, d);
      test_rope<strata::bf16>(device, results, rng, s, n, d);
    }
    // groups x (hpg + 2) heads a row: MHA (hpg 1), GQA, one group; d = 12 takes the element path
    for (const auto& [s, b, groups, hpg, d] : std::vector<std::tuple<index_t, index_t, index_t, index_t, index_t>>{
             {5, 2, 3, 1, 12}, {129, 2, 8, 3, 128}, {64, 3, 1, 4, 64}, {33, 1, 2, 25, 128}}) {
      test_qkv_rope<float>(device, results, rng, s, b, groups, hpg, d);
      test_qkv_rope<double>(device, results, rng, s, b, groups, hpg, d);
      test_qkv_rope<strata::bf16>(device, results, rng, s, b, groups, hpg, d);
    }
    // 64 and 128 (qk norms over a head) take the warp path, 7 and 2048 the block path.
    for (const auto& [rows, cols] : std::vector<std::pair<index_t, index_t>>{{3, 7}, {1001, 64}, {257, 128}, {5, 2048}}) {
      test_norm_offset<float>(device, results, rng, rows, cols);
      test_norm_offset<double>(device, results, rng, rows, cols);
      test_norm_offset<strata::bf16>(device, results, rng, rows, cols);
    }
    return results.finish();
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    return 1;
  }
}
