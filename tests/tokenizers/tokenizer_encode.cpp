// tokenizer_encode: the strata side of check_tokenizers.py: any tokenizer make_tokenizer builds,
// over texts given as hex-encoded bytes (so invalid UTF-8 travels too).
//
//   tokenizer_encode --tokenizer-type T [--tokenizer-model M] [--vocab-size N] [--vocab-file V --merge-file F]
//                    <texts.hex> <ids.txt>
//
// <texts.hex>: one text per line, its bytes in hex ("" for an empty text). <ids.txt>: one line per
// text, its ids separated by spaces. On stdout, one JSON object: texts, bytes, tokens, the seconds
// of one pass over the texts on one thread (encode_into, as preprocess_data calls it) and of a
// second pass (warm caches), vocab_size, eod and the tokenizer's description. Builds with g++ alone:
//
//   g++ -std=c++20 -O2 -Iinclude -DSTRATA_WITH_SENTENCEPIECE=1 tests/tokenizers/tokenizer_encode.cpp -lsentencepiece -o /tmp/tokenizer_encode
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <strata/data/text_tokenizer.hpp>

namespace {

std::vector<std::string> read_hex_texts(const std::string& path) {
  const std::string content = strata::data::detail::read_whole_file(path, "texts, one hex-encoded text per line");
  std::vector<std::string> texts;
  std::size_t line_number = 0;
  const auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t start = 0; start < content.size();) {
    std::size_t end = content.find('\n', start);
    if (end == std::string::npos) end = content.size();
    std::string_view line = std::string_view(content).substr(start, end - start);
    ++line_number;
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::string text;
    for (std::size_t k = 0; k < line.size(); k += 2) {
      const int high = nibble(line[k]), low = k + 1 < line.size() ? nibble(line[k + 1]) : -1;
      if (high < 0 || low < 0)
        strata::fail<strata::FileError>("'", path, "' line ", line_number, ": expected hex digits in pairs, found \"", line.substr(k, 2), "\"");
      text.push_back(static_cast<char>(high * 16 + low));
    }
    texts.push_back(std::move(text));
  }
  return texts;
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out.push_back(c);
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  strata::data::TokenizerOptions options;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tokenizer_encode: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--tokenizer-type") options.type = value();
    else if (arg == "--tokenizer-model") options.tokenizer_model = value();
    else if (arg == "--vocab-file") options.vocab_file = value();
    else if (arg == "--merge-file") options.merge_file = value();
    else if (arg == "--vocab-size") options.vocab_size = std::stoll(value());
    else positional.push_back(arg);
  }
  if (positional.size() != 2) {
    std::fprintf(stderr, "usage: %s --tokenizer-type T [--tokenizer-model M] [--vocab-size N] <texts.hex> <ids.txt>\n", argv[0]);
    return 2;
  }
  try {
    strata::data::Tokenizer tokenizer = strata::data::make_tokenizer(options);
    const std::vector<std::string> texts = read_hex_texts(positional[0]);
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
      if (again != ids[i]) strata::fail<strata::Error>("text ", i + 1, " encodes differently the second time");
    }
    const double warm = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    std::FILE* out = std::fopen(positional[1].c_str(), "wb");
    if (!out) strata::fail<strata::FileError>("cannot open '", positional[1], "' for writing");
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
    if (std::fclose(out) != 0) strata::fail<strata::FileError>("error while writing '", positional[1], "'");
    std::printf("{\"texts\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.6f, \"seconds_warm\": %.6f, \"vocab_size\": %lld, "
                "\"eod\": %d, \"description\": %s}\n",
                texts.size(), bytes, tokens, cold, warm, static_cast<long long>(tokenizer.vocab_size()), tokenizer.eod(),
                json_string(tokenizer.description()).c_str());
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "tokenizer_encode: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
