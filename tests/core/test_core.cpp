// Unit tests for core/: the 16-bit float types, Shape, Tensor/TensorView, the Philox generator and
// the error helpers.
#include <gtest/gtest.h>

#include <cstring>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <initializer_list>
#include <vector>

#include <strata/core.hpp>

namespace {

using strata::bf16;
using strata::fp16;
using strata::index_t;
using strata::Shape;
using strata::Tensor;
using strata::TensorView;

float from_bits32(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t bits32(float f) { return std::bit_cast<std::uint32_t>(f); }

bool bf16_is_nan(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }
bool fp16_is_nan(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }

// Reference float -> binary16, round to nearest, ties to even, computed in double.
std::uint16_t fp16_reference(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
  if (std::isnan(f)) return 0x7e00u;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a) || a >= 65520.0) return sign | 0x7c00u;  // 65520 is halfway from 65504 to 2^16
  const double min_normal = std::ldexp(1.0, -14);
  // The spacing of binary16 values around a.
  const int e = a < min_normal ? -14 : std::ilogb(a);
  const double quantum = std::ldexp(1.0, e - 10);
  const double steps = std::nearbyint(a / quantum);  // a / quantum is exact; nearbyint ties to even
  const double value = steps * quantum;
  if (value < min_normal) return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(steps));
  const int ev = std::ilogb(value);
  const auto mantissa = static_cast<std::uint16_t>(std::ldexp(value, -ev) * 1024.0 - 1024.0);
  return static_cast<std::uint16_t>(sign | ((ev + 15) << 10) | mantissa);
}

// ---------------------------------------------------------------------------------------------
// bf16

TEST(Bf16, EveryNonNanPatternRoundTripsExactly) {
  int checked = 0;
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    if (bf16_is_nan(bits)) continue;
    const float f = bf16::from_bits(bits);
    ASSERT_EQ(bf16(f).bits, bits) << "pattern 0x" << std::hex << b;
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * 127);
}

TEST(Bf16, WideningIsTheTopHalfOfAFloat) {
  for (std::uint32_t b = 0; b <= 0xffffu; b += 7) {
    const float f = bf16::from_bits(static_cast<std::uint16_t>(b));
    EXPECT_EQ(bits32(f), b << 16);
  }
}

TEST(Bf16, RoundsToNearestEven) {
  // Every halfway point between neighbouring finite bf16 values (both signs) goes to the even one;
  // one float ulp either side goes to the nearer one.
  for (std::uint32_t sign : {0u, 0x8000u}) {
    for (std::uint32_t lo = 0; lo < 0x7f80u; ++lo) {
      const std::uint32_t b = sign | lo;
      const std::uint32_t mid = (b << 16) | 0x8000u;
      const std::uint32_t even = (b & 1u) ? b + 1 : b;
      ASSERT_EQ(bf16(from_bits32(mid)).bits, even) << "halfway above 0x" << std::hex << b;
      ASSERT_EQ(bf16(from_bits32(mid - 1)).bits, b) << "just below halfway above 0x" << std::hex << b;
      ASSERT_EQ(bf16(from_bits32(mid + 1)).bits, b + 1) << "just above halfway above 0x" << std::hex << b;
    }
  }
  EXPECT_EQ(bf16(1.0f + 0x1p-8f).bits, bf16(1.0f).bits);              // tie, 1.0 is even
  EXPECT_EQ(bf16(1.0f + 3 * 0x1p-8f).bits, bf16(1.0f + 0x1p-6f).bits);  // tie, rounds up to even
}

TEST(Bf16, NanStaysNan) {
  for (std::uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu}) {
    const bf16 b(from_bits32(u));
    EXPECT_TRUE(bf16_is_nan(b.bits)) << std::hex << u << " -> " << b.bits;
    EXPECT_TRUE(std::isnan(static_cast<float>(b)));
  }
  EXPECT_TRUE(std::isnan(static_cast<float>(bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Bf16, OverflowsToInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16(inf).bits, 0x7f80u);
  EXPECT_EQ(bf16(-inf).bits, 0xff80u);
  EXPECT_EQ(bf16(std::numeric_limits<float>::max()).bits, 0x7f80u);
  EXPECT_EQ(bf16(-std::numeric_limits<float>::max()).bits, 0xff80u);
  EXPECT_EQ(bf16(from_bits32(0x7f7f7fffu)).bits, 0x7f7fu);  // just below halfway: largest finite
  EXPECT_EQ(bf16(from_bits32(0x7f7f8000u)).bits, 0x7f80u);  // halfway, odd below: infinity
  EXPECT_TRUE(std::isinf(static_cast<float>(bf16(1e39))));
}

TEST(Bf16, ConstructorsAgree) {
  EXPECT_EQ(bf16(3).bits, bf16(3.0f).bits);
  EXPECT_EQ(bf16(0.1).bits, bf16(0.1f).bits);
  EXPECT_EQ(static_cast<float>(bf16(-2.5f)), -2.5f);
  bf16 x(1.0f);
  x += 2.0f;
  x *= 4.0f;
  x -= 1.0f;
  EXPECT_EQ(static_cast<float>(x), 11.0f);
}

// ---------------------------------------------------------------------------------------------
// fp16

TEST(Fp16, EveryNonNanPatternRoundTripsExactly) {
  int checked = 0;
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if (fp16_is_nan(bits)) continue;
    const float f = fp16::from_bits(bits);
    ASSERT_EQ(fp16(f).bits, bits) << "pattern 0x" << std::hex << h;
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * 1023);
}

TEST(Fp16, WideningMatchesTheFormatDefinition) {
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = fp16::from_bits(bits);
    if (fp16_is_nan(bits)) {
      ASSERT_TRUE(std::isnan(f));
      continue;
    }
    const int exponent = (h >> 10) & 0x1f;
    const int mantissa = h & 0x3ff;
    double want = exponent == 0x1f ? std::numeric_limits<double>::infinity()
                  : exponent == 0  ? std::ldexp(mantissa, -24)
                                   : std::ldexp(1024 + mantissa, exponent - 25);
    if (h & 0x8000u) want = -want;
    ASSERT_EQ(static_cast<double>(f), want) << "pattern 0x" << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0);
  }
}

TEST(Fp16, NanStaysNan) {
  for (std::uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const fp16 h(from_bits32(u));
    EXPECT_TRUE(fp16_is_nan(h.bits)) << std::hex << u << " -> " << h.bits;
  }
  for (std::uint16_t h : {0x7c01u, 0x7e00u, 0xfe00u, 0x7fffu}) EXPECT_TRUE(std::isnan(static_cast<float>(fp16::from_bits(h))));
}

TEST(Fp16, OverflowsToInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fp16(inf).bits, 0x7c00u);
  EXPECT_EQ(fp16(-inf).bits, 0xfc00u);
  EXPECT_EQ(fp16(65504.0f).bits, 0x7bffu);                  // largest finite
  EXPECT_EQ(fp16(65519.996f).bits, 0x7bffu);                // below halfway
  EXPECT_EQ(fp16(65520.0f).bits, 0x7c00u);                  // halfway, odd below: infinity
  EXPECT_EQ(fp16(-65520.0f).bits, 0xfc00u);
  EXPECT_EQ(fp16(1e6f).bits, 0x7c00u);
  EXPECT_EQ(fp16(std::numeric_limits<float>::max()).bits, 0x7c00u);
}

TEST(Fp16, SubnormalsRoundToNearestEven) {
  const float tiny = 0x1p-24f;  // smallest binary16 subnormal
  EXPECT_EQ(static_cast<float>(fp16::from_bits(0x0001u)), tiny);
  EXPECT_EQ(static_cast<float>(fp16::from_bits(0x03ffu)), 1023 * tiny);
  EXPECT_EQ(static_cast<float>(fp16::from_bits(0x0400u)), 0x1p-14f);
  EXPECT_EQ(fp16(tiny).bits, 0x0001u);
  EXPECT_EQ(fp16(-tiny).bits, 0x8001u);
  EXPECT_EQ(fp16(0.5f * tiny).bits, 0x0000u);               // tie between 0 and 1: 0
  EXPECT_EQ(fp16(-0.5f * tiny).bits, 0x8000u);              // keeps the sign of zero
  EXPECT_EQ(fp16(std::nextafter(0.5f * tiny, 1.0f)).bits, 0x0001u);
  EXPECT_EQ(fp16(1.5f * tiny).bits, 0x0002u);               // tie between 1 and 2: 2
  EXPECT_EQ(fp16(2.5f * tiny).bits, 0x0002u);               // tie between 2 and 3: 2
  EXPECT_EQ(fp16(1023.5f * tiny).bits, 0x0400u);            // rounds up into the normal range
  EXPECT_EQ(fp16(0x1p-30f).bits, 0x0000u);
  EXPECT_EQ(fp16(std::numeric_limits<float>::denorm_min()).bits, 0x0000u);
}

TEST(Fp16, RoundsToNearestEven) {
  // Every halfway point between neighbouring finite fp16 values (both signs, subnormal and normal)
  // is a float; it goes to the even neighbour, one float ulp either side to the nearer one.
  for (std::uint32_t sign : {0u, 0x8000u}) {
    for (std::uint32_t lo = 0; lo < 0x7bffu; ++lo) {  // the step to infinity: OverflowsToInfinity
      const std::uint32_t h = sign | lo;
      const float a = fp16::from_bits(static_cast<std::uint16_t>(h));
      const float b = fp16::from_bits(static_cast<std::uint16_t>(h + 1));
      const float mid = static_cast<float>((static_cast<double>(a) + static_cast<double>(b)) / 2);
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(a) + static_cast<double>(b)) / 2);
      const std::uint32_t even = (h & 1u) ? h + 1 : h;
      ASSERT_EQ(fp16(mid).bits, even) << "halfway above 0x" << std::hex << h;
      ASSERT_EQ(fp16(std::nextafter(mid, a)).bits, h) << "just below halfway above 0x" << std::hex << h;
      ASSERT_EQ(fp16(std::nextafter(mid, b)).bits, h + 1) << "just above halfway above 0x" << std::hex << h;
    }
  }
  EXPECT_EQ(fp16(1.0f + 0x1p-11f).bits, 0x3c00u);  // tie, 1.0 is even
  EXPECT_EQ(fp16(1.0f + 3 * 0x1p-11f).bits, 0x3c02u);
}

TEST(Fp16, MatchesDoubleReferenceOnRandomFloats) {
  std::mt19937 gen(12345);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  // Biased exponents 95..150 cover below-subnormal, subnormal, normal and overflowing values.
  std::uniform_int_distribution<std::uint32_t> exponent(95, 150);
  std::uniform_int_distribution<std::uint32_t> mantissa(0, 0x7fffffu);
  int mismatches = 0;
  for (int i = 0; i < 1000000; ++i) {
    std::uint32_t u = any_bits(gen);
    if (i % 4 != 0) u = (u & 0x80000000u) | (exponent(gen) << 23) | mantissa(gen);
    const float f = from_bits32(u);
    const std::uint16_t got = fp16(f).bits, want = fp16_reference(f);
    const bool same = std::isnan(f) ? fp16_is_nan(got) : got == want;
    if (!same && ++mismatches <= 10)
      ADD_FAILURE() << "float 0x" << std::hex << u << " (" << f << "): got 0x" << got << ", want 0x" << want;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Fp16, ReferenceAgreesOnEveryHalfPattern) {
  // The reference itself: it reproduces every finite fp16 value.
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if (fp16_is_nan(bits)) continue;
    ASSERT_EQ(fp16_reference(fp16::from_bits(bits)), bits) << std::hex << h;
  }
}

TEST(Dtype, AccumulateTypesAndNames) {
  static_assert(std::is_same_v<strata::accumulate_t<bf16>, float>);
  static_assert(std::is_same_v<strata::accumulate_t<fp16>, float>);
  static_assert(std::is_same_v<strata::accumulate_t<float>, float>);
  static_assert(std::is_same_v<strata::accumulate_t<double>, double>);
  static_assert(strata::Element<bf16> && strata::Element<double> && !strata::Element<int>);
  EXPECT_EQ(strata::dtype_name<bf16>(), "bfloat16");
  EXPECT_EQ(strata::dtype_name<fp16>(), "float16");
  EXPECT_EQ(strata::dtype_name<float>(), "float32");
  EXPECT_EQ(strata::dtype_name<double>(), "float64");
}

// ---------------------------------------------------------------------------------------------
// Shape

TEST(Shape, RankNumelAndNegativeIndex) {
  const Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s[0], 2);
  EXPECT_EQ(s[-1], 4);
  EXPECT_EQ(s[-2], 3);
  EXPECT_EQ(s[-3], 2);
  EXPECT_EQ(s.rows(), 6);
  EXPECT_EQ(s.cols(), 4);
  const Shape scalar{};
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ((Shape{5, 0, 2}.numel()), 0);
  static_assert(Shape{2, 3}.numel() == 6 && Shape{2, 3}[-1] == 3, "Shape is usable in constant expressions.");
}

TEST(Shape, OutOfRangeIndexThrowsNamingTheDimension) {
  const Shape s{2, 3, 4};
  for (int d : {3, 7, -4, -9}) {
    try {
      (void)s[d];
      ADD_FAILURE() << "no error for dimension " << d;
    } catch (const strata::ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("dimension " + std::to_string(d)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 3"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW((void)Shape{}[0], strata::ShapeError);
}

TEST(Shape, ConstructionChecksRankAndExtents) {
  EXPECT_THROW((Shape{1, 2, 3, 4, 5}), strata::ShapeError);
  EXPECT_THROW((Shape{2, -1}), strata::ShapeError);
  EXPECT_NO_THROW((Shape{1, 2, 3, 4}));
}

TEST(Shape, WithReplacesOneExtent) {
  const Shape s{2, 3, 4};
  EXPECT_EQ(s.with(1, 7), (Shape{2, 7, 4}));
  EXPECT_EQ(s.with(-1, 1), (Shape{2, 3, 1}));
  EXPECT_EQ(s, (Shape{2, 3, 4}));  // unchanged
  EXPECT_THROW((void)s.with(3, 1), strata::ShapeError);
  Shape m = s;
  m[0] = 9;
  EXPECT_EQ(m, (Shape{9, 3, 4}));
}

TEST(Shape, EqualityComparesRankAndExtents) {
  EXPECT_EQ((Shape{2, 3}), (Shape{2, 3}));
  EXPECT_NE((Shape{2, 3}), (Shape{3, 2}));
  EXPECT_NE((Shape{2, 3}), (Shape{2, 3, 1}));
  EXPECT_NE((Shape{}), (Shape{1}));
  EXPECT_EQ((Shape{}), (Shape{}));
}

TEST(Shape, StrListsExtents) {
  EXPECT_EQ((Shape{2, 3, 4}.str()), "[2, 3, 4]");
  EXPECT_EQ((Shape{7}.str()), "[7]");
  EXPECT_EQ((Shape{}.str()), "[]");
}

TEST(Shape, CheckSameShapeNamesBothShapes) {
  EXPECT_NO_THROW(strata::check_same_shape(Shape{2, 3}, Shape{2, 3}, "x"));
  try {
    strata::check_same_shape(Shape{2, 3}, Shape{3, 2}, "residual");
    ADD_FAILURE() << "no error";
  } catch (const strata::ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("residual"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
  }
}

// ---------------------------------------------------------------------------------------------
// Tensor and TensorView

TEST(Tensor, ConstructionZeroFillsAndKeepsShape) {
  Tensor<float> t(Shape{2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_FALSE(t.empty());
  for (index_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t[i], 0.0f);

  Tensor<double> f(Shape{4}, 2.5);
  for (double v : f.span()) EXPECT_EQ(v, 2.5);

  Tensor<float> v(Shape{2, 2}, std::vector<float>{1, 2, 3, 4});
  EXPECT_EQ(v[3], 4.0f);
  EXPECT_THROW((Tensor<float>(Shape{2, 2}, std::vector<float>{1, 2, 3})), strata::ShapeError);

  EXPECT_TRUE(Tensor<float>().empty());
  EXPECT_EQ(Tensor<float>::zeros_like(v).shape(), v.shape());
  EXPECT_EQ(Tensor<float>::zeros(Shape{3, 1}).numel(), 3);
}

TEST(Tensor, FillAndZero) {
  Tensor<bf16> t(Shape{3, 2});
  t.fill(bf16(1.5f));
  for (bf16 v : t.span()) EXPECT_EQ(static_cast<float>(v), 1.5f);
  t.zero();
  for (bf16 v : t.span()) EXPECT_EQ(v.bits, 0u);
}

TEST(Tensor, ReshapeKeepsDataAndRejectsOtherSizes) {
  Tensor<float> t(Shape{2, 3}, std::vector<float>{0, 1, 2, 3, 4, 5});
  t.reshape(Shape{3, 2});
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t[5], 5.0f);

  const Tensor<float> r = t.reshaped(Shape{6});
  EXPECT_EQ(r.shape(), (Shape{6}));
  EXPECT_EQ(t.shape(), (Shape{3, 2}));  // the original keeps its shape
  Tensor<float> moved = Tensor<float>(t).reshaped(Shape{1, 6});
  EXPECT_EQ(moved.shape(), (Shape{1, 6}));

  try {
    t.reshape(Shape{4, 2});
    ADD_FAILURE() << "no error";
  } catch (const strata::ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 2]"), std::string::npos) << msg;
  }
  try {
    (void)t.view().reshaped(Shape{5});
    ADD_FAILURE() << "no error";
  } catch (const strata::ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[5]"), std::string::npos) << msg;
  }
  EXPECT_EQ(t.shape(), (Shape{3, 2}));  // a failed reshape changes nothing
}

TEST(Tensor, ViewsAliasTheData) {
  Tensor<float> t(Shape{2, 3});
  TensorView<float> v = t;
  EXPECT_EQ(v.data(), t.data());
  EXPECT_EQ(v.shape(), t.shape());
  EXPECT_EQ(v.numel(), 6);
  EXPECT_EQ(v.size(0), 2);
  v[4] = 7.0f;
  EXPECT_EQ(t[4], 7.0f);

  TensorView<const float> c = v;  // non-const view to const view
  EXPECT_EQ(c[4], 7.0f);
  const Tensor<float>& ct = t;
  TensorView<const float> c2 = ct;
  EXPECT_EQ(c2.data(), t.data());
  static_assert(!std::is_convertible_v<TensorView<const float>, TensorView<float>>,
                "A const view must not convert to a mutable one.");

  TensorView<float> flat = v.reshaped(Shape{6});
  EXPECT_EQ(flat.data(), t.data());
  EXPECT_EQ(flat.span().size(), 6u);

  const Tensor<float> copy = Tensor<float>::copy_of(c);
  t[4] = 0.0f;
  EXPECT_EQ(copy[4], 7.0f);  // copy_of owns its data
  EXPECT_EQ(copy.shape(), t.shape());
}

TEST(Tensor, CopiesShareTheBufferAndCloneDoesNot) {
  Tensor<float> a(Shape{2, 2}, std::vector<float>{1, 2, 3, 4});
  Tensor<float> b = a;  // a handle: same buffer
  EXPECT_TRUE(b.shares_buffer_with(a));
  b[0] = 9.0f;
  EXPECT_EQ(a[0], 9.0f);
  Tensor<float> c = a.clone();
  EXPECT_FALSE(c.shares_buffer_with(a));
  c[1] = -1.0f;
  EXPECT_EQ(a[1], 2.0f);
  EXPECT_EQ(c[0], 9.0f);
  const Tensor<float> r = a.reshaped(Shape{4});  // a view of the same buffer under another shape
  EXPECT_TRUE(r.shares_buffer_with(a));
  EXPECT_EQ(Tensor<float>::zeros(Shape{3})[2], 0.0f);
  EXPECT_EQ(Tensor<float>::empty(Shape{3}).numel(), 3);
  EXPECT_TRUE(Tensor<float>::empty(Shape{0, 3}).empty());
  const Tensor<float> h = strata::to_host(a);  // also a deep copy for a host tensor
  EXPECT_FALSE(h.shares_buffer_with(a));
  EXPECT_EQ(h[0], 9.0f);
}

// Device memory simulated in host memory, to test copies across spaces on a machine without a GPU.
struct HostBackedDeviceResource final : strata::device_memory_resource {
  int allocations = 0, frees = 0, uploads = 0, downloads = 0, device_copies = 0;
  void* allocate(std::size_t bytes) override {
    ++allocations;
    return ::operator new(bytes);
  }
  void deallocate(void* p, std::size_t) noexcept override {
    ++frees;
    ::operator delete(p);
  }
  void copy(void* dst, const void* src, std::size_t bytes, strata::copy_kind kind) override {
    if (kind == strata::copy_kind::host_to_device) ++uploads;
    if (kind == strata::copy_kind::device_to_host) ++downloads;
    if (kind == strata::copy_kind::device_to_device) ++device_copies;
    std::memcpy(dst, src, bytes);
  }
  void zero(void* p, std::size_t bytes) override { std::memset(p, 0, bytes); }
  std::string_view name() const override { return "host-backed test resource"; }
};

TEST(Tensor, DeviceTensorsGoThroughTheThreadsResource) {
  using DeviceTensor = Tensor<float, strata::space::cuda>;
  EXPECT_THROW((void)DeviceTensor::empty(Shape{2}), strata::Error);  // no resource installed yet
  HostBackedDeviceResource resource;
  strata::current_device_resource() = &resource;
  {
    const Tensor<float> host(Shape{2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
    DeviceTensor d = strata::to_device(host);
    EXPECT_EQ(resource.uploads, 1);
    EXPECT_EQ(d.shape(), host.shape());
    static_assert(std::is_same_v<decltype(d.buffer()), strata::device_span<float>>);
    DeviceTensor shared = d;  // handle copy: no allocation, no copy
    EXPECT_EQ(resource.allocations, 1);
    DeviceTensor deep = d.clone();
    EXPECT_EQ(resource.device_copies, 1);
    EXPECT_FALSE(deep.shares_buffer_with(d));
    const Tensor<float> back = strata::to_host(deep);
    EXPECT_EQ(resource.downloads, 1);
    for (index_t i = 0; i < 6; ++i) EXPECT_EQ(back[i], host[i]);
    DeviceTensor zeros = DeviceTensor::zeros(Shape{4});
    Tensor<float> z(Shape{4}, 7.0f);
    strata::copy(z, zeros);
    for (index_t i = 0; i < 4; ++i) EXPECT_EQ(z[i], 0.0f);
    EXPECT_THROW(strata::copy(z, d), strata::ShapeError);  // shapes differ
  }
  EXPECT_EQ(resource.frees, resource.allocations);  // every buffer returned when its last handle goes
  strata::current_device_resource() = nullptr;
}

TEST(Tensor, SliceRowsChecksBounds) {
  Tensor<float> t(Shape{4, 3});
  for (index_t i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(i);
  const TensorView<float> s = t.view().slice_rows(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.data(), t.data() + 3);
  EXPECT_EQ(s[0], 3.0f);
  EXPECT_EQ(s[5], 8.0f);
  EXPECT_EQ(t.view().slice_rows(4, 4).numel(), 0);
  EXPECT_EQ(t.view().slice_rows(0, 4).shape(), t.shape());

  Tensor<float> t3(Shape{3, 2, 2});
  EXPECT_EQ(t3.view().slice_rows(2, 3).data(), t3.data() + 8);

  for (auto [b, e] : std::initializer_list<std::pair<index_t, index_t>>{{2, 5}, {3, 2}, {-1, 1}, {5, 5}}) {
    try {
      (void)t.view().slice_rows(b, e);
      ADD_FAILURE() << "no error for [" << b << ", " << e << ")";
    } catch (const strata::ShapeError& err) {
      EXPECT_NE(std::string(err.what()).find("[4, 3]"), std::string::npos) << err.what();
    }
  }
}

TEST(Tensor, ConvertRoundsThroughAccumulatePrecision) {
  Tensor<float> f(Shape{2, 3}, std::vector<float>{1.0f, -2.5f, 0.1f, 3.14159f, 65504.0f, 1e6f});
  const Tensor<bf16> b = strata::convert<bf16, float>(f.view());
  EXPECT_EQ(b.shape(), f.shape());
  for (index_t i = 0; i < f.numel(); ++i) EXPECT_EQ(b[i].bits, bf16(f[i]).bits);

  const Tensor<float> back = strata::convert<float, bf16>(b.view());
  for (index_t i = 0; i < f.numel(); ++i) EXPECT_EQ(back[i], static_cast<float>(b[i]));

  const Tensor<fp16> h = strata::convert<fp16, bf16>(b.view());
  for (index_t i = 0; i < f.numel(); ++i) EXPECT_EQ(h[i].bits, fp16(static_cast<float>(b[i])).bits);
  EXPECT_TRUE(std::isinf(static_cast<float>(h[5])));

  const Tensor<double> d = strata::convert<double, float>(f.view());
  for (index_t i = 0; i < f.numel(); ++i) EXPECT_EQ(d[i], static_cast<double>(f[i]));
  const Tensor<float> df = strata::convert<float, double>(d.view());
  for (index_t i = 0; i < f.numel(); ++i) EXPECT_EQ(df[i], f[i]);
}

// ---------------------------------------------------------------------------------------------
// Random numbers

TEST(Rng, PhiloxMatchesPublishedKnownAnswers) {
  // Random123 kat_vectors, philox4x32-10. Key words {k0, k1} are passed as k0 | k1 << 32.
  constexpr strata::rng::Block zero = strata::rng::philox4x32({0u, 0u, 0u, 0u}, 0ull);
  EXPECT_EQ(zero, (strata::rng::Block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(strata::rng::philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, ~0ull),
            (strata::rng::Block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(strata::rng::philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                                    0xa4093822ull | (0x299f31d0ull << 32)),
            (strata::rng::Block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Rng, PhiloxIsAPureFunctionOfKeyAndCounter) {
  const std::uint64_t key = 0x0123456789abcdefull;
  EXPECT_EQ(strata::rng::bits(key, 42), strata::rng::bits(key, 42));
  EXPECT_EQ(strata::rng::uniform(key, 42), strata::rng::uniform(key, 42));
  EXPECT_EQ(strata::rng::normal(key, 42), strata::rng::normal(key, 42));
  EXPECT_NE(strata::rng::bits(key, 42), strata::rng::bits(key, 43));
  EXPECT_NE(strata::rng::bits(key, 42), strata::rng::bits(key, 42ull + (1ull << 32)));  // high counter word
  EXPECT_NE(strata::rng::bits(key, 42, 0), strata::rng::bits(key, 42, 1));               // stream
  EXPECT_NE(strata::rng::bits(key, 42), strata::rng::bits(key + 1, 42));
  EXPECT_NE(strata::rng::bits(key, 42), strata::rng::bits(key ^ (1ull << 40), 42));  // high key word
  // Order of draws does not matter: the value is the same computed alone or in a sequence.
  const double alone = strata::rng::uniform(key, 1000);
  for (std::uint64_t i = 0; i < 1000; ++i) (void)strata::rng::uniform(key, i);
  EXPECT_EQ(strata::rng::uniform(key, 1000), alone);
}

TEST(Rng, UniformIsInOpenUnitIntervalWithMeanHalfAndVarianceTwelfth) {
  const std::uint64_t key = strata::rng::parameter_key(7, "uniform");
  const int n = 1000000;
  double sum = 0, sum_sq = 0, lo = 1, hi = 0;
  for (int i = 0; i < n; ++i) {
    const double u = strata::rng::uniform(key, static_cast<std::uint64_t>(i));
    sum += u;
    sum_sq += u * u;
    lo = std::min(lo, u);
    hi = std::max(hi, u);
  }
  EXPECT_GT(lo, 0.0);
  EXPECT_LT(hi, 1.0);
  const double mean = sum / n, var = sum_sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.002);          // standard error ~0.0003
  EXPECT_NEAR(var, 1.0 / 12.0, 0.001);    // standard error ~0.00008
}

TEST(Rng, NormalHasMeanZeroAndVarianceOne) {
  const std::uint64_t key = strata::rng::parameter_key(7, "normal");
  const int n = 1000000;
  double sum = 0, sum_sq = 0;
  int within_one = 0;
  for (int i = 0; i < n; ++i) {
    const double z = strata::rng::normal(key, static_cast<std::uint64_t>(i));
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum_sq += z * z;
    within_one += std::fabs(z) < 1.0;
  }
  const double mean = sum / n, var = sum_sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.006);  // standard error 0.001
  EXPECT_NEAR(var, 1.0, 0.01);    // standard error ~0.0014
  EXPECT_NEAR(static_cast<double>(within_one) / n, 0.682689, 0.003);
}

TEST(Rng, ParameterKeyDiffersByNameAndSeed) {
  using strata::rng::parameter_key;
  EXPECT_EQ(parameter_key(1, "layer.0.weight"), parameter_key(1, "layer.0.weight"));
  EXPECT_NE(parameter_key(1, "layer.0.weight"), parameter_key(1, "layer.1.weight"));
  EXPECT_NE(parameter_key(1, "layer.0.weight"), parameter_key(2, "layer.0.weight"));
  EXPECT_NE(parameter_key(0, "a"), parameter_key(0, "b"));
  EXPECT_NE(parameter_key(0, ""), parameter_key(1, ""));
  static_assert(strata::rng::hash_name("") == 0xcbf29ce484222325ull, "FNV-1a of the empty string is the offset basis.");
  static_assert(strata::rng::hash_name("a") == 0xaf63dc4c8601ec8cull, "FNV-1a 64 of \"a\".");
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(Error, CheckThrowsTheNamedTypeWithTheMessage) {
  EXPECT_NO_THROW(STRATA_CHECK(1 + 1 == 2, strata::ConfigError, "never"));
  try {
    const int tp = 3;
    STRATA_CHECK(8 % tp == 0, strata::ConfigError, "tp = ", tp, " does not divide ", 8, " heads");
    ADD_FAILURE() << "no error";
  } catch (const strata::ConfigError& e) {
    EXPECT_STREQ(e.what(), "tp = 3 does not divide 8 heads");
  }
  EXPECT_THROW(STRATA_CHECK(false, strata::CommError, "x"), strata::CommError);
  EXPECT_THROW(STRATA_CHECK(false, strata::FileError, "x"), strata::Error);  // one family
}

TEST(Error, FailThrowsTheTypeWithTheMessage) {
  try {
    strata::fail<strata::FileError>("file ", std::string("a.bin"), " is truncated at byte ", 12);
  } catch (const strata::FileError& e) {
    EXPECT_STREQ(e.what(), "file a.bin is truncated at byte 12");
  }
  try {
    strata::fail("plain ", 1.5);
  } catch (const strata::Error& e) {
    EXPECT_STREQ(e.what(), "plain 1.5");
  }
  EXPECT_THROW(strata::fail<strata::ShapeError>("s"), std::runtime_error);
  static_assert(std::is_base_of_v<strata::Error, strata::ShapeError> && std::is_base_of_v<strata::Error, strata::CommError>);
}

}  // namespace

namespace {
TEST(Shape, RowsIsTheProductOfAllButTheLastExtentEvenWhenTheLastIsZero) {
  static_assert(strata::Shape{3, 0}.rows() == 3);
  EXPECT_EQ((strata::Shape{2, 4, 0}.rows()), 8);
  EXPECT_EQ((strata::Shape{2, 4, 5}.rows()), 8);
  EXPECT_EQ((strata::Shape{7}.rows()), 1);
  EXPECT_EQ(strata::Shape{}.rows(), 1);
}
// Extents come from files and flags: a product past 64 bits is an error, never a wrapped count.
TEST(Shape, NumelAndRowsThrowWhenTheProductOverflows) {
  const strata::index_t big = strata::index_t{1} << 40;
  const strata::Shape huge{big, big, 3};
  try {
    (void)huge.numel();
    ADD_FAILURE() << "numel of " << huge.str() << " did not throw";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit in a 64-bit integer"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)(strata::Shape{big, big, 1}.rows()), strata::ConfigError);
  // (2^62 + 3) x 4 wraps to exactly 12 in two's complement: the check must still see it.
  EXPECT_THROW((void)(strata::Shape{(strata::index_t{1} << 62) + 3, 4}.numel()), strata::ConfigError);
  EXPECT_EQ((strata::Shape{big, 1 << 20, 4}.numel()), big * (1 << 20) * 4);
}

TEST(CheckedArithmetic, ProductsAndSumsThatFitAreExactAndOthersThrow) {
  EXPECT_EQ(strata::checked_product("test", 3, 5, 7), 105);
  EXPECT_EQ(strata::checked_add(INT64_MAX - 1, 1), INT64_MAX);
  EXPECT_THROW(strata::checked_add(INT64_MAX, 1), strata::ConfigError);
  EXPECT_THROW(strata::checked_mul(INT64_MIN, -1), strata::ConfigError);
  EXPECT_EQ(strata::checked_int(2147483647, "test"), 2147483647);
  EXPECT_THROW(strata::checked_int(2147483648, "test"), strata::ConfigError);
  static_assert(strata::checked_mul(1 << 20, 1 << 20) == std::int64_t{1} << 40, "checked_mul is usable in constant expressions.");
}

// A step allocates the same large buffers every time: a freed one comes back for the next request of
// its size instead of fresh pages, and a zero-filled tensor is zero even when its buffer is reused.
TEST(HostMemory, FreedLargeBuffersAreReusedAndZerosStayZero) {
  constexpr strata::index_t n = 100000;  // 400 KB of float: above the pool's threshold
  const float* first = nullptr;
  {
    auto t = strata::Tensor<float>::empty(strata::Shape{n});
    first = t.data();
    t.fill(7.0f);
  }
  EXPECT_GE(strata::host_memory::idle_bytes(), static_cast<std::size_t>(n) * sizeof(float));
  const auto again = strata::Tensor<float>::zeros(strata::Shape{n});
  EXPECT_EQ(again.data(), first) << "the freed buffer of the same size was not reused";
  for (strata::index_t i = 0; i < n; ++i) ASSERT_EQ(again[i], 0.0f) << "at " << i;
  // Small buffers bypass the pool; a huge idle total is bounded.
  EXPECT_LE(strata::host_memory::idle_bytes(), strata::host_memory::kMaxCachedBytes);
}
}  // namespace
