// Tests of the data module: indexed datasets (round trip, byte layout, corrupt files), llm.c
// shards, the byte tokenizer, the preprocessing tool, the GPT sample index, batches and blending.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <strata/data.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace strata::data;
using strata::ConfigError;
using strata::FileError;

namespace {

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            (std::string("strata_data_") + info->test_suite_name() + "_" + info->name() + "_" + std::to_string(::getpid()));
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

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}
template <class T>
T at(const std::vector<char>& bytes, std::size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}
template <class T>
void put(std::vector<char>& bytes, std::size_t offset, T v) {
  std::memcpy(bytes.data() + offset, &v, sizeof(T));
}

// Expects `f` to throw FileError whose message contains every one of `parts`.
void expect_file_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no FileError thrown";
  } catch (const FileError& e) {
    std::string message = e.what();
    for (const auto& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
  }
}

// Expects `f`, which opens the FIFO `fifo` among its files, to throw FileError naming `parts`
// without blocking; a call that blocks in open(2) is released by a writer after 10 s and fails.
void expect_fifo_refused(const std::string& fifo, const std::function<void()>& f, const std::vector<std::string>& parts) {
  std::promise<std::string> message;
  std::future<std::string> done = message.get_future();
  std::thread call([&] {
    try {
      f();
      message.set_value("no FileError thrown");
    } catch (const FileError& e) {
      message.set_value(e.what());
    } catch (const std::exception& e) {
      message.set_value(std::string("another exception: ") + e.what());
    }
  });
  if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked on the FIFO " << fifo;
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (writer >= 0) ::close(writer);
  }
  call.join();
  const std::string text = done.get();
  for (const auto& p : parts) EXPECT_NE(text.find(p), std::string::npos) << "'" << p << "' not in: " << text;
}

// Documents of random lengths and tokens below `vocab`.
std::vector<std::vector<std::int32_t>> random_documents(int count, int max_length, int vocab, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::vector<std::int32_t>> docs(static_cast<std::size_t>(count));
  for (auto& d : docs) {
    d.resize(static_cast<std::size_t>(gen() % static_cast<unsigned>(max_length) + 1));
    for (auto& t : d) t = static_cast<std::int32_t>(gen() % static_cast<unsigned>(vocab));
  }
  return docs;
}

std::shared_ptr<const IndexedDataset> write_dataset(const std::string& prefix, const std::vector<std::vector<std::int32_t>>& docs,
                                                    DType dtype = DType::uint16) {
  IndexedDatasetWriter w(prefix, dtype);
  for (const auto& d : docs) w.add_document(d);
  w.finalize();
  return std::make_shared<const IndexedDataset>(prefix);
}

// Writes a small valid dataset: 3 sequences in 2 documents, int32.
std::string small_dataset(const TempDir& dir) {
  std::string prefix = dir / "small";
  IndexedDatasetWriter w(prefix, DType::int32);
  w.add_item(std::vector<std::int32_t>{1, 2, 3});
  w.add_item(std::vector<std::int32_t>{4, 5});
  w.end_document();
  w.add_item(std::vector<std::int32_t>{6});
  w.end_document();
  w.finalize();
  return prefix;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Indexed dataset

TEST(IndexedDataset, RoundTripEveryDType) {
  TempDir dir;
  const auto docs = random_documents(20, 50, 120, 7);  // values fit every dtype, int8 included
  for (DType dtype : {DType::uint8, DType::int8, DType::int16, DType::uint16, DType::int32, DType::int64, DType::float32,
                      DType::float64}) {
    std::string prefix = dir / ("rt_" + std::string(dtype_name(dtype)));
    IndexedDatasetWriter w(prefix, dtype);
    for (const auto& d : docs) {
      // Two sequences per document, to exercise the document index.
      std::size_t half = d.size() / 2;
      w.add_item(std::span<const std::int32_t>(d.data(), half));
      w.add_item(std::span<const std::int32_t>(d.data() + half, d.size() - half));
      w.end_document();
    }
    w.finalize();
    IndexedDataset ds(prefix);
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    EXPECT_EQ(ds.dtype(), dtype);
    EXPECT_EQ(ds.sequence_count(), 40);
    EXPECT_EQ(ds.document_count(), 20);
    ASSERT_EQ(ds.document_indices().size(), 21u);
    for (std::size_t d = 0; d <= 20; ++d) EXPECT_EQ(ds.document_indices()[d], static_cast<std::int64_t>(2 * d));
    for (std::size_t d = 0; d < docs.size(); ++d) {
      auto first = ds.get(static_cast<std::int64_t>(2 * d));
      auto second = ds.get(static_cast<std::int64_t>(2 * d + 1));
      first.insert(first.end(), second.begin(), second.end());
      EXPECT_EQ(first, docs[d]);
    }
    // Partial reads.
    auto whole = ds.get(1);
    if (whole.size() >= 3) {
      EXPECT_EQ(ds.get(1, 1, 2), std::vector<std::int32_t>(whole.begin() + 1, whole.begin() + 3));
      EXPECT_EQ(ds.get(1, 1), std::vector<std::int32_t>(whole.begin() + 1, whole.end()));
    }
    EXPECT_FALSE(fs::exists(prefix + ".bin.tmp"));
    EXPECT_FALSE(fs::exists(prefix + ".idx.tmp"));
  }
}

TEST(IndexedDataset, LargeTokenIdsInInt32AndRangeChecks) {
  TempDir dir;
  std::vector<std::int32_t> big{0, 65535, 65536, 50256, 2000000000};
  auto ds = write_dataset(dir / "big", {big}, DType::int32);
  EXPECT_EQ(ds->get(0), big);
  IndexedDatasetWriter w(dir / "narrow", DType::uint16);
  EXPECT_THROW(w.add_item(std::vector<std::int32_t>{65536}), ConfigError);
  EXPECT_THROW(w.add_item(std::vector<std::int32_t>{-1}), ConfigError);
  EXPECT_THROW(ds->get(1), ConfigError);
  EXPECT_THROW(ds->get(0, 2, 4), ConfigError);
}

// An int64 token above 2^32 used to come back truncated (4294967361 -> 65): reading it as the
// model's int32 ids is an error naming the file, the sequence and the value.
TEST(IndexedDataset, TokenIdsThatDoNotFitTheReadTypeAreAnErrorNotTruncated) {
  TempDir dir;
  {
    IndexedDatasetWriter w(dir / "wide", DType::int64);
    w.add_document(std::vector<std::int64_t>{1, 2});
    w.add_document(std::vector<std::int64_t>{3, 4294967361LL, 5});
    w.finalize();
  }
  auto ds = std::make_shared<const IndexedDataset>(dir / "wide");
  EXPECT_EQ(ds->get(0), (std::vector<std::int32_t>{1, 2}));
  try {
    (void)ds->get(1);
    ADD_FAILURE() << "token 4294967361 was read as an int32";
  } catch (const FileError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(dir / "wide.bin"), std::string::npos) << m;
    EXPECT_NE(m.find("sequence 1"), std::string::npos) << m;
    EXPECT_NE(m.find("4294967361"), std::string::npos) << m;
  }
  EXPECT_EQ(ds->read<std::int64_t>(1), (std::vector<std::int64_t>{3, 4294967361LL, 5}));
  {
    IndexedDatasetWriter w(dir / "float", DType::float64);
    w.add_document(std::vector<double>{1.0, 2.5});
    w.finalize();
  }
  EXPECT_THROW((void)IndexedDataset(dir / "float").get(0), FileError);
}

TEST(IndexedDataset, UnfinishedWriterLeavesNoFiles) {
  TempDir dir;
  {
    IndexedDatasetWriter w(dir / "gone", DType::uint16);
    w.add_document(std::vector<std::int32_t>{1, 2, 3});
  }
  EXPECT_FALSE(fs::exists(dir / "gone.bin"));
  EXPECT_FALSE(fs::exists(dir / "gone.bin.tmp"));
  EXPECT_FALSE(fs::exists(dir / "gone.idx"));
}

TEST(IndexedDataset, MegatronByteLayout) {
  TempDir dir;
  std::string prefix = dir / "layout";
  IndexedDatasetWriter w(prefix, DType::uint16);
  w.add_item(std::vector<std::int32_t>{10, 11, 12});
  w.add_item(std::vector<std::int32_t>{13});
  w.end_document();
  w.add_item(std::vector<std::int32_t>{300, 65535});
  w.end_document();
  w.finalize();

  auto idx = read_bytes(prefix + ".idx");
  ASSERT_EQ(idx.size(), 34u + 3 * 4 + 3 * 8 + 3 * 8);
  EXPECT_EQ(std::memcmp(idx.data(), "MMIDIDX\0\0", 9), 0);
  EXPECT_EQ(at<std::uint64_t>(idx, 9), 1u);            // version
  EXPECT_EQ(static_cast<std::uint8_t>(idx[17]), 8u);   // dtype code: uint16
  EXPECT_EQ(at<std::uint64_t>(idx, 18), 3u);           // sequence count
  EXPECT_EQ(at<std::uint64_t>(idx, 26), 3u);           // document index length = documents + 1
  EXPECT_EQ(at<std::int32_t>(idx, 34), 3);             // sequence lengths
  EXPECT_EQ(at<std::int32_t>(idx, 38), 1);
  EXPECT_EQ(at<std::int32_t>(idx, 42), 2);
  EXPECT_EQ(at<std::int64_t>(idx, 46), 0);             // byte pointers
  EXPECT_EQ(at<std::int64_t>(idx, 54), 6);
  EXPECT_EQ(at<std::int64_t>(idx, 62), 8);
  EXPECT_EQ(at<std::int64_t>(idx, 70), 0);             // document indices
  EXPECT_EQ(at<std::int64_t>(idx, 78), 2);
  EXPECT_EQ(at<std::int64_t>(idx, 86), 3);

  auto bin = read_bytes(prefix + ".bin");
  const std::vector<unsigned char> expected{10, 0, 11, 0, 12, 0, 13, 0, 0x2c, 0x01, 0xff, 0xff};
  ASSERT_EQ(bin.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(static_cast<unsigned char>(bin[i]), expected[i]) << i;
}

TEST(IndexedDataset, ReadsAHandWrittenMegatronFile) {
  // Bytes laid out by hand from the format description, not by the writer.
  TempDir dir;
  std::string prefix = dir / "hand";
  std::vector<char> idx(34 + 2 * 4 + 2 * 8 + 2 * 8);
  std::memcpy(idx.data(), "MMIDIDX\0\0", 9);
  put<std::uint64_t>(idx, 9, 1);
  idx[17] = 4;  // int32
  put<std::uint64_t>(idx, 18, 2);
  put<std::uint64_t>(idx, 26, 2);
  put<std::int32_t>(idx, 34, 2);
  put<std::int32_t>(idx, 38, 1);
  put<std::int64_t>(idx, 42, 0);
  put<std::int64_t>(idx, 50, 8);
  put<std::int64_t>(idx, 58, 0);
  put<std::int64_t>(idx, 66, 2);
  write_bytes(prefix + ".idx", idx);
  std::vector<char> bin(12);
  put<std::int32_t>(bin, 0, 7);
  put<std::int32_t>(bin, 4, -3);
  put<std::int32_t>(bin, 8, 100000);
  write_bytes(prefix + ".bin", bin);
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.dtype(), DType::int32);
  EXPECT_EQ(ds.document_count(), 1);
  EXPECT_EQ(ds.get(0), (std::vector<std::int32_t>{7, -3}));
  EXPECT_EQ(ds.get(1), (std::vector<std::int32_t>{100000}));
}

TEST(IndexedDataset, CorruptFilesThrowFileErrorNamingFileAndProblem) {
  TempDir dir;
  const std::string prefix = small_dataset(dir);
  const auto good_idx = read_bytes(prefix + ".idx");
  const auto good_bin = read_bytes(prefix + ".bin");
  const std::string idx_name = prefix + ".idx", bin_name = prefix + ".bin";
  auto open = [&] { IndexedDataset ds(prefix); };
  auto with_idx = [&](std::vector<char> bytes, const std::vector<std::string>& parts) {
    write_bytes(idx_name, bytes);
    write_bytes(bin_name, good_bin);
    expect_file_error(open, parts);
  };
  ASSERT_NO_THROW(open());

  auto bad_magic = good_idx;
  bad_magic[0] = 'X';
  with_idx(bad_magic, {idx_name, "bad magic"});

  auto bad_version = good_idx;
  put<std::uint64_t>(bad_version, 9, 2);
  with_idx(bad_version, {idx_name, "unsupported version 2"});

  auto bad_dtype = good_idx;
  bad_dtype[17] = 9;
  with_idx(bad_dtype, {idx_name, "bad dtype code 9"});
  bad_dtype[17] = 0;
  with_idx(bad_dtype, {idx_name, "bad dtype code 0"});

  with_idx(std::vector<char>(good_idx.begin(), good_idx.begin() + 20), {idx_name, "truncated", "header"});
  with_idx(std::vector<char>(good_idx.begin(), good_idx.end() - 5), {idx_name, "truncated"});

  auto huge_count = good_idx;
  put<std::uint64_t>(huge_count, 18, ~std::uint64_t{0});
  with_idx(huge_count, {idx_name, "truncated"});

  auto non_monotone = good_idx;  // document indices at 34 + 12*3 = 70: {0, 2, 3} -> {0, 3, 2}... keep ends valid
  put<std::int64_t>(non_monotone, 70 + 8, 5);
  put<std::int64_t>(non_monotone, 70 + 16, 3);
  with_idx(non_monotone, {idx_name, "not monotone"});

  auto bad_start = good_idx;
  put<std::int64_t>(bad_start, 70, 1);
  with_idx(bad_start, {idx_name, "starts at 1"});

  auto bad_end = good_idx;
  put<std::int64_t>(bad_end, 70 + 16, 2);
  with_idx(bad_end, {idx_name, "ends at 2"});

  auto bad_pointer = good_idx;  // pointers at 34 + 4*3 = 46
  put<std::int64_t>(bad_pointer, 54, 3);
  with_idx(bad_pointer, {idx_name, "pointer 3"});

  // .bin shorter than the pointers say.
  write_bytes(idx_name, good_idx);
  write_bytes(bin_name, std::vector<char>(good_bin.begin(), good_bin.end() - 4));
  expect_file_error(open, {bin_name, "too short", "sequence 2"});

  // Missing files.
  fs::remove(bin_name);
  expect_file_error(open, {bin_name, "cannot open", "No such file"});
  fs::remove(idx_name);
  expect_file_error(open, {idx_name, "cannot open", "No such file"});
}

// A FIFO or a device named as the .idx or the .bin is refused before anything can block on it.
TEST(IndexedDataset, FifoOrDeviceAsIdxOrBinIsRefusedWithoutBlocking) {
  TempDir dir;
  const std::string prefix = small_dataset(dir);
  for (const char* ext : {".idx", ".bin"}) {
    const std::string file = prefix + ext, saved = prefix + ext + ".saved";
    fs::rename(file, saved);
    ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
    expect_fifo_refused(file, [&] { IndexedDataset d(prefix); }, {file, "FIFO", "not a regular file"});
    fs::remove(file);
    fs::create_symlink("/dev/zero", file);
    expect_file_error([&] { IndexedDataset d(prefix); }, {file, "character device"});
    fs::remove(file);
    fs::create_directory(file);
    expect_file_error([&] { IndexedDataset d(prefix); }, {file, "directory"});
    fs::remove(file);
    fs::rename(saved, file);
  }
  EXPECT_EQ(IndexedDataset(prefix).size(), 3);
}

TEST(IndexedDataset, EveryBitFlipInTheIndexIsReadOrRefusedNeverACrash) {
  TempDir dir;
  const std::string prefix = small_dataset(dir);
  const auto good = read_bytes(prefix + ".idx");
  int refused = 0;
  for (std::size_t byte = 0; byte < good.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      auto bytes = good;
      bytes[byte] = static_cast<char>(bytes[byte] ^ (1 << bit));
      write_bytes(prefix + ".idx", bytes);
      try {
        IndexedDataset ds(prefix);
        for (std::int64_t i = 0; i < ds.size(); ++i) (void)ds.get(i);  // whatever was accepted is readable
      } catch (const FileError& e) {
        ++refused;
        EXPECT_NE(std::string(e.what()).find(prefix), std::string::npos);
      }
    }
  }
  EXPECT_GT(refused, 0);
}

// ---------------------------------------------------------------------------------------------
// llm.c shards

TEST(LlmcShard, RoundTripAndHeader) {
  TempDir dir;
  std::vector<std::int32_t> tokens{50256, 1, 2, 65535, 0, 42};
  write_llmc_shard(dir / "shard.bin", tokens);
  auto bytes = read_bytes(dir / "shard.bin");
  ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
  EXPECT_EQ(at<std::int32_t>(bytes, 0), 20240520);
  EXPECT_EQ(at<std::int32_t>(bytes, 4), 1);
  EXPECT_EQ(at<std::int32_t>(bytes, 8), 6);
  for (std::size_t i = 3; i < 256; ++i) EXPECT_EQ(at<std::int32_t>(bytes, 4 * i), 0);
  LlmcShard shard(dir / "shard.bin");
  ASSERT_EQ(shard.size(), 6);
  for (std::size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(shard.tokens()[i], tokens[i]);
  EXPECT_THROW(write_llmc_shard(dir / "bad.bin", std::vector<std::int32_t>{70000}), ConfigError);
}

TEST(LlmcShard, CorruptFiles) {
  TempDir dir;
  const std::string path = dir / "shard.bin";
  write_llmc_shard(path, std::vector<std::uint16_t>{1, 2, 3});
  const auto good = read_bytes(path);
  auto open = [&] { LlmcShard shard(path); };
  auto bad = good;
  put<std::int32_t>(bad, 0, 1234);
  write_bytes(path, bad);
  expect_file_error(open, {path, "bad magic 1234"});
  bad = good;
  put<std::int32_t>(bad, 4, 7);
  write_bytes(path, bad);
  expect_file_error(open, {path, "unsupported version 7"});
  write_bytes(path, std::vector<char>(good.begin(), good.end() - 1));
  expect_file_error(open, {path, "truncated"});
  write_bytes(path, std::vector<char>(good.begin(), good.begin() + 100));
  expect_file_error(open, {path, "truncated", "header"});
  auto longer = good;
  longer.push_back(0);
  longer.push_back(0);
  write_bytes(path, longer);
  expect_file_error(open, {path, "size mismatch"});
  fs::remove(path);
  expect_file_error(open, {path, "cannot open"});
}

// ---------------------------------------------------------------------------------------------
// Tokenizer and the preprocessing tool

TEST(ByteTokenizer, RoundTrip) {
  std::string text = "Hello, \xc3\xa9t\xc3\xa9!\n\t\x01\xff";
  auto tokens = ByteTokenizer::encode(text);
  ASSERT_EQ(tokens.size(), text.size());
  EXPECT_EQ(tokens[0], 'H');
  EXPECT_EQ(tokens.back(), 255);
  EXPECT_EQ(ByteTokenizer::decode(tokens), text);
  tokens.push_back(ByteTokenizer::kEod);
  EXPECT_EQ(ByteTokenizer::decode(tokens), text);
  EXPECT_EQ(ByteTokenizer::decode(tokens, "<eod>"), text + "<eod>");
  EXPECT_EQ(ByteTokenizer::vocab_size(), 257);
  EXPECT_THROW(ByteTokenizer::decode(std::vector<std::int32_t>{257}), ConfigError);
}

#ifdef STRATA_PREPROCESS_DATA
namespace {
int run_tool(const std::string& args) {
  std::string command = std::string("\"") + STRATA_PREPROCESS_DATA + "\" " + args + " > /dev/null 2>&1";
  return std::system(command.c_str());
}
}  // namespace

TEST(PreprocessData, PlainTextParagraphsTokenForToken) {
  TempDir dir;
  const std::vector<std::string> paragraphs{"First paragraph,\nover two lines.", "Second \xe2\x80\x94 one line.",
                                            "Third.\nWith\nthree lines"};
  write_text(dir / "in.txt", "\n\n" + paragraphs[0] + "\r\n\r\n \n" + paragraphs[1] + "\n\n\n" + paragraphs[2]);
  ASSERT_EQ(run_tool("--input " + (dir / "in.txt") + " --output-prefix " + (dir / "out") + " --append-eod"), 0);
  IndexedDataset ds(dir / "out_text_document");
  EXPECT_EQ(ds.dtype(), DType::uint16);
  ASSERT_EQ(ds.document_count(), 3);
  ASSERT_EQ(ds.sequence_count(), 3);
  for (std::size_t i = 0; i < paragraphs.size(); ++i) {
    auto expected = ByteTokenizer::encode(paragraphs[i]);
    expected.push_back(ByteTokenizer::kEod);
    EXPECT_EQ(ds.get(static_cast<std::int64_t>(i)), expected) << i;
  }
  // Without EOD, int32.
  ASSERT_EQ(run_tool("--input " + (dir / "in.txt") + " --output-prefix " + (dir / "noeod") + " --dtype int32"), 0);
  IndexedDataset plain(dir / "noeod_text_document");
  EXPECT_EQ(plain.dtype(), DType::int32);
  EXPECT_EQ(plain.get(1), ByteTokenizer::encode(paragraphs[1]));
}

TEST(PreprocessData, JsonLinesWithEscapes) {
  TempDir dir;
  write_text(dir / "in.jsonl",
             "{\"id\": 1, \"meta\": {\"a\": [1, 2, {\"b\": \"x\\\"}\"}]}, \"text\": \"line one\\nquote \\\" back \\\\ "
             "e\\u00e9 g\\u00DF snake \\ud83d\\udc0d tab\\t/\\/\"}\n"
             "\n"
             "{\"text\": \"second\", \"other\": null}\n");
  ASSERT_EQ(run_tool("--input " + (dir / "in.jsonl") + " --json-keys text --output-prefix " + (dir / "j") + " --append-eod"), 0);
  IndexedDataset ds(dir / "j_text_document");
  ASSERT_EQ(ds.document_count(), 2);
  auto expected = ByteTokenizer::encode("line one\nquote \" back \\ e\xc3\xa9 g\xc3\x9f snake \xf0\x9f\x90\x8d tab\t//");
  expected.push_back(ByteTokenizer::kEod);
  EXPECT_EQ(ds.get(0), expected);
  EXPECT_EQ(ByteTokenizer::decode(ds.get(1)), "second");
  // An unterminated object is refused with its line number, even though its key came first.
  write_text(dir / "open.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"abc\"\n");
  const std::string log = dir / "open.log";
  EXPECT_NE(std::system(("\"" + std::string(STRATA_PREPROCESS_DATA) + "\" --input " + (dir / "open.jsonl") + " --output-prefix " +
                         (dir / "open") + " > " + log + " 2>&1")
                            .c_str()),
            0);
  std::ifstream log_in(log);
  const std::string message((std::istreambuf_iterator<char>(log_in)), {});
  EXPECT_NE(message.find("line 2"), std::string::npos) << message;
  EXPECT_NE(message.find("not closed"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(dir / "open_text_document.bin"));
  write_text(dir / "trailing.jsonl", "{\"text\": \"abc\"} x\n");
  EXPECT_NE(run_tool("--input " + (dir / "trailing.jsonl") + " --output-prefix " + (dir / "trailing")), 0);
  // A line without the key is an error naming the file and line.
  write_text(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
  EXPECT_NE(run_tool("--input " + (dir / "bad.jsonl") + " --output-prefix " + (dir / "bad")), 0);
  EXPECT_FALSE(fs::exists(dir / "bad_text_document.bin"));
}
#endif

// The shipped corpus: its .bin/.idx are the tool's output for the shipped text.
TEST(ShippedCorpus, MatchesItsText) {
  const std::string dir = STRATA_EXAMPLES_DATA_DIR;
  IndexedDataset ds(dir + "/corpus_text_document");
  std::ifstream in(dir + "/kjv_pentateuch.txt", std::ios::binary);
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::vector<std::string> paragraphs;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find("\n\n", begin);
    if (end == std::string::npos) end = text.size();
    std::string p = text.substr(begin, end - begin);
    while (!p.empty() && p.back() == '\n') p.pop_back();
    if (!p.empty()) paragraphs.push_back(p);
    begin = end + 2;
  }
  ASSERT_EQ(ds.document_count(), static_cast<std::int64_t>(paragraphs.size()));
  EXPECT_EQ(ds.document_count(), 187);  // the chapters of Genesis .. Deuteronomy
  for (std::size_t i = 0; i < paragraphs.size(); ++i) {
    auto expected = ByteTokenizer::encode(paragraphs[i]);
    expected.push_back(ByteTokenizer::kEod);
    ASSERT_EQ(ds.get(static_cast<std::int64_t>(i)), expected) << "chapter " << i;
  }
}

// ---------------------------------------------------------------------------------------------
// GPT sample index

namespace {
// The tokens of sample `unshuffled` straight from the index arrays.
std::vector<std::int32_t> tokens_of(const GptSampleIndex& index, const std::vector<std::vector<std::int32_t>>& docs,
                                    std::int64_t unshuffled) {
  std::vector<std::int32_t> stream;
  auto [fp, fo] = index.start(unshuffled);
  auto [lp, lo] = index.start(unshuffled + 1);
  for (std::int64_t p = fp; p <= lp; ++p) {
    const auto& d = docs[static_cast<std::size_t>(index.document_index[static_cast<std::size_t>(p)])];
    std::int64_t b = p == fp ? fo : 0, e = p == lp ? lo + 1 : static_cast<std::int64_t>(d.size());
    stream.insert(stream.end(), d.begin() + b, d.begin() + e);
  }
  return stream;
}
std::vector<std::int32_t> lengths_of(const std::vector<std::vector<std::int32_t>>& docs) {
  std::vector<std::int32_t> lengths;
  for (const auto& d : docs) lengths.push_back(static_cast<std::int32_t>(d.size()));
  return lengths;
}
}  // namespace

TEST(GptSampleIndex, SamplesHaveSeqLengthPlusOneTokensAndCoverTheEpoch) {
  auto docs = random_documents(40, 30, 1000, 3);
  docs[5].clear();  // an empty document is skipped over
  const auto lengths = lengths_of(docs);
  const std::int64_t T = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
  for (std::int64_t S : {1, 7, 16, 64}) {
    GptDatasetConfig config{.seq_length = S, .num_samples = -1, .seed = 5};
    auto index = build_gpt_sample_index(lengths, config);
    SCOPED_TRACE(S);
    EXPECT_EQ(index.num_epochs, 1);
    EXPECT_EQ(index.size(), (T - 1) / S);
    // The document index is a permutation of the documents.
    auto sorted = index.document_index;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(sorted[i], static_cast<std::int64_t>(i));
    // Samples in order, minus their shared token, are the epoch's token stream.
    std::vector<std::int32_t> stream;
    for (std::int64_t d : index.document_index) stream.insert(stream.end(), docs[d].begin(), docs[d].end());
    std::vector<std::int32_t> covered;
    for (std::int64_t s = 0; s < index.size(); ++s) {
      auto t = tokens_of(index, docs, s);
      ASSERT_EQ(static_cast<std::int64_t>(t.size()), S + 1) << "sample " << s;
      covered.insert(covered.end(), t.begin(), t.end() - 1);
    }
    covered.push_back(tokens_of(index, docs, index.size() - 1).back());
    ASSERT_EQ(static_cast<std::int64_t>(covered.size()), index.size() * S + 1);
    EXPECT_TRUE(std::equal(covered.begin(), covered.end(), stream.begin()));
    EXPECT_LT(T - static_cast<std::int64_t>(covered.size()), S);  // less than one sample is dropped
    // The shuffle index is a permutation of the samples.
    auto shuffled = index.shuffle_index;
    std::sort(shuffled.begin(), shuffled.end());
    for (std::size_t i = 0; i < shuffled.size(); ++i) EXPECT_EQ(shuffled[i], static_cast<std::int64_t>(i));
  }
}

TEST(GptSampleIndex, DeterministicForASeedDifferentForAnother) {
  const auto lengths = lengths_of(random_documents(50, 40, 10, 4));
  GptDatasetConfig config{.seq_length = 8, .num_samples = 300, .seed = 42};
  auto a = build_gpt_sample_index(lengths, config);
  auto b = build_gpt_sample_index(lengths, config);
  EXPECT_EQ(a.document_index, b.document_index);
  EXPECT_EQ(a.sample_index, b.sample_index);
  EXPECT_EQ(a.shuffle_index, b.shuffle_index);
  config.seed = 43;
  auto c = build_gpt_sample_index(lengths, config);
  EXPECT_NE(a.document_index, c.document_index);
  EXPECT_NE(a.shuffle_index, c.shuffle_index);
  config.shuffle = false;
  auto plain = build_gpt_sample_index(lengths, config);
  for (std::size_t i = 0; i < plain.shuffle_index.size(); ++i) EXPECT_EQ(plain.shuffle_index[i], static_cast<std::int64_t>(i));
}

TEST(GptSampleIndex, EpochsFromRequestedSamples) {
  // 10 documents of 10 tokens: 100 tokens per epoch; seq_length 9 -> 11 samples per epoch.
  std::vector<std::int32_t> lengths(10, 10);
  EXPECT_EQ(gpt_num_epochs(100, 9, 11), 1);   // 11*9 + 1 = 100 tokens
  EXPECT_EQ(gpt_num_epochs(100, 9, 12), 2);
  EXPECT_EQ(gpt_num_epochs(100, 9, 22), 2);   // 199 tokens
  EXPECT_EQ(gpt_num_epochs(100, 9, 23), 3);
  GptDatasetConfig config{.seq_length = 9, .num_samples = 23, .seed = 1};
  auto index = build_gpt_sample_index(lengths, config);
  EXPECT_EQ(index.num_epochs, 3);
  EXPECT_EQ(index.size(), (300 - 1) / 9);
  EXPECT_GE(index.size(), 23);
  // Each epoch visits each document once.
  for (std::int64_t e = 0; e < 3; ++e) {
    std::vector<std::int64_t> epoch(index.document_index.begin() + 10 * e, index.document_index.begin() + 10 * (e + 1));
    std::sort(epoch.begin(), epoch.end());
    for (std::int64_t d = 0; d < 10; ++d) EXPECT_EQ(epoch[static_cast<std::size_t>(d)], d);
  }
  // 23 - 22 = 1 sample from the third epoch (< 80% of 11): its samples are shuffled apart, after
  // all 22 samples of the first two epochs.
  EXPECT_TRUE(index.separate_final_epoch);
  std::vector<std::int64_t> head(index.shuffle_index.begin(), index.shuffle_index.begin() + 22);
  std::sort(head.begin(), head.end());
  for (std::int64_t i = 0; i < 22; ++i) EXPECT_EQ(head[static_cast<std::size_t>(i)], i);
  EXPECT_THROW(build_gpt_sample_index(std::vector<std::int32_t>{3}, GptDatasetConfig{.seq_length = 3}), ConfigError);
}

TEST(GptDataset, SamplesMatchTheIndexAndBatchesShiftLabels) {
  TempDir dir;
  auto docs = random_documents(30, 25, 200, 9);
  for (auto& d : docs) d.push_back(ByteTokenizer::kEod);
  auto indexed = write_dataset(dir / "gpt", docs);
  GptDataset ds(indexed, GptDatasetConfig{.seq_length = 12, .num_samples = 100, .seed = 3});
  EXPECT_GE(ds.size(), 100);
  for (std::int64_t i = 0; i < ds.size(); ++i)
    ASSERT_EQ(ds.sample(i), tokens_of(ds.index(), docs, ds.index().shuffle_index[static_cast<std::size_t>(i)]));

  const std::int64_t mbs = 4, k = 3;
  Batch batch = micro_batch(ds, k, mbs, BatchOptions{.eod_token = ByteTokenizer::kEod, .eod_mask_loss = true});
  EXPECT_EQ(batch.tokens.shape(), (strata::Shape{mbs, 12}));
  EXPECT_EQ(batch.labels.shape(), (strata::Shape{mbs, 12}));
  EXPECT_EQ(batch.loss_mask.shape(), (strata::Shape{mbs, 12}));
  int masked = 0;
  for (std::int64_t b = 0; b < mbs; ++b) {
    auto s = ds.sample(k * mbs + b);
    for (std::int64_t t = 0; t < 12; ++t) {
      EXPECT_EQ(batch.tokens[b * 12 + t], s[static_cast<std::size_t>(t)]);
      EXPECT_EQ(batch.labels[b * 12 + t], s[static_cast<std::size_t>(t + 1)]);
      const bool eod = s[static_cast<std::size_t>(t)] == ByteTokenizer::kEod;
      EXPECT_EQ(batch.loss_mask[b * 12 + t], eod ? 0.0f : 1.0f);
      masked += eod;
    }
  }
  EXPECT_GT(masked, 0);
  Batch plain = make_batch(ds, 0, 2);
  for (std::int64_t i = 0; i < plain.loss_mask.numel(); ++i) EXPECT_EQ(plain.loss_mask[i], 1.0f);
  EXPECT_THROW(make_batch(ds, ds.size() - 1, 2), ConfigError);
  EXPECT_EQ(micro_batch_first_sample(64, 4, 1, 2, 3), 64 + (3 * 2 + 1) * 4);
}

TEST(GptDataset, Splits) {
  auto w = parse_split("969,30,1");
  ASSERT_EQ(w.size(), 3u);
  EXPECT_NEAR(w[0], 0.969, 1e-12);
  auto bounds = split_bounds(1000, w);
  EXPECT_EQ(bounds, (std::vector<std::int64_t>{0, 969, 999, 1000}));
  auto b2 = split_bounds(7, parse_split("1,1,1"));
  EXPECT_EQ(b2.front(), 0);
  EXPECT_EQ(b2.back(), 7);
  EXPECT_THROW(parse_split("9,x,1"), ConfigError);
}

// As Megatron: at most three weights, each finite and non-negative, with a finite positive sum.
TEST(GptDataset, SplitRefusesNonFiniteOverflowingOrMoreThanThreeWeights) {
  auto expect_refused = [](const std::string& split, const std::string& part) {
    try {
      parse_split(split);
      ADD_FAILURE() << "--split " << split << " accepted";
    } catch (const ConfigError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("--split"), std::string::npos) << message;
      EXPECT_NE(message.find(part), std::string::npos) << message;
    }
  };
  expect_refused("nan,1,1", "'nan' is not a finite non-negative number");
  expect_refused("inf,1,0", "'inf' is not a finite non-negative number");
  expect_refused("1,-inf,0", "'-inf'");
  expect_refused("1e308,1e308,0", "sum to more than a double can hold");
  expect_refused("1,2,3,4", "4 weights");
  expect_refused("0,0,0", "sum to 0");
  EXPECT_EQ(parse_split("1e300,0,1e300")[0], 0.5);
}

// ---------------------------------------------------------------------------------------------
// Blending

TEST(Blending, GreedyRuleOnAHandComputedExample) {
  // weights 0.3 / 0.7, x = max(s, 1):
  //   s=0: e = (0.3, 0.7) -> 1      s=1: (0.3, -0.3) -> 0     s=2: (-0.4, 0.4) -> 1
  //   s=3: (-0.1, 0.1) -> 1         s=4: (0.2, -0.2) -> 0
  auto index = build_blending_indices(std::vector<double>{3, 7}, 5);  // normalized inside
  EXPECT_EQ(index.dataset_index, (std::vector<std::int16_t>{1, 0, 1, 1, 0}));
  EXPECT_EQ(index.dataset_sample_index, (std::vector<std::int64_t>{0, 0, 1, 2, 1}));
  // A tie goes to the lowest index.
  auto even = build_blending_indices(std::vector<double>{1, 1}, 4);
  EXPECT_EQ(even.dataset_index, (std::vector<std::int16_t>{0, 1, 0, 1}));
}

TEST(Blending, ProportionsWithinTolerance) {
  const std::vector<double> weights{0.2, 0.5, 0.3};
  const std::int64_t n = 10000;
  auto index = build_blending_indices(weights, n);
  std::vector<std::int64_t> counts(3, 0);
  for (std::int64_t s = 0; s < n; ++s) {
    auto d = static_cast<std::size_t>(index.dataset_index[static_cast<std::size_t>(s)]);
    EXPECT_EQ(index.dataset_sample_index[static_cast<std::size_t>(s)], counts[d]);
    ++counts[d];
    for (std::size_t i = 0; i < 3; ++i)  // every prefix stays within two samples of its target
      ASSERT_LE(std::abs(static_cast<double>(counts[i]) - weights[i] * static_cast<double>(s + 1)), 2.0);
  }
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(static_cast<double>(counts[i]) / n, weights[i], 1e-3);
  auto sizes = blend_component_sizes(weights, n);
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{2010, 5025, 3015}));
}

TEST(Blending, ParseDataPath) {
  auto single = parse_data_path("data/corpus_text_document");
  EXPECT_EQ(single.prefixes, (std::vector<std::string>{"data/corpus_text_document"}));
  EXPECT_EQ(single.weights, (std::vector<double>{1.0}));
  auto pairs = parse_data_path(" 0.3 pathA   0.7 pathB ");
  EXPECT_EQ(pairs.prefixes, (std::vector<std::string>{"pathA", "pathB"}));
  EXPECT_EQ(pairs.weights, (std::vector<double>{0.3, 0.7}));
  auto unweighted = parse_data_path("pathA pathB");
  EXPECT_EQ(unweighted.prefixes.size(), 2u);
  EXPECT_TRUE(unweighted.weights.empty());
  EXPECT_THROW(parse_data_path("0.3 pathA 0.7"), ConfigError);
  EXPECT_THROW(parse_data_path("pathA 0.3 pathB 0.7"), ConfigError);
  EXPECT_THROW(parse_data_path("-1 pathA 2 pathB"), ConfigError);
  EXPECT_THROW(parse_data_path(""), ConfigError);
}

TEST(Blending, BlendedGptDatasetServesFromItsParts) {
  TempDir dir;
  auto docs_a = random_documents(20, 30, 100, 1);
  auto docs_b = random_documents(20, 30, 100, 2);
  for (auto& d : docs_b)
    for (auto& t : d) t += 100;  // tells the two apart
  write_dataset(dir / "a", docs_a);
  write_dataset(dir / "b", docs_b);
  auto blend = build_blended_gpt_dataset("0.25 " + (dir / "a") + " 0.75 " + (dir / "b"), GptDatasetConfig{.seq_length = 8, .seed = 11}, 200);
  ASSERT_EQ(blend->size(), 200);
  EXPECT_EQ(blend->seq_length(), 8);
  int from_b = 0;
  for (std::int64_t s = 0; s < 200; ++s) {
    auto tokens = blend->sample(s);
    const auto d = blend->dataset_index()[static_cast<std::size_t>(s)];
    EXPECT_EQ(tokens, blend->dataset(static_cast<std::size_t>(d)).sample(blend->dataset_sample_index()[static_cast<std::size_t>(s)]));
    const bool is_b = std::all_of(tokens.begin(), tokens.end(), [](std::int32_t t) { return t >= 100; });
    EXPECT_EQ(is_b, d == 1);
    from_b += is_b;
  }
  EXPECT_EQ(from_b, 150);
  Batch batch = make_batch(*blend, 8, 4);
  EXPECT_EQ(batch.tokens.shape(), (strata::Shape{4, 8}));
  // A part too small for its share is refused with a clear error.
  auto small = std::make_shared<const GptDataset>(std::make_shared<const IndexedDataset>(dir / "a"),
                                                  GptDatasetConfig{.seq_length = 8, .seed = 1});
  EXPECT_THROW((BlendedDataset<GptDataset>({small}, {1.0}, small->size() + 1)), ConfigError);
}

// Non-finite or overflowing blend weights are refused naming them (never "sum to 0").
TEST(Blending, NonFiniteOrOverflowingWeightsAreRefusedNamingThem) {
  const std::string prefix = std::string(STRATA_EXAMPLES_DATA_DIR) + "/corpus_text_document";
  auto expect_refused = [&](const std::string& data_path, const std::string& part) {
    try {
      build_blended_gpt_dataset(data_path, GptDatasetConfig{64, 20, 1234, true}, 20);
      ADD_FAILURE() << "--data-path " << data_path << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_refused("1e308 " + prefix + " 1e308 " + prefix, "1e+308 1e+308 sum to more than a double can hold");
  expect_refused("nan " + prefix + " 1 " + prefix, "weight 'nan'");
  expect_refused("inf " + prefix + " 1 " + prefix, "weight 'inf'");
  EXPECT_THROW(normalize_weights(std::vector<double>{1e308, 1e308}), ConfigError);
}

// An empty dataset is named as empty, not blamed on --split.
TEST(Blending, EmptyDatasetIsNamedNotBlamedOnTheSplit) {
  TempDir dir;
  const std::string prefix = dir / "empty";
  IndexedDatasetWriter w(prefix, DType::uint16);
  w.finalize();
  for (const auto& split : {std::vector<double>{}, parse_split("969,30,1")}) {
    try {
      build_blended_gpt_dataset(prefix, GptDatasetConfig{8, 4, 1234, true}, 4, split, 0);
      ADD_FAILURE() << "an empty dataset accepted";
    } catch (const FileError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(prefix), std::string::npos) << message;
      EXPECT_NE(message.find("is empty"), std::string::npos) << message;
      EXPECT_EQ(message.find("--split"), std::string::npos) << message;
    }
  }
}

// A token at or above the vocabulary is reported with the .bin that holds it and the vocabulary size.
TEST(GptDataset, TokensOutsideTheVocabularyNameTheBinAndTheVocabularySize) {
  TempDir dir;
  const std::string prefix = dir / "oov";
  auto docs = random_documents(20, 30, 100, 7);
  docs[5][3] = 100;
  auto indexed = write_dataset(prefix, docs);
  GptDataset ds(indexed, GptDatasetConfig{16, 200, 1234, true, 100});
  std::vector<std::int32_t> out(17);
  try {
    for (std::int64_t i = 0; i < ds.size(); ++i) ds.sample(i, out);
    ADD_FAILURE() << "token 100 of a vocabulary of 100 accepted";
  } catch (const FileError& e) {
    const std::string message = e.what();
    for (const std::string& part : std::vector<std::string>{prefix + ".bin", "sequence 5", "token id 100", "vocabulary of 100", "--vocab-size"})
      EXPECT_NE(message.find(part), std::string::npos) << message;
  }
  GptDataset unchecked(indexed, GptDatasetConfig{16, 200, 1234, true});
  for (std::int64_t i = 0; i < unchecked.size(); ++i) unchecked.sample(i, out);
}

// Megatron's --mock-data: documents 1, 2, ..., n-1 (modulo the vocabulary) and the end of document,
// n in [1, 4096), sampled like a real dataset; the split parts draw on disjoint documents.
TEST(MockGptDataset, DocumentsAreCountingSequencesEndingInTheEndOfDocument) {
  const std::int64_t vocab = 1000, eod = 999;
  const MockGptDataset train(GptDatasetConfig{64, 500, 1234, true}, vocab, eod, parse_split("969,30,1"), 0);
  const MockGptDataset valid(GptDatasetConfig{64, 50, 1234, true}, vocab, eod, parse_split("969,30,1"), 1);
  EXPECT_GE(train.size(), 500);
  std::int64_t longest = 0;
  for (std::int64_t d = 0; d < MockGptDataset::kDocuments; ++d) {
    const std::int32_t n = train.document_length(d);
    ASSERT_GE(n, 1);
    ASSERT_LT(n, 4096);
    longest = std::max<std::int64_t>(longest, n);
  }
  EXPECT_GT(longest, 4000);
  EXPECT_EQ(train.token(7, train.document_length(7) - 1), eod);
  if (train.document_length(7) > 1) {
    EXPECT_EQ(train.token(7, 0), 1);
  }
  EXPECT_EQ(train.token(0, 1499), train.document_length(0) == 1500 ? eod : 1500 % vocab);
  // Every sample follows the counting rule: each token is the previous + 1 (mod vocab), or the
  // end of document, or the 1 that starts the next document.
  std::vector<std::int32_t> out(65);
  std::int64_t ends = 0;
  for (std::int64_t i = 0; i < 200; ++i) {
    train.sample(i, out);
    for (std::size_t k = 1; k < out.size(); ++k) {
      const bool counts = out[k] == (out[k - 1] + 1) % vocab, ends_here = out[k] == eod, starts = out[k - 1] == eod && out[k] == 1;
      EXPECT_TRUE(counts || ends_here || starts || (out[k - 1] == eod && out[k] == eod)) << "sample " << i << " position " << k;
      ends += ends_here ? 1 : 0;
    }
  }
  EXPECT_GT(ends, 0);
  valid.sample(0, out);
  EXPECT_THROW(MockGptDataset(GptDatasetConfig{64, 50, 1234, true}, vocab, eod, parse_split("1,0,0"), 1), ConfigError);
}

TEST(Blending, SplitPartsUseDisjointSequences) {
  // --split 969,30,1 over the shipped corpus: training samples come only from the first 96.9% of
  // the sequences, validation samples only from the next 3%.
  const std::string prefix = std::string(STRATA_EXAMPLES_DATA_DIR) + "/corpus_text_document";
  const std::vector<double> split = parse_split("969,30,1");
  auto train = build_blended_gpt_dataset(prefix, GptDatasetConfig{64, 200, 1234, true}, 200, split, 0);
  auto valid = build_blended_gpt_dataset(prefix, GptDatasetConfig{64, 20, 1234, true}, 20, split, 1);
  const auto bounds = split_bounds(train->dataset(0).indexed_dataset().size(), split);
  for (std::int64_t d : train->dataset(0).index().document_index) {
    EXPECT_GE(d, bounds[0]);
    EXPECT_LT(d, bounds[1]);
  }
  for (std::int64_t d : valid->dataset(0).index().document_index) {
    EXPECT_GE(d, bounds[1]);
    EXPECT_LT(d, bounds[2]);
  }
  EXPECT_THROW(build_blended_gpt_dataset(prefix, GptDatasetConfig{64, 20, 1234, true}, 20, parse_split("100,0,0"), 1),
               ConfigError);
}
