// strata/backend/activation_options.hpp: the options of the gated activations beyond SwiGLU
// (backend entry points glu_forward / glu_backward; CPU twin cpu/activation.hpp, CUDA
// cuda/kernels/activation.cuh).
//
//   gate_up [rows, 2f] holds [gate (f) | up (f)] in each row; y [rows, f]:
//     y = act(min(gate, clamp)) * (clamp(up, -clamp, clamp) + linear_offset)
//   act: silu(g) = g sigmoid(g) (SwiGLU), or quick_gelu(g) = g sigmoid(1.702 g) (Megatron's
//   --quick-geglu, gpt-oss). clamp = 0 clamps nothing (Megatron's --activation-func-clamp-value,
//   7.0 for gpt-oss); linear_offset is Megatron's --glu-linear-offset (1.0 for gpt-oss).
//   The clamps pass gradient where the input is inside them, bounds included (torch.clamp's backward).
//
// Squared ReLU (Megatron's --squared-relu, Nemotron): y = max(x, 0)^2, entry points
// squared_relu_forward / squared_relu_backward, not gated.
#pragma once

#include <type_traits>

#include "../core/config.hpp"

STRATA_NAMESPACE_BEGIN

enum class GluKind : int { silu, quick_gelu };

struct GluActivation {
  GluKind kind = GluKind::silu;
  double clamp = 0.0;          // 0: no clamp; else gate <= clamp and -clamp <= up <= clamp
  double linear_offset = 0.0;  // added to the (clamped) up half
};
static_assert(std::is_trivially_copyable_v<GluActivation>, "GluActivation is passed to kernels by value.");

// The sigmoid's slope of each kind: silu 1, quick_gelu 1.702.
STRATA_HOST_DEVICE inline double glu_alpha(GluKind kind) { return kind == GluKind::quick_gelu ? 1.702 : 1.0; }

// The MLP's activation by value (layers/mlp.hpp's MlpConfig::activation, models' ModelConfig;
// Megatron's --swiglu, --squared-relu, --quick-geglu); preset: the model's own.
enum class MlpActivation { preset, gelu, swiglu, squared_relu, quick_geglu };

inline const char* mlp_activation_name(MlpActivation a) {
  switch (a) {
    case MlpActivation::preset: return "the model's own";
    case MlpActivation::gelu: return "gelu";
    case MlpActivation::swiglu: return "swiglu";
    case MlpActivation::squared_relu: return "squared_relu";
    case MlpActivation::quick_geglu: return "quick_geglu";
  }
  return "?";
}

STRATA_NAMESPACE_END
