// strata/backend/cuda/gemm_tuning.hpp: the GEMM algorithms chosen by timing, kept in a file.
//
// cuBLASLt's heuristic names one algorithm per GEMM problem; among its next candidates there is
// often a faster one (a few percent of a training step's GEMM time). Timing them once per problem
// finds it, but timing is noisy: two runs that each timed for themselves could pick different
// algorithms and no longer give the same bits. So the choices live in a file: the run that finds a
// problem missing times the candidates and adds the winner, and every later run reads it and uses
// the same algorithms, so it gives the bits of the run that wrote it.
//
// The file is text, one problem per line:
//
//   strata gemm tuning 1
//   platform cublasLt 130100; NVIDIA H100 80GB HBM3, sm_90, 132 SMs
//   gemm <problem> algo <8 hex words> ms <chosen> <heuristic's first> of <candidates>
//
// <problem> is the GEMM's key as gemm.hpp writes it (types, transposes, sizes, epilogue, operand
// alignments). The algorithm words are cuBLASLt's cublasLtMatmulAlgo_t, which the library documents
// as serializable for the same library version; hence the platform line: a file made with another
// cuBLASLt or on another GPU is refused with an error that says to delete it (its algorithms may not
// exist here, and a new timing would change the bits anyway). The file is rewritten after each new
// problem (written aside, synced, renamed), so a crash leaves the last complete version.
//
// This header holds only the table and its file (no CUDA), so it is tested on machines without a GPU;
// gemm.hpp does the timing. One table per GPU (a trainer with several ranks gives each its own
// file); its calls are serialized by a mutex all the same.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "../../checkpoint/durable_file.hpp"
#include "../../core/error.hpp"

STRATA_NAMESPACE_BEGIN
namespace cuda {

class gemm_tuning {
 public:
  static constexpr std::string_view kMagic = "strata gemm tuning 1";
  using algorithm_words = std::array<std::uint64_t, 8>;  // cublasLtMatmulAlgo_t::data

  // One problem's choice: the algorithm, its time and that of the heuristic's first choice
  // (milliseconds per call, as timed when it was chosen), and how many candidates were timed.
  struct choice {
    algorithm_words algorithm{};
    double ms = 0, first_ms = 0;
    int candidates = 1;
  };

  // Reads `file` when it exists (a FileError names the file and the line if it is not a tuning
  // file or is damaged); a file that does not exist yet starts an empty table, written on the first
  // record().
  explicit gemm_tuning(std::filesystem::path file) : file_(std::move(file)) {
    if (std::filesystem::exists(file_)) read();
  }
  gemm_tuning(const gemm_tuning&) = delete;
  gemm_tuning& operator=(const gemm_tuning&) = delete;

  // The library and device this process runs. The first call sets them for a new file; a file
  // written on another platform is refused here, before any of its algorithms is used.
  void bind(const std::string& platform) {
    std::lock_guard lock(mutex_);
    if (platform.empty() || platform.find('\n') != std::string::npos)
      fail<Error>("gemm_tuning: the platform must be one non-empty line");
    if (platform_.empty()) {
      platform_ = platform;
      return;
    }
    if (platform_ != platform)
      fail<FileError>("GEMM tuning file ", file_, " was written for \"", platform_, "\" but this process runs \"", platform,
                      "\": its algorithms may not exist here. Delete it (or name another file) to time the GEMMs again");
  }

  // The choice for a problem, if the table has one (counted as read from the file).
  std::optional<choice> find(const std::string& problem) {
    std::lock_guard lock(mutex_);
    const auto it = entries_.find(problem);
    if (it == entries_.end()) return std::nullopt;
    if (!it->second.used) {
      it->second.used = true;
      ++used_;
    }
    return it->second.value;
  }

  // Adds a problem's choice and rewrites the file. bind() must have been called.
  void record(const std::string& problem, const choice& value) {
    std::lock_guard lock(mutex_);
    if (platform_.empty()) fail<Error>("gemm_tuning::record: bind() the platform first");
    if (problem.empty() || problem.find_first_of("\n") != std::string::npos || problem.find(" algo ") != std::string::npos)
      fail<Error>("gemm_tuning::record: a problem key is one line without \" algo \"");
    if (entries_.insert_or_assign(problem, entry{value, true, true}).second) ++used_;
    ++timed_;
    write();
  }

  const std::filesystem::path& file() const { return file_; }
  const std::string& platform() const { return platform_; }
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return entries_.size();
  }
  // Problems of this process: timed here, and read from the file.
  std::size_t timed() const {
    std::lock_guard lock(mutex_);
    return timed_;
  }
  std::size_t read_from_file() const {
    std::lock_guard lock(mutex_);
    return used_ - timed_;
  }
  // Over the problems this process used: the heuristic's first choices' milliseconds minus the
  // chosen ones' (one call of each).
  double saved_ms() const {
    std::lock_guard lock(mutex_);
    double saved = 0;
    for (const auto& [problem, e] : entries_)
      if (e.used) saved += e.value.first_ms - e.value.ms;
    return saved;
  }

 private:
  struct entry {
    choice value;
    bool used = false;   // looked up or recorded by this process
    bool timed = false;  // recorded by this process
  };

  [[noreturn]] void damaged(int line, const std::string& why) const {
    fail<FileError>("GEMM tuning file ", file_, ", line ", line, ": ", why,
                    ". Delete the file (or name another) to time the GEMMs again");
  }

  void read() {
    std::ifstream in(file_);
    if (!in) fail<FileError>("cannot open GEMM tuning file ", file_);
    std::string line;
    int number = 0;
    if (!std::getline(in, line) || line != kMagic)
      fail<FileError>("GEMM tuning file ", file_, " does not start with \"", kMagic,
                      "\": it is not a tuning file (or from a newer strata)");
    ++number;
    if (!std::getline(in, line) || line.rfind("platform ", 0) != 0 || line.size() == 9) damaged(2, "expected \"platform <library; device>\"");
    platform_ = line.substr(9);
    ++number;
    while (std::getline(in, line)) {
      ++number;
      if (line.empty()) continue;
      const auto algo_at = line.find(" algo ");
      if (line.rfind("gemm ", 0) != 0 || algo_at == std::string::npos || algo_at <= 5)
        damaged(number, "expected \"gemm <problem> algo <8 hex words> ms <chosen> <first> of <candidates>\"");
      const std::string problem = line.substr(5, algo_at - 5);
      std::istringstream rest(line.substr(algo_at + 6));
      choice value;
      for (auto& word : value.algorithm) {
        std::string hex;
        if (!(rest >> hex) || hex.empty() || hex.size() > 16 ||
            hex.find_first_not_of("0123456789abcdef") != std::string::npos)
          damaged(number, "the algorithm is not 8 hexadecimal words");
        word = std::stoull(hex, nullptr, 16);
      }
      std::string ms, of;
      if (!(rest >> ms >> value.ms >> value.first_ms >> of >> value.candidates) || ms != "ms" || of != "of" ||
          !(value.ms >= 0) || !(value.first_ms >= 0) || value.candidates < 1)
        damaged(number, "expected \"ms <chosen> <first> of <candidates>\" after the algorithm");
      std::string extra;
      if (rest >> extra) damaged(number, "unexpected text \"" + extra + "\" at the end");
      if (!entries_.emplace(problem, entry{value, false, false}).second) damaged(number, "problem \"" + problem + "\" appears twice");
    }
  }

  void write() const {
    std::ostringstream out;
    out << kMagic << "\nplatform " << platform_ << "\n";
    char word[24];
    for (const auto& [problem, e] : entries_) {
      out << "gemm " << problem << " algo";
      for (const std::uint64_t w : e.value.algorithm) {
        std::snprintf(word, sizeof(word), " %llx", static_cast<unsigned long long>(w));
        out << word;
      }
      std::snprintf(word, sizeof(word), "%.6g", e.value.ms);
      out << " ms " << word;
      std::snprintf(word, sizeof(word), "%.6g", e.value.first_ms);
      out << " " << word << " of " << e.value.candidates << "\n";
    }
    checkpoint_detail::write_text_file_durably(file_, out.str());
  }

  std::filesystem::path file_;
  std::string platform_;
  std::map<std::string, entry> entries_;
  std::size_t used_ = 0, timed_ = 0;
  mutable std::mutex mutex_;
};

}  // namespace cuda
STRATA_NAMESPACE_END
