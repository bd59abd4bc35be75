// The safetensors reader and writer and the JSON reader under them: a round trip of every dtype
// (and the conversions between the floating types), the writer's determinism and alignment,
// partial reads, every malformed file rejected with a FileError naming the file and the tensor,
// and model directories (one file, or shards with an index).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <strata/checkpoint/json.hpp>
#include <strata/checkpoint/safetensors.hpp>

#include "expect_error.hpp"
#include "temp_directory.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_safetensors_cases {

namespace {

using namespace strata;
using strata_test::expect_error;
using strata_test::same_bytes;
using strata_test::TempDirectory;

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// ---- JSON ----

TEST(Json, ParsesEveryKindOfValue) {
  const json::Value v = json::parse(
      R"( {"a": [1, -2, 3.5, 1e3, 0, -0.25E-2], "b": {"c": null, "d": true, "e": false},
          "s": "q\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00x", "u": "h\u00e9 ☃"} )",
      "test");
  ASSERT_TRUE(v.is_object());
  const json::Value* a = v.find("a");
  ASSERT_TRUE(a && a->is_array());
  ASSERT_EQ(a->items().size(), 6u);
  std::int64_t i = 0;
  double d = 0;
  EXPECT_TRUE(a->items()[0].to_int64(i));
  EXPECT_EQ(i, 1);
  EXPECT_TRUE(a->items()[1].to_int64(i));
  EXPECT_EQ(i, -2);
  EXPECT_FALSE(a->items()[2].to_int64(i));  // 3.5 is not an integer
  EXPECT_TRUE(a->items()[2].to_double(d));
  EXPECT_EQ(d, 3.5);
  EXPECT_FALSE(a->items()[3].to_int64(i));  // 1e3: an exponent makes it a float
  EXPECT_TRUE(a->items()[3].to_double(d));
  EXPECT_EQ(d, 1000.0);
  EXPECT_TRUE(a->items()[5].to_double(d));
  EXPECT_EQ(d, -0.25e-2);
  std::uint64_t u = 0;
  EXPECT_FALSE(a->items()[1].to_uint64(u));  // negative
  EXPECT_TRUE(v.find("b")->find("c")->is_null());
  EXPECT_TRUE(v.find("b")->find("d")->boolean());
  EXPECT_FALSE(v.find("b")->find("e")->boolean());
  EXPECT_EQ(v.find("s")->text(), "q\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80x");
  EXPECT_EQ(v.find("u")->text(), "h\xc3\xa9 \xe2\x98\x83");
  EXPECT_EQ(v.find("missing"), nullptr);
  std::uint64_t big = 0;
  EXPECT_TRUE(json::parse("18446744073709551615", "t").to_uint64(big));
  EXPECT_EQ(big, 18446744073709551615ull);
  EXPECT_FALSE(json::parse("18446744073709551616", "t").to_uint64(big));  // does not fit
}

TEST(Json, RejectsWhatIsNotStrictJson) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"a\": 1,}", "expected a string as object key"},
      {"[1, 2,]", "unexpected character ']'"},
      {"{\"a\" 1}", "expected ':'"},
      {"{\"a\": 1", "ends inside an object"},
      {"[1 2]", "expected ',' or ']'"},
      {"01", "leading zero"},
      {"-", "without digits"},
      {"1.", "no digit after its '.'"},
      {"1e", "no digit in its exponent"},
      {"NaN", "unexpected character 'N'"},
      {"\"a\nb\"", "control character"},
      {"\"\\x\"", "unknown escape"},
      {"\"\\u12\"", "hex digit"},
      {"\"\\udc00\"", "lone low surrogate"},
      {"\"\\ud800x\"", "high surrogate"},
      {"\"\xff\"", "invalid UTF-8"},
      {"\"\xc0\xaf\"", "invalid UTF-8"},  // overlong
      {"\"abc", "ends inside a string"},
      {"{\"k\": 1, \"k\": 2}", "appears twice"},
      {"{} x", "unexpected text after the value"},
      {"", "ends where a value should start"},
      {"// c\n{}", "unexpected character '/'"},
      {std::string(100, '[') + std::string(100, ']'), "nesting deeper than 64"},
  };
  for (const auto& [text, why] : bad)
    expect_error<FileError>([&] { json::parse(text, "document X"); }, {"document X is not valid JSON", why});
}

TEST(Json, WritesStringsAndNumbersThatReadBack) {
  const std::string s = std::string("a\"b\\c\n\x01") + "\xc3\xa9";
  EXPECT_EQ(json::parse(json::quote(s), "t").text(), s);
  for (double x : {1e-5, 1e-6, 0.02, 10000.0, 500000.0, 1.0 / 3.0, -2.5e-300}) {
    double back = 0;
    ASSERT_TRUE(json::parse(json::number(x), "t").to_double(back));
    EXPECT_EQ(back, x);
  }
  EXPECT_EQ(json::number(10000.0), "10000.0");
  EXPECT_EQ(json::number(1e-5), "1e-05");
}

// ---- safetensors: round trips ----

template <class X>
Tensor<X> ramp(Shape shape, double scale, double offset) {
  Tensor<X> t(shape);
  for (index_t i = 0; i < t.numel(); ++i) t[i] = static_cast<X>(scale * static_cast<double>(i) + offset);
  return t;
}

TEST(Safetensors, RoundTripOfEveryDtype) {
  TempDirectory dir("safetensors");
  const auto f32 = ramp<float>(Shape{3, 5}, 0.37, -2.0);
  const auto f64 = ramp<double>(Shape{2, 3, 4}, 1e-3, 1.0 / 3.0);
  const auto b16 = ramp<bf16>(Shape{7}, 0.5, -1.25);
  const auto h16 = ramp<fp16>(Shape{1, 3}, 0.25, 0.125);
  const auto i32 = ramp<std::int32_t>(Shape{4}, -3, 7);
  const auto i64 = ramp<std::int64_t>(Shape{2, 2}, 1e12, -5);
  const auto u8 = ramp<std::uint8_t>(Shape{9}, 1, 200);
  const Tensor<float> scalar = ramp<float>(Shape{}, 0, 42.0);
  const Tensor<float> empty = Tensor<float>::zeros(Shape{0, 3});
  SafetensorsWriter w;
  w.add("f32", f32);
  w.add("f64", f64);
  w.add("b16", b16);
  w.add("h16", h16);
  w.add("i32", i32);
  w.add("i64", i64);
  w.add("u8", u8);
  w.add("scalar", scalar);
  w.add("empty", empty);
  w.add("f32.as_bf16", f32, SafetensorsDtype::bfloat16);
  w.add("f32.as_f16", f32, SafetensorsDtype::float16);
  w.add("f32.as_f64", f32, SafetensorsDtype::float64);
  w.add("f64.as_f32", f64, SafetensorsDtype::float32);
  w.set_metadata("format", "pt");
  w.set_metadata("note", "quote \" and newline \n");
  const auto path = dir.path() / "all.safetensors";
  w.write(path);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "all.safetensors.part"));

  const SafetensorsFile file(path);
  EXPECT_EQ(file.entries().size(), 13u);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "quote \" and newline \n");
  EXPECT_TRUE(same_bytes(file.read_tensor<float>("f32"), f32));
  EXPECT_TRUE(same_bytes(file.read_tensor<double>("f64"), f64));
  EXPECT_TRUE(same_bytes(file.read_tensor<bf16>("b16"), b16));
  EXPECT_TRUE(same_bytes(file.read_tensor<fp16>("h16"), h16));
  EXPECT_TRUE(same_bytes(file.read_tensor<std::int32_t>("i32"), i32));
  EXPECT_TRUE(same_bytes(file.read_tensor<std::int64_t>("i64"), i64));
  EXPECT_TRUE(same_bytes(file.read_tensor<std::uint8_t>("u8"), u8));
  EXPECT_EQ(file.read_tensor<float>("scalar").shape(), Shape{});
  EXPECT_EQ(file.read_tensor<float>("scalar")[0], 42.0f);
  EXPECT_EQ(file.read_tensor<float>("empty").shape(), (Shape{0, 3}));
  EXPECT_EQ(file.entry("f32").dtype, SafetensorsDtype::float32);
  EXPECT_EQ(file.entry("f32.as_bf16").dtype, SafetensorsDtype::bfloat16);
  EXPECT_EQ(file.entry("f64").shape, (std::vector<std::int64_t>{2, 3, 4}));

  // Conversions on write and on read: round to nearest even, through float for the 16-bit types.
  const auto as_bf16 = file.read_tensor<bf16>("f32.as_bf16");
  const auto as_f16 = file.read_tensor<fp16>("f32.as_f16");
  const auto f32_as_double = file.read_tensor<double>("f32");  // F32 -> double on read
  const auto f32_as_bf16 = file.read_tensor<bf16>("f32");      // F32 -> bf16 on read
  const auto bf16_as_float = file.read_tensor<float>("f32.as_bf16");
  for (index_t i = 0; i < f32.numel(); ++i) {
    EXPECT_EQ(as_bf16[i].bits, bf16(f32[i]).bits);
    EXPECT_EQ(as_f16[i].bits, fp16(f32[i]).bits);
    EXPECT_EQ(f32_as_double[i], static_cast<double>(f32[i]));
    EXPECT_EQ(f32_as_bf16[i].bits, bf16(f32[i]).bits);
    EXPECT_EQ(bf16_as_float[i], static_cast<float>(bf16(f32[i])));
  }
  const auto as_f64 = file.read_tensor<double>("f32.as_f64");
  const auto back_f32 = file.read_tensor<float>("f32.as_f64");
  EXPECT_TRUE(same_bytes(back_f32, f32));
  for (index_t i = 0; i < f32.numel(); ++i) EXPECT_EQ(as_f64[i], static_cast<double>(f32[i]));
  const auto f64_as_f32 = file.read_tensor<float>("f64.as_f32");
  for (index_t i = 0; i < f64.numel(); ++i) EXPECT_EQ(f64_as_f32[i], static_cast<float>(f64[i]));
}

TEST(Safetensors, WriterIsDeterministicSortedPaddedAndAligned) {
  TempDirectory dir("safetensors");
  const auto a = ramp<bf16>(Shape{3}, 1, 0);   // 6 bytes: would misalign a later float
  const auto b = ramp<float>(Shape{5}, 1, 0);
  const auto c = ramp<double>(Shape{1}, 1, 0);
  auto write = [&](const std::filesystem::path& path, bool reversed) {
    SafetensorsWriter w;
    if (reversed) {
      w.add("c", c);
      w.add("b", b);
      w.add("a", a);
    } else {
      w.add("a", a);
      w.add("b", b);
      w.add("c", c);
    }
    w.set_metadata("format", "pt");
    w.write(path);
  };
  write(dir.path() / "one.safetensors", false);
  write(dir.path() / "two.safetensors", true);
  const std::string one = slurp(dir.path() / "one.safetensors"), two = slurp(dir.path() / "two.safetensors");
  EXPECT_EQ(one, two);  // the order of add() does not matter
  std::uint64_t n = 0;
  std::memcpy(&n, one.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = one.substr(8, n);
  EXPECT_LT(header.find("\"__metadata__\""), header.find("\"a\""));
  EXPECT_LT(header.find("\"a\""), header.find("\"b\""));
  EXPECT_LT(header.find("\"b\""), header.find("\"c\""));
  const SafetensorsFile f(dir.path() / "one.safetensors");
  for (const auto& e : f.entries()) EXPECT_EQ((f.data_offset() + e.begin) % safetensors_dtype_size(e.dtype), 0u) << e.name;
  EXPECT_EQ(f.entry("c").begin, 0u);  // largest elements first
}

TEST(Safetensors, ReadsARunOfElements) {
  TempDirectory dir("safetensors");
  const auto t = ramp<float>(Shape{6, 7}, 0.5, 1);
  SafetensorsWriter w;
  w.add("t", t);
  w.add("t16", t, SafetensorsDtype::bfloat16);
  w.write(dir.path() / "m.safetensors");
  const SafetensorsFile f(dir.path() / "m.safetensors");
  std::vector<float> run(10);
  f.read<float>("t", std::span<float>(run), 13);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(run[i], t[13 + i]);
  std::vector<double> converted(5);
  f.read<double>("t16", std::span<double>(converted), 37);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(converted[i], static_cast<double>(static_cast<float>(bf16(t[37 + i]))));
  std::vector<float> too_many(6);
  expect_error<ConfigError>([&] { f.read<float>("t", std::span<float>(too_many), 37); }, {"elements [37, 43)", "'t'"});
  expect_error<ConfigError>([&] { f.read<float>("nope", std::span<float>(run)); }, {"has no tensor 'nope'"});
}

TEST(Safetensors, RefusesConversionsThatDoNotExist) {
  TempDirectory dir("safetensors");
  const auto i = ramp<std::int32_t>(Shape{3}, 1, 0);
  const auto f = ramp<float>(Shape{3}, 1, 0);
  SafetensorsWriter w;
  w.add("i", i);
  w.add("f", f);
  w.write(dir.path() / "m.safetensors");
  const SafetensorsFile file(dir.path() / "m.safetensors");
  expect_error<ConfigError>([&] { file.read_tensor<float>("i"); }, {"tensor 'i' is stored as I32", "float32"});
  expect_error<ConfigError>([&] { file.read_tensor<std::int64_t>("f"); }, {"tensor 'f' is stored as F32", "int64"});
  SafetensorsWriter bad;
  expect_error<ConfigError>([&] { bad.add("x", i, SafetensorsDtype::float32); }, {"'x'", "cannot be stored as F32"});
  expect_error<ConfigError>([&] { bad.add("__metadata__", f); }, {"cannot name a tensor"});
  bad.add("y", f);
  expect_error<ConfigError>([&] { bad.add("y", f); }, {"'y' was added twice"});
}

// ---- safetensors: malformed files ----

// A file of header length `declared` (or the header's own), `header` and `data` bytes.
std::filesystem::path raw_file(const TempDirectory& dir, const std::string& name, const std::string& header,
                               std::size_t data_bytes, std::optional<std::uint64_t> declared = std::nullopt) {
  const auto path = dir.path() / name;
  std::ofstream out(path, std::ios::binary);
  const std::uint64_t n = declared.value_or(header.size());
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header;
  out << std::string(data_bytes, '\x01');
  return path;
}

TEST(Safetensors, RejectsEveryMalformedFile) {
  TempDirectory dir("safetensors");
  const std::string good_a = R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
  auto open = [](const std::filesystem::path& p) { SafetensorsFile f(p); };
  struct Case {
    std::string name, header;
    std::size_t data;
    std::vector<std::string> expected;
    std::optional<std::uint64_t> declared = std::nullopt;
  };
  const std::vector<Case> cases = {
      {"short_header_length", "{}", 0, {"header length is 1 bytes"}, 1},
      {"huge_header_length", "{}", 0, {"exceeds the limit of 100000000"}, 200'000'000},
      {"header_past_end", "{}", 0, {"runs past the end of the file"}, 64},
      {"not_an_object", "[1] ", 0, {"does not start with '{'"}},
      {"bad_json", R"({"a":{"dtype":"F32",}})", 0, {"is not valid JSON"}},
      {"unknown_dtype", R"({"a":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", 8, {"tensor 'a'", "unknown dtype \"F7\""}},
      {"negative_extent", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, {"tensor 'a'", "shape entry -2"}},
      {"fractional_extent", R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8, {"tensor 'a'", "shape entry 2.5"}},
      {"overflowing_shape",
       R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
       {"tensor 'a'", "more elements than a 64-bit size can count"}},
      {"size_mismatch", R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20,
       {"tensor 'a'", "of 20 bytes", "needs 24"}},
      {"offsets_out_of_bounds", "{" + good_a + "}", 16, {"tensor 'a'", "outside the data section of 16 bytes"}},
      {"offsets_reversed", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8, {"tensor 'a'", "end before they begin"}},
      {"offsets_not_two", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, {"tensor 'a'", "not two non-negative integers"}},
      {"overlapping", "{" + good_a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})", 24,
       {"tensor 'b'", "overlaps tensor 'a'"}},
      {"hole", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16, {"data bytes [0, 8)", "tensor 'a'", "no holes"}},
      {"trailing_bytes", "{" + good_a + "}", 30, {"cover 24 bytes", "30"}},
      {"missing_field", R"({"a":{"dtype":"F32","shape":[2]}})", 8, {"tensor 'a'", "lacks one of"}},
      {"unknown_field", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8, {"tensor 'a'", "unknown field \"x\""}},
      {"entry_not_object", R"({"a":[1]})", 0, {"tensor 'a'", "not described by an object"}},
      {"metadata_not_strings", R"({"__metadata__":{"format":1}})", 0, {"__metadata__ value 'format'", "not a string"}},
      {"duplicate_name", "{" + good_a + "," + good_a + "}", 24, {"\"a\" appears twice"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto path = raw_file(dir, c.name + ".safetensors", c.header, c.data, c.declared);
    std::vector<std::string> parts = {c.name + ".safetensors"};
    parts.insert(parts.end(), c.expected.begin(), c.expected.end());
    try {
      open(path);
      ADD_FAILURE() << "opened";
    } catch (const FileError& e) {
      const std::string m = e.what();
      for (const auto& part : parts) EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' not in: " << m;
    }
  }
  // Shorter than the length field, and a file that lost its tail.
  {
    const auto path = dir.path() / "tiny.safetensors";
    std::ofstream(path, std::ios::binary) << "abc";
    expect_error<FileError>([&] { open(path); }, {"tiny.safetensors", "truncated", "3 bytes"});
  }
  {
    const auto t = ramp<float>(Shape{4, 4}, 1, 0);
    SafetensorsWriter w;
    w.add("first", t);
    w.add("second", t);
    const auto path = dir.path() / "cut.safetensors";
    w.write(path);
    std::filesystem::resize_file(path, std::filesystem::file_size(path) - 10);
    expect_error<FileError>([&] { open(path); }, {"cut.safetensors", "tensor 'second'", "outside the data section"});
  }
  expect_error<FileError>([&] { open(dir.path() / "absent.safetensors"); }, {"absent.safetensors", "does not exist"});
  // A valid minimal file: "{}" padded, no tensors.
  const auto empty = raw_file(dir, "empty.safetensors", "{}      ", 0);
  EXPECT_TRUE(SafetensorsFile(empty).entries().empty());
}

// ---- model directories ----

TEST(SafetensorsDirectory, OneFileOrShardsWithAnIndex) {
  const auto a = ramp<float>(Shape{2, 3}, 1, 0), b = ramp<float>(Shape{4}, -1, 0.5);
  const auto c = ramp<bf16>(Shape{3}, 2, 1);
  {
    TempDirectory dir("safetensors_dir");
    SafetensorsWriter w;
    w.add("a", a);
    w.add("b", b);
    w.write(dir.path() / "model.safetensors");
    const SafetensorsDirectory d(dir.path());
    EXPECT_TRUE(d.index_path().empty());
    EXPECT_EQ(d.names(), (std::vector<std::string>{"a", "b"}));
    EXPECT_TRUE(same_bytes(d.read_tensor<float>("b"), b));
  }
  TempDirectory dir("safetensors_dir");
  SafetensorsWriter w1, w2;
  w1.add("a", a);
  w2.add("b", b);
  w2.add("c", c);
  w1.write(dir.path() / "model-00001-of-00002.safetensors");
  w2.write(dir.path() / "model-00002-of-00002.safetensors");
  auto write_index = [&](const std::string& weight_map) {
    std::ofstream(dir.path() / "model.safetensors.index.json")
        << R"({"metadata": {"total_size": 46}, "weight_map": {)" << weight_map << "}}";
  };
  write_index(R"("a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors")");
  {
    const SafetensorsDirectory d(dir.path());
    EXPECT_FALSE(d.index_path().empty());
    EXPECT_EQ(d.files().size(), 2u);
    EXPECT_EQ(d.names(), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_TRUE(same_bytes(d.read_tensor<float>("a"), a));
    EXPECT_TRUE(same_bytes(d.read_tensor<bf16>("c"), c));
    EXPECT_EQ(d.file_of("c").path().filename(), "model-00002-of-00002.safetensors");
  }
  write_index(R"("a": "model-00001-of-00002.safetensors", "b": "model-00003-of-00003.safetensors")");
  expect_error<FileError>([&] { SafetensorsDirectory d(dir.path()); },
                          {"model.safetensors.index.json", "tensor 'b'", "model-00003-of-00003.safetensors", "does not exist"});
  write_index(R"("a": "model-00002-of-00002.safetensors")");
  expect_error<FileError>([&] { SafetensorsDirectory d(dir.path()); },
                          {"maps tensor 'a'", "model-00002-of-00002.safetensors", "does not hold it"});
  write_index(R"("a": "../model-00001-of-00002.safetensors")");
  expect_error<FileError>([&] { SafetensorsDirectory d(dir.path()); }, {"tensor 'a'", "not a plain file name"});
  write_index(R"("a": 3)");
  expect_error<FileError>([&] { SafetensorsDirectory d(dir.path()); }, {"tensor 'a' maps to a number"});
  std::ofstream(dir.path() / "model.safetensors.index.json") << R"({"weights": {}})";
  expect_error<FileError>([&] { SafetensorsDirectory d(dir.path()); }, {"index.json", "no \"weight_map\" object"});
  std::ofstream(dir.path() / "model.safetensors.index.json") << R"({"weight_map": {}, )";
  expect_error<FileError>([&] { SafetensorsDirectory d(dir.path()); }, {"index.json", "not valid JSON"});
  std::filesystem::remove(dir.path() / "model.safetensors.index.json");
  expect_error<FileError>([&] { SafetensorsDirectory d(dir.path()); }, {"holds neither model.safetensors nor"});
  expect_error<FileError>([&] { SafetensorsDirectory d(dir.path() / "nothing"); }, {"nothing", "does not exist"});
}

}  // namespace
}  // namespace test_safetensors_cases
