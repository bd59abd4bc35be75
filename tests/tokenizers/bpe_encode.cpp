// bpe_encode: the strata side of the check against Hugging Face tokenizers (check_bpe.py).
//
//   bpe_encode <vocab.json> <merges.txt> <texts.jsonl> <ids.txt>
//
// Reads one JSON string per line of <texts.jsonl> (blank lines are skipped), encodes each
// with BpeTokenizer, and writes one line per text to <ids.txt>: its ids separated by spaces. On
// stdout, one JSON object: texts, bytes, tokens, the seconds of the first pass (an empty word
// cache, as a fresh preprocessing run) and of a second pass over the same texts (a warm cache),
// the tokenizer's vocabulary size, merges, EOD, the Unicode version of its tables, and how many
// texts did not decode back to themselves (none should). It needs nothing but a C++20 compiler
// and strata's headers, so it builds with one g++ command:
//
//   g++ -std=c++20 -O2 -Iinclude tests/tokenizers/bpe_encode.cpp -o /tmp/bpe_encode
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <strata/data/bpe_tokenizer.hpp>

namespace {

std::vector<std::string> read_texts(const std::string& path) {
  const std::string content = strata::data::detail::read_whole_file(path, "texts, one JSON string per line");
  std::vector<std::string> texts;
  std::size_t line_number = 0;
  for (std::size_t start = 0; start < content.size();) {
    std::size_t end = content.find('\n', start);
    if (end == std::string::npos) end = content.size();
    const std::string_view line = std::string_view(content).substr(start, end - start);
    ++line_number;
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const strata::json::Value value =
        strata::json::parse(line, strata::detail::concat("line ", line_number, " of '", path, "' (one JSON string per line)"));
    if (!value.is_string())
      strata::fail<strata::FileError>("line ", line_number, " of '", path, "' holds ", strata::json::Value::kind_name(value.kind()),
                                      "; expected one JSON string per line");
    texts.push_back(value.text());
  }
  return texts;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s <vocab.json> <merges.txt> <texts.jsonl> <ids.txt>\n", argv[0]);
    return 2;
  }
  try {
    strata::data::BpeTokenizer tokenizer(argv[1], argv[2]);
    const std::vector<std::string> texts = read_texts(argv[3]);
    std::vector<std::vector<std::int32_t>> ids(texts.size());
    std::size_t bytes = 0, tokens = 0;

    auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < texts.size(); ++i) tokenizer.encode_into(texts[i], ids[i]);
    const double cold = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    std::vector<std::int32_t> again;
    start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < texts.size(); ++i) {
      again.clear();
      tokenizer.encode_into(texts[i], again);
      if (again != ids[i]) strata::fail<strata::Error>("text ", i + 1, " encodes differently with a warm cache");
    }
    const double warm = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    std::size_t round_trip_failures = 0;
    for (std::size_t i = 0; i < texts.size(); ++i)
      if (tokenizer.decode(ids[i]) != texts[i]) ++round_trip_failures;

    std::FILE* out = std::fopen(argv[4], "wb");
    if (!out) strata::fail<strata::FileError>("cannot open '", argv[4], "' for writing");
    std::string line;
    for (std::size_t i = 0; i < texts.size(); ++i) {
      bytes += texts[i].size();
      tokens += ids[i].size();
      line.clear();
      for (std::size_t k = 0; k < ids[i].size(); ++k) {
        if (k) line.push_back(' ');
        line += std::to_string(ids[i][k]);
      }
      line.push_back('\n');
      std::fwrite(line.data(), 1, line.size(), out);
    }
    if (std::fclose(out) != 0) strata::fail<strata::FileError>("error while writing '", argv[4], "'");

    std::printf(
        "{\"texts\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.6f, \"seconds_warm\": %.6f, \"vocab_size\": %lld, "
        "\"merges\": %lld, \"eod\": %d, \"unicode\": \"%s\", \"round_trip_failures\": %zu}\n",
        texts.size(), bytes, tokens, cold, warm, static_cast<long long>(tokenizer.vocab_size()),
        static_cast<long long>(tokenizer.merge_count()), tokenizer.eod(), strata::data::unicode::kUnicodeVersion, round_trip_failures);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "bpe_encode: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
