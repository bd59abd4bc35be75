// strata/backend/cuda/cudnn_sdpa.hpp: cuDNN 9 scaled-dot-product attention graphs, built through the
// header-only cuDNN frontend (C++ API) and cached per shape.
//
// The contract's layouts go to cuDNN as strided [b, h, s, d] tensors, no permute copy:
//   q, out, dout, dq  [s, b, heads, d]   -> dims (b, heads, s, d), strides (heads d, d, b heads d, 1)
//   k, v, dk, dv      [s, b, groups, d]  -> dims (b, groups, s, d), strides (groups d, d, b groups d, 1)
//   lse               [b, heads, s] fp32 -> cuDNN's "Stats" (b, heads, s, 1), packed
// q, dq and k, v, dk, dv may be strided views (backend/attention_strides.hpp): element (t, batch,
// head, e) at (t b + batch) row + head head_stride + e goes to cuDNN as strides
// (row, head_stride, b row, 1), which the contiguous layouts above are the case of; the graph is
// built for, and cached with, those strides.
// cuDNN's Stats is max + ln(sum exp(S - max)) of the scaled scores S: the natural-log log-sum-exp
// the contract names, in the contract's layout, so no conversion is needed (base 2 only when asked
// for with set_stats_use_log2, which is never done here). Grouped-query attention is cuDNN's own
// (fewer K/V heads than Q heads); the causal mask is the top-left diagonal band (key j <= query i),
// and a graph built with shape::causal = false has no mask (context parallelism's blocks of keys
// wholly in the past of their queries).
//
// The scale is a pass-by-value input, so one graph serves every scale. The backward is built with
// set_deterministic_algorithm(true): on Hopper cuDNN then reduces dQ without atomics (through a
// dP scratch of about b * heads * s * s * 2 bytes in the workspace, or a linear one with cuDNN
// >= 9.25 when CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT caps it), so two runs give the same bits. The
// scratch is per call, like any workspace; nothing s x s survives a call.
//
// Only compiled in when STRATA_WITH_CUDNN is set (the strata::cudnn target sets it).
#pragma once

#if defined(STRATA_WITH_CUDNN) && STRATA_WITH_CUDNN

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "../../core/dtype.hpp"
#include "../../core/error.hpp"
#include "../../core/shape.hpp"
#include "../attention_strides.hpp"

STRATA_NAMESPACE_BEGIN
namespace cuda {

namespace detail {
[[noreturn]] inline void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file, int line) {
  fail<Error>(file, ":", line, ": ", expr, " failed: ", cudnnGetErrorString(status));
}
}  // namespace detail

}  // namespace cuda
STRATA_NAMESPACE_END

// STRATA_CUDNN_CHECK(expr): expr returns cudnnStatus_t; throws strata::Error unless success.
#define STRATA_CUDNN_CHECK(expr)                                                           \
  do {                                                                                     \
    const cudnnStatus_t strata_cudnn_status_ = (expr);                                     \
    if (strata_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                      \
      ::strata::cuda::detail::throw_cudnn_error(strata_cudnn_status_, #expr, __FILE__, __LINE__); \
  } while (0)

STRATA_NAMESPACE_BEGIN
namespace cuda {
namespace sdpa {

namespace fe = cudnn_frontend;

// Tensor ids of the variant pack.
enum tensor_uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kDO, kDQ, kDK, kDV };

template <class T>
constexpr fe::DataType_t io_type() {
  static_assert(is_half_v<T>, "cuDNN attention in strata takes bf16 or fp16 elements; float and double use the "
                              "flash kernels of flash_attention.hpp.");
  if constexpr (std::is_same_v<T, bf16>) return fe::DataType_t::BFLOAT16;
  else return fe::DataType_t::HALF;
}

// A built graph, or the reason cuDNN refused the shape.
struct graph_entry {
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace_bytes = 0;
  std::string refusal;  // empty when the graph is usable
};

struct shape {
  std::int64_t s, b, heads, groups, d;
  AttentionStrides strides;  // resolved: of q, dq and of k, v, dk, dv
  bool causal = true;        // false: no mask (a context-parallel block wholly in the past)
};

// Where one tensor's heads lie: elements between [s, b] positions and between heads.
struct head_layout {
  std::int64_t row, head;
};
inline head_layout contiguous(std::int64_t heads, std::int64_t d) { return {heads * d, d}; }

inline std::shared_ptr<fe::graph::Tensor_attributes> strided(fe::graph::Graph& graph, const char* name,
                                                             std::int64_t uid, std::int64_t b, std::int64_t h,
                                                             std::int64_t s, std::int64_t d, head_layout at) {
  // storage (t, batch, head, e) at (t b + batch) row + head stride + e, seen as (b, h, s, d)
  return graph.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({b, h, s, d}).set_stride(
      {at.row, at.head, b * at.row, 1}));
}

inline void set_strided(fe::graph::Tensor_attributes& t, std::int64_t uid, std::int64_t b, std::int64_t h,
                        std::int64_t s, std::int64_t d, head_layout at) {
  t.set_output(true).set_uid(uid).set_dim({b, h, s, d}).set_stride({at.row, at.head, b * at.row, 1});
}

inline std::shared_ptr<fe::graph::Tensor_attributes> scale_input(fe::graph::Graph& graph) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name("attn_scale")
                          .set_uid(kScale)
                          .set_dim({1, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_is_pass_by_value(true)
                          .set_data_type(fe::DataType_t::FLOAT));
}

// validate, lower, pick an engine by heuristics A, build; any refusal is recorded, not thrown. With
// `all_plans`, every engine configuration heuristics A and the fallback list offer is built (the
// first is heuristics A's choice; execute_plan_at_index runs any of them) and the workspace is the
// largest any of them needs.
inline graph_entry finish(std::shared_ptr<fe::graph::Graph> graph, cudnnHandle_t handle, bool all_plans = false) {
  graph_entry entry;
  auto refuse = [&](const char* step, fe::error_t status) {
    entry.refusal = std::string(step) + ": " + status.get_message();
    return entry;
  };
  if (auto st = graph->validate(); !st.is_good()) return refuse("validate", st);
  if (auto st = graph->build_operation_graph(handle); !st.is_good()) return refuse("build_operation_graph", st);
  const std::vector<fe::HeurMode_t> modes =
      all_plans ? std::vector<fe::HeurMode_t>{fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK} : std::vector<fe::HeurMode_t>{fe::HeurMode_t::A};
  if (auto st = graph->create_execution_plans(modes); !st.is_good()) return refuse("create_execution_plans", st);
  if (auto st = graph->check_support(handle); !st.is_good()) return refuse("check_support", st);
  if (auto st = graph->build_plans(handle, all_plans ? fe::BuildPlanPolicy_t::ALL : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
      !st.is_good())
    return refuse("build_plans", st);
  if (auto st = graph->get_workspace_size(entry.workspace_bytes); !st.is_good())
    return refuse("get_workspace_size", st);
  if (all_plans)
    for (std::int64_t i = 0; i < graph->get_execution_plan_count(); ++i) {
      std::int64_t bytes = 0;
      if (graph->get_workspace_size_plan_at_index(i, bytes).is_good()) entry.workspace_bytes = std::max(entry.workspace_bytes, bytes);
    }
  entry.graph = std::move(graph);
  return entry;
}

template <class T>
graph_entry build_forward(cudnnHandle_t handle, const shape& x, bool all_plans = false) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(io_type<T>())
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const head_layout q_at{x.strides.q_row, x.strides.q_head}, kv_at{x.strides.kv_row, x.strides.kv_head};
  auto q = strided(*graph, "Q", kQ, x.b, x.heads, x.s, x.d, q_at);
  auto k = strided(*graph, "K", kK, x.b, x.groups, x.s, x.d, kv_at);
  auto v = strided(*graph, "V", kV, x.b, x.groups, x.s, x.d, kv_at);
  auto options = fe::graph::SDPA_attributes()
                     .set_name(x.causal ? "causal_gqa_attention" : "gqa_attention")
                     .set_generate_stats(true)
                     .set_causal_mask(x.causal)
                     .set_attn_scale(scale_input(*graph));
  auto [o, stats] = graph->sdpa(q, k, v, options);
  set_strided(*o, kO, x.b, x.heads, x.s, x.d, contiguous(x.heads, x.d));
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({x.b, x.heads, x.s, 1})
      .set_stride({x.heads * x.s, x.s, 1, 1});  // [b, heads, s]
  return finish(std::move(graph), handle, all_plans);
}

template <class T>
graph_entry build_backward(cudnnHandle_t handle, const shape& x, bool deterministic = true, bool all_plans = false) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(io_type<T>())
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const head_layout q_at{x.strides.q_row, x.strides.q_head}, kv_at{x.strides.kv_row, x.strides.kv_head};
  auto q = strided(*graph, "Q", kQ, x.b, x.heads, x.s, x.d, q_at);
  auto k = strided(*graph, "K", kK, x.b, x.groups, x.s, x.d, kv_at);
  auto v = strided(*graph, "V", kV, x.b, x.groups, x.s, x.d, kv_at);
  auto o = strided(*graph, "O", kO, x.b, x.heads, x.s, x.d, contiguous(x.heads, x.d));
  auto dout = strided(*graph, "dO", kDO, x.b, x.heads, x.s, x.d, contiguous(x.heads, x.d));
  auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                 .set_name("Stats")
                                 .set_uid(kStats)
                                 .set_dim({x.b, x.heads, x.s, 1})
                                 .set_stride({x.heads * x.s, x.s, 1, 1})
                                 .set_data_type(fe::DataType_t::FLOAT));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name(x.causal ? "causal_gqa_attention_backward" : "gqa_attention_backward")
                     .set_causal_mask(x.causal)
                     .set_attn_scale(scale_input(*graph))
                     .set_deterministic_algorithm(deterministic);
  auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, o, dout, stats, options);
  set_strided(*dq, kDQ, x.b, x.heads, x.s, x.d, q_at);
  set_strided(*dk, kDK, x.b, x.groups, x.s, x.d, kv_at);
  set_strided(*dv, kDV, x.b, x.groups, x.s, x.d, kv_at);
  return finish(std::move(graph), handle, all_plans);
}

inline void execute(const graph_entry& entry, cudnnHandle_t handle, std::unordered_map<std::int64_t, void*>& pack,
                    void* workspace) {
  if (auto st = entry.graph->execute(handle, pack, workspace); !st.is_good())
    fail<Error>("cuDNN attention: executing the graph failed: ", st.get_message());
}

}  // namespace sdpa
}  // namespace cuda
STRATA_NAMESPACE_END

#endif  // STRATA_WITH_CUDNN
