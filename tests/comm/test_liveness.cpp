// The peer-liveness monitor (comm/liveness.hpp) across real processes on loopback: a rank that is
// killed, stopped, or reports a failure is named to every other rank within the bound, with what
// it was doing; a clean finish is not a failure; ranks that never connect are named. And the
// process-wide failure exit (comm/failure.hpp) ends a process whose threads are blocked.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <strata/comm/failure.hpp>
#include <strata/comm/liveness.hpp>

namespace {

namespace liveness = strata::liveness;
using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t n = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

liveness::Options options(int rank, int world, int port) {
  liveness::Options o;
  o.rank = rank;
  o.world_size = world;
  o.address = "127.0.0.1";
  o.port = port;
  o.connect_timeout = 10s;
  o.heartbeat_interval = 0.05s;
  o.silence_timeout = 1.0s;
  return o;
}

// A failure seen by this process: the message and when it came.
struct Seen {
  std::mutex mutex;
  std::string message;
  std::atomic<bool> done{false};
  clock_type::time_point at{};
  void operator()(const std::string& m) {
    std::lock_guard lock(mutex);
    message = m;
    at = clock_type::now();
    done = true;
  }
  bool wait(std::chrono::duration<double> bound) {
    const auto until = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(bound);
    while (!done && clock_type::now() < until) std::this_thread::sleep_for(5ms);
    return done;
  }
};

// Options whose failures land in `seen`.
liveness::Options watched(int rank, int world, int port, Seen& seen) {
  liveness::Options o = options(rank, world, port);
  o.on_failure = [&seen](const std::string& m) { seen(m); };
  return o;
}

// A child rank: connects, sets its status, then per `behaviour`: "idle" (waits to be killed),
// "report" (reports a failure), "finish" (ends cleanly). Writes the failure it saw (or "none") to
// `pipe_fd` and exits 0.
[[noreturn]] void child(int rank, int world, int port, const char* behaviour, int pipe_fd) {
  std::string result = "none";
  try {
    Seen seen;
    auto o = options(rank, world, port);
    o.on_failure = [&](const std::string& m) { seen(m); };
    liveness::Monitor monitor(o);
    monitor.set_status("iteration 7: forward of micro-batch 2");
    if (std::strcmp(behaviour, "report") == 0) {
      std::this_thread::sleep_for(200ms);
      monitor.report("all_reduce<float32>(1024 elements, sum) on group 'tp' did not complete within the timeout");
      std::this_thread::sleep_for(500ms);
    } else if (std::strcmp(behaviour, "finish") == 0) {
      std::this_thread::sleep_for(300ms);
      monitor.finish();
    } else {
      seen.wait(8s);
      if (seen.done) result = seen.message;
    }
  } catch (const std::exception& e) {
    result = std::string("exception: ") + e.what();
  }
  (void)!::write(pipe_fd, result.data(), result.size());
  ::close(pipe_fd);
  std::_Exit(0);
}

struct Child {
  pid_t pid = -1;
  int read_fd = -1;
};

Child spawn(int rank, int world, int port, const char* behaviour) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    child(rank, world, port, behaviour, fds[1]);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

std::string collect(Child& c) {
  std::string out;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(c.read_fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    out.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(c.read_fd);
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  return out;
}

void reap(Child& c) {
  ::kill(c.pid, SIGKILL);
  ::close(c.read_fd);
  int status = 0;
  ::waitpid(c.pid, &status, 0);
}

TEST(Liveness, KilledRankIsNamedToEveryRankWithinASecond) {
  const int port = free_port();
  Child idle = spawn(1, 3, port, "idle");
  Child witness = spawn(2, 3, port, "idle");
  Seen seen;
  liveness::Monitor monitor(watched(0, 3, port, seen));
  monitor.set_status("iteration 7: all_reduce of the loss");
  std::this_thread::sleep_for(200ms);  // statuses arrive with the beats
  const auto killed_at = clock_type::now();
  ::kill(idle.pid, SIGKILL);
  ASSERT_TRUE(seen.wait(5s)) << "rank 0 never heard that rank 1 was killed";
  EXPECT_LT(std::chrono::duration<double>(seen.at - killed_at).count(), 1.0);
  EXPECT_NE(seen.message.find("rank 1 (pid " + std::to_string(idle.pid)), std::string::npos) << seen.message;
  EXPECT_NE(seen.message.find("ended without finishing"), std::string::npos) << seen.message;
  const std::string activity = monitor.activity_summary();
  EXPECT_NE(activity.find("rank 0: iteration 7: all_reduce of the loss"), std::string::npos) << activity;
  EXPECT_NE(activity.find("rank 2: iteration 7: forward of micro-batch 2"), std::string::npos) << activity;
  const std::string heard = collect(witness);
  EXPECT_NE(heard.find("rank 1 (pid " + std::to_string(idle.pid)), std::string::npos) << heard;
  // the others hear it from rank 0 with what every rank was last doing
  EXPECT_NE(heard.find("[last reported activity: rank 0: iteration 7: all_reduce of the loss"), std::string::npos) << heard;
  collect(idle);
}

TEST(Liveness, StoppedRankIsNamedAfterTheSilenceTimeout) {
  const int port = free_port();
  Child stopped = spawn(1, 2, port, "idle");
  Seen seen;
  liveness::Monitor monitor(watched(0, 2, port, seen));
  std::this_thread::sleep_for(200ms);
  const auto stopped_at = clock_type::now();
  ::kill(stopped.pid, SIGSTOP);
  ASSERT_TRUE(seen.wait(5s)) << "rank 0 never noticed that rank 1 stopped";
  const double took = std::chrono::duration<double>(seen.at - stopped_at).count();
  EXPECT_GE(took, 0.9);  // the silence timeout is 1 s
  EXPECT_LT(took, 2.0);
  EXPECT_NE(seen.message.find("rank 1 (pid"), std::string::npos) << seen.message;
  EXPECT_NE(seen.message.find("sent nothing for"), std::string::npos) << seen.message;
  EXPECT_NE(seen.message.find("SIGSTOP"), std::string::npos) << seen.message;
  reap(stopped);
}

TEST(Liveness, ReportedFailureReachesEveryRankWithTheReportersActivity) {
  const int port = free_port();
  Child reporter = spawn(2, 3, port, "report");
  Child witness = spawn(1, 3, port, "idle");
  Seen seen;
  liveness::Monitor monitor(watched(0, 3, port, seen));
  ASSERT_TRUE(seen.wait(5s));
  EXPECT_NE(seen.message.find("rank 2 (pid " + std::to_string(reporter.pid)), std::string::npos) << seen.message;
  EXPECT_NE(seen.message.find("did not complete within the timeout"), std::string::npos) << seen.message;
  EXPECT_NE(monitor.activity_summary().find("rank 2: iteration 7: forward of micro-batch 2"), std::string::npos)
      << monitor.activity_summary();
  const std::string heard = collect(witness);
  EXPECT_NE(heard.find("rank 2: iteration 7: forward of micro-batch 2"), std::string::npos) << heard;
  EXPECT_NE(heard.find("did not complete within the timeout"), std::string::npos) << heard;
  EXPECT_NE(heard.find("rank 2 (pid"), std::string::npos) << heard;
  collect(reporter);
}

TEST(Liveness, DeadRootIsNamedToTheOtherRanks) {
  const int port = free_port();
  // The root is a child here; this process is rank 1.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t root = ::fork();
  if (root == 0) {
    ::close(fds[0]);
    child(0, 2, port, "idle", fds[1]);
  }
  ::close(fds[1]);
  Child root_child{root, fds[0]};
  Seen seen;
  liveness::Monitor monitor(watched(1, 2, port, seen));
  std::this_thread::sleep_for(100ms);
  ::kill(root, SIGKILL);
  ASSERT_TRUE(seen.wait(5s));
  EXPECT_NE(seen.message.find("rank 0"), std::string::npos) << seen.message;
  EXPECT_NE(seen.message.find("ended without finishing"), std::string::npos) << seen.message;
  collect(root_child);
}

TEST(Liveness, CleanFinishIsNotAFailure) {
  const int port = free_port();
  Child finisher = spawn(1, 2, port, "finish");
  Seen seen;
  {
    liveness::Monitor monitor(watched(0, 2, port, seen));
    EXPECT_EQ(collect(finisher), "none");
    EXPECT_FALSE(seen.wait(1.5s)) << seen.message;  // well past the silence timeout
    EXPECT_FALSE(monitor.failure().has_value());
  }
}

TEST(Liveness, RanksThatNeverConnectAreNamed) {
  const int port = free_port();
  Child one = spawn(1, 3, port, "finish");
  auto o = options(0, 3, port);
  o.connect_timeout = 0.5s;
  try {
    liveness::Monitor monitor(o);
    FAIL() << "rank 2 never connected, yet the monitor started";
  } catch (const strata::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("for rank(s) 2 to connect"), std::string::npos) << e.what();
  }
  reap(one);
}

TEST(Liveness, RootOnPortZeroPublishesThePortItGot) {
  // Rank 0 asks the system for a port and hands it to a rank started only once it is known.
  Seen seen;
  liveness::Options o = watched(0, 2, 0, seen);
  std::atomic<int> published{0};
  Child late;
  o.on_listening = [&](int port) {
    published = port;
    late = spawn(1, 2, port, "finish");
  };
  liveness::Monitor monitor(o);
  EXPECT_GT(published.load(), 0);
  EXPECT_EQ(monitor.port(), published.load());
  EXPECT_EQ(collect(late), "none");
  EXPECT_FALSE(monitor.failure().has_value());
}

TEST(Liveness, BadOptionsAreRefusedBeforeAnySocket) {
  auto o = options(3, 2, 1234);
  EXPECT_THROW(liveness::Monitor{o}, strata::ConfigError);
  o = options(0, 2, 1234);
  o.silence_timeout = 0.01s;  // below the heartbeat interval
  EXPECT_THROW(liveness::Monitor{o}, strata::ConfigError);
  o = options(1, 2, 0);  // rank 0's port unknown
  EXPECT_THROW(liveness::Monitor{o}, strata::ConfigError);
}

// Runs `body` in a forked child whose stderr and `out_fd` writes come back; returns the child's
// wait status, what it printed, and how long it ran.
struct ChildRun {
  int status = 0;
  std::string output;
  double seconds = 0;
};
template <class Body>
ChildRun run_in_child(Body body) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const auto start = clock_type::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::dup2(fds[1], 2);  // stderr into the pipe
    body(fds[1]);
    std::_Exit(0);
  }
  ::close(fds[1]);
  ChildRun run;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;) run.output.append(buffer, static_cast<std::size_t>(n));
  ::close(fds[0]);
  ::waitpid(pid, &run.status, 0);
  run.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  return run;
}

// A process whose main thread is blocked forever still ends, with the message first, once a
// failure is reported from another thread.
TEST(FailureExit, BlockedProcessEndsAfterTheGracePeriod) {
  const ChildRun run = run_in_child([](int) {
    strata::failure::exit_on_failure(0.3, 3, "strata rank 1");
    std::thread([] {
      std::this_thread::sleep_for(50ms);
      strata::failure::report("rank 0 ended without finishing");
    }).detach();
    for (;;) ::pause();  // blocked for good: no signal comes
  });
  ASSERT_TRUE(WIFEXITED(run.status));
  EXPECT_EQ(WEXITSTATUS(run.status), 3);
  EXPECT_LT(run.seconds, 5.0);
  EXPECT_NE(run.output.find("strata rank 1: rank 0 ended without finishing"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("did not end within 0.3 s"), std::string::npos) << run.output;
}

TEST(FailureExit, ThePrintedLineCarriesTheAnnotation) {
  const ChildRun run = run_in_child([](int) {
    strata::failure::exit_on_failure(0.1, 4, "strata rank 0");
    strata::failure::set_annotator([] { return std::string(" [last reported activity: rank 1: iteration 3: evaluation]"); });
    strata::failure::report("all_reduce timed out");
    for (;;) ::pause();
  });
  ASSERT_TRUE(WIFEXITED(run.status));
  EXPECT_EQ(WEXITSTATUS(run.status), 4);
  EXPECT_NE(run.output.find("strata rank 0: all_reduce timed out [last reported activity: rank 1: iteration 3: evaluation]\n"),
            std::string::npos)
      << run.output;
}

TEST(FailureExit, OnlyTheFirstReportCountsAndNothingExitsWhenOff) {
  const ChildRun run = run_in_child([](int out) {
    std::string forwarded;
    strata::failure::set_forwarder([&](const std::string& m) { forwarded += m + "|"; });
    strata::failure::report("first");
    strata::failure::report("second");
    std::this_thread::sleep_for(200ms);
    const std::string result = strata::failure::first_message() + ";" + forwarded;
    (void)!::write(out, result.data(), result.size());
    std::_Exit(strata::failure::reported() ? 0 : 9);
  });
  ASSERT_TRUE(WIFEXITED(run.status));
  EXPECT_EQ(WEXITSTATUS(run.status), 0);
  EXPECT_EQ(run.output, "first;first|");  // and no line printed: the exit is off
}

// stand_down() after a run that failed: the pending exit never comes, the failure is forgotten, and
// the next run's failure is reported and ends the process as the first would have.
TEST(FailureExit, StandDownCancelsThePendingExitAndStartsClean) {
  const ChildRun run = run_in_child([](int out) {
    strata::failure::exit_on_failure(0.1, 5, "strata");
    strata::failure::report("the first run failed");
    strata::failure::stand_down();
    std::this_thread::sleep_for(400ms);  // four grace periods: the cancelled exit would have come
    const std::string after = std::string(strata::failure::reported() ? "reported" : "clean") + ";" +
                              std::string(strata::failure::exits_on_failure() ? "on" : "off") + ";";
    (void)!::write(out, after.data(), after.size());
    strata::failure::exit_on_failure(0.1, 6, "strata");
    strata::failure::report("the second run failed");
    for (;;) ::pause();
  });
  ASSERT_TRUE(WIFEXITED(run.status));
  EXPECT_EQ(WEXITSTATUS(run.status), 6) << run.output;
  EXPECT_NE(run.output.find("strata: the first run failed\nclean;off;strata: the second run failed"), std::string::npos)
      << run.output;
}

}  // namespace
