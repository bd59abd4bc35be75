// examples/trainer/pipeline_timing.hpp: the measured bubble of a pipeline rank. The executor calls
// its observer (pipeline::ExecutorOptions::on_action) right before and after each F / B / Bi / W;
// PipelineTimer marks those moments and the start and end of the step's schedule, and sums
//
//   busy = sum over actions of (end - begin)      step = end of the schedule - its start
//   measured bubble = 1 - busy / step             (the transfers and the waits for them are idle)
//
// The step is the schedule alone (model.train_step: the executor and the tied-embedding gradient
// exchange), not the optimizer or the data-parallel reduction, so the bubble compares with the
// table's own (verify_schedule(shape).bubble_fraction(), the unit-cost model of schedule_check.hpp).
//
// Clocks: on the CPU the backend computes on the calling thread, so std::chrono::steady_clock
// around the actions times them. On CUDA (STRATA_TRAINER_CUDA) the host only enqueues: a pool of
// cudaEvents, created once (two per action and two for the step), is recorded on the backend's
// compute stream, where the transfers are ordered too; the elapsed times of a step are read when
// the next step begins (or at finish()), with one cudaEventSynchronize on the step's last event,
// so nothing waits for the device inside a step and the host stays a step ahead at most.
// The first step measured is the warm-up (allocations, plans, lazy loading) and is left out of
// the means unless it is the only one.
#pragma once

#include <chrono>
#include <cstddef>
#include <type_traits>
#include <vector>

#include <strata/core.hpp>

#ifdef STRATA_TRAINER_CUDA
#include <cuda_runtime_api.h>

#include <strata/backend/cuda/backend.cuh>
#endif

namespace trainer {

// The sums of the steps a PipelineTimer read.
struct PipelineTimes {
  double busy_seconds = 0;  // sum over steps of the actions' time
  double step_seconds = 0;  // sum over steps of the schedule's time
  int steps = 0;
  bool first_only = false;  // the sums are of the first (warm-up) step, the only one measured

  double mean_busy() const { return steps == 0 ? 0.0 : busy_seconds / steps; }
  double mean_step() const { return steps == 0 ? 0.0 : step_seconds / steps; }
  double bubble() const { return step_seconds <= 0 ? 0.0 : 1.0 - busy_seconds / step_seconds; }
};

// Marks on the host clock (the CPU backend: the work is done when the call returns).
class HostMarks {
 public:
  explicit HostMarks(std::size_t count) : marks_(count) {}
  void record(std::size_t i) { marks_[i] = std::chrono::steady_clock::now(); }
  void wait(std::size_t) {}
  double seconds(std::size_t from, std::size_t to) const { return std::chrono::duration<double>(marks_[to] - marks_[from]).count(); }

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

#ifdef STRATA_TRAINER_CUDA
// Marks as cudaEvents recorded on a stream (the CUDA backend's compute stream).
class CudaEventMarks {
 public:
  CudaEventMarks(std::size_t count, cudaStream_t stream) : events_(count, nullptr), stream_(stream) {
    for (cudaEvent_t& e : events_) STRATA_CUDA_CHECK(cudaEventCreate(&e));
  }
  CudaEventMarks(const CudaEventMarks&) = delete;
  CudaEventMarks& operator=(const CudaEventMarks&) = delete;
  ~CudaEventMarks() {
    for (cudaEvent_t e : events_)
      if (e != nullptr) (void)cudaEventDestroy(e);
  }
  void record(std::size_t i) { STRATA_CUDA_CHECK(cudaEventRecord(events_[i], stream_)); }
  void wait(std::size_t i) { STRATA_CUDA_CHECK(cudaEventSynchronize(events_[i])); }
  double seconds(std::size_t from, std::size_t to) const {
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[from], events_[to]));
    return 1e-3 * static_cast<double>(ms);
  }

 private:
  std::vector<cudaEvent_t> events_;
  cudaStream_t stream_;
};
#endif

// The marks of a device: events on the CUDA backend's stream, the host clock otherwise.
template <class Device>
auto make_marks(const Device& device, std::size_t count) {
#ifdef STRATA_TRAINER_CUDA
  if constexpr (std::is_same_v<Device, strata::cuda::backend>) return CudaEventMarks(count, device.stream());
  else
#endif
  {
    (void)device;
    return HostMarks(count);
  }
}

// Times the actions of one pipeline rank, step after step. `actions` is the rank's table length
// (pipeline::rank_actions(shape, rank).size()): the pool holds 2 actions + 2 marks.
template <class Device>
class PipelineTimer {
 public:
  PipelineTimer(const Device& device, std::size_t actions) : marks_(make_marks(device, 2 * actions + 2)), count_(2 * actions + 2) {}

  // Before the schedule: reads the previous step (if any), then marks the start.
  void begin_step() {
    collect();
    next_ = 0;
    marks_.record(next_++);
  }
  // The executor's observer: begin and end of an action, alternating.
  void on_action(bool begin) {
    if (begin != (next_ % 2 == 1))
      strata::fail<strata::Error>("PipelineTimer: an action ", begin ? "began" : "ended", " at mark ", next_, " where an ",
                                  begin ? "end" : "begin", " was due; the executor's observer calls must alternate begin, end");
    if (next_ + 1 >= count_)
      strata::fail<strata::Error>("PipelineTimer: more than ", (count_ - 2) / 2, " actions in one step; build the timer with the "
                                  "length of this rank's schedule table");
    marks_.record(next_++);
  }
  // After the schedule: marks its end; the times are read at the next begin_step or finish.
  void end_step() {
    marks_.record(next_++);
    pending_ = true;
  }
  // Reads the last step (waiting for it on a device) and returns the sums of the steps after the
  // first, or of the first alone when it is the only one.
  PipelineTimes finish() {
    collect();
    if (after_first_.steps > 0) return after_first_;
    PipelineTimes only = first_;
    only.first_only = true;
    return only;
  }

 private:
  void collect() {
    if (!pending_) return;
    pending_ = false;
    const std::size_t last = next_ - 1;  // marks: start, (begin, end) per action, end
    marks_.wait(last);
    PipelineTimes& into = first_.steps == 0 ? first_ : after_first_;
    for (std::size_t i = 1; i + 1 < last; i += 2) into.busy_seconds += marks_.seconds(i, i + 1);
    into.step_seconds += marks_.seconds(0, last);
    ++into.steps;
  }

  decltype(make_marks(std::declval<const Device&>(), 0)) marks_;
  std::size_t count_ = 0, next_ = 0;
  bool pending_ = false;
  PipelineTimes first_, after_first_;
};

}  // namespace trainer
