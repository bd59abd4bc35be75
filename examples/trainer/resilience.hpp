// examples/trainer/resilience.hpp: what the trainers add so that a failure anywhere ends the job,
// names its cause, and a slow or stuck rank is seen.
//
//   Progress         each rank's phase ("iteration 31: forward and backward of 4 micro-batches"),
//                    sent with the liveness monitor's beats (process mode) and named by the
//                    progress timer and in failure messages.
//   ProgressTimer    --progress-timeout-minutes: no iteration finished within the bound ends the
//                    process, naming where every rank of it was (a whole job stuck on the host,
//                    which no collective timeout sees).
//   JobLiveness      one process per GPU: the liveness monitor (strata/comm/liveness.hpp) between
//                    the job's processes, tied to the NCCL watchdog (a peer that died, stopped or
//                    failed aborts this process's communicators) and to failure::report (a failure
//                    here reaches every peer at once).
//   FaultInjection   tests only: STRATA_FAULT_INJECT=<action>@<rank>:<iteration>[:save] makes world
//                    rank <rank> kill itself (SIGKILL), stop (SIGSTOP), exit(1), throw, or sleep for
//                    good at the start of 1-based iteration <iteration>, or with ":save" inside that
//                    iteration's checkpoint save, after writing its rank file (the background write
//                    with --async-save). Not in a run torchrun restarted.
//   straggler_line   --log-straggler: the min / median / max step time over the ranks and the
//                    slowest ranks, one small all-reduce per log step.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <strata/comm/failure.hpp>
#include <strata/comm/liveness.hpp>
#include <strata/core/error.hpp>

namespace trainer {

using ::strata::detail::concat;
namespace failure = ::strata::failure;

class Progress {
 public:
  explicit Progress(int ranks) : phases_(static_cast<std::size_t>(std::max(ranks, 1))),
                                 last_done_(static_cast<std::size_t>(std::max(ranks, 1)), clock::now()) {}

  // What world rank `rank` of this process does now. Cheap: called a few times per iteration.
  void set(int rank, std::string phase) {
    ::strata::liveness::Monitor* monitor = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (rank < 0 || static_cast<std::size_t>(rank) >= phases_.size()) rank = 0;
      monitor = monitor_;
      if (monitor) monitor->set_status(phase);
      phases_[static_cast<std::size_t>(rank)] = std::move(phase);
    }
  }
  void iteration_done(int rank, int iteration) {
    std::lock_guard lock(mutex_);
    if (rank < 0 || static_cast<std::size_t>(rank) >= phases_.size()) rank = 0;
    last_done_[static_cast<std::size_t>(rank)] = clock::now();
    last_iteration_ = std::max(last_iteration_, iteration);
  }
  void attach(::strata::liveness::Monitor* monitor) {
    std::lock_guard lock(mutex_);
    monitor_ = monitor;
  }

  // "rank 0: <phase>; rank 1: <phase>" over the ranks of this process (world ranks as given to set).
  std::string phases() const {
    std::lock_guard lock(mutex_);
    std::string s;
    for (std::size_t r = 0; r < phases_.size(); ++r)
      if (!phases_[r].empty()) s += concat(s.empty() ? "" : "; ", "rank ", r, ": ", phases_[r]);
    return s;
  }
  // Seconds since the slowest rank of this process last finished an iteration (or since start).
  double seconds_without_progress() const {
    std::lock_guard lock(mutex_);
    const auto oldest = *std::min_element(last_done_.begin(), last_done_.end());
    return std::chrono::duration<double>(clock::now() - oldest).count();
  }
  int last_iteration() const {
    std::lock_guard lock(mutex_);
    return last_iteration_;
  }

 private:
  using clock = std::chrono::steady_clock;
  mutable std::mutex mutex_;
  std::vector<std::string> phases_;
  std::vector<clock::time_point> last_done_;
  int last_iteration_ = 0;
  ::strata::liveness::Monitor* monitor_ = nullptr;
};

// --progress-timeout-minutes: a thread that reports a failure (failure::report; with the trainers'
// exit_on_failure, the process ends) when no iteration finished for `bound` seconds.
class ProgressTimer {
 public:
  ProgressTimer(const Progress& progress, double bound_seconds) : progress_(progress), bound_(bound_seconds) {
    thread_ = std::thread([this] { loop(); });
  }
  ProgressTimer(const ProgressTimer&) = delete;
  ProgressTimer& operator=(const ProgressTimer&) = delete;
  ~ProgressTimer() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopping_; });
      if (stopping_) return;
      const double idle = progress_.seconds_without_progress();
      if (idle <= bound_) continue;
      const int last = progress_.last_iteration();
      failure::report(concat("no iteration finished for ", idle, " s (--progress-timeout-minutes ", bound_ / 60.0,
                             "): ", last > 0 ? concat("the last one was iteration ", last) : std::string("none finished yet"),
                             "; where the ranks of this process are: ", progress_.phases(),
                             ". A rank stuck in host code (or every rank waiting on the host) ends the run here"));
      return;
    }
  }

  const Progress& progress_;
  const double bound_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

// STRATA_FAULT_INJECT (tests): see the top of this file.
struct FaultInjection {
  std::string action;  // kill, stop, exit, throw, sleep
  int rank = -1;
  int iteration = -1;  // 1-based
  bool in_save = false;

  // Unset, and in a job torchrun restarted (TORCHELASTIC_RESTART_COUNT > 0: the fault already
  // happened once), nothing is injected.
  static std::optional<FaultInjection> from_environment() {
    const char* text = std::getenv("STRATA_FAULT_INJECT");
    if (text == nullptr || *text == '\0') return std::nullopt;
    const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
    if (restarts != nullptr && *restarts != '\0' && std::string_view(restarts) != "0") return std::nullopt;
    const std::string s = text;
    FaultInjection f;
    const auto at = s.find('@'), colon = s.find(':', at == std::string::npos ? 0 : at);
    char* end = nullptr;
    bool ok = at != std::string::npos && colon != std::string::npos;
    if (ok) {
      f.action = s.substr(0, at);
      f.rank = static_cast<int>(std::strtol(s.c_str() + at + 1, &end, 10));
      ok = end == s.c_str() + colon && f.rank >= 0;
    }
    if (ok) {
      f.iteration = static_cast<int>(std::strtol(s.c_str() + colon + 1, &end, 10));
      const std::string rest = end;
      f.in_save = rest == ":save";
      ok = f.iteration >= 1 && (rest.empty() || f.in_save);
    }
    ok = ok && (f.action == "kill" || f.action == "stop" || f.action == "exit" || f.action == "throw" || f.action == "sleep");
    if (!ok)
      ::strata::fail<::strata::ConfigError>("STRATA_FAULT_INJECT='", s, "' is not <action>@<rank>:<iteration>[:save] with "
                                            "action kill, stop, exit, throw or sleep, rank >= 0 and iteration >= 1");
    return f;
  }

  // Fires when world rank `rank` reaches 1-based `iteration` (inside its save when `save`).
  void maybe_fire(int world_rank, int iteration_1based, bool save) const {
    if (world_rank != rank || iteration_1based != iteration || save != in_save) return;
    std::fprintf(stderr, "fault injection: rank %d: %s at iteration %d%s\n", world_rank, action.c_str(), iteration,
                 in_save ? " (inside the checkpoint save)" : "");
    std::fflush(stderr);
    std::fflush(stdout);
    if (action == "kill") ::raise(SIGKILL);
    if (action == "stop") ::raise(SIGSTOP);
    if (action == "exit") std::exit(1);
    if (action == "throw")
      ::strata::fail<::strata::Error>("fault injection: rank ", world_rank, " throws at iteration ", iteration,
                                      in_save ? " inside the checkpoint save" : "");
    if (action == "sleep")
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
};

// One process per GPU: the liveness monitor between the job's processes (see the top). Started
// after the NCCL world exists (every process is up). Rank 0's address: MASTER_ADDR, and the port
// STRATA_LIVENESS_PORT or MASTER_PORT + 2 (torchrun's agent listens on MASTER_PORT and NCCL's
// bootstrap on MASTER_PORT + 1); without MASTER_ADDR but with STRATA_NCCL_ID_FILE (mpirun), rank 0
// listens on a port the system picks (or STRATA_LIVENESS_PORT) and writes "<host> <port>" to
// <STRATA_NCCL_ID_FILE>.liveness, which the others read. STRATA_LIVENESS=0, or neither variable,
// leaves it off: the collective timeout and the launcher then end the job.
class JobLiveness {
 public:
  template <class OnPeerFailure>
  JobLiveness(int rank, int world_size, double timeout_seconds, Progress& progress, OnPeerFailure on_peer_failure,
              bool print) : progress_(progress) {
    const char* off = std::getenv("STRATA_LIVENESS");
    const char* address = std::getenv("MASTER_ADDR");
    if (world_size < 2 || (off != nullptr && std::string_view(off) == "0")) return;
    const char* id_file = std::getenv("STRATA_NCCL_ID_FILE");
    const bool through_file = (address == nullptr || *address == '\0') && id_file != nullptr && *id_file != '\0';
    if ((address == nullptr || *address == '\0') && !through_file) {
      if (print)
        std::fprintf(stderr, "note: neither MASTER_ADDR nor STRATA_NCCL_ID_FILE: the liveness monitor between processes is "
                             "off; a dead or stopped rank ends the job at the collective timeout or through the launcher\n");
      return;
    }
    int port = 0;
    if (const char* given = std::getenv("STRATA_LIVENESS_PORT"); given != nullptr && *given != '\0') {
      port = std::atoi(given);
    } else if (const char* master = std::getenv("MASTER_PORT"); !through_file && master != nullptr && *master != '\0') {
      port = std::atoi(master) + 2;
    }
    if ((!through_file && port <= 0) || port < 0 || port > 65535)
      ::strata::fail<::strata::ConfigError>("the liveness monitor needs a port: set MASTER_PORT (it listens on MASTER_PORT + 2) "
                                            "or STRATA_LIVENESS_PORT, or STRATA_LIVENESS=0 to leave it off");
    ::strata::liveness::Options options;
    options.rank = rank;
    options.world_size = world_size;
    options.port = port;
    const std::string published = through_file ? std::string(id_file) + ".liveness" : std::string();
    if (!through_file) {
      options.address = address;
    } else if (rank == 0) {
      options.on_listening = [published](int bound) { publish_address(published, bound); };
    } else {
      std::tie(options.address, options.port) = read_address(published, timeout_seconds);
    }
    options.connect_timeout = std::chrono::duration<double>(timeout_seconds);
    options.heartbeat_interval = std::chrono::duration<double>(1.0);
    options.silence_timeout = std::chrono::duration<double>(std::max(timeout_seconds, 2.0));
    // The watchdog names the operation this rank waits in ("<operation> cannot complete: <message>")
    // and reports that within a few tens of milliseconds; the bare message is the fallback.
    options.on_failure = [on_peer_failure](const std::string& message) {
      on_peer_failure(message);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      failure::report(message);
    };
    monitor_ = std::make_unique<::strata::liveness::Monitor>(options);
    if (through_file && rank == 0) std::remove(published.c_str());  // every rank has connected
    failure::set_forwarder([monitor = monitor_.get()](const std::string& message) { monitor->report(message); });
    failure::set_annotator([monitor = monitor_.get()] { return monitor->activity_summary(); });
    progress_.attach(monitor_.get());
  }
  JobLiveness(const JobLiveness&) = delete;
  JobLiveness& operator=(const JobLiveness&) = delete;
  // A clean end says goodbye; after a failure the process ends without it.
  ~JobLiveness() {
    if (!monitor_) return;
    failure::set_forwarder({});
    failure::set_annotator({});
    progress_.attach(nullptr);
    monitor_->finish();
  }
  bool active() const { return monitor_ != nullptr; }

 private:
  // Rank 0: "<host> <port>" into `path`, atomically (a temporary file renamed).
  static void publish_address(const std::string& path, int port) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "127.0.0.1");
    const std::string temporary = concat(path, ".tmp.", ::getpid());
    std::FILE* out = std::fopen(temporary.c_str(), "w");
    const bool written = out != nullptr && std::fprintf(out, "%s %d\n", host, port) > 0;
    const bool closed = out != nullptr && std::fclose(out) == 0;
    if (!written || !closed || std::rename(temporary.c_str(), path.c_str()) != 0)
      ::strata::fail<::strata::FileError>("the liveness monitor could not write rank 0's address to '", path,
                                          "' (next to STRATA_NCCL_ID_FILE); is its folder writable?");
  }
  // The others: rank 0's host and port from `path`, waiting for it up to `timeout_seconds`.
  static std::pair<std::string, int> read_address(const std::string& path, double timeout_seconds) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
    for (;;) {
      if (std::FILE* in = std::fopen(path.c_str(), "r")) {
        char host[256] = {};
        int port = 0;
        const int read = std::fscanf(in, "%255s %d", host, &port);
        std::fclose(in);
        if (read == 2 && port > 0 && port <= 65535) return {host, port};
      }
      if (std::chrono::steady_clock::now() > until)
        ::strata::fail<::strata::CommError>("the liveness monitor waited ", timeout_seconds, " s for rank 0 to write its "
                                            "address to '", path, "'; check that rank 0 started and that the path is on a "
                                            "file system every rank shares");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  Progress& progress_;
  std::unique_ptr<::strata::liveness::Monitor> monitor_;
};

// --log-straggler: given every rank's seconds per step (index = world rank), the line rank 0
// prints: min / median / max and the `count` slowest ranks (Megatron's --straggler-minmax-count).
inline std::string straggler_line(const std::vector<double>& seconds, int count, int iteration) {
  std::vector<int> order(seconds.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return seconds[static_cast<std::size_t>(x)] < seconds[static_cast<std::size_t>(y)]; });
  const auto at = [&](std::size_t i) { return seconds[static_cast<std::size_t>(order[i])]; };
  const std::size_t n = order.size();
  const double median = n % 2 == 1 ? at(n / 2) : 0.5 * (at(n / 2 - 1) + at(n / 2));
  std::string slowest;
  for (int k = 0; k < count && static_cast<std::size_t>(k) < n; ++k) {
    const int r = order[n - 1 - static_cast<std::size_t>(k)];
    slowest += concat(k ? ", " : "", "rank ", r, " (", seconds[static_cast<std::size_t>(r)] * 1e3, " ms)");
  }
  std::string fastest;
  for (int k = 0; k < count && static_cast<std::size_t>(k) < n; ++k) {
    const int r = order[static_cast<std::size_t>(k)];
    fastest += concat(k ? ", " : "", "rank ", r, " (", seconds[static_cast<std::size_t>(r)] * 1e3, " ms)");
  }
  char head[160];
  std::snprintf(head, sizeof(head), "straggler  %6d | step time over %zu ranks: min %.1f ms | median %.1f ms | max %.1f ms (%.2fx the median)",
                iteration, n, at(0) * 1e3, median * 1e3, at(n - 1) * 1e3, median > 0 ? at(n - 1) / median : 0.0);
  return concat(head, " | slowest: ", slowest, " | fastest: ", fastest);
}

}  // namespace trainer
