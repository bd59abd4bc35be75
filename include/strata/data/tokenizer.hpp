// strata/data/tokenizer.hpp: `ByteTokenizer`, the tokenizer that needs no vocabulary file: each
// byte of the UTF-8 input is one token (0..255) and the end-of-document token is 256, so the
// vocabulary has 257 entries. Any text round-trips exactly; it is what the shipped corpus and the
// tests use, and what a small model trains on when no BPE vocabulary is at hand.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../core/error.hpp"

STRATA_NAMESPACE_BEGIN
namespace data {

struct ByteTokenizer {
  static constexpr std::int32_t kEod = 256;
  static constexpr std::int64_t kVocabSize = 257;

  static constexpr std::int32_t eod() { return kEod; }
  static constexpr std::int64_t vocab_size() { return kVocabSize; }

  static std::vector<std::int32_t> encode(std::string_view text) {
    std::vector<std::int32_t> out;
    out.reserve(text.size());
    for (char c : text) out.push_back(static_cast<std::int32_t>(static_cast<unsigned char>(c)));
    return out;
  }
  // Appends the tokens of `text` to `out` (no allocation per document in a preprocessing loop).
  static void encode_into(std::string_view text, std::vector<std::int32_t>& out) {
    for (char c : text) out.push_back(static_cast<std::int32_t>(static_cast<unsigned char>(c)));
  }
  // Bytes back to text; each EOD becomes `eod_text` (nothing by default).
  static std::string decode(std::span<const std::int32_t> tokens, std::string_view eod_text = {}) {
    std::string out;
    out.reserve(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      std::int32_t t = tokens[i];
      if (t == kEod) {
        out += eod_text;
      } else if (t >= 0 && t < 256) {
        out.push_back(static_cast<char>(static_cast<unsigned char>(t)));
      } else {
        fail<ConfigError>("ByteTokenizer::decode: token ", t, " at position ", i, " is outside the vocabulary [0, ",
                          kVocabSize, ")");
      }
    }
    return out;
  }
};

}  // namespace data
STRATA_NAMESPACE_END
