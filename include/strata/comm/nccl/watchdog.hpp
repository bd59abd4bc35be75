// strata/comm/nccl/watchdog.hpp: the state behind a rank's NCCL communicators and the watchdog
// thread that turns a hang into an error.
//
// Every NCCL communicator of a rank (its world and every group split from it) shares one
// `RankState`: the device, the compute stream all operations are enqueued on, the timeout, one
// recursive mutex that serializes the rank's own NCCL calls, and the rank's first failure. Each
// group (`Group`) owns its ncclComm_t and a queue of the operations it has enqueued that the GPU has
// not finished yet, each with a CUDA event recorded after it.
//
// The watchdog is one thread per process. Every few tens of milliseconds it visits each live rank
// and, for each of its groups:
//   - asks ncclCommGetAsyncError: an error there (a peer died, a network failure) fails the rank;
//   - pops the operations whose events have completed; when the oldest one has been waiting
//     longer than the timeout (counted from when it was enqueued or, if later, from when the
//     operation before it finished), it fails the rank naming that operation;
//   - fails the rank when another part of the process said the job is over (`abort_all_ranks`:
//     the liveness monitor heard that a peer process died, stopped or failed), naming the
//     operation this rank was waiting in.
// Finding a timeout does not need the mutex the rank's own thread holds while it calls NCCL: the
// queues have a mutex of their own (`pending_mutex`), the handles another (`handle_mutex`, held
// only to swap a handle out and by the watchdog around ncclCommGetAsyncError), the failure text a
// third. The rank's thread may be blocked anywhere (in a kernel launch behind a collective that
// waits for a dead peer, a stream synchronization, a host read of the loss) and the failure is
// still seen. ncclCommGetAsyncError itself runs only while the watchdog holds the rank's mutex (a
// query beside a split or an initialization in progress on the same communicator is not safe).
//
// Failing a rank first reports the message to the process (failure.hpp: printed at once, and with
// failure::exit_on_failure, as the trainers set it, the process ends after a grace period if it
// does not end by itself), then calls ncclCommAbort on every communicator of the rank, so the NCCL
// kernels still waiting on the stream return, when it can take the rank's mutex within a second.
// When it cannot (the rank's thread is inside a NCCL call that does not return), the abort is left
// out (aborting a communicator under a call in progress would free it under that call) and the
// process exit ends the job. The message reaches the caller from the rank's next call of any
// operation, `check()` or `synchronize()` on any of its communicators (a CommError; AbortedError
// when the failure started on another rank). The watchdog never throws.
//
// A second thread watches the watchdog: a visit that has not returned within the smallest timeout
// of the watched ranks (a CUDA or NCCL query that blocks) is reported as a failure, naming the
// operation being checked, so even a stuck driver call ends the process (PyTorch's heartbeat
// monitor does the same for its watchdog).
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
#include "../failure.hpp"
#include "types.hpp"

STRATA_NAMESPACE_BEGIN
namespace nccl::detail {

using clock = std::chrono::steady_clock;

struct Group;

// True on the watchdog's threads: a Group whose last handle the watchdog drops is destroyed there,
// without the rank's mutex (the rank's thread may hold it for a long time).
inline bool& on_watchdog_thread() {
  thread_local bool flag = false;
  return flag;
}

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
  // Guarded by failure_mutex (taken after `mutex` where both are held).
  std::mutex failure_mutex;
  std::string failure;
  bool aborted_by_peer = false;
  // Guards every group's `pending` and `spare_events`; never held across a call that can block.
  std::mutex pending_mutex;
  // Held to swap a group's communicator handle out (abort, destroy) and by the watchdog while it
  // queries a handle, so a handle is never freed under a query.
  std::mutex handle_mutex;
  // Guarded by mutex.
  std::vector<std::weak_ptr<Group>> groups;  // written under mutex and pending_mutex
  // Guarded by pending_mutex.
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

  // Call with `mutex` held. Records the first failure, reports it to the process (failure.hpp)
  // and aborts every communicator of the rank.
  inline void fail(std::string message, bool by_peer = false);
  // Records the first failure and reports it, without the mutex and without aborting (see the top).
  inline void fail_without_abort(std::string message, bool by_peer = false);
  // The failure text and whether it came from a peer (takes failure_mutex).
  std::pair<std::string, bool> failure_text() {
    std::lock_guard lock(failure_mutex);
    return {failure, aborted_by_peer};
  }

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
  // Guarded by rank_state->pending_mutex.
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

inline void RankState::fail_without_abort(std::string message, bool by_peer) {
  {
    std::lock_guard lock(failure_mutex);
    if (failed.load()) return;
    failure = message;
    aborted_by_peer = by_peer;
    failed.store(true);
  }
  failure::report(message);  // before anything that may block: the process exit is armed now
}

inline void RankState::fail(std::string message, bool by_peer) {
  if (failed.load()) return;
  fail_without_abort(std::move(message), by_peer);
  int previous = -1;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(device);
  for (auto& weak : groups) {
    if (auto g = weak.lock()) {
      ncclComm_t comm = nullptr;
      {
        std::lock_guard handles(handle_mutex);
        comm = std::exchange(g->comm, nullptr);
      }
      if (comm != nullptr) (void)ncclCommAbort(comm);
    }
  }
  std::vector<ncclComm_t> gone;
  {
    std::lock_guard queues(pending_mutex);
    gone.swap(retired);
  }
  for (ncclComm_t comm : gone) (void)ncclCommAbort(comm);
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
  std::unique_lock lock(rank_state->mutex, std::defer_lock);
  if (!on_watchdog_thread()) {
    lock.lock();
  } else {  // the watchdog held the last handle: wait a little for the rank's thread to leave NCCL
    const auto until = clock::now() + std::chrono::seconds(2);
    while (!lock.try_lock() && clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int previous = -1;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(rank_state->device);
  ncclComm_t handle = nullptr;
  {
    std::lock_guard handles(rank_state->handle_mutex);
    handle = std::exchange(comm, nullptr);
  }
  if (handle != nullptr) {
    if (rank_state->defer_destroy && !rank_state->failed.load()) {
      std::lock_guard queues(rank_state->pending_mutex);
      rank_state->retired.push_back(handle);
    } else {
      release_comm(handle, rank_state->failed.load(), rank_state->timeout);
    }
  }
  std::lock_guard queues(rank_state->pending_mutex);
  for (auto& p : pending) (void)cudaEventDestroy(p.event);
  for (cudaEvent_t e : spare_events) (void)cudaEventDestroy(e);
  if (previous >= 0 && previous != rank_state->device) (void)cudaSetDevice(previous);
}

// A window outlives the communicator it is registered on: freed at once, or with the RankState
// when the rank's communicators are retired there (defer_destroy).
inline Group::WindowMemory::~WindowMemory() {
  if (blocks.empty() || owner == nullptr) return;
  if (owner->defer_destroy && !owner->failed.load()) {
    std::lock_guard queues(owner->pending_mutex);
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

// Fails `r` with `message` from a thread other than the rank's own: with the abort when the rank's
// mutex can be taken within `patience`, without it otherwise (see the top).
inline void fail_from_outside(RankState& r, std::string message, bool by_peer,
                              std::chrono::milliseconds patience = std::chrono::milliseconds(1000)) noexcept {
  try {
    if (r.failed.load()) return;
    std::unique_lock lock(r.mutex, std::defer_lock);
    const auto until = clock::now() + patience;
    while (!lock.try_lock()) {
      if (clock::now() > until) {
        r.fail_without_abort(std::move(message), by_peer);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    r.fail(std::move(message), by_peer);
  } catch (...) {
  }
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
    const double seconds = rank->timeout.count();
    if (smallest_timeout_ <= 0 || seconds < smallest_timeout_) smallest_timeout_ = seconds;
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    if (!guard_.joinable()) guard_ = std::thread([this] { guard(); });
  }

  // Every rank of this process fails with `reason` at the watchdog's next round (the job is over:
  // another process died, stopped or failed), each naming the operation it was waiting in.
  void abort_all(std::string reason) {
    {
      std::lock_guard lock(mutex_);
      if (!external_.empty()) return;
      external_ = std::move(reason);
    }
    cv_.notify_all();
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
    if (guard_.joinable()) guard_.join();
  }

  // How often each rank is visited.
  static constexpr std::chrono::milliseconds kPollInterval{20};

 private:
  Watchdog() = default;

  void loop() {
    on_watchdog_thread() = true;
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      cv_.wait_for(lock, kPollInterval, [this] { return stopping_; });
      if (stopping_) break;
      std::vector<std::shared_ptr<RankState>> live;
      for (auto& weak : ranks_)
        if (auto r = weak.lock()) live.push_back(std::move(r));
      const std::string external = external_;
      lock.unlock();
      for (auto& r : live) {
        visit_started_.store(clock::now().time_since_epoch().count(), std::memory_order_release);
        visit(*r, external);
        visit_started_.store(0, std::memory_order_release);
      }
      live.clear();  // a RankState may be destroyed here, outside the watchdog's lock
      lock.lock();
    }
  }

  // The second thread: a visit that does not return within the smallest timeout is a failure.
  void guard() {
    on_watchdog_thread() = true;
    std::unique_lock lock(mutex_);
    bool reported = false;
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(250), [this] { return stopping_; });
      if (stopping_ || reported) continue;
      const auto started = visit_started_.load(std::memory_order_acquire);
      if (started == 0 || smallest_timeout_ <= 0) continue;
      const std::chrono::duration<double> busy = clock::now() - clock::time_point(clock::duration(started));
      if (busy.count() <= smallest_timeout_) continue;
      reported = true;
      std::string checking;
      {
        std::lock_guard checking_lock(checking_mutex_);
        checking = checking_;
      }
      failure::report(concat(kBackend, ": the watchdog has been blocked for ", busy.count(),
                             " s in a CUDA or NCCL query while checking ", checking.empty() ? std::string("a rank") : checking,
                             ": the GPU or the driver does not answer (a kernel that never ends, or a call blocked "
                             "behind one); the rank's operations cannot be aborted"));
    }
  }

  void note_checking(const Group& g, const std::string& operation) {
    std::lock_guard lock(checking_mutex_);
    checking_ = g.site(operation.empty() ? std::string_view("its operations") : std::string_view(operation)).str();
  }

  // What r is waiting in: the oldest unfinished operation of its groups (pending_mutex taken;
  // operations the GPU has finished are retired first, so a finished one is never named).
  static std::string waiting_in(RankState& r) {
    std::lock_guard queues(r.pending_mutex);
    std::string best;
    clock::time_point since = clock::time_point::max();
    for (auto& weak : r.groups) {
      std::shared_ptr<Group> g = weak.lock();
      if (!g) continue;
      while (!g->pending.empty() && cudaEventQuery(g->pending.front().event) == cudaSuccess) {
        g->spare_events.push_back(g->pending.front().event);
        g->pending.pop_front();
      }
      if (g->pending.empty()) continue;
      if (g->pending.front().since < since) {
        since = g->pending.front().since;
        best = g->site(g->pending.front().operation).str();
      }
    }
    return best;
  }

  // Finds what is wrong with r without its mutex: an asynchronous NCCL error, an operation past
  // the timeout. Empty when nothing is.
  std::string problem_of(RankState& r) {
    const auto now = clock::now();
    // r.groups changes only under r.mutex, on the rank's thread; copy the pointers under the
    // queue mutex, which split() also holds while it adds a group.
    std::vector<std::shared_ptr<Group>> groups;
    {
      std::lock_guard queues(r.pending_mutex);
      for (auto& weak : r.groups)
        if (auto g = weak.lock()) groups.push_back(std::move(g));
    }
    // ncclCommGetAsyncError only while the rank's own thread is not inside a NCCL call: a query
    // beside a split or an initialization still in progress on the same communicator is not safe
    // in NCCL. When the rank's thread holds the mutex (for long: it is blocked), the events below
    // still find an operation past its timeout.
    std::unique_lock own(r.mutex, std::try_to_lock);
    for (auto& g : groups) {
      if (own.owns_lock()) {
        std::lock_guard handles(r.handle_mutex);
        if (g->comm != nullptr) {
          note_checking(*g, std::string());
          ncclResult_t async = ncclSuccess;
          ncclResult_t queried = ncclCommGetAsyncError(g->comm, &async);
          if (queried != ncclSuccess) async = queried;
          if (async != ncclSuccess && async != ncclInProgress) {
            std::string operation;
            {
              std::lock_guard queues(r.pending_mutex);
              operation = g->pending.empty() ? std::string("the group's operations") : g->pending.front().operation;
            }
            return concat(g->site(operation).str(), ": NCCL reported an asynchronous error: ", describe_result(async),
                          "; the rank's NCCL communicators were aborted (a peer may have died or the network failed)");
          }
        }
      }
      std::lock_guard queues(r.pending_mutex);
      while (!g->pending.empty()) {
        Pending& p = g->pending.front();
        note_checking(*g, p.operation);
        cudaError_t status = cudaEventQuery(p.event);
        if (status == cudaSuccess) {
          g->spare_events.push_back(p.event);
          g->pending.pop_front();
          if (!g->pending.empty()) g->pending.front().since = std::max(g->pending.front().since, now);
          continue;
        }
        if (status == cudaErrorNotReady) {
          const std::chrono::duration<double> waited = now - p.since;
          if (waited > r.timeout) return timeout_message(*g, p, waited);
          break;
        }
        if (status == cudaErrorCudartUnloading) return std::string();  // the process is exiting
        return concat(g->site(p.operation).str(), ": the CUDA stream reported ", describe_cuda(status),
                      " while this operation was in flight; the rank's NCCL communicators were aborted");
      }
    }
    return std::string();
  }

  void visit(RankState& r, const std::string& external) noexcept {
    if (r.failed.load()) return;
    try {
      int previous = -1;
      (void)cudaGetDevice(&previous);
      if (previous != r.device) (void)cudaSetDevice(r.device);
      std::string problem;
      bool by_peer = false;
      if (!external.empty()) {
        const std::string in = waiting_in(r);
        problem = in.empty() ? concat(kBackend, ": rank ", r.world_rank, " of ", r.world_size, " stops because ", external)
                             : concat(in, " cannot complete: ", external);
        by_peer = true;
      } else {
        problem = problem_of(r);
      }
      if (!problem.empty()) fail_from_outside(r, std::move(problem), by_peer);
      if (previous >= 0 && previous != r.device) (void)cudaSetDevice(previous);
    } catch (...) {
      // Never let the watchdog die; the next round tries again.
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<std::weak_ptr<RankState>> ranks_;
  double smallest_timeout_ = 0;  // guarded by mutex_
  std::string external_;         // guarded by mutex_: abort_all's reason
  std::thread thread_;
  std::thread guard_;
  std::atomic<clock::rep> visit_started_{0};  // when the visit in progress began (0: none)
  std::mutex checking_mutex_;
  std::string checking_;  // the group and operation being queried, for the guard's message
};

}  // namespace nccl::detail
STRATA_NAMESPACE_END
