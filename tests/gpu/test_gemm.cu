// tests/gpu/gemm_test.cu: cuda::backend::gemm (cuBLASLt) against a double-precision host product.
//
// Every transpose combination, float / double / bf16, odd shapes (1, 3, 5, 7, 33, 127, 769, ...),
// with and without the bias epilogue (also a misaligned bias, which falls back to the bias_add
// kernel), accumulate into an existing C, gemm_add (a separate addend as cuBLASLt's C), and the weight-gradient form: bf16 operands accumulated
// into an fp32 C (beta = 1). Relative error ||gpu - ref|| / ||ref|| within 1e-12 / 1e-5 / 1e-2;
// each product runs twice and gives the same bits; a repeated shape reuses its cached plan.
// Tuned GEMMs (blas_handle::tune): a backend timing the candidates into a new file agrees with the
// untuned one within the tolerance, and a second backend reading the file times nothing and gives
// the first one's bits. GEMMs planned for fewer SMs (the margin left to communication) agree with
// the rest.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "check.hpp"

using namespace gpu_test;
using strata::cuda::backend;

namespace {

// C[m,n] (= or +=) op(A) op(B) (+ bias), summed in double, rounded once to C.
template <class T, class C>
std::vector<C> reference(bool ta, bool tb, index_t m, index_t n, index_t k, const std::vector<T>& a,
                         const std::vector<T>& b, const std::vector<C>& c0, bool accumulate, const T* bias) {
  // Rows of op(A) and columns of op(B), contiguous in double: each output is one dot product.
  std::vector<double> rows_a(static_cast<std::size_t>(m * k)), cols_b(static_cast<std::size_t>(n * k));
  for (index_t i = 0; i < m; ++i)
    for (index_t p = 0; p < k; ++p) rows_a[i * k + p] = as_double(ta ? a[p * m + i] : a[i * k + p]);  // A [m,k] or [k,m]
  for (index_t j = 0; j < n; ++j)
    for (index_t p = 0; p < k; ++p) cols_b[j * k + p] = as_double(tb ? b[j * k + p] : b[p * n + j]);  // B [k,n] or [n,k]
  std::vector<C> out(static_cast<std::size_t>(m * n));
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double sum = 0;
      for (index_t p = 0; p < k; ++p) sum += rows_a[i * k + p] * cols_b[j * k + p];
      if (accumulate) sum += as_double(c0[i * n + j]);
      if (bias) sum += as_double(bias[j]);
      if constexpr (std::is_same_v<C, double>) out[i * n + j] = sum;
      else out[i * n + j] = C(static_cast<float>(sum));
    }
  return out;
}

template <class T, class C = T>
void check_gemm(backend& device, suite& results, std::uint64_t seed, bool ta, bool tb, index_t m, index_t n, index_t k,
                bool accumulate, bool with_bias, index_t bias_offset = 0) {
  host_rng rng(seed);
  const auto M = static_cast<std::size_t>(m), N = static_cast<std::size_t>(n), K = static_cast<std::size_t>(k);
  auto va = rng.template uniform<T>(M * K), vb = rng.template uniform<T>(K * N);
  auto vc = rng.template uniform<C>(M * N);
  auto vbias = rng.template uniform<T>(N + 1);
  const T* host_bias = with_bias ? vbias.data() + bias_offset : nullptr;
  auto ref = reference<T, C>(ta, tb, m, n, k, va, vb, vc, accumulate, host_bias);
  device_vector<T> a(M * K), b(K * N), bias(N + 1);
  device_vector<C> c(M * N);
  device.copy_from_host(va.data(), static_cast<index_t>(va.size()), a.data());
  device.copy_from_host(vb.data(), static_cast<index_t>(vb.size()), b.data());
  device.copy_from_host(vbias.data(), static_cast<index_t>(vbias.size()), bias.data());
  auto run = [&] {
    if (accumulate) device.copy_from_host(vc.data(), static_cast<index_t>(vc.size()), c.data());
    else device.fill(c.data(), static_cast<index_t>(M * N), std::numeric_limits<double>::quiet_NaN());
    device.gemm<T, C>(ta, tb, m, n, k, a.data(), b.data(), c.data(), accumulate, with_bias ? bias.data() + bias_offset : nullptr);
    std::vector<C> out(M * N);
    device.copy_to_host(c.data(), static_cast<index_t>(out.size()), out.data());
    return out;
  };
  auto first = run();
  const std::size_t plans = device.blas().cached_plans();
  auto second = run();
  const bool plan_reused = device.blas().cached_plans() == plans;
  const double error = relative_error(first, ref), tol = tolerance<T>();
  const bool repeat = same_bits(first, second);
  const std::string label = "gemm<" + type_name<T>() + "," + type_name<C>() + "> ta=" + std::to_string(ta) +
                            " tb=" + std::to_string(tb) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                            " k=" + std::to_string(k) + (accumulate ? " accumulate" : "") +
                            (with_bias ? (bias_offset ? " bias(misaligned)" : " bias") : "");
  results.record(repeat && plan_reused && error <= tol,
                 label + ": rel " + format("%.2e", error) + " (tol " + format("%.0e", tol) + ")" +
                     (repeat ? ", same bits twice" : ", DIFFERENT bits on the second run") +
                     (plan_reused ? "" : ", the second call built a new plan"));
}

// gemm_add: out = addend + A B^T (+ bias) in one GEMM (cuBLASLt's C operand the addend, beta = 1),
// against the double reference (one rounding); the addend is left as it was, the same bits twice.
// addend_offset 1 starts the addend one element past an aligned address.
template <class T>
void check_gemm_add(backend& device, suite& results, std::uint64_t seed, index_t m, index_t n, index_t k, bool with_bias,
                    index_t addend_offset = 0) {
  host_rng rng(seed);
  const auto M = static_cast<std::size_t>(m), N = static_cast<std::size_t>(n), K = static_cast<std::size_t>(k);
  auto va = rng.template uniform<T>(M * K), vb = rng.template uniform<T>(N * K), vbias = rng.template uniform<T>(N);
  auto vaddend = rng.template uniform<T>(M * N + 1);
  const std::vector<T> addend_host(vaddend.begin() + addend_offset, vaddend.begin() + addend_offset + static_cast<std::ptrdiff_t>(M * N));
  auto ref = reference<T, T>(false, true, m, n, k, va, vb, addend_host, true, with_bias ? vbias.data() : nullptr);
  device_vector<T> a(M * K), b(N * K), bias(N), addend(M * N + 1), out(M * N);
  device.copy_from_host(va.data(), static_cast<index_t>(M * K), a.data());
  device.copy_from_host(vb.data(), static_cast<index_t>(N * K), b.data());
  device.copy_from_host(vbias.data(), static_cast<index_t>(N), bias.data());
  device.copy_from_host(vaddend.data(), static_cast<index_t>(M * N + 1), addend.data());
  auto run = [&] {
    device.fill(out.data(), static_cast<index_t>(M * N), std::numeric_limits<double>::quiet_NaN());
    device.gemm_add<T>(false, true, m, n, k, a.data(), b.data(), with_bias ? bias.data() : nullptr,
                       addend.data() + addend_offset, out.data());
    std::vector<T> h(M * N);
    device.copy_to_host(out.data(), static_cast<index_t>(h.size()), h.data());
    return h;
  };
  const auto first = run(), second = run();
  std::vector<T> addend_after(M * N + 1);
  device.copy_to_host(addend.data(), static_cast<index_t>(addend_after.size()), addend_after.data());
  const double error = relative_error(first, ref), tol = tolerance<T>();
  const bool repeat = same_bits(first, second), untouched = same_bits(addend_after, vaddend);
  results.record(repeat && untouched && error <= tol,
                 "gemm_add<" + type_name<T>() + "> m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" +
                     std::to_string(k) + (with_bias ? " bias" : "") + (addend_offset ? " addend(misaligned)" : "") +
                     ": rel " + format("%.2e", error) + " (tol " + format("%.0e", tol) + ")" +
                     (repeat ? ", same bits twice" : ", DIFFERENT bits on the second run") +
                     (untouched ? "" : ", the addend CHANGED"));
}

// gemm_gelu and gemm_gelu_backward (the fused cuBLASLt GELU epilogues where they run, the GEMM and the
// GELU kernel where not: n not a multiple of 8) against the double product followed by the GELU math
// in double: pre, gelu(pre), and (dY W) * gelu'(pre).
double gelu_ref(double v) { return 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }
double gelu_grad_ref(double v) {
  const double u = 0.7978845608028654 * (v + 0.044715 * v * v * v), t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * v * v);
}
template <class T>
void check_gemm_gelu(backend& device, suite& results, std::uint64_t seed, index_t m, index_t n, index_t k, bool with_bias) {
  host_rng rng(seed);
  const auto M = static_cast<std::size_t>(m), N = static_cast<std::size_t>(n), K = static_cast<std::size_t>(k);
  auto va = rng.template uniform<T>(M * K), vb = rng.template uniform<T>(N * K), vbias = rng.template uniform<T>(N);
  auto vpre_in = rng.template uniform<T>(M * N, -3, 3);
  // forward: pre = A B^T (+ bias), out = gelu(pre)   (A [m,k], B [n,k]: the layers' x W^T)
  std::vector<double> ref_pre(M * N), ref_out(M * N);
  {
    // the product in double, then the GELU in double
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) {
        double sum = with_bias ? as_double(vbias[j]) : 0.0;
        for (index_t p = 0; p < k; ++p) sum += as_double(va[i * k + p]) * as_double(vb[j * k + p]);
        ref_pre[i * n + j] = sum;
        ref_out[i * n + j] = gelu_ref(sum);
      }
  }
  device_vector<T> a(M * K), b(N * K), bias(N), pre(M * N), out(M * N), pre_in(M * N);
  device.copy_from_host(va.data(), static_cast<index_t>(M * K), a.data());
  device.copy_from_host(vb.data(), static_cast<index_t>(N * K), b.data());
  device.copy_from_host(vbias.data(), static_cast<index_t>(N), bias.data());
  device.copy_from_host(vpre_in.data(), static_cast<index_t>(M * N), pre_in.data());
  auto download = [&](const device_vector<T>& d) {
    std::vector<T> h(d.size());
    device.copy_to_host(d.data(), static_cast<index_t>(h.size()), h.data());
    std::vector<double> out_d(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) out_d[i] = as_double(h[i]);
    return out_d;
  };
  auto forward = [&] {
    device.fill(pre.data(), static_cast<index_t>(M * N), std::numeric_limits<double>::quiet_NaN());
    device.fill(out.data(), static_cast<index_t>(M * N), std::numeric_limits<double>::quiet_NaN());
    device.gemm_gelu<T>(false, true, m, n, k, a.data(), b.data(), with_bias ? bias.data() : nullptr, pre.data(), out.data());
    return std::pair{download(pre), download(out)};
  };
  auto f1 = forward(), f2 = forward();
  const double tol = tolerance<T>();
  const std::string label = "gemm_gelu<" + type_name<T>() + "> m=" + std::to_string(m) + " n=" + std::to_string(n) +
                            " k=" + std::to_string(k) + (with_bias ? " bias" : "");
  const double e_pre = relative_error(f1.first, ref_pre), e_out = relative_error(f1.second, ref_out);
  results.record(same_bits(f1.first, f2.first) && same_bits(f1.second, f2.second) && e_pre <= tol && e_out <= tol,
                 label + ": pre rel " + format("%.2e", e_pre) + ", gelu rel " + format("%.2e", e_out) + " (tol " +
                     format("%.0e", tol) + ")");
  // backward: out = (A B) * gelu'(pre_in) with A [m,k] and the same buffer read as B [k,n]
  std::vector<double> ref_dx(M * N);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double sum = 0;
      for (index_t p = 0; p < k; ++p) sum += as_double(va[i * k + p]) * as_double(vb[p * n + j]);
      ref_dx[i * n + j] = sum * gelu_grad_ref(as_double(vpre_in[i * n + j]));
    }
  auto backward = [&] {
    device.fill(out.data(), static_cast<index_t>(M * N), std::numeric_limits<double>::quiet_NaN());
    device.gemm_gelu_backward<T>(false, false, m, n, k, a.data(), b.data(), pre_in.data(), out.data());
    return download(out);
  };
  auto b1 = backward(), b2 = backward();
  const double e_dx = relative_error(b1, ref_dx);
  results.record(same_bits(b1, b2) && e_dx <= tol, "gemm_gelu_backward<" + type_name<T>() + "> m=" + std::to_string(m) +
                                                       " n=" + std::to_string(n) + " k=" + std::to_string(k) + ": rel " +
                                                       format("%.2e", e_dx) + " (tol " + format("%.0e", tol) + ")");
}

// The outputs of a fixed set of GEMMs (bf16 forward with bias, GELU and dGELU epilogues, an addend,
// a weight gradient accumulated into fp32, a float product), each as doubles, on `device`.
std::vector<std::vector<double>> tuning_workload(backend& device) {
  host_rng rng(4242);
  std::vector<std::vector<double>> outputs;
  const auto upload = [&](auto& dst, const auto& src) { device.copy_from_host(src.data(), static_cast<index_t>(src.size()), dst.data()); };
  const auto download = [&](const auto& src) {
    std::vector<std::remove_cvref_t<decltype(*src.data())>> h(src.size());
    device.copy_to_host(src.data(), static_cast<index_t>(h.size()), h.data());
    std::vector<double> d(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) d[i] = as_double(h[i]);
    outputs.push_back(std::move(d));
  };
  const index_t m = 512, n = 1024, k = 256;
  const auto vx = rng.uniform<bf16>(m * k), vw = rng.uniform<bf16>(n * k), vbias = rng.uniform<bf16>(n);
  const auto vdy = rng.uniform<bf16>(m * n), vres = rng.uniform<bf16>(m * k);
  const auto vg = rng.uniform<float>(n * k);
  device_vector<bf16> x(m * k), w(n * k), bias(n), dy(m * n), res(m * k), out(m * n), pre(m * n), dx(m * k);
  device_vector<float> g(n * k);
  upload(x, vx), upload(w, vw), upload(bias, vbias), upload(dy, vdy), upload(res, vres), upload(g, vg);
  device.gemm<bf16>(false, true, m, n, k, x.data(), w.data(), out.data(), false, bias.data());  // x W^T + b
  download(out);
  device.gemm_gelu<bf16>(false, true, m, n, k, x.data(), w.data(), bias.data(), pre.data(), out.data());  // fc1
  download(pre), download(out);
  device.gemm_gelu_backward<bf16>(false, false, m, n, k, dy.data(), w.data(), pre.data(), out.data());  // (dy W) gelu'(pre)
  download(out);
  device.gemm_add<bf16>(false, false, m, k, n, dy.data(), w.data(), nullptr, res.data(), dx.data());  // res + dy W
  download(dx);
  device.gemm<bf16, float>(true, false, n, k, m, dy.data(), x.data(), g.data(), true);  // g += dy^T x
  download(g);
  const auto va = rng.uniform<float>(127 * 769), vb = rng.uniform<float>(769 * 65);
  device_vector<float> a(127 * 769), b(769 * 65), c(127 * 65);
  upload(a, va), upload(b, vb);
  device.gemm<float>(false, false, 127, 65, 769, a.data(), b.data(), c.data(), false);
  download(c);
  return outputs;
}

void check_tuning(suite& results, backend& untuned) {
  const auto file = std::filesystem::temp_directory_path() / ("strata_gemm_tuning_" + std::to_string(::getpid()) + ".txt");
  std::filesystem::remove(file);
  const auto reference = tuning_workload(untuned);
  const auto run = [&](std::size_t& timed, std::size_t& read) {
    backend device(0);
    device.blas().tune(std::make_shared<strata::cuda::gemm_tuning>(file));
    auto outputs = tuning_workload(device);
    timed = device.blas().tuning()->timed(), read = device.blas().tuning()->read_from_file();
    return outputs;
  };
  std::size_t timed1 = 0, read1 = 0, timed2 = 0, read2 = 0;
  const auto first = run(timed1, read1), second = run(timed2, read2);
  double worst = 0;
  bool same = first.size() == second.size() && first.size() == reference.size();
  for (std::size_t i = 0; same && i < first.size(); ++i) {
    worst = std::max(worst, relative_error(first[i], reference[i]));
    same = same_bits(first[i], second[i]);
  }
  const bool counts = timed1 >= 6 && read1 == 0 && timed2 == 0 && read2 == timed1;
  results.record(same && counts && worst <= tolerance<bf16>(),
                 "tuned GEMMs: " + std::to_string(timed1) + " problems timed into the file, then " + std::to_string(read2) +
                     " read back (" + std::to_string(timed2) + " timed); rel " + format("%.2e", worst) +
                     " against the heuristic's choices" + (same ? ", the reading run gives the same bits" : ", DIFFERENT bits"));
  std::filesystem::remove(file);
}

// STRATA_CUBLASLT_WORKSPACE_KIB: 0 gives a backend without a cuBLASLt workspace whose GEMMs still
// agree with the default's; a value that is not a size is refused with the variable's name.
void check_workspace_variable(suite& results, backend& with_default) {
  with_default.install();  // a backend made and gone since (check_tuning's) left this thread without one
  const auto reference = tuning_workload(with_default);
  ::setenv("STRATA_CUBLASLT_WORKSPACE_KIB", "0", 1);
  std::size_t bytes = 1;
  std::vector<std::vector<double>> outputs;
  {
    backend device(0);
    bytes = device.blas().workspace_bytes();
    outputs = tuning_workload(device);
  }
  with_default.install();
  double worst = 0;
  for (std::size_t i = 0; i < outputs.size() && i < reference.size(); ++i)
    worst = std::max(worst, relative_error(outputs[i], reference[i]));
  results.record(bytes == 0 && outputs.size() == reference.size() && worst <= tolerance<bf16>(),
                 "STRATA_CUBLASLT_WORKSPACE_KIB=0: workspace " + std::to_string(bytes) + " bytes, GEMMs rel " +
                     format("%.2e", worst) + " against the 32 MiB workspace's");
  const std::string message = config_error_under("STRATA_CUBLASLT_WORKSPACE_KIB", "32MiB",
                                                  [] { return strata::cuda::blas_handle::default_workspace_bytes(); });
  results.record(message.find("STRATA_CUBLASLT_WORKSPACE_KIB") != std::string::npos && message.find("32MiB") != std::string::npos,
                 "STRATA_CUBLASLT_WORKSPACE_KIB=32MiB is refused: " + message);
  results.record(strata::cuda::blas_handle::default_workspace_bytes() == strata::cuda::blas_handle::kDefaultWorkspaceBytes,
                 "without the variable the workspace is 32 MiB");
}

// The SM margin for communication (backend::set_communication_sm_margin): GEMMs marked as beside a
// collective are planned for the SMs the margin leaves (a plan of their own per problem) and agree
// with the unmarked ones; unmarked GEMMs, and marked ones under a margin of 0, keep every SM; a
// margin outside [0, SMs) is refused with the device's SM count.
void check_sm_margin(suite& results, backend& device) {
  device.install();
  const auto reference = tuning_workload(device);
  const std::size_t plans = device.blas().cached_plans();
  const int sms = device.sm_count(), margin = 16;
  (void)device.set_communication_sm_margin(margin);
  const bool unmarked_full = device.blas().sm_target() == 0;
  const bool was = device.gemms_beside_communication(true);
  const int target = device.blas().sm_target();
  const auto marked = tuning_workload(device);
  const std::size_t marked_plans = device.blas().cached_plans() - plans;
  (void)device.gemms_beside_communication(was);
  const int after = device.blas().sm_target();
  (void)device.set_communication_sm_margin(0);
  (void)device.gemms_beside_communication(true);
  const int no_margin = device.blas().sm_target();
  (void)device.gemms_beside_communication(false);
  double worst = 0;
  for (std::size_t i = 0; i < marked.size() && i < reference.size(); ++i)
    worst = std::max(worst, relative_error(marked[i], reference[i]));
  results.record(unmarked_full && target == sms - margin && after == 0 && no_margin == 0 && marked_plans >= 5 &&
                     marked.size() == reference.size() && worst <= tolerance<bf16>(),
                 "SM margin " + std::to_string(margin) + " of " + std::to_string(sms) + ": GEMMs beside communication target " +
                     std::to_string(target) + " SMs in " + std::to_string(marked_plans) + " plans of their own, rel " +
                     format("%.2e", worst) + " against every SM's; unmarked and margin-0 GEMMs target all (" +
                     std::to_string(after) + ", " + std::to_string(no_margin) + ")");
  for (const int bad : {-1, sms}) {
    std::string message;
    try {
      (void)device.set_communication_sm_margin(bad);
    } catch (const strata::ConfigError& e) {
      message = e.what();
    }
    results.record(message.find(std::to_string(sms) + " SMs") != std::string::npos &&
                       message.find("got " + std::to_string(bad)) != std::string::npos,
                   "SM margin " + std::to_string(bad) + " is refused: " + message);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool small = argc > 1 && std::strcmp(argv[1], "--small") == 0;
  try {
    backend device(0);
    suite results(small ? "gemm (small)" : "gemm");
    std::uint64_t seed = 100;
    const std::vector<std::tuple<index_t, index_t, index_t>> shapes =
        small ? std::vector<std::tuple<index_t, index_t, index_t>>{{1, 1, 1}, {3, 7, 5}, {33, 17, 65}}
              : std::vector<std::tuple<index_t, index_t, index_t>>{{1, 1, 1}, {3, 7, 5}, {127, 65, 769}, {1000, 769, 127}};
    for (const auto& [m, n, k] : shapes)
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        for (int variant = 0; variant < 3; ++variant) {  // plain, bias, accumulate
          const bool bias = variant == 1, accumulate = variant == 2;
          check_gemm<float>(device, results, seed++, ta, tb, m, n, k, accumulate, bias);
          check_gemm<double>(device, results, seed++, ta, tb, m, n, k, accumulate, bias);
          check_gemm<bf16>(device, results, seed++, ta, tb, m, n, k, accumulate, bias);
        }
        check_gemm<bf16, float>(device, results, seed++, ta, tb, m, n, k, true, false);   // weight gradient
        check_gemm<bf16, float>(device, results, seed++, ta, tb, m, n, k, false, false);
      }
    check_gemm<float>(device, results, seed++, false, true, 127, 65, 33, false, true, 1);  // bias not 16-byte aligned
    check_gemm<bf16>(device, results, seed++, false, true, 127, 65, 33, false, true, 1);
    check_gemm<float>(device, results, seed++, false, false, 5, 7, 0, false, false);      // k = 0: C = 0
    for (const auto& [m, n, k] : std::vector<std::tuple<index_t, index_t, index_t>>{{1, 1, 1}, {127, 64, 769}, {1000, 768, 128}, {33, 77, 65}, {5, 7, 0}})
      for (bool bias : {false, true}) {
        check_gemm_add<bf16>(device, results, seed++, m, n, k, bias);
        check_gemm_add<float>(device, results, seed++, m, n, k, bias);
        check_gemm_add<double>(device, results, seed++, m, n, k, bias);
      }
    check_gemm_add<bf16>(device, results, seed++, 127, 64, 33, true, 1);
    for (const auto& [m, n, k] : std::vector<std::tuple<index_t, index_t, index_t>>{{64, 96, 48}, {129, 768, 200}, {33, 77, 65}})
      for (bool bias : {false, true}) {  // n = 77: not a multiple of 8, the unfused path
        check_gemm_gelu<bf16>(device, results, seed++, m, n, k, bias);
        check_gemm_gelu<float>(device, results, seed++, m, n, k, bias);
      }
    check_tuning(results, device);
    check_workspace_variable(results, device);
    check_sm_margin(results, device);
    return results.finish();
  } catch (const std::exception& e) {
    std::printf("FAIL gemm: exception: %s\nSUITE gemm: aborted\n", e.what());
    return 2;
  }
}
