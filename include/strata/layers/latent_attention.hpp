// strata/layers/latent_attention.hpp: `LatentAttention<Policy>`, multi-latent attention (DeepSeek-V2 and
// V3, Megatron's --multi-latent-attention), causal, with RoPE, heads split over the tensor-parallel
// group. SelfAttention<Policy, rope, ...> runs it in place of its packed qkv projection when
// AttentionConfig::latent is set, so the Llama and Mixtral models of the trainers carry it without
// another compiled model.
//
// With n heads, dn = qk_head_dim, dr = qk_pos_emb_head_dim, dv = v_head_dim, D = dn + dr:
//   queries:   q_lora_rank > 0: c_q = x Wq_down^T [rq] (replicated), RMSNorm*, q = c_q Wq_up^T
//              (column-parallel, n * D); otherwise q = x Wq^T (column-parallel, n * D)
//   keys/vals: [c_kv | k_pe] = x Wkv_down^T [rkv + dr] (replicated); c_kv RMSNorm*;
//              [k_nope | v] = c_kv Wkv_up^T (column-parallel, n * (dn + dv))
//   each head: q_h = [q_nope | rope(q_pe)], k_h = [k_nope_h | rope(k_pe)] (k_pe shared by the heads),
//              attention with head dimension D and softmax scale 1 / sqrt(D); v is padded with zeros to
//              D columns (the attention's own head dimension), and the output's first dv columns kept
//   output:    RowParallelLinear n * dv -> hidden
// The head layout of each projection is Megatron's: per head, q = [nope | pe] and kv = [k_nope | v].
// * The latent RMSNorms exist with LatentAttentionConfig::latent_norms (Megatron: --qk-layernorm,
//   which its DeepSeek-V3 example passes; DeepSeek-V3 always has them).
//
// Tensor parallelism as Megatron shards it: the down projections and the latent norms are
// replicated, the up projections and the output projection split by heads. Every rank runs the
// down projections on the whole sequence (gathered first under sequence parallelism); their weight
// gradients and those of the latent norms are this rank's heads' share, summed over tp in one
// all-reduce, and the input's gradient is reduced as a column-parallel layer's (all-reduce, or
// reduce-scatter under sequence parallelism).
//
// Context parallelism (ctx.cp of more than one rank): everything but the attention is per token and
// runs on the rank's two chunks; RoPE turns each chunk by its global positions, and the attention
// of q, k and the padded v (head dimension D) is that of SelfAttention under cp: ring attention
// (p2p), the same blocks against the gathered keys and values (allgather), or all-to-all (a2a: the
// heads of this tp rank must divide over cp).
//
// RoPE turns the dr dimensions of q and k_pe as AttentionConfig::rope says (DeepSeek's and Megatron's
// multi-latent attention: interleaved pairs); under YaRN the softmax scale is 1 / sqrt(D) times
// mscale(factor, mscale_all_dim)^2, as DeepSeek-V3 scales it, and cos and sin carry YaRN's attention
// factor as for every head.
//
// Not yet: sliding windows, cp a2a+p2p,
// attention sinks and qk norms with a latent (refused by SelfAttention::validated). Under FP8 only the
// output projection runs in FP8; the down and up projections run in the element type.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../backend/attention_options.hpp"
#include "../backend/rope_options.hpp"
#include "../shard/context_parallel.hpp"
#include "column_parallel_linear.hpp"
#include "context_parallel_attention.hpp"
#include "norm.hpp"
#include "row_parallel_linear.hpp"

STRATA_NAMESPACE_BEGIN

// Multi-latent attention's sizes (Megatron's flags). kv_lora_rank > 0 turns it on.
struct LatentAttentionConfig {
  index_t q_lora_rank = 0;          // --q-lora-rank: 0 projects the queries from the hidden state directly
  index_t kv_lora_rank = 0;         // --kv-lora-rank
  index_t qk_head_dim = 0;          // --qk-head-dim: the part of each query/key head without RoPE
  index_t qk_pos_emb_head_dim = 0;  // --qk-pos-emb-head-dim: the part with RoPE (shared by the heads in k)
  index_t v_head_dim = 0;           // --v-head-dim
  double norm_epsilon = 1e-5;       // the latent RMSNorms'
  bool latent_norms = true;         // RMSNorm on c_q and c_kv (Megatron: with --qk-layernorm; DeepSeek always)
  bool enabled() const { return kv_lora_rank > 0; }
  index_t head_dim() const { return qk_head_dim + qk_pos_emb_head_dim; }
};

template <class Policy>
class LatentAttention {
 public:
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Context = context_t<Policy>;
  using Space = space_t<Policy>;
  template <class L>
  using Act = Activation<T, L, Space>;
  using Layout = residual_layout_t<Policy>;
  using Up = ColumnParallelLinear<Policy>;
  using Proj = RowParallelLinear<Policy>;
  using Param = Parameter<T, Space>;

  struct Saved {
    Tensor<T, Space> x;                                   // the whole-sequence input [S, b, hidden]
    Tensor<T, Space> q_latent;                            // q_lora_rank > 0: c_q [S, b, rq] (normalized with the latent norms)
    Tensor<T, Space> kv_latent;                           // c_kv [S, b, rkv] (normalized with the latent norms)
    typename RmsNorm<Policy>::Saved q_norm, kv_norm;
    Tensor<T, Space> q_raw, kv, k_pe_raw;                 // recompute only: the core's inputs (q before RoPE, [k_nope | v], k_pe)
    Tensor<T, Space> q, k, v;                             // [S, b, n_local, D]: q and k after RoPE, v padded with zeros
    Tensor<T, Space> out;                                 // [S, b, n_local, D]: the attention's output (columns past dv zero)
    Tensor<A, Space> lse;                                 // [b, n_local, S]; under cp p2p/allgather [2, b, n_local, S / 2]
    Tensor<T, Space> heads_out;                           // cp a2a only: the output of this rank's heads over the whole sequence
    typename Proj::Saved proj;                            // its input: out's first dv columns [S, b, n_local * dv]
    AttentionDropout dropout;
  };

  LatentAttention(Context& ctx, const std::string& name, index_t hidden, int heads, LatentAttentionConfig c, bool bias,
                  RopeOptions rope, double rope_base)
      : c_(c), heads_local_(heads / ctx.tp.size()), hidden_(hidden), rope_(rope), rope_base_(rope_base),
        kv_down_(name + ".kv_down.weight", Shape{c.kv_lora_rank + c.qk_pos_emb_head_dim, hidden}, ShardSpec::replicated()),
        kv_up_(ctx, name + ".kv_up", c.kv_lora_rank, static_cast<index_t>(heads) * (c.qk_head_dim + c.v_head_dim), false),
        proj_(ctx, name + ".proj", static_cast<index_t>(heads) * c.v_head_dim, hidden, bias) {
    if (c.q_lora_rank > 0) {
      q_down_.emplace(name + ".q_down.weight", Shape{c.q_lora_rank, hidden}, ShardSpec::replicated());
      if (c.latent_norms) q_norm_.emplace(ctx, name + ".q_latent_norm", c.q_lora_rank, c.norm_epsilon);
      q_.emplace(ctx, name + ".q_up", c.q_lora_rank, static_cast<index_t>(heads) * c.head_dim(), false);
    } else {
      q_.emplace(ctx, name + ".q", hidden, static_cast<index_t>(heads) * c.head_dim(), false);
    }
    if (c.latent_norms) kv_norm_.emplace(ctx, name + ".kv_latent_norm", c.kv_lora_rank, c.norm_epsilon);
    rope_.rotary_dim = 0;  // all of the dr dimensions turn
  }

  // Plans the attention of a [s, b] input (SelfAttention::prepare). Under context parallelism the
  // blocks are planned at their first call.
  void prepare(Context& ctx, index_t s, index_t b, bool backward) const {
    if (ctx.cp.size() > 1) return;
    ctx.device.template prepare_attention<T>(s, b, heads_local_, heads_local_, c_.head_dim(), backward, AttentionOptions{});
  }

  std::pair<Act<Layout>, Saved> forward(Context& ctx, const Act<Layout>& x, AttentionDropout dropout, bool recompute_core) const {
    Saved saved;
    saved.dropout = dropout;
    saved.x = q_->full_input(ctx, x);
    const index_t rows = saved.x.shape().rows(), s = saved.x.size(0), b = saved.x.size(1);
    const index_t rkv = c_.kv_lora_rank, dr = c_.qk_pos_emb_head_dim;
    auto q = Tensor<T, Space>::empty(Shape{s, b, heads_local_ * c_.head_dim()});
    if (q_down_) {
      auto c_q = detail::linear_forward(ctx.device, saved.x, *q_down_, nullptr, "LatentAttention q_down");
      saved.q_latent = latent_norm_forward(ctx, q_norm_, std::move(c_q), saved.q_norm);
      q_->forward_rows(ctx, saved.q_latent.data(), rows, q.data());
    } else {
      q_->forward_rows(ctx, saved.x.data(), rows, q.data());
    }
    auto kv_all = detail::linear_forward(ctx.device, saved.x, kv_down_, nullptr, "LatentAttention kv_down");  // [c_kv | k_pe]
    auto c_kv = Tensor<T, Space>::empty(Shape{s, b, rkv});
    auto k_pe = Tensor<T, Space>::empty(Shape{s, b, dr});
    ctx.device.template copy_columns<T>(kv_all.data(), rkv + dr, rows, rkv, c_kv.data(), rkv);
    ctx.device.template copy_columns<T>(kv_all.data() + rkv, rkv + dr, rows, dr, k_pe.data(), dr);
    saved.kv_latent = latent_norm_forward(ctx, kv_norm_, std::move(c_kv), saved.kv_norm);
    auto kv = Tensor<T, Space>::empty(Shape{s, b, heads_local_ * (c_.qk_head_dim + c_.v_head_dim)});
    kv_up_.forward_rows(ctx, saved.kv_latent.data(), rows, kv.data());
    if (recompute_core) {
      saved.q_raw = q, saved.kv = kv, saved.k_pe_raw = k_pe;  // shared handles: the core works on copies
      core_forward(ctx, saved, copy_of(ctx, q), kv, copy_of(ctx, k_pe));
    } else {
      core_forward(ctx, saved, std::move(q), kv, std::move(k_pe));
    }
    auto [y, proj_saved] = proj_.forward(ctx, Act<layout::sharded<-1>>(output_columns(ctx, saved.out)));
    saved.proj = std::move(proj_saved);
    if (recompute_core) {
      saved.q = saved.k = saved.v = saved.out = saved.heads_out = Tensor<T, Space>();
      saved.lse = Tensor<A, Space>();
      saved.proj = {};  // the input, or under FP8 the codes kept in its place
    }
    return {std::move(y), std::move(saved)};
  }

  Act<Layout> backward(Context& ctx, const Saved& stored, const Act<Layout>& dy, DeferredWeightGradients* deferred,
                       bool output_bias_gradient) {
    Saved recomputed;
    const Saved* saved = &stored;
    if (!stored.q_raw.empty()) {  // selective recompute: the core again from its kept inputs
      recomputed = stored;
      core_forward(ctx, recomputed, copy_of(ctx, stored.q_raw), stored.kv, copy_of(ctx, stored.k_pe_raw));
      recomputed.proj.input = output_columns(ctx, recomputed.out);
      saved = &recomputed;
    }
    const Saved& sv = *saved;
    const index_t s = sv.x.size(0), b = sv.x.size(1), rows = s * b, n = heads_local_;
    const index_t D = c_.head_dim(), dn = c_.qk_head_dim, dr = c_.qk_pos_emb_head_dim, dv = c_.v_head_dim,
                  rkv = c_.kv_lora_rank;
    auto dcontext = proj_.backward(ctx, sv.proj, dy, deferred, output_bias_gradient);  // [S, b, n * dv]
    auto dout = Tensor<T, Space>::empty(Shape{s, b, n, D});
    if (dv < D) ctx.device.template fill<T>(dout.data(), dout.numel(), 0.0);
    ctx.device.template copy_columns<T>(dcontext.data(), dv, rows * n, dv, dout.data(), D);
    auto dq = Tensor<T, Space>::empty(Shape{s, b, n, D}), dk = Tensor<T, Space>::empty(Shape{s, b, n, D}),
         dvp = Tensor<T, Space>::empty(Shape{s, b, n, D});
    const ContextParallelSplit split = cp_split(ctx, s);
    if (!split.active()) {
      ctx.device.template attention_backward<T>(dout.data(), sv.q.data(), sv.k.data(), sv.v.data(), sv.out.data(),
                                                sv.lse.data(), s, b, n, n, D, scale(), dq.data(), dk.data(), dvp.data(),
                                                AttentionOptions{AttentionStrides{}, sv.dropout});
    } else {
      context_parallel_attention_backward<T, A>(ctx, b, n, n, D, scale(), AttentionOptions{AttentionStrides{}, sv.dropout},
                                                sv.q, sv.k, sv.v, sv.heads_out, sv.lse, sv.out.data(), dout.data(), s,
                                                dq.data(), dk.data(), dvp.data(), "LatentAttention");
    }
    // dk, dv -> d[k_nope | v] per head; the heads' k_pe gradients summed
    auto dkv = Tensor<T, Space>::empty(Shape{s, b, n * (dn + dv)});
    ctx.device.template copy_columns<T>(dk.data(), D, rows * n, dn, dkv.data(), dn + dv);
    ctx.device.template copy_columns<T>(dvp.data(), D, rows * n, dv, dkv.data() + dn, dn + dv);
    auto dk_pe = Tensor<T, Space>::empty(Shape{s, b, dr});
    ctx.device.template copy_columns<T>(dk.data() + dn, n * D, rows, dr, dk_pe.data(), dr);
    if (n > 1) {
      auto head = Tensor<T, Space>::empty(dk_pe.shape());
      for (index_t h = 1; h < n; ++h) {
        ctx.device.template copy_columns<T>(dk.data() + h * D + dn, n * D, rows, dr, head.data(), dr);
        ctx.device.template add<T>(dk_pe.data(), head.data(), dk_pe.numel(), dk_pe.data());
      }
    }
    rope_by_chunk(ctx, split, dq.data(), dk_pe.data(), s, b, /*backward=*/true);
    // Up projections (this rank's heads): their weight gradients, and the latents' partial gradients.
    auto dkv_latent = Tensor<T, Space>::empty(sv.kv_latent.shape());
    kv_up_.backward_rows(ctx, sv.kv_latent.data(), dkv.data(), rows, dkv_latent.data());
    // The replicated parameters' increments, one after the other: [q_down | kv_down | kv norm | q norm].
    std::vector<Param*> replicated;
    const index_t kv_norm_size = kv_norm_ ? kv_norm_->partial_size() : 0;
    index_t total = kv_down_.value.numel() + kv_norm_size + (q_norm_ ? q_norm_->partial_size() : 0);
    if (q_down_) total += q_down_->value.numel();
    auto increments = Tensor<A, Space>::empty(Shape{total});
    index_t at = 0;
    auto dx = Tensor<T, Space>::empty(sv.x.shape());  // partial over tp
    auto down_backward = [&](Param& weight, const Tensor<T, Space>& dlatent, bool accumulate) {
      const index_t out = weight.value.size(0);
      ctx.device.template gemm<T, A>(true, false, out, hidden_, rows, dlatent.data(), sv.x.data(), increments.data() + at, false);
      ctx.device.template gemm<T>(false, false, rows, hidden_, out, dlatent.data(), weight.value.data(), dx.data(), accumulate);
      at += weight.value.numel();
      replicated.push_back(&weight);
    };
    auto dq_latent = Tensor<T, Space>();
    if (q_down_) {
      dq_latent = Tensor<T, Space>::empty(sv.q_latent.shape());
      q_->backward_rows(ctx, sv.q_latent.data(), dq.data(), rows, dq_latent.data());
    } else {
      q_->backward_rows(ctx, sv.x.data(), dq.data(), rows, dx.data());
    }
    // The latent norms' backward (their weight increments after the down projections').
    const index_t norm_at = kv_down_.value.numel() + (q_down_ ? q_down_->value.numel() : 0);
    auto dc_kv = latent_norm_backward(ctx, kv_norm_, sv.kv_norm, std::move(dkv_latent), increments.data() + norm_at);
    auto dkv_all = Tensor<T, Space>::empty(Shape{s, b, rkv + dr});
    ctx.device.template copy_columns<T>(dc_kv.data(), rkv, rows, rkv, dkv_all.data(), rkv + dr);
    ctx.device.template copy_columns<T>(dk_pe.data(), dr, rows, dr, dkv_all.data() + rkv, rkv + dr);
    if (q_down_) {
      auto dc_q = latent_norm_backward(ctx, q_norm_, sv.q_norm, std::move(dq_latent), increments.data() + norm_at + kv_norm_size);
      down_backward(*q_down_, dc_q, false);
      down_backward(kv_down_, dkv_all, true);
    } else {
      down_backward(kv_down_, dkv_all, true);  // dx holds the query projection's part
    }
    if (kv_norm_) kv_norm_->for_each_parameter([&](Param& p) { replicated.push_back(&p); });
    if (q_norm_) q_norm_->for_each_parameter([&](Param& p) { replicated.push_back(&p); });
    // Each rank's increments are its heads' share: summed over tp (the layout tag that reduces them).
    add_replicated_gradients<layout::sharded<0>>(ctx.device, ctx.tp, increments,
                                                 std::span<Param* const>(replicated.data(), replicated.size()));
    return q_->reduce_input_gradient(ctx, Act<layout::partial>(std::move(dx)));
  }

  Param* output_bias() { return proj_.bias(); }

  void init(Context& ctx, std::uint64_t seed, double stddev, double output_stddev) {
    if (q_down_) {
      init_normal(ctx.device, *q_down_, seed, stddev);
      if (q_norm_) q_norm_->init(ctx, seed, stddev);
    }
    q_->init(ctx, seed, stddev);
    init_normal(ctx.device, kv_down_, seed, stddev);
    if (kv_norm_) kv_norm_->init(ctx, seed, stddev);
    kv_up_.init(ctx, seed, stddev);
    proj_.init(ctx, seed, output_stddev);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    if (q_down_) {
      visit(*q_down_);
      if (q_norm_) q_norm_->for_each_parameter(visit);
    }
    q_->for_each_parameter(visit);
    visit(kv_down_);
    if (kv_norm_) kv_norm_->for_each_parameter(visit);
    kv_up_.for_each_parameter(visit);
    proj_.for_each_parameter(visit);
  }

 private:
  // 1 / sqrt(D), times YaRN's mscale(factor, mscale_all_dim)^2 under YaRN with mscale_all_dim set
  // (DeepSeek-V3's, Megatron's and transformers' multi-latent attention).
  A scale() const {
    double s = 1.0 / std::sqrt(static_cast<double>(c_.head_dim()));
    if (rope_.yarn() && rope_.yarn_mscale_all_dim != 0) {
      const double m = rope_yarn_mscale(rope_.yarn_factor, rope_.yarn_mscale_all_dim);
      s *= m * m;
    }
    return A(s);
  }
  // RoPE over the last dr columns of rows of pitch D (q's pe part, from a pointer dn columns in).
  RopeOptions pe_rope() const {
    RopeOptions o = rope_;
    o.rotary_dim = c_.qk_pos_emb_head_dim;
    return o;
  }
  Tensor<T, Space> copy_of(Context& ctx, const Tensor<T, Space>& t) const {
    auto c = Tensor<T, Space>::empty(t.shape());
    ctx.device.template copy<T>(t.data(), t.numel(), c.data());
    return c;
  }
  // out [S, b, n, D] -> its first dv columns per head [S, b, n * dv], the output projection's input.
  Tensor<T, Space> output_columns(Context& ctx, const Tensor<T, Space>& out) const {
    const index_t s = out.size(0), b = out.size(1), dv = c_.v_head_dim;
    auto context = Tensor<T, Space>::empty(Shape{s, b, heads_local_ * dv});
    ctx.device.template copy_columns<T>(out.data(), c_.head_dim(), s * b * heads_local_, dv, context.data(), dv);
    return context;
  }
  // q (owned, [S, b, n * D] before RoPE), kv [S, b, n * (dn + dv)], k_pe (owned, [S, b, dr] before
  // RoPE) -> saved q, k, v, out, lse.
  void core_forward(Context& ctx, Saved& saved, Tensor<T, Space> q, const Tensor<T, Space>& kv, Tensor<T, Space> k_pe) const {
    const index_t s = q.size(0), b = q.size(1), rows = s * b, n = heads_local_;
    const index_t D = c_.head_dim(), dn = c_.qk_head_dim, dr = c_.qk_pos_emb_head_dim, dv = c_.v_head_dim;
    const ContextParallelSplit split = cp_split(ctx, s);
    rope_by_chunk(ctx, split, q.data(), k_pe.data(), s, b, /*backward=*/false);
    q.reshape(Shape{s, b, n, D});
    auto k = Tensor<T, Space>::empty(Shape{s, b, n, D}), v = Tensor<T, Space>::empty(Shape{s, b, n, D});
    ctx.device.template copy_columns<T>(kv.data(), dn + dv, rows * n, dn, k.data(), D);
    for (index_t h = 0; h < n; ++h) ctx.device.template copy_columns<T>(k_pe.data(), dr, rows, dr, k.data() + h * D + dn, n * D);
    if (dv < D) ctx.device.template fill<T>(v.data(), v.numel(), 0.0);
    ctx.device.template copy_columns<T>(kv.data() + dn, dn + dv, rows * n, dv, v.data(), D);
    saved.out = Tensor<T, Space>::empty(Shape{s, b, n, D});
    if (!split.active()) {
      saved.q = std::move(q), saved.k = std::move(k), saved.v = std::move(v);
      saved.lse = Tensor<A, Space>::empty(Shape{b, n, s});
      ctx.device.template attention_forward<T>(saved.q.data(), saved.k.data(), saved.v.data(), s, b, n, n, D, scale(),
                                               saved.out.data(), saved.lse.data(),
                                               AttentionOptions{AttentionStrides{}, saved.dropout});
    } else {
      saved.q = std::move(q), saved.k = std::move(k), saved.v = std::move(v);
      context_parallel_attention_forward<T, A>(ctx, b, n, n, D, scale(), AttentionOptions{AttentionStrides{}, saved.dropout},
                                               saved.q, saved.k, saved.v, saved.heads_out, saved.lse, saved.out.data(),
                                               "LatentAttention");
    }
  }
  // A latent through its RMSNorm (its input and statistics into `saved`), or as it is without one.
  Tensor<T, Space> latent_norm_forward(Context& ctx, const std::optional<RmsNorm<Policy>>& norm, Tensor<T, Space> latent,
                                       typename RmsNorm<Policy>::Saved& saved) const {
    if (!norm) return latent;
    auto [normed, norm_saved] = norm->forward(ctx, Act<layout::sharded<0>>(std::move(latent)));
    saved = std::move(norm_saved);
    return std::move(normed.tensor);
  }
  // Its backward: the gradient before the norm, the weight's increment into `increment`.
  Tensor<T, Space> latent_norm_backward(Context& ctx, std::optional<RmsNorm<Policy>>& norm,
                                        const typename RmsNorm<Policy>::Saved& saved, Tensor<T, Space> dlatent,
                                        A* increment) {
    if (!norm) return dlatent;
    return norm->template backward_partial<layout::sharded<0>>(ctx, saved, Act<layout::sharded<0>>(std::move(dlatent)), nullptr,
                                                               increment)
        .tensor;
  }
  // This rank's part of a local sequence of s tokens (inactive without context parallelism).
  ContextParallelSplit cp_split(const Context& ctx, index_t s) const {
    if (ctx.cp.size() == 1) return {};
    return context_parallel_split(s * ctx.cp.size(), ctx.cp.size(), ctx.cp.rank(), "LatentAttention");
  }
  // RoPE (or its backward) on q's pe part ([s, b, n, D], dn columns in) and on k_pe [s, b, dr], each
  // chunk of the local sequence turned by the global position of its first token.
  void rope_by_chunk(Context& ctx, const ContextParallelSplit& split, T* q, T* k_pe, index_t s, index_t b, bool backward) const {
    const index_t n = heads_local_, D = c_.head_dim(), dn = c_.qk_head_dim, dr = c_.qk_pos_emb_head_dim;
    const int chunks = split.active() ? 2 : 1;
    const index_t c = split.active() ? split.chunk : s;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const index_t first = split.active() ? split.global_chunk(chunk) * c : 0;
      T* q_chunk = q + chunk * c * b * n * D + dn;
      T* k_chunk = k_pe + chunk * c * b * dr;
      if (backward) {
        ctx.device.template rope_backward<T>(q_chunk, c, b * n, D, rope_base_, first, pe_rope());
        ctx.device.template rope_backward<T>(k_chunk, c, b, dr, rope_base_, first, rope_);
      } else {
        ctx.device.template rope_forward<T>(q_chunk, c, b * n, D, rope_base_, first, pe_rope());
        ctx.device.template rope_forward<T>(k_chunk, c, b, dr, rope_base_, first, rope_);
      }
    }
  }

  LatentAttentionConfig c_;
  index_t heads_local_, hidden_;
  RopeOptions rope_;
  double rope_base_;
  std::optional<Param> q_down_;
  std::optional<RmsNorm<Policy>> q_norm_;  // q_lora_rank > 0, with the latent norms
  std::optional<Up> q_;  // q_up (from the latent) or q (from the hidden state); optional only to be built after q_down_
  Param kv_down_;
  std::optional<RmsNorm<Policy>> kv_norm_;  // with the latent norms
  Up kv_up_;
  Proj proj_;
};

STRATA_NAMESPACE_END
