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
//           when Position = rope, and qkv_merge of dq, dk, dv in the backward (split and RoPE in one
//           pass, RoPE's backward and the merge in one, where the backend has qkv_split_rope and
//           no q/k norm lies between them)
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
// them as without cp, and one all-to-all brings the output back; with a2a+p2p, all-to-all inside
// groups of adjacent cp ranks and the ring across them. All run on every backend (on the GPU the
// ring's transfers overlap the blocks).
//
// Query groups must be a multiple of tp (each rank owns whole groups); fewer groups than tp is
// rejected with a ConfigError before any allocation. Input and output: the residual stream layout.
//
// Run-time options of the block (AttentionConfig), each Megatron's flag:
//   kv_channels (--kv-channels): the head dimension d, 0 for hidden / heads; the projections are
//     then hidden -> groups * (hpg + 2) * d and heads * d -> hidden (Qwen3, Gemma), and the
//     softmax scale is 1 / sqrt(d).
//   qkv_bias (--add-qkv-bias): a bias on the qkv projection even where `bias` is off (Qwen2).
//   qk_norm (--qk-layernorm): a LayerNorm or RMSNorm over the d features of each query and key
//     head after the projection and before RoPE (Qwen3, OLMo 2), its weight [d] shared by all heads
//     and replicated over tp: each rank normalizes its own heads, and the weight gradients of both
//     norms are summed over the tensor-parallel group in one all-reduce. q, k, v are then copies.
//   rope (--rotary-percent, --rotary-interleaved, --use-rope-scaling, --position-embedding-type yarn:
//     backend/rope_options.hpp).
//   window (--window-size): sliding-window attention, query i sees keys i - window .. i (Mistral,
//     gpt-oss's alternating layers); under context parallelism by global positions (the ring skips
//     the blocks wholly before every window).
//   softmax (--softmax-type): attention sinks (backend/attention_options.hpp). off-by-one adds a
//     zero logit to each softmax denominator; learnable adds a learned logit per head, the
//     parameter `softmax_offset` [heads] (Megatron's name), split over tp with the heads (rank r
//     holds heads r x heads / tp onward), initialized N(0, std) as Megatron's init_method, no
//     weight decay (one-dimensional, as Megatron's default). Its gradient is whole on each rank (a
//     rank attends with its own heads over the whole sequence), so it needs no collective. Under
//     context parallelism the ring gives the sink to the diagonal block of each query chunk only,
//     a2a to the rank's heads; each cp rank's gradient is its queries' share (or its heads'), summed
//     with the other gradients over dp x cp.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../backend/attention_options.hpp"
#include "../backend/rope_options.hpp"
#include "../shard/context_parallel.hpp"
#include "../shard/partition.hpp"
#include "column_parallel_linear.hpp"
#include "context_parallel_attention.hpp"
#include "latent_attention.hpp"
#include "norm.hpp"
#include "row_parallel_linear.hpp"

STRATA_NAMESPACE_BEGIN

namespace detail {
// Whether the backend splits the packed projection with RoPE in one pass, and merges with RoPE's
// backward (optional qkv_split_rope / qkv_merge_rope, docs/DEVICE.md).
template <class Device, class T>
concept backend_fuses_qkv_rope = requires(Device& d, const T* ct, T* t, index_t n, double base, const RopeOptions& o) {
  d.template qkv_split_rope<T>(ct, n, n, n, n, n, t, t, t, base, n, o);
  d.template qkv_merge_rope<T>(ct, ct, ct, n, n, n, n, n, t, base, n, o);
};
// Whether the backend's merge with RoPE's backward can write FP8 codes (optional qkv_merge_rope_fp8).
template <class Device, class T>
concept backend_merges_into_fp8 = requires(Device& d, const T* ct, index_t n, double base, const RopeOptions& o,
                                           const Fp8Output& out) {
  d.template qkv_merge_rope_fp8<T>(ct, ct, ct, n, n, n, n, n, base, n, o, out);
};
}  // namespace detail

// Position tags.
struct rope {};     // rotary embedding on queries and keys (Llama)
struct no_rope {};  // positions come from elsewhere (GPT's learned absolute embedding)
// Grouping tags.
struct mha {};  // one key/value head per query head (query_groups is ignored)
struct gqa {};  // query_groups key/value heads shared by heads / query_groups query heads each

// The norm of --qk-layernorm (Megatron takes the model's --normalization for it).
enum class QkNorm { none, layernorm, rmsnorm };

struct AttentionConfig {
  index_t hidden_size = 0;
  int num_heads = 0;
  int num_query_groups = 0;  // 0: same as num_heads
  double rope_base = 10000.0;
  bool bias = true;  // biases on the qkv and output projections
  double dropout = 0.0;  // on the attention probabilities (training forward and its backward)
  int kv_channels = 0;       // the head dimension (--kv-channels); 0: hidden_size / num_heads
  bool qkv_bias = false;     // a bias on the qkv projection even without `bias` (--add-qkv-bias)
  QkNorm qk_norm = QkNorm::none;  // --qk-layernorm: a norm over each head of q and k before RoPE
  double qk_norm_epsilon = 1e-5;
  bool qk_norm_zero_centered = false;  // --apply-layernorm-1p for the qk norms too
  RopeOptions rope{};  // rotary_dim (--rotary-percent), interleaved, Llama 3.1 scaling
  index_t window = -1;  // sliding window (--window-size): query i sees keys i - window .. i; -1: all
  SoftmaxType softmax = SoftmaxType::vanilla;  // attention sinks (--softmax-type)
  LatentAttentionConfig latent{};  // multi-latent attention (--multi-latent-attention; with rope only)
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
    // qk_norm only: the norms' saved inputs (q and k before the norm) and statistics
    typename LayerNorm<Policy>::Saved q_layernorm, k_layernorm;
    typename RmsNorm<Policy>::Saved q_rmsnorm, k_rmsnorm;
    typename LatentAttention<Policy>::Saved latent;  // multi-latent attention: everything it keeps (the rest empty)
  };

  // Whether attention reads q, k, v as views of the packed projection (see the note at the top).
  bool reads_packed_qkv() const { return packed_view().is_view; }

  // (ctx is not const: the qk norms, when configured, set their weights to their initial constants.)
  SelfAttention(Context& ctx, std::string name, AttentionConfig config)
      : config_(validated(config, ctx.tp.size())),
        heads_local_(heads_per_rank(config_.num_heads, ctx.tp.size())),
        groups_local_(query_groups_per_rank(config_.num_query_groups, ctx.tp.size())),
        head_dim_(config_.kv_channels),
        context_parallel_(ctx.cp.size() > 1) {
    if constexpr (std::is_same_v<Position, rope>) {
      if (config_.latent.enabled()) {
        latent_.emplace(ctx, name, config_.hidden_size, config_.num_heads, config_.latent, config_.bias, config_.rope,
                        config_.rope_base);
        return;
      }
    }
    qkv_.emplace(ctx, name + ".qkv", config_.hidden_size,
                 static_cast<index_t>(config_.num_query_groups) * (config_.num_heads / config_.num_query_groups + 2) *
                     config_.kv_channels,
                 config_.bias || config_.qkv_bias);
    proj_.emplace(ctx, name + ".proj", static_cast<index_t>(config_.num_heads) * config_.kv_channels, config_.hidden_size,
                  config_.bias);
    if (config_.qk_norm == QkNorm::layernorm) {
      q_layernorm_.emplace(ctx, name + ".q_norm", head_dim_, config_.qk_norm_epsilon, config_.qk_norm_zero_centered);
      k_layernorm_.emplace(ctx, name + ".k_norm", head_dim_, config_.qk_norm_epsilon, config_.qk_norm_zero_centered);
    } else if (config_.qk_norm == QkNorm::rmsnorm) {
      q_rmsnorm_.emplace(ctx, name + ".q_norm", head_dim_, config_.qk_norm_epsilon, config_.qk_norm_zero_centered);
      k_rmsnorm_.emplace(ctx, name + ".k_norm", head_dim_, config_.qk_norm_epsilon, config_.qk_norm_zero_centered);
    }
    if (config_.softmax == SoftmaxType::learnable)
      sinks_.emplace(name + ".softmax_offset", Shape{config_.num_heads}, ShardSpec::split(0, ctx.tp.rank(), ctx.tp.size()),
                     /*decay=*/false);
  }

  // Plans the attention of a [s, b] input now (backend prepare_attention): its forward, and its
  // backward when `backward`. Optional; the first call of a shape plans it otherwise. With dropout
  // the training calls need no plan (the CUDA backend runs them on its flash kernels): only the
  // forward without dropout (evaluation) is planned.
  // `s` is the whole sequence's length. Under context parallelism the calls are the blocks of s /
  // (2 cp) queries (causal and not), or with a2a whole sequences of heads / cp heads.
  void prepare(Context& ctx, index_t s, index_t b, bool backward) const {
    const bool plan_backward = backward && config_.dropout <= 0;
    if (latent_) {
      latent_->prepare(ctx, s, b, plan_backward);
      return;
    }
    if (!context_parallel_) {
      ctx.device.template prepare_attention<T>(s, b, heads_local_, groups_local_, head_dim_, plan_backward,
                                               options_of(packed_view().strides, {}));
      return;
    }
    (void)context_parallel_split(ctx, s / ctx.cp.size());  // checks the length
    prepare_context_parallel_attention<T>(ctx, s / ctx.cp.size(), b, heads_local_, groups_local_, head_dim_, plan_backward,
                                          options_of({}, {}), "SelfAttention");
  }

  // dropout_key: the key of this micro-batch's attention dropout mask (distinct per layer and
  // micro-batch; TransformerLayer derives it); none, or a dropout of 0, runs without dropout.
  // With `given`: the qkv projection's input codes (fp8_input_state, fp8_input_of), x for its layout alone.
  std::pair<Act<Layout>, Saved> forward(Context& ctx, const Act<Layout>& x,
                                        std::optional<std::uint64_t> dropout_key = std::nullopt,
                                        detail::Fp8Pair<Space>* given = nullptr) const {
    Saved saved;
    if (dropout_key && config_.dropout > 0)
      saved.dropout = AttentionDropout{config_.dropout, *dropout_key, static_cast<index_t>(ctx.tp.rank()) * heads_local_};
    if constexpr (std::is_same_v<Position, rope>) {
      if (latent_) {
        auto [y, latent_saved] = latent_->forward(ctx, x, saved.dropout, recompute_core_);
        saved.latent = std::move(latent_saved);
        return {std::move(y), std::move(saved)};
      }
    }
    auto [qkv, qkv_saved] = qkv_->forward(ctx, x, given);  // (s, b, groups_local * (hpg + 2) * d)
    saved.qkv = std::move(qkv_saved);
    core_forward(ctx, qkv.tensor, saved);
    auto [y, proj_saved] = proj_->forward(ctx, Act<layout::sharded<-1>>(saved.out));
    saved.proj = std::move(proj_saved);
    if (recompute_core_) {  // keep the core's input only; backward runs the core again
      saved.qkv_output = std::move(qkv.tensor);
      saved.q = saved.k = saved.v = saved.out = saved.packed = saved.heads_out = Tensor<T, Space>();
      saved.lse = Tensor<A, Space>();
      saved.proj = {};  // the input, or under FP8 the codes kept in its place
      saved.q_layernorm = {}, saved.k_layernorm = {};
      saved.q_rmsnorm = {}, saved.k_rmsnorm = {};
    } else {  // saved.out stays for the core's backward: the projection may hold it instead of its codes
      proj_->fp8_hold_input_instead_of_codes(ctx, saved.proj, saved.out);
    }
    return {std::move(y), std::move(saved)};
  }

  // With `deferred`, the qkv and output projections' weight gradients are appended to it. Without
  // `output_bias_gradient`, the output projection's bias gradient is left to the caller
  // (RowParallelLinear::backward).
  Act<Layout> backward(Context& ctx, const Saved& stored, const Act<Layout>& dy, DeferredWeightGradients* deferred = nullptr,
                       bool output_bias_gradient = true) {
    if constexpr (std::is_same_v<Position, rope>)
      if (latent_) return latent_->backward(ctx, stored.latent, dy, deferred, output_bias_gradient);
    if (!stored.qkv_output.empty()) {  // selective recompute: the core's tensors again, then the backward
      Saved saved = stored;
      core_forward(ctx, saved.qkv_output, saved);
      saved.proj.input = saved.out;
      return backward_from(ctx, saved, dy, deferred, output_bias_gradient);
    }
    return backward_from(ctx, stored, dy, deferred, output_bias_gradient);
  }
  // The output projection's bias (null without one).
  Parameter<T, Space>* output_bias() { return latent_ ? latent_->output_bias() : proj_->bias(); }

  // On: forward keeps only the qkv output and backward recomputes the attention core (see above).
  void set_recompute_core(bool on) { recompute_core_ = on; }
  bool recompute_core() const { return recompute_core_; }

  // The FP8 state for which a norm before this attention may write the qkv projection's input codes
  // (ColumnParallelLinear::fp8_input_state; none under multi-latent attention), or null; and those
  // codes (fp8_input_of), for forward(ctx, x, key, &given).
  Fp8State<Space>* fp8_input_state(const Context& ctx) const { return qkv_ ? qkv_->fp8_input_state(ctx) : nullptr; }
  template <class Write>
  detail::Fp8Pair<Space> fp8_input_of(Context& ctx, const Shape& x, Write&& write) const {
    return qkv_->fp8_input_of(ctx, x, std::forward<Write>(write));
  }

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
                                               options_of(view.strides, saved.dropout));
    } else {
      saved.q = Tensor<T, Space>::empty(Shape{s, b, heads_local_, d});
      saved.k = Tensor<T, Space>::empty(Shape{s, b, groups_local_, d});
      saved.v = Tensor<T, Space>::empty(Shape{s, b, groups_local_, d});
      if constexpr (fuses_rope) {
        if (!has_qk_norm()) {  // the split and RoPE in one pass
          ctx.device.template qkv_split_rope<T>(qkv.data(), s, b, groups_local_, hpg, d, saved.q.data(), saved.k.data(),
                                                saved.v.data(), config_.rope_base, 0, config_.rope);
          ctx.device.template attention_forward<T>(saved.q.data(), saved.k.data(), saved.v.data(), s, b, heads_local_,
                                                   groups_local_, d, scale(), saved.out.data(), saved.lse.data(),
                                                   options_of(AttentionStrides{}, saved.dropout));
          return;
        }
      }
      ctx.device.template qkv_split<T>(qkv.data(), s * b, groups_local_, hpg, d, saved.q.data(), saved.k.data(),
                                       saved.v.data());
      qk_norm_forward(ctx, saved);
      if constexpr (std::is_same_v<Position, rope>) {
        ctx.device.template rope_forward<T>(saved.q.data(), s, b * heads_local_, d, config_.rope_base, 0, config_.rope);
        ctx.device.template rope_forward<T>(saved.k.data(), s, b * groups_local_, d, config_.rope_base, 0, config_.rope);
      }
      ctx.device.template attention_forward<T>(saved.q.data(), saved.k.data(), saved.v.data(), s, b, heads_local_,
                                               groups_local_, d, scale(), saved.out.data(), saved.lse.data(),
                                               options_of(AttentionStrides{}, saved.dropout));
    }
  }

  // Whether q, k, v are split with RoPE in the same pass (and dq, dk turned back in the merge): rope
  // on a backend with qkv_split_rope / qkv_merge_rope, and no q/k norm between the two (core_forward).
  static constexpr bool fuses_rope =
      std::is_same_v<Position, rope> && detail::backend_fuses_qkv_rope<typename Policy::backend, T>;
  bool has_qk_norm() const { return q_layernorm_.has_value() || q_rmsnorm_.has_value(); }

  // This rank's part of a local sequence of s tokens (two chunks of s / 2).
  ContextParallelSplit context_parallel_split(const Context& ctx, index_t s) const {
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
        ctx.device.template rope_backward<T>(q_chunk, c, b * heads_local_, d, config_.rope_base, first, config_.rope);
        ctx.device.template rope_backward<T>(k_chunk, c, b * groups_local_, d, config_.rope_base, first, config_.rope);
      } else {
        ctx.device.template rope_forward<T>(q_chunk, c, b * heads_local_, d, config_.rope_base, first, config_.rope);
        ctx.device.template rope_forward<T>(k_chunk, c, b * groups_local_, d, config_.rope_base, first, config_.rope);
      }
    }
  }
  // core_forward under context parallelism: q, k, v as copies, RoPE by chunk, then the comm type's
  // core (context_parallel_attention_forward says what it keeps).
  void context_parallel_core_forward(Context& ctx, const Tensor<T, Space>& qkv, Saved& saved) const {
    const index_t s = qkv.shape()[0], b = qkv.shape()[1], d = head_dim_, hpg = heads_local_ / groups_local_;
    const ContextParallelSplit split = context_parallel_split(ctx, s);
    saved.q = Tensor<T, Space>::empty(Shape{s, b, heads_local_, d});
    saved.k = Tensor<T, Space>::empty(Shape{s, b, groups_local_, d});
    saved.v = Tensor<T, Space>::empty(Shape{s, b, groups_local_, d});
    ctx.device.template qkv_split<T>(qkv.data(), s * b, groups_local_, hpg, d, saved.q.data(), saved.k.data(),
                                     saved.v.data());
    qk_norm_forward(ctx, saved);
    if constexpr (std::is_same_v<Position, rope>) rope_by_chunk(ctx, split, saved.q.data(), saved.k.data(), b, false);
    context_parallel_attention_forward<T, A>(ctx, b, heads_local_, groups_local_, d, scale(), options_of({}, saved.dropout),
                                             saved.q, saved.k, saved.v, saved.heads_out, saved.lse, saved.out.data(),
                                             "SelfAttention");
  }

  // With `deferred`, the qkv and output projections' weight gradients are appended to it.
  Act<Layout> backward_from(Context& ctx, const Saved& saved, const Act<Layout>& dy, DeferredWeightGradients* deferred,
                            bool output_bias_gradient) {
    const index_t s = saved.out.size(0), b = saved.out.size(1), d = head_dim_, hpg = heads_local_ / groups_local_;
    auto dcontext = proj_->backward(ctx, saved.proj, dy, deferred, output_bias_gradient);  // (s, b, np_local * d)
    Act<layout::sharded<-1>> dqkv(Tensor<T, Space>::empty(Shape{s, b, groups_local_ * (hpg + 2) * d}));
    if (context_parallel_) {
      const ContextParallelSplit split = context_parallel_split(ctx, s);
      auto dq = Tensor<T, Space>::empty(Shape{s, b, heads_local_, d});
      auto dk = Tensor<T, Space>::empty(Shape{s, b, groups_local_, d}), dv = Tensor<T, Space>::empty(dk.shape());
      context_parallel_attention_backward<T, A>(ctx, b, heads_local_, groups_local_, d, scale(),
                                                backward_options_of({}, saved.dropout), saved.q, saved.k, saved.v,
                                                saved.heads_out, saved.lse, saved.out.data(), dcontext.data(), s, dq.data(),
                                                dk.data(), dv.data(), "SelfAttention");
      if constexpr (std::is_same_v<Position, rope>) rope_by_chunk(ctx, split, dq.data(), dk.data(), b, /*backward=*/true);
      qk_norm_backward(ctx, saved, dq, dk);
      ctx.device.template qkv_merge<T>(dq.data(), dk.data(), dv.data(), s * b, groups_local_, hpg, d, dqkv.data());
      return qkv_->backward(ctx, saved.qkv, dqkv, deferred);
    }
    if (const PackedQkvView view = packed_view(); view.is_view) {
      // dq, dk, dv are views of dqkv that together cover each of its elements once: no zeroing
      const T* packed = saved.packed.data();
      T* dpacked = dqkv.data();
      ctx.device.template attention_backward<T>(dcontext.data(), packed, packed + view.k_offset, packed + view.v_offset,
                                                saved.out.data(), saved.lse.data(), s, b, heads_local_, groups_local_,
                                                d, scale(), dpacked, dpacked + view.k_offset,
                                                dpacked + view.v_offset, backward_options_of(view.strides, saved.dropout));
      return qkv_->backward(ctx, saved.qkv, dqkv, deferred);
    }
    auto dq = Tensor<T, Space>::empty(saved.q.shape()), dk = Tensor<T, Space>::empty(saved.k.shape()),
         dv = Tensor<T, Space>::empty(saved.v.shape());
    ctx.device.template attention_backward<T>(dcontext.data(), saved.q.data(), saved.k.data(), saved.v.data(),
                                              saved.out.data(), saved.lse.data(), s, b, heads_local_, groups_local_, d,
                                              scale(), dq.data(), dk.data(), dv.data(),
                                              backward_options_of(AttentionStrides{}, saved.dropout));
    if constexpr (fuses_rope) {
      if (!has_qk_norm()) {  // RoPE's backward and the merge in one pass
        if constexpr (detail::backend_merges_into_fp8<typename Policy::backend, T>) {
          if (qkv_->fp8_grad_state(ctx)) {  // the merge writes the qkv projection's output-gradient codes
            auto given = qkv_->fp8_output_gradient_of(ctx, dqkv.shape(), [&](const Fp8Output& out) {
              ctx.device.template qkv_merge_rope_fp8<T>(dq.data(), dk.data(), dv.data(), s, b, groups_local_, hpg, d,
                                                        config_.rope_base, 0, config_.rope, out);
            });
            return qkv_->backward(ctx, saved.qkv, dqkv, deferred, &given);  // dqkv: its shape alone
          }
        }
        ctx.device.template qkv_merge_rope<T>(dq.data(), dk.data(), dv.data(), s, b, groups_local_, hpg, d, dqkv.data(),
                                              config_.rope_base, 0, config_.rope);
        return qkv_->backward(ctx, saved.qkv, dqkv, deferred);
      }
    }
    if constexpr (std::is_same_v<Position, rope>) {
      ctx.device.template rope_backward<T>(dq.data(), s, b * heads_local_, d, config_.rope_base, 0, config_.rope);
      ctx.device.template rope_backward<T>(dk.data(), s, b * groups_local_, d, config_.rope_base, 0, config_.rope);
    }
    qk_norm_backward(ctx, saved, dq, dk);
    ctx.device.template qkv_merge<T>(dq.data(), dk.data(), dv.data(), s * b, groups_local_, hpg, d, dqkv.data());
    return qkv_->backward(ctx, saved.qkv, dqkv, deferred);
  }

 public:

  // Megatron's init: N(0, std) for qkv; the output projection scaled by output_stddev.
  void init(Context& ctx, std::uint64_t seed, double stddev, double output_stddev) {
    if (latent_) {
      latent_->init(ctx, seed, stddev, output_stddev);
      return;
    }
    qkv_->init(ctx, seed, stddev);
    proj_->init(ctx, seed, output_stddev);
    if (q_layernorm_) {
      q_layernorm_->init(ctx, seed, stddev);
      k_layernorm_->init(ctx, seed, stddev);
    }
    if (q_rmsnorm_) {
      q_rmsnorm_->init(ctx, seed, stddev);
      k_rmsnorm_->init(ctx, seed, stddev);
    }
    if (sinks_) init_normal(ctx.device, *sinks_, seed, stddev);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    if (latent_) {
      latent_->for_each_parameter(visit);
      return;
    }
    qkv_->for_each_parameter(visit);
    proj_->for_each_parameter(visit);
    if (q_layernorm_) {
      q_layernorm_->for_each_parameter(visit);
      k_layernorm_->for_each_parameter(visit);
    }
    if (q_rmsnorm_) {
      q_rmsnorm_->for_each_parameter(visit);
      k_rmsnorm_->for_each_parameter(visit);
    }
    if (sinks_) visit(*sinks_);
  }

  // Multi-latent attention's sizes, and the options it does not take yet.
  static void validate_latent(const AttentionConfig& c) {
    const LatentAttentionConfig& l = c.latent;
    if constexpr (!std::is_same_v<Position, rope>)
      fail<ConfigError>("SelfAttention: multi-latent attention needs rotary embeddings (its keys' and queries' "
                        "qk_pos_emb_head_dim part); this model uses learned positions (--position-embedding-type learned_absolute)");
    if (l.q_lora_rank < 0 || l.qk_head_dim <= 0 || l.qk_pos_emb_head_dim <= 0 || l.qk_pos_emb_head_dim % 2 != 0 ||
        l.v_head_dim <= 0 || !(std::isfinite(l.norm_epsilon) && l.norm_epsilon > 0))
      fail<ConfigError>("SelfAttention: multi-latent attention needs --kv-lora-rank > 0 (", l.kv_lora_rank,
                        "), --q-lora-rank >= 0 (", l.q_lora_rank, "; 0: no query compression), --qk-head-dim > 0 (",
                        l.qk_head_dim, "), an even --qk-pos-emb-head-dim > 0 (", l.qk_pos_emb_head_dim,
                        ") and --v-head-dim > 0 (", l.v_head_dim, ")");
    if (l.v_head_dim > l.head_dim())
      fail<ConfigError>("SelfAttention: multi-latent attention with --v-head-dim ", l.v_head_dim,
                        " wider than --qk-head-dim + --qk-pos-emb-head-dim = ", l.head_dim(),
                        " is not available (values are padded to the query/key head dimension); use --v-head-dim <= ", l.head_dim());
    const char* other = c.window >= 0                           ? "a sliding window (--window-size)"
                        : c.softmax != SoftmaxType::vanilla     ? "attention sinks (--softmax-type)"
                        : c.qk_norm != QkNorm::none             ? "norms on each head of q and k (its norms are the latents', LatentAttentionConfig::latent_norms)"
                        : c.qkv_bias                            ? "--add-qkv-bias"
                        : c.rope.rotary_dim > 0                 ? "--rotary-percent below 1 (the qk_pos_emb_head_dim part turns whole)"
                        : nullptr;
    if (other)
      fail<ConfigError>("SelfAttention: multi-latent attention with ", other, " is not available yet; drop one of the two");
  }

  static AttentionConfig validated(AttentionConfig c, int tp) {
    if (std::is_same_v<Grouping, mha> || c.num_query_groups == 0) c.num_query_groups = c.num_heads;
    if (c.latent.enabled()) {  // every head has its own keys and values, of the latent's head dimension
      c.num_query_groups = c.num_heads;
      c.kv_channels = static_cast<int>(c.latent.head_dim());
      validate_latent(c);
    }
    if (c.window < -1)
      fail<ConfigError>("SelfAttention: window=", c.window, " must be -1 (no sliding window) or a number of keys >= 0");
    if (c.num_heads <= 0 || c.hidden_size <= 0)
      fail<ConfigError>("SelfAttention: num_attention_heads=", c.num_heads, " and hidden_size=", c.hidden_size, " must be positive");
    if (c.kv_channels < 0)
      fail<ConfigError>("SelfAttention: kv_channels=", c.kv_channels, " must be positive (or 0 for hidden_size / num_attention_heads)");
    if (c.kv_channels == 0 && c.hidden_size % c.num_heads != 0)
      fail<ConfigError>("SelfAttention: num_attention_heads=", c.num_heads, " does not divide hidden_size=", c.hidden_size,
                        "; give the head dimension with --kv-channels");
    if (c.kv_channels == 0) c.kv_channels = static_cast<int>(c.hidden_size / c.num_heads);
    if constexpr (std::is_same_v<Position, rope>) {
      const index_t rotary_dim = rope_rotary_dim(c.rope, c.kv_channels);
      if (rotary_dim % 2 != 0 || rotary_dim > c.kv_channels)
        fail<ConfigError>("SelfAttention: rotary embeddings turn pairs of dimensions, but the rotary width is ", rotary_dim,
                          " of a head dimension of ", c.kv_channels,
                          " (kv_channels x --rotary-percent); choose a --rotary-percent that gives an even width");
      if (c.rope.scaling_factor < 0 || !std::isfinite(c.rope.scaling_factor) ||
          (c.rope.scaling_factor > 0 && !(c.rope.high_freq_factor > c.rope.low_freq_factor && c.rope.low_freq_factor > 0 &&
                                          c.rope.original_max_positions > 0)))
        fail<ConfigError>("SelfAttention: rope scaling factor=", c.rope.scaling_factor, " (low ", c.rope.low_freq_factor,
                          ", high ", c.rope.high_freq_factor, ", original context ", c.rope.original_max_positions,
                          ") must be >= 0 with 0 < low < high and a positive original context (Llama 3.1: 8, 1, 4, 8192)");
      const RopeOptions& r = c.rope;
      if (!(std::isfinite(r.yarn_factor) && r.yarn_factor >= 0) ||
          (r.yarn() && (r.scaling_factor > 0 || !(r.yarn_original_max_positions > 0) || !(r.yarn_beta_slow > 0) ||
                        !(r.yarn_beta_fast > r.yarn_beta_slow) || !std::isfinite(r.yarn_beta_fast) ||
                        !(rope_yarn_mscale(r.yarn_factor, r.yarn_mscale_all_dim) > 0) || !std::isfinite(r.yarn_mscale))))
        fail<ConfigError>("SelfAttention: YaRN factor=", r.yarn_factor, " (original context ", r.yarn_original_max_positions,
                          ", beta_fast ", r.yarn_beta_fast, ", beta_slow ", r.yarn_beta_slow, ", mscale ", r.yarn_mscale,
                          ", mscale_all_dim ", r.yarn_mscale_all_dim, ") must be >= 0, without Llama 3.1's scaling, with a "
                          "positive original context, 0 < beta_slow < beta_fast and finite mscales (gpt-oss: 32, 4096, 32, 1)");
    }
    if (c.qk_norm != QkNorm::none && !(std::isfinite(c.qk_norm_epsilon) && c.qk_norm_epsilon > 0))
      fail<ConfigError>("SelfAttention: qk_norm_epsilon=", c.qk_norm_epsilon, " must be a finite positive number");
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
  // The options of this layer's attention calls (and of the context-parallel core): its window with `strides`
  // and `dropout`.
  AttentionOptions options_of(AttentionStrides strides, AttentionDropout dropout) const {
    AttentionOptions options{strides, dropout};
    options.window = config_.window;
    options.softmax = config_.softmax;
    if (sinks_) options.sinks = sinks_->value.data();
    return options;
  }
  // The options of the backward: those of the forward, and the sink logits' gradient to add to.
  AttentionOptions backward_options_of(AttentionStrides strides, AttentionDropout dropout) {
    AttentionOptions options = options_of(strides, dropout);
    if (sinks_) options.sink_gradient = sinks_->grad.data();
    return options;
  }
  A scale() const { return A(1) / std::sqrt(A(head_dim_)); }
  // The local heads as views of the packed projection, or is_view = false where they are not one
  // (several groups of several query heads) or RoPE must rewrite q and k first.
  PackedQkvView packed_view() const {
    if (context_parallel_ || config_.qk_norm != QkNorm::none) return {};
    if constexpr (std::is_same_v<Position, rope>) return {};
    else return packed_qkv_view(groups_local_, heads_local_ / groups_local_, head_dim_);
  }

  // --qk-layernorm: q [s, b, np_local, d] and k [s, b, ng_local, d] of `saved` normalized over d
  // in place, each norm's input and statistics kept in `saved` (rows: every (token, head) of this
  // rank, so the layout is that of rows split over tp: sharded<0>).
  void qk_norm_forward(Context& ctx, Saved& saved) const {
    if (config_.qk_norm == QkNorm::none) return;
    using Rows = Act<layout::sharded<0>>;
    if (q_layernorm_) {
      auto [q, qs] = q_layernorm_->forward(ctx, Rows(saved.q));
      auto [k, ks] = k_layernorm_->forward(ctx, Rows(saved.k));
      saved.q = std::move(q.tensor), saved.k = std::move(k.tensor);
      saved.q_layernorm = std::move(qs), saved.k_layernorm = std::move(ks);
    } else {
      auto [q, qs] = q_rmsnorm_->forward(ctx, Rows(saved.q));
      auto [k, ks] = k_rmsnorm_->forward(ctx, Rows(saved.k));
      saved.q = std::move(q.tensor), saved.k = std::move(k.tensor);
      saved.q_rmsnorm = std::move(qs), saved.k_rmsnorm = std::move(ks);
    }
  }
  // dq, dk (after RoPE's backward) become the gradients of q and k before the norms; the norms'
  // weight increments of this rank's heads are summed over tp in one all-reduce.
  void qk_norm_backward(Context& ctx, const Saved& saved, Tensor<T, Space>& dq, Tensor<T, Space>& dk) {
    if (config_.qk_norm == QkNorm::none) return;
    using Rows = Act<layout::sharded<0>>;
    std::vector<Parameter<T, Space>*> params;
    auto run = [&](auto& q_norm, auto& k_norm, const auto& q_saved, const auto& k_saved) {
      const index_t first = q_norm->partial_size();
      auto partials = Tensor<A, Space>::empty(Shape{first + k_norm->partial_size()});
      dq = q_norm->template backward_partial<layout::sharded<0>>(ctx, q_saved, Rows(dq), nullptr, partials.data()).tensor;
      dk = k_norm->template backward_partial<layout::sharded<0>>(ctx, k_saved, Rows(dk), nullptr, partials.data() + first).tensor;
      q_norm->for_each_parameter([&](Parameter<T, Space>& p) { params.push_back(&p); });
      k_norm->for_each_parameter([&](Parameter<T, Space>& p) { params.push_back(&p); });
      add_replicated_gradients<layout::sharded<0>>(ctx.device, ctx.tp, partials,
                                                   std::span<Parameter<T, Space>* const>(params.data(), params.size()));
    };
    if (q_layernorm_) run(q_layernorm_, k_layernorm_, saved.q_layernorm, saved.k_layernorm);
    else run(q_rmsnorm_, k_rmsnorm_, saved.q_rmsnorm, saved.k_rmsnorm);
  }

  AttentionConfig config_;
  index_t heads_local_, groups_local_, head_dim_;
  std::optional<Qkv> qkv_;    // empty under multi-latent attention
  std::optional<Proj> proj_;  // empty under multi-latent attention (latent_ has its own)
  std::optional<LatentAttention<Policy>> latent_;  // multi-latent attention (config_.latent), rope only
  std::optional<LayerNorm<Policy>> q_layernorm_, k_layernorm_;  // qk_norm layernorm
  std::optional<RmsNorm<Policy>> q_rmsnorm_, k_rmsnorm_;        // qk_norm rmsnorm
  std::optional<Parameter<T, Space>> sinks_;                    // softmax learnable: softmax_offset [heads] split over tp
  bool recompute_core_ = false;
  bool context_parallel_ = false;  // ctx.cp of more than one rank: ring attention over the local chunks
};

STRATA_NAMESPACE_END
