// strata/layers/layout.hpp: sharding layouts carried in the type of every activation edge.
//
// An activation is [seq, batch, hidden] (sequence-major, as Megatron), and its layout tag says how
// this rank's local tensor relates to the global one over the tensor-parallel group:
//
//   replicated   every rank holds the whole tensor
//   sharded<D>   rank r holds the r-th even slice along dimension D (D = -1: last, hidden;
//                D = 0: sequence, the sequence-parallel region)
//   partial      every rank holds a full-shape addend; the true value is the sum over ranks
//
// The gradient of an edge carries the edge's own layout and means "the complete gradient with
// respect to this rank's local piece"; `partial` appears only between a row-parallel matmul and its
// reduction. Layers state the layouts they accept and return (`input_layout` / `output_layout`);
// feeding one a mismatched edge fails to compile with a message naming the conversion to insert.
#pragma once

#include <string_view>
#include <type_traits>
#include <utility>

#include "../core/tensor.hpp"

STRATA_NAMESPACE_BEGIN

namespace layout {
struct replicated {
  static constexpr std::string_view name = "replicated";
};
template <int Dim>
struct sharded {
  static constexpr int dim = Dim;
  static constexpr std::string_view name = Dim == 0 ? "sharded<0> (sequence)" : "sharded<-1> (hidden)";
};
struct partial {
  static constexpr std::string_view name = "partial";
};
using sharded_hidden = sharded<-1>;
using sharded_sequence = sharded<0>;

template <class L>
inline constexpr bool is_layout_v = std::is_same_v<L, replicated> || std::is_same_v<L, partial> ||
                                    std::is_same_v<L, sharded<0>> || std::is_same_v<L, sharded<-1>>;
}  // namespace layout

// A tensor together with its layout, in memory space `Space` (the policy's backend space).
// Owning: layer outputs are values, never lazy expressions.
template <class T, class Layout, class Space = space::host>
struct Activation {
  static_assert(layout::is_layout_v<Layout>, "Activation's second argument must be a strata::layout tag.");
  using element_type = T;
  using layout_type = Layout;
  using space_type = Space;

  Tensor<T, Space> tensor;

  Activation() = default;
  explicit Activation(Tensor<T, Space> t) : tensor(std::move(t)) {}

  const Shape& shape() const { return tensor.shape(); }
  T* data() { return tensor.data(); }
  const T* data() const { return tensor.data(); }
};

// The check every layer's forward/backward runs on its argument's layout. `What` names the edge.
template <class Expected, class Got>
constexpr void expect_layout() {
  static_assert(std::is_same_v<Expected, Got>,
                "strata: layout mismatch on a tensor-parallel edge. The layer expects the layout in the first "
                "template argument of expect_layout and was given the second. Insert a conversion from "
                "strata/layers/conversions.hpp: gather_from_tensor_parallel (sharded<-1> -> replicated), "
                "scatter_to_tensor_parallel (replicated -> sharded<-1>), gather_from_sequence_parallel "
                "(sharded<0> -> replicated), scatter_to_sequence_parallel (replicated -> sharded<0>), or "
                "pair a ColumnParallelLinear without gather_output with a RowParallelLinear with "
                "input_is_parallel.");
}

STRATA_NAMESPACE_END
