// strata/checkpoint/format.hpp: the per-rank checkpoint file (".strata"), `StateWriter` which
// writes one and `StateReader` which reads and checks one.
//
// A file holds named tensors and named scalars (the training state). Every tensor records its
// local shape, its global (unsharded) shape and its ShardSpec, so a later loader can reshard.
// Layout (all integers little-endian; tensor data in the host's order, which must be little-endian):
//
//   offset 0   "STRATACK"                     8 bytes, the magic
//          8   u32 format version (1)
//         12   u32 reserved (0)
//         16   u64 file size                  the whole file; checked against the file on disk
//         24   u64 table size                 bytes of the table that starts at offset 32
//         32   table:
//                u32 scalar count, then per scalar (sorted by key):
//                  str key, u8 kind (1 int64, 2 double, 3 string), value (i64 | f64 bits | str)
//                u32 tensor count, then per tensor (in the order added):
//                  str name, u8 dtype, u8 rank + i64 local extents, u8 rank + i64 global extents,
//                  u8 sharded, i32 dim, i32 stacks, i32 shard rank, i32 parts,
//                  u64 data offset, u64 data bytes, u32 CRC-32 of the data
//              u32 CRC-32 of bytes [0, 32 + table size)   (header and table)
//              zero padding to a multiple of 64, then each tensor's data at its 64-byte-aligned offset
//   where str = u32 length + bytes.
//
// Checks on read: magic, version, file size (truncation), the table's CRC and bounds, and each
// tensor's CRC when it is loaded. Errors in the file are FileError; a file that is fine but does
// not fit what the caller asks for (another dtype, another shape) is ConfigError. Both name the
// file.
//
// StateWriter does not copy tensor data: `add` keeps a pointer, so every tensor added must stay
// alive and unchanged until write() returns (passing a temporary does not compile).
//
// Parameters are taken by their members (name, value, global_shape, shard), so this header needs
// no layer type: any parameter-like struct can be stored.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/shape.hpp"
#include "../core/tensor.hpp"
#include "../shard/shard_spec.hpp"
#include "crc32.hpp"
#include "durable_file.hpp"

STRATA_NAMESPACE_BEGIN

static_assert(std::endian::native == std::endian::little,
              "strata checkpoints store tensor data in little-endian order; big-endian hosts are not supported.");

inline constexpr char kCheckpointMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'C', 'K'};
inline constexpr std::uint32_t kCheckpointFormatVersion = 1;
inline constexpr std::size_t kCheckpointHeaderBytes = 32;
inline constexpr std::size_t kCheckpointDataAlignment = 64;

// The element types a checkpoint stores, with their codes in the file.
enum class StoredDtype : std::uint8_t { float32 = 1, float64 = 2, bfloat16 = 3, float16 = 4, int32 = 5, int64 = 6, uint8 = 7 };

template <class X>
inline constexpr bool is_storable_v = std::is_same_v<X, float> || std::is_same_v<X, double> || std::is_same_v<X, bf16> ||
                                      std::is_same_v<X, fp16> || std::is_same_v<X, std::int32_t> ||
                                      std::is_same_v<X, std::int64_t> || std::is_same_v<X, std::uint8_t>;

template <class X>
constexpr StoredDtype stored_dtype() {
  static_assert(is_storable_v<X>,
                "A checkpoint stores tensors of float, double, bf16, fp16, int32, int64 or uint8 only.");
  if constexpr (std::is_same_v<X, float>) return StoredDtype::float32;
  else if constexpr (std::is_same_v<X, double>) return StoredDtype::float64;
  else if constexpr (std::is_same_v<X, bf16>) return StoredDtype::bfloat16;
  else if constexpr (std::is_same_v<X, fp16>) return StoredDtype::float16;
  else if constexpr (std::is_same_v<X, std::int32_t>) return StoredDtype::int32;
  else if constexpr (std::is_same_v<X, std::int64_t>) return StoredDtype::int64;
  else return StoredDtype::uint8;
}

constexpr std::string_view stored_dtype_name(StoredDtype d) {
  switch (d) {
    case StoredDtype::float32: return "float32";
    case StoredDtype::float64: return "float64";
    case StoredDtype::bfloat16: return "bfloat16";
    case StoredDtype::float16: return "float16";
    case StoredDtype::int32: return "int32";
    case StoredDtype::int64: return "int64";
    case StoredDtype::uint8: return "uint8";
  }
  return "unknown";
}

// Bytes per element; 0 for a code that is not a StoredDtype.
constexpr std::size_t stored_dtype_size(StoredDtype d) {
  switch (d) {
    case StoredDtype::float32: return 4;
    case StoredDtype::float64: return 8;
    case StoredDtype::bfloat16: return 2;
    case StoredDtype::float16: return 2;
    case StoredDtype::int32: return 4;
    case StoredDtype::int64: return 8;
    case StoredDtype::uint8: return 1;
  }
  return 0;
}

// One tensor's row in the table.
struct TensorRecord {
  std::string name;
  StoredDtype dtype = StoredDtype::float32;
  Shape local_shape;
  Shape global_shape;
  ShardSpec shard;
  std::uint64_t offset = 0;  // of the data, from the start of the file
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
};

// A named scalar of the training state.
using StateValue = std::variant<std::int64_t, double, std::string>;

inline std::string format_shard(const ShardSpec& s) {
  if (!s.sharded) return "replicated";
  return detail::concat("split dim ", s.dim, " over ", s.parts, " ranks (rank ", s.rank, ", ", s.stacks, " stack",
                        s.stacks == 1 ? "" : "s", ")");
}

inline bool same_shard(const ShardSpec& a, const ShardSpec& b) {
  if (a.sharded != b.sharded) return false;
  if (!a.sharded) return true;
  return a.dim == b.dim && a.stacks == b.stacks && a.rank == b.rank && a.parts == b.parts;
}

namespace checkpoint_detail {

class ByteSink {
 public:
  void u8(std::uint8_t v) { bytes_.push_back(static_cast<std::byte>(v)); }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void i32(std::int32_t v) { u32(static_cast<std::uint32_t>(v)); }
  void i64(std::int64_t v) { u64(static_cast<std::uint64_t>(v)); }
  void f64(double v) { u64(std::bit_cast<std::uint64_t>(v)); }
  void str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    for (char c : s) u8(static_cast<std::uint8_t>(c));
  }
  void shape(const Shape& s) {
    u8(static_cast<std::uint8_t>(s.rank()));
    for (int d = 0; d < s.rank(); ++d) i64(s[d]);
  }
  void raw(std::span<const std::byte> b) { bytes_.insert(bytes_.end(), b.begin(), b.end()); }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

// Reads the table; every read past the end is a FileError naming the file.
class ByteSource {
 public:
  ByteSource(std::span<const std::byte> bytes, const std::filesystem::path& file) : bytes_(bytes), file_(file) {}

  std::uint8_t u8() { return static_cast<std::uint8_t>(take(1)[0]); }
  std::uint32_t u32() {
    auto b = take(4);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(b[i]) << (8 * i);
    return v;
  }
  std::uint64_t u64() {
    auto b = take(8);
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(b[i]) << (8 * i);
    return v;
  }
  std::int32_t i32() { return static_cast<std::int32_t>(u32()); }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  double f64() { return std::bit_cast<double>(u64()); }
  std::string str() {
    const std::uint32_t n = u32();
    auto b = take(n);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  Shape shape() {
    const int rank = u8();
    if (rank > Shape::kMaxRank) malformed(detail::concat("a shape of rank ", rank));
    Shape s;
    for (int d = 0; d < rank; ++d) {
      const std::int64_t e = i64();
      if (e < 0) malformed(detail::concat("a negative extent ", e));
      s = append(s, e);
    }
    return s;
  }
  bool done() const { return pos_ == bytes_.size(); }
  [[noreturn]] void malformed(std::string_view what) const {
    fail<FileError>("checkpoint file ", file_, " is corrupt: its table holds ", what);
  }

 private:
  static Shape append(const Shape& s, index_t e) {
    switch (s.rank()) {
      case 0: return Shape{e};
      case 1: return Shape{s[0], e};
      case 2: return Shape{s[0], s[1], e};
      default: return Shape{s[0], s[1], s[2], e};
    }
  }
  std::span<const std::byte> take(std::size_t n) {
    if (n > bytes_.size() - pos_) malformed("a field that runs past its end");
    auto out = bytes_.subspan(pos_, n);
    pos_ += n;
    return out;
  }

  std::span<const std::byte> bytes_;
  std::filesystem::path file_;
  std::size_t pos_ = 0;
};

constexpr std::uint64_t align_up(std::uint64_t n, std::uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

}  // namespace checkpoint_detail

// Collects named tensors and scalars, then writes them as one checkpoint file.
class StateWriter {
 public:
  // Adds `tensor` under `name`. global: the unsharded shape (empty: the tensor's own shape);
  // shard: where this piece lives (default: replicated). The tensor is not copied.
  template <class X>
  void add(std::string name, const Tensor<X>& tensor, Shape global = {}, ShardSpec shard = {}) {
    static_assert(is_storable_v<X>,
                  "StateWriter::add: a checkpoint stores tensors of float, double, bf16, fp16, int32, int64 or uint8.");
    if (index_.count(name)) fail<ConfigError>("StateWriter: a tensor named '", name, "' was added twice");
    if (global.rank() == 0 && tensor.shape().rank() != 0) global = tensor.shape();
    if (!(local_shape(global, shard) == tensor.shape()))
      fail<ShapeError>("StateWriter: tensor '", name, "' has shape ", tensor.shape().str(), " but a ",
                       format_shard(shard), " piece of global shape ", global.str(), " has shape ",
                       local_shape(global, shard).str());
    TensorRecord r;
    r.name = std::move(name);
    r.dtype = stored_dtype<X>();
    r.local_shape = tensor.shape();
    r.global_shape = global;
    r.shard = shard;
    r.bytes = static_cast<std::uint64_t>(tensor.numel()) * sizeof(X);
    r.crc = crc32(std::as_bytes(tensor.span()));
    index_.emplace(r.name, records_.size());
    records_.push_back(std::move(r));
    data_.push_back(reinterpret_cast<const std::byte*>(tensor.data()));
  }
  template <class X>
  void add(std::string name, const Tensor<X>&& tensor, Shape global = {}, ShardSpec shard = {}) = delete;
  // A tensor in another memory space: a host copy (to_host) is taken now and kept until written.
  template <class X, class Space>
    requires(!std::is_same_v<Space, space::host>)
  void add(std::string name, const Tensor<X, Space>& tensor, Shape global = {}, ShardSpec shard = {}) {
    auto copy = std::make_shared<Tensor<X>>(to_host(tensor));
    add(std::move(name), *copy, global, shard);
    host_copies_.push_back(std::move(copy));
  }

  // A parameter's value under its name, with its global shape and shard.
  template <class P>
  void add_parameter(const P& p) {
    add(p.name, p.value, p.global_shape, p.shard);
  }
  template <class P>
  void add_parameter(const P& p, std::string name) {
    add(std::move(name), p.value, p.global_shape, p.shard);
  }

  void set(std::string key, std::int64_t value) { scalars_[std::move(key)] = value; }
  void set(std::string key, int value) { scalars_[std::move(key)] = std::int64_t{value}; }
  void set(std::string key, double value) { scalars_[std::move(key)] = value; }
  void set(std::string key, std::string value) { scalars_[std::move(key)] = std::move(value); }
  void set(std::string key, const char* value) { scalars_[std::move(key)] = std::string(value); }

  const std::vector<TensorRecord>& tensors() const { return records_; }
  const std::map<std::string, StateValue>& scalars() const { return scalars_; }

  // Writes the file durably: to "<path>.part", fsync'd, renamed to `path`.
  void write(const std::filesystem::path& path) const {
    namespace cd = checkpoint_detail;
    std::vector<TensorRecord> records = records_;
    const std::uint64_t table_size = table(records).size();  // offsets are fixed-width: size known now
    std::uint64_t offset = cd::align_up(kCheckpointHeaderBytes + table_size + 4, kCheckpointDataAlignment);
    for (TensorRecord& r : records) {
      r.offset = offset;
      offset = cd::align_up(offset + r.bytes, kCheckpointDataAlignment);
    }
    const std::uint64_t file_size = records.empty() ? kCheckpointHeaderBytes + table_size + 4
                                                    : records.back().offset + records.back().bytes;
    cd::ByteSink head;
    head.raw(std::as_bytes(std::span<const char>(kCheckpointMagic)));
    head.u32(kCheckpointFormatVersion);
    head.u32(0);
    head.u64(file_size);
    head.u64(table_size);
    head.raw(table(records));
    head.u32(crc32(head.bytes()));

    cd::DurableFile file(path);
    file.write(head.bytes());
    static constexpr std::byte kZeros[kCheckpointDataAlignment] = {};
    for (std::size_t i = 0; i < records.size(); ++i) {
      const std::size_t pad = static_cast<std::size_t>(records[i].offset) - file.written();
      file.write(std::span<const std::byte>(kZeros, pad));
      file.write(std::span<const std::byte>(data_[i], static_cast<std::size_t>(records[i].bytes)));
    }
    if (file.written() != file_size)
      fail<FileError>("StateWriter: wrote ", file.written(), " bytes to ", path, " but planned ", file_size);
    file.commit();
  }

 private:
  std::vector<std::byte> table(const std::vector<TensorRecord>& records) const {
    checkpoint_detail::ByteSink t;
    t.u32(static_cast<std::uint32_t>(scalars_.size()));
    for (const auto& [key, value] : scalars_) {
      t.str(key);
      if (const auto* i = std::get_if<std::int64_t>(&value)) {
        t.u8(1);
        t.i64(*i);
      } else if (const auto* d = std::get_if<double>(&value)) {
        t.u8(2);
        t.f64(*d);
      } else {
        t.u8(3);
        t.str(std::get<std::string>(value));
      }
    }
    t.u32(static_cast<std::uint32_t>(records.size()));
    for (const TensorRecord& r : records) {
      t.str(r.name);
      t.u8(static_cast<std::uint8_t>(r.dtype));
      t.shape(r.local_shape);
      t.shape(r.global_shape);
      t.u8(r.shard.sharded ? 1 : 0);
      t.i32(r.shard.dim);
      t.i32(r.shard.stacks);
      t.i32(r.shard.rank);
      t.i32(r.shard.parts);
      t.u64(r.offset);
      t.u64(r.bytes);
      t.u32(r.crc);
    }
    return std::move(t.bytes());
  }

  std::vector<TensorRecord> records_;
  std::vector<const std::byte*> data_;
  std::vector<std::shared_ptr<const void>> host_copies_;  // host copies of device tensors being written
  std::map<std::string, std::size_t> index_;
  std::map<std::string, StateValue> scalars_;
};

// Opens one checkpoint file, checks its header and table, and loads tensors on request (each
// checked against its CRC as it is read).
class StateReader {
 public:
  explicit StateReader(std::filesystem::path path) : path_(std::move(path)) {
    namespace cd = checkpoint_detail;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path_, ec)) fail<FileError>("checkpoint file ", path_, " does not exist");
    const std::uint64_t actual = std::filesystem::file_size(path_, ec);
    if (ec) fail<FileError>("cannot read the size of checkpoint file ", path_, ": ", ec.message());
    in_.open(path_, std::ios::binary);
    if (!in_) fail<FileError>("cannot open checkpoint file ", path_);
    if (actual < kCheckpointHeaderBytes)
      fail<FileError>("checkpoint file ", path_, " is truncated: it has ", actual, " bytes, less than the ",
                      kCheckpointHeaderBytes, "-byte header");
    std::vector<std::byte> head(kCheckpointHeaderBytes);
    read_at(0, head);
    if (std::memcmp(head.data(), kCheckpointMagic, sizeof(kCheckpointMagic)) != 0)
      fail<FileError>("checkpoint file ", path_, " is not a strata checkpoint (bad magic; expected \"STRATACK\")");
    cd::ByteSource header(std::span<const std::byte>(head).subspan(8), path_);
    const std::uint32_t version = header.u32();
    if (version != kCheckpointFormatVersion)
      fail<FileError>("checkpoint file ", path_, " has format version ", version, "; this build reads version ",
                      kCheckpointFormatVersion);
    header.u32();
    const std::uint64_t file_size = header.u64();
    const std::uint64_t table_size = header.u64();
    if (file_size != actual)
      fail<FileError>("checkpoint file ", path_, " is ", actual < file_size ? "truncated" : "longer than written",
                      ": its header says ", file_size, " bytes, the file has ", actual);
    if (table_size > file_size || kCheckpointHeaderBytes + table_size + 4 > file_size)
      fail<FileError>("checkpoint file ", path_, " is corrupt: its table (", table_size,
                      " bytes) does not fit in the file (", file_size, " bytes)");
    std::vector<std::byte> all(kCheckpointHeaderBytes + static_cast<std::size_t>(table_size) + 4);
    read_at(0, all);
    cd::ByteSource tail(std::span<const std::byte>(all).subspan(all.size() - 4), path_);
    const std::uint32_t stored_crc = tail.u32();
    const std::uint32_t computed = crc32(std::span<const std::byte>(all).first(all.size() - 4));
    if (stored_crc != computed)
      fail<FileError>("checkpoint file ", path_, " is corrupt: the checksum of its header and table does not match");
    parse_table(std::span<const std::byte>(all).subspan(kCheckpointHeaderBytes, static_cast<std::size_t>(table_size)), file_size);
  }

  const std::filesystem::path& path() const { return path_; }

  // Scalars.
  bool has(std::string_view key) const { return scalars_.find(key) != scalars_.end(); }
  std::int64_t get_int(std::string_view key) const { return get<std::int64_t>(key, "an integer"); }
  double get_double(std::string_view key) const { return get<double>(key, "a floating-point number"); }
  const std::string& get_string(std::string_view key) const { return get<std::string>(key, "a string"); }
  const std::map<std::string, StateValue, std::less<>>& scalars() const { return scalars_; }

  // Tensors.
  bool has_tensor(std::string_view name) const { return index_.find(name) != index_.end(); }
  const std::vector<TensorRecord>& tensors() const { return records_; }
  const TensorRecord& record(std::string_view name) const {
    auto it = index_.find(name);
    if (it == index_.end()) fail<FileError>("checkpoint file ", path_, " has no tensor '", name, "'");
    return records_[it->second];
  }

  // Reads tensor `name` into `out`, which must have the stored dtype and (local) shape.
  template <class X>
  void load_into(std::string_view name, Tensor<X>& out) {
    const TensorRecord& r = record(name);
    if (r.dtype != stored_dtype<X>())
      fail<ConfigError>("checkpoint file ", path_, ": tensor '", name, "' is stored as ", stored_dtype_name(r.dtype),
                        " but is being loaded into a ", stored_dtype_name(stored_dtype<X>()), " tensor");
    if (!(r.local_shape == out.shape()))
      fail<ConfigError>("checkpoint file ", path_, ": tensor '", name, "' has shape ", r.local_shape.str(),
                        " but the tensor it is loaded into has shape ", out.shape().str());
    std::span<std::byte> bytes = std::as_writable_bytes(out.span());
    read_at(r.offset, bytes);
    const std::uint32_t computed = crc32(std::span<const std::byte>(bytes));
    if (computed != r.crc)
      fail<FileError>("checkpoint file ", path_, " is corrupt: tensor '", name, "' fails its CRC-32 check (stored ",
                      hex(r.crc), ", computed ", hex(computed), ")");
  }
  // A tensor in another memory space: read on the host, then copied in (to the device).
  template <class X, class Space>
    requires(!std::is_same_v<Space, space::host>)
  void load_into(std::string_view name, Tensor<X, Space>& out) {
    Tensor<X> host = Tensor<X>::empty(out.shape());
    load_into(name, host);
    strata::copy(out, host);
  }
  // Same, and checks that the stored global shape and shard match.
  template <class X, class Space>
    requires(!std::is_same_v<Space, space::host>)
  void load_into(std::string_view name, Tensor<X, Space>& out, const Shape& global, const ShardSpec& shard) {
    check_layout(record(name), global, shard);
    load_into(name, out);
  }
  // Same, and checks that the stored global shape and shard match.
  template <class X>
  void load_into(std::string_view name, Tensor<X>& out, const Shape& global, const ShardSpec& shard) {
    check_layout(record(name), global, shard);
    load_into(name, out);
  }
  // A parameter's value (stored under its name, or under `name`), checking global shape and shard.
  template <class P>
  void load_parameter(P& p) {
    load_into(p.name, p.value, p.global_shape, p.shard);
  }
  template <class P>
  void load_parameter(P& p, std::string_view name) {
    load_into(name, p.value, p.global_shape, p.shard);
  }

 private:
  static std::string hex(std::uint32_t v) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s = "0x";
    for (int i = 7; i >= 0; --i) s += digits[(v >> (4 * i)) & 0xfu];
    return s;
  }

  void check_layout(const TensorRecord& r, const Shape& global, const ShardSpec& shard) const {
    if (!(r.global_shape == global))
      fail<ConfigError>("checkpoint file ", path_, ": tensor '", r.name, "' has global shape ", r.global_shape.str(),
                        " but the model's is ", global.str());
    if (!same_shard(r.shard, shard))
      fail<ConfigError>("checkpoint file ", path_, ": tensor '", r.name, "' was saved as ", format_shard(r.shard),
                        " but is loaded as ", format_shard(shard));
  }

  void read_at(std::uint64_t offset, std::span<std::byte> out) {
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
    if (!in_ || static_cast<std::size_t>(in_.gcount()) != out.size())
      fail<FileError>("cannot read ", out.size(), " bytes at offset ", offset, " of checkpoint file ", path_,
                      " (truncated?)");
  }

  template <class V>
  const V& get(std::string_view key, const char* kind) const {
    auto it = scalars_.find(key);
    if (it == scalars_.end()) fail<FileError>("checkpoint file ", path_, " has no value '", key, "'");
    const V* v = std::get_if<V>(&it->second);
    if (!v) fail<FileError>("checkpoint file ", path_, ": value '", key, "' is not ", kind);
    return *v;
  }

  void parse_table(std::span<const std::byte> table, std::uint64_t file_size) {
    checkpoint_detail::ByteSource t(table, path_);
    const std::uint32_t n_scalars = t.u32();
    for (std::uint32_t i = 0; i < n_scalars; ++i) {
      std::string key = t.str();
      const std::uint8_t kind = t.u8();
      StateValue value;
      if (kind == 1) value = t.i64();
      else if (kind == 2) value = t.f64();
      else if (kind == 3) value = t.str();
      else t.malformed(detail::concat("value '", key, "' of unknown kind ", int{kind}));
      scalars_.emplace(std::move(key), std::move(value));
    }
    const std::uint32_t n_tensors = t.u32();
    for (std::uint32_t i = 0; i < n_tensors; ++i) {
      TensorRecord r;
      r.name = t.str();
      r.dtype = static_cast<StoredDtype>(t.u8());
      const std::size_t element = stored_dtype_size(r.dtype);
      if (element == 0) t.malformed(detail::concat("tensor '", r.name, "' of unknown dtype code ", int(r.dtype)));
      r.local_shape = t.shape();
      r.global_shape = t.shape();
      r.shard.sharded = t.u8() != 0;
      r.shard.dim = t.i32();
      r.shard.stacks = t.i32();
      r.shard.rank = t.i32();
      r.shard.parts = t.i32();
      r.offset = t.u64();
      r.bytes = t.u64();
      r.crc = t.u32();
      // Extents are file contents: their products are checked, so a huge table entry is reported
      // as corrupt instead of wrapping into a plausible byte count.
      std::int64_t local_bytes = 0;
      try {
        local_bytes = checked_mul(r.local_shape.numel(), static_cast<std::int64_t>(element), "tensor bytes");
        (void)r.global_shape.numel();
      } catch (const ConfigError&) {
        t.malformed(detail::concat("tensor '", r.name, "' of shape ", r.local_shape.str(), " (global ", r.global_shape.str(),
                                   "), more elements than a 64-bit size can count"));
      }
      if (r.bytes != static_cast<std::uint64_t>(local_bytes))
        t.malformed(detail::concat("tensor '", r.name, "' of ", r.bytes, " bytes for ", r.local_shape.str(), " ",
                                   stored_dtype_name(r.dtype), " elements"));
      if (r.offset > file_size || r.bytes > file_size - r.offset)
        t.malformed(detail::concat("tensor '", r.name, "' at bytes [", r.offset, ", ", r.offset + r.bytes,
                                   ") outside the file"));
      if (index_.count(r.name)) t.malformed(detail::concat("tensor '", r.name, "' twice"));
      index_.emplace(r.name, records_.size());
      records_.push_back(std::move(r));
    }
    if (!t.done()) t.malformed("bytes after its last entry");
  }

  std::filesystem::path path_;
  std::ifstream in_;
  std::map<std::string, StateValue, std::less<>> scalars_;
  std::vector<TensorRecord> records_;
  std::map<std::string, std::size_t, std::less<>> index_;
};

STRATA_NAMESPACE_END
