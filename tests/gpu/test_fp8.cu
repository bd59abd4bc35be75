// tests/gpu/test_fp8.cu: the FP8 kernels (kernels/fp8.cuh, fp8_gemm.hpp) against their CPU twins
// (backend/cpu/fp8.hpp).
//
//   conversion   the hardware's cvt.rn.satfinite (__nv_cvt_float_to_fp8, __NV_SATFINITE) against
//                core/fp8.hpp's fp8_encode on every one of the 2^32 float bit patterns, both formats
//   fp8_amax, fp8_cast, fp8_cast_transpose (both layouts, or the transposed one alone), fp8_update_scale,
//                fp8_transpose (bytes, against the host's transpose)
//   fp8_cast_transpose_fused (copy, GELU and GELU-backward producers, with column sums and without) against the
//                unfused steps on the GPU: codes and amax bit for bit, sums within 1e-4 (1e-12 double)
//                bit for bit against the CPU twin (float, bf16, double inputs; odd and large sizes;
//                a NaN input), run twice with the same bits
//   layernorm_forward_fp8, rmsnorm_forward_fp8 (the norms writing FP8 codes) against the norm then
//                fp8_cast on the GPU: codes, amax, statistics and residual sums bit for bit
//   fp8_gemm     every transpose combination (TN also with a bias, in cuBLASLt's epilogue; and
//                fp8_gemm_gelu / fp8_gemm_gelu_backward, the GELU epilogues, fp8_gemm_add (the residual in the
//                epilogue), against the CPU backend's), E4M3 x E4M3, E5M2 x E4M3, E4M3 x E5M2, bf16 and float
//                outputs (float accumulated into an existing C): against the CPU twin within
//                1e-5 (float) / 1e-2 (bf16) relative (the accumulation bound: the products are exact,
//                the sums differ in order), planned without cuBLASLt's workspace (the default) and
//                with one (STRATA_CUBLASLT_FP8_WORKSPACE_KIB); E5M2 x E5M2 refused
//   blockwise    fp8_cast_blocks (runs along rows, runs along columns into x^T) and fp8_cast_tiles
//                (both layouts, both scale grids) bit for bit against the CPU twin (blocks of 128 and
//                of 32, partial blocks, an all-zero block, a NaN); fp8_gemm_blocks (runs x tiles,
//                tiles x runs, runs x runs; bf16 and float outputs, float accumulated) against the
//                CPU twin within the bf16 bound (the decoded operands are exact, the sums differ).
//                (blocks of 128 with k whole blocks run through cuBLASLt's block-scaled GEMM, whose
//                accumulation bound for float outputs is 5e-4 as for the per-tensor GEMM).
//                cuBLASLt's block-scaled GEMM called directly with strata's scale layouts, runs x tiles
//                and runs x runs, against the CPU twin (a check); the transposed layouts beside them
//                are printed as a probe
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <strata/backend/cpu/backend.hpp>
#include <strata/backend/cpu/fp8.hpp>

#include "check.hpp"

using namespace gpu_test;
using strata::Fp8Format;
using strata::cuda::backend;

namespace {

__global__ void conversion_mismatches(Fp8Format format, std::uint64_t begin, std::uint64_t count, unsigned long long* mismatches,
                                      unsigned* first_bits) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < count; i += std::uint64_t(gridDim.x) * blockDim.x) {
    const auto bits = static_cast<unsigned>(begin + i);
    const float v = __uint_as_float(bits);
    const auto hardware = static_cast<std::uint8_t>(
        __nv_cvt_float_to_fp8(v, __NV_SATFINITE, format == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2));
    const std::uint8_t software = strata::fp8_encode(v, format);
    // NaN: any NaN code is a NaN (the hardware's sign of a NaN result is not part of the contract)
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    const bool same = nan ? (strata::detail::fp8_to_float(hardware, format) != strata::detail::fp8_to_float(hardware, format))
                          : hardware == software;
    if (!same) {
      if (atomicAdd(mismatches, 1ull) == 0) *first_bits = bits;
    }
  }
}

void check_conversion(suite& results, Fp8Format fp8_format) {
  device_vector<unsigned long long> mismatches(1);
  device_vector<unsigned> first(1);
  cudaMemset(mismatches.data(), 0, sizeof(unsigned long long));
  const std::uint64_t total = std::uint64_t(1) << 32;
  conversion_mismatches<<<4096, 256>>>(fp8_format, 0, total, mismatches.data(), first.data());
  STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  unsigned long long count = 0;
  unsigned bits = 0;
  cudaMemcpy(&count, mismatches.data(), sizeof count, cudaMemcpyDeviceToHost);
  cudaMemcpy(&bits, first.data(), sizeof bits, cudaMemcpyDeviceToHost);
  std::string line = "conversion " + std::string(strata::fp8_format_name(fp8_format)) +
                     ": cvt.rn.satfinite == fp8_encode on all 2^32 floats, mismatches " + std::to_string(count);
  if (count) {
    char first_text[32];
    std::snprintf(first_text, sizeof first_text, " (first bits 0x%08x)", bits);
    line += first_text;
  }
  results.record(count == 0, line);
}

template <class T>
std::vector<T> inputs(std::size_t n, std::uint64_t seed, double spread) {
  host_rng rng(seed);
  auto v = rng.template uniform<T>(n, -spread, spread);
  return v;
}

template <class T>
void check_casts(backend& device, suite& results, std::uint64_t seed, index_t rows, index_t cols, Fp8Format format, float scale,
                 bool with_nan) {
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  auto x = inputs<T>(n, seed, 3.0);
  if (with_nan && n > 2) x[n / 2] = T(std::numeric_limits<float>::quiet_NaN());
  // CPU twins
  std::vector<std::uint8_t> q_cpu(n), qt_cpu(n), q2_cpu(n);
  float amax_cpu = 0.25f, amax_cast_cpu = 0.0f, amax_ct_cpu = 0.0f;
  strata::cpu::fp8_amax<T>(x.data(), static_cast<index_t>(n), &amax_cpu);
  strata::cpu::fp8_cast<T>(x.data(), static_cast<index_t>(n), format, &scale, q_cpu.data(), &amax_cast_cpu);
  strata::cpu::fp8_cast_transpose<T>(x.data(), rows, cols, format, &scale, q2_cpu.data(), qt_cpu.data(), &amax_ct_cpu);
  // GPU
  device_vector<T> dx(n);
  device_vector<std::uint8_t> dq(n), dq2(n), dqt(n);
  device_vector<float> dscale(1), damax(3);
  device.copy_from_host(x.data(), static_cast<index_t>(n), dx.data());
  device.copy_from_host(&scale, 1, dscale.data());
  const float start[3] = {0.25f, 0.0f, 0.0f};
  std::vector<std::uint8_t> q(n), q2(n), qt(n), q_again(n), qt_alone(n);
  float amax[3];
  for (int run = 0; run < 2; ++run) {
    device.copy_from_host(start, 3, damax.data());
    device.fp8_amax<T>(dx.data(), static_cast<index_t>(n), damax.data());
    device.fp8_cast<T>(dx.data(), static_cast<index_t>(n), format, dscale.data(), dq.data(), damax.data() + 1);
    device.fp8_cast_transpose<T>(dx.data(), rows, cols, format, dscale.data(), dq2.data(), dqt.data(), damax.data() + 2);
    device.copy_to_host(dq.data(), static_cast<index_t>(n), run == 0 ? q.data() : q_again.data());
    device.copy_to_host(dq2.data(), static_cast<index_t>(n), q2.data());
    device.copy_to_host(dqt.data(), static_cast<index_t>(n), qt.data());
    device.copy_to_host(damax.data(), 3, amax);
  }
  device.fp8_cast_transpose<T>(dx.data(), rows, cols, format, dscale.data(), nullptr, dqt.data(), nullptr);  // qt alone
  device.copy_to_host(dqt.data(), static_cast<index_t>(n), qt_alone.data());
  // Input and codes one element past an aligned start: the kernels' element-by-element paths.
  std::vector<std::uint8_t> q_off(n), q2_off(n), qt_off(n);
  {
    device_vector<T> dx1(n + 1);
    device_vector<std::uint8_t> dq1(n + 1), dq21(n + 1), dqt1(n + 1);
    device.copy_from_host(x.data(), static_cast<index_t>(n), dx1.data() + 1);
    device.fp8_cast<T>(dx1.data() + 1, static_cast<index_t>(n), format, dscale.data(), dq1.data() + 1, nullptr);
    device.fp8_cast_transpose<T>(dx1.data() + 1, rows, cols, format, dscale.data(), dq21.data() + 1, dqt1.data() + 1, nullptr);
    device.copy_to_host(dq1.data() + 1, static_cast<index_t>(n), q_off.data());
    device.copy_to_host(dq21.data() + 1, static_cast<index_t>(n), q2_off.data());
    device.copy_to_host(dqt1.data() + 1, static_cast<index_t>(n), qt_off.data());
  }
  const auto same_float = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; };
  const std::string what = type_name<T>() + " " + std::to_string(rows) + "x" + std::to_string(cols) + " " +
                           std::string(strata::fp8_format_name(format)) + (with_nan ? " with NaN" : "");
  results.record(same_float(amax[0], amax_cpu), "fp8_amax " + what + " == cpu twin");
  results.record(same_bits(q, q_cpu) && same_float(amax[1], amax_cast_cpu), "fp8_cast " + what + " codes and amax == cpu twin");
  results.record(same_bits(q, q_again), "fp8_cast " + what + " same bits twice");
  results.record(same_bits(q2, q2_cpu) && same_bits(qt, qt_cpu) && same_float(amax[2], amax_ct_cpu),
                 "fp8_cast_transpose " + what + " both layouts and amax == cpu twin");
  results.record(same_bits(qt_alone, qt_cpu), "fp8_cast_transpose " + what + " transposed codes alone == cpu twin");
  results.record(same_bits(q_off, q_cpu) && same_bits(q2_off, q2_cpu) && same_bits(qt_off, qt_cpu),
                 "fp8_cast, fp8_cast_transpose " + what + " from unaligned pointers == cpu twin");
}

// fp8_cast_transpose_fused against the GPU's own unfused steps (gelu_forward / gelu_backward, then
// fp8_cast_transpose, and bias_grad for the column sums): codes in both layouts and amax bit for bit,
// the column sums within the accumulation bound; aligned (16-byte loads) and one element past
// (element by element), whole and edge tiles.
template <class T>
void check_fused_casts(backend& device, suite& results, std::uint64_t seed, index_t rows, index_t cols, strata::Fp8Producer p,
                       index_t offset) {
  using A = strata::accumulate_t<T>;
  const std::size_t n = static_cast<std::size_t>(rows * cols), at = static_cast<std::size_t>(offset);
  // x and pre hold 2n values (swiglu reads [gate | up] of 2 cols a row); the others read n
  const auto x = inputs<T>(2 * n, seed, 3.0), pre = inputs<T>(2 * n, seed + 1000, 3.0);
  const float scale = 40.0f;
  device_vector<T> dx(2 * n + at), dpre(2 * n + at), dv(n + at);
  device_vector<std::uint8_t> q(n + at), qt(n + at), q_ref(n), qt_ref(n);
  device_vector<float> dscale(1), amax(4);
  device_vector<A> sums(static_cast<std::size_t>(cols)), sums_ref(static_cast<std::size_t>(cols));
  device.copy_from_host(x.data(), static_cast<index_t>(2 * n), dx.data() + at);
  device.copy_from_host(pre.data(), static_cast<index_t>(2 * n), dpre.data() + at);
  device.copy_from_host(&scale, 1, dscale.data());
  const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  device.copy_from_host(zero, 4, amax.data());
  // the unfused steps
  const T* v = dx.data() + at;
  if (p == strata::Fp8Producer::gelu) device.gelu_forward<T>(dx.data() + at, static_cast<index_t>(n), dv.data() + at);
  if (p == strata::Fp8Producer::gelu_backward)
    device.gelu_backward<T>(dx.data() + at, dpre.data() + at, static_cast<index_t>(n), dv.data() + at);
  if (p == strata::Fp8Producer::swiglu) device.swiglu_forward<T>(dx.data() + at, rows, cols, dv.data() + at);
  if (p == strata::Fp8Producer::swiglu_backward)
    device.swiglu_backward<T>(dx.data() + at, dpre.data() + at, rows, cols / 2, dv.data() + at);
  if (p != strata::Fp8Producer::copy) v = dv.data() + at;
  const Fp8Format format = Fp8Format::e5m2;
  device.fp8_cast_transpose<T>(v, rows, cols, format, dscale.data(), q_ref.data(), qt_ref.data(), amax.data());
  device.fill<A>(sums_ref.data(), cols, 0.0);
  device.bias_grad<T>(v, rows, cols, sums_ref.data());
  // fused
  device.fp8_cast_transpose_fused<T>(p, dx.data() + at, dpre.data() + at, rows, cols, format, dscale.data(), q.data() + at,
                                     qt.data() + at, amax.data() + 1, sums.data());
  // fused without the column sums (the kernels' other instances), both layouts and the transposed alone
  device_vector<std::uint8_t> q2(n + at), qt2(n + at), qt3(n + at);
  device.fp8_cast_transpose_fused<T>(p, dx.data() + at, dpre.data() + at, rows, cols, format, dscale.data(), q2.data() + at,
                                     qt2.data() + at, amax.data() + 2, static_cast<A*>(nullptr));
  device.fp8_cast_transpose_fused<T>(p, dx.data() + at, dpre.data() + at, rows, cols, format, dscale.data(), nullptr,
                                     qt3.data() + at, amax.data() + 3, static_cast<A*>(nullptr));
  std::vector<std::uint8_t> hq(n), hqt(n), hq_ref(n), hqt_ref(n), hq2(n), hqt2(n), hqt3(n);
  std::vector<A> hs(static_cast<std::size_t>(cols)), hs_ref(static_cast<std::size_t>(cols));
  float ha[4];
  device.copy_to_host(q.data() + at, static_cast<index_t>(n), hq.data());
  device.copy_to_host(qt.data() + at, static_cast<index_t>(n), hqt.data());
  device.copy_to_host(q2.data() + at, static_cast<index_t>(n), hq2.data());
  device.copy_to_host(qt2.data() + at, static_cast<index_t>(n), hqt2.data());
  device.copy_to_host(qt3.data() + at, static_cast<index_t>(n), hqt3.data());
  device.copy_to_host(q_ref.data(), static_cast<index_t>(n), hq_ref.data());
  device.copy_to_host(qt_ref.data(), static_cast<index_t>(n), hqt_ref.data());
  device.copy_to_host(sums.data(), cols, hs.data());
  device.copy_to_host(sums_ref.data(), cols, hs_ref.data());
  device.copy_to_host(amax.data(), 4, ha);
  double worst = 0;
  for (std::size_t c = 0; c < hs.size(); ++c)
    worst = std::max(worst, std::abs(double(hs[c]) - double(hs_ref[c])) / (1.0 + std::abs(double(hs_ref[c]))));
  const double bound = std::is_same_v<A, double> ? 1e-12 : 1e-4;
  const char* names[] = {"copy", "gelu", "gelu_backward", "swiglu", "swiglu_backward"};
  const char* name = names[static_cast<int>(p)];
  const std::string what = type_name<T>() + " " + std::to_string(rows) + "x" + std::to_string(cols) + " " + name +
                           (offset ? " unaligned" : "");
  results.record(same_bits(hq, hq_ref) && same_bits(hqt, hqt_ref) && std::memcmp(&ha[0], &ha[1], sizeof(float)) == 0,
                 "fp8_cast_transpose_fused " + what + ": codes and amax == the unfused steps'");
  results.record(same_bits(hq2, hq_ref) && same_bits(hqt2, hqt_ref) && same_bits(hqt3, hqt_ref) &&
                     std::memcmp(&ha[0], &ha[2], sizeof(float)) == 0 && std::memcmp(&ha[0], &ha[3], sizeof(float)) == 0,
                 "fp8_cast_transpose_fused " + what +
                     " without column sums: codes (both layouts, transposed alone) and amax == the unfused steps'");
  results.record(worst <= bound, "fp8_cast_transpose_fused " + what + ": column sums within " + std::to_string(bound) +
                                     " of bias_grad's (worst " + std::to_string(worst) + ")");
  if (p == strata::Fp8Producer::gelu || p == strata::Fp8Producer::swiglu) {
    // the forward's codes alone (no x^T: Fp8Options::activation_codes_in_backward)
    device_vector<std::uint8_t> q4(n + at);
    device.fp8_cast_transpose_fused<T>(p, dx.data() + at, dpre.data() + at, rows, cols, format, dscale.data(), q4.data() + at,
                                       nullptr, static_cast<float*>(nullptr), static_cast<A*>(nullptr));
    std::vector<std::uint8_t> hq4(n);
    device.copy_to_host(q4.data() + at, static_cast<index_t>(n), hq4.data());
    results.record(same_bits(hq4, hq_ref), "fp8_cast_transpose_fused " + what + " without x^T: codes == the unfused steps'");
  }
  if (p == strata::Fp8Producer::gelu_backward || p == strata::Fp8Producer::swiglu_backward) {
    // the forward activation's codes^T beside the gradient's (gelu(pre) or SwiGLU of pre, e4m3 at its
    // own scale) against the GPU's own activation kernel then fp8_cast_transpose; the gradient's codes,
    // amax and sums unchanged by them
    const bool gelu = p == strata::Fp8Producer::gelu_backward;
    const index_t width = gelu ? cols : cols / 2;
    const std::size_t m = static_cast<std::size_t>(rows * width);
    const float act_scale = 7.0f;
    device_vector<float> dact_scale(1), amax5(2);
    device.copy_from_host(&act_scale, 1, dact_scale.data());
    device.copy_from_host(zero, 2, amax5.data());
    device_vector<T> act(m);
    if (gelu) device.gelu_forward<T>(dpre.data() + at, static_cast<index_t>(m), act.data());
    else device.swiglu_forward<T>(dpre.data() + at, rows, width, act.data());
    device_vector<std::uint8_t> act_ref(m), act_t(m + at), act_t2(m + at), q5(n + at), qt5(n + at);
    device.fp8_cast_transpose<T>(act.data(), rows, width, Fp8Format::e4m3, dact_scale.data(), nullptr, act_ref.data(), nullptr);
    device_vector<A> sums5(static_cast<std::size_t>(cols));
    device.fp8_cast_transpose_fused<T>(p, dx.data() + at, dpre.data() + at, rows, cols, format, dscale.data(), q5.data() + at,
                                       qt5.data() + at, amax5.data(), sums5.data(),
                                       strata::Fp8Output{Fp8Format::e4m3, dact_scale.data(), act_t.data() + at, nullptr});
    device.fp8_cast_transpose_fused<T>(p, dx.data() + at, dpre.data() + at, rows, cols, format, dscale.data(), nullptr,
                                       qt5.data() + at, amax5.data() + 1, static_cast<A*>(nullptr),
                                       strata::Fp8Output{Fp8Format::e4m3, dact_scale.data(), act_t2.data() + at, nullptr});
    std::vector<std::uint8_t> hact(m), hact2(m), hact_ref(m), hq5(n), hqt5(n);
    std::vector<A> hs5(static_cast<std::size_t>(cols));
    float ha5[2];
    device.copy_to_host(act_t.data() + at, static_cast<index_t>(m), hact.data());
    device.copy_to_host(act_t2.data() + at, static_cast<index_t>(m), hact2.data());
    device.copy_to_host(act_ref.data(), static_cast<index_t>(m), hact_ref.data());
    device.copy_to_host(q5.data() + at, static_cast<index_t>(n), hq5.data());
    device.copy_to_host(qt5.data() + at, static_cast<index_t>(n), hqt5.data());
    device.copy_to_host(sums5.data(), cols, hs5.data());
    device.copy_to_host(amax5.data(), 2, ha5);
    results.record(same_bits(hact, hact_ref) && same_bits(hact2, hact_ref),
                   "fp8_cast_transpose_fused " + what + " with the activation's codes: those codes == the activation "
                   "kernel then fp8_cast_transpose (with and without the column sums)");
    results.record(same_bits(hq5, hq_ref) && same_bits(hqt5, hqt_ref) && std::memcmp(&ha[0], &ha5[0], sizeof(float)) == 0 &&
                       std::memcmp(&ha[0], &ha5[1], sizeof(float)) == 0 && same_bits(hs5, hs),
                   "fp8_cast_transpose_fused " + what + " with the activation's codes: the gradient's codes, amax and "
                   "column sums as without them");
  }
}

// The norms writing FP8 codes (layernorm_forward_fp8 / rmsnorm_forward_fp8) against the GPU's own
// two steps (the norm into T, then fp8_cast): codes, amax, the statistics and the residual sum bit for
// bit; widths of the one-warp, warp-team and block-per-row kernels (1000 and 2050: rows that are not
// whole 16-byte vectors; 20480: wider than every team), with and without the residual and the
// zero-centred weight, aligned and one element past.
template <class T>
void check_norm_codes(backend& device, suite& results, std::uint64_t seed, bool layer, index_t rows, index_t h,
                      bool residual, bool offset1, index_t offset) {
  using A = strata::accumulate_t<T>;
  const std::size_t n = static_cast<std::size_t>(rows * h), at = static_cast<std::size_t>(offset);
  const auto x = inputs<T>(n, seed, 3.0), r = inputs<T>(n, seed + 1, 1.0), g = inputs<T>(static_cast<std::size_t>(h), seed + 2, 1.5),
             b = inputs<T>(static_cast<std::size_t>(h), seed + 3, 0.5);
  const float scale = 24.0f;
  const A eps = A(1e-5), weight_offset = offset1 ? A(1) : A(0);
  const Fp8Format format = Fp8Format::e4m3;
  device_vector<T> dx(n + at), dr(n + at), dg(h + at), db(h + at), dy(n), dsum(n + at), dsum2(n + at);
  device_vector<A> mean(rows), rstd(rows), mean2(rows), rstd2(rows);
  device_vector<std::uint8_t> codes(n + at), codes_ref(n);
  device_vector<float> dscale(1), amax(2);
  device.copy_from_host(x.data(), static_cast<index_t>(n), dx.data() + at);
  device.copy_from_host(r.data(), static_cast<index_t>(n), dr.data() + at);
  device.copy_from_host(g.data(), h, dg.data() + at);
  device.copy_from_host(b.data(), h, db.data() + at);
  device.copy_from_host(&scale, 1, dscale.data());
  const float zero[2] = {0.0f, 0.0f};
  device.copy_from_host(zero, 2, amax.data());
  const T* res = residual ? dr.data() + at : nullptr;
  // the two steps: the norm into y (the sum into dsum), then the cast of y
  if (layer)
    device.layernorm_forward<T>(dx.data() + at, dg.data() + at, db.data() + at, rows, h, eps, dy.data(), mean.data(), rstd.data(),
                                res, residual ? dsum.data() + at : nullptr, weight_offset);
  else
    device.rmsnorm_forward<T>(dx.data() + at, dg.data() + at, rows, h, eps, dy.data(), rstd.data(), res,
                              residual ? dsum.data() + at : nullptr, weight_offset);
  device.fp8_cast<T>(dy.data(), static_cast<index_t>(n), format, dscale.data(), codes_ref.data(), amax.data());
  // one pass
  const strata::Fp8Output out{format, dscale.data(), codes.data() + at, amax.data() + 1};
  if (layer)
    device.layernorm_forward_fp8<T>(dx.data() + at, dg.data() + at, db.data() + at, rows, h, eps, mean2.data(), rstd2.data(), res,
                                    residual ? dsum2.data() + at : nullptr, weight_offset, out);
  else
    device.rmsnorm_forward_fp8<T>(dx.data() + at, dg.data() + at, rows, h, eps, rstd2.data(), res,
                                  residual ? dsum2.data() + at : nullptr, weight_offset, out);
  std::vector<std::uint8_t> hc(n), hc_ref(n);
  std::vector<A> hm(rows), hm2(rows), hr(rows), hr2(rows);
  std::vector<T> hs(residual ? n : 0), hs2(residual ? n : 0);
  float ha[2];
  device.copy_to_host(codes.data() + at, static_cast<index_t>(n), hc.data());
  device.copy_to_host(codes_ref.data(), static_cast<index_t>(n), hc_ref.data());
  device.copy_to_host(rstd.data(), rows, hr.data());
  device.copy_to_host(rstd2.data(), rows, hr2.data());
  if (layer) {
    device.copy_to_host(mean.data(), rows, hm.data());
    device.copy_to_host(mean2.data(), rows, hm2.data());
  }
  if (residual) {
    device.copy_to_host(dsum.data() + at, static_cast<index_t>(n), hs.data());
    device.copy_to_host(dsum2.data() + at, static_cast<index_t>(n), hs2.data());
  }
  device.copy_to_host(amax.data(), 2, ha);
  const std::string what = std::string(layer ? "layernorm" : "rmsnorm") + "_forward_fp8 " + type_name<T>() + " " +
                           std::to_string(rows) + "x" + std::to_string(h) + (residual ? " with residual" : "") +
                           (offset1 ? " zero-centred" : "") + (offset ? " unaligned" : "");
  results.record(same_bits(hc, hc_ref) && std::memcmp(&ha[0], &ha[1], sizeof(float)) == 0 && ha[0] > 0.0f,
                 what + ": codes and amax == the norm's output cast by fp8_cast");
  results.record(same_bits(hr, hr2) && same_bits(hm, hm2) && same_bits(hs, hs2),
                 what + ": statistics (and the residual sum) == the norm's");
}

// fp8_transpose (the codes of x^T from x's codes, bytes moved as they are) against the transpose on
// the host, bit for bit: whole 64 x 64 tiles, partial tiles, sizes that are not multiples of 8, and
// pointers that are not 8-byte aligned (the byte-at-a-time path); the bytes past the output stay.
void check_transpose(backend& device, suite& results, std::uint64_t seed, index_t rows, index_t cols, index_t offset) {
  const std::size_t n = static_cast<std::size_t>(rows * cols), at = static_cast<std::size_t>(offset);
  host_rng rng(seed);
  const auto draws = rng.integers(n, 0, 255);
  std::vector<std::uint8_t> in(draws.begin(), draws.end()), want(n + 8, 0xa5), got(n + 8);
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) want[static_cast<std::size_t>(c * rows + r)] = in[static_cast<std::size_t>(r * cols + c)];
  device_vector<std::uint8_t> din(n + at), dout(n + at + 8);
  device.copy_from_host(in.data(), static_cast<index_t>(n), din.data() + at);
  const std::vector<std::uint8_t> fill(n + 8, 0xa5);
  device.copy_from_host(fill.data(), static_cast<index_t>(n + 8), dout.data() + at);
  device.fp8_transpose(din.data() + at, rows, cols, dout.data() + at);
  device.copy_to_host(dout.data() + at, static_cast<index_t>(n + 8), got.data());
  results.record(got == want, "fp8_transpose " + std::to_string(rows) + "x" + std::to_string(cols) + " at +" +
                                  std::to_string(offset) + (got == want ? " == the host's transpose" : " DIFFERENT from the host's transpose"));
}

void check_update(backend& device, suite& results) {
  const int L = 5;
  std::vector<float> row = {3.0f, 7.5f, 0.0f, 1.0f, 2.0f, 0.5f, 2.0f};
  for (auto algo : {strata::Fp8AmaxAlgo::max, strata::Fp8AmaxAlgo::most_recent})
    for (int margin : {0, 2}) {
      const strata::Fp8UpdateArgs args{L, algo, margin, true};
      std::vector<float> cpu = row, gpu(row.size());
      strata::cpu::fp8_update_scale(cpu.data(), 448.0f, args);
      device_vector<float> d(row.size());
      device.copy_from_host(row.data(), static_cast<index_t>(row.size()), d.data());
      device.fp8_update_scale(d.data(), 448.0f, args);
      device.copy_to_host(d.data(), static_cast<index_t>(gpu.size()), gpu.data());
      results.record(same_bits(cpu, gpu), std::string("fp8_update_scale ") + (algo == strata::Fp8AmaxAlgo::max ? "max" : "most_recent") +
                                              " margin " + std::to_string(margin) + " == cpu twin");
      // the three roles' rows of 97 states in one launch (rows [97, 3, L + 2], each role its own max,
      // each state's values its own), each new 1 / scale also in its aligned slot [97, 3, 4]
      const index_t states = 97;
      std::vector<float> rows;
      for (index_t i = 0; i < states; ++i)
        for (int r = 0; r < strata::kFp8Roles; ++r)
          for (float v : row) rows.push_back(v * float(r + 1) * (1.0f + 0.25f * float(i % 7)));
      const strata::Fp8RoleMaxes maxes{{448.0f, 448.0f, 57344.0f}};
      std::vector<float> rows_cpu = rows, rows_gpu(rows.size());
      std::vector<float> aligned_cpu(static_cast<std::size_t>(states * strata::kFp8Roles * 4), -1.0f), aligned_gpu(aligned_cpu.size());
      strata::cpu::fp8_update_scales(rows_cpu.data(), states, L + 2, maxes, args, aligned_cpu.data());
      device_vector<float> dr(rows.size()), da(aligned_cpu.size());
      device.copy_from_host(rows.data(), static_cast<index_t>(rows.size()), dr.data());
      device.copy_from_host(std::vector<float>(aligned_cpu.size(), -1.0f).data(), static_cast<index_t>(aligned_cpu.size()), da.data());
      device.fp8_update_scales(dr.data(), states, L + 2, maxes, args, da.data());
      device.copy_to_host(dr.data(), static_cast<index_t>(rows_gpu.size()), rows_gpu.data());
      device.copy_to_host(da.data(), static_cast<index_t>(aligned_gpu.size()), aligned_gpu.data());
      // the one-state update per state gives the same rows (the CPU twin, state by state)
      std::vector<float> one_by_one = rows;
      for (index_t i = 0; i < states; ++i)
        strata::cpu::fp8_update_scales(one_by_one.data() + i * strata::kFp8Roles * (L + 2), 1, L + 2, maxes, args, nullptr);
      bool slots = true;
      for (index_t j = 0; j < states * strata::kFp8Roles; ++j)
        slots = slots && std::memcmp(&aligned_gpu[4 * j], &rows_gpu[j * (L + 2) + L + 1], sizeof(float)) == 0 &&
                aligned_gpu[4 * j + 1] == -1.0f;
      const std::string label = std::string("fp8_update_scales (97 states x three roles) ") +
                                (algo == strata::Fp8AmaxAlgo::max ? "max" : "most_recent") + " margin " + std::to_string(margin);
      results.record(same_bits(rows_cpu, rows_gpu) && same_bits(aligned_cpu, aligned_gpu), label + " == cpu twin");
      results.record(same_bits(one_by_one, rows_cpu) && slots,
                     label + ": the rows of one state at a time; each slot holds its row's 1 / scale, the rest untouched");
    }
}

template <class C>
void check_gemm(backend& device, suite& results, std::uint64_t seed, bool ta, bool tb, index_t m, index_t n, index_t k,
                Fp8Format fa, Fp8Format fb, bool accumulate, bool with_bias = false,
                strata::Fp8Accumulation accumulation = strata::Fp8Accumulation::split) {
  const bool fast = accumulation == strata::Fp8Accumulation::fast;
  host_rng rng(seed);
  const auto M = static_cast<std::size_t>(m), N = static_cast<std::size_t>(n), K = static_cast<std::size_t>(k);
  auto va = rng.uniform<float>(M * K, -2, 2), vb = rng.uniform<float>(K * N, -2, 2);
  std::vector<std::uint8_t> a(M * K), b(K * N);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = strata::fp8_encode(va[i] * 100.0f, fa);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = strata::fp8_encode(vb[i] * 100.0f, fb);
  const float a_scale_inv = 0.013f, b_scale_inv = 0.007f;
  auto c0 = rng.uniform<C>(M * N);
  std::vector<C> want = c0;
  const std::vector<C> bias = rng.uniform<C>(N, -3, 3);
  const C* host_bias = with_bias ? bias.data() : nullptr;
  strata::cpu::fp8_gemm<C>(ta, tb, m, n, k, a.data(), fa, &a_scale_inv, b.data(), fb, &b_scale_inv, want.data(), accumulate,
                           host_bias);
  device_vector<std::uint8_t> da(a.size()), db(b.size());
  device_vector<float> scales(2);
  device_vector<C> dc(M * N), dbias(N);
  device.copy_from_host(bias.data(), static_cast<index_t>(N), dbias.data());
  device.copy_from_host(a.data(), static_cast<index_t>(a.size()), da.data());
  device.copy_from_host(b.data(), static_cast<index_t>(b.size()), db.data());
  const float s[2] = {a_scale_inv, b_scale_inv};
  device.copy_from_host(s, 2, scales.data());
  std::vector<C> got(M * N), again(M * N);
  for (int run = 0; run < 2; ++run) {
    device.copy_from_host(c0.data(), static_cast<index_t>(c0.size()), dc.data());
    device.fp8_gemm<C>(ta, tb, m, n, k, da.data(), fa, scales.data(), db.data(), fb, scales.data() + 1, dc.data(), accumulate,
                       with_bias ? dbias.data() : nullptr, accumulation);
    device.copy_to_host(dc.data(), static_cast<index_t>(got.size()), run == 0 ? got.data() : again.data());
  }
  // The accumulation bound: Hopper's FP8 tensor cores add their products in an accumulator
  // narrower than float (about 14 mantissa bits; cuBLASLt promotes the partial sums to float at
  // intervals along k), so a float output differs from the CPU twin's float sum by about 1e-4 of its
  // size (seen on an H100: 2e-5 at k = 16 to 1.1e-4 at k = 2048); 5e-4 leaves room over that and is
  // far below the casts' own error (an E4M3 step is 1/8 of a value). A bf16 output is bounded by its own rounding (tolerance<bf16>).
  // Fast accumulation (Fp8Accumulation::fast) keeps the whole sum in that narrower accumulator, no
  // promotion: its float bound is 4e-3 (the accumulator's 2^-14 relative step grows about as the
  // square root of the additions, 2^-14 x sqrt(k) x 8 at k = 2048 is 2.2e-2 for the worst element,
  // far less over the whole output), still under an E4M3 step; bf16 outputs keep tolerance<bf16>.
  const double error = relative_error(got, want);
  const double tol = std::is_same_v<C, float> ? (fast ? 4e-3 : 5e-4) : tolerance<C>();
  results.record(error <= tol && same_bits(got, again),
                 "fp8_gemm<" + type_name<C>() + "> ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " " +
                     std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " " +
                     std::string(strata::fp8_format_name(fa)) + "x" + std::string(strata::fp8_format_name(fb)) +
                     (accumulate ? " accumulate" : "") + (with_bias ? " + bias" : "") + (fast ? " fast accumulation" : "") +
                     " rel err " + format("%.3g", error) + " (tol " + format("%.0e", tol) + ")");
}

// n E4M3 codes of uniform values in [-200, 200] (with scales near 1e-3 the products are of order 1).
std::vector<std::uint8_t> random_e4m3_codes(host_rng& rng, std::size_t n) {
  const auto v = rng.uniform<float>(n, -2, 2);
  std::vector<std::uint8_t> codes(n);
  for (std::size_t i = 0; i < n; ++i) codes[i] = strata::fp8_encode(v[i] * 100.0f, Fp8Format::e4m3);
  return codes;
}

// fp8_gemm_gelu and fp8_gemm_gelu_backward (TN, with and without a bias) against the CPU backend's:
// pre and out within the GEMM's bound (the GPU's GELU reads the fp32 product, the CPU's the rounded
// pre-activation: a bf16 rounding apart).
template <class C>
void check_gemm_gelu(backend& device, suite& results, std::uint64_t seed, index_t m, index_t n, index_t k, bool with_bias) {
  host_rng rng(seed);
  const auto M = static_cast<std::size_t>(m), N = static_cast<std::size_t>(n), K = static_cast<std::size_t>(k);
  const std::vector<std::uint8_t> a = random_e4m3_codes(rng, M * K), b = random_e4m3_codes(rng, N * K);
  const float s[2] = {0.0013f, 0.0007f};  // products of order 1, where GELU bends
  const std::vector<C> bias = rng.uniform<C>(N, -1, 1);
  const C* host_bias = with_bias ? bias.data() : nullptr;
  std::vector<C> pre_cpu(M * N), out_cpu(M * N), dgelu_cpu(M * N);
  strata::cpu::backend::fp8_gemm_gelu<C>(m, n, k, a.data(), Fp8Format::e4m3, s, b.data(), Fp8Format::e4m3, s + 1, host_bias,
                                         pre_cpu.data(), out_cpu.data());
  strata::cpu::backend::fp8_gemm_gelu_backward<C>(m, n, k, a.data(), Fp8Format::e4m3, s, b.data(), Fp8Format::e4m3, s + 1,
                                                  pre_cpu.data(), dgelu_cpu.data());
  device_vector<std::uint8_t> da(a.size()), db(b.size());
  device_vector<float> scales(2);
  device_vector<C> dbias(N), dpre(M * N), dout(M * N), dpre_in(M * N), ddgelu(M * N);
  device.copy_from_host(a.data(), static_cast<index_t>(a.size()), da.data());
  device.copy_from_host(b.data(), static_cast<index_t>(b.size()), db.data());
  device.copy_from_host(s, 2, scales.data());
  device.copy_from_host(bias.data(), static_cast<index_t>(N), dbias.data());
  device.copy_from_host(pre_cpu.data(), static_cast<index_t>(M * N), dpre_in.data());
  device.fp8_gemm_gelu<C>(m, n, k, da.data(), Fp8Format::e4m3, scales.data(), db.data(), Fp8Format::e4m3, scales.data() + 1,
                          with_bias ? dbias.data() : nullptr, dpre.data(), dout.data());
  device.fp8_gemm_gelu_backward<C>(m, n, k, da.data(), Fp8Format::e4m3, scales.data(), db.data(), Fp8Format::e4m3,
                                   scales.data() + 1, dpre_in.data(), ddgelu.data());
  std::vector<C> pre(M * N), out(M * N), dgelu(M * N);
  device.copy_to_host(dpre.data(), static_cast<index_t>(M * N), pre.data());
  device.copy_to_host(dout.data(), static_cast<index_t>(M * N), out.data());
  device.copy_to_host(ddgelu.data(), static_cast<index_t>(M * N), dgelu.data());
  const double tol = std::is_same_v<C, float> ? 5e-4 : tolerance<C>();
  const double e_pre = relative_error(pre, pre_cpu), e_out = relative_error(out, out_cpu), e_d = relative_error(dgelu, dgelu_cpu);
  const std::string what = type_name<C>() + " " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                           (with_bias ? " + bias" : "");
  results.record(e_pre <= tol && e_out <= tol, "fp8_gemm_gelu<" + what + "> pre, out rel err " + format("%.3g", e_pre) + ", " +
                                                   format("%.3g", e_out) + " (tol " + format("%.0e", tol) + ")");
  results.record(e_d <= tol, "fp8_gemm_gelu_backward<" + what + "> rel err " + format("%.3g", e_d) + " (tol " + format("%.0e", tol) + ")");
  // The GELU epilogues themselves (the backend takes them only with STRATA_FP8_GELU_EPILOGUE=1): run
  // for bf16 outputs, declined for float ones.
  if constexpr (std::is_same_v<C, bf16>) {
    namespace sc = strata::cuda;
    device_vector<C> epre(M * N), eout(M * N), edgelu(M * N);
    const bool fused = sc::fp8_gemm_tn<C>(device.blas(), device.stream(), m, n, k, da.data(), Fp8Format::e4m3, scales.data(),
                                          db.data(), Fp8Format::e4m3, scales.data() + 1, eout.data(), false,
                                          with_bias ? dbias.data() : nullptr, sc::detail::gemm_epilogue::gelu_aux, epre.data());
    const bool dfused = sc::fp8_gemm_tn<C>(device.blas(), device.stream(), m, n, k, da.data(), Fp8Format::e4m3, scales.data(),
                                           db.data(), Fp8Format::e4m3, scales.data() + 1, edgelu.data(), false, nullptr,
                                           sc::detail::gemm_epilogue::dgelu, dpre_in.data());
    device.copy_to_host(epre.data(), static_cast<index_t>(M * N), pre.data());
    device.copy_to_host(eout.data(), static_cast<index_t>(M * N), out.data());
    device.copy_to_host(edgelu.data(), static_cast<index_t>(M * N), dgelu.data());
    const double f_pre = relative_error(pre, pre_cpu), f_out = relative_error(out, out_cpu), f_d = relative_error(dgelu, dgelu_cpu);
    results.record(fused && dfused && f_pre <= tol && f_out <= tol && f_d <= tol,
                   "FP8 GELU_AUX / DGELU epilogues <" + what + "> ran, rel err " + format("%.3g", f_pre) + ", " + format("%.3g", f_out) +
                       ", " + format("%.3g", f_d));
  }
}

// fp8_gemm_add (TN; the residual add in the epilogue of a layer's last FP8 GEMM) against the CPU
// backend's two steps (fp8_gemm with the bias, then add): within the GEMM's bound, the GPU rounding the
// fp32 sum once where the twin rounds the product and then the sum. `in_place`: out is the addend.
template <class C>
void check_gemm_add(backend& device, suite& results, std::uint64_t seed, index_t m, index_t n, index_t k, bool with_bias,
                    bool in_place) {
  host_rng rng(seed);
  const auto M = static_cast<std::size_t>(m), N = static_cast<std::size_t>(n), K = static_cast<std::size_t>(k);
  const std::vector<std::uint8_t> a = random_e4m3_codes(rng, M * K), b = random_e4m3_codes(rng, N * K);
  const float s[2] = {0.0013f, 0.0007f};
  const std::vector<C> bias = rng.uniform<C>(N, -1, 1), addend = rng.uniform<C>(M * N, -3, 3);
  std::vector<C> want(M * N);
  strata::cpu::backend::fp8_gemm<C>(false, true, m, n, k, a.data(), Fp8Format::e4m3, s, b.data(), Fp8Format::e4m3, s + 1,
                                    want.data(), false, with_bias ? bias.data() : nullptr);
  strata::cpu::backend::add<C>(want.data(), addend.data(), static_cast<index_t>(M * N), want.data());
  device_vector<std::uint8_t> da(a.size()), db(b.size());
  device_vector<float> scales(2);
  device_vector<C> dbias(N), daddend(M * N), dout(M * N);
  device.copy_from_host(a.data(), static_cast<index_t>(a.size()), da.data());
  device.copy_from_host(b.data(), static_cast<index_t>(b.size()), db.data());
  device.copy_from_host(s, 2, scales.data());
  device.copy_from_host(bias.data(), static_cast<index_t>(N), dbias.data());
  std::vector<C> got(M * N), again(M * N), kept(M * N);
  for (int run = 0; run < 2; ++run) {
    device.copy_from_host(addend.data(), static_cast<index_t>(M * N), daddend.data());
    C* out = in_place ? daddend.data() : dout.data();
    device.fp8_gemm_add<C>(m, n, k, da.data(), Fp8Format::e4m3, scales.data(), db.data(), Fp8Format::e4m3, scales.data() + 1,
                           with_bias ? dbias.data() : nullptr, daddend.data(), out);
    device.copy_to_host(out, static_cast<index_t>(M * N), run == 0 ? got.data() : again.data());
  }
  device.copy_to_host(daddend.data(), static_cast<index_t>(M * N), kept.data());
  const double tol = std::is_same_v<C, float> ? 5e-4 : tolerance<C>();
  const double error = relative_error(got, want);
  const bool addend_kept = in_place || same_bits(kept, addend);
  results.record(error <= tol && same_bits(got, again) && addend_kept,
                 "fp8_gemm_add<" + type_name<C>() + "> " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                     (with_bias ? " + bias" : "") + (in_place ? " in place" : "") + " rel err " + format("%.3g", error) +
                     " (tol " + format("%.0e", tol) + ")" + (addend_kept ? "" : ", the addend CHANGED"));
}

template <class T>
void check_block_casts(backend& device, suite& results, std::uint64_t seed, index_t rows, index_t cols, index_t block,
                       Fp8Format format) {
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  auto x = inputs<T>(n, seed, 3.0);
  for (std::size_t i = 0; i < n; ++i) x[i] = T(float(x[i]) * std::ldexp(1.0f, static_cast<int>(i % 11) - 5));  // ranges
  for (index_t c = 0; c < std::min<index_t>(cols, block); ++c) x[static_cast<std::size_t>(c)] = T(0.0f);  // a zero run
  if (n > 3) x[n - 2] = T(std::numeric_limits<float>::quiet_NaN());
  const index_t row_runs = (cols + block - 1) / block, col_runs = (rows + block - 1) / block;
  const std::size_t nq = static_cast<std::size_t>(row_runs * rows), nqt = static_cast<std::size_t>(col_runs * cols),
                    nt = static_cast<std::size_t>(row_runs * col_runs);
  std::vector<std::uint8_t> q_cpu(n), qt_cpu(n), tq_cpu(n), tqt_cpu(n);
  std::vector<float> s_cpu(nq), st_cpu(nqt), t_cpu(nt), tt_cpu(nt);
  strata::cpu::fp8_cast_blocks<T>(x.data(), rows, cols, format, block, q_cpu.data(), s_cpu.data(), qt_cpu.data(), st_cpu.data());
  strata::cpu::fp8_cast_tiles<T>(x.data(), rows, cols, format, block, tq_cpu.data(), tqt_cpu.data(), t_cpu.data(), tt_cpu.data());
  device_vector<T> dx(n);
  device_vector<std::uint8_t> dq(n), dqt(n), dtq(n), dtqt(n);
  device_vector<float> ds(nq), dst(nqt), dt(nt), dtt(nt);
  device.copy_from_host(x.data(), static_cast<index_t>(n), dx.data());
  device.fp8_cast_blocks<T>(dx.data(), rows, cols, format, block, dq.data(), ds.data(), dqt.data(), dst.data());
  device.fp8_cast_tiles<T>(dx.data(), rows, cols, format, block, dtq.data(), dtqt.data(), dt.data(), dtt.data());
  std::vector<std::uint8_t> q(n), qt(n), tq(n), tqt(n);
  std::vector<float> sv(nq), stv(nqt), tv(nt), ttv(nt);
  device.copy_to_host(dq.data(), static_cast<index_t>(n), q.data());
  device.copy_to_host(dqt.data(), static_cast<index_t>(n), qt.data());
  device.copy_to_host(dtq.data(), static_cast<index_t>(n), tq.data());
  device.copy_to_host(dtqt.data(), static_cast<index_t>(n), tqt.data());
  device.copy_to_host(ds.data(), static_cast<index_t>(nq), sv.data());
  device.copy_to_host(dst.data(), static_cast<index_t>(nqt), stv.data());
  device.copy_to_host(dt.data(), static_cast<index_t>(nt), tv.data());
  device.copy_to_host(dtt.data(), static_cast<index_t>(nt), ttv.data());
  const std::string what = type_name<T>() + " " + std::to_string(rows) + "x" + std::to_string(cols) + " blocks of " +
                           std::to_string(block) + " " + std::string(strata::fp8_format_name(format));
  results.record(same_bits(q, q_cpu) && same_bits(sv, s_cpu), "fp8_cast_blocks " + what + " runs along rows == cpu twin");
  results.record(same_bits(qt, qt_cpu) && same_bits(stv, st_cpu), "fp8_cast_blocks " + what + " runs along columns == cpu twin");
  results.record(same_bits(tq, tq_cpu) && same_bits(tqt, tqt_cpu) && same_bits(tv, t_cpu) && same_bits(ttv, tt_cpu),
                 "fp8_cast_tiles " + what + " both layouts and grids == cpu twin");
}

template <class C>
void check_block_gemm(backend& device, suite& results, std::uint64_t seed, index_t m, index_t n, index_t k, index_t block,
                      bool a_tiles, bool b_tiles, bool accumulate) {
  host_rng rng(seed);
  const auto M = static_cast<std::size_t>(m), N = static_cast<std::size_t>(n), K = static_cast<std::size_t>(k);
  auto va = rng.uniform<float>(M * K, -2, 2), vb = rng.uniform<float>(N * K, -2, 2);
  for (std::size_t i = 0; i < va.size(); ++i) va[i] *= std::ldexp(1.0f, static_cast<int>((i / 97) % 7) - 3);
  auto scales_of = [&](index_t rows, bool tiles) {
    const index_t runs = (k + block - 1) / block;
    return static_cast<std::size_t>(tiles ? ((rows + block - 1) / block) * runs : runs * rows);
  };
  std::vector<std::uint8_t> a(M * K), b(N * K);
  std::vector<float> sa(scales_of(m, a_tiles)), sb(scales_of(n, b_tiles));
  const Fp8Format fa = Fp8Format::e4m3, fb = accumulate ? Fp8Format::e5m2 : Fp8Format::e4m3;
  if (a_tiles) strata::cpu::fp8_cast_tiles<float>(va.data(), m, k, fa, block, a.data(), nullptr, sa.data(), nullptr);
  else strata::cpu::fp8_cast_blocks<float>(va.data(), m, k, fa, block, a.data(), sa.data(), nullptr, nullptr);
  if (b_tiles) strata::cpu::fp8_cast_tiles<float>(vb.data(), n, k, fb, block, b.data(), nullptr, sb.data(), nullptr);
  else strata::cpu::fp8_cast_blocks<float>(vb.data(), n, k, fb, block, b.data(), sb.data(), nullptr, nullptr);
  auto c0 = rng.uniform<C>(M * N);
  std::vector<C> want = c0;
  strata::cpu::fp8_gemm_blocks<C>(m, n, k, a.data(), fa, sa.data(), a_tiles, b.data(), fb, sb.data(), b_tiles, block, want.data(),
                                  accumulate);
  device_vector<std::uint8_t> da(a.size()), db(b.size());
  device_vector<float> dsa(sa.size()), dsb(sb.size());
  device_vector<C> dc(M * N);
  device.copy_from_host(a.data(), static_cast<index_t>(a.size()), da.data());
  device.copy_from_host(b.data(), static_cast<index_t>(b.size()), db.data());
  device.copy_from_host(sa.data(), static_cast<index_t>(sa.size()), dsa.data());
  device.copy_from_host(sb.data(), static_cast<index_t>(sb.size()), dsb.data());
  device.copy_from_host(c0.data(), static_cast<index_t>(c0.size()), dc.data());
  device.fp8_gemm_blocks<C>(m, n, k, da.data(), fa, dsa.data(), a_tiles, db.data(), fb, dsb.data(), b_tiles, block, dc.data(),
                            accumulate);
  std::vector<C> got(M * N);
  device.copy_to_host(dc.data(), static_cast<index_t>(got.size()), got.data());
  const double error = relative_error(got, want), tol = std::is_same_v<C, float> ? 5e-4 : tolerance<C>();
  results.record(error <= tol, "fp8_gemm_blocks<" + type_name<C>() + "> " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                                   std::to_string(k) + " blocks of " + std::to_string(block) + (a_tiles ? " tiles" : " runs") +
                                   " x" + (b_tiles ? " tiles" : " runs") + (accumulate ? " accumulate" : "") + " rel err " +
                                   format("%.3g", error) + " (tol " + format("%.0e", tol) + ")");
}

// The probe (see the note at the top): runs x tiles and runs x runs at 256 x 384 x 512, blocks of
// 128, each operand's scales as strata lays them out (runs [k/B, rows], tiles [rows/B, k/B]) or
// transposed; one printed line per candidate with its error against the CPU twin.
void probe_cublaslt_block_layouts(backend& device, suite& results) {
  const index_t m = 256, n = 384, k = 512, block = 128;
  host_rng rng(77);
  auto va = rng.uniform<float>(static_cast<std::size_t>(m * k), -2, 2), vb = rng.uniform<float>(static_cast<std::size_t>(n * k), -2, 2);
  for (std::size_t i = 0; i < va.size(); ++i) va[i] *= std::ldexp(1.0f, static_cast<int>((i / 61) % 9) - 4);
  for (std::size_t i = 0; i < vb.size(); ++i) {  // every 128 x 128 tile of b its own range, so the tile layout shows
    const std::size_t row = i / static_cast<std::size_t>(k), col = i % static_cast<std::size_t>(k);
    vb[i] *= std::ldexp(1.0f, static_cast<int>(((row / 128) * 5 + col / 128) % 7) - 3);
  }
  auto transpose = [](const std::vector<float>& x, index_t rows, index_t cols) {
    std::vector<float> t(x.size());
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < cols; ++c) t[static_cast<std::size_t>(c * rows + r)] = x[static_cast<std::size_t>(r * cols + c)];
    return t;
  };
  for (const bool b_tiles : {true, false}) {
    std::vector<std::uint8_t> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(n * k));
    std::vector<float> sa(static_cast<std::size_t>((k / block) * m)), sb(static_cast<std::size_t>(b_tiles ? (n / block) * (k / block) : (k / block) * n));
    strata::cpu::fp8_cast_blocks<float>(va.data(), m, k, Fp8Format::e4m3, block, a.data(), sa.data(), nullptr, nullptr);
    if (b_tiles) strata::cpu::fp8_cast_tiles<float>(vb.data(), n, k, Fp8Format::e4m3, block, b.data(), nullptr, sb.data(), nullptr);
    else strata::cpu::fp8_cast_blocks<float>(vb.data(), n, k, Fp8Format::e4m3, block, b.data(), sb.data(), nullptr, nullptr);
    std::vector<float> want(static_cast<std::size_t>(m * n));
    strata::cpu::fp8_gemm_blocks<float>(m, n, k, a.data(), Fp8Format::e4m3, sa.data(), false, b.data(), Fp8Format::e4m3, sb.data(),
                                        b_tiles, block, want.data(), false);
    device_vector<std::uint8_t> da(a.size()), db(b.size());
    device.copy_from_host(a.data(), static_cast<index_t>(a.size()), da.data());
    device.copy_from_host(b.data(), static_cast<index_t>(b.size()), db.data());
    for (const bool a_transposed : {false, true})
      for (const bool b_transposed : {false, true}) {
        const std::vector<float> la = a_transposed ? transpose(sa, k / block, m) : sa;
        const std::vector<float> lb = !b_transposed ? sb
                                      : b_tiles     ? transpose(sb, n / block, k / block)
                                                    : transpose(sb, k / block, n);
        device_vector<float> dsa(la.size()), dsb(lb.size()), dc(static_cast<std::size_t>(m * n));
        device.copy_from_host(la.data(), static_cast<index_t>(la.size()), dsa.data());
        device.copy_from_host(lb.data(), static_cast<index_t>(lb.size()), dsb.data());
        bool ran = false;
        std::string error;
        try {
          ran = strata::cuda::fp8_gemm_blocks_cublaslt<float>(device.blas(), device.stream(), m, n, k, da.data(), Fp8Format::e4m3,
                                                              dsa.data(), false, db.data(), Fp8Format::e4m3, dsb.data(), b_tiles,
                                                              dc.data(), false);
          device.synchronize();
        } catch (const std::exception& e) {
          error = e.what();
        }
        std::vector<float> got(static_cast<std::size_t>(m * n), 0.0f);
        if (ran) device.copy_to_host(dc.data(), static_cast<index_t>(got.size()), got.data());
        if (!a_transposed && !b_transposed)
          results.record(ran && relative_error(got, want) <= 5e-4,
                         std::string("cuBLASLt's block-scaled FP8 GEMM reads strata's scale layouts, runs x ") +
                             (b_tiles ? "tiles" : "runs") + " (the training path of fp8_gemm_blocks)");
        std::printf("probe cuBLASLt block-scaled FP8 GEMM runs x %s: a scales %s, b scales %s: %s\n", b_tiles ? "tiles" : "runs",
                    a_transposed ? "transposed" : "as strata's", b_transposed ? "transposed" : "as strata's",
                    !error.empty() ? ("error: " + error).c_str()
                    : ran          ? format("rel err %.3g", relative_error(got, want)).c_str()
                                   : "no algorithm");
      }
  }
}

// STRATA_CUBLASLT_FP8_WORKSPACE_KIB: the per-tensor FP8 GEMMs are planned without a cuBLASLt
// workspace by default; a backend made with the variable set lets them use one, and their products
// stay within the bound of the CPU twin; a value that is not a size is refused with the variable's name.
void check_fp8_workspace(suite& results, backend& with_default, std::uint64_t& seed) {
  results.record(with_default.blas().fp8_workspace_bytes() == 0 && with_default.blas().workspace_bytes() > 0,
                 "the FP8 GEMMs are planned without a workspace by default (the handle's: " +
                     std::to_string(with_default.blas().workspace_bytes()) + " bytes)");
  ::setenv("STRATA_CUBLASLT_FP8_WORKSPACE_KIB", "32768", 1);
  {
    backend device(0);
    results.record(device.blas().fp8_workspace_bytes() == (std::size_t{32} << 20),
                   "STRATA_CUBLASLT_FP8_WORKSPACE_KIB=32768: the FP8 GEMMs may use " +
                       std::to_string(device.blas().fp8_workspace_bytes()) + " bytes");
    for (const bool accumulate : {false, true}) {
      check_gemm<bf16>(device, results, seed++, false, true, 1024, 768, 2048, Fp8Format::e4m3, Fp8Format::e4m3, false);
      check_gemm<float>(device, results, seed++, false, true, 2048, 3072, 1024, Fp8Format::e5m2, Fp8Format::e4m3, accumulate);
    }
  }
  ::unsetenv("STRATA_CUBLASLT_FP8_WORKSPACE_KIB");
  with_default.install();  // the backend made and gone above left this thread without one
  const std::string message = config_error_under("STRATA_CUBLASLT_FP8_WORKSPACE_KIB", "1GiB",
                                                  [] { return strata::cuda::blas_handle::default_fp8_workspace_bytes(); });
  results.record(message.find("STRATA_CUBLASLT_FP8_WORKSPACE_KIB") != std::string::npos && message.find("1GiB") != std::string::npos,
                 "STRATA_CUBLASLT_FP8_WORKSPACE_KIB=1GiB is refused: " + message);
}

}  // namespace

int main() {
  try {
    backend device(0);
    suite results("fp8");
    check_conversion(results, Fp8Format::e4m3);
    check_conversion(results, Fp8Format::e5m2);
    std::uint64_t seed = 1;
    for (auto format : {Fp8Format::e4m3, Fp8Format::e5m2})
      for (auto [rows, cols] : {std::pair<index_t, index_t>{1, 1}, {7, 33}, {128, 96}, {200, 136}, {1000, 777}, {4096, 2048}})
        for (float scale : {1.0f, 150.0f, 3.0e4f}) {
          check_casts<float>(device, results, seed++, rows, cols, format, scale, false);
          check_casts<bf16>(device, results, seed++, rows, cols, format, scale, false);
          check_casts<double>(device, results, seed++, rows, cols, format, scale, false);
        }
    check_casts<float>(device, results, seed++, 64, 64, Fp8Format::e4m3, 1.0f, true);
    check_casts<bf16>(device, results, seed++, 64, 64, Fp8Format::e5m2, 1.0f, true);
    check_update(device, results);
    for (const auto& [rows, cols] : std::vector<std::pair<index_t, index_t>>{
             {64, 64}, {8192, 2048}, {2048, 6144}, {200, 136}, {37, 53}, {1, 96}, {96, 1}, {520, 72}})
      for (const index_t offset : {0, 1, 8})
        check_transpose(device, results, seed++, rows, cols, offset);
    for (auto producer : {strata::Fp8Producer::copy, strata::Fp8Producer::gelu, strata::Fp8Producer::gelu_backward,
                          strata::Fp8Producer::swiglu, strata::Fp8Producer::swiglu_backward})
      // swiglu_backward makes [d gate | d up]: an even width (136 = 2 x 68: eights straddle the halves;
      // 768, 2048: they do not; 400 = 2 x 200: whole eights, halves of three whole tiles and an edge, 136
      // rows of two whole tile rows and an edge)
      for (auto [rows, cols] :
           {std::pair<index_t, index_t>{1, 2}, {7, 34}, {200, 136}, {136, 400}, {1024, 768}, {4096, 2048}})
        for (index_t offset : {0, 1}) {
          check_fused_casts<bf16>(device, results, seed++, rows, cols, producer, offset);
          check_fused_casts<float>(device, results, seed++, rows, cols, producer, offset);
          check_fused_casts<double>(device, results, seed++, rows, cols, producer, offset);
        }
    for (const bool layer : {true, false})
      for (auto [rows, h] : {std::pair<index_t, index_t>{1, 8}, {37, 1000}, {64, 2048}, {33, 2050}, {128, 3072}, {4, 20480}})
        for (const bool residual : {false, true})
          for (index_t offset : {0, 1}) {
            const bool offset1 = (rows + offset) % 2 == 1;
            check_norm_codes<bf16>(device, results, seed++, layer, rows, h, residual, offset1, offset);
            check_norm_codes<float>(device, results, seed++, layer, rows, h, residual, offset1, offset);
            check_norm_codes<double>(device, results, seed++, layer, rows, h, residual, offset1, offset);
          }
    const std::vector<std::tuple<index_t, index_t, index_t>> shapes = {{16, 16, 16}, {64, 48, 32}, {256, 512, 1024}, {1024, 768, 2048}};
    const std::vector<std::pair<Fp8Format, Fp8Format>> formats = {
        {Fp8Format::e4m3, Fp8Format::e4m3}, {Fp8Format::e5m2, Fp8Format::e4m3}, {Fp8Format::e4m3, Fp8Format::e5m2}};
    for (const auto& [m, n, k] : shapes)
      for (int t = 0; t < 4; ++t)
        for (const auto& [fa, fb] : formats) {
          const bool ta = t & 1, tb = t & 2;
          check_gemm<bf16>(device, results, seed++, ta, tb, m, n, k, fa, fb, false);
          check_gemm<float>(device, results, seed++, ta, tb, m, n, k, fa, fb, false);
          if (t == 2) {  // the forward's layout (TN): the bias in the epilogue; the forward's fast accumulation
            check_gemm<bf16>(device, results, seed++, ta, tb, m, n, k, fa, fb, false, true);
            check_gemm<float>(device, results, seed++, ta, tb, m, n, k, fa, fb, false, true);
            for (const bool with_bias : {false, true}) {
              check_gemm<bf16>(device, results, seed++, ta, tb, m, n, k, fa, fb, false, with_bias, strata::Fp8Accumulation::fast);
              check_gemm<float>(device, results, seed++, ta, tb, m, n, k, fa, fb, false, with_bias, strata::Fp8Accumulation::fast);
            }
          }
          check_gemm<float>(device, results, seed++, ta, tb, m, n, k, fa, fb, true);  // a weight gradient
        }
    for (const bool fast : {false, true}) {  // a long sum, as the MLP's second GEMM's (k = 4 x hidden)
      const auto accumulation = fast ? strata::Fp8Accumulation::fast : strata::Fp8Accumulation::split;
      check_gemm<float>(device, results, seed++, false, true, 256, 512, 8192, Fp8Format::e4m3, Fp8Format::e4m3, false, false,
                        accumulation);
      check_gemm<bf16>(device, results, seed++, false, true, 256, 512, 8192, Fp8Format::e4m3, Fp8Format::e4m3, false, false,
                       accumulation);
    }
    check_fp8_workspace(results, device, seed);
    bool refused = false;
    try {
      device_vector<std::uint8_t> a(256);
      device_vector<float> s(1), c(256);
      device.fp8_gemm<float>(false, true, 16, 16, 16, a.data(), Fp8Format::e5m2, s.data(), a.data(), Fp8Format::e5m2, s.data(),
                             c.data(), false);
    } catch (const strata::ConfigError& e) {
      refused = std::string(e.what()).find("E5M2 x E5M2") != std::string::npos;
    }
    results.record(refused, "fp8_gemm E5M2 x E5M2 refused with a sentence");
    for (const auto& [m, n, k] : std::vector<std::tuple<index_t, index_t, index_t>>{{64, 48, 32}, {512, 1024, 256}})
      for (const bool with_bias : {false, true}) {
        check_gemm_gelu<bf16>(device, results, seed++, m, n, k, with_bias);
        check_gemm_gelu<float>(device, results, seed++, m, n, k, with_bias);
      }
    for (const auto& [m, n, k] : std::vector<std::tuple<index_t, index_t, index_t>>{{64, 48, 32}, {512, 1024, 256}, {96, 2048, 8192}})
      for (const bool with_bias : {false, true})
        for (const bool in_place : {false, true}) {
          check_gemm_add<bf16>(device, results, seed++, m, n, k, with_bias, in_place);
          check_gemm_add<float>(device, results, seed++, m, n, k, with_bias, in_place);
        }
    for (const index_t block : {128, 32})
      for (auto [rows, cols] : {std::pair<index_t, index_t>{1, 1}, {7, 200}, {300, 260}, {1024, 768}, {136, 384}, {200, 1280}, {144, 256}})
        for (auto format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
          check_block_casts<float>(device, results, seed++, rows, cols, block, format);
          check_block_casts<bf16>(device, results, seed++, rows, cols, block, format);
        }
    for (const auto& [m, n, k] : std::vector<std::tuple<index_t, index_t, index_t>>{{64, 48, 200}, {512, 384, 1024}})
      for (const auto& [a_tiles, b_tiles] : {std::pair{false, true}, {true, false}, {false, false}}) {
        check_block_gemm<bf16>(device, results, seed++, m, n, k, 128, a_tiles, b_tiles, false);
        check_block_gemm<float>(device, results, seed++, m, n, k, 128, a_tiles, b_tiles, true);
      }
    probe_cublaslt_block_layouts(device, results);
    device.synchronize();
    return results.finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_fp8: %s\n", e.what());
    return 2;
  }
}
