// strata/comm/nccl/watchdog.hpp: the state behind a rank's NCCL communicators and the watchdog
// thread that turns a hang into an error.
//
// Every NCCL communicator of a rank (its world and every group split from it) shares one
// `RankState`: the device, the compute stream all operations are enqueued on, the timeout, one
// recursive mutex that serializes the rank's NCCL calls against the watchdog, and the rank's
// first failure. Each group (`Group`) owns its ncclComm_t and a queue of the operations it has
// enqueued that the GPU has not finished yet, each with a CUDA event recorded after it.
//
// The watchdog is one thread per process. Every few tens of milliseconds it visits each live
// rank and, for each of its groups:
//   - asks ncclCommGetAsyncError: an error there (a peer died, a network failure) fails the rank;
//   - pops the operations whose events have completed; when the oldest one has been waiting
//     longer than the timeout (counted from when it was enqueued or, if later, from when the
//     operation before it finished), it fails the rank naming that operation.
// Failing a rank records the message and calls ncclCommAbort on every communicator of the rank,
// so the NCCL kernels still waiting on the stream return and nothing hangs. The message reaches
// the caller from the rank's next call of any operation, `check()` or `synchronize()` on any of
// its communicators (a CommError; AbortedError when the failure started on another rank). The
// watchdog never throws and only uses try_lock: a rank busy in a call is visited next round.
//
// Lifetimes. When one process drives several GPUs (nccl::run), freeing device memory on one GPU
// (cudaFree, and the frees inside ncclCommDestroy) can wait for a kernel on a peer GPU, and that
// kernel may be a collective waiting for this very thread: a deadlock. So a rank's device memory
// is allocated once (the barrier word, in RankState) and, in that mode (`defer_destroy`), a group
// that goes away is only retired: its communicator is finalized and destroyed with the RankState,
// after the launcher has seen every rank finish. One process per GPU destroys at once.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../communicator.hpp"
#include "types.hpp"

STRATA_NAMESPACE_BEGIN
namespace nccl::detail {

using clock = std::chrono::steady_clock;

struct Group;

// Raised by the thread launcher when a rank failed: the others stop waiting. `reason` is written
// once, before `raised` is set. It also carries the launcher's host barrier (communicator::
// local_barrier): `parties` threads, `arrived` of them waiting in generation `generation`.
struct StopSignal {
  std::atomic<bool> raised{false};
  std::string reason;  // "rank 0 failed: <its exception>"
  int parties = 1;
  std::mutex barrier_mutex;
  std::condition_variable barrier_cv;
  int arrived = 0;
  std::uint64_t generation = 0;
};

// An operation enqueued on the stream whose completion the watchdog has not seen yet.
struct Pending {
  cudaEvent_t event = nullptr;
  std::string operation;  // "all_reduce<float32>(1024 elements, sum)"
  clock::time_point since;
};

struct RankState {
  RankState(int device_ordinal, cudaStream_t compute_stream, bool owns, std::chrono::duration<double> wait_timeout,
            int world_rank_, int world_size_)
      : device(device_ordinal),
        stream(compute_stream),
        owns_stream(owns),
        timeout(wait_timeout),
        world_rank(world_rank_),
        world_size(world_size_) {}
  RankState(const RankState&) = delete;
  RankState& operator=(const RankState&) = delete;
  inline ~RankState();

  const int device;
  const cudaStream_t stream;
  const bool owns_stream;
  const std::chrono::duration<double> timeout;
  const int world_rank;
  const int world_size;
  // Set by the thread launcher: another rank of the process failed, stop waiting.
  StopSignal* stop = nullptr;

  std::recursive_mutex mutex;
  std::atomic<bool> failed{false};
  // Guarded by mutex.
  std::string failure;
  bool aborted_by_peer = false;
  std::vector<std::weak_ptr<Group>> groups;
  std::vector<ncclComm_t> retired;  // communicators of groups gone, destroyed with the RankState
  std::vector<void*> retired_memory;  // ncclMemAlloc'd windows of groups gone, freed after `retired`
  // One int on the device that barrier() all-reduces (every group of the rank shares the stream).
  std::int32_t* barrier_word = nullptr;
  // Several ranks share the process (nccl::run): communicators are destroyed with the RankState.
  bool defer_destroy = false;
  // communicator::set_dry_run: every operation of every group of the rank enqueues nothing.
  std::atomic<bool> dry_run{false};
  // communicator::overlapped: the communication stream (made on first use, shared by the rank's
  // groups) and the events that order it after the compute stream (fork) and back (join).
  // Guarded by mutex.
  cudaStream_t comm_stream = nullptr;
  cudaEvent_t fork_event = nullptr;
  cudaEvent_t join_event = nullptr;
  // communicator::overlapped_mark: mark m is recorded on the communication stream in slot
  // m % kMarkSlots (events made on first use); a later mark may reuse the slot, and a join then
  // waits for that later point, which is later in the same stream: never too early.
  static constexpr std::size_t kMarkSlots = 64;
  std::vector<cudaEvent_t> mark_events;
  std::uint64_t marks_issued = 0;

  // Call with `mutex` held. Records the first failure and aborts every communicator of the rank.
  inline void fail(std::string message, bool by_peer = false);

  bool stop_requested() const { return stop != nullptr && stop->raised.load(std::memory_order_acquire); }
  std::string stop_reason() const { return stop_requested() ? stop->reason : std::string(); }
};

struct Group {
  Group(std::shared_ptr<RankState> state, ncclComm_t handle, std::string group_name, int group_rank, int group_size,
        bool world)
      : rank_state(std::move(state)), comm(handle), name(std::move(group_name)), rank(group_rank), size(group_size),
        is_world(world) {}
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  inline ~Group();

  const std::shared_ptr<RankState> rank_state;
  // Guarded by rank_state->mutex; null once aborted or destroyed.
  ncclComm_t comm = nullptr;
  const std::string name;
  const int rank;
  const int size;
  const bool is_world;
  // Guarded by rank_state->mutex.
  std::deque<Pending> pending;
  std::vector<cudaEvent_t> spare_events;
  // communicator::use_copy_engines_for_overlapped_gathers: a window of symmetric memory (ncclMemAlloc,
  // registered on `copy_engines`) and the group of the same ranks made with NCCL_CTA_POLICY_ZERO that
  // gathers through it. Guarded by rank_state->mutex. Members go in reverse order, so the group's
  // communicator is released (or retired) before its windows are freed.
  struct Window {
    void* memory = nullptr;
    std::size_t bytes = 0;
  };
  struct WindowMemory {
    std::vector<void*> blocks;  // every window ever allocated (a grown one keeps its predecessors)
    RankState* owner = nullptr;
    WindowMemory() = default;
    WindowMemory(const WindowMemory&) = delete;
    WindowMemory& operator=(const WindowMemory&) = delete;
    inline ~WindowMemory();
  };
  WindowMemory window_memory;
  Window window;
  std::shared_ptr<Group> copy_engines;

  strata::detail::CommCallSite site(std::string_view operation) const {
    return {kBackend, name, rank, size, is_world ? -1 : rank_state->world_rank, operation};
  }
};

inline void RankState::fail(std::string message, bool by_peer) {
  if (failed.load()) return;
  failure = std::move(message);
  aborted_by_peer = by_peer;
  failed.store(true);
  int previous = -1;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(device);
  for (auto& weak : groups) {
    if (auto g = weak.lock()) {
      if (g->comm != nullptr) (void)ncclCommAbort(g->comm);
      g->comm = nullptr;
    }
  }
  for (ncclComm_t comm : retired) (void)ncclCommAbort(comm);
  retired.clear();
  if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
}

// Finalizes and destroys `comm`, or aborts it when `failed` or when finalizing takes longer than
// `timeout` (a peer that never takes part keeps it in progress forever). Current device: its own.
inline void release_comm(ncclComm_t comm, bool failed, std::chrono::duration<double> timeout) noexcept {
  if (comm == nullptr) return;
  if (failed) {
    (void)ncclCommAbort(comm);
    return;
  }
  ncclResult_t state = ncclCommFinalize(comm);
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(timeout);
  while (state == ncclInProgress && clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
  }
  if (state == ncclSuccess) (void)ncclCommDestroy(comm);
  else (void)ncclCommAbort(comm);
}

inline Group::~Group() {
  std::lock_guard lock(rank_state->mutex);
  int previous = -1;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(rank_state->device);
  if (comm != nullptr) {
    if (rank_state->defer_destroy && !rank_state->failed.load()) rank_state->retired.push_back(comm);
    else release_comm(comm, rank_state->failed.load(), rank_state->timeout);
    comm = nullptr;
  }
  for (auto& p : pending) (void)cudaEventDestroy(p.event);
  for (cudaEvent_t e : spare_events) (void)cudaEventDestroy(e);
  if (previous >= 0 && previous != rank_state->device) (void)cudaSetDevice(previous);
}

// A window outlives the communicator it is registered on: freed at once, or with the RankState
// when the rank's communicators are retired there (defer_destroy).
inline Group::WindowMemory::~WindowMemory() {
  if (blocks.empty() || owner == nullptr) return;
  if (owner->defer_destroy && !owner->failed.load()) {
    std::lock_guard lock(owner->mutex);
    for (void* block : blocks) owner->retired_memory.push_back(block);
    return;
  }
  for (void* block : blocks) (void)ncclMemFree(block);
}

inline RankState::~RankState() {
  int previous = -1;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(device);
  // Newest first: groups split from the world go before it.
  for (auto it = retired.rbegin(); it != retired.rend(); ++it) release_comm(*it, failed.load(), timeout);
  for (void* block : retired_memory) (void)ncclMemFree(block);
  if (barrier_word != nullptr) (void)cudaFree(barrier_word);
  if (fork_event != nullptr) (void)cudaEventDestroy(fork_event);
  if (join_event != nullptr) (void)cudaEventDestroy(join_event);
  for (cudaEvent_t e : mark_events) (void)cudaEventDestroy(e);
  if (comm_stream != nullptr) (void)cudaStreamDestroy(comm_stream);
  if (owns_stream && stream != nullptr) (void)cudaStreamDestroy(stream);
  if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
}

// The message for an operation that the GPU did not finish within the timeout.
inline std::string timeout_message(const Group& g, const Pending& p, std::chrono::duration<double> waited) {
  return concat(g.site(p.operation).str(), " did not complete within the timeout of ", g.rank_state->timeout.count(),
                " s (waited ", waited.count(), " s); the rank's NCCL communicators were aborted. The other ranks of "
                "group '", g.name, "' probably never called it: every rank must call the same operations in the same "
                "order, and a rank that stopped or skipped one leaves its peers waiting (raise STRATA_NCCL_TIMEOUT if "
                "the operation is merely slow)");
}

class Watchdog {
 public:
  static Watchdog& instance() {
    static Watchdog watchdog;
    return watchdog;
  }

  void watch(const std::shared_ptr<RankState>& rank) {
    std::lock_guard lock(mutex_);
    std::erase_if(ranks_, [](const std::weak_ptr<RankState>& r) { return r.expired(); });
    ranks_.push_back(rank);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }

  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // How often each rank is visited.
  static constexpr std::chrono::milliseconds kPollInterval{20};

 private:
  Watchdog() = default;

  void loop() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      cv_.wait_for(lock, kPollInterval, [this] { return stopping_; });
      if (stopping_) break;
      std::vector<std::shared_ptr<RankState>> live;
      for (auto& weak : ranks_)
        if (auto r = weak.lock()) live.push_back(std::move(r));
      lock.unlock();
      for (auto& r : live) visit(*r);
      live.clear();  // a RankState may be destroyed here, outside the watchdog's lock
      lock.lock();
    }
  }

  static void visit(RankState& r) noexcept {
    std::unique_lock lock(r.mutex, std::try_to_lock);
    if (!lock.owns_lock() || r.failed.load()) return;
    try {
      int previous = -1;
      (void)cudaGetDevice(&previous);
      if (previous != r.device) (void)cudaSetDevice(r.device);
      const auto now = clock::now();
      for (auto& weak : r.groups) {
        std::shared_ptr<Group> g = weak.lock();
        if (!g || g->comm == nullptr) continue;
        ncclResult_t async = ncclSuccess;
        ncclResult_t queried = ncclCommGetAsyncError(g->comm, &async);
        if (queried != ncclSuccess) async = queried;
        if (async != ncclSuccess && async != ncclInProgress) {
          std::string operation = g->pending.empty() ? std::string("the group's operations") : g->pending.front().operation;
          r.fail(concat(g->site(operation).str(), ": NCCL reported an asynchronous error: ", describe_result(async),
                        "; the rank's NCCL communicators were aborted (a peer may have died or the network failed)"));
          return;
        }
        while (!g->pending.empty()) {
          Pending& p = g->pending.front();
          cudaError_t status = cudaEventQuery(p.event);
          if (status == cudaSuccess) {
            g->spare_events.push_back(p.event);
            g->pending.pop_front();
            if (!g->pending.empty()) g->pending.front().since = std::max(g->pending.front().since, now);
            continue;
          }
          if (status == cudaErrorNotReady) {
            const std::chrono::duration<double> waited = now - p.since;
            if (waited > r.timeout) {
              r.fail(timeout_message(*g, p, waited));
              return;
            }
            break;
          }
          if (status == cudaErrorCudartUnloading) return;  // the process is exiting
          r.fail(concat(g->site(p.operation).str(), ": the CUDA stream reported ", describe_cuda(status),
                        " while this operation was in flight; the rank's NCCL communicators were aborted"));
          return;
        }
      }
      if (previous >= 0 && previous != r.device) (void)cudaSetDevice(previous);
    } catch (...) {
      // Never let the watchdog die; the next round tries again.
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<std::weak_ptr<RankState>> ranks_;
  std::thread thread_;
};

}  // namespace nccl::detail
STRATA_NAMESPACE_END
