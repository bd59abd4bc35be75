// strata/layers/context_parallel_attention.hpp: ring attention, the attention core of a
// context-parallel rank (Megatron's --cp-comm-type p2p).
//
// Each rank of the cp group holds two chunks of c tokens of every sequence, global chunks r and
// 2 cp - 1 - r (shard/context_parallel.hpp): q, out [2c, b, heads, d] and k, v [2c, b, groups, d]
// are the rank's local sequence, lse is kept per chunk, [2][b, heads, c]. The attention of a local
// query chunk splits into blocks, one per key/value chunk of the whole sequence:
//
//   key chunk == query chunk   causal block (the diagonal)
//   key chunk <  query chunk   full block (every key lies in the past)
//   key chunk >  query chunk   skipped (every key lies in the future)
//
// A sliding window (AttentionOptions::window, by global positions) skips the blocks wholly before
// every query's window as well, and masks a band of the others (a row that sees none of a block's
// keys adds nothing to the merge). Attention sinks join the diagonal block only, so every query row
// counts its sink once: that block's lse includes it, and so the merged lse, from which the
// backward's probabilities and the sink's gradient (on the diagonal block, once per row) follow.
//
// Forward: k and v travel around the cp ring (cp - 1 exchanges: send to rank + 1, receive from
// rank - 1, batched so blocking point-to-point cannot deadlock). At step t a rank holds the keys and
// values of rank r - t and runs its blocks with the backend's attention_forward (causal or not,
// with the global positions of both chunks so the dropout mask is the whole sequence's); each
// block's output and log-sum-exp merge into the chunk's through attention_merge:
//   lse = log sum_k e^(lse_k),   out = sum_k e^(lse_k - lse) out_k.
// Without a window every rank runs the same number of blocks (three at step 0, two after); the
// diagonal blocks come first and write out and lse.
//
// Backward: flash attention's backward of a block from the *merged* out and lse is exactly that
// block's share of the gradient (p = e^(z - lse) are the whole softmax's probabilities and
// D = dout . out is the whole row's), so each block gives dq (summed here) and dk, dv of the keys it
// saw. Keys and values go around the ring again, each with the running sums dk, dv of its owner's
// chunks; after cp steps one more exchange hands every rank the sums of its own k and v.
//
// Overlap. The exchanges go through the communicator's overlapped handle (comm/communicator.hpp:
// on NCCL, the communication stream), issued before the blocks they run beside and joined before
// their results are read: in the forward the next step's keys and values travel while this step's
// blocks run; in the backward the next step's keys and values travel while this step's blocks run,
// the block gradients of a step are summed into a buffer of their own, and the running sums, which
// arrive from the previous rank while those blocks run, are added after the join and sent on while
// the next step's blocks run. Every buffer an exchange reads or writes outlives its join. Where the
// communicator does not overlap (the in-process one), the same calls run in the same order at once.
//
// The sums run in a fixed order (ring order), so two runs give the same bits; the result equals
// cp = 1's to rounding.
//
// All-gather (Megatron's --cp-comm-type allgather): the same blocks against every rank's keys and
// values gathered at once (allgather_attention_forward / _backward below).
//
// All-to-all (Ulysses, Megatron's --cp-comm-type a2a): sequence_to_heads and heads_to_sequence
// below turn the local sequence of every head into the whole sequence of heads / cp of them and
// back, one all-to-all each way; attention runs between them as without context parallelism.
#pragma once

#include <cstdint>
#include <vector>

#include "../backend/attention_options.hpp"
#include "../comm/communicator.hpp"
#include "../comm/parallel_context.hpp"
#include "../core/dtype.hpp"
#include "../core/tensor.hpp"
#include "../shard/context_parallel.hpp"

STRATA_NAMESPACE_BEGIN

namespace detail {

// The blocks of local query chunk `query_chunk` against the key chunks of cp rank `owner`: calls
// block(key_chunk, options) for each block that is not skipped, the diagonal one (causal, with the
// sink of `base` if any) first; the others without a sink.
template <class Block>
void for_each_ring_block(const ContextParallelSplit& split, int owner, int query_chunk, const AttentionOptions& base,
                         Block&& block) {
  const index_t c = split.chunk, global_query = split.global_chunk(query_chunk);
  const int first = owner == split.rank ? query_chunk : 0;  // the own chunks: the diagonal block first
  for (const int key_chunk : {first, 1 - first}) {
    const index_t global_key = split.global_chunk_of(owner, key_chunk);
    if (global_key > global_query) continue;  // wholly in the future
    if (base.window >= 0 && (global_key + 1) * c - 1 < global_query * c - base.window) continue;  // before every window
    AttentionOptions options = base;
    options.causal = global_key == global_query;
    options.query_offset = global_query * c;
    options.key_offset = global_key * c;
    if (!options.causal) options.softmax = SoftmaxType::vanilla, options.sinks = nullptr, options.sink_gradient = nullptr;
    block(key_chunk, options);
  }
}

// Sends the `count` buffers in `send` to the next rank of the ring and receives as many from the
// previous one into `recv`, in one batch.
template <class T, class Comm, std::size_t N>
void ring_exchange(Comm& cp, const T* const (&send)[N], T* const (&recv)[N], index_t n) {
  const int size = cp.size(), rank = cp.rank();
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  auto batch = batch_point_to_point(cp);
  for (std::size_t i = 0; i < N; ++i) cp.send(comm_span_t<const T, Comm>(send[i], static_cast<std::size_t>(n)), next);
  for (std::size_t i = 0; i < N; ++i) cp.recv(comm_span_t<T, Comm>(recv[i], static_cast<std::size_t>(n)), previous);
  batch.end();
}

// All-to-all of equal blocks of `block` elements: block p of `send` to rank p, block p of `recv`
// from rank p.
template <class T, class Comm>
void all_to_all_equal(Comm& cp, const T* send, T* recv, index_t block) {
  const auto size = static_cast<std::size_t>(cp.size());
  std::vector<std::size_t> counts(size, static_cast<std::size_t>(block));
  cp.all_to_all(comm_span_t<const T, Comm>(send, size * static_cast<std::size_t>(block)), counts,
                comm_span_t<T, Comm>(recv, size * static_cast<std::size_t>(block)), counts);
}

}  // namespace detail

namespace detail {

// Scratch of one block's results, reused by every block of a call.
template <class T, class A, class Space>
struct RingBlockScratch {
  Tensor<T, Space> out, dq, dk, dv;  // [c, b, heads or groups, d]
  Tensor<A, Space> lse;              // [b, heads, c]
};

// The forward blocks of both local query chunks against the key/value chunks of cp rank `owner`
// (keys, values [2c, b, groups, d]), merged into out and lse; `first` (the rank's own chunks, the
// first owner of a call): the diagonal blocks, which come first, write out and lse.
template <class T, class A, class Context, class Space>
void forward_blocks(Context& ctx, const ContextParallelSplit& split, int owner, bool first, const T* q, const T* keys,
                    const T* values, index_t b, index_t heads, index_t groups, index_t d, A scale, T* out, A* lse,
                    const AttentionOptions& base, RingBlockScratch<T, A, Space>& scratch) {
  const index_t c = split.chunk;
  const index_t q_chunk = c * b * heads * d, kv_chunk = c * b * groups * d, lse_chunk = b * heads * c;
  for (int query_chunk = 0; query_chunk < 2; ++query_chunk)
    for_each_ring_block(split, owner, query_chunk, base, [&](int key_chunk, const AttentionOptions& options) {
      T* chunk_out = out + query_chunk * q_chunk;
      A* chunk_lse = lse + query_chunk * lse_chunk;
      const bool writes = first && options.causal;  // the diagonal block comes first for both query chunks
      ctx.device.template attention_forward<T>(q + query_chunk * q_chunk, keys + key_chunk * kv_chunk,
                                               values + key_chunk * kv_chunk, c, b, heads, groups, d, scale,
                                               writes ? chunk_out : scratch.out.data(),
                                               writes ? chunk_lse : scratch.lse.data(), options);
      if (!writes)
        ctx.device.template attention_merge<T>(chunk_out, chunk_lse, scratch.out.data(), scratch.lse.data(), c, b, heads, d);
    });
}

// The backward blocks of both local query chunks against the key/value chunks of cp rank `owner`:
// dq [2c, b, heads, d] and dk, dv [2c, b, groups, d] (the owner's two chunks) accumulate.
template <class T, class A, class Context, class Space>
void backward_blocks(Context& ctx, const ContextParallelSplit& split, int owner, const T* dout, const T* q,
                     const T* keys, const T* values, const T* out, const A* lse, index_t b, index_t heads,
                     index_t groups, index_t d, A scale, T* dq, T* dk, T* dv, const AttentionOptions& base,
                     RingBlockScratch<T, A, Space>& scratch) {
  const index_t c = split.chunk;
  const index_t q_chunk = c * b * heads * d, kv_chunk = c * b * groups * d, lse_chunk = b * heads * c;
  for (int query_chunk = 0; query_chunk < 2; ++query_chunk)
    for_each_ring_block(split, owner, query_chunk, base, [&](int key_chunk, const AttentionOptions& options) {
      ctx.device.template attention_backward<T>(
          dout + query_chunk * q_chunk, q + query_chunk * q_chunk, keys + key_chunk * kv_chunk,
          values + key_chunk * kv_chunk, out + query_chunk * q_chunk, lse + query_chunk * lse_chunk, c, b, heads,
          groups, d, scale, scratch.dq.data(), scratch.dk.data(), scratch.dv.data(), options);
      T* dq_chunk = dq + query_chunk * q_chunk;
      ctx.device.template add<T>(dq_chunk, scratch.dq.data(), q_chunk, dq_chunk);
      T* dk_chunk = dk + key_chunk * kv_chunk;
      T* dv_chunk = dv + key_chunk * kv_chunk;
      ctx.device.template add<T>(dk_chunk, scratch.dk.data(), kv_chunk, dk_chunk);
      ctx.device.template add<T>(dv_chunk, scratch.dv.data(), kv_chunk, dv_chunk);
    });
}

template <class T, class A, class Space>
RingBlockScratch<T, A, Space> ring_block_scratch(index_t c, index_t b, index_t heads, index_t groups, index_t d,
                                                 bool backward) {
  RingBlockScratch<T, A, Space> x;
  if (backward) {
    x.dq = Tensor<T, Space>::empty(Shape{c, b, heads, d});
    x.dk = Tensor<T, Space>::empty(Shape{c, b, groups, d});
    x.dv = Tensor<T, Space>::empty(Shape{c, b, groups, d});
  } else {
    x.out = Tensor<T, Space>::empty(Shape{c, b, heads, d});
    x.lse = Tensor<A, Space>::empty(Shape{b, heads, c});
  }
  return x;
}

}  // namespace detail

// out [2c, b, heads, d] and lse [2][b, heads, c] written (see the note at the top). `base`: the
// layer's dropout, window and sink (its strides are the contiguous layout, as here everywhere).
template <class T, class A, class Context, class Comm>
void ring_attention_forward(Context& ctx, Comm& cp, const ContextParallelSplit& split, const T* q, const T* k, const T* v,
                            index_t b, index_t heads, index_t groups, index_t d, A scale, T* out, A* lse,
                            const AttentionOptions& base) {
  using Space = typename Context::space;
  const index_t c = split.chunk;
  const index_t kv_numel = 2 * c * b * groups * d;
  const Shape kv_shape{2 * c, b, groups, d};
  auto held_k = Tensor<T, Space>::empty(kv_shape), held_v = Tensor<T, Space>::empty(kv_shape);
  auto next_k = Tensor<T, Space>::empty(kv_shape), next_v = Tensor<T, Space>::empty(kv_shape);
  auto scratch = detail::ring_block_scratch<T, A, Space>(c, b, heads, groups, d, false);
  const int size = split.size, rank = split.rank;
  auto ring = overlapped_handle(cp);  // the exchanges run beside the blocks
  std::uint64_t arrived = 0;          // the mark of the exchanges the next join waits for
  for (int step = 0; step < size; ++step) {
    const T* keys = step == 0 ? k : held_k.data();
    const T* values = step == 0 ? v : held_v.data();
    if (step + 1 < size) {  // the next step's keys and values, from the previous rank
      const T* send[2] = {keys, values};
      T* const recv[2] = {next_k.data(), next_v.data()};
      detail::ring_exchange<T>(ring, send, recv, kv_numel);
      arrived = overlapped_mark(ring);
    }
    detail::forward_blocks<T, A>(ctx, split, (rank - step + size) % size, step == 0, q, keys, values, b, heads, groups, d,
                                 scale, out, lse, base, scratch);
    if (step + 1 < size) join_overlapped(ring, arrived);  // the next step's keys and values have arrived
    std::swap(held_k, next_k);
    std::swap(held_v, next_v);
  }
}

// dq [2c, b, heads, d], dk, dv [2c, b, groups, d] written from dout, q, k, v and the forward's
// merged out and lse (see the note at the top).
template <class T, class A, class Context, class Comm>
void ring_attention_backward(Context& ctx, Comm& cp, const ContextParallelSplit& split, const T* dout, const T* q, const T* k,
                             const T* v, const T* out, const A* lse, index_t b, index_t heads, index_t groups,
                             index_t d, A scale, T* dq, T* dk, T* dv, const AttentionOptions& base) {
  using Space = typename Context::space;
  const index_t c = split.chunk;
  const index_t kv_numel = 2 * c * b * groups * d;
  const Shape kv_shape{2 * c, b, groups, d};
  auto held_k = Tensor<T, Space>::empty(kv_shape), held_v = Tensor<T, Space>::empty(kv_shape);
  auto next_k = Tensor<T, Space>::empty(kv_shape), next_v = Tensor<T, Space>::empty(kv_shape);
  auto held_dk = Tensor<T, Space>::zeros(kv_shape), held_dv = Tensor<T, Space>::zeros(kv_shape);  // the owner's sums
  auto next_dk = Tensor<T, Space>::empty(kv_shape), next_dv = Tensor<T, Space>::empty(kv_shape);
  auto step_dk = Tensor<T, Space>::empty(kv_shape), step_dv = Tensor<T, Space>::empty(kv_shape);  // this step's blocks
  auto scratch = detail::ring_block_scratch<T, A, Space>(c, b, heads, groups, d, true);
  ctx.device.template fill<T>(dq, 2 * c * b * heads * d, 0.0);
  const int size = split.size, rank = split.rank;
  auto ring = overlapped_handle(cp);  // the exchanges run beside the blocks
  std::uint64_t arrived = 0;          // the mark of the exchanges the next join waits for
  for (int step = 0; step < size; ++step) {
    const T* keys = step == 0 ? k : held_k.data();
    const T* values = step == 0 ? v : held_v.data();
    if (step + 1 < size) {  // the next step's keys and values, from the previous rank
      const T* send[2] = {keys, values};
      T* const recv[2] = {next_k.data(), next_v.data()};
      detail::ring_exchange<T>(ring, send, recv, kv_numel);
      arrived = overlapped_mark(ring);  // after the previous step's sums too
    }
    ctx.device.template fill<T>(step_dk.data(), kv_numel, 0.0);
    ctx.device.template fill<T>(step_dv.data(), kv_numel, 0.0);
    detail::backward_blocks<T, A>(ctx, split, (rank - step + size) % size, dout, q, keys, values, out, lse, b, heads,
                                  groups, d, scale, dq, step_dk.data(), step_dv.data(), base, scratch);
    if (size > 1) join_overlapped(ring, arrived);  // the owner's sums (and the next keys) have arrived
    ctx.device.template add<T>(held_dk.data(), step_dk.data(), kv_numel, held_dk.data());
    ctx.device.template add<T>(held_dv.data(), step_dv.data(), kv_numel, held_dv.data());
    if (step + 1 < size) {  // the owner's sums on to the next rank, beside the next step's blocks
      const T* send[2] = {held_dk.data(), held_dv.data()};
      T* const recv[2] = {next_dk.data(), next_dv.data()};
      detail::ring_exchange<T>(ring, send, recv, kv_numel);
      arrived = overlapped_mark(ring);
      std::swap(held_k, next_k);
      std::swap(held_v, next_v);
      std::swap(held_dk, next_dk);
      std::swap(held_dv, next_dv);
    }
  }
  if (size == 1) {
    ctx.device.template copy<T>(held_dk.data(), kv_numel, dk);
    ctx.device.template copy<T>(held_dv.data(), kv_numel, dv);
    return;
  }
  // the sums held now are those of rank + 1's chunks: one more step hands each to its owner
  const T* send[2] = {held_dk.data(), held_dv.data()};
  T* const recv[2] = {dk, dv};
  detail::ring_exchange<T>(ring, send, recv, kv_numel);
  join_overlapped(ring, overlapped_mark(ring));  // dk, dv written, and no buffer of this call in use, before the caller goes on
}

// ---- all-gather (--cp-comm-type allgather) ----
//
// The ring's blocks without the ring: one all-gather over the cp group gives every rank the keys
// and values of all ranks ([cp][2c, b, groups, d]), and the blocks run against each owner's chunks
// in the ring's order (owner = rank, rank - 1, ...), so the forward gives the ring's bits. The
// backward gathers them again, sums the blocks' dk, dv per owner into [cp][2c, b, groups, d] and
// one reduce-scatter hands every rank the sums of its own chunks. It moves the same bytes as the
// ring without the overlap, and holds every rank's keys and values at once.

template <class T, class Context>
Tensor<T, typename Context::space> gather_over_cp(Context& ctx, const ContextParallelSplit& split, const T* x,
                                                  index_t numel) {
  using Space = typename Context::space;
  using Comm = typename Context::communicator_type;
  auto all = Tensor<T, Space>::empty(Shape{split.size, numel});
  ctx.cp.all_gather(comm_span_t<const T, Comm>(x, static_cast<std::size_t>(numel)),
                    comm_span_t<T, Comm>(all.data(), static_cast<std::size_t>(split.size * numel)));
  return all;
}

// out [2c, b, heads, d] and lse [2][b, heads, c] written, as ring_attention_forward writes them.
template <class T, class A, class Context>
void allgather_attention_forward(Context& ctx, const ContextParallelSplit& split, const T* q, const T* k, const T* v,
                                 index_t b, index_t heads, index_t groups, index_t d, A scale, T* out, A* lse,
                                 const AttentionOptions& base) {
  using Space = typename Context::space;
  const index_t kv_numel = 2 * split.chunk * b * groups * d;
  const auto all_k = gather_over_cp<T>(ctx, split, k, kv_numel), all_v = gather_over_cp<T>(ctx, split, v, kv_numel);
  auto scratch = detail::ring_block_scratch<T, A, Space>(split.chunk, b, heads, groups, d, false);
  for (int step = 0; step < split.size; ++step) {
    const int owner = (split.rank - step + split.size) % split.size;
    detail::forward_blocks<T, A>(ctx, split, owner, step == 0, q, all_k.data() + owner * kv_numel,
                                 all_v.data() + owner * kv_numel, b, heads, groups, d, scale, out, lse, base, scratch);
  }
}

// dq, dk, dv written, as ring_attention_backward writes them (dk, dv summed in another order).
template <class T, class A, class Context>
void allgather_attention_backward(Context& ctx, const ContextParallelSplit& split, const T* dout, const T* q,
                                  const T* k, const T* v, const T* out, const A* lse, index_t b, index_t heads,
                                  index_t groups, index_t d, A scale, T* dq, T* dk, T* dv,
                                  const AttentionOptions& base) {
  using Space = typename Context::space;
  using Comm = typename Context::communicator_type;
  const index_t kv_numel = 2 * split.chunk * b * groups * d;
  const auto all_k = gather_over_cp<T>(ctx, split, k, kv_numel), all_v = gather_over_cp<T>(ctx, split, v, kv_numel);
  auto all_dk = Tensor<T, Space>::zeros(all_k.shape()), all_dv = Tensor<T, Space>::zeros(all_k.shape());
  auto scratch = detail::ring_block_scratch<T, A, Space>(split.chunk, b, heads, groups, d, true);
  ctx.device.template fill<T>(dq, 2 * split.chunk * b * heads * d, 0.0);
  for (int step = 0; step < split.size; ++step) {
    const int owner = (split.rank - step + split.size) % split.size;
    const index_t at = owner * kv_numel;
    detail::backward_blocks<T, A>(ctx, split, owner, dout, q, all_k.data() + at, all_v.data() + at, out, lse, b, heads,
                                  groups, d, scale, dq, all_dk.data() + at, all_dv.data() + at, base, scratch);
  }
  const auto whole = static_cast<std::size_t>(split.size * kv_numel), own = static_cast<std::size_t>(kv_numel);
  ctx.cp.reduce_scatter(comm_span_t<const T, Comm>(all_dk.data(), whole), comm_span_t<T, Comm>(dk, own), ReduceOp::sum);
  ctx.cp.reduce_scatter(comm_span_t<const T, Comm>(all_dv.data(), whole), comm_span_t<T, Comm>(dv, own), ReduceOp::sum);
}

// ---- all-to-all (Ulysses, --cp-comm-type a2a) ----
//
// One all-to-all over a group of a ranks (the cp group, or a2a+p2p's inner group) turns this
// rank's local sequence of all its heads into the sequences of heads / a of them held by the group:
// x [2c, b, n, d] -> [2 a c, b, n / a, d]. `split` is the group's split (size a, this rank's place
// in the group, chunk c): rank j's two chunks go to places j and 2a-1-j, so for the cp group (a =
// cp) the result is the whole sequence in global order; attention then runs on whole sequences as
// without context parallelism, and one all-to-all brings the output back. Heads and key/value
// groups must both divide over a (checked_cp_heads below).
template <class T, class Context, class Comm>
Tensor<T, typename Context::space> sequence_to_heads(Context& ctx, Comm& group, const ContextParallelSplit& split,
                                                     const T* x, index_t b, index_t n, index_t d) {
  using Space = typename Context::space;
  const int cp = split.size;
  const index_t c = split.chunk, n_rank = n / cp, rows = 2 * c * b;
  const index_t block = rows * n_rank * d, chunk = c * b * n_rank * d;  // one rank's part; one chunk of it
  auto send = Tensor<T, Space>::empty(Shape{cp, 2 * c * b, n_rank, d});  // (cp, 2c b, n / cp, d)
  auto recv = Tensor<T, Space>::empty(send.shape());
  for (int j = 0; j < cp; ++j)  // heads [j n / cp, (j + 1) n / cp) of every local token to rank j
    ctx.device.template slice_columns<T>(x, rows, n * d, j * n_rank * d, n_rank * d, send.data() + j * block);
  detail::all_to_all_equal<T>(group, send.data(), recv.data(), block);
  auto whole = Tensor<T, Space>::empty(Shape{2 * cp * c, b, n_rank, d});  // (s, b, n / cp, d)
  for (int j = 0; j < cp; ++j)
    for (int local_chunk = 0; local_chunk < 2; ++local_chunk)
      ctx.device.template copy<T>(recv.data() + j * block + local_chunk * chunk, chunk,
                                  whole.data() + split.global_chunk_of(j, local_chunk) * chunk);
  return whole;
}

// The inverse: whole [2 a c, b, n / a, d] of this rank's heads -> y [2c, b, n, d], this rank's tokens
// of every head.
template <class T, class Context, class Comm>
void heads_to_sequence(Context& ctx, Comm& group, const ContextParallelSplit& split, const T* whole, index_t b, index_t n,
                       index_t d, T* y) {
  using Space = typename Context::space;
  const int cp = split.size;
  const index_t c = split.chunk, n_rank = n / cp, rows = 2 * c * b;
  const index_t block = rows * n_rank * d, chunk = c * b * n_rank * d;
  auto send = Tensor<T, Space>::empty(Shape{cp, 2 * c * b, n_rank, d});  // (cp, 2c b, n / cp, d)
  auto recv = Tensor<T, Space>::empty(send.shape());
  for (int j = 0; j < cp; ++j)  // rank j's chunks of the sequence, for this rank's heads
    for (int local_chunk = 0; local_chunk < 2; ++local_chunk)
      ctx.device.template copy<T>(whole + split.global_chunk_of(j, local_chunk) * chunk, chunk,
                                  send.data() + j * block + local_chunk * chunk);
  detail::all_to_all_equal<T>(group, send.data(), recv.data(), block);
  ctx.device.template unstack_columns<T>(recv.data(), cp, rows, n_rank * d, y);  // heads of rank j at columns j
}

// The options of all-to-all attention: of a rank's `local_heads` heads (those of its tp rank), rank
// j of the all-to-all group (size a) attends to the j-th local_heads / a of them, so their global
// numbers (the dropout mask's) start that far on, and so do their sink logits and the sinks'
// gradients (elements T and accumulate_t<T>).
template <class T, class Comm>
AttentionOptions a2a_attention_options(const Comm& group, AttentionOptions options, index_t local_heads) {
  const index_t first = static_cast<index_t>(group.rank()) * (local_heads / group.size());
  options.dropout.head_offset += first;
  if (options.sinks) options.sinks = static_cast<const T*>(options.sinks) + first;
  if (options.sink_gradient) options.sink_gradient = static_cast<accumulate_t<T>*>(options.sink_gradient) + first;
  return options;
}

// ---- all-to-all inside, ring across (--cp-comm-type a2a+p2p) ----
//
// Megatron's hierarchical context parallelism (--hierarchical-context-parallel-sizes a b, a x b =
// cp): the cp group splits into groups of a adjacent cp ranks (ParallelContext::cp_a2a) and the
// groups of the ranks at one place in them (cp_p2p, b ranks). cp rank r = o a + j is rank j of
// inner group o and rank o of the ring. The inner all-to-all gathers the group's chunks, which are
// two runs of a adjacent chunks of the sequence: chunks o a .. o a + a - 1 and their mirror
// 2cp-1-o a-(a-1) .. 2cp-1-o a (sequence_to_heads places rank j's chunks at j and 2a-1-j, which
// is that order). Those two runs are the load-balanced split of the sequence over b ranks with
// chunks of a c tokens, rank o's: ring attention over cp_p2p runs on them for heads / a heads
// unchanged (global positions for the causal mask, the window and dropout follow from the runs'
// offsets), and the inner all-to-all brings the output back. a = cp is a2a; a = 1 is the ring.

// The all-to-all group of ctx.cp_comm_type: the cp group for a2a, the inner group for a2a+p2p (a
// ConfigError where the context has none).
template <class Context>
auto& cp_a2a_group(Context& ctx) {
  if (ctx.cp_comm_type != ContextParallelComm::a2a_p2p) return ctx.cp;
  if (!ctx.cp_a2a)
    fail<ConfigError>("--cp-comm-type a2a+p2p needs the hierarchical context-parallel sizes (Megatron's "
                      "--hierarchical-context-parallel-sizes; ParallelContext::split_context_parallel) to form its "
                      "all-to-all and ring groups; give them, or use --cp-comm-type p2p or a2a");
  return *ctx.cp_a2a;
}

// Heads and key/value groups of this tensor-parallel rank checked against the all-to-all group's
// size (a2a, a2a+p2p: each of its ranks attends whole heads), naming `who`.
template <class Context>
void check_cp_heads(const Context& ctx, index_t heads, index_t groups, const char* who) {
  if (ctx.cp.size() <= 1) return;
  if (ctx.cp_comm_type != ContextParallelComm::a2a && ctx.cp_comm_type != ContextParallelComm::a2a_p2p) return;
  const int a = cp_a2a_group(ctx).size();
  if (heads % a != 0 || groups % a != 0)
    fail<ConfigError>(who, ": --cp-comm-type ", context_parallel_comm_name(ctx.cp_comm_type), " (cp=", ctx.cp.size(),
                      ") gives each of the ", a,
                      " ranks of an all-to-all group whole query heads and key/value heads, but this tensor-parallel rank "
                      "has ", heads, " query heads and ", groups, " key/value heads (num_query_groups / tp), which ", a,
                      " does not divide; use --cp-comm-type p2p, more query groups, or a smaller cp or tp");
}

// ---- the core of context-parallel attention, every comm type ----
//
// q [2c, b, heads, d], k, v [2c, b, groups, d]: this rank's local sequence (RoPE applied); out
// [2c, b, heads, d] written. Kept for the backward, in the caller's tensors:
//   p2p, allgather: q, k, v as given; lse [2, b, heads, c] (out is the merged output)
//   a2a:            q, k, v, heads_out: the whole sequence of heads / cp heads; lse [b, heads / cp, s]
//   a2a+p2p:        q, k, v, heads_out: the ring's two runs of heads / a heads; lse [2, b, heads / a, a c]
// `options`: the layer's dropout, window and sinks.
template <class T, class A, class Context, class Space = typename Context::space>
void context_parallel_attention_forward(Context& ctx, index_t b, index_t heads, index_t groups, index_t d, A scale,
                                        const AttentionOptions& options, Tensor<T, Space>& q, Tensor<T, Space>& k,
                                        Tensor<T, Space>& v, Tensor<T, Space>& heads_out, Tensor<A, Space>& lse, T* out,
                                        const char* who) {
  const index_t s = q.size(0);
  check_cp_heads(ctx, heads, groups, who);
  if (ctx.cp_comm_type == ContextParallelComm::p2p || ctx.cp_comm_type == ContextParallelComm::allgather) {
    const ContextParallelSplit split = context_parallel_split(s * ctx.cp.size(), ctx.cp.size(), ctx.cp.rank(), who);
    lse = Tensor<A, Space>::empty(Shape{2, b, heads, split.chunk});
    if (ctx.cp_comm_type == ContextParallelComm::allgather)
      allgather_attention_forward<T, A>(ctx, split, q.data(), k.data(), v.data(), b, heads, groups, d, scale, out, lse.data(),
                                        options);
    else
      ring_attention_forward<T, A>(ctx, ctx.cp, split, q.data(), k.data(), v.data(), b, heads, groups, d, scale, out,
                                   lse.data(), options);
    return;
  }
  auto& group = cp_a2a_group(ctx);
  const ContextParallelSplit inner{group.size(), group.rank(), s / 2};
  const index_t nh = heads / inner.size, ng = groups / inner.size, span = s * inner.size;
  const AttentionOptions heads_options = a2a_attention_options<T>(group, options, heads);
  q = sequence_to_heads<T>(ctx, group, inner, q.data(), b, heads, d);  // [span, b, nh, d]
  k = sequence_to_heads<T>(ctx, group, inner, k.data(), b, groups, d);
  v = sequence_to_heads<T>(ctx, group, inner, v.data(), b, groups, d);
  heads_out = Tensor<T, Space>::empty(q.shape());
  if (ctx.cp_comm_type == ContextParallelComm::a2a) {  // whole sequences
    lse = Tensor<A, Space>::empty(Shape{b, nh, span});
    ctx.device.template attention_forward<T>(q.data(), k.data(), v.data(), span, b, nh, ng, d, scale, heads_out.data(),
                                             lse.data(), heads_options);
  } else {  // the ring across the groups, on their two runs
    auto& ring = *ctx.cp_p2p;
    const ContextParallelSplit outer{ring.size(), ring.rank(), span / 2};
    lse = Tensor<A, Space>::empty(Shape{2, b, nh, outer.chunk});
    ring_attention_forward<T, A>(ctx, ring, outer, q.data(), k.data(), v.data(), b, nh, ng, d, scale, heads_out.data(),
                                 lse.data(), heads_options);
  }
  heads_to_sequence<T>(ctx, group, inner, heads_out.data(), b, heads, d, out);
}

// dq [2c, b, heads, d], dk, dv [2c, b, groups, d] of the local sequence written from dout [2c, b,
// heads, d] and what the forward kept (out: the forward's output; p2p and allgather read it).
template <class T, class A, class Context, class Space = typename Context::space>
void context_parallel_attention_backward(Context& ctx, index_t b, index_t heads, index_t groups, index_t d, A scale,
                                         const AttentionOptions& options, const Tensor<T, Space>& q,
                                         const Tensor<T, Space>& k, const Tensor<T, Space>& v,
                                         const Tensor<T, Space>& heads_out, const Tensor<A, Space>& lse, const T* out,
                                         const T* dout, index_t s, T* dq, T* dk, T* dv, const char* who) {
  if (ctx.cp_comm_type == ContextParallelComm::p2p || ctx.cp_comm_type == ContextParallelComm::allgather) {
    const ContextParallelSplit split = context_parallel_split(s * ctx.cp.size(), ctx.cp.size(), ctx.cp.rank(), who);
    if (ctx.cp_comm_type == ContextParallelComm::allgather)
      allgather_attention_backward<T, A>(ctx, split, dout, q.data(), k.data(), v.data(), out, lse.data(), b, heads, groups,
                                         d, scale, dq, dk, dv, options);
    else
      ring_attention_backward<T, A>(ctx, ctx.cp, split, dout, q.data(), k.data(), v.data(), out, lse.data(), b, heads,
                                    groups, d, scale, dq, dk, dv, options);
    return;
  }
  auto& group = cp_a2a_group(ctx);
  const ContextParallelSplit inner{group.size(), group.rank(), s / 2};
  const index_t nh = heads / inner.size, ng = groups / inner.size, span = s * inner.size;
  const AttentionOptions heads_options = a2a_attention_options<T>(group, options, heads);
  const auto dout_heads = sequence_to_heads<T>(ctx, group, inner, dout, b, heads, d);
  auto dq_heads = Tensor<T, Space>::empty(q.shape()), dk_heads = Tensor<T, Space>::empty(k.shape()),
       dv_heads = Tensor<T, Space>::empty(v.shape());
  if (ctx.cp_comm_type == ContextParallelComm::a2a) {
    ctx.device.template attention_backward<T>(dout_heads.data(), q.data(), k.data(), v.data(), heads_out.data(), lse.data(),
                                              span, b, nh, ng, d, scale, dq_heads.data(), dk_heads.data(), dv_heads.data(),
                                              heads_options);
  } else {
    auto& ring = *ctx.cp_p2p;
    const ContextParallelSplit outer{ring.size(), ring.rank(), span / 2};
    ring_attention_backward<T, A>(ctx, ring, outer, dout_heads.data(), q.data(), k.data(), v.data(), heads_out.data(),
                                  lse.data(), b, nh, ng, d, scale, dq_heads.data(), dk_heads.data(), dv_heads.data(),
                                  heads_options);
  }
  heads_to_sequence<T>(ctx, group, inner, dq_heads.data(), b, heads, d, dq);
  heads_to_sequence<T>(ctx, group, inner, dk_heads.data(), b, groups, d, dk);
  heads_to_sequence<T>(ctx, group, inner, dv_heads.data(), b, groups, d, dv);
}

// Plans the attention calls of the core for a local sequence of s tokens (SelfAttention::prepare):
// the ring's blocks (causal and not) or whole sequences of heads.
template <class T, class Context>
void prepare_context_parallel_attention(Context& ctx, index_t s, index_t b, index_t heads, index_t groups, index_t d,
                                        bool backward, AttentionOptions options, const char* who) {
  check_cp_heads(ctx, heads, groups, who);
  index_t block = s / 2;  // p2p, allgather: the local chunks
  if (ctx.cp_comm_type == ContextParallelComm::a2a || ctx.cp_comm_type == ContextParallelComm::a2a_p2p) {
    auto& group = cp_a2a_group(ctx);
    options = a2a_attention_options<T>(group, options, heads);
    heads /= group.size(), groups /= group.size();
    if (ctx.cp_comm_type == ContextParallelComm::a2a) {
      ctx.device.template prepare_attention<T>(s * group.size(), b, heads, groups, d, backward, options);
      return;
    }
    block = s * group.size() / 2;  // the ring's runs
  }
  for (const bool causal : {true, false}) {
    AttentionOptions o = options;
    o.causal = causal;
    if (!causal) o.softmax = SoftmaxType::vanilla, o.sinks = nullptr, o.sink_gradient = nullptr;  // the diagonal's only
    ctx.device.template prepare_attention<T>(block, b, heads, groups, d, backward, o);
  }
}

STRATA_NAMESPACE_END
