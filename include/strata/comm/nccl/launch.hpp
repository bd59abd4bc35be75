// strata/comm/nccl/launch.hpp: the two ways to start NCCL ranks.
//
// 1. One process per GPU: `nccl::init_from_environment()` reads the rank, the world size and the
//    local rank from the variables the launcher set, in this order of precedence:
//      torchrun                 RANK, WORLD_SIZE, LOCAL_RANK (and MASTER_ADDR, MASTER_PORT)
//      Open MPI mpirun          OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//      Slurm srun               SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
//    uses GPU LOCAL_RANK (of those the process sees) and exchanges the NCCL unique id one of two
//    ways, both existing mechanisms rather than a protocol of our own:
//      - NCCL's own bootstrap (the default). NCCL_COMM_ID=<host>:<port> names the address of the
//        bootstrap root: every rank then derives the same unique id from it (ncclGetUniqueId) and
//        rank 0's ncclCommInitRank starts the root listening there. When NCCL_COMM_ID is not set it
//        is set to MASTER_ADDR:<port>, port = STRATA_NCCL_PORT if set, else MASTER_PORT + 1
//        (torchrun's agent already listens on MASTER_PORT). MASTER_ADDR must be an address of
//        rank 0's host that every rank can reach.
//      - A file on a path every rank shares: STRATA_NCCL_ID_FILE=<path> (takes precedence). Rank 0
//        calls ncclGetUniqueId (its bootstrap root starts in rank 0's process), writes the id to
//        <path>.tmp.<pid> and renames it to <path> (atomic on one file system); the other ranks
//        wait for the file, up to the timeout. Rank 0 deletes the file once the communicator
//        exists. Use a path per job (e.g. containing $SLURM_JOB_ID): a file left by a crashed run
//        on the same path could be read before rank 0 replaces it.
//
//      torchrun --nproc-per-node=8 ./train            # RANK, LOCAL_RANK, MASTER_ADDR/PORT set
//      srun --ntasks-per-node=8 --gpus-per-task=1 env MASTER_ADDR=$(hostname) MASTER_PORT=29500 ./train
//      mpirun -np 8 -x STRATA_NCCL_ID_FILE=$PWD/nccl-id.$JOB ./train
//
//      auto world = strata::nccl::init_from_environment();   // collective
//
//    Under srun with --gpus-per-task=1 every process sees one GPU: its local rank is then out of
//    range, so the process uses GPU 0 when it sees exactly one (any other mismatch is an error).
//
// 2. One process driving all local GPUs from threads: `nccl::run(num_gpus, fn)` (the same shape as
//    inprocess::run) creates the unique id in memory, starts one thread per GPU, each of which
//    sets its device and calls ncclCommInitRankConfig with the shared id, then runs
//    fn(communicator& world). The first rank to throw aborts the others, which then stop with an
//    AbortedError instead of waiting; `run` rethrows the lowest rank's own exception and
//    `run_collect` returns every rank's. Leave NCCL_COMM_ID unset for this mode.
//    One caveat comes with this mode (NCCL's own): cudaMalloc / cudaFree on one GPU can wait for a
//    kernel on another GPU of the process, and if that kernel is a collective waiting for the
//    allocating thread, both hang. So `run` starts no function before every rank's communicator
//    exists, synchronizes each rank's stream when its function returns, and destroys the
//    communicators (all of them, split groups included) only after every rank has finished; the
//    functions themselves should allocate device memory before their first collective or through
//    a caching allocator (cuda::backend's), never while a peer may be inside a collective.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../core/error.hpp"
#include "communicator.hpp"
#include "types.hpp"
#include "watchdog.hpp"

STRATA_NAMESPACE_BEGIN
namespace nccl {

// Where this process sits in a job started by torchrun, Open MPI or Slurm.
struct LaunchEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string launcher;  // "torchrun", "Open MPI" or "Slurm": which variables were read
};

namespace detail {

inline std::optional<std::string> env_text(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

inline int env_int(const char* name, const std::string& launcher) {
  std::optional<std::string> text = env_text(name);
  if (!text)
    fail<ConfigError>("nccl launch: ", launcher, " variables are set but ", name,
                      " is missing; set it or start the job with a launcher that sets all of them");
  char* end = nullptr;
  long value = std::strtol(text->c_str(), &end, 10);
  if (end == text->c_str() || *end != '\0' || value < 0 || value > 1 << 24)
    fail<ConfigError>("nccl launch: ", name, "='", *text, "' is not a non-negative integer");
  return static_cast<int>(value);
}

}  // namespace detail

// Reads the launcher's variables; ConfigError naming the variables when none (or a partial set) is found.
inline LaunchEnvironment launch_environment() {
  LaunchEnvironment env;
  if (detail::env_text("RANK") || detail::env_text("WORLD_SIZE")) {
    env.launcher = "torchrun";
    env.rank = detail::env_int("RANK", env.launcher);
    env.world_size = detail::env_int("WORLD_SIZE", env.launcher);
    env.local_rank = detail::env_text("LOCAL_RANK") ? detail::env_int("LOCAL_RANK", env.launcher) : env.rank;
  } else if (detail::env_text("OMPI_COMM_WORLD_RANK")) {
    env.launcher = "Open MPI";
    env.rank = detail::env_int("OMPI_COMM_WORLD_RANK", env.launcher);
    env.world_size = detail::env_int("OMPI_COMM_WORLD_SIZE", env.launcher);
    env.local_rank = detail::env_int("OMPI_COMM_WORLD_LOCAL_RANK", env.launcher);
  } else if (detail::env_text("SLURM_PROCID")) {
    env.launcher = "Slurm";
    env.rank = detail::env_int("SLURM_PROCID", env.launcher);
    env.world_size = detail::env_int("SLURM_NTASKS", env.launcher);
    env.local_rank = detail::env_int("SLURM_LOCALID", env.launcher);
  } else {
    fail<ConfigError>("nccl launch: no launcher variables found: set RANK, WORLD_SIZE and LOCAL_RANK (torchrun), or "
                      "start under mpirun (OMPI_COMM_WORLD_RANK ...) or srun (SLURM_PROCID ...); for one process "
                      "driving several GPUs use nccl::run");
  }
  if (env.world_size < 1) fail<ConfigError>("nccl launch (", env.launcher, "): the world size must be at least 1");
  if (env.rank >= env.world_size)
    fail<ConfigError>("nccl launch (", env.launcher, "): rank ", env.rank, " is not below the world size ",
                      env.world_size);
  return env;
}

namespace detail {

struct launcher_access {
  static std::shared_ptr<RankState> rank_state(const communicator& comm) { return comm.group_->rank_state; }
};

// NCCL_COMM_ID as it is or as derived from MASTER_ADDR / MASTER_PORT (see the top of this file);
// sets it in the environment, where NCCL reads it, before the first NCCL call of the process.
inline std::string ensure_bootstrap_address(const LaunchEnvironment& env) {
  if (std::optional<std::string> given = env_text("NCCL_COMM_ID")) return *given;
  std::optional<std::string> address = env_text("MASTER_ADDR");
  if (!address)
    fail<ConfigError>("nccl launch (", env.launcher, ", rank ", env.rank,
                      "): no way to find rank 0: set MASTER_ADDR (and MASTER_PORT) to an address of rank 0's host, "
                      "NCCL_COMM_ID=<host>:<port>, or STRATA_NCCL_ID_FILE to a path every rank shares");
  int port = 0;
  if (env_text("STRATA_NCCL_PORT")) {
    port = env_int("STRATA_NCCL_PORT", "strata");
  } else {
    if (!env_text("MASTER_PORT"))
      fail<ConfigError>("nccl launch (", env.launcher, ", rank ", env.rank, "): MASTER_ADDR is set but MASTER_PORT "
                        "is not; set MASTER_PORT (NCCL's bootstrap then listens on MASTER_PORT + 1) or STRATA_NCCL_PORT");
    port = env_int("MASTER_PORT", env.launcher) + 1;
  }
  if (port < 1 || port > 65535) fail<ConfigError>("nccl launch: bootstrap port ", port, " is outside 1..65535");
  std::string id = address->find(':') != std::string::npos && address->front() != '['
                       ? concat("[", *address, "]:", port)  // a bare IPv6 address
                       : concat(*address, ":", port);
  if (::setenv("NCCL_COMM_ID", id.c_str(), 0) != 0)
    fail<Error>("nccl launch: could not set NCCL_COMM_ID=", id, ": ", std::strerror(errno));
  return id;
}

inline void check_nccl(ncclResult_t result, std::string_view what) {
  if (result != ncclSuccess) fail<CommError>("nccl launch: ", what, " returned ", describe_result(result));
}

// STRATA_NCCL_ID_FILE: rank 0 writes the id atomically, the others wait for it.
inline ncclUniqueId exchange_id_through_file(const std::string& path, const LaunchEnvironment& env,
                                             std::chrono::duration<double> timeout) {
  ncclUniqueId id{};
  if (env.rank == 0) {
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const std::string temporary = concat(path, ".tmp.", ::getpid());
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(&id), sizeof(id));
      out.flush();
      if (!out)
        fail<FileError>("nccl launch: rank 0 could not write the NCCL id to '", temporary,
                        "' (STRATA_NCCL_ID_FILE='", path, "'); is its directory writable by rank 0?");
    }
    std::error_code error;
    std::filesystem::rename(temporary, path, error);
    if (error)
      fail<FileError>("nccl launch: rank 0 could not rename '", temporary, "' to '", path, "': ", error.message());
    return id;
  }
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(timeout);
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      in.read(reinterpret_cast<char*>(&id), sizeof(id));
      if (in.gcount() == static_cast<std::streamsize>(sizeof(id))) return id;
    }
    if (clock::now() > deadline)
      fail<CommError>("nccl launch (", env.launcher, "): rank ", env.rank, " waited ", timeout.count(),
                      " s for rank 0 to write the NCCL id to STRATA_NCCL_ID_FILE='", path,
                      "'; check that rank 0 started and that the path is on a file system every rank shares");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace detail

// Collective over the job: this process's world communicator, from the launcher's variables (see
// the top of this file). The device is the local rank, or 0 when the process sees exactly one GPU.
inline communicator init_from_environment(Options options = {}) {
  const LaunchEnvironment env = launch_environment();
  const std::chrono::duration<double> timeout = options.timeout ? *options.timeout : default_timeout();
  options.timeout = timeout;
  int devices = 0;
  cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices < 1)
    fail<ConfigError>("nccl launch (", env.launcher, ", rank ", env.rank, "): this process sees no GPU (",
                      status == cudaSuccess ? std::string("0 devices") : detail::describe_cuda(status), ")");
  int device = env.local_rank;
  if (device >= devices) {
    if (devices != 1)
      fail<ConfigError>("nccl launch (", env.launcher, ", rank ", env.rank, "): local rank ", env.local_rank,
                        " has no GPU of its own: this process sees ", devices,
                        " GPUs; start at most one process per GPU on each host");
    device = 0;
  }

  ncclUniqueId id{};
  std::optional<std::string> id_file = detail::env_text("STRATA_NCCL_ID_FILE");
  if (id_file) {
    id = detail::exchange_id_through_file(*id_file, env, timeout);
  } else {
    detail::ensure_bootstrap_address(env);
    detail::check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId (with NCCL_COMM_ID set)");
  }
  communicator world = communicator::create(id, env.world_size, env.rank, device, std::move(options));
  if (id_file && env.rank == 0) {
    std::error_code ignored;
    std::filesystem::remove(*id_file, ignored);  // every rank has joined, so every rank has read it
  }
  return world;
}

// Ends every NCCL rank of this process: at the watchdog's next round (tens of milliseconds) each
// fails with `reason`, naming the operation it was waiting in, and aborts its communicators (see
// watchdog.hpp). For another part of the process that learned the job is over, such as the
// liveness monitor (comm/liveness.hpp) hearing that a peer process died.
inline void abort_all_ranks(std::string reason) { detail::Watchdog::instance().abort_all(std::move(reason)); }

struct RunOptions {
  // Unset: STRATA_NCCL_TIMEOUT, else 600 s (see Options::timeout).
  std::optional<std::chrono::duration<double>> timeout{};
  // Name of the world group in messages.
  std::string name = "world";
};

// Runs fn(communicator& world) on `num_gpus` threads, rank r on GPU r, and waits for all of them.
// Returns, per rank, the exception its function ended with (null when it returned normally).
template <class F>
std::vector<std::exception_ptr> run_collect(int num_gpus, F&& fn, RunOptions options = {}) {
  int devices = 0;
  cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess) fail<ConfigError>("nccl::run: cudaGetDeviceCount failed: ", detail::describe_cuda(status));
  if (num_gpus < 1 || num_gpus > devices)
    fail<ConfigError>("nccl::run: asked for ", num_gpus, " GPUs but this process sees ", devices,
                      " (check CUDA_VISIBLE_DEVICES)");
  ncclUniqueId id{};
  detail::check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");

  detail::StopSignal stop;
  stop.parties = num_gpus;  // communicator::local_barrier waits for every thread of this run
  std::mutex ranks_mutex;
  std::condition_variable phase;  // with ranks_mutex: `created` and `finished` count ranks
  int created = 0;
  int finished = 0;
  std::vector<std::weak_ptr<detail::RankState>> ranks(static_cast<std::size_t>(num_gpus));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(num_gpus));

  // The first rank to fail raises `stop` and aborts the others' communicators, so a rank waiting
  // in a collective (or still in creation) gets an AbortedError naming the failed rank.
  auto abort_others = [&](int failed_rank, const std::exception_ptr& error) {
    std::string what;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
      what = "an exception not derived from std::exception";
    }
    std::vector<std::shared_ptr<detail::RankState>> live;
    {
      std::lock_guard lock(ranks_mutex);
      if (stop.raised.load()) return;  // a later failure, most likely caused by the first
      stop.reason = detail::concat("rank ", failed_rank, " failed: ", what);
      stop.raised.store(true, std::memory_order_release);
      for (int r = 0; r < num_gpus; ++r)
        if (r != failed_rank)
          if (auto state = ranks[static_cast<std::size_t>(r)].lock()) live.push_back(std::move(state));
    }
    phase.notify_all();
    // Not under the rank's mutex, which its thread may hold while blocked (watchdog.hpp).
    for (auto& state : live)
      detail::fail_from_outside(*state,
                                detail::concat(detail::kBackend, ": rank ", state->world_rank, " of group '", options.name,
                                               "' was aborted because ", stop.reason),
                                true);
  };

  // Two host barriers keep device memory management away from collectives in flight (see
  // watchdog.hpp, Lifetimes): no rank starts its function before every rank's communicator exists,
  // and no rank destroys its communicators before every rank has finished.
  auto body = [&](int r) {
    std::optional<communicator> world;
    try {
      Options rank_options;
      rank_options.timeout = options.timeout;
      rank_options.name = options.name;
      world.emplace(detail::make_world(id, num_gpus, r, r, std::move(rank_options), &stop));
      {
        std::unique_lock lock(ranks_mutex);
        ranks[static_cast<std::size_t>(r)] = detail::launcher_access::rank_state(*world);
        ++created;
        phase.notify_all();
        phase.wait(lock, [&] { return created == num_gpus || stop.raised.load(); });
        // abort_others raises `stop` and reads `ranks` under ranks_mutex, so a rank registered
        // too late sees it here.
        if (stop.raised.load())
          throw AbortedError(detail::concat(detail::kBackend, ": rank ", r, " of group '", options.name,
                                            "' did not start its function because ", stop.reason));
      }
      std::invoke(fn, *world);
      world->synchronize();  // what the function enqueued has finished, or its failure is thrown
    } catch (...) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
      abort_others(r, errors[static_cast<std::size_t>(r)]);
    }
    {
      std::unique_lock lock(ranks_mutex);
      ++finished;
      phase.notify_all();
      phase.wait(lock, [&] { return finished == num_gpus; });
    }
    try {
      world.reset();
    } catch (...) {
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(num_gpus));
  try {
    for (int r = 0; r < num_gpus; ++r) threads.emplace_back(body, r);
  } catch (...) {
    {
      std::lock_guard lock(ranks_mutex);
      if (!stop.raised.load()) {
        stop.reason = "the launcher could not start a thread for every rank";
        stop.raised.store(true, std::memory_order_release);
      }
      finished += num_gpus - static_cast<int>(threads.size());  // the threads never started
    }
    phase.notify_all();
    for (auto& t : threads) t.join();
    throw;
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Runs fn(communicator& world) on `num_gpus` threads. If any rank threw, rethrows the original
// exception of the lowest rank that failed first-hand (not an AbortedError caused by another rank).
template <class F>
void run(int num_gpus, F&& fn, RunOptions options = {}) {
  std::vector<std::exception_ptr> errors = run_collect(num_gpus, std::forward<F>(fn), std::move(options));
  strata::detail::rethrow_first_hand_failure<AbortedError>(errors);
}

}  // namespace nccl
STRATA_NAMESPACE_END
