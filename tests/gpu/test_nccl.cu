// tests/gpu/test_nccl.cu: strata::nccl::communicator on real GPUs against the in-process
// communicator on the same inputs.
//
//   test_nccl [--gpus N]       threads mode: nccl::run on N GPUs (default: all, at least 2), every
//                              operation and element type, uneven counts, split sub-groups, group
//                              calls, size errors, and the failure tests (a rank skips a
//                              collective; the other must get a CommError naming it in time)
//   test_nccl --process        one process of a job started with torchrun-style variables (RANK,
//                              WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or with
//                              STRATA_NCCL_ID_FILE; run_nccl_processes.sh starts such a job
//
// Every check prints one line (PASS or FAIL, the mode, the rank, what was checked); the last line
// is a summary, and the exit status is non-zero when any check failed. Results are compared bit
// for bit: with two ranks every reduced element is one IEEE operation on both sides (a + b, or
// a/2 + b/2 for avg, which equals (a + b)/2 away from the subnormal range), so NCCL and the
// in-process reference agree exactly whatever NCCL's algorithm. The one exception: bf16 / fp16
// sums over more than two ranks, where NCCL rounds each partial sum to 16 bits; those are held to
// the rounding bound of sum_tolerance.
#include <strata/backend/cuda/runtime.hpp>
#include <strata/comm/inprocess.hpp>
#include <strata/comm/nccl.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using strata::bf16;
using strata::device_span;
using strata::fp16;
using strata::ReduceOp;
namespace nccl = strata::nccl;
namespace inprocess = strata::inprocess;

std::mutex print_mutex;
std::atomic<int> passed{0};
std::atomic<int> failed{0};

void report(bool ok, const std::string& line) {
  (ok ? passed : failed).fetch_add(1);
  std::lock_guard lock(print_mutex);
  std::printf("%s  %s\n", ok ? "PASS" : "FAIL", line.c_str());
  std::fflush(stdout);
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
double as_double(T value) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, fp16>) return static_cast<double>(static_cast<float>(value));
  else return static_cast<double>(value);
}

// Deterministic inputs: multiples of 1/64 in [-15.6, 15.6] for floating types, integers in
// [-1000, 1000] otherwise, different for every (rank, index, salt).
template <class T>
std::vector<T> make_input(std::size_t n, int rank, std::uint64_t salt) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t h = (i * 7919u + static_cast<std::uint64_t>(rank) * 104729u + salt * 31u) % 2001u;
    const double centered = static_cast<double>(h) - 1000.0;
    if constexpr (std::is_integral_v<T>) v[i] = static_cast<T>(centered);
    else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, fp16>) v[i] = T(static_cast<float>(centered / 64.0));
    else v[i] = static_cast<T>(centered / 64.0);
  }
  return v;
}

// How far a sum (or average) of `ranks` inputs of make_input may be from the in-process one. Both
// are exact for float, double and integers (multiples of 1/64 below 2^10 add exactly), and for two
// ranks (one addition, rounded once on both sides). For bf16 / fp16 over more ranks NCCL rounds
// every partial sum to 16 bits (a ring adds one rank's part at a time, a tree in pairs) where the
// in-process communicator sums in float and rounds once: ranks - 1 roundings on NCCL's side and one
// on the reference's, each within half an ulp of the largest partial sum, |sum| <= 15.6 x ranks.
template <class T>
double sum_tolerance(int ranks) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, fp16>) {
    if (ranks <= 2) return 0;
    const T top(15.625f * static_cast<float>(ranks));
    const double ulp = as_double(T::from_bits(static_cast<std::uint16_t>(top.bits + 1))) - as_double(top);
    return 0.5 * ulp * ranks;
  } else {
    return 0;
  }
}

std::uint64_t salt_of(std::string_view label) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : label) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h % 1000u;
}

// Device memory of one rank, allocated once before any collective and handed out per case.
// When one process drives several GPUs, cudaMalloc / cudaFree on one GPU can wait for a kernel on
// a peer GPU, which may be a collective waiting for this thread: a test that allocated per case
// could deadlock (NCCL's known caveat for that mode), so it never does.
class DeviceArena {
 public:
  explicit DeviceArena(std::size_t bytes) : capacity_(bytes) {
    STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&base_), capacity_));
  }
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() { (void)cudaFree(base_); }

  void reset() { used_ = 0; }
  template <class T>
  T* take(std::size_t n) {
    const std::size_t begin = (used_ + 255) / 256 * 256;
    if (begin + n * sizeof(T) > capacity_)
      strata::fail<strata::Error>("DeviceArena: ", n * sizeof(T), " bytes do not fit (", capacity_ - begin, " left)");
    used_ = begin + n * sizeof(T);
    return reinterpret_cast<T*>(base_ + begin);
  }

 private:
  char* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
};

// Threads of one process meeting on the host (no GPU work), reusable.
class HostBarrier {
 public:
  explicit HostBarrier(int count) : count_(count) {}
  void arrive_and_wait() {
    std::unique_lock lock(mutex_);
    const long generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int count_;
  int arrived_ = 0;
  long generation_ = 0;
};

constexpr std::size_t kArenaBytes = std::size_t{96} << 20;

struct Context {
  std::string mode;  // "threads" or "process"
  DeviceArena* arena = nullptr;
};

// Runs one case on this rank (`label` must be the same on every rank: it seeds the inputs): the in-process communicator computes every rank's expected output
// from the same inputs (group size and ranks as in `comm`), then `gpu` runs on the device and the
// rank's output is compared with its expected one.
//   in_counts[p], out_counts[p]: sizes of rank p's input and output
//   host(c, in, out): the operation on inprocess::communicator c with host spans
//   gpu(comm, in, out): the same on nccl::communicator with device spans
//   tolerance: the largest difference allowed (0: the same bits; sum_tolerance for sums)
template <class T, class Host, class Gpu>
void run_case(const Context& ctx, nccl::communicator& comm, const std::string& label,
              const std::vector<std::size_t>& in_counts, const std::vector<std::size_t>& out_counts, Host host, Gpu gpu,
              double tolerance = 0) {
  const int size = comm.size();
  const int rank = comm.rank();
  const std::string line = strata::detail::concat("[", ctx.mode, "] world rank ", comm.world_rank(), " group '",
                                                  comm.name(), "' rank ", rank, "/", size, ": ", label, " <",
                                                  strata::dtype_name<T>(), ">");
  try {
    const std::uint64_t salt = salt_of(label);
    std::vector<std::vector<T>> inputs(static_cast<std::size_t>(size));
    std::vector<std::vector<T>> expected(static_cast<std::size_t>(size));
    for (int p = 0; p < size; ++p) {
      inputs[static_cast<std::size_t>(p)] = make_input<T>(in_counts[static_cast<std::size_t>(p)], p, salt);
      expected[static_cast<std::size_t>(p)].assign(out_counts[static_cast<std::size_t>(p)], T{});
    }
    inprocess::run(size, [&](inprocess::communicator& c) {
      const std::size_t p = static_cast<std::size_t>(c.rank());
      host(c, std::span<const T>(inputs[p]), std::span<T>(expected[p]));
    });

    const std::size_t me = static_cast<std::size_t>(rank);
    ctx.arena->reset();  // the previous case has finished: synchronized below
    T* in = ctx.arena->take<T>(in_counts[me]);
    T* out = ctx.arena->take<T>(out_counts[me]);
    STRATA_CUDA_CHECK(cudaMemcpyAsync(in, inputs[me].data(), in_counts[me] * sizeof(T), cudaMemcpyHostToDevice,
                                      comm.stream()));
    STRATA_CUDA_CHECK(cudaMemsetAsync(out, 0, out_counts[me] * sizeof(T), comm.stream()));
    gpu(comm, device_span<const T>(in, in_counts[me]), device_span<T>(out, out_counts[me]));
    std::vector<T> got(out_counts[me]);
    STRATA_CUDA_CHECK(cudaMemcpyAsync(got.data(), out, out_counts[me] * sizeof(T), cudaMemcpyDeviceToHost,
                                      comm.stream()));
    comm.synchronize();

    double largest = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double diff = std::abs(as_double(got[i]) - as_double(expected[me][i]));
      if (tolerance == 0 ? !same_bits(got[i], expected[me][i]) : !(diff <= tolerance)) {
        report(false, strata::detail::concat(line, ": element ", i, " of ", got.size(), " is ", as_double(got[i]),
                                             ", the in-process communicator gives ", as_double(expected[me][i]),
                                             tolerance == 0 ? std::string() : strata::detail::concat(" (allowed ", tolerance, ")")));
        return;
      }
      largest = std::max(largest, diff);
    }
    report(true, tolerance == 0 ? strata::detail::concat(line, " (", got.size(), " elements equal)")
                                : strata::detail::concat(line, " (", got.size(), " elements within ", tolerance,
                                                         ", largest difference ", largest, ")"));
  } catch (const std::exception& e) {
    report(false, strata::detail::concat(line, ": threw ", e.what()));
  }
}

std::vector<std::size_t> all(int size, std::size_t n) { return std::vector<std::size_t>(static_cast<std::size_t>(size), n); }

bool adds(ReduceOp op) { return op == ReduceOp::sum || op == ReduceOp::avg; }

template <class T>
void reductions(const Context& ctx, nccl::communicator& comm, std::size_t n) {
  const int size = comm.size();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
    const std::string name(reduce_op_name(op));
    run_case<T>(
        ctx, comm, strata::detail::concat("all_reduce ", name, " n=", n), all(size, n), all(size, n),
        [op](inprocess::communicator& c, std::span<const T> in, std::span<T> out) {
          std::copy(in.begin(), in.end(), out.begin());
          c.all_reduce(out, op);
        },
        [op](nccl::communicator& c, device_span<const T> in, device_span<T> out) {
          STRATA_CUDA_CHECK(cudaMemcpyAsync(out.data(), in.data(), in.size_bytes(), cudaMemcpyDeviceToDevice, c.stream()));
          c.all_reduce(out, op);
        },
        adds(op) ? sum_tolerance<T>(size) : 0);
  }
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
    const std::string name(reduce_op_name(op));
    const std::size_t block = 257;
    run_case<T>(
        ctx, comm, strata::detail::concat("reduce_scatter ", name, " block=", block), all(size, block * size),
        all(size, block),
        [op](inprocess::communicator& c, std::span<const T> in, std::span<T> out) { c.reduce_scatter(in, out, op); },
        [op](nccl::communicator& c, device_span<const T> in, device_span<T> out) { c.reduce_scatter(in, out, op); },
        adds(op) ? sum_tolerance<T>(size) : 0);
  }
}

// Uneven counts: rank p has counts[p] elements; with two ranks {5, 17} and {0, 9}.
std::vector<std::vector<std::size_t>> uneven_counts(int size) {
  std::vector<std::size_t> a, b;
  for (int p = 0; p < size; ++p) {
    a.push_back(static_cast<std::size_t>(5 + 12 * p));
    b.push_back(p == 0 ? 0 : static_cast<std::size_t>(9 * p));
  }
  return {a, b};
}

template <class T>
void gathers(const Context& ctx, nccl::communicator& comm) {
  const int size = comm.size();
  const std::size_t n = 333;
  run_case<T>(
      ctx, comm, strata::detail::concat("all_gather n=", n), all(size, n), all(size, n * size),
      [](inprocess::communicator& c, std::span<const T> in, std::span<T> out) { c.all_gather(in, out); },
      [](nccl::communicator& c, device_span<const T> in, device_span<T> out) { c.all_gather(in, out); });
  for (const auto& counts : uneven_counts(size)) {
    const std::size_t total = strata::detail::sum_of_counts(counts);
    run_case<T>(
        ctx, comm, strata::detail::concat("all_gather_v counts ", strata::detail::format_counts(counts)), counts,
        all(size, total),
        [&](inprocess::communicator& c, std::span<const T> in, std::span<T> out) { c.all_gather_v(in, out, counts); },
        [&](nccl::communicator& c, device_span<const T> in, device_span<T> out) { c.all_gather_v(in, out, counts); });
    run_case<T>(
        ctx, comm, strata::detail::concat("reduce_scatter_v sum counts ", strata::detail::format_counts(counts)),
        all(size, total), counts,
        [&](inprocess::communicator& c, std::span<const T> in, std::span<T> out) {
          c.reduce_scatter_v(in, out, counts, ReduceOp::sum);
        },
        [&](nccl::communicator& c, device_span<const T> in, device_span<T> out) {
          c.reduce_scatter_v(in, out, counts, ReduceOp::sum);
        },
        sum_tolerance<T>(size));
  }
}

template <class T>
void broadcasts_and_point_to_point(const Context& ctx, nccl::communicator& comm) {
  const int size = comm.size();
  const std::size_t n = 1000;
  for (int root = 0; root < size; ++root) {
    run_case<T>(
        ctx, comm, strata::detail::concat("broadcast root ", root), all(size, n), all(size, n),
        [root](inprocess::communicator& c, std::span<const T> in, std::span<T> out) {
          std::copy(in.begin(), in.end(), out.begin());
          c.broadcast(out, root);
        },
        [root](nccl::communicator& c, device_span<const T> in, device_span<T> out) {
          STRATA_CUDA_CHECK(cudaMemcpyAsync(out.data(), in.data(), in.size_bytes(), cudaMemcpyDeviceToDevice, c.stream()));
          c.broadcast(out, root);
        });
  }
  if (size < 2) return;
  // One direction: rank 0 sends, rank 1 receives (the others keep zeros).
  run_case<T>(
      ctx, comm, "send 0 -> recv 1", all(size, n), all(size, n),
      [](inprocess::communicator& c, std::span<const T> in, std::span<T> out) {
        if (c.rank() == 0) c.send(in, 1);
        if (c.rank() == 1) c.recv(out, 0);
      },
      [](nccl::communicator& c, device_span<const T> in, device_span<T> out) {
        if (c.rank() == 0) c.send(in, 1);
        if (c.rank() == 1) c.recv(out, 0);
      });
  // A ring exchange in one group: each rank sends to the next and receives from the previous.
  run_case<T>(
      ctx, comm, "ring send/recv in a group", all(size, n), all(size, n),
      [](inprocess::communicator& c, std::span<const T> in, std::span<T> out) {
        c.send(in, (c.rank() + 1) % c.size());
        c.recv(out, (c.rank() + c.size() - 1) % c.size());
      },
      [](nccl::communicator& c, device_span<const T> in, device_span<T> out) {
        auto batch = strata::batch_point_to_point(c);  // c.group(): one NCCL group
        c.send(in, (c.rank() + 1) % c.size());
        c.recv(out, (c.rank() + c.size() - 1) % c.size());
        batch.end();
      });
}

// Uneven all_to_all: rank r sends (2 + 3r + p) % 7 elements to rank p (some zero), so rank r
// receives (2 + 3p + r) % 7 from rank p.
template <class T>
void all_to_all(const Context& ctx, nccl::communicator& comm) {
  const int size = comm.size();
  auto counts_of = [size](int r) {
    std::vector<std::size_t> send(static_cast<std::size_t>(size)), recv(static_cast<std::size_t>(size));
    for (int p = 0; p < size; ++p) {
      send[static_cast<std::size_t>(p)] = static_cast<std::size_t>((2 + 3 * r + p) % 7);
      recv[static_cast<std::size_t>(p)] = static_cast<std::size_t>((2 + 3 * p + r) % 7);
    }
    return std::pair{send, recv};
  };
  std::vector<std::size_t> in_counts, out_counts;
  for (int r = 0; r < size; ++r) {
    auto [send, recv] = counts_of(r);
    in_counts.push_back(strata::detail::sum_of_counts(send));
    out_counts.push_back(strata::detail::sum_of_counts(recv));
  }
  const auto [mine_send, mine_recv] = counts_of(comm.rank());
  // The label seeds the inputs, so it must be the same on every rank (no rank's own counts in it).
  run_case<T>(
      ctx, comm, "all_to_all uneven (rank r sends (2 + 3r + p) % 7 to rank p)", in_counts, out_counts,
      [&](inprocess::communicator& c, std::span<const T> in, std::span<T> out) {
        auto [send, recv] = counts_of(c.rank());
        c.all_to_all(in, send, out, recv);
      },
      [&](nccl::communicator& c, device_span<const T> in, device_span<T> out) {
        c.all_to_all(in, mine_send, out, mine_recv);
      });
}

template <class T>
void every_operation(const Context& ctx, nccl::communicator& comm) {
  reductions<T>(ctx, comm, 1000);
  gathers<T>(ctx, comm);
  broadcasts_and_point_to_point<T>(ctx, comm);
  all_to_all<T>(ctx, comm);
}

std::string line_of(const Context& ctx, const nccl::communicator& comm, std::string_view what) {
  return strata::detail::concat("[", ctx.mode, "] world rank ", comm.world_rank(), " group '", comm.name(), "': ", what);
}

// Spins for about `cycles` clock cycles, then writes value to p[0..n): a producer that finishes
// well after the host has enqueued what follows it.
__global__ void spin_then_fill(float* p, std::size_t n, float value, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = value;
}

// An overlapped handle runs on the rank's communication stream, after what the compute stream had
// enqueued (a slow producer's output is what gets reduced), and join_overlapped() holds the compute
// stream until the overlapped work is done (a slow write on the communication stream is what the
// compute stream reads after the join).
void overlapped_operations(const Context& ctx, nccl::communicator& world) {
  const std::size_t n = std::size_t{1} << 20;
  ctx.arena->reset();
  float* buffer = ctx.arena->take<float>(2 * n);
  float* other = buffer + n;
  const cudaStream_t compute = world.stream();
  const long long cycles = 20'000'000;  // ~10 ms
  spin_then_fill<<<64, 256, 0, compute>>>(buffer, n, static_cast<float>(world.rank() + 1), cycles);
  nccl::communicator side = world.overlapped();
  side.all_reduce(device_span<float>(buffer, n), ReduceOp::sum);
  const cudaStream_t comm_stream = side.stream();
  spin_then_fill<<<64, 256, 0, comm_stream>>>(other, n, 7.0f, cycles);
  world.join_overlapped();
  std::vector<float> got(2 * n);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(got.data(), buffer, 2 * n * sizeof(float), cudaMemcpyDeviceToHost, compute));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(compute));
  world.synchronize();
  const float sum = static_cast<float>(world.size() * (world.size() + 1) / 2);
  std::size_t bad_sum = 0, bad_other = 0;
  for (std::size_t i = 0; i < n; ++i) {
    bad_sum += got[i] != sum;
    bad_other += got[n + i] != 7.0f;
  }
  report(comm_stream != nullptr && comm_stream != compute,
         line_of(ctx, world, "overlapped() enqueues on a communication stream of its own"));
  report(bad_sum == 0, line_of(ctx, world, strata::detail::concat("overlapped all_reduce reads the compute stream's slow producer's "
                                                                  "output: ", n - bad_sum, " of ", n, " elements are the sum ", sum)));
  report(bad_other == 0, line_of(ctx, world, strata::detail::concat("after join_overlapped the compute stream sees the communication "
                                                                    "stream's slow write: ", n - bad_other, " of ", n, " elements")));
}

// A mark of the communication stream: join_overlapped(mark) holds the compute stream until the
// overlapped work issued before the mark is done (an overlapped all_reduce of a slow producer's
// output, then a slow write), and not until the work issued after it (a much slower write is
// still running when the compute stream has read the first results).
void overlapped_marks(const Context& ctx, nccl::communicator& world) {
  const std::size_t n = std::size_t{1} << 20;
  ctx.arena->reset();
  float* reduced = ctx.arena->take<float>(3 * n);
  float* written = reduced + n;
  float* later = written + n;
  const cudaStream_t compute = world.stream();
  nccl::communicator side = world.overlapped();
  spin_then_fill<<<64, 256, 0, compute>>>(reduced, n, static_cast<float>(world.rank() + 1), 20'000'000);
  side.all_reduce(device_span<float>(reduced, n), ReduceOp::sum);
  const cudaStream_t comm_stream = side.stream();
  spin_then_fill<<<64, 256, 0, comm_stream>>>(written, n, 5.0f, 20'000'000);
  const std::uint64_t mark = world.overlapped_mark();
  spin_then_fill<<<64, 256, 0, comm_stream>>>(later, n, 9.0f, 800'000'000);  // ~0.4 s
  cudaEvent_t later_done = nullptr;
  STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&later_done, cudaEventDisableTiming));
  STRATA_CUDA_CHECK(cudaEventRecord(later_done, comm_stream));
  world.join_overlapped(mark);
  std::vector<float> got(2 * n);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(got.data(), reduced, 2 * n * sizeof(float), cudaMemcpyDeviceToHost, compute));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(compute));
  const cudaError_t later_state = cudaEventQuery(later_done);
  world.join_overlapped();
  world.synchronize();
  STRATA_CUDA_CHECK(cudaEventDestroy(later_done));
  const float sum = static_cast<float>(world.size() * (world.size() + 1) / 2);
  std::size_t good_sum = 0, good_written = 0;
  for (std::size_t i = 0; i < n; ++i) {
    good_sum += got[i] == sum;
    good_written += got[n + i] == 5.0f;
  }
  report(good_sum == n && good_written == n,
         line_of(ctx, world, strata::detail::concat("after join_overlapped(mark) the compute stream sees the work issued before "
                                                    "the mark: ", good_sum, " and ", good_written, " of ", n, " elements")));
  report(later_state == cudaErrorNotReady,
         line_of(ctx, world, strata::detail::concat("join_overlapped(mark) does not wait for work issued after the mark (a 0.4 s "
                                                    "write was ", later_state == cudaErrorNotReady ? "still running" : "done",
                                                    " when the compute stream had read the results)")));
  bool refused = false;
  try {
    world.join_overlapped(mark + 1000);
  } catch (const strata::CommError&) {
    refused = true;
  }
  report(refused, line_of(ctx, world, "join_overlapped refuses a mark that was never issued"));
}

// Splits: singletons (color = rank) and the whole group with reversed keys.
void splits(const Context& ctx, nccl::communicator& world) {
  try {
    nccl::communicator single = world.split(world.rank(), 0, "single");
    report(single.size() == 1 && single.rank() == 0,
           line_of(ctx, single, strata::detail::concat("split(color = rank) gives size ", single.size(), ", rank ",
                                                       single.rank(), " (want 1, 0)")));
    reductions<float>(ctx, single, 100);
    gathers<double>(ctx, single);
    all_to_all<float>(ctx, single);

    nccl::communicator reversed = world.split(0, world.size() - 1 - world.rank(), "reversed");
    const int want = world.size() - 1 - world.rank();
    report(reversed.size() == world.size() && reversed.rank() == want,
           line_of(ctx, reversed, strata::detail::concat("split(0, key = size-1-rank) gives rank ", reversed.rank(),
                                                         " of ", reversed.size(), " (want ", want, " of ",
                                                         world.size(), ")")));
    reductions<bf16>(ctx, reversed, 1000);
    gathers<float>(ctx, reversed);
    gathers<std::int32_t>(ctx, reversed);
    broadcasts_and_point_to_point<float>(ctx, reversed);
    all_to_all<double>(ctx, reversed);
    reversed.barrier();
    report(true, line_of(ctx, reversed, "barrier on the reversed group returned"));
  } catch (const std::exception& e) {
    report(false, line_of(ctx, world, strata::detail::concat("split tests threw ", e.what())));
  }
}

// Sizes that do not fit are ShapeError before anything is enqueued, and the rank stays usable.
void size_errors(const Context& ctx, nccl::communicator& comm) {
  ctx.arena->reset();
  device_span<float> a(ctx.arena->take<float>(10), 10), b(ctx.arena->take<float>(7), 7);
  try {
    comm.all_gather(device_span<const float>(a), b);
    report(false, line_of(ctx, comm, "all_gather with a wrong output size did not throw"));
  } catch (const strata::ShapeError& e) {
    const bool names = std::string(e.what()).find("all_gather") != std::string::npos;
    report(names, line_of(ctx, comm, strata::detail::concat("all_gather with a wrong output size: ShapeError '", e.what(), "'")));
  } catch (const std::exception& e) {
    report(false, line_of(ctx, comm, strata::detail::concat("all_gather with a wrong output size threw another error: ", e.what())));
  }
  try {
    comm.broadcast(a, comm.size());
    report(false, line_of(ctx, comm, "broadcast from a root outside the group did not throw"));
  } catch (const strata::CommError& e) {
    report(true, line_of(ctx, comm, strata::detail::concat("broadcast from root ", comm.size(), ": CommError '", e.what(), "'")));
  }
  report(!comm.failed(), line_of(ctx, comm, "the communicator is still usable after the size errors"));
}

// Copy-engine all-gathers (use_copy_engines_for_overlapped_gathers), on a group of their own: NCCL
// registers the window where it can (NCCL 2.28 loaded, GPUs that map each other's memory), and
// every all-gather on an overlapped handle then gives the bits of the in-process all-gather, in
// place and not, in 16 and 32 bits, and once larger than the window (which grows). A handle that
// is not overlapped gathers as before.
void copy_engine_gathers(const Context& ctx, nccl::communicator& world) {
  try {
    nccl::communicator group = world.split(0, world.rank(), "copy_engines");
    int version = 0;
    (void)ncclGetVersion(&version);
    bool peers = true;
    for (int d = 0; d < strata::cuda::device_count(); ++d) {
      int can = 1;
      if (d != group.device() && cudaDeviceCanAccessPeer(&can, group.device(), d) == cudaSuccess && !can) peers = false;
    }
    const bool expected = version >= NCCL_VERSION(2, 28, 0) && peers;
    const bool on = group.use_copy_engines_for_overlapped_gathers(std::size_t{1} << 20);
    report(on == expected && group.copy_engine_gathers() == on,
           line_of(ctx, group, strata::detail::concat("use_copy_engines_for_overlapped_gathers: ", on ? "on" : "off",
                                                      " (NCCL ", version, ", peers map each other's memory: ",
                                                      peers ? "yes" : "no", "; want ", expected ? "on" : "off", ")")));
    const auto overlapped_gather = [](nccl::communicator& c, auto in, auto out) {
      nccl::communicator side = c.overlapped();
      side.all_gather(in, out);
      c.join_overlapped();
    };
    const auto host_gather = [](inprocess::communicator& c, auto in, auto out) { c.all_gather(in, out); };
    const int size = group.size();
    for (std::size_t n : {std::size_t{333}, std::size_t{1} << 20}) {  // 4 MiB per rank of floats: the window grows
      run_case<float>(ctx, group, strata::detail::concat("overlapped all_gather by copy engines n=", n), all(size, n),
                      all(size, n * size), host_gather, overlapped_gather);
      run_case<bf16>(ctx, group, strata::detail::concat("overlapped all_gather by copy engines n=", n), all(size, n),
                     all(size, n * size), host_gather, overlapped_gather);
    }
    run_case<float>(ctx, group, "all_gather on the handle that is not overlapped", all(size, 333), all(size, 333 * size),
                    host_gather, [](nccl::communicator& c, device_span<const float> in, device_span<float> out) {
                      c.all_gather(in, out);
                    });
    // In place: this rank's block of `out` is the input.
    const std::size_t n = 4099;
    ctx.arena->reset();
    float* whole = ctx.arena->take<float>(n * static_cast<std::size_t>(size));
    std::vector<std::vector<float>> blocks(static_cast<std::size_t>(size));
    for (int p = 0; p < size; ++p) blocks[static_cast<std::size_t>(p)] = make_input<float>(n, p, 77);
    float* own = whole + n * static_cast<std::size_t>(group.rank());
    STRATA_CUDA_CHECK(cudaMemsetAsync(whole, 0, n * static_cast<std::size_t>(size) * sizeof(float), group.stream()));
    STRATA_CUDA_CHECK(cudaMemcpyAsync(own, blocks[static_cast<std::size_t>(group.rank())].data(), n * sizeof(float),
                                      cudaMemcpyHostToDevice, group.stream()));
    overlapped_gather(group, device_span<const float>(own, n), device_span<float>(whole, n * static_cast<std::size_t>(size)));
    std::vector<float> got(n * static_cast<std::size_t>(size));
    STRATA_CUDA_CHECK(cudaMemcpyAsync(got.data(), whole, got.size() * sizeof(float), cudaMemcpyDeviceToHost, group.stream()));
    group.synchronize();
    bool same = true;
    for (int p = 0; p < size; ++p)
      same = same && std::memcmp(got.data() + n * static_cast<std::size_t>(p), blocks[static_cast<std::size_t>(p)].data(),
                                 n * sizeof(float)) == 0;
    report(same, line_of(ctx, group, strata::detail::concat("overlapped all_gather by copy engines in place (n=", n,
                                                            "): every block is its rank's input")));
  } catch (const std::exception& e) {
    report(false, line_of(ctx, world, strata::detail::concat("copy-engine all-gathers threw ", e.what())));
  }
}

void all_cases(const Context& ctx, nccl::communicator& world) {
  every_operation<float>(ctx, world);
  every_operation<double>(ctx, world);
  every_operation<bf16>(ctx, world);
  every_operation<std::int32_t>(ctx, world);
  reductions<fp16>(ctx, world, 1000);
  reductions<std::int64_t>(ctx, world, 1000);
  gathers<std::int64_t>(ctx, world);
  reductions<float>(ctx, world, std::size_t{1} << 22);  // several NCCL chunks and channels
  splits(ctx, world);
  overlapped_operations(ctx, world);
  overlapped_marks(ctx, world);
  copy_engine_gathers(ctx, world);
  size_errors(ctx, world);
  try {
    world.barrier();
    report(true, line_of(ctx, world, "barrier returned"));
  } catch (const std::exception& e) {
    report(false, line_of(ctx, world, strata::detail::concat("barrier threw ", e.what())));
  }
}

// One rank skips an all_reduce; the other must get a CommError naming all_reduce within the
// timeout plus a margin, not a hang. `warm_up` first runs one all_reduce on both ranks, so the
// connections exist and the skipped collective reaches the GPU (the watchdog's case); without it
// NCCL may still be connecting when the timeout expires (the enqueue wait's case).
void failure_test(int gpus, bool warm_up) {
  const double timeout_seconds = 5.0;
  const std::string label = strata::detail::concat("[threads] failure test (", warm_up ? "after a warm-up" : "first collective",
                                                   "): rank 1 skips all_reduce, timeout ", timeout_seconds, " s");
  std::atomic<double> elapsed{-1.0};
  std::atomic<bool> rank0_done{false};
  HostBarrier allocated(gpus);
  std::vector<std::exception_ptr> errors;
  const auto start = std::chrono::steady_clock::now();
  try {
    nccl::RunOptions options;
    options.timeout = std::chrono::duration<double>(timeout_seconds);
    options.name = "failure";
    errors = nccl::run_collect(
        gpus,
        [&](nccl::communicator& comm) {
          strata::cuda::device_buffer<float> buffer(4096);
          buffer.zero(comm.stream());
          device_span<float> span(buffer.data(), buffer.size());
          allocated.arrive_and_wait();  // no rank allocates while another's collective is in flight
          if (warm_up) {
            comm.all_reduce(span);
            comm.synchronize();
          }
          if (comm.rank() == 1) {
            // The rank that skips keeps its communicator (and the memory its peer's kernels
            // read) alive until rank 0 is done, as a rank blocked elsewhere would.
            const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
            while (!rank0_done.load() && std::chrono::steady_clock::now() < give_up)
              std::this_thread::sleep_for(std::chrono::milliseconds(10));
            return;
          }
          const auto begin = std::chrono::steady_clock::now();
          try {
            comm.all_reduce(span);
            comm.synchronize();
          } catch (const strata::CommError& e) {
            elapsed.store(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
            // A failed rank stays failed: its next call reports the same failure.
            std::string next = "returned normally";
            try {
              comm.all_reduce(span);
            } catch (const strata::CommError& again) {
              next = again.what();
            }
            report(next.find("all_reduce<float32>(4096 elements, sum)") != std::string::npos,
                   strata::detail::concat(label, ": the next all_reduce on the failed rank: '", next, "'"));
            rank0_done.store(true);
            throw;
          } catch (...) {
            rank0_done.store(true);
            throw;
          }
          rank0_done.store(true);
        },
        options);
  } catch (const std::exception& e) {
    report(false, strata::detail::concat(label, ": the launcher threw ", e.what()));
    return;
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!errors.at(0)) {
    report(false, strata::detail::concat(label, ": rank 0 returned normally; it should have failed"));
    return;
  }
  try {
    std::rethrow_exception(errors[0]);
  } catch (const nccl::AbortedError& e) {
    report(false, strata::detail::concat(label, ": rank 0 got an AbortedError instead of its own CommError: ", e.what()));
    return;
  } catch (const strata::CommError& e) {
    const std::string what = e.what();
    const bool names_operation = what.find("all_reduce<float32>(4096 elements, sum)") != std::string::npos;
    const bool names_group = what.find("group 'failure'") != std::string::npos && what.find("rank 0") != std::string::npos;
    const bool in_time = elapsed.load() >= 0 && elapsed.load() < timeout_seconds + 10.0;
    report(names_operation && names_group && in_time,
           strata::detail::concat(label, ": rank 0 got CommError after ", elapsed.load(), " s (launcher returned after ",
                                  total, " s): '", what, "'"));
  } catch (const std::exception& e) {
    report(false, strata::detail::concat(label, ": rank 0 got another exception: ", e.what()));
    return;
  }
  bool rank1_ok = !errors[1];
  std::string rank1_text = "returned normally";
  if (errors[1]) {
    try {
      std::rethrow_exception(errors[1]);
    } catch (const nccl::AbortedError& e) {
      rank1_ok = true;
      rank1_text = strata::detail::concat("AbortedError '", e.what(), "'");
    } catch (const std::exception& e) {
      rank1_text = strata::detail::concat("unexpected '", e.what(), "'");
    }
  }
  report(rank1_ok, strata::detail::concat(label, ": rank 1 (which skipped) ", rank1_text));
}

// A rank whose function throws stops its peers: the one waiting in a collective gets an
// AbortedError naming the failed rank long before the timeout.
void peer_exception_test(int gpus) {
  const std::string label = "[threads] failure test: rank 0 throws, rank 1 waits in all_reduce, timeout 60 s";
  std::atomic<double> elapsed{-1.0};
  HostBarrier allocated(gpus);
  std::vector<std::exception_ptr> errors;
  try {
    nccl::RunOptions options;
    options.timeout = std::chrono::duration<double>(60.0);
    options.name = "peer";
    errors = nccl::run_collect(
        gpus,
        [&](nccl::communicator& comm) {
          // Rank 0 owns no device memory: freeing it while unwinding could wait for rank 1's
          // kernel on the peer GPU, which waits for rank 0 (see DeviceArena).
          if (comm.rank() == 0) {
            allocated.arrive_and_wait();
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
            throw std::runtime_error("deliberate failure of rank 0");
          }
          strata::cuda::device_buffer<float> buffer(1024);
          buffer.zero(comm.stream());
          allocated.arrive_and_wait();  // no rank allocates while another's collective is in flight
          const auto begin = std::chrono::steady_clock::now();
          try {
            comm.all_reduce(device_span<float>(buffer.data(), buffer.size()));
            comm.synchronize();
          } catch (...) {
            elapsed.store(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
            throw;
          }
        },
        options);
  } catch (const std::exception& e) {
    report(false, strata::detail::concat(label, ": the launcher threw ", e.what()));
    return;
  }
  bool rank0_own = false;
  try {
    if (errors.at(0)) std::rethrow_exception(errors[0]);
  } catch (const std::runtime_error& e) {
    rank0_own = std::string(e.what()) == "deliberate failure of rank 0";
  } catch (...) {
  }
  report(rank0_own, strata::detail::concat(label, ": rank 0 ends with its own exception"));
  try {
    if (errors.at(1)) std::rethrow_exception(errors[1]);
    report(false, strata::detail::concat(label, ": rank 1 returned normally; it should have been aborted"));
  } catch (const nccl::AbortedError& e) {
    const std::string what = e.what();
    report(what.find("rank 0 failed: deliberate failure of rank 0") != std::string::npos && elapsed.load() < 30.0,
           strata::detail::concat(label, ": rank 1 got AbortedError after ", elapsed.load(), " s: '", what, "'"));
  } catch (const std::exception& e) {
    report(false, strata::detail::concat(label, ": rank 1 got another exception: ", e.what()));
  }
}

int summary(const char* mode) {
  std::printf("SUITE nccl %s: %d passed, %d failed\n", mode, passed.load(), failed.load());
  return failed.load() == 0 && passed.load() > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  bool process_mode = false;
  int gpus = -1;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--process") process_mode = true;
    else if (arg == "--gpus" && i + 1 < argc) gpus = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--gpus N] | --process\n", argv[0]);
      return 2;
    }
  }
  try {
    if (process_mode) {
      nccl::Options options;
      options.timeout = std::chrono::duration<double>(120.0);
      nccl::communicator world = nccl::init_from_environment(options);
      DeviceArena arena(kArenaBytes);
      Context ctx{"process", &arena};
      const nccl::LaunchEnvironment env = nccl::launch_environment();
      report(world.rank() == env.rank && world.size() == env.world_size,
             line_of(ctx, world, strata::detail::concat("init_from_environment (", env.launcher, "): rank ", world.rank(),
                                                        " of ", world.size(), " on GPU ", world.device())));
      all_cases(ctx, world);
      std::string mode = strata::detail::concat("process rank ", world.rank());
      return summary(mode.c_str());
    }
    const int available = strata::cuda::device_count();
    if (gpus < 0) gpus = available;
    if (gpus < 2) {
      std::printf("FAIL  test_nccl needs at least 2 GPUs; this process sees %d\n", available);
      return 1;
    }
    std::atomic<bool> rank0_past_sleep{false};
    nccl::run(gpus, [&](nccl::communicator& world) {
      DeviceArena arena(kArenaBytes);
      if (world.rank() == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        rank0_past_sleep.store(true);
      }
      world.local_barrier();  // every rank's memory exists before the first collective
      Context ctx{"threads", &arena};
      report(rank0_past_sleep.load(), line_of(ctx, world, strata::detail::concat(
                                          "local_barrier: rank ", world.rank(), " left it after rank 0 arrived (host only)")));
      world.local_barrier();
      world.local_barrier();  // generations reuse the same counter
      report(world.size() == gpus, line_of(ctx, world, strata::detail::concat("nccl::run: rank ", world.rank(), " of ",
                                                                             world.size(), " on GPU ", world.device())));
      all_cases(ctx, world);
    });
    failure_test(2, true);
    failure_test(2, false);
    peer_exception_test(2);
  } catch (const std::exception& e) {
    report(false, strata::detail::concat("test_nccl stopped: ", e.what()));
  }
  return summary(process_mode ? "process" : "threads");
}
