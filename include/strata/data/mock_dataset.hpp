// strata/data/mock_dataset.hpp: the two kinds of mock data, for runs that must not depend on a corpus.
//
// `MockGptDataset` is Megatron's --mock-data (MockGPTLowLevelDataset under MockGPTDataset): 100,000
// documents, document d of length L_d drawn uniformly from [1, 4096) holding the counting sequence
// 1, 2, ..., L_d - 1 (each modulo the vocabulary) followed by the end-of-document token; samples
// are cut from them by the GPT sample index (document shuffle, epochs, sample shuffle) exactly as
// from a real dataset, so a model learns them (the loss falls toward zero). The lengths come from
// strata's counter-based generator, not NumPy's, so the documents' lengths differ from Megatron's.
//
// `MockDataset` is strata's --mock-data-random: uniformly random tokens, which no model can learn
// below log(vocab); what benchmarks want (the loss does not collapse, the data costs nothing).
// Sample i holds seq_length + 1 tokens, token j = floor(u * vocab) with u the counter-based uniform
// draw rng::uniform(key, i * (seq_length + 1) + j): any sample, on any rank, in any order, is the
// same for one seed, and nothing is stored (size() is only the number of samples asked for).
#pragma once

#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "batch.hpp"
#include "gpt_dataset.hpp"

STRATA_NAMESPACE_BEGIN
namespace data {

class MockDataset {
 public:
  MockDataset(std::int64_t num_samples, std::int64_t seq_length, std::int64_t vocab_size, std::uint64_t seed)
      : size_(num_samples), seq_length_(seq_length), vocab_(vocab_size), key_(rng::mix(seed, 0x6d6f636bull)) {  // "mock"
    if (num_samples < 0) fail<ConfigError>("mock data: the number of samples must be >= 0, got ", num_samples);
    if (seq_length < 1) fail<ConfigError>("mock data: seq_length must be >= 1, got ", seq_length);
    if (vocab_size < 1 || vocab_size > (std::int64_t{1} << 31) - 1)
      fail<ConfigError>("mock data: the vocabulary must hold 1 to 2^31 - 1 tokens, got ", vocab_size);
  }

  std::int64_t size() const { return size_; }
  std::int64_t seq_length() const { return seq_length_; }

  void sample(std::int64_t i, std::span<std::int32_t> out) const {
    if (i < 0 || i >= size_) fail<ConfigError>("mock data: sample ", i, " is outside [0, ", size_, ")");
    if (static_cast<std::int64_t>(out.size()) != seq_length_ + 1)
      fail<ConfigError>("mock data: a sample has ", seq_length_ + 1, " tokens, the buffer holds ", out.size());
    const auto base = static_cast<std::uint64_t>(i) * static_cast<std::uint64_t>(seq_length_ + 1);
    for (std::size_t j = 0; j < out.size(); ++j) {
      const auto t = static_cast<std::int64_t>(rng::uniform(key_, base + j) * static_cast<double>(vocab_));
      out[j] = static_cast<std::int32_t>(t < vocab_ ? t : vocab_ - 1);
    }
  }

 private:
  std::int64_t size_, seq_length_, vocab_;
  std::uint64_t key_;
};
static_assert(SampleSource<MockDataset>);

class MockGptDataset {
 public:
  static constexpr std::int64_t kDocuments = 100000;        // MockGPTLowLevelDataset.size
  static constexpr std::int64_t kMaxDocumentLength = 4096;  // lengths in [1, kMaxDocumentLength)

  // config.num_samples samples of config.seq_length + 1 tokens over the documents of part
  // `split_index` of `split` (all documents when split is empty), as GptDataset does.
  MockGptDataset(const GptDatasetConfig& config, std::int64_t vocab_size, std::int64_t eod, std::span<const double> split = {},
                 int split_index = 0)
      : config_(config), vocab_(vocab_size), eod_(eod) {
    if (vocab_size < 2 || vocab_size > (std::int64_t{1} << 31) - 1)
      fail<ConfigError>("mock data: the vocabulary must hold 2 to 2^31 - 1 tokens, got ", vocab_size);
    if (eod < 0 || eod >= vocab_size)
      fail<ConfigError>("mock data: the end-of-document token ", eod, " is outside the vocabulary of ", vocab_size);
    const std::uint64_t key = rng::mix(0, 0x6d6f636b646f63ull);  // "mockdoc": fixed, as Megatron's seed 0
    lengths_.resize(static_cast<std::size_t>(kDocuments));
    for (std::int64_t d = 0; d < kDocuments; ++d) {
      const auto drawn = static_cast<std::int64_t>(rng::uniform(key, static_cast<std::uint64_t>(d)) * (kMaxDocumentLength - 1));
      lengths_[static_cast<std::size_t>(d)] = static_cast<std::int32_t>(1 + std::min(drawn, kMaxDocumentLength - 2));
    }
    std::int64_t begin = 0, end = kDocuments;
    if (!split.empty()) {
      if (split_index < 0 || split_index >= static_cast<int>(split.size()))
        fail<ConfigError>("mock data: split index ", split_index, " is outside the ", split.size(), " parts of the split");
      const auto bounds = split_bounds(kDocuments, split);
      begin = bounds[static_cast<std::size_t>(split_index)];
      end = bounds[static_cast<std::size_t>(split_index) + 1];
      if (end <= begin)
        fail<ConfigError>("mock data: --split leaves no document of the ", kDocuments, " mock documents for part ", split_index,
                          "; give that part weight in --split");
    }
    std::vector<std::int64_t> documents(static_cast<std::size_t>(end - begin));
    std::iota(documents.begin(), documents.end(), begin);
    index_ = build_gpt_sample_index(lengths_, documents, config_);
  }

  std::int64_t size() const { return index_.size(); }
  std::int64_t seq_length() const { return config_.seq_length; }
  std::int32_t document_length(std::int64_t d) const { return lengths_.at(static_cast<std::size_t>(d)); }
  // Token k of document d: k + 1 (modulo the vocabulary) before the last, the end of document last.
  std::int32_t token(std::int64_t d, std::int64_t k) const {
    return static_cast<std::int32_t>(k + 1 == document_length(d) ? eod_ : (k + 1) % vocab_);
  }

  void sample(std::int64_t i, std::span<std::int32_t> out) const {
    if (i < 0 || i >= size()) fail<ConfigError>("mock data: sample ", i, " is outside [0, ", size(), ")");
    if (static_cast<std::int64_t>(out.size()) != config_.seq_length + 1)
      fail<ConfigError>("mock data: a sample has ", config_.seq_length + 1, " tokens, the buffer holds ", out.size());
    std::size_t written = 0;
    index_.for_each_piece(i, [this](std::int64_t d) { return document_length(d); },
                          [&](std::int64_t doc, std::int64_t begin, std::int64_t end) {
                            for (std::int64_t k = begin; k < end; ++k) out[written++] = token(doc, k);
                          });
  }

 private:
  GptDatasetConfig config_;
  std::int64_t vocab_, eod_;
  std::vector<std::int32_t> lengths_;
  GptSampleIndex index_{};
};
static_assert(SampleSource<MockGptDataset>);

}  // namespace data
STRATA_NAMESPACE_END
