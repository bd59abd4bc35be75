// tests/gpu/test_moe_grouped.cu: the experts' grouped GEMMs whose group sizes stay in device memory
// (cuda::backend::grouped_gemm_rows / grouped_gemm_weights) against their CPU twins
// (backend/cpu/moe.hpp) on random inputs: random group sizes with empty groups, more rows than the
// counts' total (those rows must come back zero), both layouts of B, accumulation into fp32 weight
// gradients and plain writes; bf16 at sizes the Hopper kernel takes (multiples of 8) and at sizes it
// does not (the fallback reads the counts on the host), float (always the fallback). Then, at the
// Mixtral-like shapes of bench/bench_grouped_gemm.cu, the grouped kernels against a loop of the
// backend's gemm per group, the same bits on a second call, and, where the Hopper kernel is built,
// that the calls return while the stream is still busy (no wait for the host). Built the compiled
// way (linking strata::cuda_kernels, where the Hopper kernel lives when CUTLASS was found).
#include <atomic>
#include <chrono>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <strata/backend/cpu/backend.hpp>

#include "check.hpp"

using namespace gpu_test;
using strata::cuda::backend;
using cpu = strata::cpu::backend;

namespace {

constexpr bool kCutlass =
#if defined(STRATA_WITH_CUTLASS) && STRATA_WITH_CUTLASS
    true;
#else
    false;
#endif

std::string sizes(const std::vector<std::int32_t>& counts) {
  std::string out = "[";
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(counts[i]);
  }
  return out + "]";
}

// C = A op(B_g) by row groups, against the CPU twin; `extra` rows past the counts' total.
// With CUTLASS, `tile` other than automatic runs the Hopper kernel of that tile directly (bf16).
#if defined(STRATA_WITH_CUTLASS) && STRATA_WITH_CUTLASS
using strata::cuda::sm90::rows_tile;
#else
enum class rows_tile { automatic };
#endif

template <class T>
void check_rows(backend& device, suite& results, bool transpose_b, std::vector<std::int32_t> counts, index_t n, index_t k,
                index_t extra, rows_tile tile = rows_tile::automatic) {
  const index_t groups = static_cast<index_t>(counts.size());
  const index_t rows = std::accumulate(counts.begin(), counts.end(), index_t{0}) + extra;
  host_rng rng(31 + transpose_b + static_cast<std::uint64_t>(n + k + groups));
  const auto a = rng.template uniform<T>(static_cast<std::size_t>(rows * k));
  const auto c0 = rng.template uniform<T>(static_cast<std::size_t>(rows * n));  // must all be overwritten
  std::vector<std::vector<T>> b;
  for (index_t g = 0; g < groups; ++g) b.push_back(rng.template uniform<T>(static_cast<std::size_t>(n * k)));
  std::vector<T> expected = c0;
  std::vector<const T*> hb;
  for (auto& v : b) hb.push_back(v.data());
  cpu::grouped_gemm_rows<T>(transpose_b, groups, counts.data(), rows, n, k, a.data(), hb.data(), expected.data());

  device_vector<T> da(a.size()), dc(c0.size()), dc2(c0.size());
  device_vector<std::int32_t> dcounts(counts.size());
  device_vector<T> db(static_cast<std::size_t>(groups * n * k));
  upload(device, a, da), upload(device, c0, dc), upload(device, c0, dc2), upload(device, counts, dcounts);
  std::vector<const T*> pb;
  for (index_t g = 0; g < groups; ++g) {
    device.copy_from_host(b[g].data(), n * k, db.data() + g * n * k);
    pb.push_back(db.data() + g * n * k);
  }
  std::string which;
  for (auto* out : {&dc, &dc2}) {
#if defined(STRATA_WITH_CUTLASS) && STRATA_WITH_CUTLASS
    if constexpr (std::is_same_v<T, bf16>) {
      if (tile != rows_tile::automatic) {
        which = std::string(" tile ") + strata::cuda::sm90::rows_tile_name(tile);
        if (!strata::cuda::sm90::grouped_gemm_rows(device.stream(), device.allocator(), transpose_b, groups, dcounts.data(),
                                                   rows, n, k, da.data(), pb.data(), out->data(), tile)) {
          results.record(false, "grouped_gemm_rows" + which + ": the Hopper kernel did not take the call");
          return;
        }
        continue;
      }
    }
#endif
    device.grouped_gemm_rows<T>(transpose_b, groups, dcounts.data(), rows, n, k, da.data(), pb.data(), out->data());
  }
  const auto got = to_host(device, dc), again = to_host(device, dc2);
  const double error = relative_error(got, expected);
  bool tail_zero = true;
  for (index_t i = (rows - extra) * n; i < rows * n; ++i) tail_zero = tail_zero && as_double(got[i]) == 0.0;
  results.record(error <= tolerance<T>() && tail_zero && same_bits(got, again),
                 "grouped_gemm_rows<" + type_name<T>() + ">" + which + " tb=" + std::to_string(transpose_b) + " counts " + sizes(counts) +
                     " +" + std::to_string(extra) + " rows, n=" + std::to_string(n) + " k=" + std::to_string(k) + ": error " +
                     format("%.3g", error) + (tail_zero ? ", rows past the counts zero" : ", rows past the counts NOT ZERO") +
                     (same_bits(got, again) ? ", same bits twice" : ", DIFFERENT bits twice"));
}

// C_g (+)= A_g^T B_g by row groups, against the CPU twin.
template <class T, class C>
void check_weights(backend& device, suite& results, std::vector<std::int32_t> counts, index_t m, index_t n, bool accumulate) {
  const index_t groups = static_cast<index_t>(counts.size());
  const index_t rows = std::accumulate(counts.begin(), counts.end(), index_t{0}) + 3;
  host_rng rng(77 + accumulate + static_cast<std::uint64_t>(m + n + groups));
  const auto a = rng.template uniform<T>(static_cast<std::size_t>(rows * m));
  const auto b = rng.template uniform<T>(static_cast<std::size_t>(rows * n));
  std::vector<std::vector<C>> c;
  for (index_t g = 0; g < groups; ++g) c.push_back(rng.template uniform<C>(static_cast<std::size_t>(m * n)));
  std::vector<std::vector<C>> expected = c;
  std::vector<C*> hc;
  for (auto& v : expected) hc.push_back(v.data());
  cpu::grouped_gemm_weights<T, C>(groups, counts.data(), rows, m, n, a.data(), b.data(), hc.data(), accumulate);

  device_vector<T> da(a.size()), db(b.size());
  device_vector<std::int32_t> dcounts(counts.size());
  device_vector<C> dc(static_cast<std::size_t>(groups * m * n));
  upload(device, a, da), upload(device, b, db), upload(device, counts, dcounts);
  std::vector<C*> pc;
  for (index_t g = 0; g < groups; ++g) {
    device.copy_from_host(c[g].data(), m * n, dc.data() + g * m * n);
    pc.push_back(dc.data() + g * m * n);
  }
  device.grouped_gemm_weights<T, C>(groups, dcounts.data(), rows, m, n, da.data(), db.data(), pc.data(), accumulate);
  const auto got = to_host(device, dc);
  std::vector<C> want;
  for (auto& v : expected) want.insert(want.end(), v.begin(), v.end());
  const double error = relative_error(got, want);
  results.record(error <= tolerance<T>(), "grouped_gemm_weights<" + type_name<T>() + "," + type_name<C>() + "> counts " +
                                              sizes(counts) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                              " accumulate=" + std::to_string(accumulate) + ": error " + format("%.3g", error));
}

// The experts' five GEMMs of one layer at Mixtral-like shapes (hidden h, expert width f, gated fc1)
// against a loop of the backend's gemm per group: forward fc1 and fc2, the input gradients, the
// weight gradients. Returns whether every call returned while a host gate held the stream (only
// meaningful where the Hopper kernel runs).
bool check_against_loop(backend& device, suite& results, const std::vector<std::int32_t>& counts, index_t h, index_t f) {
  const index_t groups = static_cast<index_t>(counts.size());
  const index_t rows = std::accumulate(counts.begin(), counts.end(), index_t{0});
  host_rng rng(5);
  const auto x = rng.template uniform<bf16>(static_cast<std::size_t>(rows * h));
  const auto w = rng.template uniform<bf16>(static_cast<std::size_t>(groups * 2 * f * h), -0.05, 0.05);
  device_vector<bf16> dx(x.size()), dw(w.size()), out(static_cast<std::size_t>(rows * 2 * f)),
      loop(static_cast<std::size_t>(rows * 2 * f));
  device_vector<float> grads(static_cast<std::size_t>(groups * 2 * f * h)), loop_grads(grads.size());
  device_vector<std::int32_t> dcounts(counts.size());
  upload(device, x, dx), upload(device, w, dw), upload(device, counts, dcounts);
  device.fill<float>(grads.data(), static_cast<index_t>(grads.size()), 0.0);
  device.fill<float>(loop_grads.data(), static_cast<index_t>(grads.size()), 0.0);
  std::vector<const bf16*> pw;
  std::vector<float*> pg, lg;
  for (index_t g = 0; g < groups; ++g)
    pw.push_back(dw.data() + g * 2 * f * h), pg.push_back(grads.data() + g * 2 * f * h), lg.push_back(loop_grads.data() + g * 2 * f * h);

  // A host gate holds the stream: the grouped calls must return while it is closed.
  std::atomic<bool> open{false};
  auto gate = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  // Warm (the allocator's blocks exist), then start the gradients from zero again.
  device.grouped_gemm_rows<bf16>(true, groups, dcounts.data(), rows, 2 * f, h, dx.data(), pw.data(), out.data());
  device.grouped_gemm_weights<bf16, float>(groups, dcounts.data(), rows, 2 * f, h, out.data(), dx.data(), pg.data(), true);
  device.fill<float>(grads.data(), static_cast<index_t>(grads.size()), 0.0);
  device.synchronize();
  STRATA_CUDA_CHECK(cudaLaunchHostFunc(device.stream(), gate, &open));
  device.grouped_gemm_rows<bf16>(true, groups, dcounts.data(), rows, 2 * f, h, dx.data(), pw.data(), out.data());
  device.grouped_gemm_weights<bf16, float>(groups, dcounts.data(), rows, 2 * f, h, out.data(), dx.data(), pg.data(), true);
  const bool no_wait = cudaStreamQuery(device.stream()) == cudaErrorNotReady;
  open = true;
  device.synchronize();
  index_t at = 0;
  for (index_t g = 0; g < groups; ++g) {
    device.gemm<bf16>(false, true, counts[g], 2 * f, h, dx.data() + at * h, pw[g], loop.data() + at * 2 * f, false);
    device.gemm<bf16, float>(true, false, 2 * f, h, counts[g], loop.data() + at * 2 * f, dx.data() + at * h, lg[g], true);
    at += counts[g];
  }
  const double e1 = relative_error(to_host(device, out), to_host(device, loop));
  const double e2 = relative_error(to_host(device, grads), to_host(device, loop_grads));
  results.record(e1 <= tolerance<bf16>() && e2 <= tolerance<bf16>(),
                 "grouped vs loop of gemm, counts " + sizes(counts) + " h=" + std::to_string(h) + " f=" + std::to_string(f) +
                     ": fc1 error " + format("%.3g", e1) + ", fc1 weight gradient error " + format("%.3g", e2));
  return no_wait;
}

}  // namespace

int main() {
  try {
    backend device(0);
    suite results("moe_grouped");
    int major = 0;
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    std::printf("Hopper grouped kernel %s; this GPU is sm_%d0\n", kCutlass ? "built (CUTLASS)" : "NOT built (no CUTLASS)", major);
    const std::vector<std::vector<std::int32_t>> layouts = {{37, 0, 130, 1, 64, 0, 12, 200}, {0, 0, 0}, {256}, {5, 0, 0, 9}};
    for (bool tb : {true, false})
      for (const auto& counts : layouts) {
        check_rows<bf16>(device, results, tb, counts, 96, 64, 7);     // the Hopper kernel's sizes
        check_rows<bf16>(device, results, tb, counts, 36, 20, 0);     // not multiples of 8: the fallback
        check_rows<float>(device, results, tb, counts, 40, 24, 5);
      }
#if defined(STRATA_WITH_CUTLASS) && STRATA_WITH_CUTLASS
    // Every tile the rows form is compiled with, on the Hopper GPU: partial tiles in both dimensions
    // (n 264, groups of 1 to 300 rows), empty groups, rows past the counts.
    // The automatic choice by size (the layouts above run it): 128 x 128 tiles up to 256 rows a group.
    using strata::cuda::sm90::automatic_rows_tile;
    results.record(automatic_rows_tile(8 * 256, 8) == rows_tile::c128x128_1x2 &&
                       automatic_rows_tile(8 * 256 + 1, 8) == rows_tile::c128x256_1x2 &&
                       automatic_rows_tile(16384, 8) == rows_tile::c128x256_1x2,
                   "automatic_rows_tile: c128x128_1x2 up to 256 rows a group, c128x256_1x2 above");
    if (major == 9)
      for (rows_tile tile : strata::cuda::sm90::kRowsTiles)
        for (bool tb : {true, false}) {
          check_rows<bf16>(device, results, tb, {37, 0, 130, 1, 64, 0, 12, 300}, 264, 72, 9, tile);
          check_rows<bf16>(device, results, tb, {256, 0}, 512, 128, 0, tile);
        }
#endif
    for (bool accumulate : {true, false})
      for (const auto& counts : layouts) {
        check_weights<bf16, float>(device, results, counts, 96, 64, accumulate);
        check_weights<bf16, float>(device, results, counts, 36, 20, accumulate);
        check_weights<float, float>(device, results, counts, 40, 24, accumulate);
      }
    const bool no_wait = check_against_loop(device, results, {2048, 1900, 2200, 2000, 0, 2100, 1950, 2134}, 1024, 3584);
    (void)check_against_loop(device, results, {64, 512, 128, 300, 96, 0, 200, 448}, 1024, 3584);
    if (kCutlass && major == 9)
      results.record(no_wait, std::string("grouped_gemm_rows and grouped_gemm_weights ") +
                                  (no_wait ? "returned while the stream was held (no wait for the host)"
                                           : "WAITED for the stream"));
    return results.finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_moe_grouped: %s\n", e.what());
    return 1;
  }
}
