// strata/core/file.hpp: opening the files a user names (datasets, tokenizer files, checkpoint
// trackers and rank files, Hugging Face files) for reading, safely.
//
// A path from the command line may name anything: a directory, a FIFO (whose open(2) blocks until
// a writer appears, forever in practice), a character device such as /dev/zero (which never ends),
// or a regular file far larger than its kind can be. So every read of a user's file goes through
// `ReadableFile`: it opens with O_NONBLOCK (an open that cannot block), checks with fstat that the
// descriptor is a regular file, then clears O_NONBLOCK; `read_whole_file` adds a size bound that
// fits the kind of file. Every failure is a FileError that names the file, says what it is
// ("a directory", "a FIFO (named pipe)") and what was expected.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.hpp"

STRATA_NAMESPACE_BEGIN

// Size bounds for whole-file reads, by kind of file.
inline constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
inline constexpr std::uint64_t kMaxTrackerBytes = 4096;             // latest_checkpointed_iteration.txt: a number
inline constexpr std::uint64_t kMaxConfigBytes = 64 * kMiB;         // config.json, tokenizer_config.json, index files
inline constexpr std::uint64_t kMaxTokenizerBytes = 1024 * kMiB;    // vocab.json, merges.txt, tokenizer.json, *.model

// What a stat mode is, in words ("a directory", "a FIFO (named pipe)", ...).
inline const char* file_type_name(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// FileError unless `path` (symbolic links followed) is an existing regular file; `what` says what
// the file is for ("checkpoint file", "the BPE vocabulary (--vocab-file)"). Use it before handing
// the path to something that opens it itself (std::ifstream, a library).
inline void require_regular_file(const std::filesystem::path& path, std::string_view what) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int err = errno;
    fail<FileError>("cannot open ", what, " ", path, ": ", err == ENOENT ? "it does not exist (" : "(", std::strerror(err),
                    ")");
  }
  if (!S_ISREG(info.st_mode))
    fail<FileError>(what, " ", path, " is ", file_type_name(info.st_mode),
                    ", not a regular file; only a regular file is read here (a pipe or a device could block or never end)");
}

// A file descriptor open for reading on a regular file (checked after an open that cannot block).
class ReadableFile {
 public:
  ReadableFile() = default;
  ReadableFile(const std::filesystem::path& path, std::string_view what) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) {
      const int err = errno;
      fail<FileError>("cannot open ", what, " ", path, ": ", err == ENOENT ? "it does not exist (" : "(", std::strerror(err),
                    ")");
    }
    struct stat info {};
    if (::fstat(fd_, &info) != 0) {
      const int err = errno;
      close();
      fail<FileError>("cannot stat ", what, " ", path, ": ", std::strerror(err));
    }
    if (!S_ISREG(info.st_mode)) {
      close();
      fail<FileError>(what, " ", path, " is ", file_type_name(info.st_mode),
                    ", not a regular file; only a regular file is read here (a pipe or a device could block or never end)");
    }
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
    size_ = static_cast<std::uint64_t>(info.st_size);
  }
  ReadableFile(ReadableFile&& other) noexcept
      : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}
  ReadableFile& operator=(ReadableFile&& other) noexcept {
    if (this != &other) {
      close();
      path_ = std::move(other.path_);
      fd_ = std::exchange(other.fd_, -1);
      size_ = other.size_;
    }
    return *this;
  }
  ReadableFile(const ReadableFile&) = delete;
  ReadableFile& operator=(const ReadableFile&) = delete;
  ~ReadableFile() { close(); }

  int fd() const { return fd_; }
  std::uint64_t size() const { return size_; }  // at open time
  const std::filesystem::path& path() const { return path_; }
  // Gives up the descriptor (the caller closes it).
  int release() { return std::exchange(fd_, -1); }

 private:
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  std::filesystem::path path_{};
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// The whole content of the regular file `path`, at most `max_bytes` long; `what` names the file's
// role for the errors.
inline std::string read_whole_file(const std::filesystem::path& path, std::string_view what, std::uint64_t max_bytes) {
  ReadableFile file(path, what);
  if (file.size() > max_bytes)
    fail<FileError>(what, " ", path, " holds ", file.size(), " bytes, more than the ", max_bytes,
                    " bytes such a file can reasonably hold; check that the path names the right file");
  std::string text(static_cast<std::size_t>(file.size()), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ::ssize_t n = ::read(file.fd(), text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail<FileError>("error while reading ", what, " ", path, ": ", std::strerror(errno));
    }
    if (n == 0) break;  // the file shrank while being read
    done += static_cast<std::size_t>(n);
  }
  text.resize(done);
  return text;
}

STRATA_NAMESPACE_END
