// strata/checkpoint/durable_file.hpp: writing files so that a crash never leaves a half-written one
// under the final name (POSIX).
//
// `DurableFile` writes to "<path>.part", and commit() fsyncs it, renames it to <path> (atomic on
// POSIX file systems) and fsyncs the directory so the rename itself survives a power loss. A file
// destroyed without commit() removes its ".part". Every failure is a FileError naming the path and
// the system's reason.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "../core/error.hpp"

STRATA_NAMESPACE_BEGIN
namespace checkpoint_detail {

inline std::string errno_text(int error) { return std::generic_category().message(error); }

// fsync on a directory, so renames and new entries in it are durable.
inline void sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail<FileError>("cannot open directory ", dir, " to sync it: ", errno_text(errno));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0 && error != EINVAL) fail<FileError>("cannot sync directory ", dir, ": ", errno_text(error));
}

// rename(2): atomic replacement of a file, or move of a directory onto a name that does not exist.
inline void rename_path(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    fail<FileError>("cannot rename ", from, " to ", to, ": ", errno_text(errno));
}

class DurableFile {
 public:
  explicit DurableFile(std::filesystem::path path) : path_(std::move(path)), part_(path_) {
    part_ += ".part";
    fd_ = ::open(part_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail<FileError>("cannot create ", part_, ": ", errno_text(errno));
  }
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;
  ~DurableFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(part_.c_str());
    }
  }

  void write(std::span<const std::byte> bytes) {
    const std::byte* p = bytes.data();
    std::size_t left = bytes.size();
    while (left > 0) {
      const ::ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail<FileError>("cannot write ", part_, ": ", errno_text(errno));
      }
      p += n;
      left -= static_cast<std::size_t>(n);
      written_ += static_cast<std::size_t>(n);
    }
  }
  std::size_t written() const { return written_; }

  // fsync, close, rename to the final name, fsync the directory.
  void commit() {
    if (::fsync(fd_) != 0) fail<FileError>("cannot sync ", part_, ": ", errno_text(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) {
      ::unlink(part_.c_str());
      fail<FileError>("cannot close ", part_, ": ", errno_text(errno));
    }
    if (::rename(part_.c_str(), path_.c_str()) != 0) {
      const int error = errno;
      ::unlink(part_.c_str());
      fail<FileError>("cannot rename ", part_, " to ", path_, ": ", errno_text(error));
    }
    sync_directory(path_.has_parent_path() ? path_.parent_path() : std::filesystem::path("."));
  }

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::filesystem::path part_;
  int fd_ = -1;
  std::size_t written_ = 0;
};

// Writes `text` to `path` durably (temp file, fsync, rename, fsync of the directory).
inline void write_text_file_durably(const std::filesystem::path& path, std::string_view text) {
  DurableFile file(path);
  file.write(std::as_bytes(std::span<const char>(text.data(), text.size())));
  file.commit();
}

}  // namespace checkpoint_detail
STRATA_NAMESPACE_END
