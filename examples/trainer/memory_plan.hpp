// examples/trainer/memory_plan.hpp: what a training run needs in memory, estimated from its flags
// before anything is allocated (`plan_memory<T>`): every pipeline rank's model memory
// (models/memory_estimate.hpp), its batches, the dataset indices and the loss history. The trainers
// print it and refuse a run that does not fit; strata-plan (examples/tools/plan/) predicts each
// layout's memory per GPU with the same function.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <strata/models.hpp>

#include "args.hpp"

namespace trainer {

using namespace strata;

// The validation dataset's index holds at most this many samples (24 MiB); a longer evaluation
// (--eval-iters x --global-batch-size beyond it) reads them again cyclically, so --eval-iters
// bounds time, not memory.
inline constexpr std::int64_t kMaxValidationIndexSamples = std::int64_t{1} << 20;

// Bytes of memory this process can still allocate: /proc/meminfo's MemAvailable, else the free
// physical pages (sysconf); -1 when neither is known.
inline std::int64_t host_memory_available() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::int64_t>(pages) * page : -1;
}

// What a run needs in host memory, estimated before anything is allocated: every rank's model
// memory (models::estimate_pipeline_rank_memory: its pipeline stage's parameters, the activations
// its schedule keeps in flight under the run's recompute, the optimizer state over dp with the
// distributed optimizer) and input batches, the dataset sample indices (24 bytes per sample: sample
// index pair + shuffle index) and the loss history.
struct MemoryPlan {
  models::MemoryEstimate per_rank;    // the pipeline rank that needs the most (every rank without a pipeline)
  int per_rank_stage = 0;             // which pipeline rank that is
  int stages = 1;                     // pipeline ranks
  std::vector<models::MemoryEstimate> stage_estimates;  // per pipeline rank
  std::int64_t batch_bytes = 0;       // per rank: the micro-batches of one iteration
  std::int64_t ranks = 0;
  std::int64_t train_index_bytes = 0;
  std::int64_t validation_index_bytes = 0;
  std::int64_t history_bytes = 0;
  std::int64_t total = 0;
  std::int64_t available = -1;
  bool padded_experts = false;        // --moe-pad-expert-input-to-capacity: the experts' rows are their capacity
};

// The layers --fp8-format runs in FP8 (not --first-last-layers-bf16's) and what they keep, for the
// memory estimate (models::Fp8Layers); none without --fp8-format.
inline models::Fp8Layers fp8_layers_of(const TrainArgs& a) {
  models::Fp8Layers fp8;
  if (a.fp8_format.empty()) return fp8;
  fp8.first = a.first_last_layers_bf16 ? a.num_layers_at_start_in_bf16 : 0;
  fp8.end = a.model.num_layers - (a.first_last_layers_bf16 ? a.num_layers_at_end_in_bf16 : 0);
  fp8.codes_kept = a.fp8_recipe != "blockwise";
  fp8.attention_output_recast = a.fp8_recast_attention_output;
  fp8.activation_codes_later = a.fp8_recipe == "delayed" && a.fp8_activation_codes_in_backward;
  fp8.experts = a.fp8_recipe == "delayed" && a.fp8_experts;  // layers/moe/experts.hpp
  // --fp8-param-gather: the gathered codes are the forward's W (counted here, not as parameters)
  fp8.forward_codes_cached =
      a.fp8_recipe == "blockwise" || !a.fp8_cache_weights || a.fp8_param_gather || fp8_keeps_forward_weight_codes(a);
  // blockwise casts into the cache's buffers even when it casts per GEMM
  fp8.weight_cache = a.fp8_recipe == "blockwise" || (a.fp8_cache_weights && a.fp8_weight_cache != "none");
  return fp8;
}

template <class T>
MemoryPlan plan_memory(const TrainArgs& a) {
  MemoryPlan plan;
  const models::DecoderShape shape = a.model_kind == "gpt" ? models::DecoderShape::gpt() : models::DecoderShape::llama();
  const int tp = a.tensor_model_parallel_size, pp = a.pipeline.pipeline_model_parallel_size;
  const std::int64_t dp = data_parallel_size_of(a);
  // Activations are those of each rank's local tokens: seq_length / cp under context parallelism.
  models::ModelConfig local_model = a.model;
  local_model.seq_length = a.model.seq_length / std::max(1, a.context_parallel_size);
  // tokens, labels (int32) and loss mask (float) of every micro-batch of an iteration
  plan.batch_bytes = checked_product("batch memory", a.global_batch_size / dp, a.model.seq_length, 12);
  plan.ranks = a.world_size;
  plan.stages = pp;
  plan.padded_experts = a.model.moe.enabled() && a.model.moe.pad_to_capacity;
  const int micro_steps = static_cast<int>(a.global_batch_size / (static_cast<std::int64_t>(a.micro_batch_size) * dp));
  std::int64_t pipeline_total = 0;  // one rank of each pipeline stage, batches included
  auto holdings = pipeline_holdings(a.pipeline, a.model, micro_steps);
  const ParallelConfig parallel = parallel_config_of(a);
  for (auto& holding : holdings)
    for (auto& piece : holding.chunks) piece.ep = parallel.ep, piece.etp = parallel.etp;
  const models::Fp8Layers fp8 = fp8_layers_of(a);
  for (std::size_t r = 0; r < holdings.size(); ++r) {
    models::MemoryEstimate e = models::estimate_pipeline_rank_memory(
        local_model, shape, tp, a.sequence_parallel, a.micro_batch_size, models::element_bytes_of<T>(),
        static_cast<std::int64_t>(ClassifierChunks{}.max_bytes), holdings[r],
        a.use_distributed_optimizer ? dp * a.context_parallel_size : 1, fp8, recompute_of(a));
    e.activation_bytes = checked_add(  // the ring's (or all-to-all's) buffers of one layer's backward
        e.activation_bytes,
        models::context_parallel_attention_bytes(a.model, tp, a.context_parallel_size, context_parallel_comm_of(a),
                                                 a.micro_batch_size, models::element_bytes_of<T>()),
        "memory");
    plan.stage_estimates.push_back(e);
    if (r == 0 || e.total() > plan.per_rank.total()) {
      plan.per_rank = e;
      plan.per_rank_stage = static_cast<int>(r);
    }
    pipeline_total = checked_add(pipeline_total, checked_add(e.total(), plan.batch_bytes, "memory"), "memory");
  }
  const std::int64_t train_samples = samples_of(batch_schedule_of(a), a.train_iters);
  plan.train_index_bytes = checked_mul(train_samples, 24, "training dataset index");
  if (a.eval_iters > 0) {  // the validation index covers --eval-iters global batches, up to its cap
    const std::int64_t eval_samples = checked_mul(a.eval_iters, a.global_batch_size, "validation samples");
    plan.validation_index_bytes = checked_mul(std::min(eval_samples, kMaxValidationIndexSamples), 24, "validation dataset index");
  }
  plan.history_bytes = checked_mul(a.train_iters, 8, "loss history");
  std::int64_t total = checked_mul(pipeline_total, plan.ranks / pp, "memory");
  total = checked_add(total, plan.train_index_bytes, "memory");
  total = checked_add(total, plan.validation_index_bytes, "memory");
  plan.total = checked_add(total, plan.history_bytes, "memory");
  plan.available = host_memory_available();
  return plan;
}

// Megatron's memory report, one line.
inline std::string describe(const MemoryPlan& p, const std::string& dtype) {
  const auto& r = p.per_rank;
  return ::strata::detail::concat(
      "memory estimate per rank (", dtype, p.stages > 1 ? ::strata::detail::concat(", pipeline rank ", p.per_rank_stage, " of ", p.stages, ", the largest") : std::string(),
      "): ", r.parameters, " parameters ", models::format_bytes(r.parameter_bytes),
      ", gradients ", models::format_bytes(r.gradient_bytes), ", optimizer ", models::format_bytes(r.optimizer_bytes),
      ", activations ", models::format_bytes(r.activation_bytes),
      r.fp8_cache_bytes > 0 ? ", FP8 weight caches " + models::format_bytes(r.fp8_cache_bytes) : std::string(), ", batches ", models::format_bytes(p.batch_bytes), p.stages > 1 ? "; over the stages, x " : "; x ",
      p.stages > 1 ? p.ranks / p.stages : p.ranks, p.stages > 1 ? " replicas" : " ranks", " + dataset indices ", models::format_bytes(p.train_index_bytes + p.validation_index_bytes),
      " + history ", models::format_bytes(p.history_bytes), " = ", models::format_bytes(p.total), " of ",
      p.available < 0 ? std::string("unknown") : models::format_bytes(p.available), " available");
}

// Refuses a run whose estimate exceeds the memory available, with the numbers.
inline void check_fits(const MemoryPlan& p, const std::string& dtype) {
  if (p.available >= 0 && p.total > p.available)
    fail<ConfigError>("the configuration does not fit in memory: ", describe(p, dtype),
                      ". Use smaller --hidden-size, --num-layers, --vocab-size, --seq-length, --micro-batch-size, "
                      "--train-iters or --eval-iters", p.padded_experts ? ", a smaller --moe-expert-capacity-factor" : "",
                      ", or fewer ranks");
}

}  // namespace trainer
