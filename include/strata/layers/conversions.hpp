// strata/layers/conversions.hpp: the layout conversions on the tensor-parallel group: Megatron's
// f and g operators and their sequence-parallel and gather/scatter cousins, as typed functions.
//
//   conversion                          forward                          backward
//   copy_to_tensor_parallel       (f)   replicated -> replicated (id)    partial -> replicated (all-reduce)
//   reduce_from_tensor_parallel   (g)   partial -> replicated (all-red.) replicated -> replicated (id)
//   scatter_to_tensor_parallel          replicated -> sharded<-1>        sharded<-1> -> replicated (all-gather)
//   gather_from_tensor_parallel         sharded<-1> -> replicated        replicated -> sharded<-1> (slice)
//   scatter_to_sequence_parallel        replicated -> sharded<0>         sharded<0> -> replicated (all-gather)
//   gather_from_sequence_parallel       sharded<0> -> replicated         partial -> sharded<0> (reduce-scatter)
//                                                                        or replicated -> sharded<0> (slice)
//   reduce_scatter_to_sequence_parallel partial -> sharded<0>            sharded<0> -> replicated (all-gather)
//
// Tensors are [seq, batch, hidden] row-major, so sequence slices are contiguous row blocks (a
// backend copy) and hidden slices are backend slice_columns / unstack_columns. Every function takes
// the rank's backend object and the group (`device, tp`); for a host communicator the device may be
// left out (its default backend is used). Collectives work in place only on tensors the function
// made itself. Every function checks divisibility and throws ShapeError naming the conversion.
// On a group of one rank every conversion is the identity and returns its input's storage (no copy,
// no collective): a caller that writes into a conversion's result in place must own its input.
#pragma once

#include <concepts>
#include <span>
#include <type_traits>

#include "../comm/communicator.hpp"
#include "layout.hpp"

STRATA_NAMESPACE_BEGIN

namespace detail {

// While alive, the GEMMs `device` enqueues run beside a collective in flight on the communication
// stream: a backend with gemms_beside_communication (cuda::backend) plans them for the SMs its
// communication margin leaves (set_communication_sm_margin); on others it does nothing.
template <class Device>
class gemms_beside_communication {
 public:
  explicit gemms_beside_communication(Device& device) : device_(device) {
    if constexpr (marks) previous_ = device_.gemms_beside_communication(true);
  }
  gemms_beside_communication(const gemms_beside_communication&) = delete;
  gemms_beside_communication& operator=(const gemms_beside_communication&) = delete;
  ~gemms_beside_communication() {
    if constexpr (marks) (void)device_.gemms_beside_communication(previous_);
  }

 private:
  static constexpr bool marks = requires(Device& d) { { d.gemms_beside_communication(true) } -> std::same_as<bool>; };
  Device& device_;
  bool previous_ = false;
};

// Whether the all-gathers beside GEMMs go whole (ctx.tp_comm_overlap_gather collective or
// copy_engines) rather than as rings (all_gather_dim0_ring's `whole`).
template <class Context>
bool overlap_gathers_whole(const Context& ctx) {
  return ctx.tp_comm_overlap_gather != decltype(ctx.tp_comm_overlap_gather)::ring;
}

inline void check_divisible(index_t extent, int parts, const char* what, const Shape& shape) {
  if (parts <= 0 || extent % parts != 0)
    fail<ShapeError>(what, ": dimension of extent ", extent, " in ", shape.str(), " does not divide over ", parts,
                     " tensor-parallel ranks");
}

template <class Device, class Comm, class T, class Space>
Tensor<T, Space> all_gather_dim0(Device&, Comm& comm, const Tensor<T, Space>& in) {
  if (comm.size() == 1) return in;
  auto out = Tensor<T, Space>::empty(in.shape().with(0, in.size(0) * comm.size()));
  comm.all_gather(in.buffer(), out.buffer());
  return out;
}

template <class Device, class Comm, class T, class Space>
Tensor<T, Space> reduce_scatter_dim0(Device&, Comm& comm, const Tensor<T, Space>& in, const char* what) {
  check_divisible(in.size(0), comm.size(), what, in.shape());
  if (comm.size() == 1) return in;
  auto out = Tensor<T, Space>::empty(in.shape().with(0, in.size(0) / comm.size()));
  comm.reduce_scatter(in.buffer(), out.buffer(), ReduceOp::sum);
  return out;
}

template <class Device, class T, class Space>
Tensor<T, Space> slice_dim0(Device& device, const Tensor<T, Space>& in, int rank, int parts, const char* what) {
  check_divisible(in.size(0), parts, what, in.shape());
  if (parts == 1) return in;
  const index_t n = in.size(0) / parts, inner = in.size(0) == 0 ? 0 : in.numel() / in.size(0);
  auto out = Tensor<T, Space>::empty(in.shape().with(0, n));  // rows [n * rank, n * (rank + 1))
  device.template copy<T>(in.data() + n * rank * inner, out.numel(), out.data());
  return out;
}

template <class Device, class T, class Space>
Tensor<T, Space> slice_last(Device& device, const Tensor<T, Space>& in, int rank, int parts, const char* what) {
  check_divisible(in.shape().cols(), parts, what, in.shape());
  if (parts == 1) return in;
  const index_t rows = in.shape().rows(), cols = in.shape().cols(), local = cols / parts;
  auto out = Tensor<T, Space>::empty(in.shape().with(-1, local));  // (rows, local)
  device.template slice_columns<T>(in.data(), rows, cols, rank * local, local, out.data());
  return out;
}

template <class Device, class Comm, class T, class Space>
Tensor<T, Space> all_gather_last(Device& device, Comm& comm, const Tensor<T, Space>& in) {
  const int parts = comm.size();
  if (parts == 1) return in;
  const index_t rows = in.shape().rows(), local = in.shape().cols();
  auto stacked = Tensor<T, Space>::empty(Shape{parts, rows, local});  // (tp, rows, local)
  comm.all_gather(in.buffer(), stacked.buffer());
  auto out = Tensor<T, Space>::empty(in.shape().with(-1, local * parts));  // (rows, tp * local)
  device.template unstack_columns<T>(stacked.data(), parts, rows, local, out.data());
  return out;
}

// all_gather_dim0 beside the consumer of its blocks, on the communicator's overlapped handle: a
// ring of tp - 1 exchanges calling block(rank, data) (data: the first element of that rank's block
// of dim0 in the result) for each rank's block as soon as it has arrived (this rank's own first,
// then the ones from the ranks before it, nearest first), while the next exchange is in flight; or,
// `whole`, one all-gather with this rank's own block beside it and the others after it, in the
// same order. The consumer of a gathered input whose rows are independent (a matmul) runs beside
// the gather (NCCL: exchanges on the communication stream, blocks on the compute stream, inside
// gemms_beside_communication while something is in flight). A block call may read only its block
// of the result. With an in-process communicator each exchange has finished when it returns, so
// this is the plain gather followed by the blocks.
template <class Device, class Comm, class T, class Space, class Block>
Tensor<T, Space> all_gather_dim0_ring(Device& device, Comm& tp, const Tensor<T, Space>& in, Block&& block,
                                      bool whole = false) {
  const int parts = tp.size(), rank = tp.rank();
  if (parts == 1) {
    block(0, in.data());
    return in;
  }
  const index_t n = in.numel();  // elements of one rank's block
  auto out = Tensor<T, Space>::empty(in.shape().with(0, in.size(0) * parts));
  device.template copy<T>(in.data(), n, out.data() + rank * n);
  Comm ring = overlapped_handle(tp);
  const auto beside = [&](int held) {
    gemms_beside_communication<Device> marked(device);
    block(held, static_cast<const T*>(out.data() + held * n));
  };
  if (whole) {
    ring.all_gather(comm_span_t<const T, Comm>(out.data() + rank * n, static_cast<std::size_t>(n)),
                    comm_span_t<T, Comm>(out.data(), static_cast<std::size_t>(n) * static_cast<std::size_t>(parts)));
    const std::uint64_t mark = overlapped_mark(ring);
    beside(rank);
    join_overlapped(tp, mark);
    for (int step = 1; step < parts; ++step) {
      const int arrived = (rank - step + parts) % parts;
      block(arrived, static_cast<const T*>(out.data() + arrived * n));
    }
    return out;
  }
  const int next = (rank + 1) % parts, previous = (rank + parts - 1) % parts;
  for (int step = 0; step < parts - 1; ++step) {
    // forward the block that arrived last (own at first); receive the previous rank's one before it
    const int held = (rank - step + parts) % parts, arriving = (rank - step - 1 + parts) % parts;
    auto batch = batch_point_to_point(ring);
    ring.send(comm_span_t<const T, Comm>(out.data() + held * n, static_cast<std::size_t>(n)), next);
    ring.recv(comm_span_t<T, Comm>(out.data() + arriving * n, static_cast<std::size_t>(n)), previous);
    batch.end();
    const std::uint64_t mark = overlapped_mark(ring);
    beside(held);
    join_overlapped(tp, mark);
  }
  const int last = (rank + 1) % parts;  // the last to arrive
  block(last, static_cast<const T*>(out.data() + last * n));
  return out;
}

// reduce_scatter_dim0 of a partial tensor of shape `full` that is produced block by block, as a
// ring of tp - 1 exchanges on the communicator's overlapped handle: partial(rank, data) writes
// this rank's addend of that rank's block of dim0 (rows [rank n, (rank + 1) n) of `full`) at data.
// Step k sends the running sum of one block to the next rank while the addend of the block the
// previous rank sends is computed, then adds the two; after tp - 1 steps this rank holds its own
// block summed over every rank, in the order own + (previous + (the one before + ...)). The sums
// equal reduce_scatter_dim0's to rounding (the same sum, another association beyond two ranks).
template <class T, class Space, class Device, class Comm, class Partial>
Tensor<T, Space> reduce_scatter_dim0_ring(Device& device, Comm& tp, const Shape& full, Partial&& partial,
                                          const char* what) {
  const int parts = tp.size(), rank = tp.rank();
  check_divisible(full[0], parts, what, full);
  auto out = Tensor<T, Space>::empty(full.with(0, full[0] / parts));
  if (parts == 1) {
    partial(0, out.data());
    return out;
  }
  const index_t n = out.numel();  // elements of one block
  auto sums = Tensor<T, Space>::empty(full);   // this rank's addends, then running sums, by block
  auto arrived = Tensor<T, Space>::empty(out.shape());
  Comm ring = overlapped_handle(tp);
  const int next = (rank + 1) % parts, previous = (rank + parts - 1) % parts;
  auto block_at_step = [&](int step) { return (rank - step - 1 + 2 * parts) % parts; };  // the last step's is rank's own
  partial(block_at_step(0), sums.data() + block_at_step(0) * n);
  for (int step = 0; step < parts - 1; ++step) {
    const int sent = block_at_step(step), coming = block_at_step(step + 1);
    auto batch = batch_point_to_point(ring);
    ring.send(comm_span_t<const T, Comm>(sums.data() + sent * n, static_cast<std::size_t>(n)), next);
    ring.recv(comm_span_t<T, Comm>(arrived.data(), static_cast<std::size_t>(n)), previous);
    batch.end();
    const std::uint64_t mark = overlapped_mark(ring);
    {
      gemms_beside_communication<Device> beside(device);
      partial(coming, sums.data() + coming * n);
    }
    join_overlapped(tp, mark);
    T* into = step + 1 == parts - 1 ? out.data() : sums.data() + coming * n;
    device.template add<T>(sums.data() + coming * n, arrived.data(), n, into);
  }
  return out;
}

// The backend a host communicator brings (cpu::backend for the in-process one).
template <class Comm>
  requires std::is_same_v<typename Comm::space, space::host>
typename Comm::default_device default_device_of() {
  return {};
}

}  // namespace detail

// f: identity forward; its backward all-reduces the partial gradient.
template <class T, class Space>
Activation<T, layout::replicated, Space> copy_to_tensor_parallel(Activation<T, layout::replicated, Space> x) {
  return x;
}
template <class Comm, class T, class Space>
Activation<T, layout::replicated, Space> copy_to_tensor_parallel_backward(Comm& tp, Activation<T, layout::partial, Space> dx) {
  // dx holds a fresh gradient (the caller's matmul output): reduced in place
  if (tp.size() > 1) tp.all_reduce(dx.tensor.buffer(), ReduceOp::sum);
  return Activation<T, layout::replicated, Space>(std::move(dx.tensor));
}

// g: all-reduce forward; identity backward (the complete gradient is every addend's gradient).
template <class Comm, class T, class Space>
Activation<T, layout::replicated, Space> reduce_from_tensor_parallel(Comm& tp, Activation<T, layout::partial, Space> y) {
  // y holds a fresh partial sum (the caller's matmul output): reduced in place
  if (tp.size() > 1) tp.all_reduce(y.tensor.buffer(), ReduceOp::sum);
  return Activation<T, layout::replicated, Space>(std::move(y.tensor));
}
template <class T, class Space>
Activation<T, layout::partial, Space> reduce_from_tensor_parallel_backward(Activation<T, layout::replicated, Space> dy) {
  return Activation<T, layout::partial, Space>(std::move(dy.tensor));
}

template <class Device, class Comm, class T, class Space>
Activation<T, layout::sharded<-1>, Space> scatter_to_tensor_parallel(Device& device, Comm& tp, const Activation<T, layout::replicated, Space>& x) {
  return Activation<T, layout::sharded<-1>, Space>(detail::slice_last(device, x.tensor, tp.rank(), tp.size(), "scatter_to_tensor_parallel"));
}
template <class Device, class Comm, class T, class Space>
Activation<T, layout::replicated, Space> scatter_to_tensor_parallel_backward(Device& device, Comm& tp, const Activation<T, layout::sharded<-1>, Space>& dy) {
  return Activation<T, layout::replicated, Space>(detail::all_gather_last(device, tp, dy.tensor));
}

template <class Device, class Comm, class T, class Space>
Activation<T, layout::replicated, Space> gather_from_tensor_parallel(Device& device, Comm& tp, const Activation<T, layout::sharded<-1>, Space>& x) {
  return Activation<T, layout::replicated, Space>(detail::all_gather_last(device, tp, x.tensor));
}
template <class Device, class Comm, class T, class Space>
Activation<T, layout::sharded<-1>, Space> gather_from_tensor_parallel_backward(Device& device, Comm& tp, const Activation<T, layout::replicated, Space>& dy) {
  return Activation<T, layout::sharded<-1>, Space>(detail::slice_last(device, dy.tensor, tp.rank(), tp.size(), "gather_from_tensor_parallel (backward)"));
}

template <class Device, class Comm, class T, class Space>
Activation<T, layout::sharded<0>, Space> scatter_to_sequence_parallel(Device& device, Comm& tp, const Activation<T, layout::replicated, Space>& x) {
  return Activation<T, layout::sharded<0>, Space>(detail::slice_dim0(device, x.tensor, tp.rank(), tp.size(), "scatter_to_sequence_parallel"));
}
template <class Device, class Comm, class T, class Space>
Activation<T, layout::replicated, Space> scatter_to_sequence_parallel_backward(Device& device, Comm& tp, const Activation<T, layout::sharded<0>, Space>& dy) {
  return Activation<T, layout::replicated, Space>(detail::all_gather_dim0(device, tp, dy.tensor));
}

template <class Device, class Comm, class T, class Space>
Activation<T, layout::replicated, Space> gather_from_sequence_parallel(Device& device, Comm& tp, const Activation<T, layout::sharded<0>, Space>& x) {
  return Activation<T, layout::replicated, Space>(detail::all_gather_dim0(device, tp, x.tensor));
}
// Backward when the consumers of the gathered tensor were tensor-parallel (their input gradient is partial).
template <class Device, class Comm, class T, class Space>
Activation<T, layout::sharded<0>, Space> gather_from_sequence_parallel_backward(Device& device, Comm& tp, const Activation<T, layout::partial, Space>& dy) {
  return Activation<T, layout::sharded<0>, Space>(detail::reduce_scatter_dim0(device, tp, dy.tensor, "gather_from_sequence_parallel (backward)"));
}
// Backward when the consumers were replicated computations (their input gradient is complete).
template <class Device, class Comm, class T, class Space>
Activation<T, layout::sharded<0>, Space> gather_from_sequence_parallel_backward(Device& device, Comm& tp, const Activation<T, layout::replicated, Space>& dy) {
  return Activation<T, layout::sharded<0>, Space>(detail::slice_dim0(device, dy.tensor, tp.rank(), tp.size(), "gather_from_sequence_parallel (backward)"));
}

template <class Device, class Comm, class T, class Space>
Activation<T, layout::sharded<0>, Space> reduce_scatter_to_sequence_parallel(Device& device, Comm& tp, const Activation<T, layout::partial, Space>& y) {
  return Activation<T, layout::sharded<0>, Space>(detail::reduce_scatter_dim0(device, tp, y.tensor, "reduce_scatter_to_sequence_parallel"));
}
template <class Device, class Comm, class T, class Space>
Activation<T, layout::partial, Space> reduce_scatter_to_sequence_parallel_backward(Device& device, Comm& tp, const Activation<T, layout::sharded<0>, Space>& dy) {
  return Activation<T, layout::partial, Space>(detail::all_gather_dim0(device, tp, dy.tensor));
}

// Host-communicator shorthands: the same conversions with the communicator's default backend.
#define STRATA_HOST_CONVERSION(name, In, Out)                                                        \
  template <class Comm, class T>                                                                     \
    requires std::is_same_v<typename Comm::space, space::host>                                       \
  Activation<T, Out> name(Comm& tp, const Activation<T, In>& x) {                                    \
    auto device = detail::default_device_of<Comm>();                                                 \
    return name(device, tp, x);                                                                      \
  }
STRATA_HOST_CONVERSION(scatter_to_tensor_parallel, layout::replicated, layout::sharded<-1>)
STRATA_HOST_CONVERSION(scatter_to_tensor_parallel_backward, layout::sharded<-1>, layout::replicated)
STRATA_HOST_CONVERSION(gather_from_tensor_parallel, layout::sharded<-1>, layout::replicated)
STRATA_HOST_CONVERSION(gather_from_tensor_parallel_backward, layout::replicated, layout::sharded<-1>)
STRATA_HOST_CONVERSION(scatter_to_sequence_parallel, layout::replicated, layout::sharded<0>)
STRATA_HOST_CONVERSION(scatter_to_sequence_parallel_backward, layout::sharded<0>, layout::replicated)
STRATA_HOST_CONVERSION(gather_from_sequence_parallel, layout::sharded<0>, layout::replicated)
STRATA_HOST_CONVERSION(gather_from_sequence_parallel_backward, layout::partial, layout::sharded<0>)
STRATA_HOST_CONVERSION(gather_from_sequence_parallel_backward, layout::replicated, layout::sharded<0>)
STRATA_HOST_CONVERSION(reduce_scatter_to_sequence_parallel, layout::partial, layout::sharded<0>)
STRATA_HOST_CONVERSION(reduce_scatter_to_sequence_parallel_backward, layout::sharded<0>, layout::partial)
#undef STRATA_HOST_CONVERSION

STRATA_NAMESPACE_END

STRATA_NAMESPACE_BEGIN

// True when an increment of a replicated parameter applied to an activation of layout `Layout` needs
// no reduction (replicated activations, or one tensor-parallel rank): the kernel that computes it
// may then add it straight into the gradient, with the bits of add_replicated_gradient.
template <class Layout, class Comm>
bool replicated_gradient_is_local(const Comm& tp) {
  if constexpr (std::is_same_v<Layout, layout::sharded<0>>) return tp.size() == 1;
  else return true;
}

// Adds a gradient increment of a replicated parameter that was applied to an activation of layout
// `Layout`. Applied to a sequence shard (sharded<0>), each rank saw only its part of the sequence,
// so the increments are summed over the tensor-parallel group first: the reduction Megatron users
// must remember for norm weights under sequence parallelism happens here, chosen by the type.
// `increment` is the caller's own scratch tensor (reduced in place).
template <class Layout, class Device, class Comm, class G, class Space>
void add_replicated_gradient(Device& device, Comm& tp, Tensor<G, Space>& grad, Tensor<G, Space>& increment) {
  static_assert(std::is_same_v<Layout, layout::replicated> || std::is_same_v<Layout, layout::sharded<0>>,
                "add_replicated_gradient: a replicated parameter acts on replicated or sequence-sharded "
                "activations only.");
  check_same_shape(grad.shape(), increment.shape(), "add_replicated_gradient");
  if constexpr (std::is_same_v<Layout, layout::sharded<0>>)
    if (tp.size() > 1) tp.all_reduce(increment.buffer(), ReduceOp::sum);
  device.template add<G>(grad.data(), increment.data(), grad.numel(), grad.data());
}

// The same for several replicated parameters at once: `increments` holds their increments one after
// the other, in the order of `params`, and is reduced over the tensor-parallel group in one collective
// (a sequence-parallel layer's norms: one all-reduce instead of one per parameter). The bits are those
// of one add_replicated_gradient per parameter.
template <class Layout, class Device, class Comm, class G, class Space, class Param>
void add_replicated_gradients(Device& device, Comm& tp, Tensor<G, Space>& increments, std::span<Param* const> params) {
  static_assert(std::is_same_v<Layout, layout::replicated> || std::is_same_v<Layout, layout::sharded<0>>,
                "add_replicated_gradients: replicated parameters act on replicated or sequence-sharded activations only.");
  index_t total = 0;
  for (const Param* p : params) total += p->grad.numel();
  if (total != increments.numel())
    fail<ShapeError>("add_replicated_gradients: ", increments.numel(), " increments for parameters of ", total, " elements");
  if constexpr (std::is_same_v<Layout, layout::sharded<0>>)
    if (tp.size() > 1) tp.all_reduce(increments.buffer(), ReduceOp::sum);
  index_t offset = 0;
  for (Param* p : params) {
    device.template add<G>(p->grad.data(), increments.data() + offset, p->grad.numel(), p->grad.data());
    offset += p->grad.numel();
  }
}

STRATA_NAMESPACE_END
