// The executor's transfers beside the compute (ExecutorOptions::overlap_transfers), checked on CPU
// threads over a communicator whose overlapped operations happen only when the compute side joins
// them, as on a communication stream that has not run yet: an overlapped recv fills its buffer
// with NaN when issued and receives at the join; an overlapped send goes out at the join, reading
// its buffer then. So an executor that read a received tensor before joining its batch, or let a
// sent tensor go before the join, would train on NaN. With overlap the loss and every gradient are
// bit for bit those of the transfers on the compute stream, under every schedule, GPT and Llama.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "pipeline_equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_pipeline_overlap_cases {

namespace {

using namespace strata;
using namespace strata_test;

// The in-process communicator with a deferring overlapped() handle (see the top).
struct DeferringComm : inprocess::communicator {
  struct Queue {
    std::vector<std::function<void()>> operations;  // issued on the overlapped handle, in order
    std::size_t done = 0;                           // operations run so far
    std::vector<std::size_t> marks;                 // per mark: the operations issued before it
    int joins = 0;                                  // join_overlapped(mark) calls
  };
  std::shared_ptr<Queue> queue = std::make_shared<Queue>();
  bool deferred = false;

  explicit DeferringComm(const inprocess::communicator& c) : inprocess::communicator(c) {}
  DeferringComm split(int color, int key, std::string name) {
    return DeferringComm(inprocess::communicator::split(color, key, std::move(name)));
  }
  DeferringComm split(int color, int key) { return DeferringComm(inprocess::communicator::split(color, key)); }
  DeferringComm overlapped() const {
    DeferringComm c = *this;
    c.deferred = true;
    return c;
  }
  template <class T>
  void send(std::span<T> buffer, int peer) {
    inprocess::communicator base = *this;
    if (!deferred) return base.send(buffer, peer);
    queue->operations.push_back([base, buffer, peer]() mutable { base.send(buffer, peer); });
  }
  template <class T>
  void recv(std::span<T> buffer, int peer) {
    inprocess::communicator base = *this;
    if (!deferred) return base.recv(buffer, peer);
    std::fill(buffer.begin(), buffer.end(), T(std::numeric_limits<float>::quiet_NaN()));
    queue->operations.push_back([base, buffer, peer]() mutable { base.recv(buffer, peer); });
  }
  std::uint64_t overlapped_mark() {
    queue->marks.push_back(queue->operations.size());
    return queue->marks.size() - 1;
  }
  void join_overlapped(std::uint64_t mark) {
    ++queue->joins;
    run_until(queue->marks.at(static_cast<std::size_t>(mark)));
  }
  void join_overlapped() { run_until(queue->operations.size()); }

 private:
  void run_until(std::size_t n) {
    while (queue->done < n) queue->operations[queue->done++]();
  }
};

template <class T, bool SP>
struct DeferringPolicy : TestPolicy<T, SP> {
  using comm = DeferringComm;
};

struct OverlapRun {
  Snapshot snapshot;
  int deferred_operations = 0;  // summed over ranks
  int joins = 0;
};

template <template <class> class Model>
OverlapRun run(const models::ModelConfig& config, const PipelineRun& shape, bool overlap) {
  using P = DeferringPolicy<double, false>;
  OverlapRun out;
  std::mutex mutex;
  inprocess::run(shape.tp * shape.pp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<DeferringComm>::create(DeferringComm(world), ParallelConfig{.tp = shape.tp, .pp = shape.pp});
    models::PipelineModel<Model, P> model(ctx, config, {shape.virtual_stages, -1, -1});
    model.init(ctx, 1234);
    const auto batches = as_pipeline_batches(micro_batches(config, shape.micro_batches));
    const auto keys = dropout_keys(shape.micro_batches);
    pipeline::ExecutorOptions options;
    options.overlap_transfers = overlap;
    zero_gradients(ctx.device, model);
    auto result = model.train_step(ctx, shape.kind, std::span<const PipelineBatch>(batches), std::span<const std::uint64_t>(keys),
                                   1.0 / token_count(micro_batches(config, shape.micro_batches)), options);
    const double loss = result.loss_sum_on_host();
    gather_pipeline_parameters(ctx, model, out.snapshot, mutex);
    std::lock_guard lock(mutex);
    if (world.rank() == 0) out.snapshot.outputs.push_back({loss});
    out.deferred_operations += static_cast<int>(ctx.pp.queue->operations.size());
    out.joins += ctx.pp.queue->joins;
    EXPECT_EQ(ctx.pp.queue->done, ctx.pp.queue->operations.size()) << "every deferred transfer ran by the end of the step";
  });
  return out;
}

template <template <class> class Model>
void expect_overlap_changes_nothing(const models::ModelConfig& config, int tp) {
  using pipeline::ScheduleKind;
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zero_bubble})
    for (int pp : {2, 4}) {
      const int m = 2 * pp;
      const PipelineRun shape{kind, tp, pp, kind == ScheduleKind::interleaved ? 2 : 1, m};
      const OverlapRun plain = run<Model>(config, shape, false);
      const OverlapRun overlapped = run<Model>(config, shape, true);
      EXPECT_EQ(plain.deferred_operations, 0) << shape.str();
      EXPECT_GT(overlapped.deferred_operations, 0) << shape.str();
      EXPECT_GT(overlapped.joins, 0) << shape.str();
      ASSERT_EQ(overlapped.snapshot.outputs, plain.snapshot.outputs) << shape.str() << ": the loss";
      ASSERT_FALSE(plain.snapshot.grads.empty());
      EXPECT_EQ(overlapped.snapshot.grads, plain.snapshot.grads) << shape.str() << ": the gradients";
    }
}

TEST(PipelineOverlap, TransfersBesideTheComputeTrainTheSameBitsGpt) { expect_overlap_changes_nothing<models::Gpt>(tiny_gpt(8), 1); }

TEST(PipelineOverlap, TransfersBesideTheComputeTrainTheSameBitsLlamaTp2) {
  expect_overlap_changes_nothing<models::Llama>(tiny_llama(), 2);
}

}  // namespace
}  // namespace test_pipeline_overlap_cases
