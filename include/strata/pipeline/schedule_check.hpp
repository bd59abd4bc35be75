// strata/pipeline/schedule_check.hpp: the proof a schedule table must pass before it runs, as a
// constexpr function (so `static_assert(verify_schedule(shape).ok())` proves it at compile time,
// and the executor checks the same at run time), and `ProvenSchedule<Kind, pp, m, v>`, which
// refuses an impossible configuration with a sentence at compile time.
//
// verify_schedule(shape) checks, in order:
//   1. order: on every rank each (micro-batch, chunk) has exactly one forward and one backward (or
//      one backward_input and one backward_weight when the backward is split), each backward after
//      its own forward, each backward_weight after its backward_input;
//   2. matching: on every channel (sender, receiver), the k-th send and the k-th receive name the
//      same message (transfers match in order, as NCCL and the in-process communicator match them);
//   3. progress: a simulation of unbuffered blocking send/recv (a send completes only when its
//      receive is posted), with each rank posting its transfer batches (schedule.hpp) in order,
//      finishes on every rank: no deadlock;
//   4. memory: the peak of micro-batch chunks in flight on each rank equals claimed_peak_in_flight.
// The report also times the schedule with forward = 1 unit per chunk, fused backward = 2,
// backward_input = backward_weight = 1, as data flow (each action starts when its rank is free and
// its input has arrived; transfers are free and never hold the sender, as with asynchronous
// sends): `bubble_fraction()` is the idle share of the step, (makespan - work) / makespan, the same
// on every rank because every rank works 3 m v units. 1F1B gives (pp - 1) / (m + pp - 1).
#pragma once

#include <array>
#include <vector>

#include "schedule.hpp"

STRATA_NAMESPACE_BEGIN
namespace pipeline {

// Unit costs of the timing model.
constexpr int action_cost(Op op) {
  switch (op) {
    case Op::forward: return 1;
    case Op::backward: return 2;
    case Op::backward_input: return 1;
    case Op::backward_weight: return 1;
  }
  return 0;
}

struct ScheduleReport {
  Problem problem;  // empty when every check passed
  ScheduleShape shape{};
  long makespan = 0;  // time units until the last rank finishes (timing model below)
  long work = 0;      // busy time units per rank (the same on every rank)
  std::array<int, kMaxPipelineSize> peak_in_flight{};

  constexpr bool ok() const { return problem.ok(); }
  constexpr double bubble_fraction() const { return makespan == 0 ? 0.0 : double(makespan - work) / double(makespan); }
};

namespace detail {

constexpr Problem order_problem(const ScheduleShape& s, int rank, const std::vector<Action>& actions) {
  const int m = s.micro_batches, v = s.virtual_stages;
  // position + 1 of each op per (micro-batch, chunk); 0 = not seen
  std::vector<int> forward(static_cast<std::size_t>(m * v), 0), backward(forward), input(forward), weight(forward);
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.micro_batch < 0 || a.micro_batch >= m || a.chunk < 0 || a.chunk >= v)
      return Problem::sentence("rank ", rank, " action #", i, " names micro-batch ", a.micro_batch, " of chunk ", a.chunk,
                               ", outside the ", m, " micro-batches and ", v, " chunks.");
    const auto slot = static_cast<std::size_t>(a.micro_batch * v + a.chunk);
    const bool split_op = a.op == Op::backward_input || a.op == Op::backward_weight;
    if (a.op != Op::forward && split_op != s.split_backward())
      return Problem::sentence("rank ", rank, " action #", i, " (", op_name(a.op), " of micro-batch ", a.micro_batch,
                               ") mixes a ", s.split_backward() ? "fused" : "split", " backward into a schedule whose backward is ",
                               s.split_backward() ? "split." : "fused.");
    std::vector<int>& seen = a.op == Op::forward ? forward : a.op == Op::backward ? backward : a.op == Op::backward_input ? input : weight;
    if (seen[slot] != 0)
      return Problem::sentence("rank ", rank, " runs ", op_name(a.op), " of micro-batch ", a.micro_batch, " chunk ", a.chunk,
                               " twice (actions #", seen[slot] - 1, " and #", i, ").");
    seen[slot] = static_cast<int>(i) + 1;
    if (a.op != Op::forward && forward[slot] == 0)
      return Problem::sentence("rank ", rank, " action #", i, " runs ", op_name(a.op), " of micro-batch ", a.micro_batch,
                               " chunk ", a.chunk, " before its forward.");
    if (a.op == Op::backward_weight && input[slot] == 0)
      return Problem::sentence("rank ", rank, " action #", i, " runs W of micro-batch ", a.micro_batch, " chunk ", a.chunk,
                               " before its backward_input.");
  }
  for (std::size_t slot = 0; slot < forward.size(); ++slot) {
    const int mb = static_cast<int>(slot) / v, chunk = static_cast<int>(slot) % v;
    const bool done = forward[slot] != 0 && (s.split_backward() ? input[slot] != 0 && weight[slot] != 0 : backward[slot] != 0);
    if (!done)
      return Problem::sentence("rank ", rank, " never completes micro-batch ", mb, " of chunk ", chunk,
                               forward[slot] == 0 ? " (no forward)." : " (its backward is missing).");
  }
  return {};
}

// All transfers of `rank` on the channel to or from `peer`, in order, as sends (or receives).
constexpr std::vector<Message> channel(const ScheduleShape& s, int rank, const std::vector<Action>& actions, int peer, bool sends) {
  std::vector<Message> out;
  const auto starts = step_starts(actions);
  for (std::size_t j = 0; j <= starts.size(); ++j)
    for (const Transfer& t : transfer_batch(s, rank, actions, starts, j))
      if (t.send == sends && t.peer == peer) out.push_back(t.message);
  return out;
}

constexpr Problem matching_problem(const ScheduleShape& s, const std::vector<std::vector<Action>>& table) {
  for (int from = 0; from < s.pp; ++from)
    for (int to = 0; to < s.pp; ++to) {
      const auto sent = channel(s, from, table[static_cast<std::size_t>(from)], to, true);
      const auto received = channel(s, to, table[static_cast<std::size_t>(to)], from, false);
      const std::size_t n = std::max(sent.size(), received.size());
      for (std::size_t k = 0; k < n; ++k) {
        if (k >= sent.size() || k >= received.size())
          return Problem::sentence("rank ", from, " sends ", sent.size(), " messages to rank ", to, ", which receives ",
                                   received.size(), " from it.");
        if (!(sent[k] == received[k]))
          return Problem::sentence("send #", k, " from rank ", from, " to rank ", to, " carries the ",
                                   sent[k].gradient ? "gradient" : "activation", " of micro-batch ", sent[k].micro_batch,
                                   " from stage ", sent[k].from_stage, ", but rank ", to, " expects the ",
                                   received[k].gradient ? "gradient" : "activation", " of micro-batch ",
                                   received[k].micro_batch, " from stage ", received[k].from_stage, ".");
      }
    }
  return {};
}

struct PostedTransfer {
  Transfer transfer{};
  int sequence = 0;  // index on its channel
  bool done = false;
};

// The timing model: each action starts when its rank is free and its input has arrived (sent the
// moment the producing action ends; transfers take no time and never hold the sender), and takes
// action_cost units. Returns when the last rank finishes. Called once the blocking simulation has
// shown that every action runs.
constexpr long dataflow_makespan(const ScheduleShape& s, const std::vector<std::vector<Action>>& table) {
  const auto pp = static_cast<std::size_t>(s.pp);
  // finish time of each action's output message, by (gradient, micro-batch, from_stage); -1: not yet
  const auto slots = static_cast<std::size_t>(2 * s.micro_batches * s.stages());
  std::vector<long> produced(slots, -1);
  auto slot = [&](const Message& m) {
    return static_cast<std::size_t>(((m.gradient ? 1 : 0) * s.micro_batches + m.micro_batch) * s.stages() + m.from_stage);
  };
  std::vector<std::size_t> next(pp, 0);
  std::vector<long> free_at(pp, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t r = 0; r < pp; ++r) {
      while (next[r] < table[r].size()) {
        const Action& a = table[r][next[r]];
        Transfer in{};
        long start = free_at[r];
        if (input_transfer(a, s.pp, s.virtual_stages, static_cast<int>(r), in)) {
          const long arrival = produced[slot(in.message)];
          if (arrival < 0) break;
          start = std::max(start, arrival);
        }
        free_at[r] = start + action_cost(a.op);
        Transfer out{};
        if (output_transfer(a, s.pp, s.virtual_stages, static_cast<int>(r), out)) produced[slot(out.message)] = free_at[r];
        ++next[r];
        progress = true;
      }
    }
  }
  long makespan = 0;
  for (long t : free_at) makespan = std::max(makespan, t);
  return makespan;
}

}  // namespace detail

// Checks 1 to 3 on any table of `s.pp` ranks (a generated one, or one written by hand), and
// measures the peak in flight and the timing; the report's problem names the first failure.
constexpr ScheduleReport verify_table(const ScheduleShape& s, const std::vector<std::vector<Action>>& table) {
  ScheduleReport report;
  report.shape = s;
  report.problem = schedule_problem(s);
  if (!report.ok()) return report;
  const auto pp_size = static_cast<std::size_t>(s.pp);
  if (table.size() != pp_size) {
    report.problem = Problem::sentence("the table has ", table.size(), " ranks but pp=", s.pp, ".");
    return report;
  }
  for (int r = 0; r < s.pp; ++r) {
    report.problem = detail::order_problem(s, r, table[static_cast<std::size_t>(r)]);
    if (!report.ok()) return report;
  }
  report.problem = detail::matching_problem(s, table);
  if (!report.ok()) return report;

  // The batches of every rank with the channel sequence number of each transfer.
  std::vector<std::vector<std::vector<detail::PostedTransfer>>> batches(pp_size);
  std::vector<std::vector<std::size_t>> starts(pp_size);
  for (std::size_t r = 0; r < pp_size; ++r) {
    std::vector<int> sends(pp_size, 0), receives(pp_size, 0);
    const auto& actions = table[r];
    starts[r] = step_starts(actions);
    for (std::size_t j = 0; j <= starts[r].size(); ++j) {
      std::vector<detail::PostedTransfer> batch;
      for (const Transfer& t : transfer_batch(s, static_cast<int>(r), actions, starts[r], j)) {
        int& counter = t.send ? sends[static_cast<std::size_t>(t.peer)] : receives[static_cast<std::size_t>(t.peer)];
        batch.push_back({t, counter++, false});
      }
      batches[r].push_back(batch);
    }
  }

  // Blocking simulation: position[r] is the batch rank r has posted (steps + 1: finished).
  std::vector<std::size_t> position(pp_size, 0);
  std::vector<int> in_flight(pp_size, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t r = 0; r < pp_size; ++r) {
      const auto& actions = table[r];
      const std::size_t steps = starts[r].size();
      if (position[r] > steps) continue;
      auto& batch = batches[r][position[r]];
      for (auto& mine : batch) {
        if (mine.done) continue;
        const auto p = static_cast<std::size_t>(mine.transfer.peer);
        if (position[p] > starts[p].size()) continue;
        for (auto& theirs : batches[p][position[p]]) {
          if (theirs.done || theirs.transfer.send == mine.transfer.send || theirs.transfer.peer != static_cast<int>(r) ||
              theirs.sequence != mine.sequence)
            continue;
          mine.done = theirs.done = true;
          progress = true;
          break;
        }
      }
      bool complete = true;
      for (const auto& mine : batch) complete = complete && mine.done;
      if (!complete) continue;
      progress = true;
      if (position[r] < steps) {
        const std::size_t end = position[r] + 1 < steps ? starts[r][position[r] + 1] : actions.size();
        for (std::size_t i = starts[r][position[r]]; i < end; ++i) {
          if (actions[i].op == Op::forward) ++in_flight[r];
          if (actions[i].op == Op::backward || actions[i].op == Op::backward_weight) --in_flight[r];
          report.peak_in_flight[r] = std::max(report.peak_in_flight[r], in_flight[r]);
        }
      }
      ++position[r];
    }
  }
  for (std::size_t r = 0; r < pp_size; ++r) {
    if (position[r] <= starts[r].size()) {
      const std::size_t j = position[r];
      for (const auto& mine : batches[r][j])
        if (!mine.done) {
          report.problem = Problem::sentence(
              "deadlock: rank ", r, " waits to ", mine.transfer.send ? "send the " : "receive the ",
              mine.transfer.message.gradient ? "gradient" : "activation", " of micro-batch ", mine.transfer.message.micro_batch,
              mine.transfer.send ? " to rank " : " from rank ", mine.transfer.peer, " in its transfer batch #", j, " of ",
              starts[r].size() + 1, ", and that rank never posts the matching transfer.");
          return report;
        }
    }
  }
  for (const Action& a : table[0]) report.work += action_cost(a.op);
  report.makespan = detail::dataflow_makespan(s, table);
  return report;
}

// Every check, with check 4 (the documented peak in flight) on the generated table of `s`.
constexpr ScheduleReport verify_schedule(const ScheduleShape& s) {
  if (!schedule_problem(s).ok()) return verify_table(s, {});
  ScheduleReport report = verify_table(s, schedule_table(s));
  if (!report.ok()) return report;

  for (int r = 0; r < s.pp; ++r)
    if (report.peak_in_flight[static_cast<std::size_t>(r)] != claimed_peak_in_flight(s, r)) {
      report.problem = Problem::sentence("rank ", r, " of the ", schedule_name(s.kind), " schedule (pp=", s.pp, ", micro_batches=",
                                         s.micro_batches, ", virtual_stages=", s.virtual_stages, ") holds ",
                                         report.peak_in_flight[static_cast<std::size_t>(r)],
                                         " micro-batch chunks in flight at its peak, but the documented claim is ",
                                         claimed_peak_in_flight(s, r), ".");
      return report;
    }
  return report;
}

// A schedule proved at compile time: an impossible configuration stops the build with a sentence,
// and a table that fails a check (order, matching, deadlock, memory claim) does too.
template <ScheduleKind Kind, int PP, int MicroBatches, int VirtualStages = 1>
struct ProvenSchedule {
  static_assert(PP >= 1, "A pipeline needs at least one stage: pp must be at least 1.");
  static_assert(PP <= kMaxPipelineSize, "The schedule checks track at most kMaxPipelineSize (64) pipeline ranks: use a smaller pp.");
  static_assert(MicroBatches >= 1, "A pipeline schedule needs at least one micro-batch: give micro_batches >= 1.");
  static_assert(VirtualStages >= 1, "Every rank holds at least one model chunk: virtual stages must be at least 1.");
  static_assert(Kind == ScheduleKind::interleaved || VirtualStages == 1,
                "Only the interleaved schedule runs several model chunks per rank: use ScheduleKind::interleaved for "
                "virtual stages > 1, or one virtual stage.");
  static_assert(!(Kind == ScheduleKind::interleaved && VirtualStages > 1 && MicroBatches % (PP < 1 ? 1 : PP) != 0),
                "The interleaved schedule with virtual stages needs the number of micro-batches to be a multiple of pp "
                "(Megatron's constraint): choose a multiple of pp.");

  static constexpr ScheduleShape shape{Kind, PP, MicroBatches, VirtualStages};
  static constexpr ScheduleReport report = verify_schedule(shape);
  static_assert(!schedule_problem(shape).ok() || report.ok(), "The schedule table fails its proof (order, send/recv matching, deadlock freedom or the "
                             "in-flight claim); verify_schedule(shape).problem says which.");
};

}  // namespace pipeline
STRATA_NAMESPACE_END
