// The MoE model's harness: models::MoeLlama on a parallel layout against one rank. Every rank of the
// layout runs the micro-batch of its data-parallel index; the single rank runs those micro-batches
// one after another (its gradients accumulate as the data-parallel reduction sums them). Recorded:
// each micro-batch's loss sum, the router losses [aux, z] summed over every rank, every parameter's
// value and gradient (dense ones gathered over tp and summed over dp, expert ones gathered over
// etp and summed over expert dp) and, with a `Step`, the parameters after one optimizer step
// (recorded as outputs, gathered the same way) and the step's gradient norm.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>

#include <strata/models.hpp>

#include "../common/equivalence.hpp"
#include "../models/model_equivalence.hpp"

namespace moe_model_test {

using namespace strata;
using strata_test::Snapshot;

constexpr index_t kMicroBatch = 2;

inline models::ModelConfig tiny_config(int experts = 8, bool shared = true) {
  models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 32;
  c.vocab_size = 61;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 16;
  c.init_method_std = 0.1;  // every expert of every layer receives tokens
  c.moe.num_experts = experts;
  c.moe.topk = 2;
  c.moe.expert_ffn_hidden_size = 16;
  c.moe.shared_expert_ffn_hidden_size = shared ? 16 : 0;
  c.moe.aux_loss_coeff = 0.05;
  c.moe.z_loss_coeff = 0.01;
  return c;
}

inline std::string describe(const ParallelConfig& c, bool sp) {
  return "tp=" + std::to_string(c.tp) + (sp ? " SP" : "") + " dp=" + std::to_string(c.dp) + " ep=" + std::to_string(c.ep) +
         " etp=" + std::to_string(c.etp);
}

// Collective: every parameter's global value (and gradient) into `values` (and `grads`): dense
// ones gathered over tp (their gradients summed over dp unless `reduced`), expert ones gathered over
// etp (summed over expert dp unless `reduced`). Written by the first rank of each group.
template <class Context, class Model>
void gather_model(Context& ctx, Model& model, std::map<std::string, strata_test::Values>* values,
                  std::map<std::string, strata_test::Values>* grads, bool reduced, std::mutex& mutex) {
  model.for_each_parameter([&](auto& p) {
    auto& split = p.expert ? ctx.expert_tp : ctx.tp;
    auto& replicas = p.expert ? ctx.expert_dp : ctx.dp;
    auto value = gather_global(split, p, p.value);
    auto grad = gather_global(split, p, p.grad);
    if (!reduced && replicas.size() > 1) replicas.all_reduce(grad.buffer(), ReduceOp::sum);
    if (split.rank() == 0 && replicas.rank() == 0) {
      std::lock_guard lock(mutex);
      if (values) (*values)[p.name] = strata_test::to_values(value);
      if (grads) (*grads)[p.name] = strata_test::to_values(grad);
    }
  });
}

// What runs after the backward on each rank (an optimizer step); null: nothing. It gets the context
// and the model, reduces the gradients itself and returns the gradient norm it measured.
template <class Model>
using Step = std::function<double(ParallelContext<inprocess::communicator>&, Model&)>;

// micro_batches > 0: one rank runs that many micro-batches (the reference); else config's layout,
// one micro-batch per data-parallel rank.
template <template <class> class Model, bool SP>
Snapshot run_moe_model(const ParallelConfig& config, int micro_batches, const models::ModelConfig& model_config,
                       Step<Model<strata_test::TestPolicy<double, SP>>> step = {}) {
  using P = strata_test::TestPolicy<double, SP>;
  using Context = ParallelContext<inprocess::communicator>;
  Snapshot snapshot;
  std::mutex mutex;
  std::map<int, double> loss_sums;
  std::map<std::string, strata_test::Values> stepped;  // parameters after the step
  strata_test::Values norms;                           // the step's gradient norm on every rank
  strata_test::Values router(2, 0.0);
  const int batches = micro_batches > 0 ? micro_batches : config.dp;
  inprocess::run(config.world_size(), [&](inprocess::communicator& world) {
    auto ctx = Context::create(world, config);
    Model<P> model(ctx, model_config);
    model.init(ctx, 1234);
    const double loss_scale = 1.0 / static_cast<double>(batches * kMicroBatch * model_config.seq_length);
    const int first = micro_batches > 0 ? 0 : ctx.coords.dp, last = micro_batches > 0 ? micro_batches : ctx.coords.dp + 1;
    for (int d = first; d < last; ++d) {
      const auto batch = strata_test::random_batch(model_config.vocab_size, kMicroBatch, model_config.seq_length, 77 + 10 * d);
      auto [loss, saved] = model.forward(ctx, batch.tokens, batch.labels, batch.mask, 99 + d, models::FusedLoss{loss_scale});
      model.backward(ctx, saved, loss_scale);
      if (ctx.tp.rank() == 0) {
        std::lock_guard lock(mutex);
        loss_sums[d] = loss.loss_sum();
      }
    }
    {
      const Tensor<double> mine = to_host(model.router_losses(ctx));
      std::lock_guard lock(mutex);
      router[0] += mine[0], router[1] += mine[1];
    }
    gather_model(ctx, model, &snapshot.values, &snapshot.grads, false, mutex);
    if (step) {
      const double norm = step(ctx, model);
      {
        std::lock_guard lock(mutex);
        norms.push_back(norm);
      }
      gather_model(ctx, model, &stepped, nullptr, true, mutex);
    }
  });
  strata_test::Values losses;
  for (auto& [d, l] : loss_sums) losses.push_back(l);
  snapshot.outputs = {losses, router};
  if (step) {  // the same norm on every rank
    for (double n : norms) EXPECT_EQ(n, norms.front()) << "the gradient norm differs between ranks";
    snapshot.outputs.push_back({norms.front()});
  }
  for (auto& [name, v] : stepped) snapshot.outputs.push_back(v);
  return snapshot;
}

}  // namespace moe_model_test
