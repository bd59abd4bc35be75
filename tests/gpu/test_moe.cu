// tests/gpu/test_moe.cu: the mixture-of-experts entry points of cuda::backend against their CPU
// twins (backend/cpu/moe.hpp) on random inputs: grouped_gemm (every transpose pair the experts use,
// float / double / bf16, groups with no rows, accumulation into fp32; then, bf16 and float, against a
// loop of the backend's gemm per group at the experts' shapes and layout, the same bits on a second
// call, the groups sent to the cuBLAS grouped call where grouped_gemm.hpp says they go, and no wait
// for the GPU nor cudaMalloc once warm), the router forward and
// backward (softmax before / after top-k, sigmoid, expert bias), capacity dropping by probability
// and by position, counting, the sort by expert (packed and padded to capacity), the row maps of the
// compacted padded exchange, gathering rows,
// combine and its backward, the aux loss and the expert-bias update. Integer outputs must match
// exactly; values within the tolerance of their type (check.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <strata/backend/cpu/backend.hpp>

#include "check.hpp"

using namespace gpu_test;
using strata::cuda::backend;
using strata::MoeRouting;
using strata::MoeScore;
using cpu = strata::cpu::backend;

namespace {

template <class T, class C = T>
void check_grouped_gemm(backend& device, suite& results, bool ta, bool tb, bool accumulate) {
  const std::vector<index_t> m = {5, 0, 17, 3}, n = {7, 7, 7, 7}, k = {9, 9, 0, 33};
  const index_t groups = static_cast<index_t>(m.size());
  host_rng rng(11 + ta + 2 * tb);
  std::vector<std::vector<T>> a, b;
  std::vector<std::vector<C>> c;
  for (index_t g = 0; g < groups; ++g) {
    a.push_back(rng.template uniform<T>(static_cast<std::size_t>(m[g] * k[g])));
    b.push_back(rng.template uniform<T>(static_cast<std::size_t>(k[g] * n[g])));
    c.push_back(rng.template uniform<C>(static_cast<std::size_t>(m[g] * n[g])));
  }
  std::vector<std::vector<C>> expected = c;
  std::vector<const T*> ha, hb;
  std::vector<C*> hc;
  for (index_t g = 0; g < groups; ++g) ha.push_back(a[g].data()), hb.push_back(b[g].data()), hc.push_back(expected[g].data());
  cpu::grouped_gemm<T, C>(ta, tb, groups, m.data(), n.data(), k.data(), ha.data(), hb.data(), hc.data(), accumulate);

  std::vector<device_vector<T>*> da, db;
  std::vector<device_vector<C>*> dc;
  std::vector<const T*> pa, pb;
  std::vector<C*> pc;
  for (index_t g = 0; g < groups; ++g) {
    da.push_back(new device_vector<T>(a[g].size() + 1));
    db.push_back(new device_vector<T>(b[g].size() + 1));
    dc.push_back(new device_vector<C>(c[g].size() + 1));
    device.copy_from_host(a[g].data(), static_cast<index_t>(a[g].size()), da[g]->data());
    device.copy_from_host(b[g].data(), static_cast<index_t>(b[g].size()), db[g]->data());
    device.copy_from_host(c[g].data(), static_cast<index_t>(c[g].size()), dc[g]->data());
    pa.push_back(da[g]->data()), pb.push_back(db[g]->data()), pc.push_back(dc[g]->data());
  }
  device.grouped_gemm<T, C>(ta, tb, groups, m.data(), n.data(), k.data(), pa.data(), pb.data(), pc.data(), accumulate);
  double worst = 0;
  for (index_t g = 0; g < groups; ++g) {
    std::vector<C> got(c[g].size());
    device.copy_to_host(dc[g]->data(), static_cast<index_t>(got.size()), got.data());
    worst = std::max(worst, relative_error(got, expected[g]));
    delete da[g], delete db[g], delete dc[g];
  }
  results.record(worst <= tolerance<T>(), "grouped_gemm<" + type_name<T>() + "," + type_name<C>() + "> ta=" +
                                              std::to_string(ta) + " tb=" + std::to_string(tb) + " accumulate=" +
                                              std::to_string(accumulate) + " error " + format("%.3g", worst));
}

// Grouped GEMMs laid out as layers/moe/experts.hpp lays them out: each operand one buffer, group g's
// block at the running offset (plus `pad` elements after every block: pad = 1 misaligns the blocks,
// which then run one cuBLASLt GEMM each). The grouped call must match a loop of the backend's gemm
// per group on the same inputs (the whole C buffer, gaps included), give the same bits on a second
// call, and send `expect_grouped` groups to the cuBLAS grouped call (-1: not checked).
template <class T, class C = T>
void check_grouped_equals_loop(backend& device, suite& results, const std::string& what, bool ta, bool tb, bool accumulate,
                               const std::vector<index_t>& m, const std::vector<index_t>& n, const std::vector<index_t>& k,
                               index_t pad, index_t expect_grouped) {
  const index_t groups = static_cast<index_t>(m.size());
  std::vector<index_t> offset_a, offset_b, offset_c;
  index_t size_a = 0, size_b = 0, size_c = 0;
  for (index_t g = 0; g < groups; ++g) {
    offset_a.push_back(size_a), offset_b.push_back(size_b), offset_c.push_back(size_c);
    size_a += m[g] * k[g] + pad, size_b += k[g] * n[g] + pad, size_c += m[g] * n[g] + pad;
  }
  host_rng rng(101 + ta + 2 * tb + 4 * accumulate + static_cast<std::uint64_t>(groups));
  const auto a = rng.template uniform<T>(static_cast<std::size_t>(size_a));
  const auto b = rng.template uniform<T>(static_cast<std::size_t>(size_b));
  const auto c0 = rng.template uniform<C>(static_cast<std::size_t>(size_c));
  device_vector<T> da(a.size() + 1), db(b.size() + 1);
  device_vector<C> c_grouped(c0.size() + 1), c_again(c0.size() + 1), c_loop(c0.size() + 1);
  upload(device, a, da), upload(device, b, db);
  upload(device, c0, c_grouped), upload(device, c0, c_again), upload(device, c0, c_loop);
  const auto pointers = [&](const device_vector<C>& out) {
    std::vector<const T*> pa, pb;
    std::vector<C*> pc;
    for (index_t g = 0; g < groups; ++g)
      pa.push_back(da.data() + offset_a[g]), pb.push_back(db.data() + offset_b[g]), pc.push_back(out.data() + offset_c[g]);
    return std::make_tuple(pa, pb, pc);
  };
  const auto [pa, pb, pc] = pointers(c_grouped);
  const auto [qa, qb, qc] = pointers(c_again);
  const auto [la, lb, lc] = pointers(c_loop);
  const auto grouped = static_cast<index_t>(
      strata::cuda::groups_in_grouped_call<T, C>(groups, m.data(), n.data(), k.data(), pa.data(), pb.data(), pc.data()).size());
  device.grouped_gemm<T, C>(ta, tb, groups, m.data(), n.data(), k.data(), pa.data(), pb.data(), pc.data(), accumulate);
  device.grouped_gemm<T, C>(ta, tb, groups, m.data(), n.data(), k.data(), qa.data(), qb.data(), qc.data(), accumulate);
  for (index_t g = 0; g < groups; ++g)
    device.gemm<T, C>(ta, tb, m[g], n[g], k[g], la[g], lb[g], lc[g], accumulate);
  auto got = to_host(device, c_grouped), again = to_host(device, c_again), loop = to_host(device, c_loop);
  got.pop_back(), again.pop_back(), loop.pop_back();
  const double error = relative_error(got, loop);
  const bool same = same_bits(got, again), routed = expect_grouped < 0 || grouped == expect_grouped;
  results.record(error <= tolerance<T>() && same && routed,
                 "grouped_gemm<" + type_name<T>() + "," + type_name<C>() + "> " + what + " ta=" + std::to_string(ta) +
                     " tb=" + std::to_string(tb) + " accumulate=" + std::to_string(accumulate) + " pad=" +
                     std::to_string(pad) + ": " + std::to_string(grouped) + " of " + std::to_string(groups) +
                     " groups in the grouped call" + (routed ? "" : " (expected " + std::to_string(expect_grouped) + ")") +
                     ", against the gemm loop " + format("%.3g", error) + (same ? ", same bits twice" : ", DIFFERENT bits twice"));
}

// Groups with m, n, k > 0: what the grouped call takes when every block is aligned.
index_t nonempty_groups(const std::vector<index_t>& m, const std::vector<index_t>& n, const std::vector<index_t>& k) {
  index_t count = 0;
  for (std::size_t g = 0; g < m.size(); ++g) count += m[g] > 0 && n[g] > 0 && k[g] > 0;
  return count;
}

// The experts' GEMMs (layers/moe/experts.hpp) at hidden 64, ffn 48 (swiglu: fc1 has 96 rows) over 8
// local experts with uneven rows (two experts get none), then an evenly balanced routing (one cuBLAS
// group of 8), then groups of mixed sizes with an empty inner dimension.
template <class T>
void check_grouped_against_loop(backend& device, suite& results) {
  using A = accumulate_t<T>;
  const index_t hidden = 64, ffn = 48, fc1 = 2 * ffn;
  const std::vector<index_t> uneven = {37, 0, 130, 1, 64, 0, 12, 200}, balanced(8, 64);
  const auto constant = [](index_t value, std::size_t count) { return std::vector<index_t>(count, value); };
  for (const auto& rows : {uneven, balanced}) {
    const std::string routing = rows == uneven ? "uneven rows" : "balanced rows";
    const std::size_t experts = rows.size();
    for (bool accumulate : {false, true}) {
      // fc1 forward: pre[rows, fc1] = x[rows, hidden] fc1^T
      const auto h = constant(hidden, experts), f = constant(fc1, experts), a = constant(ffn, experts);
      check_grouped_equals_loop<T>(device, results, "fc1 forward, " + routing, false, true, accumulate, rows, f, h, 0,
                                   nonempty_groups(rows, f, h));
      // da[rows, ffn] = dy[rows, hidden] fc2[hidden, ffn]
      check_grouped_equals_loop<T>(device, results, "da, " + routing, false, false, accumulate, rows, a, h, 0,
                                   nonempty_groups(rows, a, h));
      // dfc1[fc1, hidden] (+)= dpre[rows, fc1]^T x[rows, hidden]: empty experts have k = 0
      check_grouped_equals_loop<T>(device, results, "dfc1, " + routing, true, false, accumulate, f, h, rows, 0,
                                   nonempty_groups(f, h, rows));
      if constexpr (!std::is_same_v<A, T>)  // the fp32 weight gradient: never grouped (no bf16 -> fp32 row in cuBLAS's table)
        check_grouped_equals_loop<T, A>(device, results, "dfc1 fp32, " + routing, true, false, accumulate, f, h, rows, 0, 0);
    }
  }
  const std::vector<index_t> m = {5, 0, 17, 3, 24, 8, 8}, n = {16, 16, 8, 16, 8, 8, 8}, k = {8, 8, 0, 32, 16, 16, 16};
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool accumulate : {false, true}) {
        check_grouped_equals_loop<T>(device, results, "mixed sizes", ta, tb, accumulate, m, n, k, 0, nonempty_groups(m, n, k));
        check_grouped_equals_loop<T>(device, results, "mixed sizes, misaligned", ta, tb, accumulate, m, n, k, 1, -1);
      }
}

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Once warm, grouped_gemm returns while the GPU is still busy with earlier work (it never waits for the
// stream) and takes its pointer table from the caching allocator without a cudaMalloc.
void check_grouped_gemm_enqueues(backend& device, suite& results) {
  const std::vector<index_t> rows = {37, 0, 130, 1, 64, 0, 12, 200}, n(8, 96), k(8, 64);
  const index_t total = std::accumulate(rows.begin(), rows.end(), index_t{0});
  device_vector<bf16> x(static_cast<std::size_t>(total * 64)), w(static_cast<std::size_t>(8 * 96 * 64)),
      y(static_cast<std::size_t>(total * 96));
  std::vector<const bf16*> pa, pb;
  std::vector<bf16*> pc;
  index_t at = 0;
  for (std::size_t g = 0; g < rows.size(); ++g) {
    pa.push_back(x.data() + at * 64), pb.push_back(w.data() + static_cast<index_t>(g) * 96 * 64), pc.push_back(y.data() + at * 96);
    at += rows[g];
  }
  device.fill<bf16>(x.data(), total * 64, 0.5);
  device.fill<bf16>(w.data(), 8 * 96 * 64, 0.25);
  const auto call = [&] {
    device.grouped_gemm<bf16>(false, true, 8, rows.data(), n.data(), k.data(), pa.data(), pb.data(), pc.data(), false);
  };
  call(), call();
  device.synchronize();
  const auto mallocs = device.memory_stats().malloc_calls;
  spin_kernel<<<1, 1, 0, device.stream()>>>(2'000'000'000LL);  // about a second
  call();
  const bool busy = cudaStreamQuery(device.stream()) == cudaErrorNotReady;
  device.synchronize();
  const bool no_malloc = device.memory_stats().malloc_calls == mallocs;
  const auto grouped = strata::cuda::groups_in_grouped_call<bf16>(8, rows.data(), n.data(), k.data(), pa.data(), pb.data(),
                                                                  pc.data()).size();
  results.record(busy && no_malloc && grouped == 6,
                 std::string("grouped_gemm<bf16> enqueues only: ") + (busy ? "returned while the stream was busy" : "WAITED for the stream") +
                     (no_malloc ? ", no cudaMalloc once warm" : ", CALLED cudaMalloc once warm") + ", " +
                     std::to_string(grouped) + " of 8 groups in the grouped call");
}

template <class A>
void check_router(backend& device, suite& results, MoeRouting routing, bool bias, const std::string& what) {
  const index_t tokens = 300, experts = 16, k = 4, groups = 3;
  host_rng rng(5);
  auto logits = rng.template uniform<A>(static_cast<std::size_t>(tokens * experts), -3, 3);
  auto expert_bias = rng.template uniform<A>(static_cast<std::size_t>(experts), -0.5, 0.5);
  auto dweights = rng.template uniform<A>(static_cast<std::size_t>(tokens * k));
  auto coefficients = rng.template uniform<A>(static_cast<std::size_t>(groups * experts));
  std::vector<std::int32_t> idx(static_cast<std::size_t>(tokens * k));
  std::vector<A> w(idx.size()), aux(logits.size()), lse(static_cast<std::size_t>(tokens)), dlogits(logits.size());
  cpu::moe_router_forward<A>(logits.data(), tokens, experts, k, routing, bias ? expert_bias.data() : nullptr, idx.data(),
                             w.data(), aux.data(), lse.data());
  cpu::moe_router_backward<A>(logits.data(), tokens, experts, k, routing, idx.data(), dweights.data(), coefficients.data(),
                              groups, 0.5, 0.01, dlogits.data());
  device_vector<A> d_logits(logits.size()), d_bias(expert_bias.size()), d_w(w.size()), d_aux(aux.size()), d_lse(lse.size()),
      d_dweights(dweights.size()), d_coefficients(coefficients.size()), d_dlogits(logits.size());
  device_vector<std::int32_t> d_idx(idx.size());
  upload(device, logits, d_logits), upload(device, expert_bias, d_bias), upload(device, dweights, d_dweights);
  upload(device, coefficients, d_coefficients);
  device.moe_router_forward<A>(d_logits.data(), tokens, experts, k, routing, bias ? d_bias.data() : nullptr, d_idx.data(),
                               d_w.data(), d_aux.data(), d_lse.data());
  device.moe_router_backward<A>(d_logits.data(), tokens, experts, k, routing, d_idx.data(), d_dweights.data(),
                                d_coefficients.data(), groups, 0.5, 0.01, d_dlogits.data());
  const bool same_choice = to_host(device, d_idx) == idx;
  const double error = std::max({relative_error(to_host(device, d_w), w), relative_error(to_host(device, d_aux), aux),
                                 relative_error(to_host(device, d_lse), lse), relative_error(to_host(device, d_dlogits), dlogits)});
  results.record(same_choice && error <= tolerance<A>(),
                 "router<" + type_name<A>() + "> " + what + (same_choice ? " same experts" : " DIFFERENT experts") +
                     ", weights/scores/lse/dlogits error " + format("%.3g", error));
}

// moe_count (several groups, accumulating into non-zero counts, int and float) and
// moe_sort_by_expert (no capacity) over many tiles of assignments, some dropped: the same integers
// as the CPU twins.
void check_count_and_sort_many(backend& device, suite& results) {
  const index_t tokens = 3001, experts = 16, k = 2, n = tokens * k, groups = 4, first = 3, local = 8;
  host_rng rng(11);
  auto routed = rng.integers(static_cast<std::size_t>(n), 0, experts - 1);
  for (index_t a = 0; a < n; a += 7) routed[static_cast<std::size_t>(a)] = -1;  // dropped choices
  std::vector<std::int32_t> counts(static_cast<std::size_t>(groups * experts));
  std::vector<float> fcounts(counts.size());
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = static_cast<std::int32_t>(i), fcounts[i] = 0.5f * static_cast<float>(i);
  device_vector<std::int32_t> g_routed(routed.size()), g_counts(counts.size());
  device_vector<float> g_fcounts(fcounts.size());
  upload(device, routed, g_routed), upload(device, counts, g_counts), upload(device, fcounts, g_fcounts);
  cpu::moe_count<std::int32_t>(routed.data(), n, k, groups, experts, counts.data(), true);
  cpu::moe_count<float>(routed.data(), n, k, groups, experts, fcounts.data(), true);
  device.moe_count<std::int32_t>(g_routed.data(), n, k, groups, experts, g_counts.data(), true);
  device.moe_count<float>(g_routed.data(), n, k, groups, experts, g_fcounts.data(), true);
  index_t slots = 0;
  for (index_t a = 0; a < n; ++a) slots += routed[static_cast<std::size_t>(a)] >= first && routed[static_cast<std::size_t>(a)] < first + local;
  std::vector<std::int32_t> slot_of(static_cast<std::size_t>(n)), token_of(static_cast<std::size_t>(slots));
  cpu::moe_sort_by_expert(routed.data(), n, k, first, local, 0, slot_of.data(), token_of.data(), slots);
  device_vector<std::int32_t> g_slot(slot_of.size()), g_token(token_of.size());
  device.moe_sort_by_expert(g_routed.data(), n, k, first, local, 0, g_slot.data(), g_token.data(), slots);
  const bool same = to_host(device, g_counts) == counts && to_host(device, g_fcounts) == fcounts &&
                    to_host(device, g_slot) == slot_of && to_host(device, g_token) == token_of;
  results.record(same, std::string("moe_count (4 groups, accumulating, int and float) and moe_sort_by_expert over 6002 "
                                   "assignments: ") + (same ? "the CPU twins' integers" : "DIFFERENT from the CPU twins"));

  // The same assignments from the second on: an array that is not 16-byte aligned (the kernels read
  // one assignment at a time instead of four), one group (moe_count's path without the group test).
  const index_t m = n - 1;
  const std::int32_t* tail = routed.data() + 1;
  std::vector<std::int32_t> counts1(static_cast<std::size_t>(experts));
  cpu::moe_count<std::int32_t>(tail, m, k, 1, experts, counts1.data(), false);
  device_vector<std::int32_t> g_counts1(counts1.size());
  device.moe_count<std::int32_t>(g_routed.data() + 1, m, k, 1, experts, g_counts1.data(), false);
  index_t slots1 = 0;
  for (index_t a = 0; a < m; ++a) slots1 += tail[a] >= first && tail[a] < first + local;
  std::vector<std::int32_t> slot1(static_cast<std::size_t>(m)), token1(static_cast<std::size_t>(slots1));
  cpu::moe_sort_by_expert(tail, m, k, first, local, 0, slot1.data(), token1.data(), slots1);
  device_vector<std::int32_t> g_slot1(slot1.size()), g_token1(token1.size());
  device.moe_sort_by_expert(g_routed.data() + 1, m, k, first, local, 0, g_slot1.data(), g_token1.data(), slots1);
  const bool same1 = to_host(device, g_counts1) == counts1 && to_host(device, g_slot1) == slot1 &&
                     to_host(device, g_token1) == token1;
  results.record(same1, std::string("moe_count (1 group) and moe_sort_by_expert over 6001 assignments not 16-byte "
                                    "aligned: ") + (same1 ? "the CPU twins' integers" : "DIFFERENT from the CPU twins"));
}

// moe_chunk_maps (the compacted padded exchange's row maps) against the CPU twin: chunk counts from
// 0 to the capacity (empty and full chunks among them), 8 sources x 3 local experts and 1 x 1.
void check_chunk_maps(backend& device, suite& results, index_t chunks, index_t local, index_t capacity) {
  host_rng rng(static_cast<std::uint64_t>(chunks * 100 + local));
  auto counts = rng.integers(static_cast<std::size_t>(chunks * local), 0, static_cast<std::int32_t>(capacity));
  if (counts.size() > 2) counts[0] = 0, counts[1] = static_cast<std::int32_t>(capacity);
  const auto rows = static_cast<std::size_t>(chunks * local * capacity);
  std::vector<std::int32_t> to_expert(rows), to_chunk(rows), per_expert(static_cast<std::size_t>(local));
  cpu::moe_chunk_maps(counts.data(), chunks, local, capacity, to_expert.data(), to_chunk.data(), per_expert.data());
  device_vector<std::int32_t> g_counts(counts.size()), g_to_expert(rows), g_to_chunk(rows), g_per_expert(per_expert.size());
  upload(device, counts, g_counts);
  device.moe_chunk_maps(g_counts.data(), chunks, local, capacity, g_to_expert.data(), g_to_chunk.data(), g_per_expert.data());
  const bool same = to_host(device, g_to_expert) == to_expert && to_host(device, g_to_chunk) == to_chunk &&
                    to_host(device, g_per_expert) == per_expert;
  results.record(same, "moe_chunk_maps " + std::to_string(chunks) + " sources x " + std::to_string(local) + " experts x " +
                           std::to_string(capacity) + " rows: " + (same ? "the CPU twin's integers" : "DIFFERENT from the CPU twin"));
}

// moe_drop against its CPU twin: n assignments over several of the kernel's shared-memory tiles
// (the last one partial), one in experts + 1 unrouted (-1), weights drawn from eight values so many tie
// (ties go to the earlier position), both policies, and capacities from none kept to all kept.
template <class A>
void check_drop(backend& device, suite& results, index_t n, index_t experts, index_t capacity, bool by_position) {
  host_rng rng(static_cast<std::uint64_t>(n * 31 + capacity * 7 + (by_position ? 1 : 0)));
  auto idx = rng.integers(static_cast<std::size_t>(n), -1, static_cast<int>(experts) - 1);
  auto w = rng.template uniform<A>(static_cast<std::size_t>(n), 0, 1);
  for (auto& v : w) v = static_cast<A>(std::floor(static_cast<double>(v) * 8) / 8);  // ties
  std::vector<std::int32_t> routed(static_cast<std::size_t>(n));
  cpu::moe_drop<A>(idx.data(), w.data(), n, capacity, by_position, routed.data());
  device_vector<std::int32_t> g_idx(idx.size()), g_routed(routed.size());
  device_vector<A> g_w(w.size());
  upload(device, idx, g_idx), upload(device, w, g_w);
  device.moe_drop<A>(g_idx.data(), g_w.data(), n, capacity, by_position, g_routed.data());
  const auto got = to_host(device, g_routed);
  const auto kept = std::count_if(routed.begin(), routed.end(), [](std::int32_t e) { return e >= 0; });
  results.record(got == routed, "moe_drop<" + type_name<A>() + "> " + std::to_string(n) + " assignments, " +
                                    std::to_string(experts) + " experts, capacity " + std::to_string(capacity) +
                                    (by_position ? " by position" : " by probability") + ", " + std::to_string(kept) +
                                    " kept: " + (got == routed ? "the CPU twin's integers" : "DIFFERENT from the CPU twin"));
}

template <class T>
void check_permutation(backend& device, suite& results, bool by_position, index_t capacity_padding) {
  using A = accumulate_t<T>;
  const index_t tokens = 200, experts = 8, k = 2, cols = 37, n = tokens * k;
  host_rng rng(by_position ? 3 : 4);
  auto idx = rng.integers(static_cast<std::size_t>(n), 0, experts - 1);
  for (index_t x = 0; x < tokens; ++x)
    if (idx[x * k] == idx[x * k + 1]) idx[x * k + 1] = (idx[x * k] + 1) % experts;
  auto w = rng.template uniform<A>(static_cast<std::size_t>(n), 0, 1);
  const index_t capacity = 40;
  std::vector<std::int32_t> routed(static_cast<std::size_t>(n)), counts(static_cast<std::size_t>(experts));
  cpu::moe_drop<A>(idx.data(), w.data(), n, capacity, by_position, routed.data());
  cpu::moe_count<std::int32_t>(routed.data(), n, k, 1, experts, counts.data(), false);
  // the local experts [2, 6)
  const index_t first = 2, local = 4, pad = capacity_padding;
  index_t slots = 0;
  for (index_t e = first; e < first + local; ++e) slots += pad > 0 ? pad : counts[e];
  std::vector<std::int32_t> slot_of(static_cast<std::size_t>(n)), token_of(static_cast<std::size_t>(slots));
  cpu::moe_sort_by_expert(routed.data(), n, k, first, local, pad, slot_of.data(), token_of.data(), slots);
  auto x = rng.template uniform<T>(static_cast<std::size_t>(tokens * cols));
  auto dy = rng.template uniform<T>(static_cast<std::size_t>(tokens * cols));
  std::vector<T> gathered(static_cast<std::size_t>(slots * cols)), combined(x.size()), d_in(gathered.size());
  std::vector<A> dw(static_cast<std::size_t>(n));
  cpu::moe_gather_rows<T>(x.data(), cols, token_of.data(), slots, gathered.data());
  cpu::moe_combine<T>(gathered.data(), slot_of.data(), w.data(), tokens, k, cols, combined.data());
  cpu::moe_combine_backward<T>(dy.data(), gathered.data(), slot_of.data(), w.data(), tokens, k, cols, slots, d_in.data(),
                               dw.data());

  device_vector<std::int32_t> g_idx(idx.size()), g_routed(routed.size()), g_counts(counts.size()), g_slot(slot_of.size()),
      g_token(token_of.size() + 1);
  device_vector<A> g_w(w.size()), g_dw(dw.size());
  device_vector<T> g_x(x.size()), g_dy(dy.size()), g_gathered(gathered.size() + 1), g_combined(x.size()), g_din(d_in.size() + 1);
  upload(device, idx, g_idx), upload(device, w, g_w), upload(device, x, g_x), upload(device, dy, g_dy);
  device.moe_drop<A>(g_idx.data(), g_w.data(), n, capacity, by_position, g_routed.data());
  device.moe_count<std::int32_t>(g_routed.data(), n, k, 1, experts, g_counts.data(), false);
  device.moe_sort_by_expert(g_routed.data(), n, k, first, local, pad, g_slot.data(), g_token.data(), slots);
  device.moe_gather_rows<T>(g_x.data(), cols, g_token.data(), slots, g_gathered.data());
  device.moe_combine<T>(g_gathered.data(), g_slot.data(), g_w.data(), tokens, k, cols, g_combined.data());
  device.moe_combine_backward<T>(g_dy.data(), g_gathered.data(), g_slot.data(), g_w.data(), tokens, k, cols, slots,
                                 g_din.data(), g_dw.data());
  auto token_got = to_host(device, g_token);
  token_got.pop_back();
  const bool same_ints = to_host(device, g_routed) == routed && to_host(device, g_counts) == counts &&
                         to_host(device, g_slot) == slot_of && token_got == token_of;
  auto gathered_got = to_host(device, g_gathered), din_got = to_host(device, g_din);
  gathered_got.pop_back(), din_got.pop_back();
  const double error = std::max({relative_error(gathered_got, gathered), relative_error(to_host(device, g_combined), combined),
                                 relative_error(din_got, d_in), relative_error(to_host(device, g_dw), dw)});
  results.record(same_ints && error <= tolerance<T>(),
                 "drop/count/sort/gather/combine<" + type_name<T>() + "> " + (by_position ? "by position" : "by probability") +
                     (pad > 0 ? " padded" : " packed") + (same_ints ? " same slots" : " DIFFERENT slots") + ", error " +
                     format("%.3g", error));
}

template <class A>
void check_losses(backend& device, suite& results) {
  host_rng rng(9);
  const index_t n = 24;
  auto p = rng.template uniform<A>(n, 0, 5), c = rng.template uniform<A>(n, 0, 50), bias = rng.template uniform<A>(n);
  std::vector<double> loss{0.25};
  std::vector<A> coefficients(n), bias_cpu = bias;
  cpu::moe_aux_loss<A>(p.data(), c.data(), n, 0.01, loss.data(), coefficients.data());
  cpu::moe_expert_bias_update<A>(c.data(), n, 1e-3, bias_cpu.data());
  device_vector<A> g_p(n), g_c(n), g_coefficients(n), g_bias(n);
  device_vector<double> g_loss(1);
  upload(device, p, g_p), upload(device, c, g_c), upload(device, bias, g_bias), upload(device, std::vector<double>{0.25}, g_loss);
  device.moe_aux_loss<A>(g_p.data(), g_c.data(), n, 0.01, g_loss.data(), g_coefficients.data());
  device.moe_expert_bias_update<A>(g_c.data(), n, 1e-3, g_bias.data());
  const double error = std::max({relative_error(to_host(device, g_loss), loss),
                                 relative_error(to_host(device, g_coefficients), coefficients),
                                 relative_error(to_host(device, g_bias), bias_cpu)});
  results.record(error <= tolerance<A>(), "aux_loss/expert_bias_update<" + type_name<A>() + "> error " + format("%.3g", error));
}

}  // namespace

int main() {
  try {
    backend device(0);
    suite results("moe");
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        check_grouped_gemm<float>(device, results, ta, tb, false);
        check_grouped_gemm<double>(device, results, ta, tb, true);
        check_grouped_gemm<bf16>(device, results, ta, tb, false);
      }
    check_grouped_gemm<bf16, float>(device, results, true, false, true);  // expert weight gradients
    check_grouped_against_loop<bf16>(device, results);
    check_grouped_against_loop<float>(device, results);
    check_grouped_gemm_enqueues(device, results);
    for (bool bias : {false, true}) {
      check_router<double>(device, results, MoeRouting{MoeScore::softmax, false, 1.0}, bias, "softmax after top-k");
      check_router<double>(device, results, MoeRouting{MoeScore::softmax, true, 1.0}, bias, "softmax before top-k");
      check_router<double>(device, results, MoeRouting{MoeScore::sigmoid, false, 2.5}, bias, "sigmoid scaled");
      check_router<float>(device, results, MoeRouting{MoeScore::softmax, false, 1.0}, bias, "softmax after top-k");
      check_router<float>(device, results, MoeRouting{MoeScore::sigmoid, false, 1.0}, bias, "sigmoid");
    }
    for (bool by_position : {false, true})
      for (index_t pad : {index_t{0}, index_t{40}}) {
        check_permutation<double>(device, results, by_position, pad);
        check_permutation<float>(device, results, by_position, pad);
        check_permutation<bf16>(device, results, by_position, pad);
      }
    check_count_and_sort_many(device, results);
    for (bool by_position : {false, true}) {
      for (index_t capacity : {0, 1, 37, 400, 5000}) check_drop<float>(device, results, 3001, 8, capacity, by_position);
      check_drop<double>(device, results, 2049, 5, 300, by_position);
      check_drop<float>(device, results, 16384, 8, 2048, by_position);
    }
    check_chunk_maps(device, results, 8, 3, 257);
    check_chunk_maps(device, results, 1, 1, 5);
    check_chunk_maps(device, results, 4, 16, 1024);
    check_losses<double>(device, results);
    check_losses<float>(device, results);
    return results.finish();
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    return 1;
  }
}
