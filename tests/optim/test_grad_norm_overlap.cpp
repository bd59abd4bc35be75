// The gradient norm's squares summed beside the backward (GradNormOverlap): on a backend whose side
// stream is recorded (the CPU backend with the side entry points, each call run at once, as the side
// stream would run it after its fork), every bucket's counted gradients are summed exactly once,
// when the buffer starts the bucket and not before (the sums taken then equal the final gradients'),
// in any order the backward reports the parameters; finish() adds every gradient's sum in visiting
// order (the bits of per-tensor sums added in order), leaving out pipeline copies and, off tp rank 0,
// the parameters that are not tensor-parallel; a discarded step refuses to finish.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <strata/optim.hpp>

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_grad_norm_overlap_cases {

namespace {

using namespace strata;

// The CPU backend with a recorded side stream: each side call runs at once.
struct SideDevice : cpu::backend {
  struct Launch {
    std::vector<const float*> tensors;
  };
  std::vector<Launch>* launches;
  int* forks;
  int* joins;

  template <class X>
  static std::size_t sum_of_squares_each_workspace(std::span<const SquaresTensor<X>> tensors) {
    return tensors.size();
  }
  template <class X>
  void sum_of_squares_each_on_side(std::span<const SquaresTensor<X>> tensors, double* sums, double* workspace) const {
    Launch l;
    for (std::size_t j = 0; j < tensors.size(); ++j) {
      double s = 0;
      for (index_t i = 0; i < tensors[j].n; ++i) s += static_cast<double>(tensors[j].data[i]) * static_cast<double>(tensors[j].data[i]);
      sums[j] = s;
      workspace[j] = -1;  // the workspace given is the caller's, of the size asked for
      l.tensors.push_back(tensors[j].data);
    }
    launches->push_back(l);
  }
  void add_in_order(const double* sums, index_t count, double* accumulator) const {
    for (index_t j = 0; j < count; ++j) accumulator[0] += sums[j];
  }
  void side_fork() const { ++*forks; }
  void side_join() const { ++*joins; }
};
static_assert(has_side_squares<SideDevice, float>);
static_assert(!has_side_squares<cpu::backend, float>);

// Float parameters of the given sizes; `split` ones tensor-parallel (a shard of 2), `copy` ones
// pipeline copies.
struct Flat {
  std::vector<std::unique_ptr<Parameter<float>>> params;
  Flat(const std::vector<index_t>& sizes, const std::vector<int>& split, const std::vector<int>& copy) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const bool tp = std::find(split.begin(), split.end(), static_cast<int>(k)) != split.end();
      params.push_back(std::make_unique<Parameter<float>>("p" + std::to_string(k), Shape{sizes[k]},
                                                          tp ? ShardSpec::split(0, 0, 2) : ShardSpec::replicated()));
      params.back()->pipeline_copy = std::find(copy.begin(), copy.end(), static_cast<int>(k)) != copy.end();
    }
  }
  template <class V>
  void for_each_parameter(V&& visit) {
    for (auto& p : params) visit(*p);
  }
};

// The gradient of parameter k, as the backward writes it: element i is (i % 13 - 6) * 0.25 + k / 8.
void write_gradient(Parameter<float>& p, std::size_t k) {
  for (index_t i = 0; i < p.grad.numel(); ++i)
    p.grad[i] = static_cast<float>((i % 13 - 6) * 0.25 + static_cast<double>(k) / 8.0);
}

// The reference: each counted gradient's sum in double, added in visiting order.
double reference_sum(Flat& m, int tp_rank) {
  double total = 0;
  for (auto& p : m.params) {
    if (p->pipeline_copy || (!p->tensor_parallel() && tp_rank != 0) || p->grad.numel() == 0) continue;
    double s = 0;
    for (index_t i = 0; i < p->grad.numel(); ++i) s += static_cast<double>(p->grad[i]) * static_cast<double>(p->grad[i]);
    total += s;
  }
  return total;
}

// One step: the backward reports the parameters in `order` (indices), writing each gradient first.
void check_step(const std::vector<std::size_t>& order, int tp_rank) {
  const std::vector<index_t> sizes{100, 7, 300, 50, 0, 90, 64, 130, 33};
  Flat m(sizes, /*split=*/{2, 7}, /*copy=*/{3});
  std::vector<SideDevice::Launch> launches;
  int forks = 0, joins = 0;
  SideDevice device;
  device.launches = &launches;
  device.forks = &forks;
  device.joins = &joins;
  GradBuffer<float> buffer(device, m, GradBufferOptions{.bucket_size = 128, .dp = 1, .alignment = 8});
  ASSERT_GT(buffer.buckets().size(), 3u);
  GradNormOverlap<float, space::host> overlap(device, buffer, m, tp_rank);
  inprocess::run(1, [&](inprocess::communicator& dp) {
    for (int step = 0; step < 2; ++step) {  // the second step: after reset, everything summed again
      launches.clear();
      buffer.zero(device);
      overlap.reset();
      for (std::size_t k : order) {
        write_gradient(*m.params[k], k + static_cast<std::size_t>(step));
        buffer.mark_ready(device, dp, *m.params[k]);
        overlap.launch_started(device);
        EXPECT_EQ(overlap.buckets_summed(), buffer.buckets_started()) << "after reporting p" << k;
      }
      buffer.finish_reduction(device, dp);
      double accumulator = 0.5;
      overlap.finish(device, &accumulator);
      EXPECT_EQ(accumulator, 0.5 + reference_sum(m, tp_rank)) << "step " << step << ", tp rank " << tp_rank;
      EXPECT_NEAR(accumulator - 0.5, local_grad_square_sum(m, tp_rank), 1e-12 * (1 + accumulator));
      // every counted gradient summed exactly once, and nothing else
      std::vector<const float*> summed;
      for (const auto& l : launches) summed.insert(summed.end(), l.tensors.begin(), l.tensors.end());
      std::vector<const float*> counted;
      for (auto& p : m.params)
        if (!p->pipeline_copy && (p->tensor_parallel() || tp_rank == 0) && p->grad.numel() > 0) counted.push_back(p->grad.data());
      std::sort(summed.begin(), summed.end());
      std::sort(counted.begin(), counted.end());
      EXPECT_EQ(summed, counted);
      EXPECT_EQ(overlap.gradients(), static_cast<index_t>(counted.size()));
    }
  });
  EXPECT_GE(forks, 2);
  EXPECT_EQ(joins, 2);
  // a step whose gradients were written after the backward refuses to finish
  overlap.discard();
  double accumulator = 0;
  EXPECT_THROW(overlap.finish(device, &accumulator), Error);
  overlap.reset();
  EXPECT_TRUE(overlap.valid());
}

TEST(GradNormOverlap, SumsEachBucketOnceItIsFinalAndAddsTheSumsInVisitingOrder) {
  // the backward's order (the last parameter first), and one that completes later buckets first
  check_step({8, 7, 6, 5, 4, 3, 2, 1, 0}, 0);
  check_step({0, 1, 2, 3, 4, 5, 6, 7, 8}, 0);
  check_step({4, 8, 0, 6, 2, 7, 1, 5, 3}, 0);
  check_step({8, 7, 6, 5, 4, 3, 2, 1, 0}, 1);  // off tp rank 0: the tensor-parallel gradients alone
}

TEST(GradNormOverlap, FinishSumsBucketsNoHookReported) {
  // a step without the hook (a warm-up step): finish sums every bucket
  Flat m({40, 200, 17}, {}, {});
  std::vector<SideDevice::Launch> launches;
  int forks = 0, joins = 0;
  SideDevice device;
  device.launches = &launches;
  device.forks = &forks;
  device.joins = &joins;
  GradBuffer<float> buffer(device, m, GradBufferOptions{.bucket_size = 64, .dp = 1, .alignment = 8});
  GradNormOverlap<float, space::host> overlap(device, buffer, m, 0);
  for (std::size_t k = 0; k < m.params.size(); ++k) write_gradient(*m.params[k], k);
  inprocess::run(1, [&](inprocess::communicator& dp) { buffer.finish_reduction(device, dp); });
  double accumulator = 0;
  overlap.finish(device, &accumulator);
  EXPECT_EQ(accumulator, reference_sum(m, 0));
  EXPECT_EQ(forks, 1);
  EXPECT_EQ(overlap.buckets_summed(), 0u);
}

TEST(GradNormOverlap, RefusesAGradientOutsideTheBuffer) {
  Flat m({40, 20}, {}, {}), other({5}, {}, {});
  SideDevice device;
  GradBuffer<float> buffer(device, m, GradBufferOptions{.bucket_size = 0, .dp = 1});
  EXPECT_THROW((GradNormOverlap<float, space::host>(device, buffer, other, 0)), Error);
}

}  // namespace
}  // namespace test_grad_norm_overlap_cases
