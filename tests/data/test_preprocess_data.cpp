// Tests of preprocess_data against Megatron's tools/preprocess_data.py: what it writes for empty
// texts, sentences and several keys, that --workers and --partitions do not change the bytes, gzip
// input, errors naming file and line; the sentence splitter; the writer's merge (add_index); and
// the GPT dataset over a file holding empty documents.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <strata/data.hpp>

#include "sentence_splitter.hpp"

namespace fs = std::filesystem;
using namespace strata::data;

namespace {

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            (std::string("strata_pre_") + info->test_suite_name() + "_" + info->name() + "_" + std::to_string(::getpid()));
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

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}
void write_gzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// A JSON string literal of `text`.
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += std::string("\\") + c;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else out.push_back(c);
  }
  return out + "\"";
}

// Runs the tool; the exit status, with stdout and stderr in `log` when given.
int run_tool(const std::string& args, std::string* log = nullptr) {
  static int calls = 0;
  const std::string log_path = (fs::temp_directory_path() / ("strata_pre_log_" + std::to_string(::getpid()) + "_" +
                                                             std::to_string(calls++)))
                                   .string();
  const std::string command = std::string("\"") + STRATA_PREPROCESS_DATA + "\" " + args + " > " + log_path + " 2>&1";
  const int rc = std::system(command.c_str());
  if (log != nullptr) *log = read_file(log_path);
  fs::remove(log_path);
  return rc;
}

void expect_same_files(const std::string& a, const std::string& b) {
  for (const char* ext : {".bin", ".idx"}) {
    const std::string x = read_file(a + ext), y = read_file(b + ext);
    EXPECT_FALSE(x.empty() && std::string(ext) == ".idx") << a << ext << " is missing or empty";
    EXPECT_TRUE(x == y) << a << ext << " (" << x.size() << " bytes) differs from " << b << ext << " (" << y.size() << " bytes)";
  }
}

std::vector<std::int32_t> bytes_of(const std::string& text, bool eod = false) {
  auto tokens = ByteTokenizer::encode(text);
  if (eod) tokens.push_back(ByteTokenizer::kEod);
  return tokens;
}

// A corpus of `count` JSON lines with empty texts, multi-line texts, escapes and UTF-8.
std::string random_jsonl(int count, unsigned seed) {
  std::mt19937 gen(seed);
  const std::vector<std::string> words{"the", "Lord", "said.", "And", "it", "was", "so!", "Dr.", "Smith", "\xc3\xa9t\xc3\xa9",
                                       "\xe2\x80\x94", "\"quoted.\"", "end?", "\n", "\n\n", "tab\t", "a\\b"};
  std::string out;
  for (int i = 0; i < count; ++i) {
    std::string text;
    const int n = gen() % 7 == 0 ? 0 : static_cast<int>(gen() % 60);
    for (int w = 0; w < n; ++w) text += words[gen() % words.size()] + (gen() % 3 == 0 ? "" : " ");
    out += "{\"id\": " + std::to_string(i) + ", \"text\": " + json_string(text) + ", \"title\": " + json_string("title " + std::to_string(i)) +
           "}\n";
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The sentence splitter (not punkt: a documented rule set)

TEST(SentenceSplitter, SplitsAtTerminalPunctuationFollowedBySpaceAndText) {
  using strata::tools::split_sentences;
  const std::string text = "Hello world. This is Dr. Smith! Is it? yes it is.\n\nSaid \"go.\" Then J. R. went (home.) Last one  \n";
  const std::vector<std::string_view> expected{"Hello world.", "This is Dr. Smith!", "Is it? yes it is.", "Said \"go.\"",
                                               "Then J. R. went (home.)", "Last one"};
  EXPECT_EQ(split_sentences(text, false), expected);
}

TEST(SentenceSplitter, KeepNewlinesKeepsTheWhitespaceAfterEachSentence) {
  using strata::tools::split_sentences;
  const std::string text = "  One.\nTwo!\n\n  Three...   Four e.g. five.\n";
  const std::vector<std::string_view> kept{"  One.\n", "Two!\n\n  ", "Three...   ", "Four e.g. five."};
  EXPECT_EQ(split_sentences(text, true), kept);
  const std::vector<std::string_view> dropped{"  One.", "Two!", "Three...", "Four e.g. five."};
  EXPECT_EQ(split_sentences(text, false), dropped);
  // Put together, the kept sentences give back the text without its trailing whitespace.
  std::string joined;
  for (auto s : split_sentences(text, true)) joined += s;
  EXPECT_EQ(joined, "  One.\nTwo!\n\n  Three...   Four e.g. five.");
}

TEST(SentenceSplitter, WhitespaceOnlyTextHasNoSentence) {
  EXPECT_TRUE(strata::tools::split_sentences(" \n\t ", false).empty());
  EXPECT_TRUE(strata::tools::split_sentences("", true).empty());
  EXPECT_EQ(strata::tools::split_sentences("No end", false), std::vector<std::string_view>{"No end"});
}

// ---------------------------------------------------------------------------------------------
// The writer's merge: Megatron's IndexedDatasetBuilder.add_index

TEST(IndexedDatasetWriter, AddIndexOfPartsEqualsWritingTheWhole) {
  TempDir dir;
  std::mt19937 gen(7);
  std::vector<std::vector<std::vector<std::int32_t>>> documents(30);  // [document][sequence][token]
  for (auto& d : documents) {
    d.resize(gen() % 4);  // 0..3 sequences: some documents hold none
    for (auto& s : d) {
      s.resize(gen() % 9 + 1);
      for (auto& t : s) t = static_cast<std::int32_t>(gen() % 50000);
    }
  }
  auto add = [](IndexedDatasetWriter& w, const std::vector<std::vector<std::int32_t>>& doc) {
    std::vector<std::int32_t> tokens, lengths;
    for (const auto& s : doc) {
      tokens.insert(tokens.end(), s.begin(), s.end());
      lengths.push_back(static_cast<std::int32_t>(s.size()));
    }
    w.add_document(tokens, lengths);
  };
  IndexedDatasetWriter whole(dir / "whole", DType::uint16);
  for (const auto& d : documents) add(whole, d);
  whole.finalize();
  const std::vector<std::size_t> cuts{0, 0, 11, 11, 29, 30};  // parts 0 and 2 are empty datasets
  for (std::size_t p = 0; p + 1 < cuts.size(); ++p) {
    IndexedDatasetWriter part(dir / ("part" + std::to_string(p)), DType::uint16);
    for (std::size_t d = cuts[p]; d < cuts[p + 1]; ++d) add(part, documents[d]);
    part.finalize();
  }
  IndexedDatasetWriter merged(dir / "merged", DType::uint16);
  for (std::size_t p = 0; p + 1 < cuts.size(); ++p) merged.add_index(dir / ("part" + std::to_string(p)));
  merged.finalize();
  expect_same_files(dir / "merged", dir / "whole");
  // A part of another dtype is refused, naming it.
  IndexedDatasetWriter wide(dir / "wide", DType::int32);
  wide.add_document(std::vector<std::int32_t>{1, 2});
  wide.finalize();
  IndexedDatasetWriter other(dir / "other", DType::uint16);
  try {
    other.add_index(dir / "wide");
    ADD_FAILURE() << "no error";
  } catch (const strata::FileError& e) {
    EXPECT_NE(std::string(e.what()).find("wide.idx"), std::string::npos) << e.what();
  }
  // Sequence lengths that do not cut the tokens are refused.
  EXPECT_THROW(other.add_document(std::vector<std::int32_t>{1, 2, 3}, std::vector<std::int32_t>{2}), strata::ConfigError);
}

// ---------------------------------------------------------------------------------------------
// The GPT dataset over documents of no tokens

// Megatron's preprocess_data writes an empty text as a document of no sequence; other writers
// may leave sequences of length 0, first and last included. The sample index steps over both,
// and the samples are the token stream cut as without them.
TEST(GptDataset, FileWithEmptyDocumentsGivesTheSamplesOfItsTokens) {
  TempDir dir;
  std::vector<std::vector<std::int32_t>> sequences{{}, {1, 2, 3}, {}, {}, {4, 5}, {6, 7, 8, 9, 10}, {}, {11}, {12, 13, 14}, {}};
  {
    IndexedDatasetWriter w(dir / "empties", DType::uint16);
    w.add_document(std::vector<std::int32_t>{}, std::vector<std::int32_t>{});  // a document of no sequence, first
    for (const auto& s : sequences) {
      w.add_document(s);
      w.add_document(std::vector<std::int32_t>{}, std::vector<std::int32_t>{});
    }
    w.finalize();
  }
  auto dataset = std::make_shared<const IndexedDataset>(dir / "empties");
  ASSERT_EQ(dataset->sequence_count(), static_cast<std::int64_t>(sequences.size()));
  ASSERT_EQ(dataset->document_count(), 2 * static_cast<std::int64_t>(sequences.size()) + 1);
  std::vector<std::int32_t> stream;
  for (const auto& s : sequences) stream.insert(stream.end(), s.begin(), s.end());
  for (std::int64_t seq_length : {1, 2, 3, 5, 13}) {
    SCOPED_TRACE(seq_length);
    GptDataset gpt(dataset, GptDatasetConfig{.seq_length = seq_length, .num_samples = -1, .seed = 1, .shuffle = false});
    ASSERT_EQ(gpt.size(), (static_cast<std::int64_t>(stream.size()) - 1) / seq_length);
    for (std::int64_t i = 0; i < gpt.size(); ++i) {
      const std::vector<std::int32_t> expected(stream.begin() + i * seq_length, stream.begin() + (i + 1) * seq_length + 1);
      EXPECT_EQ(gpt.sample(i), expected) << "sample " << i;
    }
    // Shuffled and over several epochs: every sample still has seq_length + 1 tokens of the stream.
    GptDataset shuffled(dataset, GptDatasetConfig{.seq_length = seq_length, .num_samples = 40, .seed = 3});
    for (std::int64_t i = 0; i < shuffled.size(); ++i) {
      const auto sample = shuffled.sample(i);
      ASSERT_EQ(static_cast<std::int64_t>(sample.size()), seq_length + 1);
      for (std::int32_t t : sample) EXPECT_TRUE(t >= 1 && t <= 14) << t;
    }
  }
}

#ifdef STRATA_PREPROCESS_DATA
// ---------------------------------------------------------------------------------------------
// The tool

// Megatron's Encoder.encode: an empty text gives no sentence, so the document has no sequence
// (its document index repeats the previous one) and --append-eod adds nothing to it.
TEST(PreprocessData, EmptyDocumentsWrittenAsMegatronWritesThem) {
  TempDir dir;
  write_file(dir / "in.jsonl", "{\"text\": \"\"}\n{\"text\": \"ab\"}\n{\"text\": \"\"}\n{\"text\": \"\"}\n{\"text\": \"c\"}\n{\"text\": \"\"}\n");
  for (bool eod : {false, true}) {
    SCOPED_TRACE(eod);
    const std::string prefix = dir / (eod ? "eod" : "plain");
    ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl") + " --output-prefix " + prefix + (eod ? " --append-eod" : "")), 0);
    IndexedDataset ds(prefix + "_text_document");
    EXPECT_EQ(ds.dtype(), DType::uint16);
    ASSERT_EQ(ds.document_count(), 6);
    EXPECT_EQ(std::vector<std::int64_t>(ds.document_indices().begin(), ds.document_indices().end()),
              (std::vector<std::int64_t>{0, 0, 1, 1, 1, 2, 2}));
    ASSERT_EQ(ds.sequence_count(), 2);
    EXPECT_EQ(ds.get(0), bytes_of("ab", eod));
    EXPECT_EQ(ds.get(1), bytes_of("c", eod));
    // The .idx byte for byte: header, lengths, pointers, document indices.
    std::string expected("MMIDIDX\0\0", 9);
    auto put = [&](auto value) { expected.append(reinterpret_cast<const char*>(&value), sizeof(value)); };
    put(std::uint64_t{1});
    put(std::uint8_t{8});  // uint16
    put(std::uint64_t{2});
    put(std::uint64_t{7});
    put(std::int32_t{eod ? 3 : 2});
    put(std::int32_t{eod ? 2 : 1});
    put(std::int64_t{0});
    put(std::int64_t{eod ? 6 : 4});
    for (std::int64_t d : {0, 0, 1, 1, 1, 2, 2}) put(d);
    EXPECT_TRUE(read_file(prefix + "_text_document.idx") == expected);
  }
}

TEST(PreprocessData, WorkersOneAndFourWriteTheSameBytes) {
  TempDir dir;
  write_file(dir / "in.jsonl", random_jsonl(3000, 11));
  for (const std::string flags : {"--append-eod", "--append-eod --split-sentences", "--json-keys text title"}) {
    SCOPED_TRACE(flags);
    std::string log1, log4;
    ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl") + " --output-prefix " + (dir / "w1") + " --workers 1 " + flags, &log1), 0)
        << log1;
    ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl") + " --output-prefix " + (dir / "w4") + " --workers 4 --log-interval 500 " +
                           flags,
                       &log4),
              0)
        << log4;
    const std::string level = flags.find("split") != std::string::npos ? "_sentence" : "_document";
    expect_same_files(dir / ("w4_text" + level), dir / ("w1_text" + level));
    IndexedDataset ds(dir / ("w1_text" + level));
    EXPECT_EQ(ds.document_count(), 3000);
    // Megatron's progress line, every --log-interval documents.
    EXPECT_NE(log4.find("Processed 500 documents ("), std::string::npos) << log4;
    EXPECT_NE(log4.find("Processed 3000 documents ("), std::string::npos) << log4;
    EXPECT_NE(log4.find(" docs/s, "), std::string::npos) << log4;
    EXPECT_NE(log4.find(" MB/s)."), std::string::npos) << log4;
  }
  expect_same_files(dir / "w4_title_document", dir / "w1_title_document");
}

// Megatron's --partitions: the input's documents go round robin into partition files (consecutive
// runs with --keep-sequential-samples), each is encoded, and the parts are merged in order.
TEST(PreprocessData, PartitionsMergedEqualOnePartition) {
  TempDir dir;
  const int count = 1000;
  write_file(dir / "in.jsonl", random_jsonl(count, 5));
  const std::string in = dir / "in.jsonl";
  ASSERT_EQ(run_tool("--input " + in + " --output-prefix " + (dir / "one") + " --append-eod"), 0);
  std::string log;
  ASSERT_EQ(run_tool("--input " + in + " --output-prefix " + (dir / "seq") + " --append-eod --partitions 3 --keep-sequential-samples --workers 2", &log), 0)
      << log;
  expect_same_files(dir / "seq_text_document", dir / "one_text_document");
  // Megatron's file names: partition files beside the input, per-partition datasets.
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(fs::exists(dir / ("in_" + std::to_string(i) + ".jsonl")));
    EXPECT_TRUE(fs::exists(dir / ("seq_" + std::to_string(i) + "_text_document.idx")));
  }
  EXPECT_EQ(IndexedDataset(dir / "seq_0_text_document").document_count(), 334);  // ceil(1000 / 3)
  EXPECT_EQ(IndexedDataset(dir / "seq_2_text_document").document_count(), 332);

  // Round robin: documents 0, 3, 6, ..., then 1, 4, ..., then 2, 5, ...
  ASSERT_EQ(run_tool("--input " + in + " --output-prefix " + (dir / "rr") + " --append-eod --partitions 3", &log), 0) << log;
  IndexedDataset one(dir / "one_text_document"), round_robin(dir / "rr_text_document");
  ASSERT_EQ(round_robin.document_count(), count);
  std::int64_t d = 0;
  for (int start = 0; start < 3; ++start) {
    for (int source = start; source < count; source += 3, ++d) {
      const auto a = one.document_indices(), b = round_robin.document_indices();
      ASSERT_EQ(a[source + 1] - a[source], b[d + 1] - b[d]) << "document " << d;
      for (std::int64_t s = 0; s < a[source + 1] - a[source]; ++s) ASSERT_EQ(round_robin.get(b[d] + s), one.get(a[source] + s));
    }
  }
  // A glob over several files: their documents in the order of the sorted names.
  write_file(dir / "more_a.jsonl", "{\"text\": \"first\"}\n{\"text\": \"second\"}\n");
  write_file(dir / "more_b.jsonl", "{\"text\": \"third\"}\n");
  ASSERT_EQ(run_tool("--input '" + (dir / "more_*.jsonl") + "' --output-prefix " + (dir / "glob") +
                         " --partitions 2 --keep-sequential-samples --input-format jsonl",
                     &log),
            0)
      << log;
  IndexedDataset globbed(dir / "glob_text_document");
  ASSERT_EQ(globbed.document_count(), 3);
  EXPECT_EQ(ByteTokenizer::decode(globbed.get(2)), "third");
}

TEST(PreprocessData, GzipInputEqualsPlainInput) {
  TempDir dir;
  const std::string corpus = random_jsonl(800, 3);
  write_file(dir / "in.jsonl", corpus);
  write_gzip(dir / "in.jsonl.gz", corpus);
  ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl") + " --output-prefix " + (dir / "plain") + " --append-eod"), 0);
  std::string log;
  ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl.gz") + " --output-prefix " + (dir / "gz") + " --append-eod --workers 2", &log), 0)
      << log;
  expect_same_files(dir / "gz_text_document", dir / "plain_text_document");
  ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl.gz") + " --output-prefix " + (dir / "gzp") + " --append-eod --partitions 2 --keep-sequential-samples",
                     &log),
            0)
      << log;
  expect_same_files(dir / "gzp_text_document", dir / "plain_text_document");
  // Plain text under gzip too.
  write_gzip(dir / "book.txt.gz", "One.\n\nTwo.\n");
  ASSERT_EQ(run_tool("--input " + (dir / "book.txt.gz") + " --output-prefix " + (dir / "book")), 0);
  EXPECT_EQ(IndexedDataset(dir / "book_text_document").document_count(), 2);
}

// Megatron's sentence-level datasets: one sequence per sentence, documents over them, output
// named _sentence; EOD on the last sentence; sentences of no token dropped.
TEST(PreprocessData, SplitSentencesWritesSentenceBoundaries) {
  TempDir dir;
  write_file(dir / "in.jsonl",
             "{\"text\": \"First one. Second one!\\nThird?\"}\n"
             "{\"text\": \"\"}\n"
             "{\"text\": \"   \"}\n"
             "{\"text\": \"Alone\"}\n"
             "{\"text\": [\"Given\", \"\", \"as a list. Not split again.\"]}\n");
  ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl") + " --output-prefix " + (dir / "s") + " --split-sentences --append-eod"), 0);
  EXPECT_FALSE(fs::exists(dir / "s_text_document.idx"));
  IndexedDataset ds(dir / "s_text_sentence");
  EXPECT_EQ(std::vector<std::int64_t>(ds.document_indices().begin(), ds.document_indices().end()),
            (std::vector<std::int64_t>{0, 3, 3, 3, 4, 6}));
  ASSERT_EQ(ds.sequence_count(), 6);
  EXPECT_EQ(ds.get(0), bytes_of("First one."));
  EXPECT_EQ(ds.get(1), bytes_of("Second one!"));
  EXPECT_EQ(ds.get(2), bytes_of("Third?", true));
  EXPECT_EQ(ds.get(3), bytes_of("Alone", true));
  EXPECT_EQ(ds.get(4), bytes_of("Given"));
  EXPECT_EQ(ds.get(5), bytes_of("as a list. Not split again.", true));
  // A list value is Megatron's pre-split text even without --split-sentences (level "document").
  ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl") + " --output-prefix " + (dir / "d")), 0);
  IndexedDataset doc(dir / "d_text_document");
  EXPECT_EQ(std::vector<std::int64_t>(doc.document_indices().begin(), doc.document_indices().end()),
            (std::vector<std::int64_t>{0, 1, 1, 2, 3, 5}));
}

// Megatron's --keep-newlines: the newlines (whitespace) after a sentence stay in it.
TEST(PreprocessData, KeepNewlinesKeepsWhitespaceBetweenSentences) {
  TempDir dir;
  write_file(dir / "in.jsonl", "{\"text\": \"Line one.\\n\\nLine two.  Three.\\n\"}\n");
  ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl") + " --output-prefix " + (dir / "k") + " --split-sentences --keep-newlines"), 0);
  ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl") + " --output-prefix " + (dir / "n") + " --split-sentences"), 0);
  IndexedDataset kept(dir / "k_text_sentence"), dropped(dir / "n_text_sentence");
  ASSERT_EQ(kept.sequence_count(), 3);
  ASSERT_EQ(dropped.sequence_count(), 3);
  EXPECT_EQ(kept.get(0), bytes_of("Line one.\n\n"));
  EXPECT_EQ(kept.get(1), bytes_of("Line two.  "));
  EXPECT_EQ(kept.get(2), bytes_of("Three."));
  EXPECT_EQ(dropped.get(0), bytes_of("Line one."));
  EXPECT_EQ(dropped.get(1), bytes_of("Line two."));
  EXPECT_EQ(dropped.get(2), bytes_of("Three."));
}

// Megatron's --json-keys with several keys: one dataset per key, each with every line's document.
TEST(PreprocessData, SeveralJsonKeysOneDatasetEach) {
  TempDir dir;
  write_file(dir / "in.jsonl",
             "{\"title\": \"T1\", \"body\": \"B one\", \"skip\": [1, {\"title\": \"no\"}]}\n"
             "{\"body\": \"\", \"title\": \"T2\", \"title\": \"T2 again\"}\n");
  ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl") + " --output-prefix " + (dir / "m") + " --json-keys title body --append-eod"), 0);
  IndexedDataset title(dir / "m_title_document"), body(dir / "m_body_document");
  ASSERT_EQ(title.document_count(), 2);
  ASSERT_EQ(body.document_count(), 2);
  EXPECT_EQ(title.get(0), bytes_of("T1", true));
  EXPECT_EQ(title.get(1), bytes_of("T2 again", true));  // a repeated key: the last value, as Python's json
  EXPECT_EQ(body.get(0), bytes_of("B one", true));
  EXPECT_EQ(body.sequence_count(), 1);  // the empty body is a document of no sequence
}

// Errors name the file and the line (Megatron stops with a Python traceback).
TEST(PreprocessData, ErrorsNameFileAndLine) {
  TempDir dir;
  auto expect_error = [&](const std::string& args, const std::vector<std::string>& parts) {
    std::string log;
    EXPECT_NE(run_tool(args, &log), 0) << args;
    for (const auto& p : parts) EXPECT_NE(log.find(p), std::string::npos) << "'" << p << "' not in: " << log;
  };
  write_file(dir / "missing.jsonl", "{\"text\": \"ok\"}\n\n{\"body\": \"no text\"}\n");
  expect_error("--input " + (dir / "missing.jsonl") + " --output-prefix " + (dir / "m") + " --workers 3",
               {dir / "missing.jsonl", "line 3", "no key \"text\""});
  EXPECT_FALSE(fs::exists(dir / "m_text_document.idx"));
  write_file(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": \"abc\" x}\n{\"text\": \"ok\"}\n");
  expect_error("--input " + (dir / "bad.jsonl") + " --output-prefix " + (dir / "b") + " --workers 2",
               {dir / "bad.jsonl", "line 3", "column"});
  write_file(dir / "number.jsonl", "{\"text\": 5}\n");
  expect_error("--input " + (dir / "number.jsonl") + " --output-prefix " + (dir / "n"), {"line 1", "not a string"});
  // A gzip file whose compressed data is damaged, and one cut short.
  std::string lines;
  for (int i = 0; i < 20000; ++i) lines += "{\"text\": \"line " + std::to_string(i) + "\"}\n";
  write_gzip(dir / "good.jsonl.gz", lines);
  std::string gz = read_file(dir / "good.jsonl.gz");
  std::string damaged = gz;
  for (std::size_t i = 40; i < damaged.size() - 40; i += 7) damaged[i] = static_cast<char>(damaged[i] ^ 0x5a);
  write_file(dir / "damaged.jsonl.gz", damaged);
  expect_error("--input " + (dir / "damaged.jsonl.gz") + " --output-prefix " + (dir / "d"), {dir / "damaged.jsonl.gz", "line "});
  write_file(dir / "cut.jsonl.gz", gz.substr(0, gz.size() / 2));
  expect_error("--input " + (dir / "cut.jsonl.gz") + " --output-prefix " + (dir / "c"),
               {dir / "cut.jsonl.gz", "line ", "unexpected end of file"});
  EXPECT_FALSE(fs::exists(dir / "c_text_document.idx"));
  expect_error("--input " + (dir / "absent.jsonl") + " --output-prefix " + (dir / "a"), {"absent.jsonl", "cannot open"});
  // A text the tokenizer refuses (NullTokenizer reads ids written as numbers).
  write_file(dir / "ids.jsonl", "{\"text\": \"1 2 3\"}\n{\"text\": \"4 five\"}\n");
  expect_error("--input " + (dir / "ids.jsonl") + " --output-prefix " + (dir / "i") + " --tokenizer-type NullTokenizer --vocab-size 10",
               {dir / "ids.jsonl", "line 2", "key \"text\""});
  // The tokenizer's flags are checked by make_tokenizer.
  expect_error("--input " + (dir / "missing.jsonl") + " --output-prefix " + (dir / "t") + " --tokenizer-type GPT2BPETokenizer",
               {"--vocab-file"});
}

// A value nested far deeper than any call stack, under a key that is not extracted, is skipped.
TEST(PreprocessData, DeepNestingUnderAnUnextractedKeyIsSkipped) {
  TempDir dir;
  const int depth = 70000;
  write_file(dir / "deep.jsonl", "{\"deep\": " + std::string(depth, '[') + std::string(depth, ']') +
                                     ", \"more\": {\"a\": [1, {\"b\": [true, null, \"x\"]}, []], \"c\": {}}, \"text\": \"hello\"}\n"
                                     "{\"obj\": " + std::string(depth, '[') + "{\"k\": 1}" + std::string(depth, ']') + ", \"text\": \"world\"}\n");
  std::string log;
  ASSERT_EQ(run_tool("--input " + (dir / "deep.jsonl") + " --output-prefix " + (dir / "d"), &log), 0) << log;
  const IndexedDataset ds(dir / "d_text_document");
  ASSERT_EQ(ds.sequence_count(), 2);
  // A container left open is still an error naming the line.
  write_file(dir / "open.jsonl", "{\"text\": \"ok\"}\n{\"deep\": " + std::string(depth, '[') + ", \"text\": \"x\"}\n");
  EXPECT_NE(run_tool("--input " + (dir / "open.jsonl") + " --output-prefix " + (dir / "o"), &log), 0);
  EXPECT_NE(log.find("line 2"), std::string::npos) << log;
}

// Python's json.loads (which Megatron uses) refuses raw control characters inside strings.
TEST(PreprocessData, RawControlCharactersInStringsAreRefused) {
  TempDir dir;
  for (const std::string& bad : {std::string("a\0b", 3), std::string("a\x01b"), std::string("a\tb"), std::string("a\x1f")}) {
    write_file(dir / "ctl.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"" + bad + "\"}\n");
    std::string log;
    EXPECT_NE(run_tool("--input " + (dir / "ctl.jsonl") + " --output-prefix " + (dir / "c"), &log), 0);
    for (const char* part : {"ctl.jsonl", "line 2", "control character"}) EXPECT_NE(log.find(part), std::string::npos) << log;
  }
  // Escaped, they are text.
  write_file(dir / "esc.jsonl", "{\"text\": \"a\\u0000b\\tc\"}\n");
  std::string log;
  EXPECT_EQ(run_tool("--input " + (dir / "esc.jsonl") + " --output-prefix " + (dir / "e"), &log), 0) << log;
}

// Flags out of range: a negative --log-interval is refused; far more --workers than hardware
// threads fall back to the hardware threads with a note, and write the same files.
TEST(PreprocessData, LogIntervalAndWorkersAreBounded) {
  TempDir dir;
  write_file(dir / "in.jsonl", random_jsonl(50, 3));
  std::string log;
  EXPECT_NE(run_tool("--input " + (dir / "in.jsonl") + " --output-prefix " + (dir / "l") + " --log-interval -1", &log), 0);
  EXPECT_NE(log.find("--log-interval -1"), std::string::npos) << log;
  ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl") + " --output-prefix " + (dir / "w1"), &log), 0) << log;
  ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl") + " --output-prefix " + (dir / "wmany") + " --workers 100000", &log), 0) << log;
  EXPECT_NE(log.find("--workers 100000"), std::string::npos) << log;
  expect_same_files(dir / "w1_text_document", dir / "wmany_text_document");
}

// strata's plain-text input keeps working (paragraphs, --dtype).
TEST(PreprocessData, PlainTextParagraphsWithWorkers) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 500; ++i) text += "Paragraph " + std::to_string(i) + ".\nSecond line. Here.\r\n\r\n \n";
  write_file(dir / "in.txt", text);
  ASSERT_EQ(run_tool("--input " + (dir / "in.txt") + " --output-prefix " + (dir / "p1") + " --append-eod --dtype int32"), 0);
  ASSERT_EQ(run_tool("--input " + (dir / "in.txt") + " --output-prefix " + (dir / "p3") + " --append-eod --dtype int32 --workers 3"), 0);
  expect_same_files(dir / "p3_text_document", dir / "p1_text_document");
  IndexedDataset ds(dir / "p1_text_document");
  EXPECT_EQ(ds.dtype(), DType::int32);
  ASSERT_EQ(ds.document_count(), 500);
  EXPECT_EQ(ds.get(7), bytes_of("Paragraph 7.\nSecond line. Here.", true));
  ASSERT_EQ(run_tool("--input " + (dir / "in.txt") + " --output-prefix " + (dir / "ps") + " --split-sentences"), 0);
  IndexedDataset sentences(dir / "ps_text_sentence");
  EXPECT_EQ(sentences.sequence_count(), 1500);
  EXPECT_EQ(sentences.get(1), bytes_of("Second line."));
}
#endif

// The shipped novels (examples/data/README.md): the documented size, plain text with LF line ends
// and nothing of Project Gutenberg's header or licence, the eight books in the documented order;
// tokenized with the Bible as bench/fp8_convergence.sh does, the "library" of 18,577,572 byte
// tokens in 48,957 paragraphs, enough for 2,000 iterations of 8 x 1024 tokens read once.
namespace {
std::string gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return {};
  std::string text;
  char buffer[1 << 16];
  int got = 0;
  while ((got = gzread(f, buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<std::size_t>(got));
  EXPECT_EQ(got, 0) << path << ": not a whole gzip stream";
  gzclose(f);
  return text;
}
}  // namespace

TEST(ShippedCorpus, NovelsAreTheDocumentedTextsAndTheLibraryItsTokens) {
  const std::string data = STRATA_EXAMPLES_DATA_DIR;
  const std::string novels = gunzip(data + "/novels.txt.gz");
  EXPECT_EQ(novels.size(), 14485436u);
  EXPECT_EQ(novels.find('\r'), std::string::npos);
  EXPECT_EQ(novels.find("\xEF\xBB\xBF"), std::string::npos) << "a byte-order mark";
  for (const char* word : {"Gutenberg", "GUTENBERG", "gutenberg"}) EXPECT_EQ(novels.find(word), std::string::npos) << word;
  std::size_t at = 0;
  for (const char* opening : {"BOOK ONE: 1805", "So long as there shall exist, by virtue of law and custom",
                              "It was with considerable reluctance that I abandoned", "Fyodor Pavlovitch Karamazov",
                              "Supplied by a Late Consumptive Usher", "A preface to the first edition of",
                              "family name being Pirrip", "Most of the adventures recorded in this book really occurred"}) {
    const std::size_t found = novels.find(opening, at);
    ASSERT_NE(found, std::string::npos) << "'" << opening << "' after byte " << at;
    at = found;
  }
#ifdef STRATA_PREPROCESS_DATA
  TempDir dir;
  write_file(dir / "library.txt", gunzip(data + "/kjv_bible.txt.gz") + "\n" + novels);
  ASSERT_EQ(run_tool("--input " + (dir / "library.txt") + " --output-prefix " + (dir / "library") + " --append-eod"), 0);
  IndexedDataset library(dir / "library_text_document");
  EXPECT_EQ(library.token_count(), 18577572);
  EXPECT_EQ(library.document_count(), 48957);
  EXPECT_GE(library.token_count(), 2000 * 8 * 1025);
#endif
}
