// The shipped tokenizers (tests/tokenizers, trained by train_tokenizers.py) against the ids the
// Python packages gave (tests/tokenizers/expected/*.jsonl, written by check_tokenizers.py): the
// corpus paragraphs by token count and FNV-1a 64 hash, the adversarial cases id for id. No Python is
// needed here. The SentencePiece configurations run where this program links strata::sentencepiece
// (and are skipped, saying so, elsewhere); so do the tests of Megatron's SentencePiece semantics
// and of the SentencePiece files' errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include <strata/data/text_tokenizer.hpp>

namespace fs = std::filesystem;
using namespace strata::data;
using strata::ConfigError;
using strata::FileError;
using Ids = std::vector<std::int32_t>;

namespace {

const std::string kTokenizers = STRATA_TOKENIZERS_DIR;
const std::string kCorpus = STRATA_EXAMPLES_DATA_DIR "/kjv_pentateuch.txt";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

template <class E = FileError>
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception thrown; expected one with: " << testing::PrintToString(parts);
  } catch (const E& e) {
    const std::string message = e.what();
    for (const auto& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
  }
}

// The corpus as train_bpe.py's read_paragraphs splits it: lines without a trailing '\r'; a line of
// only spaces, tabs, form feeds and vertical tabs ends a paragraph; a paragraph keeps its newlines.
std::vector<std::string> corpus_paragraphs() {
  const std::string text = read_text(kCorpus);
  std::vector<std::string> paragraphs;
  std::string current;
  bool any = false;
  for (std::size_t start = 0; start <= text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t\f\v") == std::string::npos) {
      if (any) paragraphs.push_back(current);
      current.clear();
      any = false;
    } else {
      if (any) current += '\n';
      current += line;
      any = true;
    }
    if (end == text.size()) break;
  }
  if (any) paragraphs.push_back(current);
  return paragraphs;
}

std::uint64_t fnv1a64(const Ids& ids) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::int32_t id : ids)
    for (int k = 0; k < 4; ++k) {
      h ^= (static_cast<std::uint32_t>(id) >> (8 * k)) & 0xFFu;
      h *= 0x100000001b3ull;
    }
  return h;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t k = 0; k + 1 < hex.size(); k += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(k, 2), nullptr, 16)));
  return out;
}

bool is_sentencepiece_type(const std::string& type) { return type != "HuggingFaceTokenizer"; }

void check_fixture(const std::string& config) {
  const std::string path = kTokenizers + "/expected/" + config + ".jsonl";
  const std::string text = read_text(path);
  ASSERT_FALSE(text.empty()) << "missing " << path;
  std::vector<strata::json::Value> lines;
  for (std::size_t start = 0, number = 1; start < text.size(); ++number) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) lines.push_back(strata::json::parse(std::string_view(text).substr(start, end - start), path + " line " + std::to_string(number)));
    start = end + 1;
  }
  ASSERT_GT(lines.size(), 1u);
  const auto& head = lines[0];
  const std::string type = head.find("tokenizer_type")->text();
  if (is_sentencepiece_type(type) && !kHasSentencePiece) GTEST_SKIP() << config << ": built without SentencePiece (strata::sentencepiece)";
  Tokenizer tokenizer = make_tokenizer({.type = type, .tokenizer_model = kTokenizers + "/" + head.find("tokenizer_model")->text()});
  std::int64_t vocab_size = 0, eod = 0;
  ASSERT_TRUE(head.find("vocab_size")->to_int64(vocab_size) && head.find("eod")->to_int64(eod));
  EXPECT_EQ(tokenizer.vocab_size(), vocab_size);
  EXPECT_EQ(tokenizer.eod(), eod);

  const std::vector<std::string> paragraphs = corpus_paragraphs();
  std::size_t corpus_checked = 0, cases_checked = 0;
  for (std::size_t k = 1; k < lines.size(); ++k) {
    const auto& line = lines[k];
    if (const auto* paragraph = line.find("paragraph")) {
      std::int64_t index = 0, count = 0;
      ASSERT_TRUE(paragraph->to_int64(index) && line.find("count")->to_int64(count));
      ASSERT_LT(static_cast<std::size_t>(index), paragraphs.size());
      const Ids ids = tokenizer.encode(paragraphs[static_cast<std::size_t>(index)]);
      char hash[17];
      std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a64(ids)));
      EXPECT_EQ(static_cast<std::int64_t>(ids.size()), count) << config << " paragraph " << index;
      EXPECT_EQ(std::string(hash), line.find("fnv1a64")->text()) << config << " paragraph " << index;
      ++corpus_checked;
      continue;
    }
    const std::string name = line.find("case")->text();
    const std::string input = line.find("text") ? line.find("text")->text() : from_hex(line.find("hex")->text());
    Ids expected;
    for (const auto& id : line.find("ids")->items()) {
      std::int64_t v = 0;
      ASSERT_TRUE(id.to_int64(v));
      expected.push_back(static_cast<std::int32_t>(v));
    }
    EXPECT_EQ(tokenizer.encode(input), expected) << config << " case \"" << name << "\"";
    ++cases_checked;
  }
  EXPECT_EQ(corpus_checked, paragraphs.size());
  EXPECT_GT(cases_checked, 60u);
}

}  // namespace

TEST(TokenizerFixtures, CorpusHasItsParagraphs) { EXPECT_EQ(corpus_paragraphs().size(), 187u); }
TEST(TokenizerFixtures, HuggingFaceGpt2Style) { check_fixture("hf_gpt2"); }
TEST(TokenizerFixtures, HuggingFaceLlama3Style) { check_fixture("hf_llama3"); }
TEST(TokenizerFixtures, Llama2Tokenizer) { check_fixture("sp_llama2"); }
TEST(TokenizerFixtures, SentencePieceTokenizer) { check_fixture("sp_megatron"); }
TEST(TokenizerFixtures, GptSentencePieceTokenizerUnigram) { check_fixture("sp_gpt_unigram"); }

// ---------------------------------------------------------------------------------------------
// Megatron's SentencePiece semantics (where the library is linked)

#if defined(STRATA_WITH_SENTENCEPIECE)
TEST(SentencePiece, MegatronSemantics) {
  const std::string model = kTokenizers + "/sp_bpe.model";
  Tokenizer llama2 = make_tokenizer({.type = "Llama2Tokenizer", .tokenizer_model = model});
  Tokenizer gpt = make_tokenizer({.type = "GPTSentencePieceTokenizer", .tokenizer_model = model});
  Tokenizer megatron = make_tokenizer({.type = "SentencePieceTokenizer", .tokenizer_model = model});
  // Llama2Tokenizer: bos (1) first, no eos; EOD is eos (2); vocab = the pieces.
  const Ids plain = gpt.encode("In the beginning");
  ASSERT_FALSE(plain.empty());
  Ids with_bos{1};
  with_bos.insert(with_bos.end(), plain.begin(), plain.end());
  EXPECT_EQ(llama2.encode("In the beginning"), with_bos);
  EXPECT_EQ(llama2.eod(), 2);
  EXPECT_EQ(llama2.vocab_size(), 2000);
  EXPECT_EQ(gpt.eod(), 2);
  EXPECT_EQ(gpt.vocab_size(), 2000);
  EXPECT_EQ(llama2.encode(""), (Ids{1}));
  EXPECT_EQ(gpt.decode(plain), "In the beginning");
  // SentencePieceTokenizer: <CLS> <SEP> <EOD> <MASK> <PAD> appended (2000..2004; <s> and </s> are
  // pieces 1 and 2), EOD = <EOD>; special tokens in the text are cut out, the parts encoded alone.
  EXPECT_EQ(megatron.vocab_size(), 2005);
  EXPECT_EQ(megatron.eod(), 2002);
  Ids expected = gpt.encode("a");
  expected.push_back(2002);
  for (auto id : gpt.encode("b")) expected.push_back(id);
  expected.push_back(2);  // "</s>" is the eos piece, a special token of Megatron's wrapper
  EXPECT_EQ(megatron.encode("a<EOD>b</s>"), expected);
  EXPECT_EQ(megatron.encode("<EOD><CLS>"), (Ids{2002, 2000}));
  EXPECT_EQ(megatron.decode(Ids{2002}), " <EOD> ");
  EXPECT_NE(megatron.description().find("eod 2002"), std::string::npos) << megatron.description();
  // Invalid UTF-8 is replaced as Python decodes it.
  EXPECT_EQ(gpt.encode("a\xff" "b"), gpt.encode("a\xEF\xBF\xBD" "b"));
}

TEST(SentencePiece, RefusedFiles) {
  const std::string dir = (fs::temp_directory_path() / ("strata_sp_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  for (const char* type : {"SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"}) {
    expect_error([&] { make_tokenizer({.type = type, .tokenizer_model = dir + "/none.model"}); }, {dir + "/none.model", "cannot open", "tokenizer.model"});
    write_text(dir + "/bad.model", "this is not a protocol buffer");
    expect_error([&] { make_tokenizer({.type = type, .tokenizer_model = dir + "/bad.model"}); }, {dir + "/bad.model", "is not a SentencePiece model"});
    expect_error([&] { make_tokenizer({.type = type, .tokenizer_model = kTokenizers + "/gpt2_bpe/tokenizer.json"}); }, {"tokenizer.json", "is not a SentencePiece model"});
    expect_error<ConfigError>([&] { make_tokenizer({.type = type, .vocab_file = "v.json", .tokenizer_model = kTokenizers + "/sp_bpe.model"}); },
                              {"--vocab-file and --merge-file", type});
  }
  fs::remove_all(dir);
}
#endif
