// bench_collectives: the in-process collectives (ranks are threads of this process, buffers are
// host memory) for a few message sizes on 2 and 4 ranks, next to a plain memcpy of the same bytes.
//
// Bytes per operation follow nccl-tests' "size": all_reduce and all_to_all: one rank's buffer;
// all_gather: the gathered output; reduce_scatter: the input that is scattered. bytes_per_second
// is that size over the time of one operation (nccl-tests' algbw).
//
// Timing: the ranks start once per benchmark run. Each allocates its buffers, runs one
// operation (first touch of every page) and meets the others at a barrier; then rank 0 runs
// Google Benchmark's timed loop and the other ranks run the same number of operations
// (State::max_iterations is fixed before the loop starts). Wall-clock time, since the work is
// spread over threads.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include <strata/comm.hpp>

namespace {

using element = float;

enum class Op { all_reduce, all_gather, reduce_scatter, all_to_all };

template <Op op>
void collective(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  const std::size_t count = bytes / sizeof(element);  // elements in the "size" buffer
  const std::size_t block = count / static_cast<std::size_t>(ranks);
  const std::size_t gathered = block * static_cast<std::size_t>(ranks);

  strata::inprocess::run(ranks, [&](strata::inprocess::communicator& comm) {
    std::vector<element> a, b;
    std::vector<std::size_t> counts(static_cast<std::size_t>(ranks), block);
    if constexpr (op == Op::all_reduce) {
      a.assign(count, 0.0f);
    } else if constexpr (op == Op::all_gather) {
      a.assign(block, 0.0f);
      b.assign(gathered, 0.0f);
    } else if constexpr (op == Op::reduce_scatter) {
      a.assign(gathered, 0.0f);
      b.assign(block, 0.0f);
    } else {
      a.assign(gathered, 0.0f);
      b.assign(gathered, 0.0f);
    }
    auto once = [&] {
      if constexpr (op == Op::all_reduce) comm.all_reduce(std::span<element>(a), strata::ReduceOp::sum);
      else if constexpr (op == Op::all_gather) comm.all_gather(std::span<const element>(a), std::span<element>(b));
      else if constexpr (op == Op::reduce_scatter)
        comm.reduce_scatter(std::span<const element>(a), std::span<element>(b), strata::ReduceOp::sum);
      else
        comm.all_to_all(std::span<const element>(a), std::span<const std::size_t>(counts), std::span<element>(b),
                        std::span<const std::size_t>(counts));
      benchmark::DoNotOptimize(a.data());
      benchmark::DoNotOptimize(b.data());
    };
    once();
    comm.barrier();
    if (comm.rank() == 0) {
      for (auto _ : state) once();
    } else {
      for (benchmark::IterationCount i = 0; i < state.max_iterations; ++i) once();
    }
  });
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
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
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
