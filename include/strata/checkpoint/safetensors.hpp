// strata/checkpoint/safetensors.hpp: the safetensors format (Hugging Face's tensor file), our own
// reader and writer: `SafetensorsWriter`, `SafetensorsFile` (one file) and `SafetensorsDirectory`
// (a model directory: one model.safetensors, or shards listed by model.safetensors.index.json).
//
// A file (all integers little-endian):
//
//   offset 0   u64 N                      length of the header
//          8   N bytes of JSON            {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]},
//                                          ..., "__metadata__": {"<key>": "<string>", ...}}
//      8 + N   the data section           tensor <name> occupies bytes [b, e) of it, row-major, little-endian
//
// Writer: deterministic. The header lists "__metadata__" first, then the tensors sorted by name;
// the data holds the tensors by element size (largest first), then by name, so that each one
// starts aligned to its element size; the header is padded with spaces to a multiple of 8 bytes.
// The file is written durably (".part", fsync, rename; durable_file.hpp). Tensor data is produced
// one tensor at a time while writing, so a writer never holds a second copy of the model.
//
// Reader: checks everything before handing out a byte, and reads a tensor (or a run of its
// elements) with positioned reads, never the whole file. Each error is a FileError naming the file
// (and the tensor): a header length below 2, above 100 MB or past the end of the file; a header
// that is not strict JSON (json.hpp) or not an object of tensor entries; an unknown dtype; a shape
// that is not a list of non-negative integers or whose element count overflows; data_offsets that
// are not two integers, disagree with shape x element size, leave the data section, overlap
// another tensor, or leave a hole (as the reference implementation, every byte of the data section
// belongs to exactly one tensor); metadata that is not string -> string. Reading into another
// element type converts between F32, F64, BF16 and F16 (round to nearest even); integer types are
// read only into their own type. A request the file cannot serve (a missing tensor, a conversion
// that does not exist) is a ConfigError.
//
// Directory: model.safetensors when present (as transformers prefers it), else the index, whose
// weight_map must name, for every tensor, a plain file name in the directory that exists, is a
// valid safetensors file and holds that tensor.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/checked.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/file.hpp"
#include "../core/shape.hpp"
#include "../core/tensor.hpp"
#include "durable_file.hpp"
#include "json.hpp"

STRATA_NAMESPACE_BEGIN

static_assert(std::endian::native == std::endian::little,
              "safetensors files hold little-endian data; big-endian hosts are not supported.");

inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
inline constexpr std::string_view kSafetensorsModelFile = "model.safetensors";
inline constexpr std::string_view kSafetensorsIndexFile = "model.safetensors.index.json";

// The dtypes of the format (its codes: "F32", "BF16", ...).
enum class SafetensorsDtype : std::uint8_t {
  boolean, uint8, int8, uint16, int16, uint32, int32, uint64, int64,
  float16, bfloat16, float32, float64, float8_e4m3, float8_e5m2
};

constexpr std::string_view safetensors_dtype_code(SafetensorsDtype d) {
  switch (d) {
    case SafetensorsDtype::boolean: return "BOOL";
    case SafetensorsDtype::uint8: return "U8";
    case SafetensorsDtype::int8: return "I8";
    case SafetensorsDtype::uint16: return "U16";
    case SafetensorsDtype::int16: return "I16";
    case SafetensorsDtype::uint32: return "U32";
    case SafetensorsDtype::int32: return "I32";
    case SafetensorsDtype::uint64: return "U64";
    case SafetensorsDtype::int64: return "I64";
    case SafetensorsDtype::float16: return "F16";
    case SafetensorsDtype::bfloat16: return "BF16";
    case SafetensorsDtype::float32: return "F32";
    case SafetensorsDtype::float64: return "F64";
    case SafetensorsDtype::float8_e4m3: return "F8_E4M3";
    case SafetensorsDtype::float8_e5m2: return "F8_E5M2";
  }
  return "?";
}

constexpr std::size_t safetensors_dtype_size(SafetensorsDtype d) {
  switch (d) {
    case SafetensorsDtype::boolean:
    case SafetensorsDtype::uint8:
    case SafetensorsDtype::int8:
    case SafetensorsDtype::float8_e4m3:
    case SafetensorsDtype::float8_e5m2: return 1;
    case SafetensorsDtype::uint16:
    case SafetensorsDtype::int16:
    case SafetensorsDtype::float16:
    case SafetensorsDtype::bfloat16: return 2;
    case SafetensorsDtype::uint32:
    case SafetensorsDtype::int32:
    case SafetensorsDtype::float32: return 4;
    case SafetensorsDtype::uint64:
    case SafetensorsDtype::int64:
    case SafetensorsDtype::float64: return 8;
  }
  return 0;
}

inline std::optional<SafetensorsDtype> parse_safetensors_dtype(std::string_view code) {
  for (int i = 0; i <= static_cast<int>(SafetensorsDtype::float8_e5m2); ++i) {
    const auto d = static_cast<SafetensorsDtype>(i);
    if (safetensors_dtype_code(d) == code) return d;
  }
  return std::nullopt;
}

constexpr bool is_safetensors_float(SafetensorsDtype d) {
  return d == SafetensorsDtype::float32 || d == SafetensorsDtype::float64 || d == SafetensorsDtype::bfloat16 ||
         d == SafetensorsDtype::float16;
}

template <class X>
inline constexpr bool is_safetensors_element_v =
    std::is_same_v<X, float> || std::is_same_v<X, double> || std::is_same_v<X, bf16> || std::is_same_v<X, fp16> ||
    std::is_same_v<X, std::int32_t> || std::is_same_v<X, std::int64_t> || std::is_same_v<X, std::uint8_t>;

// The dtype a C++ element type is stored as.
template <class X>
constexpr SafetensorsDtype safetensors_dtype() {
  static_assert(is_safetensors_element_v<X>,
                "safetensors: strata reads and writes float, double, bf16, fp16, int32, int64 and uint8 elements.");
  if constexpr (std::is_same_v<X, float>) return SafetensorsDtype::float32;
  else if constexpr (std::is_same_v<X, double>) return SafetensorsDtype::float64;
  else if constexpr (std::is_same_v<X, bf16>) return SafetensorsDtype::bfloat16;
  else if constexpr (std::is_same_v<X, fp16>) return SafetensorsDtype::float16;
  else if constexpr (std::is_same_v<X, std::int32_t>) return SafetensorsDtype::int32;
  else if constexpr (std::is_same_v<X, std::int64_t>) return SafetensorsDtype::int64;
  else return SafetensorsDtype::uint8;
}

// One tensor of a file.
struct SafetensorsEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::float32;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 1;
  std::uint64_t begin = 0, end = 0;  // [begin, end) of the data section

  std::string shape_str() const {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

namespace safetensors_detail {

// Converts n elements of stored dtype `from` (little-endian bytes) to X.
template <class X>
void convert_elements(const std::byte* in, SafetensorsDtype from, std::size_t n, X* out) {
  auto each = [&](auto tag) {
    using S = decltype(tag);
    for (std::size_t i = 0; i < n; ++i) {
      S s;
      std::memcpy(&s, in + i * sizeof(S), sizeof(S));
      if constexpr (std::is_same_v<X, bf16> || std::is_same_v<X, fp16>) {
        if constexpr (std::is_same_v<S, double>) out[i] = X(static_cast<double>(s));
        else out[i] = X(static_cast<float>(s));
      } else {
        if constexpr (std::is_same_v<S, double> || std::is_same_v<S, float>) out[i] = static_cast<X>(s);
        else out[i] = static_cast<X>(static_cast<float>(s));
      }
    }
  };
  switch (from) {
    case SafetensorsDtype::float32: each(float{}); break;
    case SafetensorsDtype::float64: each(double{}); break;
    case SafetensorsDtype::bfloat16: each(bf16{}); break;
    case SafetensorsDtype::float16: each(fp16{}); break;
    default: break;  // refused by the caller
  }
}

// X -> n elements of dtype `to`, as little-endian bytes.
template <class X>
void store_elements(const X* in, std::size_t n, SafetensorsDtype to, std::byte* out) {
  auto each = [&](auto tag) {
    using S = decltype(tag);
    for (std::size_t i = 0; i < n; ++i) {
      S s;
      if constexpr (std::is_same_v<S, bf16> || std::is_same_v<S, fp16>) {
        if constexpr (std::is_same_v<X, double>) s = S(in[i]);
        else s = S(static_cast<float>(in[i]));
      } else if constexpr (std::is_same_v<X, bf16> || std::is_same_v<X, fp16>) {
        s = static_cast<S>(static_cast<float>(in[i]));
      } else {
        s = static_cast<S>(in[i]);
      }
      std::memcpy(out + i * sizeof(S), &s, sizeof(S));
    }
  };
  switch (to) {
    case SafetensorsDtype::float32: each(float{}); break;
    case SafetensorsDtype::float64: each(double{}); break;
    case SafetensorsDtype::bfloat16: each(bf16{}); break;
    case SafetensorsDtype::float16: each(fp16{}); break;
    default: break;  // refused by the caller
  }
}

// Whether elements stored as `stored` can be read into (or written from) X.
template <class X>
constexpr bool convertible(SafetensorsDtype stored) {
  if (stored == safetensors_dtype<X>()) return true;
  constexpr bool x_float = std::is_same_v<X, float> || std::is_same_v<X, double> || is_half_v<X>;
  return x_float && is_safetensors_float(stored);
}

inline std::string quoted_path(const std::filesystem::path& p) {
  std::ostringstream out;
  out << p;
  return out.str();
}

// A read-only file descriptor with positioned reads (safe to share between threads).
class ReadOnlyFile {
 public:
  ReadOnlyFile() = default;
  explicit ReadOnlyFile(const std::filesystem::path& path) : path_(path) {
    // Checked to be a regular file before anything could block on it (a FIFO).
    fd_ = ReadableFile(path, "safetensors file").release();
  }
  ReadOnlyFile(ReadOnlyFile&& other) noexcept : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept {
    if (this != &other) {
      close();
      path_ = std::move(other.path_);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile() { close(); }

  std::uint64_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail<FileError>("cannot read the size of ", path_, ": ", checkpoint_detail::errno_text(errno));
    return static_cast<std::uint64_t>(st.st_size);
  }

  // Exactly out.size() bytes at `offset`, or FileError (a short read means the file shrank).
  void read_at(std::uint64_t offset, std::span<std::byte> out) const {
    std::size_t done = 0;
    while (done < out.size()) {
      const ::ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        fail<FileError>("cannot read ", out.size(), " bytes at offset ", offset, " of ", path_, ": ",
                        checkpoint_detail::errno_text(errno));
      }
      if (n == 0)
        fail<FileError>("cannot read ", out.size(), " bytes at offset ", offset, " of ", path_,
                        ": the file ends early (was it truncated while being read?)");
      done += static_cast<std::size_t>(n);
    }
  }

 private:
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace safetensors_detail

// One safetensors file, opened and checked (see the top of this file); tensors are read on request.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::filesystem::path path) : path_(std::move(path)) {
    file_ = safetensors_detail::ReadOnlyFile(path_);
    const std::uint64_t size = file_.size();
    if (size < 8)
      fail<FileError>("safetensors file ", path_, " is truncated: it has ", size,
                      " bytes, fewer than the 8 of its header length");
    std::byte length_bytes[8];
    file_.read_at(0, length_bytes);
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(length_bytes[i]) << (8 * i);
    if (n < 2) fail<FileError>("safetensors file ", path_, " is corrupt: its header length is ", n, " bytes (at least 2: \"{}\")");
    if (n > kSafetensorsMaxHeaderBytes)
      fail<FileError>("safetensors file ", path_, " is corrupt: its header length ", n, " bytes exceeds the limit of ",
                      kSafetensorsMaxHeaderBytes);
    if (n > size - 8)
      fail<FileError>("safetensors file ", path_, " is truncated or corrupt: its header length ", n,
                      " bytes runs past the end of the file (", size, " bytes)");
    data_start_ = 8 + n;
    data_size_ = size - data_start_;
    std::string header(static_cast<std::size_t>(n), '\0');
    file_.read_at(8, std::as_writable_bytes(std::span<char>(header.data(), header.size())));
    parse_header(header);
  }

  const std::filesystem::path& path() const { return path_; }
  // Sorted by name.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }
  std::uint64_t data_offset() const { return data_start_; }  // of the data section, in the file

  bool has(std::string_view name) const { return find(name) != nullptr; }
  const SafetensorsEntry* find(std::string_view name) const {
    auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                               [](const SafetensorsEntry& e, std::string_view n) { return e.name < n; });
    return it != entries_.end() && it->name == name ? &*it : nullptr;
  }
  const SafetensorsEntry& entry(std::string_view name) const {
    const SafetensorsEntry* e = find(name);
    if (!e) fail<ConfigError>("safetensors file ", path_, " has no tensor '", name, "'");
    return *e;
  }

  // Elements [first, first + out.size()) of tensor `name` (row-major), converted to X.
  template <class X>
  void read(std::string_view name, std::span<X> out, std::int64_t first = 0) const {
    static_assert(is_safetensors_element_v<X>,
                  "SafetensorsFile::read: read into float, double, bf16, fp16, int32, int64 or uint8 elements.");
    const SafetensorsEntry& e = entry(name);
    if (!safetensors_detail::convertible<X>(e.dtype))
      fail<ConfigError>("safetensors file ", path_, ": tensor '", name, "' is stored as ", safetensors_dtype_code(e.dtype),
                        ", which strata cannot read into ", dtype_label<X>(), " elements",
                        is_safetensors_float(e.dtype) || !is_safetensors_float(safetensors_dtype<X>())
                            ? ""
                            : " (floating-point tensors convert among F32, F64, BF16 and F16 only)");
    const std::int64_t count = static_cast<std::int64_t>(out.size());
    if (first < 0 || first > e.numel || count > e.numel - first)
      fail<ConfigError>("safetensors file ", path_, ": elements [", first, ", ", first + count, ") of tensor '", name,
                        "' are outside its ", e.numel, " elements");
    const std::size_t element = safetensors_dtype_size(e.dtype);
    const std::uint64_t offset = data_start_ + e.begin + static_cast<std::uint64_t>(first) * element;
    if (e.dtype == safetensors_dtype<X>()) {
      file_.read_at(offset, std::as_writable_bytes(out));
      return;
    }
    // Through a bounded buffer, converting as it goes.
    constexpr std::size_t kChunkElements = std::size_t{1} << 22;
    std::vector<std::byte> buffer(std::min(out.size(), kChunkElements) * element);
    for (std::size_t done = 0; done < out.size();) {
      const std::size_t n = std::min(kChunkElements, out.size() - done);
      file_.read_at(offset + done * element, std::span<std::byte>(buffer.data(), n * element));
      safetensors_detail::convert_elements(buffer.data(), e.dtype, n, out.data() + done);
      done += n;
    }
  }

  // The whole tensor, converted to X (its shape must have at most 4 dimensions).
  template <class X>
  Tensor<X> read_tensor(std::string_view name) const {
    const SafetensorsEntry& e = entry(name);
    if (e.shape.size() > static_cast<std::size_t>(Shape::kMaxRank))
      fail<ConfigError>("safetensors file ", path_, ": tensor '", name, "' has ", e.shape.size(),
                        " dimensions; a strata Tensor holds at most ", Shape::kMaxRank);
    Shape shape;
    switch (e.shape.size()) {
      case 0: shape = Shape{}; break;
      case 1: shape = Shape{e.shape[0]}; break;
      case 2: shape = Shape{e.shape[0], e.shape[1]}; break;
      case 3: shape = Shape{e.shape[0], e.shape[1], e.shape[2]}; break;
      default: shape = Shape{e.shape[0], e.shape[1], e.shape[2], e.shape[3]}; break;
    }
    Tensor<X> out = Tensor<X>::empty(shape);
    read<X>(name, std::span<X>(out.data(), static_cast<std::size_t>(e.numel)));
    return out;
  }

  template <class X>
  static constexpr std::string_view dtype_label() {
    if constexpr (std::is_same_v<X, std::uint8_t>) return "uint8";
    else return dtype_name<X>();
  }

 private:
  [[noreturn]] void corrupt(std::string_view what) const {
    fail<FileError>("safetensors file ", path_, " is corrupt: ", what);
  }

  void parse_header(std::string_view text) {
    if (text.front() != '{') corrupt("its header does not start with '{'");
    const json::Value header = json::parse(text, detail::concat("the header of safetensors file ", path_));
    if (!header.is_object()) corrupt("its header is not a JSON object");
    for (const auto& [name, value] : header.members()) {
      if (name == "__metadata__") {
        if (!value.is_object()) corrupt("its __metadata__ is not an object of strings");
        for (const auto& [key, v] : value.members()) {
          if (!v.is_string())
            corrupt(detail::concat("its __metadata__ value '", key, "' is ", json::Value::kind_name(v.kind()),
                                   ", not a string"));
          metadata_.emplace(key, v.text());
        }
        continue;
      }
      entries_.push_back(parse_entry(name, value));
    }
    std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    // Every byte of the data section belongs to exactly one tensor.
    std::vector<const SafetensorsEntry*> by_offset;
    for (const auto& e : entries_) by_offset.push_back(&e);
    std::stable_sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
      return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    std::uint64_t covered = 0;
    const SafetensorsEntry* previous = nullptr;
    for (const SafetensorsEntry* e : by_offset) {
      if (e->begin < covered)
        corrupt(detail::concat("tensor '", e->name, "' at data bytes [", e->begin, ", ", e->end, ") overlaps tensor '",
                               previous->name, "' at [", previous->begin, ", ", previous->end, ")"));
      if (e->begin > covered)
        corrupt(detail::concat("data bytes [", covered, ", ", e->begin, ") before tensor '", e->name,
                               "' belong to no tensor (the data section must have no holes)"));
      covered = e->end;
      previous = e;
    }
    if (covered != data_size_)
      corrupt(detail::concat("its tensors cover ", covered, " bytes of the data section, which has ", data_size_,
                             covered < data_size_ ? " (trailing bytes belong to no tensor)" : ""));
  }

  SafetensorsEntry parse_entry(const std::string& name, const json::Value& value) const {
    SafetensorsEntry e;
    e.name = name;
    auto bad = [&](std::string_view what) { corrupt(detail::concat("tensor '", name, "' ", what)); };
    if (!value.is_object()) bad("is not described by an object");
    const json::Value* dtype = value.find("dtype");
    const json::Value* shape = value.find("shape");
    const json::Value* offsets = value.find("data_offsets");
    if (!dtype || !shape || !offsets) bad("lacks one of \"dtype\", \"shape\" and \"data_offsets\"");
    for (const auto& [key, v] : value.members())
      if (key != "dtype" && key != "shape" && key != "data_offsets") bad(detail::concat("has an unknown field \"", key, "\""));
    if (!dtype->is_string()) bad("has a dtype that is not a string");
    const auto parsed = parse_safetensors_dtype(dtype->text());
    if (!parsed) bad(detail::concat("has the unknown dtype \"", dtype->text(), "\""));
    e.dtype = *parsed;
    if (!shape->is_array()) bad("has a shape that is not an array");
    for (const json::Value& extent : shape->items()) {
      std::int64_t x = 0;
      if (!extent.to_int64(x) || x < 0)
        bad(detail::concat("has the shape entry ", extent.is_number() ? extent.text() : std::string(json::Value::kind_name(extent.kind())),
                           ", not a non-negative integer"));
      e.shape.push_back(x);
    }
    std::int64_t bytes = 0;
    try {
      e.numel = 1;
      for (std::int64_t x : e.shape) e.numel = checked_mul(e.numel, x, "tensor elements");
      bytes = checked_mul(e.numel, static_cast<std::int64_t>(safetensors_dtype_size(e.dtype)), "tensor bytes");
    } catch (const ConfigError&) {
      bad(detail::concat("has the shape ", e.shape_str(), ", more elements than a 64-bit size can count"));
    }
    if (!offsets->is_array() || offsets->items().size() != 2 || !offsets->items()[0].to_uint64(e.begin) ||
        !offsets->items()[1].to_uint64(e.end))
      bad("has data_offsets that are not two non-negative integers [begin, end]");
    if (e.end < e.begin) bad(detail::concat("has data_offsets [", e.begin, ", ", e.end, "] that end before they begin"));
    if (e.end - e.begin != static_cast<std::uint64_t>(bytes))
      bad(detail::concat("has data_offsets [", e.begin, ", ", e.end, "] of ", e.end - e.begin, " bytes, but its shape ",
                         e.shape_str(), " of ", safetensors_dtype_code(e.dtype), " needs ", bytes));
    if (e.end > data_size_)
      bad(detail::concat("has data_offsets [", e.begin, ", ", e.end, "] outside the data section of ", data_size_,
                         " bytes (a truncated file?)"));
    return e;
  }

  std::filesystem::path path_;
  safetensors_detail::ReadOnlyFile file_;
  std::uint64_t data_start_ = 0, data_size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

// Collects tensors, then writes them as one safetensors file (see the top of this file).
class SafetensorsWriter {
 public:
  // Writes the tensor's bytes (little-endian, row-major) into a buffer of exactly its size.
  using Fill = std::function<void(std::span<std::byte>)>;

  // A tensor whose data `fill` produces when the file is written.
  void add(std::string name, SafetensorsDtype dtype, std::vector<std::int64_t> shape, Fill fill) {
    if (name.empty() || name == "__metadata__")
      fail<ConfigError>("SafetensorsWriter: '", name, "' cannot name a tensor");
    if (tensors_.count(name)) fail<ConfigError>("SafetensorsWriter: a tensor named '", name, "' was added twice");
    Pending p;
    p.dtype = dtype;
    std::int64_t numel = 1;
    for (std::int64_t x : shape) {
      if (x < 0) fail<ConfigError>("SafetensorsWriter: tensor '", name, "' has a negative extent ", x);
      numel = checked_mul(numel, x, "tensor elements");
    }
    p.bytes = static_cast<std::uint64_t>(
        checked_mul(numel, static_cast<std::int64_t>(safetensors_dtype_size(dtype)), "tensor bytes"));
    p.shape = std::move(shape);
    p.fill = std::move(fill);
    tensors_.emplace(std::move(name), std::move(p));
  }

  // A host tensor, stored as `stored` (converted among the floating types). The tensor is not
  // copied: it must stay alive and unchanged until write() returns.
  template <class X>
  void add(std::string name, const Tensor<X>& tensor, SafetensorsDtype stored = safetensors_dtype<X>()) {
    static_assert(is_safetensors_element_v<X>,
                  "SafetensorsWriter::add: a tensor of float, double, bf16, fp16, int32, int64 or uint8 elements.");
    if (!safetensors_detail::convertible<X>(stored))
      fail<ConfigError>("SafetensorsWriter: tensor '", name, "' of ", SafetensorsFile::dtype_label<X>(),
                        " elements cannot be stored as ", safetensors_dtype_code(stored));
    std::vector<std::int64_t> shape;
    for (int d = 0; d < tensor.shape().rank(); ++d) shape.push_back(tensor.shape()[d]);
    const X* data = tensor.data();
    const std::size_t n = static_cast<std::size_t>(tensor.numel());
    add(std::move(name), stored, std::move(shape), [data, n, stored](std::span<std::byte> out) {
      if (stored == safetensors_dtype<X>()) std::memcpy(out.data(), data, n * sizeof(X));
      else safetensors_detail::store_elements(data, n, stored, out.data());
    });
  }
  template <class X>
  void add(std::string name, const Tensor<X>&& tensor, SafetensorsDtype stored = safetensors_dtype<X>()) = delete;

  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

  bool empty() const { return tensors_.empty(); }
  std::size_t size() const { return tensors_.size(); }
  // Bytes of the data section.
  std::uint64_t data_bytes() const {
    std::uint64_t total = 0;
    for (const auto& [name, p] : tensors_) total += p.bytes;
    return total;
  }

  // Writes the file durably: to "<path>.part", fsync'd, renamed to `path`.
  void write(const std::filesystem::path& path) const {
    // Data order: larger elements first (each tensor starts aligned to its element size), then by name.
    std::vector<const std::pair<const std::string, Pending>*> order;
    for (const auto& item : tensors_) order.push_back(&item);
    std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
      return safetensors_dtype_size(a->second.dtype) > safetensors_dtype_size(b->second.dtype);
    });
    std::map<std::string_view, std::uint64_t> offsets;
    std::uint64_t offset = 0;
    for (const auto* item : order) {
      offsets[item->first] = offset;
      offset += item->second.bytes;
    }
    std::string header = "{";
    auto separate = [&header] {
      if (header.size() > 1 && header.back() != '{') header += ',';
    };
    if (!metadata_.empty()) {
      header += "\"__metadata__\":{";
      for (const auto& [key, value] : metadata_) {
        separate();
        header.append(json::quote(key)).append(":").append(json::quote(value));
      }
      header += "}";
    }
    for (const auto& [name, p] : tensors_) {
      const std::uint64_t begin = offsets[name];
      separate();
      header.append(json::quote(name)).append(":{\"dtype\":\"").append(safetensors_dtype_code(p.dtype)).append("\",\"shape\":[");
      for (std::size_t i = 0; i < p.shape.size(); ++i) {
        if (i) header += ',';
        header.append(std::to_string(p.shape[i]));
      }
      header.append("],\"data_offsets\":[").append(std::to_string(begin)).append(",").append(std::to_string(begin + p.bytes)).append("]}");
    }
    header += "}";
    while (header.size() % 8 != 0) header += ' ';
    if (header.size() > kSafetensorsMaxHeaderBytes)
      fail<ConfigError>("SafetensorsWriter: the header of ", path, " would be ", header.size(),
                        " bytes, over the format's limit of ", kSafetensorsMaxHeaderBytes, "; write fewer tensors per file");

    checkpoint_detail::DurableFile file(path);
    std::byte length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<std::byte>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
    file.write(length);
    file.write(std::as_bytes(std::span<const char>(header.data(), header.size())));
    std::vector<std::byte> buffer;
    for (const auto* item : order) {
      buffer.assign(static_cast<std::size_t>(item->second.bytes), std::byte{0});
      item->second.fill(buffer);
      file.write(buffer);
    }
    if (file.written() != 8 + header.size() + offset)
      fail<FileError>("SafetensorsWriter: wrote ", file.written(), " bytes to ", path, " but planned ", 8 + header.size() + offset);
    file.commit();
  }

 private:
  struct Pending {
    SafetensorsDtype dtype = SafetensorsDtype::float32;
    std::vector<std::int64_t> shape;
    std::uint64_t bytes = 0;
    Fill fill;
  };
  std::map<std::string, Pending, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A model directory: <dir>/model.safetensors, or the shards <dir>/model.safetensors.index.json
// lists (see the top of this file). Every file is opened and checked when the directory is.
class SafetensorsDirectory {
 public:
  explicit SafetensorsDirectory(std::filesystem::path dir) : dir_(std::move(dir)) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir_, ec)) fail<FileError>("model directory ", dir_, " does not exist");
    const std::filesystem::path single = dir_ / kSafetensorsModelFile;
    const std::filesystem::path index = dir_ / kSafetensorsIndexFile;
    if (std::filesystem::exists(single, ec)) {
      files_.push_back(std::make_unique<SafetensorsFile>(single));
      for (const SafetensorsEntry& e : files_.front()->entries()) where_.emplace(e.name, 0);
      return;
    }
    if (!std::filesystem::exists(index, ec))
      fail<FileError>("model directory ", dir_, " holds neither ", kSafetensorsModelFile, " nor ", kSafetensorsIndexFile);
    read_index(index);
  }

  const std::filesystem::path& directory() const { return dir_; }
  // The index file when the weights are sharded, else empty.
  const std::filesystem::path& index_path() const { return index_path_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

  bool has(std::string_view name) const { return where_.find(name) != where_.end(); }
  // Every tensor name, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, file] : where_) out.push_back(name);
    return out;
  }
  const SafetensorsFile& file_of(std::string_view name) const {
    auto it = where_.find(name);
    if (it == where_.end()) fail<ConfigError>("model directory ", dir_, " has no tensor '", name, "'");
    return *files_[it->second];
  }
  const SafetensorsEntry& entry(std::string_view name) const { return file_of(name).entry(name); }

  template <class X>
  void read(std::string_view name, std::span<X> out, std::int64_t first = 0) const {
    file_of(name).read<X>(name, out, first);
  }
  template <class X>
  Tensor<X> read_tensor(std::string_view name) const {
    return file_of(name).read_tensor<X>(name);
  }

 private:
  void read_index(const std::filesystem::path& index) {
    index_path_ = index;
    const std::string text = read_whole_file(index, "index file", kMaxConfigBytes);
    const json::Value root = json::parse(text, detail::concat("index file ", index));
    const json::Value* map = root.is_object() ? root.find("weight_map") : nullptr;
    if (!map || !map->is_object())
      fail<FileError>("index file ", index, " is corrupt: it has no \"weight_map\" object");
    if (const json::Value* metadata = root.find("metadata"); metadata && !metadata->is_object() && !metadata->is_null())
      fail<FileError>("index file ", index, " is corrupt: its \"metadata\" is not an object");
    std::map<std::string, std::size_t> opened;
    for (const auto& [name, file] : map->members()) {
      if (!file.is_string())
        fail<FileError>("index file ", index, " is corrupt: tensor '", name, "' maps to ",
                        json::Value::kind_name(file.kind()), ", not a file name");
      const std::string& file_name = file.text();
      if (file_name.empty() || file_name.find('/') != std::string::npos || file_name.find('\\') != std::string::npos ||
          file_name == "." || file_name == "..")
        fail<FileError>("index file ", index, " is corrupt: tensor '", name, "' maps to \"", file_name,
                        "\", which is not a plain file name in the directory");
      auto it = opened.find(file_name);
      if (it == opened.end()) {
        const std::filesystem::path shard = dir_ / file_name;
        std::error_code ec;
        if (!std::filesystem::exists(shard, ec))
          fail<FileError>("index file ", index, " maps tensor '", name, "' to ", shard, ", which does not exist");
        files_.push_back(std::make_unique<SafetensorsFile>(shard));
        it = opened.emplace(file_name, files_.size() - 1).first;
      }
      if (!files_[it->second]->has(name))
        fail<FileError>("index file ", index, " maps tensor '", name, "' to ", files_[it->second]->path(),
                        ", which does not hold it");
      where_.emplace(name, it->second);
    }
  }

  std::filesystem::path dir_;
  std::filesystem::path index_path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::size_t, std::less<>> where_;  // tensor -> index in files_
};

STRATA_NAMESPACE_END
