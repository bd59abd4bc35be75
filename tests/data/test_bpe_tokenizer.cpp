// Tests of BpeTokenizer, GPT-2's byte-level BPE: the pre-tokenization pattern piece by piece, the
// byte symbols, encodings of a small hand-made vocabulary, both merge strategies against a plain
// GPT-2 merge loop, round trips of any bytes, the files' errors, and the preprocessing tool and
// bpe_encode with --tokenizer-type GPT2BPETokenizer. The check against Hugging Face tokenizers
// itself is tests/tokenizers/check_bpe.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <strata/data.hpp>

namespace fs = std::filesystem;
using namespace strata::data;
using strata::ConfigError;
using strata::FileError;

namespace {

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            (std::string("strata_bpe_") + info->test_suite_name() + "_" + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}
[[maybe_unused]] std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Expects `f` to throw `E` whose message contains every one of `parts`.
template <class E = FileError>
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception thrown";
  } catch (const E& e) {
    const std::string message = e.what();
    for (const auto& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
  }
}

// The byte-symbol spelling of `bytes`, as vocab.json writes tokens.
std::string spelled(std::string_view bytes) {
  std::string s;
  for (char c : bytes) strata::append_utf8(s, byte_symbol(static_cast<std::uint8_t>(c)));
  return s;
}
std::string json_quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

// A vocabulary: the byte symbols with id = byte value, then the merges' results in order, then
// "<|endoftext|>". `merges` are pairs of byte strings (not yet spelled).
struct TinyVocab {
  std::string vocab_json;
  std::string merges_txt;
  std::map<std::string, std::int32_t> ids;  // spelled token -> id
};
TinyVocab make_vocab(const std::vector<std::pair<std::string, std::string>>& merges) {
  TinyVocab v;
  for (int b = 0; b < 256; ++b) v.ids.emplace(spelled(std::string(1, static_cast<char>(b))), b);
  v.merges_txt = "#version: 0.2\n";
  std::int32_t next = 256;
  for (const auto& [left, right] : merges) {
    v.merges_txt += spelled(left) + " " + spelled(right) + "\n";
    if (v.ids.emplace(spelled(left + right), next).second) ++next;
  }
  v.ids.emplace("<|endoftext|>", next);
  std::vector<std::pair<std::int32_t, std::string>> by_id;
  for (const auto& [token, id] : v.ids) by_id.emplace_back(id, token);
  std::sort(by_id.begin(), by_id.end());
  v.vocab_json = "{";
  for (std::size_t i = 0; i < by_id.size(); ++i)
    v.vocab_json += (i ? ",\n " : "") + json_quoted(by_id[i].second) + ": " + std::to_string(by_id[i].first);
  v.vocab_json += "}\n";
  return v;
}

// The hand-made vocabulary of the known encodings: ids 256.. in the order of these merges.
const std::vector<std::pair<std::string, std::string>> kTinyMerges{
    {" ", "t"},     // 256 "Ġt"
    {"h", "e"},     // 257 "he"
    {" t", "he"},   // 258 "Ġthe"
    {"a", "a"},     // 259 "aa"
    {"aa", "aa"},   // 260 "aaaa"
    {"'", "s"},     // 261 "'s"
    {"1", "2"},     // 262 "12"
    {"12", "3"},    // 263 "123"
    {" ", " "},     // 264 "ĠĠ"
    {"i", "n"},     // 265 "in"
    {"in", "g"},    // 266 "ing"
    {"\n", "\n"},   // 267 "ĊĊ"
    {"c", "a"},     // 268 "ca"
    {"ca", "t"},    // 269 "cat"
    {" ", "cat"},   // 270 "Ġcat"
};                  // 271 "<|endoftext|>"

BpeTokenizer tiny_tokenizer(BpeOptions options = {}) {
  const TinyVocab v = make_vocab(kTinyMerges);
  return BpeTokenizer::from_text(v.vocab_json, v.merges_txt, options);
}

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  for (auto p : gpt2_pre_tokens(text)) out.emplace_back(p);
  return out;
}
using Pieces = std::vector<std::string>;

// GPT-2's own merge loop, on strings: merge every occurrence of the best-ranked pair, left to
// right, then look again.
std::vector<std::string> gpt2_merge_loop(const std::string& word_bytes, const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> word;
  for (char c : word_bytes) word.push_back(spelled(std::string(1, c)));
  while (word.size() > 1) {
    int best = -1;
    std::pair<std::string, std::string> best_pair;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = ranks.find({word[i], word[i + 1]});
      if (it != ranks.end() && (best < 0 || it->second < best)) {
        best = it->second;
        best_pair = it->first;
      }
    }
    if (best < 0) break;
    std::vector<std::string> merged;
    for (std::size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == best_pair.first && word[i + 1] == best_pair.second) {
        merged.push_back(word[i] + word[i + 1]);
        i += 2;
      } else {
        merged.push_back(word[i++]);
      }
    }
    word = std::move(merged);
  }
  return word;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Characters and the pre-tokenization pattern

TEST(Unicode, ClassesOfKnownCharacters) {
  EXPECT_EQ(char_class(U'a'), CharClass::letter);
  EXPECT_EQ(char_class(U'Z'), CharClass::letter);
  EXPECT_EQ(char_class(U'7'), CharClass::number);
  EXPECT_EQ(char_class(U' '), CharClass::whitespace);
  EXPECT_EQ(char_class(U'\t'), CharClass::whitespace);
  EXPECT_EQ(char_class(U'\'' ), CharClass::other);
  EXPECT_EQ(char_class(0x1C), CharClass::other);       // a separator control: not White_Space
  EXPECT_EQ(char_class(0x85), CharClass::whitespace);  // NEL
  EXPECT_EQ(char_class(0xA0), CharClass::whitespace);  // no-break space
  EXPECT_EQ(char_class(0x3000), CharClass::whitespace);
  EXPECT_EQ(char_class(0x2028), CharClass::whitespace);
  EXPECT_EQ(char_class(0x200B), CharClass::other);     // zero-width space is a format character
  EXPECT_EQ(char_class(0x200D), CharClass::other);     // zero-width joiner
  EXPECT_EQ(char_class(0x00E9), CharClass::letter);    // é
  EXPECT_EQ(char_class(0x0301), CharClass::other);     // combining acute accent (Mn)
  EXPECT_EQ(char_class(0x01C5), CharClass::letter);    // ǅ (Lt)
  EXPECT_EQ(char_class(0x02B0), CharClass::letter);    // ʰ (Lm)
  EXPECT_EQ(char_class(0x65E5), CharClass::letter);    // 日 (Lo)
  EXPECT_EQ(char_class(0x05D0), CharClass::letter);    // א
  EXPECT_EQ(char_class(0x0663), CharClass::number);    // ٣ (Nd)
  EXPECT_EQ(char_class(0x216B), CharClass::number);    // Ⅻ (Nl)
  EXPECT_EQ(char_class(0x00BD), CharClass::number);    // ½ (No)
  EXPECT_EQ(char_class(0x1F600), CharClass::other);    // 😀
  EXPECT_EQ(char_class(0x10FFFF), CharClass::other);
  EXPECT_EQ(char_class(0x20000), CharClass::letter);   // CJK extension B
}

TEST(Unicode, StrictUtf8Decoding) {
  EXPECT_EQ(utf8_char_at("\xc3\xa9", 0).code_point, 0xE9u);
  EXPECT_EQ(utf8_char_at("\xf0\x9f\x98\x80", 0).code_point, 0x1F600u);
  EXPECT_EQ(utf8_char_at("\xf0\x9f\x98\x80", 0).length, 4u);
  for (const char* bad : {"\x80", "\xc0\xaf", "\xc1\xbf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf0\x80\x80\xaf", "\xf4\x90\x80\x80",
                          "\xf5\x80\x80\x80", "\xff", "\xc3", "\xe2\x82", "\xf0\x9f\x98"}) {
    const Utf8Char c = utf8_char_at(bad, 0);
    EXPECT_FALSE(c.valid) << testing::PrintToString(std::string(bad));
    EXPECT_EQ(c.length, 1u);
  }
}

TEST(Gpt2PreTokenize, EnglishAndContractions) {
  EXPECT_EQ(pieces("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces("I'm don't we'll they've you're she'd it's"),
            (Pieces{"I", "'m", " don", "'t", " we", "'ll", " they", "'ve", " you", "'re", " she", "'d", " it", "'s"}));
  // Upper case is not a contraction: the apostrophe is punctuation.
  EXPECT_EQ(pieces("IT'S WE'LL I'D"), (Pieces{"IT", "'", "S", " WE", "'", "LL", " I", "'", "D"}));
  // A contraction matches wherever an apostrophe starts a piece, even inside a word.
  EXPECT_EQ(pieces("'sup 'llama' x'll"), (Pieces{"'s", "up", " '", "llama", "'", " x", "'ll"}));  // " '" is one piece
  EXPECT_EQ(pieces("rock'n'roll"), (Pieces{"rock", "'", "n", "'", "roll"}));
  EXPECT_EQ(pieces("?!'s"), (Pieces{"?!'", "s"}));  // a punctuation run takes the apostrophe
  EXPECT_EQ(pieces("''s"), (Pieces{"''", "s"}));
  EXPECT_EQ(pieces("'"), (Pieces{"'"}));
  EXPECT_EQ(pieces("'r"), (Pieces{"'", "r"}));
}

TEST(Gpt2PreTokenize, NumbersAndPunctuation) {
  EXPECT_EQ(pieces("abc123 456,789.0 x2"), (Pieces{"abc", "123", " 456", ",", "789", ".", "0", " x", "2"}));
  EXPECT_EQ(pieces("Hello!!! ...?! (a)"), (Pieces{"Hello", "!!!", " ...?!", " (", "a", ")"}));
  EXPECT_EQ(pieces("$1,000,000.00"), (Pieces{"$", "1", ",", "000", ",", "000", ".", "00"}));
  EXPECT_EQ(pieces("12345678901234567890"), (Pieces{"12345678901234567890"}));
  EXPECT_EQ(pieces("\xd9\xa3\xd9\xa4 \xc2\xbd \xe2\x85\xab"), (Pieces{"\xd9\xa3\xd9\xa4", " \xc2\xbd", " \xe2\x85\xab"}));  // ٣٤ ½ Ⅻ
  EXPECT_EQ(pieces("x\xc2\xb2"), (Pieces{"x", "\xc2\xb2"}));                                                               // x²
}

TEST(Gpt2PreTokenize, SpacesTabsAndNewlines) {
  EXPECT_EQ(pieces("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(pieces("a   "), (Pieces{"a", "   "}));
  EXPECT_EQ(pieces("   "), (Pieces{"   "}));
  EXPECT_EQ(pieces(" "), (Pieces{" "}));
  EXPECT_EQ(pieces(" a"), (Pieces{" a"}));
  EXPECT_EQ(pieces("a \t b"), (Pieces{"a", " \t", " b"}));
  EXPECT_EQ(pieces("a\tb"), (Pieces{"a", "\t", "b"}));
  EXPECT_EQ(pieces("a\r\nb"), (Pieces{"a", "\r", "\n", "b"}));
  EXPECT_EQ(pieces("line1\nline2\n\n  x"), (Pieces{"line", "1", "\n", "line", "2", "\n\n ", " x"}));
  EXPECT_EQ(pieces("end\n"), (Pieces{"end", "\n"}));
  EXPECT_EQ(pieces("a \n b"), (Pieces{"a", " \n", " b"}));
  // Only U+0020 joins the next word: a no-break space or an ideographic space stays apart.
  EXPECT_EQ(pieces("a\xc2\xa0" "b"), (Pieces{"a", "\xc2\xa0", "b"}));
  EXPECT_EQ(pieces("a \xc2\xa0" "b"), (Pieces{"a", " ", "\xc2\xa0", "b"}));
  EXPECT_EQ(pieces("a\xe3\x80\x80\xe3\x80\x80" "b"), (Pieces{"a", "\xe3\x80\x80", "\xe3\x80\x80", "b"}));
  // U+001C..U+001F are not White_Space.
  EXPECT_EQ(pieces("a\x1c" "b"), (Pieces{"a", "\x1c", "b"}));
  // Long runs: all but the last space, then the word.
  const std::string spaces(1000, ' ');
  EXPECT_EQ(pieces(spaces + "x"), (Pieces{std::string(999, ' '), " x"}));
  EXPECT_EQ(pieces(spaces), (Pieces{spaces}));
  EXPECT_EQ(pieces("x" + std::string(500, '\n') + "y"), (Pieces{"x", std::string(499, '\n'), "\n", "y"}));
}

TEST(Gpt2PreTokenize, EmojiCjkMarksAndScripts) {
  // 👋🏽 (a skin-tone modifier is a symbol, so the pair is one "other" run)
  EXPECT_EQ(pieces("hi \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd there"), (Pieces{"hi", " \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd", " there"}));
  // 👨‍👩‍👧: emoji joined by ZWJ (U+200D, a format character): one piece.
  const std::string family = "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7";
  EXPECT_EQ(pieces("a" + family + "!"), (Pieces{"a", family + "!"}));
  // 日本語のテキスト: all letters; 你好，世界: a full-width comma between.
  EXPECT_EQ(pieces("\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88"),
            (Pieces{"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88"}));
  EXPECT_EQ(pieces("\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c"),
            (Pieces{"\xe4\xbd\xa0\xe5\xa5\xbd", "\xef\xbc\x8c", "\xe4\xb8\x96\xe7\x95\x8c"}));
  // A combining accent is not a letter: "cafe" + U+0301 splits, a precomposed é does not.
  EXPECT_EQ(pieces("cafe\xcc\x81 caf\xc3\xa9 na\xc3\xafve"), (Pieces{"cafe", "\xcc\x81", " caf\xc3\xa9", " na\xc3\xafve"}));
  // Hebrew and Arabic (right to left) with a right-to-left mark (U+200F, format).
  EXPECT_EQ(pieces("\xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d \xe2\x80\x8f\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7"),
            (Pieces{"\xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d", " \xe2\x80\x8f", "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7"}));
  // Devanagari: vowel signs are marks (Mc/Mn), so a word splits around them.
  EXPECT_EQ(pieces("\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80"),
            (Pieces{"\xe0\xa4\xb9", "\xe0\xa4\xbf", "\xe0\xa4\xa8", "\xe0\xa5\x8d", "\xe0\xa4\xa6", "\xe0\xa5\x80"}));
}

TEST(Gpt2PreTokenize, InvalidBytesAreOtherCharacters) {
  EXPECT_EQ(pieces("ab\xff\xfe" "cd"), (Pieces{"ab", "\xff\xfe", "cd"}));
  EXPECT_EQ(pieces(" \x80x"), (Pieces{" \x80", "x"}));
  EXPECT_EQ(pieces("!\xc3(?"), (Pieces{"!\xc3(?"}));
  EXPECT_EQ(pieces("\xed\xa0\x80"), (Pieces{"\xed\xa0\x80"}));  // an encoded surrogate: three invalid bytes
}

TEST(Gpt2PreTokenize, PiecesConcatenateToAnyInput) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255), length(0, 60);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int n = length(rng);
    for (int i = 0; i < n; ++i) text.push_back(static_cast<char>(byte(rng) % 4 == 0 ? " \n'a1!"[byte(rng) % 6] : byte(rng)));
    std::string joined;
    for (auto p : gpt2_pre_tokens(text)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, text);
  }
}

// ---------------------------------------------------------------------------------------------
// Byte symbols and the tokenizer

TEST(ByteSymbols, Gpt2Mapping) {
  EXPECT_EQ(byte_symbol('a'), U'a');
  EXPECT_EQ(byte_symbol('!'), U'!');
  EXPECT_EQ(byte_symbol(0x00), 0x100u);
  EXPECT_EQ(byte_symbol('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(byte_symbol(' '), 0x120u);   // Ġ
  EXPECT_EQ(byte_symbol(0x7F), 0x121u);
  EXPECT_EQ(byte_symbol(0xA0), 0x142u);
  EXPECT_EQ(byte_symbol(0xAD), 0x143u);
  EXPECT_EQ(byte_symbol(0xE9), 0xE9u);
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t s = byte_symbol(static_cast<std::uint8_t>(b));
    EXPECT_EQ(symbol_byte(s), b);
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(symbol_byte(U'Ą'), 4);  // U+0104 spells byte 4
  EXPECT_EQ(symbol_byte(0x144), -1);
  EXPECT_EQ(symbol_byte(0x3042), -1);
}

TEST(BpeTokenizer, KnownEncodings) {
  BpeTokenizer tokenizer = tiny_tokenizer();
  EXPECT_EQ(tokenizer.vocab_size(), 272);
  EXPECT_EQ(tokenizer.eod(), 271);
  EXPECT_EQ(tokenizer.merge_count(), 15);
  EXPECT_EQ(tokenizer.encode("the cat's"), (std::vector<std::int32_t>{'t', 257, 270, 261}));
  EXPECT_EQ(tokenizer.encode(" the"), (std::vector<std::int32_t>{258}));
  EXPECT_EQ(tokenizer.encode("aaaaa"), (std::vector<std::int32_t>{260, 'a'}));  // the leftmost pair first
  EXPECT_EQ(tokenizer.encode("aaa"), (std::vector<std::int32_t>{259, 'a'}));
  EXPECT_EQ(tokenizer.encode("1234"), (std::vector<std::int32_t>{263, '4'}));
  EXPECT_EQ(tokenizer.encode("singing"), (std::vector<std::int32_t>{'s', 266, 266}));
  EXPECT_EQ(tokenizer.encode("a    b"), (std::vector<std::int32_t>{'a', 264, ' ', ' ', 'b'}));
  EXPECT_EQ(tokenizer.encode("\n\n\nthe"), (std::vector<std::int32_t>{267, '\n', 't', 257}));
  EXPECT_EQ(tokenizer.encode(""), (std::vector<std::int32_t>{}));
  EXPECT_EQ(tokenizer.encode("\xc3\xa9"), (std::vector<std::int32_t>{0xC3, 0xA9}));  // é: two byte tokens
  // "<|endoftext|>" in a text is text, not the EOD token.
  const auto as_text = tokenizer.encode("<|endoftext|>");
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), tokenizer.eod()), 0);
  EXPECT_EQ(tokenizer.decode(std::vector<std::int32_t>{tokenizer.eod()}), "<|endoftext|>");
  EXPECT_EQ(tokenizer.decode(tokenizer.encode("the cat's")), "the cat's");
  EXPECT_EQ(tokenizer.token_to_id("\xc4\xa0the"), 258);  // "Ġthe"
  EXPECT_EQ(tokenizer.id_to_token(270), "\xc4\xa0" "cat");
  EXPECT_FALSE(tokenizer.token_to_id("dog").has_value());
  std::vector<std::int32_t> appended{7};
  tokenizer.encode_into(" the", appended);
  EXPECT_EQ(appended, (std::vector<std::int32_t>{7, 258}));
  expect_error<ConfigError>([&] { tokenizer.decode(std::vector<std::int32_t>{1, 272}); }, {"272", "position 1", "vocab.json"});
  expect_error<ConfigError>([&] { tokenizer.decode(std::vector<std::int32_t>{-1}); }, {"-1", "position 0"});
}

TEST(BpeTokenizer, RoundTripsAnyBytes) {
  BpeTokenizer tokenizer = tiny_tokenizer();
  std::mt19937 rng(11);
  const std::vector<std::string> pool{"a", "aa", "the", " ", "  ", "\n", "\r\n", "\t", "'s", "'LL", "12", "3", "!", "?!", "\xc3\xa9",
                                      "\xcc\x81", "\xe6\x97\xa5", "\xf0\x9f\x98\x80", "\xe2\x80\x8d", "\xc2\xa0", "\xd7\xa9",
                                      "\xff", "\x80", "\xc3", "\xed\xa0\x80", "\x00", "<|endoftext|>"};
  std::uniform_int_distribution<std::size_t> pick(0, pool.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255), length(0, 40);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const int n = length(rng);
    for (int i = 0; i < n; ++i) text += trial % 2 ? pool[pick(rng)] : std::string(1, static_cast<char>(byte(rng)));
    const auto ids = tokenizer.encode(text);
    ASSERT_EQ(tokenizer.decode(ids), text) << testing::PrintToString(text);
    for (auto id : ids) ASSERT_NE(id, tokenizer.eod());
  }
}

// Random merges over a small alphabet, each making a new token from two earlier ones (as trained
// files do): the scanning and heap strategies, with and without the cache, give GPT-2's loop.
TEST(BpeTokenizer, MergeStrategiesEqualGpt2Loop) {
  std::mt19937 rng(3);
  const std::string alphabet = "ab c\n";
  std::vector<std::string> tokens;
  for (char c : alphabet) tokens.emplace_back(1, c);
  std::set<std::string> known(tokens.begin(), tokens.end());
  std::vector<std::pair<std::string, std::string>> merges;
  std::map<std::pair<std::string, std::string>, int> ranks;
  while (merges.size() < 120) {
    std::uniform_int_distribution<std::size_t> pick(0, tokens.size() - 1);
    const std::string left = tokens[pick(rng)], right = tokens[pick(rng)];
    if (known.count(left + right) || left.size() + right.size() > 12) continue;
    ranks.emplace(std::make_pair(spelled(left), spelled(right)), static_cast<int>(merges.size()));
    merges.emplace_back(left, right);
    tokens.push_back(left + right);
    known.insert(left + right);
  }
  const TinyVocab v = make_vocab(merges);
  BpeTokenizer scanning = BpeTokenizer::from_text(v.vocab_json, v.merges_txt, {.cache_words = 0, .linear_merge_limit = 1 << 20});
  BpeTokenizer heap = BpeTokenizer::from_text(v.vocab_json, v.merges_txt, {.cache_words = 0, .linear_merge_limit = 0});
  BpeTokenizer cached = BpeTokenizer::from_text(v.vocab_json, v.merges_txt);
  std::uniform_int_distribution<int> letter(0, 3), length(1, 200);
  for (int trial = 0; trial < 1500; ++trial) {
    std::string word;
    const int n = trial < 1000 ? length(rng) % 24 + 1 : length(rng);
    for (int i = 0; i < n; ++i) word.push_back("abbc"[letter(rng)]);
    if (trial % 3 == 0) word = " " + word;
    std::vector<std::int32_t> expected;
    for (const auto& token : gpt2_merge_loop(word, ranks)) expected.push_back(v.ids.at(token));
    ASSERT_EQ(scanning.encode(word), expected) << word;
    ASSERT_EQ(heap.encode(word), expected) << word;
    ASSERT_EQ(cached.encode(word), expected) << word;
    ASSERT_EQ(cached.encode(word), expected) << word;  // from the cache
  }
  EXPECT_GT(cached.cached_words(), 0u);
  EXPECT_EQ(scanning.cached_words(), 0u);
  // A copy shares the vocabulary and keeps its own cache.
  BpeTokenizer copy = cached;
  EXPECT_EQ(copy.encode(" abcab"), cached.encode(" abcab"));
}

// Where one token is made by two merges, GPT-2's loop and tokenizers' order can part: here "abc"
// is made by "a bc" and by "ab c". In "abcabc", after "a b" twice, tokenizers merges the leftmost
// "ab c" and then at once the better-ranked "abc ab"; GPT-2's loop merges both "ab c" first.
// BpeTokenizer follows tokenizers.
TEST(BpeTokenizer, FollowsTokenizersWhereTheGpt2LoopDiffers) {
  const std::vector<std::pair<std::string, std::string>> merges{{"a", "b"}, {"b", "c"}, {"a", "bc"}, {"abc", "ab"}, {"ab", "c"}};
  const TinyVocab v = make_vocab(merges);
  std::map<std::pair<std::string, std::string>, int> ranks;
  for (std::size_t r = 0; r < merges.size(); ++r) ranks.emplace(std::make_pair(spelled(merges[r].first), spelled(merges[r].second)), static_cast<int>(r));
  EXPECT_EQ(gpt2_merge_loop("abcabc", ranks), (std::vector<std::string>{"abc", "abc"}));
  for (std::size_t limit : {std::size_t{0}, std::size_t{1} << 20}) {
    BpeTokenizer tokenizer = BpeTokenizer::from_text(v.vocab_json, v.merges_txt, {.linear_merge_limit = limit});
    EXPECT_EQ(tokenizer.encode("abcabc"), (std::vector<std::int32_t>{v.ids.at("abcab"), 'c'})) << limit;
  }
}

TEST(BpeTokenizer, LongWordsAndTheCacheLimit) {
  BpeTokenizer tokenizer = tiny_tokenizer({.cache_words = 4});
  const std::string spaces(10001, ' ');
  // 10000 spaces then " a": pairs of spaces merge left to right.
  const auto ids = tokenizer.encode(spaces + "a");
  ASSERT_EQ(ids.size(), 5002u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 264), 5000);
  EXPECT_EQ(tokenizer.decode(ids), spaces + "a");
  const std::string as(100001, 'a');
  const auto a_ids = tokenizer.encode(as);
  EXPECT_EQ(a_ids.size(), 25001u);
  EXPECT_EQ(a_ids.back(), 'a');
  for (const char* word : {"one", " two", " three", " four", " five", " six"}) tokenizer.encode(word);
  EXPECT_EQ(tokenizer.cached_words(), 4u);
}

TEST(BpeTokenizer, ByteSymbolsWithOtherIdsAndAddedTokens) {
  // GPT-2's own order: the printable bytes first. Ids need not equal byte values, and a token
  // whose characters are not byte symbols decodes to its own text.
  std::string vocab = "{";
  int id = 0;
  const auto add = [&](int b) {
    if (id > 0) vocab += ", ";
    vocab += json_quoted(spelled(std::string(1, static_cast<char>(b)))) + ": " + std::to_string(id);
    ++id;
  };
  for (int b = 0x21; b <= 0x7E; ++b) add(b);
  for (int b = 0; b < 256; ++b)
    if (b < 0x21 || b > 0x7E) add(b);
  vocab += ", \"<|endoftext|>\": " + std::to_string(id) + ", \"\\u00abpad\\u00bb \\u2603\": " + std::to_string(id + 2) + "}";
  BpeTokenizer tokenizer = BpeTokenizer::from_text(vocab, "");
  EXPECT_EQ(tokenizer.vocab_size(), 259);  // the largest id + 1 (id 257 is unused)
  EXPECT_EQ(tokenizer.encode("!"), (std::vector<std::int32_t>{0}));
  EXPECT_EQ(tokenizer.encode(" "), (std::vector<std::int32_t>{94 + 32}));
  EXPECT_EQ(tokenizer.decode(std::vector<std::int32_t>{258}), "\xc2\xab" "pad\xc2\xbb \xe2\x98\x83");
  expect_error<ConfigError>([&] { tokenizer.decode(std::vector<std::int32_t>{257}); }, {"257"});
}

// ---------------------------------------------------------------------------------------------
// Files and their errors

TEST(BpeTokenizer, LoadsFiles) {
  TempDir dir;
  const TinyVocab v = make_vocab(kTinyMerges);
  write_text(dir / "vocab.json", v.vocab_json);
  // CRLF line ends and no "#version" line are fine too.
  std::string merges = v.merges_txt.substr(v.merges_txt.find('\n') + 1);
  std::string crlf;
  for (char c : merges) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  write_text(dir / "merges.txt", crlf);
  BpeTokenizer tokenizer(dir / "vocab.json", dir / "merges.txt");
  EXPECT_EQ(tokenizer.encode("the cat's"), (std::vector<std::int32_t>{'t', 257, 270, 261}));
  EXPECT_EQ(tokenizer.vocab_file(), dir / "vocab.json");
}

TEST(BpeTokenizer, FileErrorsNameTheFileAndLine) {
  TempDir dir;
  const TinyVocab v = make_vocab(kTinyMerges);
  const std::string vocab = dir / "vocab.json", merges = dir / "merges.txt";
  write_text(vocab, v.vocab_json);
  write_text(merges, v.merges_txt);
  const auto load = [&] { BpeTokenizer(vocab, merges); };
  expect_error([&] { BpeTokenizer(dir / "none.json", merges); }, {"none.json", "cannot open", "vocab.json"});
  expect_error([&] { BpeTokenizer(vocab, dir / "none.txt"); }, {"none.txt", "cannot open", "merges.txt"});

  // vocab.json: line 1 is "{" + the first entry; entries follow one per line.
  const auto with_vocab = [&](const std::string& text, const std::vector<std::string>& parts) {
    write_text(vocab, text);
    expect_error(load, parts);
  };
  with_vocab("", {vocab, "empty"});
  with_vocab("[1, 2]", {vocab, "line 1, column 1", "'{'"});
  with_vocab("{\"a\": 1,\n \"b\" 2}", {vocab, "line 2, column 6", "':'"});
  with_vocab("{\"a\": 1,\n \"b\": 2", {vocab, "line 2", "ends inside an object"});
  with_vocab("{\"a\": 1,\n \"b\": 2.5}", {vocab, "line 2", "integer"});
  with_vocab("{\"a\": 1,\n \"b\": \"2\"}", {vocab, "line 2", "integer"});
  with_vocab("{\"a\": 1,\n \"b\": -3}", {vocab, "line 2", "-3", "outside"});
  with_vocab("{\"a\": 1}\n{}", {vocab, "line 2", "after the value"});
  with_vocab("{\"a\": 1,\n \"\\ud83d\": 2}", {vocab, "line 2", "surrogate"});
  with_vocab("{\"a\": 1,\n \"b\\q\": 2}", {vocab, "line 2", "escape"});
  with_vocab("{\"a\": 1,\n \"b\": 2,\n \"c\": 1}", {vocab, "line 3", "id 1", "\"c\"", "\"a\"", "line 1"});
  with_vocab("{\"a\": 1,\n \"b\": 2,\n \"a\": 3}", {vocab, "line 3", "\"a\"", "twice", "line 1"});
  with_vocab("{\"a\": 0}", {vocab, "byte 0", "256 byte symbols"});
  with_vocab("{\"a\": 0, \"b\": 2000000000}", {vocab, "ids up to 2000000000", "gaps"});
  std::string without_eod = v.vocab_json;
  without_eod.replace(without_eod.find("\"<|endoftext|>\""), 15, "\"<|end|>\"");
  with_vocab(without_eod, {vocab, "<|endoftext|>"});
  write_text(vocab, v.vocab_json);
  EXPECT_NO_THROW(load());

  // merges.txt: line numbers count the "#version" line.
  const auto with_merges = [&](const std::string& text, const std::vector<std::string>& parts) {
    write_text(merges, text);
    expect_error(load, parts);
  };
  with_merges("#version: 0.2\nh e\nhe\n", {merges, "line 3", "two tokens"});
  with_merges("h e\nh e x\n", {merges, "line 2", "two tokens"});
  with_merges("h e\nh  e\n", {merges, "line 2", "two tokens"});
  with_merges("h e\n\xe2\x98\x83 e\n", {merges, "line 2", "left part", "\xe2\x98\x83", vocab});
  with_merges("h e\nh \xc4\xa0\xc4\xa0\xc4\xa0\n", {merges, "line 2", "right part"});
  with_merges("h e\nx y\n", {merges, "line 2", "result", "\"xy\""});
  with_merges("#version: 0.2\nh e\ni n\nh e\n", {merges, "line 4", "already given", "at line 2"});
  write_text(merges, "");
  EXPECT_NO_THROW(load());  // no merges: every byte is its own token
}

// ---------------------------------------------------------------------------------------------
// The programs: preprocess_data --tokenizer-type GPT2BPETokenizer, and bpe_encode

#ifdef STRATA_PREPROCESS_DATA
namespace {
int run_preprocess(const std::string& args, const std::string& log = "/dev/null") {
  const std::string command = std::string("\"") + STRATA_PREPROCESS_DATA + "\" " + args + " > " + log + " 2>&1";
  return std::system(command.c_str());
}
}  // namespace

TEST(PreprocessData, Gpt2BpeTokenizer) {
  TempDir dir;
  const TinyVocab v = make_vocab(kTinyMerges);
  write_text(dir / "vocab.json", v.vocab_json);
  write_text(dir / "merges.txt", v.merges_txt);
  const std::vector<std::string> paragraphs{"the cat's singing,\nthe cat's", "aaaaa 1234 \xf0\x9f\x98\x80 caf\xc3\xa9"};
  write_text(dir / "in.txt", paragraphs[0] + "\n\n" + paragraphs[1] + "\n");
  const std::string files = " --vocab-file " + (dir / "vocab.json") + " --merge-file " + (dir / "merges.txt");
  ASSERT_EQ(run_preprocess("--input " + (dir / "in.txt") + " --output-prefix " + (dir / "out") + " --append-eod --tokenizer-type GPT2BPETokenizer" + files), 0);
  BpeTokenizer tokenizer(dir / "vocab.json", dir / "merges.txt");
  IndexedDataset ds(dir / "out_text_document");
  EXPECT_EQ(ds.dtype(), strata::data::DType::uint16);
  ASSERT_EQ(ds.document_count(), 2);
  for (std::size_t i = 0; i < paragraphs.size(); ++i) {
    auto expected = tokenizer.encode(paragraphs[i]);
    expected.push_back(tokenizer.eod());
    EXPECT_EQ(ds.get(static_cast<std::int64_t>(i)), expected) << i;
  }
  // Files without the BPE tokenizer, or the BPE tokenizer without files, are refused.
  const std::string log = dir / "log.txt";
  EXPECT_NE(run_preprocess("--input " + (dir / "in.txt") + " --output-prefix " + (dir / "x") + " --tokenizer-type GPT2BPETokenizer", log), 0);
  EXPECT_NE(read_text(log).find("--vocab-file"), std::string::npos) << read_text(log);
  EXPECT_NE(run_preprocess("--input " + (dir / "in.txt") + " --output-prefix " + (dir / "x") + files, log), 0);
  EXPECT_NE(read_text(log).find("GPT2BPETokenizer"), std::string::npos) << read_text(log);
  write_text(dir / "bad.txt", "h e\nq q\n");
  EXPECT_NE(run_preprocess("--input " + (dir / "in.txt") + " --output-prefix " + (dir / "x") + " --tokenizer-type GPT2BPETokenizer --vocab-file " +
                               (dir / "vocab.json") + " --merge-file " + (dir / "bad.txt"),
                           log),
            0);
  EXPECT_NE(read_text(log).find("line 2"), std::string::npos) << read_text(log);
  EXPECT_FALSE(fs::exists(dir / "x_text_document.bin"));
}
#endif

#ifdef STRATA_BPE_ENCODE
TEST(BpeEncode, ReadsJsonStringsAndWritesIds) {
  TempDir dir;
  const TinyVocab v = make_vocab(kTinyMerges);
  write_text(dir / "vocab.json", v.vocab_json);
  write_text(dir / "merges.txt", v.merges_txt);
  write_text(dir / "texts.jsonl", "\"the cat's\"\n\"caf\\u00e9 \\ud83d\\ude00\\n\\ttab\"\n\"\"\n\"aaaaa\"\n");
  const std::string command = std::string("\"") + STRATA_BPE_ENCODE + "\" " + (dir / "vocab.json") + " " + (dir / "merges.txt") + " " +
                              (dir / "texts.jsonl") + " " + (dir / "ids.txt") + " > " + (dir / "summary.json");
  ASSERT_EQ(std::system(command.c_str()), 0);
  BpeTokenizer tokenizer(dir / "vocab.json", dir / "merges.txt");
  std::string expected;
  for (const std::string text : {"the cat's", "caf\xc3\xa9 \xf0\x9f\x98\x80\n\ttab", "", "aaaaa"}) {
    const auto ids = tokenizer.encode(text);
    for (std::size_t k = 0; k < ids.size(); ++k) {
      if (k > 0) expected += ' ';
      expected += std::to_string(ids[k]);
    }
    expected += '\n';
  }
  EXPECT_EQ(read_text(dir / "ids.txt"), expected);
  const std::string summary = read_text(dir / "summary.json");
  EXPECT_NE(summary.find("\"texts\": 4"), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"eod\": 271"), std::string::npos) << summary;
  // A bad line is an error naming the file and line.
  write_text(dir / "bad.jsonl", "\"ok\"\n\"two\" \"strings\"\n");
  const std::string bad = std::string("\"") + STRATA_BPE_ENCODE + "\" " + (dir / "vocab.json") + " " + (dir / "merges.txt") + " " +
                          (dir / "bad.jsonl") + " " + (dir / "ids.txt") + " > " + (dir / "log.txt") + " 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  EXPECT_NE(read_text(dir / "log.txt").find("line 2"), std::string::npos) << read_text(dir / "log.txt");
}
#endif
