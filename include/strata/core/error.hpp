// strata/core/error.hpp: the exception types and the check macro.
//
// Every error says which value is wrong, why, and (where it can) what to do. Errors are
// exceptions derived from strata::Error so callers can catch the whole family at once;
// the subclasses let tests and tools tell a bad configuration from a bad file or a
// communication failure.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "config.hpp"

STRATA_NAMESPACE_BEGIN

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A configuration that cannot work (found before anything is allocated).
struct ConfigError : Error {
  using Error::Error;
};
// Two tensors whose shapes do not fit together.
struct ShapeError : Error {
  using Error::Error;
};
// A file that is missing, truncated, corrupt or of the wrong kind; the message names the file.
struct FileError : Error {
  using Error::Error;
};
// A collective that failed, timed out or was aborted; the message names group, rank, operation.
struct CommError : Error {
  using Error::Error;
};

namespace detail {
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

// Throw `Type` with a message built from the streamed parts.
template <class Type = Error, class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw Type(detail::concat(std::forward<Parts>(parts)...));
}

STRATA_NAMESPACE_END

// STRATA_CHECK(cond, Type, parts...): throws Type with the message when cond is false.
#define STRATA_CHECK(cond, Type, ...)                  \
  do {                                                 \
    if (!(cond)) ::strata::fail<Type>(__VA_ARGS__);    \
  } while (0)
