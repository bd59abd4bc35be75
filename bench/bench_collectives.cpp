// bench_collectives: the in-process collectives (ranks are threads of this process, buffers are
// host memory) for a few message sizes on 2 and 4 ranks, next to a plain memcpy of the same bytes.
//
// Bytes per operation follow nccl-tests' "size": all_reduce and all_to_all: one rank's buffer;
// all_gather: the gathered output; reduce_scatter: the input that is scattered. bytes_per_second
// is that size over the time of one operation (nccl-tests' algbw).
//
// Timing: one benchmark iteration starts the ranks (inprocess::run), warms up with one
// operation, lines the ranks up with a barrier, then times `repeats` operations on rank 0 between
// two barriers; the reported time is that span over `repeats` (manual time), so thread start-up
// and buffer allocation are not counted.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include <strata/comm.hpp>

namespace {

using element = float;
using clock_type = std::chrono::steady_clock;

enum class Op { all_reduce, all_gather, reduce_scatter, all_to_all };

// Enough repeats that one timed span is a few milliseconds or more.
int repeats_for(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{64} << 20) / std::max<std::size_t>(bytes, 1), 4, 2000));
}

template <Op op>
void collective(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  const std::size_t count = bytes / sizeof(element);  // elements in the "size" buffer
  const std::size_t block = count / static_cast<std::size_t>(ranks);
  const int repeats = repeats_for(bytes);

  for (auto _ : state) {
    double seconds = 0;
    strata::inprocess::run(ranks, [&](strata::inprocess::communicator& comm) {
      std::vector<element> a, b;
      std::vector<std::size_t> counts(static_cast<std::size_t>(ranks), block);
      if constexpr (op == Op::all_reduce) {
        a.assign(count, 0.0f);
      } else if constexpr (op == Op::all_gather) {
        a.assign(block, 0.0f);
        b.assign(block * static_cast<std::size_t>(ranks), 0.0f);
      } else if constexpr (op == Op::reduce_scatter) {
        a.assign(block * static_cast<std::size_t>(ranks), 0.0f);
        b.assign(block, 0.0f);
      } else {
        a.assign(block * static_cast<std::size_t>(ranks), 0.0f);
        b.assign(block * static_cast<std::size_t>(ranks), 0.0f);
      }
      auto once = [&] {
        if constexpr (op == Op::all_reduce) comm.all_reduce(std::span<element>(a), strata::ReduceOp::sum);
        else if constexpr (op == Op::all_gather) comm.all_gather(std::span<const element>(a), std::span<element>(b));
        else if constexpr (op == Op::reduce_scatter)
          comm.reduce_scatter(std::span<const element>(a), std::span<element>(b), strata::ReduceOp::sum);
        else
          comm.all_to_all(std::span<const element>(a), std::span<const std::size_t>(counts), std::span<element>(b),
                          std::span<const std::size_t>(counts));
      };
      once();  // first touch of every page, outside the timed span
      comm.barrier();
      const auto start = clock_type::now();
      for (int r = 0; r < repeats; ++r) once();
      comm.barrier();
      const auto stop = clock_type::now();
      if (comm.rank() == 0) seconds = std::chrono::duration<double>(stop - start).count();
      benchmark::DoNotOptimize(b.data());
      benchmark::DoNotOptimize(a.data());
    });
    state.SetIterationTime(seconds / repeats);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.counters["ranks"] = ranks;
}

// The floor: one thread copying the same number of bytes.
void memcpy_baseline(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<char> source(bytes, 1), destination(bytes, 0);
  for (auto _ : state) {
    std::memcpy(destination.data(), source.data(), bytes);
    benchmark::DoNotOptimize(destination.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

// Message sizes: 4 KiB, 256 KiB, 4 MiB, 16 MiB.
constexpr std::int64_t kSizes[] = {std::int64_t{1} << 12, std::int64_t{1} << 18, std::int64_t{1} << 22,
                                   std::int64_t{1} << 24};

void collective_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"ranks", "bytes"});
  for (std::int64_t ranks : {2, 4})
    for (std::int64_t bytes : kSizes) b->Args({ranks, bytes});
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}
void memcpy_args(benchmark::internal::Benchmark* b) {
  b->ArgName("bytes");
  for (std::int64_t bytes : kSizes) b->Arg(bytes);
  b->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(memcpy_baseline)->Apply(memcpy_args);
BENCHMARK(collective<Op::all_reduce>)->Name("all_reduce")->Apply(collective_args);
BENCHMARK(collective<Op::all_gather>)->Name("all_gather")->Apply(collective_args);
BENCHMARK(collective<Op::reduce_scatter>)->Name("reduce_scatter")->Apply(collective_args);
BENCHMARK(collective<Op::all_to_all>)->Name("all_to_all")->Apply(collective_args);

BENCHMARK_MAIN();
