// strata/comm/communicator.hpp: the `Communicator` concept every communication backend models.
//
// A communicator is a cheap, copyable handle on one process group (the world, or a tp / dp / pp
// ... group made by `split`). It names the memory space its buffers live in (`using space`) and
// the backend its operations are ordered with (`using default_device`); buffers are typed spans of
// that space, `span_t<T, typename C::space>` (std::span on the host, device_span on a GPU); the
// element type is known at compile time and is one of `CommElement` (float, double, bf16, fp16,
// int32, int64, and uint8 for FP8 codes, which are gathered but never reduced).
//
//   all_reduce(buffer, op)                          in place; every rank gets op over all ranks
//   all_gather(in, out)                             out = in_0 | in_1 | ... (rank-major), |out| = |in| * size
//   all_gather_v(in, out, counts)                   same with |in_r| = counts[r], |out| = sum(counts)
//   reduce_scatter(in, out, op)                     |in| = |out| * size; rank r gets op over block r
//   reduce_scatter_v(in, out, counts, op)           block r of `in` has counts[r] elements
//   broadcast(buffer, root)                         root's buffer copied to every rank
//   send(buffer, peer) / recv(buffer, peer)         point to point; peer is a rank of this group
//   all_to_all(in, send_counts, out, recv_counts)   block p of `in` (at the prefix sum of send_counts)
//                                                   goes to rank p; block p of `out` comes from rank p
//   barrier()
//   split(color, key), split(color, key, name)      collective; ranks with equal color form a new
//                                                   group ordered by (key, old rank), as MPI_Comm_split
//
// Every rank of a group calls the same collectives in the same order with matching sizes. Errors
// (wrong sizes, disagreeing ranks, timeouts, a failed peer) are exceptions that name the backend,
// the group, the rank and the operation: ShapeError for a rank's own buffers that do not fit,
// CommError for everything that involves the other ranks.
//
// Layers check their communicator policy with `static_assert(strata::check_communicator<C>())`,
// which reports each missing requirement with a sentence naming it.
#pragma once

#include <concepts>
#include <vector>
#include <exception>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/space.hpp"

STRATA_NAMESPACE_BEGIN

enum class ReduceOp { sum, max, min, avg };

constexpr std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::avg: return "avg";
  }
  return "unknown";
}

// The element types a communicator moves and reduces (uint8: FP8 codes, moved, never reduced).
template <class T>
concept CommElement = Element<T> || std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
                      std::is_same_v<T, std::uint8_t>;

namespace detail {

template <class C>
struct communicator_space {
  using type = space::host;
};
template <class C>
  requires requires { typename C::space; }
struct communicator_space<C> {
  using type = typename C::space;
};

}  // namespace detail

// The memory space a communicator's buffers live in: `C::space` where C names one, else host.
// Buffers are `comm_span_t<T, C>`: std::span<T> for host communicators, device_span<T> for space::cuda.
template <class C>
using communicator_space_t = typename detail::communicator_space<C>::type;
template <class T, class C>
using comm_span_t = span_t<T, communicator_space_t<C>>;

namespace detail {

template <class C>
concept communicator_has_space = requires { typename C::space; } && space::is_space_v<typename C::space>;

template <class C>
concept communicator_has_group_queries = requires(const C& c) {
  { c.rank() } -> std::same_as<int>;
  { c.size() } -> std::same_as<int>;
  { c.name() } -> std::convertible_to<std::string_view>;
};

template <class C, class T>
concept communicator_has_all_reduce = requires(C& c, comm_span_t<T, C> buffer, ReduceOp op) { c.all_reduce(buffer, op); };

template <class C, class T>
concept communicator_has_all_gather = requires(C& c, comm_span_t<const T, C> in, comm_span_t<T, C> out,
                                               std::span<const std::size_t> counts) {
  c.all_gather(in, out);
  c.all_gather_v(in, out, counts);
};

template <class C, class T>
concept communicator_has_reduce_scatter = requires(C& c, comm_span_t<const T, C> in, comm_span_t<T, C> out,
                                                   std::span<const std::size_t> counts, ReduceOp op) {
  c.reduce_scatter(in, out, op);
  c.reduce_scatter_v(in, out, counts, op);
};

template <class C, class T>
concept communicator_has_broadcast = requires(C& c, comm_span_t<T, C> buffer, int root) { c.broadcast(buffer, root); };

template <class C, class T>
concept communicator_has_point_to_point = requires(C& c, comm_span_t<const T, C> in, comm_span_t<T, C> out, int peer) {
  c.send(in, peer);
  c.recv(out, peer);
};

template <class C, class T>
concept communicator_has_all_to_all = requires(C& c, comm_span_t<const T, C> in, comm_span_t<T, C> out,
                                               std::span<const std::size_t> counts) {
  c.all_to_all(in, counts, out, counts);
};

template <class C>
concept communicator_has_barrier_and_split = requires(C& c, int color, int key, std::string name) {
  c.barrier();
  { c.split(color, key) } -> std::same_as<C>;
  { c.split(color, key, name) } -> std::same_as<C>;
};

template <class C, class T>
concept communicator_moves = communicator_has_space<C> && communicator_has_all_reduce<C, T> && communicator_has_all_gather<C, T> &&
                             communicator_has_reduce_scatter<C, T> && communicator_has_broadcast<C, T> &&
                             communicator_has_point_to_point<C, T> && communicator_has_all_to_all<C, T>;

}  // namespace detail

// C is a handle on one process group. The concept checks float and double; backends provide the
// same operations for every CommElement. Buffers are spans of C's memory space (`C::space`, which every
// communicator names); counts are always host spans.
template <class C>
concept Communicator = std::copy_constructible<C> && std::is_move_assignable_v<C> && detail::communicator_has_space<C> &&
                       detail::communicator_has_group_queries<C> && detail::communicator_has_barrier_and_split<C> &&
                       detail::communicator_moves<C, float> && detail::communicator_moves<C, double>;

template <class C>
inline constexpr bool is_communicator_v = Communicator<C>;

// `static_assert(check_communicator<C>())`: each requirement C lacks fails its own static_assert,
// whose message names it, before the compiler's own error about a missing member.
template <class C>
consteval bool check_communicator() {
  static_assert(std::copy_constructible<C> && std::is_move_assignable_v<C>,
                "The type does not model strata::Communicator: a communicator is a cheap handle that must be "
                "copyable and movable.");
  static_assert(detail::communicator_has_space<C>,
                "The type does not model strata::Communicator: it lacks `using space = strata::space::host` (or "
                "space::cuda), the memory space of the buffers it moves.");
  static_assert(detail::communicator_has_group_queries<C>,
                "The type does not model strata::Communicator: it lacks `int rank() const`, `int size() const` "
                "or `std::string_view name() const`.");
  static_assert(detail::communicator_has_all_reduce<C, float> && detail::communicator_has_all_reduce<C, double>,
                "The type does not model strata::Communicator: it lacks all_reduce(span_t<T, space>, ReduceOp) for "
                "T = float or double.");
  static_assert(detail::communicator_has_all_gather<C, float> && detail::communicator_has_all_gather<C, double>,
                "The type does not model strata::Communicator: it lacks all_gather(span_t<const T, space>, span_t<T, space>) "
                "or all_gather_v(span_t<const T, space>, span_t<T, space>, std::span<const std::size_t>) for T = float or "
                "double.");
  static_assert(detail::communicator_has_reduce_scatter<C, float> && detail::communicator_has_reduce_scatter<C, double>,
                "The type does not model strata::Communicator: it lacks reduce_scatter(span_t<const T, space>, "
                "span_t<T, space>, ReduceOp) or reduce_scatter_v(span_t<const T, space>, span_t<T, space>, "
                "std::span<const std::size_t>, ReduceOp) for T = float or double.");
  static_assert(detail::communicator_has_broadcast<C, float> && detail::communicator_has_broadcast<C, double>,
                "The type does not model strata::Communicator: it lacks broadcast(span_t<T, space>, int root) for "
                "T = float or double.");
  static_assert(detail::communicator_has_point_to_point<C, float> && detail::communicator_has_point_to_point<C, double>,
                "The type does not model strata::Communicator: it lacks send(span_t<const T, space>, int peer) or "
                "recv(span_t<T, space>, int peer) for T = float or double.");
  static_assert(detail::communicator_has_all_to_all<C, float> && detail::communicator_has_all_to_all<C, double>,
                "The type does not model strata::Communicator: it lacks all_to_all(span_t<const T, space>, "
                "std::span<const std::size_t>, span_t<T, space>, std::span<const std::size_t>) for T = float or double.");
  static_assert(detail::communicator_has_barrier_and_split<C>,
                "The type does not model strata::Communicator: it lacks barrier(), `C split(int color, int key)` "
                "or `C split(int color, int key, std::string name)` returning the same communicator type.");
  return Communicator<C>;
}

// A batch of point-to-point calls that must be issued together. NCCL's send completes only when
// the peer receives, so two ranks that exchange messages (or one that posts several) open a batch
// first; a buffered communicator (in-process) needs none. Code written for every communicator:
//   auto batch = strata::batch_point_to_point(comm);
//   comm.send(a, next); comm.recv(b, previous);
//   batch.end();
struct unbatched {
  void end() {}
};
template <class C>
concept has_group_batch = requires(C& c) { c.group(); };  // namespace scope: nvcc reads a requires-expression
                                                          // naming a function parameter as false
template <class C>
auto batch_point_to_point(C& comm) {
  if constexpr (has_group_batch<C>) return comm.group();
  else return unbatched{};
}

// Communication beside compute. A backend whose operations can run concurrently with the rank's
// compute (NCCL: on a second, communication stream) gives
//   c.overlapped()        a handle on the same group whose operations run on the communication
//                         stream, each after everything enqueued on the compute stream before it
//                         was issued (so it reads finished inputs) and concurrently with what the
//                         compute stream does next;
//   c.join_overlapped()   work enqueued on the compute stream from now on runs after every
//                         overlapped operation issued so far;
//   c.overlapped_mark()   (optional) a point in the overlapped operations issued so far, and
//   c.join_overlapped(m)  work enqueued on the compute stream from now on runs after every
//                         overlapped operation issued before mark m (and perhaps after a few
//                         more: a backend may reuse a mark's slot for a later one), so a consumer
//                         waits for exactly the operations whose outputs it reads.
// Code written for every communicator uses the free functions below: on a communicator whose
// operations are done when they return (in-process) the handle is the same one and join does
// nothing. Between an overlapped operation and the join, the compute stream must neither write
// the operation's buffers nor read its outputs.
namespace detail {
template <class C>
concept communicator_overlaps = requires(const C& c, C& m) {
  { c.overlapped() } -> std::same_as<C>;
  m.join_overlapped();
};
template <class C>
concept communicator_marks = requires(C& m, std::uint64_t mark) {
  { m.overlapped_mark() } -> std::same_as<std::uint64_t>;
  m.join_overlapped(mark);
};
}  // namespace detail

template <class C>
C overlapped_handle(const C& comm) {
  if constexpr (detail::communicator_overlaps<C>) return comm.overlapped();
  else return comm;
}
template <class C>
void join_overlapped(C& comm) {
  if constexpr (detail::communicator_overlaps<C>) comm.join_overlapped();
}
// The mark of the overlapped operations issued so far (0 where they are done when they return),
// and the join up to one: a backend that overlaps without marks joins everything.
template <class C>
std::uint64_t overlapped_mark(C& comm) {
  if constexpr (detail::communicator_marks<C>) return comm.overlapped_mark();
  else return 0;
}
template <class C>
void join_overlapped(C& comm, std::uint64_t mark) {
  if constexpr (detail::communicator_marks<C>) comm.join_overlapped(mark);
  else join_overlapped(comm);
}
// Collective over comm's group: from now on its overlapped handles' all-gathers are moved by the
// GPUs' copy engines, through a window of at least `bytes` bytes, where the backend can
// (nccl::communicator::use_copy_engines_for_overlapped_gathers). Returns whether it can; a
// communicator without copy engines (in-process) returns false and gathers as before.
template <class C>
bool use_copy_engines_for_overlapped_gathers(C& comm, std::size_t bytes) {
  if constexpr (requires { { comm.use_copy_engines_for_overlapped_gathers(bytes) } -> std::same_as<bool>; })
    return comm.use_copy_engines_for_overlapped_gathers(bytes);
  else return false;
}

// Size checks shared by the backends. Each throws ShapeError (or CommError for a bad peer or
// root) whose message starts with the call site, e.g.
//   "inprocess communicator: rank 1 of group 'tp' (world rank 3) in all_gather: ..."
namespace detail {

struct CommCallSite {
  std::string_view backend;  // "inprocess communicator"
  std::string_view group;
  int rank = 0;
  int size = 1;
  int world_rank = -1;  // shown when >= 0
  std::string_view operation;

  std::string str() const {
    std::string s = concat(backend, ": rank ", rank, " of group '", group, "'");
    if (world_rank >= 0) s += concat(" (world rank ", world_rank, ")");
    return s + concat(" in ", operation);
  }
};

inline std::size_t sum_of_counts(std::span<const std::size_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

// Offset of block `index` when blocks have sizes `counts` (the exclusive prefix sum).
inline std::size_t offset_of_block(std::span<const std::size_t> counts, std::size_t index) {
  return std::accumulate(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(index), std::size_t{0});
}

inline std::string format_counts(std::span<const std::size_t> counts) {
  std::string s = "[";
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (i == 16) {
      s += ", ...";
      break;
    }
    s += (i ? ", " : "") + std::to_string(counts[i]);
  }
  return s + "]";
}

inline void check_rank_argument(const CommCallSite& site, int value, std::string_view what) {
  if (value < 0 || value >= site.size)
    fail<CommError>(site.str(), ": ", what, " ", value, " is not a rank of group '", site.group, "', which has ",
                    site.size, " rank", site.size == 1 ? "" : "s");
}

inline void check_counts_length(const CommCallSite& site, std::span<const std::size_t> counts, std::string_view what) {
  if (counts.size() != static_cast<std::size_t>(site.size))
    fail<ShapeError>(site.str(), ": ", what, " has ", counts.size(), " entries but the group has ", site.size,
                     " ranks (one count per rank)");
}

inline void check_all_gather_sizes(const CommCallSite& site, std::size_t in, std::size_t out) {
  if (out != in * static_cast<std::size_t>(site.size))
    fail<ShapeError>(site.str(), ": out has ", out, " elements but must have in.size() * size() = ", in, " * ",
                     site.size, " = ", in * static_cast<std::size_t>(site.size));
}

inline void check_all_gather_v_sizes(const CommCallSite& site, std::size_t in, std::size_t out,
                                     std::span<const std::size_t> counts) {
  check_counts_length(site, counts, "counts");
  if (in != counts[static_cast<std::size_t>(site.rank)])
    fail<ShapeError>(site.str(), ": in has ", in, " elements but counts[", site.rank, "] = ",
                     counts[static_cast<std::size_t>(site.rank)]);
  if (out != sum_of_counts(counts))
    fail<ShapeError>(site.str(), ": out has ", out, " elements but the counts ", format_counts(counts), " sum to ",
                     sum_of_counts(counts));
}

inline void check_reduce_scatter_sizes(const CommCallSite& site, std::size_t in, std::size_t out) {
  if (in != out * static_cast<std::size_t>(site.size))
    fail<ShapeError>(site.str(), ": in has ", in, " elements but must have out.size() * size() = ", out, " * ",
                     site.size, " = ", out * static_cast<std::size_t>(site.size));
}

inline void check_reduce_scatter_v_sizes(const CommCallSite& site, std::size_t in, std::size_t out,
                                         std::span<const std::size_t> counts) {
  check_counts_length(site, counts, "counts");
  if (in != sum_of_counts(counts))
    fail<ShapeError>(site.str(), ": in has ", in, " elements but the counts ", format_counts(counts), " sum to ",
                     sum_of_counts(counts));
  if (out != counts[static_cast<std::size_t>(site.rank)])
    fail<ShapeError>(site.str(), ": out has ", out, " elements but counts[", site.rank, "] = ",
                     counts[static_cast<std::size_t>(site.rank)]);
}

inline void check_all_to_all_sizes(const CommCallSite& site, std::size_t in, std::span<const std::size_t> send_counts,
                                   std::size_t out, std::span<const std::size_t> recv_counts) {
  check_counts_length(site, send_counts, "send_counts");
  check_counts_length(site, recv_counts, "recv_counts");
  if (in != sum_of_counts(send_counts))
    fail<ShapeError>(site.str(), ": in has ", in, " elements but send_counts ", format_counts(send_counts),
                     " sum to ", sum_of_counts(send_counts));
  if (out != sum_of_counts(recv_counts))
    fail<ShapeError>(site.str(), ": out has ", out, " elements but recv_counts ", format_counts(recv_counts),
                     " sum to ", sum_of_counts(recv_counts));
}

}  // namespace detail

namespace detail {

// What a thread launcher (inprocess::run, nccl::run) rethrows from the ranks' exceptions: the
// original exception of the lowest rank that failed first-hand, skipping `Aborted` errors (ranks
// stopped because another rank failed), else the first exception at all. Returns if none threw.
template <class Aborted>
void rethrow_first_hand_failure(const std::vector<std::exception_ptr>& errors) {
  for (const auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const Aborted&) {
    } catch (...) {
      throw;
    }
  }
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace detail

STRATA_NAMESPACE_END
