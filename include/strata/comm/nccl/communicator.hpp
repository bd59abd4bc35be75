// strata/comm/nccl/communicator.hpp: `strata::nccl::communicator`, the Communicator concept on
// NCCL: buffers are device_span<T>, every operation is enqueued on the rank's compute stream (or,
// through an overlapped() handle, on its communication stream).
//
// Ordering. An operation is enqueued on the stream the communicator was created with (the rank's
// cuda::backend compute stream), so it runs after the kernels that produced its input and before
// the kernels enqueued after it; the call returns once NCCL has enqueued it, not when the data
// has arrived. `synchronize()` waits for the stream. An `overlapped()` handle enqueues on the
// rank's communication stream (one per rank, high priority, made on first use) after an event
// that orders it behind the compute stream's work so far; `join_overlapped()` makes the compute
// stream wait for the communication stream (see communicator.hpp). `barrier()` is an all-reduce of one integer
// followed by synchronize(), so it also holds the host.
//
//   all_reduce       ncclAllReduce, in place (sum, max, min, avg)
//   all_gather       ncclAllGather (in may be this rank's block of out)
//   reduce_scatter   ncclReduceScatter (out may be this rank's block of in)
//   all_gather_v     one ncclBroadcast per rank (root r sends its counts[r] elements), one group
//   reduce_scatter_v one ncclReduce per rank (root r receives block r), one group
//   broadcast        ncclBroadcast, in place
//   send / recv      ncclSend / ncclRecv. Not buffered: a send completes when the peer receives.
//                    Two ranks that exchange messages, or one that posts several, put the calls
//                    in one group: `{ auto g = comm.group(); comm.send(a, 1); comm.recv(b, 1); g.end(); }`
//   all_to_all       ncclSend + ncclRecv per peer with non-zero counts (self included), one group
//   split            ncclCommSplit (ranks ordered by key, then old rank; the child shares the stream)
//
// Failures never hang silently. Communicators are created non-blocking (ncclConfig_t::blocking = 0):
// every call that NCCL answers with ncclInProgress is polled with ncclCommGetAsyncError until it is
// enqueued, for at most the timeout, and every enqueued operation is followed by a CUDA event that
// the watchdog (watchdog.hpp) watches. On a NCCL error, a CUDA error or an operation that does not
// complete within the timeout (Options::timeout, else STRATA_NCCL_TIMEOUT seconds, else 600 s),
// every communicator of the rank is aborted (ncclCommAbort) and the error, a sentence naming the
// group, the rank and the operation that did not complete, is thrown as CommError by the rank's
// next operation, check() or synchronize() on any of its communicators. A rank that failed stays
// failed. Wrong sizes are ShapeError before anything is enqueued, as for every communicator.
//
// Handles are cheap copies of one group; one rank's handles are used from one thread at a time.
// Creating one: `nccl::run` (threads, one per GPU) and `nccl::init_from_environment` (one process
// per GPU) in launch.hpp, or `communicator::create` with an ncclUniqueId you distribute yourself.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../core/dtype.hpp"
#include "../../core/error.hpp"
#include "../../core/space.hpp"
#include "../communicator.hpp"
#include "types.hpp"
#include "watchdog.hpp"

STRATA_NAMESPACE_BEGIN
namespace nccl {

class communicator;

namespace detail {

using strata::detail::check_all_gather_sizes;
using strata::detail::check_all_gather_v_sizes;
using strata::detail::check_all_to_all_sizes;
using strata::detail::check_rank_argument;
using strata::detail::check_reduce_scatter_sizes;
using strata::detail::check_reduce_scatter_v_sizes;
using strata::detail::format_counts;
using strata::detail::offset_of_block;

// The error of a rank that already failed, thrown from `operation` on group g (mutex held).
[[noreturn]] inline void throw_failed(const Group& g, std::string_view operation) {
  auto [failure, by_peer] = g.rank_state->failure_text();
  std::string message = concat(failure, " [raised by ", operation, " on group '", g.name, "']");
  if (by_peer) throw AbortedError(message);
  throw CommError(message);
}

// Fails the rank with `message` and throws it (mutex held).
[[noreturn]] inline void fail_rank(Group& g, std::string_view operation, std::string message, bool by_peer = false) {
  g.rank_state->fail(std::move(message), by_peer);
  throw_failed(g, operation);
}

// Polls ncclCommGetAsyncError until NCCL has finished the call in progress on g (mutex held),
// for at most the timeout.
inline void wait_until_enqueued(Group& g, std::string_view operation) {
  RankState& r = *g.rank_state;
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(r.timeout);
  auto pause = std::chrono::microseconds(1);
  for (;;) {
    if (r.failed.load() || g.comm == nullptr) throw_failed(g, operation);
    ncclResult_t state = ncclInProgress;
    ncclResult_t queried = ncclCommGetAsyncError(g.comm, &state);
    if (queried != ncclSuccess) state = queried;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)
      fail_rank(g, operation, concat(g.site(operation).str(), ": NCCL reported ", describe_result(state),
                                     "; the rank's NCCL communicators were aborted"));
    if (r.stop_requested())
      fail_rank(g, operation, concat(g.site(operation).str(), ": aborted because ", r.stop_reason()), true);
    if (clock::now() > deadline)
      fail_rank(g, operation,
                concat(g.site(operation).str(), " could not be enqueued within the timeout of ", r.timeout.count(),
                       " s: NCCL was still connecting to or waiting for the other ranks of group '", g.name,
                       "'; the rank's NCCL communicators were aborted. Every rank must call the same operations in "
                       "the same order (raise STRATA_NCCL_TIMEOUT if they are merely slow)"));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

// Records an event after everything enqueued so far on `stream` (the rank's compute stream, or its
// communication stream) and hands it to the watchdog under the name `operation` (mutex held).
inline void record_pending(Group& g, std::string operation, cudaStream_t stream) {
  cudaEvent_t event = nullptr;
  {
    std::lock_guard queues(g.rank_state->pending_mutex);
    if (!g.spare_events.empty()) {
      event = g.spare_events.back();
      g.spare_events.pop_back();
    }
  }
  if (event == nullptr) {
    device_guard guard(g.rank_state->device);
    cudaError_t status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (status != cudaSuccess)
      fail_rank(g, operation, concat(g.site(operation).str(), ": cudaEventCreateWithFlags failed: ", describe_cuda(status)));
  }
  cudaError_t status = cudaEventRecord(event, stream);
  if (status != cudaSuccess) {
    (void)cudaEventDestroy(event);
    fail_rank(g, operation, concat(g.site(operation).str(), ": cudaEventRecord on the rank's stream failed: ",
                                   describe_cuda(status)));
  }
  std::lock_guard queues(g.rank_state->pending_mutex);
  g.pending.push_back(Pending{event, std::move(operation), clock::now()});
}

// The rank's communication stream, made on first use with the fork and join events (mutex held).
inline cudaStream_t communication_stream(Group& g, std::string_view operation) {
  RankState& r = *g.rank_state;
  if (r.comm_stream != nullptr) return r.comm_stream;
  device_guard guard(r.device);
  int least = 0, greatest = 0;  // the higher priority lets communication kernels start while compute runs
  cudaError_t status = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  cudaStream_t stream = nullptr;
  if (status == cudaSuccess) status = cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest);
  if (status == cudaSuccess) status = cudaEventCreateWithFlags(&r.fork_event, cudaEventDisableTiming);
  if (status == cudaSuccess) status = cudaEventCreateWithFlags(&r.join_event, cudaEventDisableTiming);
  if (status != cudaSuccess)
    fail_rank(g, operation, concat(g.site(operation).str(), ": could not create the communication stream: ", describe_cuda(status)));
  r.comm_stream = stream;
  return stream;
}

// Makes `stream` wait for everything enqueued on the compute stream so far (mutex held).
inline void fork_from_compute(Group& g, cudaStream_t stream, std::string_view operation) {
  RankState& r = *g.rank_state;
  cudaError_t status = cudaEventRecord(r.fork_event, r.stream);
  if (status == cudaSuccess) status = cudaStreamWaitEvent(stream, r.fork_event, 0);
  if (status != cudaSuccess)
    fail_rank(g, operation, concat(g.site(operation).str(), ": could not order the communication stream after the compute "
                                   "stream: ", describe_cuda(status)));
}

// The NCCL group calls this thread has open (ncclGroupStart nests; the outermost ncclGroupEnd
// launches). The groups touched inside stay locked until the outermost end.
struct GroupFrame {
  int depth = 0;
  std::vector<std::shared_ptr<Group>> groups;   // distinct, in order of first use
  std::vector<std::string> operations;          // per entry of `groups`, what was issued on it
  std::vector<int> counts;                      // per entry of `groups`, how many operations
  std::vector<std::vector<cudaStream_t>> streams;  // per entry of `groups`, the streams used
  std::vector<std::unique_lock<std::recursive_mutex>> locks;
};

inline GroupFrame& group_frame() {
  thread_local GroupFrame frame;
  return frame;
}

inline void frame_begin() {
  ncclResult_t result = ncclGroupStart();
  if (result != ncclSuccess) fail<CommError>(kBackend, ": ncclGroupStart failed: ", describe_result(result));
  ++group_frame().depth;
}

// Locks g for the rest of the frame and notes `operation` on it, enqueued on `stream`.
inline void frame_join(const std::shared_ptr<Group>& g, std::string_view operation, cudaStream_t stream) {
  GroupFrame& frame = group_frame();
  auto it = std::find(frame.groups.begin(), frame.groups.end(), g);
  if (it == frame.groups.end()) {
    frame.locks.emplace_back(g->rank_state->mutex);
    frame.groups.push_back(g);
    frame.operations.emplace_back(operation);
    frame.counts.push_back(1);
    frame.streams.push_back({stream});
  } else {
    const std::size_t at = static_cast<std::size_t>(it - frame.groups.begin());
    auto& used = frame.streams[at];
    if (std::find(used.begin(), used.end(), stream) == used.end()) used.push_back(stream);
    ++frame.counts[at];
    std::string& ops = frame.operations[static_cast<std::size_t>(it - frame.groups.begin())];
    if (ops.size() < 400) ops += concat(", ", operation);
    else if (ops.back() != '.') ops += ", ...";
  }
}

// Closes one level; the outermost waits until NCCL has enqueued everything and hands one event
// per group to the watchdog.
inline void frame_end() {
  GroupFrame& frame = group_frame();
  --frame.depth;
  const ncclResult_t result = ncclGroupEnd();
  if (frame.depth > 0) {
    if (result != ncclSuccess && result != ncclInProgress)
      fail<CommError>(kBackend, ": a nested ncclGroupEnd failed: ", describe_result(result));
    return;
  }
  std::vector<std::shared_ptr<Group>> groups = std::move(frame.groups);
  std::vector<std::string> operations = std::move(frame.operations);
  std::vector<int> counts = std::move(frame.counts);
  std::vector<std::vector<cudaStream_t>> streams = std::move(frame.streams);
  std::vector<std::unique_lock<std::recursive_mutex>> locks = std::move(frame.locks);
  frame.groups.clear();
  frame.operations.clear();
  frame.counts.clear();
  frame.streams.clear();
  frame.locks.clear();
  const auto describe = [&](std::size_t i) {
    return counts[i] == 1 ? operations[i] : concat("group(", operations[i], ")");
  };
  if (result != ncclSuccess && result != ncclInProgress) {
    for (std::size_t i = 0; i < groups.size(); ++i)
      groups[i]->rank_state->fail(concat(groups[i]->site(describe(i)).str(), ": ncclGroupEnd returned ",
                                         describe_result(result), "; the rank's NCCL communicators were aborted"));
    if (groups.empty()) fail<CommError>(kBackend, ": ncclGroupEnd returned ", describe_result(result));
    throw_failed(*groups.front(), describe(0));
  }
  for (std::size_t i = 0; i < groups.size(); ++i) wait_until_enqueued(*groups[i], describe(i));
  for (std::size_t i = 0; i < groups.size(); ++i)
    for (cudaStream_t stream : streams[i]) record_pending(*groups[i], describe(i), stream);
}

}  // namespace detail

// An open NCCL group on the calling thread (ncclGroupStart ... ncclGroupEnd): the operations
// issued until end() are launched together, so sends and receives between ranks cannot deadlock.
// end() reports errors at once; a guard destroyed without end() still closes the group, and an
// error then surfaces at the rank's next operation. Groups nest.
class group_guard {
 public:
  group_guard() {
    detail::frame_begin();
    active_ = true;
  }
  group_guard(group_guard&& other) noexcept : active_(std::exchange(other.active_, false)) {}
  group_guard& operator=(group_guard&&) = delete;
  group_guard(const group_guard&) = delete;
  group_guard& operator=(const group_guard&) = delete;
  ~group_guard() {
    if (!active_) return;
    try {
      detail::frame_end();
    } catch (...) {
    }
  }

  void end() {
    if (!active_) return;
    active_ = false;
    detail::frame_end();
  }

 private:
  bool active_ = false;
};

namespace detail {
communicator make_world(const ncclUniqueId& id, int size, int rank, int device, Options options,
                        StopSignal* stop);
struct launcher_access;
}  // namespace detail

class communicator {
 public:
  using space = strata::space::cuda;
  using default_device = cuda::backend;

  // An empty handle; every operation on it throws. Real ones come from create, split and launch.hpp.
  communicator() = default;

  // Collective over `size` ranks that share `id` (from ncclGetUniqueId on one of them): makes the
  // calling thread's current device `device` and creates this rank's world communicator.
  static communicator create(const ncclUniqueId& id, int size, int rank, int device, Options options = {}) {
    return detail::make_world(id, size, rank, device, std::move(options), nullptr);
  }

  bool valid() const { return group_ != nullptr; }
  int rank() const { return group_ ? group_->rank : 0; }
  int size() const { return group_ ? group_->size : 0; }
  std::string_view name() const { return group_ ? std::string_view(group_->name) : std::string_view("(none)"); }
  int world_rank() const { return group_ ? group_->rank_state->world_rank : -1; }
  int world_size() const { return group_ ? group_->rank_state->world_size : 0; }
  int device() const { return group_ ? group_->rank_state->device : -1; }
  // The stream every operation is enqueued on: the compute stream, or for an overlapped() handle
  // the communication stream (null until its first operation).
  cudaStream_t stream() const {
    if (!group_) return nullptr;
    if (!overlapped_) return group_->rank_state->stream;
    std::lock_guard lock(group_->rank_state->mutex);
    return group_->rank_state->comm_stream;
  }

  // A handle on this group whose operations run on the rank's communication stream, each after
  // everything enqueued on the compute stream before it (communicator.hpp, "Communication beside
  // compute"). join_overlapped() orders the compute stream after all of them.
  communicator overlapped() const {
    communicator c = *this;
    c.overlapped_ = true;
    return c;
  }
  bool is_overlapped() const { return overlapped_; }
  void join_overlapped() {
    require_valid("join_overlapped");
    detail::Group& g = *group_;
    std::lock_guard lock(g.rank_state->mutex);
    if (g.rank_state->failed.load()) detail::throw_failed(g, "join_overlapped");
    detail::RankState& r = *g.rank_state;
    if (r.comm_stream == nullptr) return;  // nothing was ever overlapped on this rank
    cudaError_t status = cudaEventRecord(r.join_event, r.comm_stream);
    if (status == cudaSuccess) status = cudaStreamWaitEvent(r.stream, r.join_event, 0);
    if (status != cudaSuccess)
      detail::fail_rank(g, "join_overlapped", detail::concat(site("join_overlapped").str(),
                                                             ": could not order the compute stream after the communication "
                                                             "stream: ", detail::describe_cuda(status)));
  }
  // A mark of the overlapped operations this rank issued so far (on any of its groups: they share
  // the communication stream); join_overlapped(mark) orders the compute stream after them alone.
  // no_mark when nothing was ever overlapped on this rank (its join does nothing).
  static constexpr std::uint64_t no_mark = ~std::uint64_t{0};
  std::uint64_t overlapped_mark() {
    require_valid("overlapped_mark");
    detail::Group& g = *group_;
    std::lock_guard lock(g.rank_state->mutex);
    if (g.rank_state->failed.load()) detail::throw_failed(g, "overlapped_mark");
    detail::RankState& r = *g.rank_state;
    if (r.comm_stream == nullptr) return no_mark;
    const std::size_t slot = static_cast<std::size_t>(r.marks_issued % detail::RankState::kMarkSlots);
    cudaError_t status = cudaSuccess;
    if (slot == r.mark_events.size()) {
      detail::device_guard guard(r.device);
      cudaEvent_t event = nullptr;
      status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      if (status == cudaSuccess) r.mark_events.push_back(event);
    }
    if (status == cudaSuccess) status = cudaEventRecord(r.mark_events[slot], r.comm_stream);
    if (status != cudaSuccess)
      detail::fail_rank(g, "overlapped_mark", detail::concat(site("overlapped_mark").str(), ": could not record a mark on the "
                                                             "communication stream: ", detail::describe_cuda(status)));
    return r.marks_issued++;
  }
  void join_overlapped(std::uint64_t mark) {
    require_valid("join_overlapped");
    if (mark == no_mark) return;
    detail::Group& g = *group_;
    std::lock_guard lock(g.rank_state->mutex);
    if (g.rank_state->failed.load()) detail::throw_failed(g, "join_overlapped");
    detail::RankState& r = *g.rank_state;
    if (mark >= r.marks_issued)
      fail<CommError>(site("join_overlapped").str(), ": mark ", mark, " was never issued on this rank (", r.marks_issued,
                      " so far); pass a value overlapped_mark() returned");
    const cudaError_t status =
        cudaStreamWaitEvent(r.stream, r.mark_events[static_cast<std::size_t>(mark % detail::RankState::kMarkSlots)], 0);
    if (status != cudaSuccess)
      detail::fail_rank(g, "join_overlapped", detail::concat(site("join_overlapped").str(),
                                                             ": could not order the compute stream after a mark of the "
                                                             "communication stream: ", detail::describe_cuda(status)));
  }
  std::chrono::duration<double> timeout() const {
    return group_ ? group_->rank_state->timeout : std::chrono::duration<double>{};
  }
  // The NCCL communicator (null once aborted).
  ncclComm_t native_handle() const {
    if (!group_) return nullptr;
    std::lock_guard lock(group_->rank_state->mutex);
    return group_->comm;
  }

  template <CommElement T>
  void all_reduce(device_span<T> buffer, ReduceOp op = ReduceOp::sum) {
    require_valid("all_reduce");
    const std::string operation = describe<T>("all_reduce", detail::concat(count_text(buffer.size()), ", ", reduce_op_name(op)));
    enqueue(operation, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(buffer.data(), buffer.data(), buffer.size(), detail::data_type<T>(), detail::reduce_op(op),
                           comm, stream);
    });
  }

  // `in` may be exactly this rank's block of `out`; otherwise the two must not overlap.
  template <CommElement T>
  void all_gather(device_span<const std::type_identity_t<T>> in, device_span<T> out) {
    require_valid("all_gather");
    detail::check_all_gather_sizes(site("all_gather"), in.size(), out.size());
    check_disjoint_or_own_block<T>("all_gather", in.data(), in.size(), out.data(), out.size(),
                                   static_cast<std::size_t>(rank()) * in.size(), "in", "out");
    if (gathers_through_window()) return all_gather_through_window<T>(in, out);
    enqueue(describe<T>("all_gather", count_text(in.size())), [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllGather(in.data(), out.data(), in.size(), detail::data_type<T>(), comm, stream);
    });
  }

  template <CommElement T>
  void all_gather_v(device_span<const std::type_identity_t<T>> in, device_span<T> out,
                    std::span<const std::size_t> counts) {
    require_valid("all_gather_v");
    detail::check_all_gather_v_sizes(site("all_gather_v"), in.size(), out.size(), counts);
    const std::size_t own_offset = detail::offset_of_block(counts, static_cast<std::size_t>(rank()));
    check_disjoint_or_own_block<T>("all_gather_v", in.data(), in.size(), out.data(), out.size(), own_offset, "in", "out");
    enqueue(describe<T>("all_gather_v", detail::concat("counts ", detail::format_counts(counts))),
            [&](ncclComm_t comm, cudaStream_t stream) {
              std::size_t offset = 0;
              for (int p = 0; p < size(); ++p) {
                const std::size_t n = counts[static_cast<std::size_t>(p)];
                T* block = out.data() + offset;  // out [sum(counts)]: block p at the prefix sum
                offset += n;
                if (n == 0) continue;
                const T* source = p == rank() ? in.data() : block;
                ncclResult_t result = ncclBroadcast(source, block, n, detail::data_type<T>(), p, comm, stream);
                if (result != ncclSuccess && result != ncclInProgress) return result;
              }
              return ncclSuccess;
            });
  }

  // `out` may be exactly this rank's block of `in`; otherwise the two must not overlap.
  template <CommElement T>
  void reduce_scatter(device_span<const std::type_identity_t<T>> in, device_span<T> out, ReduceOp op = ReduceOp::sum) {
    require_valid("reduce_scatter");
    detail::check_reduce_scatter_sizes(site("reduce_scatter"), in.size(), out.size());
    check_disjoint_or_own_block<T>("reduce_scatter", out.data(), out.size(), in.data(), in.size(),
                                   static_cast<std::size_t>(rank()) * out.size(), "out", "in");
    enqueue(describe<T>("reduce_scatter", detail::concat(count_text(out.size()), " per rank, ", reduce_op_name(op))),
            [&](ncclComm_t comm, cudaStream_t stream) {
              return ncclReduceScatter(in.data(), out.data(), out.size(), detail::data_type<T>(), detail::reduce_op(op),
                                       comm, stream);
            });
  }

  template <CommElement T>
  void reduce_scatter_v(device_span<const std::type_identity_t<T>> in, device_span<T> out,
                        std::span<const std::size_t> counts, ReduceOp op = ReduceOp::sum) {
    require_valid("reduce_scatter_v");
    detail::check_reduce_scatter_v_sizes(site("reduce_scatter_v"), in.size(), out.size(), counts);
    const std::size_t own_offset = detail::offset_of_block(counts, static_cast<std::size_t>(rank()));
    check_disjoint_or_own_block<T>("reduce_scatter_v", out.data(), out.size(), in.data(), in.size(), own_offset, "out",
                                   "in");
    enqueue(describe<T>("reduce_scatter_v",
                        detail::concat("counts ", detail::format_counts(counts), ", ", reduce_op_name(op))),
            [&](ncclComm_t comm, cudaStream_t stream) {
              std::size_t offset = 0;
              for (int p = 0; p < size(); ++p) {
                const std::size_t n = counts[static_cast<std::size_t>(p)];
                const T* block = in.data() + offset;  // in [sum(counts)]: block p at the prefix sum
                offset += n;
                if (n == 0) continue;
                ncclResult_t result = ncclReduce(block, out.data(), n, detail::data_type<T>(), detail::reduce_op(op), p,
                                                 comm, stream);
                if (result != ncclSuccess && result != ncclInProgress) return result;
              }
              return ncclSuccess;
            });
  }

  template <CommElement T>
  void broadcast(device_span<T> buffer, int root) {
    require_valid("broadcast");
    detail::check_rank_argument(site("broadcast"), root, "root");
    enqueue(describe<T>("broadcast", detail::concat(count_text(buffer.size()), ", root ", root)),
            [&](ncclComm_t comm, cudaStream_t stream) {
              return ncclBroadcast(buffer.data(), buffer.data(), buffer.size(), detail::data_type<T>(), root, comm,
                                   stream);
            });
  }

  // Completes when `peer` receives; see group() for exchanges.
  template <class T>
    requires CommElement<std::remove_const_t<T>>
  void send(device_span<T> buffer, int peer) {
    using E = std::remove_const_t<T>;
    require_valid("send");
    detail::check_rank_argument(site("send"), peer, "peer");
    enqueue(describe<E>("send", detail::concat(count_text(buffer.size()), " to rank ", peer)),
            [&](ncclComm_t comm, cudaStream_t stream) {
              return ncclSend(buffer.data(), buffer.size(), detail::data_type<E>(), peer, comm, stream);
            });
  }

  template <CommElement T>
  void recv(device_span<T> buffer, int peer) {
    require_valid("recv");
    detail::check_rank_argument(site("recv"), peer, "peer");
    enqueue(describe<T>("recv", detail::concat(count_text(buffer.size()), " from rank ", peer)),
            [&](ncclComm_t comm, cudaStream_t stream) {
              return ncclRecv(buffer.data(), buffer.size(), detail::data_type<T>(), peer, comm, stream);
            });
  }

  // Block p of `in` (send_counts[p] elements at the prefix sum) goes to rank p; block p of `out`
  // (recv_counts[p] elements) comes from rank p. `in` and `out` must not overlap.
  template <CommElement T>
  void all_to_all(device_span<const std::type_identity_t<T>> in, std::span<const std::size_t> send_counts,
                  device_span<T> out, std::span<const std::size_t> recv_counts) {
    require_valid("all_to_all");
    detail::check_all_to_all_sizes(site("all_to_all"), in.size(), send_counts, out.size(), recv_counts);
    if (overlaps(in.data(), in.size(), out.data(), out.size()))
      fail<ShapeError>(site("all_to_all").str(), ": in and out overlap; all_to_all is not in place");
    enqueue(describe<T>("all_to_all", detail::concat("send_counts ", detail::format_counts(send_counts),
                                                     ", recv_counts ", detail::format_counts(recv_counts))),
            [&](ncclComm_t comm, cudaStream_t stream) {
              std::size_t send_offset = 0, recv_offset = 0;
              for (int p = 0; p < size(); ++p) {
                const std::size_t to = send_counts[static_cast<std::size_t>(p)];
                const std::size_t from = recv_counts[static_cast<std::size_t>(p)];
                if (to > 0) {
                  ncclResult_t result = ncclSend(in.data() + send_offset, to, detail::data_type<T>(), p, comm, stream);
                  if (result != ncclSuccess && result != ncclInProgress) return result;
                }
                if (from > 0) {
                  ncclResult_t result = ncclRecv(out.data() + recv_offset, from, detail::data_type<T>(), p, comm, stream);
                  if (result != ncclSuccess && result != ncclInProgress) return result;
                }
                send_offset += to;
                recv_offset += from;
              }
              return ncclSuccess;
            });
  }

  // Dry run (a warm-up pass): while on, every operation of every group of this rank (the world and
  // its splits) checks its arguments and returns without enqueuing anything, leaving its outputs as
  // they were. One process driving several GPUs runs one training step this way before its first
  // real collective, so that every kernel, cuBLASLt algorithm and cuDNN plan the step uses is
  // loaded while no collective is in flight (loading GPU code can wait for every GPU of the
  // process). Results computed during a dry run are meaningless.
  void set_dry_run(bool on) {
    require_valid("set_dry_run");
    group_->rank_state->dry_run.store(on, std::memory_order_relaxed);
  }
  bool dry_run() const { return group_ && group_->rank_state->dry_run.load(std::memory_order_relaxed); }

  // The ranks that share this process (threads of nccl::run) have all called it when it returns:
  // a host-only barrier, with no GPU work, that a failure elsewhere ends with an AbortedError. A
  // rank alone in its process (one process per GPU) returns at once. Work that waits for every GPU
  // of the process (loading GPU code: building cuDNN plans, a library's first use) must be
  // finished on every rank before any rank enqueues its first collective, or it can wait for a
  // peer's collective that waits for this thread; call this between the two.
  void local_barrier() {
    require_valid("local_barrier");
    detail::StopSignal* shared = group_->rank_state->stop;
    if (shared == nullptr || shared->parties <= 1) return;
    std::unique_lock lock(shared->barrier_mutex);
    const std::uint64_t generation = shared->generation;
    if (++shared->arrived == shared->parties) {
      shared->arrived = 0;
      ++shared->generation;
      shared->barrier_cv.notify_all();
      return;
    }
    while (shared->generation == generation) {
      if (shared->raised.load(std::memory_order_acquire))
        throw AbortedError(::strata::detail::concat(detail::kBackend, ": rank ", group_->rank_state->world_rank,
                                  " left local_barrier because ", shared->reason));
      shared->barrier_cv.wait_for(lock, std::chrono::milliseconds(50));
    }
  }

  // Every rank of the group has reached the barrier when it returns (the host waits).
  void barrier() {
    require_valid("barrier");
    require_no_open_group("barrier");
    enqueue("barrier", [&](ncclComm_t comm, cudaStream_t stream) {
      std::int32_t* word = group_->rank_state->barrier_word;
      return ncclAllReduce(word, word, 1, ncclInt32, ncclSum, comm, stream);
    });
    synchronize();
  }

  // Waits until everything enqueued on the rank's stream has finished; throws the rank's failure
  // if there is one (before or while waiting). No timeout of its own: the watchdog bounds the
  // communication, and an abort lets the stream drain.
  void synchronize() {
    require_valid("synchronize");
    require_no_open_group("synchronize");
    detail::Group& g = *group_;
    cudaEvent_t event = nullptr;
    {
      std::lock_guard lock(g.rank_state->mutex);
      if (g.rank_state->failed.load()) detail::throw_failed(g, "synchronize");
      {
        std::lock_guard queues(g.rank_state->pending_mutex);
        if (!g.spare_events.empty()) {
          event = g.spare_events.back();
          g.spare_events.pop_back();
        }
      }
      if (event == nullptr) {
        detail::device_guard guard(g.rank_state->device);
        cudaError_t status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        if (status != cudaSuccess)
          fail<Error>(site("synchronize").str(), ": cudaEventCreateWithFlags failed: ", detail::describe_cuda(status));
      }
      cudaStream_t stream = overlapped_ && g.rank_state->comm_stream != nullptr ? g.rank_state->comm_stream : g.rank_state->stream;
      cudaError_t status = cudaEventRecord(event, stream);
      if (status != cudaSuccess) {
        (void)cudaEventDestroy(event);
        detail::fail_rank(g, "synchronize", detail::concat(site("synchronize").str(), ": cudaEventRecord failed: ",
                                                           detail::describe_cuda(status)));
      }
    }
    auto pause = std::chrono::microseconds(1);
    for (;;) {
      cudaError_t status = cudaEventQuery(event);
      if (status != cudaErrorNotReady) {
        std::lock_guard lock(g.rank_state->mutex);
        {
          std::lock_guard queues(g.rank_state->pending_mutex);
          g.spare_events.push_back(event);
        }
        if (g.rank_state->failed.load()) detail::throw_failed(g, "synchronize");
        if (status != cudaSuccess)
          detail::fail_rank(g, "synchronize", detail::concat(site("synchronize").str(), ": the rank's stream reported ",
                                                             detail::describe_cuda(status)));
        return;
      }
      if (g.rank_state->failed.load()) {
        std::lock_guard lock(g.rank_state->mutex);
        {
          std::lock_guard queues(g.rank_state->pending_mutex);
          g.spare_events.push_back(event);
        }
        detail::throw_failed(g, "synchronize");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(500));
    }
  }

  // Throws the rank's failure, if any, without waiting.
  void check() const {
    require_valid("check");
    std::lock_guard lock(group_->rank_state->mutex);
    if (group_->rank_state->failed.load()) detail::throw_failed(*group_, "check");
  }

  bool failed() const { return group_ && group_->rank_state->failed.load(); }

  // Opens a group on the calling thread (see group_guard).
  static group_guard group() { return group_guard(); }

  // Collective over this group: ranks passing the same color (>= 0) form a new group, ranked by
  // (key, rank in this group), named `new_name`; it enqueues on the same stream.
  communicator split(int color, int key, std::string new_name) {
    return split_with_policy(color, key, std::move(new_name), NCCL_CONFIG_UNDEF_INT);
  }
  // The new group is named "<this group's name>.split".
  communicator split(int color, int key) { return split(color, key, group_ ? group_->name + ".split" : std::string()); }

  // Copy-engine all-gathers (NCCL 2.28 and newer). Collective over this group: makes a second NCCL
  // communicator of the same ranks with NCCL_CTA_POLICY_ZERO and a window of at least `bytes` bytes
  // of symmetric memory on it (ncclMemAlloc, ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC).
  // From then on an all_gather issued on an overlapped() handle of this group, outside an open
  // group, copies this rank's block into the window, gathers there with NCCL's copy-engine
  // all-gather (the GPUs' copy engines move the data and no kernel runs, so the GEMMs beside it keep
  // every SM) and copies the result to `out`: the same bits as ncclAllGather. A larger all-gather
  // first grows the window, collectively (every rank gathers the same sizes); the old window stays
  // allocated until the group goes. Returns whether NCCL registered the window: false with an NCCL
  // older than 2.28 (at build or at run time) or ranks that cannot map each other's memory (no
  // symmetric memory support), and then every all-gather stays ncclAllGather's kernel.
  bool use_copy_engines_for_overlapped_gathers(std::size_t bytes) {
    const std::string operation = detail::concat("use_copy_engines_for_overlapped_gathers(", bytes, " bytes)");
    require_valid(operation);
    require_no_open_group(operation);
    if (bytes == 0) fail<ConfigError>(site(operation).str(), ": the window needs at least one byte");
    if (!copy_engines_supported()) return false;
    detail::Group& g = *group_;
    {
      std::lock_guard lock(g.rank_state->mutex);
      if (g.copy_engines != nullptr) return g.window.memory != nullptr && grow_window(g, bytes, operation);
    }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    communicator engines = split_with_policy(0, rank(), g.name + ".copy_engines", NCCL_CTA_POLICY_ZERO);
    std::lock_guard lock(g.rank_state->mutex);
    g.copy_engines = engines.group_;
    g.window_memory.owner = g.rank_state.get();
    return grow_window(g, bytes, operation);
#else
    return false;
#endif
  }
  // Whether all-gathers on this group's overlapped() handles go through the copy engines.
  bool copy_engine_gathers() const {
    if (!group_) return false;
    std::lock_guard lock(group_->rank_state->mutex);
    return group_->window.memory != nullptr;
  }

 private:
  // Whether this build and the NCCL library loaded at run time have copy-engine collectives (2.28).
  static bool copy_engines_supported() {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    int version = 0;
    return ncclGetVersion(&version) == ncclSuccess && version >= NCCL_VERSION(2, 28, 0);
#else
    return false;
#endif
  }

  // split() with a CTA policy for the new communicator (NCCL_CONFIG_UNDEF_INT: NCCL's default).
  communicator split_with_policy(int color, int key, std::string new_name, int cta_policy) {
    require_valid("split");
    require_no_open_group("split");
    if (color < 0)
      fail<ConfigError>(site("split").str(), ": color ", color, " is negative; colors are non-negative integers");
    detail::Group& g = *group_;
    const std::string operation = detail::concat("split(color ", color, ", key ", key, ", name '", new_name, "')");
    std::unique_lock lock(g.rank_state->mutex);
    if (g.rank_state->failed.load() || g.comm == nullptr) detail::throw_failed(g, operation);
    detail::device_guard guard(g.rank_state->device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    config.CTAPolicy = cta_policy;
#else
    if (cta_policy != NCCL_CONFIG_UNDEF_INT)
      fail<ConfigError>(site(operation).str(), ": a CTA policy needs NCCL 2.27 or newer (this build has ", NCCL_MAJOR, ".",
                        NCCL_MINOR, ")");
#endif
    // NCCL writes the new communicator into *slot from its own thread once the split is done
    // (until then it stays null); the parent reports progress. If we leave early the slot is
    // leaked on purpose, so a late write cannot land in freed memory.
    auto slot = std::make_unique<ncclComm_t>(nullptr);
    ncclResult_t result = ncclCommSplit(g.comm, color, key, slot.get(), &config);
    if (result != ncclSuccess && result != ncclInProgress) {
      (void)slot.release();
      detail::fail_rank(g, operation, detail::concat(g.site(operation).str(), ": ncclCommSplit returned ",
                                                     detail::describe_result(result)));
    }
    try {
      detail::wait_until_enqueued(g, operation);
    } catch (...) {
      (void)slot.release();
      throw;
    }
    ncclComm_t child = *slot;
    if (child == nullptr)
      detail::fail_rank(g, operation, detail::concat(g.site(operation).str(), ": ncclCommSplit completed without a new "
                                                     "communicator for color ", color));
    int child_rank = 0, child_size = 0;
    if (ncclCommUserRank(child, &child_rank) != ncclSuccess || ncclCommCount(child, &child_size) != ncclSuccess) {
      (void)ncclCommAbort(child);
      detail::fail_rank(g, operation,
                        detail::concat(g.site(operation).str(), ": the new communicator does not report its rank and size"));
    }
    auto ready = std::make_shared<detail::Group>(g.rank_state, child, std::move(new_name), child_rank, child_size, false);
    {
      std::lock_guard queues(g.rank_state->pending_mutex);
      std::erase_if(g.rank_state->groups, [](const std::weak_ptr<detail::Group>& w) { return w.expired(); });
      g.rank_state->groups.push_back(ready);
    }
    detail::wait_until_enqueued(*ready, operation);
    return communicator(std::move(ready));
  }

  // (mutex held) Makes g's window at least `bytes` long: a new one, allocated and registered on the
  // copy-engine group (collective), when the current one is shorter. False when NCCL did not
  // register it (no symmetric memory support between the ranks).
  static bool grow_window(detail::Group& g, std::size_t bytes, const std::string& operation) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    if (g.window.memory != nullptr && g.window.bytes >= bytes) return true;
    if (g.rank_state->failed.load() || g.copy_engines == nullptr || g.copy_engines->comm == nullptr)
      detail::throw_failed(g, operation);
    constexpr std::size_t granule = std::size_t{2} << 20;
    bytes = (bytes + granule - 1) / granule * granule;
    detail::device_guard guard(g.rank_state->device);
    void* memory = nullptr;
    ncclResult_t result = ncclMemAlloc(&memory, bytes);
    if (result != ncclSuccess || memory == nullptr)
      detail::fail_rank(g, operation, detail::concat(g.site(operation).str(), ": ncclMemAlloc of ", bytes, " bytes failed: ",
                                                     detail::describe_result(result),
                                                     "; the rank's NCCL communicators were aborted"));
    g.window_memory.blocks.push_back(memory);
    // NCCL writes the window from its own thread when the registration completes; as in split, a
    // slot we leave early is leaked on purpose.
    auto slot = std::make_unique<ncclWindow_t>(nullptr);
    result = ncclCommWindowRegister(g.copy_engines->comm, memory, bytes, slot.get(), NCCL_WIN_COLL_SYMMETRIC);
    if (result != ncclSuccess && result != ncclInProgress) {
      (void)slot.release();
      detail::fail_rank(g, operation, detail::concat(g.site(operation).str(), ": ncclCommWindowRegister returned ",
                                                     detail::describe_result(result)));
    }
    try {
      detail::wait_until_enqueued(*g.copy_engines, operation);
    } catch (...) {
      (void)slot.release();
      throw;
    }
    if (*slot == nullptr) return false;  // NCCL has no symmetric memory between these ranks
    g.window = {memory, bytes};
    return true;
#else
    (void)g, (void)bytes, (void)operation;
    return false;
#endif
  }

  // Whether an all_gather on this handle goes through the copy engines now (see
  // use_copy_engines_for_overlapped_gathers).
  bool gathers_through_window() const {
    if (!overlapped_ || group_->rank_state->dry_run.load(std::memory_order_relaxed) || detail::group_frame().depth > 0)
      return false;
    std::lock_guard lock(group_->rank_state->mutex);
    return group_->window.memory != nullptr;
  }

  // The copy-engine all-gather on the communication stream: `in` into this rank's block of the
  // window, NCCL's all-gather in place in the window, the window to `out` (this rank's block only
  // when `in` is not already it).
  template <class T>
  void all_gather_through_window(device_span<const T> in, device_span<T> out) {
    const std::string operation = describe<T>("all_gather", detail::concat(count_text(in.size()), ", copy engines"));
    detail::Group& g = *group_;
    const std::size_t n = in.size(), own = static_cast<std::size_t>(rank()) * n, total = out.size();
    if (n == 0) return;
    constexpr std::size_t size_of = sizeof(T);
    const auto copy = [&](void* to, const void* from, std::size_t elements, cudaStream_t stream) {
      const cudaError_t status = cudaMemcpyAsync(to, from, elements * size_of, cudaMemcpyDeviceToDevice, stream);
      if (status != cudaSuccess)
        detail::fail_rank(g, operation, detail::concat(g.site(operation).str(), ": cudaMemcpyAsync on the communication "
                                                       "stream failed: ", detail::describe_cuda(status)));
    };
    cudaStream_t stream = nullptr;
    T* window = nullptr;
    {
      std::lock_guard lock(g.rank_state->mutex);
      if (g.rank_state->failed.load() || g.comm == nullptr) detail::throw_failed(g, operation);
      if (!grow_window(g, total * size_of, operation))
        detail::fail_rank(g, operation, detail::concat(g.site(operation).str(), ": NCCL did not register the grown window "
                                                       "of ", total * size_of, " bytes"));
      window = static_cast<T*>(g.window.memory);
      detail::device_guard guard(g.rank_state->device);
      stream = detail::communication_stream(g, operation);
      detail::fork_from_compute(g, stream, operation);
      copy(window + own, in.data(), n, stream);
    }
    {
      group_guard frame;
      detail::frame_join(g.copy_engines, operation, stream);
      if (g.rank_state->failed.load() || g.copy_engines->comm == nullptr) detail::throw_failed(g, operation);
      const ncclResult_t result =
          ncclAllGather(window + own, window, n, detail::data_type<T>(), g.copy_engines->comm, stream);
      if (result != ncclSuccess && result != ncclInProgress)
        detail::fail_rank(g, operation, detail::concat(g.site(operation).str(), ": NCCL refused the call: ",
                                                       detail::describe_result(result)));
      frame.end();
    }
    std::lock_guard lock(g.rank_state->mutex);
    detail::device_guard guard(g.rank_state->device);
    if (own > 0) copy(out.data(), window, own, stream);
    if (own + n < total) copy(out.data() + own + n, window + own + n, total - own - n, stream);
    if (in.data() != out.data() + own) copy(out.data() + own, window + own, n, stream);
    detail::record_pending(g, operation, stream);
  }
  friend communicator detail::make_world(const ncclUniqueId&, int, int, int, Options, detail::StopSignal*);
  friend struct detail::launcher_access;

  explicit communicator(std::shared_ptr<detail::Group> group) : group_(std::move(group)) {}

  strata::detail::CommCallSite site(std::string_view operation) const {
    if (!group_) return {detail::kBackend, "(none)", 0, 0, -1, operation};
    return group_->site(operation);
  }

  void require_valid(std::string_view operation) const {
    if (!group_)
      fail<CommError>(detail::kBackend, ": ", operation,
                      " called on an empty communicator (one that was default-constructed or moved from)");
  }

  void require_no_open_group(std::string_view operation) const {
    if (detail::group_frame().depth > 0)
      fail<CommError>(site(operation).str(), ": called while a group is open on this thread; end the group first");
  }

  template <class T>
  static std::string describe(std::string_view operation, std::string_view arguments) {
    return detail::concat(operation, "<", dtype_name<T>(), ">(", arguments, ")");
  }
  static std::string count_text(std::size_t n) { return detail::concat(n, n == 1 ? " element" : " elements"); }

  template <class T>
  static bool overlaps(const T* a, std::size_t na, const T* b, std::size_t nb) {
    if (na == 0 || nb == 0) return false;
    std::less<const T*> less;
    return less(a, b + nb) && less(b, a + na);
  }

  template <class T>
  void check_disjoint_or_own_block(std::string_view operation, const T* part, std::size_t part_size, const T* whole,
                                   std::size_t whole_size, std::size_t offset, std::string_view part_name,
                                   std::string_view whole_name) const {
    if (part == whole + offset) return;
    if (overlaps<T>(part, part_size, whole, whole_size))
      fail<ShapeError>(site(operation).str(), ": ", part_name, " overlaps ", whole_name,
                       " but is not this rank's block of ", whole_name, " (the only overlap an in-place ", operation,
                       " allows)");
  }

  // Issues `issue(comm, stream)` inside a group of its own (nested in the caller's, if open).
  template <class Issue>
  void enqueue(const std::string& operation, Issue&& issue) {
    if (group_->rank_state->dry_run.load(std::memory_order_relaxed)) return;  // set_dry_run: nothing to do
    group_guard frame;
    detail::Group& g = *group_;
    cudaStream_t stream = g.rank_state->stream;
    if (overlapped_) {
      std::lock_guard lock(g.rank_state->mutex);
      if (g.rank_state->failed.load() || g.comm == nullptr) detail::throw_failed(g, operation);
      stream = detail::communication_stream(g, operation);
      detail::fork_from_compute(g, stream, operation);
    }
    detail::frame_join(group_, operation, stream);
    if (g.rank_state->failed.load() || g.comm == nullptr) detail::throw_failed(g, operation);
    const ncclResult_t result = issue(g.comm, stream);
    if (result != ncclSuccess && result != ncclInProgress)
      detail::fail_rank(g, operation, detail::concat(g.site(operation).str(), ": NCCL refused the call: ",
                                                     detail::describe_result(result)));
    frame.end();
  }

  std::shared_ptr<detail::Group> group_{};
  bool overlapped_ = false;  // operations on the rank's communication stream
};

static_assert(check_communicator<communicator>());
static_assert(std::is_same_v<communicator_space_t<communicator>, space::cuda>);

namespace detail {

// Creates the world communicator of one rank (see communicator::create); `stop`, when set by the
// thread launcher, ends the wait for the other ranks early.
inline communicator make_world(const ncclUniqueId& id, int size, int rank, int device, Options options,
                               StopSignal* stop) {
  const std::string where = concat(kBackend, ": rank ", rank, " of group '", options.name, "'");
  if (size < 1) fail<ConfigError>(where, ": the group needs at least 1 rank, got size ", size);
  if (rank < 0 || rank >= size) fail<ConfigError>(where, ": rank ", rank, " is outside [0, ", size, ")");
  int devices = 0;
  cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess)
    fail<Error>(where, ": cudaGetDeviceCount failed: ", describe_cuda(status), "; is a GPU visible to this process?");
  if (device < 0 || device >= devices)
    fail<ConfigError>(where, ": device ", device, " does not exist; this process sees ", devices,
                      " GPU(s) (check CUDA_VISIBLE_DEVICES and the local rank)");
  status = cudaSetDevice(device);
  if (status != cudaSuccess) fail<Error>(where, ": cudaSetDevice(", device, ") failed: ", describe_cuda(status));
  const std::chrono::duration<double> timeout = options.timeout ? *options.timeout : default_timeout();
  if (!(timeout.count() > 0)) fail<ConfigError>(where, ": the timeout must be positive, got ", timeout.count(), " s");

  cudaStream_t stream = options.stream;
  const bool owns_stream = stream == nullptr;
  if (owns_stream) {
    status = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (status != cudaSuccess) fail<Error>(where, ": cudaStreamCreateWithFlags failed: ", describe_cuda(status));
  }
  auto state = std::make_shared<RankState>(device, stream, owns_stream, timeout, rank, size);
  state->stop = stop;
  state->defer_destroy = stop != nullptr;  // set by nccl::run: several ranks share this process
  status = cudaMalloc(reinterpret_cast<void**>(&state->barrier_word), sizeof(std::int32_t));
  if (status == cudaSuccess) status = cudaMemset(state->barrier_word, 0, sizeof(std::int32_t));
  if (status != cudaSuccess)
    fail<Error>(where, ": could not allocate 4 bytes of device memory: ", describe_cuda(status));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress)
    fail<CommError>(where, ": ncclCommInitRankConfig returned ", describe_result(result));
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(timeout);
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    ncclResult_t state_now = ncclInProgress;
    if (comm == nullptr) fail<CommError>(where, ": ncclCommInitRankConfig returned no communicator");
    ncclResult_t queried = ncclCommGetAsyncError(comm, &state_now);
    if (queried != ncclSuccess) state_now = queried;
    if (state_now == ncclSuccess) break;
    if (state_now != ncclInProgress) {
      const std::string reason = describe_result(state_now);
      (void)ncclCommAbort(comm);
      fail<CommError>(where, " could not create its NCCL communicator: ", reason);
    }
    if (stop != nullptr && stop->raised.load(std::memory_order_acquire)) {
      (void)ncclCommAbort(comm);
      throw AbortedError(concat(where, ": creating the NCCL communicator was aborted because ", stop->reason));
    }
    if (clock::now() > deadline) {
      (void)ncclCommAbort(comm);
      fail<CommError>(where, " of size ", size, " timed out after ", timeout.count(),
                      " s creating its NCCL communicator: not every rank joined. Check that all ", size,
                      " ranks started, that they share one id (NCCL_COMM_ID or STRATA_NCCL_ID_FILE) and that rank 0's "
                      "address is reachable from every rank");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
  auto group = std::make_shared<Group>(state, comm, std::move(options.name), rank, size, true);
  {
    std::lock_guard lock(state->mutex);
    std::lock_guard queues(state->pending_mutex);
    state->groups.push_back(group);
  }
  communicator world(group);
  Watchdog::instance().watch(state);
  return world;
}

}  // namespace detail
}  // namespace nccl
STRATA_NAMESPACE_END
