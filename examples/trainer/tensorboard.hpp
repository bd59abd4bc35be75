// trainer/tensorboard.hpp: `TensorBoardWriter`, scalars written as TensorBoard event files
// (what --tensorboard-dir writes), with no TensorFlow or protobuf library.
//
// An event file is a sequence of TFRecords:
//   u64 length (little-endian), u32 masked CRC-32C of those 8 bytes, `length` bytes of data,
//   u32 masked CRC-32C of the data                  (masked: ((crc >> 15) | (crc << 17)) + 0xa282ead8)
// where each record's data is a serialized tensorflow.Event protocol buffer:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2"; every later one a Summary with one scalar.
// The file is named events.out.tfevents.<seconds>.<host>.<pid> (TensorBoard looks for
// "tfevents" in the name), flushed at each flush() so a running TensorBoard sees the scalars.
#pragma once

#include <unistd.h>

#include <array>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <strata/core/error.hpp>

namespace trainer {

namespace tensorboard_detail {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), as TFRecord uses.
inline constexpr std::array<std::uint32_t, 256> kCrc32cTable = [] {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    table[i] = c;
  }
  return table;
}();

constexpr std::uint32_t crc32c(std::span<const std::uint8_t> bytes) {
  std::uint32_t crc = 0xffffffffu;
  for (std::uint8_t b : bytes) crc = kCrc32cTable[(crc ^ b) & 0xffu] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

constexpr std::uint32_t masked_crc32c(std::span<const std::uint8_t> bytes) {
  const std::uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// Protocol-buffer wire format, the few field kinds an Event needs.
class Proto {
 public:
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      bytes_.push_back(static_cast<std::uint8_t>(v | 0x80));
      v >>= 7;
    }
    bytes_.push_back(static_cast<std::uint8_t>(v));
  }
  void key(int field, int wire_type) { varint(static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire_type)); }
  void fixed64(int field, std::uint64_t v) {
    key(field, 1);
    for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void fixed32(int field, std::uint32_t v) {
    key(field, 5);
    for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void int64(int field, std::int64_t v) {
    key(field, 0);
    varint(static_cast<std::uint64_t>(v));
  }
  void bytes(int field, std::span<const std::uint8_t> b) {
    key(field, 2);
    varint(b.size());
    bytes_.insert(bytes_.end(), b.begin(), b.end());
  }
  void string(int field, std::string_view s) {
    bytes(field, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()));
  }
  const std::vector<std::uint8_t>& data() const { return bytes_; }

 private:
  std::vector<std::uint8_t> bytes_;
};

}  // namespace tensorboard_detail

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it.
  explicit TensorBoardWriter(const std::filesystem::path& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) strata::fail<strata::FileError>("--tensorboard-dir: cannot create ", dir, ": ", ec.message());
    char host[256] = "localhost";
    ::gethostname(host, sizeof host - 1);
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    path_ = dir / ("events.out.tfevents." + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count()) +
                   "." + host + "." + std::to_string(::getpid()));
    out_.open(path_, std::ios::binary | std::ios::trunc);
    if (!out_) strata::fail<strata::FileError>("--tensorboard-dir: cannot create the event file ", path_);
    tensorboard_detail::Proto event;
    event.fixed64(1, std::bit_cast<std::uint64_t>(wall_time()));
    event.string(3, "brain.Event:2");
    record(event.data());
    flush();
  }

  // One scalar `tag` at `step` (TensorBoard's simple_value is a float).
  void scalar(std::string_view tag, double value, std::int64_t step) {
    tensorboard_detail::Proto v;
    v.string(1, tag);
    v.fixed32(2, std::bit_cast<std::uint32_t>(static_cast<float>(value)));
    tensorboard_detail::Proto summary;
    summary.bytes(1, v.data());
    tensorboard_detail::Proto event;
    event.fixed64(1, std::bit_cast<std::uint64_t>(wall_time()));
    event.int64(2, step);
    event.bytes(5, summary.data());
    record(event.data());
  }

  void flush() {
    out_.flush();
    if (!out_) strata::fail<strata::FileError>("--tensorboard-dir: writing ", path_, " failed (disk full?)");
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  static double wall_time() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  void record(const std::vector<std::uint8_t>& data) {
    std::uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(data.size()) >> (8 * i));
    const std::uint32_t length_crc = tensorboard_detail::masked_crc32c(length);
    const std::uint32_t data_crc = tensorboard_detail::masked_crc32c(data);
    auto u32 = [&](std::uint32_t v) {
      for (int i = 0; i < 4; ++i) out_.put(static_cast<char>(v >> (8 * i)));
    };
    out_.write(reinterpret_cast<const char*>(length), 8);
    u32(length_crc);
    out_.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    u32(data_crc);
  }

  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace trainer
