// strata/layers/chunked_classifier.hpp: the output layer (a ColumnParallelLinear) and the
// vocab-parallel cross-entropy run together over blocks of rows, so the whole logits [rows, V/tp]
// never exist: one block of them does.
//
// `chunked_classifier` is training's form, where the gradient of each token's loss is known before
// the forward runs (dloss = loss_mask * loss_scale):
//
//   h [s, b, D]: replicated, or sharded<0> under sequence parallelism (all-gathered on the
//   sequence first, as the output layer's forward does); rows = s * b of the full sequence
//   for each block of rows [r0, r1), c = r1 - r0 <= chunk rows:
//     z   = h[r0:r1] W^T (+ b)                  (c, V/tp)  the one block buffer
//     m   = all-reduce-max(row max of z);  [S, z_t, Z] = all-reduce-sum(row sums)   (tp group)
//     loss[r0:r1], lse                         per row, as VocabParallelCrossEntropy::forward
//     z  <- dz = (softmax - targets) dloss     (c, V/tp)  written over z
//     dh[r0:r1] = dz W                          (c, D)     partial over tp
//     dW += dz^T h[r0:r1]  (db += sum_rows dz)  (V/tp, D) accumulated into the weight's gradient
//   dh: all-reduce over tp (f's backward), or reduce-scatter on the sequence under sequence
//   parallelism (the output layer's backward), to h's layout
//
// `chunked_classifier_loss` is the forward-only form (evaluation): z and the losses per block.
//
// The losses are the unfused path's up to the rounding of a GEMM over fewer rows; dW is summed
// block by block, so it too differs from the unfused single GEMM by rounding only. The block size
// (`ClassifierChunks`) is a tuning choice: a row count, or the rows whose logits fit a byte budget.
// Every tensor-parallel rank holds the same rows, so every rank runs the same blocks and collectives.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "../comm/parallel_context.hpp"
#include "column_parallel_linear.hpp"
#include "cross_entropy.hpp"
#include "layout.hpp"
#include "policy.hpp"

STRATA_NAMESPACE_BEGIN

// How many rows a block of the chunked classifier has: `rows` when it is positive, else as many as
// keep a block of logits [rows, V/tp] in the element type within `max_bytes` (at least one row),
// rounded down to a multiple of kRowGranule when there are that many, so that every block but the
// last fills whole GEMM tiles (GPT-2's 16384 rows of 50304 logits in bf16: blocks of 2560 rows,
// six and one of 1024, where 2668 would leave a last block of 376).
struct ClassifierChunks {
  static constexpr index_t kRowGranule = 256;
  index_t rows = 0;
  std::size_t max_bytes = std::size_t{256} << 20;  // 256 MiB

  void check() const {
    if (rows < 0)
      fail<ConfigError>("ClassifierChunks: rows=", rows, " must be at least 1, or 0 to derive the rows of a block from "
                        "max_bytes=", max_bytes);
  }
  index_t rows_for(index_t columns, std::size_t element_bytes) const {
    check();
    if (rows > 0) return rows;
    const std::size_t row_bytes =
        static_cast<std::size_t>(std::max<index_t>(columns, 1)) * std::max<std::size_t>(element_bytes, 1);
    const auto fit = static_cast<index_t>(std::min<std::size_t>(max_bytes / row_bytes, std::numeric_limits<index_t>::max()));
    if (fit >= kRowGranule) return fit - fit % kRowGranule;
    return std::max<index_t>(1, fit);
  }
};

// What chunked_classifier returns: the per-token losses [s, b] (in the accumulate type) and the
// gradient with respect to the classifier's input h, in h's layout.
template <class T, class Layout, class Space>
struct ClassifierResult {
  Tensor<accumulate_t<T>, Space> losses;
  Activation<T, Layout, Space> input_gradient;
};

namespace detail {

// The classifier's input over the full sequence (rows, D), checked against the output weight and
// the labels (host labels against the vocabulary too).
template <class Policy, ColumnOptions Options, class Layout>
Tensor<typename Policy::element, space_t<Policy>> classifier_input(
    context_t<Policy>& ctx, const ColumnParallelLinear<Policy, Options>& output,
    const VocabParallelCrossEntropy<Policy>& loss, const Activation<typename Policy::element, Layout, space_t<Policy>>& h,
    const Tensor<std::int32_t, space_t<Policy>>& labels, const char* who) {
  static_assert(!Options.gather_output && !Options.skip_bias_add,
                "chunked_classifier: the output layer must keep its logits sharded over the vocabulary and add its "
                "own bias (ColumnOptions{} without gather_output or skip_bias_add), as VocabParallelCrossEntropy "
                "expects them.");
  auto input = output.full_input(ctx, h);      // (rows, D), the full sequence
  const auto& weight = output.weight().value;  // (V/tp, D)
  const index_t rows = input.shape().rows(), features = input.shape().cols();
  if (features != weight.size(1))
    fail<ShapeError>(who, ": input ", input.shape().str(), " has ", features, " features, the output weight ",
                     weight.shape().str(), " expects ", weight.size(1));
  if (labels.numel() != rows)
    fail<ShapeError>(who, ": ", labels.numel(), " labels for ", rows, " rows of input ", input.shape().str(),
                     "; give one per token of the full sequence");
  if constexpr (std::is_same_v<space_t<Policy>, space::host>) loss.check_labels(labels, loss.vocabulary(ctx, weight.size(0)));
  return input;
}

// block(first row, rows) for each block of at most `chunk` rows of [0, rows), in order.
template <class Block>
void for_each_row_block(index_t rows, index_t chunk, Block&& block) {
  for (index_t r0 = 0; r0 < rows; r0 += chunk) block(r0, std::min(chunk, rows - r0));
}

}  // namespace detail

// h: the output layer's input; labels [s, b] and dloss [s, b] (the gradient of each token's loss)
// in the backend's space, over the full sequence (rows of h after the sequence gather). Accumulates
// the output layer's weight (and bias) gradient, returns the losses and dh. Host labels are checked
// here; device labels must have been checked on the host before their upload.
template <class Policy, ColumnOptions Options, class Layout>
ClassifierResult<typename Policy::element, typename ColumnParallelLinear<Policy, Options>::input_layout, space_t<Policy>>
chunked_classifier(context_t<Policy>& ctx, ColumnParallelLinear<Policy, Options>& output,
                   const VocabParallelCrossEntropy<Policy>& loss,
                   const Activation<typename Policy::element, Layout, space_t<Policy>>& h,
                   const Tensor<std::int32_t, space_t<Policy>>& labels,
                   const Tensor<accumulate_t<typename Policy::element>, space_t<Policy>>& dloss, ClassifierChunks chunks = {}) {
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Space = space_t<Policy>;
  if (dloss.numel() != labels.numel())
    fail<ShapeError>("chunked_classifier: ", dloss.numel(), " loss gradients for ", labels.numel(),
                     " labels; give one of each per token");
  const Tensor<T, Space> input = detail::classifier_input(ctx, output, loss, h, labels, "chunked_classifier");
  const index_t rows = input.shape().rows(), features = input.shape().cols(), local = output.weight().value.size(0);
  const index_t chunk = std::min(chunks.rows_for(local, sizeof(T)), std::max<index_t>(rows, 1));
  auto block = Tensor<T, Space>::empty(Shape{chunk, local});  // (chunk, V/tp): logits, then their gradient
  ClassifierResult<T, typename ColumnParallelLinear<Policy, Options>::input_layout, Space> result;
  result.losses = Tensor<A, Space>::empty(labels.shape());    // (s, b)
  auto partial_dx = Tensor<T, Space>::empty(input.shape());   // (rows, D), partial over tp
  detail::for_each_row_block(rows, chunk, [&](index_t r0, index_t c) {
    const T* x = input.data() + r0 * features;  // rows [r0, r0 + c) of (rows, D)
    output.forward_rows(ctx, x, c, block.data());
    loss.forward_backward_rows(ctx, block.data(), c, local, labels.data() + r0, dloss.data() + r0, result.losses.data() + r0);
    output.backward_rows(ctx, x, block.data(), c, partial_dx.data() + r0 * features);
  });
  result.input_gradient = output.reduce_input_gradient(ctx, Activation<T, layout::partial, Space>(std::move(partial_dx)));
  return result;
}

// Forward only: the per-token losses [s, b] of h against labels [s, b], block by block.
template <class Policy, ColumnOptions Options, class Layout>
Tensor<accumulate_t<typename Policy::element>, space_t<Policy>> chunked_classifier_loss(
    context_t<Policy>& ctx, const ColumnParallelLinear<Policy, Options>& output,
    const VocabParallelCrossEntropy<Policy>& loss, const Activation<typename Policy::element, Layout, space_t<Policy>>& h,
    const Tensor<std::int32_t, space_t<Policy>>& labels, ClassifierChunks chunks = {}) {
  using T = typename Policy::element;
  using A = accumulate_t<T>;
  using Space = space_t<Policy>;
  const Tensor<T, Space> input = detail::classifier_input(ctx, output, loss, h, labels, "chunked_classifier_loss");
  const index_t rows = input.shape().rows(), features = input.shape().cols(), local = output.weight().value.size(0);
  const index_t chunk = std::min(chunks.rows_for(local, sizeof(T)), std::max<index_t>(rows, 1));
  auto block = Tensor<T, Space>::empty(Shape{chunk, local});  // (chunk, V/tp): logits
  auto losses = Tensor<A, Space>::empty(labels.shape());      // (s, b)
  detail::for_each_row_block(rows, chunk, [&](index_t r0, index_t c) {
    output.forward_rows(ctx, input.data() + r0 * features, c, block.data());
    loss.forward_rows(ctx, block.data(), c, local, labels.data() + r0, losses.data() + r0);
  });
  return losses;
}

STRATA_NAMESPACE_END
