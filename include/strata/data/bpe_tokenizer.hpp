// strata/data/bpe_tokenizer.hpp: `BpeTokenizer`, GPT-2's byte-level BPE: Megatron's
// GPT2BPETokenizer, loaded from the same `vocab.json` and `merges.txt`, giving the same ids as
// Hugging Face `tokenizers` (ByteLevel pre-tokenizer, BPE model) and GPT-2's own encoder.
//
// Encoding a text takes three steps.
//  1. Pre-tokenization splits the text into words with GPT-2's pattern
//         's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     written out by hand (`gpt2_pre_tokenize`): at each position the first alternative that
//     matches wins; a run of whitespace followed by a word leaves its last character to that word
//     (so "a   b" is "a", "  ", " b"). Letters, numbers and whitespace are Unicode's classes, from
//     the generated table in unicode_tables.hpp (it names its Unicode version); everything else,
//     combining marks and emoji included, is "other".
//  2. Each byte of a word becomes one symbol: GPT-2 spells bytes as printable characters ('!'..'~',
//     U+00A1..U+00AC and U+00AE..U+00FF stand for themselves, the other 68 bytes become U+0100..
//     U+0143 in order, so a space is "Ġ"), and vocab.json names every token in that spelling.
//  3. BPE: the adjacent pair whose merge comes first in merges.txt is merged, the leftmost one
//     among equals, until no adjacent pair has a merge. This is what `tokenizers` does. GPT-2's
//     loop (merge every occurrence of the best pair, then look again), which Megatron runs, gives
//     the same ids whenever merges only use tokens made by earlier merges (true of trained files)
//     and no token is made by two merges; where a trained file has such a token (a trainer may
//     reach "abc" as "ab c" and later as "a bc"), a rare word can differ, and `tokenizers` is the
//     one followed here. Short words merge by scanning the pairs, long ones (a long run of spaces
//     or digits) through a heap, so no word costs more than O(n log n).
// The ids of a word depend only on its bytes, so each word's ids are cached (a fixed number of
// words; the first ones seen stay). Special tokens are not split out: "<|endoftext|>" inside a
// text is encoded as text, as Megatron's GPT2BPETokenizer does. `eod()` is its id, appended by
// the preprocessing tool.
//
// Bytes that are not UTF-8. Python's str and Rust's String cannot hold them, so neither GPT-2 nor
// `tokenizers` ever sees them (Megatron reads JSON text; `tokenizers` refuses invalid input). Here
// each byte that does not start a well-formed UTF-8 sequence (a stray continuation byte, an
// overlong form, a surrogate, a truncated sequence, 0xF5..0xFF) is one character of class "other",
// and its byte is an ordinary byte symbol. So every byte string encodes, and decode(encode(x)) == x
// for any bytes x, valid UTF-8 or not; on valid UTF-8 nothing changes.
//
// Files. vocab.json: one JSON object, token -> id (ids >= 0 and about dense, no id twice, no token
// twice); it must hold the 256 byte symbols (a byte-level vocabulary covers every byte, so nothing
// is ever unknown) and "<|endoftext|>". merges.txt: an optional "#version" line, then one merge per
// line, "a b" with a single space, in rank order (blank lines and a '\r' before the newline are
// ignored); a, b and ab must all be tokens of vocab.json, and no pair may come twice (GPT-2 and
// `tokenizers` would let the later one win; here it is an error). Every error is a FileError
// naming the file, the line where there is one, and what is wrong.
//
// A BpeTokenizer keeps its cache, so encoding is not const: give each thread its own copy; copies
// share the loaded vocabulary and merges.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/utf8.hpp"
#include "unicode_tables.hpp"

STRATA_NAMESPACE_BEGIN
namespace data {

// ---------------------------------------------------------------------------------------------
// Characters: UTF-8 decoding and the classes of the pre-tokenization pattern

using unicode::CharClass;

namespace detail {
constexpr std::array<CharClass, 128> make_ascii_classes() {
  std::array<CharClass, 128> classes{};
  std::size_t run = 0;
  constexpr std::size_t runs = std::size(unicode::kClassRuns);
  for (std::uint32_t cp = 0; cp < 128; ++cp) {
    while (run + 1 < runs && (unicode::kClassRuns[run + 1] >> 2) <= cp) ++run;
    classes[cp] = static_cast<CharClass>(unicode::kClassRuns[run] & 3u);
  }
  return classes;
}
inline constexpr std::array<CharClass, 128> kAsciiClasses = make_ascii_classes();
}  // namespace detail

// The class of code point `cp` in GPT-2's pattern: \p{L}, \p{N}, \s, or other.
inline CharClass char_class(char32_t cp) {
  if (cp < 128) return detail::kAsciiClasses[cp];
  const std::uint32_t key = (static_cast<std::uint32_t>(cp) << 2) | 3u;
  const auto* it = std::upper_bound(std::begin(unicode::kClassRuns), std::end(unicode::kClassRuns), key);
  return static_cast<CharClass>(*(it - 1) & 3u);
}

// One character of a byte string: its length in bytes and its code point. A byte that does not
// start a well-formed UTF-8 sequence is a character of its own with `valid` false.
struct Utf8Char {
  std::uint32_t length = 1;
  char32_t code_point = 0;
  bool valid = true;
};

// The character starting at text[i] (i < text.size()), decoded strictly (Unicode's table 3-7).
inline Utf8Char utf8_char_at(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return {1, b0, true};
  const std::size_t left = text.size() - i;
  const auto continuation = [&](std::size_t k, unsigned char low = 0x80, unsigned char high = 0xBF) {
    return k < left && byte(i + k) >= low && byte(i + k) <= high;
  };
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (continuation(1)) return {2, static_cast<char32_t>(((b0 & 0x1Fu) << 6) | (byte(i + 1) & 0x3Fu)), true};
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    const unsigned char low = b0 == 0xE0 ? 0xA0 : 0x80, high = b0 == 0xED ? 0x9F : 0xBF;
    if (continuation(1, low, high) && continuation(2))
      return {3, static_cast<char32_t>(((b0 & 0x0Fu) << 12) | ((byte(i + 1) & 0x3Fu) << 6) | (byte(i + 2) & 0x3Fu)), true};
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    const unsigned char low = b0 == 0xF0 ? 0x90 : 0x80, high = b0 == 0xF4 ? 0x8F : 0xBF;
    if (continuation(1, low, high) && continuation(2) && continuation(3))
      return {4,
              static_cast<char32_t>(((b0 & 0x07u) << 18) | ((byte(i + 1) & 0x3Fu) << 12) | ((byte(i + 2) & 0x3Fu) << 6) |
                                    (byte(i + 3) & 0x3Fu)),
              true};
  }
  return {1, b0, false};
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenization: GPT-2's pattern, by hand

namespace detail {
struct ClassedChar {
  std::uint32_t length;
  CharClass cls;
};
inline ClassedChar classed_char_at(std::string_view text, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(text[i]);
  if (b0 < 0x80) return {1, kAsciiClasses[b0]};
  const Utf8Char c = utf8_char_at(text, i);
  return {c.length, c.valid ? char_class(c.code_point) : CharClass::other};
}
// The end of the run of class `cls` that continues at `i`.
inline std::size_t class_run_end(std::string_view text, std::size_t i, CharClass cls) {
  while (i < text.size()) {
    const ClassedChar c = classed_char_at(text, i);
    if (c.cls != cls) break;
    i += c.length;
  }
  return i;
}
// The end of the pattern's match starting at `i` (i < text.size()).
inline std::size_t gpt2_piece_end(std::string_view text, std::size_t i) {
  const std::size_t n = text.size();
  // 's|'t|'re|'ve|'m|'ll|'d (lower case only)
  if (text[i] == '\'' && i + 1 < n) {
    const char a = text[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 < n) {
      const char b = text[i + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
  }
  // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: an optional space (U+0020 only), then a run of one class.
  if (text[i] == ' ' && i + 1 < n) {
    const ClassedChar next = classed_char_at(text, i + 1);
    if (next.cls != CharClass::whitespace) return class_run_end(text, i + 1 + next.length, next.cls);
  }
  const ClassedChar first = classed_char_at(text, i);
  if (first.cls != CharClass::whitespace) return class_run_end(text, i + first.length, first.cls);
  // `\s+(?!\S)`: the whole whitespace run if it ends the text, else all of it but its last
  // character (which then starts the next piece); `\s+` for a single whitespace character before
  // a non-space.
  std::size_t last_start = i, end = i;
  while (end < n) {
    const ClassedChar c = classed_char_at(text, end);
    if (c.cls != CharClass::whitespace) break;
    last_start = end;
    end += c.length;
  }
  if (end == n || last_start == i) return end;
  return last_start;
}
}  // namespace detail

// Calls on_piece(std::string_view) for each piece of `text` under GPT-2's pattern, in order; the
// pieces concatenate to `text`.
template <class OnPiece>
void gpt2_pre_tokenize(std::string_view text, OnPiece&& on_piece) {
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t end = detail::gpt2_piece_end(text, i);
    on_piece(text.substr(i, end - i));
    i = end;
  }
}

// The pieces of `text` under GPT-2's pattern.
inline std::vector<std::string_view> gpt2_pre_tokens(std::string_view text) {
  std::vector<std::string_view> pieces;
  gpt2_pre_tokenize(text, [&](std::string_view piece) { pieces.push_back(piece); });
  return pieces;
}

// ---------------------------------------------------------------------------------------------
// GPT-2's byte symbols

namespace detail {
constexpr bool byte_is_its_own_symbol(unsigned b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}
constexpr std::array<char32_t, 256> make_byte_symbols() {
  std::array<char32_t, 256> symbols{};
  char32_t next = 256;
  for (unsigned b = 0; b < 256; ++b) symbols[b] = byte_is_its_own_symbol(b) ? static_cast<char32_t>(b) : next++;
  return symbols;
}
inline constexpr std::array<char32_t, 256> kByteSymbols = make_byte_symbols();
inline constexpr char32_t kByteSymbolEnd = 256 + 68;  // symbols are < U+0144
constexpr std::array<std::int16_t, kByteSymbolEnd> make_symbol_bytes() {
  std::array<std::int16_t, kByteSymbolEnd> bytes{};
  for (auto& b : bytes) b = -1;
  for (unsigned b = 0; b < 256; ++b) bytes[kByteSymbols[b]] = static_cast<std::int16_t>(b);
  return bytes;
}
inline constexpr std::array<std::int16_t, kByteSymbolEnd> kSymbolBytes = make_symbol_bytes();
}  // namespace detail

// The character GPT-2's vocabulary spells byte `b` with ('a' for 'a', U+0120 'Ġ' for a space).
constexpr char32_t byte_symbol(std::uint8_t b) { return detail::kByteSymbols[b]; }
// The byte that character `symbol` spells, or -1 if it spells none.
constexpr int symbol_byte(char32_t symbol) { return symbol < detail::kByteSymbolEnd ? detail::kSymbolBytes[symbol] : -1; }

// ---------------------------------------------------------------------------------------------
// A small JSON reader for vocab.json (and for test programs reading JSON strings); its errors
// name the file, line and column.

namespace detail {
class JsonReader {
 public:
  JsonReader(std::string_view text, std::string_view file) : text_(text), file_(file) {}

  std::size_t position() const { return pos_; }
  bool at_end() const { return pos_ >= text_.size(); }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  char peek(std::string_view expected) const {
    if (at_end()) fail_at(pos_, "unexpected end of the text, expected ", expected);
    return text_[pos_];
  }
  void expect(char c, std::string_view what) {
    const char found = peek(what);
    if (found != c) fail_at(pos_, "expected ", what, ", found ", shown(found));
    ++pos_;
  }
  // A string literal, unescaped to UTF-8. A \u escape of half a surrogate pair is an error (it is
  // not a character).
  std::string string() {
    const std::size_t start = pos_;
    expect('"', "'\"' (a string)");
    std::string out;
    while (true) {
      if (at_end()) fail_at(start, "the string is not closed");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail_at(pos_, "a control character (byte ", static_cast<int>(c), ") inside a string must be escaped");
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      const std::size_t escape = pos_++;
      if (at_end()) fail_at(start, "the string is not closed");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          char32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (pos_ + 2 > text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u')
              fail_at(escape, "\\u", hex(cp), " is the first half of a surrogate pair without its second half");
            pos_ += 2;
            const char32_t low = hex4();
            if (low < 0xDC00 || low >= 0xE000)
              fail_at(escape, "\\u", hex(cp), " is the first half of a surrogate pair but \\u", hex(low), " is not a second half");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail_at(escape, "\\u", hex(cp), " is the second half of a surrogate pair without its first half");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail_at(escape, "unknown escape '\\", e, "'");
      }
    }
  }
  // A JSON integer (no fraction, no exponent) as int64; `what` names it in errors.
  std::int64_t integer(std::string_view what) {
    const std::size_t start = pos_;
    bool negative = false;
    if (!at_end() && text_[pos_] == '-') {
      negative = true;
      ++pos_;
    }
    if (at_end() || text_[pos_] < '0' || text_[pos_] > '9') fail_at(start, "expected ", what, " (an integer), found ", shown_rest(start));
    std::int64_t value = 0;
    while (!at_end() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      if (value > (std::numeric_limits<std::int64_t>::max() - 9) / 10) fail_at(start, what, " is too large");
      value = value * 10 + (text_[pos_++] - '0');
    }
    if (!at_end() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))
      fail_at(start, "expected ", what, " (an integer), found ", shown_rest(start));
    return negative ? -value : value;
  }

  std::int64_t line_of(std::size_t pos) const {
    return 1 + std::count(text_.begin(), text_.begin() + static_cast<std::ptrdiff_t>(std::min(pos, text_.size())), '\n');
  }
  template <class... Parts>
  [[noreturn]] void fail_at(std::size_t pos, const Parts&... parts) const {
    pos = std::min(pos, text_.size());
    const std::size_t line_start = text_.rfind('\n', pos == 0 ? 0 : pos - 1);
    const std::size_t column = line_start == std::string_view::npos || pos == 0 ? pos + 1 : pos - line_start;
    fail<FileError>("'", file_, "' line ", line_of(pos), ", column ", column, ": ", parts...);
  }

 private:
  char32_t hex4() {
    if (pos_ + 4 > text_.size()) fail_at(pos_, "truncated \\u escape");
    char32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text_[pos_];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<char32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<char32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<char32_t>(c - 'A' + 10);
      else fail_at(pos_, "bad hex digit ", shown(c), " in a \\u escape");
      ++pos_;
    }
    return v;
  }
  static std::string hex(char32_t v) {
    static constexpr char kDigits[] = "0123456789ABCDEF";
    std::string s(4, '0');
    for (int k = 3; k >= 0; --k, v >>= 4) s[static_cast<std::size_t>(k)] = kDigits[v & 0xF];
    return s;
  }
  static std::string shown(char c) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F)
      return "byte 0x" + hex(static_cast<unsigned char>(c)).substr(2);
    return std::string("'") + c + "'";
  }
  std::string shown_rest(std::size_t start) const {
    if (start >= text_.size()) return "the end of the text";
    std::string_view rest = text_.substr(start, 16);
    rest = rest.substr(0, std::min(rest.find('\n'), rest.size()));
    std::string quoted(1, '"');
    quoted.append(rest);
    quoted.push_back('"');
    return quoted;
  }

  std::string_view text_;
  std::string_view file_;
  std::size_t pos_ = 0;
};

// The whole content of `path`; `what` says what the file is, for the error.
inline std::string read_whole_file(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<FileError>("cannot open '", path, "' for reading (", what, ")");
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) fail<FileError>("error while reading '", path, "' (", what, ")");
  return text;
}

// Hashing of std::string keys that std::string_view can look up without a copy (where the
// standard library has C++20's heterogeneous lookup; a copy of the key otherwise).
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <class Map>
auto find_key(Map& map, std::string_view key) {
#if defined(__cpp_lib_generic_unordered_lookup)
  return map.find(key);
#else
  return map.find(std::string(key));
#endif
}

// Merge rank and merged id of each pair of ids: open addressing with linear probing, keys
// (left << 32) | right (ids are >= 0, so the all-ones key never occurs and marks an empty slot).
class PairMerges {
 public:
  struct Merge {
    std::int32_t rank;
    std::int32_t merged;
  };

  void reserve(std::size_t count) {
    std::size_t capacity = 16;
    int bits = 4;
    while (capacity < 2 * count) {
      capacity <<= 1;
      ++bits;
    }
    keys_.assign(capacity, kEmpty);
    values_.assign(capacity, Merge{0, 0});
    shift_ = 64 - bits;
    size_ = 0;
  }
  // Inserts the merge of (left, right); returns the merge already there instead if there is one.
  std::optional<Merge> insert(std::int32_t left, std::int32_t right, Merge merge) {
    if (2 * (size_ + 1) > keys_.size()) grow();
    const std::uint64_t key = key_of(left, right);
    std::size_t slot = slot_of(key);
    while (keys_[slot] != kEmpty) {
      if (keys_[slot] == key) return values_[slot];
      slot = (slot + 1) & (keys_.size() - 1);
    }
    keys_[slot] = key;
    values_[slot] = merge;
    ++size_;
    return std::nullopt;
  }
  const Merge* find(std::int32_t left, std::int32_t right) const {
    if (keys_.empty()) return nullptr;
    const std::uint64_t key = key_of(left, right);
    std::size_t slot = slot_of(key);
    while (true) {
      const std::uint64_t k = keys_[slot];
      if (k == key) return &values_[slot];
      if (k == kEmpty) return nullptr;
      slot = (slot + 1) & (keys_.size() - 1);
    }
  }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  static std::uint64_t key_of(std::int32_t left, std::int32_t right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }
  std::size_t slot_of(std::uint64_t key) const { return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  void grow() {
    std::vector<std::uint64_t> keys = std::move(keys_);
    std::vector<Merge> values = std::move(values_);
    reserve(std::max<std::size_t>(keys.size(), 8));
    for (std::size_t s = 0; s < keys.size(); ++s)
      if (keys[s] != kEmpty)
        insert(static_cast<std::int32_t>(keys[s] >> 32), static_cast<std::int32_t>(keys[s] & 0xFFFFFFFFu), values[s]);
  }

  std::vector<std::uint64_t> keys_;
  std::vector<Merge> values_;
  int shift_ = 60;
  std::size_t size_ = 0;
};

// What a BpeTokenizer loads: immutable, shared by copies.
struct BpeModel {
  std::string vocab_name;
  std::string merges_name;
  std::vector<std::string> tokens;                                            // by id; "" where no token has the id
  std::vector<std::uint8_t> has_id;                                           // by id
  std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>> ids;
  std::string id_bytes;                                                       // the bytes of every id, back to back
  std::vector<std::uint32_t> id_bytes_offset;                                 // id -> [offset[id], offset[id + 1])
  std::array<std::int32_t, 256> byte_ids{};                                   // the id of each byte's symbol
  PairMerges merges;
  std::int64_t merge_count = 0;
  std::int32_t eod = -1;
};

inline void load_vocabulary(BpeModel& model, std::string_view text) {
  JsonReader json(text, model.vocab_name);
  std::vector<std::size_t> where;  // by id: the position of its entry, for errors
  json.skip_space();
  if (json.at_end()) fail<FileError>("'", model.vocab_name, "' is empty; expected a JSON object of token -> id");
  json.expect('{', "'{' (vocab.json is one JSON object of token -> id)");
  json.skip_space();
  std::vector<std::pair<std::string, std::int32_t>> entries;
  std::vector<std::size_t> entry_positions;
  if (json.peek("a token or '}'") == '}') {
    json.expect('}', "'}'");
  } else {
    while (true) {
      json.skip_space();
      const std::size_t entry = json.position();
      std::string token = json.string();
      json.skip_space();
      json.expect(':', "':' after the token");
      json.skip_space();
      const std::size_t value_position = json.position();
      const std::int64_t id = json.integer("the token's id");
      if (id < 0 || id > std::numeric_limits<std::int32_t>::max())
        json.fail_at(value_position, "id ", id, " of token \"", token, "\" is outside [0, 2^31)");
      entries.emplace_back(std::move(token), static_cast<std::int32_t>(id));
      entry_positions.push_back(entry);
      json.skip_space();
      const char c = json.peek("',' or '}'");
      if (c == ',') {
        json.expect(',', "','");
        continue;
      }
      json.expect('}', "',' or '}' after an entry");
      break;
    }
  }
  json.skip_space();
  if (!json.at_end()) json.fail_at(json.position(), "unexpected text after the vocabulary object");
  if (entries.empty()) fail<FileError>("'", model.vocab_name, "' holds no tokens");

  std::int32_t largest = 0;
  for (const auto& e : entries) largest = std::max(largest, e.second);
  if (static_cast<std::size_t>(largest) > 2 * entries.size() + 1024)
    fail<FileError>("'", model.vocab_name, "' numbers ", entries.size(), " tokens with ids up to ", largest,
                    "; a BPE vocabulary numbers its tokens from 0 without large gaps");
  const auto size = static_cast<std::size_t>(largest) + 1;
  model.tokens.assign(size, std::string());
  model.has_id.assign(size, 0);
  where.assign(size, 0);
  model.ids.reserve(entries.size());
  for (std::size_t k = 0; k < entries.size(); ++k) {
    auto& [token, id] = entries[k];
    const auto slot = static_cast<std::size_t>(id);
    if (const auto it = find_key(model.ids, token); it != model.ids.end())
      json.fail_at(entry_positions[k], "token \"", token, "\" appears twice (first on line ",
                   json.line_of(where[static_cast<std::size_t>(it->second)]), ")");
    if (model.has_id[slot])
      json.fail_at(entry_positions[k], "id ", id, " is given to \"", token, "\" and, on line ", json.line_of(where[slot]), ", to \"",
                   model.tokens[slot], "\"; each id must name one token");
    model.ids.emplace(token, id);
    model.has_id[slot] = 1;
    model.tokens[slot] = std::move(token);
    where[slot] = entry_positions[k];
  }

  // The bytes each id stands for: its characters as byte symbols, or, for a token with a character
  // that is no byte symbol (an added token), its own UTF-8 text.
  model.id_bytes_offset.assign(size + 1, 0);
  model.id_bytes.clear();
  for (std::size_t id = 0; id < size; ++id) {
    model.id_bytes_offset[id] = static_cast<std::uint32_t>(model.id_bytes.size());
    if (!model.has_id[id]) continue;
    const std::string& token = model.tokens[id];
    std::string bytes;
    bool all_symbols = true;
    for (std::size_t i = 0; i < token.size();) {
      const Utf8Char c = utf8_char_at(token, i);
      if (!c.valid) json.fail_at(where[id], "token \"", token, "\" is not valid UTF-8");
      const int b = symbol_byte(c.code_point);
      if (b < 0) all_symbols = false;
      bytes.push_back(static_cast<char>(b));
      i += c.length;
    }
    model.id_bytes += all_symbols ? bytes : token;
  }
  model.id_bytes_offset[size] = static_cast<std::uint32_t>(model.id_bytes.size());

  for (unsigned b = 0; b < 256; ++b) {
    std::string symbol;
    append_utf8(symbol, byte_symbol(static_cast<std::uint8_t>(b)));
    const auto it = find_key(model.ids, symbol);
    if (it == model.ids.end())
      fail<FileError>("'", model.vocab_name, "' has no token \"", symbol, "\" for byte ", b,
                      ": a byte-level BPE vocabulary holds all 256 byte symbols (GPT-2's vocab.json does)");
    model.byte_ids[b] = it->second;
  }
  const auto eod = find_key(model.ids, "<|endoftext|>");
  if (eod == model.ids.end())
    fail<FileError>("'", model.vocab_name, "' has no token \"<|endoftext|>\", the end-of-document token of GPT2BPETokenizer");
  model.eod = eod->second;
}

inline void load_merges(BpeModel& model, std::string_view text) {
  std::vector<std::pair<std::int64_t, std::string_view>> lines;  // (line number, merge line)
  std::int64_t line_number = 0;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    ++line_number;
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.starts_with("#version")) continue;
    lines.emplace_back(line_number, line);
  }
  model.merges.reserve(lines.size());
  std::vector<std::int64_t> line_of_rank;
  line_of_rank.reserve(lines.size());
  const auto at = [&](std::int64_t line) { return strata::detail::concat("'", model.merges_name, "' line ", line, ": "); };
  for (const auto& entry : lines) {
    const std::int64_t number = entry.first;
    const std::string_view line = entry.second;
    const std::size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() || line.find(' ', space + 1) != std::string_view::npos)
      fail<FileError>(at(number), "expected a merge \"<left> <right>\" (two tokens and one space), found \"", line, "\"");
    const std::string_view left = line.substr(0, space), right = line.substr(space + 1);
    const auto find = [&](std::string_view token, std::string_view role) {
      const auto it = find_key(model.ids, token);
      if (it == model.ids.end())
        fail<FileError>(at(number), "the merge's ", role, " \"", token, "\" is not a token of '", model.vocab_name, "'");
      return it->second;
    };
    const std::int32_t left_id = find(left, "left part");
    const std::int32_t right_id = find(right, "right part");
    const std::int32_t merged_id = find(std::string(left) + std::string(right), "result");
    const auto rank = static_cast<std::int32_t>(line_of_rank.size());
    if (const auto earlier = model.merges.insert(left_id, right_id, {rank, merged_id}))
      fail<FileError>(at(number), "the merge \"", line, "\" was already given on line ",
                      line_of_rank[static_cast<std::size_t>(earlier->rank)]);
    line_of_rank.push_back(number);
  }
  model.merge_count = static_cast<std::int64_t>(line_of_rank.size());
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// The tokenizer

struct BpeOptions {
  std::size_t cache_words = std::size_t{1} << 16;  // words whose ids are kept (0: no cache)
  std::size_t cache_word_bytes = 256;               // longer words are not cached
  std::size_t linear_merge_limit = 64;              // words of at most this many bytes merge by scanning, longer
                                                    // ones through a heap (the same result; a speed choice)
};

class BpeTokenizer {
 public:
  static constexpr std::string_view kEndOfText = "<|endoftext|>";

  BpeTokenizer(const std::string& vocab_file, const std::string& merge_file, BpeOptions options = {})
      : BpeTokenizer(detail::read_whole_file(vocab_file, "the BPE vocabulary, vocab.json"),
                     detail::read_whole_file(merge_file, "the BPE merges, merges.txt"), options, vocab_file, merge_file) {}

  // From the files' contents; the names are used in error messages.
  static BpeTokenizer from_text(std::string_view vocab_json, std::string_view merges_text, BpeOptions options = {},
                                std::string vocab_name = "vocab.json", std::string merges_name = "merges.txt") {
    return BpeTokenizer(vocab_json, merges_text, options, std::move(vocab_name), std::move(merges_name));
  }

  // Largest id + 1: the size of an embedding that holds every id (for GPT-2's dense vocabulary,
  // the number of tokens, 50257).
  std::int64_t vocab_size() const { return static_cast<std::int64_t>(model_->tokens.size()); }
  std::int32_t eod() const { return model_->eod; }
  std::int64_t merge_count() const { return model_->merge_count; }
  const std::string& vocab_file() const { return model_->vocab_name; }
  const std::string& merge_file() const { return model_->merges_name; }

  // The id of `token` (spelled with byte symbols, as in vocab.json), if it is one.
  std::optional<std::int32_t> token_to_id(std::string_view token) const {
    const auto it = detail::find_key(model_->ids, token);
    if (it == model_->ids.end()) return std::nullopt;
    return it->second;
  }
  // The vocabulary's spelling of `id`.
  const std::string& id_to_token(std::int32_t id) const {
    check_id(id, 0, "id_to_token");
    return model_->tokens[static_cast<std::size_t>(id)];
  }

  std::vector<std::int32_t> encode(std::string_view text) {
    std::vector<std::int32_t> out;
    out.reserve(text.size() / 3 + 1);
    encode_into(text, out);
    return out;
  }
  // Appends the ids of `text` to `out`.
  void encode_into(std::string_view text, std::vector<std::int32_t>& out) {
    gpt2_pre_tokenize(text, [&](std::string_view word) { encode_word(word, out); });
  }
  // The bytes the ids stand for ("<|endoftext|>" for EOD, as GPT-2 decodes it).
  std::string decode(std::span<const std::int32_t> ids) const {
    std::string out;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      check_id(ids[i], i, "decode");
      const auto id = static_cast<std::size_t>(ids[i]);
      const std::uint32_t begin = model_->id_bytes_offset[id], end = model_->id_bytes_offset[id + 1];
      out.append(model_->id_bytes, begin, end - begin);
    }
    return out;
  }

  std::size_t cached_words() const { return cache_.size(); }

 private:
  BpeTokenizer(std::string_view vocab_json, std::string_view merges_text, BpeOptions options, std::string vocab_name,
               std::string merges_name)
      : options_(options) {
    auto model = std::make_shared<detail::BpeModel>();
    model->vocab_name = std::move(vocab_name);
    model->merges_name = std::move(merges_name);
    detail::load_vocabulary(*model, vocab_json);
    detail::load_merges(*model, merges_text);
    model_ = std::move(model);
  }

  void check_id(std::int32_t id, std::size_t position, std::string_view where) const {
    if (id < 0 || id >= vocab_size() || !model_->has_id[static_cast<std::size_t>(id)])
      fail<ConfigError>("BpeTokenizer::", where, ": token ", id, " at position ", position, " is not in the vocabulary of '",
                        model_->vocab_name, "' (ids 0..", vocab_size() - 1, ")");
  }

  struct CachedIds {
    std::uint32_t offset;
    std::uint32_t length;
  };
  // merge_with_heap's symbols (a linked list over the word's bytes) and candidate merges.
  struct Symbol {
    std::int32_t id;
    std::int32_t prev;
    std::int32_t next;
    bool alive;
  };
  struct Candidate {
    std::int32_t rank;
    std::int32_t position;
    bool operator>(const Candidate& other) const { return rank != other.rank ? rank > other.rank : position > other.position; }
  };

  void encode_word(std::string_view word, std::vector<std::int32_t>& out) {
    const detail::BpeModel& m = *model_;
    if (word.size() == 1) {
      out.push_back(m.byte_ids[static_cast<unsigned char>(word[0])]);
      return;
    }
    const bool cacheable = options_.cache_words > 0 && word.size() <= options_.cache_word_bytes;
    if (cacheable) {
      const auto it = detail::find_key(cache_, word);
      if (it != cache_.end()) {
        const auto begin = cache_ids_.begin() + it->second.offset;
        out.insert(out.end(), begin, begin + it->second.length);
        return;
      }
    }
    const std::size_t before = out.size();
    if (word.size() <= options_.linear_merge_limit) merge_by_scanning(word, out);
    else merge_with_heap(word, out);
    if (cacheable && cache_.size() < options_.cache_words) {
      const CachedIds entry{static_cast<std::uint32_t>(cache_ids_.size()), static_cast<std::uint32_t>(out.size() - before)};
      cache_ids_.insert(cache_ids_.end(), out.begin() + static_cast<std::ptrdiff_t>(before), out.end());
      cache_.emplace(std::string(word), entry);
    }
  }

  // Short words: the ranks of all adjacent pairs in an array; each step merges the leftmost pair
  // of lowest rank and looks up the two pairs it changed.
  void merge_by_scanning(std::string_view word, std::vector<std::int32_t>& out) {
    const detail::BpeModel& m = *model_;
    constexpr std::int32_t kNone = std::numeric_limits<std::int32_t>::max();
    auto& symbols = scan_symbols_;
    auto& ranks = scan_ranks_;  // ranks[i]: the rank of merging symbols[i] and symbols[i + 1]
    symbols.resize(word.size());
    for (std::size_t i = 0; i < word.size(); ++i) symbols[i] = m.byte_ids[static_cast<unsigned char>(word[i])];
    ranks.resize(word.size() - 1);
    const auto rank_of = [&](std::size_t i) {
      const auto* merge = m.merges.find(symbols[i], symbols[i + 1]);
      return merge ? merge->rank : kNone;
    };
    for (std::size_t i = 0; i + 1 < symbols.size(); ++i) ranks[i] = rank_of(i);
    while (!ranks.empty()) {
      std::size_t best = 0;
      for (std::size_t i = 1; i < ranks.size(); ++i)
        if (ranks[i] < ranks[best]) best = i;
      if (ranks[best] == kNone) break;
      symbols[best] = m.merges.find(symbols[best], symbols[best + 1])->merged;
      symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
      ranks.erase(ranks.begin() + static_cast<std::ptrdiff_t>(best));
      if (best > 0) ranks[best - 1] = rank_of(best - 1);
      if (best < ranks.size()) ranks[best] = rank_of(best);
    }
    out.insert(out.end(), symbols.begin(), symbols.end());
  }

  // Long words: symbols in a linked list, candidate merges in a min-heap by (rank, position).
  // A candidate is stale when its left symbol has been merged away or its pair has changed; the
  // pair's rank identifies it (no pair has two merges), so a stale one is recognised and dropped.
  void merge_with_heap(std::string_view word, std::vector<std::int32_t>& out) {
    const detail::BpeModel& m = *model_;
    auto& symbols = heap_symbols_;
    auto& heap = heap_candidates_;
    const auto n = static_cast<std::int32_t>(word.size());
    symbols.resize(word.size());
    for (std::int32_t i = 0; i < n; ++i)
      symbols[static_cast<std::size_t>(i)] = {m.byte_ids[static_cast<unsigned char>(word[static_cast<std::size_t>(i)])], i - 1,
                                              i + 1 < n ? i + 1 : -1, true};
    heap.clear();
    const auto push = [&](std::int32_t left) {
      const std::int32_t right = symbols[static_cast<std::size_t>(left)].next;
      if (right < 0) return;
      if (const auto* merge = m.merges.find(symbols[static_cast<std::size_t>(left)].id, symbols[static_cast<std::size_t>(right)].id)) {
        heap.push_back({merge->rank, left});
        std::push_heap(heap.begin(), heap.end(), std::greater<>{});
      }
    };
    for (std::int32_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
      const Candidate top = heap.back();
      heap.pop_back();
      Symbol& left = symbols[static_cast<std::size_t>(top.position)];
      if (!left.alive || left.next < 0) continue;
      Symbol& right = symbols[static_cast<std::size_t>(left.next)];
      const auto* merge = m.merges.find(left.id, right.id);
      if (!merge || merge->rank != top.rank) continue;
      left.id = merge->merged;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = top.position;
      if (left.prev >= 0) push(left.prev);
      push(top.position);
    }
    for (std::int32_t i = 0; i >= 0; i = symbols[static_cast<std::size_t>(i)].next) out.push_back(symbols[static_cast<std::size_t>(i)].id);
  }

  std::shared_ptr<const detail::BpeModel> model_;
  BpeOptions options_;
  std::unordered_map<std::string, CachedIds, detail::StringHash, std::equal_to<>> cache_;
  std::vector<std::int32_t> cache_ids_;
  std::vector<std::int32_t> scan_symbols_, scan_ranks_;
  std::vector<Symbol> heap_symbols_;
  std::vector<Candidate> heap_candidates_;
};

}  // namespace data
STRATA_NAMESPACE_END
