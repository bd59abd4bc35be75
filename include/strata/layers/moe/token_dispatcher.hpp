// strata/layers/moe/token_dispatcher.hpp: moving each rank's routed tokens to the ranks that hold
// their experts and back (Megatron-Core's MoEAllGatherTokenDispatcher and
// MoEAlltoAllTokenDispatcher), over the expert-parallel group (ep) with expert tensor parallelism
// (etp). Rank (etp_i, ep_i) holds the experts [ep_i * E/ep, (ep_i + 1) * E/ep), each split over etp.
//
//   dispatch(hidden [T, h], routed [T, k], weights [T, k])  -> the local experts' input [rows, h],
//        grouped by local expert, and the rows of each local expert (counts, in the backend's memory)
//        for the grouped GEMMs
//   combine(expert output [rows, h], partial over etp)      -> y [T, h] = sum_j weights[x, j] *
//        output of token x's j-th expert (dropped choices add nothing)
//   combine_backward(dy [T, h])                             -> d expert output [rows, h], dweights [T, k]
//   dispatch_backward(d expert input [rows, h], partial over etp) -> d hidden [T, h]
//
// AllGatherDispatcher: all-gather tokens, choices and weights over the etp x ep group; each rank
//   sorts the gathered tokens of its local experts; combine weighs and sums them per gathered token
//   and reduce-scatters back (which also sums the partial outputs of the etp ranks).
// AllToAllDispatcher: sort this rank's tokens by expert; exchange the per-expert counts over ep
//   (all_to_all) and all-gather them over etp on the device, read them on the host once (the copy
//   started before the rows are permuted by expert, its wait after, so the GPU permutes while the
//   host waits); then the
//   tokens (all_to_all over ep, all-gather over etp); sort the chunks
//   (etp source, ep source, local expert) into local-expert order. combine runs it backwards:
//   unsort, reduce-scatter over etp, all_to_all back, then weigh and sum per token.
//
// On one rank of the etp x ep group the experts' input has the upper bound of T x k rows (the routed
// ones first, grouped by expert; the rest, what capacity dropped, zero and in no group), and nothing
// is read on the host where the experts' grouped GEMMs read the counts on the device (dispatch's
// `device_counts`). Experts that need them on the host (biases, FP8, a backend without device-count
// grouped GEMMs) get them read by the dispatch, started as soon as they are counted and waited for
// after the permutation and `beside`, so the GPU permutes (and computes `beside`) while the host
// waits, instead of a read inside the experts' forward after all of it. Over several ranks the
// sizes of the collectives are read on the host, as in Megatron: once per dispatch by the all-to-all
// dispatcher (its counts exchanged on the device first), twice by the all-gather one (the ranks'
// token counts, then the experts'). With padding to capacity every expert receives exactly its
// capacity from every rank (the router's `capacity`), padded with zero rows. Where the counts are
// on the host (read for the exchanges, or the padded capacity) the dispatch hands them on
// (Dispatched::host_counts), so experts that need them there (biases, FP8) read nothing more.
//
// dispatch's last argument, `beside` (a callable, default none), is work that does not depend on the
// dispatch: it is run once per dispatch, after the rows are permuted and before the wait for the
// counts where there is one, so the GPU computes it while the host waits (MoeMlp passes its shared
// experts' forward). Both dispatchers run it on every path, so the collectives inside it come in
// the same order on every rank.
#pragma once

#include <cstdint>
#include <numeric>
#include <utility>
#include <variant>
#include <vector>

#include "../../backend/backend.hpp"
#include "../policy.hpp"

STRATA_NAMESPACE_BEGIN

struct DispatcherConfig {
  index_t hidden_size = 0;
  index_t num_experts = 0;
  index_t topk = 1;
  MoeDispatcherType type = MoeDispatcherType::alltoall;  // ConfiguredDispatcher's choice; the others ignore it
};

namespace detail {

// A backend with the row maps of a compacted padded exchange (moe_chunk_maps; cpu and cuda backends).
template <class Device>
concept has_moe_chunk_maps = requires(Device& d, const std::int32_t* c, std::int32_t* m, index_t n) {
  d.moe_chunk_maps(c, n, n, n, m, m, m);
};

// A copy of device counts to the host started now and finished by finish_host_copies (the backend's
// copy_to_host_start / wait_host_copies, so the GPU goes on with the work enqueued in between), or
// made at once by a backend without them.
template <class Device, class X>
void start_host_copy(Device& device, const X* src, index_t n, X* host) {
  if constexpr (requires { device.template copy_to_host_start<X>(src, n, host); }) device.template copy_to_host_start<X>(src, n, host);
  else device.template copy_to_host<X>(src, n, host);
}
template <class Device>
void finish_host_copies(Device& device) {
  if constexpr (requires { device.wait_host_copies(); }) device.wait_host_copies();
}

// dispatch's default `beside`: nothing.
struct NothingBeside {
  void operator()() const {}
};

inline std::vector<std::size_t> times(const std::vector<index_t>& counts, index_t factor) {
  std::vector<std::size_t> out(counts.size());
  for (std::size_t i = 0; i < counts.size(); ++i) out[i] = static_cast<std::size_t>(counts[i] * factor);
  return out;
}

// A tensor's buffer as a read-only span of its space (what collectives take as input).
template <class X, class Space>
span_t<const X, Space> read_only(const Tensor<X, Space>& t) {
  return t.buffer();
}

template <class Context>
index_t local_experts(const Context& ctx, const DispatcherConfig& c, const char* who) {
  if (c.num_experts % ctx.ep.size() != 0)
    fail<ConfigError>(who, ": ep=", ctx.ep.size(), " does not divide num_experts=", c.num_experts,
                      "; each expert-parallel rank holds num_experts / ep whole experts.");
  return c.num_experts / ctx.ep.size();
}

}  // namespace detail

template <class Policy>
class AllGatherDispatcher {
 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  static_assert(check_moe_backend<typename Policy::backend>());

  struct Dispatched {
    Tensor<T, Space> tokens;             // [rows, hidden], grouped by local expert
    Tensor<std::int32_t, Space> counts;  // [local experts] rows of each (in the backend's memory)
    // The same on the host where the dispatch knows them without a read of its own (padded to
    // capacity, or read for its exchanges); empty where they stay on the device alone
    std::vector<index_t> host_counts;
  };
  struct State {
    std::vector<index_t> tokens_of_rank;     // tokens of each rank of the etp x ep group
    Tensor<std::int32_t, Space> slot_of;     // [N, k] slot of each gathered assignment here, or -1
    Tensor<A, Space> weights;                // [N, k] gathered weights
    Tensor<T, Space> expert_output;          // [rows, hidden], set by combine
    index_t gathered = 0, rows = 0, tokens = 0;
  };

  AllGatherDispatcher(const Context& ctx, DispatcherConfig c)
      : config_(c), local_(detail::local_experts(ctx, c, "AllGatherDispatcher")) {}

  template <class Beside = detail::NothingBeside>
  std::pair<Dispatched, State> dispatch(Context& ctx, const Tensor<T, Space>& hidden, const Tensor<std::int32_t, Space>& routed,
                                        const Tensor<A, Space>& weights, index_t capacity = 0, bool device_counts = false,
                                        const Beside& beside = Beside{}) const {
    const index_t h = config_.hidden_size, k = config_.topk, E = config_.num_experts;
    auto& group = ctx.expert_tp_ep;
    State state;
    state.tokens = hidden.shape().numel() / h;
    if (group.size() == 1) {
      state.tokens_of_rank = {state.tokens};
    } else {  // tokens of every rank
      std::vector<std::int64_t> mine{state.tokens}, all(static_cast<std::size_t>(group.size()));
      auto in = Tensor<std::int64_t, Space>::empty(Shape{1}), out = Tensor<std::int64_t, Space>::empty(Shape{group.size()});
      ctx.device.template copy_from_host<std::int64_t>(mine.data(), 1, in.data());
      group.all_gather(detail::read_only(in), out.buffer());
      ctx.device.template copy_to_host<std::int64_t>(out.data(), group.size(), all.data());
      state.tokens_of_rank.assign(all.begin(), all.end());
    }
    state.gathered = std::accumulate(state.tokens_of_rank.begin(), state.tokens_of_rank.end(), index_t{0});
    const index_t n = state.gathered;
    Tensor<T, Space> all_hidden = hidden;  // one rank: its own tensors, shared
    Tensor<std::int32_t, Space> all_routed = routed;
    state.weights = weights;
    if (group.size() > 1) {
      all_hidden = Tensor<T, Space>::empty(Shape{n, h});
      all_routed = Tensor<std::int32_t, Space>::empty(Shape{n, k});
      state.weights = Tensor<A, Space>::empty(Shape{n, k});
      group.all_gather_v(hidden.buffer(), all_hidden.buffer(), detail::times(state.tokens_of_rank, h));
      group.all_gather_v(routed.buffer(), all_routed.buffer(), detail::times(state.tokens_of_rank, k));
      group.all_gather_v(weights.buffer(), state.weights.buffer(), detail::times(state.tokens_of_rank, k));
    }

    const index_t first = ctx.ep.rank() * local_;
    Dispatched out;
    bool beside_done = false;
    std::vector<std::int32_t> alone_host;  // one rank, experts without device counts: read beside the sort
    out.counts = Tensor<std::int32_t, Space>::empty(Shape{local_});
    if (capacity > 0) {
      ctx.device.template fill<std::int32_t>(out.counts.data(), local_, static_cast<double>(capacity * group.size()));
      state.rows = local_ * capacity * group.size();
      out.host_counts.assign(static_cast<std::size_t>(local_), capacity * group.size());
    } else {
      auto counts = Tensor<std::int32_t, Space>::empty(Shape{E});
      ctx.device.template moe_count<std::int32_t>(all_routed.data(), n * k, k, 1, E, counts.data(), false);
      ctx.device.template copy<std::int32_t>(counts.data() + first, local_, out.counts.data());
      if (group.size() == 1) {
        state.rows = n * k;  // every routed assignment is local: the upper bound
        if (!device_counts) {
          alone_host.resize(static_cast<std::size_t>(local_));
          detail::start_host_copy(ctx.device, out.counts.data(), local_, alone_host.data());
        }
      } else {  // the counts' read started, `beside` enqueued, then the wait
        std::vector<std::int32_t> host(static_cast<std::size_t>(local_));
        detail::start_host_copy(ctx.device, out.counts.data(), local_, host.data());
        beside();
        beside_done = true;
        detail::finish_host_copies(ctx.device);
        state.rows = std::accumulate(host.begin(), host.end(), index_t{0});
        out.host_counts.assign(host.begin(), host.end());
      }
    }
    state.slot_of = Tensor<std::int32_t, Space>::empty(Shape{n, k});
    auto token_of_slot = Tensor<std::int32_t, Space>::empty(Shape{state.rows});
    ctx.device.moe_sort_by_expert(all_routed.data(), n * k, k, first, local_, capacity * group.size(), state.slot_of.data(),
                                  token_of_slot.data(), state.rows);
    out.tokens = Tensor<T, Space>::empty(Shape{state.rows, h});
    ctx.device.template moe_gather_rows<T>(all_hidden.data(), h, token_of_slot.data(), state.rows, out.tokens.data());
    if (!beside_done) beside();
    if (!alone_host.empty()) {
      detail::finish_host_copies(ctx.device);
      out.host_counts.assign(alone_host.begin(), alone_host.end());
    }
    return {std::move(out), std::move(state)};
  }

  Tensor<T, Space> combine(Context& ctx, State& state, const Tensor<T, Space>& expert_output) const {
    const index_t h = config_.hidden_size;
    state.expert_output = expert_output;
    auto all = Tensor<T, Space>::empty(Shape{state.gathered, h});
    ctx.device.template moe_combine<T, A>(expert_output.data(), state.slot_of.data(), state.weights.data(), state.gathered,
                                          config_.topk, h, all.data());
    return scatter_back(ctx, state, std::move(all), h);
  }

  std::pair<Tensor<T, Space>, Tensor<A, Space>> combine_backward(Context& ctx, const State& state,
                                                                 const Tensor<T, Space>& dy) const {
    const index_t h = config_.hidden_size, k = config_.topk;
    Tensor<T, Space> all_dy = dy;
    if (ctx.expert_tp_ep.size() > 1) {
      all_dy = Tensor<T, Space>::empty(Shape{state.gathered, h});
      ctx.expert_tp_ep.all_gather_v(dy.buffer(), all_dy.buffer(), detail::times(state.tokens_of_rank, h));
    }
    auto d_output = Tensor<T, Space>::empty(Shape{state.rows, h});
    auto all_dweights = Tensor<A, Space>::empty(Shape{state.gathered, k});
    ctx.device.template moe_combine_backward<T, A>(all_dy.data(), state.expert_output.data(), state.slot_of.data(),
                                                   state.weights.data(), state.gathered, k, h, state.rows, d_output.data(),
                                                   all_dweights.data());
    // partial sums of the experts' ranks
    return {std::move(d_output), scatter_back(ctx, state, std::move(all_dweights), k)};
  }

  Tensor<T, Space> dispatch_backward(Context& ctx, const State& state, const Tensor<T, Space>& d_input) const {
    const index_t h = config_.hidden_size;
    auto all = Tensor<T, Space>::empty(Shape{state.gathered, h});
    ctx.device.template moe_combine<T, A>(d_input.data(), state.slot_of.data(), nullptr, state.gathered, config_.topk, h,
                                          all.data());
    return scatter_back(ctx, state, std::move(all), h);
  }

  index_t local_experts() const { return local_; }

 private:
  // The gathered tokens' rows [N, cols] summed over the etp x ep group and scattered back to their
  // ranks (on one rank: the rows themselves).
  template <class X>
  static Tensor<X, Space> scatter_back(Context& ctx, const State& state, Tensor<X, Space> all, index_t cols) {
    if (ctx.expert_tp_ep.size() == 1) return all;
    auto y = Tensor<X, Space>::empty(Shape{state.tokens, cols});
    ctx.expert_tp_ep.reduce_scatter_v(detail::read_only(all), y.buffer(), detail::times(state.tokens_of_rank, cols),
                                      ReduceOp::sum);
    return y;
  }

  DispatcherConfig config_;
  index_t local_;
};

template <class Policy>
class AllToAllDispatcher {
 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  static_assert(check_moe_backend<typename Policy::backend>());

  using Dispatched = typename AllGatherDispatcher<Policy>::Dispatched;
  struct State {
    Tensor<std::int32_t, Space> slot_of;  // [T, k] slot of each assignment in the permuted tokens, or -1
    Tensor<A, Space> weights;             // [T, k]
    Tensor<T, Space> combined_output;     // [R, hidden] the experts' output back in permuted order (combine)
    std::vector<index_t> send_rows, recv_rows;  // per ep rank
    std::vector<index_t> etp_rows;              // rows each etp rank received over ep
    // chunk (etp source q, ep source p, local expert l): rows, in (q, p, l) order
    std::vector<index_t> chunk_rows;
    index_t tokens = 0, permuted = 0, rows = 0;
    // Padded to capacity and compacted (dispatch's `device_counts` with capacity): the row maps
    // between the chunk order and the experts' order of the real rows alone (backend
    // moe_chunk_maps), in the backend's memory.
    bool compact = false;
    Tensor<std::int32_t, Space> to_expert, to_chunk;
  };

  AllToAllDispatcher(const Context& ctx, DispatcherConfig c)
      : config_(c), local_(detail::local_experts(ctx, c, "AllToAllDispatcher")) {}

  // device_counts: the experts read the counts in the backend's memory
  // (GroupedExperts::takes_device_counts). Padded to capacity over several ranks (a backend with
  // moe_chunk_maps), the exchange then keeps its fixed sizes and the received rows are compacted on
  // the device into the experts' order of the real rows alone, with the counts left in the
  // backend's memory (no wait for the host), so the experts compute no padding row; on one rank the
  // kept rows are simply sorted packed, as without capacity. Without it the dispatch hands the
  // counts over on the host (Dispatched::host_counts), read beside the permutation where it has to
  // read them.
  template <class Beside = detail::NothingBeside>
  std::pair<Dispatched, State> dispatch(Context& ctx, const Tensor<T, Space>& hidden, const Tensor<std::int32_t, Space>& routed,
                                        const Tensor<A, Space>& weights, index_t capacity = 0, bool device_counts = false,
                                        const Beside& beside = Beside{}) const {
    const index_t h = config_.hidden_size, k = config_.topk, E = config_.num_experts;
    const int ep = ctx.ep.size(), etp = ctx.expert_tp.size();
    State state;
    state.tokens = hidden.shape().numel() / h;
    state.weights = weights;
    // one rank, device counts: the kept rows packed (the dropless layout; capacity has dropped the rest)
    if (ep * etp == 1)
      return dispatch_alone(ctx, std::move(state), hidden, routed, device_counts ? 0 : capacity,
                            !device_counts && capacity == 0, beside);
    if constexpr (detail::has_moe_chunk_maps<typename Context::device_type>) state.compact = device_counts && capacity > 0;
    Tensor<std::int32_t, Space> real_rows;  // compact: the real rows of each chunk, (q, p, l) order
    // The counts: this rank's rows per expert [E], then, for each etp rank q, the rows every ep rank p
    // sends to q's local expert l, in (q, p, l) order [etp x E]. Padded to capacity they are all
    // `capacity`, known here: a fixed-size exchange with no wait. Otherwise they are counted,
    // exchanged on the device (all-to-all over ep, all-gather over etp) and read on the host once.
    std::vector<std::int32_t> host(static_cast<std::size_t>(E + etp * E), static_cast<std::int32_t>(capacity));
    if (capacity == 0 || state.compact) {
      auto counts = Tensor<std::int32_t, Space>::empty(Shape{E});
      ctx.device.template moe_count<std::int32_t>(routed.data(), state.tokens * k, k, 1, E, counts.data(), false);
      Tensor<std::int32_t, Space> received = counts;
      if (ep > 1) {
        received = Tensor<std::int32_t, Space>::empty(Shape{E});
        const std::vector<std::size_t> blocks(static_cast<std::size_t>(ep), static_cast<std::size_t>(local_));
        ctx.ep.all_to_all(detail::read_only(counts), blocks, received.buffer(), blocks);
      }
      Tensor<std::int32_t, Space> chunks = received;
      if (etp > 1) {
        chunks = Tensor<std::int32_t, Space>::empty(Shape{etp * E});
        ctx.expert_tp.all_gather(detail::read_only(received), chunks.buffer());
      }
      if (state.compact) {
        real_rows = chunks;  // the kept rows, which capacity bounds: the exchange's sizes stay `capacity`
      } else {
        auto both = Tensor<std::int32_t, Space>::empty(Shape{E + etp * E});
        ctx.device.template copy<std::int32_t>(counts.data(), E, both.data());
        ctx.device.template copy<std::int32_t>(chunks.data(), etp * E, both.data() + E);
        detail::start_host_copy(ctx.device, both.data(), E + etp * E, host.data());  // read beside the permutation below
      }
    }
    // Permute by expert (so by destination rank) while the counts travel to the host: into the most
    // slots there can be (every assignment kept, or every expert's capacity), kept rows first, the
    // slots past them empty (-1, gathered as zero rows); then the one wait, and the kept rows.
    const index_t slots = capacity > 0 ? E * capacity : state.tokens * k;
    state.slot_of = Tensor<std::int32_t, Space>::empty(Shape{state.tokens, k});
    auto token_of_slot = Tensor<std::int32_t, Space>::empty(Shape{slots});
    ctx.device.moe_sort_by_expert(routed.data(), state.tokens * k, k, 0, E, capacity, state.slot_of.data(),
                                  token_of_slot.data(), slots);
    auto permuted = Tensor<T, Space>::empty(Shape{slots, h});
    ctx.device.template moe_gather_rows<T>(hidden.data(), h, token_of_slot.data(), slots, permuted.data());
    beside();                                // enqueued while the counts travel
    detail::finish_host_copies(ctx.device);  // the one wait
    const std::int32_t* per_expert = host.data();
    const std::int32_t* mine = host.data() + E + ctx.expert_tp.rank() * E;  // received by this etp rank
    state.permuted = std::accumulate(per_expert, per_expert + E, index_t{0});
    if (state.permuted < slots) permuted = Tensor<T, Space>::alias(permuted, 0, Shape{state.permuted, h});

    state.send_rows.assign(static_cast<std::size_t>(ep), 0);
    state.recv_rows.assign(static_cast<std::size_t>(ep), 0);
    for (int p = 0; p < ep; ++p)
      for (index_t l = 0; l < local_; ++l) {
        state.send_rows[p] += per_expert[p * local_ + l];
        state.recv_rows[p] += mine[p * local_ + l];
      }
    const Tensor<T, Space> exchanged = exchange(ctx, state, permuted);

    state.chunk_rows.assign(host.begin() + E, host.end());
    state.etp_rows.assign(static_cast<std::size_t>(etp), 0);
    for (int q = 0; q < etp; ++q)
      for (index_t c = 0; c < E; ++c) state.etp_rows[q] += state.chunk_rows[q * E + c];
    state.rows = std::accumulate(state.etp_rows.begin(), state.etp_rows.end(), index_t{0});
    Tensor<T, Space> gathered = exchanged;
    if (etp > 1) {
      gathered = Tensor<T, Space>::empty(Shape{state.rows, h});
      ctx.expert_tp.all_gather_v(exchanged.buffer(), gathered.buffer(), detail::times(state.etp_rows, h));
    }
    Dispatched out;
    if (state.compact) {
      out.counts = Tensor<std::int32_t, Space>::empty(Shape{local_});
      state.to_expert = Tensor<std::int32_t, Space>::empty(Shape{state.rows});
      state.to_chunk = Tensor<std::int32_t, Space>::empty(Shape{state.rows});
      if constexpr (detail::has_moe_chunk_maps<typename Context::device_type>)
        ctx.device.moe_chunk_maps(real_rows.data(), etp * ep, local_, capacity, state.to_expert.data(), state.to_chunk.data(),
                                  out.counts.data());
      out.tokens = sort_chunks(ctx, state, gathered, true);
      return {std::move(out), std::move(state)};
    }
    out.tokens = sort_chunks(ctx, state, gathered, true);
    std::vector<std::int32_t> per_local(static_cast<std::size_t>(local_), 0);
    for (int q = 0; q < etp; ++q)
      for (int p = 0; p < ep; ++p)
        for (index_t l = 0; l < local_; ++l)
          per_local[l] += static_cast<std::int32_t>(state.chunk_rows[(q * ep + p) * local_ + l]);
    out.counts = Tensor<std::int32_t, Space>::empty(Shape{local_});
    ctx.device.template copy_from_host<std::int32_t>(per_local.data(), local_, out.counts.data());
    out.host_counts.assign(per_local.begin(), per_local.end());
    return {std::move(out), std::move(state)};
  }

  Tensor<T, Space> combine(Context& ctx, State& state, const Tensor<T, Space>& expert_output) const {
    state.combined_output = back_to_tokens_order(ctx, state, expert_output);
    auto y = Tensor<T, Space>::empty(Shape{state.tokens, config_.hidden_size});
    ctx.device.template moe_combine<T, A>(state.combined_output.data(), state.slot_of.data(), state.weights.data(),
                                          state.tokens, config_.topk, config_.hidden_size, y.data());
    return y;
  }

  std::pair<Tensor<T, Space>, Tensor<A, Space>> combine_backward(Context& ctx, const State& state,
                                                                 const Tensor<T, Space>& dy) const {
    const index_t h = config_.hidden_size, k = config_.topk;
    auto d_permuted = Tensor<T, Space>::empty(Shape{state.permuted, h});
    auto dweights = Tensor<A, Space>::empty(Shape{state.tokens, k});
    ctx.device.template moe_combine_backward<T, A>(dy.data(), state.combined_output.data(), state.slot_of.data(),
                                                   state.weights.data(), state.tokens, k, h, state.permuted,
                                                   d_permuted.data(), dweights.data());
    const Tensor<T, Space> exchanged = exchange(ctx, state, d_permuted);
    Tensor<T, Space> gathered = exchanged;
    if (ctx.expert_tp.size() > 1) {
      gathered = Tensor<T, Space>::empty(Shape{state.rows, h});
      ctx.expert_tp.all_gather_v(exchanged.buffer(), gathered.buffer(), detail::times(state.etp_rows, h));
    }
    return {sort_chunks(ctx, state, gathered, true), std::move(dweights)};
  }

  Tensor<T, Space> dispatch_backward(Context& ctx, const State& state, const Tensor<T, Space>& d_input) const {
    auto d_permuted = back_to_tokens_order(ctx, state, d_input);
    auto dx = Tensor<T, Space>::empty(Shape{state.tokens, config_.hidden_size});
    ctx.device.template moe_combine<T, A>(d_permuted.data(), state.slot_of.data(), nullptr, state.tokens, config_.topk,
                                          config_.hidden_size, dx.data());
    return dx;
  }

  index_t local_experts() const { return local_; }

 private:
  // One rank of the etp x ep group: the sort by expert is the whole dispatch, with the counts in the
  // backend's memory and the upper bound of rows (T x k, or every expert's capacity); the chunk order
  // is the expert order and every exchange is the rows themselves. Padded, the counts are known on
  // the host; dropless they are read only for experts that need them there (`read_counts`), the
  // read started once they are counted and waited for after the sort, the gather and `beside`.
  template <class Beside>
  std::pair<Dispatched, State> dispatch_alone(Context& ctx, State state, const Tensor<T, Space>& hidden,
                                              const Tensor<std::int32_t, Space>& routed, index_t capacity, bool read_counts,
                                              const Beside& beside) const {
    const index_t h = config_.hidden_size, k = config_.topk, E = config_.num_experts;
    Dispatched out;
    out.counts = Tensor<std::int32_t, Space>::empty(Shape{E});
    if (capacity > 0) {
      ctx.device.template fill<std::int32_t>(out.counts.data(), E, static_cast<double>(capacity));
      out.host_counts.assign(static_cast<std::size_t>(E), capacity);
    } else {
      ctx.device.template moe_count<std::int32_t>(routed.data(), state.tokens * k, k, 1, E, out.counts.data(), false);
    }
    std::vector<std::int32_t> host;
    if (read_counts) {
      host.resize(static_cast<std::size_t>(E));
      detail::start_host_copy(ctx.device, out.counts.data(), E, host.data());
    }
    state.permuted = state.rows = capacity > 0 ? E * capacity : state.tokens * k;
    state.send_rows = state.recv_rows = state.etp_rows = {state.rows};
    state.slot_of = Tensor<std::int32_t, Space>::empty(Shape{state.tokens, k});
    auto token_of_slot = Tensor<std::int32_t, Space>::empty(Shape{state.rows});
    ctx.device.moe_sort_by_expert(routed.data(), state.tokens * k, k, 0, E, capacity, state.slot_of.data(),
                                  token_of_slot.data(), state.rows);
    out.tokens = Tensor<T, Space>::empty(Shape{state.rows, h});
    ctx.device.template moe_gather_rows<T>(hidden.data(), h, token_of_slot.data(), state.rows, out.tokens.data());
    beside();
    if (read_counts) {
      detail::finish_host_copies(ctx.device);
      out.host_counts.assign(host.begin(), host.end());
    }
    return {std::move(out), std::move(state)};
  }

  // Rows in chunk order (q, p, l) -> local-expert order (l, q, p) when `to_expert_order`, else back
  // (on one rank the two orders are one: the rows themselves, shared).
  // Compacted (State::compact): a gather by the row maps, padding rows zero, the experts' rows past
  // their real total zero.
  Tensor<T, Space> sort_chunks(Context& ctx, const State& state, const Tensor<T, Space>& in, bool to_expert_order) const {
    const index_t h = config_.hidden_size;
    const int ep = ctx.ep.size(), etp = ctx.expert_tp.size();
    if (ep * etp == 1) return in;
    if (state.compact) {
      auto out = Tensor<T, Space>::empty(Shape{state.rows, h});
      ctx.device.template moe_gather_rows<T>(in.data(), h, (to_expert_order ? state.to_expert : state.to_chunk).data(),
                                             state.rows, out.data());
      return out;
    }
    const std::size_t count = static_cast<std::size_t>(etp * ep * local_);
    std::vector<index_t> chunk_offset(count), expert_offset(count);  // row offsets in the two orders
    index_t at = 0;
    for (std::size_t c = 0; c < count; ++c) chunk_offset[c] = at, at += state.chunk_rows[c];
    at = 0;
    for (index_t l = 0; l < local_; ++l)
      for (int q = 0; q < etp; ++q)
        for (int p = 0; p < ep; ++p) {
          const std::size_t c = static_cast<std::size_t>((q * ep + p) * local_ + l);
          expert_offset[c] = at, at += state.chunk_rows[c];
        }
    auto out = Tensor<T, Space>::empty(Shape{state.rows, h});
    for (std::size_t c = 0; c < count; ++c) {
      const index_t from = to_expert_order ? chunk_offset[c] : expert_offset[c];
      const index_t to = to_expert_order ? expert_offset[c] : chunk_offset[c];
      ctx.device.template copy<T>(in.data() + from * h, state.chunk_rows[c] * h, out.data() + to * h);
    }
    return out;
  }

  // The experts' rows (local-expert order, partial over etp) back to this rank's permuted order:
  // unsort, reduce-scatter over etp, all_to_all back over ep.
  Tensor<T, Space> back_to_tokens_order(Context& ctx, const State& state, const Tensor<T, Space>& rows) const {
    const index_t h = config_.hidden_size;
    Tensor<T, Space> chunked = sort_chunks(ctx, state, rows, false);
    Tensor<T, Space> mine = chunked;
    if (ctx.expert_tp.size() > 1) {
      mine = Tensor<T, Space>::empty(Shape{state.etp_rows[static_cast<std::size_t>(ctx.expert_tp.rank())], h});
      ctx.expert_tp.reduce_scatter_v(detail::read_only(chunked), mine.buffer(), detail::times(state.etp_rows, h),
                                     ReduceOp::sum);
    }
    if (ctx.ep.size() == 1) return mine;  // the all_to_all of one rank: the rows themselves
    auto permuted = Tensor<T, Space>::empty(Shape{state.permuted, h});
    ctx.ep.all_to_all(detail::read_only(mine), detail::times(state.recv_rows, h), permuted.buffer(),
                      detail::times(state.send_rows, h));
    return permuted;
  }

  // Rows in this rank's permuted order -> the rows of its local experts from every ep rank, (p, l)
  // order: the all_to_all over ep; with ep = 1 the rows themselves (shared, read only), no copy.
  Tensor<T, Space> exchange(Context& ctx, const State& state, const Tensor<T, Space>& rows) const {
    if (ctx.ep.size() == 1) return rows;
    const index_t mine = std::accumulate(state.recv_rows.begin(), state.recv_rows.end(), index_t{0});
    auto out = Tensor<T, Space>::empty(Shape{mine, config_.hidden_size});
    ctx.ep.all_to_all(detail::read_only(rows), detail::times(state.send_rows, config_.hidden_size), out.buffer(),
                      detail::times(state.recv_rows, config_.hidden_size));
    return out;
  }

  DispatcherConfig config_;
  index_t local_;
};

// The dispatcher DispatcherConfig::type names, chosen when the layer is built (Megatron's
// --moe-token-dispatcher-type read at run time): the same calls as the two above, forwarded to the
// one it holds, so one compiled model serves both (the trainers' models::Mixtral). Its results are
// those of the dispatcher it holds, bit for bit.
template <class Policy>
class ConfiguredDispatcher {
  using AllToAll = AllToAllDispatcher<Policy>;
  using AllGather = AllGatherDispatcher<Policy>;

 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  using Dispatched = typename AllGather::Dispatched;
  using State = std::variant<typename AllToAll::State, typename AllGather::State>;  // the held dispatcher's

  ConfiguredDispatcher(const Context& ctx, DispatcherConfig c) : impl_(make(ctx, c)) {}

  template <class Beside = detail::NothingBeside>
  std::pair<Dispatched, State> dispatch(Context& ctx, const Tensor<T, Space>& hidden, const Tensor<std::int32_t, Space>& routed,
                                        const Tensor<A, Space>& weights, index_t capacity = 0, bool device_counts = false,
                                        const Beside& beside = Beside{}) const {
    return std::visit(
        [&](const auto& d) -> std::pair<Dispatched, State> {
          auto [dispatched, state] = d.dispatch(ctx, hidden, routed, weights, capacity, device_counts, beside);
          return {std::move(dispatched), State(std::move(state))};
        },
        impl_);
  }
  Tensor<T, Space> combine(Context& ctx, State& state, const Tensor<T, Space>& expert_output) const {
    return with_state(state, [&](const auto& d, auto& s) { return d.combine(ctx, s, expert_output); });
  }
  std::pair<Tensor<T, Space>, Tensor<A, Space>> combine_backward(Context& ctx, const State& state, const Tensor<T, Space>& dy) const {
    return with_state(state, [&](const auto& d, const auto& s) { return d.combine_backward(ctx, s, dy); });
  }
  Tensor<T, Space> dispatch_backward(Context& ctx, const State& state, const Tensor<T, Space>& d_input) const {
    return with_state(state, [&](const auto& d, const auto& s) { return d.dispatch_backward(ctx, s, d_input); });
  }
  index_t local_experts() const {
    return std::visit([](const auto& d) { return d.local_experts(); }, impl_);
  }
  MoeDispatcherType type() const { return impl_.index() == 0 ? MoeDispatcherType::alltoall : MoeDispatcherType::allgather; }

 private:
  static std::variant<AllToAll, AllGather> make(const Context& ctx, const DispatcherConfig& c) {
    if (c.type == MoeDispatcherType::allgather) return std::variant<AllToAll, AllGather>(std::in_place_index<1>, ctx, c);
    return std::variant<AllToAll, AllGather>(std::in_place_index<0>, ctx, c);
  }
  // f(held dispatcher, its state); a state of the other dispatcher is a logic error, named.
  template <class S, class F>
  decltype(auto) with_state(S& state, F&& f) const {
    if (state.index() != impl_.index())
      fail<Error>("ConfiguredDispatcher: a state made by the ", state.index() == 0 ? "all-to-all" : "all-gather",
                  " dispatcher was handed to the ", impl_.index() == 0 ? "all-to-all" : "all-gather", " one");
    if (impl_.index() == 0) return f(std::get<0>(impl_), std::get<0>(state));
    return f(std::get<1>(impl_), std::get<1>(state));
  }

  std::variant<AllToAll, AllGather> impl_;
};

STRATA_NAMESPACE_END
