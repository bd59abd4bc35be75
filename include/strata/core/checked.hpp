// strata/core/checked.hpp: checked 64-bit integer arithmetic for sizes that come from user input or
// file contents (flags, model configurations, checkpoint tables, dataset indices).
//
// A size computed from an outside number must never wrap: a wrapped product looks like a small or
// negative size and turns into an out-of-bounds access or a bogus allocation later. These helpers
// compute in std::int64_t with the compiler's overflow builtins and throw ConfigError naming what
// was being computed and the operands when the exact result does not fit. They are constexpr, so
// a constant expression that overflows does not compile.
#pragma once

#include <cstdint>

#include "error.hpp"

STRATA_NAMESPACE_BEGIN

// a * b, or ConfigError "<what>: a x b does not fit in 64 bits".
constexpr std::int64_t checked_mul(std::int64_t a, std::int64_t b, const char* what = "size") {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out))
    fail<ConfigError>(what, ": ", a, " x ", b, " does not fit in a 64-bit integer; the sizes are far too large");
  return out;
}

// a + b, or ConfigError "<what>: a + b does not fit in 64 bits".
constexpr std::int64_t checked_add(std::int64_t a, std::int64_t b, const char* what = "size") {
  std::int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out))
    fail<ConfigError>(what, ": ", a, " + ", b, " does not fit in a 64-bit integer; the sizes are far too large");
  return out;
}

// The product of all arguments, checked at every step.
template <class... Ints>
constexpr std::int64_t checked_product(const char* what, Ints... factors) {
  std::int64_t out = 1;
  ((out = checked_mul(out, static_cast<std::int64_t>(factors), what)), ...);
  return out;
}

// value as an int, or ConfigError naming `what` when it does not fit.
constexpr int checked_int(std::int64_t value, const char* what) {
  if (value < INT32_MIN || value > INT32_MAX)
    fail<ConfigError>(what, " = ", value, " does not fit in a 32-bit int; use smaller sizes");
  return static_cast<int>(value);
}

STRATA_NAMESPACE_END
