// examples/trainer/pipeline_step.hpp: the trainers' pipeline parallelism: Megatron's flags, their
// checks, and the step's forwards and backwards run by a pipeline schedule.
//
//   --pipeline-model-parallel-size P              pipeline stages (world = tp x pp x dp)
//   --num-layers-per-virtual-pipeline-stage N     interleaved schedule: num_layers / (P N) chunks per rank
//   --decoder-first-pipeline-num-layers F         layers of the first stage (the rest split evenly)
//   --decoder-last-pipeline-num-layers L          layers of the last stage
//   --pipeline-schedule gpipe|1f1b|interleaved|zero-bubble
//
// The model is a models::PipelineModel on every run (with P = 1 one chunk holding the whole
// model, and 1F1B over one stage is plain gradient accumulation), so the optimizer, the gradient
// norm and the checkpoints see this rank's stage through for_each_parameter.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <strata/models.hpp>
#include <strata/pipeline.hpp>

namespace trainer {

struct PipelineArgs {
  int pipeline_model_parallel_size = 1;
  int num_layers_per_virtual_pipeline_stage = 0;  // 0: one chunk per rank
  int decoder_first_pipeline_num_layers = -1;     // -1: even split
  int decoder_last_pipeline_num_layers = -1;
  std::string pipeline_schedule = "1f1b";
  bool overlap_p2p_communication = false;  // the transfers beside the compute (ExecutorOptions::overlap_transfers)
};

inline void add_pipeline_options(CLI::App& app, PipelineArgs& p) {
  app.add_option("--pipeline-model-parallel-size", p.pipeline_model_parallel_size, "pipeline stages");
  app.add_option("--num-layers-per-virtual-pipeline-stage", p.num_layers_per_virtual_pipeline_stage,
                 "layers per model chunk of the interleaved schedule (0: one chunk per rank)");
  app.add_option("--decoder-first-pipeline-num-layers", p.decoder_first_pipeline_num_layers,
                 "layers of the first pipeline stage (-1: split evenly)");
  app.add_option("--decoder-last-pipeline-num-layers", p.decoder_last_pipeline_num_layers,
                 "layers of the last pipeline stage (-1: split evenly)");
  app.add_option("--pipeline-schedule", p.pipeline_schedule, "pipeline schedule")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zero-bubble"}));
  app.add_flag("--overlap-p2p-communication,!--no-overlap-p2p-communication", p.overlap_p2p_communication,
               "send and receive the activations and gradients between stages on the communication stream, beside the "
               "compute: a rank goes on computing while its peers take its sends, and waits for a received tensor only "
               "right before the action that reads it (NCCL; the same bits; on the CPU the in-process transfers are done "
               "when issued)");
}

inline strata::pipeline::ScheduleKind schedule_kind_of(const PipelineArgs& p) {
  strata::pipeline::ScheduleKind kind{};
  if (!strata::pipeline::parse_schedule_kind(p.pipeline_schedule, kind))
    strata::fail<strata::ConfigError>("--pipeline-schedule=", p.pipeline_schedule,
                                      " is not a schedule; use gpipe, 1f1b, interleaved or zero-bubble");
  return kind;
}

inline int virtual_stages_of(const PipelineArgs& p, const strata::models::ModelConfig& m) {
  const int per = p.num_layers_per_virtual_pipeline_stage;
  if (per <= 0) return 1;
  const int pp = p.pipeline_model_parallel_size;
  if (m.num_layers % (pp * per) != 0)
    strata::fail<strata::ConfigError>("--num-layers-per-virtual-pipeline-stage=", per, " x --pipeline-model-parallel-size=", pp,
                                      " does not divide --num-layers=", m.num_layers,
                                      "; every rank holds num_layers / (pp x that) chunks of that many layers");
  return m.num_layers / (pp * per);
}

inline strata::models::PipelineLayout layout_of(const PipelineArgs& p, const strata::models::ModelConfig& m) {
  return {virtual_stages_of(p, m), p.decoder_first_pipeline_num_layers, p.decoder_last_pipeline_num_layers};
}

// Throws ConfigError naming the first flag that cannot work (before anything is allocated).
inline void check_pipeline_args(const PipelineArgs& p, const strata::models::ModelConfig& m, int world_size, int tp,
                                int micro_steps, bool sampling) {
  const int pp = p.pipeline_model_parallel_size;
  if (pp < 1 || world_size % (tp * pp) != 0)
    strata::fail<strata::ConfigError>("--pipeline-model-parallel-size=", pp, " x --tensor-model-parallel-size=", tp,
                                      " does not divide --world-size=", world_size,
                                      "; the world is tensor parallel x pipeline parallel x data parallel");
  const auto kind = schedule_kind_of(p);
  const int v = virtual_stages_of(p, m);
  if (v > 1 && kind != strata::pipeline::ScheduleKind::interleaved)
    strata::fail<strata::ConfigError>("--num-layers-per-virtual-pipeline-stage gives ", v,
                                      " chunks per rank, which only --pipeline-schedule interleaved runs (got ",
                                      p.pipeline_schedule, ")");
  (void)strata::pipeline::stage_layers_of(m.num_layers, pp, v, 0, 0, p.decoder_first_pipeline_num_layers,
                                          p.decoder_last_pipeline_num_layers);
  const strata::Problem problem = strata::pipeline::schedule_problem({kind, pp, micro_steps, v});
  if (!problem.ok())
    strata::fail<strata::ConfigError>("--pipeline-schedule ", p.pipeline_schedule, " with ", micro_steps,
                                      " micro-batches per step (global batch / (micro-batch size x data parallel)): ",
                                      problem.message());
  if (pp > 1 && sampling)
    strata::fail<strata::ConfigError>("--sample-tokens runs the whole model on each rank; with --pipeline-model-parallel-size=",
                                      pp, " pass --sample-tokens 0");
}

// What each pipeline rank holds of the model (its chunks' layers and ends), its schedule's peak of
// micro-batch chunks in flight (pipeline::claimed_peak_in_flight) and, under zero-bubble, the
// micro-batch whose weight gradients wait, for the memory plan.
inline std::vector<strata::models::PipelineRankHolding> pipeline_holdings(const PipelineArgs& p, const strata::models::ModelConfig& m,
                                                                          int micro_steps) {
  const int pp = p.pipeline_model_parallel_size, v = virtual_stages_of(p, m);
  const strata::pipeline::ScheduleShape shape{schedule_kind_of(p), pp, micro_steps, v};
  std::vector<strata::models::PipelineRankHolding> out(static_cast<std::size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    auto& rank = out[static_cast<std::size_t>(r)];
    rank.peak_in_flight = strata::pipeline::claimed_peak_in_flight(shape, r);
    // Zero-bubble: the micro-batch between its input half (Bi) and its weight half (W) holds its
    // linear layers' output gradients besides its activations.
    if (shape.kind == strata::pipeline::ScheduleKind::zero_bubble) rank.deferred_weight_gradients = 1;
    for (int c = 0; c < v; ++c) {
      const auto stage = strata::pipeline::stage_layers_of(m.num_layers, pp, v, r, c, p.decoder_first_pipeline_num_layers,
                                                           p.decoder_last_pipeline_num_layers);
      strata::models::ModelPiece piece{stage.layers.end - stage.layers.begin, stage.has_embedding, stage.has_head};
      piece.first_layer = stage.layers.begin;
      rank.chunks.push_back(piece);
    }
  }
  return out;
}

// The step's forwards and backwards: every micro-batch of this data-parallel rank through the
// schedule; the loss sum (on every rank) is added to `loss_sum`. `ready` (when set) is told each
// parameter whose gradient is final (the data-parallel buckets' overlap), `needed` (when set) each
// parameter the forward is about to read (the overlapped parameter all-gather); `options` may
// carry an observer of the actions (pipeline_timing.hpp).
template <class Context, class Model, class Batch, class Ready, class Needed>
void pipeline_micro_batches(Context& ctx, Model& model, strata::pipeline::ScheduleKind kind, const std::vector<Batch>& batches,
                            const std::vector<std::uint64_t>& dropout_keys, double loss_scale,
                            strata::Tensor<double, typename Context::space>& loss_sum, const Ready& ready, const Needed& needed,
                            const strata::pipeline::ExecutorOptions& options = {}) {
  const auto result = model.train_step(ctx, kind, std::span<const Batch>(batches), std::span<const std::uint64_t>(dropout_keys),
                                       loss_scale, options, ready ? &ready : nullptr, needed ? &needed : nullptr);
  ctx.device.template add<double>(loss_sum.data(), result.loss_sum.data(), 1, loss_sum.data());
}

}  // namespace trainer
