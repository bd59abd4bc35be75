// strata/core/shape.hpp: `Shape`, a small fixed-capacity list of extents (row-major, up to 4 dims).
//
// Extents come from user input and from files (checkpoint tables), so numel() and rows() multiply
// with checked 64-bit arithmetic: a product that does not fit throws instead of wrapping.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "checked.hpp"
#include "error.hpp"

STRATA_NAMESPACE_BEGIN

using index_t = std::int64_t;

class Shape {
 public:
  static constexpr int kMaxRank = 4;

  constexpr Shape() = default;
  constexpr Shape(std::initializer_list<index_t> extents) {
    if (extents.size() > kMaxRank) fail<ShapeError>("a Shape holds at most ", kMaxRank, " dimensions, got ", extents.size());
    for (index_t e : extents) {
      if (e < 0) fail<ShapeError>("a Shape extent must be >= 0, got ", e);
      extents_[rank_++] = e;
    }
  }

  constexpr int rank() const { return rank_; }
  // Extent of dimension d; negative d counts from the end (-1 is the last).
  constexpr index_t operator[](int d) const { return extents_[normalize(d)]; }
  constexpr index_t& operator[](int d) { return extents_[normalize(d)]; }
  constexpr index_t numel() const {
    index_t n = 1;
    for (int i = 0; i < rank_; ++i) n = checked_mul(n, extents_[i], "number of elements of a Shape");
    return n;
  }
  // Product of all extents but the last: the "rows" of a row-major matrix view.
  constexpr index_t rows() const {
    index_t n = 1;
    for (int i = 0; i + 1 < rank_; ++i) n = checked_mul(n, extents_[i], "rows of a Shape");
    return n;
  }
  constexpr index_t cols() const { return rank_ == 0 ? 1 : extents_[rank_ - 1]; }
  constexpr Shape with(int d, index_t extent) const {
    Shape out = *this;
    out[d] = extent;
    return out;
  }
  constexpr int normalize(int d) const {
    int n = d < 0 ? d + rank_ : d;
    if (n < 0 || n >= rank_) fail<ShapeError>("dimension ", d, " is out of range for a shape of rank ", rank_);
    return n;
  }

  friend constexpr bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.extents_[i] != b.extents_[i]) return false;
    return true;
  }

  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(extents_[i]);
    return s + "]";
  }

 private:
  std::array<index_t, kMaxRank> extents_{};
  int rank_ = 0;
};

// Throws ShapeError naming `what` when the two shapes differ.
inline void check_same_shape(const Shape& a, const Shape& b, const char* what) {
  if (!(a == b)) fail<ShapeError>(what, ": shapes differ, ", a.str(), " vs ", b.str());
}

STRATA_NAMESPACE_END
