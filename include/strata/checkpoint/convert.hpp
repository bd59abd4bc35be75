// strata/checkpoint/convert.hpp: `convert_checkpoint`, a saved checkpoint rewritten for another
// parallel layout, offline (no communicator, one process): what the strata-convert tool runs.
//
// load_checkpoint already loads any layout, so conversion is never required to train; it makes a
// checkpoint whose files match a layout (each rank's shards in its own file), e.g. before copying
// it to the machines that will train at that layout, and it is the converter's path to and from
// other formats. The target holds, per rank file of (tp, pp, dp) in Megatron's rank order:
// - data-parallel rank 0 of each (tp, pp): every tensor-parallel shard of the parameters and of
//   their optimizer state that its pipeline stage holds (layers by their global index, split as
//   the trainers split them; embeddings on the first stage, the final norm and output layer on the
//   last), replicated tensors on tensor-parallel rank 0 only; a distributed optimizer's flat
//   ranges become whole shards (any dp, with or without the distributed optimizer, loads them);
// - every rank: the scalars (training state, layout, its coordinates).
// The vocabulary tables take the padding of the new tensor-parallel size (rows past the real
// vocabulary are zero where the source had none). The result is committed like a save: written
// under iter_N.tmp, renamed, then the tracker. Progress (tensors and bytes) goes to a callback.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "../core/error.hpp"
#include "../pipeline/stage.hpp"
#include "../shard/partition.hpp"
#include "../shard/rank_generator.hpp"
#include "checkpoint.hpp"
#include "format.hpp"
#include "huggingface.hpp"
#include "reshard.hpp"

STRATA_NAMESPACE_BEGIN

struct ConvertProgress {
  std::int64_t tensors_done = 0, tensors_total = 0;
  std::uint64_t bytes_done = 0, bytes_total = 0;
};

struct ConvertOptions {
  int tp = 1, pp = 1, dp = 1;           // the target layout
  int ep = 1, etp = 0;                  // its experts' (etp 0: tp, as Megatron's default)
  bool optimizer = true;                // false: parameters only (load with --no-load-optim / --finetune)
  std::function<void(const ConvertProgress&)> progress;  // after each tensor written
};

namespace checkpoint_detail {

// "layers.<i>.rest" -> i, else -1.
inline int layer_index(std::string_view parameter) {
  constexpr std::string_view prefix = "layers.";
  if (!parameter.starts_with(prefix)) return -1;
  parameter.remove_prefix(prefix.size());
  int value = 0;
  std::size_t digits = 0;
  while (digits < parameter.size() && parameter[digits] >= '0' && parameter[digits] <= '9')
    value = value * 10 + (parameter[digits++] - '0');
  return digits == 0 ? -1 : value;
}

// "layers.<i>.mlp.experts.<e>.rest" -> e (an expert's parameter), else -1.
inline int expert_index(std::string_view parameter) {
  constexpr std::string_view marker = ".mlp.experts.";
  const std::size_t at = parameter.find(marker);
  if (at == std::string_view::npos || layer_index(parameter) < 0) return -1;
  parameter.remove_prefix(at + marker.size());
  int value = 0;
  std::size_t digits = 0;
  while (digits < parameter.size() && parameter[digits] >= '0' && parameter[digits] <= '9')
    value = value * 10 + (parameter[digits++] - '0');
  return digits == 0 ? -1 : value;
}

// The parameter a stored tensor belongs to: "model.<p>" -> p, "optimizer.<p>.main" -> p.
inline std::string parameter_of(std::string_view name) {
  if (name.starts_with("model.")) return std::string(name.substr(6));
  if (name.starts_with("optimizer.")) {
    name.remove_prefix(10);
    for (std::string_view suffix : {".main", ".exp_avg_sq", ".exp_avg"})
      if (name.ends_with(suffix)) return std::string(name.substr(0, name.size() - suffix.size()));
  }
  return std::string();
}

}  // namespace checkpoint_detail

// Calls f(X{}) with X the element type of `dtype`.
template <class F>
void with_stored_type(StoredDtype dtype, F&& f) {
  switch (dtype) {
    case StoredDtype::float32: return f(float{});
    case StoredDtype::float64: return f(double{});
    case StoredDtype::bfloat16: return f(bf16{});
    case StoredDtype::float16: return f(fp16{});
    case StoredDtype::int32: return f(std::int32_t{});
    case StoredDtype::int64: return f(std::int64_t{});
    case StoredDtype::uint8: return f(std::uint8_t{});
  }
  fail<FileError>("unknown stored dtype code ", static_cast<int>(dtype));
}

// Writes the checkpoint `source` as the same iteration in `target_dir`, laid out for options.tp x
// options.pp x options.dp, a mixture of experts' expert weights for options.ep x options.etp: expert
// e on expert-data-parallel rank 0 of the ep rank that holds it, split over etp. Refuses a target
// whose sizes do not divide the tensors, the layers or the experts.
inline void convert_checkpoint(ShardedCheckpoint& source, const std::filesystem::path& target_dir,
                               const ConvertOptions& options) {
  namespace cd = checkpoint_detail;
  const StateReader& first = source.first();
  const ParallelConfig target{.tp = options.tp, .pp = options.pp, .dp = options.dp, .ep = options.ep,
                              .etp = options.etp > 0 ? options.etp : options.tp};
  raise_if(validate(target));
  const index_t experts = first.has("model.num_experts") ? first.get_int("model.num_experts") : 0;
  if (experts > 0 && experts % target.ep != 0)
    fail<ConfigError>("--target-expert-parallel-size ", target.ep, " does not divide the checkpoint's ", experts,
                      " experts; each expert-parallel rank holds num_experts / ep whole experts");
  if (experts == 0 && target.ep > 1)
    fail<ConfigError>("--target-expert-parallel-size ", target.ep, ": checkpoint ", source.directory(),
                      " holds no experts (model.num_experts is not recorded)");
  if (target.world_size() > kMaxCheckpointRanks)
    fail<ConfigError>("the target layout tp=", options.tp, " x pp=", options.pp, " x dp=", options.dp, " needs ", target.world_size(),
                      " rank files, more than the ", kMaxCheckpointRanks, " a checkpoint can hold; give smaller target sizes");
  const RankGenerator ranks(target);
  const std::int64_t iteration = first.get_int("train.iteration");
  for (const char* key : {"model.num_layers", "model.vocab_size"})
    if (!first.has(key))
      fail<FileError>("checkpoint ", source.directory(), " does not record '", key,
                      "' (saved by an older strata?); it cannot be laid out again by the converter");
  const int num_layers = static_cast<int>(first.get_int("model.num_layers"));
  const index_t vocab = first.get_int("model.vocab_size");
  const int divisible_by = first.has("model.make_vocab_size_divisible_by")
                               ? static_cast<int>(first.get_int("model.make_vocab_size_divisible_by")) : 128;
  const index_t saved_padded = first.has("model.padded_vocab_size") ? first.get_int("model.padded_vocab_size") : -1;
  const index_t padded = padded_vocab_size(vocab, options.tp, divisible_by);
  // Each layer's pipeline stage in the target (the trainers' even split).
  std::vector<int> stage_of(static_cast<std::size_t>(num_layers), 0);
  for (int p = 0; p < options.pp; ++p) {
    const pipeline::StageLayers stage = pipeline::stage_layers_of(num_layers, options.pp, 1, p, 0);
    for (index_t l = stage.layers.begin; l < stage.layers.end; ++l) stage_of[static_cast<std::size_t>(l)] = p;
  }
  auto stage_for = [&](const std::string& parameter) {
    const int layer = cd::layer_index(parameter);
    if (layer >= num_layers)
      fail<FileError>("checkpoint ", source.directory(), " holds '", parameter, "' but records ", num_layers, " layers");
    if (layer >= 0) return stage_of[static_cast<std::size_t>(layer)];
    if (parameter.starts_with("final_norm") || parameter.starts_with("output")) return options.pp - 1;
    return 0;
  };
  auto target_global = [&](const ShardedCheckpoint::Entry& e) {
    Shape global = e.global_shape;
    if (saved_padded > 0 && global.rank() >= 1 && global[0] == saved_padded) global = global.with(0, padded);
    return global;
  };
  // The shards each rank file holds (data-parallel rank 0 of each (tp, pp); an expert's on
  // expert-data-parallel rank 0 of its ep rank, each etp piece), and the progress totals. A tensor
  // saved with a split dimension is split by the target's size (also when it was saved whole, at a
  // size of 1), a replicated one goes to the group's rank 0.
  struct Job {
    const ShardedCheckpoint::Entry* entry;
    Shape global;
    ShardSpec spec;
  };
  std::vector<std::vector<Job>> jobs(static_cast<std::size_t>(ranks.world_size()));
  ConvertProgress progress;
  for (int r = 0; r < ranks.world_size(); ++r) {
    const Coordinates c = ranks.coordinates(r);
    const ExpertCoordinates ec = ranks.expert_coordinates(r);
    for (const auto& [name, e] : source.entries()) {
      const std::string parameter = cd::parameter_of(name);
      if (parameter.empty() || (!options.optimizer && name.starts_with("optimizer."))) continue;
      if (stage_for(parameter) != c.pp) continue;
      const int expert = experts > 0 ? cd::expert_index(parameter) : -1;
      if (expert >= experts)
        fail<FileError>("checkpoint ", source.directory(), " holds '", parameter, "' but records ", experts, " experts");
      int split_rank = c.tp, split_parts = options.tp;
      if (expert >= 0) {
        if (ec.edp != 0 || ec.ep != expert / (experts / target.ep)) continue;
        split_rank = ec.etp, split_parts = target.etp;
      } else if (c.dp != 0) {
        continue;
      }
      if (!e.shard.sharded && split_rank != 0) continue;
      const ShardSpec spec = e.shard.sharded ? ShardSpec::split(e.shard.dim, split_rank, split_parts, e.shard.stacks) : ShardSpec{};
      const Shape global = target_global(e);
      (void)local_shape(global, spec);  // a size the new tp does not divide: ConfigError naming the shape
      jobs[static_cast<std::size_t>(r)].push_back(Job{&e, global, spec});
      ++progress.tensors_total;
      progress.bytes_total += static_cast<std::uint64_t>(local_shape(global, spec).numel()) * stored_dtype_size(e.dtype);
    }
  }

  const cd::SavePaths paths(target_dir, iteration);
  cd::make_temporary_directory(paths);
  ShardedCheckpoint::ReadOptions read;
  read.real_rows = vocab;
  for (int r = 0; r < ranks.world_size(); ++r) {
    const Coordinates c = ranks.coordinates(r);
    StateWriter writer;
    writer.copy_data(true);  // each shard is read into a tensor that goes away before the file is written
    for (const auto& [key, value] : first.scalars()) {
      if (key.starts_with("parallel.") || key.starts_with("rank.")) continue;
      std::visit([&](const auto& v) { writer.set(key, v); }, value);
    }
    if (saved_padded > 0) writer.set("model.padded_vocab_size", padded);
    describe_parallel_layout(writer, target, ranks.world_size(), r, c);
    for (const Job& job : jobs[static_cast<std::size_t>(r)]) {
      with_stored_type(job.entry->dtype, [&](auto zero) {
        using X = decltype(zero);
        Tensor<X> shard = Tensor<X>::empty(local_shape(job.global, job.spec));
        source.read_into(job.entry->name, shard, job.global, job.spec, read);
        writer.add(job.entry->name, shard, job.global, job.spec);
        progress.bytes_done += shard.bytes();
      });
      ++progress.tensors_done;
      if (options.progress) options.progress(progress);
    }
    writer.write(paths.tmp_dir / rank_file_name(r));
  }
  cd::commit_directory(paths, iteration, SaveOptions{});
}

// Writes the model of the checkpoint `source` (any layout) as a Hugging Face transformers model
// (config.json + safetensors) in `out`: each parameter is assembled whole from the rank files
// (ShardedCheckpoint), the vocabulary padding dropped. X: the element type the parameters were
// saved in.
template <class X>
void export_hf_from_checkpoint(ShardedCheckpoint& source, hf::Architecture architecture, const models::ModelConfig& config,
                               const std::filesystem::path& out, hf::SaveOptions options = {}) {
  const std::string word = "model.embedding.word.weight";
  if (options.padded_vocab == 0) options.padded_vocab = source.entry(word).global_shape[0];
  ShardedCheckpoint::ReadOptions read;
  read.real_rows = config.vocab_size;
  hf::save_hf(out, architecture, config,
              [&](const std::string& name, const Shape& global) {
                Tensor<X> whole = Tensor<X>::empty(global);
                source.read_into("model." + name, whole, global, ShardSpec{}, read);
                return whole;
              },
              options);
}
template <class X>
void export_hf_from_checkpoint(const std::filesystem::path& dir, std::int64_t iteration, hf::Architecture architecture,
                               const models::ModelConfig& config, const std::filesystem::path& out, hf::SaveOptions options = {}) {
  ShardedCheckpoint source = open_sharded_checkpoint(dir, LoadOptions{.iteration = iteration});
  export_hf_from_checkpoint<X>(source, architecture, config, out, options);
}

// The model a checkpoint holds, as its "model.*" scalars describe it (saved by save_checkpoint of
// a models::Gpt, models::Llama or PipelineModel of either), for export without the model's type.
inline std::pair<hf::Architecture, models::ModelConfig> checkpoint_model(const ShardedCheckpoint& source) {
  const StateReader& r = source.first();
  for (const char* key : {"model.architecture", "model.num_layers", "model.seq_length"})
    if (!r.has(key))
      fail<FileError>("checkpoint ", source.directory(), " does not record '", key,
                      "': it was not saved from a strata GPT or Llama model (or by an older strata)");
  const std::optional<hf::Architecture> architecture = hf::parse_architecture(r.get_string("model.architecture"));
  if (!architecture)
    fail<FileError>("checkpoint ", source.directory(), " holds a model of architecture '", r.get_string("model.architecture"),
                    "', which has no Hugging Face mapping");
  models::ModelConfig c;
  auto get = [&](const char* key) { return static_cast<int>(r.get_int(key)); };
  c.num_layers = get("model.num_layers");
  c.hidden_size = get("model.hidden_size");
  c.num_attention_heads = get("model.num_attention_heads");
  c.num_query_groups = *architecture == hf::Architecture::gpt2 ? 0 : get("model.num_query_groups");
  c.ffn_hidden_size = get("model.ffn_hidden_size");
  c.vocab_size = get("model.vocab_size");
  c.seq_length = get("model.seq_length");
  if (r.has("model.max_position_embeddings")) c.max_position_embeddings = get("model.max_position_embeddings");
  c.make_vocab_size_divisible_by = get("model.make_vocab_size_divisible_by");
  c.norm_epsilon = r.get_double("model.norm_epsilon");
  c.rope_base = r.get_double("model.rope_base");
  checkpoint_detail::read_architecture_options(r, c);
  checkpoint_detail::read_recorded_options(r, c);
  if (r.has("model.window_size")) {  // sliding windows (checkpoints older than this record hold none)
    c.window_size = get("model.window_size");
    if (r.has("model.window_pattern"))
      for (const char x : r.get_string("model.window_pattern")) c.window_layers.push_back(x == '1' ? 1 : 0);
  }
  if (r.has("model.num_experts")) {  // a mixture-of-experts model (router settings: read_recorded_options, else Mixtral's)
    c.moe.num_experts = get("model.num_experts");
    c.moe.topk = get("model.moe_router_topk");
    c.moe.expert_ffn_hidden_size = get("model.moe_ffn_hidden_size");
    c.moe.shared_expert_ffn_hidden_size = get("model.moe_shared_expert_intermediate_size");
    if (r.has("model.moe_layer_pattern"))
      for (const char x : r.get_string("model.moe_layer_pattern")) c.moe.layers.push_back(x == '1' ? 1 : 0);
  }
  return {*architecture, c};
}

STRATA_NAMESPACE_END
