// strata/checkpoint/checkpoint.hpp: saving and loading a training run -- model parameters,
// optimizer state and training state -- one file per rank, in Megatron's directory layout:
//
//   <dir>/latest_checkpointed_iteration.txt      the tracker: the last complete iteration, as text
//   <dir>/iter_0000010/rank_00003.strata         world rank 3's file (format.hpp)
//
// Saving is collective over ctx.world and crash-safe; at no point can a crash leave the tracker
// naming an incomplete checkpoint, or damage the one it names:
//   1. rank 0 creates <dir>/iter_0000010.tmp/ (removing a leftover one from an earlier crash); barrier
//   2. every rank writes rank_XXXXX.strata.part in it, fsyncs it and renames it to rank_XXXXX.strata
//   3. barrier; rank 0 renames iter_0000010.tmp to iter_0000010 (an existing iter_0000010, from an
//      earlier save of the same iteration, is first moved to iter_0000010.old and removed after)
//   4. rank 0 rewrites the tracker atomically (temp file, fsync, rename, fsync of the directory)
//   5. barrier
// A loader that finds iter_N missing but iter_N.old present (a crash inside step 3) uses the .old
// directory, which is the complete earlier save of that iteration.
//
// Each tensor-parallel piece of a parameter and of its optimizer state is written once: by the
// first data-parallel (and context-parallel) replica, by tensor-parallel rank 0 when the
// parameter is replicated, never by a pipeline stage's copy of a tied weight; a distributed
// optimizer's share by the rank that owns it (as flat ranges of the parameter's shard). So the
// checkpoint does not grow with dp, and a rank file may hold scalars only.
//
// Loading (load_checkpoint) works in any layout: tensor, pipeline and data-parallel sizes, with or
// without the distributed optimizer, other than the saving run's. It reads the tables of every
// rank file of the iteration and, of the data, only the CRC chunks holding this rank's shards
// (reshard.hpp); no communication. Pipeline layers are named by their global index, so depth can
// be re-split. The model's architecture ("model.*" scalars) and every tensor's global shape are
// checked first; the vocabulary padding, which depends on tp, may differ (padding rows past the
// saved ones load as zero). open_checkpoint reads this rank's own file of a checkpoint saved in
// the same layout.
//
// Experts (Parameter::expert, StatePiece::expert) are written once too: by expert-data-parallel
// rank 0 (a distributed optimizer's share by its owner), every etp piece when split over etp, else
// by etp rank 0. Their names hold the global expert index ("layers.3.mlp.experts.5.fc1.weight"), so
// a rank loads the experts it holds in any (tp, ep, etp, dp) layout, and a rank holding some of the
// experts is not refused for the others in the checkpoint. A module's persistent tensors that are
// not parameters (for_each_persistent_tensor: the routers' expert bias), replicated, are written by
// the first tp, cp and dp rank of each stage and loaded whole.
//
// Names in the file: "model.<param>" for parameter values, "optimizer.<param>.main" (".exp_avg",
// ".exp_avg_sq") for the optimizer state, scalars "train.*", "optimizer.*", "model.*" (the architecture), "parallel.*", "rank.*".
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "../comm/communicator.hpp"
#include "../core/error.hpp"
#include "../core/file.hpp"
#include "../core/tensor.hpp"
#include "../shard/parallel_config.hpp"
#include "../shard/rank_generator.hpp"
#include "durable_file.hpp"
#include "format.hpp"
#include "reshard.hpp"
#include "../optim/state_piece.hpp"

STRATA_NAMESPACE_BEGIN

// What a run needs besides parameters and optimizer state to continue where it stopped.
struct TrainState {
  std::int64_t iteration = 0;         // iterations completed
  std::int64_t consumed_samples = 0;  // global samples consumed
  std::uint64_t seed = 0;
  std::map<std::string, std::int64_t> extra{};  // e.g. data-loader position
};

struct SaveOptions {
  // Called on each rank at each stage of a save: "begin", "rank_file_written", "all_files_written",
  // then on rank 0 only "directory_renamed" and "tracker_updated", then "end" on every rank (an
  // AsyncSaver calls "background_write" on its writing thread instead of "rank_file_written"). An
  // exception thrown here stops the save at that point (tests use it to simulate a crash).
  std::function<void(std::string_view stage)> on_stage;
};

struct LoadOptions {
  std::optional<std::int64_t> iteration;  // unset: the tracker's
  bool load_optimizer = true;             // false: the model alone (Megatron's --no-load-optim)
};

inline constexpr std::string_view kCheckpointTrackerName = "latest_checkpointed_iteration.txt";

inline std::string iteration_directory_name(std::int64_t iteration) {
  if (iteration < 0) fail<ConfigError>("a checkpoint iteration must be >= 0, got ", iteration);
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "iter_%07lld", static_cast<long long>(iteration));
  return buffer;
}
inline std::filesystem::path iteration_directory(const std::filesystem::path& dir, std::int64_t iteration) {
  return dir / iteration_directory_name(iteration);
}
inline std::string rank_file_name(int world_rank) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "rank_%05d.strata", world_rank);
  return buffer;
}
inline std::filesystem::path tracker_path(const std::filesystem::path& dir) { return dir / kCheckpointTrackerName; }

// The iteration named by <dir>/latest_checkpointed_iteration.txt; empty when there is no tracker.
inline std::optional<std::int64_t> latest_checkpointed_iteration(const std::filesystem::path& dir) {
  const std::filesystem::path tracker = tracker_path(dir);
  std::error_code ec;
  if (!std::filesystem::exists(tracker, ec)) return std::nullopt;
  std::string text = read_whole_file(tracker, "checkpoint tracker", kMaxTrackerBytes);
  if (const std::size_t end = text.find('\n'); end != std::string::npos) text.resize(end);
  while (!text.empty() && (text.back() == '\r' || text.back() == ' ')) text.pop_back();
  std::size_t used = 0;
  long long value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < 0)
    fail<FileError>("checkpoint tracker ", tracker, " should hold an iteration number, found '", text, "'");
  return static_cast<std::int64_t>(value);
}

// The directory holding iteration `iteration` (iter_N, or iter_N.old left by a crash while
// replacing it); FileError when neither exists.
inline std::filesystem::path find_iteration_directory(const std::filesystem::path& dir, std::int64_t iteration) {
  const std::filesystem::path path = iteration_directory(dir, iteration);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return path;
  std::filesystem::path old = path;
  old += ".old";
  if (std::filesystem::is_directory(old, ec)) return old;
  fail<FileError>("checkpoint directory ", path, " does not exist");
}

namespace checkpoint_detail {

// Namespace-scope concepts: nvcc's front end mis-evaluates requires-expressions that name local
// variables or parameters inside function bodies (they come out false), so every test of what a
// model or an optimizer offers is spelled here.
struct StatePieceProbe {
  template <class A, class B, class C>
  void operator()(const StatePiece&, A&, B&, C&) const {}
};
struct ShardedStateProbe {
  template <class X>
  void operator()(const std::string&, X&, const Shape&, const ShardSpec&) const {}
};
template <class Optimizer>
concept has_state_pieces = requires(Optimizer& o, StatePieceProbe probe) { o.for_each_state_piece(probe); };
template <class Optimizer>
concept has_sharded_state = requires(Optimizer& o, ShardedStateProbe probe) { o.for_each_sharded_state(probe); };
template <class Optimizer>
concept has_adamw_config = requires(const Optimizer& o) { o.config().beta1; };
template <class Optimizer, class Device, class Module>
concept reloads_main_from_model = requires(Optimizer& o, Device& d, Module& m) { o.reload_main_from_model(d, m); };
template <class Module>
concept has_model_config = requires(const Module& m) {
  m.config().num_layers;
  m.config().vocab_size;
};
template <class Module>
concept has_architecture = requires { Module::architecture; };
template <class P>
concept has_pipeline_copy_flag = requires(const P& p) { p.pipeline_copy; };
struct PersistentTensorProbe {
  template <class X>
  void operator()(const std::string&, X&) const {}
};
template <class Module>
concept has_persistent_tensors = requires(Module& m, PersistentTensorProbe probe) { m.for_each_persistent_tensor(probe); };
template <class Module>
concept has_moe_config = requires(const Module& m) { m.config().moe.num_experts; };

}  // namespace checkpoint_detail

namespace checkpoint_detail {

inline std::string describe_layout(const ParallelConfig& c, std::int64_t world_size) {
  return detail::concat("tp=", c.tp, " pp=", c.pp, " dp=", c.dp, " cp=", c.cp, " ep=", c.ep, " etp=", c.etp, " (",
                        world_size, world_size == 1 ? " rank)" : " ranks)");
}

inline ParallelConfig saved_layout(const StateReader& r) {
  auto get = [&](const char* key) { return static_cast<int>(r.get_int(key)); };
  return ParallelConfig{.tp = get("parallel.tp"), .pp = get("parallel.pp"), .dp = get("parallel.dp"),
                        .cp = get("parallel.cp"), .ep = get("parallel.ep"), .etp = get("parallel.etp")};
}

template <class Context>
void check_same_layout(const StateReader& r, const Context& ctx) {
  const ParallelConfig saved = saved_layout(r);
  const std::int64_t saved_world = r.get_int("parallel.world_size");
  const std::int64_t world = ctx.world.size();
  if (!(saved == ctx.config) || saved_world != world)
    fail<ConfigError>("checkpoint ", r.path(), " was saved with ", describe_layout(saved, saved_world),
                      "; this run has ", describe_layout(ctx.config, world),
                      "; open_checkpoint reads a rank's own file in the saving layout (load_checkpoint loads any layout)");
}

inline void call_stage(const SaveOptions& options, std::string_view stage) {
  if (options.on_stage) options.on_stage(stage);
}

template <class Optimizer>
void visit_optimizer_state(Optimizer& optimizer, auto&& visit) {
  if constexpr (has_sharded_state<Optimizer>) {
    optimizer.for_each_sharded_state(visit);
  } else {
    optimizer.for_each_state([&](const std::string& name, auto& tensor) { visit(name, tensor, tensor.shape(), ShardSpec{}); });
  }
}

}  // namespace checkpoint_detail

// Records the parallel layout and a rank's place in it ("parallel.*", "rank.*").
inline void describe_parallel_layout(StateWriter& writer, const ParallelConfig& config, int world_size, int world_rank,
                                     const Coordinates& coords) {
  writer.set("parallel.tp", config.tp);
  writer.set("parallel.pp", config.pp);
  writer.set("parallel.dp", config.dp);
  writer.set("parallel.cp", config.cp);
  writer.set("parallel.ep", config.ep);
  writer.set("parallel.etp", config.etp);
  writer.set("parallel.world_size", world_size);
  writer.set("rank.world", world_rank);
  writer.set("rank.tp", coords.tp);
  writer.set("rank.cp", coords.cp);
  writer.set("rank.dp", coords.dp);
  writer.set("rank.pp", coords.pp);
  writer.set("rank.ep", coords.ep);
}
// This rank's.
template <class Context>
void describe_parallel_layout(StateWriter& writer, const Context& ctx) {
  describe_parallel_layout(writer, ctx.config, ctx.world.size(), ctx.world.rank(), ctx.coords);
}

namespace checkpoint_detail {

// The scalars every rank file carries: the layout, this rank's place in it, the iteration.
template <class Context>
void stamp(StateWriter& writer, const Context& ctx, std::int64_t iteration) {
  describe_parallel_layout(writer, ctx);
  writer.set("train.iteration", iteration);
  writer.set("strata.version", detail::concat(STRATA_VERSION_MAJOR, ".", STRATA_VERSION_MINOR, ".", STRATA_VERSION_PATCH));
}

struct SavePaths {
  std::filesystem::path dir, final_dir, tmp_dir, old_dir;
  SavePaths(const std::filesystem::path& d, std::int64_t iteration)
      : dir(d), final_dir(iteration_directory(d, iteration)), tmp_dir(final_dir), old_dir(final_dir) {
    tmp_dir += ".tmp";
    old_dir += ".old";
  }
};

// Step 1 on rank 0: a fresh <dir>/iter_N.tmp/.
inline void make_temporary_directory(const SavePaths& p) {
  std::error_code ec;
  std::filesystem::create_directories(p.dir, ec);
  if (ec) fail<FileError>("cannot create checkpoint directory ", p.dir, ": ", ec.message());
  std::filesystem::remove_all(p.tmp_dir, ec);
  if (ec) fail<FileError>("cannot remove the unfinished checkpoint ", p.tmp_dir, ": ", ec.message());
  std::filesystem::create_directory(p.tmp_dir, ec);
  if (ec) fail<FileError>("cannot create ", p.tmp_dir, ": ", ec.message());
}

// Steps 3 and 4 on rank 0, once every rank file is written: iter_N.tmp becomes iter_N, then the
// tracker names N.
inline void commit_directory(const SavePaths& p, std::int64_t iteration, const SaveOptions& options) {
  std::error_code ec;
  sync_directory(p.tmp_dir);
  const bool replacing = std::filesystem::exists(p.final_dir, ec);
  if (replacing) {
    std::filesystem::remove_all(p.old_dir, ec);
    if (ec) fail<FileError>("cannot remove ", p.old_dir, ": ", ec.message());
    rename_path(p.final_dir, p.old_dir);
  }
  rename_path(p.tmp_dir, p.final_dir);
  sync_directory(p.dir);
  if (replacing) {
    std::filesystem::remove_all(p.old_dir, ec);
    if (ec) fail<FileError>("cannot remove ", p.old_dir, ": ", ec.message());
  }
  call_stage(options, "directory_renamed");
  write_text_file_durably(tracker_path(p.dir), std::to_string(iteration) + "\n");
  call_stage(options, "tracker_updated");
}

}  // namespace checkpoint_detail

// Collective over ctx.world: writes each rank's `writer` as <dir>/iter_N/rank_R.strata and then
// points the tracker at N, with the crash-safe protocol described at the top of this file. Adds the
// layout ("parallel.*", "rank.*") and "train.iteration" = iteration to the writer.
template <class Context>
void save(Context& ctx, const std::filesystem::path& dir, std::int64_t iteration, StateWriter& writer,
          const SaveOptions& options = {}) {
  namespace cd = checkpoint_detail;
  const cd::SavePaths paths(dir, iteration);
  cd::stamp(writer, ctx, iteration);
  cd::call_stage(options, "begin");
  const bool leader = ctx.world.rank() == 0;
  if (leader) cd::make_temporary_directory(paths);
  ctx.world.barrier();
  writer.write(paths.tmp_dir / rank_file_name(ctx.world.rank()));
  cd::call_stage(options, "rank_file_written");
  ctx.world.barrier();
  cd::call_stage(options, "all_files_written");
  if (leader) cd::commit_directory(paths, iteration, options);
  ctx.world.barrier();
  cd::call_stage(options, "end");
}

// Saves that write their files in the background while training goes on (Megatron's
// --async-save). save() takes this rank's StateWriter, which must own its data (checkpoint_writer
// with copy_data: host copies of device tensors are taken at the step boundary), creates the
// temporary directory, and starts a thread that writes the rank file. poll(), called by every rank
// at every step boundary, commits the oldest save once every rank's file is written (the same
// rename and tracker steps as save(), so a crash at any point leaves the tracker on a complete
// checkpoint), and throws on every rank if a background write failed anywhere, naming the
// iteration, the rank and the error. At most max_in_flight saves are pending: another save() first
// waits for the oldest. finish() waits for and commits every pending save.
//
// Collective: every rank calls save(), poll() and finish() in the same order. poll() communicates
// (one small all-reduce over ctx.world) only while a save is pending.
template <class Context>
class AsyncSaver {
 public:
  explicit AsyncSaver(int max_in_flight = 1) : max_in_flight_(max_in_flight) {
    if (max_in_flight < 1) fail<ConfigError>("AsyncSaver: max_in_flight must be at least 1, got ", max_in_flight);
  }
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;
  // Joins the writing threads; a save not yet committed is left as iter_N.tmp (never the tracker's).
  ~AsyncSaver() {
    for (auto& p : pending_)
      if (p->thread.joinable()) p->thread.join();
  }

  void save(Context& ctx, const std::filesystem::path& dir, std::int64_t iteration, StateWriter writer,
            const SaveOptions& options = {}) {
    namespace cd = checkpoint_detail;
    while (static_cast<int>(pending_.size()) >= max_in_flight_) poll(ctx, true);
    auto p = std::make_unique<Pending>(dir, iteration, std::move(writer), options);
    cd::stamp(p->writer, ctx, iteration);
    cd::call_stage(options, "begin");
    if (ctx.world.rank() == 0) cd::make_temporary_directory(p->paths);
    ctx.world.barrier();
    Pending* raw = p.get();
    const std::filesystem::path file = p->paths.tmp_dir / rank_file_name(ctx.world.rank());
    p->thread = std::thread([raw, file] {
      try {
        cd::call_stage(raw->options, "background_write");
        raw->writer.write(file);
        raw->status.store(1, std::memory_order_release);
      } catch (const std::exception& e) {
        raw->error = e.what();
        raw->status.store(2, std::memory_order_release);
      } catch (...) {
        raw->error = "unknown exception";
        raw->status.store(2, std::memory_order_release);
      }
    });
    pending_.push_back(std::move(p));
  }

  // Commits the oldest pending save if every rank has written its file (with wait: waits for this
  // rank's write first). Throws on every rank when a rank's write failed.
  void poll(Context& ctx, bool wait = false) {
    namespace cd = checkpoint_detail;
    if (pending_.empty()) return;
    Pending& p = *pending_.front();
    if (wait && p.thread.joinable()) p.thread.join();
    const int status = p.status.load(std::memory_order_acquire);
    // max over ranks of (not written yet, failed rank + 1)
    std::int32_t local[2] = {status == 0 ? 1 : 0, status == 2 ? ctx.world.rank() + 1 : 0};
    using Space = typename std::remove_cvref_t<decltype(ctx.world)>::space;
    Tensor<std::int32_t> host(Shape{2});
    host[0] = local[0];
    host[1] = local[1];
    Tensor<std::int32_t, Space> flags = Tensor<std::int32_t, Space>::empty(Shape{2});
    strata::copy(flags, host);
    ctx.world.all_reduce(flags.buffer(), ReduceOp::max);
    strata::copy(host, flags);
    if (host[1] > 0) {
      const int failed = host[1] - 1;
      if (p.thread.joinable()) p.thread.join();
      const std::string error = status == 2 ? p.error : std::string();
      const std::int64_t iteration = p.iteration;
      const std::filesystem::path dir = p.paths.dir;
      pending_.erase(pending_.begin());
      fail<FileError>("the background save of iteration ", iteration, " into ", dir, " failed on rank ", failed,
                      error.empty() ? std::string() : ": " + error,
                      "; the tracker still names the last complete checkpoint");
    }
    if (host[0] > 0) return;  // a rank is still writing
    if (p.thread.joinable()) p.thread.join();
    cd::call_stage(p.options, "all_files_written");
    if (ctx.world.rank() == 0) cd::commit_directory(p.paths, p.iteration, p.options);
    ctx.world.barrier();
    cd::call_stage(p.options, "end");
    last_committed_ = p.iteration;
    pending_.erase(pending_.begin());
  }

  // Waits for every pending save and commits it.
  void finish(Context& ctx) {
    while (!pending_.empty()) poll(ctx, true);
  }

  std::size_t pending() const { return pending_.size(); }
  // The iteration of the last save this object committed; -1 before the first.
  std::int64_t last_committed() const { return last_committed_; }

 private:
  struct Pending {
    Pending(const std::filesystem::path& dir, std::int64_t it, StateWriter w, const SaveOptions& o)
        : paths(dir, it), iteration(it), writer(std::move(w)), options(o) {}
    checkpoint_detail::SavePaths paths;
    std::int64_t iteration;
    StateWriter writer;
    SaveOptions options;
    std::thread thread;
    std::atomic<int> status{0};  // 0 writing, 1 written, 2 failed (error says why)
    std::string error;
  };
  int max_in_flight_;
  std::int64_t last_committed_ = -1;
  std::vector<std::unique_ptr<Pending>> pending_;
};

// This rank's file of the checkpoint in `dir` (the tracker's iteration unless options say
// otherwise), opened and checked: header, table, and that it was saved with this run's parallel
// layout and for this rank. No communication.
template <class Context>
StateReader open_checkpoint(const Context& ctx, const std::filesystem::path& dir, const LoadOptions& options = {}) {
  std::int64_t iteration = 0;
  if (options.iteration) {
    iteration = *options.iteration;
  } else {
    std::optional<std::int64_t> latest = latest_checkpointed_iteration(dir);
    if (!latest)
      fail<FileError>("no checkpoint to load in ", dir, ": ", tracker_path(dir), " does not exist");
    iteration = *latest;
  }
  const std::filesystem::path iter_dir = find_iteration_directory(dir, iteration);
  const std::filesystem::path file = iter_dir / rank_file_name(ctx.world.rank());
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    // Most often a run with more ranks than the checkpoint: say so if rank 0's file tells.
    const std::filesystem::path first = iter_dir / rank_file_name(0);
    if (ctx.world.rank() != 0 && std::filesystem::exists(first, ec))
      checkpoint_detail::check_same_layout(StateReader(first), ctx);
    fail<FileError>("checkpoint file ", file, " does not exist");
  }
  StateReader reader(file);
  checkpoint_detail::check_same_layout(reader, ctx);
  if (reader.get_int("rank.world") != ctx.world.rank())
    fail<FileError>("checkpoint file ", file, " belongs to world rank ", reader.get_int("rank.world"),
                    ", not to rank ", ctx.world.rank());
  if (reader.get_int("train.iteration") != iteration)
    fail<FileError>("checkpoint file ", file, " records iteration ", reader.get_int("train.iteration"),
                    " but lies in the directory of iteration ", iteration);
  return reader;
}

// The rank files of one saved iteration of `dir` (the tracker's unless options say otherwise), all
// tables opened and checked, for loading into any layout. No communication.
inline ShardedCheckpoint open_sharded_checkpoint(const std::filesystem::path& dir, const LoadOptions& options = {}) {
  std::int64_t iteration = 0;
  if (options.iteration) {
    iteration = *options.iteration;
  } else {
    std::optional<std::int64_t> latest = latest_checkpointed_iteration(dir);
    if (!latest) fail<FileError>("no checkpoint to load in ", dir, ": ", tracker_path(dir), " does not exist");
    iteration = *latest;
  }
  ShardedCheckpoint checkpoint(find_iteration_directory(dir, iteration));
  if (checkpoint.first().get_int("train.iteration") != iteration)
    fail<FileError>("checkpoint ", checkpoint.directory(), " records iteration ", checkpoint.first().get_int("train.iteration"),
                    " but lies in the directory of iteration ", iteration);
  return checkpoint;
}

namespace checkpoint_detail {

// The run-time architecture options of a model configuration (models::ModelConfig, read by its
// field names: checkpoint/ does not include models/) as checkpoint scalars: (key, value, default).
// Booleans and the activation (MlpActivation's value) are numbers.
struct ArchitectureOption {
  const char* key;
  double value, default_value;
};
template <class Config>
std::vector<ArchitectureOption> architecture_options(const Config& c) {
  const Config d{};
  return {{"model.kv_channels", double(c.kv_channels), double(d.kv_channels)},
          {"model.add_qkv_bias", double(c.add_qkv_bias), double(d.add_qkv_bias)},
          {"model.add_bias_linear", double(c.add_bias_linear), double(d.add_bias_linear)},
          {"model.qk_layernorm", double(c.qk_layernorm), double(d.qk_layernorm)},
          {"model.apply_layernorm_1p", double(c.apply_layernorm_1p), double(d.apply_layernorm_1p)},
          {"model.rotary_percent", c.rotary_percent, d.rotary_percent},
          {"model.rotary_interleaved", double(c.rotary_interleaved), double(d.rotary_interleaved)},
          {"model.rope_scaling_factor", c.rope_scaling_factor, d.rope_scaling_factor},
          {"model.rope_low_freq_factor", c.rope_low_freq_factor, d.rope_low_freq_factor},
          {"model.rope_high_freq_factor", c.rope_high_freq_factor, d.rope_high_freq_factor},
          {"model.rope_original_max_positions", c.rope_original_max_positions, d.rope_original_max_positions},
          {"model.yarn_scaling_factor", c.yarn_scaling_factor, d.yarn_scaling_factor},
          {"model.yarn_original_max_positions", c.yarn_original_max_positions, d.yarn_original_max_positions},
          {"model.yarn_beta_fast", c.yarn_beta_fast, d.yarn_beta_fast},
          {"model.yarn_beta_slow", c.yarn_beta_slow, d.yarn_beta_slow},
          {"model.yarn_mscale", c.yarn_mscale, d.yarn_mscale},
          {"model.yarn_mscale_all_dim", c.yarn_mscale_all_dim, d.yarn_mscale_all_dim},
          {"model.yarn_round_to_int", double(c.yarn_round_to_int), double(d.yarn_round_to_int)},
          {"model.softmax_type", double(static_cast<int>(c.softmax_type)), double(static_cast<int>(d.softmax_type))},
          {"model.activation", double(static_cast<int>(c.activation)), double(static_cast<int>(d.activation))},
          {"model.activation_clamp", c.activation_clamp, d.activation_clamp},
          {"model.glu_linear_offset", c.glu_linear_offset, d.glu_linear_offset}};
}
// Options every checkpoint records since they were added: multi-latent attention's sizes and the
// router's settings. A checkpoint without them (older) is checked against none of them.
template <class Config>
std::vector<ArchitectureOption> recorded_options(const Config& c) {
  // (the sizes only with multi-latent attention, the router's settings only with experts: the
  // flags are read for them alone)
  const auto& r = c.moe.routing;
  std::vector<ArchitectureOption> out{{"model.multi_latent_attention", double(c.multi_latent_attention), 0}};
  if (c.multi_latent_attention)
    out.insert(out.end(), {{"model.q_lora_rank", double(c.q_lora_rank), 0},
                           {"model.kv_lora_rank", double(c.kv_lora_rank), 0},
                           {"model.qk_head_dim", double(c.qk_head_dim), 0},
                           {"model.qk_pos_emb_head_dim", double(c.qk_pos_emb_head_dim), 0},
                           {"model.v_head_dim", double(c.v_head_dim), 0}});
  if (c.moe.num_experts > 0)
    out.insert(out.end(), {{"model.moe_router_score", double(static_cast<int>(r.score)), 0},
                           {"model.moe_router_pre_softmax", double(r.pre_softmax), 0},
                           {"model.moe_router_topk_scaling_factor", r.scaling_factor, 0},
                           {"model.moe_router_num_groups", double(r.num_groups), 0},
                           {"model.moe_router_group_topk", double(r.group_topk), 0},
                           {"model.moe_router_enable_expert_bias", double(c.moe.expert_bias), 0},
                           {"model.moe_shared_expert_gate", double(c.moe.shared_expert_gate), 0}});
  return out;
}
template <class Config>
void read_recorded_options(const StateReader& r, Config& c) {
  auto get = [&](const char* key, auto& field) {
    if (r.has(key)) field = static_cast<std::remove_reference_t<decltype(field)>>(r.get_double(key));
  };
  get("model.multi_latent_attention", c.multi_latent_attention);
  get("model.q_lora_rank", c.q_lora_rank);
  get("model.kv_lora_rank", c.kv_lora_rank);
  get("model.qk_head_dim", c.qk_head_dim);
  get("model.qk_pos_emb_head_dim", c.qk_pos_emb_head_dim);
  get("model.v_head_dim", c.v_head_dim);
  if (r.has("model.moe_router_score")) c.moe.routing.score = static_cast<decltype(c.moe.routing.score)>(static_cast<int>(r.get_double("model.moe_router_score")));
  get("model.moe_router_pre_softmax", c.moe.routing.pre_softmax);
  get("model.moe_router_topk_scaling_factor", c.moe.routing.scaling_factor);
  get("model.moe_router_num_groups", c.moe.routing.num_groups);
  get("model.moe_router_group_topk", c.moe.routing.group_topk);
  get("model.moe_router_enable_expert_bias", c.moe.expert_bias);
  get("model.moe_shared_expert_gate", c.moe.shared_expert_gate);
}

// The options a checkpoint records (absent: the default), into c.
template <class Config>
void read_architecture_options(const StateReader& r, Config& c) {
  const Config d{};
  auto get = [&](const char* key, double fallback) { return r.has(key) ? r.get_double(key) : fallback; };
  c.kv_channels = static_cast<int>(get("model.kv_channels", d.kv_channels));
  c.add_qkv_bias = get("model.add_qkv_bias", d.add_qkv_bias) != 0;
  c.add_bias_linear = get("model.add_bias_linear", d.add_bias_linear) != 0;
  c.qk_layernorm = get("model.qk_layernorm", d.qk_layernorm) != 0;
  c.apply_layernorm_1p = get("model.apply_layernorm_1p", d.apply_layernorm_1p) != 0;
  c.rotary_percent = get("model.rotary_percent", d.rotary_percent);
  c.rotary_interleaved = get("model.rotary_interleaved", d.rotary_interleaved) != 0;
  c.rope_scaling_factor = get("model.rope_scaling_factor", d.rope_scaling_factor);
  c.rope_low_freq_factor = get("model.rope_low_freq_factor", d.rope_low_freq_factor);
  c.rope_high_freq_factor = get("model.rope_high_freq_factor", d.rope_high_freq_factor);
  c.rope_original_max_positions = get("model.rope_original_max_positions", d.rope_original_max_positions);
  c.yarn_scaling_factor = get("model.yarn_scaling_factor", d.yarn_scaling_factor);
  c.yarn_original_max_positions = get("model.yarn_original_max_positions", d.yarn_original_max_positions);
  c.yarn_beta_fast = get("model.yarn_beta_fast", d.yarn_beta_fast);
  c.yarn_beta_slow = get("model.yarn_beta_slow", d.yarn_beta_slow);
  c.yarn_mscale = get("model.yarn_mscale", d.yarn_mscale);
  c.yarn_mscale_all_dim = get("model.yarn_mscale_all_dim", d.yarn_mscale_all_dim);
  c.yarn_round_to_int = get("model.yarn_round_to_int", d.yarn_round_to_int) != 0;
  c.softmax_type = static_cast<decltype(c.softmax_type)>(static_cast<int>(get("model.softmax_type", static_cast<int>(d.softmax_type))));
  c.activation = static_cast<decltype(c.activation)>(static_cast<int>(get("model.activation", static_cast<int>(d.activation))));
  c.activation_clamp = get("model.activation_clamp", d.activation_clamp);
  c.glu_linear_offset = get("model.glu_linear_offset", d.glu_linear_offset);
}

// A MoE layer pattern as text, one character per layer: "0111".
inline std::string moe_layer_pattern_text(const std::vector<int>& layers) {
  std::string out;
  for (const int x : layers) out += x != 0 ? '1' : '0';
  return out;
}

// The model's architecture, recorded so that a load into another model is refused by name.
template <class Module>
void describe_model(StateWriter& writer, const Module& model, int tp) {
  if constexpr (has_model_config<Module>) {
    const auto& c = model.config();
    writer.set("model.num_layers", c.num_layers);
    writer.set("model.hidden_size", c.hidden_size);
    writer.set("model.num_attention_heads", c.num_attention_heads);
    writer.set("model.num_query_groups", c.num_query_groups == 0 ? c.num_attention_heads : c.num_query_groups);
    writer.set("model.ffn_hidden_size", c.ffn());
    writer.set("model.vocab_size", c.vocab_size);
    writer.set("model.make_vocab_size_divisible_by", c.make_vocab_size_divisible_by);
    writer.set("model.padded_vocab_size", c.padded_vocab(tp));
    writer.set("model.seq_length", c.seq_length);
    writer.set("model.max_position_embeddings", c.positions());
    writer.set("model.norm_epsilon", c.norm_epsilon);
    writer.set("model.rope_base", c.rope_base);
    // The run-time building blocks, recorded where they differ from the default (older checkpoints
    // and plain models stay as they were): checkpoint_detail::architecture_options lists them.
    for (const auto& [key, value, default_value] : architecture_options(c))
      if (value != default_value) writer.set(key, value);
    // Sliding windows: the window and which layers have it ("10" for --window-attn-skip-freq 2 over
    // two layers; absent: every layer). Absent in checkpoints older than this record.
    for (const auto& [key, value, unused] : recorded_options(c)) writer.set(key, value);
    if (c.window_size >= 0) {
      writer.set("model.window_size", c.window_size);
      if (!c.window_layers.empty()) writer.set("model.window_pattern", moe_layer_pattern_text(c.window_layers));
    }
  }
  if constexpr (has_moe_config<Module>) {
    const auto& c = model.config();
    if (c.moe.num_experts > 0) {  // dense checkpoints stay as they were
      writer.set("model.num_experts", c.moe.num_experts);
      writer.set("model.moe_router_topk", c.moe.topk);
      writer.set("model.moe_ffn_hidden_size", c.expert_ffn());
      writer.set("model.moe_shared_expert_intermediate_size", c.moe.shared_expert_ffn_hidden_size);
      if (!c.moe.layers.empty()) writer.set("model.moe_layer_pattern", moe_layer_pattern_text(c.moe.layers));
    }
  }
  if constexpr (has_architecture<Module>) writer.set("model.architecture", std::string(Module::architecture));
}

template <class Module>
void check_model(const StateReader& r, const Module& model) {
  if constexpr (has_model_config<Module>) {
    const auto& c = model.config();
    auto check = [&](const char* key, const char* flag, std::int64_t mine) {
      if (r.has(key) && r.get_int(key) != mine)
        fail<ConfigError>("checkpoint file ", r.path(), " holds a model with ", flag, "=", r.get_int(key),
                          "; this run's model has ", flag, "=", mine, ". Build the model the checkpoint was saved with");
    };
    check("model.num_layers", "--num-layers", c.num_layers);
    check("model.hidden_size", "--hidden-size", c.hidden_size);
    check("model.num_attention_heads", "--num-attention-heads", c.num_attention_heads);
    check("model.num_query_groups", "--num-query-groups", c.num_query_groups == 0 ? c.num_attention_heads : c.num_query_groups);
    check("model.ffn_hidden_size", "--ffn-hidden-size", c.ffn());
    check("model.vocab_size", "the vocabulary size", c.vocab_size);
    // The building blocks that change the math without changing a parameter's name or shape.
    for (const auto& [key, mine, default_value] : architecture_options(c)) {
      const double saved = r.has(key) ? r.get_double(key) : default_value;
      if (saved != mine)
        fail<ConfigError>("checkpoint file ", r.path(), " holds a model with ", std::string_view(key).substr(6), "=", saved,
                          "; this run's model has ", mine, ". Build the model the checkpoint was saved with (the same "
                          "architecture flags)");
    }
    for (const auto& [key, mine, unused] : recorded_options(c))
      if (r.has(key) && r.get_double(key) != mine)
        fail<ConfigError>("checkpoint file ", r.path(), " holds a model with ", std::string_view(key).substr(6), "=",
                          r.get_double(key), "; this run's model has ", mine, ". Build the model the checkpoint was saved "
                          "with (the same architecture and router flags)");
    // The windows, where the checkpoint records them (older ones do not; they load as before).
    if (r.has("model.window_size")) {
      std::string saved = r.has("model.window_pattern") ? r.get_string("model.window_pattern")
                                                        : std::string(static_cast<std::size_t>(c.num_layers), '1');
      std::string mine(static_cast<std::size_t>(c.num_layers), '0');
      for (int l = 0; l < c.num_layers; ++l) mine[static_cast<std::size_t>(l)] = c.layer_window(l) >= 0 ? '1' : '0';
      if (r.get_int("model.window_size") != c.window_size || saved != mine)
        fail<ConfigError>("checkpoint file ", r.path(), " holds a model with a sliding window of ", r.get_int("model.window_size"),
                          " keys before each query on its layers ", saved, " (1: windowed); this run's model has ", c.window_size, " on ", mine,
                          ". Give the --window-size and --window-attn-skip-freq the checkpoint was saved with");
    }
  }
  if constexpr (has_moe_config<Module>) {
    const auto& c = model.config();
    const bool moe = c.moe.num_experts > 0;
    auto check = [&](const char* key, const char* flag, std::int64_t mine) {
      const std::int64_t saved = r.has(key) ? r.get_int(key) : 0;
      if (saved != mine)
        fail<ConfigError>("checkpoint file ", r.path(), " holds a model with ", flag, "=", saved,
                          "; this run's model has ", flag, "=", mine, ". Build the model the checkpoint was saved with");
    };
    check("model.num_experts", "--num-experts", c.moe.num_experts);
    if (moe) {
      check("model.moe_router_topk", "--moe-router-topk", c.moe.topk);
      check("model.moe_ffn_hidden_size", "--moe-ffn-hidden-size", c.expert_ffn());
      check("model.moe_shared_expert_intermediate_size", "--moe-shared-expert-intermediate-size",
            c.moe.shared_expert_ffn_hidden_size);
      // which layers are MoE layers (absent: every layer): "0111" for --moe-layer-freq [0]+[1]*3
      const std::string saved = r.has("model.moe_layer_pattern") ? r.get_string("model.moe_layer_pattern")
                                                                 : std::string(static_cast<std::size_t>(c.num_layers), '1');
      std::string mine(static_cast<std::size_t>(c.num_layers), '1');
      for (int l = 0; l < c.num_layers; ++l) mine[static_cast<std::size_t>(l)] = c.moe_layer(l) ? '1' : '0';
      if (saved != mine)
        fail<ConfigError>("checkpoint file ", r.path(), " holds a model whose MoE layers (1) and dense layers (0) are ", saved,
                          "; this run's model has ", mine, ". Give the --moe-layer-freq the checkpoint was saved with");
    }
  }
}

// The name with its last all-digit component replaced by '*': the family of an expert's weight
// ("layers.3.mlp.experts.5.fc1.weight" -> "layers.3.mlp.experts.*.fc1.weight").
inline std::string expert_family(std::string_view name) {
  std::size_t end = name.size();
  while (end > 0) {
    const std::size_t dot = name.rfind('.', end - 1);
    const std::size_t begin = dot == std::string_view::npos ? 0 : dot + 1;
    const std::string_view part = name.substr(begin, end - begin);
    if (!part.empty() && part.find_first_not_of("0123456789") == std::string_view::npos)
      return std::string(name.substr(0, begin)) + "*" + std::string(name.substr(end));
    if (dot == std::string_view::npos) break;
    end = dot;
  }
  return std::string(name);
}

// Whether this rank writes a model parameter: one copy of each tensor-parallel piece per
// checkpoint (data-parallel rank 0, context-parallel rank 0, tensor-parallel rank 0 for a
// replicated parameter), never a pipeline stage's copy of a tied weight.
// An expert's weight: expert-data-parallel rank 0, etp rank 0 when not split over etp.
template <class Context>
bool writes_piece(const Context& ctx, const ShardSpec& shard, bool pipeline_copy, bool data_parallel_replica,
                  bool expert = false) {
  if (expert) {
    if (pipeline_copy) return false;
    if (data_parallel_replica && ctx.expert_coords.edp != 0) return false;
    return (shard.sharded && shard.parts > 1) || ctx.expert_coords.etp == 0;
  }
  if (pipeline_copy) return false;
  // replicated over data and context parallelism; a distributed optimizer's share (sharded over
  // dp x cp) by its owner, whatever its cp coordinate
  if (data_parallel_replica && (ctx.coords.dp != 0 || ctx.coords.cp != 0)) return false;
  return (shard.sharded && shard.parts > 1) || ctx.coords.tp == 0;
}

template <class P>
concept has_expert_flag = requires(const P& q) { q.expert; };  // namespace scope: see has_pipeline_copy_flag
template <class P>
constexpr bool is_expert(const P& p) {
  if constexpr (has_expert_flag<P>) return p.expert;
  else return false;
}

template <class P>
constexpr bool is_pipeline_copy(const P& p) {
  if constexpr (has_pipeline_copy_flag<P>) return p.pipeline_copy;
  else return false;
}


}  // namespace checkpoint_detail

// This rank's part of a checkpoint of `model`, `optimizer` and `state`, ready for save() (or for an
// AsyncSaver, with copy_data so that training may go on while it is written).
template <class Context, class Module, class Optimizer>
StateWriter checkpoint_writer(const Context& ctx, Module& model, Optimizer& optimizer, const TrainState& state,
                              bool copy_data = false) {
  namespace cd = checkpoint_detail;
  if constexpr (requires { optimizer.values_stale(); })
    if (optimizer.values_stale())
      fail<Error>("checkpoint_writer: under the FP8 parameter gather the FP8 weights' values are current only in this "
                  "rank's shards (the gather moved their codes); call the optimizer's gather_values(ctx) before saving");
  StateWriter writer;
  writer.copy_data(copy_data);
  model.for_each_parameter([&](auto& p) {
    if (cd::writes_piece(ctx, p.shard, cd::is_pipeline_copy(p), true, cd::is_expert(p))) writer.add_parameter(p, "model." + p.name);
  });
  if constexpr (cd::has_persistent_tensors<Module>) {
    model.for_each_persistent_tensor([&](const std::string& name, auto& tensor) {
      if (ctx.coords.tp == 0 && ctx.coords.cp == 0 && ctx.coords.dp == 0)
        writer.add("model." + name, tensor, tensor.shape(), ShardSpec::replicated());
    });
  }
  if (ctx.fp8 && ctx.coords.tp == 0 && ctx.coords.cp == 0 && ctx.coords.dp == 0)  // the same on every rank of a stage
    for (const auto& fp8 : ctx.fp8->states)
      writer.add("fp8." + fp8->name + ".scaling", fp8->rows, fp8->rows.shape(), ShardSpec::replicated());
  if constexpr (cd::has_state_pieces<Optimizer>) {
    optimizer.for_each_state_piece([&](const StatePiece& piece, auto& main, auto& exp_avg, auto& exp_avg_sq) {
      if (!cd::writes_piece(ctx, piece.shard, piece.pipeline_copy, piece.data_parallel_replica, piece.expert)) return;
      const std::string base = "optimizer." + piece.name;
      writer.add_range(base + ".main", main, piece.offset, piece.count, piece.global_shape, piece.shard, piece.flat_begin);
      writer.add_range(base + ".exp_avg", exp_avg, piece.offset, piece.count, piece.global_shape, piece.shard, piece.flat_begin);
      writer.add_range(base + ".exp_avg_sq", exp_avg_sq, piece.offset, piece.count, piece.global_shape, piece.shard,
                       piece.flat_begin);
    });
  } else {
    cd::visit_optimizer_state(optimizer, [&](const std::string& name, auto& tensor, const Shape& global, const ShardSpec& shard) {
      writer.add("optimizer." + name, tensor, global, shard);
    });
  }
  writer.set("optimizer.steps", static_cast<std::int64_t>(optimizer.steps()));
  if constexpr (cd::has_adamw_config<Optimizer>) {
    writer.set("optimizer.beta1", optimizer.config().beta1);
    writer.set("optimizer.beta2", optimizer.config().beta2);
    writer.set("optimizer.eps", optimizer.config().eps);
    writer.set("optimizer.weight_decay", optimizer.config().weight_decay);
  }
  cd::describe_model(writer, model, ctx.tp.size());
  writer.set("train.consumed_samples", state.consumed_samples);
  writer.set("train.seed", static_cast<std::int64_t>(state.seed));
  for (const auto& [key, value] : state.extra) writer.set("train.extra." + key, value);
  return writer;
}

// Collective over ctx.world: saves the model's parameter values, the optimizer's state (anything
// with for_each_state_piece, or for_each_state(visit(name, tensor)), and steps(), such as AdamW)
// and the training state as iteration `iteration` (which is what the checkpoint records, whatever
// state.iteration says). Each tensor-parallel piece of a parameter and of its state is written
// once (by the first data-parallel replica; a distributed optimizer's share by its owner), so the
// checkpoint's size does not grow with dp.
template <class Context, class Module, class Optimizer>
void save_checkpoint(Context& ctx, const std::filesystem::path& dir, std::int64_t iteration, Module& model,
                     Optimizer& optimizer, const TrainState& state, const SaveOptions& options = {}) {
  StateWriter writer = checkpoint_writer(ctx, model, optimizer, state);
  save(ctx, dir, iteration, writer, options);
}

// Loads what save_checkpoint wrote into `model` and `optimizer`, in this run's parallel layout
// whatever the saving run's was (tensor, pipeline and data-parallel sizes, the distributed
// optimizer or not), and returns the training state. Reads the tables of every rank file and, of
// the data, only the CRC chunks holding this rank's shards. No communication. The model's
// architecture and every tensor's global shape are checked before anything is loaded; a tensor
// that fails its own check (CRC) throws after the tensors before it were loaded, so a failed load
// leaves the model in no defined state.
// options.load_optimizer = false (--no-load-optim, --finetune): the optimizer's main parameters are
// taken from the loaded model and its moments and step count start from zero.
template <class Context, class Module, class Optimizer>
TrainState load_checkpoint(const Context& ctx, const std::filesystem::path& dir, Module& model, Optimizer& optimizer,
                           const LoadOptions& options = {}) {
  namespace cd = checkpoint_detail;
  ShardedCheckpoint checkpoint = open_sharded_checkpoint(dir, options);
  const StateReader& first = checkpoint.first();
  cd::check_model(first, model);
  ShardedCheckpoint::ReadOptions read;
  if (first.has("model.vocab_size")) read.real_rows = first.get_int("model.vocab_size");
  // Every parameter and its shape, before any data is read.
  model.for_each_parameter([&](auto& p) {
    const std::string name = "model." + p.name;
    if (!checkpoint.has_tensor(name))
      fail<ConfigError>("checkpoint ", checkpoint.directory(), " has no parameter '", p.name, "', which the model has");
  });
  if constexpr (cd::has_persistent_tensors<Module>) {
    model.for_each_persistent_tensor([&](const std::string& name, auto&) {
      if (!checkpoint.has_tensor("model." + name))
        fail<ConfigError>("checkpoint ", checkpoint.directory(), " has no tensor '", name, "', which the model has");
    });
  }
  if (ctx.config.pp == 1) {  // the whole model on this rank: the checkpoint must hold nothing more
    std::set<std::string, std::less<>> names, expert_families;  // other ranks' experts belong to the model too
    model.for_each_parameter([&](auto& p) {
      names.insert("model." + p.name);
      if (cd::is_expert(p)) expert_families.insert(cd::expert_family("model." + p.name));
    });
    if constexpr (cd::has_persistent_tensors<Module>)
      model.for_each_persistent_tensor([&](const std::string& name, auto&) { names.insert("model." + name); });
    for (const auto& [name, entry] : checkpoint.entries())
      if (name.starts_with("model.") && !names.count(name) && !expert_families.count(cd::expert_family(name)))
        fail<ConfigError>("checkpoint ", checkpoint.directory(), " holds parameter '", name.substr(6),
                          "', which the model lacks");
  }
  model.for_each_parameter([&](auto& p) {
    checkpoint.read_into("model." + p.name, p.value, p.global_shape, p.shard, read);
  });
  if constexpr (cd::has_persistent_tensors<Module>) {
    model.for_each_persistent_tensor([&](const std::string& name, auto& tensor) {
      checkpoint.read_into("model." + name, tensor, tensor.shape(), ShardSpec::replicated(), read);
    });
  }
  // FP8 scaling states (amax histories, scales): loaded where the checkpoint has them; a checkpoint
  // of a run without FP8 leaves them as a new run starts them.
  if (ctx.fp8)
    for (const auto& fp8 : ctx.fp8->states) {
      const std::string name = "fp8." + fp8->name + ".scaling";
      if (checkpoint.has_tensor(name)) checkpoint.read_into(name, fp8->rows, fp8->rows.shape(), ShardSpec::replicated(), read);
    }
  if (ctx.fp8) ctx.fp8->drop_weight_caches();  // new weights and scales: the FP8 layers cast their weights again
  if (options.load_optimizer) {
    if constexpr (cd::has_state_pieces<Optimizer>) {
      optimizer.for_each_state_piece([&](const StatePiece& piece, auto& main, auto& exp_avg, auto& exp_avg_sq) {
        const std::string base = "optimizer." + piece.name;
        for (const char* which : {".main", ".exp_avg", ".exp_avg_sq"})
          if (!checkpoint.has_tensor(base + which))
            fail<ConfigError>("checkpoint ", checkpoint.directory(), " has no optimizer state '", piece.name, which,
                              "'; pass --no-load-optim to load the model alone");
        checkpoint.read_into(base + ".main", main, piece.offset, piece.count, piece.global_shape, piece.shard, piece.flat_begin, read);
        checkpoint.read_into(base + ".exp_avg", exp_avg, piece.offset, piece.count, piece.global_shape, piece.shard,
                             piece.flat_begin, read);
        checkpoint.read_into(base + ".exp_avg_sq", exp_avg_sq, piece.offset, piece.count, piece.global_shape, piece.shard,
                             piece.flat_begin, read);
      });
    } else {
      cd::visit_optimizer_state(optimizer, [&](const std::string& name, auto& tensor, const Shape& global, const ShardSpec& shard) {
        const std::string stored = "optimizer." + name;
        if (!checkpoint.has_tensor(stored))
          fail<ConfigError>("checkpoint ", checkpoint.directory(), " has no optimizer state '", name,
                            "'; pass --no-load-optim to load the model alone");
        checkpoint.read_into(stored, tensor, global, shard, read);
      });
    }
    optimizer.set_steps(static_cast<int>(first.get_int("optimizer.steps")));
  } else {
    if constexpr (cd::reloads_main_from_model<Optimizer, std::remove_cvref_t<decltype(ctx.device)>, Module>)
      optimizer.reload_main_from_model(ctx.device, model);
    else
      optimizer.reload_main_from_model(ctx.device);
    optimizer.reset_moments(ctx.device);
    optimizer.set_steps(0);
  }
  TrainState state;
  state.iteration = first.get_int("train.iteration");
  state.consumed_samples = first.get_int("train.consumed_samples");
  state.seed = static_cast<std::uint64_t>(first.get_int("train.seed"));
  constexpr std::string_view prefix = "train.extra.";
  for (const auto& [key, value] : first.scalars())
    if (key.starts_with(prefix)) state.extra[key.substr(prefix.size())] = first.get_int(key);
  return state;
}

STRATA_NAMESPACE_END
