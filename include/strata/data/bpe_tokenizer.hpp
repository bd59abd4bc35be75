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
//
// The BPE core (the model with its checks, `BpeWordEncoder`'s merge loop and cache) is shared with
// HuggingFaceTokenizer (huggingface_tokenizer.hpp), which reads the same model from tokenizer.json.
// vocab.json is read with the strict JSON reader of core/json.hpp.
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
#include "../core/file.hpp"
#include "../core/json.hpp"
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

// Whether `text` is well-formed UTF-8.
inline bool is_valid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Char c = utf8_char_at(text, i);
    if (!c.valid) return false;
    i += c.length;
  }
  return true;
}

// `text` as Python's bytes.decode("utf-8", errors="replace") sees it, back in UTF-8: each maximal
// ill-formed subpart (a byte that starts no sequence, or the longest start of a sequence that is
// cut short; Unicode's "best practice", section 3.9) becomes U+FFFD. Valid text comes back as it is.
inline std::string replace_invalid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  for (std::size_t i = 0; i < text.size();) {
    const Utf8Char c = utf8_char_at(text, i);
    if (c.valid) {
      out.append(text.substr(i, c.length));
      i += c.length;
      continue;
    }
    // The length of the well-formed prefix of the sequence the lead byte starts (at least 1).
    const unsigned char b0 = byte(i);
    std::size_t need = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
    else if (b0 >= 0xE0 && b0 <= 0xEF) need = 2, low = b0 == 0xE0 ? 0xA0 : 0x80, high = b0 == 0xED ? 0x9F : 0xBF;
    else if (b0 >= 0xF0 && b0 <= 0xF4) need = 3, low = b0 == 0xF0 ? 0x90 : 0x80, high = b0 == 0xF4 ? 0x8F : 0xBF;
    std::size_t length = 1;
    for (std::size_t k = 1; k <= need && i + k < text.size(); ++k) {
      const unsigned char b = byte(i + k);
      if (b < (k == 1 ? low : 0x80) || b > (k == 1 ? high : 0xBF)) break;
      ++length;
    }
    out.append("\xEF\xBF\xBD");
    i += length;
  }
  return out;
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

// Calls on_piece(std::string_view) for each piece of `text`, piece_end(text, i) giving the end of
// the piece that starts at i (a pre-tokenization pattern written out by hand); the pieces
// concatenate to `text`.
template <class PieceEnd, class OnPiece>
void for_each_piece(std::string_view text, PieceEnd piece_end, OnPiece&& on_piece) {
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t end = piece_end(text, i);
    on_piece(text.substr(i, end - i));
    i = end;
  }
}

// The pieces of for_each_piece, collected.
template <class PieceEnd>
std::vector<std::string_view> pieces_of(std::string_view text, PieceEnd piece_end) {
  std::vector<std::string_view> pieces;
  for_each_piece(text, piece_end, [&](std::string_view piece) { pieces.push_back(piece); });
  return pieces;
}
}  // namespace detail

// Calls on_piece(std::string_view) for each piece of `text` under GPT-2's pattern, in order; the
// pieces concatenate to `text`.
template <class OnPiece>
void gpt2_pre_tokenize(std::string_view text, OnPiece&& on_piece) {
  detail::for_each_piece(text, detail::gpt2_piece_end, on_piece);
}

// The pieces of `text` under GPT-2's pattern.
inline std::vector<std::string_view> gpt2_pre_tokens(std::string_view text) {
  return detail::pieces_of(text, detail::gpt2_piece_end);
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
// Files

namespace detail {
// The whole content of `path`; `what` says what the file is, for the error.
// Only a regular file is read, at most `max_bytes` of it (a tokenizer file by default).
inline std::string read_whole_file(const std::string& path, std::string_view what,
                                   std::uint64_t max_bytes = kMaxTokenizerBytes) {
  return ::strata::read_whole_file(path, what, max_bytes);
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

// ---------------------------------------------------------------------------------------------
// The byte-level BPE core, shared by BpeTokenizer (vocab.json + merges.txt) and
// HuggingFaceTokenizer (tokenizer.json): the vocabulary and merges, checked as they are loaded,
// and the merge loop with its word cache.

// What a byte-level BPE loads: immutable, shared by copies.
struct BpeModel {
  std::string vocab_name;                                                     // the file of the vocabulary, for errors
  std::string merges_name;                                                    // the file of the merges, for errors
  std::vector<std::string> tokens;                                            // by id; "" where no token has the id
  std::vector<std::uint8_t> has_id;                                           // by id
  std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>> ids;
  std::string id_bytes;                                                       // the bytes of every id, back to back
  std::vector<std::uint32_t> id_bytes_offset;                                 // id -> [offset[id], offset[id + 1])
  std::array<std::int32_t, 256> byte_ids{};                                   // the id of each byte's symbol
  PairMerges merges;
  std::int64_t merge_count = 0;
  bool ignore_merges = false;  // a word that is itself a token is that token, unmerged (tokenizers' ignore_merges)
};

// One token of a vocabulary as a file gives it; `offset` is where, for errors.
struct BpeVocabEntry {
  std::string token;  // spelled with byte symbols
  std::int64_t id;
  std::size_t offset;
};

// Fills the vocabulary of `model` from `entries`. `where(offset)` says where an entry is ("line 3,
// column 2 (byte 30)"); errors are FileErrors "'<vocab_name>' <where>: <what>".
inline void set_vocabulary(BpeModel& model, std::vector<BpeVocabEntry> entries,
                           const std::function<std::string(std::size_t)>& where) {
  const auto at = [&](std::size_t offset) { return strata::detail::concat("'", model.vocab_name, "' ", where(offset), ": "); };
  if (entries.empty()) fail<FileError>("'", model.vocab_name, "' holds no tokens");
  std::int64_t largest = 0;
  for (const auto& e : entries) {
    if (e.id < 0 || e.id > std::numeric_limits<std::int32_t>::max())
      fail<FileError>(at(e.offset), "id ", e.id, " of token \"", e.token, "\" is outside [0, 2^31)");
    largest = std::max(largest, e.id);
  }
  if (static_cast<std::size_t>(largest) > 2 * entries.size() + 1024)
    fail<FileError>("'", model.vocab_name, "' numbers ", entries.size(), " tokens with ids up to ", largest,
                    "; a BPE vocabulary numbers its tokens from 0 without large gaps");
  const auto size = static_cast<std::size_t>(largest) + 1;
  std::vector<std::size_t> offset_of(size, 0);  // by id: where its entry is, for errors
  model.tokens.assign(size, std::string());
  model.has_id.assign(size, 0);
  model.ids.reserve(entries.size());
  for (auto& [token, id64, offset] : entries) {
    const auto slot = static_cast<std::size_t>(id64);
    const auto id = static_cast<std::int32_t>(id64);
    if (const auto it = find_key(model.ids, token); it != model.ids.end())
      fail<FileError>(at(offset), "token \"", token, "\" appears twice (first at ",
                      where(offset_of[static_cast<std::size_t>(it->second)]), ")");
    if (model.has_id[slot])
      fail<FileError>(at(offset), "id ", id, " is given to \"", token, "\" and, at ", where(offset_of[slot]), ", to \"",
                      model.tokens[slot], "\"; each id must name one token");
    for (std::size_t i = 0; i < token.size();) {
      const Utf8Char c = utf8_char_at(token, i);
      if (!c.valid) fail<FileError>(at(offset), "token \"", token, "\" is not valid UTF-8");
      i += c.length;
    }
    model.ids.emplace(token, id);
    model.has_id[slot] = 1;
    model.tokens[slot] = std::move(token);
    offset_of[slot] = offset;
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
}

// Gives each (id, text) the bytes `text` when decoded (an added token decodes to its own text).
inline void set_id_bytes(BpeModel& model, const std::vector<std::pair<std::int32_t, std::string>>& texts) {
  if (texts.empty()) return;
  std::vector<const std::string*> replaced(model.tokens.size(), nullptr);
  for (const auto& [id, text] : texts) replaced[static_cast<std::size_t>(id)] = &text;
  std::string bytes;
  bytes.reserve(model.id_bytes.size());
  const auto size = model.tokens.size();
  for (std::size_t k = 0; k < size; ++k) {
    const std::uint32_t begin = model.id_bytes_offset[k], end = model.id_bytes_offset[k + 1];
    model.id_bytes_offset[k] = static_cast<std::uint32_t>(bytes.size());
    if (replaced[k]) bytes.append(*replaced[k]);
    else bytes.append(model.id_bytes, begin, end - begin);
  }
  model.id_bytes_offset[size] = static_cast<std::uint32_t>(bytes.size());
  model.id_bytes = std::move(bytes);
}

// One merge "left right" as a file gives it; `index` is passed to `where` for errors.
struct BpeMergeEntry {
  std::string_view left, right;
  std::size_t index;
};

// Fills the merges of `model`, in rank order. `where(index)` says where a merge is ("line 3",
// "model.merges[2]"); errors are FileErrors "'<merges_name>' <where>: <what>".
inline void set_merges(BpeModel& model, const std::vector<BpeMergeEntry>& merges,
                       const std::function<std::string(std::size_t)>& where) {
  model.merges.reserve(merges.size());
  std::vector<std::size_t> index_of_rank;
  index_of_rank.reserve(merges.size());
  std::string merged;
  for (const auto& entry : merges) {
    const auto at = [&] { return strata::detail::concat("'", model.merges_name, "' ", where(entry.index), ": "); };
    const auto find = [&](std::string_view token, std::string_view role) {
      const auto it = find_key(model.ids, token);
      if (it == model.ids.end())
        fail<FileError>(at(), "the merge's ", role, " \"", token, "\" is not a token of '", model.vocab_name, "'");
      return it->second;
    };
    const std::int32_t left_id = find(entry.left, "left part");
    const std::int32_t right_id = find(entry.right, "right part");
    merged.assign(entry.left);
    merged.append(entry.right);
    const std::int32_t merged_id = find(merged, "result");
    const auto rank = static_cast<std::int32_t>(index_of_rank.size());
    if (const auto earlier = model.merges.insert(left_id, right_id, {rank, merged_id}))
      fail<FileError>(at(), "the merge \"", entry.left, " ", entry.right, "\" was already given, at ",
                      where(index_of_rank[static_cast<std::size_t>(earlier->rank)]));
    index_of_rank.push_back(entry.index);
  }
  model.merge_count = static_cast<std::int64_t>(index_of_rank.size());
}
}  // namespace detail

struct BpeOptions {
  std::size_t cache_words = std::size_t{1} << 16;  // words whose ids are kept (0: no cache)
  std::size_t cache_word_bytes = 256;               // longer words are not cached
  std::size_t linear_merge_limit = 64;              // words of at most this many bytes merge by scanning, longer
                                                    // ones through a heap (the same result; a speed choice)
};

// The merge loop over a shared BpeModel: the ids of one pre-tokenized word (its bytes), with a
// cache of the words seen. Not const (the cache); copies share the model and keep their own cache.
class BpeWordEncoder {
 public:
  BpeWordEncoder() = default;
  BpeWordEncoder(std::shared_ptr<const detail::BpeModel> model, BpeOptions options) : model_(std::move(model)), options_(options) {}

  const detail::BpeModel& model() const { return *model_; }
  std::size_t cached_words() const { return cache_.size(); }

  // Appends the ids of `word` (raw bytes, one pre-tokenized piece) to `out`.
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) {
    const detail::BpeModel& m = *model_;
    if (word.empty()) return;
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
    if (!(m.ignore_merges && whole_word(word, out))) {
      if (word.size() <= options_.linear_merge_limit) merge_by_scanning(word, out);
      else merge_with_heap(word, out);
    }
    if (cacheable && cache_.size() < options_.cache_words) {
      const CachedIds entry{static_cast<std::uint32_t>(cache_ids_.size()), static_cast<std::uint32_t>(out.size() - before)};
      cache_ids_.insert(cache_ids_.end(), out.begin() + static_cast<std::ptrdiff_t>(before), out.end());
      cache_.emplace(std::string(word), entry);
    }
  }

 private:
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

  // ignore_merges: a word spelled as one token of the vocabulary is that token.
  bool whole_word(std::string_view word, std::vector<std::int32_t>& out) {
    spelled_.clear();
    for (char c : word) append_utf8(spelled_, byte_symbol(static_cast<std::uint8_t>(c)));
    const auto it = detail::find_key(model_->ids, spelled_);
    if (it == model_->ids.end()) return false;
    out.push_back(it->second);
    return true;
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
  std::string spelled_;
};

// ---------------------------------------------------------------------------------------------
// GPT-2's files: vocab.json and merges.txt

namespace detail {
inline void load_vocabulary(BpeModel& model, std::string_view text) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
    fail<FileError>("'", model.vocab_name, "' is empty; expected a JSON object of token -> id");
  const json::Value root = json::parse(text, strata::detail::concat("'", model.vocab_name, "' (the BPE vocabulary)"));
  const auto where = [&](std::size_t offset) { return json::position(text, offset); };
  if (!root.is_object())
    fail<FileError>("'", model.vocab_name, "' ", where(root.offset()), ": expected '{' (vocab.json is one JSON object of token -> id), found ",
                    json::Value::kind_name(root.kind()));
  std::vector<BpeVocabEntry> entries;
  entries.reserve(root.members().size());
  for (const auto& [token, value] : root.members()) {
    std::int64_t id = 0;
    if (!value.to_int64(id)) {
      if (value.is_number() && !value.text().empty() && value.text()[0] == '-' && value.text().find_first_of(".eE") == std::string::npos)
        fail<FileError>("'", model.vocab_name, "' ", where(value.offset()), ": id ", value.text(), " of token \"", token, "\" is outside [0, 2^31)");
      fail<FileError>("'", model.vocab_name, "' ", where(value.offset()), ": the id of token \"", token, "\" must be an integer, found ",
                      value.is_number() ? value.text() : std::string(json::Value::kind_name(value.kind())));
    }
    entries.push_back({token, id, value.offset()});
  }
  set_vocabulary(model, std::move(entries), where);
}

inline void load_merges(BpeModel& model, std::string_view text) {
  std::vector<BpeMergeEntry> merges;
  std::size_t line_number = 0;
  const auto at = [&](std::size_t line) { return strata::detail::concat("'", model.merges_name, "' line ", line, ": "); };
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    ++line_number;
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.starts_with("#version")) continue;
    const std::size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() || line.find(' ', space + 1) != std::string_view::npos)
      fail<FileError>(at(line_number), "expected a merge \"<left> <right>\" (two tokens and one space), found \"", line, "\"");
    merges.push_back({line.substr(0, space), line.substr(space + 1), line_number});
  }
  set_merges(model, merges, [](std::size_t line) { return strata::detail::concat("line ", line); });
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// The tokenizer

class BpeTokenizer {
 public:
  static constexpr std::string_view kEndOfText = "<|endoftext|>";

  BpeTokenizer(const std::string& vocab_file, const std::string& merge_file, BpeOptions options = {})
      : BpeTokenizer(detail::read_whole_file(vocab_file, "BPE vocabulary (vocab.json)"),
                     detail::read_whole_file(merge_file, "BPE merges (merges.txt)"), options, vocab_file, merge_file) {}

  // From the files' contents; the names are used in error messages.
  static BpeTokenizer from_text(std::string_view vocab_json, std::string_view merges_text, BpeOptions options = {},
                                std::string vocab_name = "vocab.json", std::string merges_name = "merges.txt") {
    return BpeTokenizer(vocab_json, merges_text, options, std::move(vocab_name), std::move(merges_name));
  }

  // Largest id + 1: the size of an embedding that holds every id (for GPT-2's dense vocabulary,
  // the number of tokens, 50257).
  std::int64_t vocab_size() const { return static_cast<std::int64_t>(model().tokens.size()); }
  std::int32_t eod() const { return eod_; }
  std::int64_t merge_count() const { return model().merge_count; }
  const std::string& vocab_file() const { return model().vocab_name; }
  const std::string& merge_file() const { return model().merges_name; }

  // The id of `token` (spelled with byte symbols, as in vocab.json), if it is one.
  std::optional<std::int32_t> token_to_id(std::string_view token) const {
    const auto it = detail::find_key(model().ids, token);
    if (it == model().ids.end()) return std::nullopt;
    return it->second;
  }
  // The vocabulary's spelling of `id`.
  const std::string& id_to_token(std::int32_t id) const {
    check_id(id, 0, "id_to_token");
    return model().tokens[static_cast<std::size_t>(id)];
  }

  std::vector<std::int32_t> encode(std::string_view text) {
    std::vector<std::int32_t> out;
    out.reserve(text.size() / 3 + 1);
    encode_into(text, out);
    return out;
  }
  // Appends the ids of `text` to `out`.
  void encode_into(std::string_view text, std::vector<std::int32_t>& out) {
    gpt2_pre_tokenize(text, [&](std::string_view word) { words_.encode_word(word, out); });
  }
  // The bytes the ids stand for ("<|endoftext|>" for EOD, as GPT-2 decodes it).
  std::string decode(std::span<const std::int32_t> ids) const {
    std::string out;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      check_id(ids[i], i, "decode");
      const auto id = static_cast<std::size_t>(ids[i]);
      const std::uint32_t begin = model().id_bytes_offset[id], end = model().id_bytes_offset[id + 1];
      out.append(model().id_bytes, begin, end - begin);
    }
    return out;
  }

  std::size_t cached_words() const { return words_.cached_words(); }

 private:
  BpeTokenizer(std::string_view vocab_json, std::string_view merges_text, BpeOptions options, std::string vocab_name,
               std::string merges_name) {
    auto model = std::make_shared<detail::BpeModel>();
    model->vocab_name = std::move(vocab_name);
    model->merges_name = std::move(merges_name);
    detail::load_vocabulary(*model, vocab_json);
    const auto eod = detail::find_key(model->ids, kEndOfText);
    if (eod == model->ids.end())
      fail<FileError>("'", model->vocab_name, "' has no token \"<|endoftext|>\", the end-of-document token of GPT2BPETokenizer");
    eod_ = eod->second;
    detail::load_merges(*model, merges_text);
    words_ = BpeWordEncoder(std::move(model), options);
  }

  const detail::BpeModel& model() const { return words_.model(); }

  void check_id(std::int32_t id, std::size_t position, std::string_view where) const {
    if (id < 0 || id >= vocab_size() || !model().has_id[static_cast<std::size_t>(id)])
      fail<ConfigError>("BpeTokenizer::", where, ": token ", id, " at position ", position, " is not in the vocabulary of '",
                        model().vocab_name, "' (ids 0..", vocab_size() - 1, ")");
  }

  BpeWordEncoder words_;
  std::int32_t eod_ = -1;
};

}  // namespace data
STRATA_NAMESPACE_END
