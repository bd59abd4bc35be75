// strata/shard/problem.hpp: `Problem`, the answer of a validation ("fine", or one sentence why not).
//
// Validation runs in constant expressions as well as at run time, so its result cannot hold a
// std::string: a Problem is a fixed buffer of chars with a length. An empty Problem means the
// input is fine. `Problem::sentence(parts...)` builds the message from string pieces and integers
// in a constant expression. `raise_if(problem)` turns a Problem into a thrown ConfigError at run
// time; in a constant expression it calls a function that is not constexpr, so an invalid
// configuration used at compile time does not compile.
#pragma once

#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

#include "../core/error.hpp"

STRATA_NAMESPACE_BEGIN

class Problem {
 public:
  static constexpr std::size_t kCapacity = 384;

  constexpr Problem() = default;

  // A Problem whose message is the concatenation of the parts (string pieces and integers).
  template <class... Parts>
  static constexpr Problem sentence(const Parts&... parts) {
    Problem p;
    (p.append(parts), ...);
    return p;
  }

  constexpr bool ok() const { return length_ == 0; }
  constexpr std::string_view message() const { return {text_, length_}; }

 private:
  template <class Part>
  constexpr void append(const Part& part) {
    if constexpr (std::is_same_v<Part, bool>) {
      append_text(part ? "true" : "false");
    } else if constexpr (std::integral<Part>) {
      append_integer(static_cast<long long>(part));
    } else {
      append_text(std::string_view(part));
    }
  }
  constexpr void append_text(std::string_view s) {
    for (char c : s) push(c);
  }
  constexpr void append_integer(long long v) {
    char digits[24]{};
    int n = 0;
    unsigned long long u = v < 0 ? 0ull - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
    do {
      digits[n++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u != 0);
    if (v < 0) push('-');
    while (n > 0) push(digits[--n]);
  }
  constexpr void push(char c) {
    if (length_ < kCapacity) text_[length_++] = c;  // a longer message is cut, never overflows
  }

  char text_[kCapacity]{};
  std::size_t length_ = 0;
};

namespace detail {
// Not constexpr on purpose: reaching it in a constant expression is a compile error.
[[noreturn]] inline void configuration_is_invalid(const Problem& problem) {
  throw ConfigError(std::string(problem.message()));
}
}  // namespace detail

// Throws ConfigError with the problem's sentence unless the problem is empty.
constexpr void raise_if(const Problem& problem) {
  if (!problem.ok()) detail::configuration_is_invalid(problem);
}

STRATA_NAMESPACE_END
