// preprocess_data: text or JSONL to a Megatron indexed dataset (<prefix>_<key>_document.bin/.idx).
// The flags follow Megatron's tools/preprocess_data.py.
//
//   preprocess_data --input book.txt --output-prefix data/book --append-eod
//   preprocess_data --input corpus.jsonl --json-keys text --output-prefix data/corpus --append-eod
//       --tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt
//
// Tokenizers: ByteTokenizer (the default: bytes 0..255, EOD 256; strata/data/tokenizer.hpp) or
// GPT2BPETokenizer (GPT-2's byte-level BPE from --vocab-file and --merge-file, EOD
// "<|endoftext|>"; strata/data/bpe_tokenizer.hpp). The token type is the smallest that holds
// the vocabulary unless --dtype says otherwise.
//
// Plain text: one document per paragraph (paragraphs are separated by one or more blank lines; the
// lines of a paragraph keep their newlines, a trailing '\r' is dropped). JSONL: one JSON object per
// line; each key named in --json-keys must hold a string and goes to its own dataset. Empty
// documents are skipped. Each document is one sequence, followed by EOD with --append-eod.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <strata/data.hpp>

namespace {

using strata::ConfigError;
using strata::FileError;
using strata::data::BpeTokenizer;
using strata::data::ByteTokenizer;

// A minimal reader of one JSON object per line: finds top-level string fields by key.
class JsonLine {
 public:
  JsonLine(std::string_view text, const std::string& file, std::int64_t line) : s_(text), file_(file), line_(line) {}

  // The decoded string value of top-level key `key`, or nothing if the key is absent. The whole
  // line is parsed, so an object that is not closed (`{"text": "abc"`) or text after it is an
  // error naming the line, even when the key comes first.
  std::optional<std::string> string_field(std::string_view key) {
    pos_ = 0;
    std::optional<std::string> found;
    skip_space();
    expect('{');
    skip_space();
    if (peek() == '}') {
      ++pos_;
    } else {
      while (true) {
        skip_space();
        std::string name = parse_string();
        skip_space();
        expect(':');
        skip_space();
        if (name == key && !found) {
          if (peek() != '"') error("the value of key \"", key, "\" is not a string");
          found = parse_string();
        } else {
          skip_value();
        }
        skip_space();
        if (pos_ >= s_.size()) error("the object is not closed: expected ',' or '}' before the end of the line");
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}');
        break;
      }
    }
    skip_space();
    if (pos_ != s_.size()) error("unexpected '", s_[pos_], "' after the end of the object (one JSON object per line)");
    return found;
  }

 private:
  template <class... Parts>
  [[noreturn]] void error(const Parts&... parts) const {
    strata::fail<FileError>("'", file_, "' line ", line_, ", column ", pos_ + 1, ": ", parts...);
  }
  char peek() const {
    if (pos_ >= s_.size()) error("unexpected end of line");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) error("expected '", c, "', found '", s_[pos_], "'");
    ++pos_;
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r' || s_[pos_] == '\n')) ++pos_;
  }
  unsigned hex4() {
    if (pos_ + 4 > s_.size()) error("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else error("bad hex digit '", c, "' in \\u escape");
    }
    return v;
  }
  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      char c = peek();
      ++pos_;
      if (c == '"') return out;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      char e = peek();
      ++pos_;
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
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && pos_ + 6 <= s_.size() && s_[pos_] == '\\' && s_[pos_ + 1] == 'u') {
            std::size_t save = pos_;
            pos_ += 2;
            unsigned low = hex4();
            if (low >= 0xDC00 && low < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            else pos_ = save;  // unpaired: keep the high half alone
          }
          strata::append_utf8(out, static_cast<char32_t>(cp));
          break;
        }
        default: error("unknown escape '\\", e, "'");
      }
    }
  }
  void skip_value() {
    char c = peek();
    if (c == '"') {
      parse_string();
    } else if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++pos_;
      skip_space();
      if (peek() == close) {
        ++pos_;
        return;
      }
      while (true) {
        skip_space();
        if (close == '}') {
          parse_string();
          skip_space();
          expect(':');
          skip_space();
        }
        skip_value();
        skip_space();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect(close);
        return;
      }
    } else {  // number, true, false, null
      std::size_t start = pos_;
      while (pos_ < s_.size() && s_[pos_] != ',' && s_[pos_] != '}' && s_[pos_] != ']' && s_[pos_] != ' ' &&
             s_[pos_] != '\t' && s_[pos_] != '\r' && s_[pos_] != '\n')
        ++pos_;
      if (pos_ == start) error("expected a value, found '", c, "'");
    }
  }

  std::string_view s_;
  const std::string& file_;
  std::int64_t line_;
  std::size_t pos_ = 0;
};

struct Output {
  std::string key;
  std::string prefix;
  std::unique_ptr<strata::data::IndexedDatasetWriter> writer;
  std::int64_t empty = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokenize text or JSONL into a Megatron indexed dataset (<output-prefix>_<key>_document.bin/.idx)."};
  std::string input, output_prefix, format = "auto", dtype_name = "auto", tokenizer_type = "ByteTokenizer";
  std::string vocab_file, merge_file;
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false;
  std::int64_t log_interval = 10000;
  app.add_option("--input", input, "input file: plain text (documents separated by blank lines) or JSONL")->required();
  app.add_option("--output-prefix", output_prefix, "output path prefix; files are <prefix>_<key>_document.bin/.idx")
      ->required();
  app.add_option("--json-keys", json_keys, "JSONL keys to extract, one dataset each (plain text uses the first)")
      ->capture_default_str();
  app.add_option("--input-format", format, "text, jsonl, or auto (jsonl for .jsonl/.json files)")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}))
      ->capture_default_str();
  app.add_flag("--append-eod", append_eod, "append the end-of-document token to every document");
  app.add_option("--dtype", dtype_name, "token type in .bin: uint16, int32, or auto (the smallest that fits)")
      ->check(CLI::IsMember({"auto", "uint16", "int32"}))
      ->capture_default_str();
  app.add_option("--tokenizer-type", tokenizer_type,
                 "ByteTokenizer (bytes 0..255, EOD 256) or GPT2BPETokenizer (GPT-2's byte-level BPE, EOD <|endoftext|>)")
      ->check(CLI::IsMember({"ByteTokenizer", "GPT2BPETokenizer"}))
      ->capture_default_str();
  app.add_option("--vocab-file", vocab_file, "GPT2BPETokenizer: the vocabulary, vocab.json (token -> id)");
  app.add_option("--merge-file", merge_file, "GPT2BPETokenizer: the merges, merges.txt");
  app.add_option("--log-interval", log_interval, "print progress every this many documents")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    if (format == "auto") {
      const bool json = input.ends_with(".jsonl") || input.ends_with(".json");
      format = json ? "jsonl" : "text";
    }
    const bool jsonl = format == "jsonl";
    if (!jsonl) json_keys.resize(1);

    std::optional<BpeTokenizer> bpe;
    if (tokenizer_type == "GPT2BPETokenizer") {
      if (vocab_file.empty() || merge_file.empty())
        strata::fail<ConfigError>("--tokenizer-type GPT2BPETokenizer needs --vocab-file (vocab.json) and --merge-file (merges.txt)");
      bpe.emplace(vocab_file, merge_file);
    } else if (!vocab_file.empty() || !merge_file.empty()) {
      strata::fail<ConfigError>("--vocab-file and --merge-file are the files of --tokenizer-type GPT2BPETokenizer; the ",
                                tokenizer_type, " needs none");
    }
    const std::int64_t vocab_size = bpe ? bpe->vocab_size() : ByteTokenizer::kVocabSize;
    const std::int32_t eod = bpe ? bpe->eod() : ByteTokenizer::kEod;
    if (dtype_name == "uint16" && vocab_size > 65536)
      strata::fail<ConfigError>("--dtype uint16 cannot hold the ids of a vocabulary of ", vocab_size, " tokens; use int32 or auto");
    const auto dtype = dtype_name == "auto" ? strata::data::smallest_token_dtype(vocab_size) : strata::data::dtype_from_name(dtype_name);

    std::ifstream in(input, std::ios::binary);
    if (!in) strata::fail<FileError>("cannot open '", input, "' for reading");

    std::vector<Output> outputs;
    for (const auto& key : json_keys) {
      Output o;
      o.key = key;
      o.prefix = output_prefix + "_" + key + "_document";
      o.writer = std::make_unique<strata::data::IndexedDatasetWriter>(o.prefix, dtype);
      outputs.push_back(std::move(o));
    }

    const auto start = std::chrono::steady_clock::now();
    std::int64_t documents = 0, bytes_read = 0;
    std::vector<std::int32_t> tokens;
    auto add = [&](Output& out, std::string_view text) {
      if (text.empty()) {
        ++out.empty;
        return;
      }
      tokens.clear();
      if (bpe) bpe->encode_into(text, tokens);
      else ByteTokenizer::encode_into(text, tokens);
      if (append_eod) tokens.push_back(eod);
      out.writer->add_document(tokens);
    };
    auto progress = [&] {
      ++documents;
      if (log_interval > 0 && documents % log_interval == 0) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "processed %lld documents (%.1f MB, %.1f MB/s)\n", static_cast<long long>(documents),
                     static_cast<double>(bytes_read) / 1e6, static_cast<double>(bytes_read) / 1e6 / std::max(seconds, 1e-9));
      }
    };

    std::string line, paragraph;
    std::int64_t line_number = 0;
    while (std::getline(in, line)) {
      ++line_number;
      bytes_read += static_cast<std::int64_t>(line.size()) + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (jsonl) {
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        JsonLine json(line, input, line_number);
        for (auto& out : outputs) {
          auto text = json.string_field(out.key);
          if (!text) strata::fail<FileError>("'", input, "' line ", line_number, ": no key \"", out.key, "\"");
          add(out, *text);
        }
        progress();
      } else if (line.find_first_not_of(" \t\f\v") == std::string::npos) {
        if (!paragraph.empty()) {
          add(outputs[0], paragraph);
          paragraph.clear();
          progress();
        }
      } else {
        if (!paragraph.empty()) paragraph.push_back('\n');
        paragraph += line;
      }
    }
    if (in.bad()) strata::fail<FileError>("error while reading '", input, "'");
    if (!jsonl && !paragraph.empty()) {
      add(outputs[0], paragraph);
      progress();
    }

    for (auto& out : outputs) out.writer->finalize();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("input:      %s (%s, %lld lines, %.2f MB)\n", input.c_str(), jsonl ? "jsonl" : "text",
                static_cast<long long>(line_number), static_cast<double>(bytes_read) / 1e6);
    if (bpe)
      std::printf("tokenizer:  GPT2BPETokenizer (vocab %lld from '%s', %lld merges from '%s', eod %d%s)\n",
                  static_cast<long long>(vocab_size), vocab_file.c_str(), static_cast<long long>(bpe->merge_count()), merge_file.c_str(),
                  eod, append_eod ? ", appended" : ", not appended");
    else
      std::printf("tokenizer:  ByteTokenizer (vocab %lld, eod %d%s)\n", static_cast<long long>(vocab_size), eod,
                  append_eod ? ", appended" : ", not appended");
    for (const auto& out : outputs)
      std::printf("output:     %s.bin/.idx  key \"%s\": %lld documents, %lld tokens, dtype %s, %lld empty skipped\n",
                  out.prefix.c_str(), out.key.c_str(), static_cast<long long>(out.writer->document_count()),
                  static_cast<long long>(out.writer->token_count()),
                  std::string(strata::data::dtype_name(dtype)).c_str(), static_cast<long long>(out.empty));
    std::printf("time:       %.2f s\n", seconds);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "preprocess_data: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
