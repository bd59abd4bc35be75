// Shared body of the pipeline tests: a model cut into pp stages (v chunks per rank) and run under a
// schedule on tp x pp in-process ranks, against the single-rank run of the same micro-batches:
// the loss, every parameter's gathered gradient, and the measured peak of micro-batch chunks in
// flight on each pipeline rank against the schedule's claim.
#pragma once

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include <strata/models.hpp>
#include <strata/optim.hpp>
#include <strata/pipeline.hpp>

#include "../common/equivalence.hpp"
#include "../models/model_equivalence.hpp"

namespace strata_test {

struct PipelineRun {
  strata::pipeline::ScheduleKind kind = strata::pipeline::ScheduleKind::one_f_one_b;
  int tp = 1;
  int pp = 1;
  int virtual_stages = 1;
  int micro_batches = 1;
  int first_stage_layers = -1;
  int last_stage_layers = -1;
  int steps = 0;  // optimizer steps after the compared gradients (0: gradients of one step only)

  std::string str() const {
    return std::string(strata::pipeline::schedule_name(kind)) + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) +
           " v=" + std::to_string(virtual_stages) + " m=" + std::to_string(micro_batches);
  }
};

// A GPT small enough for every schedule on CPU threads (seq 4, hidden 16, 2 heads, vocab 32).
inline strata::models::ModelConfig tiny_gpt(int layers) {
  strata::models::ModelConfig c;
  c.num_layers = layers;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.ffn_hidden_size = 32;
  c.vocab_size = 32;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 4;
  return c;
}

// A Llama as small (untied output layer, RoPE, RMSNorm, SwiGLU, 4 heads in 2 query groups), 8
// layers: pp=4 x 2 chunks.
inline strata::models::ModelConfig tiny_llama() {
  strata::models::ModelConfig c;
  c.num_layers = 8;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 32;
  c.vocab_size = 32;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 4;
  return c;
}

inline std::vector<TokenBatch> micro_batches(const strata::models::ModelConfig& config, int m) {
  std::vector<TokenBatch> out;
  for (int i = 0; i < m; ++i) out.push_back(random_batch(config.vocab_size, 1, config.seq_length, 500 + 17 * i));
  return out;
}
inline std::vector<std::uint64_t> dropout_keys(int m) {
  std::vector<std::uint64_t> keys;
  for (int i = 0; i < m; ++i) keys.push_back(900 + static_cast<std::uint64_t>(i));
  return keys;
}
inline double token_count(const std::vector<TokenBatch>& batches) {
  double n = 0;
  for (const auto& b : batches)
    for (strata::index_t i = 0; i < b.mask.numel(); ++i) n += b.mask[i];
  return n;
}

// A batch as the executor reads it.
struct PipelineBatch {
  strata::Tensor<std::int32_t> tokens, labels;
  strata::Tensor<float> loss_mask;
};
inline std::vector<PipelineBatch> as_pipeline_batches(const std::vector<TokenBatch>& batches) {
  std::vector<PipelineBatch> out;
  for (const auto& b : batches) out.push_back({b.tokens, b.labels, b.mask});
  return out;
}

// Collective: every parameter gathered over tp, written by tp rank 0 of each pipeline rank; the
// tied copy (pipeline_copy) is left out (tests compare it with the original on their own).
template <class Context, class Module>
void gather_pipeline_parameters(Context& ctx, Module& module, Snapshot& snapshot, std::mutex& mutex) {
  module.for_each_parameter([&](auto& p) {
    auto value = strata::gather_global(ctx.tp, p, p.value);
    auto grad = strata::gather_global(ctx.tp, p, p.grad);
    if (ctx.tp.rank() == 0 && !p.pipeline_copy) {
      std::lock_guard lock(mutex);
      snapshot.values[p.name] = to_values(value);
      snapshot.grads[p.name] = to_values(grad);
    }
  });
}

// The reference: the whole model on one rank, the micro-batches one after the other (fused loss),
// gradients accumulated; with run.steps, AdamW steps on each batch after the first.
template <template <class> class Model, class T>
Snapshot reference_run(const strata::models::ModelConfig& config, int m, int steps = 0) {
  using namespace strata;
  using P = ModelPolicy<T, false>;
  Snapshot snapshot;
  std::mutex mutex;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    Model<P> model(ctx, config);
    model.init(ctx, 1234);
    AdamW<T> optimizer(ctx.device, model);
    const auto batches = micro_batches(config, m);
    const auto keys = dropout_keys(m);
    const double loss_scale = 1.0 / token_count(batches);
    for (int step = 0; step <= steps; ++step) {
      zero_gradients(ctx.device, model);
      double loss = 0;
      for (int i = 0; i < m; ++i) {
        const auto& b = batches[static_cast<std::size_t>(i)];
        auto [l, saved] = model.forward(ctx, b.tokens, b.labels, b.mask, keys[static_cast<std::size_t>(i)],
                                        models::FusedLoss{loss_scale});
        model.backward(ctx, saved, loss_scale);
        loss += l.loss_sum();
      }
      snapshot.outputs.push_back({loss});
      if (step < steps) optimizer.step(ctx.device, model, 1e-2);
    }
    gather_pipeline_parameters(ctx, model, snapshot, mutex);
  });
  return snapshot;
}

// The same micro-batches through PipelineModel on tp x pp ranks. Checks on the way: the measured
// peak in flight equals the claim on every pipeline rank, and the tied embedding copies are
// bit-identical (value and gradient) on the first and last stage.
template <template <class> class Model, class T, bool SP>
Snapshot pipeline_run(const strata::models::ModelConfig& config, const PipelineRun& run) {
  using namespace strata;
  using P = ModelPolicy<T, SP>;
  Snapshot snapshot;
  std::mutex mutex;
  inprocess::run(run.tp * run.pp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = run.tp, .pp = run.pp});
    models::PipelineModel<Model, P> model(ctx, config,
                                          {run.virtual_stages, run.first_stage_layers, run.last_stage_layers});
    model.init(ctx, 1234);
    AdamW<T> optimizer(ctx.device, model);
    const auto batches = as_pipeline_batches(micro_batches(config, run.micro_batches));
    const auto keys = dropout_keys(run.micro_batches);
    double tokens = 0;
    for (const auto& b : batches)
      for (index_t i = 0; i < b.loss_mask.numel(); ++i) tokens += b.loss_mask[i];
    const pipeline::ScheduleShape shape{run.kind, run.pp, run.micro_batches, run.virtual_stages};
    for (int step = 0; step <= run.steps; ++step) {
      zero_gradients(ctx.device, model);
      auto result = model.train_step(ctx, run.kind, std::span<const PipelineBatch>(batches), std::span<const std::uint64_t>(keys),
                                     1.0 / tokens);
      EXPECT_EQ(result.peak_in_flight, pipeline::claimed_peak_in_flight(shape, ctx.pp.rank()))
          << run.str() << ": measured peak in flight on pipeline rank " << ctx.pp.rank();
      EXPECT_EQ(result.tokens, tokens);
      const double loss = result.loss_sum_on_host();
      if (world.rank() == 0) {
        std::lock_guard lock(mutex);
        snapshot.outputs.push_back({loss});
      }
      if (step < run.steps) optimizer.step(ctx.device, model, 1e-2);
    }
    gather_pipeline_parameters(ctx, model, snapshot, mutex);
    // The tied copies: the first stage sends its embedding value and gradient to the last stage.
    Parameter<T>* tied = nullptr;
    for (auto* chunk : model.chunks())
      if (auto* p = chunk->tied_embedding_copy()) tied = p;
    if (tied != nullptr && run.pp > 1) {
      if (ctx.pp.rank() == 0) {
        ctx.pp.send(tied->value.buffer(), run.pp - 1);
        ctx.pp.send(tied->grad.buffer(), run.pp - 1);
      } else {
        auto value = Tensor<T>::empty(tied->value.shape());
        auto grad = Tensor<typename Parameter<T>::grad_type>::empty(tied->grad.shape());
        ctx.pp.recv(value.buffer(), 0);
        ctx.pp.recv(grad.buffer(), 0);
        bool same = true;
        for (index_t i = 0; i < value.numel(); ++i) same = same && value[i] == tied->value[i] && grad[i] == tied->grad[i];
        EXPECT_TRUE(same) << run.str() << ": the tied embedding copies differ on the first and last stage";
        EXPECT_TRUE(tied->pipeline_copy);
      }
    }
  });
  return snapshot;
}

// Every schedule on pp in {2, 4} with micro-batches {pp, 2 pp, pp + 1} (interleaved with two chunks
// where pp divides them), on tp (with and without sequence parallelism when tp > 1), against the
// single-rank run.
template <template <class> class Model, class T>
void expect_pipeline_equivalence(const strata::models::ModelConfig& config, int tp, strata::pipeline::ScheduleKind kind) {
  using strata::pipeline::ScheduleKind;
  for (int pp : {2, 4})
    for (int m : {pp, 2 * pp, pp + 1}) {
      const Snapshot reference = reference_run<Model, T>(config, m);
      const int v = kind == ScheduleKind::interleaved && m % pp == 0 ? 2 : 1;
      const PipelineRun run{kind, tp, pp, v, m};
      expect_equivalent(pipeline_run<Model, T, false>(config, run), reference, tolerance<T>(), run.str());
      if (tp > 1) expect_equivalent(pipeline_run<Model, T, true>(config, run), reference, tolerance<T>(), run.str() + " SP");
    }
}

}  // namespace strata_test
