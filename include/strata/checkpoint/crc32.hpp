// strata/checkpoint/crc32.hpp: CRC-32 (IEEE 802.3: reflected polynomial 0xEDB88320, initial value
// and final xor 0xFFFFFFFF; the checksum of zlib, PNG and gzip), used to detect corrupt
// checkpoint entries.
//
// Slicing-by-4 over a table built at compile time. `crc32_update` continues a running checksum,
// so a tensor can be checked in pieces: crc32(ab) == crc32_update(crc32(a), b).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "../core/config.hpp"

STRATA_NAMESPACE_BEGIN
namespace checkpoint_detail {

inline constexpr std::array<std::array<std::uint32_t, 256>, 4> kCrc32Tables = [] {
  std::array<std::array<std::uint32_t, 256>, 4> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (std::uint32_t i = 0; i < 256; ++i)
    for (int s = 1; s < 4; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xffu];
  return t;
}();

}  // namespace checkpoint_detail

// Continues `crc` (the checksum of the bytes before) over `bytes`.
constexpr std::uint32_t crc32_update(std::uint32_t crc, std::span<const std::byte> bytes) {
  const auto& t = checkpoint_detail::kCrc32Tables;
  std::uint32_t c = ~crc;
  std::size_t i = 0;
  const std::size_t n = bytes.size();
  for (; i + 4 <= n; i += 4) {
    c ^= static_cast<std::uint32_t>(bytes[i]) | static_cast<std::uint32_t>(bytes[i + 1]) << 8 |
         static_cast<std::uint32_t>(bytes[i + 2]) << 16 | static_cast<std::uint32_t>(bytes[i + 3]) << 24;
    c = t[3][c & 0xffu] ^ t[2][(c >> 8) & 0xffu] ^ t[1][(c >> 16) & 0xffu] ^ t[0][c >> 24];
  }
  for (; i < n; ++i) c = t[0][(c ^ static_cast<std::uint32_t>(bytes[i])) & 0xffu] ^ (c >> 8);
  return ~c;
}

constexpr std::uint32_t crc32(std::span<const std::byte> bytes) { return crc32_update(0, bytes); }

// The checksum of a string's characters (handy in tests and for names).
constexpr std::uint32_t crc32(std::string_view text) {
  std::uint32_t c = 0;
  for (char ch : text) {
    const std::byte b = static_cast<std::byte>(ch);
    c = crc32_update(c, std::span<const std::byte>(&b, 1));
  }
  return c;
}

static_assert(crc32(std::string_view("123456789")) == 0xCBF43926u, "CRC-32 check value");

STRATA_NAMESPACE_END
