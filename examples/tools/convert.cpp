// strata-convert: a saved checkpoint rewritten for another parallel layout (the flag names of
// Megatron's checkpoint converter).
//
//   strata-convert --load ckpt --save ckpt_tp4 --target-tensor-parallel-size 4 --target-pipeline-parallel-size 1
//   strata-convert --load ckpt --ckpt-step 2000 --save weights --no-load-optim   # parameters only
//   strata-convert --load ckpt --save ckpt_ep8 --target-expert-parallel-size 8 --target-data-parallel-size 8
//   strata-convert --load ckpt --save-hf gpt2-hf              # Hugging Face transformers' format
//
// The trainers load a checkpoint of any layout directly; converting writes each rank's shards into
// its own file for the target layout (checkpoint/convert.hpp). A progress line (tensors and bytes)
// goes to stderr. --save-hf writes the model as transformers' config.json + safetensors instead
// (GPT2LMHeadModel, LlamaForCausalLM; import goes through the trainers' --load-hf).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>

#include <strata/checkpoint.hpp>

int main(int argc, char** argv) {
  CLI::App app{"strata-convert: rewrite a strata checkpoint for another parallel layout"};
  std::string load, save, save_hf, ckpt_format = "strata";
  int ckpt_step = -1, tp = 1, pp = 1, dp = 1, ep = 1, etp = 0;
  bool no_load_optim = false, no_load_rng = false, quiet = false;
  app.add_option("--load", load, "checkpoint directory to read")->required();
  app.add_option("--ckpt-step", ckpt_step, "iteration to read (default: the latest)");
  auto* save_option = app.add_option("--save", save, "directory to write the converted checkpoint into");
  auto* save_hf_option = app.add_option("--save-hf", save_hf, "directory to write the model into in Hugging Face transformers' format");
  save_option->excludes(save_hf_option);
  app.add_option("--target-tensor-parallel-size", tp, "tensor-parallel size of the result");
  app.add_option("--target-pipeline-parallel-size", pp, "pipeline-parallel size of the result");
  app.add_option("--target-data-parallel-size", dp, "data-parallel size of the result (its files hold the scalars only)");
  app.add_option("--target-expert-parallel-size", ep, "expert-parallel size of the result (a mixture of experts: expert e on the rank that holds it)");
  app.add_option("--target-expert-tensor-parallel-size", etp,
                 "expert-tensor-parallel size of the result (default: --target-tensor-parallel-size, as Megatron)");
  app.add_flag("--no-load-optim", no_load_optim, "leave the optimizer state out (load the result with --no-load-optim or --finetune)");
  app.add_flag("--no-load-rng", no_load_rng, "accepted: strata keeps no generator state (draws are functions of the seed and the iteration)");
  app.add_option("--ckpt-format", ckpt_format, "format of --load and --save: strata (Megatron's torch and torch_dist are not read)");
  app.add_flag("--quiet", quiet, "no progress line");
  CLI11_PARSE(app, argc, argv);
  try {
    if (ckpt_format != "strata")
      strata::fail<strata::ConfigError>("--ckpt-format ", ckpt_format,
                                        ": strata-convert reads and writes strata's sharded format only (--ckpt-format strata)");
    for (auto [flag, value] : {std::pair{"--target-tensor-parallel-size", tp}, std::pair{"--target-pipeline-parallel-size", pp},
                               std::pair{"--target-data-parallel-size", dp}, std::pair{"--target-expert-parallel-size", ep}})
      if (value < 1) strata::fail<strata::ConfigError>(flag, "=", value, " is out of range: it must be at least 1");
    if (const std::int64_t ranks = std::int64_t{tp} * pp * dp; ranks > strata::kMaxCheckpointRanks)
      strata::fail<strata::ConfigError>("--target-tensor-parallel-size ", tp, " x --target-pipeline-parallel-size ", pp,
                                        " x --target-data-parallel-size ", dp, " = ", ranks, " ranks, more than the ",
                                        strata::kMaxCheckpointRanks, " (one file each) a checkpoint can hold; give smaller target sizes");
    if (app.count("--ckpt-step") > 0 && ckpt_step < 0)
      strata::fail<strata::ConfigError>("--ckpt-step ", ckpt_step, " is negative; give the iteration to read (iter_<N> in --load), "
                                        "or leave --ckpt-step out for the latest");
    if (save.empty() && save_hf.empty()) strata::fail<strata::ConfigError>("give --save <directory> or --save-hf <directory>");
    const std::string& out = save.empty() ? save_hf : save;
    if (std::filesystem::weakly_canonical(load) == std::filesystem::weakly_canonical(out))
      strata::fail<strata::ConfigError>("--save must be another directory than --load (", load, ")");
    strata::LoadOptions which;
    if (ckpt_step >= 0) which.iteration = ckpt_step;
    strata::ShardedCheckpoint source = strata::open_sharded_checkpoint(load, which);
    if (!save_hf.empty()) {
      const auto [architecture, config] = strata::checkpoint_model(source);
      strata::hf::SaveOptions options;  // the token ids the training run's tokenizer gave (checkpoints since they are kept)
      const strata::StateReader& state = source.first();
      if (state.has("train.extra.hf_bos_token_id")) options.bos_token_id = strata::json::number(state.get_int("train.extra.hf_bos_token_id"));
      if (state.has("train.extra.hf_eos_token_id")) options.eos_token_id = strata::json::number(state.get_int("train.extra.hf_eos_token_id"));
      strata::with_stored_type(source.entry("model.embedding.word.weight").dtype, [&](auto zero) {
        using X = decltype(zero);
        if constexpr (std::is_floating_point_v<X> || std::is_same_v<X, strata::bf16> || std::is_same_v<X, strata::fp16>)
          strata::export_hf_from_checkpoint<X>(source, architecture, config, save_hf, options);
        else
          strata::fail<strata::FileError>("checkpoint ", load, " holds integer weights");
      });
      if (!quiet)
        std::printf("strata-convert: iteration %lld of %s written to %s as a Hugging Face %s model\n",
                    static_cast<long long>(source.first().get_int("train.iteration")), load.c_str(), save_hf.c_str(),
                    std::string(strata::hf::architecture_class(strata::hf::hf_architecture(architecture, config))).c_str());
      return 0;
    }
    const auto t0 = std::chrono::steady_clock::now();
    strata::ConvertOptions options;
    options.tp = tp;
    options.pp = pp;
    options.dp = dp;
    options.ep = ep;
    if (etp < 0) strata::fail<strata::ConfigError>("--target-expert-tensor-parallel-size=", etp, " is out of range: it must be at least 1");
    options.etp = etp;
    options.optimizer = !no_load_optim;
    if (!quiet)
      options.progress = [&](const strata::ConvertProgress& p) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double fraction = p.bytes_total > 0 ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 1.0;
        char bar[31] = {};
        for (int i = 0; i < 30; ++i) bar[i] = i < static_cast<int>(fraction * 30) ? '#' : '.';
        std::fprintf(stderr, "\r[%s] %lld/%lld tensors, %.1f/%.1f MiB, %.1f MiB/s", bar, static_cast<long long>(p.tensors_done),
                     static_cast<long long>(p.tensors_total), static_cast<double>(p.bytes_done) / 1048576.0,
                     static_cast<double>(p.bytes_total) / 1048576.0,
                     seconds > 0 ? static_cast<double>(p.bytes_done) / 1048576.0 / seconds : 0.0);
        if (p.tensors_done == p.tensors_total) std::fprintf(stderr, "\n");
      };
    strata::convert_checkpoint(source, save, options);
    if (!quiet)
      std::printf("strata-convert: iteration %lld of %s written to %s for tp=%d pp=%d dp=%d ep=%d etp=%d%s\n",
                  static_cast<long long>(source.first().get_int("train.iteration")), load.c_str(), save.c_str(), tp, pp, dp,
                  ep, etp > 0 ? etp : tp, no_load_optim ? " (parameters only)" : "");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata-convert: error: %s\n", e.what());
    return 1;
  }
}
