// strata/checkpoint/format.hpp: the per-rank checkpoint file (".strata"), `StateWriter` which
// writes one and `StateReader` which reads and checks one.
//
// A file holds named tensors and named scalars (the training state). Every tensor records its
// global (unsharded) shape, its ShardSpec (which tensor-parallel piece of the global tensor this
// rank's local shard is) and which elements of that local shard it holds: elements
// [flat_begin, flat_begin + numel) in row-major order, so a whole shard (flat_begin 0, the local
// shape) or a flat range of one (a distributed optimizer's share). That is enough for a loader to
// assemble any other layout's shards (reshard.hpp).
// Layout (all integers little-endian; tensor data in the host's order, which must be little-endian):
//
//   offset 0   "STRATACK"                     8 bytes, the magic
//          8   u32 format version (2; version 1 files are read too)
//         12   u32 reserved (0)
//         16   u64 file size                  the whole file; checked against the file on disk
//         24   u64 table size                 bytes of the table that starts at offset 32
//         32   table:
//                u32 scalar count, then per scalar (sorted by key):
//                  str key, u8 kind (1 int64, 2 double, 3 string), value (i64 | f64 bits | str)
//                u32 tensor count, then per tensor (in the order added):
//                  str name, u8 dtype, u8 rank + i64 stored extents, u8 rank + i64 global extents,
//                  u8 sharded, i32 dim, i32 stacks, i32 shard rank, i32 parts,
//                  i64 flat_begin, u64 data offset, u64 data bytes,
//                  u64 chunk bytes, u32 chunk count, u32 CRC-32 of each chunk of the data
//                (version 1: no flat_begin, and one u32 CRC-32 of the whole data instead of chunks)
//              u32 CRC-32 of bytes [0, 32 + table size)   (header and table)
//              zero padding to a multiple of 64, then each tensor's data at its 64-byte-aligned offset
//   where str = u32 length + bytes.
//
// The data of a tensor is checked in chunks of kCheckpointCrcChunkBytes (1 MiB), each with its own
// CRC-32, so a loader that needs part of a tensor reads and checks only the chunks holding it.
//
// Checks on read: magic, version, file size (truncation), the table's CRC and bounds, and the CRC
// of every chunk read. Errors in the file are FileError; a file that is fine but does not fit what
// the caller asks for (another dtype, another shape) is ConfigError. Both name the file.
//
// StateWriter does not copy host tensor data unless asked (copy_data(true), for a write that runs
// while training goes on): `add` keeps a pointer, so every tensor added must stay alive and
// unchanged until write() returns (passing a temporary does not compile). Tensors in device memory
// are always copied to the host when added. CRCs are computed by write().
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
#include "../core/file.hpp"
#include "../core/shape.hpp"
#include "../core/tensor.hpp"
#include "../shard/shard_spec.hpp"
#include "crc32.hpp"
#include "durable_file.hpp"

STRATA_NAMESPACE_BEGIN

static_assert(std::endian::native == std::endian::little,
              "strata checkpoints store tensor data in little-endian order; big-endian hosts are not supported.");

// The most ranks (one file each) a checkpoint may be saved by or converted for.
inline constexpr std::int64_t kMaxCheckpointRanks = std::int64_t{1} << 20;
inline constexpr char kCheckpointMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'C', 'K'};
inline constexpr std::uint32_t kCheckpointFormatVersion = 2;
inline constexpr std::uint64_t kCheckpointCrcChunkBytes = std::uint64_t{1} << 20;
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
  Shape local_shape;   // the stored data's shape: the local shard's, or [n] for a flat range of it
  Shape global_shape;
  ShardSpec shard;
  index_t flat_begin = 0;    // first element of the local shard held (row-major)
  std::uint64_t offset = 0;  // of the data, from the start of the file
  std::uint64_t bytes = 0;
  std::uint64_t chunk_bytes = kCheckpointCrcChunkBytes;
  std::vector<std::uint32_t> crcs;  // one per chunk of the data

  index_t numel() const { return local_shape.numel(); }
  // True when the data is the whole local shard in its own shape (what StateReader::load_into reads).
  bool whole_shard() const { return flat_begin == 0 && local_shape == strata::local_shape(global_shape, shard); }
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
  StateWriter() = default;
  // With copy_data(true), host tensors added from then on are copied, so they may change (training
  // goes on) before write() runs.
  void copy_data(bool copy) { copy_data_ = copy; }

  // Adds `tensor` under `name`. global: the unsharded shape (empty: the tensor's own shape);
  // shard: where this piece lives (default: replicated).
  template <class X>
  void add(std::string name, const Tensor<X>& tensor, Shape global = {}, ShardSpec shard = {}) {
    if (global.rank() == 0 && tensor.shape().rank() != 0) global = tensor.shape();
    if (!(local_shape(global, shard) == tensor.shape()))
      fail<ShapeError>("StateWriter: tensor '", name, "' has shape ", tensor.shape().str(), " but a ",
                       format_shard(shard), " piece of global shape ", global.str(), " has shape ",
                       local_shape(global, shard).str());
    add_record<X>(std::move(name), tensor.data(), tensor.shape(), global, shard, 0);
  }
  template <class X>
  void add(std::string name, const Tensor<X>&& tensor, Shape global = {}, ShardSpec shard = {}) = delete;
  // A tensor in another memory space: a host copy (to_host) is taken now and kept until written.
  template <class X, class Space>
    requires(!std::is_same_v<Space, space::host>)
  void add(std::string name, const Tensor<X, Space>& tensor, Shape global = {}, ShardSpec shard = {}) {
    const bool copying = copy_data_;
    copy_data_ = false;  // the host copy below is already this writer's own
    add(std::move(name), keep(to_host(tensor)), global, shard);
    copy_data_ = copying;
  }

  // Elements [begin, begin + count) of `tensor` (any memory space), which are elements
  // [flat_begin, flat_begin + count) of the local shard `shard` of a tensor of shape `global`.
  template <class X, class Space>
  void add_range(std::string name, const Tensor<X, Space>& tensor, index_t begin, index_t count, const Shape& global,
                 const ShardSpec& shard, index_t flat_begin) {
    const index_t shard_numel = local_shape(global, shard).numel();
    if (begin < 0 || count < 0 || begin + count > tensor.numel() || flat_begin < 0 || flat_begin + count > shard_numel)
      fail<ShapeError>("StateWriter: range '", name, "' of ", count, " elements at ", begin, " of a tensor of ",
                       tensor.numel(), ", placed at ", flat_begin, " of a ", format_shard(shard), " piece of ",
                       global.str(), " (", shard_numel, " elements), does not fit");
    if constexpr (std::is_same_v<Space, space::host>) {
      add_record<X>(std::move(name), tensor.data() + begin, Shape{count}, global, shard, flat_begin);
    } else {
      // One host copy per device tensor, however many ranges of it are added.
      auto it = device_copies_.find(tensor.data());
      if (it == device_copies_.end()) it = device_copies_.emplace(tensor.data(), &keep(to_host(tensor))).first;
      const bool copying = copy_data_;
      copy_data_ = false;
      add_record<X>(std::move(name), static_cast<const Tensor<X>*>(it->second)->data() + begin, Shape{count}, global,
                    shard, flat_begin);
      copy_data_ = copying;
    }
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
  // Bytes of tensor data the file will hold.
  std::uint64_t data_bytes() const {
    std::uint64_t n = 0;
    for (const TensorRecord& r : records_) n += r.bytes;
    return n;
  }

  // Writes the file durably: to "<path>.part", fsync'd, renamed to `path`. Computes the CRCs.
  void write(const std::filesystem::path& path) const {
    namespace cd = checkpoint_detail;
    std::vector<TensorRecord> records = records_;
    for (std::size_t i = 0; i < records.size(); ++i) {
      TensorRecord& r = records[i];
      const std::uint64_t chunks = (r.bytes + r.chunk_bytes - 1) / r.chunk_bytes;
      r.crcs.resize(static_cast<std::size_t>(chunks));
      for (std::uint64_t c = 0; c < chunks; ++c) {
        const std::uint64_t first = c * r.chunk_bytes, n = std::min(r.chunk_bytes, r.bytes - first);
        r.crcs[static_cast<std::size_t>(c)] = crc32(std::span<const std::byte>(data_[i] + first, static_cast<std::size_t>(n)));
      }
    }
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
  template <class X>
  const Tensor<X>& keep(Tensor<X> copy) {
    auto owned = std::make_shared<Tensor<X>>(std::move(copy));
    const Tensor<X>& ref = *owned;
    host_copies_.push_back(std::move(owned));
    return ref;
  }

  template <class X>
  void add_record(std::string name, const X* data, const Shape& stored, const Shape& global, const ShardSpec& shard,
                  index_t flat_begin) {
    static_assert(is_storable_v<X>,
                  "StateWriter::add: a checkpoint stores tensors of float, double, bf16, fp16, int32, int64 or uint8.");
    if (index_.count(name)) fail<ConfigError>("StateWriter: a tensor named '", name, "' was added twice");
    if (copy_data_) {
      auto copy = std::make_shared<std::vector<X>>(data, data + stored.numel());
      data = copy->data();
      host_copies_.push_back(std::move(copy));
    }
    TensorRecord r;
    r.name = std::move(name);
    r.dtype = stored_dtype<X>();
    r.local_shape = stored;
    r.global_shape = global;
    r.shard = shard;
    r.flat_begin = flat_begin;
    r.bytes = static_cast<std::uint64_t>(stored.numel()) * sizeof(X);
    index_.emplace(r.name, records_.size());
    records_.push_back(std::move(r));
    data_.push_back(reinterpret_cast<const std::byte*>(data));
  }

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
      t.i64(r.flat_begin);
      t.u64(r.offset);
      t.u64(r.bytes);
      t.u64(r.chunk_bytes);
      t.u32(static_cast<std::uint32_t>(r.crcs.size()));
      for (std::uint32_t crc : r.crcs) t.u32(crc);
    }
    return std::move(t.bytes());
  }

  bool copy_data_ = false;
  std::vector<TensorRecord> records_;
  std::vector<const std::byte*> data_;
  std::vector<std::shared_ptr<const void>> host_copies_;  // data this writer owns (device copies, copy_data)
  std::map<const void*, const void*> device_copies_;       // device tensor data -> its host copy (add_range)
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
    require_regular_file(path_, "checkpoint file");  // before the open, which a FIFO would block
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
    version_ = header.u32();
    if (version_ != 1 && version_ != kCheckpointFormatVersion)
      fail<FileError>("checkpoint file ", path_, " has format version ", version_, "; this build reads versions 1 to ",
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
  std::uint32_t version() const { return version_; }

  // Bytes [first, first + out.size()) of the data of tensor `r` (a record of this file). Every
  // CRC chunk touched is read whole and checked.
  void read_bytes(const TensorRecord& r, std::uint64_t first, std::span<std::byte> out) {
    if (first > r.bytes || out.size() > r.bytes - first)
      fail<ConfigError>("checkpoint file ", path_, ": bytes [", first, ", ", first + out.size(), ") of tensor '", r.name,
                        "' lie outside its ", r.bytes, " bytes");
    if (out.empty()) return;
    const std::uint64_t last = first + out.size();
    std::vector<std::byte> chunk;
    for (std::uint64_t c = first / r.chunk_bytes; c * r.chunk_bytes < last; ++c) {
      const std::uint64_t begin = c * r.chunk_bytes, n = std::min(r.chunk_bytes, r.bytes - begin);
      const std::uint64_t lo = std::max(begin, first), hi = std::min(begin + n, last);
      const bool whole = lo == begin && hi == begin + n;
      std::span<std::byte> target;
      if (whole) {
        target = out.subspan(static_cast<std::size_t>(begin - first), static_cast<std::size_t>(n));
      } else {
        chunk.resize(static_cast<std::size_t>(n));
        target = chunk;
      }
      read_at(r.offset + begin, target);
      const std::uint32_t computed = crc32(std::span<const std::byte>(target));
      const std::uint32_t stored = r.crcs[static_cast<std::size_t>(c)];
      if (computed != stored)
        fail<FileError>("checkpoint file ", path_, " is corrupt: tensor '", r.name, "' fails its CRC-32 check",
                        r.crcs.size() > 1 ? detail::concat(" in bytes [", begin, ", ", begin + n, ")") : std::string(),
                        " (stored ", hex(stored), ", computed ", hex(computed), ")");
      if (!whole)
        std::memcpy(out.data() + (lo - first), chunk.data() + (lo - begin), static_cast<std::size_t>(hi - lo));
    }
  }

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
    if (r.flat_begin != 0)
      fail<ConfigError>("checkpoint file ", path_, ": tensor '", name, "' holds elements from ", r.flat_begin,
                        " of its shard, not the whole shard; load it through a ShardedCheckpoint");
    read_bytes(r, 0, std::as_writable_bytes(out.span()));
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
      if (version_ >= 2) r.flat_begin = t.i64();
      r.offset = t.u64();
      r.bytes = t.u64();
      if (version_ >= 2) {
        r.chunk_bytes = t.u64();
        const std::uint32_t chunks = t.u32();
        if (r.chunk_bytes == 0 || chunks != (r.bytes + r.chunk_bytes - 1) / r.chunk_bytes)
          t.malformed(detail::concat("tensor '", r.name, "' with ", chunks, " CRC chunks of ", r.chunk_bytes, " bytes for ",
                                     r.bytes, " bytes of data"));
        r.crcs.resize(chunks);
        for (std::uint32_t& crc : r.crcs) crc = t.u32();
      } else {  // version 1: one CRC of the whole data
        r.chunk_bytes = std::max<std::uint64_t>(r.bytes, 1);
        r.crcs.assign(1, t.u32());
        if (r.bytes == 0) r.crcs.clear();
      }
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
      const int dims = r.global_shape.rank();
      if (r.shard.sharded && (r.shard.parts < 1 || r.shard.stacks < 1 || r.shard.rank < 0 || r.shard.rank >= r.shard.parts ||
                              r.shard.dim < -dims || r.shard.dim >= dims))
        t.malformed(detail::concat("tensor '", r.name, "' with an impossible shard (dim ", r.shard.dim, " of ", dims,
                                   ", rank ", r.shard.rank, " of ", r.shard.parts, ", ", r.shard.stacks, " stacks)"));
      std::int64_t shard_numel = 0;
      try {
        shard_numel = local_shape(r.global_shape, r.shard).numel();
      } catch (const Error&) {
        t.malformed(detail::concat("tensor '", r.name, "' of global shape ", r.global_shape.str(), " that its shard (",
                                   format_shard(r.shard), ") does not divide"));
      }
      if (r.flat_begin < 0 || r.flat_begin > shard_numel || r.local_shape.numel() > shard_numel - r.flat_begin)
        t.malformed(detail::concat("tensor '", r.name, "' holding elements [", r.flat_begin, ", ",
                                   r.flat_begin + r.local_shape.numel(), ") of a shard of ", shard_numel));
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
  std::uint32_t version_ = kCheckpointFormatVersion;
  std::ifstream in_;
  std::map<std::string, StateValue, std::less<>> scalars_;
  std::vector<TensorRecord> records_;
  std::map<std::string, std::size_t, std::less<>> index_;
};

STRATA_NAMESPACE_END
