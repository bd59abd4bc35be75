// The models in a device memory space, run on this machine: a backend whose space is space::cuda
// but whose entry points are the CPU kernels, a communicator that moves device spans, and device
// memory simulated in host memory (a device_memory_resource installed on every rank's thread).
// Every tensor the layers, the model and the optimizer create is then a device tensor; the run
// must give exactly the bits of the host run (same kernels, same order), and every byte that goes
// between spaces goes through the resource.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <span>
#include <vector>

#include <strata/models.hpp>
#include <strata/optim.hpp>
#include <strata/policy.hpp>

#include "model_equivalence.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_device_space_cases {

namespace {

using namespace strata;

struct HostBackedDeviceResource final : device_memory_resource {
  std::size_t uploads = 0, downloads = 0;
  void* allocate(std::size_t bytes) override { return ::operator new(bytes); }
  void deallocate(void* p, std::size_t) noexcept override { ::operator delete(p); }
  void copy(void* dst, const void* src, std::size_t bytes, copy_kind kind) override {
    if (kind == copy_kind::host_to_device) uploads += bytes;
    if (kind == copy_kind::device_to_host) downloads += bytes;
    std::memcpy(dst, src, bytes);
  }
  void zero(void* p, std::size_t bytes) override { std::memset(p, 0, bytes); }
  std::string_view name() const override { return "host-backed device memory"; }
};

// The CPU kernels, claiming device memory (which the resource above keeps in host memory).
struct simulated_device_backend : cpu::backend {
  using space = strata::space::cuda;
};

template <class T>
std::span<T> host_view(device_span<T> s) {
  return {s.data(), s.size()};
}

// The in-process communicator, taking device spans.
struct simulated_device_communicator {
  using space = strata::space::cuda;
  using default_device = simulated_device_backend;
  inprocess::communicator inner;

  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  std::string_view name() const { return inner.name(); }
  template <class T> void all_reduce(device_span<T> b, ReduceOp op) { inner.all_reduce(host_view(b), op); }
  template <class T> void all_gather(device_span<const T> in, device_span<T> out) { inner.all_gather(host_view(in), host_view(out)); }
  template <class T>
  void all_gather_v(device_span<const T> in, device_span<T> out, std::span<const std::size_t> counts) {
    inner.all_gather_v(host_view(in), host_view(out), counts);
  }
  template <class T> void reduce_scatter(device_span<const T> in, device_span<T> out, ReduceOp op) {
    inner.reduce_scatter(host_view(in), host_view(out), op);
  }
  template <class T>
  void reduce_scatter_v(device_span<const T> in, device_span<T> out, std::span<const std::size_t> counts, ReduceOp op) {
    inner.reduce_scatter_v(host_view(in), host_view(out), counts, op);
  }
  template <class T> void broadcast(device_span<T> b, int root) { inner.broadcast(host_view(b), root); }
  template <class T> void send(device_span<const T> b, int peer) { inner.send(host_view(b), peer); }
  template <class T> void recv(device_span<T> b, int peer) { inner.recv(host_view(b), peer); }
  template <class T>
  void all_to_all(device_span<const T> in, std::span<const std::size_t> sc, device_span<T> out, std::span<const std::size_t> rc) {
    inner.all_to_all(host_view(in), sc, host_view(out), rc);
  }
  void barrier() { inner.barrier(); }
  simulated_device_communicator split(int color, int key) { return {inner.split(color, key)}; }
  simulated_device_communicator split(int color, int key, std::string name) { return {inner.split(color, key, std::move(name))}; }
};
static_assert(check_communicator<simulated_device_communicator>());

template <class T, bool SP>
struct DevicePolicy {
  using element = T;
  using backend = simulated_device_backend;
  using comm = simulated_device_communicator;
  static constexpr bool sequence_parallel = SP;
};

struct Run {
  std::vector<double> losses, norms;
  std::vector<std::vector<double>> values, grads;  // gathered, after the optimizer step
  std::size_t uploads = 0;
};

template <template <class> class Model, class Policy, class Comm>
void train(Comm world, const models::ModelConfig& config, Run& run, std::mutex& mutex) {
  auto ctx = context_t<Policy>::create(world, ParallelConfig{.tp = 2});
  Model<Policy> model(ctx, config);
  model.init(ctx, 1234);
  AdamW<typename Policy::element, space_t<Policy>> optimizer(ctx.device, model);
  for (int step = 0; step < 2; ++step) {
    zero_gradients(ctx.device, model);
    strata_test::TokenBatch batch = strata_test::random_batch(config.vocab_size, 2, config.seq_length, 77 + step);
    auto [loss, saved] = model.forward(ctx, batch.tokens, batch.labels, batch.mask, 99 + step);
    model.backward(ctx, saved, 1.0 / loss.tokens);
    const double norm = to_host(clip_grad_norm_device(ctx, model, 0.05))[0];
    optimizer.step(ctx.device, model, 1e-2);
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      run.losses.push_back(loss.loss_sum());
      run.norms.push_back(norm);
    }
  }
  model.for_each_parameter([&](auto& p) {
    const auto value = gather_global(ctx.tp, p, p.value), grad = gather_global(ctx.tp, p, p.grad);
    if (world.rank() != 0) return;
    std::lock_guard lock(mutex);
    run.values.emplace_back();
    run.grads.emplace_back();
    for (index_t i = 0; i < value.numel(); ++i) run.values.back().push_back(static_cast<double>(value[i]));
    for (index_t i = 0; i < grad.numel(); ++i) run.grads.back().push_back(static_cast<double>(grad[i]));
  });
}

template <template <class> class Model, class T, bool SP>
void expect_device_space_run_equals_host_run(const models::ModelConfig& config) {
  Run host, device;
  std::mutex mutex;
  inprocess::run(2, [&](inprocess::communicator& world) {
    train<Model, strata_test::TestPolicy<T, SP>>(world, config, host, mutex);
  });
  std::vector<HostBackedDeviceResource> resources(2);
  inprocess::run(2, [&](inprocess::communicator& world) {
    current_device_resource() = &resources[static_cast<std::size_t>(world.rank())];
    train<Model, DevicePolicy<T, SP>>(simulated_device_communicator{world}, config, device, mutex);
    current_device_resource() = nullptr;
  });
  ASSERT_EQ(host.losses.size(), 2u);
  ASSERT_EQ(host.losses.size(), device.losses.size());
  ASSERT_GT(host.values.size(), 10u);  // every parameter of both layers, embeddings and norms
  EXPECT_GT(host.losses[0], 0.0);
  EXPECT_GT(host.norms[0], 0.05);  // clipping was active
  for (std::size_t i = 0; i < host.losses.size(); ++i) {
    EXPECT_EQ(host.losses[i], device.losses[i]) << "loss of step " << i;
    EXPECT_EQ(host.norms[i], device.norms[i]) << "gradient norm of step " << i;
  }
  ASSERT_EQ(host.values.size(), device.values.size());
  for (std::size_t p = 0; p < host.values.size(); ++p) {
    EXPECT_EQ(host.values[p], device.values[p]) << "parameter " << p;
    EXPECT_EQ(host.grads[p], device.grads[p]) << "gradient " << p;
  }
  for (const auto& r : resources) EXPECT_GT(r.uploads, 0u);  // token ids, labels and masks went up
}

models::ModelConfig tiny(bool gqa) {
  models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = gqa ? 2 : 0;
  c.ffn_hidden_size = 64;
  c.vocab_size = 90;
  c.make_vocab_size_divisible_by = 8;
  c.seq_length = 8;
  c.hidden_dropout = 0.1;
  c.label_smoothing = 0.1;
  return c;
}

TEST(DeviceSpace, GptRunInDeviceMemoryEqualsHostRunBitForBit) {
  expect_device_space_run_equals_host_run<models::Gpt, float, true>(tiny(false));
}
TEST(DeviceSpace, LlamaRunInDeviceMemoryEqualsHostRunBitForBit) {
  expect_device_space_run_equals_host_run<models::Llama, double, false>(tiny(true));
}
TEST(DeviceSpace, Bf16GptRunInDeviceMemoryEqualsHostRunBitForBit) {
  expect_device_space_run_equals_host_run<models::Gpt, bf16, false>(tiny(false));
}

}  // namespace

namespace {

// Device bytes in use, their peak since start_measuring(), and the largest single allocation.
struct CountingDeviceResource final : device_memory_resource {
  std::size_t in_use = 0, peak = 0, largest = 0;
  void* allocate(std::size_t bytes) override {
    in_use += bytes;
    peak = std::max(peak, in_use);
    largest = std::max(largest, bytes);
    return ::operator new(bytes);
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    in_use -= bytes;
    ::operator delete(p);
  }
  void copy(void* dst, const void* src, std::size_t bytes, copy_kind) override { std::memcpy(dst, src, bytes); }
  void zero(void* p, std::size_t bytes) override { std::memset(p, 0, bytes); }
  std::string_view name() const override { return "counting host-backed device memory"; }
  void start_measuring() {
    peak = in_use;
    largest = 0;
  }
};

struct StepMemory {
  std::size_t peak = 0;     // most bytes in use during forward + backward, above those in use before
  std::size_t largest = 0;  // largest allocation during forward + backward
};

// One training micro-batch (forward + backward) of GPT in float at tp = 2 with sequence
// parallelism, in simulated device memory; the memory of rank 0. chunk_rows < 0: the unfused path.
StepMemory measure_step(const models::ModelConfig& config, index_t chunk_rows) {
  using Policy = DevicePolicy<float, true>;
  std::vector<CountingDeviceResource> resources(2);
  StepMemory rank0;
  inprocess::run(2, [&](inprocess::communicator& world) {
    CountingDeviceResource& resource = resources[static_cast<std::size_t>(world.rank())];
    current_device_resource() = &resource;
    {
      auto ctx = context_t<Policy>::create(simulated_device_communicator{world}, ParallelConfig{.tp = 2});
      models::Gpt<Policy> model(ctx, config);
      model.init(ctx, 1234);
      const strata_test::TokenBatch batch = strata_test::random_batch(config.vocab_size, 2, config.seq_length, 5);
      const std::size_t before = resource.in_use;
      resource.start_measuring();
      {
        auto [loss, saved] = chunk_rows < 0 ? model.forward(ctx, batch.tokens, batch.labels, batch.mask, 7)
                                            : model.forward(ctx, batch.tokens, batch.labels, batch.mask, 7,
                                                            models::FusedLoss{1.0 / 16, {chunk_rows}});
        model.backward(ctx, saved, 1.0 / 16);
      }
      if (world.rank() == 0) rank0 = {resource.peak - before, resource.largest};
    }
    current_device_resource() = nullptr;
  });
  return rank0;
}

// The fused classifier holds one block of logits at a time: no allocation of a forward + backward
// is larger than one block [chunk_rows, V/tp]; the step's peak with blocks of 3 rows is that with
// one block of all 16 rows less the difference of the blocks, and below the unfused step's peak
// (logits kept, then their gradient beside them) by more than the whole logits. (A vocabulary much
// wider than the hidden size makes the logits the largest tensors of the step, as in real models.)
TEST(DeviceSpace, FusedClassifierHoldsOneBlockOfLogits) {
  models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.ffn_hidden_size = 32;
  c.vocab_size = 1000;  // padded to 1008: 504 columns per rank
  c.make_vocab_size_divisible_by = 8;
  c.seq_length = 8;
  const std::size_t rows = 16, local = 504, chunk_rows = 3;
  const std::size_t logits_bytes = rows * local * sizeof(float), block_bytes = chunk_rows * local * sizeof(float);
  const StepMemory unfused = measure_step(c, -1);
  const StepMemory fused = measure_step(c, static_cast<index_t>(chunk_rows));
  const StepMemory whole = measure_step(c, static_cast<index_t>(rows));  // one block of every row
  EXPECT_GE(unfused.largest, logits_bytes) << "the unfused step makes the whole logits (the counter sees them)";
  EXPECT_EQ(fused.largest, block_bytes) << "the largest allocation of the fused step is its block of logits";
  EXPECT_EQ(whole.largest, logits_bytes);
  EXPECT_LE(fused.peak + logits_bytes, unfused.peak)
      << "fused peak " << fused.peak << " B, unfused peak " << unfused.peak << " B, logits " << logits_bytes << " B";
  EXPECT_EQ(fused.peak + logits_bytes - block_bytes, whole.peak)
      << "the block is the only difference between the fused steps of 3 rows and of every row";
}

}  // namespace
}  // namespace test_device_space_cases
