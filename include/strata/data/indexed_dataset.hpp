// strata/data/indexed_dataset.hpp: Megatron-Core's indexed dataset (`<prefix>.bin` + `<prefix>.idx`),
// byte-compatible with megatron/core/datasets/indexed_dataset.py, as a writer and an mmap reader.
//
// `.bin` is the tokens of every sequence, back to back, in one element type. `.idx` (little-endian,
// no padding, so the arrays after the 34-byte header are unaligned):
//
//   offset  size        field
//   0       9           magic "MMIDIDX\x00\x00"
//   9       u64         version = 1
//   17      u8          dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)
//   18      u64         S = sequence count
//   26      u64         D = length of the document index array (documents + 1)
//   34      i32[S]      sequence lengths, in elements
//   34+4S   i64[S]      sequence pointers, byte offsets into .bin
//   34+12S  i64[D]      document indices: document d is sequences [idx[d], idx[d+1]); idx[0] = 0, idx[D-1] = S
//   (34+12S+8D  i8[S]   sequence modes; only in Megatron's multimodal files, accepted and ignored)
//
// The writer streams tokens to `<prefix>.bin.tmp`, keeps the small index in memory, and on
// finalize() writes `<prefix>.idx.tmp` and renames both, so readers never see half a dataset.
// A document may hold no sequence (two equal document indices): Megatron's preprocess_data writes
// an empty text that way. add_index() appends a finished dataset (Megatron's merge of partitions).
// The reader copies the index arrays (20 bytes per sequence) out of the map and validates all of
// it before anything is read: magic, version, dtype code, sizes against the file length, every
// sequence against the size of .bin, and the document indices (start at 0, never decrease, end at
// S). Any violation is a FileError naming the file and the problem. Tokens come back converted to
// int32 (the type embedding layers index with), or to any arithmetic type through read<T>(); a
// token the requested type cannot hold exactly is a FileError naming the file, sequence and value.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mapped_file.hpp"

STRATA_NAMESPACE_BEGIN
namespace data {

// Element type of the tokens in .bin; the values are Megatron's codes.
enum class DType : std::uint8_t {
  uint8 = 1,
  int8 = 2,
  int16 = 3,
  int32 = 4,
  int64 = 5,
  float64 = 6,
  float32 = 7,
  uint16 = 8,
};

constexpr bool is_valid_dtype_code(std::uint8_t code) { return code >= 1 && code <= 8; }

constexpr std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::uint8:
    case DType::int8: return 1;
    case DType::int16:
    case DType::uint16: return 2;
    case DType::int32:
    case DType::float32: return 4;
    case DType::int64:
    case DType::float64: return 8;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::uint8: return "uint8";
    case DType::int8: return "int8";
    case DType::int16: return "int16";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::float64: return "float64";
    case DType::float32: return "float32";
    case DType::uint16: return "uint16";
  }
  return "unknown";
}

inline DType dtype_from_name(std::string_view name) {
  for (std::uint8_t code = 1; code <= 8; ++code)
    if (dtype_name(static_cast<DType>(code)) == name) return static_cast<DType>(code);
  fail<ConfigError>("unknown dtype '", name, "'; expected one of uint8, int8, int16, uint16, int32, int64, float32, float64");
}

// Megatron's choice for token ids: uint16 when every id fits below 65500, else int32.
constexpr DType smallest_token_dtype(std::int64_t vocab_size) {
  return vocab_size < 65500 ? DType::uint16 : DType::int32;
}

// Calls f(T{}) with T the C++ type of `dtype`.
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::uint8: return f(std::uint8_t{});
    case DType::int8: return f(std::int8_t{});
    case DType::int16: return f(std::int16_t{});
    case DType::int32: return f(std::int32_t{});
    case DType::int64: return f(std::int64_t{});
    case DType::float64: return f(double{});
    case DType::float32: return f(float{});
    case DType::uint16: return f(std::uint16_t{});
  }
  fail<ConfigError>("invalid dtype code ", static_cast<int>(dtype));
}

inline constexpr std::array<char, 9> kIndexMagic = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr std::uint64_t kIndexVersion = 1;
inline constexpr std::size_t kIndexHeaderBytes = 34;

inline std::string bin_path(std::string_view prefix) { return std::string(prefix) + ".bin"; }
inline std::string idx_path(std::string_view prefix) { return std::string(prefix) + ".idx"; }

class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string path_prefix, DType dtype)
      : prefix_(std::move(path_prefix)), dtype_(dtype), bin_(bin_path(prefix_)) {
    if (!is_valid_dtype_code(static_cast<std::uint8_t>(dtype)))
      fail<ConfigError>("IndexedDatasetWriter for '", prefix_, "': invalid dtype code ", static_cast<int>(dtype));
    document_indices_.push_back(0);
  }

  // Appends one sequence. Values must be representable in the dataset's dtype.
  template <std::ranges::contiguous_range Range>
    requires std::is_arithmetic_v<std::ranges::range_value_t<Range>> &&
             (!std::is_same_v<std::ranges::range_value_t<Range>, bool>) &&
             (!std::is_same_v<std::ranges::range_value_t<Range>, char>)
  void add_item(const Range& tokens) {
    check_open("add_item");
    std::span<const std::ranges::range_value_t<Range>> in(std::ranges::data(tokens), std::ranges::size(tokens));
    if (in.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
      fail<ConfigError>("IndexedDatasetWriter '", prefix_, "': a sequence of ", in.size(),
                        " tokens does not fit the int32 length field");
    visit_dtype(dtype_, [&](auto stored) {
      using Stored = decltype(stored);
      buffer_.resize(in.size() * sizeof(Stored));
      for (std::size_t i = 0; i < in.size(); ++i) {
        auto value = in[i];
        if constexpr (std::is_integral_v<Stored>) {
          if (!fits<Stored>(value))
            fail<ConfigError>("IndexedDatasetWriter '", prefix_, "': token ", +value, " (sequence ", lengths_.size(),
                              ", position ", i, ") does not fit dtype ", dtype_name(dtype_));
        }
        Stored s = static_cast<Stored>(value);
        std::memcpy(buffer_.data() + i * sizeof(Stored), &s, sizeof(Stored));
      }
    });
    bin_.write(buffer_.data(), buffer_.size());
    pointers_.push_back(bytes_written_);
    lengths_.push_back(static_cast<std::int32_t>(in.size()));
    bytes_written_ += static_cast<std::int64_t>(buffer_.size());
    tokens_written_ += static_cast<std::int64_t>(in.size());
  }
  // Closes the current document: every sequence added since the last end_document() belongs to it.
  void end_document() {
    check_open("end_document");
    document_indices_.push_back(static_cast<std::int64_t>(lengths_.size()));
  }
  // A document of one sequence.
  template <std::ranges::contiguous_range Range>
  void add_document(const Range& tokens) {
    add_item(tokens);
    end_document();
  }
  // A document of several sequences (Megatron's add_document(tensor, lengths)): `tokens` back to
  // back, cut into sequences of `sequence_lengths`, which must sum to tokens.size(). No lengths
  // (and no tokens) is a document of no sequence: its document index repeats the previous one, as
  // Megatron's preprocess_data writes an empty text.
  template <std::ranges::contiguous_range Range>
  void add_document(const Range& tokens, std::span<const std::int32_t> sequence_lengths) {
    check_open("add_document");
    std::span<const std::ranges::range_value_t<Range>> all(std::ranges::data(tokens), std::ranges::size(tokens));
    std::size_t begin = 0;
    for (std::int32_t length : sequence_lengths) {
      if (length < 0 || static_cast<std::size_t>(length) > all.size() - begin)
        fail<ConfigError>("IndexedDatasetWriter '", prefix_, "': add_document with sequence lengths that do not cut ",
                          all.size(), " tokens (a length of ", length, " at token ", begin, ")");
      begin += static_cast<std::size_t>(length);
    }
    if (begin != all.size())
      fail<ConfigError>("IndexedDatasetWriter '", prefix_, "': add_document with sequence lengths summing to ", begin,
                        " for ", all.size(), " tokens");
    begin = 0;
    for (std::int32_t length : sequence_lengths) {
      add_item(all.subspan(begin, static_cast<std::size_t>(length)));
      begin += static_cast<std::size_t>(length);
    }
    end_document();
  }

  // Appends every sequence and document of the finished dataset at `path_prefix` (Megatron's
  // IndexedDatasetBuilder.add_index): its .bin is copied, its lengths and document indices follow
  // this writer's, so writing parts and merging them gives the bytes of writing the whole. The
  // dtypes must be equal and the part's sequences must lie back to back in its .bin, as a writer
  // lays them (anything else is a FileError naming the part).
  void add_index(std::string_view path_prefix);  // defined after IndexedDataset, which reads the part

  // Writes .idx, then moves both files to their final names. Sequences added after the last
  // end_document() form a final document.
  void finalize() {
    check_open("finalize");
    if (document_indices_.back() != static_cast<std::int64_t>(lengths_.size()))
      document_indices_.push_back(static_cast<std::int64_t>(lengths_.size()));
    bin_.close();
    detail::PendingFile idx(idx_path(prefix_));
    idx.write(kIndexMagic.data(), kIndexMagic.size());
    idx.write_value<std::uint64_t>(kIndexVersion);
    idx.write_value<std::uint8_t>(static_cast<std::uint8_t>(dtype_));
    idx.write_value<std::uint64_t>(lengths_.size());
    idx.write_value<std::uint64_t>(document_indices_.size());
    idx.write(lengths_.data(), lengths_.size() * sizeof(std::int32_t));
    idx.write(pointers_.data(), pointers_.size() * sizeof(std::int64_t));
    idx.write(document_indices_.data(), document_indices_.size() * sizeof(std::int64_t));
    idx.close();
    bin_.commit();
    idx.commit();
    finalized_ = true;
  }

  const std::string& path_prefix() const { return prefix_; }
  DType dtype() const { return dtype_; }
  std::int64_t sequence_count() const { return static_cast<std::int64_t>(lengths_.size()); }
  std::int64_t document_count() const { return static_cast<std::int64_t>(document_indices_.size()) - 1; }
  std::int64_t token_count() const { return tokens_written_; }
  std::int64_t bytes_written() const { return bytes_written_; }

 private:
  template <class Stored, class Value>
  static bool fits(Value value) {
    if constexpr (std::is_floating_point_v<Value>) {
      return value == static_cast<Value>(static_cast<std::int64_t>(value)) &&
             std::in_range<Stored>(static_cast<std::int64_t>(value));
    } else {
      return std::in_range<Stored>(value);
    }
  }
  void check_open(const char* what) const {
    if (finalized_) fail<ConfigError>("IndexedDatasetWriter '", prefix_, "': ", what, "() after finalize()");
  }

  std::string prefix_;
  DType dtype_;
  detail::PendingFile bin_;
  std::vector<std::int32_t> lengths_{};
  std::vector<std::int64_t> pointers_{};
  std::vector<std::int64_t> document_indices_{};
  std::vector<std::byte> buffer_{};
  std::int64_t bytes_written_ = 0;
  std::int64_t tokens_written_ = 0;
  bool finalized_ = false;
};

class IndexedDataset {
 public:
  explicit IndexedDataset(std::string path_prefix) : prefix_(std::move(path_prefix)) {
    load_index();
    bin_ = MappedFile(bin_path(prefix_));
    validate_sequences();
  }

  const std::string& path_prefix() const { return prefix_; }
  DType dtype() const { return dtype_; }
  std::size_t dtype_bytes() const { return dtype_size(dtype_); }
  // Number of sequences (Megatron's len(dataset)).
  std::int64_t size() const { return static_cast<std::int64_t>(lengths_.size()); }
  std::int64_t sequence_count() const { return size(); }
  std::int64_t document_count() const { return static_cast<std::int64_t>(document_indices_.size()) - 1; }
  std::int64_t token_count() const { return token_count_; }
  std::span<const std::int32_t> sequence_lengths() const { return lengths_; }
  std::span<const std::int64_t> sequence_pointers() const { return pointers_; }
  std::span<const std::int64_t> document_indices() const { return document_indices_; }
  std::int64_t sequence_length(std::int64_t i) const { return lengths_[checked(i)]; }

  // Tokens [offset, offset + length) of sequence i; length -1 means "to the end of the sequence".
  std::vector<std::int32_t> get(std::int64_t i, std::int64_t offset = 0, std::int64_t length = -1) const {
    return read<std::int32_t>(i, offset, length);
  }
  template <class T = std::int32_t>
  std::vector<T> read(std::int64_t i, std::int64_t offset = 0, std::int64_t length = -1) const {
    auto [begin, count] = range(i, offset, length);
    std::vector<T> out(static_cast<std::size_t>(count));
    copy_tokens(i, begin, std::span<T>(out));
    return out;
  }
  // Writes tokens [offset, offset + out.size()) of sequence i into out.
  template <class T>
  void read_into(std::int64_t i, std::int64_t offset, std::span<T> out) const {
    auto [begin, count] = range(i, offset, static_cast<std::int64_t>(out.size()));
    copy_tokens(i, begin, out.first(static_cast<std::size_t>(count)));
  }

 private:
  [[noreturn]] void bad_index(const auto&... parts) const { fail<FileError>("'", idx_path(prefix_), "': ", parts...); }

  void load_index() {
    MappedFile idx(idx_path(prefix_));
    const std::size_t file_size = idx.size();
    const std::byte* p = idx.data();
    if (file_size < kIndexHeaderBytes)
      bad_index("truncated: the header needs ", kIndexHeaderBytes, " bytes but the file has ", file_size);
    if (std::memcmp(p, kIndexMagic.data(), kIndexMagic.size()) != 0)
      bad_index("bad magic: not a Megatron indexed dataset index (expected \"MMIDIDX\\x00\\x00\" at byte 0)");
    auto version = detail::load<std::uint64_t>(p + 9);
    if (version != kIndexVersion) bad_index("unsupported version ", version, " (expected ", kIndexVersion, ")");
    auto code = detail::load<std::uint8_t>(p + 17);
    if (!is_valid_dtype_code(code)) bad_index("bad dtype code ", static_cast<int>(code), " (expected 1..8)");
    dtype_ = static_cast<DType>(code);
    auto sequences = detail::load<std::uint64_t>(p + 18);
    auto documents = detail::load<std::uint64_t>(p + 26);
    const std::size_t room = file_size - kIndexHeaderBytes;
    // Compare counts before multiplying so a corrupt count cannot overflow the size arithmetic.
    if (sequences > room / 12 || documents > (room - sequences * 12) / 8)
      bad_index("truncated: ", sequences, " sequences and ", documents, " document indices need ",
                describe_size(sequences, documents), " bytes but the file has ", file_size);
    const std::size_t expected = kIndexHeaderBytes + sequences * 12 + documents * 8;
    if (file_size != expected && file_size != expected + sequences)
      bad_index("size mismatch: ", sequences, " sequences and ", documents, " document indices need ", expected,
                " bytes but the file has ", file_size);
    if (documents == 0) bad_index("the document index is empty (it must hold at least the leading 0)");
    const std::byte* at = p + kIndexHeaderBytes;
    lengths_ = detail::load_array<std::int32_t>(at, sequences);
    pointers_ = detail::load_array<std::int64_t>(at + sequences * 4, sequences);
    document_indices_ = detail::load_array<std::int64_t>(at + sequences * 12, documents);

    if (document_indices_.front() != 0) bad_index("the document index starts at ", document_indices_.front(), ", not 0");
    for (std::size_t d = 1; d < document_indices_.size(); ++d)
      if (document_indices_[d] < document_indices_[d - 1])
        bad_index("the document index is not monotone: entry ", d, " = ", document_indices_[d], " < entry ", d - 1,
                  " = ", document_indices_[d - 1]);
    if (document_indices_.back() != static_cast<std::int64_t>(sequences))
      bad_index("the document index ends at ", document_indices_.back(), " but there are ", sequences, " sequences");
  }

  static std::string describe_size(std::uint64_t sequences, std::uint64_t documents) {
    // Printed as a sum so an absurd count does not overflow.
    return ::strata::detail::concat(kIndexHeaderBytes, " + 12*", sequences, " + 8*", documents);
  }

  void validate_sequences() {
    const std::int64_t bin_size = static_cast<std::int64_t>(bin_.size());
    const auto item = static_cast<std::int64_t>(dtype_bytes());
    token_count_ = 0;
    for (std::size_t i = 0; i < lengths_.size(); ++i) {
      if (lengths_[i] < 0) bad_index("sequence ", i, " has negative length ", lengths_[i]);
      if (pointers_[i] < 0 || pointers_[i] % item != 0)
        bad_index("sequence ", i, " has pointer ", pointers_[i], ", not a non-negative multiple of the ", item,
                  "-byte ", dtype_name(dtype_), " element");
      if (pointers_[i] > bin_size || lengths_[i] > (bin_size - pointers_[i]) / item)
        fail<FileError>("'", bin_.path(), "' is too short: sequence ", i, " spans bytes [", pointers_[i], ", ",
                        pointers_[i] + std::int64_t{lengths_[i]} * item, ") but the file has ", bin_size,
                        " bytes (truncated .bin, or an .idx from another dataset)");
      token_count_ += lengths_[i];
    }
  }

  std::size_t checked(std::int64_t i) const {
    if (i < 0 || i >= size())
      fail<ConfigError>("sequence ", i, " is out of range: '", prefix_, "' has ", size(), " sequences");
    return static_cast<std::size_t>(i);
  }
  std::pair<std::int64_t, std::int64_t> range(std::int64_t i, std::int64_t offset, std::int64_t length) const {
    const std::int64_t n = lengths_[checked(i)];
    if (offset < 0 || offset > n)
      fail<ConfigError>("offset ", offset, " is outside sequence ", i, " of '", prefix_, "' (length ", n, ")");
    if (length < 0) length = n - offset;
    if (length > n - offset)
      fail<ConfigError>("tokens [", offset, ", ", offset + length, ") are outside sequence ", i, " of '", prefix_,
                        "' (length ", n, ")");
    return {offset, length};
  }
  // Converts each stored token to T; a value T cannot hold exactly (an int64 id above 2^31 read as
  // int32, a fractional or negative float id) is a FileError naming the file, sequence and value,
  // never a silent truncation (4294967361 must not come back as 65).
  template <class T>
  void copy_tokens(std::int64_t i, std::int64_t begin, std::span<T> out) const {
    const std::byte* base = bin_.data() + pointers_[static_cast<std::size_t>(i)];
    visit_dtype(dtype_, [&](auto stored) {
      using Stored = decltype(stored);
      const std::byte* at = base + begin * static_cast<std::int64_t>(sizeof(Stored));
      for (std::size_t k = 0; k < out.size(); ++k) {
        const Stored value = detail::load<Stored>(at + k * sizeof(Stored));
        if constexpr (std::is_integral_v<T>) {
          bool fits = false;
          if constexpr (std::is_integral_v<Stored>) {
            fits = std::in_range<T>(value);
          } else {
            fits = value >= static_cast<Stored>(std::numeric_limits<T>::min()) &&
                   value <= static_cast<Stored>(std::numeric_limits<T>::max()) && value == static_cast<Stored>(static_cast<T>(value));
          }
          if (!fits)
            fail<FileError>("'", bin_.path(), "': sequence ", i, " holds token ", +value, " at position ",
                            begin + static_cast<std::int64_t>(k), ", which does not fit the ", sizeof(T) * 8,
                            "-bit token ids the model reads (", dtype_name(dtype_),
                            " dataset); re-tokenize with a vocabulary that fits, or check the file");
        }
        out[k] = static_cast<T>(value);
      }
    });
  }

  std::string prefix_;
  DType dtype_ = DType::int32;
  std::vector<std::int32_t> lengths_{};
  std::vector<std::int64_t> pointers_{};
  std::vector<std::int64_t> document_indices_{};
  std::int64_t token_count_ = 0;
  MappedFile bin_{};
};

inline void IndexedDatasetWriter::add_index(std::string_view path_prefix) {
  check_open("add_index");
  const std::string part_idx = idx_path(path_prefix), part_bin = bin_path(path_prefix);
  std::vector<std::int32_t> lengths;
  std::vector<std::int64_t> documents;
  std::int64_t bin_bytes = 0;
  {
    IndexedDataset part{std::string(path_prefix)};  // validates the whole index against the .bin
    lengths.assign(part.sequence_lengths().begin(), part.sequence_lengths().end());
    documents.assign(part.document_indices().begin(), part.document_indices().end());
    if (part.dtype() != dtype_)
      fail<FileError>("'", part_idx, "' holds ", dtype_name(part.dtype()), " tokens but the dataset being written ('", prefix_,
                      "') is ", dtype_name(dtype_), "; only parts of one dtype can be merged");
    const auto item = static_cast<std::int64_t>(dtype_size(dtype_));
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      if (part.sequence_pointers()[i] != bin_bytes)
        fail<FileError>("'", part_idx, "': sequence ", i, " starts at byte ", part.sequence_pointers()[i], ", not at ", bin_bytes,
                        " right after the previous one; only datasets whose sequences lie back to back can be merged");
      bin_bytes += std::int64_t{lengths[i]} * item;
    }
  }
  require_regular_file(part_bin, "dataset file");
  std::ifstream in(part_bin, std::ios::binary);
  if (!in) fail<FileError>("cannot open '", part_bin, "' for reading");
  in.seekg(0, std::ios::end);
  if (static_cast<std::int64_t>(in.tellg()) != bin_bytes)
    fail<FileError>("'", part_bin, "' has ", static_cast<std::int64_t>(in.tellg()), " bytes but its index covers ", bin_bytes,
                    "; only datasets whose .bin holds exactly their sequences can be merged");
  in.seekg(0);
  buffer_.resize(std::size_t{1} << 20);
  for (std::int64_t left = bin_bytes; left > 0;) {
    const auto chunk = static_cast<std::size_t>(std::min<std::int64_t>(left, static_cast<std::int64_t>(buffer_.size())));
    if (!in.read(reinterpret_cast<char*>(buffer_.data()), static_cast<std::streamsize>(chunk)))
      fail<FileError>("error while reading '", part_bin, "'");
    bin_.write(buffer_.data(), chunk);
    left -= static_cast<std::int64_t>(chunk);
  }
  const auto offset = static_cast<std::int64_t>(lengths_.size());
  for (std::int32_t length : lengths) {
    pointers_.push_back(bytes_written_);
    lengths_.push_back(length);
    bytes_written_ += std::int64_t{length} * static_cast<std::int64_t>(dtype_size(dtype_));
    tokens_written_ += length;
  }
  for (std::size_t d = 1; d < documents.size(); ++d) document_indices_.push_back(offset + documents[d]);
}

}  // namespace data
STRATA_NAMESPACE_END
