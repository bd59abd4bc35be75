// examples/tools/plan/planner.hpp: the best parallel layout for a model and a cluster, predicted
// without running it (strata-plan; docs/PLANNING.md says what is modeled and what is not).
//
//   trainer::TrainArgs model = trainer::parse_flags("gpt", {...Megatron's model flags...});
//   plan::Plan p = plan::make_plan(model, plan::Cluster{8, 1, 80}, plan::load_calibration("h100_node.json"));
//   std::cout << plan::format_table(p, 10);
//
// 1. Enumeration (`enumerate_layouts`): tp (dividing the world, at most a node), cp (up to
//    SearchSpace::max_cp), pp (up to the layers and pipeline::kMaxPipelineSize; where pp does not
//    divide the layers, pp >= 3 with the middle stages at ceil(layers / pp) and the first and last
//    sharing the rest, as Megatron's --decoder-first/last-pipeline-num-layers), the schedule (1F1B,
//    zero-bubble, interleaved with v chunks for every v > 1 that divides layers / pp), ep (MoE:
//    divisors of the expert count up to world / pp), the micro-batch size (powers of two up to
//    SearchSpace::max_micro_batch and the global batch), recompute none / selective / full (and,
//    for a MoE model, selective+moe: the MoE blocks recomputed too, --recompute-modules core_attn
//    moe), and the distributed optimizer off / on (on only where dp x cp > 1). dp is what is left
//    of the world.
// 2. Validity: each layout becomes the trainers' flags (`args_of`) and goes through
//    trainer::validate, the check every trainer runs before it allocates; a refused layout is
//    counted with the trainer's sentence and not shown.
// 3. Memory per GPU: trainer::plan_memory<bf16> (models/memory_estimate.hpp, which counts what
//    recompute keeps) for every pipeline rank, the largest; plus the calibration's runtime reserve.
// 4. Step time (`predict_step`): per micro-batch and pipeline rank, compute from the shapes (GEMMs
//    x3 for forward, input and weight gradient at the calibrated throughput of the nearest measured
//    shape, FP8 layers' at the FP8 one, with their casts; causal attention at the calibrated rate for
//    its length and head size; memory-bound kernels from the bytes they move),
//    the exposed communication (tensor parallel: on the compute stream, all exposed; context
//    parallel: ring steps hidden behind the attention blocks they feed; expert all-to-alls: exposed;
//    pipeline transfers: exposed), the recompute's extra forward; the pipeline bubble from the
//    schedule's table (pipeline::verify_schedule, unit costs); data-parallel reduction with
//    --overlap-grad-reduce (hidden behind the last micro-batch's backward except one bucket) and
//    the distributed optimizer's all-gather behind the first forward; the optimizer update; a fixed
//    overhead per step.
// 5. Ranking: layouts that fit by step time; each loser gets the reason it lost to the best
//    (does not fit, bubble, communication, recompute, compute), `format_table` prints them and
//    `svg` draws step time against memory, one point per valid layout.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <strata/pipeline/schedule_check.hpp>

#include "../../trainer/args.hpp"
#include "../../trainer/memory_plan.hpp"
#include "calibration.hpp"

namespace plan {

using strata::models::RecomputeGranularity;

struct Cluster {
  int gpus_per_node = 8;
  int nodes = 1;
  double gpu_memory_gib = 80;
  int world() const { return gpus_per_node * nodes; }
  std::int64_t gpu_memory_bytes() const { return static_cast<std::int64_t>(gpu_memory_gib * 1024.0 * 1024.0 * 1024.0); }
};

// The bounds of the enumeration (see the top).
struct SearchSpace {
  int max_cp = 16;
  int max_micro_batch = 16;
  bool zero_bubble = true;  // zero-bubble as well as 1F1B at v = 1
};

struct Layout {
  int tp = 1, pp = 1, dp = 1, cp = 1, ep = 1;
  int virtual_stages = 1;
  std::string schedule = "1f1b";  // 1f1b | zero-bubble | interleaved
  int micro_batch = 1;
  RecomputeGranularity recompute = RecomputeGranularity::none;
  bool distributed_optimizer = false;
  // Layers of the first and last pipeline stages when pp does not divide the layers (Megatron's
  // --decoder-first/last-pipeline-num-layers); -1: the even split.
  int first_stage_layers = -1, last_stage_layers = -1;
  // With selective recompute of a MoE model: the MoE blocks too (--recompute-modules core_attn moe).
  bool recompute_moe = false;
};

inline const char* recompute_name(RecomputeGranularity r) {
  return r == RecomputeGranularity::none ? "none" : r == RecomputeGranularity::selective ? "selective" : "full";
}
// The layout's recompute as the table names it: none, selective, selective+moe or full.
inline const char* recompute_name(const Layout& l) {
  return l.recompute == RecomputeGranularity::selective && l.recompute_moe ? "selective+moe" : recompute_name(l.recompute);
}

// The trainers' recompute flags of a layout's choice: full uniform with one layer per chunk;
// selective of the attention core, and with `moe` of the MoE blocks too.
inline void set_recompute(trainer::TrainArgs& a, RecomputeGranularity r, bool moe) {
  a.recompute_granularity = r == RecomputeGranularity::none ? "" : recompute_name(r);
  a.recompute_method = "uniform";
  a.recompute_num_layers = 1;
  a.recompute_modules = r == RecomputeGranularity::selective && moe ? "core_attn moe" : "";
}

// The trainers' flags of `layout` over the model's: bf16 on GPUs, sequence parallelism with tp > 1,
// --overlap-grad-reduce (and --overlap-param-gather with the distributed optimizer), ring attention
// for cp, full recompute uniform with one layer per chunk (selective: the attention core, and with
// recompute_moe the MoE blocks), no sampling.
inline trainer::TrainArgs args_of(const trainer::TrainArgs& model, const Cluster& cluster, const Layout& l) {
  trainer::TrainArgs a = model;
  a.device = "cuda";
  a.dtype = "bf16";
  a.world_size = cluster.world();
  a.tensor_model_parallel_size = l.tp;
  a.pipeline.pipeline_model_parallel_size = l.pp;
  a.pipeline.pipeline_schedule = l.schedule;
  a.pipeline.num_layers_per_virtual_pipeline_stage = l.virtual_stages > 1 ? a.model.num_layers / (l.pp * l.virtual_stages) : 0;
  a.pipeline.decoder_first_pipeline_num_layers = l.first_stage_layers;
  a.pipeline.decoder_last_pipeline_num_layers = l.last_stage_layers;
  a.context_parallel_size = l.cp;
  a.expert_model_parallel_size = l.ep;
  a.micro_batch_size = l.micro_batch;
  a.sequence_parallel = l.tp > 1;
  set_recompute(a, l.recompute, l.recompute_moe);
  a.use_distributed_optimizer = l.distributed_optimizer;
  a.overlap_grad_reduce = true;
  a.overlap_param_gather = l.distributed_optimizer;
  a.sample_tokens = 0;
  return a;
}

inline std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// Every layout of the search space (see the top), valid or not.
inline std::vector<Layout> enumerate_layouts(const trainer::TrainArgs& model, const Cluster& cluster, const SearchSpace& space = {}) {
  std::vector<Layout> out;
  const int world = cluster.world(), layers = model.model.num_layers;
  const bool moe = model.model.moe.enabled();
  for (int tp : divisors(world)) {
    if (tp > cluster.gpus_per_node) continue;
    for (int cp : divisors(world / tp)) {
      if (cp > space.max_cp) continue;
      for (int pp : divisors(world / (tp * cp))) {
        if (pp > std::min(layers, strata::pipeline::kMaxPipelineSize)) continue;
        const int dp = world / (tp * cp * pp);
        // pp not dividing the layers: the middle stages take ceil(layers / pp) each and the first
        // and last share the rest (the first the smaller half), when each gets at least one.
        int first = -1, last = -1;
        if (layers % pp != 0) {
          if (pp < 3) continue;
          const int per = (layers + pp - 1) / pp, rest = layers - (pp - 2) * per;
          if (rest < 2) continue;
          first = rest / 2, last = rest - rest / 2;
        }
        std::vector<std::pair<std::string, int>> schedules{{"1f1b", 1}};
        if (pp > 1) {
          if (space.zero_bubble) schedules.push_back({"zero-bubble", 1});
          if (first < 0)
            for (int v : divisors(layers / pp))
              if (v > 1) schedules.push_back({"interleaved", v});
        }
        std::vector<int> eps{1};
        if (moe) {
          eps.clear();
          for (int ep : divisors(model.model.moe.num_experts))
            if (ep <= world / pp) eps.push_back(ep);
        }
        for (const auto& [schedule, v] : schedules)
          for (int ep : eps)
            for (int mb = 1; mb <= std::min(space.max_micro_batch, model.global_batch_size); mb *= 2)
              for (RecomputeGranularity r : {RecomputeGranularity::none, RecomputeGranularity::selective, RecomputeGranularity::full})
                for (bool distributed : {false, true})
                  for (bool recompute_moe : {false, true}) {
                    if (distributed && dp * cp == 1) continue;
                    if (recompute_moe && (!moe || r != RecomputeGranularity::selective)) continue;
                    out.push_back(Layout{tp, pp, dp, cp, ep, v, schedule, mb, r, distributed, first, last, recompute_moe});
                  }
      }
    }
  }
  return out;
}

// ---- memory ---------------------------------------------------------------------------------

struct MemoryPrediction {
  std::int64_t estimate = 0;         // plan_memory's per-rank estimate (the largest pipeline rank), recompute included
  int stage = 0;                     // which pipeline rank needs the most
  std::int64_t reserve = 0;          // the calibration's runtime reserve
  strata::models::MemoryEstimate state;  // that rank's plan_memory estimate (parameters, gradients, optimizer, activations)
  std::int64_t per_gpu() const { return estimate + reserve; }
};

// The memory per GPU of `a` with recompute `r` (uniform, one layer per chunk under full; the
// attention core under selective, and with `moe` the MoE blocks): plan_memory's largest pipeline
// rank, which counts what recompute keeps (models::activations_of), and the calibration's runtime
// reserve.
inline MemoryPrediction predict_memory(trainer::TrainArgs a, const Calibration& calibration, RecomputeGranularity r,
                                       bool moe = false) {
  set_recompute(a, r, moe);
  MemoryPrediction out;
  const trainer::MemoryPlan plan = trainer::plan_memory<strata::bf16>(a);
  out.stage = plan.per_rank_stage;
  out.estimate = plan.per_rank.total();
  out.state = plan.per_rank;
  out.reserve = static_cast<std::int64_t>(calibration.runtime_reserve_gib * 1024.0 * 1024.0 * 1024.0);
  return out;
}

// ---- time -----------------------------------------------------------------------------------

// Milliseconds of one step on every GPU, by where they go (exposed time only).
struct StepTime {
  double compute = 0;        // GEMMs, attention, memory-bound kernels, the embedding and the output layer
  double recompute = 0;      // the forwards recompute repeats
  double tensor_parallel = 0, context_parallel = 0, expert_parallel = 0, pipeline_transfers = 0, data_parallel = 0;
  double bubble = 0;         // the pipeline schedule's idle time
  double optimizer = 0;      // the AdamW update of this rank's shard
  double overhead = 0;       // the calibration's fixed cost per step, MoE host waits
  double communication() const { return tensor_parallel + context_parallel + expert_parallel + pipeline_transfers + data_parallel; }
  double total() const { return compute + recompute + communication() + bubble + optimizer + overhead; }
};

// The schedule's idle share in its unit-cost model (F = 1, B = 2): verify_schedule's table up to
// 128 micro-batches, the closed form beyond ((pp - 1) / (v m + pp - 1) for 1F1B and interleaved,
// a third of 1F1B's for zero-bubble), memoized.
inline double bubble_fraction(strata::pipeline::ScheduleKind kind, int pp, int micro_batches, int v) {
  if (pp <= 1) return 0;
  thread_local std::map<std::tuple<int, int, int, int>, double> memo;
  const auto key = std::tuple{static_cast<int>(kind), pp, micro_batches, v};
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  double b = 0;
  if (micro_batches <= 128) {
    b = strata::pipeline::verify_schedule({kind, pp, micro_batches, v}).bubble_fraction();
  } else {
    const double one_f_one_b = double(pp - 1) / (double(v) * micro_batches + pp - 1);
    b = kind == strata::pipeline::ScheduleKind::zero_bubble ? one_f_one_b / 3 : one_f_one_b;
  }
  memo[key] = b;
  return b;
}

inline StepTime predict_step(const trainer::TrainArgs& a, const Layout& l, const Cluster& cluster, const Calibration& cal) {
  const auto& m = a.model;
  const double h = m.hidden_size, heads = m.num_attention_heads, groups = m.num_query_groups == 0 ? heads : m.num_query_groups;
  const double d = m.head_dim(), ffn = m.ffn(), vocab = static_cast<double>(m.padded_vocab(l.tp));
  const bool gated = a.architecture.swiglu, moe = m.moe.enabled();
  const double tp = l.tp, cp = l.cp, s = m.seq_length, vb = 2;  // bf16
  const double t = l.micro_batch * s / cp;                       // this rank's tokens of a micro-batch
  const int etp = trainer::parallel_config_of(a).etp;
  const bool sp = a.sequence_parallel;
  const int node = cluster.gpus_per_node;
  const Link& tp_link = l.tp <= node ? cal.nvlink : cal.infiniband;
  const Link& cp_link = l.tp * l.cp <= node ? cal.nvlink : cal.infiniband;
  const Link& ep_link = l.tp * l.ep <= node ? cal.nvlink : cal.infiniband;
  const Link& dp_link = l.tp * l.cp * l.dp <= node ? cal.nvlink : cal.infiniband;
  const Link& pp_link = cluster.world() <= node ? cal.nvlink : cal.infiniband;
  auto gemm_ms = [&](double rows, double cols, double inner) {  // forward, input gradient, weight gradient
    if (rows < 1 || cols < 1 || inner < 1) return 0.0;
    return 3 * 2 * rows * cols * inner / (cal.gemm_tflops(rows, cols, inner) * 1e12) * 1e3;
  };
  auto bytes_ms = [&](double bytes) { return bytes / (cal.elementwise_gbps * 1e9) * 1e3; };

  // One layer, one micro-batch, of each kind: a dense layer (every layer of a dense model, those
  // --moe-layer-freq marks 0 in a MoE one) and a MoE layer.
  // Attention's GEMMs and the attention engine's head dimension and key/value heads: plain (the qkv
  // and output projections), or multi-latent (layers/latent_attention.hpp: the down projections
  // replicated over tp, the up and output projections split by heads; q and k of qk + pe dimensions,
  // values padded to them, one key/value head per query head).
  // FP8 layers (--fp8-format, the per-tensor recipes): their linear GEMMs at the calibration's FP8
  // rates, plus the casts (each GEMM operand in the element type read and its codes written in both
  // layouts, once per micro-batch; the weights' once per step; the norms' outputs, below). Blockwise
  // is priced as bf16.
  const bool fp8 = !a.fp8_format.empty() && a.fp8_recipe != "blockwise";
  auto fp8_gemm_ms = [&](double rows, double cols, double inner) {
    if (rows < 1 || cols < 1 || inner < 1) return 0.0;
    return 3 * 2 * rows * cols * inner / (cal.fp8_gemm_tflops(rows, cols, inner) * 1e12) * 1e3;
  };
  double core_dim = d, kv_heads = groups;
  const auto attention_gemm_of = [&](auto&& gemm) {
    if (m.multi_latent_attention) {
      const double rq = m.q_lora_rank, rkv = m.kv_lora_rank, qk = m.qk_head_dim, pe = m.qk_pos_emb_head_dim,
                   dv = m.v_head_dim;
      core_dim = qk + pe, kv_heads = heads;
      return (rq > 0 ? gemm(t, rq, h) + gemm(t, heads * core_dim / tp, rq) : gemm(t, heads * core_dim / tp, h)) +
             gemm(t, rkv + pe, h) + gemm(t, heads * (qk + dv) / tp, rkv) + gemm(t, h, heads * dv / tp);
    }
    return gemm(t, (heads + 2 * groups) * d / tp, h) + gemm(t, h, heads * d / tp);
  };
  const auto mlp_gemm_of = [&](auto&& gemm) { return gemm(t, ffn * (gated ? 2 : 1) / tp, h) + gemm(t, h, ffn / tp); };
  const double attention_gemm = attention_gemm_of(gemm_ms);
  const double dense_gemm = attention_gemm + mlp_gemm_of(gemm_ms);
  // the FP8 layers' GEMMs and casts (the elements of the linear layers' inputs and outputs per token)
  const double fp8_attention_gemm = fp8 ? attention_gemm_of(fp8_gemm_ms) : attention_gemm;
  const double fp8_dense_gemm = fp8 ? fp8_attention_gemm + mlp_gemm_of(fp8_gemm_ms) : dense_gemm;
  const double attention_io = h + (heads + 2 * groups) * d / tp + heads * d / tp + h,
               mlp_io = h + ffn * (gated ? 2 : 1) / tp + ffn / tp + h;
  // Delayed: the norms write the qkv projection's and a dense fc1's input codes (Fp8Options::
  // norm_writes_codes; not under multi-latent attention): one byte written where the norm wrote vb,
  // then a transpose of the bytes (two), instead of the cast (vb + 2).
  const bool norm_codes = fp8 && a.fp8_recipe == "delayed" && a.fp8_norm_writes_codes;
  const double input_bytes = norm_codes ? 3 - vb : vb + 2;
  const double fp8_attention_casts =
                   fp8 ? bytes_ms((vb + 2) * t * (attention_io - h) +
                                  (m.multi_latent_attention ? vb + 2 : input_bytes) * t * h)
                       : 0,
               fp8_mlp_casts = fp8 ? bytes_ms((vb + 2) * t * (mlp_io - h) + input_bytes * t * h) : 0;
  // Under the delayed recipe a MoE layer's experts run FP8 too (layers/moe/experts.hpp): their GEMMs
  // at the FP8 rates, their operands cast (x, the activation, dy and the activation's gradient, both
  // layouts) and the weight gradients' groups of transposed codes copied out, and (per-expert GEMMs)
  // the counts on the host: one read per forward where the dispatcher does not have them.
  const bool fp8_experts = fp8 && a.fp8_recipe == "delayed" && a.fp8_experts;
  double moe_gemm = attention_gemm, moe_ms = 0, ep_ms = 0, fp8_expert_delta = 0, fp8_moe_ms = 0, fp8_expert_weights = 0;
  if (moe) {
    const double experts = m.moe.num_experts, topk = m.moe.topk, width = m.expert_ffn();
    // Rows per local expert: the routed ones, or with padding every expert's whole capacity (from
    // each of the ep ranks), which it computes whether tokens fill it or not.
    const double routed = t / (sp ? tp : 1);
    const double rows = m.moe.pad_to_capacity && m.moe.capacity_factor > 0
                            ? double(strata::moe_expert_capacity(static_cast<std::int64_t>(routed), m.moe.topk, m.moe.num_experts,
                                                                 m.moe.capacity_factor)) * l.ep * (sp ? tp : 1)
                            : t * topk * l.ep / experts;
    moe_gemm += gemm_ms(t, experts, h);
    const auto experts_gemm_of = [&](auto&& gemm) {
      return experts / l.ep * (gemm(rows, width * (gated ? 2 : 1) / etp, h) + gemm(rows, h, width / etp));
    };
    moe_gemm += experts_gemm_of(gemm_ms);
    if (fp8_experts) {
      const double io = 2 * h + width * (gated ? 3 : 2) / etp;  // x, the activation, dy, the activation's gradient
      fp8_expert_delta = experts_gemm_of(fp8_gemm_ms) - experts_gemm_of(gemm_ms) + bytes_ms((vb + 2 + 2) * rows * experts / l.ep * io);
      fp8_expert_weights = experts / l.ep * (gated ? 3 : 2) * width * h / etp;
    }
    if (m.moe.shared_expert_ffn_hidden_size > 0) {
      const double shared = m.moe.shared_expert_ffn_hidden_size;
      moe_gemm += gemm_ms(t, shared * (gated ? 2 : 1) / tp, h) + gemm_ms(t, h, shared / tp);
    }
    const double local_tokens = sp ? t / tp : t;
    ep_ms = 4 * ep_link.seconds(local_tokens * topk * h * vb, l.ep) * 1e3;  // dispatch and combine, forward and backward
    // The host waits for the token counts (layers/moe/token_dispatcher.hpp): on one rank of the
    // etp x ep group none (the experts' grouped GEMMs read the counts on the device); over several,
    // the all-to-all dispatcher reads them once per dispatch unless padding to capacity fixes every
    // size, the all-gather one reads the ranks' token counts, and the experts' counts unless padded.
    // Experts with biases, and FP8 experts, need the counts on the host: the dispatcher's where it
    // has them (read for its exchanges, or padded to capacity), else one read per forward.
    double reads = 0;
    const bool padded = m.moe.pad_to_capacity && m.moe.capacity_factor > 0;
    if (l.ep * etp > 1)
      reads = m.moe.token_dispatcher == strata::MoeDispatcherType::allgather ? (padded ? 1 : 2) : (padded ? 0 : 1);
    const bool counts_on_host = l.ep * etp > 1 || padded;
    moe_ms = (reads + (m.add_bias_linear && !counts_on_host ? 1 : 0)) * cal.moe_host_ms_per_layer;
    fp8_moe_ms = (reads + ((m.add_bias_linear || fp8_experts) && !counts_on_host ? 1 : 0)) * cal.moe_host_ms_per_layer;
  }
  const double attention_flops = 2 * t * s * heads * core_dim / tp;  // causal: each local token meets s / 2 keys on average
  // The attention engine runs over whole sequences (cp = 1, or the all-to-all's heads), or over
  // blocks of s / cp queries and keys (the ring, and the all-gather's local queries): its rate at that length.
  const double attention_length = l.cp > 1 && a.cp_comm_type != "a2a" ? s / cp : s;
  const double attention =
      3.5 * attention_flops / (cal.attention_tflops_at(attention_length, core_dim, a.deterministic_attention) * 1e12) * 1e3;
  auto elementwise_of = [&](double width) {
    const double replicated = 16 * h * t * vb, sharded = (8 * h + 3 * width * (gated ? 2 : 1)) * t * vb / tp;
    return bytes_ms(sp ? (replicated / tp + sharded) : (replicated + sharded));
  };
  const double dense_elementwise = elementwise_of(ffn), moe_elementwise = moe ? elementwise_of(m.expert_ffn() * m.moe.topk) : 0;
  const double dense_compute = dense_gemm + attention + dense_elementwise, moe_compute = moe_gemm + attention + moe_elementwise;
  // FP8 layers: the same with their GEMMs at the FP8 rates and their casts (a MoE layer's experts only
  // under the delayed recipe: fp8_expert_delta)
  const double fp8_dense_compute = fp8_dense_gemm + fp8_attention_casts + fp8_mlp_casts + attention + dense_elementwise,
               fp8_moe_compute = moe_gemm - attention_gemm + fp8_attention_gemm + fp8_attention_casts + attention +
                                 moe_elementwise + fp8_expert_delta;

  // Tensor parallel: 4 all-gathers / reduce-scatters per direction under sequence parallelism, else
  // 2 all-reduces; the norms' gradient all-reduce (latency). On the compute stream: all exposed.
  const double activation_bytes = t * h * vb;
  double tp_forward = 0, tp_layer = 0;
  if (l.tp > 1) {
    tp_forward = sp ? 4 * tp_link.seconds(activation_bytes, l.tp) * 1e3 : 2 * tp_link.seconds(activation_bytes, l.tp, 2) * 1e3;
    tp_layer = 2 * tp_forward + (sp ? tp_link.latency_us * 1e-3 : 0);
  }
  // Context parallel (ring): cp - 1 steps of keys and values forward, of those and their gradients
  // backward, each hidden behind the attention block it feeds.
  double cp_layer = 0;
  if (l.cp > 1) {
    const double kv = 2 * t * std::max(1.0, kv_heads / tp) * core_dim * vb;
    const double ring = (l.cp - 1) * (cp_link.seconds(kv, 2) + cp_link.seconds(2 * kv, 2)) * 1e3;
    cp_layer = std::max(0.0, ring - attention * (l.cp - 1) / l.cp);
  }
  double dense_recompute = 0, moe_recompute = 0;
  if (l.recompute == RecomputeGranularity::selective) dense_recompute = moe_recompute = attention / 3.5;
  // selective+moe: the MoE block's forward again (router, dispatch, experts, combine)
  const bool moe_blocks = l.recompute == RecomputeGranularity::selective && l.recompute_moe;
  if (moe_blocks) moe_recompute += moe_gemm / 3 + moe_elementwise / 3;
  const bool moe_forward_again = moe_blocks || l.recompute == RecomputeGranularity::full;
  if (l.recompute == RecomputeGranularity::full) {
    dense_recompute = dense_gemm / 3 + attention / 3.5 + dense_elementwise / 3 + tp_forward;
    moe_recompute = moe_gemm / 3 + attention / 3.5 + moe_elementwise / 3 + tp_forward;
  }

  // Per pipeline rank and micro-batch: its layers, the embedding on the first, the output layer and
  // the loss on the last; transfers to the neighbours (exposed), per chunk.
  const int dp = trainer::data_parallel_size_of(a);
  const int micro_batches = static_cast<int>(a.global_batch_size / (std::int64_t{l.micro_batch} * dp));
  const auto holdings = trainer::pipeline_holdings(a.pipeline, m, micro_batches);
  const double head = gemm_ms(t, vocab / tp, h) + bytes_ms(4 * t * vocab / tp * vb);
  const double embedding = bytes_ms(3 * t * h * vb);
  // One point-to-point transfer (bus bandwidth as its rate) each way per chunk and micro-batch.
  const double boundary =
      l.pp > 1 ? 2 * ((t * h * vb / (sp ? tp : 1)) / (pp_link.bus_gbps * 1e9) * 1e3 + pp_link.latency_us * 1e-3) : 0;
  const strata::models::Fp8Layers fp8_layers = fp8 ? trainer::fp8_layers_of(a) : strata::models::Fp8Layers{};
  // the weight casts of one FP8 layer, once per step: read in bf16, W^T (and W) written; under
  // --fp8-param-gather each of the dp x cp ranks casts its shard (read in bf16, W written) and every
  // rank makes W^T from the gathered codes (a byte read and written)
  const double fp8_layer_weights = (((heads + 2 * groups) * d + heads * d) * h + (gated ? 3 : 2) * ffn * h) / tp;
  const bool fp8_gather = fp8 && a.fp8_param_gather && l.distributed_optimizer;
  const double fp8_weight_casts =
      !fp8 ? 0 : bytes_ms((fp8_gather ? (vb + 1) / (dp * l.cp) + 2 : vb + 2) * fp8_layer_weights);
  // a MoE layer casts its attention's weights and (delayed) its experts', not a dense MLP's
  const double fp8_moe_weight_casts =
      !fp8 ? 0 : bytes_ms((vb + 2) * (((heads + 2 * groups) * d + heads * d) * h / tp + fp8_expert_weights));
  StepTime worst;
  double worst_total = -1, worst_fp8_layers = 0, worst_fp8_moe = 0;
  for (const auto& rank : holdings) {
    double layers = 0, moe_layers = 0, fp8_all = 0, fp8_moe = 0;
    bool first = false, last = false;
    for (const auto& chunk : rank.chunks) {
      layers += chunk.layer_count(m), first = first || chunk.embedding, last = last || chunk.head;
      moe_layers += static_cast<double>(chunk.moe_layer_count(m));
      fp8_all += static_cast<double>(fp8_layers.in(m, chunk));
      fp8_moe += static_cast<double>(fp8_layers.moe_in(m, chunk));
    }
    const double dense_layers = layers - moe_layers, fp8_dense = fp8_all - fp8_moe;
    StepTime r;
    r.compute = (dense_layers - fp8_dense) * dense_compute + fp8_dense * fp8_dense_compute + (moe_layers - fp8_moe) * moe_compute +
                fp8_moe * fp8_moe_compute + (first ? embedding : 0) + (last ? head : 0);
    r.recompute = dense_layers * dense_recompute + moe_layers * moe_recompute;
    r.tensor_parallel = layers * tp_layer;
    r.context_parallel = layers * cp_layer;
    // full recompute (or the MoE block's) runs a MoE layer's forward again: its dispatch and combine
    // exchanges too (half of ep_ms)
    r.expert_parallel = moe_layers * ep_ms * (moe_forward_again ? 1.5 : 1.0);
    r.overhead = (moe_layers - fp8_moe) * moe_ms + fp8_moe * fp8_moe_ms;
    r.pipeline_transfers = boundary * static_cast<double>(rank.chunks.size());
    const double per_micro_batch = r.total();
    if (per_micro_batch > worst_total) worst_total = per_micro_batch, worst = r, worst_fp8_layers = fp8_all, worst_fp8_moe = fp8_moe;
  }
  StepTime step;
  const double mb = micro_batches;
  step.compute = worst.compute * mb + (worst_fp8_layers - worst_fp8_moe) * fp8_weight_casts + worst_fp8_moe * fp8_moe_weight_casts;
  step.recompute = worst.recompute * mb;
  step.tensor_parallel = worst.tensor_parallel * mb;
  step.context_parallel = worst.context_parallel * mb;
  step.expert_parallel = worst.expert_parallel * mb;
  step.pipeline_transfers = worst.pipeline_transfers * mb;
  step.overhead = worst.overhead * mb + cal.step_overhead_ms;
  const double busy = worst_total * mb;
  const double b = bubble_fraction(trainer::schedule_kind_of(a.pipeline), l.pp, micro_batches, l.virtual_stages);
  step.bubble = busy * b / (1 - b);

  // Data parallel over dp x cp ranks (the gradients are fp32): with the distributed optimizer a
  // reduce-scatter and the parameters' all-gather, else an all-reduce; hidden behind the last
  // micro-batch's backward (and the gather behind the first forward) except one bucket each.
  const trainer::MemoryPlan memory = trainer::plan_memory<strata::bf16>(a);
  double parameters = 0;
  for (const auto& e : memory.stage_estimates) parameters = std::max(parameters, static_cast<double>(e.parameters));
  const int shards = dp * l.cp;
  const double bucket = std::min(parameters, std::max(40e6, 1e6 * shards));
  const double backward = worst_total * 2 / 3, forward = worst_total / 3;
  if (shards > 1) {
    if (l.distributed_optimizer) {
      // --fp8-param-gather: the FP8 layers' weights gathered as one-byte codes
      const double fp8_weights = fp8_gather ? std::min(parameters, worst_fp8_layers * fp8_layer_weights) : 0;
      const double rs = dp_link.seconds(parameters * 4, shards) * 1e3,
                   ag = dp_link.seconds((parameters - fp8_weights) * 2 + fp8_weights, shards) * 1e3;
      step.data_parallel = std::max(rs * bucket / parameters, rs - backward) + std::max(ag * bucket / parameters, ag - forward);
    } else {
      const double ar = dp_link.seconds(parameters * 4, shards, 2) * 1e3;
      step.data_parallel = std::max(ar * bucket / parameters, ar - backward);
    }
  }
  step.optimizer = parameters / (l.distributed_optimizer ? shards : 1) * 32 / (cal.optimizer_gbps * 1e9) * 1e3;
  return step;
}

// ---- the plan -------------------------------------------------------------------------------

struct Candidate {
  Layout layout;
  MemoryPrediction memory;
  StepTime time;
  bool fits = false;
  double tokens_per_second = 0, mfu = 0;
  std::string lost;     // why it is not the best ("" for the best)
  double lost_ms = 0;   // by how much that part exceeds the best's (ms per step; 0 for "does not fit")
};

struct Invalid {
  Layout layout;
  std::string reason;  // the trainers' sentence
};

struct Plan {
  Cluster cluster;
  std::string model;  // a one-line description
  std::vector<Candidate> valid;  // fitting ones first, by step time; then the rest by memory
  std::vector<Invalid> invalid;
  std::size_t enumerated = 0, fitting = 0;
  std::map<std::string, int> lost_counts;  // reason -> layouts
};

inline std::string describe_layout(const Layout& l) {
  char text[200];
  const std::string split = l.first_stage_layers > 0 ? " layers " + std::to_string(l.first_stage_layers) + "/.../" + std::to_string(l.last_stage_layers) : "";
  std::snprintf(text, sizeof text, "tp=%d pp=%d%s%s dp=%d cp=%d ep=%d mbs=%d recompute=%s%s", l.tp, l.pp, split.c_str(),
                l.pp > 1 ? (l.schedule == "interleaved" ? (" v=" + std::to_string(l.virtual_stages)).c_str()
                                                        : (" " + l.schedule).c_str())
                         : "",
                l.dp, l.cp, l.ep, l.micro_batch, recompute_name(l), l.distributed_optimizer ? " dist-opt" : "");
  return text;
}

inline Plan make_plan(const trainer::TrainArgs& model, const Cluster& cluster, const Calibration& calibration, const SearchSpace& space = {}) {
  Plan p;
  p.cluster = cluster;
  const std::vector<Layout> layouts = enumerate_layouts(model, cluster, space);
  p.enumerated = layouts.size();
  const double flops_per_token = trainer::flops_per_token(model);
  for (const Layout& l : layouts) {
    const trainer::TrainArgs a = args_of(model, cluster, l);
    try {
      trainer::validate(a);
    } catch (const std::exception& e) {
      p.invalid.push_back({l, e.what()});
      continue;
    }
    Candidate c;
    c.layout = l;
    c.memory = predict_memory(a, calibration, l.recompute, l.recompute_moe);
    c.time = predict_step(a, l, cluster, calibration);
    c.fits = c.memory.per_gpu() <= cluster.gpu_memory_bytes();
    c.tokens_per_second = double(model.global_batch_size) * model.model.seq_length / (c.time.total() * 1e-3);
    c.mfu = flops_per_token * c.tokens_per_second / (cluster.world() * calibration.peak_tflops * 1e12);
    p.valid.push_back(std::move(c));
  }
  std::stable_sort(p.valid.begin(), p.valid.end(), [](const Candidate& x, const Candidate& y) {
    if (x.fits != y.fits) return x.fits;
    return x.fits ? x.time.total() < y.time.total() : x.memory.per_gpu() < y.memory.per_gpu();
  });
  for (const Candidate& c : p.valid) p.fitting += c.fits ? 1 : 0;
  // Why each one lost: it does not fit, or the part of its step that exceeds the best's most.
  for (std::size_t i = 0; i < p.valid.size(); ++i) {
    Candidate& c = p.valid[i];
    if (!c.fits) {
      c.lost = "does not fit";
    } else if (i > 0) {
      const StepTime& best = p.valid.front().time;
      const std::pair<double, const char*> parts[] = {
          {c.time.bubble - best.bubble, "bubble"},
          {c.time.communication() - best.communication(), "communication"},
          {c.time.recompute - best.recompute, "recompute"},
          {c.time.compute + c.time.optimizer + c.time.overhead - best.compute - best.optimizer - best.overhead, "compute"}};
      const auto* worst = &parts[0];
      for (const auto& part : parts)
        if (part.first > worst->first) worst = &part;
      c.lost = worst->second;
      c.lost_ms = worst->first;
    }
    if (!c.lost.empty()) ++p.lost_counts[c.lost];
  }
  return p;
}

inline std::string gib(std::int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", double(bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

inline std::string format_ms(double ms) {
  char text[32];
  std::snprintf(text, sizeof text, ms < 10 ? "%.2f" : "%.1f", ms);
  return text;
}

// The best `top` layouts that fit, a line per layout, and what the others lost to.
inline std::string format_table(const Plan& p, std::size_t top = 10) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%zu layouts enumerated: %zu refused by the trainers' validation, %zu valid, %zu fit in %.1f GiB per GPU\n",
                p.enumerated, p.invalid.size(), p.valid.size(), p.fitting, p.cluster.gpu_memory_gib);
  out += line;
  if (p.fitting == 0) {
    if (!p.valid.empty())
      out += "no valid layout fits; the smallest needs " + gib(p.valid.front().memory.per_gpu()) + " GiB per GPU (" +
             describe_layout(p.valid.front().layout) + "): use more GPUs or GPUs with more memory\n";
    return out;
  }
  std::snprintf(line, sizeof line, "%4s %3s %3s %-18s %5s %3s %3s %4s %-13s %4s %8s %9s %12s %6s %7s  %s\n", "rank", "tp", "pp", "schedule",
                "dp", "cp", "ep", "mbs", "recompute", "dopt", "GiB/GPU", "step ms", "tokens/s", "MFU", "vs best", "lost to the best by");
  out += line;
  const double best = p.valid.front().time.total();
  for (std::size_t i = 0; i < std::min(top, p.fitting); ++i) {
    const Candidate& c = p.valid[i];
    const Layout& l = c.layout;
    std::string schedule = l.pp == 1 ? "-" : l.schedule == "interleaved" ? "interleaved/" + std::to_string(l.virtual_stages) : l.schedule;
    if (l.first_stage_layers > 0) schedule += " " + std::to_string(l.first_stage_layers) + ".." + std::to_string(l.last_stage_layers);
    std::snprintf(line, sizeof line, "%4zu %3d %3d %-18s %5d %3d %3d %4d %-13s %4s %8s %9.1f %12.0f %5.1f%% %6.3fx  %s\n", i + 1, l.tp, l.pp,
                  schedule.c_str(), l.dp, l.cp, l.ep, l.micro_batch, recompute_name(l), l.distributed_optimizer ? "on" : "off",
                  gib(c.memory.per_gpu()).c_str(), c.time.total(), c.tokens_per_second, 100 * c.mfu, c.time.total() / best,
                  i == 0 ? "(best)" : (c.lost + " (+" + format_ms(c.lost_ms) + " ms)").c_str());
    out += line;
  }
  const StepTime& b = p.valid.front().time;
  std::snprintf(line, sizeof line,
                "best step %.1f ms = compute %.1f + recompute %.1f + tensor-parallel %.1f + context-parallel %.1f + expert-parallel %.1f + "
                "pipeline transfers %.1f + data-parallel %.1f + bubble %.1f + optimizer %.1f + overhead %.1f\n",
                b.total(), b.compute, b.recompute, b.tensor_parallel, b.context_parallel, b.expert_parallel, b.pipeline_transfers,
                b.data_parallel, b.bubble, b.optimizer, b.overhead);
  out += line;
  out += "the others lost by:";
  for (const auto& [reason, count] : p.lost_counts) out += " " + reason + " " + std::to_string(count) + ",";
  if (!p.lost_counts.empty()) out.pop_back();
  out += "\n";
  if (!p.invalid.empty()) {  // the trainers' refusals, by their first words
    std::map<std::string, int> reasons;
    for (const Invalid& i : p.invalid) reasons[i.reason.substr(0, std::min<std::size_t>(i.reason.find_first_of(":;("), 100))]++;
    std::vector<std::pair<int, std::string>> sorted;
    for (const auto& [reason, count] : reasons) sorted.push_back({count, reason});
    std::sort(sorted.rbegin(), sorted.rend());
    out += "refused by the trainers' validation:\n";
    for (std::size_t i = 0; i < std::min<std::size_t>(5, sorted.size()); ++i)
      out += "  " + std::to_string(sorted[i].first) + " x " + sorted[i].second + "\n";
  }
  return out;
}

// Step time against memory per GPU, one point per valid layout (fitting ones filled, the best
// ringed), the GPU's memory as a vertical line. Plain SVG.
inline std::string svg(const Plan& p, const std::string& title) {
  const double width = 820, height = 520, left = 80, right = 30, top = 50, bottom = 60;
  // Memory up to 4 GPUs' worth: layouts needing more are drawn at the right edge.
  double max_memory = p.cluster.gpu_memory_gib * 1.1, max_time = 0, min_time = 1e300;
  for (const Candidate& c : p.valid) {
    max_memory = std::min(std::max(max_memory, double(c.memory.per_gpu()) / (1 << 30)), 4 * p.cluster.gpu_memory_gib);
    max_time = std::max(max_time, c.time.total());
    min_time = std::min(min_time, c.time.total());
  }
  if (p.valid.empty()) max_time = 1, min_time = 0.1;
  const double log_low = std::log10(std::max(1e-3, min_time)) - 0.05, log_high = std::log10(std::max(max_time, min_time * 1.01)) + 0.05;
  auto x = [&](double gib_value) { return left + (width - left - right) * std::min(gib_value, max_memory) / max_memory; };
  auto y = [&](double ms) { return height - bottom - (height - top - bottom) * (std::log10(ms) - log_low) / (log_high - log_low); };
  char buffer[512];
  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"820\" height=\"520\" font-family=\"sans-serif\" font-size=\"12\">\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::string escaped;
  for (char ch : title) escaped += ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '&' ? "&amp;" : std::string(1, ch);
  out += "<text x=\"80\" y=\"25\" font-size=\"15\">" + escaped + "</text>\n";
  std::snprintf(buffer, sizeof buffer, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/><line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n",
                left, height - bottom, width - right, height - bottom, left, top, left, height - bottom);
  out += buffer;
  for (int i = 0; i <= 5; ++i) {  // memory ticks
    const double v = max_memory * i / 5;
    std::snprintf(buffer, sizeof buffer, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%.0f</text>\n", x(v), height - bottom + 18, v);
    out += buffer;
  }
  for (double decade = std::pow(10.0, std::floor(log_low)); decade <= std::pow(10.0, log_high); decade *= 10)
    for (double f : {1.0, 1.5, 2.0, 3.0, 5.0, 7.0}) {
      const double v = decade * f;
      if (std::log10(v) < log_low || std::log10(v) > log_high) continue;
      std::snprintf(buffer, sizeof buffer, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%g</text><line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#ddd\"/>\n",
                    left - 6, y(v) + 4, v, left, y(v), width - right, y(v));
      out += buffer;
    }
  std::snprintf(buffer, sizeof buffer,
                "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">predicted memory per GPU (GiB; beyond the axis: at its end)</text>\n"
                "<text x=\"20\" y=\"%g\" transform=\"rotate(-90 20 %g)\" text-anchor=\"middle\">predicted step time (ms, log scale)</text>\n",
                (left + width - right) / 2, height - 15, (top + height - bottom) / 2, (top + height - bottom) / 2);
  out += buffer;
  std::snprintf(buffer, sizeof buffer, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"red\" stroke-dasharray=\"4 3\"/><text x=\"%g\" y=\"%g\" fill=\"red\">%.0f GiB per GPU</text>\n",
                x(p.cluster.gpu_memory_gib), top, x(p.cluster.gpu_memory_gib), height - bottom, x(p.cluster.gpu_memory_gib) + 4, top + 12,
                p.cluster.gpu_memory_gib);
  out += buffer;
  for (std::size_t i = p.valid.size(); i-- > 0;) {
    const Candidate& c = p.valid[i];
    std::snprintf(buffer, sizeof buffer, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\" fill-opacity=\"0.6\"><title>%s: %.2f GiB, %.1f ms</title></circle>\n",
                  x(double(c.memory.per_gpu()) / (1 << 30)), y(c.time.total()), c.fits ? "#1f77b4" : "#bbbbbb", describe_layout(c.layout).c_str(),
                  double(c.memory.per_gpu()) / (1 << 30), c.time.total());
    out += buffer;
  }
  if (p.fitting > 0) {
    const Candidate& best = p.valid.front();
    std::snprintf(buffer, sizeof buffer, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"8\" fill=\"none\" stroke=\"green\" stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\" fill=\"green\">best: %s</text>\n",
                  x(double(best.memory.per_gpu()) / (1 << 30)), y(best.time.total()), left + 10, top + 12, describe_layout(best.layout).c_str());
    out += buffer;
  }
  out += "</svg>\n";
  return out;
}

}  // namespace plan
