// strata/comm/failure.hpp: a failure ends the process, even when a thread of it cannot move.
//
// A communicator that fails (a peer died, an operation timed out, the transport reported an error)
// throws from the rank's next call, and a trainer that catches it exits non-zero. That is not
// enough when a thread of the process is blocked where no exception can reach it: in a CUDA call
// behind a kernel that waits for a dead peer, in a launch queue that is full, in a peer thread of
// the same process that never returns. The process then holds its GPUs forever.
//
// `failure::exit_on_failure(grace)` (the trainers call it; off by default in the library) makes
// the first failure reported to `failure::report(message)` from any thread:
//   1. print one line to stderr at once: "strata: <message>" (the message reaches the log even if
//      the process is then killed),
//   2. start a timer: if the process is still running `grace` seconds later, print that it did not
//      end by itself and end it with std::_Exit(exit_code) (no destructors, no atexit handlers: a
//      thread may hold any lock), so that launchers (torchrun, srun, mpirun) see the failure and
//      restart or end the job.
// Reports after the first are ignored; report() never blocks and never throws. Without
// exit_on_failure, report() only records the first message (first_message()).
//
// The in-process communicator, the NCCL watchdog, the peer-liveness monitor (liveness.hpp) and the
// trainers' progress timer report here.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "../core/config.hpp"

STRATA_NAMESPACE_BEGIN
namespace failure {

namespace detail {

struct State {
  std::mutex mutex;
  bool enabled = false;
  double grace_seconds = 5.0;
  int exit_code = 1;
  std::atomic<bool> reported{false};
  std::atomic<unsigned> generation{0};  // stand_down() moves it on: a pending exit of an older one is void
  std::string first;  // written once, under mutex
  std::string prefix = "strata";
  std::function<void(const std::string&)> forwarder;  // set_forwarder
  std::function<std::string()> annotator;             // set_annotator
};

inline State& state() {
  static State* s = new State;  // never destroyed: report() may run while the process exits
  return *s;
}

}  // namespace detail

// Turns on the exit described at the top. `grace_seconds` >= 0; `exit_code` != 0. `prefix` starts
// the printed line (e.g. "strata rank 3").
inline void exit_on_failure(double grace_seconds = 5.0, int exit_code = 1, std::string prefix = "strata") {
  detail::State& s = detail::state();
  std::lock_guard lock(s.mutex);
  s.enabled = true;
  s.grace_seconds = grace_seconds < 0 ? 0 : grace_seconds;
  s.exit_code = exit_code == 0 ? 1 : exit_code;
  s.prefix = std::move(prefix);
}

inline bool exits_on_failure() {
  detail::State& s = detail::state();
  std::lock_guard lock(s.mutex);
  return s.enabled;
}

// The grace period, from STRATA_EXIT_GRACE_SECONDS when set (a number >= 0), else `fallback`.
inline double grace_from_environment(double fallback = 5.0) {
  const char* text = std::getenv("STRATA_EXIT_GRACE_SECONDS");
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(value >= 0) || value > 86400) return fallback;
  return value;
}

// `forward(message)` is called with the first failure, from the reporting thread, before anything
// is printed: the liveness monitor uses it to tell the other processes of the job at once. It must
// not block. An empty function removes it.
inline void set_forwarder(std::function<void(const std::string&)> forward) {
  detail::State& s = detail::state();
  std::lock_guard lock(s.mutex);
  s.forwarder = std::move(forward);
}

// `annotate()` is appended to the printed line (not to first_message()): the liveness monitor adds
// what every rank was last doing. It must not block. An empty function removes it.
inline void set_annotator(std::function<std::string()> annotate) {
  detail::State& s = detail::state();
  std::lock_guard lock(s.mutex);
  s.annotator = std::move(annotate);
}

// For a program that runs several trainings in one process (a test program calling a trainer's
// main() more than once): turns the exit off, cancels a pending one (its timer sees the generation
// move on and returns) and forgets the failure, so that the next run starts as the first did. Call
// it once the run that failed has ended (its threads joined). A real trainer process never calls
// it: there the pending exit is what ends a process whose exit hangs.
inline void stand_down() noexcept {
  detail::State& s = detail::state();
  s.generation.fetch_add(1, std::memory_order_acq_rel);
  try {
    std::lock_guard lock(s.mutex);
    s.enabled = false;
    s.first.clear();
  } catch (...) {
  }
  s.reported.store(false, std::memory_order_release);
}

// Whether a failure was reported, and its message.
inline bool reported() { return detail::state().reported.load(std::memory_order_acquire); }
inline std::string first_message() {
  detail::State& s = detail::state();
  std::lock_guard lock(s.mutex);
  return s.first;
}

// Records the first failure of the process; with exit_on_failure, prints it (unless `print` is
// false: the caller printed it already) and arms the exit. Safe from any thread, never blocks for
// long, never throws.
inline void report(std::string_view message, bool print = true) noexcept {
  detail::State& s = detail::state();
  bool expected = false;
  if (!s.reported.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) return;
  const unsigned generation = s.generation.load(std::memory_order_acquire);  // the run this failure ends
  bool enabled = false;
  double grace = 0;
  int code = 1;
  std::string prefix;
  std::function<void(const std::string&)> forward;
  std::function<std::string()> annotate;
  try {
    std::lock_guard lock(s.mutex);
    s.first.assign(message);
    enabled = s.enabled;
    grace = s.grace_seconds;
    code = s.exit_code;
    prefix = s.prefix;
    forward = s.forwarder;
    annotate = s.annotator;
  } catch (...) {
    return;
  }
  if (forward) {
    try {
      forward(std::string(message));
    } catch (...) {
    }
  }
  if (!enabled) return;
  if (print) {
    std::string extra;
    if (annotate && message.find("[last reported activity:") == std::string_view::npos) {
      try {
        extra = annotate();
      } catch (...) {
      }
    }
    std::fprintf(stderr, "%s: %.*s%s\n", prefix.c_str(), static_cast<int>(message.size()), message.data(), extra.c_str());
    std::fflush(stderr);
  }
  try {
    std::thread([grace, code, prefix, generation] {
      std::this_thread::sleep_for(std::chrono::duration<double>(grace));
      if (detail::state().generation.load(std::memory_order_acquire) != generation) return;  // stand_down()
      std::fprintf(stderr, "%s: the process did not end within %g s of the failure above (a thread is blocked where the "
                           "failure cannot reach it); exiting with status %d\n",
                   prefix.c_str(), grace, code);
      std::fflush(stderr);
      std::fflush(stdout);
      std::_Exit(code);
    }).detach();
  } catch (...) {
    std::_Exit(code);  // no thread for the timer: end now rather than risk holding the job
  }
}

}  // namespace failure
STRATA_NAMESPACE_END
