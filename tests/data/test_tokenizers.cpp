// Tests of make_tokenizer's types that need no library: NullTokenizer (Megatron's semantics),
// HuggingFaceTokenizer (the shipped GPT-2 and Llama 3 style tokenizer.json, the Llama 3 pattern
// piece by piece, added tokens, the end-of-document rule, every refused file by its message), the
// flags each --tokenizer-type takes, and the UTF-8 replacement. This program is built without
// SentencePiece, so it also checks that the SentencePiece types are refused with a message.
// Ids against the Python packages: test_tokenizer_files.cpp (fixtures) and
// tests/tokenizers/check_tokenizers.py.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <strata/data/text_tokenizer.hpp>

namespace fs = std::filesystem;
using namespace strata::data;
using strata::ConfigError;
using strata::FileError;
using Ids = std::vector<std::int32_t>;

namespace {

const std::string kTokenizers = STRATA_TOKENIZERS_DIR;

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            (std::string("strata_tok_") + info->test_suite_name() + "_" + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}
std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Expects `f` to throw `E` whose message contains every one of `parts`.
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

TokenizerOptions hf(const std::string& model) { return {.type = "HuggingFaceTokenizer", .tokenizer_model = model}; }

std::vector<std::string> llama3_pieces(std::string_view text) {
  std::vector<std::string> out;
  for (auto p : llama3_pre_tokens(text)) out.emplace_back(p);
  return out;
}
using Pieces = std::vector<std::string>;

// Replaces the first `from` in `text` by `to` (the test's way to make a bad tokenizer.json).
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// NullTokenizer

TEST(NullTokenizer, MegatronSemantics) {
  Tokenizer t = make_tokenizer({.type = "NullTokenizer", .vocab_size = 1000});
  EXPECT_EQ(t.name(), "NullTokenizer");
  EXPECT_EQ(t.vocab_size(), 1000);  // Megatron's NullTokenizer: vocab_size N
  EXPECT_EQ(t.eod(), 999);          // and eod_id N - 1
  EXPECT_EQ(t.encode("17 4 999 0"), (Ids{17, 4, 999, 0}));
  EXPECT_EQ(t.encode("5"), (Ids{5}));
  EXPECT_EQ(t.encode("999"), (Ids{999}));             // the EOD itself
  EXPECT_EQ(t.encode("12\n"), (Ids{12}));             // int("12\n") == 12
  EXPECT_EQ(t.encode("\t7 8\r\n"), (Ids{7, 8}));
  EXPECT_EQ(t.encode("007 +3 -0 1_0"), (Ids{7, 3, 0, 10}));  // as Python's int()
  EXPECT_EQ(t.decode(Ids{3, 1, 999}), "3 1 999");
  Ids appended{9};
  t.encode_into("1 2", appended);
  EXPECT_EQ(appended, (Ids{9, 1, 2}));
  EXPECT_NE(t.description().find("eod 999"), std::string::npos) << t.description();
}

TEST(NullTokenizer, RefusesWhatIsNotAnId) {
  NullTokenizer t(100);
  expect_error<ConfigError>([&] { t.encode(""); }, {"piece 1", "is empty"});
  expect_error<ConfigError>([&] { t.encode("1  2"); }, {"piece 2", "is empty", "single spaces"});  // split(' ') gives ''
  expect_error<ConfigError>([&] { t.encode("1 2 "); }, {"piece 3", "is empty"});
  expect_error<ConfigError>([&] { t.encode("1\n2"); }, {"piece 1", "\"1\n2\"", "not an integer"});
  expect_error<ConfigError>([&] { t.encode("1 two"); }, {"piece 2", "\"two\"", "not an integer"});
  expect_error<ConfigError>([&] { t.encode("1 2.5"); }, {"\"2.5\"", "not an integer"});
  expect_error<ConfigError>([&] { t.encode("1 _2"); }, {"not an integer"});
  expect_error<ConfigError>([&] { t.encode("1 2_"); }, {"not an integer"});
  expect_error<ConfigError>([&] { t.encode("1 2__3"); }, {"not an integer"});
  expect_error<ConfigError>([&] { t.encode("-1"); }, {"\"-1\"", "negative"});
  expect_error<ConfigError>([&] { t.encode("3 100"); }, {"piece 2", "\"100\"", "larger than the vocabulary", "0..99"});
  expect_error<ConfigError>([&] { t.encode("99999999999999999999999"); }, {"larger than the vocabulary"});
  expect_error<ConfigError>([&] { NullTokenizer bad(0); }, {"--vocab-size", "0"});
}

// ---------------------------------------------------------------------------------------------
// Flags

TEST(MakeTokenizer, FlagsOfEachType) {
  expect_error<ConfigError>([] { make_tokenizer({.type = "Nonsense"}); }, {"Nonsense", "not known", "HuggingFaceTokenizer", "NullTokenizer"});
  expect_error<ConfigError>([] { make_tokenizer({.type = "TikTokenizer"}); }, {"TikTokenizer", "Megatron's but not supported"});
  expect_error<ConfigError>([] { make_tokenizer({.type = "BertWordPieceCase"}); }, {"BertWordPieceCase", "not supported"});
  expect_error<ConfigError>([] { make_tokenizer({.type = "NullTokenizer"}); }, {"NullTokenizer", "--vocab-size"});
  expect_error<ConfigError>([] { make_tokenizer({.type = "NullTokenizer", .vocab_size = -5}); }, {"--vocab-size N > 0"});
  expect_error<ConfigError>([] { make_tokenizer({.type = "NullTokenizer", .tokenizer_model = "x", .vocab_size = 5}); },
                            {"--tokenizer-model is not a file of --tokenizer-type NullTokenizer"});
  expect_error<ConfigError>([] { make_tokenizer({.type = "HuggingFaceTokenizer"}); }, {"HuggingFaceTokenizer", "needs --tokenizer-model"});
  expect_error<ConfigError>([] { make_tokenizer({.type = "HuggingFaceTokenizer", .vocab_file = "v.json", .tokenizer_model = "x"}); },
                            {"--vocab-file and --merge-file", "HuggingFaceTokenizer takes none", "--tokenizer-model"});
  expect_error<ConfigError>([] { make_tokenizer({.type = "HuggingFaceTokenizer", .tokenizer_model = "x", .vocab_size = 10}); },
                            {"--vocab-size is the vocabulary of --tokenizer-type NullTokenizer", "its files"});
  expect_error<ConfigError>([] { make_tokenizer({.type = "ByteTokenizer", .vocab_size = 10}); }, {"--vocab-size", "257"});
  expect_error<ConfigError>([] { make_tokenizer({.type = "ByteTokenizer", .tokenizer_model = "t.model"}); }, {"--tokenizer-model"});
  expect_error<ConfigError>([] { make_tokenizer({.type = "GPT2BPETokenizer", .vocab_file = "v.json"}); }, {"--merge-file"});
  for (const char* type : {"SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"})
    expect_error<ConfigError>([&] { make_tokenizer({.type = type}); }, {type, "needs --tokenizer-model", "SentencePiece tokenizer.model"});
  EXPECT_EQ(make_tokenizer({}).name(), "ByteTokenizer");
}

TEST(MakeTokenizer, SentencePieceTypesNeedTheLibrary) {
  ASSERT_FALSE(kHasSentencePiece) << "this test program is built without strata::sentencepiece";
  for (const char* type : {"SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"})
    expect_error<ConfigError>([&] { make_tokenizer({.type = type, .tokenizer_model = kTokenizers + "/sp_bpe.model"}); },
                              {type, "needs the SentencePiece library", "built without it", "libsentencepiece-dev", "strata::sentencepiece"});
}

// ---------------------------------------------------------------------------------------------
// Llama 3's pattern

TEST(Llama3PreTokenize, Alternatives) {
  EXPECT_EQ(llama3_pieces("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(llama3_pieces("I'M you'RE it's x'Ll"), (Pieces{"I", "'M", " you", "'RE", " it", "'s", " x", "'Ll"}));
  EXPECT_EQ(llama3_pieces("'\xC5\xBFx"), (Pieces{"'\xC5\xBF", "x"}));  // U+017F folds to 's'
  EXPECT_EQ(llama3_pieces("1234567 12"), (Pieces{"123", "456", "7", " ", "12"}));
  EXPECT_EQ(llama3_pieces("(hello) \tword _x"), (Pieces{"(hello", ")", " ", "\tword", " _", "x"}));
  EXPECT_EQ(llama3_pieces("hello!!\n\nworld"), (Pieces{"hello", "!!\n\n", "world"}));
  EXPECT_EQ(llama3_pieces("a  \n  \n  b"), (Pieces{"a", "  \n  \n", " ", " b"}));
  EXPECT_EQ(llama3_pieces("x\r\n\r\ny"), (Pieces{"x", "\r\n\r\n", "y"}));
  EXPECT_EQ(llama3_pieces("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(llama3_pieces("end   "), (Pieces{"end", "   "}));
  EXPECT_EQ(llama3_pieces(" 1"), (Pieces{" ", "1"}));
  EXPECT_EQ(llama3_pieces("\n\nfoo"), (Pieces{"\n\n", "foo"}));
  EXPECT_EQ(llama3_pieces("\nfoo"), (Pieces{"\n", "foo"}));  // a line break is not the one character before letters
  EXPECT_EQ(llama3_pieces("a\xc2\xa0" "b"), (Pieces{"a", "\xc2\xa0" "b"}));  // no-break space before letters
  EXPECT_EQ(llama3_pieces("caf\xc3\xa9\xcc\x81!"), (Pieces{"caf\xc3\xa9", "\xcc\x81!"}));
}

TEST(Utf8, ReplacedAsPythonDecodes) {
  EXPECT_TRUE(is_valid_utf8("caf\xc3\xa9 \xf0\x9f\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xc3"));
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(replace_invalid_utf8("ok"), "ok");
  EXPECT_EQ(replace_invalid_utf8("a\xff" "b"), "a" + fffd + "b");
  EXPECT_EQ(replace_invalid_utf8("\xe2\x82" "A"), fffd + "A");          // one maximal subpart
  EXPECT_EQ(replace_invalid_utf8("\xf0\x9f\x98"), fffd);                // cut short at the end
  EXPECT_EQ(replace_invalid_utf8("\xed\xa0\x80"), fffd + fffd + fffd);  // a surrogate: ED is a subpart alone
  EXPECT_EQ(replace_invalid_utf8("\xc0\xaf"), fffd + fffd);             // overlong: C0 starts nothing
  EXPECT_EQ(replace_invalid_utf8("\x80\x80"), fffd + fffd);
  EXPECT_EQ(replace_invalid_utf8("\xf4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // above U+10FFFF
}

// ---------------------------------------------------------------------------------------------
// HuggingFaceTokenizer on the shipped files (ids from tokenizers 0.23.3)

TEST(HuggingFaceTokenizer, Gpt2Style) {
  Tokenizer t = make_tokenizer(hf(kTokenizers + "/gpt2_bpe"));  // the directory, as Megatron's flag names it
  EXPECT_EQ(t.name(), "HuggingFaceTokenizer");
  EXPECT_EQ(t.vocab_size(), 2050);
  EXPECT_EQ(t.eod(), 2048);  // the special "<|endoftext|>" (no tokenizer_config.json)
  EXPECT_EQ(t.encode("Hello world<|endoftext|> the<sep>x"), (Ids{39, 1388, 78, 694, 321, 2048, 258, 2049, 87}));
  EXPECT_EQ(t.decode(t.encode("In the beginning<|endoftext|>")), "In the beginning<|endoftext|>");
  EXPECT_NE(t.description().find("GPT-2 pre-tokenizer"), std::string::npos) << t.description();
  Tokenizer file = make_tokenizer(hf(kTokenizers + "/gpt2_bpe/tokenizer.json"));  // or the file itself
  EXPECT_EQ(file.encode("Hello"), t.encode("Hello"));
}

TEST(HuggingFaceTokenizer, Llama3Style) {
  Tokenizer t = make_tokenizer(hf(kTokenizers + "/llama3_bpe"));
  EXPECT_EQ(t.vocab_size(), 2053);
  EXPECT_EQ(t.eod(), 2049);  // eos_token "<|end_of_text|>" of tokenizer_config.json
  // <|begin_of_text|> (2048) first: the TemplateProcessing post-processor.
  EXPECT_EQ(t.encode("Hello world<|end_of_text|> THE'S 12345"), (Ids{2048, 39, 1391, 78, 698, 322, 2049, 910, 39, 36, 6, 50, 220, 16, 17, 18, 19, 20}));
  EXPECT_EQ(t.encode(""), (Ids{2048}));
  EXPECT_NE(t.description().find("Llama 3 pre-tokenizer"), std::string::npos) << t.description();
  EXPECT_NE(t.description().find("tokenizer_config.json"), std::string::npos) << t.description();
  const Ids ids = t.encode("In the beginning God created");
  EXPECT_EQ(t.decode(std::span<const std::int32_t>(ids).subspan(1)), "In the beginning God created");
}

// Tokenizer files that are a device, a FIFO or a directory are refused naming the file, before
// anything can block on them or read without end (a call still blocked after 10 s is released).
TEST(TokenizerFiles, DeviceFifoOrDirectoryIsRefusedWithoutReadingIt) {
  TempDir dir;
  const std::string fifo = dir / "fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_directory(dir / "folder");
  write_text(dir / "merges.txt", "#version: 0.2\n");
  const TokenizerOptions gpt2{.type = "GPT2BPETokenizer", .vocab_file = "/dev/zero", .merge_file = dir / "merges.txt"};
  auto expect_refused = [&](TokenizerOptions options, const std::string& file, const std::string& what) {
    auto call = std::async(std::launch::async, [options] {
      try {
        make_tokenizer(options);
        return std::string("accepted");
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
    });
    if (call.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      ADD_FAILURE() << "blocked on " << file;
      const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (writer >= 0) ::close(writer);
    }
    const std::string message = call.get();
    for (const std::string& part : {file, what, std::string("not a regular file")})
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  };
  expect_refused(gpt2, "/dev/zero", "character device");
  TokenizerOptions options = gpt2;
  options.vocab_file = fifo;
  expect_refused(options, fifo, "FIFO");
  options.vocab_file = dir / "folder";
  expect_refused(options, dir / "folder", "directory");
  expect_refused(hf(fifo), fifo, "FIFO");
  write_text(dir / "tokenizer.json", read_text(kTokenizers + "/llama3_bpe/tokenizer.json"));
  fs::create_symlink("/dev/zero", dir / "tokenizer_config.json");
  expect_refused(hf(dir.path()), dir / "tokenizer_config.json", "character device");
}

// Text to show (the trainer's sample) is valid UTF-8: a character cut between byte-level pieces is
// whole when the sequence is decoded at once, and bytes that form no character become U+FFFD.
TEST(TokenizerFiles, DecodeTextIsValidUtf8) {
  const Tokenizer bytes = make_tokenizer({.type = "ByteTokenizer"});
  const std::string euro = "\xe2\x82\xac";  // U+20AC, three bytes, three ids
  const Ids ids{'a', 0xe2, 0x82, 0xac, 'b'};
  EXPECT_EQ(bytes.decode_text(ids), "a" + euro + "b");
  EXPECT_EQ(bytes.decode_text(Ids{'a', 0xe2, 0x82}), "a\xef\xbf\xbd");  // cut at the end
  EXPECT_EQ(bytes.decode_text(Ids{0xff, 'x', 0x80}), "\xef\xbf\xbdx\xef\xbf\xbd");
  EXPECT_EQ(bytes.decode(Ids{'a', 0xe2, 0x82}), "a\xe2\x82");  // decode keeps the bytes
}

TEST(HuggingFaceTokenizer, EndOfDocumentRule) {
  TempDir dir;
  const std::string json = read_text(kTokenizers + "/llama3_bpe/tokenizer.json");
  write_text(dir / "tokenizer.json", json);
  // Without tokenizer_config.json: the first special among the known end-of-text names.
  EXPECT_EQ(make_tokenizer(hf(dir.path())).eod(), 2049);
  // eos_token as transformers writes it, a string or an object with "content".
  write_text(dir / "tokenizer_config.json", R"({"eos_token": "<|eot_id|>"})");
  HuggingFaceTokenizer eot(dir.path());
  EXPECT_EQ(eot.eod(), 2052);
  EXPECT_NE(eot.eod_rule().find("<|eot_id|>"), std::string::npos);
  write_text(dir / "tokenizer_config.json", R"({"eos_token": {"content": "<|reserved_special_token_1|>", "special": true}})");
  EXPECT_EQ(make_tokenizer(hf(dir.path())).eod(), 2051);
  write_text(dir / "tokenizer_config.json", R"({"eos_token": "<|nothing|>"})");
  expect_error([&] { HuggingFaceTokenizer t(dir.path()); }, {dir / "tokenizer_config.json", "eos_token \"<|nothing|>\"", "is not a token"});
  // An eos_token that is not a token's text is refused, not passed over for the fallback.
  for (const char* bad : {R"({"eos_token": 5})", R"({"eos_token": true})", R"({"eos_token": {"special": true}})",
                          R"({"eos_token": {"content": 7}})"}) {
    write_text(dir / "tokenizer_config.json", bad);
    expect_error([&] { HuggingFaceTokenizer t(dir.path()); }, {dir / "tokenizer_config.json", "eos_token is", "not a token"});
  }
  write_text(dir / "tokenizer_config.json", R"({"eos_token": null})");
  EXPECT_EQ(make_tokenizer(hf(dir.path())).eod(), 2049);  // none named: the fallback
  write_text(dir / "tokenizer_config.json", R"({"eos_token": )");
  expect_error([&] { HuggingFaceTokenizer t(dir.path()); }, {dir / "tokenizer_config.json", "not valid JSON"});
  // No config and no known end-of-text token: refused, saying what to add.
  fs::remove(dir / "tokenizer_config.json");
  write_text(dir / "tokenizer.json", replaced(json, "\"<|end_of_text|>\"", "\"<|stop|>\""));
  expect_error([&] { HuggingFaceTokenizer t(dir.path()); }, {dir / "tokenizer.json", "no end-of-document token", "eos_token"});
}

TEST(HuggingFaceTokenizer, AddedTokensLongestLeftmostThenNormalized) {
  const std::string base = read_text(kTokenizers + "/gpt2_bpe/tokenizer.json");
  // Added: "<a>" and "<a><b>" (not normalized), "x<a" (normalized): the first pass takes "<a><b>"
  // where it can, and "x<a" never matches across a token cut out before.
  const std::string json = replaced(
      base, "\"added_tokens\": [",
      R"("added_tokens": [{"id": 2050, "content": "<a>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        {"id": 2051, "content": "<a><b>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false},
        {"id": 2052, "content": "x<a", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false},)");
  HuggingFaceTokenizer t = HuggingFaceTokenizer::from_text(json);
  EXPECT_EQ(t.vocab_size(), 2053);
  EXPECT_EQ(t.encode("<a><b>"), (Ids{2051}));
  EXPECT_EQ(t.encode("<a><a>"), (Ids{2050, 2050}));
  EXPECT_EQ(t.encode("x<a>"), (Ids{87, 2050}));  // pass 1 takes "<a>" before "x<a" is looked for
  EXPECT_EQ(t.encode("x<ab"), (Ids{2052, 65}));
  EXPECT_EQ(t.decode(Ids{2051, 2052}), "<a><b>x<a");
}

TEST(HuggingFaceTokenizer, InvalidUtf8IsReplacedFirst) {
  HuggingFaceTokenizer t(kTokenizers + "/gpt2_bpe");
  EXPECT_EQ(t.encode("a\xff" "b"), t.encode("a\xEF\xBF\xBD" "b"));
  EXPECT_EQ(t.encode("\xe2\x82" "A"), t.encode("\xEF\xBF\xBD" "A"));
}

// ---------------------------------------------------------------------------------------------
// Refused files: each names the file, the JSON path and what is supported

TEST(HuggingFaceTokenizer, RefusedFiles) {
  TempDir dir;
  const std::string gpt2 = read_text(kTokenizers + "/gpt2_bpe/tokenizer.json");
  const std::string llama3 = read_text(kTokenizers + "/llama3_bpe/tokenizer.json");
  const std::string file = dir / "tokenizer.json";
  const auto with = [&](const std::string& text, const std::vector<std::string>& parts) {
    write_text(file, text);
    std::vector<std::string> all{file};
    all.insert(all.end(), parts.begin(), parts.end());
    expect_error([&] { make_tokenizer(hf(file)); }, all);
  };
  expect_error([&] { make_tokenizer(hf(dir / "none.json")); }, {dir / "none.json", "cannot open", "tokenizer.json"});
  expect_error([&] { make_tokenizer(hf(dir.path())); }, {dir.path(), "directory without tokenizer.json"});
  with("{\"model\": ", {"not valid JSON", "line 1"});
  with("[1, 2]", {"expected a JSON object"});
  with(replaced(gpt2, "\"normalizer\": null", R"("normalizer": {"type": "NFC"})"), {"normalizer", "\"NFC\"", "not supported", "no normalizer"});
  with(replaced(gpt2, "\"type\": \"BPE\"", "\"type\": \"Unigram\""), {"model.type", "\"Unigram\"", "not supported", "type \"BPE\""});
  with(replaced(gpt2, "\"type\": \"BPE\"", "\"type\": \"WordPiece\""), {"model.type", "\"WordPiece\"", "WordPiece"});
  with(replaced(gpt2, "\"dropout\": null", "\"dropout\": 0.1"), {"model.dropout", "dropout", "null"});
  with(replaced(gpt2, "\"byte_fallback\": false", "\"byte_fallback\": true"), {"model.byte_fallback", "not supported"});
  with(replaced(gpt2, "\"continuing_subword_prefix\": null", "\"continuing_subword_prefix\": \"##\""),
       {"model.continuing_subword_prefix", "not supported"});
  with(replaced(gpt2, "\"end_of_word_suffix\": null", "\"end_of_word_suffix\": \"</w>\""), {"model.end_of_word_suffix"});
  with(replaced(gpt2, "\"truncation\": null", R"("truncation": {"max_length": 512})"), {"truncation", "not supported"});
  with(replaced(gpt2, "\"padding\": null", R"("padding": {"length": 512})"), {"padding", "not supported"});
  with(replaced(gpt2, "\"pre_tokenizer\": {\n    \"type\": \"ByteLevel\"", "\"pre_tokenizer\": {\n    \"type\": \"Metaspace\""),
       {"pre_tokenizer.type", "\"Metaspace\"", "not supported", "ByteLevel(use_regex=true"});
  with(replaced(gpt2, "\"add_prefix_space\": false", "\"add_prefix_space\": true"),
       {"pre_tokenizer.add_prefix_space", "not supported"});
  with(replaced(gpt2, "\"use_regex\": true", "\"use_regex\": false"),
       {"pre_tokenizer.use_regex", "not supported"});
  with(replaced(llama3, "\\\\p{N}{1,3}", "\\\\p{N}{1,4}"), {"pre_tokenizer.pretokenizers[0].pattern.Regex", "not one strata knows", "Llama 3"});
  with(replaced(llama3, "\"behavior\": \"Isolated\"", "\"behavior\": \"Removed\""), {"pre_tokenizer.pretokenizers[0].behavior", "Isolated"});
  with(replaced(llama3, "\"invert\": false", "\"invert\": true"), {"pre_tokenizer.pretokenizers[0].invert"});
  with(replaced(gpt2, "\"post_processor\": {\n    \"type\": \"ByteLevel\"", "\"post_processor\": {\n    \"type\": \"BertProcessing\""),
       {"post_processor.type", "\"BertProcessing\"", "TemplateProcessing"});
  with(replaced(gpt2, "\"decoder\": {\n    \"type\": \"ByteLevel\"", "\"decoder\": {\n    \"type\": \"WordPiece\""), {"decoder", "\"WordPiece\""});
  with(replaced(gpt2, "\"lstrip\": false", "\"lstrip\": true"), {"added_tokens[0].lstrip", "<|endoftext|>", "not supported"});
  with(replaced(gpt2, "\"single_word\": false", "\"single_word\": true"), {"added_tokens[0].single_word"});
  with(replaced(gpt2, "\"id\": 2048", "\"id\": 5"), {"added_tokens[0]", "id 5", "model.vocab gives to"});
  with(replaced(gpt2, "\"Ġ\": 220", "\"Ġzz\": 220"), {"has no token \"Ġ\"", "for byte 32", "256 byte symbols"});
  with(replaced(gpt2, "\"Ġ\": 220", "\"Ġ\": 2.5"), {"model.vocab", "line", "must be an integer"});
  const std::string first_merge = "[\n        \"t\",\n        \"h\"\n      ]";
  with(replaced(gpt2, first_merge, "[\"t\", \"q\u00e9\"]"), {"model.merges[0]", "right part", "is not a token"});
  with(replaced(gpt2, first_merge, "[\"t\"]"), {"model.merges[0]", "expected a merge"});
  with(replaced(gpt2, first_merge, "\"t h x\""), {"model.merges[0]", "two tokens and one space"});
  with(replaced(gpt2, "[\n        \"Ġ\",\n        \"th\"\n      ]", "[\"t\", \"h\"]"), {"model.merges[1]", "already given", "model.merges[0]"});
  with(replaced(gpt2, "\"vocab\": {", "\"vocab\": {\"t\": 3000, "), {"not valid JSON", "\"t\"", "twice"});
}
