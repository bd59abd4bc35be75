// strata/data/mock_dataset.hpp: `MockDataset`, uniformly random tokens addressed like a real
// dataset (Megatron's --mock-data): for benchmarks and smoke tests that must not depend on a corpus.
//
// Sample i holds seq_length + 1 tokens, token j = floor(u * vocab) with u the counter-based uniform
// draw rng::uniform(key, i * (seq_length + 1) + j): any sample, on any rank, in any order, is the
// same for one seed, and nothing is stored (size() is only the number of samples asked for).
#pragma once

#include <cstdint>
#include <span>

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "batch.hpp"

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

}  // namespace data
STRATA_NAMESPACE_END
