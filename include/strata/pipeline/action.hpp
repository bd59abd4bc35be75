// strata/pipeline/action.hpp: the vocabulary of a pipeline schedule: one `Action` is an operation
// (forward, fused backward, or the two halves of a split backward) of one micro-batch on one model
// chunk of a rank, and each action implies the point-to-point `Transfer`s around it.
//
// Virtual stages: with v model chunks per rank (interleaved schedules) the model is cut into
// S = pp * v pieces; piece vs = chunk * pp + rank (Megatron's placement), so chunk c of rank r feeds
// chunk c of rank r + 1, and the last rank's chunk c feeds chunk c + 1 of rank 0. With v = 1 the
// virtual stage is the rank.
//
//   forward  (mb, chunk) on vs: receives the activation of mb from vs - 1 (unless vs = 0),
//                               sends its output to vs + 1 (unless vs = S - 1)
//   backward / backward_input:  receives the gradient of mb from vs + 1 (unless vs = S - 1),
//                               sends the input gradient to vs - 1 (unless vs = 0)
//   backward_weight:            no transfer (the weight gradients of a split backward)
//
// A message is named by what it carries (activation or gradient), its micro-batch and the virtual
// stage that sent it; the schedule checks (schedule_check.hpp) match sends and receives by name.
#pragma once

#include <cstdint>
#include <string_view>

#include "../core/shape.hpp"

STRATA_NAMESPACE_BEGIN
namespace pipeline {

enum class Op : std::uint8_t {
  forward,          // F: the chunk's forward; saves what its backward needs
  backward,         // B: the fused backward (input and weight gradients at once)
  backward_input,   // the first half of a split backward: the input gradient only
  backward_weight,  // W: the second half: the weight gradients the first half deferred
};

constexpr std::string_view op_name(Op op) {
  switch (op) {
    case Op::forward: return "F";
    case Op::backward: return "B";
    case Op::backward_input: return "Bi";
    case Op::backward_weight: return "W";
  }
  return "?";
}

struct Action {
  Op op = Op::forward;
  int micro_batch = 0;
  int chunk = 0;
  // Runs in the same step as the previous action: no transfer batch between the two (the
  // interleaved schedule's steady forward-backward pairs, whose inputs are received together).
  bool joined = false;
  friend constexpr bool operator==(const Action&, const Action&) = default;
};

// What crosses a stage boundary, named by content.
struct Message {
  bool gradient = false;  // false: an activation going forward; true: a gradient going back
  int micro_batch = 0;
  int from_stage = 0;  // the virtual stage that sends it
  friend constexpr bool operator==(const Message&, const Message&) = default;
};

// One side of a point-to-point exchange on the pipeline group.
struct Transfer {
  bool send = false;  // false: receive
  int peer = 0;       // rank in the pipeline group
  Message message{};
};

constexpr int virtual_stage(int pp, int rank, int chunk) { return chunk * pp + rank; }
constexpr int rank_of_stage(int pp, int stage) { return stage % pp; }
constexpr int chunk_of_stage(int pp, int stage) { return stage / pp; }

// The transfer an action waits for before it runs (false when it needs none).
constexpr bool input_transfer(const Action& a, int pp, int virtual_stages, int rank, Transfer& out) {
  const int vs = virtual_stage(pp, rank, a.chunk), last = pp * virtual_stages - 1;
  if (a.op == Op::forward && vs > 0) {
    out = {false, rank_of_stage(pp, vs - 1), {false, a.micro_batch, vs - 1}};
    return true;
  }
  if ((a.op == Op::backward || a.op == Op::backward_input) && vs < last) {
    out = {false, rank_of_stage(pp, vs + 1), {true, a.micro_batch, vs + 1}};
    return true;
  }
  return false;
}

// The transfer an action produces after it runs (false when it produces none).
constexpr bool output_transfer(const Action& a, int pp, int virtual_stages, int rank, Transfer& out) {
  const int vs = virtual_stage(pp, rank, a.chunk), last = pp * virtual_stages - 1;
  if (a.op == Op::forward && vs < last) {
    out = {true, rank_of_stage(pp, vs + 1), {false, a.micro_batch, vs}};
    return true;
  }
  if ((a.op == Op::backward || a.op == Op::backward_input) && vs > 0) {
    out = {true, rank_of_stage(pp, vs - 1), {true, a.micro_batch, vs}};
    return true;
  }
  return false;
}

}  // namespace pipeline
STRATA_NAMESPACE_END
