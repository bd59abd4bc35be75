// The GEMM tuning table's file (backend/cuda/gemm_tuning.hpp; no GPU needed): choices written and
// read back word for word, a file kept complete after every record, another platform refused, and
// damaged files refused with the file and line named.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <strata/backend/cuda/gemm_tuning.hpp>

#include "../checkpoint/temp_directory.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_gemm_tuning_cases {

namespace {

using strata::cuda::gemm_tuning;
constexpr const char* kPlatform = "cublasLt 130100; NVIDIA H100 80GB HBM3, sm_90, 132 SMs";

gemm_tuning::choice sample_choice(std::uint64_t seed) {
  gemm_tuning::choice c;
  for (std::size_t i = 0; i < c.algorithm.size(); ++i) c.algorithm[i] = seed * 0x9e3779b97f4a7c15ull + i * 0xffffffffull;
  c.algorithm[7] = 0;  // a zero word, and a full one
  c.algorithm[6] = ~0ull;
  c.ms = 0.125 + static_cast<double>(seed);
  c.first_ms = 0.25 + static_cast<double>(seed);
  c.candidates = 16;
  return c;
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// Runs f and returns the FileError's message ("" when nothing was thrown).
template <class F>
std::string file_error(F&& f) {
  try {
    f();
  } catch (const strata::FileError& e) {
    return e.what();
  }
  return "";
}

TEST(GemmTuning, ChoicesRoundTripWordForWord) {
  strata_test::TempDirectory dir("gemm_tuning");
  const auto file = dir.path() / "h100.tuning";
  const std::string a = "types=14>14 ta=0 tb=1 m=32768 n=2304 k=768 accumulate=0 bias=1 addend=0 epilogue=none align=256,256,256";
  const std::string b = "types=14>0 ta=1 tb=0 m=768 n=2304 k=32768 accumulate=1 bias=0 addend=0 epilogue=none align=256,256,256";
  {
    gemm_tuning t(file);
    EXPECT_EQ(t.size(), 0u);
    EXPECT_FALSE(std::filesystem::exists(file)) << "an empty table writes nothing";
    t.bind(kPlatform);
    t.record(a, sample_choice(1));
    // The file is complete after each record: a second reader sees the first choice already.
    gemm_tuning reader(file);
    EXPECT_EQ(reader.size(), 1u);
    t.record(b, sample_choice(2));
    EXPECT_EQ(t.timed(), 2u);
    EXPECT_EQ(t.read_from_file(), 0u);
    EXPECT_DOUBLE_EQ(t.saved_ms(), 0.25);
  }
  gemm_tuning t(file);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.platform(), kPlatform);
  t.bind(kPlatform);
  for (const auto& [problem, seed] : {std::pair{a, 1}, std::pair{b, 2}}) {
    const auto found = t.find(problem);
    ASSERT_TRUE(found.has_value()) << problem;
    const auto expected = sample_choice(static_cast<std::uint64_t>(seed));
    EXPECT_EQ(found->algorithm, expected.algorithm);
    EXPECT_DOUBLE_EQ(found->ms, expected.ms);
    EXPECT_DOUBLE_EQ(found->first_ms, expected.first_ms);
    EXPECT_EQ(found->candidates, 16);
  }
  EXPECT_FALSE(t.find("types=14>14 ta=0 tb=0 m=1 n=1 k=1 accumulate=0 bias=0 addend=0 epilogue=none align=2,2,2"));
  EXPECT_EQ(t.timed(), 0u);
  EXPECT_EQ(t.read_from_file(), 2u);
  (void)t.find(a);  // counted once
  EXPECT_EQ(t.read_from_file(), 2u);
}

TEST(GemmTuning, AnotherPlatformIsRefused) {
  strata_test::TempDirectory dir("gemm_tuning");
  const auto file = dir.path() / "t.tuning";
  {
    gemm_tuning t(file);
    t.bind(kPlatform);
    t.record("p", sample_choice(3));
  }
  gemm_tuning t(file);
  const std::string message = file_error([&] { t.bind("cublasLt 130000; NVIDIA H200, sm_90, 132 SMs"); });
  EXPECT_NE(message.find(file.string()), std::string::npos) << message;
  EXPECT_NE(message.find("H200"), std::string::npos) << message;
  EXPECT_NE(message.find("Delete it"), std::string::npos) << message;
}

TEST(GemmTuning, DamagedFilesNameTheFileAndLine) {
  strata_test::TempDirectory dir("gemm_tuning");
  const auto file = dir.path() / "bad.tuning";
  const std::string head = std::string(gemm_tuning::kMagic) + "\nplatform " + kPlatform + "\n";
  const std::string good = "gemm m=1 algo 1 2 3 4 5 6 7 8 ms 0.5 0.6 of 4\n";
  const auto refused = [&](const std::string& text, const std::string& expected) {
    write_text(file, text);
    const std::string message = file_error([&] { gemm_tuning t(file); });
    EXPECT_NE(message.find(file.string()), std::string::npos) << "no file name in: " << message;
    EXPECT_NE(message.find(expected), std::string::npos) << "\"" << expected << "\" not in: " << message;
  };
  refused("a checkpoint, perhaps\n", "not a tuning file");
  refused("", "not a tuning file");
  refused(std::string(gemm_tuning::kMagic) + "\ngemm x algo 1 2 3 4 5 6 7 8 ms 1 1 of 1\n", "line 2");
  refused(head + good + "gemm m=2 algo 1 2 3 ms 0.5 0.6 of 4\n", "line 4: the algorithm is not 8 hexadecimal words");
  refused(head + "gemm m=2 algo 1 2 3 4 5 6 7 zz ms 0.5 0.6 of 4\n", "line 3: the algorithm");
  refused(head + "gemm m=2 algo 1 2 3 4 5 6 7 8 ms 0.5\n", "line 3: expected \"ms");
  refused(head + "gemm m=2 algo 1 2 3 4 5 6 7 8 ms 0.5 0.6 of 0\n", "line 3: expected \"ms");
  refused(head + "gemm m=2 algo 1 2 3 4 5 6 7 8 ms 0.5 0.6 of 4 more\n", "unexpected text \"more\"");
  refused(head + good + good, "line 4: problem \"m=1\" appears twice");
  refused(head + "m=2 algo 1 2 3 4 5 6 7 8 ms 0.5 0.6 of 4\n", "line 3: expected \"gemm");
  // A good file reads.
  write_text(file, head + good);
  gemm_tuning t(file);
  EXPECT_EQ(t.size(), 1u);
}

TEST(GemmTuning, RecordNeedsAPlatformFirst) {
  strata_test::TempDirectory dir("gemm_tuning");
  gemm_tuning t(dir.path() / "t.tuning");
  EXPECT_THROW(t.record("p", sample_choice(1)), strata::Error);
  EXPECT_THROW(t.bind(""), strata::Error);
  t.bind(kPlatform);
  EXPECT_THROW(t.record("two\nlines", sample_choice(1)), strata::Error);
}

}  // namespace
}  // namespace test_gemm_tuning_cases
