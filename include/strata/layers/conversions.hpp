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
// Tensors are [seq, batch, hidden] row-major, so sequence slices are contiguous row blocks. Every
// function checks divisibility and throws ShapeError naming the conversion.
#pragma once

#include <algorithm>
#include <span>

#include "../comm/communicator.hpp"
#include "layout.hpp"

STRATA_NAMESPACE_BEGIN

namespace detail {

inline void check_divisible(index_t extent, int parts, const char* what, const Shape& shape) {
  if (parts <= 0 || extent % parts != 0)
    fail<ShapeError>(what, ": dimension of extent ", extent, " in ", shape.str(), " does not divide over ", parts,
                     " tensor-parallel ranks");
}

template <class T, class Comm>
Tensor<T> all_gather_dim0(Comm& comm, const Tensor<T>& in) {
  Tensor<T> out(in.shape().with(0, in.size(0) * comm.size()));
  comm.all_gather(std::span<const T>(in.span()), out.span());
  return out;
}

template <class T, class Comm>
Tensor<T> reduce_scatter_dim0(Comm& comm, const Tensor<T>& in, const char* what) {
  check_divisible(in.size(0), comm.size(), what, in.shape());
  Tensor<T> out(in.shape().with(0, in.size(0) / comm.size()));
  comm.reduce_scatter(std::span<const T>(in.span()), out.span(), ReduceOp::sum);
  return out;
}

template <class T>
Tensor<T> slice_dim0(const Tensor<T>& in, int rank, int parts, const char* what) {
  check_divisible(in.size(0), parts, what, in.shape());
  index_t n = in.size(0) / parts;
  return Tensor<T>::copy_of(in.view().slice_rows(n * rank, n * (rank + 1)));
}

template <class T>
Tensor<T> slice_last(const Tensor<T>& in, int rank, int parts, const char* what) {
  check_divisible(in.shape().cols(), parts, what, in.shape());
  const index_t rows = in.shape().rows(), cols = in.shape().cols(), local = cols / parts;
  Tensor<T> out(in.shape().with(-1, local));
  for (index_t r = 0; r < rows; ++r)
    std::copy_n(in.data() + r * cols + rank * local, local, out.data() + r * local);
  return out;
}

template <class T, class Comm>
Tensor<T> all_gather_last(Comm& comm, const Tensor<T>& in) {
  const int parts = comm.size();
  const index_t rows = in.shape().rows(), local = in.shape().cols();
  Tensor<T> stacked(Shape{parts, rows, local});  // (tp, rows, local)
  comm.all_gather(std::span<const T>(in.span()), stacked.span());
  Tensor<T> out(in.shape().with(-1, local * parts));  // (rows, tp * local)
  for (int p = 0; p < parts; ++p)
    for (index_t r = 0; r < rows; ++r)
      std::copy_n(stacked.data() + (p * rows + r) * local, local, out.data() + r * local * parts + p * local);
  return out;
}

}  // namespace detail

// f: identity forward; its backward all-reduces the partial gradient.
template <class T>
Activation<T, layout::replicated> copy_to_tensor_parallel(Activation<T, layout::replicated> x) {
  return x;
}
template <class T, class Comm>
Activation<T, layout::replicated> copy_to_tensor_parallel_backward(Comm& tp, Activation<T, layout::partial> dx) {
  if (tp.size() > 1) tp.all_reduce(dx.tensor.span(), ReduceOp::sum);
  return Activation<T, layout::replicated>(std::move(dx.tensor));
}

// g: all-reduce forward; identity backward (the complete gradient is every addend's gradient).
template <class T, class Comm>
Activation<T, layout::replicated> reduce_from_tensor_parallel(Comm& tp, Activation<T, layout::partial> y) {
  if (tp.size() > 1) tp.all_reduce(y.tensor.span(), ReduceOp::sum);
  return Activation<T, layout::replicated>(std::move(y.tensor));
}
template <class T>
Activation<T, layout::partial> reduce_from_tensor_parallel_backward(Activation<T, layout::replicated> dy) {
  return Activation<T, layout::partial>(std::move(dy.tensor));
}

template <class T, class Comm>
Activation<T, layout::sharded<-1>> scatter_to_tensor_parallel(Comm& tp, const Activation<T, layout::replicated>& x) {
  return Activation<T, layout::sharded<-1>>(detail::slice_last(x.tensor, tp.rank(), tp.size(), "scatter_to_tensor_parallel"));
}
template <class T, class Comm>
Activation<T, layout::replicated> scatter_to_tensor_parallel_backward(Comm& tp, const Activation<T, layout::sharded<-1>>& dy) {
  return Activation<T, layout::replicated>(detail::all_gather_last(tp, dy.tensor));
}

template <class T, class Comm>
Activation<T, layout::replicated> gather_from_tensor_parallel(Comm& tp, const Activation<T, layout::sharded<-1>>& x) {
  return Activation<T, layout::replicated>(detail::all_gather_last(tp, x.tensor));
}
template <class T, class Comm>
Activation<T, layout::sharded<-1>> gather_from_tensor_parallel_backward(Comm& tp, const Activation<T, layout::replicated>& dy) {
  return Activation<T, layout::sharded<-1>>(detail::slice_last(dy.tensor, tp.rank(), tp.size(), "gather_from_tensor_parallel (backward)"));
}

template <class T, class Comm>
Activation<T, layout::sharded<0>> scatter_to_sequence_parallel(Comm& tp, const Activation<T, layout::replicated>& x) {
  return Activation<T, layout::sharded<0>>(detail::slice_dim0(x.tensor, tp.rank(), tp.size(), "scatter_to_sequence_parallel"));
}
template <class T, class Comm>
Activation<T, layout::replicated> scatter_to_sequence_parallel_backward(Comm& tp, const Activation<T, layout::sharded<0>>& dy) {
  return Activation<T, layout::replicated>(detail::all_gather_dim0(tp, dy.tensor));
}

template <class T, class Comm>
Activation<T, layout::replicated> gather_from_sequence_parallel(Comm& tp, const Activation<T, layout::sharded<0>>& x) {
  return Activation<T, layout::replicated>(detail::all_gather_dim0(tp, x.tensor));
}
// Backward when the consumers of the gathered tensor were tensor-parallel (their input gradient is partial).
template <class T, class Comm>
Activation<T, layout::sharded<0>> gather_from_sequence_parallel_backward(Comm& tp, const Activation<T, layout::partial>& dy) {
  return Activation<T, layout::sharded<0>>(detail::reduce_scatter_dim0(tp, dy.tensor, "gather_from_sequence_parallel (backward)"));
}
// Backward when the consumers were replicated computations (their input gradient is complete).
template <class T, class Comm>
Activation<T, layout::sharded<0>> gather_from_sequence_parallel_backward(Comm& tp, const Activation<T, layout::replicated>& dy) {
  return Activation<T, layout::sharded<0>>(detail::slice_dim0(dy.tensor, tp.rank(), tp.size(), "gather_from_sequence_parallel (backward)"));
}

template <class T, class Comm>
Activation<T, layout::sharded<0>> reduce_scatter_to_sequence_parallel(Comm& tp, const Activation<T, layout::partial>& y) {
  return Activation<T, layout::sharded<0>>(detail::reduce_scatter_dim0(tp, y.tensor, "reduce_scatter_to_sequence_parallel"));
}
template <class T, class Comm>
Activation<T, layout::partial> reduce_scatter_to_sequence_parallel_backward(Comm& tp, const Activation<T, layout::sharded<0>>& dy) {
  return Activation<T, layout::partial>(detail::all_gather_dim0(tp, dy.tensor));
}

STRATA_NAMESPACE_END

STRATA_NAMESPACE_BEGIN

// Adds a gradient increment of a replicated parameter that was applied to an activation of layout
// `Layout`. Applied to a sequence shard (sharded<0>), each rank saw only its part of the sequence,
// so the increments are summed over the tensor-parallel group first: the reduction Megatron users
// must remember for norm weights under sequence parallelism happens here, chosen by the type.
template <class Layout, class Comm, class G>
void add_replicated_gradient(Comm& tp, Tensor<G>& grad, Tensor<G>& increment) {
  static_assert(std::is_same_v<Layout, layout::replicated> || std::is_same_v<Layout, layout::sharded<0>>,
                "add_replicated_gradient: a replicated parameter acts on replicated or sequence-sharded "
                "activations only.");
  check_same_shape(grad.shape(), increment.shape(), "add_replicated_gradient");
  if constexpr (std::is_same_v<Layout, layout::sharded<0>>)
    if (tp.size() > 1) tp.all_reduce(increment.span(), ReduceOp::sum);
  for (index_t i = 0; i < grad.numel(); ++i) grad[i] += increment[i];
}

STRATA_NAMESPACE_END
