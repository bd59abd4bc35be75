// strata/pipeline/executor.hpp: `run_schedule`, the one executor of every schedule table: it walks
// this rank's actions (schedule.hpp) step by step, exchanges the transfers of each step in one
// batch over the pipeline group (strata::batch_point_to_point: an NCCL group; the in-process
// communicator's sends are buffered), and runs each action on the rank's model chunk:
//
//   F   chunk.forward_stage(ctx, input, tokens, labels, mask, key, loss_scale): the input received
//       from the previous stage (none on the first); the Saved kept; the output sent next step
//   B   chunk.backward_stage(ctx, saved, dy, loss_scale): the gradient received from the next
//       stage (none on the last); the Saved freed at once; the input gradient sent next step
//   Bi  the same with a DeferredWeightGradients list: the input gradient now, the linear layers'
//       weight gradients appended to the list; the Saved freed at once
//   W   the list run and freed
//
// With ExecutorOptions::overlap_transfers the batches run beside the compute (NCCL: on the
// communication stream), each action waiting only for the batch that brought its input.
//
// Shapes are known in advance (chunk.boundary_shape), so receives need no handshake; under sequence
// parallelism each tensor-parallel rank sends its own sequence shard. The loss sum of every
// micro-batch is added on the backend by the rank that holds the last stage and broadcast over the
// pipeline group at the end, so every rank returns the step's loss sum; the token count comes from
// the masks, on the host. Gradients of  loss_scale * sum(mask * loss)  accumulate in the chunks'
// parameters (loss_scale = 1 / tokens of the global batch averages the loss over micro-batches).
//
// A chunk (the Stage type) provides: Saved, Boundary (an Activation), boundary_shape(ctx, b, s),
// forward_stage, backward_stage as above, has_embedding(), has_head() (models::DecoderModel does).
// A Batch provides tokens, labels ([b, s] int32 host tensors) and loss_mask ([b, s] float).
//
// The table is checked (verify_schedule) before anything runs; the result reports the measured
// peak of micro-batch chunks in flight (Saved or deferred weight gradients held), which equals
// claimed_peak_in_flight.
//
// An observer (ExecutorOptions::on_action) is called with (action, true) right before and
// (action, false) right after each F / B / Bi / W, in table order, and never around the transfer
// batches: what runs between one action's end and the next one's begin is the rank's transfers and
// its wait for them. The executor knows nothing of clocks or streams; a caller measures with them
// (the trainers time each action with the device's events to report the measured bubble).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "../comm/communicator.hpp"
#include "../core/tensor.hpp"
#include "../layers/chunked_classifier.hpp"
#include "../layers/deferred_weight_gradients.hpp"
#include "../layers/parameter.hpp"
#include "../shard/context_parallel.hpp"
#include "schedule_check.hpp"

STRATA_NAMESPACE_BEGIN
namespace pipeline {

template <class Space>
struct PipelineStepResult {
  Tensor<double, Space> loss_sum;  // [1]: sum over micro-batches and tokens of mask * loss, on every rank
  double tokens = 0;               // sum of the masks of every micro-batch (this rank's tokens under context parallelism)
  int peak_in_flight = 0;          // measured on this rank
  int transfers = 0;               // sends and receives this rank issued

  double loss_sum_on_host() const { return loss_sum.empty() ? 0.0 : to_host(loss_sum)[0]; }
};

struct ExecutorOptions {
  ClassifierChunks classifier = {};  // blocks of rows of the fused output layer and loss
  bool verify = true;                // check the table before running it
  // Called right before (begin = true) and right after (begin = false) each action's compute; empty: none.
  std::function<void(const Action&, bool begin)> on_action = {};
  // Transfers beside the compute (communicator.hpp, "Communication beside compute"; NCCL: on the
  // communication stream): each step's batch is issued and the rank goes on computing; an action
  // waits for the batch that brought its input right before it begins (so the wait is not counted
  // in its time), and a sent tensor is kept until the compute stream has waited for its batch.
  // The same transfers in the same order: the same bits. A communicator whose operations are done
  // when they return (in-process) runs as without it.
  bool overlap_transfers = false;
};

// Runs one step of `shape` on this rank. chunks[c]: this rank's model chunk c; batches[mb] and
// dropout_keys[mb]: micro-batch mb. Collective over ctx.pp (and, inside the chunks, ctx.tp).
// `ready` (optional): handed every parameter of a chunk once its gradient is final for the step:
// layer by layer during the chunk's last backward, or the whole chunk after its last W.
// `needed` (optional): handed every parameter of a chunk during its first forward of the step,
// module by module right before each runs (ParameterNeeded).
template <class Context, class Stage, class Batch>
PipelineStepResult<typename Context::space> run_schedule(
    Context& ctx, const ScheduleShape& shape, std::span<Stage* const> chunks, std::span<const Batch> batches,
    std::span<const std::uint64_t> dropout_keys, double loss_scale, const ExecutorOptions& options = {},
    const GradientReady<typename Stage::Boundary::element_type, typename Context::space>* ready = nullptr,
    const ParameterNeeded<typename Stage::Boundary::element_type, typename Context::space>* needed = nullptr) {
  using Space = typename Context::space;
  using Boundary = typename Stage::Boundary;
  using Saved = typename Stage::Saved;
  using T = typename Boundary::element_type;
  if (ready != nullptr && !*ready) ready = nullptr;
  if (needed != nullptr && !*needed) needed = nullptr;
  if (shape.pp != ctx.pp.size())
    fail<ConfigError>("run_schedule: the schedule is for pp=", shape.pp, " but the pipeline group has ", ctx.pp.size(), " ranks");
  if (static_cast<int>(chunks.size()) != shape.virtual_stages)
    fail<ConfigError>("run_schedule: the schedule runs virtual_stages=", shape.virtual_stages, " chunks per rank, but ",
                      chunks.size(), " chunks were given");
  if (static_cast<int>(batches.size()) != shape.micro_batches || dropout_keys.size() != batches.size())
    fail<ConfigError>("run_schedule: the schedule runs micro_batches=", shape.micro_batches, ", but ", batches.size(),
                      " batches and ", dropout_keys.size(), " dropout keys were given");
  if (options.verify) raise_if(verify_schedule(shape).problem);
  if (!std::isfinite(loss_scale)) fail<ConfigError>("run_schedule: loss_scale=", loss_scale, " must be a finite number");

  const int rank = ctx.pp.rank(), last_stage = shape.stages() - 1;
  const std::vector<Action> actions = rank_actions(shape, rank);
  const std::vector<std::size_t> starts = step_starts(actions);
  std::vector<std::size_t> last_gradient_action(chunks.size(), actions.size());  // per chunk: its last B, Bi or W
  std::vector<bool> forward_seen(chunks.size(), false);                           // per chunk: its first F has run
  for (std::size_t i = 0; i < actions.size(); ++i)
    if (actions[i].op != Op::forward && actions[i].chunk >= 0 && actions[i].chunk < static_cast<int>(chunks.size()))
      last_gradient_action[static_cast<std::size_t>(actions[i].chunk)] = i;
  using Key = std::pair<int, int>;  // (micro-batch, chunk)
  struct Received {
    Boundary tensor;
    std::uint64_t mark = 0;  // with overlap_transfers: the compute stream joins this before reading it
  };
  std::map<Key, Saved> saved;
  std::map<Key, DeferredWeightGradients> deferred;
  std::map<std::tuple<bool, int, int>, Received> received;  // (gradient, micro-batch, chunk) -> tensor
  std::vector<Boundary> outgoing;                            // outputs of the last step, in action order
  // The transfers' communicator: the pipeline group, or its overlapped handle; tensors sent beside
  // the compute, kept with their batch's mark until the compute stream has joined it.
  const bool overlap = options.overlap_transfers;
  auto transfers = overlap ? overlapped_handle(ctx.pp) : ctx.pp;
  std::vector<std::pair<std::uint64_t, Boundary>> sending;
  auto join = [&](std::uint64_t mark) {
    join_overlapped(transfers, mark);
    std::erase_if(sending, [&](const auto& entry) { return entry.first <= mark; });
  };
  auto take_received = [&](bool gradient, const Action& a) -> Boundary {
    auto it = received.find({gradient, a.micro_batch, a.chunk});
    if (it == received.end())
      fail<Error>("run_schedule: rank ", rank, " has no ", gradient ? "gradient for the backward" : "input for F", " of micro-batch ",
                  a.micro_batch);
    if (overlap) join(it->second.mark);
    Boundary tensor = std::move(it->second.tensor);
    received.erase(it);
    return tensor;
  };

  PipelineStepResult<Space> result;
  result.loss_sum = Tensor<double, Space>::zeros(Shape{1});
  for (const Batch& b : batches) {  // this rank's tokens (its two chunks under context parallelism), as the loss sum
    const Tensor<float> mask = local_sequence(b.loss_mask, ctx.cp.size(), ctx.cp.rank(), "pipeline schedule");
    for (index_t i = 0; i < mask.numel(); ++i) result.tokens += mask[i];
  }

  auto in_flight = [&] {
    std::set<Key> keys;
    for (const auto& [k, s] : saved) keys.insert(k);
    for (const auto& [k, d] : deferred) keys.insert(k);
    return static_cast<int>(keys.size());
  };
  auto chunk_of = [&](const Action& a) -> Stage& {
    if (a.chunk < 0 || a.chunk >= static_cast<int>(chunks.size()) || chunks[static_cast<std::size_t>(a.chunk)] == nullptr)
      fail<ConfigError>("run_schedule: no model chunk ", a.chunk, " on pipeline rank ", rank);
    return *chunks[static_cast<std::size_t>(a.chunk)];
  };

  for (std::size_t step = 0; step <= starts.size(); ++step) {
    // The transfers between step - 1 and step: sends first, then receives, in one batch.
    const std::vector<Transfer> batch = transfer_batch(shape, rank, actions, starts, step);
    if (!batch.empty()) {
      std::size_t next_out = 0;
      std::vector<Boundary> incoming;
      auto group = batch_point_to_point(transfers);
      for (const Transfer& t : batch) {
        ++result.transfers;
        if (t.send) {
          if (next_out >= outgoing.size()) fail<Error>("run_schedule: rank ", rank, " has no output to send in step ", step);
          transfers.send(std::as_const(outgoing[next_out++].tensor).buffer(), t.peer);
        } else {
          const int receiving_stage = t.message.gradient ? t.message.from_stage - 1 : t.message.from_stage + 1;
          const Batch& b = batches[static_cast<std::size_t>(t.message.micro_batch)];
          Stage& chunk = *chunks[static_cast<std::size_t>(chunk_of_stage(shape.pp, receiving_stage))];
          incoming.emplace_back(Tensor<T, Space>::empty(chunk.boundary_shape(ctx, b.tokens.size(0), b.tokens.size(1))));
          transfers.recv(incoming.back().tensor.buffer(), t.peer);
        }
      }
      group.end();
      const std::uint64_t mark = overlap ? overlapped_mark(transfers) : 0;
      std::size_t next_in = 0;
      for (const Transfer& t : batch)
        if (!t.send) {
          const int receiving_stage = t.message.gradient ? t.message.from_stage - 1 : t.message.from_stage + 1;
          received[{t.message.gradient, t.message.micro_batch, chunk_of_stage(shape.pp, receiving_stage)}] =
              Received{std::move(incoming[next_in++]), mark};
        }
      // Sent: on the compute stream the allocator may reuse the memory at once (stream-ordered);
      // beside it, only once the compute stream has joined the batch.
      if (overlap)
        for (Boundary& out : outgoing) sending.emplace_back(mark, std::move(out));
    }
    outgoing.clear();
    if (step == starts.size()) break;

    const std::size_t end = step + 1 < starts.size() ? starts[step + 1] : actions.size();
    for (std::size_t i = starts[step]; i < end; ++i) {
      const Action& a = actions[i];
      Stage& chunk = chunk_of(a);
      const Key key{a.micro_batch, a.chunk};
      const int vs = virtual_stage(shape.pp, rank, a.chunk);
      const Batch& b = batches[static_cast<std::size_t>(a.micro_batch)];
      // The received input (F) or output gradient (B, Bi), joined before the action begins.
      Boundary input;
      const bool receives = a.op == Op::forward ? vs > 0 : a.op != Op::backward_weight && vs < last_stage;
      if (receives) input = take_received(a.op != Op::forward, a);
      if (options.on_action) options.on_action(a, true);
      if (a.op == Op::forward) {
        const bool first_forward = !forward_seen[static_cast<std::size_t>(a.chunk)];
        forward_seen[static_cast<std::size_t>(a.chunk)] = true;
        auto out = chunk.forward_stage(ctx, vs > 0 ? &input : nullptr, b.tokens, b.labels, b.loss_mask,
                                       dropout_keys[static_cast<std::size_t>(a.micro_batch)], loss_scale, options.classifier,
                                       first_forward ? needed : nullptr);
        saved[key] = std::move(out.saved);
        result.peak_in_flight = std::max(result.peak_in_flight, in_flight());  // only a forward adds to it
        if (vs == last_stage) ctx.device.template add<double>(result.loss_sum.data(), out.loss.sum.data(), 1, result.loss_sum.data());
        else outgoing.push_back(std::move(out.output));
      } else if (a.op == Op::backward || a.op == Op::backward_input) {
        Boundary& dy = input;
        auto it = saved.find(key);
        if (it == saved.end()) fail<Error>("run_schedule: rank ", rank, " runs a backward of micro-batch ", a.micro_batch, " it never ran forward");
        DeferredWeightGradients* list = a.op == Op::backward_input ? &deferred[key] : nullptr;
        const bool final_backward = list == nullptr && last_gradient_action[static_cast<std::size_t>(a.chunk)] == i;
        Boundary dx = chunk.backward_stage(ctx, it->second, vs < last_stage ? &dy : nullptr, loss_scale, list,
                                           final_backward ? ready : nullptr);
        saved.erase(it);  // the activations are freed once the input gradient is taken
        if (vs > 0) outgoing.push_back(std::move(dx));
      } else {
        auto it = deferred.find(key);
        if (it == deferred.end()) fail<Error>("run_schedule: rank ", rank, " runs W of micro-batch ", a.micro_batch, " before its Bi");
        it->second.run();
        deferred.erase(it);
        if (ready != nullptr && last_gradient_action[static_cast<std::size_t>(a.chunk)] == i) {
          Parameter<T, Space>* tied_copy = chunk.tied_embedding_copy();
          chunk.for_each_parameter([&](Parameter<T, Space>& p) {
            if (&p != tied_copy) (*ready)(p);
          });
        }
      }
      if (options.on_action) options.on_action(a, false);
    }
  }
  if (overlap) {  // the last sends and any batch not yet joined
    join_overlapped(transfers);
    sending.clear();
  }
  if (!saved.empty() || !deferred.empty() || !received.empty())
    fail<Error>("run_schedule: rank ", rank, " ends the step holding ", saved.size(), " saved forwards, ", deferred.size(),
                " deferred weight gradients and ", received.size(), " unused received tensors");
  if (shape.pp > 1) ctx.pp.broadcast(result.loss_sum.buffer(), rank_of_stage(shape.pp, last_stage));
  return result;
}

}  // namespace pipeline
STRATA_NAMESPACE_END
