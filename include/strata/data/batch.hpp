// strata/data/batch.hpp: `Batch` (tokens, labels, loss mask of one micro-batch) and make_batch(),
// which fills one from any sample source (GptDataset, BlendedDataset, ...).
//
// A sample holds seq_length + 1 tokens x; the model reads tokens = x[0, S) and is scored on
// labels = x[1, S + 1) (next-token prediction). The loss mask is 1 everywhere unless
// eod_mask_loss is set, in which case positions whose *input* token is EOD get 0 (Megatron's
// --eod-mask-loss: the prediction made right after a document ends, which would have to guess the
// next document's first token, is not scored).
//
// Samples are addressed by their global index, so a trainer asks for "samples [k*mbs, (k+1)*mbs)";
// with data parallelism, Megatron's pretraining sampler gives data-parallel rank r the samples
// [consumed + r*mbs, consumed + (r+1)*mbs) of each global step, which micro_batch_first_sample()
// computes.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <vector>

#include "../core/tensor.hpp"

STRATA_NAMESPACE_BEGIN
namespace data {

// A source of fixed-length token samples addressed by a global index.
template <class Source>
concept SampleSource = requires(const Source& source, std::int64_t i, std::span<std::int32_t> out) {
  { source.size() } -> std::convertible_to<std::int64_t>;
  { source.seq_length() } -> std::convertible_to<std::int64_t>;
  source.sample(i, out);  // writes seq_length() + 1 tokens
};

struct Batch {
  Tensor<std::int32_t> tokens;  // [micro_batch, seq_length]
  Tensor<std::int32_t> labels;  // [micro_batch, seq_length]
  Tensor<float> loss_mask;      // [micro_batch, seq_length]
};

struct BatchOptions {
  std::int32_t eod_token = -1;  // the end-of-document token (needed by eod_mask_loss)
  bool eod_mask_loss = false;   // zero the loss where the input token is EOD
};

// The first global sample index of micro-batch `micro_step` of data-parallel rank `dp_rank` after
// `consumed_samples` samples (the global batch is micro_batch_size * dp_size * micro-steps).
constexpr std::int64_t micro_batch_first_sample(std::int64_t consumed_samples, std::int64_t micro_batch_size,
                                                std::int64_t dp_rank, std::int64_t dp_size, std::int64_t micro_step = 0) {
  return consumed_samples + (micro_step * dp_size + dp_rank) * micro_batch_size;
}

// Samples [first, first + count) of `source` as one micro-batch.
template <class Source>
Batch make_batch(const Source& source, std::int64_t first, std::int64_t count, const BatchOptions& options = {}) {
  static_assert(SampleSource<Source>,
                "make_batch needs a sample source: size(), seq_length() and sample(i, std::span<std::int32_t>) "
                "writing seq_length() + 1 tokens.");
  if (count < 1) fail<ConfigError>("make_batch: micro-batch size must be >= 1, got ", count);
  if (first < 0 || first + count > static_cast<std::int64_t>(source.size()))
    fail<ConfigError>("make_batch: samples [", first, ", ", first + count, ") are outside the dataset's ",
                      static_cast<std::int64_t>(source.size()), " samples");
  if (options.eod_mask_loss && options.eod_token < 0)
    fail<ConfigError>("make_batch: eod_mask_loss needs the eod_token");
  const std::int64_t S = source.seq_length();
  Batch batch{Tensor<std::int32_t>(Shape{count, S}), Tensor<std::int32_t>(Shape{count, S}),
              Tensor<float>(Shape{count, S}, 1.0f)};
  std::vector<std::int32_t> sample(static_cast<std::size_t>(S + 1));
  for (std::int64_t b = 0; b < count; ++b) {
    source.sample(first + b, std::span<std::int32_t>(sample));
    for (std::int64_t t = 0; t < S; ++t) {
      const auto k = static_cast<std::size_t>(t);
      batch.tokens[b * S + t] = sample[k];      // (b, t)
      batch.labels[b * S + t] = sample[k + 1];  // (b, t)
      if (options.eod_mask_loss && sample[k] == options.eod_token) batch.loss_mask[b * S + t] = 0.0f;
    }
  }
  return batch;
}

// Micro-batch k of size micro_batch_size: samples [k * micro_batch_size, (k + 1) * micro_batch_size).
template <class Source>
Batch micro_batch(const Source& source, std::int64_t k, std::int64_t micro_batch_size, const BatchOptions& options = {}) {
  return make_batch(source, k * micro_batch_size, micro_batch_size, options);
}

}  // namespace data
STRATA_NAMESPACE_END
