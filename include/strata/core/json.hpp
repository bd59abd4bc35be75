// strata/core/json.hpp: a small strict JSON reader, and the few writing helpers, for the JSON files
// strata reads and writes: the safetensors header, config.json and the shard index
// model.safetensors.index.json of Hugging Face checkpoints, and the tokenizers' vocab.json and
// tokenizer.json.
//
// The reader takes RFC 8259 JSON and nothing else: no comments, no trailing commas, no NaN or
// Infinity, no leading zeros, no control characters or invalid UTF-8 inside strings, no
// duplicate object keys (a safetensors header with a tensor named twice is corrupt, not "the
// last one wins"; found by sorting, so an object of 100k keys costs O(n log n)). \uXXXX escapes are decoded to UTF-8 (surrogate pairs included; a lone
// surrogate is an error). Nesting is limited to 64 levels so a hostile file cannot exhaust the
// stack. Numbers keep their text: as_int64 / as_uint64 accept only integers that fit, as_double
// any number. Whitespace may follow the value (safetensors pads its header with spaces).
//
// Every error is a FileError that names the document (the caller's words, e.g. "the header of
// safetensors file \"/ckpt/model.safetensors\"") and where the problem is: line, column (counted
// in bytes from 1) and byte offset. Each value keeps the offset where it starts (`offset()`), so a
// caller that finds a value it cannot use can say where it is with `position(text, offset)`.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "error.hpp"
#include "utf8.hpp"

STRATA_NAMESPACE_BEGIN
namespace json {

class Value {
 public:
  enum class Kind : std::uint8_t { null, boolean, number, string, array, object };

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::null; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_number() const { return kind_ == Kind::number; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_object() const { return kind_ == Kind::object; }

  // The value of a boolean; the decoded text of a string; the literal of a number.
  bool boolean() const { return boolean_; }
  const std::string& text() const { return text_; }
  const std::vector<Value>& items() const { return items_; }
  const std::vector<std::pair<std::string, Value>>& members() const { return members_; }
  // The byte offset in the document where the value starts.
  std::size_t offset() const { return offset_; }

  // The member named `key` of an object, or nullptr.
  const Value* find(std::string_view key) const {
    for (const auto& [name, value] : members_)
      if (name == key) return &value;
    return nullptr;
  }

  // A number without fraction or exponent that fits, else false.
  bool to_int64(std::int64_t& out) const { return is_number() && integral_ && parse_integer(out); }
  bool to_uint64(std::uint64_t& out) const { return is_number() && integral_ && parse_integer(out); }
  // Any number (the nearest double), else false.
  bool to_double(double& out) const {
    if (!is_number()) return false;
    const char* end = text_.data() + text_.size();
    const auto [ptr, ec] = std::from_chars(text_.data(), end, out);
    return ec == std::errc() && ptr == end;
  }

  static std::string_view kind_name(Kind k) {
    switch (k) {
      case Kind::null: return "null";
      case Kind::boolean: return "a boolean";
      case Kind::number: return "a number";
      case Kind::string: return "a string";
      case Kind::array: return "an array";
      case Kind::object: return "an object";
    }
    return "unknown";
  }

 private:
  friend class Parser;
  template <class I>
  bool parse_integer(I& out) const {
    const char* end = text_.data() + text_.size();
    const auto [ptr, ec] = std::from_chars(text_.data(), end, out);
    return ec == std::errc() && ptr == end;
  }

  Kind kind_ = Kind::null;
  bool boolean_ = false;
  bool integral_ = false;  // a number literal without fraction or exponent
  std::size_t offset_ = 0;
  std::string text_;
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> members_;
};

// "line L, column C (byte N)" for byte offset `offset` of `text` (lines and columns from 1,
// columns counted in bytes).
inline std::string position(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  const std::string_view before = text.substr(0, offset);
  const std::size_t line = 1 + static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
  const std::size_t line_start = before.rfind('\n');
  const std::size_t column = line_start == std::string_view::npos ? offset + 1 : offset - line_start;
  return detail::concat("line ", line, ", column ", column, " (byte ", offset, ")");
}

class Parser {
 public:
  static constexpr int kMaxDepth = 64;

  Parser(std::string_view text, std::string_view document) : text_(text), document_(document) {}

  Value parse_document() {
    skip_whitespace();
    Value v = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) error("unexpected text after the value");
    return v;
  }

 private:
  [[noreturn]] void error(std::string_view what) const {
    fail<FileError>(document_, " is not valid JSON: ", what, " at ", position(text_, pos_));
  }

  void skip_whitespace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  bool consume_literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Value parse_value(int depth) {
    if (depth >= kMaxDepth) error("nesting deeper than 64 levels");
    if (pos_ >= text_.size()) error("the text ends where a value should start");
    Value v;
    v.offset_ = pos_;
    const char c = text_[pos_];
    if (c == '{') {
      v.kind_ = Value::Kind::object;
      parse_object(v, depth);
    } else if (c == '[') {
      v.kind_ = Value::Kind::array;
      parse_array(v, depth);
    } else if (c == '"') {
      v.kind_ = Value::Kind::string;
      v.text_ = parse_string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind_ = Value::Kind::number;
      parse_number(v);
    } else if (consume_literal("true")) {
      v.kind_ = Value::Kind::boolean;
      v.boolean_ = true;
    } else if (consume_literal("false")) {
      v.kind_ = Value::Kind::boolean;
    } else if (consume_literal("null")) {
      v.kind_ = Value::Kind::null;
    } else {
      error(detail::concat("unexpected character '", printable(c), "'"));
    }
    return v;
  }

  void parse_object(Value& v, int depth) {
    ++pos_;  // '{'
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return;
    }
    std::vector<std::size_t> key_offsets;
    for (;;) {
      skip_whitespace();
      if (pos_ >= text_.size()) error("the text ends inside an object, expected a string as object key");
      if (text_[pos_] != '"') error("expected a string as object key");
      key_offsets.push_back(pos_);
      std::string key = parse_string();
      skip_whitespace();
      if (pos_ >= text_.size() || text_[pos_] != ':') error("expected ':' after an object key");
      ++pos_;
      skip_whitespace();
      Value member = parse_value(depth + 1);
      v.members_.emplace_back(std::move(key), std::move(member));
      skip_whitespace();
      if (pos_ >= text_.size()) error("the text ends inside an object, expected ',' or '}'");
      if (text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (text_[pos_] == '}') {
        ++pos_;
        check_unique_keys(v, key_offsets);
        return;
      }
      error("expected ',' or '}' in an object");
    }
  }

  // A key given twice: the error points at its second occurrence and names the first.
  void check_unique_keys(const Value& v, const std::vector<std::size_t>& key_offsets) {
    const auto& members = v.members_;
    if (members.size() < 2) return;
    std::vector<std::size_t> order(members.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return members[a].first != members[b].first ? members[a].first < members[b].first : a < b;
    });
    std::size_t first = members.size(), second = members.size();
    for (std::size_t k = 0; k + 1 < order.size(); ++k)
      if (members[order[k]].first == members[order[k + 1]].first && order[k + 1] < second) {
        first = order[k];
        second = order[k + 1];
      }
    if (second == members.size()) return;
    pos_ = key_offsets[second];
    error(detail::concat("the key \"", members[second].first, "\" appears twice in one object (first at ",
                         position(text_, key_offsets[first]), ")"));
  }

  void parse_array(Value& v, int depth) {
    ++pos_;  // '['
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return;
    }
    for (;;) {
      skip_whitespace();
      v.items_.push_back(parse_value(depth + 1));
      skip_whitespace();
      if (pos_ >= text_.size()) error("the text ends inside an array, expected ',' or ']'");
      if (text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (text_[pos_] == ']') {
        ++pos_;
        return;
      }
      error("expected ',' or ']' in an array");
    }
  }

  // JSON's number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  void parse_number(Value& v) {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    if (text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0') {
      ++pos_;
      if (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') error("a number with a leading zero");
    } else if (digits() == 0) {
      error("a '-' without digits");
    }
    bool integral = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      integral = false;
      if (digits() == 0) error("a number with no digit after its '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      integral = false;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (digits() == 0) error("a number with no digit in its exponent");
    }
    v.text_ = std::string(text_.substr(start, pos_ - start));
    v.integral_ = integral;
  }

  unsigned hex4() {
    if (text_.size() - pos_ < 4) error("a \\u escape with fewer than 4 hex digits");
    unsigned value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      value <<= 4;
      if (c >= '0' && c <= '9') value |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') value |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') value |= static_cast<unsigned>(c - 'A' + 10);
      else error("a \\u escape with a character that is not a hex digit");
    }
    return value;
  }

  // One UTF-8 sequence starting at pos_ (its first byte >= 0x80), checked and copied.
  void copy_utf8(std::string& out) {
    const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text_[i]); };
    const unsigned lead = byte(pos_);
    int length = 0;
    unsigned code = 0, minimum = 0;
    if (lead >= 0xc2 && lead <= 0xdf) length = 2, code = lead & 0x1f, minimum = 0x80;
    else if (lead >= 0xe0 && lead <= 0xef) length = 3, code = lead & 0x0f, minimum = 0x800;
    else if (lead >= 0xf0 && lead <= 0xf4) length = 4, code = lead & 0x07, minimum = 0x10000;
    else error("a string with invalid UTF-8");
    if (text_.size() - pos_ < static_cast<std::size_t>(length)) error("a string with a truncated UTF-8 sequence");
    for (int i = 1; i < length; ++i) {
      const unsigned next = byte(pos_ + i);
      if ((next & 0xc0) != 0x80) error("a string with invalid UTF-8");
      code = (code << 6) | (next & 0x3f);
    }
    if (code < minimum || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) error("a string with invalid UTF-8");
    out.append(text_.substr(pos_, static_cast<std::size_t>(length)));
    pos_ += static_cast<std::size_t>(length);
  }

  std::string parse_string() {
    ++pos_;  // '"'
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) error("the text ends inside a string");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) error("a control character inside a string (it must be escaped)");
      if (static_cast<unsigned char>(c) >= 0x80) {
        copy_utf8(out);
        continue;
      }
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= text_.size()) error("the text ends inside an escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned code = hex4();
          if (code >= 0xdc00 && code <= 0xdfff) error("a lone low surrogate in a \\u escape");
          if (code >= 0xd800 && code <= 0xdbff) {
            if (!consume_literal("\\u")) error("a high surrogate not followed by a \\u escape");
            const unsigned low = hex4();
            if (low < 0xdc00 || low > 0xdfff) error("a high surrogate not followed by a low surrogate");
            code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
          }
          append_utf8(out, static_cast<char32_t>(code));
          break;
        }
        default: --pos_; error(detail::concat("an unknown escape '\\", printable(e), "'"));
      }
    }
  }

  static std::string printable(char c) {
    if (static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f) return std::string(1, c);
    static constexpr char digits[] = "0123456789abcdef";
    const unsigned u = static_cast<unsigned char>(c);
    return std::string("\\x") + digits[u >> 4] + digits[u & 0xf];
  }

  std::string_view text_;
  std::string_view document_;
  std::size_t pos_ = 0;
};

// Parses `text`; `document` names it in errors ("the header of safetensors file \"/x.safetensors\"").
inline Value parse(std::string_view text, std::string_view document) { return Parser(text, document).parse_document(); }

// ---- writing ----

// `s` as a JSON string literal (quotes, backslashes and control characters escaped; other bytes as they are).
inline std::string quote(std::string_view s) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += digits[static_cast<unsigned char>(c) >> 4];
          out += digits[static_cast<unsigned char>(c) & 0xf];
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// The shortest text that reads back as `v` (a finite double), always with a '.' or an exponent so
// that readers keep it a float ("1e-05", "10000.0").
inline std::string number(double v) {
  if (!(v == v) || v == std::numeric_limits<double>::infinity() || v == -std::numeric_limits<double>::infinity())
    fail<ConfigError>("JSON has no representation for the non-finite number ", v);
  char buffer[64];
  const auto [ptr, ec] = std::to_chars(buffer, buffer + sizeof buffer, v);
  std::string out(buffer, ptr);
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}
inline std::string number(std::int64_t v) { return std::to_string(v); }
inline std::string number(int v) { return std::to_string(v); }
inline std::string boolean(bool v) { return v ? "true" : "false"; }

}  // namespace json
STRATA_NAMESPACE_END
