// strata/data/mapped_file.hpp: `MappedFile`, a read-only memory map of a whole file (POSIX mmap),
// and the little helpers the dataset readers and writers share (unaligned little-endian loads,
// an output file that appears under its final name only once it is complete).
//
// Datasets are read through maps so that a 100 GB corpus costs address space, not memory, and
// every data-parallel rank on a host shares one copy in the page cache. Every failure is a
// FileError whose message names the file and what went wrong (missing, unreadable, a directory;
// a FIFO or a device is refused before anything can block on it, see core/file.hpp).
// An empty file maps to an empty byte span (mmap refuses length 0). Host byte order must be
// little-endian, the order the formats are defined in; the static_assert says so.
#pragma once

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.hpp"
#include "../core/file.hpp"

STRATA_NAMESPACE_BEGIN
namespace data {

static_assert(std::endian::native == std::endian::little,
              "strata's dataset readers assume a little-endian host: the .bin/.idx and llm.c formats are little-endian.");

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(std::string path) : path_(std::move(path)) {
    // The type is checked before anything can block (a FIFO) or never end (a device).
    ReadableFile file(path_, "dataset file");
    size_ = static_cast<std::size_t>(file.size());
    const int fd = file.fd();
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        int err = errno;
        fail<FileError>("cannot memory-map '", path_, "' (", size_, " bytes): ", std::strerror(err));
      }
      data_ = static_cast<const std::byte*>(p);
    }
    // `file` closes the descriptor; the map keeps its own reference to the file.
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept { swap(other); }
  MappedFile& operator=(MappedFile&& other) noexcept {
    MappedFile tmp(std::move(other));
    swap(tmp);
    return *this;
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  }

  const std::string& path() const { return path_; }
  std::size_t size() const { return size_; }
  const std::byte* data() const { return data_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  void swap(MappedFile& other) noexcept {
    std::swap(path_, other.path_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }
  std::string path_{};
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

namespace detail {

// A value of type T stored at `at` (no alignment required).
template <class T>
T load(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

// Copies `count` values of type T stored from `at` into a vector (no alignment required).
template <class T>
std::vector<T> load_array(const std::byte* at, std::size_t count) {
  std::vector<T> out(count);
  if (count > 0) std::memcpy(out.data(), at, count * sizeof(T));
  return out;
}

// An output file written under `<final>.tmp` and renamed to `<final>` by commit(); destroyed
// without commit, it removes the temporary, so a crash never leaves a half-written file under
// the final name.
class PendingFile {
 public:
  explicit PendingFile(std::string final_path) : final_(std::move(final_path)), temp_(final_ + ".tmp") {
    out_.open(temp_, std::ios::binary | std::ios::trunc);
    if (!out_) fail<FileError>("cannot create '", temp_, "': ", std::strerror(errno));
  }
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;
  ~PendingFile() {
    if (out_.is_open()) out_.close();
    if (!committed_) {
      std::error_code ignored;
      std::filesystem::remove(temp_, ignored);
    }
  }

  void write(const void* bytes, std::size_t count) {
    out_.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(count));
    if (!out_) fail<FileError>("cannot write ", count, " bytes to '", temp_, "' (disk full?)");
  }
  template <class T>
  void write_value(T value) {
    write(&value, sizeof(T));
  }
  // Flushes and closes the temporary; the file is complete but not yet under its final name.
  void close() {
    if (!out_.is_open()) return;
    out_.flush();
    if (!out_) fail<FileError>("cannot flush '", temp_, "' (disk full?)");
    out_.close();
    if (out_.fail()) fail<FileError>("cannot close '", temp_, "'");
  }
  // Moves the complete file to its final name (atomic on POSIX file systems).
  void commit() {
    close();
    if (std::rename(temp_.c_str(), final_.c_str()) != 0)
      fail<FileError>("cannot rename '", temp_, "' to '", final_, "': ", std::strerror(errno));
    committed_ = true;
  }
  const std::string& final_path() const { return final_; }

 private:
  std::string final_;
  std::string temp_;
  std::ofstream out_{};
  bool committed_ = false;
};

}  // namespace detail
}  // namespace data
STRATA_NAMESPACE_END
