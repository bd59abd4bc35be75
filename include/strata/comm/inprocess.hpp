// strata/comm/inprocess.hpp: `strata::inprocess::communicator`, ranks as threads of one process
// exchanging host memory, and the launcher `inprocess::run` that starts them.
//
// Design. Each group (the world, or one made by `split`) is a shared state with a mutex and a
// condition variable. A collective is a rendezvous in two phases:
//   1. arrive: each rank posts its call (operation, element type, sizes, buffer pointers) and
//      waits until every rank of the group has posted. The last to arrive checks that all calls
//      agree (same operation, type, sizes, root, counts) before anyone reads a peer's buffer.
//   2. depart: each rank computes its own output by reading its peers' inputs directly, then waits
//      until every rank has finished reading, so no buffer is reused or freed while a peer reads it.
// A collective may split its work into two steps with a meeting between them (every rank finishes
// step one before any rank starts step two); all_reduce on large buffers does. Per-rank counters
// keep consecutive collectives and their steps apart.
//
// Reductions. Every element is combined over the ranks in rank order 0, 1, 2, ... in
// accumulate_t<T> (bf16 / fp16 in float, rounded once at the end; integers wrap; max and min
// propagate NaN; a sum keeps the first NaN in rank order), so the result is bit-identical whatever
// the thread timing, the same on every rank, and independent of how the buffer is divided between
// ranks. The kernel is instantiated per operation (the switch on the operation sits outside the
// loops, so they vectorize) and works through the elements in blocks of a few KiB held in an
// accumulator on the stack: rank 0's input is loaded into it, each further rank's input is
// combined into it in turn, and it is divided (avg), converted and stored last. The output may
// therefore be one of the inputs.
//   - reduce_scatter, reduce_scatter_v: each rank reduces only its own block.
//   - all_reduce, large buffers: reduce-scatter then all-gather, in place. The buffer is cut into
//     one contiguous block per rank; in step one each rank reduces its block of every rank's
//     buffer into the same block of its own buffer (no other rank reads that block in step one);
//     in step two it copies every other rank's reduced block from that rank's buffer into its own
//     (no rank writes its own block in step two). Each element is reduced once, by one rank.
//   - all_reduce, buffers of at most kWholeReduceBytes: one step fewer beats dividing the work.
//     Every rank reduces the whole buffer into a scratch buffer of its own, kept by the group and
//     reused by later calls, and copies it back after phase 2.
// No reduction allocates memory once the scratch buffers have grown.
//
// send is buffered: it copies into a mailbox per (source, destination) pair and returns; recv
// takes the next message from that peer and checks its type and size.
//
// Nothing hangs silently. Every wait has a timeout (RunOptions::timeout, else the environment
// variable STRATA_COMM_TIMEOUT_SECONDS, else 300 s); a rank that throws aborts the world, waking
// every rank waiting in any group with an AbortedError naming the failed rank; a rank waiting for
// a peer whose function already returned fails at once. A group that reported an error is not
// usable afterwards. `run` rethrows the original exception of the lowest rank that failed
// first-hand; `run_collect` returns every rank's exception.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backend/cpu/backend.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "communicator.hpp"
#include "failure.hpp"

STRATA_NAMESPACE_BEGIN
namespace inprocess {

// Thrown on the ranks that did not fail themselves but were stopped because another rank failed.
struct AbortedError : CommError {
  using CommError::CommError;
};

struct RunOptions {
  // How long any rank waits for its peers before failing; unset: STRATA_COMM_TIMEOUT_SECONDS, else 300 s.
  std::optional<std::chrono::duration<double>> timeout{};
  // Name of the world group in messages.
  std::string name = "world";
};

// STRATA_COMM_TIMEOUT_SECONDS if set (a positive number of seconds), else 300 s.
inline std::chrono::duration<double> default_timeout() {
  const char* env = std::getenv("STRATA_COMM_TIMEOUT_SECONDS");
  if (env == nullptr || *env == '\0') return std::chrono::duration<double>(300.0);
  char* end = nullptr;
  double seconds = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(seconds > 0))
    fail<ConfigError>("STRATA_COMM_TIMEOUT_SECONDS must be a positive number of seconds, got '", env, "'");
  return std::chrono::duration<double>(seconds);
}

class communicator;

template <class F>
std::vector<std::exception_ptr> run_collect(int world_size, F&& fn, RunOptions options = {});

namespace detail {

using strata::detail::check_all_gather_sizes;
using strata::detail::check_all_gather_v_sizes;
using strata::detail::check_all_to_all_sizes;
using strata::detail::check_rank_argument;
using strata::detail::check_reduce_scatter_sizes;
using strata::detail::check_reduce_scatter_v_sizes;
using strata::detail::CommCallSite;
using strata::detail::concat;
using strata::detail::format_counts;
using strata::detail::offset_of_block;

inline constexpr std::string_view kBackend = "inprocess communicator";

// One rank's posted call.
struct Call {
  std::string_view operation;
  std::string_view dtype;
  std::size_t count = 0;  // the size every rank must agree on (meaning depends on the operation)
  int root = -1;
  ReduceOp op = ReduceOp::sum;
  bool reduces = false;
  const void* in = nullptr;
  void* out = nullptr;
  std::span<const std::size_t> counts{};   // all_gather_v, reduce_scatter_v; send_counts for all_to_all
  std::span<const std::size_t> counts2{};  // recv_counts for all_to_all
  int color = 0, key = 0;                  // split
  std::string name{};                      // split: the new group's name
  std::shared_ptr<struct Group> new_group{};
  int new_rank = -1;
};

struct Message {
  std::string_view dtype;
  std::size_t count = 0;
  std::vector<std::byte> bytes;
};

struct Group {
  Group(std::string group_name, std::vector<int> ranks, bool world)
      : name(std::move(group_name)),
        world_ranks(std::move(ranks)),
        is_world(world),
        arrived(world_ranks.size(), 0),
        stepped(world_ranks.size(), 0),
        departed(world_ranks.size(), 0),
        calls(world_ranks.size()),
        mailboxes(world_ranks.size() * world_ranks.size()),
        scratch(world_ranks.size()) {}

  int size() const { return static_cast<int>(world_ranks.size()); }

  const std::string name;
  const std::vector<int> world_ranks;  // group rank -> world rank
  const bool is_world;

  std::mutex mutex;
  std::condition_variable cv;
  // Guarded by mutex.
  std::vector<std::uint64_t> arrived;   // collectives each rank has entered
  std::vector<std::uint64_t> stepped;   // first steps of two-step collectives each rank has finished
  std::vector<std::uint64_t> departed;  // collectives each rank has finished
  std::vector<Call> calls;              // the call each rank posted for its current collective
  std::string error;                    // set by the last to arrive when the calls disagree
  std::vector<std::deque<Message>> mailboxes;  // [source * size + destination]
  // Not guarded: scratch[r] belongs to rank r, which alone reads and writes it, without the lock.
  std::vector<std::vector<std::byte>> scratch;
};

class World {
 public:
  World(int world_size, std::chrono::duration<double> wait_timeout)
      : size(world_size), timeout(wait_timeout), exited_(static_cast<std::size_t>(world_size)) {}

  const int size;
  const std::chrono::duration<double> timeout;
  std::atomic<bool> aborted{false};

  void add_group(const std::shared_ptr<Group>& group) {
    std::lock_guard lock(mutex_);
    std::erase_if(groups_, [](const std::weak_ptr<Group>& g) { return g.expired(); });
    groups_.push_back(group);
  }

  // Records the first failure and wakes every waiting rank. Later calls change nothing.
  void abort(int world_rank, std::string reason) {
    {
      std::lock_guard lock(mutex_);
      if (aborted.load()) return;
      failed_rank_ = world_rank;
      reason_ = std::move(reason);
      aborted.store(true);
      // The process hears of it (failure.hpp: with exit_on_failure, a rank thread that never
      // returns cannot keep the process alive).
      failure::report(world_rank >= 0 ? detail::concat("rank ", world_rank, " failed: ", reason_) : reason_);
    }
    wake_all();
  }

  void mark_exited(int world_rank) {
    exited_[static_cast<std::size_t>(world_rank)].store(true);
    wake_all();
  }
  bool exited(int world_rank) const { return exited_[static_cast<std::size_t>(world_rank)].load(); }

  std::pair<int, std::string> abort_reason() const {
    std::lock_guard lock(mutex_);
    return {failed_rank_, reason_};
  }

 private:
  void wake_all() {
    std::vector<std::shared_ptr<Group>> live;
    {
      std::lock_guard lock(mutex_);
      for (auto& weak : groups_)
        if (auto g = weak.lock()) live.push_back(std::move(g));
    }
    for (auto& g : live) {
      std::lock_guard lock(g->mutex);
      g->cv.notify_all();
    }
  }

  mutable std::mutex mutex_;
  int failed_rank_ = -1;
  std::string reason_;
  std::vector<std::weak_ptr<Group>> groups_;
  std::vector<std::atomic<bool>> exited_;
};

inline std::string describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

inline std::string describe_call(const Call& c) {
  std::string s(c.operation);
  if (!c.dtype.empty()) s += concat("<", c.dtype, ">");
  s += "(";
  if (c.operation == "split") {
    s += concat("color ", c.color, ", key ", c.key, ", name '", c.name, "'");
  } else if (c.operation == "all_gather_v" || c.operation == "reduce_scatter_v") {
    s += concat("counts ", format_counts(c.counts));
  } else if (c.operation == "all_to_all") {
    s += concat("send_counts ", format_counts(c.counts), ", recv_counts ", format_counts(c.counts2));
  } else if (c.operation != "barrier") {
    s += concat(c.count, " element", c.count == 1 ? "" : "s");
  }
  if (c.root >= 0) s += concat(", root ", c.root);
  if (c.reduces) s += concat(", ", reduce_op_name(c.op));
  return s + ")";
}

// Run by the last rank to arrive, under the group's lock: returns an empty string when every
// rank's call matches rank 0's, else a sentence saying which ranks disagree and how.
inline std::string check_calls_agree(const Group& g) {
  const Call& first = g.calls[0];
  const std::string_view order_hint = "; every rank of a group must call the same collectives in the same order";
  for (int r = 1; r < g.size(); ++r) {
    const Call& c = g.calls[static_cast<std::size_t>(r)];
    bool same = c.operation == first.operation && c.dtype == first.dtype && c.count == first.count &&
                c.root == first.root && c.reduces == first.reduces && (!c.reduces || c.op == first.op);
    if (same && (c.operation == "all_gather_v" || c.operation == "reduce_scatter_v"))
      same = std::equal(c.counts.begin(), c.counts.end(), first.counts.begin(), first.counts.end());
    if (!same)
      return concat("rank ", r, " called ", describe_call(c), " while rank 0 called ", describe_call(first),
                    order_hint);
  }
  if (first.operation == "all_to_all") {
    for (int r = 0; r < g.size(); ++r)
      for (int p = 0; p < g.size(); ++p) {
        std::size_t expects = g.calls[static_cast<std::size_t>(r)].counts2[static_cast<std::size_t>(p)];
        std::size_t sends = g.calls[static_cast<std::size_t>(p)].counts[static_cast<std::size_t>(r)];
        if (expects != sends)
          return concat("rank ", r, " expects recv_counts[", p, "] = ", expects, " elements from rank ", p,
                        ", but rank ", p, " sends it send_counts[", r, "] = ", sends);
      }
  }
  if (first.operation == "split") {
    std::map<int, const Call*> named;
    for (int r = 0; r < g.size(); ++r) {
      const Call& c = g.calls[static_cast<std::size_t>(r)];
      auto [it, inserted] = named.emplace(c.color, &c);
      if (!inserted && it->second->name != c.name)
        return concat("ranks of color ", c.color, " name their new group differently ('", it->second->name,
                      "' and '", c.name, "')");
    }
  }
  return {};
}

// Run by the last rank to arrive at a split: builds one group per color and tells each rank its
// group and new rank.
inline void build_split_groups(Group& g, World& world) {
  std::map<int, std::vector<int>> members;  // color -> old ranks
  for (int r = 0; r < g.size(); ++r) members[g.calls[static_cast<std::size_t>(r)].color].push_back(r);
  for (auto& [color, ranks] : members) {
    std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) {
      return g.calls[static_cast<std::size_t>(a)].key < g.calls[static_cast<std::size_t>(b)].key;
    });
    std::vector<int> world_ranks;
    for (int r : ranks) world_ranks.push_back(g.world_ranks[static_cast<std::size_t>(r)]);
    auto group = std::make_shared<Group>(g.calls[static_cast<std::size_t>(ranks[0])].name, std::move(world_ranks),
                                         false);
    world.add_group(group);
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      Call& c = g.calls[static_cast<std::size_t>(ranks[i])];
      c.new_group = group;
      c.new_rank = static_cast<int>(i);
    }
  }
}

template <class T>
using acc_t = accumulate_t<T>;

// all_reduce of at most this many bytes: every rank reduces the whole buffer (one step);
// larger: reduce-scatter then all-gather (two steps). See the notes at the top of this file.
inline constexpr std::size_t kWholeReduceBytes = std::size_t{64} << 10;

// a op b in the accumulate type A, where a holds the earlier ranks. Integers wrap on overflow (as
// on GPUs). max and min return b when b is NaN, so a NaN anywhere in the rank order reaches the
// result. A sum with a NaN in a is a + a (a, quieted), so the first NaN in rank order is the one
// that survives, as scalar x86 code computing a + b gives it; without this the vectorized loop,
// whose addition the compiler may commute, could return b's NaN instead (other sign or payload).
// The operand is selected before the one addition, so the loop stays free of branches.
template <ReduceOp Op, class A>
A combine(A a, A b) {
  if constexpr (Op == ReduceOp::sum || Op == ReduceOp::avg) {
    if constexpr (std::is_integral_v<A>) {
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + (a != a ? a : b);
    }
  } else if constexpr (Op == ReduceOp::max) {
    if constexpr (std::is_integral_v<A>) return b > a ? b : a;
    else return (b > a || b != b) ? b : a;
  } else {
    static_assert(Op == ReduceOp::min);
    if constexpr (std::is_integral_v<A>) return b < a ? b : a;
    else return (b < a || b != b) ? b : a;
  }
}

// out[i] = in_0[offset + i] op in_1[offset + i] op ... for i < n, where in_p is rank p's posted
// input (calls[p].in): in rank order, accumulating in acc_t<T>, divided by the number of ranks
// for avg, converted to T once. Each block of the accumulator is filled from every input before
// its elements are stored, so `out` may be one of the inputs (at the same offset).
template <ReduceOp Op, class T>
void reduce_blocks(T* out, const std::vector<Call>& calls, std::size_t offset, std::size_t n) {
  using A = acc_t<T>;
  constexpr std::size_t kBlock = 1024;
  alignas(64) A acc[kBlock];
  const std::size_t ranks = calls.size();
  auto input = [&](std::size_t p, std::size_t begin) { return static_cast<const T*>(calls[p].in) + offset + begin; };
  for (std::size_t begin = 0; begin < n; begin += kBlock) {
    const std::size_t len = std::min(kBlock, n - begin);
    const T* in0 = input(0, begin);
    for (std::size_t i = 0; i < len; ++i) acc[i] = static_cast<A>(in0[i]);
    for (std::size_t p = 1; p < ranks; ++p) {
      const T* in = input(p, begin);
      for (std::size_t i = 0; i < len; ++i) acc[i] = combine<Op>(acc[i], static_cast<A>(in[i]));
    }
    T* dst = out + begin;
    if constexpr (Op == ReduceOp::avg) {
      const A divisor = static_cast<A>(ranks);
      for (std::size_t i = 0; i < len; ++i) dst[i] = static_cast<T>(acc[i] / divisor);
    } else {
      for (std::size_t i = 0; i < len; ++i) dst[i] = static_cast<T>(acc[i]);
    }
  }
}

// reduce_blocks for a run-time operation: the one switch, outside every loop.
template <class T>
void reduce_in_rank_order(T* out, const std::vector<Call>& calls, std::size_t offset, std::size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return reduce_blocks<ReduceOp::sum>(out, calls, offset, n);
    case ReduceOp::avg: return reduce_blocks<ReduceOp::avg>(out, calls, offset, n);
    case ReduceOp::max: return reduce_blocks<ReduceOp::max>(out, calls, offset, n);
    case ReduceOp::min: return reduce_blocks<ReduceOp::min>(out, calls, offset, n);
  }
}

// Rank r's block [first, second) of an n-element all_reduce over `ranks` ranks: contiguous, in
// rank order, equal sizes rounded up to whole 64-byte lines (the last blocks may be shorter or
// empty).
template <class T>
std::pair<std::size_t, std::size_t> all_reduce_block(std::size_t n, std::size_t ranks, std::size_t r) {
  constexpr std::size_t line = std::max<std::size_t>(1, 64 / sizeof(T));
  const std::size_t per = (n / ranks + (n % ranks != 0) + line - 1) / line * line;
  return {std::min(n, r * per), std::min(n, (r + 1) * per)};
}

// True when [a, a + na) and [b, b + nb) share an element.
template <class T>
bool overlaps(const T* a, std::size_t na, const T* b, std::size_t nb) {
  if (na == 0 || nb == 0) return false;
  std::less<const T*> less;
  return less(a, b + nb) && less(b, a + na);
}

}  // namespace detail

// A handle on one group: shared state plus this thread's rank. Copies refer to the same group
// and rank; one rank's handles are used from that rank's thread only.
class communicator {
 public:
  using space = strata::space::host;       // buffers are host memory
  using default_device = cpu::backend;     // the compute backend its ranks use by default

  // An empty handle; every operation on it throws. Real ones come from run() and split().
  communicator() = default;

  bool valid() const { return group_ != nullptr; }
  int rank() const { return rank_; }
  int size() const { return group_ ? group_->size() : 0; }
  std::string_view name() const { return group_ ? std::string_view(group_->name) : std::string_view("(none)"); }
  // This rank's place in the world group, and the world's size.
  int world_rank() const { return group_ ? group_->world_ranks[static_cast<std::size_t>(rank_)] : -1; }
  int world_size() const { return world_ ? world_->size : 0; }
  // The world rank of rank `r` of this group.
  int world_rank_of(int r) const {
    require_valid("world_rank_of");
    detail::check_rank_argument(site("world_rank_of"), r, "rank");
    return group_->world_ranks[static_cast<std::size_t>(r)];
  }
  std::chrono::duration<double> timeout() const { return world_ ? world_->timeout : std::chrono::duration<double>{}; }

  template <CommElement T>
  void all_reduce(std::span<T> buffer, ReduceOp op = ReduceOp::sum) {
    require_valid("all_reduce");
    detail::Call call = make_call<T>("all_reduce");
    call.count = buffer.size();
    call.op = op;
    call.reduces = true;
    call.in = buffer.data();
    const std::size_t n = buffer.size();
    if (n * sizeof(T) <= detail::kWholeReduceBytes) {
      T* result = scratch<T>(n);
      collective(std::move(call), [&](const std::vector<detail::Call>& calls) {
        detail::reduce_in_rank_order(result, calls, 0, n, op);
      });
      copy_block<T>(result, buffer.data(), n);  // peers are done reading `buffer`
      return;
    }
    const std::size_t ranks = static_cast<std::size_t>(size());
    const std::size_t me = static_cast<std::size_t>(rank_);
    collective_in_two_steps(
        std::move(call),
        [&](const std::vector<detail::Call>& calls) {  // reduce this rank's block, in place
          const auto [first, last] = detail::all_reduce_block<T>(n, ranks, me);
          detail::reduce_in_rank_order(buffer.data() + first, calls, first, last - first, op);
        },
        [&](const std::vector<detail::Call>& calls) {  // gather the other ranks' reduced blocks
          for (std::size_t p = 0; p < ranks; ++p) {
            if (p == me) continue;
            const auto [first, last] = detail::all_reduce_block<T>(n, ranks, p);
            copy_block<T>(static_cast<const T*>(calls[p].in) + first, buffer.data() + first, last - first);
          }
        });
  }

  // `in` may be exactly this rank's block of `out`; otherwise the two must not overlap.
  template <CommElement T>
  void all_gather(std::span<const std::type_identity_t<T>> in, std::span<T> out) {
    require_valid("all_gather");
    detail::check_all_gather_sizes(site("all_gather"), in.size(), out.size());
    check_disjoint_or_own_block<T>("all_gather", in.data(), in.size(), out.data(), out.size(),
                                   static_cast<std::size_t>(rank_) * in.size(), "in", "out");
    detail::Call call = make_call<T>("all_gather");
    call.count = in.size();
    call.in = in.data();
    collective(std::move(call), [&](const std::vector<detail::Call>& calls) {
      for (std::size_t p = 0; p < calls.size(); ++p) copy_block<T>(calls[p].in, out.data() + p * in.size(), in.size());
    });
  }

  template <CommElement T>
  void all_gather_v(std::span<const std::type_identity_t<T>> in, std::span<T> out, std::span<const std::size_t> counts) {
    require_valid("all_gather_v");
    detail::check_all_gather_v_sizes(site("all_gather_v"), in.size(), out.size(), counts);
    check_disjoint_or_own_block<T>("all_gather_v", in.data(), in.size(), out.data(), out.size(),
                                   detail::offset_of_block(counts, static_cast<std::size_t>(rank_)), "in", "out");
    detail::Call call = make_call<T>("all_gather_v");
    call.counts = counts;
    call.in = in.data();
    collective(std::move(call), [&](const std::vector<detail::Call>& calls) {
      std::size_t offset = 0;
      for (std::size_t p = 0; p < calls.size(); ++p) {
        copy_block<T>(calls[p].in, out.data() + offset, counts[p]);
        offset += counts[p];
      }
    });
  }

  // `out` may be exactly this rank's block of `in`; otherwise the two must not overlap.
  template <CommElement T>
  void reduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    require_valid("reduce_scatter");
    detail::check_reduce_scatter_sizes(site("reduce_scatter"), in.size(), out.size());
    check_disjoint_or_own_block<T>("reduce_scatter", out.data(), out.size(), in.data(), in.size(),
                                   static_cast<std::size_t>(rank_) * out.size(), "out", "in");
    detail::Call call = make_call<T>("reduce_scatter");
    call.count = out.size();
    call.op = op;
    call.reduces = true;
    call.in = in.data();
    collective(std::move(call), [&](const std::vector<detail::Call>& calls) {
      detail::reduce_in_rank_order(out.data(), calls, static_cast<std::size_t>(rank_) * out.size(), out.size(), op);
    });
  }

  template <CommElement T>
  void reduce_scatter_v(std::span<const std::type_identity_t<T>> in, std::span<T> out,
                        std::span<const std::size_t> counts, ReduceOp op = ReduceOp::sum) {
    require_valid("reduce_scatter_v");
    detail::check_reduce_scatter_v_sizes(site("reduce_scatter_v"), in.size(), out.size(), counts);
    const std::size_t offset = detail::offset_of_block(counts, static_cast<std::size_t>(rank_));
    check_disjoint_or_own_block<T>("reduce_scatter_v", out.data(), out.size(), in.data(), in.size(), offset, "out",
                                   "in");
    detail::Call call = make_call<T>("reduce_scatter_v");
    call.counts = counts;
    call.op = op;
    call.reduces = true;
    call.in = in.data();
    collective(std::move(call), [&](const std::vector<detail::Call>& calls) {
      detail::reduce_in_rank_order(out.data(), calls, offset, out.size(), op);
    });
  }

  template <CommElement T>
  void broadcast(std::span<T> buffer, int root) {
    require_valid("broadcast");
    detail::check_rank_argument(site("broadcast"), root, "root");
    detail::Call call = make_call<T>("broadcast");
    call.count = buffer.size();
    call.root = root;
    call.in = buffer.data();
    collective(std::move(call), [&](const std::vector<detail::Call>& calls) {
      if (rank_ != root) copy_block<T>(calls[static_cast<std::size_t>(root)].in, buffer.data(), buffer.size());
    });
  }

  // Block p of `in` (send_counts[p] elements from the prefix sum) goes to rank p; block p of
  // `out` (recv_counts[p] elements) comes from rank p. `in` and `out` must not overlap.
  template <CommElement T>
  void all_to_all(std::span<const std::type_identity_t<T>> in, std::span<const std::size_t> send_counts,
                  std::span<T> out, std::span<const std::size_t> recv_counts) {
    require_valid("all_to_all");
    detail::check_all_to_all_sizes(site("all_to_all"), in.size(), send_counts, out.size(), recv_counts);
    if (detail::overlaps<T>(in.data(), in.size(), out.data(), out.size()))
      fail<ShapeError>(site("all_to_all").str(), ": in and out overlap; all_to_all is not in place");
    detail::Call call = make_call<T>("all_to_all");
    call.counts = send_counts;
    call.counts2 = recv_counts;
    call.in = in.data();
    collective(std::move(call), [&](const std::vector<detail::Call>& calls) {
      std::size_t offset = 0;
      for (std::size_t p = 0; p < calls.size(); ++p) {
        const T* source = static_cast<const T*>(calls[p].in) +
                          detail::offset_of_block(calls[p].counts, static_cast<std::size_t>(rank_));
        copy_block<T>(source, out.data() + offset, recv_counts[p]);
        offset += recv_counts[p];
      }
    });
  }

  void barrier() {
    require_valid("barrier");
    collective(make_call<void>("barrier"), [](const std::vector<detail::Call>&) {});
  }

  // Buffered: copies `buffer` into the mailbox for `peer` and returns.
  template <class T>
    requires CommElement<std::remove_const_t<T>>
  void send(std::span<T> buffer, int peer) {
    using E = std::remove_const_t<T>;
    require_valid("send");
    detail::check_rank_argument(site("send"), peer, "peer");
    detail::Message message{dtype_name<E>(), buffer.size(), std::vector<std::byte>(buffer.size_bytes())};
    if (!buffer.empty()) std::memcpy(message.bytes.data(), buffer.data(), buffer.size_bytes());
    std::unique_lock lock(group_->mutex);
    if (world_->aborted.load()) throw_aborted(lock, "send");
    group_->mailboxes[mailbox(rank_, peer)].push_back(std::move(message));
    group_->cv.notify_all();
  }

  // Waits for the next message from `peer`; its type and size must match `buffer`.
  template <CommElement T>
  void recv(std::span<T> buffer, int peer) {
    require_valid("recv");
    detail::check_rank_argument(site("recv"), peer, "peer");
    std::unique_lock lock(group_->mutex);
    auto& queue = group_->mailboxes[mailbox(peer, rank_)];
    wait_until_done(
        lock, "recv", [&] { return queue.empty() ? std::vector<int>{peer} : std::vector<int>{}; },
        [&](const std::vector<int>&) { return detail::concat("waiting for a message from rank ", peer); });
    detail::Message message = std::move(queue.front());
    queue.pop_front();
    if (message.dtype != dtype_name<T>() || message.count != buffer.size())
      fail_group(lock, detail::concat(site("recv").str(), ": rank ", peer, " sent ", message.count, " ", message.dtype,
                              " elements but this recv expects ", buffer.size(), " ", dtype_name<T>(),
                              " elements; sends and recvs between two ranks must match in order, type and size"));
    lock.unlock();
    if (!buffer.empty()) std::memcpy(buffer.data(), message.bytes.data(), buffer.size_bytes());
  }

  // Collective over this group: ranks passing the same color form a new group, ranked by
  // (key, rank in this group). The new group is named `name` (equal on all its members).
  communicator split(int color, int key, std::string new_name) {
    require_valid("split");
    detail::Call call = make_call<void>("split");
    call.color = color;
    call.key = key;
    call.name = std::move(new_name);
    std::shared_ptr<detail::Group> group;
    int new_rank = -1;
    collective(
        std::move(call),
        [&](const std::vector<detail::Call>& calls) {
          group = calls[static_cast<std::size_t>(rank_)].new_group;
          new_rank = calls[static_cast<std::size_t>(rank_)].new_rank;
        },
        [this](detail::Group& g) { detail::build_split_groups(g, *world_); });
    return communicator(world_, std::move(group), new_rank);
  }
  // The new group is named "<this group's name>.split".
  communicator split(int color, int key) { return split(color, key, group_ ? group_->name + ".split" : std::string()); }

 private:
  template <class F>
  friend std::vector<std::exception_ptr> run_collect(int, F&&, RunOptions);

  communicator(std::shared_ptr<detail::World> world, std::shared_ptr<detail::Group> group, int rank)
      : world_(std::move(world)), group_(std::move(group)), rank_(rank) {}

  detail::CommCallSite site(std::string_view operation) const {
    return {detail::kBackend, name(), rank_, size(), group_ && !group_->is_world ? world_rank() : -1, operation};
  }

  void require_valid(std::string_view operation) const {
    if (!group_)
      fail<CommError>(detail::kBackend, ": ", operation,
                      " called on an empty communicator (one that was default-constructed or moved from)");
  }

  template <class T>
  static detail::Call make_call(std::string_view operation) {
    detail::Call call;
    call.operation = operation;
    if constexpr (!std::is_void_v<T>) call.dtype = dtype_name<T>();
    return call;
  }

  std::size_t mailbox(int source, int destination) const {
    return static_cast<std::size_t>(source) * static_cast<std::size_t>(size()) + static_cast<std::size_t>(destination);
  }

  // This rank's scratch buffer, grown to at least n elements of T (contents unspecified).
  template <class T>
  T* scratch(std::size_t n) {
    std::vector<std::byte>& bytes = group_->scratch[static_cast<std::size_t>(rank_)];
    if (bytes.size() < n * sizeof(T)) bytes.resize(n * sizeof(T));
    return reinterpret_cast<T*>(bytes.data());  // operator new aligns for every CommElement
  }

  template <class T>
  static void copy_block(const void* source, T* destination, std::size_t n) {
    if (n != 0 && source != destination) std::memcpy(destination, source, n * sizeof(T));
  }

  // [part, part + part_size) must be exactly [whole + offset, ...) or not overlap the whole at all.
  template <class T>
  void check_disjoint_or_own_block(std::string_view operation, const T* part, std::size_t part_size, const T* whole,
                                   std::size_t whole_size, std::size_t offset, std::string_view part_name,
                                   std::string_view whole_name) const {
    if (part == whole + offset) return;
    if (detail::overlaps<T>(part, part_size, whole, whole_size))
      fail<ShapeError>(site(operation).str(), ": ", part_name, " overlaps ", whole_name, " but is not this rank's block of ",
                       whole_name, " (the only overlap an in-place ", operation, " allows)");
  }

  // Leaves the group unusable: aborts the world (so every waiting rank wakes) and throws.
  [[noreturn]] void fail_group(std::unique_lock<std::mutex>& lock, std::string message) const {
    if (lock.owns_lock()) lock.unlock();
    world_->abort(world_rank(), message);
    throw CommError(message);
  }

  [[noreturn]] void throw_aborted(std::unique_lock<std::mutex>& lock, std::string_view operation) const {
    if (lock.owns_lock()) lock.unlock();
    auto [failed, reason] = world_->abort_reason();
    throw AbortedError(detail::concat(site(operation).str(), ": aborted because world rank ", failed, " failed: ", reason));
  }

  // Waits, holding `lock`, until `missing()` (the group ranks still awaited) is empty. Throws on
  // abort, on timeout, and when an awaited rank's function has already returned.
  template <class Missing, class Describe>
  void wait_until_done(std::unique_lock<std::mutex>& lock, std::string_view operation, Missing missing,
                       Describe describe) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(world_->timeout);
    bool timed_out = false;
    for (;;) {
      if (world_->aborted.load()) throw_aborted(lock, operation);
      std::vector<int> awaited = missing();
      if (awaited.empty()) return;
      for (int r : awaited)
        if (world_->exited(group_->world_ranks[static_cast<std::size_t>(r)]))
          fail_group(lock, detail::concat(site(operation).str(), ": rank ", r,
                                  " has already returned from its function, so it will never take part (",
                                  describe(awaited), ")"));
      if (timed_out)
        fail_group(lock, detail::concat(detail::kBackend, ": rank ", rank_, " of group '", name(), "'",
                                group_->is_world ? std::string() : detail::concat(" (world rank ", world_rank(), ")"),
                                " timed out after ", world_->timeout.count(), " s in ", operation, " ",
                                describe(awaited)));
      timed_out = group_->cv.wait_until(lock, deadline) == std::cv_status::timeout;
    }
  }

  static std::string list_ranks(const std::vector<int>& ranks) {
    std::string s = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
    return s;
  }

  // Waits until every rank's entry of `counter` (one of the group's per-rank counters) has reached
  // `target`, this rank's own entry having just been set to it; the last rank to get there wakes
  // the others. `what` ends the timeout message after the list of awaited ranks.
  void wait_for_all(std::unique_lock<std::mutex>& lock, std::string_view operation,
                    const std::vector<std::uint64_t>& counter, std::uint64_t target, std::string_view what) {
    auto missing = [&] {
      std::vector<int> awaited;
      for (int r = 0; r < group_->size(); ++r)
        if (counter[static_cast<std::size_t>(r)] < target) awaited.push_back(r);
      return awaited;
    };
    if (missing().empty()) {
      group_->cv.notify_all();
    } else {
      wait_until_done(lock, operation, missing, [what](const std::vector<int>& awaited) {
        return detail::concat("waiting for ", list_ranks(awaited), what);
      });
    }
  }

  // The two-phase rendezvous described at the top of this file. `compute` reads the peers' calls
  // (and through them their buffers) and writes this rank's own output; `on_complete` runs once,
  // under the lock, on the last rank to arrive, after the calls were found to agree.
  template <class Compute, class OnComplete = void (*)(detail::Group&)>
  void collective(detail::Call call, Compute&& compute, OnComplete on_complete = [](detail::Group&) {}) {
    rendezvous(std::move(call), on_complete, compute, nullptr);
  }

  // The same with phase 2 in two steps: every rank finishes `first` before any rank starts `second`.
  template <class First, class Second>
  void collective_in_two_steps(detail::Call call, First&& first, Second&& second) {
    rendezvous(std::move(call), [](detail::Group&) {}, first, second);
  }

  // `second` is nullptr for a collective of one step.
  template <class OnComplete, class First, class Second>
  void rendezvous(detail::Call call, OnComplete on_complete, First&& first, Second&& second) {
    detail::Group& g = *group_;
    const std::string_view operation = call.operation;
    const std::size_t me = static_cast<std::size_t>(rank_);
    std::unique_lock lock(g.mutex);
    if (world_->aborted.load()) throw_aborted(lock, operation);
    if (!g.error.empty()) fail_group(lock, detail::concat(site(operation).str(), ": the group already failed: ", g.error));

    const std::uint64_t generation = g.arrived[me] + 1;
    g.calls[me] = std::move(call);
    g.arrived[me] = generation;
    auto not_arrived = [&] {
      std::vector<int> awaited;
      for (int r = 0; r < g.size(); ++r)
        if (g.arrived[static_cast<std::size_t>(r)] < generation) awaited.push_back(r);
      return awaited;
    };
    if (not_arrived().empty()) {
      g.error = detail::check_calls_agree(g);
      if (g.error.empty()) on_complete(g);
      g.cv.notify_all();
    } else {
      wait_until_done(lock, operation, not_arrived,
                      [](const std::vector<int>& awaited) { return detail::concat("waiting for ", list_ranks(awaited)); });
    }
    if (!g.error.empty()) fail_group(lock, detail::concat(site(operation).str(), ": ", g.error));
    lock.unlock();

    first(std::as_const(g.calls));

    if constexpr (!std::is_null_pointer_v<std::remove_cvref_t<Second>>) {
      // All ranks run the same collectives in the same order (checked on arrival), so the number
      // of first steps each has finished identifies this one.
      lock.lock();
      const std::uint64_t step = g.stepped[me] + 1;
      g.stepped[me] = step;
      wait_for_all(lock, operation, g.stepped, step, " to finish the first step");
      lock.unlock();

      second(std::as_const(g.calls));
    }

    lock.lock();
    g.departed[me] = generation;
    wait_for_all(lock, operation, g.departed, generation, " to finish reading");
  }

  std::shared_ptr<detail::World> world_{};
  std::shared_ptr<detail::Group> group_{};
  int rank_ = 0;
};

static_assert(check_communicator<communicator>());

// Runs fn(communicator& world) on `world_size` threads and waits for all of them. Returns, per
// world rank, the exception its function ended with (null when it returned normally). The first
// rank to throw aborts the world, so the others stop at their next wait instead of hanging.
template <class F>
std::vector<std::exception_ptr> run_collect(int world_size, F&& fn, RunOptions options) {
  if (world_size < 1) fail<ConfigError>("inprocess::run needs a world size of at least 1, got ", world_size);
  const std::chrono::duration<double> timeout = options.timeout ? *options.timeout : default_timeout();
  if (!(timeout.count() > 0))
    fail<ConfigError>("inprocess::run needs a positive timeout, got ", timeout.count(), " s");
  auto world = std::make_shared<detail::World>(world_size, timeout);
  std::vector<int> ranks(static_cast<std::size_t>(world_size));
  std::iota(ranks.begin(), ranks.end(), 0);
  auto group = std::make_shared<detail::Group>(options.name, std::move(ranks), true);
  world->add_group(group);

  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world_size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  auto body = [&](int r) {
    communicator comm(world, group, r);
    try {
      std::invoke(fn, comm);
    } catch (...) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
      world->abort(r, detail::describe_exception(errors[static_cast<std::size_t>(r)]));
    }
    world->mark_exited(r);
  };
  try {
    for (int r = 0; r < world_size; ++r) threads.emplace_back(body, r);
  } catch (...) {
    world->abort(-1, "the launcher could not start a thread for every rank");
    for (auto& t : threads) t.join();
    throw;
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Runs fn(communicator& world) on `world_size` threads. If any rank threw, rethrows the original
// exception of the lowest rank that failed first-hand (not an AbortedError caused by another rank).
template <class F>
void run(int world_size, F&& fn, RunOptions options = {}) {
  std::vector<std::exception_ptr> errors = run_collect(world_size, std::forward<F>(fn), std::move(options));
  strata::detail::rethrow_first_hand_failure<AbortedError>(errors);
}

// Like run, and returns each world rank's result: fn(communicator&) -> R. R defaults to fn's
// return type.
template <class R = void, class F>
auto run_and_collect(int world_size, F&& fn, RunOptions options = {}) {
  using Result = std::conditional_t<std::is_void_v<R>, std::invoke_result_t<F&, communicator&>, R>;
  static_assert(!std::is_void_v<Result>, "run_and_collect needs a function that returns a value; use run otherwise.");
  std::vector<std::optional<Result>> slots(static_cast<std::size_t>(std::max(world_size, 0)));
  run(
      world_size, [&](communicator& comm) { slots[static_cast<std::size_t>(comm.world_rank())].emplace(std::invoke(fn, comm)); },
      std::move(options));
  std::vector<Result> results;
  results.reserve(slots.size());
  for (auto& s : slots) results.push_back(std::move(*s));
  return results;
}

}  // namespace inprocess
STRATA_NAMESPACE_END
