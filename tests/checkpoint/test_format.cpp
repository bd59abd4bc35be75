// The per-rank checkpoint file: CRC-32 check values, a round trip of every stored dtype and the
// scalars, and the errors for files that are corrupt, truncated or of another kind.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <fstream>
#include <string>
#include <vector>

#include <strata/checkpoint.hpp>

#include "temp_directory.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_format_cases {

namespace {

using namespace strata;
using strata_test::TempDirectory;

TEST(Crc32, KnownValues) {
  EXPECT_EQ(crc32(std::string_view("")), 0u);
  EXPECT_EQ(crc32(std::string_view("123456789")), 0xCBF43926u);
  EXPECT_EQ(crc32(std::string_view("The quick brown fox jumps over the lazy dog")), 0x414FA339u);
  // In pieces, and through the 4-byte path with a tail.
  const std::string text = "The quick brown fox jumps over the lazy dog";
  const auto bytes = std::as_bytes(std::span<const char>(text.data(), text.size()));
  EXPECT_EQ(crc32(bytes), 0x414FA339u);
  EXPECT_EQ(crc32_update(crc32(bytes.first(10)), bytes.subspan(10)), 0x414FA339u);
}

template <class X>
Tensor<X> filled(Shape shape, double scale) {
  Tensor<X> t(shape);
  for (index_t i = 0; i < t.numel(); ++i) t[i] = static_cast<X>(scale * static_cast<double>(i) + 3.0);
  return t;
}

template <class X>
void expect_same_bytes(const Tensor<X>& a, const Tensor<X>& b, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(X)), 0) << what;
}

struct Sample {
  Tensor<float> f32 = filled<float>(Shape{3, 5}, 0.37);
  Tensor<double> f64 = filled<double>(Shape{2, 2, 3}, 1.0 / 3.0);
  Tensor<bf16> b16 = filled<bf16>(Shape{8}, 0.11);
  Tensor<fp16> h16 = filled<fp16>(Shape{2, 3}, 0.21);
  Tensor<std::int32_t> i32 = filled<std::int32_t>(Shape{4}, 1000);
  Tensor<std::int64_t> i64 = filled<std::int64_t>(Shape{3}, 1e12);
  Tensor<std::uint8_t> u8 = filled<std::uint8_t>(Shape{9}, 7);
  Tensor<double> empty{Shape{0, 4}};

  void add_to(StateWriter& w) const {
    w.add("f32", f32, Shape{6, 5}, ShardSpec::split(0, 1, 2));
    w.add("f64", f64);
    w.add("b16", b16, Shape{16}, ShardSpec::split(0, 0, 2, 2));
    w.add("h16", h16);
    w.add("i32", i32);
    w.add("i64", i64);
    w.add("u8", u8);
    w.add("empty", empty);
    w.set("iteration", std::int64_t{1234567890123});
    w.set("lr", 3.5e-4);
    w.set("note", "hello, checkpoint");
    w.set("small", 7);
  }
};

std::filesystem::path write_sample(const std::filesystem::path& dir) {
  Sample s;
  StateWriter w;
  s.add_to(w);
  const auto path = dir / "sample.strata";
  w.write(path);
  return path;
}

TEST(CheckpointFormat, RoundTripsEveryDtypeAndScalar) {
  TempDirectory dir("format");
  const auto path = write_sample(dir.path());
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".part"));
  Sample want;
  StateReader r(path);
  Tensor<float> f32(Shape{3, 5});
  Tensor<double> f64(Shape{2, 2, 3}), empty(Shape{0, 4});
  Tensor<bf16> b16(Shape{8});
  Tensor<fp16> h16(Shape{2, 3});
  Tensor<std::int32_t> i32(Shape{4});
  Tensor<std::int64_t> i64(Shape{3});
  Tensor<std::uint8_t> u8(Shape{9});
  r.load_into("f32", f32, Shape{6, 5}, ShardSpec::split(0, 1, 2));
  r.load_into("f64", f64);
  r.load_into("b16", b16);
  r.load_into("h16", h16);
  r.load_into("i32", i32);
  r.load_into("i64", i64);
  r.load_into("u8", u8);
  r.load_into("empty", empty);
  expect_same_bytes(f32, want.f32, "f32");
  expect_same_bytes(f64, want.f64, "f64");
  expect_same_bytes(b16, want.b16, "b16");
  expect_same_bytes(h16, want.h16, "h16");
  expect_same_bytes(i32, want.i32, "i32");
  expect_same_bytes(i64, want.i64, "i64");
  expect_same_bytes(u8, want.u8, "u8");
  EXPECT_EQ(r.get_int("iteration"), 1234567890123);
  EXPECT_EQ(r.get_int("small"), 7);
  EXPECT_EQ(r.get_double("lr"), 3.5e-4);
  EXPECT_EQ(r.get_string("note"), "hello, checkpoint");
  EXPECT_TRUE(r.has("lr"));
  EXPECT_FALSE(r.has("missing"));
  EXPECT_TRUE(r.has_tensor("u8"));
  // Layout records.
  const TensorRecord& b = r.record("b16");
  EXPECT_EQ(b.dtype, StoredDtype::bfloat16);
  EXPECT_EQ(b.global_shape, (Shape{16}));
  EXPECT_TRUE(b.shard.sharded);
  EXPECT_EQ(b.shard.stacks, 2);
  EXPECT_EQ(b.shard.parts, 2);
  EXPECT_EQ(r.record("f64").global_shape, (Shape{2, 2, 3}));
  EXPECT_FALSE(r.record("f64").shard.sharded);
  for (const TensorRecord& rec : r.tensors()) EXPECT_EQ(rec.offset % kCheckpointDataAlignment, 0u) << rec.name;
}

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

TEST(CheckpointFormat, MismatchesAreConfigErrorsAndMissingIsFileError) {
  TempDirectory dir("format");
  const auto path = write_sample(dir.path());
  StateReader r(path);
  Tensor<double> wrong_type(Shape{3, 5});
  Tensor<float> wrong_shape(Shape{5, 3}), f32(Shape{3, 5});
  std::string m = error_of<ConfigError>([&] { r.load_into("f32", wrong_type); });
  EXPECT_NE(m.find("float32"), std::string::npos) << m;
  EXPECT_NE(m.find(path.string()), std::string::npos) << m;
  m = error_of<ConfigError>([&] { r.load_into("f32", wrong_shape); });
  EXPECT_NE(m.find("[3, 5]"), std::string::npos) << m;
  m = error_of<ConfigError>([&] { r.load_into("f32", f32, Shape{6, 5}, ShardSpec::split(0, 0, 2)); });
  EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
  m = error_of<ConfigError>([&] { r.load_into("f32", f32, Shape{3, 5}, ShardSpec::replicated()); });
  EXPECT_NE(m.find("global shape [6, 5]"), std::string::npos) << m;
  m = error_of<FileError>([&] { r.load_into("nope", f32); });
  EXPECT_NE(m.find("no tensor 'nope'"), std::string::npos) << m;
  m = error_of<FileError>([&] { r.get_int("note"); });
  EXPECT_NE(m.find("not an integer"), std::string::npos) << m;
  m = error_of<FileError>([&] { r.get_double("missing"); });
  EXPECT_NE(m.find("no value 'missing'"), std::string::npos) << m;
  EXPECT_THROW(StateReader(dir.path() / "does_not_exist.strata"), FileError);

  StateWriter w;
  Tensor<float> t(Shape{2});
  w.add("t", t);
  EXPECT_THROW(w.add("t", t), ConfigError);
  EXPECT_THROW(w.add("u", t, Shape{6}, ShardSpec::split(0, 0, 2)), ShapeError);
}

std::vector<char> read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}
void write_all(const std::filesystem::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(CheckpointFormat, CorruptFilesAreFileErrorsNamingTheFile) {
  TempDirectory dir("format");
  const auto path = write_sample(dir.path());
  const std::vector<char> good = read_all(path);
  std::uint64_t data_offset = 0;
  {
    StateReader r(path);
    data_offset = r.record("f64").offset + 5;
  }
  auto expect_file_error = [&](const std::vector<char>& bytes, const std::string& phrase, bool on_load) {
    write_all(path, bytes);
    const std::string m = error_of<FileError>([&] {
      StateReader r(path);
      if (on_load) {
        Tensor<double> f64(Shape{2, 2, 3});
        r.load_into("f64", f64);
      }
    });
    EXPECT_NE(m.find(path.string()), std::string::npos) << m;
    EXPECT_NE(m.find(phrase), std::string::npos) << m;
  };
  std::vector<char> bad = good;
  bad[0] = 'X';
  expect_file_error(bad, "bad magic", false);
  bad = good;
  bad[8] = 9;  // version
  expect_file_error(bad, "format version 9", false);
  bad = good;
  bad[40] ^= 0x10;  // inside the table
  expect_file_error(bad, "checksum of its header and table", false);
  bad = good;
  bad[data_offset] ^= 0x01;  // one bit of one tensor's data
  expect_file_error(bad, "fails its CRC-32 check", true);
  expect_file_error(std::vector<char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2)),
                    "truncated", false);
  expect_file_error(std::vector<char>(good.begin(), good.begin() + 20), "truncated", false);
  bad = good;
  bad.push_back(0);
  expect_file_error(bad, "longer than written", false);
  // The untouched file still loads.
  write_all(path, good);
  StateReader r(path);
  Tensor<double> f64(Shape{2, 2, 3});
  EXPECT_NO_THROW(r.load_into("f64", f64));
}


// A table whose extents multiply past 64 bits must be reported as corrupt, not wrap into a
// plausible element count: [1, 2^62 + 3, 4] wraps to 12 elements, exactly the 96 bytes of the
// sample's 12 doubles, so only checked arithmetic tells it from the real [2, 2, 3].
TEST(CheckpointFormat, ExtentsWhoseProductOverflowsAreCorrupt) {
  TempDirectory dir("format");
  const auto path = write_sample(dir.path());
  std::vector<char> bytes = read_all(path);
  auto i64_at = [&](std::size_t at) {
    std::int64_t v;
    std::memcpy(&v, bytes.data() + at, 8);
    return v;
  };
  // Find the f64 tensor's name, then its two shapes: u8 rank 3 + three i64 extents, twice.
  const std::string name = "f64";
  std::size_t at = 0;
  for (; at + 4 + name.size() < bytes.size(); ++at) {
    std::uint32_t length;
    std::memcpy(&length, bytes.data() + at, 4);
    if (length == name.size() && std::string(bytes.data() + at + 4, name.size()) == name) break;
  }
  ASSERT_LT(at + 4 + name.size(), bytes.size()) << "tensor 'f64' not found in the table";
  const std::size_t local = at + 4 + name.size() + 1;  // after the dtype byte
  ASSERT_EQ(bytes[local], 3);
  ASSERT_EQ(i64_at(local + 1), 2);
  ASSERT_EQ(i64_at(local + 9), 2);
  ASSERT_EQ(i64_at(local + 17), 3);
  const std::int64_t huge[2][3] = {{1, (std::int64_t{1} << 62) + 3, 4}, {1, (std::int64_t{1} << 62) + 3, 4}};
  for (int s = 0; s < 2; ++s)
    for (int d = 0; d < 3; ++d) std::memcpy(bytes.data() + local + s * 25 + 1 + d * 8, &huge[s][d], 8);
  // Re-seal the header and table with their CRC so only the extents are wrong.
  std::uint64_t table_size;
  std::memcpy(&table_size, bytes.data() + 24, 8);
  const std::size_t sealed = 32 + static_cast<std::size_t>(table_size);
  const std::uint32_t crc = crc32(std::as_bytes(std::span<const char>(bytes.data(), sealed)));
  std::memcpy(bytes.data() + sealed, &crc, 4);
  write_all(path, bytes);
  const std::string m = error_of<FileError>([&] { StateReader r(path); });
  EXPECT_NE(m.find(path.string()), std::string::npos) << m;
  EXPECT_NE(m.find("more elements than a 64-bit size can count"), std::string::npos) << m;
}

}  // namespace
}  // namespace test_format_cases
