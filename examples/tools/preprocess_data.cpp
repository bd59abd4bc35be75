// preprocess_data: JSONL (or plain text) to Megatron indexed datasets, with the command line of
// Megatron's tools/preprocess_data.py and the bytes of its IndexedDatasetBuilder.
//
//   preprocess_data --input corpus.jsonl --output-prefix data/corpus --json-keys text --append-eod
//       --tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt
//       --workers 2
//   preprocess_data --input book.txt --output-prefix data/book --append-eod      (plain text)
//
// Writes <output-prefix>_<key>_document.bin/.idx for each --json-keys key (_sentence instead of
// _document with --split-sentences), as Megatron names them. As Megatron does:
//  - Input: one JSON object per line; a key's value is a string (one text) or a list of strings (a
//    text already cut into sentences, as Megatron's own sentence-split files hold them).
//  - A document is one line; its sequences are its sentences (a text is one sentence without
//    --split-sentences). A sentence that tokenizes to nothing is dropped, and --append-eod adds
//    the end-of-document id to the last sequence of a document that has one. So an empty text is a
//    document of no sequence (its document index repeats the previous one) and gets no EOD.
//  - Tokens: the tokenizer of --tokenizer-type and its files (data::make_tokenizer); .bin holds
//    uint16 when the vocabulary has fewer than 65500 ids, else int32.
//  - --workers N encodes on N threads, each with its own copy of the tokenizer; documents are
//    written in input order, so the files do not depend on N. Every --log-interval documents a
//    line "Processed <n> documents (<docs/s> docs/s, <MB/s> MB/s)." (MB = 2^20 bytes) on stderr.
//  - --partitions N (N > 1): --input is a glob pattern; the documents of the files it matches go
//    round robin (in N consecutive runs with --keep-sequential-samples) into N partition files
//    <input stem>_<i><input extension> beside the input; each is encoded to
//    <output-prefix>_<i>_<key>_<level>, and those are merged (IndexedDatasetWriter::add_index) into
//    <output-prefix>_<key>_<level>. The partition files and per-partition datasets stay, as
//    Megatron leaves them. With --keep-sequential-samples the merged files equal those of one
//    partition; round robin changes the order of the documents, as it does in Megatron.
//  - --split-sentences: each text is cut into sentences, one sequence each; --keep-newlines keeps
//    the whitespace (newlines included) after each sentence in it.
//
// Where strata differs from Megatron:
//  - The sentence splitter is a short rule set (sentence_splitter.hpp), NOT NLTK's punkt: sentence
//    boundaries may differ where punkt's trained model knows better (abbreviations, initials).
//    --lang is accepted and changes nothing. Splitting and encoding happen in one run with no
//    intermediate <input stem>_ss file (Megatron with one partition writes that file and stops;
//    a second run encodes it).
//  - A gzip input (recognized by its bytes) is read through zlib with or without partitions
//    (Megatron reads .gz only while writing partitions).
//  - Partition files are written anew on every run (Megatron reuses partition files it finds).
//    Partitions are encoded one after another, each on all --workers threads, so --workers need
//    not be a multiple of --partitions; --workers defaults to 1 (Megatron requires it).
//  - Blank lines of a JSONL file are skipped (Megatron stops on them); a bad line, a missing key or
//    an unreadable input is an error naming the file and the line.
//  - strata's additions: plain-text input (--input-format text, or any file not named .json/.jsonl:
//    one document per paragraph, paragraphs separated by blank lines, a paragraph's lines joined
//    with '\n', a trailing '\r' dropped), --dtype to force the token type, and the ByteTokenizer
//    (bytes 0..255, end of document 256; the default).
#include <CLI/CLI.hpp>
#include <glob.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <strata/data.hpp>

#include "sentence_splitter.hpp"

namespace {

using strata::ConfigError;
using strata::FileError;
namespace data = strata::data;

// ---------------------------------------------------------------------------------------------
// JSON: one object per line

// A key's value: one text, or a list of texts (sentences).
struct Field {
  bool found = false;
  bool list = false;
  std::vector<std::string> texts;
};

// Reads one JSON object per line and picks out the values of the wanted keys. The whole line is
// parsed, so an object that is not closed (`{"text": "abc"`) or text after it is an error naming
// the line, even when the key comes first. A key given twice takes its last value (Python's json).
class JsonLine {
 public:
  JsonLine(std::string_view text, const std::string& file, std::int64_t line) : s_(text), file_(file), line_(line) {}

  void parse(std::span<const std::string> keys, std::vector<Field>& fields) {
    fields.resize(keys.size());
    for (auto& f : fields) {
      f.found = false;
      f.list = false;
      f.texts.clear();
    }
    pos_ = 0;
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
        const auto wanted = std::find(keys.begin(), keys.end(), name);
        if (wanted != keys.end()) {
          Field& f = fields[static_cast<std::size_t>(wanted - keys.begin())];
          f.found = true;
          f.texts.clear();
          if (peek() == '"') {
            f.list = false;
            f.texts.push_back(parse_string());
          } else if (peek() == '[') {
            f.list = true;
            parse_string_list(name, f.texts);
          } else {
            error("the value of key \"", name, "\" is not a string or a list of strings");
          }
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
  static std::string hex_byte(char c) {
    static constexpr char kDigits[] = "0123456789abcdef";
    const auto b = static_cast<unsigned char>(c);
    return {kDigits[b >> 4], kDigits[b & 15]};
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
      // Copy the run up to the next quote or backslash at once.
      std::size_t stop = pos_;
      while (stop < s_.size() && s_[stop] != '"' && s_[stop] != '\\' && static_cast<unsigned char>(s_[stop]) >= 0x20) ++stop;
      if (stop == s_.size()) {
        pos_ = s_.size();
        error("unexpected end of line inside a string");
      }
      if (static_cast<unsigned char>(s_[stop]) < 0x20) {
        pos_ = stop;
        error("a raw control character (byte 0x", hex_byte(s_[stop]),
              ") inside a string; JSON (and Python's json.loads) requires it escaped, e.g. \\u00", hex_byte(s_[stop]));
      }
      out.append(s_.substr(pos_, stop - pos_));
      pos_ = stop + 1;
      if (s_[stop] == '"') return out;
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
  void parse_string_list(const std::string& name, std::vector<std::string>& out) {
    expect('[');
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return;
    }
    while (true) {
      skip_space();
      if (peek() != '"') error("the list under key \"", name, "\" holds something other than a string");
      out.push_back(parse_string());
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return;
    }
  }
  // Skips one value of a key nobody asked for. Iterative, with the open containers on a heap
  // stack, so that any depth of nesting costs memory in proportion to the line, never the
  // call stack.
  void skip_value() {
    std::string open;  // the closing bracket of each container still open, innermost last
    while (true) {
      // One value starts here.
      const char c = peek();
      bool done_value = true;
      if (c == '"') {
        parse_string();
      } else if (c == '{' || c == '[') {
        const char close = c == '{' ? '}' : ']';
        ++pos_;
        skip_space();
        if (peek() == close) {
          ++pos_;
        } else {
          open.push_back(close);
          done_value = false;
        }
      } else {  // number, true, false, null
        const std::size_t start = pos_;
        while (pos_ < s_.size() && s_[pos_] != ',' && s_[pos_] != '}' && s_[pos_] != ']' && s_[pos_] != ' ' &&
               s_[pos_] != '\t' && s_[pos_] != '\r' && s_[pos_] != '\n')
          ++pos_;
        if (pos_ == start) error("expected a value, found '", c, "'");
      }
      if (done_value) {
        // Close every container this value completes; stop where another member follows.
        while (true) {
          if (open.empty()) return;
          skip_space();
          if (peek() == ',') {
            ++pos_;
            break;
          }
          expect(open.back());
          open.pop_back();
        }
      }
      // The next member of the innermost open container.
      skip_space();
      if (open.back() == '}') {
        parse_string();
        skip_space();
        expect(':');
        skip_space();
      }
    }
  }

  std::string_view s_;
  const std::string& file_;
  std::int64_t line_;
  std::size_t pos_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Input: lines of a plain or gzip file, and documents made of them

// Lines of a file, plain or gzip (zlib reads a file without the gzip header as it is).
class LineReader {
 public:
  // Reads in 64 KiB steps: zlib drops the data of a step that fails, so a damaged file is
  // reported within 64 KiB of the damage.
  explicit LineReader(std::string path) : path_(std::move(path)), buffer_(std::size_t{1} << 16) {
    errno = 0;
    file_ = gzopen(path_.c_str(), "rb");
    if (file_ == nullptr)
      strata::fail<FileError>("cannot open '", path_, "' for reading: ", errno != 0 ? std::strerror(errno) : "out of memory");
    gzbuffer(file_, 1u << 16);
  }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  ~LineReader() { gzclose(file_); }

  // The next line without its '\n' (and without a '\r' before it); false at the end of the file.
  bool next(std::string& line) {
    line.clear();
    bool any = false;
    while (true) {
      if (pos_ == size_ && !refill()) {
        if (!any) return false;
        break;
      }
      any = true;
      const char* begin = buffer_.data() + pos_;
      const auto* newline = static_cast<const char*>(std::memchr(begin, '\n', size_ - pos_));
      if (newline != nullptr) {
        const auto n = static_cast<std::size_t>(newline - begin);
        line.append(begin, n);
        pos_ += n + 1;
        bytes_ += static_cast<std::int64_t>(n) + 1;
        break;
      }
      line.append(begin, size_ - pos_);
      bytes_ += static_cast<std::int64_t>(size_ - pos_);
      pos_ = size_;
    }
    ++line_number_;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return true;
  }
  const std::string& path() const { return path_; }
  std::int64_t line_number() const { return line_number_; }
  std::int64_t bytes() const { return bytes_; }  // uncompressed bytes read so far
  bool gzip() const { return gzdirect(file_) == 0; }

 private:
  bool refill() {
    if (eof_) return false;
    const int n = gzread(file_, buffer_.data(), static_cast<unsigned>(buffer_.size()));
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (n < 0 || (code != Z_OK && code != Z_STREAM_END))
      strata::fail<FileError>("'", path_, "' line ", line_number_ + 1, ": cannot read", gzdirect(file_) == 0 ? " the gzip data" : "",
                              " past this line (zlib: ", message != nullptr ? message : "unknown error", ")",
                              code == Z_ERRNO ? std::string(" (") + std::strerror(errno) + ")" : std::string());
    if (n == 0) {
      eof_ = true;
      return false;
    }
    pos_ = 0;
    size_ = static_cast<std::size_t>(n);
    return true;
  }

  std::string path_;
  gzFile file_ = nullptr;
  std::vector<char> buffer_;
  std::size_t pos_ = 0, size_ = 0;
  std::int64_t line_number_ = 0, bytes_ = 0;
  bool eof_ = false;
};

// One document of the input: a JSON line or a paragraph, with the line it starts on.
struct Record {
  std::int64_t line = 0;
  std::string text;
};

// Documents of a file: its non-blank lines (JSONL) or its paragraphs (plain text).
class RecordReader {
 public:
  RecordReader(const std::string& path, bool jsonl) : lines_(path), jsonl_(jsonl) {}

  bool next(Record& record) {
    record.text.clear();
    if (jsonl_) {
      while (lines_.next(line_)) {
        if (line_.find_first_not_of(" \t") == std::string::npos) continue;
        record.line = lines_.line_number();
        std::swap(record.text, line_);
        return true;
      }
      return false;
    }
    while (lines_.next(line_)) {
      if (line_.find_first_not_of(" \t\f\v") == std::string::npos) {
        if (!record.text.empty()) return true;
        continue;
      }
      if (record.text.empty()) record.line = lines_.line_number();
      else record.text.push_back('\n');
      record.text += line_;
    }
    return !record.text.empty();
  }
  const LineReader& lines() const { return lines_; }

 private:
  LineReader lines_;
  bool jsonl_;
  std::string line_;
};

// ---------------------------------------------------------------------------------------------
// Encoding (Megatron's Encoder.encode), in batches on worker threads

struct Settings {
  std::vector<std::string> keys;
  bool jsonl = true;
  bool append_eod = false;
  bool split_sentences = false;
  bool keep_newlines = false;
  std::int64_t log_interval = 1000;
};

// One key's documents of a batch: tokens back to back, the sequence lengths, and how many
// sequences each document has (0: an empty document).
struct KeyDocuments {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> lengths;
  std::vector<std::int32_t> sequences;
};

struct Batch {
  std::vector<Record> records;
  std::int64_t bytes = 0;
  const std::string* file = nullptr;
  std::vector<KeyDocuments> documents;  // [key]
  std::exception_ptr error;
  bool done = false;
};

class Encoder {
 public:
  Encoder(const Settings& settings, data::Tokenizer tokenizer) : settings_(settings), tokenizer_(std::move(tokenizer)) {}

  void encode(Batch& batch) {
    const auto& keys = settings_.keys;
    batch.documents.assign(keys.size(), KeyDocuments{});
    for (const Record& record : batch.records) {
      if (!settings_.jsonl) {
        try {
          add_document(std::span<const std::string>(&record.text, 1), false, batch.documents[0]);
        } catch (const strata::Error& e) {
          strata::fail<FileError>("'", *batch.file, "' line ", record.line, ": ", e.what());
        }
        continue;
      }
      JsonLine(record.text, *batch.file, record.line).parse(keys, fields_);
      for (std::size_t k = 0; k < keys.size(); ++k) {
        if (!fields_[k].found) strata::fail<FileError>("'", *batch.file, "' line ", record.line, ": no key \"", keys[k], "\"");
        try {
          add_document(fields_[k].texts, fields_[k].list, batch.documents[k]);
        } catch (const strata::Error& e) {  // a text the tokenizer refuses: say where it is
          strata::fail<FileError>("'", *batch.file, "' line ", record.line, ", key \"", keys[k], "\": ", e.what());
        }
      }
    }
  }

 private:
  // A document of `texts`: sentences if `already_split` (a JSON list), else texts to split (with
  // --split-sentences) or to take whole.
  void add_document(std::span<const std::string> texts, bool already_split, KeyDocuments& out) {
    std::int32_t sequences = 0;
    auto add_sentence = [&](std::string_view sentence) {
      const std::size_t before = out.tokens.size();
      tokenizer_.encode_into(sentence, out.tokens);
      const std::size_t length = out.tokens.size() - before;
      if (length == 0) return;  // Megatron keeps only sentences with tokens
      if (length >= static_cast<std::size_t>(INT32_MAX))
        strata::fail<ConfigError>("a sentence of ", length, " tokens does not fit the int32 length field of .idx");
      out.lengths.push_back(static_cast<std::int32_t>(length));
      ++sequences;
    };
    for (const std::string& text : texts) {
      if (settings_.split_sentences && !already_split) {
        for (std::string_view sentence : strata::tools::split_sentences(text, settings_.keep_newlines)) add_sentence(sentence);
      } else {
        add_sentence(text);
      }
    }
    if (sequences > 0 && settings_.append_eod) {
      out.tokens.push_back(tokenizer_.eod());
      ++out.lengths.back();
    }
    out.sequences.push_back(sequences);
  }

  const Settings& settings_;
  data::Tokenizer tokenizer_;
  std::vector<Field> fields_;
};

// Up to this many workers are started as asked, whatever the hardware (beyond, see main()).
constexpr int kMinWorkerBound = 64;

// Worker threads that encode batches; the caller takes the results back in the order it submitted
// them, so the output never depends on the number of workers.
class EncoderPool {
 public:
  EncoderPool(const Settings& settings, const data::Tokenizer& tokenizer, int workers) {
    for (int w = 0; w < workers; ++w) encoders_.emplace_back(std::make_unique<Encoder>(settings, tokenizer));
    try {
      for (int w = 0; w < workers; ++w) threads_.emplace_back([this, w] { run(*encoders_[static_cast<std::size_t>(w)]); });
    } catch (const std::system_error& e) {
      const auto started = threads_.size();
      stop_all();
      strata::fail<ConfigError>("--workers ", workers, ": the system refused to start thread ", started + 1, " (", e.what(),
                                "); use fewer workers (this machine has ", std::thread::hardware_concurrency(),
                                " hardware threads)");
    }
  }
  EncoderPool(const EncoderPool&) = delete;
  EncoderPool& operator=(const EncoderPool&) = delete;
  ~EncoderPool() { stop_all(); }

  int workers() const { return static_cast<int>(threads_.size()); }
  void submit(Batch* batch) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(batch);
    }
    work_ready_.notify_one();
  }
  // Waits until `batch` is encoded; rethrows what encoding it threw.
  void wait(Batch& batch) {
    std::unique_lock lock(mutex_);
    batch_done_.wait(lock, [&] { return batch.done; });
    if (batch.error) std::rethrow_exception(batch.error);
  }

 private:
  void run(Encoder& encoder) {
    while (true) {
      Batch* batch = nullptr;
      {
        std::unique_lock lock(mutex_);
        work_ready_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        batch = queue_.front();
        queue_.pop_front();
      }
      try {
        encoder.encode(*batch);
      } catch (...) {
        batch->error = std::current_exception();
      }
      {
        std::lock_guard lock(mutex_);
        batch->done = true;
      }
      batch_done_.notify_all();
    }
  }

  void stop_all() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    work_ready_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  std::vector<std::unique_ptr<Encoder>> encoders_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable work_ready_, batch_done_;
  std::deque<Batch*> queue_;
  bool stop_ = false;
};

struct KeyTotals {
  std::int64_t documents = 0, empty_documents = 0;
};

// Encodes the documents of `path` into one writer per key, in input order. Returns the number of
// documents and adds to each key's totals.
std::int64_t encode_file(const std::string& path, const Settings& settings, EncoderPool& pool,
                         std::span<const std::unique_ptr<data::IndexedDatasetWriter>> writers, std::vector<KeyTotals>& totals,
                         std::int64_t& bytes_total) {
  std::fprintf(stderr, "Opening %s\n", path.c_str());
  RecordReader reader(path, settings.jsonl);
  const std::size_t max_in_flight = 4 * static_cast<std::size_t>(pool.workers()) + 2;
  constexpr std::size_t kBatchRecords = 256;
  constexpr std::int64_t kBatchBytes = std::int64_t{1} << 20;

  std::deque<std::unique_ptr<Batch>> in_flight;
  std::exception_ptr read_error;  // raised after the documents before it are written
  bool input_left = true;
  std::int64_t documents = 0, bytes_done = 0;
  const auto start = std::chrono::steady_clock::now();
  try {
    while (true) {
      while (input_left && !read_error && in_flight.size() < max_in_flight) {
        auto batch = std::make_unique<Batch>();
        batch->file = &path;
        const std::int64_t bytes_before = reader.lines().bytes();
        try {
          Record record;
          while (batch->records.size() < kBatchRecords && reader.lines().bytes() - bytes_before < kBatchBytes) {
            if (!reader.next(record)) {
              input_left = false;
              break;
            }
            batch->records.push_back(std::move(record));
          }
        } catch (const FileError&) {
          read_error = std::current_exception();
        }
        batch->bytes = reader.lines().bytes() - bytes_before;
        if (batch->records.empty()) break;
        pool.submit(batch.get());
        in_flight.push_back(std::move(batch));
      }
      if (in_flight.empty()) break;
      Batch& batch = *in_flight.front();
      pool.wait(batch);
      for (std::size_t k = 0; k < writers.size(); ++k) {
        const KeyDocuments& docs = batch.documents[k];
        std::size_t token = 0, sequence = 0;
        for (std::int32_t count : docs.sequences) {
          std::span<const std::int32_t> lengths(docs.lengths.data() + sequence, static_cast<std::size_t>(count));
          std::size_t tokens = 0;
          for (std::int32_t length : lengths) tokens += static_cast<std::size_t>(length);
          writers[k]->add_document(std::span<const std::int32_t>(docs.tokens.data() + token, tokens), lengths);
          token += tokens;
          sequence += static_cast<std::size_t>(count);
          ++totals[k].documents;
          if (count == 0) ++totals[k].empty_documents;
        }
      }
      // Progress as Megatron prints it, with bytes spread evenly over the batch's documents.
      const auto records = static_cast<std::int64_t>(batch.records.size());
      for (std::int64_t r = 1; r <= records; ++r) {
        ++documents;
        if (settings.log_interval > 0 && documents % settings.log_interval == 0) {
          const double seconds = std::max(1e-9, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
          const double bytes = static_cast<double>(bytes_done) + static_cast<double>(batch.bytes) * static_cast<double>(r) / static_cast<double>(records);
          std::fprintf(stderr, "Processed %lld documents (%.1f docs/s, %.2f MB/s).\n", static_cast<long long>(documents),
                       static_cast<double>(documents) / seconds, bytes / seconds / 1024 / 1024);
        }
      }
      bytes_done += batch.bytes;
      in_flight.pop_front();
    }
  } catch (...) {
    // Let the workers finish the batches they hold before those batches are freed.
    for (auto& batch : in_flight) {
      try {
        pool.wait(*batch);
      } catch (...) {
      }
    }
    throw;
  }
  if (read_error) std::rethrow_exception(read_error);
  bytes_total += bytes_done;
  return documents;
}

// ---------------------------------------------------------------------------------------------
// Partitions

// Python's os.path.splitext: the extension is the last '.' of the file name and what follows,
// unless the name only starts with dots.
std::pair<std::string, std::string> split_extension(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  const std::size_t name = slash == std::string::npos ? 0 : slash + 1;
  const std::size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || dot < name) return {path, ""};
  std::size_t first = name;
  while (first < path.size() && path[first] == '.') ++first;
  if (dot < first) return {path, ""};
  return {path.substr(0, dot), path.substr(dot)};
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t matches{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> files;
  if (rc == 0)
    for (std::size_t i = 0; i < matches.gl_pathc; ++i) files.emplace_back(matches.gl_pathv[i]);
  globfree(&matches);
  if (rc == GLOB_NOMATCH || files.empty()) strata::fail<FileError>("no file matches --input '", pattern, "'");
  if (rc != 0) strata::fail<FileError>("cannot list the files of --input '", pattern, "'");
  return files;
}

// Writes the documents of `inputs` into the partition files, round robin or in consecutive runs
// (Megatron's --keep-sequential-samples: runs of ceil(documents / partitions)).
void write_partitions(const std::vector<std::string>& inputs, const std::vector<std::string>& partitions, bool sequential,
                      bool jsonl) {
  const auto count = static_cast<std::int64_t>(partitions.size());
  std::int64_t run = 0;
  if (sequential) {
    std::int64_t total = 0;
    Record record;
    for (const auto& input : inputs) {
      RecordReader reader(input, jsonl);
      while (reader.next(record)) ++total;
    }
    run = std::max<std::int64_t>(1, (total + count - 1) / count);
  }
  std::vector<std::ofstream> outs;
  for (const auto& p : partitions) {
    outs.emplace_back(p, std::ios::binary | std::ios::trunc);
    if (!outs.back()) strata::fail<FileError>("cannot create the partition file '", p, "': ", std::strerror(errno));
  }
  std::int64_t index = 0, seen = 0;
  Record record;
  for (const auto& input : inputs) {
    RecordReader reader(input, jsonl);
    while (reader.next(record)) {
      auto& out = outs[static_cast<std::size_t>(index)];
      out << record.text << (jsonl ? "\n" : "\n\n");
      ++seen;
      index = sequential ? std::min(count - 1, seen / run) : (index + 1) % count;
    }
  }
  for (std::size_t i = 0; i < outs.size(); ++i) {
    outs[i].close();
    if (!outs[i]) strata::fail<FileError>("cannot write the partition file '", partitions[i], "' (disk full?)");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Tokenize JSONL (or plain text) into Megatron indexed datasets, <output-prefix>_<key>_document.bin/.idx, with the "
      "flags and the bytes of Megatron's tools/preprocess_data.py."};
  std::string input, output_prefix, format = "auto", dtype_name = "auto", lang = "english";
  data::TokenizerOptions tokenizer_options;
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false, split_sentences = false, keep_newlines = false, keep_sequential = false;
  int workers = 1, partitions = 1;
  std::int64_t log_interval = 1000;
  app.add_option("--input", input,
                 "input file: JSONL (one JSON object per line; a .gz is read through zlib) or plain text (documents separated "
                 "by blank lines); with --partitions > 1 a glob pattern")
      ->required();
  app.add_option("--output-prefix", output_prefix, "output path prefix: <prefix>_<key>_document.bin/.idx")->required();
  app.add_option("--json-keys", json_keys, "JSON keys to extract, one dataset each (plain text uses the first)")
      ->capture_default_str();
  app.add_flag("--split-sentences", split_sentences,
               "one sequence per sentence (output _sentence.bin/.idx); strata's simple rule-based splitter, not NLTK punkt");
  app.add_flag("--keep-newlines", keep_newlines,
               "with --split-sentences: keep the whitespace (newlines included) after each sentence in it");
  app.add_option("--lang", lang, "accepted for Megatron's command lines; the simple sentence splitter ignores it")
      ->capture_default_str();
  app.add_option("--tokenizer-type", tokenizer_options.type,
                 "Megatron's tokenizer type (ByteTokenizer: bytes 0..255, end of document 256; GPT2BPETokenizer: "
                 "--vocab-file and --merge-file; see data/text_tokenizer.hpp for the others)")
      ->capture_default_str();
  app.add_option("--vocab-file", tokenizer_options.vocab_file, "the tokenizer's vocabulary file (GPT2BPETokenizer: vocab.json)");
  app.add_option("--merge-file", tokenizer_options.merge_file, "the tokenizer's merges file (GPT2BPETokenizer: merges.txt)");
  app.add_option("--tokenizer-model", tokenizer_options.tokenizer_model, "the tokenizer's model file, for the types that take one");
  app.add_option("--vocab-size", tokenizer_options.vocab_size, "the vocabulary size, for the types that take one (NullTokenizer)");
  app.add_flag("--append-eod", append_eod, "append the end-of-document token to every non-empty document");
  app.add_option("--workers", workers, "encoding threads; the output does not depend on their number")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--partitions", partitions, "split the input into this many partition files, encode each, merge the results")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--keep-sequential-samples", keep_sequential,
               "with --partitions > 1: consecutive runs of documents per partition (input order kept) instead of round robin");
  app.add_option("--log-interval", log_interval, "print progress every this many documents (0: never)")->capture_default_str();
  app.add_option("--input-format", format, "jsonl, text, or auto (jsonl for .json/.jsonl, also under .gz)")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}))
      ->capture_default_str();
  app.add_option("--dtype", dtype_name, "token type in .bin: uint16, int32, or auto (uint16 below 65500 ids, as Megatron)")
      ->check(CLI::IsMember({"auto", "uint16", "int32"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    if (format == "auto") {
      std::string name = input;
      if (name.ends_with(".gz")) name.resize(name.size() - 3);
      format = name.ends_with(".jsonl") || name.ends_with(".json") ? "jsonl" : "text";
    }
    Settings settings;
    settings.jsonl = format == "jsonl";
    settings.append_eod = append_eod;
    settings.split_sentences = split_sentences;
    settings.keep_newlines = keep_newlines;
    if (log_interval < 0)
      strata::fail<ConfigError>("--log-interval ", log_interval, " is negative; give the number of documents between progress lines, "
                                "or 0 for none");
    settings.log_interval = log_interval;
    // Each worker holds its own copy of the tokenizer: far more workers than hardware threads
    // only cost memory (and may exceed the system's thread limit), never speed.
    const int hardware_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (workers > std::max(kMinWorkerBound, 4 * hardware_threads)) {
      std::fprintf(stderr, "note: --workers %d is far more than this machine's %d hardware threads; using %d workers (the output does not depend on their number)\n",
                   workers, hardware_threads, hardware_threads);
      workers = hardware_threads;
    }
    if (!settings.jsonl) json_keys.resize(1);
    for (std::size_t i = 0; i < json_keys.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (json_keys[i] == json_keys[j]) strata::fail<ConfigError>("--json-keys names \"", json_keys[i], "\" twice");
    settings.keys = json_keys;
    const std::string level = split_sentences ? "sentence" : "document";

    data::Tokenizer tokenizer = data::make_tokenizer(tokenizer_options);
    const std::int64_t vocab_size = tokenizer.vocab_size();
    if (dtype_name == "uint16" && vocab_size > 65536)
      strata::fail<ConfigError>("--dtype uint16 cannot hold the ids of a vocabulary of ", vocab_size, " tokens; use int32 or auto");
    const data::DType dtype = dtype_name == "auto" ? data::smallest_token_dtype(vocab_size) : data::dtype_from_name(dtype_name);

    // What to encode: the input, or the partition files made from the files its pattern matches.
    struct Part {
      std::string input, output_prefix;
    };
    std::vector<Part> parts;
    if (partitions == 1) {
      parts.push_back({input, output_prefix});
    } else {
      const auto [stem, extension] = split_extension(input);
      std::vector<std::string> partition_files;
      for (int i = 0; i < partitions; ++i) {
        partition_files.push_back(stem + "_" + std::to_string(i) + extension);
        parts.push_back({partition_files.back(), output_prefix + "_" + std::to_string(i)});
      }
      std::vector<std::string> inputs;
      for (auto& file : expand_glob(input))  // never the partition files of an earlier run
        if (std::find(partition_files.begin(), partition_files.end(), file) == partition_files.end()) inputs.push_back(file);
      if (inputs.empty()) strata::fail<FileError>("no file matches --input '", input, "' but its own partition files");
      for (const auto& file : inputs) {
        // Fail early on an unreadable input, before the partition files are created.
        LineReader probe(file);
      }
      std::fprintf(stderr, "Writing %d partition files from %zu input file(s)\n", partitions, inputs.size());
      write_partitions(inputs, partition_files, keep_sequential, settings.jsonl);
    }

    const auto start = std::chrono::steady_clock::now();
    std::vector<KeyTotals> totals(json_keys.size());
    std::int64_t documents = 0, bytes = 0;
    {
      EncoderPool pool(settings, tokenizer, workers);
      for (const Part& part : parts) {
        std::vector<std::unique_ptr<data::IndexedDatasetWriter>> writers;
        for (const auto& key : json_keys)
          writers.push_back(std::make_unique<data::IndexedDatasetWriter>(part.output_prefix + "_" + key + "_" + level, dtype));
        std::vector<KeyTotals> part_totals(json_keys.size());
        documents += encode_file(part.input, settings, pool, writers, part_totals, bytes);
        for (auto& w : writers) w->finalize();
        for (std::size_t k = 0; k < totals.size(); ++k) {
          totals[k].documents += part_totals[k].documents;
          totals[k].empty_documents += part_totals[k].empty_documents;
        }
      }
    }
    const double encode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    if (partitions > 1) {  // Megatron's merge: the partitions' datasets in order, by the writer
      for (const auto& key : json_keys) {
        data::IndexedDatasetWriter writer(output_prefix + "_" + key + "_" + level, dtype);
        for (const Part& part : parts) writer.add_index(part.output_prefix + "_" + key + "_" + level);
        writer.finalize();
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    std::printf("input:      %s (%s, %d partition%s, %.2f MB)\n", input.c_str(), settings.jsonl ? "jsonl" : "text", partitions,
                partitions == 1 ? "" : "s", static_cast<double>(bytes) / 1e6);
    std::printf("tokenizer:  %s, eod %s\n", tokenizer.description().c_str(), append_eod ? "appended" : "not appended");
    if (split_sentences)
      std::printf("sentences:  split by strata's rule-based splitter (not NLTK punkt)%s\n",
                  keep_newlines ? ", whitespace after each sentence kept" : "");
    for (std::size_t k = 0; k < json_keys.size(); ++k) {
      const std::string prefix = output_prefix + "_" + json_keys[k] + "_" + level;
      const data::IndexedDataset written(prefix);
      std::printf("output:     %s.bin/.idx  key \"%s\": %lld documents (%lld empty), %lld sequences, %lld tokens, dtype %s\n",
                  prefix.c_str(), json_keys[k].c_str(), static_cast<long long>(written.document_count()),
                  static_cast<long long>(totals[k].empty_documents), static_cast<long long>(written.sequence_count()),
                  static_cast<long long>(written.token_count()), std::string(data::dtype_name(dtype)).c_str());
    }
    std::printf("time:       %.2f s (%d worker%s): %.1f documents/s, %.2f MB/s (MB = 10^6 bytes)\n", seconds, workers,
                workers == 1 ? "" : "s", static_cast<double>(documents) / std::max(encode_seconds, 1e-9),
                static_cast<double>(bytes) / 1e6 / std::max(encode_seconds, 1e-9));
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "preprocess_data: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
