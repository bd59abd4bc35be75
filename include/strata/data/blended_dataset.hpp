// strata/data/blended_dataset.hpp: weighted blending of several sample sources, with Megatron's
// greedy rule (helpers.cpp build_blending_indices), and Megatron's `--data-path` syntax.
//
// For output sample s, with x = max(s, 1), pick the dataset i maximizing
//     error_i = weight_i * x - count_i          (count_i: samples taken from i so far)
// and take its next sample; on a tie the lowest index wins (strict '>' in a scan from 0). Weights
// are normalized first. This keeps every prefix of the blend within about one sample of its
// target proportions, deterministically and without random numbers. Two arrays come out:
//
//   dataset_index         [size]  which dataset sample s comes from
//   dataset_sample_index  [size]  the index of that sample inside its dataset
//
// `--data-path` is either one path prefix, "w1 p1 w2 p2 ..." (weights need not sum to 1), or
// several prefixes without weights, which are then blended in proportion to their sizes.
// Megatron builds each dataset of a blend of N samples with ceil(ceil(N * w) * 1.005) samples
// (blend_component_sizes), so the greedy rule never asks one for more than it has.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "batch.hpp"
#include "gpt_dataset.hpp"

STRATA_NAMESPACE_BEGIN
namespace data {

struct BlendIndex {
  std::vector<std::int16_t> dataset_index{};
  std::vector<std::int64_t> dataset_sample_index{};
};

inline std::vector<double> normalize_weights(std::span<const double> weights) {
  if (weights.empty()) fail<ConfigError>("blend: no weights given");
  double sum = 0;
  for (double w : weights) {
    if (!(w >= 0) || !std::isfinite(w)) fail<ConfigError>("blend: weight ", w, " is not a finite non-negative number");
    sum += w;
  }
  if (!std::isfinite(sum)) {
    std::ostringstream list;
    for (double w : weights) list << (list.tellp() > 0 ? " " : "") << w;
    fail<ConfigError>("blend: the weights ", list.str(), " sum to more than a double can hold; scale them down (only their ratios matter)");
  }
  if (sum <= 0) fail<ConfigError>("blend: the weights sum to ", sum, "; at least one must be positive");
  std::vector<double> out(weights.begin(), weights.end());
  for (double& w : out) w /= sum;
  return out;
}

// Megatron's build_blending_indices over normalized `weights`.
inline BlendIndex build_blending_indices(std::span<const double> weights, std::int64_t size) {
  if (weights.size() > 32767) fail<ConfigError>("blend: at most 32767 datasets, got ", weights.size());
  if (size < 0) fail<ConfigError>("blend: size must be >= 0, got ", size);
  const std::vector<double> w = normalize_weights(weights);
  BlendIndex out;
  out.dataset_index.resize(static_cast<std::size_t>(size));
  out.dataset_sample_index.resize(static_cast<std::size_t>(size));
  std::vector<std::int64_t> taken(w.size(), 0);
  for (std::int64_t s = 0; s < size; ++s) {
    const double x = std::max(static_cast<double>(s), 1.0);
    std::size_t best = 0;
    double best_error = w[0] * x - static_cast<double>(taken[0]);
    for (std::size_t i = 1; i < w.size(); ++i) {
      const double error = w[i] * x - static_cast<double>(taken[i]);
      if (error > best_error) {
        best_error = error;
        best = i;
      }
    }
    out.dataset_index[static_cast<std::size_t>(s)] = static_cast<std::int16_t>(best);
    out.dataset_sample_index[static_cast<std::size_t>(s)] = taken[best]++;
  }
  return out;
}

// Samples each dataset of a blend of `size` samples is built with (Megatron's 0.5% margin).
inline std::vector<std::int64_t> blend_component_sizes(std::span<const double> weights, std::int64_t size) {
  std::vector<std::int64_t> sizes;
  for (double w : normalize_weights(weights))
    sizes.push_back(static_cast<std::int64_t>(std::ceil(std::ceil(static_cast<double>(size) * w) * 1.005)));
  return sizes;
}

// A parsed `--data-path`.
struct DataBlend {
  std::vector<std::string> prefixes{};
  std::vector<double> weights{};  // empty: blend in proportion to dataset sizes
};

inline DataBlend parse_data_path(std::string_view text) {
  std::vector<std::string> words;
  {
    std::istringstream in{std::string(text)};
    for (std::string word; in >> word;) words.push_back(word);
  }
  if (words.empty()) fail<ConfigError>("--data-path is empty; give a path prefix or \"weight prefix weight prefix ...\"");
  auto as_number = [](const std::string& word, double& value) {
    std::size_t used = 0;
    try {
      value = std::stod(word, &used);
    } catch (const std::exception&) {
      return false;
    }
    return used == word.size();
  };
  DataBlend blend;
  if (words.size() == 1) {
    blend.prefixes = words;
    blend.weights = {1.0};
    return blend;
  }
  double value = 0;
  std::size_t numbers = 0;
  for (const auto& word : words) numbers += as_number(word, value) ? 1 : 0;
  if (numbers == 0) {
    blend.prefixes = words;
    return blend;
  }
  if (words.size() % 2 != 0)
    fail<ConfigError>("--data-path '", text, "': expected pairs \"weight prefix\", got an odd number (", words.size(),
                      ") of words");
  for (std::size_t i = 0; i < words.size(); i += 2) {
    if (!as_number(words[i], value))
      fail<ConfigError>("--data-path '", text, "': '", words[i], "' (word ", i + 1, ") should be a weight");
    if (!(value >= 0) || !std::isfinite(value))
      fail<ConfigError>("--data-path '", text, "': weight '", words[i], "' (word ", i + 1, ") is not a finite non-negative number");
    blend.weights.push_back(value);
    blend.prefixes.push_back(words[i + 1]);
  }
  normalize_weights(blend.weights);  // validates
  return blend;
}

template <class Source>
class BlendedDataset {
  static_assert(SampleSource<Source>, "BlendedDataset blends sample sources: size(), seq_length() and sample(i, out).");

 public:
  // Blends `datasets` into `size` samples; empty `weights`: in proportion to the datasets' sizes.
  BlendedDataset(std::vector<std::shared_ptr<const Source>> datasets, std::vector<double> weights, std::int64_t size)
      : datasets_(std::move(datasets)) {
    if (datasets_.empty()) fail<ConfigError>("BlendedDataset: no datasets given");
    for (std::size_t i = 0; i < datasets_.size(); ++i) {
      if (!datasets_[i]) fail<ConfigError>("BlendedDataset: dataset ", i, " is null");
      if (datasets_[i]->seq_length() != datasets_[0]->seq_length())
        fail<ConfigError>("BlendedDataset: dataset ", i, " has seq_length ", datasets_[i]->seq_length(),
                          " but dataset 0 has ", datasets_[0]->seq_length());
    }
    if (weights.empty())
      for (const auto& d : datasets_) weights.push_back(static_cast<double>(d->size()));
    if (weights.size() != datasets_.size())
      fail<ConfigError>("BlendedDataset: ", weights.size(), " weights for ", datasets_.size(), " datasets");
    weights_ = normalize_weights(weights);
    index_ = build_blending_indices(weights_, size);
    std::vector<std::int64_t> needed(datasets_.size(), 0);
    for (std::int16_t d : index_.dataset_index) ++needed[static_cast<std::size_t>(d)];
    for (std::size_t i = 0; i < datasets_.size(); ++i)
      if (needed[i] > static_cast<std::int64_t>(datasets_[i]->size()))
        fail<ConfigError>("BlendedDataset: dataset ", i, " must provide ", needed[i], " samples but has ",
                          static_cast<std::int64_t>(datasets_[i]->size()), "; build it with more samples (see blend_component_sizes)");
  }

  std::int64_t size() const { return static_cast<std::int64_t>(index_.dataset_index.size()); }
  std::int64_t seq_length() const { return datasets_[0]->seq_length(); }
  std::span<const double> weights() const { return weights_; }
  std::span<const std::int16_t> dataset_index() const { return index_.dataset_index; }
  std::span<const std::int64_t> dataset_sample_index() const { return index_.dataset_sample_index; }
  const Source& dataset(std::size_t i) const { return *datasets_.at(i); }
  std::size_t dataset_count() const { return datasets_.size(); }

  void sample(std::int64_t i, std::span<std::int32_t> out) const {
    if (i < 0 || i >= size()) fail<ConfigError>("sample ", i, " is out of range: the blend has ", size(), " samples");
    const auto k = static_cast<std::size_t>(i);
    datasets_[static_cast<std::size_t>(index_.dataset_index[k])]->sample(index_.dataset_sample_index[k], out);
  }
  std::vector<std::int32_t> sample(std::int64_t i) const {
    std::vector<std::int32_t> out(static_cast<std::size_t>(seq_length() + 1));
    sample(i, out);
    return out;
  }

 private:
  std::vector<std::shared_ptr<const Source>> datasets_;
  std::vector<double> weights_{};
  BlendIndex index_{};
};

// GPT datasets for every prefix of `blend`, blended into `num_samples` samples. Each dataset is
// built with its share of the samples (plus Megatron's margin) under config's seq_length and seed.
// With `split` (normalized weights, see parse_split), each dataset keeps only the sequences of part
// `split_index` (0 train, 1 validation, 2 test), as Megatron's --split does.
inline std::shared_ptr<const BlendedDataset<GptDataset>> build_blended_gpt_dataset(const DataBlend& blend,
                                                                                  GptDatasetConfig config,
                                                                                  std::int64_t num_samples,
                                                                                  std::span<const double> split = {},
                                                                                  int split_index = 0) {
  if (num_samples < 1) fail<ConfigError>("blended GPT dataset: num_samples must be >= 1, got ", num_samples);
  if (!split.empty() && (split_index < 0 || split_index >= static_cast<int>(split.size())))
    fail<ConfigError>("blended GPT dataset: split index ", split_index, " is outside the ", split.size(), " parts of the split");
  std::vector<std::shared_ptr<const IndexedDataset>> indexed;
  for (const auto& prefix : blend.prefixes) indexed.push_back(std::make_shared<const IndexedDataset>(prefix));
  std::vector<double> weights = blend.weights;
  if (weights.empty())
    for (const auto& d : indexed) weights.push_back(static_cast<double>(d->token_count()));
  const std::vector<std::int64_t> sizes = blend_component_sizes(weights, num_samples);
  std::vector<std::shared_ptr<const GptDataset>> datasets;
  for (std::size_t i = 0; i < indexed.size(); ++i) {
    GptDatasetConfig c = config;
    c.num_samples = sizes[i];
    std::vector<std::int64_t> documents;
    if (indexed[i]->token_count() == 0 && weights[i] > 0)
      fail<FileError>("dataset '", indexed[i]->path_prefix(), "' is empty: ", indexed[i]->path_prefix(), ".idx lists ",
                      indexed[i]->size(), " sequences and no token; give a dataset that holds tokens");
    if (!split.empty()) {
      const auto bounds = split_bounds(indexed[i]->size(), split);
      const auto begin = bounds[static_cast<std::size_t>(split_index)], end = bounds[static_cast<std::size_t>(split_index) + 1];
      if (end <= begin)
        fail<ConfigError>("dataset '", indexed[i]->path_prefix(), "': the split leaves no sequences for part ", split_index,
                          " (", indexed[i]->size(), " sequences in all); give that part more weight in --split");
      documents.resize(static_cast<std::size_t>(end - begin));
      std::iota(documents.begin(), documents.end(), begin);
    }
    datasets.push_back(std::make_shared<const GptDataset>(indexed[i], c, std::move(documents)));
  }
  return std::make_shared<const BlendedDataset<GptDataset>>(std::move(datasets), std::move(weights), num_samples);
}

inline std::shared_ptr<const BlendedDataset<GptDataset>> build_blended_gpt_dataset(std::string_view data_path,
                                                                                  GptDatasetConfig config,
                                                                                  std::int64_t num_samples,
                                                                                  std::span<const double> split = {},
                                                                                  int split_index = 0) {
  return build_blended_gpt_dataset(parse_data_path(data_path), config, num_samples, split, split_index);
}

}  // namespace data
STRATA_NAMESPACE_END
