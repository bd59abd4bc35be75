// save_checkpoint / load_checkpoint on in-process ranks: a bit-exact round trip (bf16 model with
// fp32 master weights), resuming equal to training straight through (tp=2, double), an interrupted
// save that leaves the previous checkpoint and tracker intact, loading into another
// tensor-parallel size bit for bit, replicas written once, partial reads of only the CRC chunks a
// shard needs, and clear errors for damaged or missing files (the previous checkpoint still loads).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <future>
#include <limits>
#include <thread>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <strata/checkpoint.hpp>
#include <strata/optim.hpp>
#include <strata/policy.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/equivalence.hpp"
#include "temp_directory.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_checkpoint_cases {

namespace {

using namespace strata;
using strata_test::TempDirectory;
using Comm = inprocess::communicator;
using Context = ParallelContext<Comm>;

template <class T>
struct Policy : default_policy {
  using element = T;
};

constexpr index_t kRows = 4, kIn = 6, kHidden = 8, kOut = 4;

template <class T>
struct TwoLayer {
  ColumnParallelLinear<Policy<T>> fc1;
  RowParallelLinear<Policy<T>> fc2;

  TwoLayer(Context& ctx, std::uint64_t seed) : fc1(ctx, "fc1", kIn, kHidden), fc2(ctx, "fc2", kHidden, kOut) {
    fc1.init(ctx, seed, 0.5);
    fc2.init(ctx, seed, 0.5);
    init_normal(ctx.device, *fc1.bias(), seed + 1, 0.1);
    init_normal(ctx.device, *fc2.bias(), seed + 2, 0.1);
  }
  template <class V>
  void for_each_parameter(V&& visit) {
    fc1.for_each_parameter(visit);
    fc2.for_each_parameter(visit);
  }
};

// Raw bytes of every parameter value and optimizer state tensor of this rank, by name.
template <class T>
std::map<std::string, std::vector<unsigned char>> state_bytes(TwoLayer<T>& model, AdamW<T>& optimizer) {
  std::map<std::string, std::vector<unsigned char>> out;
  auto record = [&](const std::string& name, const auto& tensor) {
    const auto* p = reinterpret_cast<const unsigned char*>(tensor.data());
    out[name] = std::vector<unsigned char>(p, p + tensor.numel() * sizeof(tensor[0]));
  };
  model.for_each_parameter([&](auto& p) { record("model." + p.name, p.value); });
  optimizer.for_each_state([&](const std::string& name, auto& tensor) { record("optimizer." + name, tensor); });
  return out;
}

// Arbitrary gradients that depend on the step and the global element.
template <class T>
void fake_gradients(TwoLayer<T>& model, int step) {
  model.for_each_parameter([&](auto& p) {
    for (index_t i = 0; i < p.grad.numel(); ++i) {
      const index_t g = global_index(p.global_shape, p.shard, i, p.shard.rank);
      p.grad[i] = static_cast<accumulate_t<T>>(std::sin(0.3 * static_cast<double>(g) + step) * 0.01);
    }
  });
}

TEST(Checkpoint, RoundTripIsBitExact) {
  TempDirectory dir("checkpoint");
  std::vector<std::map<std::string, std::vector<unsigned char>>> saved(2);
  const TrainState state{.iteration = 3, .consumed_samples = 96, .seed = 0xfedcba9876543210ull,
                         .extra = {{"data_position", 12345}, {"epoch", 2}}};
  inprocess::run(2, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2});
    TwoLayer<bf16> model(ctx, 5);
    AdamW<bf16> optimizer(model);
    for (int step = 0; step < 3; ++step) {
      fake_gradients(model, step);
      optimizer.step(model, 1e-3);
    }
    save_checkpoint(ctx, dir.path(), 3, model, optimizer, state);
    saved[static_cast<std::size_t>(world.rank())] = state_bytes(model, optimizer);
  });
  EXPECT_EQ(latest_checkpointed_iteration(dir.path()), 3);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "iter_0000003" / "rank_00000.strata"));
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "iter_0000003" / "rank_00001.strata"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "iter_0000003.tmp"));

  inprocess::run(2, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2});
    TwoLayer<bf16> model(ctx, 99);  // another init: everything must come from the file
    AdamW<bf16> optimizer(model);
    const TrainState loaded = load_checkpoint(ctx, dir.path(), model, optimizer);
    EXPECT_EQ(loaded.iteration, 3);
    EXPECT_EQ(loaded.consumed_samples, 96);
    EXPECT_EQ(loaded.seed, 0xfedcba9876543210ull);
    EXPECT_EQ(loaded.extra, state.extra);
    EXPECT_EQ(optimizer.steps(), 3);
    EXPECT_EQ(state_bytes(model, optimizer), saved[static_cast<std::size_t>(world.rank())]);
    // The file records where each shard lives.
    StateReader reader = open_checkpoint(ctx, dir.path());
    const TensorRecord& w = reader.record("model.fc1.weight");
    EXPECT_EQ(w.global_shape, (Shape{kHidden, kIn}));
    EXPECT_EQ(w.local_shape, (Shape{kHidden / 2, kIn}));
    EXPECT_EQ(w.shard.rank, world.rank());
    EXPECT_EQ(reader.record("optimizer.fc1.weight.main").dtype, StoredDtype::float32);
    EXPECT_EQ(w.dtype, StoredDtype::bfloat16);
    // A replicated parameter (and its state) is written once, by tensor-parallel rank 0.
    EXPECT_EQ(reader.has_tensor("model.fc2.bias"), world.rank() == 0);
    EXPECT_EQ(reader.has_tensor("optimizer.fc2.bias.exp_avg"), world.rank() == 0);
    if (world.rank() == 0) {
      EXPECT_FALSE(reader.record("model.fc2.bias").shard.sharded);
    }
  });
}

// Batches and targets are functions of the iteration, as a data loader's position would be.
Tensor<double> batch(Shape shape, std::uint64_t key) {
  Tensor<double> t(shape);
  for (index_t i = 0; i < t.numel(); ++i) t[i] = rng::normal(key, static_cast<std::uint64_t>(i));
  return t;
}

double train_step(Context& ctx, TwoLayer<double>& model, AdamW<double>& optimizer, const LrSchedule& schedule, int it) {
  zero_gradients(model);
  Activation<double, layout::replicated> x(batch(Shape{kRows, kIn}, 1000 + static_cast<std::uint64_t>(it)));
  const Tensor<double> target = batch(Shape{kRows, kOut}, 2000 + static_cast<std::uint64_t>(it));
  auto [h, s1] = model.fc1.forward(ctx, x);
  auto [y, s2] = model.fc2.forward(ctx, h);
  Tensor<double> dy(y.shape());
  double loss = 0;
  for (index_t i = 0; i < dy.numel(); ++i) {
    dy[i] = y.tensor[i] - target[i];
    loss += 0.5 * dy[i] * dy[i];
  }
  model.fc1.backward(ctx, s1, model.fc2.backward(ctx, s2, Activation<double, layout::replicated>(std::move(dy))));
  clip_grad_norm(ctx, model, 0.5);
  optimizer.step(model, schedule.lr(it + 1));
  return loss;
}

struct Trajectory {
  std::vector<double> losses;                                          // rank 0's
  std::vector<std::map<std::string, std::vector<unsigned char>>> end;  // per rank
};

TEST(Checkpoint, ResumeEqualsStraightThrough) {
  constexpr int kSaveAt = 3, kTotal = 7;
  const LrSchedule schedule{.max_lr = 0.05, .min_lr = 0.001, .warmup_iters = 2, .decay_iters = kTotal};
  TempDirectory dir("checkpoint");
  Trajectory straight{{}, std::vector<std::map<std::string, std::vector<unsigned char>>>(2)};
  Trajectory resumed = straight;
  inprocess::run(2, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2});
    TwoLayer<double> model(ctx, 21);
    AdamW<double> optimizer(model, AdamWConfig{.weight_decay = 0.05});
    for (int it = 0; it < kTotal; ++it) {
      const double loss = train_step(ctx, model, optimizer, schedule, it);
      if (world.rank() == 0) straight.losses.push_back(loss);
      if (it + 1 == kSaveAt)
        save_checkpoint(ctx, dir.path(), kSaveAt, model, optimizer, TrainState{.consumed_samples = kSaveAt * kRows, .seed = 21});
    }
    straight.end[static_cast<std::size_t>(world.rank())] = state_bytes(model, optimizer);
  });
  inprocess::run(2, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2});
    TwoLayer<double> model(ctx, 77);
    AdamW<double> optimizer(model, AdamWConfig{.weight_decay = 0.05});
    const TrainState state = load_checkpoint(ctx, dir.path(), model, optimizer);
    EXPECT_EQ(state.iteration, kSaveAt);
    EXPECT_EQ(state.consumed_samples, kSaveAt * kRows);
    EXPECT_EQ(state.seed, 21u);
    for (int it = static_cast<int>(state.iteration); it < kTotal; ++it) {
      const double loss = train_step(ctx, model, optimizer, schedule, it);
      if (world.rank() == 0) resumed.losses.push_back(loss);
    }
    resumed.end[static_cast<std::size_t>(world.rank())] = state_bytes(model, optimizer);
  });
  ASSERT_EQ(resumed.losses.size(), static_cast<std::size_t>(kTotal - kSaveAt));
  for (std::size_t i = 0; i < resumed.losses.size(); ++i)
    EXPECT_EQ(std::memcmp(&resumed.losses[i], &straight.losses[kSaveAt + i], sizeof(double)), 0)
        << "loss at iteration " << kSaveAt + i << ": " << resumed.losses[i] << " vs " << straight.losses[kSaveAt + i];
  EXPECT_EQ(resumed.end, straight.end);
}

// Saves iteration `iteration` of a small tp=2 model whose values encode the iteration.
void save_marked(const std::filesystem::path& dir, int iteration, SaveOptions options = {},
                 int failing_rank = -1) {
  inprocess::run(2, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2});
    TwoLayer<double> model(ctx, static_cast<std::uint64_t>(iteration));
    AdamW<double> optimizer(model);
    SaveOptions mine = options;
    if (world.rank() != failing_rank) mine.on_stage = nullptr;
    save_checkpoint(ctx, dir, iteration, model, optimizer, TrainState{.seed = static_cast<std::uint64_t>(iteration)}, mine);
  });
}

// Loads the latest checkpoint at tp=2, returns its iteration and checks the values are that save's.
std::int64_t load_marked(const std::filesystem::path& dir) {
  std::vector<std::int64_t> iterations = inprocess::run_and_collect(2, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2});
    TwoLayer<double> model(ctx, 12345);
    AdamW<double> optimizer(model);
    const TrainState state = load_checkpoint(ctx, dir, model, optimizer);
    TwoLayer<double> expected(ctx, state.seed);
    EXPECT_EQ(std::memcmp(model.fc1.weight().value.data(), expected.fc1.weight().value.data(),
                          sizeof(double) * static_cast<std::size_t>(expected.fc1.weight().value.numel())),
              0);
    EXPECT_EQ(state.seed, static_cast<std::uint64_t>(state.iteration));
    return state.iteration;
  });
  EXPECT_EQ(iterations[0], iterations[1]);
  return iterations[0];
}

struct SimulatedCrash : std::runtime_error {
  using std::runtime_error::runtime_error;
};

TEST(Checkpoint, InterruptedSaveKeepsPreviousCheckpoint) {
  TempDirectory dir("checkpoint");
  save_marked(dir.path(), 2);
  ASSERT_EQ(load_marked(dir.path()), 2);
  const auto tracker = tracker_path(dir.path());
  auto tracker_text = [&] {
    std::ifstream in(tracker);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  ASSERT_EQ(tracker_text(), "2\n");

  // Crash points: after rank 1 wrote its file (rank 0's may be written too), after every file is
  // written but before the directory is renamed, and after the rename but before the tracker.
  const std::vector<std::pair<std::string, int>> crashes = {
      {"rank_file_written", 1}, {"all_files_written", 0}, {"directory_renamed", 0}};
  for (const auto& [stage, rank] : crashes) {
    SaveOptions options;
    const std::string at = stage;
    options.on_stage = [at](std::string_view s) {
      if (s == at) throw SimulatedCrash("simulated crash at " + at);
    };
    EXPECT_THROW(save_marked(dir.path(), 4, options, rank), SimulatedCrash) << stage;
    EXPECT_EQ(tracker_text(), "2\n") << stage;
    EXPECT_EQ(latest_checkpointed_iteration(dir.path()), 2) << stage;
    EXPECT_EQ(load_marked(dir.path()), 2) << stage;
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "iter_0000002" / "rank_00001.strata")) << stage;
  }
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "iter_0000004")) << "the last crash came after the rename";

  // A later save of the same iteration cleans up and replaces the leftover directory.
  save_marked(dir.path(), 4);
  EXPECT_EQ(tracker_text(), "4\n");
  EXPECT_EQ(load_marked(dir.path()), 4);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "iter_0000004.tmp"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "iter_0000004.old"));
  // An older iteration stays loadable by number.
  inprocess::run(2, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2});
    TwoLayer<double> model(ctx, 1);
    AdamW<double> optimizer(model);
    EXPECT_EQ(load_checkpoint(ctx, dir.path(), model, optimizer, LoadOptions{.iteration = 2}).iteration, 2);
  });
}

TEST(Checkpoint, CrashWhileReplacingSameIterationFallsBackToOld) {
  // A crash between moving iter_N aside and renaming the new one leaves only iter_N.old.
  TempDirectory dir("checkpoint");
  save_marked(dir.path(), 6);
  std::filesystem::rename(dir.path() / "iter_0000006", dir.path() / "iter_0000006.old");
  EXPECT_EQ(load_marked(dir.path()), 6);
}

// Every parameter and optimizer state tensor as its global tensor (values at their global
// indices), assembled from all ranks of a run.
using GlobalState = std::map<std::string, std::vector<double>>;

template <class T>
void add_to_global(GlobalState& out, std::mutex& mutex, TwoLayer<T>& model, AdamW<T>& optimizer) {
  std::lock_guard lock(mutex);
  auto place = [&](const std::string& name, const auto& tensor, const Shape& global, const ShardSpec& shard) {
    auto& g = out[name];
    g.resize(static_cast<std::size_t>(global.numel()));
    for (index_t i = 0; i < tensor.numel(); ++i)
      g[static_cast<std::size_t>(global_index(global, shard, i, shard.rank))] = static_cast<double>(tensor[i]);
  };
  model.for_each_parameter([&](auto& p) { place("model." + p.name, p.value, p.global_shape, p.shard); });
  optimizer.for_each_sharded_state([&](const std::string& name, auto& t, const Shape& global, const ShardSpec& shard) {
    place("optimizer." + name, t, global, shard);
  });
}

TEST(Checkpoint, LoadsIntoAnyTensorParallelSizeBitForBit) {
  TempDirectory dir("checkpoint");
  GlobalState saved;
  std::mutex mutex;
  inprocess::run(2, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2});
    TwoLayer<double> model(ctx, 31);
    AdamW<double> optimizer(model);
    for (int step = 0; step < 2; ++step) {
      fake_gradients(model, step);
      optimizer.step(model, 1e-2);
    }
    save_checkpoint(ctx, dir.path(), 2, model, optimizer, TrainState{.consumed_samples = 8, .seed = 31});
    add_to_global(saved, mutex, model, optimizer);
  });
  for (int world_size : {1, 4, 8}) {
    const int tp = std::min(world_size, 4);  // 8 ranks: tp=4 x dp=2
    GlobalState loaded;
    inprocess::run(world_size, [&](Comm& world) {
      auto ctx = Context::create(world, ParallelConfig{.tp = tp, .dp = world_size / tp});
      TwoLayer<double> model(ctx, 99);
      AdamW<double> optimizer(model);
      const TrainState state = load_checkpoint(ctx, dir.path(), model, optimizer);
      EXPECT_EQ(state.iteration, 2);
      EXPECT_EQ(state.consumed_samples, 8);
      EXPECT_EQ(optimizer.steps(), 2);
      add_to_global(loaded, mutex, model, optimizer);
    });
    ASSERT_EQ(loaded.size(), saved.size()) << "tp=" << tp;
    for (const auto& [name, values] : saved)
      EXPECT_EQ(std::memcmp(loaded[name].data(), values.data(), values.size() * sizeof(double)), 0)
          << name << " at tp=" << tp << " dp=" << world_size / tp;
  }
}

TEST(Checkpoint, ShardGeometryRunsAgreeWithGlobalIndex) {
  const std::vector<std::pair<Shape, ShardSpec>> cases = {
      {Shape{12, 6}, ShardSpec::split(0, 0, 3)},           {Shape{12, 6}, ShardSpec::split(-1, 0, 2)},
      {Shape{2, 12, 5}, ShardSpec::split(1, 0, 3, 2)},     {Shape{8, 3, 4}, ShardSpec::split(0, 0, 2, 2)},
      {Shape{7, 5}, ShardSpec::replicated()},              {Shape{4, 6, 2}, ShardSpec::split(2, 0, 2)}};
  for (const auto& [global, base] : cases) {
    const ShardGeometry geometry(global, base);
    std::vector<int> seen(static_cast<std::size_t>(global.numel()), 0);
    for (int r = 0; r < (base.sharded ? base.parts : 1); ++r) {
      ShardSpec spec = base;
      spec.rank = r;
      const index_t n = local_shape(global, spec).numel();
      for (index_t l = 0; l < n; ++l) {
        const ShardGeometry::Run run = geometry.to_global(l, r);
        ASSERT_EQ(run.index, global_index(global, spec, l, r)) << global.str() << " rank " << r << " local " << l;
        ASSERT_GE(run.length, 1);
        ASSERT_LE(l + run.length, n);
        for (index_t k = 1; k < run.length; ++k)  // a run is consecutive in both numberings
          ASSERT_EQ(global_index(global, spec, l + k, r), run.index + k);
        const ShardGeometry::Run back = geometry.to_local(run.index);
        ASSERT_EQ(back.rank, r);
        ASSERT_EQ(back.index, l);
        ++seen[static_cast<std::size_t>(run.index)];
      }
    }
    for (int count : seen) ASSERT_EQ(count, 1) << global.str();
  }
}

// Sum of the tensor bytes of every rank file of one iteration.
std::uint64_t checkpoint_data_bytes(const std::filesystem::path& iteration_dir) {
  std::uint64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(iteration_dir)) {
    StateReader reader(entry.path());
    for (const TensorRecord& r : reader.tensors()) total += r.bytes;
  }
  return total;
}

TEST(Checkpoint, DataParallelReplicasWriteOnce) {
  TempDirectory dir1("checkpoint"), dir4("checkpoint");
  for (auto [world, path] : {std::pair{2, dir1.path()}, std::pair{8, dir4.path()}}) {
    inprocess::run(world, [&](Comm& comm) {
      auto ctx = Context::create(comm, ParallelConfig{.tp = 2, .dp = world / 2});
      TwoLayer<double> model(ctx, 3);
      AdamW<double> optimizer(model);
      save_checkpoint(ctx, path, 1, model, optimizer, TrainState{});
    });
  }
  const std::uint64_t one = checkpoint_data_bytes(dir1.path() / "iter_0000001");
  // The global tensors, once each: 3 x (values and main, exp_avg, exp_avg_sq) in double.
  const std::uint64_t global = (kHidden * kIn + kHidden + kOut * kHidden + kOut) * sizeof(double) * 4;
  EXPECT_EQ(one, global);
  EXPECT_EQ(checkpoint_data_bytes(dir4.path() / "iter_0000001"), one) << "dp=4 wrote more than dp=1";
}

TEST(Checkpoint, ReshardingReadsOnlyTheChunksItNeeds) {
  // A [1024, 1024] float tensor saved in two shards of 2 MiB (2 CRC chunks of 1 MiB each).
  constexpr index_t kN = 1024;
  for (int dim : {0, 1}) {
    TempDirectory dir("checkpoint");
    inprocess::run(2, [&](Comm& world) {
      auto ctx = Context::create(world, ParallelConfig{.tp = 2});
      const ShardSpec spec = ShardSpec::split(dim, world.rank(), 2);
      Tensor<float> shard(local_shape(Shape{kN, kN}, spec));
      for (index_t i = 0; i < shard.numel(); ++i) shard[i] = static_cast<float>(global_index(Shape{kN, kN}, spec, i, world.rank()));
      StateWriter writer;
      writer.add("big", shard, Shape{kN, kN}, spec);
      save(ctx, dir.path(), 1, writer);
    });
    ShardedCheckpoint checkpoint(dir.path() / "iter_0000001");
    // tp=4, rank 1: rows [256, 512) (dim 0: one chunk of saved shard 0) or columns [256, 512)
    // (dim 1: the second half of every row of saved shard 0, so both of its chunks).
    const ShardSpec wanted = ShardSpec::split(dim, 1, 4);
    Tensor<float> out(local_shape(Shape{kN, kN}, wanted));
    checkpoint.read_into("big", out, Shape{kN, kN}, wanted);
    for (index_t i = 0; i < out.numel(); ++i)
      ASSERT_EQ(out[i], static_cast<float>(global_index(Shape{kN, kN}, wanted, i, 1))) << "dim " << dim << " element " << i;
    EXPECT_EQ(checkpoint.bytes_read(), (dim == 0 ? 1u : 2u) * kCheckpointCrcChunkBytes) << "dim " << dim;
  }
}

TEST(Checkpoint, DamagedOrMissingFilesNameTheFileAndTheTensorAndTheOlderCheckpointStillLoads) {
  TempDirectory dir("checkpoint");
  save_marked(dir.path(), 2);
  save_marked(dir.path(), 4);
  auto load_at = [&](int tp, std::optional<std::int64_t> iteration) {
    inprocess::run(tp, [&](Comm& world) {
      auto ctx = Context::create(world, ParallelConfig{.tp = tp});
      TwoLayer<double> model(ctx, 1);
      AdamW<double> optimizer(model);
      load_checkpoint(ctx, dir.path(), model, optimizer, LoadOptions{.iteration = iteration});
    });
  };
  const auto file = dir.path() / "iter_0000004" / "rank_00001.strata";
  StateReader reader(file);
  const TensorRecord victim = reader.record("model.fc1.weight");
  {  // flip one byte of that tensor's data
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(victim.offset + 3));
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    io.seekp(static_cast<std::streamoff>(victim.offset + 3));
    io.write(&c, 1);
  }
  for (int tp : {2, 1}) {  // the same layout, and a layout whose rank 0 needs that shard too
    try {
      load_at(tp, std::nullopt);
      ADD_FAILURE() << "tp=" << tp << ": expected FileError";
    } catch (const FileError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(file.string()), std::string::npos) << m;
      EXPECT_NE(m.find("'model.fc1.weight' fails its CRC-32 check"), std::string::npos) << m;
    }
  }
  EXPECT_NO_THROW(load_at(1, 2));
  EXPECT_NO_THROW(load_at(2, 2));
  // A missing rank file is named, with the number of ranks that saved.
  std::filesystem::remove(file);
  try {
    load_at(4, std::nullopt);
    ADD_FAILURE() << "expected FileError";
  } catch (const FileError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("saved by 2 ranks"), std::string::npos) << m;
    EXPECT_NE(m.find(file.string()), std::string::npos) << m;
  }
  EXPECT_NO_THROW(load_at(4, 2));
}

TEST(Checkpoint, AsyncSaveStoresItsStepWhileTrainingGoesOnAndReportsAFailedWriteOnEveryRank) {
  TempDirectory dir("checkpoint");
  GlobalState at_save;
  std::mutex mutex;
  std::vector<std::string> errors(2);
  inprocess::run(2, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2});
    TwoLayer<double> model(ctx, 8);
    AdamW<double> optimizer(model);
    AsyncSaver<Context> saver(/*max_in_flight=*/1);
    fake_gradients(model, 0);
    optimizer.step(model, 1e-2);
    saver.save(ctx, dir.path(), 1, checkpoint_writer(ctx, model, optimizer, TrainState{.seed = 8}, /*copy_data=*/true));
    add_to_global(at_save, mutex, model, optimizer);
    for (int step = 1; step < 4; ++step) {  // training goes on while the files are written
      fake_gradients(model, step);
      optimizer.step(model, 1e-2);
      saver.poll(ctx);
    }
    // A second save waits for the first (one in flight) and commits it.
    saver.save(ctx, dir.path(), 4, checkpoint_writer(ctx, model, optimizer, TrainState{.seed = 8}, true));
    EXPECT_EQ(saver.last_committed(), 1);
    EXPECT_EQ(saver.pending(), 1u);
    saver.finish(ctx);
    EXPECT_EQ(saver.last_committed(), 4);
    // A write that fails on rank 1 is reported on both ranks at the next poll; the tracker stays.
    SaveOptions failing;
    if (world.rank() == 1)
      failing.on_stage = [](std::string_view stage) {
        if (stage == "background_write") throw std::runtime_error("disk full (simulated)");
      };
    saver.save(ctx, dir.path(), 5, checkpoint_writer(ctx, model, optimizer, TrainState{.seed = 8}, true), failing);
    try {
      saver.poll(ctx, /*wait=*/true);
    } catch (const FileError& e) {
      errors[static_cast<std::size_t>(world.rank())] = e.what();
    }
  });
  for (const std::string& m : errors) {
    EXPECT_NE(m.find("background save of iteration 5"), std::string::npos) << m;
    EXPECT_NE(m.find("failed on rank 1"), std::string::npos) << m;
  }
  EXPECT_NE(errors[1].find("disk full (simulated)"), std::string::npos) << errors[1];
  EXPECT_EQ(latest_checkpointed_iteration(dir.path()), 4);
  GlobalState loaded;
  inprocess::run(1, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{});
    TwoLayer<double> model(ctx, 99);
    AdamW<double> optimizer(model);
    EXPECT_EQ(load_checkpoint(ctx, dir.path(), model, optimizer, LoadOptions{.iteration = 1}).iteration, 1);
    add_to_global(loaded, mutex, model, optimizer);
  });
  ASSERT_EQ(loaded.size(), at_save.size());
  for (const auto& [name, values] : at_save) EXPECT_EQ(loaded[name], values) << name << ": not the state at the save";
}

TEST(Checkpoint, MissingOrCorruptCheckpointIsFileError) {
  TempDirectory dir("checkpoint");
  auto load = [&] {
    inprocess::run(2, [&](Comm& world) {
      auto ctx = Context::create(world, ParallelConfig{.tp = 2});
      TwoLayer<double> model(ctx, 1);
      AdamW<double> optimizer(model);
      load_checkpoint(ctx, dir.path(), model, optimizer);
    });
  };
  EXPECT_EQ(latest_checkpointed_iteration(dir.path()), std::nullopt);
  EXPECT_THROW(load(), FileError);
  save_marked(dir.path(), 5);
  const auto file = dir.path() / "iter_0000005" / "rank_00001.strata";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 8);
  try {
    load();
    ADD_FAILURE() << "expected FileError";
  } catch (const FileError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(file.string()), std::string::npos) << m;
    EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  }
  {
    std::ofstream out(tracker_path(dir.path()), std::ios::trunc);
    out << "latest\n";
  }
  EXPECT_THROW(latest_checkpointed_iteration(dir.path()), FileError);
}

// Runs `f`, which must throw FileError holding `parts` without blocking on the FIFO `fifo` (a call
// still blocked after 10 s is released by a writer, and fails).
void expect_refused_without_blocking(const std::filesystem::path& fifo, const std::function<void()>& f,
                                     const std::vector<std::string>& parts) {
  auto call = std::async(std::launch::async, [&] {
    try {
      f();
      return std::string("no FileError thrown");
    } catch (const FileError& e) {
      return std::string(e.what());
    } catch (const std::exception& e) {
      return std::string("another exception: ") + e.what();
    }
  });
  if (call.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked on " << fifo;
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (writer >= 0) ::close(writer);
  }
  const std::string message = call.get();
  for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

// A tracker or a rank file that is a FIFO, a device or a directory is refused saying what it is,
// before anything blocks on it or reads it without end.
TEST(Checkpoint, TrackerOrRankFileThatIsNotARegularFileIsRefusedSayingWhatItIs) {
  TempDirectory dir("checkpoint");
  save_marked(dir.path(), 2);
  const auto tracker = tracker_path(dir.path());
  std::filesystem::remove(tracker);
  ASSERT_EQ(::mkfifo(tracker.c_str(), 0600), 0);
  expect_refused_without_blocking(tracker, [&] { latest_checkpointed_iteration(dir.path()); },
                                  {tracker.string(), "FIFO", "not a regular file"});
  std::filesystem::remove(tracker);
  std::filesystem::create_symlink("/dev/zero", tracker);
  expect_refused_without_blocking(tracker, [&] { latest_checkpointed_iteration(dir.path()); },
                                  {tracker.string(), "character device"});
  std::filesystem::remove(tracker);
  {
    std::ofstream out(tracker);
    out << "2\n" << std::string(8192, ' ');
  }
  expect_refused_without_blocking(tracker, [&] { latest_checkpointed_iteration(dir.path()); }, {tracker.string(), "bytes"});
  {
    std::ofstream out(tracker, std::ios::trunc);
    out << "2\n";
  }
  const auto file = dir.path() / "iter_0000002" / "rank_00001.strata";
  auto load = [&] {
    inprocess::run(2, [&](Comm& world) {
      auto ctx = Context::create(world, ParallelConfig{.tp = 2});
      TwoLayer<double> model(ctx, 1);
      AdamW<double> optimizer(model);
      load_checkpoint(ctx, dir.path(), model, optimizer);
    });
  };
  std::filesystem::rename(file, dir.path() / "saved");
  std::filesystem::create_directory(file);
  expect_refused_without_blocking(file, load, {file.string(), "is a directory"});
  std::filesystem::remove(file);
  ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
  expect_refused_without_blocking(file, load, {file.string(), "FIFO"});
  std::filesystem::remove(file);
  std::filesystem::rename(dir.path() / "saved", file);
  EXPECT_EQ(load_marked(dir.path()), 2);
}

// Weights that are NaN or infinite in a checkpoint are refused at load, naming the file and the
// tensor (not blamed on the learning rate at the first iteration).
TEST(Checkpoint, NonFiniteWeightsAreRefusedAtLoadNamingFileAndTensor) {
  TempDirectory dir("checkpoint");
  inprocess::run(2, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2});
    TwoLayer<double> model(ctx, 3);
    if (world.rank() == 1) model.fc2.weight().value[1] = std::numeric_limits<double>::quiet_NaN();
    AdamW<double> optimizer(model);
    save_checkpoint(ctx, dir.path(), 3, model, optimizer, TrainState{.seed = 3});
  });
  try {
    inprocess::run(1, [&](Comm& world) {
      auto ctx = Context::create(world, ParallelConfig{.tp = 1});
      TwoLayer<double> model(ctx, 1);
      AdamW<double> optimizer(model);
      load_checkpoint(ctx, dir.path(), model, optimizer);
    });
    ADD_FAILURE() << "a NaN weight was loaded";
  } catch (const FileError& e) {
    const std::string m = e.what();
    for (const std::string& part : {std::string("rank_00001.strata"), std::string("'model.fc2.weight'"), std::string("non-finite")})
      EXPECT_NE(m.find(part), std::string::npos) << m;
  }
}

}  // namespace

// FP8 (delayed scaling): the amax histories and scales are saved and loaded, so a resumed run
// follows the straight run bit for bit; the loaded states are the saved ones, not fresh ones.
TEST(Checkpoint, Fp8ScalingStatesResumeEqualsStraightThrough) {
  constexpr int kSaveAt = 3, kTotal = 6;
  const LrSchedule schedule{.max_lr = 0.05, .min_lr = 0.001, .warmup_iters = 2, .decay_iters = kTotal};
  const Fp8Options options{.format = Fp8Formats::hybrid, .recipe = Fp8RecipeKind::delayed, .amax_history_len = 3,
                           .amax_compute_algo = Fp8AmaxAlgo::max};
  TempDirectory dir("checkpoint");
  std::vector<double> straight, resumed;
  std::vector<std::vector<float>> saved_states(2), loaded_states(2);
  auto build = [&](Context& ctx, std::uint64_t seed) {
    ctx.fp8 = std::make_shared<Fp8Scaling<space::host>>(options, 1);
    Fp8LayerScope<space::host> scope(ctx.fp8, 0);
    return std::make_unique<TwoLayer<double>>(ctx, seed);
  };
  auto rows_of = [](Context& ctx) {
    std::vector<float> out;
    for (const auto& state : ctx.fp8->states) out.insert(out.end(), state->rows.span().begin(), state->rows.span().end());
    return out;
  };
  inprocess::run(2, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2});
    auto model = build(ctx, 21);
    AdamW<double> optimizer(*model);
    for (int it = 0; it < kTotal; ++it) {
      const double loss = train_step(ctx, *model, optimizer, schedule, it);
      fp8_after_optimizer_step(ctx);
      if (world.rank() == 0) straight.push_back(loss);
      if (it + 1 == kSaveAt) {
        save_checkpoint(ctx, dir.path(), kSaveAt, *model, optimizer, TrainState{.seed = 21});
        saved_states[static_cast<std::size_t>(world.rank())] = rows_of(ctx);
      }
    }
  });
  inprocess::run(2, [&](Comm& world) {
    auto ctx = Context::create(world, ParallelConfig{.tp = 2});
    auto model = build(ctx, 77);
    AdamW<double> optimizer(*model);
    const std::vector<float> fresh = rows_of(ctx);
    (void)load_checkpoint(ctx, dir.path(), *model, optimizer);
    loaded_states[static_cast<std::size_t>(world.rank())] = rows_of(ctx);
    EXPECT_NE(loaded_states[static_cast<std::size_t>(world.rank())], fresh);
    for (int it = kSaveAt; it < kTotal; ++it) {
      const double loss = train_step(ctx, *model, optimizer, schedule, it);
      fp8_after_optimizer_step(ctx);
      if (world.rank() == 0) resumed.push_back(loss);
    }
  });
  EXPECT_EQ(loaded_states, saved_states);
  ASSERT_EQ(resumed.size(), static_cast<std::size_t>(kTotal - kSaveAt));
  for (std::size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], straight[kSaveAt + i]) << "iteration " << kSaveAt + i;
}
}  // namespace test_checkpoint_cases
