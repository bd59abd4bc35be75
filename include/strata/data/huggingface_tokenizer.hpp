// strata/data/huggingface_tokenizer.hpp: `HuggingFaceTokenizer`, Megatron's
// --tokenizer-type HuggingFaceTokenizer --tokenizer-model <dir or tokenizer.json>, for the byte-level
// BPE tokenizers that Hugging Face `tokenizers` writes: GPT-2 style and Llama 3 style. The ids are
// those of `tokenizers` (Tokenizer.from_file(...).encode(text).ids), which is what Megatron's wrapper
// gets from transformers' AutoTokenizer(text).input_ids.
//
// Encoding a text, in the order `tokenizers` runs it:
//  1. Added tokens (tokenizer.json's "added_tokens", special or not) are cut out of the text: first
//     those with "normalized": false, then, in the pieces between, those with "normalized": true
//     (with no normalizer both see the same text; the two passes are kept because their order can
//     matter). At each position the longest added token wins; the leftmost match comes first.
//  2. The pieces between are pre-tokenized by one of two patterns, written by hand over the
//     Unicode tables of unicode_tables.hpp:
//       GPT-2   pre_tokenizer ByteLevel(use_regex=true): gpt2_pre_tokenize (bpe_tokenizer.hpp)
//       Llama 3 pre_tokenizer Sequence[Split(Regex, behavior Isolated), ByteLevel(use_regex=false)]
//               with Llama 3's pattern
//                 (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//                  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//               (llama3_pre_tokenize below; GPT-2's pattern is accepted in a Split too).
//  3. Each piece's bytes go through the BPE core of bpe_tokenizer.hpp (BpeWordEncoder); with the
//     model's "ignore_merges" (Llama 3 sets it) a piece that is itself a token is that token.
//  4. The post-processor adds its tokens: TemplateProcessing's "single" template (Llama 3 puts
//     <|begin_of_text|> first); ByteLevel adds none. This is transformers' add_special_tokens=True,
//     the default of the call Megatron makes.
//
// End of document (Megatron: the AutoTokenizer's eos_token_id). transformers takes eos_token from
// tokenizer_config.json beside tokenizer.json; so does strata. Without that file transformers has
// no eos token (and Megatron no EOD); strata then takes the first special added token among
// "<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>" (GPT-2's, Llama 3's, Llama 2's and Gemma's
// names), and refuses the file when it has none of them.
// vocab_size(): the largest id + 1 (transformers' len(tokenizer), Megatron's vocab size, when the
// ids are dense, as in every trained file).
//
// Text that is not UTF-8. Python (and Rust) hold only valid text, so Megatron's tokenizer never sees
// invalid bytes: the text was decoded before. strata decodes as Python's
// bytes.decode("utf-8", errors="replace") does: each maximal ill-formed subpart becomes U+FFFD,
// then the text is encoded (replace_invalid_utf8 in bpe_tokenizer.hpp). decode() returns the bytes
// of the ids (an added token: its text), with no replacement.
//
// Refused, with a FileError naming the file, the JSON path and what is supported: a normalizer
// (other than none or an empty Sequence), a model other than BPE (Unigram, WordPiece, WordLevel),
// BPE options that change ids here (dropout, byte_fallback, a continuing-subword prefix or end-of-word
// suffix), pre-tokenizers other than the two above (Metaspace, Whitespace, Digits, ByteLevel with
// add_prefix_space, a Split with another pattern), post-processors other than ByteLevel,
// TemplateProcessing and Sequence of them, decoders other than ByteLevel, truncation or padding,
// and added tokens with single_word, lstrip or rstrip.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/json.hpp"
#include "bpe_tokenizer.hpp"

STRATA_NAMESPACE_BEGIN
namespace data {

// ---------------------------------------------------------------------------------------------
// Llama 3's pre-tokenization pattern, by hand

inline constexpr std::string_view kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
inline constexpr std::string_view kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

namespace detail {
constexpr char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }
inline bool is_line_break(std::string_view text, std::size_t i) { return text[i] == '\r' || text[i] == '\n'; }

// The end of the pattern's match starting at `i` (i < text.size()): the first alternative that
// matches, each one greedy, as the regex engine backtracks.
inline std::size_t llama3_piece_end(std::string_view text, std::size_t i) {
  const std::size_t n = text.size();
  // (?i:'s|'t|'re|'ve|'m|'ll|'d): case-insensitive, so "'S", "'Ll" too, and U+017F (long s, whose
  // case folding is 's').
  if (text[i] == '\'' && i + 1 < n) {
    const char a = ascii_lower(text[i + 1]);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (text.substr(i + 1, 2) == "\xC5\xBF") return i + 3;
    if (i + 2 < n) {
      const char b = ascii_lower(text[i + 2]);
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
  }
  const ClassedChar first = classed_char_at(text, i);
  // [^\r\n\p{L}\p{N}]?\p{L}+: letters, after at most one character that is no line break, letter
  // or number (a space, a tab, punctuation).
  if (first.cls == CharClass::letter) return class_run_end(text, i + first.length, CharClass::letter);
  if (first.cls != CharClass::number && !is_line_break(text, i) && i + first.length < n) {
    const ClassedChar second = classed_char_at(text, i + first.length);
    if (second.cls == CharClass::letter) return class_run_end(text, i + first.length + second.length, CharClass::letter);
  }
  // \p{N}{1,3}
  if (first.cls == CharClass::number) {
    std::size_t end = i + first.length;
    for (int k = 1; k < 3 && end < n; ++k) {
      const ClassedChar c = classed_char_at(text, end);
      if (c.cls != CharClass::number) break;
      end += c.length;
    }
    return end;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  std::size_t others = std::string_view::npos;
  if (text[i] == ' ' && i + 1 < n && classed_char_at(text, i + 1).cls == CharClass::other) others = i + 1;
  else if (first.cls == CharClass::other) others = i;
  if (others != std::string_view::npos) {
    std::size_t end = class_run_end(text, others, CharClass::other);
    while (end < n && is_line_break(text, end)) ++end;
    return end;
  }
  // Here text[i] starts a run of whitespace.
  std::size_t end = i, last_start = i, last_break = std::string_view::npos;
  while (end < n) {
    const ClassedChar c = classed_char_at(text, end);
    if (c.cls != CharClass::whitespace) break;
    if (is_line_break(text, end)) last_break = end;
    last_start = end;
    end += c.length;
  }
  // \s*[\r\n]+: up to the last line break of the run.
  if (last_break != std::string_view::npos) return last_break + 1;
  // \s+(?!\S): the run if it ends the text, else all but its last character; \s+ otherwise.
  if (end == n) return end;
  if (last_start > i) return last_start;
  return end;
}
}  // namespace detail

// Calls on_piece(std::string_view) for each piece of `text` under Llama 3's pattern, in order; the
// pieces concatenate to `text`.
template <class OnPiece>
void llama3_pre_tokenize(std::string_view text, OnPiece&& on_piece) {
  detail::for_each_piece(text, detail::llama3_piece_end, on_piece);
}

inline std::vector<std::string_view> llama3_pre_tokens(std::string_view text) {
  return detail::pieces_of(text, detail::llama3_piece_end);
}

// ---------------------------------------------------------------------------------------------
// Added tokens: leftmost-longest matching

namespace detail {
class AddedTokenMatcher {
 public:
  struct Match {
    std::size_t position;
    std::size_t length;
    std::int32_t id;
  };

  void add(std::string content, std::int32_t id) {
    if (content.empty()) return;
    const auto first = static_cast<unsigned char>(content[0]);
    starts_[first] = true;
    auto& list = by_first_byte_[first];
    list.emplace_back(std::move(content), id);
    std::stable_sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    ++count_;
  }
  bool empty() const { return count_ == 0; }

  // The leftmost match at or after `from`, the longest one there.
  std::optional<Match> find(std::string_view text, std::size_t from) const {
    for (std::size_t i = from; i < text.size(); ++i) {
      const auto b = static_cast<unsigned char>(text[i]);
      if (!starts_[b]) continue;
      for (const auto& [content, id] : by_first_byte_[b])
        if (text.compare(i, content.size(), content) == 0) return Match{i, content.size(), id};
    }
    return std::nullopt;
  }

 private:
  std::array<bool, 256> starts_{};
  std::array<std::vector<std::pair<std::string, std::int32_t>>, 256> by_first_byte_;
  std::size_t count_ = 0;
};
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// The tokenizer

class HuggingFaceTokenizer {
 public:
  enum class PreTokenizer : std::uint8_t { gpt2, llama3 };

  // `path`: a tokenizer.json, or a directory holding one (Megatron's --tokenizer-model names the
  // directory). A tokenizer_config.json beside it gives the end-of-document token (see the top).
  explicit HuggingFaceTokenizer(const std::string& path, BpeOptions options = {}) {
    namespace fs = std::filesystem;
    fs::path file = path;
    std::error_code ec;
    if (fs::is_directory(file, ec)) {
      file /= "tokenizer.json";
      if (!fs::exists(file, ec))
        fail<FileError>("'", path, "' is a directory without tokenizer.json; --tokenizer-model of HuggingFaceTokenizer names a ",
                        "tokenizer.json or the directory that holds it");
    }
    const std::string text = detail::read_whole_file(file.string(), "Hugging Face tokenizer (tokenizer.json)");
    const fs::path config = file.parent_path() / "tokenizer_config.json";
    std::optional<std::string> config_text;
    if (fs::exists(config, ec)) config_text = detail::read_whole_file(config.string(), "tokenizer configuration", kMaxConfigBytes);
    load(text, file.string(), config_text, config.string(), options);
  }

  // From the files' contents; the names are used in error messages.
  static HuggingFaceTokenizer from_text(std::string_view tokenizer_json, std::string name = "tokenizer.json",
                                        std::optional<std::string> config_json = std::nullopt,
                                        std::string config_name = "tokenizer_config.json", BpeOptions options = {}) {
    HuggingFaceTokenizer t;
    t.load(tokenizer_json, std::move(name), config_json, std::move(config_name), options);
    return t;
  }

  std::int64_t vocab_size() const { return static_cast<std::int64_t>(model().tokens.size()); }
  std::int32_t eod() const { return info_->eod; }
  // How eod() was chosen ("eos_token of '<dir>/tokenizer_config.json'", or the fallback).
  const std::string& eod_rule() const { return info_->eod_rule; }
  PreTokenizer pre_tokenizer() const { return info_->pre_tokenizer; }
  std::string_view pre_tokenizer_name() const { return info_->pre_tokenizer == PreTokenizer::gpt2 ? "GPT-2" : "Llama 3"; }
  const std::string& file() const { return model().vocab_name; }
  std::int64_t merge_count() const { return model().merge_count; }
  std::size_t added_token_count() const { return info_->added_count; }
  // The ids the post-processor puts before and after each text.
  const std::vector<std::int32_t>& prefix_ids() const { return info_->prefix; }
  const std::vector<std::int32_t>& suffix_ids() const { return info_->suffix; }

  std::optional<std::int32_t> token_to_id(std::string_view token) const {
    const auto it = detail::find_key(model().ids, token);
    if (it == model().ids.end()) return std::nullopt;
    return it->second;
  }
  const std::string& id_to_token(std::int32_t id) const {
    check_id(id, 0, "id_to_token");
    return model().tokens[static_cast<std::size_t>(id)];
  }

  std::vector<std::int32_t> encode(std::string_view text) {
    std::vector<std::int32_t> out;
    out.reserve(text.size() / 3 + 2);
    encode_into(text, out);
    return out;
  }
  // Appends the ids of `text` to `out`, the post-processor's tokens included.
  void encode_into(std::string_view text, std::vector<std::int32_t>& out) {
    out.insert(out.end(), info_->prefix.begin(), info_->prefix.end());
    if (is_valid_utf8(text)) {
      encode_text(text, out);
    } else {
      const std::string replaced = replace_invalid_utf8(text);
      encode_text(replaced, out);
    }
    out.insert(out.end(), info_->suffix.begin(), info_->suffix.end());
  }
  // The bytes the ids stand for (an added token: its own text).
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
  struct Info {
    PreTokenizer pre_tokenizer = PreTokenizer::gpt2;
    detail::AddedTokenMatcher raw_added;         // "normalized": false
    detail::AddedTokenMatcher normalized_added;  // "normalized": true
    std::size_t added_count = 0;
    std::vector<std::int32_t> prefix, suffix;
    std::int32_t eod = -1;
    std::string eod_rule;
  };

  HuggingFaceTokenizer() = default;

  const detail::BpeModel& model() const { return words_.model(); }

  void check_id(std::int32_t id, std::size_t position, std::string_view where) const {
    if (id < 0 || id >= vocab_size() || !model().has_id[static_cast<std::size_t>(id)])
      fail<ConfigError>("HuggingFaceTokenizer::", where, ": token ", id, " at position ", position, " is not in the vocabulary of '",
                        model().vocab_name, "' (ids 0..", vocab_size() - 1, ")");
  }

  void encode_text(std::string_view text, std::vector<std::int32_t>& out) {
    split_added(info_->raw_added, text, out, [&](std::string_view piece) {
      split_added(info_->normalized_added, piece, out, [&](std::string_view rest) { encode_plain(rest, out); });
    });
  }
  template <class OnRest>
  static void split_added(const detail::AddedTokenMatcher& matcher, std::string_view text, std::vector<std::int32_t>& out,
                          OnRest&& on_rest) {
    if (matcher.empty()) {
      on_rest(text);
      return;
    }
    std::size_t from = 0;
    while (const auto match = matcher.find(text, from)) {
      if (match->position > from) on_rest(text.substr(from, match->position - from));
      out.push_back(match->id);
      from = match->position + match->length;
    }
    if (from < text.size()) on_rest(text.substr(from));
  }
  void encode_plain(std::string_view text, std::vector<std::int32_t>& out) {
    if (info_->pre_tokenizer == PreTokenizer::gpt2) gpt2_pre_tokenize(text, [&](std::string_view w) { words_.encode_word(w, out); });
    else llama3_pre_tokenize(text, [&](std::string_view w) { words_.encode_word(w, out); });
  }

  // ---- loading ----

  struct Loader {
    std::string_view text;
    const std::string& file;

    std::string at(std::string_view path, const json::Value& v) const {
      return strata::detail::concat("'", file, "' ", path, " (", json::position(text, v.offset()), ")");
    }
    template <class... Parts>
    [[noreturn]] void refuse(std::string_view path, const json::Value& v, const Parts&... parts) const {
      fail<FileError>(at(path, v), ": ", parts...);
    }
    const json::Value& member(const json::Value& object, std::string_view path, std::string_view key) const {
      const json::Value* v = object.find(key);
      if (!v) refuse(path, object, "has no \"", key, "\"");
      return *v;
    }
    // The string member `key`, or "" when it is absent.
    std::string type_of(const json::Value& object, std::string_view path) const {
      if (!object.is_object()) refuse(path, object, "expected an object, found ", json::Value::kind_name(object.kind()));
      const json::Value* type = object.find("type");
      if (!type || !type->is_string()) refuse(path, object, "has no \"type\" string");
      return type->text();
    }
    bool flag(const json::Value& object, std::string_view path, std::string_view key, bool absent) const {
      const json::Value* v = object.find(key);
      if (!v || v->is_null()) return absent;
      if (!v->is_bool()) refuse(strata::detail::concat(path, ".", key), *v, "expected true or false, found ", json::Value::kind_name(v->kind()));
      return v->boolean();
    }
    // An optional string member that must be null, absent or "" (what strata supports).
    void empty_or_null(const json::Value& object, std::string_view path, std::string_view key, std::string_view why) const {
      const json::Value* v = object.find(key);
      if (!v || v->is_null() || (v->is_string() && v->text().empty())) return;
      refuse(strata::detail::concat(path, ".", key), *v, "is not supported (", why, "); strata reads BPE models with ", key, " null");
    }
  };

  void load(std::string_view text, std::string name, const std::optional<std::string>& config_text, const std::string& config_name,
            BpeOptions options) {
    auto info = std::make_shared<Info>();
    auto model = std::make_shared<detail::BpeModel>();
    model->vocab_name = name;
    model->merges_name = name;
    const std::string& file = model->vocab_name;
    const json::Value root = json::parse(text, strata::detail::concat("'", file, "' (a Hugging Face tokenizer.json)"));
    const Loader l{text, file};
    if (!root.is_object()) l.refuse("(the document)", root, "expected a JSON object (tokenizer.json), found ", json::Value::kind_name(root.kind()));

    for (const char* key : {"truncation", "padding"}) {
      const json::Value* v = root.find(key);
      if (v && !v->is_null())
        l.refuse(key, *v, "is not supported: strata encodes whole texts; set \"", key, "\" to null (Megatron's data path cuts sequences itself)");
    }
    if (const json::Value* normalizer = root.find("normalizer"); normalizer && !normalizer->is_null()) {
      const std::string type = l.type_of(*normalizer, "normalizer");
      const json::Value* list = normalizer->find("normalizers");
      if (!(type == "Sequence" && list && list->is_array() && list->items().empty()))
        l.refuse("normalizer", *normalizer, "type \"", type, "\" is not supported; strata reads tokenizer.json files with no normalizer (null)");
    }
    load_pre_tokenizer(l, root, *info);
    if (const json::Value* decoder = root.find("decoder"); decoder && !decoder->is_null()) {
      const std::string type = l.type_of(*decoder, "decoder");
      if (type != "ByteLevel") l.refuse("decoder", *decoder, "type \"", type, "\" is not supported; strata reads byte-level BPE files, decoder ByteLevel or null");
    }

    // The model.
    const json::Value& m = l.member(root, "(the document)", "model");
    const std::string type = m.is_object() && m.find("type") ? l.type_of(m, "model") : std::string("BPE");
    if (type != "BPE")
      l.refuse("model.type", *m.find("type"), "model type \"", type,
               "\" is not supported; strata reads byte-level BPE models (type \"BPE\"); Unigram, WordPiece and WordLevel are not");
    if (const json::Value* dropout = m.find("dropout"); dropout && !dropout->is_null())
      l.refuse("model.dropout", *dropout, "BPE dropout is not supported (it makes encoding random); set it to null");
    if (l.flag(m, "model", "byte_fallback", false))
      l.refuse("model.byte_fallback", *m.find("byte_fallback"), "byte_fallback is not supported; a byte-level BPE needs none (false)");
    l.empty_or_null(m, "model", "continuing_subword_prefix", "a byte-level BPE has none");
    l.empty_or_null(m, "model", "end_of_word_suffix", "a byte-level BPE has none");
    model->ignore_merges = l.flag(m, "model", "ignore_merges", false);

    const json::Value& vocab = l.member(m, "model", "vocab");
    if (!vocab.is_object()) l.refuse("model.vocab", vocab, "expected an object of token -> id, found ", json::Value::kind_name(vocab.kind()));
    std::vector<detail::BpeVocabEntry> entries;
    entries.reserve(vocab.members().size() + 16);
    for (const auto& [token, value] : vocab.members()) {
      std::int64_t id = 0;
      if (!value.to_int64(id)) l.refuse("model.vocab", value, "the id of token \"", token, "\" must be an integer");
      entries.push_back({token, id, value.offset()});
    }

    // Added tokens: in the vocabulary under the same id, or new ids.
    std::vector<std::pair<std::int32_t, std::string>> added_bytes;
    std::vector<std::pair<std::string, std::int32_t>> specials;  // (content, id) of special ones
    if (const json::Value* added = root.find("added_tokens"); added && !added->is_null()) {
      if (!added->is_array()) l.refuse("added_tokens", *added, "expected an array");
      for (std::size_t k = 0; k < added->items().size(); ++k) {
        const json::Value& a = added->items()[k];
        const std::string path = strata::detail::concat("added_tokens[", k, "]");
        if (!a.is_object()) l.refuse(path, a, "expected an object");
        const json::Value& content = l.member(a, path, "content");
        const json::Value& id_value = l.member(a, path, "id");
        std::int64_t id = 0;
        if (!content.is_string() || content.text().empty()) l.refuse(path + ".content", content, "expected a non-empty string");
        if (!id_value.to_int64(id) || id < 0 || id > std::numeric_limits<std::int32_t>::max())
          l.refuse(path + ".id", id_value, "expected an id in [0, 2^31)");
        for (const char* option : {"single_word", "lstrip", "rstrip"})
          if (l.flag(a, path, option, false))
            l.refuse(strata::detail::concat(path, ".", option), *a.find(option), "added token \"", content.text(), "\": ", option,
                     " is not supported; strata matches added tokens exactly (single_word, lstrip and rstrip false)");
        const auto same = std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.token == content.text(); });
        if (same != entries.end() && same->id != id)
          l.refuse(path, a, "added token \"", content.text(), "\" has id ", id, " but model.vocab gives it ", same->id);
        const auto taken = std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.id == id; });
        if (taken != entries.end() && taken->token != content.text())
          l.refuse(path, a, "added token \"", content.text(), "\" has id ", id, ", which model.vocab gives to \"", taken->token, "\"");
        if (same == entries.end()) entries.push_back({content.text(), id, a.offset()});
        const auto id32 = static_cast<std::int32_t>(id);
        (l.flag(a, path, "normalized", false) ? info->normalized_added : info->raw_added).add(content.text(), id32);
        added_bytes.emplace_back(id32, content.text());
        if (l.flag(a, path, "special", false)) specials.emplace_back(content.text(), id32);
        ++info->added_count;
      }
    }
    detail::set_vocabulary(*model, std::move(entries),
                           [&](std::size_t offset) { return strata::detail::concat("model.vocab, ", json::position(text, offset)); });
    detail::set_id_bytes(*model, added_bytes);

    // Merges: "a b" strings (tokenizers before 0.20) or ["a", "b"] pairs.
    const json::Value& merges = l.member(m, "model", "merges");
    if (!merges.is_array()) l.refuse("model.merges", merges, "expected an array of merges");
    std::vector<detail::BpeMergeEntry> merge_entries;
    merge_entries.reserve(merges.items().size());
    for (std::size_t k = 0; k < merges.items().size(); ++k) {
      const json::Value& merge = merges.items()[k];
      if (merge.is_string()) {
        const std::string_view line = merge.text();
        const std::size_t space = line.find(' ');
        if (space == std::string_view::npos || space == 0 || space + 1 == line.size() || line.find(' ', space + 1) != std::string_view::npos)
          l.refuse(strata::detail::concat("model.merges[", k, "]"), merge, "expected a merge \"<left> <right>\" (two tokens and one space), found \"",
                   line, "\"");
        merge_entries.push_back({line.substr(0, space), line.substr(space + 1), k});
      } else if (merge.is_array() && merge.items().size() == 2 && merge.items()[0].is_string() && merge.items()[1].is_string()) {
        merge_entries.push_back({merge.items()[0].text(), merge.items()[1].text(), k});
      } else {
        l.refuse(strata::detail::concat("model.merges[", k, "]"), merge, "expected a merge, \"<left> <right>\" or [\"<left>\", \"<right>\"]");
      }
    }
    detail::set_merges(*model, merge_entries, [&](std::size_t k) {
      return strata::detail::concat("model.merges[", k, "] (", json::position(text, merges.items()[k].offset()), ")");
    });

    load_post_processor(l, root, *model, *info);
    choose_eod(l, *model, specials, config_text, config_name, *info);
    info_ = std::move(info);
    words_ = BpeWordEncoder(std::move(model), options);
  }

  static void load_pre_tokenizer(const Loader& l, const json::Value& root, Info& info) {
    static constexpr std::string_view kSupported =
        "strata supports ByteLevel(use_regex=true, add_prefix_space=false) (GPT-2) and Sequence[Split(Regex of Llama 3 or GPT-2, "
        "Isolated), ByteLevel(use_regex=false, add_prefix_space=false)] (Llama 3)";
    const json::Value* p = root.find("pre_tokenizer");
    if (!p || p->is_null()) l.refuse("pre_tokenizer", p ? *p : root, "is missing; ", kSupported);
    const auto byte_level = [&](const json::Value& v, const std::string& path, bool use_regex) {
      if (l.flag(v, path, "add_prefix_space", false))
        l.refuse(path + ".add_prefix_space", *v.find("add_prefix_space"), "add_prefix_space true is not supported; ", kSupported);
      if (l.flag(v, path, "use_regex", true) != use_regex)
        l.refuse(path + ".use_regex", v.find("use_regex") ? *v.find("use_regex") : v, "use_regex ", use_regex ? "false" : "true",
                 " is not supported here; ", kSupported);
    };
    const std::string type = l.type_of(*p, "pre_tokenizer");
    if (type == "ByteLevel") {
      byte_level(*p, "pre_tokenizer", true);
      info.pre_tokenizer = PreTokenizer::gpt2;
      return;
    }
    if (type != "Sequence") l.refuse("pre_tokenizer.type", *p, "pre-tokenizer \"", type, "\" is not supported; ", kSupported);
    const json::Value& list = l.member(*p, "pre_tokenizer", "pretokenizers");
    if (!list.is_array()) l.refuse("pre_tokenizer.pretokenizers", list, "expected an array");
    const auto& items = list.items();
    if (items.size() == 1 && l.type_of(items[0], "pre_tokenizer.pretokenizers[0]") == "ByteLevel") {
      byte_level(items[0], "pre_tokenizer.pretokenizers[0]", true);
      info.pre_tokenizer = PreTokenizer::gpt2;
      return;
    }
    if (items.size() != 2) l.refuse("pre_tokenizer.pretokenizers", list, "a Sequence of ", items.size(), " pre-tokenizers is not supported; ", kSupported);
    const std::string first = l.type_of(items[0], "pre_tokenizer.pretokenizers[0]");
    const std::string second = l.type_of(items[1], "pre_tokenizer.pretokenizers[1]");
    if (first != "Split") l.refuse("pre_tokenizer.pretokenizers[0].type", items[0], "pre-tokenizer \"", first, "\" is not supported first in a Sequence; ", kSupported);
    if (second != "ByteLevel") l.refuse("pre_tokenizer.pretokenizers[1].type", items[1], "pre-tokenizer \"", second, "\" is not supported second in a Sequence; ", kSupported);
    const json::Value& split = items[0];
    const json::Value& pattern = l.member(split, "pre_tokenizer.pretokenizers[0]", "pattern");
    const json::Value* regex = pattern.is_object() ? pattern.find("Regex") : nullptr;
    if (!regex || !regex->is_string())
      l.refuse("pre_tokenizer.pretokenizers[0].pattern", pattern, "a Split on a plain string is not supported; ", kSupported);
    if (regex->text() == kLlama3Pattern) info.pre_tokenizer = PreTokenizer::llama3;
    else if (regex->text() == kGpt2Pattern) info.pre_tokenizer = PreTokenizer::gpt2;
    else l.refuse("pre_tokenizer.pretokenizers[0].pattern.Regex", *regex, "the pattern \"", regex->text(), "\" is not one strata knows; ", kSupported);
    const json::Value* behavior = split.find("behavior");
    if (!behavior || !behavior->is_string() || behavior->text() != "Isolated")
      l.refuse("pre_tokenizer.pretokenizers[0].behavior", behavior ? *behavior : split, "a Split behavior other than \"Isolated\" is not supported; ", kSupported);
    if (l.flag(split, "pre_tokenizer.pretokenizers[0]", "invert", false))
      l.refuse("pre_tokenizer.pretokenizers[0].invert", *split.find("invert"), "an inverted Split is not supported; ", kSupported);
    byte_level(items[1], "pre_tokenizer.pretokenizers[1]", false);
  }

  static void load_post_processor(const Loader& l, const json::Value& root, const detail::BpeModel& model, Info& info) {
    static constexpr std::string_view kSupported = "strata supports ByteLevel, TemplateProcessing and a Sequence of them";
    const json::Value* p = root.find("post_processor");
    if (!p || p->is_null()) return;
    std::vector<std::pair<const json::Value*, std::string>> processors{{p, "post_processor"}};
    if (l.type_of(*p, "post_processor") == "Sequence") {
      const json::Value& list = l.member(*p, "post_processor", "processors");
      if (!list.is_array()) l.refuse("post_processor.processors", list, "expected an array");
      processors.clear();
      for (std::size_t k = 0; k < list.items().size(); ++k)
        processors.emplace_back(&list.items()[k], strata::detail::concat("post_processor.processors[", k, "]"));
    }
    bool templated = false;
    for (const auto& [v, path] : processors) {
      const std::string type = l.type_of(*v, path);
      if (type == "ByteLevel") continue;  // offsets only
      if (type != "TemplateProcessing") l.refuse(path + ".type", *v, "post-processor \"", type, "\" is not supported; ", kSupported);
      if (templated) l.refuse(path, *v, "two TemplateProcessing post-processors are not supported; ", kSupported);
      templated = true;
      const json::Value& single = l.member(*v, path, "single");
      const json::Value& specials = l.member(*v, path, "special_tokens");
      if (!single.is_array()) l.refuse(path + ".single", single, "expected an array");
      bool sequence_seen = false;
      for (std::size_t k = 0; k < single.items().size(); ++k) {
        const json::Value& piece = single.items()[k];
        const std::string piece_path = strata::detail::concat(path, ".single[", k, "]");
        if (const json::Value* seq = piece.is_object() ? piece.find("Sequence") : nullptr) {
          const json::Value* id = seq->is_object() ? seq->find("id") : nullptr;
          if (!id || !id->is_string() || id->text() != "A" || sequence_seen)
            l.refuse(piece_path, piece, "a single template holds the sequence $A once");
          sequence_seen = true;
          continue;
        }
        const json::Value* special = piece.is_object() ? piece.find("SpecialToken") : nullptr;
        const json::Value* name = special && special->is_object() ? special->find("id") : nullptr;
        if (!name || !name->is_string()) l.refuse(piece_path, piece, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
        const json::Value* entry = specials.is_object() ? specials.find(name->text()) : nullptr;
        const json::Value* ids = entry && entry->is_object() ? entry->find("ids") : nullptr;
        if (!ids || !ids->is_array())
          l.refuse(path + ".special_tokens", specials, "has no ids for the template's special token \"", name->text(), "\"");
        for (const auto& id_value : ids->items()) {
          std::int64_t id = 0;
          if (!id_value.to_int64(id) || id < 0 || id >= static_cast<std::int64_t>(model.tokens.size()) || !model.has_id[static_cast<std::size_t>(id)])
            l.refuse(path + ".special_tokens", id_value, "the id of \"", name->text(), "\" is not a token of the vocabulary");
          (sequence_seen ? info.suffix : info.prefix).push_back(static_cast<std::int32_t>(id));
        }
      }
      if (!sequence_seen) l.refuse(path + ".single", single, "the single template has no $A");
    }
  }

  static void choose_eod(const Loader& l, const detail::BpeModel& model, const std::vector<std::pair<std::string, std::int32_t>>& specials,
                         const std::optional<std::string>& config_text, const std::string& config_name, Info& info) {
    if (config_text) {
      const json::Value config = json::parse(*config_text, strata::detail::concat("'", config_name, "' (tokenizer_config.json)"));
      const json::Value* eos = config.is_object() ? config.find("eos_token") : nullptr;
      const json::Value* given = eos;
      if (eos && eos->is_object()) eos = eos->find("content");  // {"content": "...", ...}
      if (given && !given->is_null() && (!eos || !eos->is_string()))
        fail<FileError>("'", config_name, "' ", json::position(*config_text, given->offset()), ": eos_token is ",
                        eos ? json::Value::kind_name(eos->kind()) : std::string_view("an object without \"content\""),
                        ", not a token; give the token's text (\"eos_token\": \"</s>\") or {\"content\": \"</s>\"}, as transformers reads it");
      if (eos && eos->is_string()) {
        const auto it = detail::find_key(model.ids, eos->text());
        if (it == model.ids.end())
          fail<FileError>("'", config_name, "' ", json::position(*config_text, eos->offset()), ": eos_token \"", eos->text(),
                          "\" is not a token of '", l.file, "'");
        info.eod = it->second;
        info.eod_rule = strata::detail::concat("eos_token \"", eos->text(), "\" of '", config_name, "'");
        return;
      }
    }
    for (std::string_view name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
      for (const auto& [content, id] : specials)
        if (content == name) {
          info.eod = id;
          info.eod_rule = strata::detail::concat("the special token \"", content, "\" (no eos_token in a tokenizer_config.json beside it)");
          return;
        }
    fail<FileError>("'", l.file, "' has no end-of-document token: no tokenizer_config.json beside it names an eos_token, and no special ",
                    "added token is \"<|endoftext|>\", \"<|end_of_text|>\", \"</s>\" or \"<eos>\"; add a tokenizer_config.json with ",
                    "\"eos_token\" (Megatron's EOD is transformers' eos_token_id)");
  }

  std::shared_ptr<const Info> info_;
  BpeWordEncoder words_;
};

}  // namespace data
STRATA_NAMESPACE_END
