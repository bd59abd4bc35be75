// strata/comm/liveness.hpp: every process of a job learns within seconds that another one died,
// stopped or failed, and why.
//
// NCCL reports a dead peer only where its transport notices (a socket that closes), and not at all
// on NVLink or shared memory, where a kernel simply waits for data that never comes. Launchers help
// only where they exist (torchrun and srun --kill-on-bad-exit end the other processes when one
// exits non-zero) and never for a process that is stopped or hung. So each process of a job keeps
// one TCP connection to rank 0's process, a star, beside NCCL:
//
//   rank k ---- hello(rank, pid, host) ----> rank 0      once, when the monitor starts (collective)
//   rank k <--- beat(status) every interval --> rank 0   from a thread of its own, both ways
//   rank k ---- failure(message) ----------> rank 0 ---> every other rank
//   rank k ---- bye -----------------------> rank 0      a clean end
//
// Rank 0 declares rank k failed when its connection closes without a bye (the process was killed,
// crashed or exited early: the kernel closes the socket at once, so this takes milliseconds), or
// when nothing arrived from it for `silence_timeout` (stopped with SIGSTOP, frozen, its host gone:
// the beats come from a thread that does nothing else, so a busy or blocked main thread does not
// stop them). Rank k declares rank 0 failed the same way. The first failure a process sees, or a
// failure message that arrives, is handed once to `on_failure`, from the monitor's thread; rank 0
// first sends it to every other rank. A failure this process reports itself (`report`, e.g. a
// collective that timed out here) goes to every other rank the same way, so all of them end with
// the same cause instead of each waiting for its own timeout.
//
// Every message carries, where known, what each rank was doing: `set_status("iteration 31: forward
// of micro-batch 2")` is sent with the beats, and rank 0 appends the last status of every rank to a
// failure ("last reported: rank 0 in ..., rank 1 in ..."). That names the peer and the operation in
// one sentence, even when the peer is alive but stuck in host code.
//
// Messages are frames of one type byte, a 4-byte little-endian length and at most kMaxPayload
// bytes. Host code only (POSIX sockets); independent of the compute backend and communicator.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../core/error.hpp"

STRATA_NAMESPACE_BEGIN
namespace liveness {

struct Options {
  int rank = 0;
  int world_size = 1;
  std::string address = "127.0.0.1";  // rank 0's host, as every rank reaches it
  int port = 0;                        // rank 0 listens on this port (every interface)
  // How long start waits for every rank to connect (rank 0) or for rank 0 to accept (the others).
  std::chrono::duration<double> connect_timeout{300.0};
  std::chrono::duration<double> heartbeat_interval{1.0};
  // A peer that sent nothing for this long is declared stopped or hung.
  std::chrono::duration<double> silence_timeout{300.0};
  // Called once, from the monitor's thread, with the first failure of another process.
  std::function<void(const std::string&)> on_failure;
  // Rank 0 only: called with the port it listens on (the one asked for, or the one the system
  // chose for port 0) before it waits for the others, so it can publish it (a shared file, say).
  std::function<void(int port)> on_listening;
};

namespace detail {

using clock = std::chrono::steady_clock;
inline constexpr std::uint32_t kMaxPayload = 64 * 1024;
inline constexpr std::size_t kMaxStatus = 200;

enum : char { kHello = 'H', kBeat = 'B', kFailure = 'F', kBye = 'Q' };

inline std::string frame(char type, std::string_view payload) {
  const auto n = static_cast<std::uint32_t>(std::min<std::size_t>(payload.size(), kMaxPayload));
  std::string out(5 + n, '\0');
  out[0] = type;
  for (int i = 0; i < 4; ++i) out[1 + static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 5, payload.data(), n);
  return out;
}

inline std::string errno_text(int error) { return std::string(std::strerror(error)); }

inline void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

inline std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// One connection: what is still to be sent, what was received and not parsed yet.
struct Peer {
  int fd = -1;
  int rank = -1;
  long pid = 0;
  std::string host;
  std::string out, in;
  clock::time_point last_heard{};
  bool said_bye = false;
  bool closed = false;

  std::string who() const { return strata::detail::concat("rank ", rank, " (pid ", pid, " on ", host, ")"); }
};

}  // namespace detail

class Monitor {
 public:
  // Collective over the job: rank 0 listens and waits until every other rank has connected; the
  // others connect to rank 0. Throws ConfigError for bad options and CommError when the ranks do
  // not all connect within connect_timeout (naming the ranks that did not).
  explicit Monitor(Options options) : options_(std::move(options)) {
    validate();
    statuses_.assign(static_cast<std::size_t>(options_.world_size), std::string());
    self_host_ = detail::host_name();
    if (options_.rank == 0) listen_and_accept();
    else connect_to_root();
    thread_ = std::thread([this] { loop(); });
  }
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;
  ~Monitor() { finish(); }

  // What this rank is doing now, sent with the next beat (cut to 200 bytes).
  void set_status(std::string_view status) {
    std::lock_guard lock(mutex_);
    status_.assign(status.substr(0, detail::kMaxStatus));
  }

  // A failure of this process: sent to every other rank (through rank 0). Never blocks.
  void report(std::string_view message) {
    std::lock_guard lock(mutex_);
    if (failed_) return;
    failed_ = true;
    failure_ = std::string(message.substr(0, detail::kMaxPayload / 2));
    outgoing_failure_ = strata::detail::concat("rank ", options_.rank, " (pid ", ::getpid(), " on ", self_host_, "): ",
                                               failure_);
  }

  // A clean end: says goodbye (so peers do not take the closing connection for a death), stops
  // the thread and closes the connections. Idempotent.
  void finish() {
    {
      std::lock_guard lock(mutex_);
      if (finishing_) return;
      finishing_ = true;
    }
    if (thread_.joinable()) thread_.join();
    for (auto& p : peers_)
      if (p.fd >= 0) ::close(p.fd);
    peers_.clear();
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
  }

  // The first failure seen or reported, if any.
  std::optional<std::string> failure() const {
    std::lock_guard lock(mutex_);
    if (!failed_) return std::nullopt;
    return failure_;
  }

  int port() const { return bound_port_; }

  // " [last reported activity: rank 0: ...; rank 1: ...]" from the statuses this process has heard
  // (rank 0: every rank's; the others: their own and rank 0's); empty when none.
  std::string activity_summary() const {
    std::lock_guard lock(mutex_);
    std::string s;
    for (std::size_t r = 0; r < statuses_.size(); ++r) {
      const std::string& status = static_cast<int>(r) == options_.rank ? status_ : statuses_[r];
      if (!status.empty()) s += strata::detail::concat(s.empty() ? "" : "; ", "rank ", r, ": ", status);
    }
    return s.empty() ? s : " [last reported activity: " + s + "]";
  }

 private:
  void validate() const {
    if (options_.world_size < 1) fail<ConfigError>("liveness monitor: the world size must be at least 1, got ", options_.world_size);
    if (options_.rank < 0 || options_.rank >= options_.world_size)
      fail<ConfigError>("liveness monitor: rank ", options_.rank, " is outside [0, ", options_.world_size, ")");
    if (options_.port < 0 || options_.port > 65535)
      fail<ConfigError>("liveness monitor: port ", options_.port, " is outside 0..65535");
    if (options_.rank != 0 && options_.port == 0)
      fail<ConfigError>("liveness monitor: rank ", options_.rank, " needs rank 0's port (0 was given)");
    const double interval = options_.heartbeat_interval.count(), silence = options_.silence_timeout.count();
    if (!(interval > 0) || !(silence > interval))
      fail<ConfigError>("liveness monitor: the heartbeat interval (", interval, " s) must be positive and below the "
                        "silence timeout (", silence, " s)");
    if (!(options_.connect_timeout.count() > 0))
      fail<ConfigError>("liveness monitor: the connect timeout must be positive, got ", options_.connect_timeout.count(), " s");
  }

  std::string where() const { return strata::detail::concat("liveness monitor (rank ", options_.rank, " of ", options_.world_size, ")"); }

  void listen_and_accept() {
    listen_fd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool v6 = listen_fd_ >= 0;
    if (!v6) listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) fail<CommError>(where(), ": socket() failed: ", detail::errno_text(errno));
    int one = 1, zero = 0;
    (void)::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int status = 0;
    if (v6) {
      (void)::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<std::uint16_t>(options_.port));
      status = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<std::uint16_t>(options_.port));
      status = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    }
    if (status != 0 || ::listen(listen_fd_, 1024) != 0)
      fail<CommError>(where(), ": cannot listen on port ", options_.port, ": ", detail::errno_text(errno),
                      " (another job on this host may use it: set STRATA_LIVENESS_PORT to a free port)");
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length) == 0)
      bound_port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                       : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    detail::set_nonblocking(listen_fd_);
    if (options_.on_listening) options_.on_listening(bound_port_);
    peers_.assign(static_cast<std::size_t>(options_.world_size), detail::Peer{});
    std::vector<detail::Peer> pending;  // accepted, hello not read yet
    int joined = 1;
    const auto deadline = detail::clock::now() + std::chrono::duration_cast<detail::clock::duration>(options_.connect_timeout);
    while (joined < options_.world_size) {
      if (detail::clock::now() > deadline) {
        std::string missing;
        for (int r = 1; r < options_.world_size; ++r)
          if (peers_[static_cast<std::size_t>(r)].fd < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        for (auto& p : pending) ::close(p.fd);
        fail<CommError>(where(), ": waited ", options_.connect_timeout.count(), " s for rank(s) ", missing,
                        " to connect to port ", bound_port_, "; check that every rank started and reaches rank 0's host");
      }
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      for (auto& p : pending) fds.push_back({p.fd, POLLIN, 0});
      (void)::poll(fds.data(), fds.size(), 50);
      for (;;) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) break;
        detail::set_nonblocking(fd);
        detail::Peer p;
        p.fd = fd;
        pending.push_back(std::move(p));
      }
      for (std::size_t i = 0; i < pending.size();) {
        detail::Peer& p = pending[i];
        bool keep = receive(p);
        char type = 0;
        std::string payload;
        if (keep && next_frame(p, type, payload)) {
          int rank = -1;
          long pid = 0;
          char host[256] = {};
          if (type == detail::kHello && std::sscanf(payload.c_str(), "%d %ld %255s", &rank, &pid, host) == 3 && rank > 0 &&
              rank < options_.world_size && peers_[static_cast<std::size_t>(rank)].fd < 0) {
            p.rank = rank;
            p.pid = pid;
            p.host = host;
            p.last_heard = detail::clock::now();
            peers_[static_cast<std::size_t>(rank)] = std::move(p);
            ++joined;
          } else {
            ::close(p.fd);  // not one of ours, or a rank twice
          }
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
          continue;
        }
        if (!keep) {
          ::close(p.fd);
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
          continue;
        }
        ++i;
      }
    }
    const std::string ready = detail::frame(detail::kBeat, "");
    for (int r = 1; r < options_.world_size; ++r) peers_[static_cast<std::size_t>(r)].out += ready;
  }

  void connect_to_root() {
    const auto deadline = detail::clock::now() + std::chrono::duration_cast<detail::clock::duration>(options_.connect_timeout);
    std::string last_error = "no attempt";
    const std::string port = std::to_string(options_.port);
    for (;;) {
      addrinfo hints{};
      hints.ai_socktype = SOCK_STREAM;
      hints.ai_family = AF_UNSPEC;
      addrinfo* found = nullptr;
      const int resolved = ::getaddrinfo(options_.address.c_str(), port.c_str(), &hints, &found);
      if (resolved != 0) {
        last_error = strata::detail::concat("cannot resolve '", options_.address, "': ", ::gai_strerror(resolved));
      } else {
        for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
          const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
          if (fd < 0) continue;
          if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            ::freeaddrinfo(found);
            detail::set_nonblocking(fd);
            detail::Peer root;
            root.fd = fd;
            root.rank = 0;
            root.host = options_.address;
            root.last_heard = detail::clock::now();
            root.out = detail::frame(detail::kHello, strata::detail::concat(options_.rank, " ", static_cast<long>(::getpid()),
                                                                            " ", self_host_));
            peers_.push_back(std::move(root));
            return;
          }
          last_error = detail::errno_text(errno);
          ::close(fd);
        }
        ::freeaddrinfo(found);
      }
      if (detail::clock::now() > deadline)
        fail<CommError>(where(), ": could not connect to rank 0 at ", options_.address, ":", options_.port, " within ",
                        options_.connect_timeout.count(), " s (", last_error, ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Reads what is available; false when the connection closed or failed.
  static bool receive(detail::Peer& p) {
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::recv(p.fd, buffer, sizeof(buffer), MSG_DONTWAIT);
      if (n > 0) {
        p.in.append(buffer, static_cast<std::size_t>(n));
        p.last_heard = detail::clock::now();
        if (p.in.size() > 4 * detail::kMaxPayload) return false;  // not our protocol
        continue;
      }
      if (n == 0) return false;
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    }
  }

  static bool next_frame(detail::Peer& p, char& type, std::string& payload) {
    if (p.in.size() < 5) return false;
    std::uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= static_cast<std::uint32_t>(static_cast<unsigned char>(p.in[1 + static_cast<std::size_t>(i)])) << (8 * i);
    if (n > detail::kMaxPayload) {  // garbled: take it as a closed connection
      p.in.clear();
      p.closed = true;
      return false;
    }
    if (p.in.size() < 5 + n) return false;
    type = p.in[0];
    payload.assign(p.in, 5, n);
    p.in.erase(0, 5 + n);
    return true;
  }

  // Sends what fits without blocking; false when the connection is gone.
  static bool flush(detail::Peer& p) {
    while (!p.out.empty()) {
      const ssize_t n = ::send(p.fd, p.out.data(), p.out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        p.out.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    }
    return true;
  }

  // The first failure: remember it, tell the others (rank 0), hand it to on_failure.
  void declare(std::string message, bool tell_others) {
    {
      std::lock_guard lock(mutex_);
      if (failed_) return;
      failed_ = true;
      failure_ = message;
    }
    if (tell_others) {  // rank 0: with what every rank was last doing
      const std::string f = detail::frame(detail::kFailure, message + activity_summary());
      for (auto& p : peers_)
        if (p.fd >= 0 && !p.closed) p.out += f;
      flush_all(std::chrono::milliseconds(500));
    }
    if (options_.on_failure) {
      try {
        options_.on_failure(message);
      } catch (...) {
      }
    }
  }

  void flush_all(std::chrono::milliseconds within) {
    const auto until = detail::clock::now() + within;
    for (;;) {
      bool left = false;
      for (auto& p : peers_)
        if (p.fd >= 0 && !p.closed && !p.out.empty()) {
          if (!flush(p)) p.closed = true;
          left = left || !p.out.empty();
        }
      if (!left || detail::clock::now() > until) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  void loop() {
    const bool root = options_.rank == 0;
    auto next_beat = detail::clock::now();
    const auto interval = std::chrono::duration_cast<detail::clock::duration>(options_.heartbeat_interval);
    const auto silence = std::chrono::duration_cast<detail::clock::duration>(options_.silence_timeout);
    for (;;) {
      bool finishing = false;
      std::string to_send;
      {
        std::lock_guard lock(mutex_);
        finishing = finishing_;
        to_send = std::exchange(outgoing_failure_, std::string());
      }
      if (!to_send.empty()) {  // this process failed: every other rank hears it now
        std::string message = root ? to_send + activity_summary() : to_send;
        const std::string f = detail::frame(detail::kFailure, message);
        for (auto& p : peers_)
          if (p.fd >= 0 && !p.closed) p.out += f;
        flush_all(std::chrono::milliseconds(500));
      }
      if (finishing) {
        const std::string bye = detail::frame(detail::kBye, "");
        for (auto& p : peers_)
          if (p.fd >= 0 && !p.closed) p.out += bye;
        flush_all(std::chrono::milliseconds(1000));
        return;
      }
      const auto now = detail::clock::now();
      if (now >= next_beat) {
        std::string status;
        {
          std::lock_guard lock(mutex_);
          status = status_;
        }
        const std::string beat = detail::frame(detail::kBeat, status);
        for (auto& p : peers_)
          if (p.fd >= 0 && !p.closed && p.out.size() < 64 * 1024) p.out += beat;  // a stopped peer reads nothing
        next_beat = now + interval;
      }
      std::vector<pollfd> fds;
      std::vector<detail::Peer*> of;
      for (auto& p : peers_)
        if (p.fd >= 0 && !p.closed && !p.said_bye) {
          fds.push_back({p.fd, static_cast<short>(POLLIN | (p.out.empty() ? 0 : POLLOUT)), 0});
          of.push_back(&p);
        }
      (void)::poll(fds.data(), fds.size(), 50);
      bool failed = false;
      {
        std::lock_guard lock(mutex_);
        failed = failed_;
      }
      for (detail::Peer* p : of) {
        const bool open = receive(*p) && !p->closed;
        char type = 0;
        std::string payload;
        while (next_frame(*p, type, payload)) {
          if (type == detail::kBeat) {
            std::lock_guard lock(mutex_);
            statuses_[static_cast<std::size_t>(p->rank)] = payload;
          }
          else if (type == detail::kBye) p->said_bye = true;
          else if (type == detail::kFailure && !failed) {
            declare(payload, root);
            failed = true;
          }
        }
        if (!flush(*p)) p->closed = true;
        if ((!open || p->closed) && !p->said_bye) {
          p->closed = true;
          if (!failed) {
            declare(strata::detail::concat(p->who(), " ended without finishing: its connection to rank ", options_.rank,
                                           " closed (the process was killed, crashed or exited on an error)"),
                    root);
            failed = true;
          }
        } else if (!failed && !p->said_bye && detail::clock::now() - p->last_heard > silence) {
          declare(strata::detail::concat(p->who(), " sent nothing for ",
                                         std::chrono::duration<double>(detail::clock::now() - p->last_heard).count(),
                                         " s (its heartbeat comes every ", options_.heartbeat_interval.count(),
                                         " s from a thread of its own): the process is stopped (SIGSTOP), frozen or "
                                         "unreachable"),
                  root);
          failed = true;
        }
      }
    }
  }

  Options options_;
  std::string self_host_;
  int listen_fd_ = -1;
  int bound_port_ = 0;  // rank 0: the port it listens on
  std::vector<detail::Peer> peers_;  // rank 0: indexed by rank (its own entry unused); others: rank 0 alone
  std::thread thread_;
  mutable std::mutex mutex_;  // guards the members below
  std::string status_;
  std::vector<std::string> statuses_;  // per world rank, the last status heard
  bool failed_ = false;
  std::string failure_;
  std::string outgoing_failure_;
  bool finishing_ = false;
};

}  // namespace liveness
STRATA_NAMESPACE_END
