// strata/data/gpt_dataset.hpp: the GPT sample index over an indexed dataset, in Megatron-Core's
// style (GPTDataset._build_document_sample_shuffle_indices and helpers.cpp build_sample_idx).
//
// A "document" here is one sequence of the indexed dataset, as in Megatron's GPTDataset. The
// documents of an epoch are laid end to end and cut into samples of seq_length + 1 tokens that
// cross document boundaries; consecutive samples share one token (the last label of one sample is
// the first input of the next), so an epoch of T tokens gives (T - 1) / seq_length samples and the
// remainder is dropped. Three arrays describe it:
//
//   document_index  [epochs * documents]    document ids in visiting order; each epoch is its own
//                                           permutation of the documents (seeded by seed and epoch)
//   sample_index    [samples + 1, 2]        (position in document_index, token offset) where sample
//                                           i starts; sample i ends (inclusive) where i + 1 starts
//   shuffle_index   [samples]               the order samples are served in
//
// Epochs: the fewest whose tokens cover num_samples * seq_length + 1 (Megatron's _get_num_epochs).
// When the last epoch is needed for less than 80% of its samples, its samples are shuffled
// separately and come after all the full epochs' samples (Megatron's separate_final_epoch), so
// a partial final epoch does not push samples of the full epochs out of the first num_samples.
//
// Differences from Megatron, deliberately: documents are shuffled within each epoch (Megatron
// shuffles the tiled full epochs as one array), which gives every epoch exactly one pass over every
// token; the shuffles use strata's counter-based generator, so indices are deterministic for a seed
// on every platform but not equal to Megatron's numpy ones, and no index files are cached.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/rng.hpp"
#include "indexed_dataset.hpp"

STRATA_NAMESPACE_BEGIN
namespace data {

struct GptDatasetConfig {
  std::int64_t seq_length = 0;     // tokens fed to the model per sample; a sample holds seq_length + 1
  std::int64_t num_samples = -1;   // samples wanted (sets the number of epochs); -1: one epoch
  std::uint64_t seed = 1234;
  bool shuffle = true;             // false: documents and samples in file order (for inspection)
  std::int64_t vocab_size = 0;     // > 0: every token read must lie in [0, vocab_size) (FileError naming the .bin)
};

struct GptSampleIndex {
  std::int64_t seq_length = 0;
  std::int64_t num_epochs = 0;
  std::int64_t tokens_per_epoch = 0;
  bool separate_final_epoch = false;
  std::vector<std::int64_t> document_index{};  // [num_epochs * documents]
  std::vector<std::int64_t> sample_index{};    // [(size() + 1) * 2], pairs (document_index position, offset)
  std::vector<std::int64_t> shuffle_index{};   // [size()]

  std::int64_t size() const { return static_cast<std::int64_t>(shuffle_index.size()); }
  std::pair<std::int64_t, std::int64_t> start(std::int64_t unshuffled) const {
    auto k = static_cast<std::size_t>(2 * unshuffled);
    return {sample_index[k], sample_index[k + 1]};
  }
  // The stretches of documents that sample i (in served order) is made of, in order:
  // piece(document, begin, end) for tokens [begin, end) of each; length(document) is a document's
  // token count (the stretches before the last run to a document's end).
  template <class Length, class Piece>
  void for_each_piece(std::int64_t i, Length&& length, Piece&& piece) const {
    const std::int64_t j = shuffle_index[static_cast<std::size_t>(i)];
    auto [first_pos, first_offset] = start(j);
    auto [last_pos, last_offset] = start(j + 1);
    for (std::int64_t pos = first_pos; pos <= last_pos; ++pos) {
      const std::int64_t doc = document_index[static_cast<std::size_t>(pos)];
      const std::int64_t begin = pos == first_pos ? first_offset : 0;
      const std::int64_t end = pos == last_pos ? last_offset + 1 : static_cast<std::int64_t>(length(doc));
      piece(doc, begin, end);
    }
  }
};

namespace detail {

// Fisher-Yates shuffle of `values`, drawing from the counter-based generator under `key`.
inline void shuffle(std::span<std::int64_t> values, std::uint64_t key) {
  for (std::size_t i = values.size(); i > 1; --i) {
    rng::Block b = rng::bits(key, i);
    std::uint64_t r = (static_cast<std::uint64_t>(b[0]) << 32) | b[1];
    auto j = static_cast<std::size_t>((static_cast<unsigned __int128>(r) * i) >> 64);  // uniform in [0, i)
    std::swap(values[i - 1], values[j]);
  }
}

inline constexpr std::uint64_t kDocumentShuffleStream = 0x646f63;  // "doc"
inline constexpr std::uint64_t kSampleShuffleStream = 0x736d70;    // "smp"

}  // namespace detail

// Megatron's _get_num_epochs: the fewest epochs whose tokens cover num_samples * seq_length + 1.
inline std::int64_t gpt_num_epochs(std::int64_t tokens_per_epoch, std::int64_t seq_length, std::int64_t num_samples) {
  if (num_samples < 0) return 1;
  const std::int64_t wanted = num_samples * seq_length + 1;
  return std::max<std::int64_t>(1, (wanted + tokens_per_epoch - 1) / tokens_per_epoch);
}

// Builds the index over documents `documents` (ids into `document_lengths`).
inline GptSampleIndex build_gpt_sample_index(std::span<const std::int32_t> document_lengths,
                                             std::span<const std::int64_t> documents, const GptDatasetConfig& config) {
  const std::int64_t S = config.seq_length;
  if (S < 1) fail<ConfigError>("GPT dataset: seq_length must be >= 1, got ", S);
  if (documents.empty()) fail<ConfigError>("GPT dataset: no documents to sample from");
  GptSampleIndex index;
  index.seq_length = S;
  for (std::int64_t d : documents) {
    if (d < 0 || d >= static_cast<std::int64_t>(document_lengths.size()))
      fail<ConfigError>("GPT dataset: document ", d, " is out of range (", document_lengths.size(), " documents)");
    index.tokens_per_epoch += document_lengths[static_cast<std::size_t>(d)];
  }
  const std::int64_t T = index.tokens_per_epoch;
  if (T < S + 1)
    fail<ConfigError>("GPT dataset: the documents hold ", T, " tokens, fewer than one sample of seq_length + 1 = ", S + 1);
  index.num_epochs = gpt_num_epochs(T, S, config.num_samples);
  const std::int64_t E = index.num_epochs;

  // Separate final epoch (Megatron's rule, threshold 80%).
  std::int64_t samples_before_final = 0;
  if (E > 1) {
    samples_before_final = ((E - 1) * T - 1) / S;
    const std::int64_t from_final = config.num_samples - samples_before_final;
    const std::int64_t per_epoch = (T - 1) / S;
    index.separate_final_epoch = from_final < static_cast<std::int64_t>(0.80 * static_cast<double>(per_epoch));
  }

  // Document index: one permutation of the documents per epoch.
  const auto D = documents.size();
  index.document_index.resize(static_cast<std::size_t>(E) * D);
  for (std::int64_t e = 0; e < E; ++e) {
    std::span<std::int64_t> epoch(index.document_index.data() + static_cast<std::size_t>(e) * D, D);
    std::copy(documents.begin(), documents.end(), epoch.begin());
    if (config.shuffle)
      detail::shuffle(epoch, rng::mix(rng::mix(config.seed, detail::kDocumentShuffleStream), static_cast<std::uint64_t>(e)));
  }

  // Sample index (Megatron's build_sample_idx with drop_last_partial_sequence and one extra token).
  const std::int64_t num_samples = (E * T - 1) / S;
  index.sample_index.resize(static_cast<std::size_t>(2 * (num_samples + 1)));
  const auto& doc_index = index.document_index;
  auto length_at = [&](std::size_t pos) { return std::int64_t{document_lengths[static_cast<std::size_t>(doc_index[pos])]}; };
  std::size_t pos = 0;
  std::int64_t offset = 0;
  index.sample_index[0] = 0;
  index.sample_index[1] = 0;
  for (std::int64_t s = 1; s <= num_samples; ++s) {
    std::int64_t remaining = S + 1;
    while (remaining != 0) {
      const std::int64_t available = length_at(pos) - offset;
      remaining -= available;
      if (remaining <= 0) {
        offset += remaining + available - 1;  // the last token of this sample starts the next one
        remaining = 0;
      } else {
        if (pos + 1 == doc_index.size())
          fail<Error>("GPT dataset: internal error, sample ", s, " runs past the end of the document index");
        ++pos;
        offset = 0;
      }
    }
    index.sample_index[static_cast<std::size_t>(2 * s)] = static_cast<std::int64_t>(pos);
    index.sample_index[static_cast<std::size_t>(2 * s + 1)] = offset;
  }

  // Shuffle index.
  index.shuffle_index.resize(static_cast<std::size_t>(num_samples));
  std::iota(index.shuffle_index.begin(), index.shuffle_index.end(), std::int64_t{0});
  if (config.shuffle) {
    const std::uint64_t key = rng::mix(config.seed, detail::kSampleShuffleStream);
    std::span<std::int64_t> all(index.shuffle_index);
    if (index.separate_final_epoch) {
      detail::shuffle(all.first(static_cast<std::size_t>(samples_before_final)), rng::mix(key, 0));
      detail::shuffle(all.subspan(static_cast<std::size_t>(samples_before_final)), rng::mix(key, 1));
    } else {
      detail::shuffle(all, rng::mix(key, 0));
    }
  }
  return index;
}

inline GptSampleIndex build_gpt_sample_index(std::span<const std::int32_t> document_lengths, const GptDatasetConfig& config) {
  std::vector<std::int64_t> all(document_lengths.size());
  std::iota(all.begin(), all.end(), std::int64_t{0});
  return build_gpt_sample_index(document_lengths, all, config);
}

// Megatron's --split: "969,30,1" -> normalized weights. Quotes that a launch script leaves in the
// value ('99,1,0') and spaces around the numbers are ignored, as Megatron's parser (which picks the
// numbers out of the string) ignores them. As Megatron, at most three weights (train, validation,
// test); each a finite non-negative number, their sum finite and positive.
inline std::vector<double> parse_split(std::string_view text) {
  const std::string whole(text);
  auto trim = [](std::string_view t) {
    while (!t.empty() && (t.front() == ' ' || t.front() == '\'' || t.front() == '"')) t.remove_prefix(1);
    while (!t.empty() && (t.back() == ' ' || t.back() == '\'' || t.back() == '"')) t.remove_suffix(1);
    return t;
  };
  text = trim(text);
  std::vector<double> weights;
  while (!text.empty()) {
    auto comma = text.find_first_of(",/");
    std::string part(trim(text.substr(0, comma)));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    std::size_t used = 0;
    double w = 0;
    try {
      w = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size() || !(w >= 0) || !std::isfinite(w))
      fail<ConfigError>("--split '", whole, "': '", part, "' is not a finite non-negative number");
    weights.push_back(w);
  }
  if (weights.size() > 3)
    fail<ConfigError>("--split '", whole, "' has ", weights.size(),
                      " weights; give at most three (train, validation, test), e.g. 969,30,1");
  while (weights.size() < 3) weights.push_back(0.0);
  double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  if (!std::isfinite(sum))
    fail<ConfigError>("--split '", whole, "': the weights sum to more than a double can hold; give smaller weights, e.g. 969,30,1");
  if (sum <= 0) fail<ConfigError>("--split '", whole, "': the weights sum to ", sum, "; at least one must be positive");
  for (double& w : weights) w /= sum;
  return weights;
}

// Megatron's _get_split_indices: document ranges [bounds[i], bounds[i+1]) of `count` documents.
inline std::vector<std::int64_t> split_bounds(std::int64_t count, std::span<const double> normalized_weights) {
  std::vector<std::int64_t> bounds{0};
  for (double w : normalized_weights)
    bounds.push_back(bounds.back() + static_cast<std::int64_t>(std::llround(w * static_cast<double>(count))));
  const std::int64_t excess = bounds.back() - count;
  for (std::size_t i = 1; i < bounds.size(); ++i) bounds[i] = std::max<std::int64_t>(0, bounds[i] - excess);
  return bounds;
}

class GptDataset {
 public:
  // Samples over sequences `documents` of `dataset` (a split); empty: all sequences.
  GptDataset(std::shared_ptr<const IndexedDataset> dataset, GptDatasetConfig config, std::vector<std::int64_t> documents = {})
      : dataset_(std::move(dataset)), config_(config) {
    if (!dataset_) fail<ConfigError>("GptDataset: no indexed dataset given");
    if (documents.empty()) {
      documents.resize(static_cast<std::size_t>(dataset_->size()));
      std::iota(documents.begin(), documents.end(), std::int64_t{0});
    }
    try {
      index_ = build_gpt_sample_index(dataset_->sequence_lengths(), documents, config_);
    } catch (const ConfigError& e) {
      fail<ConfigError>(e.what(), " (dataset '", dataset_->path_prefix(), "')");
    }
  }

  std::int64_t size() const { return index_.size(); }
  std::int64_t seq_length() const { return config_.seq_length; }
  std::int64_t sample_length() const { return config_.seq_length + 1; }
  std::int64_t num_epochs() const { return index_.num_epochs; }
  const GptDatasetConfig& config() const { return config_; }
  const GptSampleIndex& index() const { return index_; }
  const IndexedDataset& indexed_dataset() const { return *dataset_; }

  // The seq_length + 1 tokens of sample i (in served order) into out.
  void sample(std::int64_t i, std::span<std::int32_t> out) const {
    if (i < 0 || i >= size())
      fail<ConfigError>("sample ", i, " is out of range: the GPT dataset over '", dataset_->path_prefix(), "' has ",
                        size(), " samples");
    if (static_cast<std::int64_t>(out.size()) != sample_length())
      fail<ShapeError>("GptDataset::sample needs room for ", sample_length(), " tokens, got ", out.size());
    std::size_t written = 0;
    const auto length = [&](std::int64_t doc) { return dataset_->sequence_length(doc); };
    index_.for_each_piece(i, length, [&](std::int64_t doc, std::int64_t begin, std::int64_t end) {
      const auto count = static_cast<std::size_t>(end - begin);
      dataset_->read_into(doc, begin, out.subspan(written, count));
      if (config_.vocab_size > 0)
        for (std::size_t k = written; k < written + count; ++k)
          if (out[k] < 0 || out[k] >= config_.vocab_size)
            fail<FileError>("'", bin_path(dataset_->path_prefix()), "': sequence ", doc, " holds token id ", out[k], " at position ",
                            begin + static_cast<std::int64_t>(k - written), ", outside the vocabulary of ", config_.vocab_size,
                            " tokens (--vocab-size, or the tokenizer's); tokenize the data with the model's tokenizer, or give "
                            "the vocabulary size it was tokenized with");
      written += count;
    });
  }
  std::vector<std::int32_t> sample(std::int64_t i) const {
    std::vector<std::int32_t> out(static_cast<std::size_t>(sample_length()));
    sample(i, out);
    return out;
  }

 private:
  std::shared_ptr<const IndexedDataset> dataset_;
  GptDatasetConfig config_;
  GptSampleIndex index_{};
};

}  // namespace data
STRATA_NAMESPACE_END
