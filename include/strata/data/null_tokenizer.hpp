// strata/data/null_tokenizer.hpp: `NullTokenizer`, Megatron's --tokenizer-type NullTokenizer
// --vocab-size N: the text already holds the ids, written as decimal integers separated by single
// spaces ("17 4 1023"), for data that was tokenized elsewhere and for tests.
//
// Megatron's semantics (megatron/core/tokenizers NullTokenizer): the text is split on each ' ' (one space, not any
// whitespace: "1  2" holds an empty piece and is an error) and each piece is read as Python's int()
// reads it: surrounding whitespace ignored (so a trailing newline is fine), an optional sign,
// decimal digits with single '_' between them. The ids of the text are appended; nothing else
// (no bos, no eos). vocab_size() is N and EOD is N - 1, the last id (Megatron's default eod_id;
// its older _NullTokenizer had N + 1 ids with EOD N).
// decode() writes the ids back separated by single spaces.
//
// Stricter than Megatron, which takes any integer: an id outside [0, N - 1] (the EOD included) is
// an error naming the piece and its position, since no embedding row exists for it; so is an
// empty text (Python's int("") fails too) and a piece that is not an integer. Non-ASCII digits and
// non-ASCII whitespace, which Python's int() also takes, are refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../core/error.hpp"

STRATA_NAMESPACE_BEGIN
namespace data {

class NullTokenizer {
 public:
  // `vocab_size`: Megatron's --vocab-size N, the ids 0..N-1; EOD is N - 1.
  explicit NullTokenizer(std::int64_t vocab_size) : size_(vocab_size - 1) {
    if (vocab_size <= 1 || vocab_size > std::numeric_limits<std::int32_t>::max())
      fail<ConfigError>("--tokenizer-type NullTokenizer needs --vocab-size N with 1 < N <= 2^31 - 1 (the ids 0..N-1; EOD is N - 1), got ",
                        vocab_size);
  }

  std::int64_t vocab_size() const { return size_ + 1; }
  std::int32_t eod() const { return static_cast<std::int32_t>(size_); }

  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> out;
    encode_into(text, out);
    return out;
  }
  // Appends the ids written in `text` to `out` (ConfigError naming the piece if one is not an id).
  void encode_into(std::string_view text, std::vector<std::int32_t>& out) const {
    std::size_t start = 0, index = 0;
    while (true) {
      const std::size_t space = text.find(' ', start);
      const std::string_view piece = text.substr(start, space == std::string_view::npos ? std::string_view::npos : space - start);
      out.push_back(parse(piece, index, start));
      if (space == std::string_view::npos) break;
      start = space + 1;
      ++index;
    }
  }
  // The ids as text, separated by single spaces (EOD as its number).
  std::string decode(std::span<const std::int32_t> ids) const {
    std::string out;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out += std::to_string(ids[i]);
    }
    return out;
  }

 private:
  static bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); }

  std::int32_t parse(std::string_view piece, std::size_t index, std::size_t offset) const {
    const auto bad = [&](std::string_view why) -> std::int32_t {
      std::string shown(piece.substr(0, 40));
      fail<ConfigError>("NullTokenizer: piece ", index + 1, " (byte ", offset, ") \"", shown, piece.size() > 40 ? "..." : "", "\" ", why,
                        "; its text is ids 0..", size_, " (", size_, " is the end of document) separated by single spaces");
    };
    std::string_view s = piece;
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    if (s.empty()) return bad(piece.empty() ? "is empty (two spaces in a row, or a space at an end)" : "holds no digits");
    bool negative = false;
    if (s.front() == '+' || s.front() == '-') {
      negative = s.front() == '-';
      s.remove_prefix(1);
    }
    std::int64_t value = 0;
    bool digit_before = false;
    for (std::size_t k = 0; k < s.size(); ++k) {
      const char c = s[k];
      if (c == '_' && digit_before && k + 1 < s.size() && s[k + 1] >= '0' && s[k + 1] <= '9') {
        digit_before = false;
        continue;
      }
      if (c < '0' || c > '9') return bad("is not an integer");
      digit_before = true;
      if (value <= size_) value = value * 10 + (c - '0');
    }
    if (!digit_before) return bad("is not an integer");
    if (negative && value != 0) return bad("is negative");
    if (value > size_) return bad("is larger than the vocabulary");
    return static_cast<std::int32_t>(value);
  }

  std::int64_t size_;  // the largest id, the EOD: N - 1
};

}  // namespace data
STRATA_NAMESPACE_END
