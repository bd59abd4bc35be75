// strata/data/llmc_shard.hpp: llm.c token shards (`*.bin` from llm.c's dev/data scripts), read
// through a memory map, and written.
//
// Layout (little-endian): a header of 256 int32 — [0] magic 20240520, [1] version 1, [2] token
// count N, the rest zero — followed by N uint16 tokens. The tokens start at byte 1024, so the map
// is viewed as `std::span<const std::uint16_t>` without copying. The reader checks magic, version
// and that the file holds exactly 1024 + 2N bytes; anything else is a FileError naming the file.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mapped_file.hpp"

STRATA_NAMESPACE_BEGIN
namespace data {

inline constexpr std::int32_t kLlmcMagic = 20240520;
inline constexpr std::int32_t kLlmcVersion = 1;
inline constexpr std::size_t kLlmcHeaderInts = 256;
inline constexpr std::size_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(std::int32_t);

class LlmcShard {
 public:
  explicit LlmcShard(std::string path) : file_(std::move(path)) {
    const std::size_t size = file_.size();
    if (size < kLlmcHeaderBytes)
      bad("truncated: the header needs ", kLlmcHeaderBytes, " bytes but the file has ", size);
    auto magic = detail::load<std::int32_t>(file_.data());
    if (magic != kLlmcMagic) bad("bad magic ", magic, " (expected ", kLlmcMagic, " for an llm.c token shard)");
    auto version = detail::load<std::int32_t>(file_.data() + 4);
    if (version != kLlmcVersion) bad("unsupported version ", version, " (expected ", kLlmcVersion, ")");
    auto count = detail::load<std::int32_t>(file_.data() + 8);
    if (count < 0) bad("negative token count ", count);
    const std::size_t expected = kLlmcHeaderBytes + static_cast<std::size_t>(count) * sizeof(std::uint16_t);
    if (size < expected) bad("truncated: the header announces ", count, " tokens (", expected, " bytes) but the file has ", size);
    if (size > expected) bad("size mismatch: the header announces ", count, " tokens (", expected, " bytes) but the file has ", size);
    tokens_ = {reinterpret_cast<const std::uint16_t*>(file_.data() + kLlmcHeaderBytes), static_cast<std::size_t>(count)};
  }

  const std::string& path() const { return file_.path(); }
  std::int64_t size() const { return static_cast<std::int64_t>(tokens_.size()); }
  std::span<const std::uint16_t> tokens() const { return tokens_; }
  std::uint16_t operator[](std::int64_t i) const { return tokens_[static_cast<std::size_t>(i)]; }

 private:
  [[noreturn]] void bad(const auto&... parts) const { fail<FileError>("'", file_.path(), "': ", parts...); }

  MappedFile file_;
  std::span<const std::uint16_t> tokens_{};
};

// Writes an llm.c shard (through a temporary file renamed into place). Every token must fit uint16.
template <std::ranges::contiguous_range Range>
  requires std::is_integral_v<std::ranges::range_value_t<Range>>
void write_llmc_shard(const std::string& path, const Range& tokens) {
  std::span<const std::ranges::range_value_t<Range>> in(std::ranges::data(tokens), std::ranges::size(tokens));
  if (in.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    fail<ConfigError>("llm.c shard '", path, "': ", in.size(), " tokens do not fit the int32 count field");
  std::array<std::int32_t, kLlmcHeaderInts> header{};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = static_cast<std::int32_t>(in.size());
  std::vector<std::uint16_t> out(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (!std::in_range<std::uint16_t>(in[i]))
      fail<ConfigError>("llm.c shard '", path, "': token ", +in[i], " at position ", i, " does not fit uint16");
    out[i] = static_cast<std::uint16_t>(in[i]);
  }
  detail::PendingFile file(path);
  file.write(header.data(), sizeof(header));
  file.write(out.data(), out.size() * sizeof(std::uint16_t));
  file.commit();
}

}  // namespace data
STRATA_NAMESPACE_END
