// strata/backend/attention_strides.hpp: `AttentionStrides`, where the heads of q and of k, v lie in
// memory for attention_forward / attention_backward / prepare_attention, so attention can read
// them as views of another tensor (the packed qkv projection) instead of copies.
//
//   q (and dq)       element (t, batch, h, e) at q + (t b + batch) q_row + h q_head + e
//   k, v (dk, dv)    element (t, batch, g, e) at k + (t b + batch) kv_row + g kv_head + e
//   t < s, batch < b, h < heads, g < groups, e < d: each head's d elements are contiguous
// A field left 0 takes its contiguous value (q_row = heads d, q_head = d, kv_row = groups d,
// kv_head = d), so `AttentionStrides{}` is the contract's [s, b, heads, d] / [s, b, groups, d].
// out, dout and lse are always contiguous. Every stride, once resolved, is at least d.
//
// The packed qkv projection [s, b, groups, heads_per_group + 2, d] (q heads of group g, then k_g,
// then v_g) is such a view when heads_per_group = 1 (multi-head attention: q head h at h (3 d),
// k at d past it, v at 2 d) or groups = 1 (one key/value head: q heads contiguous, k at
// heads_per_group d, v after it); `packed_qkv_view` gives its strides and the k, v offsets. Other
// grouped layouts are not a strided view of heads (split them with qkv_split). In both view
// layouts every element of the packed tensor belongs to exactly one of q, k, v, so a backward that
// writes dq, dk, dv through the view writes the whole packed gradient.
#pragma once

#include <type_traits>

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../core/shape.hpp"

STRATA_NAMESPACE_BEGIN

struct AttentionStrides {
  index_t q_row = 0;    // elements between consecutive [s, b] positions of q, dq (0: heads * d)
  index_t q_head = 0;   // elements between consecutive query heads (0: d)
  index_t kv_row = 0;   // elements between consecutive [s, b] positions of k, v, dk, dv (0: groups * d)
  index_t kv_head = 0;  // elements between consecutive key/value heads (0: d)

  // Every field explicit: the zeros replaced by the contiguous strides of this shape.
  constexpr AttentionStrides resolved(index_t heads, index_t groups, index_t d) const {
    return {q_row != 0 ? q_row : heads * d, q_head != 0 ? q_head : d, kv_row != 0 ? kv_row : groups * d,
            kv_head != 0 ? kv_head : d};
  }
  constexpr bool is_contiguous(index_t heads, index_t groups, index_t d) const {
    const AttentionStrides r = resolved(heads, groups, d);
    return r.q_row == heads * d && r.q_head == d && r.kv_row == groups * d && r.kv_head == d;
  }
  friend constexpr bool operator==(const AttentionStrides&, const AttentionStrides&) = default;
};
static_assert(std::is_trivially_copyable_v<AttentionStrides>,
              "AttentionStrides is copied into kernel arguments, so it must be trivially copyable.");

// The resolved strides, or a ShapeError naming the stride that is negative or shorter than a head
// (two heads, or two positions, of one tensor would share elements).
inline AttentionStrides checked_attention_strides(const char* who, const AttentionStrides& strides, index_t heads,
                                                  index_t groups, index_t d) {
  const AttentionStrides r = strides.resolved(heads, groups, d);
  const struct {
    const char* name;
    index_t value;
  } fields[] = {{"q_row", r.q_row}, {"q_head", r.q_head}, {"kv_row", r.kv_row}, {"kv_head", r.kv_head}};
  for (const auto& f : fields)
    if (f.value < d)
      fail<ShapeError>(who, ": attention stride ", f.name, " = ", f.value, " is shorter than the head size d = ", d,
                       ", so heads or positions would overlap; pass 0 for the contiguous layout or a stride >= d");
  return r;
}

// The packed qkv projection [s, b, groups, heads_per_group + 2, d] seen as q, k, v views.
struct PackedQkvView {
  bool is_view = false;       // false: not a strided view (1 < groups and 1 < heads_per_group)
  AttentionStrides strides;   // of q and of k, v within the packed tensor
  index_t k_offset = 0;       // elements from the packed tensor's start to k (head 0, position 0)
  index_t v_offset = 0;       // ... to v
};

constexpr PackedQkvView packed_qkv_view(index_t groups, index_t heads_per_group, index_t d) {
  const index_t group_stride = (heads_per_group + 2) * d;  // [q_0 .. q_{hpg-1} | k | v] of one group
  PackedQkvView view;
  view.is_view = heads_per_group == 1 || groups == 1;
  if (!view.is_view) return view;
  view.strides.q_row = groups * group_stride;
  view.strides.q_head = heads_per_group == 1 ? group_stride : d;  // MHA: one q head per group
  view.strides.kv_row = groups * group_stride;
  view.strides.kv_head = group_stride;
  view.k_offset = heads_per_group * d;
  view.v_offset = (heads_per_group + 1) * d;
  return view;
}

STRATA_NAMESPACE_END
