// tests/gpu/test_moe.cu: the mixture-of-experts entry points of cuda::backend against their CPU
// twins (backend/cpu/moe.hpp) on random inputs: grouped_gemm (every transpose pair the experts use,
// float / double / bf16, groups with no rows, accumulation into fp32), the router forward and
// backward (softmax before / after top-k, sigmoid, expert bias), capacity dropping by probability
// and by position, counting, the sort by expert (packed and padded to capacity), gathering rows,
// combine and its backward, the aux loss and the expert-bias update. Integer outputs must match
// exactly; values within the tolerance of their type (check.hpp).
#include <cstring>
#include <string>
#include <vector>

#include <strata/backend/cpu/backend.hpp>

#include "check.hpp"

using namespace gpu_test;
using strata::cuda::backend;
using strata::MoeRouting;
using strata::MoeScore;
using cpu = strata::cpu::backend;

namespace {

template <class T>
std::vector<T> to_host(backend& device, const device_vector<T>& d) {
  std::vector<T> out(d.size());
  device.copy_to_host(d.data(), static_cast<index_t>(d.size()), out.data());
  return out;
}
template <class T>
void upload(backend& device, const std::vector<T>& h, device_vector<T>& d) {
  device.copy_from_host(h.data(), static_cast<index_t>(h.size()), d.data());
}

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
    check_losses<double>(device, results);
    check_losses<float>(device, results);
    return results.finish();
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    return 1;
  }
}
