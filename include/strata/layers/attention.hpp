// strata/layers/attention.hpp: `SelfAttention<Policy, Position, Grouping>`, causal multi-head or
// grouped-query self-attention with heads split over the tensor-parallel group.
//
//   qkv:  ColumnParallelLinear hidden -> groups * (heads/groups + 2) * head_dim, laid out group-major
//         ([q heads of group g | k_g | v_g] for each g) so rank r holds whole query groups
//   core: causal attention per local head (backend attention_forward, softmax in the accumulate
//         type); only q, k, v, the output and the log-sum-exp [b, np, s] are saved, never the
//         s x s probabilities (the backward recomputes them). q, k, v come one of two ways:
//         - views: without RoPE, when the local layout is a strided view of heads (one query head
//           per group, or one group: backend/attention_strides.hpp), attention reads q, k, v
//           straight from the packed projection, which is saved instead of them, and its backward
//           writes dq, dk, dv straight into the packed gradient (no split or merge copy)
//         - copies: otherwise qkv_split to q [s, b, np, d], k, v [s, b, ng, d], RoPE on q and k
//           when Position = rope, and qkv_merge of dq, dk, dv in the backward
//   proj: RowParallelLinear heads * head_dim -> hidden (all-reduce, or reduce-scatter under SP)
//
// Attention dropout (AttentionConfig::dropout, Megatron's --attention-dropout) on the probabilities,
// inside the backend's attention (backend/attention_options.hpp): a forward given a key draws the
// mask of each (global head, batch, query, key) from it, the local heads numbered from
// tp rank * heads per rank, so a tensor-parallel run draws the single-rank mask. The key and the
// probability are kept in Saved: the backward, and a recomputed core, draw the same mask. A forward
// without a key (evaluation, inference) has no dropout. lse is that of the undropped softmax.
//
// Selective recompute (set_recompute_core(true), Megatron's --recompute-granularity selective): the
// forward keeps the qkv projection's output instead of q, k, v, the attention output and lse, and
// the backward runs the core (qkv_split, RoPE, attention_forward) again before its own backward.
// The core is deterministic, so gradients are bit for bit those without recompute; the output
// [s, b, np_local * d] and lse are not held between forward and backward (q, k, v and the qkv
// output have the same size).
//
// Context parallelism (ctx.cp of more than one rank): the input is the rank's local sequence, two
// chunks of the whole one (shard/context_parallel.hpp); q, k, v are copies (never views), RoPE
// turns each chunk by its global positions, and the core is ring attention
// (layers/context_parallel_attention.hpp, ctx.cp_comm_type p2p), with lse kept per chunk
// [2, b, np, s/2]; with cp_comm_type allgather, the same blocks against every rank's keys and values
// gathered at once; or, with cp_comm_type a2a (Ulysses), one all-to-all makes q, k, v whole
// sequences of np/cp heads (heads and groups per tp rank must divide over cp), attention runs on
// them as without cp, and one all-to-all brings the output back. a2a+p2p is refused. Both run on every backend (on the GPU the ring's transfers overlap the blocks).
//
// Query groups must be a multiple of tp (each rank owns whole groups); fewer groups than tp is
// rejected with a ConfigError before any allocation. Input and output: the residual stream layout.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../backend/attention_options.hpp"
#include "../shard/context_parallel.hpp"
#include "../shard/partition.hpp"
#include "column_parallel_linear.hpp"
#include "context_parallel_attention.hpp"
#include "row_parallel_linear.hpp"

STRATA_NAMESPACE_BEGIN

// Position tags.
struct rope {};     // rotary embedding on queries and keys (Llama)
struct no_rope {};  // positions come from elsewhere (GPT's learned absolute embedding)
// Grouping tags.
struct mha {};  // one key/value head per query head (query_groups is ignored)
struct gqa {};  // query_groups key/value heads shared by heads / query_groups query heads each

struct AttentionConfig {
  index_t hidden_size = 0;
  int num_heads = 0;
  int num_query_groups = 0;  // 0: same as num_heads
  double rope_base = 10000.0;
  bool bias = true;  // biases on the qkv and output projections
  double dropout = 0.0;  // on the attention probabilities (training forward and its backward)
};

template <class Policy, class Position = no_rope, class Grouping = mha>
class SelfAttention {
 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  template <class L>
  using Act = Activation<T, L, Space>;
  using Layout = residual_layout_t<Policy>;
  using Qkv = ColumnParallelLinear<Policy>;
  using Proj = RowParallelLinear<Policy>;
  static_assert(std::is_same_v<Position, rope> || std::is_same_v<Position, no_rope>,
                "SelfAttention: the Position argument must be strata::rope or strata::no_rope.");
  static_assert(std::is_same_v<Grouping, mha> || std::is_same_v<Grouping, gqa>,
                "SelfAttention: the Grouping argument must be strata::mha or strata::gqa.");

  struct Saved {
    typename Qkv::Saved qkv;
    typename Proj::Saved proj;
    // copies: q [s, b, np_local, d] (after RoPE), k, v [s, b, ng_local, d]; views: all three empty
    Tensor<T, Space> q, k, v;
    Tensor<T, Space> packed;      // views: the projection (s, b, ng_local * (hpg + 2) * d); copies: empty
    Tensor<T, Space> out;         // [s, b, np_local * d]
    Tensor<A, Space> lse;         // [b, np_local, s]: log-sum-exp of each query's scores
    Tensor<T, Space> heads_out;   // cp a2a only: this rank's heads' output over the whole sequence [s_whole, b, np_local / cp, d]
    Tensor<T, Space> qkv_output;  // selective recompute only (q, k, v, packed, out, lse then empty): [s, b, groups_local * (hpg + 2) * d]
    AttentionDropout dropout;     // the forward's (probability 0: none); the backward and a recompute draw its mask
  };

  // Whether attention reads q, k, v as views of the packed projection (see the note at the top).
  bool reads_packed_qkv() const { return packed_view().is_view; }

  SelfAttention(const Context& ctx, std::string name, AttentionConfig config)
      : config_(validated(config, ctx.tp.size())),
        heads_local_(heads_per_rank(config_.num_heads, ctx.tp.size())),
        groups_local_(query_groups_per_rank(config_.num_query_groups, ctx.tp.size())),
        head_dim_(config_.hidden_size / config_.num_heads),
        qkv_(ctx, name + ".qkv", config_.hidden_size,
             static_cast<index_t>(config_.num_query_groups) * (config_.num_heads / config_.num_query_groups + 2) *
                 (config_.hidden_size / config_.num_heads),
             config_.bias),
        proj_(ctx, name + ".proj", config_.hidden_size, config_.hidden_size, config_.bias),
        context_parallel_(ctx.cp.size() > 1) {}

  // Plans the attention of a [s, b] input now (backend prepare_attention): its forward, and its
  // backward when `backward`. Optional; the first call of a shape plans it otherwise. With dropout
  // the training calls need no plan (the CUDA backend runs them on its flash kernels): only the
  // forward without dropout (evaluation) is planned.
  // `s` is the whole sequence's length. Under context parallelism the calls are the blocks of s /
  // (2 cp) queries (causal and not), or with a2a whole sequences of heads / cp heads.
  void prepare(Context& ctx, index_t s, index_t b, bool backward) const {
    const bool plan_backward = backward && config_.dropout <= 0;
    if (!context_parallel_) {
      ctx.device.template prepare_attention<T>(s, b, heads_local_, groups_local_, head_dim_, plan_backward,
                                               packed_view().strides);
      return;
    }
    const ContextParallelSplit split = context_parallel_split(ctx, s / ctx.cp.size());
    if (ctx.cp_comm_type == ContextParallelComm::a2a) {
      ctx.device.template prepare_attention<T>(s, b, heads_local_ / split.size, groups_local_ / split.size, head_dim_,
                                               plan_backward, AttentionOptions{});
      return;
    }
    for (const bool causal : {true, false}) {
      AttentionOptions block;
      block.causal = causal;
      ctx.device.template prepare_attention<T>(split.chunk, b, heads_local_, groups_local_, head_dim_, plan_backward, block);
    }
  }

  // dropout_key: the key of this micro-batch's attention dropout mask (distinct per layer and
  // micro-batch; TransformerLayer derives it); none, or a dropout of 0, runs without dropout.
  std::pair<Act<Layout>, Saved> forward(Context& ctx, const Act<Layout>& x,
                                        std::optional<std::uint64_t> dropout_key = std::nullopt) const {
    Saved saved;
    if (dropout_key && config_.dropout > 0)
      saved.dropout = AttentionDropout{config_.dropout, *dropout_key, static_cast<index_t>(ctx.tp.rank()) * heads_local_};
    auto [qkv, qkv_saved] = qkv_.forward(ctx, x);  // (s, b, groups_local * (hpg + 2) * d)
    saved.qkv = std::move(qkv_saved);
    core_forward(ctx, qkv.tensor, saved);
    auto [y, proj_saved] = proj_.forward(ctx, Act<layout::sharded<-1>>(saved.out));
    saved.proj = std::move(proj_saved);
    if (recompute_core_) {  // keep the core's input only; backward runs the core again
      saved.qkv_output = std::move(qkv.tensor);
      saved.q = saved.k = saved.v = saved.out = saved.packed = saved.heads_out = Tensor<T, Space>();
      saved.lse = Tensor<A, Space>();
      saved.proj.input = Tensor<T, Space>();
    }
    return {std::move(y), std::move(saved)};
  }

  // With `deferred`, the qkv and output projections' weight gradients are appended to it. Without
  // `output_bias_gradient`, the output projection's bias gradient is left to the caller
  // (RowParallelLinear::backward).
  Act<Layout> backward(Context& ctx, const Saved& stored, const Act<Layout>& dy, DeferredWeightGradients* deferred = nullptr,
                       bool output_bias_gradient = true) {
    if (!stored.qkv_output.empty()) {  // selective recompute: the core's tensors again, then the backward
      Saved saved = stored;
      core_forward(ctx, saved.qkv_output, saved);
      saved.proj.input = saved.out;
      return backward_from(ctx, saved, dy, deferred, output_bias_gradient);
    }
    return backward_from(ctx, stored, dy, deferred, output_bias_gradient);
  }
  // The output projection's bias (null without one).
  Parameter<T, Space>* output_bias() { return proj_.bias(); }

  // On: forward keeps only the qkv output and backward recomputes the attention core (see above).
  void set_recompute_core(bool on) { recompute_core_ = on; }
  bool recompute_core() const { return recompute_core_; }

 private:
  // q, k, v (RoPE applied), out and lse of `saved` from the qkv projection's output.
  void core_forward(Context& ctx, const Tensor<T, Space>& qkv, Saved& saved) const {
    const index_t s = qkv.shape()[0], b = qkv.shape()[1], d = head_dim_, hpg = heads_local_ / groups_local_;
    saved.out = Tensor<T, Space>::empty(Shape{s, b, heads_local_ * d});  // (s, b, np_local * d)
    if (context_parallel_) {
      context_parallel_core_forward(ctx, qkv, saved);
      return;
    }
    saved.lse = Tensor<A, Space>::empty(Shape{b, heads_local_, s});
    if (const PackedQkvView view = packed_view(); view.is_view) {
      saved.packed = qkv;  // shared, read only
      const T* packed = saved.packed.data();
      ctx.device.template attention_forward<T>(packed, packed + view.k_offset, packed + view.v_offset, s, b, heads_local_,
                                               groups_local_, d, scale(), saved.out.data(), saved.lse.data(),
                                               AttentionOptions{view.strides, saved.dropout});
    } else {
      saved.q = Tensor<T, Space>::empty(Shape{s, b, heads_local_, d});
      saved.k = Tensor<T, Space>::empty(Shape{s, b, groups_local_, d});
      saved.v = Tensor<T, Space>::empty(Shape{s, b, groups_local_, d});
      ctx.device.template qkv_split<T>(qkv.data(), s * b, groups_local_, hpg, d, saved.q.data(), saved.k.data(),
                                       saved.v.data());
      if constexpr (std::is_same_v<Position, rope>) {
        ctx.device.template rope_forward<T>(saved.q.data(), s, b * heads_local_, d, config_.rope_base, 0);
        ctx.device.template rope_forward<T>(saved.k.data(), s, b * groups_local_, d, config_.rope_base, 0);
      }
      ctx.device.template attention_forward<T>(saved.q.data(), saved.k.data(), saved.v.data(), s, b, heads_local_,
                                               groups_local_, d, scale(), saved.out.data(), saved.lse.data(),
                                               AttentionOptions{AttentionStrides{}, saved.dropout});
    }
  }

  // This rank's part of a local sequence of s tokens (two chunks of s / 2).
  ContextParallelSplit context_parallel_split(const Context& ctx, index_t s) const {
    if (ctx.cp_comm_type == ContextParallelComm::a2a_p2p)
      fail<ConfigError>("SelfAttention: --cp-comm-type a2a+p2p is not available yet (it needs a two-level cp group); "
                        "context parallelism runs ring attention (--cp-comm-type p2p), all-gather attention (allgather) "
                        "or all-to-all attention (a2a)");
    if (ctx.cp_comm_type == ContextParallelComm::a2a &&
        (heads_local_ % ctx.cp.size() != 0 || groups_local_ % ctx.cp.size() != 0))
      fail<ConfigError>("SelfAttention: --cp-comm-type a2a gives each of the cp=", ctx.cp.size(),
                        " ranks whole query heads and key/value heads, but this tensor-parallel rank has ", heads_local_,
                        " query heads and ", groups_local_, " key/value heads (num_query_groups / tp), which cp does "
                        "not divide; use --cp-comm-type p2p, more query groups, or a smaller cp or tp");
    return strata::context_parallel_split(s * ctx.cp.size(), ctx.cp.size(), ctx.cp.rank(), "SelfAttention");
  }
  // RoPE (or its backward) on q [s, b, np_local, d] and k [s, b, ng_local, d] of the local sequence,
  // each chunk turned by the global position of its first token.
  void rope_by_chunk(Context& ctx, const ContextParallelSplit& split, T* q, T* k, index_t b, bool backward) const {
    const index_t c = split.chunk, d = head_dim_;
    for (int chunk = 0; chunk < 2; ++chunk) {
      const index_t first = split.global_chunk(chunk) * c;
      T* q_chunk = q + chunk * c * b * heads_local_ * d;
      T* k_chunk = k + chunk * c * b * groups_local_ * d;
      if (backward) {
        ctx.device.template rope_backward<T>(q_chunk, c, b * heads_local_, d, config_.rope_base, first);
        ctx.device.template rope_backward<T>(k_chunk, c, b * groups_local_, d, config_.rope_base, first);
      } else {
        ctx.device.template rope_forward<T>(q_chunk, c, b * heads_local_, d, config_.rope_base, first);
        ctx.device.template rope_forward<T>(k_chunk, c, b * groups_local_, d, config_.rope_base, first);
      }
    }
  }
  // The dropout of a2a attention: this rank's heads start at cp rank x heads / cp of the local ones.
  AttentionDropout a2a_dropout(const Context& ctx, AttentionDropout dropout) const {
    dropout.head_offset += static_cast<index_t>(ctx.cp.rank()) * (heads_local_ / ctx.cp.size());
    return dropout;
  }
  // core_forward under context parallelism: q, k, v as copies, RoPE by chunk, ring attention (p2p),
  // or all-to-all attention (a2a: q, k, v, the output and lse are then kept as this rank's heads
  // over the whole sequence).
  void context_parallel_core_forward(Context& ctx, const Tensor<T, Space>& qkv, Saved& saved) const {
    const index_t s = qkv.shape()[0], b = qkv.shape()[1], d = head_dim_, hpg = heads_local_ / groups_local_;
    const ContextParallelSplit split = context_parallel_split(ctx, s);
    saved.lse = Tensor<A, Space>::empty(Shape{2, b, heads_local_, split.chunk});  // per chunk
    saved.q = Tensor<T, Space>::empty(Shape{s, b, heads_local_, d});
    saved.k = Tensor<T, Space>::empty(Shape{s, b, groups_local_, d});
    saved.v = Tensor<T, Space>::empty(Shape{s, b, groups_local_, d});
    ctx.device.template qkv_split<T>(qkv.data(), s * b, groups_local_, hpg, d, saved.q.data(), saved.k.data(),
                                     saved.v.data());
    if constexpr (std::is_same_v<Position, rope>) rope_by_chunk(ctx, split, saved.q.data(), saved.k.data(), b, false);
    if (ctx.cp_comm_type == ContextParallelComm::a2a) {  // whole sequences of heads / cp heads
      const index_t heads = heads_local_ / split.size, groups = groups_local_ / split.size, whole = s * split.size;
      saved.q = sequence_to_heads<T>(ctx, split, saved.q.data(), b, heads_local_, d);  // (s_whole, b, heads, d)
      saved.k = sequence_to_heads<T>(ctx, split, saved.k.data(), b, groups_local_, d);
      saved.v = sequence_to_heads<T>(ctx, split, saved.v.data(), b, groups_local_, d);
      saved.heads_out = Tensor<T, Space>::empty(saved.q.shape());
      saved.lse = Tensor<A, Space>::empty(Shape{b, heads, whole});
      ctx.device.template attention_forward<T>(saved.q.data(), saved.k.data(), saved.v.data(), whole, b, heads, groups, d,
                                               scale(), saved.heads_out.data(), saved.lse.data(),
                                               AttentionOptions{AttentionStrides{}, a2a_dropout(ctx, saved.dropout)});
      heads_to_sequence<T>(ctx, split, saved.heads_out.data(), b, heads_local_, d, saved.out.data());
      return;
    }
    if (ctx.cp_comm_type == ContextParallelComm::allgather)
      allgather_attention_forward<T, A>(ctx, split, saved.q.data(), saved.k.data(), saved.v.data(), b, heads_local_,
                                        groups_local_, d, scale(), saved.out.data(), saved.lse.data(), saved.dropout);
    else
      ring_attention_forward<T, A>(ctx, split, saved.q.data(), saved.k.data(), saved.v.data(), b, heads_local_,
                                   groups_local_, d, scale(), saved.out.data(), saved.lse.data(), saved.dropout);
  }

  // With `deferred`, the qkv and output projections' weight gradients are appended to it.
  Act<Layout> backward_from(Context& ctx, const Saved& saved, const Act<Layout>& dy, DeferredWeightGradients* deferred,
                            bool output_bias_gradient) {
    const index_t s = saved.out.size(0), b = saved.out.size(1), d = head_dim_, hpg = heads_local_ / groups_local_;
    auto dcontext = proj_.backward(ctx, saved.proj, dy, deferred, output_bias_gradient);  // (s, b, np_local * d)
    Act<layout::sharded<-1>> dqkv(Tensor<T, Space>::empty(Shape{s, b, groups_local_ * (hpg + 2) * d}));
    if (context_parallel_) {
      const ContextParallelSplit split = context_parallel_split(ctx, s);
      if (ctx.cp_comm_type == ContextParallelComm::a2a) {
        const index_t heads = heads_local_ / split.size, groups = groups_local_ / split.size, whole = s * split.size;
        const auto dout = sequence_to_heads<T>(ctx, split, dcontext.data(), b, heads_local_, d);  // (s_whole, b, heads, d)
        auto dq_heads = Tensor<T, Space>::empty(saved.q.shape()), dk_heads = Tensor<T, Space>::empty(saved.k.shape()),
             dv_heads = Tensor<T, Space>::empty(saved.v.shape());
        ctx.device.template attention_backward<T>(dout.data(), saved.q.data(), saved.k.data(), saved.v.data(),
                                                  saved.heads_out.data(), saved.lse.data(), whole, b, heads, groups, d,
                                                  scale(), dq_heads.data(), dk_heads.data(), dv_heads.data(),
                                                  AttentionOptions{AttentionStrides{}, a2a_dropout(ctx, saved.dropout)});
        auto dq = Tensor<T, Space>::empty(Shape{s, b, heads_local_, d});
        auto dk = Tensor<T, Space>::empty(Shape{s, b, groups_local_, d}), dv = Tensor<T, Space>::empty(dk.shape());
        heads_to_sequence<T>(ctx, split, dq_heads.data(), b, heads_local_, d, dq.data());
        heads_to_sequence<T>(ctx, split, dk_heads.data(), b, groups_local_, d, dk.data());
        heads_to_sequence<T>(ctx, split, dv_heads.data(), b, groups_local_, d, dv.data());
        if constexpr (std::is_same_v<Position, rope>) rope_by_chunk(ctx, split, dq.data(), dk.data(), b, /*backward=*/true);
        ctx.device.template qkv_merge<T>(dq.data(), dk.data(), dv.data(), s * b, groups_local_, hpg, d, dqkv.data());
        return qkv_.backward(ctx, saved.qkv, dqkv, deferred);
      }
      auto dq = Tensor<T, Space>::empty(saved.q.shape()), dk = Tensor<T, Space>::empty(saved.k.shape()),
           dv = Tensor<T, Space>::empty(saved.v.shape());
      auto blocks_backward = ctx.cp_comm_type == ContextParallelComm::allgather ? allgather_attention_backward<T, A, Context>
                                                                                 : ring_attention_backward<T, A, Context>;
      blocks_backward(ctx, split, dcontext.data(), saved.q.data(), saved.k.data(), saved.v.data(), saved.out.data(),
                      saved.lse.data(), b, heads_local_, groups_local_, d, scale(), dq.data(), dk.data(), dv.data(),
                      saved.dropout);
      if constexpr (std::is_same_v<Position, rope>) rope_by_chunk(ctx, split, dq.data(), dk.data(), b, /*backward=*/true);
      ctx.device.template qkv_merge<T>(dq.data(), dk.data(), dv.data(), s * b, groups_local_, hpg, d, dqkv.data());
      return qkv_.backward(ctx, saved.qkv, dqkv, deferred);
    }
    if (const PackedQkvView view = packed_view(); view.is_view) {
      // dq, dk, dv are views of dqkv that together cover each of its elements once: no zeroing
      const T* packed = saved.packed.data();
      T* dpacked = dqkv.data();
      ctx.device.template attention_backward<T>(dcontext.data(), packed, packed + view.k_offset, packed + view.v_offset,
                                                saved.out.data(), saved.lse.data(), s, b, heads_local_, groups_local_,
                                                d, scale(), dpacked, dpacked + view.k_offset,
                                                dpacked + view.v_offset, AttentionOptions{view.strides, saved.dropout});
      return qkv_.backward(ctx, saved.qkv, dqkv, deferred);
    }
    auto dq = Tensor<T, Space>::empty(saved.q.shape()), dk = Tensor<T, Space>::empty(saved.k.shape()),
         dv = Tensor<T, Space>::empty(saved.v.shape());
    ctx.device.template attention_backward<T>(dcontext.data(), saved.q.data(), saved.k.data(), saved.v.data(),
                                              saved.out.data(), saved.lse.data(), s, b, heads_local_, groups_local_, d,
                                              scale(), dq.data(), dk.data(), dv.data(),
                                              AttentionOptions{AttentionStrides{}, saved.dropout});
    if constexpr (std::is_same_v<Position, rope>) {
      ctx.device.template rope_backward<T>(dq.data(), s, b * heads_local_, d, config_.rope_base, 0);
      ctx.device.template rope_backward<T>(dk.data(), s, b * groups_local_, d, config_.rope_base, 0);
    }
    ctx.device.template qkv_merge<T>(dq.data(), dk.data(), dv.data(), s * b, groups_local_, hpg, d, dqkv.data());
    return qkv_.backward(ctx, saved.qkv, dqkv, deferred);
  }

 public:

  // Megatron's init: N(0, std) for qkv; the output projection scaled by output_stddev.
  void init(Context& ctx, std::uint64_t seed, double stddev, double output_stddev) {
    qkv_.init(ctx, seed, stddev);
    proj_.init(ctx, seed, output_stddev);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    qkv_.for_each_parameter(visit);
    proj_.for_each_parameter(visit);
  }

  static AttentionConfig validated(AttentionConfig c, int tp) {
    if (std::is_same_v<Grouping, mha> || c.num_query_groups == 0) c.num_query_groups = c.num_heads;
    if (c.num_heads <= 0 || c.hidden_size <= 0)
      fail<ConfigError>("SelfAttention: num_attention_heads=", c.num_heads, " and hidden_size=", c.hidden_size, " must be positive");
    if (c.hidden_size % c.num_heads != 0)
      fail<ConfigError>("SelfAttention: num_attention_heads=", c.num_heads, " does not divide hidden_size=", c.hidden_size);
    if ((c.hidden_size / c.num_heads) % 2 != 0 && std::is_same_v<Position, rope>)
      fail<ConfigError>("SelfAttention: rotary embeddings need an even head dimension, got ", c.hidden_size / c.num_heads);
    if (c.num_heads % c.num_query_groups != 0)
      fail<ConfigError>("SelfAttention: num_query_groups=", c.num_query_groups, " does not divide num_attention_heads=", c.num_heads);
    if (!(c.dropout >= 0 && c.dropout < 1))
      fail<ConfigError>("SelfAttention: attention dropout=", c.dropout, " must be in [0, 1) (0 disables dropout)");
    if (c.num_query_groups < tp || c.num_query_groups % tp != 0)
      fail<ConfigError>("SelfAttention: num_query_groups=", c.num_query_groups, " is not a multiple of tp=", tp,
                        "; each tensor-parallel rank must own whole query groups (use more query groups or a smaller tp)");
    return c;
  }

 private:
  A scale() const { return A(1) / std::sqrt(A(head_dim_)); }
  // The local heads as views of the packed projection, or is_view = false where they are not one
  // (several groups of several query heads) or RoPE must rewrite q and k first.
  PackedQkvView packed_view() const {
    if (context_parallel_) return {};
    if constexpr (std::is_same_v<Position, rope>) return {};
    else return packed_qkv_view(groups_local_, heads_local_ / groups_local_, head_dim_);
  }

  AttentionConfig config_;
  index_t heads_local_, groups_local_, head_dim_;
  Qkv qkv_;
  Proj proj_;
  bool recompute_core_ = false;
  bool context_parallel_ = false;  // ctx.cp of more than one rank: ring attention over the local chunks
};

STRATA_NAMESPACE_END
