// examples/trainer/args.hpp: the trainers' command line, as Megatron's `pretrain_gpt.py` takes it.
//
// `TrainArgs` holds every flag. Its defaults are Megatron's (megatron/training/arguments.py and
// the config dataclasses): sequence parallelism off, dropouts 0.1, no warmup, min-lr 0, linear
// decay, weight decay 0.01, Adam beta2 0.999, log every 100 iterations, 100 evaluation batches.
// Flags Megatron requires (sizes, --lr, --micro-batch-size, --train-iters) default to a small model
// that trains in seconds on a CPU. `default_args(kind)` is the demo configuration the library's
// tests start from (tensor parallel 2 with sequence parallelism, no dropout, a short cosine
// schedule); the README's demo command passes the same values as flags.
//
// Architecture by flags, as pretrain_gpt.py: --position-embedding-type, --normalization, --swiglu,
// --untie-embeddings-and-output-weights, --disable-bias-linear, --group-query-attention select one
// of the compile-time models behind a small table (`resolve_architecture`): Megatron's defaults are
// GPT-2 (models::Gpt), the Llama set is models::Llama; any other combination is refused naming the
// flags. Megatron flags strata accepts without acting on them, and those whose feature strata does
// not have, are listed in `megatron_flag_notes` and answered with one line each.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cctype>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <strata/checkpoint/huggingface.hpp>
#include <strata/data.hpp>
#include <strata/models.hpp>
#include <strata/optim.hpp>

#include "pipeline_step.hpp"

#ifndef STRATA_DEFAULT_DATA_PATH
#define STRATA_DEFAULT_DATA_PATH "examples/data/corpus_text_document"
#endif

namespace trainer {

using namespace strata;

// The model of the architecture flags with Megatron's defaults for everything else, and the small
// sizes strata uses where Megatron requires a value.
inline models::ModelConfig command_line_model() {
  models::ModelConfig m;
  m.num_layers = 4;
  m.hidden_size = 128;
  m.num_attention_heads = 4;
  m.ffn_hidden_size = 0;  // Megatron's rule: 4 x hidden, or 2/3 of that rounded down to 64 with --swiglu
  m.num_query_groups = 0;
  m.vocab_size = data::ByteTokenizer::kVocabSize;
  m.seq_length = 128;
  m.hidden_dropout = 0.1;
  m.attention_dropout = 0.1;
  return m;
}

// The architecture flags of pretrain_gpt.py (Megatron's defaults: GPT-2's set).
struct ArchitectureArgs {
  std::string position_embedding_type = "learned_absolute";  // learned_absolute | rope | yarn (rope with YaRN's scaling)
  std::string rope_type;                                     // --rope-type (multi-latent attention's): rope | yarn; "" unset
  std::string normalization = "LayerNorm";                   // LayerNorm | RMSNorm
  bool swiglu = false;
  bool squared_relu = false;  // --squared-relu (run-time: ModelConfig::activation)
  bool quick_geglu = false;   // --quick-geglu, gated (run-time: ModelConfig::activation)
  bool untie_embeddings_and_output_weights = false;
  bool disable_bias_linear = false;
  bool group_query_attention = false;
  bool add_position_embedding = true;  // --no-position-embedding: false
  // --kv-channels, --rotary-percent, --apply-layernorm-1p, --qk-layernorm, --add-qkv-bias,
  // --rotary-interleaved, --use-rope-scaling: run-time fields of ModelConfig (every compiled model).
  bool use_rope_scaling = false;
  double rope_scaling_factor = 8.0;  // Megatron's default
  // --position-embedding-type yarn: YaRN's parameters under Megatron's names and defaults
  // (--rotary-scaling-factor, --yarn-original-max-position-embeddings, --yarn-beta-fast,
  // --yarn-beta-slow, --mscale, --mscale-all-dim, --[no-]yarn-correction-range-round-to-int).
  double rotary_scaling_factor = 1.0;
  double yarn_original_max_position_embeddings = 4096;
  double yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
  double mscale = 1.0, mscale_all_dim = 0.0;
  bool yarn_correction_range_round_to_int = true;
  std::string softmax_type = "vanilla";  // --softmax-type vanilla | off-by-one | learnable (run-time: ModelConfig)
  bool enable_gpt_oss = false;           // --enable-gpt-oss: YaRN with gpt-oss's values (resolve_yarn)

  // Whether the MLP is gated (--swiglu or --quick-geglu): Llama's set asks for one of them.
  bool gated() const { return swiglu || quick_geglu; }

  // The Llama set (train_llama's preset): RoPE, RMSNorm, SwiGLU, untied output, no biases.
  static ArchitectureArgs llama() {
    ArchitectureArgs a;
    a.position_embedding_type = "rope";
    a.normalization = "RMSNorm";
    a.swiglu = true;
    a.untie_embeddings_and_output_weights = true;
    a.disable_bias_linear = true;
    return a;
  }
};

struct TrainArgs {
  std::string model_kind = "gpt";  // gpt | llama | mixtral: the compiled model the architecture flags select
  ArchitectureArgs architecture{};
  // parallelism
  int world_size = 2;
  int tensor_model_parallel_size = 1;
  int context_parallel_size = 1;         // cp: each sequence split over cp ranks (ring or all-to-all attention)
  std::string cp_comm_type = "p2p";      // p2p (ring attention), allgather, a2a (Ulysses) or a2a+p2p
  std::vector<int> hierarchical_cp_sizes{};  // a2a+p2p: {all-to-all group, ring} sizes, product cp
  int expert_model_parallel_size = 1;   // ep: experts spread over ep ranks of each stage
  int expert_tensor_parallel_size = 0;  // etp: each expert split over etp ranks; 0 = --tensor-model-parallel-size (Megatron)
  bool sequence_parallel = false;  // turned off (with a warning) when tensor parallel is 1, as Megatron
  bool tp_comm_overlap = false;    // tensor-parallel collectives beside the GEMMs (ParallelContext::tp_comm_overlap)
  bool disable_tp_comm_overlap_ag = false;  // the forward's all-gathers whole, not as rings (ParallelContext::tp_comm_overlap_ag)
  bool disable_tp_comm_overlap_rs = false;  // the forward's reduce-scatters whole (ParallelContext::tp_comm_overlap_rs)
  // ring | collective | copy-engines (ParallelContext::tp_comm_overlap_gather; the trainers set up the
  // copy engines' window, so their default is the fastest measured mode)
  std::string tp_comm_overlap_gather = "copy-engines";
  int tp_comm_overlap_sm_margin = 0;  // SMs the GEMMs beside the overlapped collectives leave to them (cuda::backend)
  PipelineArgs pipeline{};      // pipeline parallelism (pipeline_step.hpp)
  std::string device = "cpu";   // cpu | cuda (main_for: "auto" = cuda when built with CUDA and a GPU is present)
  std::string dtype = "float";  // float | double | bf16 | fp16 (16-bit parameters and activations, fp32 main params)
  // FP8 training (Megatron's flags and defaults; docs/FP8.md): the linear layers' GEMMs in FP8 when
  // fp8_format is set (e4m3 | hybrid); emulated bit for bit on the CPU.
  std::string fp8_format;                          // empty: off
  std::string fp8_recipe = "delayed";              // delayed | tensorwise | blockwise | mxfp8
  int fp8_margin = 0;
  int fp8_amax_history_len = 1;
  std::string fp8_amax_compute_algo = "most_recent";  // most_recent | max
  bool first_last_layers_bf16 = false;
  int num_layers_at_start_in_bf16 = 1;
  int num_layers_at_end_in_bf16 = 1;
  int fp8_block_size = 128;  // --fp8-recipe blockwise: the block length (128 as DeepSeek-V3; smaller on CPU threads)
  bool fp8_cache_weights = true;  // (tests) off: each FP8 weight is cast per GEMM instead of once per step
  std::string fp8_forward_accumulation = "split";  // --fp8-forward-accumulation: split or fast (Fp8Accumulation)
  std::string fp8_weight_cache = "auto";  // --fp8-weight-cache: both, transposed, none, or auto (fp8_keeps_forward_weight_codes)
  bool fp8_param_gather = false;  // --fp8-param-gather: the distributed optimizer casts its shards and gathers FP8 codes
  bool fp8_recast_attention_output = false;  // --fp8-recast-attention-output (Fp8Options::recast_attention_output)
  bool fp8_experts = true;                   // --no-fp8-experts turns it off (Fp8Options::experts)
  bool fp8_norm_writes_codes = true;         // --no-fp8-norm-writes-codes turns it off (Fp8Options::norm_writes_codes)
  bool fp8_attention_writes_grad_codes = true;  // --no-fp8-attention-writes-grad-codes (Fp8Options::attention_writes_grad_codes)
  bool fp8_activation_codes_in_backward = false;  // --fp8-activation-codes-in-backward (Fp8Options::activation_codes_in_backward)
  // model
  models::ModelConfig model = command_line_model();
  data::TokenizerOptions tokenizer{};  // --tokenizer-type and its files; the end-of-document id comes from it
  // mixture of experts: the router's settings are model.moe's; these are the flags' own forms
  std::string moe_token_dispatcher_type = "allgather";  // Megatron's default
  std::string moe_flex_dispatcher_backend;              // --moe-flex-dispatcher-backend (flex: strata's all-to-all)
  std::string moe_router_load_balancing_type = "aux_loss";
  std::string moe_router_score_function = "softmax";
  std::string moe_token_drop_policy = "probs";
  std::string moe_router_dtype;  // --moe-router-dtype fp32 | fp64 (empty: not given, Megatron's None)
  std::string window_size;            // --window-size: Megatron's (left,right) tuple; empty: no sliding window
  std::string window_attn_skip_freq;  // --window-attn-skip-freq: N, or a list of 1 (window) / 0 (full) per layer
  std::string moe_layer_freq = "1";  // N (layer l is MoE when l % N == 0), or a Python list of 1 (MoE) / 0 (dense) per layer
  // training
  int micro_batch_size = 4;
  int global_batch_size = 8;  // parse_command_line: micro-batch x data parallel when not given, as Megatron
  int train_iters = 300;      // or, with --train-samples, as many as those samples take
  std::int64_t train_samples = 0;
  std::string step_batch_size_schedule;    // "THRESHOLD:BATCH ...", thresholds in tokens (K, M, B, T suffixes)
  std::vector<std::int64_t> rampup_batch_size;  // start, increment, samples (Megatron's older ramp-up)
  double lr = 2e-3;
  double min_lr = 0.0;
  std::string lr_decay_style = "linear";
  int lr_warmup_iters = 0;
  int lr_decay_iters = 0;               // 0: --train-iters
  std::int64_t lr_warmup_samples = 0;
  std::int64_t lr_decay_samples = 0;    // 0: --train-samples
  double lr_warmup_fraction = -1;       // < 0: not given; else warmup = fraction x decay
  double lr_warmup_init = 0;  // --lr-warmup-init: the learning rate warmup starts from
  double decoupled_lr = -1, decoupled_min_lr = -1;  // < 0: not given (the embedding and output layer's own rates)
  double weight_decay = 0.01;
  double clip_grad = 1.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  bool eod_mask_loss = false;
  int exit_interval = 0;               // > 0: save (with --save) and stop after an iteration that is a multiple
  double exit_duration_in_mins = 0;    // > 0: save (with --save) and stop once training has run this long
  double distributed_timeout_minutes = 10;  // a collective waiting longer fails, naming the ranks it waits for
  double progress_timeout_minutes = 0;      // > 0: no iteration finished for this long ends the run (0: off)
  bool log_straggler = false;               // min / median / max step time over the ranks at each log step
  int straggler_minmax_count = 1;           // how many slowest (and fastest) ranks --log-straggler names
  bool disable_straggler_on_startup = false;  // --log-straggler leaves out the first log interval (start-up)
  bool log_throughput = false;
  // data, checkpoints, logging
  std::string data_path = STRATA_DEFAULT_DATA_PATH;
  bool mock_data = false;         // Megatron's mock documents (counting sequences + EOD) instead of --data-path
  bool mock_data_random = false;  // uniformly random tokens instead of --data-path (benchmarks)
  std::string split = "969,30,1";  // train, validation, test parts of every dataset (by sequence)
  int eval_interval = 0;  // 0: only at the end (Megatron's None)
  int eval_iters = 100;
  std::string save, load;
  int save_interval = 0;
  int ckpt_step = -1;          // load this iteration instead of the tracker's
  bool no_load_optim = false;  // load the model alone; the optimizer starts fresh over it
  bool no_load_rng = false;    // accepted: strata's randomness is a function of --seed and the iteration
  bool finetune = false;       // load the model alone and start at iteration 0
  bool async_save = false;     // write checkpoint files in the background while training goes on
  std::string load_hf;         // start from Hugging Face transformers weights (when --load has no checkpoint)
  std::string save_hf;         // write the trained model in transformers' format at the end
  std::string ckpt_format = "strata";
  std::uint64_t seed = 1234;
  int log_interval = 100;
  int sample_tokens = 160;  // tokens generated after training (with the tokenizer's decode); 0: none
  std::string sample_prompt = "And God said";
  double sample_temperature = 0.7;
  std::string log_jsonl;
  std::string tensorboard_dir;  // TensorBoard event files (rank 0)
  std::string wandb_project, wandb_exp_name, wandb_save_dir;  // refused: Weights & Biases needs a network
  bool quiet = false;
  bool check_for_nan_in_loss_and_grad = true;  // stop at the first non-finite loss or gradient norm
  // false (--no-deterministic-attention): cuDNN's attention backward may add dQ up in any order
  // (atomics), which is faster and makes runs differ in the last bits; every other kernel stays
  // deterministic. A no-op on the CPU and on the flash kernels.
  bool deterministic_attention = true;
  // --gemm-tuning FILE: cuBLASLt algorithms chosen by timing, once per GEMM problem, and kept in
  // FILE (gemm_tuning.hpp): a run that finds FILE uses its choices and gives the bits of the run
  // that wrote it. With several ranks each uses FILE.rank<R>. Empty: the heuristic's first choice.
  // A no-op on the CPU.
  std::string gemm_tuning;
  bool keep_final_parameters = false;           // (tests) return the trained parameters, gathered, in TrainResult
  // --profile: cudaProfilerStart before iteration profile_step_start and cudaProfilerStop after
  // iteration profile_step_end - 1 (Megatron's flags), for a tracer or profiler to bracket those
  // iterations (bench/kernel_trace.cpp reads the window; it is told the step count through
  // STRATA_TRACE_STEPS); a no-op on the CPU.
  bool profile = false;
  int profile_step_start = 10, profile_step_end = 12;
  // data parallelism, mixed precision, activation recompute (data_parallel.hpp, models/recompute.hpp)
  bool use_distributed_optimizer = false;
  int num_distributed_optimizer_instances = 1;  // Megatron's default; others are refused
  bool overlap_grad_reduce = false;    // bucket collectives during the backward, on the communication stream
  bool overlap_param_gather = false;   // the distributed optimizer's all-gather on the communication stream
  std::int64_t ddp_bucket_size = 0;    // elements per gradient bucket; 0: max(40M, 1M x dp)
  bool zero_gradients_by_fill = false; // fill every gradient at each iteration's start (else: first write)
  bool dynamic_loss_scale = false;     // the dynamic loss scaler over any --dtype (--fp16 sets it; fp16 always scales)
  double loss_scale = 0;               // > 0: a constant loss scale instead of the dynamic one
  double initial_loss_scale = 4294967296.0;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1.0;
  bool skip_nonfinite_iterations = false;  // skip the update of a non-finite iteration instead of stopping
  std::string recompute_granularity;       // "", selective, full
  std::string recompute_modules;           // --recompute-modules (selective): Megatron's names, space-separated
  std::string recompute_method = "uniform";
  int recompute_num_layers = 1;
  int inject_nonfinite_gradient_at = -1;   // (tests) iteration (0-based) whose gradients are set to inf
  // Megatron flags given that strata accepts but treats differently (one line each, printed at start),
  // and those whose feature strata lacks (validate refuses the run with the first).
  std::vector<std::string> notes, refused;
};

// The most tokens --sample-tokens may ask for (each one is a forward pass).
inline constexpr int kMaxSampleTokens = 1 << 20;
// The demo configuration the library's tests start from (the README's demo command passes the same
// values as flags): tensor parallel 2 with sequence parallelism, no dropout, a short cosine schedule
// with warmup, AdamW as GPT-2 and Llama were trained, frequent logs and short evaluations.
inline TrainArgs default_args(std::string kind) {
  TrainArgs a;
  a.model_kind = kind;
  if (kind == "llama") {
    a.architecture = ArchitectureArgs::llama();
    a.architecture.group_query_attention = true;
  }
  a.model = command_line_model();
  a.model.num_query_groups = kind == "llama" ? 2 : 0;
  a.model.hidden_dropout = 0;
  a.model.attention_dropout = 0;
  a.tensor_model_parallel_size = 2;
  a.sequence_parallel = true;
  a.lr_decay_style = "cosine";
  a.lr_warmup_iters = 10;
  a.min_lr = 2e-4;
  a.weight_decay = 0.1;
  a.adam_beta2 = 0.95;
  a.log_interval = 10;
  a.eval_interval = 100;
  a.eval_iters = 5;
  a.distributed_timeout_minutes = 0;  // the communicators' own default
  return a;
}

// The flags of data parallelism at scale, mixed precision and activation recompute (Megatron's names).
inline void add_data_parallel_options(CLI::App& app, TrainArgs& a) {
  app.add_option("--num-distributed-optimizer-instances", a.num_distributed_optimizer_instances,
                 "copies of the distributed optimizer over data parallelism: 1 (the default, one ZeRO-1 shard per rank)");
  app.add_flag("--use-distributed-optimizer", a.use_distributed_optimizer,
               "shard the optimizer state over data parallelism (ZeRO-1): gradient buckets are reduce-scattered, each "
               "rank updates its shard (fp32 main weights and Adam moments for it only) and the parameters are "
               "all-gathered");
  app.add_flag("--overlap-grad-reduce", a.overlap_grad_reduce,
               "start each gradient bucket's all-reduce (reduce-scatter with --use-distributed-optimizer) during the "
               "backward, as soon as its gradients are final, on a communication stream beside the compute (NCCL; on "
               "the CPU the in-process collectives run at once, in the same order)");
  app.add_flag("--zero-gradients-by-fill", a.zero_gradients_by_fill,
               "fill every gradient with zeros at the start of each iteration; by default the linear layers' and the "
               "experts' weight gradients are not filled, their first weight-gradient GEMM of the iteration writes them "
               "instead of adding (the same bits, one pass over the gradients less)");
  app.add_flag("--overlap-param-gather", a.overlap_param_gather,
               "with --use-distributed-optimizer: all-gather the updated parameters on the communication stream, the "
               "buckets the next forward needs first going first, joined right before that forward");
  app.add_option("--ddp-bucket-size", a.ddp_bucket_size,
                 "gradient elements per bucket before padding (0: max(40M, 1M x data-parallel size))");
  app.add_flag_callback(
      "--fp16",
      [&a] {
        a.dtype = "fp16";
        a.dynamic_loss_scale = true;
      },
      "fp16 parameters and activations (fp32 main parameters and moments) with the dynamic loss scaler, which skips an "
      "iteration whose gradients overflow and backs the scale off (Megatron's flag; same as --dtype fp16)");
  app.add_option("--loss-scale", a.loss_scale,
                 "a constant loss scale (> 0) instead of the dynamic one; also over float, double or bf16");
  app.add_option("--initial-loss-scale", a.initial_loss_scale, "the dynamic loss scale at the start (default 2^32)");
  app.add_option("--loss-scale-window", a.loss_scale_window, "iterations without overflow before the scale doubles");
  app.add_option("--hysteresis", a.hysteresis, "overflowing iterations before the scale halves");
  app.add_option("--min-loss-scale", a.min_loss_scale, "the dynamic scale never goes below this");
  app.add_flag("--skip-nonfinite-iterations", a.skip_nonfinite_iterations,
               "an iteration whose loss or gradient norm is NaN or infinite makes no update, is reported with its number "
               "at the next log step, and training goes on (default: the run stops there)");
  app.add_option("--recompute-granularity", a.recompute_granularity,
                 "activation recompute: selective (the attention core) or full (whole layers, see --recompute-method)")
      ->check(CLI::IsMember({"", "none", "selective", "full"}));
  app.add_option("--recompute-method", a.recompute_method,
                 "full recompute: uniform (chunks of --recompute-num-layers layers keep only their input) or block "
                 "(the first --recompute-num-layers layers are recomputed)")
      ->check(CLI::IsMember({"uniform", "block"}));
  app.add_option("--recompute-num-layers", a.recompute_num_layers, "layers per chunk (uniform) or recomputed layers (block)");
}

// Whether the space-separated --recompute-modules list names `module`.
inline bool names_recompute_module(const std::string& modules, const std::string& module) {
  std::istringstream in(modules);
  for (std::string name; in >> name;)
    if (name == module) return true;
  return false;
}

// The recompute configuration of the flags.
inline models::RecomputeConfig recompute_of(const TrainArgs& a) {
  models::RecomputeConfig c;
  c.granularity = models::parse_recompute_granularity(a.recompute_granularity);
  c.method = models::parse_recompute_method(a.recompute_method);
  c.num_layers = a.recompute_num_layers;
  if (!a.recompute_modules.empty()) {  // selective: the modules named (resolve_recompute_modules), else core_attn alone
    c.attention_core = names_recompute_module(a.recompute_modules, "core_attn");
    c.moe_activation = names_recompute_module(a.recompute_modules, "moe_act");
    c.moe_block = names_recompute_module(a.recompute_modules, "moe");
  }
  return c;
}


// Whether the dynamic loss scaler runs: fp16 always has a scaler (dynamic unless --loss-scale), the
// other types when asked (TrainArgs::dynamic_loss_scale).
inline bool dynamic_loss_scaling(const TrainArgs& a) {
  return a.loss_scale <= 0 && (a.dynamic_loss_scale || a.dtype == "fp16");
}

// The loss scaler of the flags: none for float, double and bf16 without --loss-scale.
inline std::optional<LossScalerConfig> loss_scaler_of(const TrainArgs& a) {
  if (!dynamic_loss_scaling(a) && a.loss_scale <= 0) return std::nullopt;
  LossScalerConfig c;
  if (a.loss_scale > 0) {
    c.dynamic = false;
    c.initial_scale = a.loss_scale;
    c.min_scale = std::min(a.min_loss_scale, a.loss_scale);
  } else {
    c.initial_scale = a.initial_loss_scale;
    c.min_scale = a.min_loss_scale;
    c.growth_interval = a.loss_scale_window;
    c.hysteresis = a.hysteresis;
  }
  return c;
}

// A flag of one string that also takes several arguments, joined by spaces, as Megatron's
// launch scripts pass them (an array expanded unquoted); a repeated flag takes its last occurrence.
inline CLI::Option* add_joined_option(CLI::App& app, const std::string& name, std::string& target, const std::string& help) {
  return app
      .add_option_function<std::vector<std::vector<std::string>>>(
          name,
          [&target](const std::vector<std::vector<std::string>>& occurrences) {
            target.clear();
            for (const std::string& part : occurrences.back()) target += (target.empty() ? "" : " ") + part;
          },
          help)
      ->expected(1, CLI::detail::expected_max_vector_size)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

// The tokenizer of the flags: --vocab-size is NullTokenizer's own; with another tokenizer it is the
// model's vocabulary (resolve_run), not the tokenizer's.
inline data::TokenizerOptions tokenizer_options_of(const TrainArgs& a) {
  data::TokenizerOptions options = a.tokenizer;
  if (options.type != "NullTokenizer") options.vocab_size = 0;
  return options;
}

// Megatron flags beyond the ones strata implements: accepted ones change nothing in strata (each
// says why when given), refused ones name the feature strata does not have. A value-taking flag
// takes one value, as in Megatron.
struct MegatronFlagNote {
  const char* flag;
  bool takes_value;
  bool refused;
  const char* note;
};
inline constexpr MegatronFlagNote kMegatronFlagNotes[] = {
    {"--use-mcore-models", false, false, "strata's layers are its own; the flag changes nothing"},
    {"--transformer-impl", true, false, "strata's layers are its own (no Transformer Engine); the flag changes nothing"},
    {"--attention-backend", true, false, "attention is always fused (cuDNN or strata's flash kernels on GPUs)"},
    {"--use-flash-attn", false, false, "attention is always fused (cuDNN or strata's flash kernels on GPUs)"},
    {"--attention-softmax-in-fp32", false, false, "the attention softmax always runs in fp32"},
    {"--no-masked-softmax-fusion", false, false, "a kernel-fusion choice; strata's kernels are fixed"},
    {"--no-bias-gelu-fusion", false, false, "a kernel-fusion choice; strata's kernels are fixed"},
    {"--no-bias-dropout-fusion", false, false, "a kernel-fusion choice; strata's kernels are fixed"},
    {"--no-bias-swiglu-fusion", false, false, "a kernel-fusion choice; strata's kernels are fixed"},
    {"--no-rope-fusion", false, false, "a kernel-fusion choice; strata's kernels are fixed"},
    {"--no-gradient-accumulation-fusion", false, false, "a kernel-fusion choice; weight gradients always accumulate in fp32"},
    {"--cross-entropy-loss-fusion", false, false, "the output layer and the loss are always fused"},
    {"--calculate-per-token-loss", false, false, "strata always weighs every token by 1 / tokens of the global batch"},
    {"--manual-gc", false, false, "there is no garbage collector in a C++ trainer"},
    {"--manual-gc-interval", true, false, "there is no garbage collector in a C++ trainer"},
    {"--empty-unused-memory-level", true, false, "the caching allocator keeps its memory"},
    {"--no-create-attention-mask-in-dataloader", false, false, "no attention mask is ever built (causal attention)"},
    {"--no-mmap-bin-files", false, false, "strata maps the .bin files; the flag changes nothing"},
    {"--num-workers", true, false, "each rank builds its batches on the host, without loader workers"},
    {"--data-cache-path", true, false, "sample indices are built in memory, not cached on disk"},
    {"--tiktoken-pattern", true, false, "only TikTokenizer reads it, which strata does not have"},
    {"--distributed-backend", true, false, "the communicator follows --device (NCCL on cuda, threads on cpu)"},
    {"--log-timers-to-tensorboard", false, false, "strata logs the step time as throughput"},
    {"--log-validation-ppl-to-tensorboard", false, false, "validation perplexity is always logged"},
    {"--log-memory-to-tensorboard", false, false, "peak device memory is always logged on GPUs"},
    {"--log-params-norm", false, false, "not logged; the gradient norm is"},
    {"--timing-log-level", true, false, "strata logs one step time"},
    {"--grad-reduce-in-bf16", false, false, "gradients are accumulated and reduced in fp32"},
    {"--rotary-seq-len-interpolation-factor", true, true, "RoPE interpolation is not available"},
    {"--use-torch-fsdp2", false, true, "FSDP is not available (use --use-distributed-optimizer)"},
    {"--use-megatron-fsdp", false, true,
     "Megatron-FSDP is not available; --use-distributed-optimizer shards the optimizer state over data parallelism (ZeRO-1)"},
    {"--data-parallel-sharding-strategy", true, true,
     "FSDP's sharding is not available; --use-distributed-optimizer shards the optimizer state over data parallelism (ZeRO-1)"},
    {"--init-model-with-meta-device", false, true,
     "meta-device initialization belongs to FSDP, which is not available; use --use-distributed-optimizer"},
    {"--fsdp-double-buffer", false, true, "FSDP is not available; use --use-distributed-optimizer"},
    {"--accumulate-allreduce-grads-in-fp32", false, false, "gradients are always accumulated and all-reduced in fp32"},
    {"--logging-level", true, false, "strata prints its notes, warnings and errors at one level; the flag changes nothing"},
    {"--log-num-zeros-in-grad", false, false, "not logged; the gradient norm is"},
    {"--enable-experimental", false, false, "strata has no experimental features behind a switch; the flag changes nothing"},
    {"--moe-per-layer-logging", false, false, "the router losses are logged for the whole model, not per layer"},
    {"--disable-bf16-reduced-precision-matmul", false, false,
     "strata's GEMMs compute in fp32 (cuBLASLt's CUBLAS_COMPUTE_32F); PyTorch's reduced-precision switch does not exist here"},
    {"--auto-detect-ckpt-format", false, false, "strata loads its own checkpoint format (--load-hf reads Hugging Face weights)"},
    {"--dist-ckpt-strictness", true, false,
     "strata's loader checks the architecture and every tensor's name and shape before reading; a mismatch is an error"},
    {"--moe-grouped-gemm", false, false, "the experts always run as grouped GEMMs"},
    {"--moe-permute-fusion", false, false,
     "always on: the permutation is one gather kernel (moe_gather_rows) and the unpermutation sums each token's expert "
     "outputs times its routing probabilities in one kernel (moe_combine, and its backward)"},
    {"--moe-router-fusion", false, false,
     "always on: the router's score function, top-k, normalization and scaling run as one kernel (moe_router_forward)"},
    {"--cuda-graph-impl", true, false, "strata launches its kernels without CUDA graphs; the flag changes nothing"},
    {"--export-force-local-attention", false, false,
     "a choice of attention module for ModelOpt's export; strata's attention is one module"},
    {"--record-memory-history", false, false, "PyTorch's allocator history; strata logs the peak device memory instead"},
    {"--memory-snapshot-path", true, false, "PyTorch's allocator snapshot; strata logs the peak device memory instead"},
    {"--profile-ranks", true, false, "--profile brackets the profiled iterations on every rank"},
    {"--use-nccl-ub", false, false, "NCCL user-buffer registration is a transport choice; the flag changes nothing"},
    {"--use-precision-aware-optimizer", false, false,
     "strata's optimizer keeps fp32 main parameters, gradients and moments, which is what the precision-aware optimizer "
     "keeps with its default dtypes"},
    {"--fsdp-manual-registration", false, true, "FSDP is not available; use --use-distributed-optimizer"},
    {"--fsdp-db-use-persist-buf-on-alloc-fail", false, true, "FSDP is not available; use --use-distributed-optimizer"},
    {"--megatron-fsdp-grad-comm-dtype", true, true, "Megatron-FSDP is not available; use --use-distributed-optimizer"},
    {"--megatron-fsdp-main-grads-dtype", true, true, "Megatron-FSDP is not available; use --use-distributed-optimizer"},
    {"--megatron-fsdp-main-params-dtype", true, true, "Megatron-FSDP is not available; use --use-distributed-optimizer"},
    {"--megatron-fsdp-max-pool-double-buffer", false, true, "Megatron-FSDP is not available; use --use-distributed-optimizer"},
    {"--outer-dp-sharding-strategy", true, true,
     "FSDP's sharding is not available; --use-distributed-optimizer shards the optimizer state over data parallelism (ZeRO-1)"},
};

// Megatron's FP8 flags (docs/FP8.md).
inline void add_fp8_options(CLI::App& app, TrainArgs& a) {
  app.add_option("--fp8-format", a.fp8_format,
                 "run the transformer layers' linear GEMMs in FP8: e4m3 (every tensor E4M3) or hybrid (E4M3 forward, E5M2 "
                 "gradients); emulated exactly on the CPU")
      ->check(CLI::IsMember({"e4m3", "hybrid"}));
  app.add_option("--fp8-recipe", a.fp8_recipe,
                 "delayed (scales from an amax history, the default), tensorwise (the amax of each tensor now), "
                 "blockwise (DeepSeek-V3's 1x128 runs and 128x128 weight tiles, each with its own scale; cuBLASLt's "
                 "block-scaled GEMM on GPUs); mxfp8 needs Blackwell")
      ->check(CLI::IsMember({"delayed", "tensorwise", "blockwise", "mxfp8"}));
  app.add_option("--fp8-block-size", a.fp8_block_size,
                 "--fp8-recipe blockwise: the length of a block (1 x B runs, B x B weight tiles); 128 (DeepSeek-V3's, "
                 "cuBLASLt's), smaller for small models on CPU threads");
  app.add_option("--fp8-weight-cache", a.fp8_weight_cache,
                 "what each FP8 layer keeps of its weight's codes for the step: both layouts (1 byte per weight each), "
                 "transposed (W^T for the input gradient; a later forward casts W again), none (every GEMM casts its "
                 "weight: the least memory, one more weight cast a micro-batch), or auto (the default: both when a step "
                 "runs a layer's forward more than once, micro-batches or full recompute; else transposed)")
      ->check(CLI::IsMember({"auto", "both", "transposed", "none"}));
  app.add_option("--fp8-forward-accumulation", a.fp8_forward_accumulation,
                 "how the GPU's tensor cores accumulate the forward FP8 GEMM: split (promoted to fp32 at intervals, as the "
                 "gradient GEMMs always are; the default) or fast (cuBLASLt's FAST_ACCUM, as Transformer Engine's and "
                 "torchao's forward: no faster on an H100, ten times the error); the CPU sums exactly either way")
      ->check(CLI::IsMember({"fast", "split"}));
  app.add_flag("--fp8-param-gather", a.fp8_param_gather,
               "with --use-distributed-optimizer: each rank casts its shard of the FP8 layers' weights to FP8 after the "
               "step and the parameter all-gather moves those codes (a byte per weight instead of two); the layers read "
               "their weights' codes from there (delayed and tensorwise recipes)");
  app.add_flag("--fp8-recast-attention-output", a.fp8_recast_attention_output,
               "delayed and tensorwise recipes: the attention's output projection keeps no FP8 codes of its input for the "
               "weight gradient; it reads the attention's output, which the attention keeps anyway, and casts it again "
               "in the backward (the same codes): a byte per element of that input per layer saved, one more cast per "
               "layer in the backward");
  app.add_flag("--fp8-experts,!--no-fp8-experts", a.fp8_experts,
               "delayed recipe: whether the MoE layers' experts run their GEMMs in FP8 too (default on; off keeps them in the "
               "element type; FP8 experts need the counts on the host where the dispatcher does not have them)");
  app.add_flag("--fp8-norm-writes-codes,!--no-fp8-norm-writes-codes", a.fp8_norm_writes_codes,
               "delayed recipe: the norms before the attention's qkv and a dense MLP's fc1 write their output as those "
               "layers' FP8 codes in their own pass (default on; off: the norm writes the element type and the linear "
               "layer casts it, the same codes one pass later)");
  app.add_flag("--fp8-attention-writes-grad-codes,!--no-fp8-attention-writes-grad-codes", a.fp8_attention_writes_grad_codes,
               "delayed recipe: the attention's merge of dq, dk and dv (with RoPE's backward) writes the qkv projection's "
               "output-gradient FP8 codes in its own pass (default on; off: the merge writes the element type and the "
               "layer casts it, the same codes one pass later)");
  app.add_flag("--fp8-activation-codes-in-backward,!--no-fp8-activation-codes-in-backward",
               a.fp8_activation_codes_in_backward,
               "delayed recipe, a dense MLP with GELU or SwiGLU: fc2 keeps no FP8 codes of its input for the weight gradient; "
               "fc1's output-gradient cast, which reads fc1's output anyway, writes them in the backward (the same codes): "
               "a byte per element of the activation per layer not kept (default off: fc2's forward casts and keeps them; "
               "the run is the same bit for bit on CPU threads, and the CUDA kernels have not run on a GPU yet)");
  app.add_option("--fp8-margin", a.fp8_margin, "delayed scaling: scale = (fp8 max / amax) / 2^margin (default 0)");
  app.add_option("--fp8-amax-history-len", a.fp8_amax_history_len, "delayed scaling: steps of amax history kept (default 1)");
  app.add_option("--fp8-amax-compute-algo", a.fp8_amax_compute_algo,
                 "delayed scaling: the amax of the history's window (max) or of the last step (most_recent, the default)")
      ->check(CLI::IsMember({"most_recent", "max"}));
  app.add_flag("--first-last-layers-bf16", a.first_last_layers_bf16,
               "with --fp8-format: keep the first and last transformer layers out of FP8");
  app.add_option("--num-layers-at-start-in-bf16", a.num_layers_at_start_in_bf16,
                 "with --first-last-layers-bf16: how many first layers stay out of FP8 (default 1)");
  app.add_option("--num-layers-at-end-in-bf16", a.num_layers_at_end_in_bf16,
                 "with --first-last-layers-bf16: how many last layers stay out of FP8 (default 1)");
}

// The FP8 options of the flags; nullopt without --fp8-format. Throws ConfigError for a recipe or
// value that cannot run.
inline int data_parallel_size_of(const TrainArgs& a);

// Whether the FP8 layers keep their weights' forward codes for the step (Fp8Options::
// cache_forward_weights): --fp8-weight-cache both, or auto where a step runs a layer's forward more
// than once (micro-batches, full recompute, the MoE block's recompute).
inline bool fp8_keeps_forward_weight_codes(const TrainArgs& a) {
  if (a.fp8_weight_cache != "auto") return a.fp8_weight_cache == "both";
  const int dp = data_parallel_size_of(a);
  const std::int64_t per_micro_step = std::int64_t{a.micro_batch_size} * std::max(dp, 1);
  const std::int64_t micro_batches = per_micro_step > 0 ? a.global_batch_size / per_micro_step : 1;
  return micro_batches > 1 || a.recompute_granularity == "full" ||
         (a.recompute_granularity == "selective" && names_recompute_module(a.recompute_modules, "moe"));
}

inline std::optional<Fp8Options> fp8_options_of(const TrainArgs& a) {
  if (a.fp8_format.empty()) return std::nullopt;
  Fp8Options o;
  o.format = a.fp8_format == "e4m3" ? Fp8Formats::e4m3 : Fp8Formats::hybrid;
  o.recipe = a.fp8_recipe == "tensorwise"  ? Fp8RecipeKind::tensorwise
             : a.fp8_recipe == "blockwise" ? Fp8RecipeKind::blockwise
             : a.fp8_recipe == "mxfp8"     ? Fp8RecipeKind::mxfp8
                                           : Fp8RecipeKind::delayed;
  o.margin = a.fp8_margin;
  o.amax_history_len = a.fp8_amax_history_len;
  o.amax_compute_algo = a.fp8_amax_compute_algo == "max" ? Fp8AmaxAlgo::max : Fp8AmaxAlgo::most_recent;
  o.first_last_layers_bf16 = a.first_last_layers_bf16;
  o.num_layers_at_start_in_bf16 = a.num_layers_at_start_in_bf16;
  o.num_layers_at_end_in_bf16 = a.num_layers_at_end_in_bf16;
  o.cache_weights = a.fp8_cache_weights && a.fp8_weight_cache != "none";
  o.cache_forward_weights = fp8_keeps_forward_weight_codes(a);
  o.recast_attention_output = a.fp8_recast_attention_output;
  o.experts = a.fp8_experts;
  o.norm_writes_codes = a.fp8_norm_writes_codes;
  o.attention_writes_grad_codes = a.fp8_attention_writes_grad_codes;
  o.activation_codes_in_backward = a.fp8_activation_codes_in_backward;
  o.forward_accumulation = a.fp8_forward_accumulation == "split" ? Fp8Accumulation::split : Fp8Accumulation::fast;
  o.block = a.fp8_block_size;
  o.validate();
  return o;
}

// cuBLASLt's FP8 GEMMs want every dimension a multiple of 16: checked before a GPU run allocates.
// The GEMMs of one rank: k = the hidden size, the tensor-parallel widths of the attention and MLP,
// and the rows of a micro-batch (the weight gradients sum over them); n = the same widths.
inline void check_fp8_gpu_shapes(const TrainArgs& a) {
  const auto& m = a.model;
  const std::int64_t tp = a.tensor_model_parallel_size, heads = m.num_attention_heads;
  const std::int64_t head = m.head_dim();  // --kv-channels, or hidden / heads
  const std::int64_t groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  const std::pair<std::string, std::int64_t> dims[] = {
      {"--hidden-size", m.hidden_size},
      {"--hidden-size / tensor-parallel size", m.hidden_size / tp},
      {"key/value heads x head size / tensor-parallel size", groups * head / tp},
      {"--ffn-hidden-size / tensor-parallel size", m.ffn() / tp},
      // the experts run FP8 under the delayed recipe (layers/moe/experts.hpp)
      {"the expert width (--moe-ffn-hidden-size or --ffn-hidden-size) / expert-tensor-parallel size",
       m.moe.enabled() && a.fp8_recipe == "delayed" && a.fp8_experts
           ? m.expert_ffn() / (a.expert_tensor_parallel_size > 0 ? a.expert_tensor_parallel_size : tp)
           : 16},
      {"--micro-batch-size x --seq-length", static_cast<std::int64_t>(a.micro_batch_size) * m.seq_length}};
  for (const auto& [what, value] : dims)
    if (value % 16 != 0)
      fail<ConfigError>("--fp8-format ", a.fp8_format, " on --device cuda: ", what, " is ", value,
                        ", not a multiple of 16, which cuBLASLt's FP8 GEMMs need; choose sizes that are, or train "
                        "without --fp8-format");
}

// Registers kMegatronFlagNotes: a given flag appends its sentence to a.notes or a.refused.
inline void add_megatron_flag_notes(CLI::App& app, TrainArgs& a) {
  for (const MegatronFlagNote& n : kMegatronFlagNotes) {
    const std::string flag = n.flag;
    auto record = [&a, n, flag](const std::string& value) {
      const std::string line = flag + (n.takes_value ? " " + value : std::string()) + ": " + n.note;
      (n.refused ? a.refused : a.notes).push_back(line);
    };
    if (n.takes_value)
      app.add_option_function<std::string>(flag, record, std::string(n.refused ? "not available: " : "accepted: ") + n.note);
    else
      app.add_flag_callback(flag, [record] { record(""); }, std::string(n.refused ? "not available: " : "accepted: ") + n.note);
  }
}

// Megatron's mixture-of-experts flags (docs/MOE.md): --num-experts > 0 makes every layer's MLP a
// MoeMlp (the Llama block: models::Mixtral); the rest map one to one onto ModelConfig::moe, the
// dispatcher type and the expert groups.
inline void add_moe_options(CLI::App& app, TrainArgs& a) {
  auto& m = a.model.moe;
  app.add_option("--num-experts", m.num_experts, "experts per MoE layer (0 or absent: a dense model)");
  app.add_option("--moe-router-topk", m.topk, "experts each token is routed to (default 2)");
  app.add_option("--moe-ffn-hidden-size", m.expert_ffn_hidden_size, "one expert's MLP width (default --ffn-hidden-size)");
  app.add_option("--moe-shared-expert-intermediate-size", m.shared_expert_ffn_hidden_size,
                 "width of the shared experts every token goes through (DeepSeek; default none)");
  app.add_flag("--moe-shared-expert-gate", m.shared_expert_gate,
               "scale the shared experts' output by sigmoid(x . w) per token, w a learned [1, hidden] weight (Qwen2-MoE)");
  app.add_option("--moe-router-score-function", a.moe_router_score_function, "softmax (default) or sigmoid scores")
      ->check(CLI::IsMember({"softmax", "sigmoid"}));
  app.add_flag("--moe-router-pre-softmax", m.routing.pre_softmax, "softmax over all experts before the top-k (softmax only)");
  app.add_option("--moe-router-topk-scaling-factor", m.routing.scaling_factor, "factor on the routing weights (default 1)");
  app.add_option("--moe-router-num-groups", m.routing.num_groups,
                 "group-limited routing (DeepSeek-V3): the experts form this many equal groups (default none)");
  app.add_option("--moe-router-group-topk", m.routing.group_topk,
                 "group-limited routing: the groups a token's experts are chosen from, those whose top topk / group-topk "
                 "scores sum highest");
  app.add_option("--moe-router-load-balancing-type", a.moe_router_load_balancing_type,
                 "aux_loss (default: Switch/GShard), seq_aux_loss (per sequence, DeepSeek-V2) or none")
      ->check(CLI::IsMember({"aux_loss", "seq_aux_loss", "none"}));
  app.add_option("--moe-aux-loss-coeff", m.aux_loss_coeff, "weight of the load-balancing loss (default 0; 1e-2 is usual)");
  app.add_option("--moe-z-loss-coeff", m.z_loss_coeff, "weight of the router z-loss (default none; 1e-3 is usual)");
  app.add_flag("--moe-router-enable-expert-bias", m.expert_bias,
               "aux-loss-free balancing (DeepSeek-V3): a per-expert bias steering the choice, moved by the load each step");
  app.add_option("--moe-router-bias-update-rate", m.expert_bias_update_rate, "step of the expert-bias update (default 1e-3)");
  app.add_option("--moe-expert-capacity-factor", m.capacity_factor,
                 "tokens an expert takes per rank: ceil(tokens x topk / experts x factor); the rest are dropped (default: no capacity)");
  app.add_option("--moe-token-drop-policy", a.moe_token_drop_policy, "over capacity, drop the lowest weights (probs) or the last tokens (position)")
      ->check(CLI::IsMember({"probs", "position"}));
  app.add_flag("--moe-pad-expert-input-to-capacity", m.pad_to_capacity, "pad every expert's input to its capacity");
  app.add_option("--moe-router-dtype", a.moe_router_dtype,
                 "fp32: the router's logits, softmax, top-k, losses and combine weights in fp32 (what strata's router "
                 "always does with bf16 / fp16 / float; fp64 with --dtype double)")
      ->check(CLI::IsMember({"fp32", "fp64"}));
  app.add_option("--moe-token-dispatcher-type", a.moe_token_dispatcher_type,
                 "allgather (default, as Megatron) or alltoall: how tokens reach the ranks holding their experts; flex "
                 "(DeepEP / HybridEP kernels in Megatron) runs the all-to-all dispatcher, the same exchange")
      ->check(CLI::IsMember({"allgather", "alltoall", "flex"}));
  app.add_option("--moe-flex-dispatcher-backend", a.moe_flex_dispatcher_backend,
                 "flex's kernels (deepep, hybridep, ncclep): with --moe-token-dispatcher-type flex, strata's all-to-all "
                 "dispatcher runs instead (a note says so)")
      ->check(CLI::IsMember({"deepep", "hybridep", "ncclep"}));
  app.add_flag("--moe-router-force-load-balancing", m.force_load_balancing,
               "benchmarks only: random router logits (per rank and step) balance the experts' loads; the gradient "
               "passes to the router's weight unchanged (Megatron's straight-through estimate)");
  app.add_option("--moe-layer-freq", a.moe_layer_freq,
                 "N: layer l (0-based) is a MoE layer when l % N == 0 (default 1: every layer); or a list of 1 (MoE) / 0 "
                 "(dense MLP of --ffn-hidden-size) per layer, e.g. ([0]*3+[1]*29)");
  app.add_option("--expert-model-parallel-size", a.expert_model_parallel_size,
                 "ranks of a pipeline stage the experts are spread over (divides --num-experts)");
  app.add_option("--expert-tensor-parallel-size", a.expert_tensor_parallel_size,
                 "ranks each expert is split over (default --tensor-model-parallel-size, as Megatron)");
}

// A per-layer 0/1 pattern written as Megatron's Python list expressions: "[1,1,0]*4", "[0]*3+[1]*5",
// "([1]*3+[0]*1)*3", "2*[0,1]"; ConfigError naming `flag` when it is not one. The grammar is that
// subset of Python: sum := product ('+' product)*, product := factor ('*' factor)*, factor :=
// '[' 0|1 (',' 0|1)* ']' | '(' sum ')' | count, a product holding exactly one list.
inline std::vector<int> parse_layer_pattern(const char* flag, const std::string& text) {
  std::string t;
  for (const char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  auto refuse = [&]() -> void {
    fail<ConfigError>(flag, " ", text, ": not a list of 0 and 1 such as [1,1,1,0]*3, [0]*2+[1]*6 or ([1]*3+[0])*2 (Megatron's syntax)");
  };
  constexpr std::size_t kMaxEntries = std::size_t{1} << 20;  // layers, far beyond any model
  std::size_t at = 0;
  // A factor: a list (has_list) or a count.
  struct Factor {
    std::vector<int> list;
    long count = 1;
    bool has_list = false;
  };
  std::function<std::vector<int>()> sum;
  auto factor = [&]() -> Factor {
    Factor f;
    if (at < t.size() && t[at] == '[') {
      ++at;
      while (true) {
        if (at >= t.size() || (t[at] != '0' && t[at] != '1')) refuse();
        f.list.push_back(t[at] - '0');
        ++at;
        if (at < t.size() && t[at] == ',') {
          ++at;
          if (at < t.size() && t[at] == ']') break;  // Python's trailing comma
          continue;
        }
        break;
      }
      if (at >= t.size() || t[at] != ']') refuse();
      ++at;
      f.has_list = true;
    } else if (at < t.size() && t[at] == '(') {
      ++at;
      f.list = sum();
      if (at >= t.size() || t[at] != ')') refuse();
      ++at;
      f.has_list = true;
    } else {
      const std::size_t begin = at;
      while (at < t.size() && std::isdigit(static_cast<unsigned char>(t[at]))) ++at;
      if (at == begin || at - begin > 7) refuse();
      f.count = std::stol(t.substr(begin, at - begin));
    }
    return f;
  };
  auto product = [&]() -> std::vector<int> {
    Factor f = factor();
    std::vector<int> list = f.list;
    bool has_list = f.has_list;
    long count = f.count;
    while (at < t.size() && t[at] == '*') {
      ++at;
      Factor g = factor();
      if (g.has_list) {
        if (has_list) refuse();  // list * list is no Python
        list = g.list;
        has_list = true;
      }
      count *= g.count;
      if (count > static_cast<long>(kMaxEntries)) refuse();
    }
    if (!has_list || list.size() * static_cast<std::size_t>(count) > kMaxEntries) refuse();
    std::vector<int> out;
    for (long r = 0; r < count; ++r) out.insert(out.end(), list.begin(), list.end());
    return out;
  };
  sum = [&]() -> std::vector<int> {
    std::vector<int> out = product();
    while (at < t.size() && t[at] == '+') {
      ++at;
      const std::vector<int> more = product();
      out.insert(out.end(), more.begin(), more.end());
      if (out.size() > kMaxEntries) refuse();
    }
    return out;
  };
  std::vector<int> out = sum();
  if (at != t.size() || out.empty()) refuse();
  return out;
}

// The MoE flags given as strings, settled into ModelConfig::moe (ConfigError for a --moe-layer-freq
// that is not Megatron's int or 0/1 list of --num-layers entries).
inline void resolve_moe_flags(TrainArgs& a) {
  auto& m = a.model.moe;
  m.routing.score = a.moe_router_score_function == "sigmoid" ? MoeScore::sigmoid : MoeScore::softmax;
  if (m.routing.pre_softmax && m.routing.score == MoeScore::sigmoid) {  // Megatron's router reads it with softmax only
    m.routing.pre_softmax = false;
    a.notes.emplace_back("--moe-router-pre-softmax: ignored with --moe-router-score-function sigmoid (it applies to softmax "
                         "scores only), as in Megatron");
  }
  m.load_balancing = a.moe_router_load_balancing_type == "none"           ? MoeLoadBalancing::none
                     : a.moe_router_load_balancing_type == "seq_aux_loss" ? MoeLoadBalancing::seq_aux_loss
                                                                          : MoeLoadBalancing::aux_loss;
  m.drop_policy = a.moe_token_drop_policy == "position" ? MoeDropPolicy::position : MoeDropPolicy::probability;
  m.token_dispatcher = a.moe_token_dispatcher_type == "allgather" ? MoeDispatcherType::allgather : MoeDispatcherType::alltoall;
  if (m.enabled() && a.moe_token_dispatcher_type == "flex")
    a.notes.emplace_back("--moe-token-dispatcher-type flex" +
                         (a.moe_flex_dispatcher_backend.empty() ? std::string()
                                                                : " (--moe-flex-dispatcher-backend " + a.moe_flex_dispatcher_backend + ")") +
                         ": strata's all-to-all dispatcher runs it (Megatron's flex is the same exchange through DeepEP / "
                         "HybridEP kernels): the same tokens reach the same experts");
  else if (!a.moe_flex_dispatcher_backend.empty())
    a.notes.emplace_back("--moe-flex-dispatcher-backend " + a.moe_flex_dispatcher_backend +
                         ": read with --moe-token-dispatcher-type flex only, as in Megatron; it changes nothing here");
  // --moe-router-dtype: the router computes in accumulate_t<T> (layers/moe/router.hpp): fp32 for
  // bf16, fp16 and float, fp64 for double. fp32 is what Megatron's flag asks for; fp64 is honoured
  // with --dtype double only.
  if (m.enabled() && a.moe_router_dtype == "fp64" && a.dtype != "double")
    a.notes.emplace_back("--moe-router-dtype fp64: the router computes in fp32 with --dtype " + a.dtype +
                         " (its logits, softmax, top-k, losses and combine weights); fp64 routing comes with --dtype double");
  if (m.enabled() && a.moe_router_dtype == "fp32" && a.dtype == "double")
    a.notes.emplace_back("--moe-router-dtype fp32: with --dtype double the router computes in fp64, as the whole model");
  m.layers.clear();
  if (!m.enabled()) return;  // a dense model reads no MoE flag
  // --moe-layer-freq: an int N (layer l is a MoE layer when l % N == 0, as Megatron) or a Python list
  // expression of 0/1 per layer ("[0]*3+[1]*29"), whose length must be --num-layers.
  std::string freq;
  for (const char c : a.moe_layer_freq)
    if (!std::isspace(static_cast<unsigned char>(c))) freq += c;
  if (freq.find('[') == std::string::npos) {
    long every = 0;
    std::size_t used = 0;
    try {
      every = std::stol(freq, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (freq.empty() || used != freq.size() || every < 1)
      fail<ConfigError>("--moe-layer-freq ", a.moe_layer_freq, ": not a whole number >= 1 (N: a MoE layer every N layers, "
                        "starting with the first) nor a list of 0 and 1 such as ([0]*3+[1]*29)");
    if (every == 1) return;  // every layer: the pattern stays empty
    for (int l = 0; l < a.model.num_layers; ++l) m.layers.push_back(l % every == 0 ? 1 : 0);
  } else {
    m.layers = parse_layer_pattern("--moe-layer-freq", freq);
    if (static_cast<int>(m.layers.size()) != a.model.num_layers)
      fail<ConfigError>("--moe-layer-freq ", a.moe_layer_freq, ": ", m.layers.size(), " entries for --num-layers ",
                        a.model.num_layers, "; give one 1 (MoE) or 0 (dense MLP) per layer");
  }
  if (std::find(m.layers.begin(), m.layers.end(), 1) == m.layers.end())
    fail<ConfigError>("--moe-layer-freq ", a.moe_layer_freq, " makes every layer dense; drop --num-experts for a dense "
                      "model, or mark at least one layer 1");
  if (std::find(m.layers.begin(), m.layers.end(), 0) == m.layers.end()) m.layers.clear();  // every layer: as "1"
}

// The data-parallel size: world / (tp x pp x cp).
inline int data_parallel_size_of(const TrainArgs& a) {
  const std::int64_t model = std::int64_t{a.tensor_model_parallel_size} * a.pipeline.pipeline_model_parallel_size *
                             a.context_parallel_size;
  return model > 0 ? static_cast<int>(a.world_size / model) : 0;
}

// The start-up line's words after cp=N: the comm type, and a2a+p2p's sizes ("" for cp = 1).
inline std::string context_parallel_label(const TrainArgs& a) {
  if (a.context_parallel_size <= 1) return "";
  std::string label = " " + a.cp_comm_type;
  if (a.hierarchical_cp_sizes.size() == 2)
    label += " " + std::to_string(a.hierarchical_cp_sizes[0]) + "x" + std::to_string(a.hierarchical_cp_sizes[1]);
  return label;
}

// --cp-comm-type as the layers' enum (the flag is checked by check_context_parallel_args).
inline ContextParallelComm context_parallel_comm_of(const TrainArgs& a) {
  return a.cp_comm_type == "a2a"         ? ContextParallelComm::a2a
         : a.cp_comm_type == "allgather" ? ContextParallelComm::allgather
         : a.cp_comm_type == "a2a+p2p"   ? ContextParallelComm::a2a_p2p
                                         : ContextParallelComm::p2p;
}

// ParallelConfig of the flags: tp, pp, cp, dp and the expert groups (etp defaults to tp, as Megatron).
inline ParallelConfig parallel_config_of(const TrainArgs& a) {
  const int tp = a.tensor_model_parallel_size, pp = a.pipeline.pipeline_model_parallel_size;
  const int dp = data_parallel_size_of(a);
  const int etp = a.expert_tensor_parallel_size > 0 ? a.expert_tensor_parallel_size : tp;
  return ParallelConfig{.tp = tp, .pp = pp, .dp = dp, .cp = a.context_parallel_size, .ep = a.expert_model_parallel_size,
                        .etp = a.model.moe.enabled() ? etp : 1};
}

inline void add_options(CLI::App& app, TrainArgs& a) {
  // A repeated flag takes its last value, as Megatron's argparse (CLI11 refuses it by default).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--world-size,--threads", a.world_size,
                 "ranks in total (cpu: threads; cuda: local GPUs, one thread each; set by the launcher under torchrun, "
                 "srun or mpirun); data parallel = world / (tensor x pipeline x context parallel)");
  app.add_option("--tensor-model-parallel-size", a.tensor_model_parallel_size, "tensor-parallel group size");
  app.add_option("--context-parallel-size", a.context_parallel_size,
                 "context-parallel group size: each sequence is cut into 2 x cp chunks, rank r holding chunks r and "
                 "2cp-1-r, and attention runs as a ring over the group (docs/CONTEXT_PARALLEL.md)");
  app.add_option("--cp-comm-type", a.cp_comm_type,
                 "how attention exchanges keys and values over the context-parallel group: p2p (ring attention, the "
                 "default), allgather (every rank's keys and values gathered at once), a2a (all-to-all to whole "
                 "sequences of heads / cp heads) or a2a+p2p (all-to-all inside groups of adjacent cp ranks, the ring "
                 "across them; with --hierarchical-context-parallel-sizes)");
  app.add_option("--hierarchical-context-parallel-sizes", a.hierarchical_cp_sizes,
                 "for --cp-comm-type a2a+p2p, two sizes whose product is --context-parallel-size: the all-to-all "
                 "groups of adjacent cp ranks, then the ring across them (Megatron's order)")
      ->expected(1, CLI::detail::expected_max_vector_size)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("--sequence-parallel,!--no-sequence-parallel", a.sequence_parallel, "shard norms and residuals on the sequence");
  app.add_flag("--tp-comm-overlap", a.tp_comm_overlap,
               "tensor-parallel collectives beside the GEMMs: the input all-gathers as rings whose arrived blocks "
               "are multiplied while the next arrives, the backward's collectives beside weight gradients "
               "(needs --sequence-parallel)");
  app.add_flag("--disable-tp-comm-overlap-ag", a.disable_tp_comm_overlap_ag,
               "with --tp-comm-overlap: the column-parallel layers' forward all-gathers run whole, not as rings beside "
               "the GEMMs (the backward still overlaps)");
  app.add_flag("--disable-tp-comm-overlap-rs", a.disable_tp_comm_overlap_rs,
               "with --tp-comm-overlap: the row-parallel layers' forward reduce-scatters run whole, not as rings beside "
               "the GEMMs (the backward still overlaps)");
  app.add_option("--tp-comm-overlap-gather", a.tp_comm_overlap_gather,
                 "with --tp-comm-overlap: the all-gathers beside GEMMs as one all-gather collective beside the GEMM "
                 "of this rank's own block, moved by the GPUs' copy engines so it takes no SMs from the GEMMs "
                 "(copy-engines, the default: NCCL 2.28 and GPUs that map each other's memory; elsewhere as "
                 "collective), as the same collective on NCCL's kernel (collective), or as a ring of point-to-point "
                 "exchanges, each arrived block multiplied beside the next (ring)")
      ->check(CLI::IsMember({"ring", "collective", "copy-engines"}));
  app.add_option("--tp-comm-overlap-sm-margin", a.tp_comm_overlap_sm_margin,
                 "with --tp-comm-overlap on GPUs: the GEMMs that run beside a collective are planned for this many "
                 "SMs fewer (cuBLASLt's SM count target), leaving them to the collective's kernel (default 0: all "
                 "SMs)")
      ->check(CLI::NonNegativeNumber);
  add_pipeline_options(app, a.pipeline);
  app.add_option("--device,--backend", a.device,
                 "cpu (threads) or cuda (NCCL, one GPU per rank); default: cuda when this binary was built with CUDA and a "
                 "GPU is present, else cpu")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--dtype", a.dtype,
                 "parameter and activation type (default: bf16 on cuda, float on cpu); fp16 runs with a loss scaler")
      ->check(CLI::IsMember({"float", "double", "bf16", "fp16"}));
  app.add_flag_callback("--bf16", [&a] { a.dtype = "bf16"; }, "same as --dtype bf16 (Megatron's flag)");
  add_fp8_options(app, a);
  app.add_option("--num-layers", a.model.num_layers);
  app.add_option("--hidden-size", a.model.hidden_size);
  app.add_option("--num-attention-heads", a.model.num_attention_heads);
  app.add_option("--num-query-groups", a.model.num_query_groups,
                 "key/value heads with --group-query-attention (without it every head has its own, as Megatron)");
  app.add_flag("--group-query-attention", a.architecture.group_query_attention,
               "grouped-query attention: --num-query-groups key/value heads");
  app.add_option("--ffn-hidden-size", a.model.ffn_hidden_size,
                 "MLP width; default (and 0) = 4 x --hidden-size, as Megatron's; without --hidden-size the demo uses 512 "
                 "(GPT) or 352 (Llama)");
  app.add_option("--seq-length", a.model.seq_length, "tokens per sample");
  app.add_option("--max-position-embeddings", a.model.max_position_embeddings,
                 "rows of the learned position table (>= --seq-length; default --seq-length)");
  app.add_option("--vocab-size", a.tokenizer.vocab_size,
                 "NullTokenizer: ids 0..N-1, the last of them (N-1) the end of document; another tokenizer: the model's vocabulary when larger "
                 "than the tokenizer's (default: the tokenizer's)");
  app.add_option("--tokenizer-type", a.tokenizer.type,
                 "ByteTokenizer (the default: bytes, end-of-document 256), GPT2BPETokenizer, HuggingFaceTokenizer, "
                 "SentencePieceTokenizer, Llama2Tokenizer, NullTokenizer");
  app.add_option("--vocab-file", a.tokenizer.vocab_file, "GPT2BPETokenizer: vocab.json");
  app.add_option("--merge-file", a.tokenizer.merge_file, "GPT2BPETokenizer: merges.txt");
  app.add_option("--tokenizer-model", a.tokenizer.tokenizer_model,
                 "HuggingFaceTokenizer: tokenizer.json (or its directory); SentencePiece/Llama2Tokenizer: tokenizer.model");
  app.add_option("--position-embedding-type", a.architecture.position_embedding_type,
                 "learned_absolute (GPT-2), rope (Llama), or yarn (rope with YaRN's frequency scaling)")
      ->check(CLI::IsMember({"learned_absolute", "rope", "mrope", "relative", "none", "yarn"}));
  app.add_flag_callback("--no-position-embedding", [&a] { a.architecture.add_position_embedding = false; },
                        "no learned position table (with --position-embedding-type rope)");
  app.add_option("--normalization", a.architecture.normalization, "LayerNorm (GPT-2) or RMSNorm (Llama)")
      ->check(CLI::IsMember({"LayerNorm", "RMSNorm"}));
  app.add_flag("--swiglu", a.architecture.swiglu, "SwiGLU MLP (Llama) instead of GELU");
  app.add_flag("--untie-embeddings-and-output-weights", a.architecture.untie_embeddings_and_output_weights,
               "an output layer of its own instead of the word embedding's transpose");
  app.add_flag("--disable-bias-linear", a.architecture.disable_bias_linear, "no biases in the linear layers");
  app.add_option("--kv-channels", a.model.kv_channels, "head size (default --hidden-size / --num-attention-heads)");
  app.add_option("--rotary-percent", a.model.rotary_percent, "the part of each head RoPE rotates (default 1.0)");
  app.add_flag("--rotary-interleaved", a.model.rotary_interleaved, "RoPE turns pairs of adjacent dimensions (GPT-J)");
  app.add_flag("--use-rope-scaling", a.architecture.use_rope_scaling, "Llama 3.1's RoPE frequency scaling");
  app.add_option("--rope-scaling-factor", a.architecture.rope_scaling_factor, "Llama 3.1's scaling factor (default 8)");
  app.add_option("--rotary-scaling-factor", a.architecture.rotary_scaling_factor,
                 "YaRN's scaling factor (with --position-embedding-type yarn; default 1, gpt-oss 32)");
  app.add_option("--yarn-original-max-position-embeddings", a.architecture.yarn_original_max_position_embeddings,
                 "YaRN: the context the model was trained at (default 4096)");
  app.add_option("--yarn-beta-fast", a.architecture.yarn_beta_fast, "YaRN: rotations over the original context below which "
                 "frequencies are kept (default 32)");
  app.add_option("--yarn-beta-slow", a.architecture.yarn_beta_slow, "YaRN: rotations above which frequencies are "
                 "interpolated (default 1)");
  app.add_option("--mscale", a.architecture.mscale, "YaRN's mscale of the attention factor (default 1)");
  app.add_option("--mscale-all-dim", a.architecture.mscale_all_dim, "YaRN's mscale_all_dim of the attention factor (default 0)");
  app.add_flag("--yarn-correction-range-round-to-int,!--no-yarn-correction-range-round-to-int",
               a.architecture.yarn_correction_range_round_to_int,
               "YaRN: round the correction range to whole dimensions (the default; gpt-oss turns it off)");
  app.add_flag("--enable-gpt-oss", a.architecture.enable_gpt_oss,
               "YaRN with gpt-oss's values (factor 32, original context 131072, beta 32 / 1, mscale 1 / 0, the range not "
               "rounded), set over the YaRN flags as Megatron's flag sets them");
  app.add_option("--softmax-type", a.architecture.softmax_type,
                 "attention softmax: vanilla, off-by-one (a zero logit in each denominator) or learnable (a learned logit "
                 "per head, gpt-oss's sinks)")
      ->check(CLI::IsMember({"vanilla", "off-by-one", "learnable"}));
  app.add_flag("--apply-layernorm-1p", a.model.apply_layernorm_1p, "norm weights stored as gamma - 1 (Nemotron)");
  app.add_flag("--qk-layernorm", a.model.qk_layernorm, "the model's norm over each head of q and k (Qwen3, OLMo 2)");
  app.add_flag("--add-qkv-bias", a.model.add_qkv_bias, "biases on q, k and v only (Qwen2)");
  app.add_flag("--squared-relu", a.architecture.squared_relu, "squared ReLU MLP (Nemotron)");
  app.add_flag("--quick-geglu", a.architecture.quick_geglu, "gated MLP with quick GELU (gpt-oss)");
  app.add_option("--activation-func-clamp-value", a.model.activation_clamp,
                 "clamp of the gated MLP's inputs (gpt-oss: 7.0; default none)");
  app.add_option("--glu-linear-offset", a.model.glu_linear_offset, "added to the gated MLP's linear half (gpt-oss: 1.0)");
  app.add_option("--window-size", a.window_size,
                 "sliding-window attention as Megatron's (left,right), e.g. \"(4095,0)\": query i sees keys i - left .. i "
                 "(right must be 0: attention is causal; left -1: no window)");
  app.add_option("--window-attn-skip-freq", a.window_attn_skip_freq,
                 "which layers keep full attention: N (every N-th layer), or a list of 1 (window) / 0 (full) per layer "
                 "such as \"[1,1,1,0]*6\" (default: every layer has the window)");
  app.add_option("--mtp-num-layers", a.model.mtp_num_layers,
                 "multi-token prediction depths after the head, each predicting one token further (DeepSeek-V3: 1; "
                 "default 0: none; a RoPE model)");
  app.add_option("--mtp-loss-scaling-factor", a.model.mtp_loss_scaling_factor,
                 "weight of the depths' mean loss in the objective (default 0.1)");
  app.add_flag("--multi-latent-attention", a.model.multi_latent_attention,
               "multi-latent attention (DeepSeek-V2/V3): queries, keys and values through low-rank latents (a RoPE model)");
  app.add_option("--q-lora-rank", a.model.q_lora_rank, "rank of the queries' latent (default: none, queries from the hidden state)");
  app.add_option("--kv-lora-rank", a.model.kv_lora_rank, "rank of the keys' and values' latent (default 32)");
  app.add_option("--qk-head-dim", a.model.qk_head_dim, "dimensions of a query/key head without RoPE (default 128)");
  app.add_option("--qk-pos-emb-head-dim", a.model.qk_pos_emb_head_dim,
                 "dimensions of a query/key head turned by RoPE, shared by the heads in k (default 64)");
  app.add_option("--v-head-dim", a.model.v_head_dim, "dimensions of a value head (default 128)");
  app.add_option("--rope-type", a.architecture.rope_type,
                 "RoPE of multi-latent attention: yarn (the default, with --rotary-scaling-factor, --mscale, --mscale-all-dim) or rope")
      ->check(CLI::IsMember({"rope", "yarn"}));
  app.add_option("--norm-epsilon", a.model.norm_epsilon, "epsilon of LayerNorm / RMSNorm");
  app.add_option("--attention-dropout", a.model.attention_dropout, "dropout on the attention probabilities (default 0.1)");
  app.add_option("--make-vocab-size-divisible-by", a.model.make_vocab_size_divisible_by);
  app.add_option("--init-method-std", a.model.init_method_std);
  app.add_option("--rotary-base", a.model.rope_base);
  app.add_option("--hidden-dropout", a.model.hidden_dropout,
                 "dropout on the embedding output and each block's output (default 0.1)");
  app.add_option("--label-smoothing", a.model.label_smoothing);
  app.add_option("--micro-batch-size", a.micro_batch_size);
  app.add_option("--global-batch-size", a.global_batch_size);
  app.add_option("--train-iters", a.train_iters);
  app.add_option("--lr", a.lr);
  app.add_option("--min-lr", a.min_lr);
  app.add_option("--lr-decay-style", a.lr_decay_style)->check(CLI::IsMember({"constant", "linear", "cosine"}));
  app.add_option("--lr-warmup-iters", a.lr_warmup_iters);
  app.add_option("--lr-decay-iters", a.lr_decay_iters, "0 = --train-iters");
  app.add_option("--train-samples", a.train_samples, "train on this many samples (instead of --train-iters)");
  app.add_option("--lr-warmup-samples", a.lr_warmup_samples, "samples of linear warmup (with --train-samples)");
  app.add_option("--lr-decay-samples", a.lr_decay_samples, "samples the learning rate decays over (0: --train-samples)");
  app.add_option("--lr-warmup-fraction", a.lr_warmup_fraction, "warmup as a fraction of the decay length");
  app.add_option("--lr-warmup-init", a.lr_warmup_init, "the learning rate warmup starts from (default 0)");
  app.add_option("--decoupled-lr", a.decoupled_lr, "the word embedding's and output layer's own peak learning rate");
  app.add_option("--decoupled-min-lr", a.decoupled_min_lr, "their minimum learning rate");
  app.add_option("--rampup-batch-size", a.rampup_batch_size,
                 "start increment samples: grow the global batch from start by increment over that many samples")
      ->expected(3);
  // One string, or (as Megatron's GPT-3 example script passes it, its array expanded unquoted) several arguments.
  add_joined_option(app, "--step-batch-size-schedule", a.step_batch_size_schedule,
                    "\"THRESHOLD:BATCH ...\": the global batch from each threshold of consumed tokens on (K, M, B, T "
                    "suffixes); one string or several arguments");
  app.add_option("--exit-interval", a.exit_interval, "save (with --save) and stop after an iteration that is a multiple of this");
  app.add_option("--exit-duration-in-mins", a.exit_duration_in_mins, "save (with --save) and stop after training this many minutes");
  app.add_option("--distributed-timeout-minutes", a.distributed_timeout_minutes,
                 "a collective waiting longer fails, naming the ranks it waits for");
  app.add_option("--progress-timeout-minutes", a.progress_timeout_minutes,
                 "end the run (non-zero exit, naming where each rank was) when no iteration finishes for this long; 0: off");
  app.add_flag("--log-straggler", a.log_straggler,
               "at each log step, the min / median / max step time over the ranks and the slowest ranks");
  app.add_option("--straggler-minmax-count", a.straggler_minmax_count, "how many slowest and fastest ranks --log-straggler names");
  app.add_flag("--disable-straggler-on-startup", a.disable_straggler_on_startup,
               "--log-straggler starts after the first log interval (start-up and warm-up left out)");
  app.add_flag("--log-throughput", a.log_throughput, "log TFLOP/s per GPU (and tokens/s) each log step");
  app.add_option("--weight-decay", a.weight_decay);
  app.add_option("--clip-grad", a.clip_grad, "global gradient-norm clip; 0 disables");
  app.add_option("--adam-beta1", a.adam_beta1);
  app.add_option("--adam-beta2", a.adam_beta2);
  app.add_option("--adam-eps", a.adam_eps);
  app.add_flag("--eod-mask-loss", a.eod_mask_loss, "no loss on predictions made from an end-of-document token");
  // Megatron's nargs='*': `--data-path 0.5 a 0.5 b` (several arguments) or one quoted string; a
  // repeated flag takes the last occurrence's arguments, as argparse does.
  add_joined_option(app, "--data-path", a.data_path,
                    "prefix of a .bin/.idx pair, or weights and prefixes: w1 prefix1 w2 prefix2 ... (several arguments or one string)");
  app.add_flag("--mock-data", a.mock_data,
               "train on Megatron's mock documents instead of --data-path: 100000 documents, each 1, 2, ..., n-1 and the "
               "end of document (learnable)");
  app.add_flag("--mock-data-random", a.mock_data_random,
               "train on uniformly random tokens instead of --data-path (benchmarks: the loss stays near log(vocab))")
      ->excludes("--mock-data");
  app.add_option("--split", a.split, "train,validation,test weights over each dataset's sequences");
  app.add_option("--eval-interval", a.eval_interval, "iterations between validation evaluations (0: only at the end)");
  app.add_option("--eval-iters", a.eval_iters, "global batches per evaluation (0: no evaluation)");
  app.add_option("--save", a.save, "checkpoint directory to save into");
  app.add_option("--load", a.load, "checkpoint directory to resume from");
  app.add_option("--save-interval", a.save_interval, "iterations between checkpoints (0 = only at the end when --save)");
  app.add_option("--ckpt-step", a.ckpt_step, "iteration of the --load checkpoint to load (default: the latest)");
  app.add_flag("--no-load-optim", a.no_load_optim, "load the model's weights alone; the optimizer starts fresh over them");
  app.add_flag("--no-load-rng", a.no_load_rng, "accepted: every random draw is a function of --seed and the iteration, so there is no generator state to load");
  app.add_flag("--finetune", a.finetune, "load the model's weights alone and start at iteration 0 (no optimizer state, no data position)");
  app.add_flag("--async-save", a.async_save, "write checkpoint files in the background while training goes on (committed at a later step)");
  app.add_option("--load-hf", a.load_hf, "start from a Hugging Face transformers model (config.json + safetensors) when --load holds no checkpoint");
  app.add_option("--save-hf", a.save_hf, "write the trained model as a Hugging Face transformers model (config.json + safetensors) at the end");
  app.add_option("--ckpt-format", a.ckpt_format, "checkpoint format: strata (one sharded file per rank, loadable in any layout)");
  app.add_option("--seed", a.seed);
  app.add_option("--log-interval", a.log_interval);
  app.add_option("--log-jsonl", a.log_jsonl, "append one JSON line of metrics per iteration");
  app.add_option("--tensorboard-dir", a.tensorboard_dir, "write TensorBoard event files here (loss, learning rate, grad norm, throughput, memory, validation loss)");
  app.add_option("--wandb-project", a.wandb_project, "refused: Weights & Biases logging needs a network; use --tensorboard-dir");
  app.add_option("--wandb-exp-name", a.wandb_exp_name, "refused (see --wandb-project)");
  app.add_option("--wandb-save-dir", a.wandb_save_dir, "refused (see --wandb-project)");
  app.add_flag("--quiet", a.quiet, "no per-iteration output");
  app.add_option("--sample-tokens", a.sample_tokens, "bytes of text to generate after training (0: none)");
  app.add_option("--sample-prompt", a.sample_prompt, "text the generated sample continues");
  app.add_option("--sample-temperature", a.sample_temperature, "softmax temperature of the sample (0: greedy)");
  app.add_flag("--profile", a.profile, "bracket iterations [--profile-step-start, --profile-step-end) with cudaProfilerStart/Stop");
  app.add_option("--profile-step-start", a.profile_step_start, "first profiled iteration (0-based, as Megatron's)");
  app.add_option("--profile-step-end", a.profile_step_end, "iteration after the last profiled one");
  app.add_flag("--check-for-nan-in-loss-and-grad,!--no-check-for-nan-in-loss-and-grad", a.check_for_nan_in_loss_and_grad,
               "stop at the first iteration whose loss or gradient norm is NaN or infinite (default on)");
  app.add_flag("--deterministic-attention,!--no-deterministic-attention", a.deterministic_attention,
               "cuDNN's deterministic attention backward (default on: two runs give the same losses bit for bit); "
               "--no-deterministic-attention lets it add dQ up with atomics, faster and no longer bit-identical");
  app.add_option("--gemm-tuning", a.gemm_tuning,
                 "time cuBLASLt's candidate algorithms once per GEMM problem and keep the fastest in this file; a run "
                 "that finds the file uses its choices (same bits as the run that wrote it). Several ranks: FILE.rank<R>");
  add_data_parallel_options(app, a);
  add_moe_options(app, a);
  app.add_flag_callback("--recompute-activations", [&a] { a.recompute_granularity = "selective"; },
                        "selective activation recompute (same as --recompute-granularity selective)");
  add_joined_option(app, "--recompute-modules", a.recompute_modules,
                    "selective recompute's modules, Megatron's names (default core_attn): strata recomputes core_attn, the "
                    "attention core; the others (mlp, moe, moe_act, shared_experts, layernorm, mla_up_proj) keep their "
                    "activations (the same numbers, more memory; a note says so)");
  add_megatron_flag_notes(app, a);
}

// The learning-rate schedule of the flags, in samples, as Megatron's OptimizerParamScheduler counts
// them (lr(samples consumed before the iteration)): an iteration-based run counts --lr-warmup-iters
// and --lr-decay-iters (else --train-iters) times the global batch; a sample-based run
// (--train-samples) --lr-warmup-samples and --lr-decay-samples (else --train-samples);
// --lr-warmup-fraction makes warmup that fraction of the decay, not rounded (Megatron's
// lr_warmup_steps = fraction x decay steps, a real number).
// With a constant batch this is the iteration schedule exactly.
inline LrSchedule schedule_of(const TrainArgs& a) {
  const std::int64_t batch = a.global_batch_size;
  std::int64_t decay = 0, warmup = 0;
  if (a.train_samples > 0) {
    decay = a.lr_decay_samples > 0 ? a.lr_decay_samples : a.train_samples;
    warmup = a.lr_warmup_samples;
  } else {
    decay = checked_mul(a.lr_decay_iters > 0 ? a.lr_decay_iters : a.train_iters, batch, "learning-rate decay samples");
    warmup = checked_mul(a.lr_warmup_iters, batch, "learning-rate warmup samples");
  }
  double fractional_warmup = 0;
  if (a.lr_warmup_fraction >= 0 && a.lr_warmup_fraction <= 1) {  // (validate refuses any other fraction)
    fractional_warmup = a.lr_warmup_fraction * static_cast<double>(decay);
    warmup = static_cast<std::int64_t>(fractional_warmup);
  }
  return LrSchedule{.max_lr = a.lr, .min_lr = a.min_lr, .warmup_iters = warmup, .decay_iters = decay,
                    .style = parse_lr_decay_style(a.lr_decay_style), .train_iters = decay, .fractional_warmup = fractional_warmup,
                    .warmup_init = a.lr_warmup_init};
}

// Training FLOPs per token, as DESIGN.md counts them for MFU: 6 x the matmul parameters (the output
// layer's padded vocabulary once) + 6 x layers x hidden x sequence (causal attention's two matmuls);
// of a MoE layer, the parameters a token goes through (topk experts, shared experts, router).
inline double flops_per_token(const TrainArgs& a) {
  const auto& m = a.model;
  const double d = m.hidden_size, l = m.num_layers, heads = m.num_attention_heads;
  const double groups = m.num_query_groups == 0 ? heads : m.num_query_groups;
  const double head = m.head_dim();
  // A MoE layer: each token through topk experts and the shared experts, plus the router's logits;
  // a dense layer (every layer of a dense model, those --moe-layer-freq marks 0 in a MoE one): the MLP.
  const double dense_mlp = (a.architecture.gated() ? 3.0 : 2.0) * d * m.ffn();
  const double moe_mlp = m.moe.enabled() ? (a.architecture.gated() ? 3.0 : 2.0) * d *
                                                   (m.moe.topk * static_cast<double>(m.expert_ffn()) + m.moe.shared_expert_ffn_hidden_size) +
                                               d * m.moe.num_experts
                                         : 0.0;
  const double moe_layers = m.moe_layer_count();
  // Attention's projections and its core (QK^T and PV, causal: half of the keys on average), as
  // Megatron counts them; multi-latent attention with its latents' projections and norms, q and k of
  // qk + pe dimensions and values of v (Megatron's MLA formula).
  double attention = d * (heads * head) + 2 * d * groups * head + heads * head * d, core = heads * head;
  if (m.multi_latent_attention) {
    const double qk = m.qk_head_dim, pe = m.qk_pos_emb_head_dim, dv = m.v_head_dim, rq = m.q_lora_rank,
                 rkv = m.kv_lora_rank;
    const double q = rq > 0 ? rq * (d + heads * (qk + pe) + 1) : d * heads * (qk + pe);
    attention = q + rkv * (d + heads * (qk + dv) + 1) + d * pe + heads * dv * d;
    core = heads * (qk + pe + dv) / 2;
  }
  const double matmul = l * attention + moe_layers * moe_mlp + (l - moe_layers) * dense_mlp +
                        d * static_cast<double>(m.padded_vocab(a.tensor_model_parallel_size));
  return 6 * matmul + 6 * l * core * m.seq_length;
}

// --decoupled-lr: the word embedding's and output layer's schedule, the same warmup and decay from
// --decoupled-lr to --decoupled-min-lr (else --min-lr), as Megatron's parameter groups; none without it.
inline std::optional<LrSchedule> decoupled_schedule_of(const TrainArgs& a) {
  if (a.decoupled_lr < 0) return std::nullopt;
  LrSchedule s = schedule_of(a);
  s.max_lr = a.decoupled_lr;
  s.min_lr = a.decoupled_min_lr >= 0 ? a.decoupled_min_lr : std::min(a.min_lr, a.decoupled_lr);
  return s;
}

// The global batch as a function of the samples consumed: constant (--global-batch-size), grown
// linearly (--rampup-batch-size start increment samples, Megatron's older ramp-up) or by steps
// (--step-batch-size-schedule "THRESHOLD:BATCH ...", thresholds in tokens as Megatron reads them:
// divided by --seq-length).
struct BatchSchedule {
  int final_batch = 0;
  std::vector<std::pair<std::int64_t, int>> steps;  // (first sample, batch), sorted; empty: no steps
  std::int64_t ramp_start = 0, ramp_increment = 0, ramp_samples = 0;  // ramp_samples > 0: a ramp-up

  bool constant() const { return steps.empty() && ramp_samples == 0; }
  int at(std::int64_t consumed) const {
    if (!steps.empty()) {
      int batch = steps.front().second;
      for (const auto& [first, b] : steps)
        if (consumed >= first) batch = b;
      return batch;
    }
    if (ramp_samples > 0 && consumed <= ramp_samples) {
      const std::int64_t increments = (final_batch - ramp_start) / ramp_increment;
      const double per_increment = static_cast<double>(ramp_samples) / static_cast<double>(increments);
      const auto done = static_cast<std::int64_t>(static_cast<double>(consumed) / per_increment);
      return static_cast<int>(std::min<std::int64_t>(final_batch, ramp_start + done * ramp_increment));
    }
    return final_batch;
  }
  // The number of consumed samples from which at() no longer changes: past the last step, or past
  // the ramp (0 for a constant schedule).
  std::int64_t settled_from() const {
    if (!steps.empty()) return steps.back().first;
    return ramp_samples > 0 ? ramp_samples + 1 : 0;
  }
  // Every batch size the schedule can take.
  std::vector<int> sizes() const {
    std::vector<int> out{final_batch};
    for (const auto& step : steps) out.push_back(step.second);
    for (std::int64_t b = ramp_start; ramp_samples > 0 && b < final_batch; b += ramp_increment) out.push_back(static_cast<int>(b));
    return out;
  }
};

// A threshold of --step-batch-size-schedule: a number with an optional K, M, B or T suffix.
inline std::int64_t parse_schedule_number(std::string text, const std::string& entry) {
  double multiplier = 1;
  if (!text.empty()) {
    const char suffix = static_cast<char>(std::toupper(static_cast<unsigned char>(text.back())));
    const double m = suffix == 'K' ? 1e3 : suffix == 'M' ? 1e6 : suffix == 'B' ? 1e9 : suffix == 'T' ? 1e12 : 0;
    if (m != 0) {
      multiplier = m;
      text.pop_back();
    }
  }
  std::size_t used = 0;
  double value = -1;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(value >= 0) || !std::isfinite(value * multiplier) || value * multiplier > 9e18)
    fail<ConfigError>("--step-batch-size-schedule: '", entry, "' is not THRESHOLD:BATCH with numbers (K, M, B, T suffixes allowed)");
  return static_cast<std::int64_t>(value * multiplier);
}

inline BatchSchedule batch_schedule_of(const TrainArgs& a) {
  BatchSchedule s;
  s.final_batch = a.global_batch_size;
  if (!a.step_batch_size_schedule.empty()) {
    std::string text = a.step_batch_size_schedule;
    std::replace(text.begin(), text.end(), ',', ' ');
    std::istringstream in(text);
    for (std::string entry; in >> entry;) {
      const auto colon = entry.find(':');
      if (colon == std::string::npos)
        fail<ConfigError>("--step-batch-size-schedule: '", entry, "' is not THRESHOLD:BATCH (e.g. \"0:16 2.4B:320\")");
      const std::int64_t tokens = parse_schedule_number(entry.substr(0, colon), entry);
      const std::int64_t batch = parse_schedule_number(entry.substr(colon + 1), entry);
      if (batch < 1 || batch > std::numeric_limits<int>::max())
        fail<ConfigError>("--step-batch-size-schedule: the batch of '", entry, "' must be a positive int");
      s.steps.emplace_back(tokens / a.model.seq_length, static_cast<int>(batch));
    }
    std::sort(s.steps.begin(), s.steps.end());
    if (s.steps.empty() || s.steps.front().first != 0)
      fail<ConfigError>("--step-batch-size-schedule \"", a.step_batch_size_schedule, "\": the first threshold must be 0");
    for (std::size_t i = 1; i < s.steps.size(); ++i)
      if (s.steps[i].first == s.steps[i - 1].first)
        fail<ConfigError>("--step-batch-size-schedule \"", a.step_batch_size_schedule,
                          "\": thresholds must differ by at least one sample (--seq-length tokens)");
    s.final_batch = s.steps.back().second;
  } else if (!a.rampup_batch_size.empty()) {
    s.ramp_start = a.rampup_batch_size[0];
    s.ramp_increment = a.rampup_batch_size[1];
    s.ramp_samples = a.rampup_batch_size[2];
    if (s.ramp_start < 1 || s.ramp_increment < 1 || s.ramp_samples < 1 || s.ramp_start > a.global_batch_size ||
        (a.global_batch_size - s.ramp_start) % s.ramp_increment != 0 || s.ramp_start == a.global_batch_size)
      fail<ConfigError>("--rampup-batch-size ", s.ramp_start, " ", s.ramp_increment, " ", s.ramp_samples,
                        ": the start must be positive and below --global-batch-size=", a.global_batch_size,
                        ", the increment positive and dividing their difference, and the samples positive");
  }
  return s;
}

// Iterations of a run: --train-iters, or with --train-samples as many as it takes to consume them
// (Megatron: train-samples / global batch with a constant batch; with a schedule, iterations until
// the samples are consumed).
inline std::int64_t iterations_of(const TrainArgs& a, const BatchSchedule& schedule) {
  if (a.train_samples <= 0) return a.train_iters;
  if (schedule.constant()) return a.train_samples / schedule.final_batch;
  std::int64_t consumed = 0, iterations = 0;
  while (consumed < a.train_samples) {
    consumed += schedule.at(consumed);
    ++iterations;
  }
  return iterations;
}

// Samples consumed by iterations [0, iterations) under the schedule.
inline std::int64_t samples_of(const BatchSchedule& schedule, std::int64_t iterations) {
  // Iteration by iteration while the batch changes, then in one product: --train-iters in the
  // billions is refused (or planned) at once instead of after seconds of additions.
  std::int64_t consumed = 0, i = 0;
  const std::int64_t settled = schedule.settled_from();
  for (; i < iterations && consumed < settled; ++i)
    consumed = checked_add(consumed, std::int64_t{schedule.at(consumed)}, "samples");
  if (i == iterations) return consumed;
  const std::int64_t rest = checked_mul(iterations - i, std::int64_t{schedule.at(consumed)}, "samples");
  return checked_add(consumed, rest, "samples");
}

// The compiled model the architecture flags select (pretrain_gpt.py's flags over strata's table):
// "gpt" for GPT-2's set (Megatron's defaults), "llama" for the Llama set, "mixtral" for the Llama
// set with --num-experts. Anything else is refused, naming the flags that differ from the nearest
// instantiated set.
//
// The building blocks of current models (--kv-channels, --qk-layernorm, --add-qkv-bias,
// --apply-layernorm-1p, --rotary-percent, --rotary-interleaved, --use-rope-scaling, --squared-relu,
// --quick-geglu and its clamp and offset) are run-time fields of ModelConfig, so they do not change
// which model is compiled: --quick-geglu stands for --swiglu in Llama's set (both gated).
inline std::string resolve_architecture(const ArchitectureArgs& x, const models::ModelConfig& m) {
  if (int(x.swiglu) + int(x.quick_geglu) + int(x.squared_relu) > 1)
    fail<ConfigError>("--swiglu, --quick-geglu and --squared-relu each choose the MLP's activation; give one of them");
  const std::string& pos = x.position_embedding_type;
  if (pos != "learned_absolute" && pos != "rope" && pos != "yarn")
    fail<ConfigError>("--position-embedding-type ", pos, ": strata has learned_absolute (GPT-2), rope (Llama) and yarn "
                      "(rope with YaRN's scaling)");
  struct Wanted {
    const char* flag;
    bool has;
  };
  const std::vector<Wanted> gpt = {
      {"--position-embedding-type learned_absolute", pos == "learned_absolute" && x.add_position_embedding},
      {"--normalization LayerNorm", x.normalization == "LayerNorm"},
      {"no --swiglu", !x.swiglu},  // --quick-geglu and --squared-relu are run-time choices of either model
      {"no --untie-embeddings-and-output-weights", !x.untie_embeddings_and_output_weights},
      {"no --disable-bias-linear", !x.disable_bias_linear},
      {"no --group-query-attention", !x.group_query_attention || m.num_query_groups == 0 ||
                                          m.num_query_groups == m.num_attention_heads}};
  const std::vector<Wanted> llama = {{"--position-embedding-type rope", pos == "rope" || pos == "yarn"},
                                     {"--normalization RMSNorm", x.normalization == "RMSNorm"},
                                     {"--swiglu", x.gated() || x.squared_relu},
                                     {"--untie-embeddings-and-output-weights", x.untie_embeddings_and_output_weights}};
  // (--disable-bias-linear is Llama's; without it the Llama block has Megatron's default linear
  // biases, ModelConfig::add_bias_linear, as gpt-oss.)
  auto missing = [](const std::vector<Wanted>& set) {
    std::vector<std::string> out;
    for (const Wanted& w : set)
      if (!w.has) out.emplace_back(w.flag);
    return out;
  };
  const auto to_gpt = missing(gpt), to_llama = missing(llama);
  if (to_gpt.empty() && m.moe.enabled())
    fail<ConfigError>("--num-experts ", m.moe.num_experts, " with GPT-2's architecture flags: strata's mixture-of-experts model is "
                      "Mixtral (the Llama block); add --position-embedding-type rope --normalization RMSNorm --swiglu "
                      "--untie-embeddings-and-output-weights --disable-bias-linear");
  if (to_gpt.empty()) return "gpt";
  if (to_llama.empty()) return m.moe.enabled() ? "mixtral" : "llama";
  const bool nearer_gpt = to_gpt.size() <= to_llama.size();
  std::string differ;
  for (const std::string& f : nearer_gpt ? to_gpt : to_llama) differ += (differ.empty() ? "" : ", ") + f;
  fail<ConfigError>("these architecture flags select a model strata does not compile: it has GPT-2 (Megatron's defaults: "
                    "learned_absolute positions, LayerNorm, GELU, tied output layer, biases) and Llama "
                    "(--position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights, "
                    "with --disable-bias-linear or with biases as gpt-oss, with or without --group-query-attention). The nearest, ",
                    nearer_gpt ? "GPT-2" : "Llama", ", also needs: ", differ);
}

// Ranks are threads of this process: at most 4 per hardware thread (and at least 16 on any
// machine), so a typo such as --world-size 3000 is an error, not thousands of threads.
inline int max_world_size() {
  const unsigned hardware = std::thread::hardware_concurrency();
  return std::max(16, 4 * static_cast<int>(hardware == 0 ? 1 : std::min(hardware, 1u << 20)));
}


// An integer flag outside [low, high]: ConfigError naming the flag, its value, the range and its meaning.
inline void check_range(const char* flag, std::int64_t value, std::int64_t low, std::int64_t high, const char* meaning) {
  if (value < low || value > high)
    fail<ConfigError>(flag, "=", value, " is out of range: it must be in [", low, ", ", high, "] (", meaning, ")");
}

// Every integer flag against its range (the model's own numbers are checked again by models::validate).
inline void check_integer_flags(const TrainArgs& a) {
  constexpr std::int64_t kInt = std::numeric_limits<int>::max();
  // On the CPU every rank is a thread of this process; on GPUs a rank is a GPU (a process of a
  // launcher's job, or a thread per local GPU), so only the CPU's world is bounded by this machine.
  if (a.device == "cuda")
    check_range("--world-size", a.world_size, 1, kInt, "ranks in total, one GPU each");
  else
    check_range("--world-size", a.world_size, 1, max_world_size(),
                "ranks in total, one thread each: at most 4 per hardware thread of this machine, and at least 16");
  check_range("--tensor-model-parallel-size", a.tensor_model_parallel_size, 1, a.world_size,
              "tensor-parallel group size, at most --world-size");
  // The layout before anything derived from it (an absent --global-batch-size is micro-batch x data parallel).
  const int pp = a.pipeline.pipeline_model_parallel_size;
  check_range("--pipeline-model-parallel-size", pp, 1, a.world_size, "pipeline stages, at most --world-size");
  if (a.world_size % a.tensor_model_parallel_size != 0)
    fail<ConfigError>("--tensor-model-parallel-size=", a.tensor_model_parallel_size, " does not divide --world-size=",
                      a.world_size, "; the world is tensor parallel x data parallel");
  if (a.world_size % (a.tensor_model_parallel_size * pp) != 0)
    fail<ConfigError>("--pipeline-model-parallel-size=", pp, " x --tensor-model-parallel-size=", a.tensor_model_parallel_size,
                      " does not divide --world-size=", a.world_size, "; the world is tensor x pipeline x data parallel");
  check_range("--num-layers-per-virtual-pipeline-stage", a.pipeline.num_layers_per_virtual_pipeline_stage, 0, kInt,
              "layers per virtual pipeline stage of the interleaved schedule; 0 = one chunk per rank");
  check_range("--kv-channels", a.model.kv_channels, 0, kInt, "head size; 0 = --hidden-size / --num-attention-heads");
  check_range("--context-parallel-size", a.context_parallel_size, 1, a.world_size,
              "context-parallel group size, at most --world-size");
  check_range("--num-layers", a.model.num_layers, 1, kInt, "transformer layers");
  check_range("--hidden-size", a.model.hidden_size, 1, kInt, "width of the residual stream");
  check_range("--num-attention-heads", a.model.num_attention_heads, 1, kInt, "attention heads");
  check_range("--num-query-groups", a.model.num_query_groups, 0, kInt, "key/value heads; 0 = one per head");
  check_range("--ffn-hidden-size", a.model.ffn_hidden_size, 0, kInt, "MLP width; 0 = 4 x --hidden-size");
  if (a.model.ffn_hidden_size == 0 && a.model.hidden_size > kInt / 4)
    fail<ConfigError>("--hidden-size=", a.model.hidden_size, " makes the default --ffn-hidden-size 4 x ", a.model.hidden_size,
                      " = ", 4 * std::int64_t{a.model.hidden_size}, ", more than a 32-bit int holds; use a smaller --hidden-size");
  check_range("--seq-length", a.model.seq_length, 1, kInt, "tokens per sequence");
  check_range("--max-position-embeddings", a.model.max_position_embeddings, 0, kInt,
              "rows of the learned position table, >= --seq-length; 0 = --seq-length");
  if (a.model.max_position_embeddings != 0 && a.model.max_position_embeddings < a.model.seq_length)
    fail<ConfigError>("--max-position-embeddings=", a.model.max_position_embeddings, " is less than --seq-length=",
                      a.model.seq_length, "; the position table needs a row per position of a sample, as Megatron asserts");
  check_range("--vocab-size", a.model.vocab_size, 1, kInt, "tokenizer vocabulary");
  check_range("--make-vocab-size-divisible-by", a.model.make_vocab_size_divisible_by, 1, kInt, "vocabulary padding multiple");
  check_range("--micro-batch-size", a.micro_batch_size, 1, kInt, "sequences per micro-batch");
  check_range(a.step_batch_size_schedule.empty() ? "--global-batch-size" : "the final batch of --step-batch-size-schedule",
              a.global_batch_size, 1, kInt, "sequences per iteration");
  check_range("--train-iters", a.train_iters, 1, kInt, "iterations to train (with --train-samples: as many as they take)");
  check_range("--train-samples", a.train_samples, 0, std::numeric_limits<std::int64_t>::max() / 2, "samples to train; 0 = --train-iters");
  check_range("--lr-warmup-samples", a.lr_warmup_samples, 0, std::numeric_limits<std::int64_t>::max() / 2, "samples of warmup");
  check_range("--lr-decay-samples", a.lr_decay_samples, 0, std::numeric_limits<std::int64_t>::max() / 2, "samples of decay");
  check_range("--lr-warmup-iters", a.lr_warmup_iters, 0, kInt, "iterations of linear warmup");
  check_range("--lr-decay-iters", a.lr_decay_iters, 0, kInt, "iterations of decay; 0 = --train-iters");
  check_range("--eval-interval", a.eval_interval, 0, kInt, "iterations between evaluations; 0 = only at the end");
  check_range("--eval-iters", a.eval_iters, 0, kInt, "global batches per evaluation; 0 = none");
  check_range("--save-interval", a.save_interval, 0, kInt, "iterations between checkpoints; 0 = only at the end");
  check_range("--ckpt-step", a.ckpt_step, -1, kInt, "a saved iteration; -1 = the latest");
  check_range("--log-interval", a.log_interval, 1, kInt, "iterations between log lines");
  check_range("--sample-tokens", a.sample_tokens, 0, kMaxSampleTokens, "bytes generated after training; 0 = none");
  check_range("--ddp-bucket-size", a.ddp_bucket_size, 0, std::numeric_limits<std::int64_t>::max() / 2,
              "gradient elements per bucket; 0 = max(40M, 1M x data-parallel size)");
  check_range("--loss-scale-window", a.loss_scale_window, 1, kInt, "iterations without overflow before the loss scale grows");
  check_range("--hysteresis", a.hysteresis, 1, kInt, "overflowing iterations before the loss scale backs off");
  if (a.recompute_granularity == "full")
    check_range("--recompute-num-layers", a.recompute_num_layers, 1, a.model.num_layers,
                "layers per recomputed chunk (uniform) or recomputed layers (block), at most --num-layers");
  if (a.profile) {
    check_range("--profile-step-start", a.profile_step_start, 0, a.train_iters - 1, "first profiled iteration, 0-based");
    check_range("--profile-step-end", a.profile_step_end, a.profile_step_start + 1, a.train_iters,
                "iteration after the last profiled one");
  }
}

// A floating-point flag that must be finite and within [low, high] (bounds inclusive unless open).
// Every comparison is written so that NaN fails it.
inline void check_real(const char* flag, double value, double low, double high, const char* meaning, bool open_low = false,
                       bool open_high = false) {
  const bool above = open_low ? value > low : value >= low;
  const bool below = open_high ? value < high : value <= high;
  if (std::isfinite(value) && above && below) return;
  if (high == std::numeric_limits<double>::max())
    fail<ConfigError>(flag, "=", value, " is out of range: it must be a finite number ", open_low ? "> " : ">= ", low, " (",
                      meaning, ")");
  fail<ConfigError>(flag, "=", value, " is out of range: it must be a finite number in ", open_low ? "(" : "[", low, ", ", high,
                    open_high ? ")" : "]", " (", meaning, ")");
}

inline void check_real_flags(const TrainArgs& a) {
  constexpr double kMax = std::numeric_limits<double>::max();
  check_real("--lr", a.lr, 0, kMax, "peak learning rate");
  check_real("--min-lr", a.min_lr, 0, kMax, "learning rate at the end of decay");
  check_real("--weight-decay", a.weight_decay, 0, kMax, "decoupled weight decay; 0 disables it");
  check_real("--clip-grad", a.clip_grad, 0, kMax, "global gradient-norm clip; 0 disables clipping");
  check_real("--adam-beta1", a.adam_beta1, 0, 1, "first-moment decay", false, true);
  check_real("--adam-beta2", a.adam_beta2, 0, 1, "second-moment decay", false, true);
  check_real("--adam-eps", a.adam_eps, 0, kMax, "added to the denominator", true);
  check_real("--init-method-std", a.model.init_method_std, 0, kMax, "standard deviation of the initial weights", true);
  check_real("--rotary-base", a.model.rope_base, 0, kMax, "RoPE base, 10000 for Llama 2", true);
  check_real("--hidden-dropout", a.model.hidden_dropout, 0, 1, "dropout probability; 0 disables it", false, true);
  check_real("--attention-dropout", a.model.attention_dropout, 0, 1, "dropout probability; 0 disables it", false, true);
  check_real("--norm-epsilon", a.model.norm_epsilon, 0, std::numeric_limits<double>::max(), "added to the variance", true);
  check_real("--label-smoothing", a.model.label_smoothing, 0, 1, "label smoothing; 0 disables it", false, true);
  check_real("--sample-temperature", a.sample_temperature, 0, kMax, "softmax temperature; 0 = greedy");
  check_real("--loss-scale", a.loss_scale, 0, kMax, "a constant loss scale; 0 = dynamic (with fp16) or none");
  check_real("--initial-loss-scale", a.initial_loss_scale, 0, kMax, "the dynamic loss scale at the start", true);
  check_real("--min-loss-scale", a.min_loss_scale, 0, kMax, "the smallest dynamic loss scale", true);
  // Values the run's types cannot hold: a loss scale and --adam-eps live in the gradients' and the
  // optimizer's type (fp32, double with --dtype double), the initial weights in the parameters' type.
  const bool wide = a.dtype == "double";
  const double accumulate_min = wide ? std::numeric_limits<double>::min() : std::numeric_limits<float>::min();
  const double accumulate_max = wide ? std::numeric_limits<double>::max() : std::numeric_limits<float>::max();
  const char* accumulate_name = wide ? "double" : "fp32";
  const auto representable = [&](const char* flag, double value, double low, double high, const char* type, const char* what) {
    if (value != 0 && (value < low || value > high))
      fail<ConfigError>(flag, "=", value, " cannot be represented in the ", what, " (", type, ", whose normal numbers lie in [",
                        low, ", ", high, "]); give a value in that range");
  };
  if (a.loss_scale > 0) representable("--loss-scale", a.loss_scale, accumulate_min, accumulate_max, accumulate_name, "gradients");
  if (dynamic_loss_scaling(a)) {
    representable("--initial-loss-scale", a.initial_loss_scale, accumulate_min, accumulate_max, accumulate_name, "gradients");
    representable("--min-loss-scale", a.min_loss_scale, accumulate_min, accumulate_max, accumulate_name, "gradients");
  }
  representable("--adam-eps", a.adam_eps, accumulate_min, accumulate_max, accumulate_name, "optimizer's state");
  const double parameter_min = a.dtype == "fp16" ? 6.103515625e-05 : accumulate_min;  // bf16 has fp32's exponent
  representable("--init-method-std", a.model.init_method_std, parameter_min, kMax,
                a.dtype == "fp16" ? "fp16" : a.dtype == "bf16" ? "bf16" : accumulate_name, "parameters");
  // Flags whose "not given" is -1: any other value must be a real one.
  if (a.lr_warmup_fraction != -1)
    check_real("--lr-warmup-fraction", a.lr_warmup_fraction, 0, 1, "the warmup as a fraction of the decay length");
  if (a.decoupled_lr != -1)
    check_real("--decoupled-lr", a.decoupled_lr, 0, kMax, "the embedding and output layer's peak learning rate");
  if (a.decoupled_min_lr != -1)
    check_real("--decoupled-min-lr", a.decoupled_min_lr, 0, kMax, "the embedding and output layer's minimum learning rate");
  if (dynamic_loss_scaling(a) && a.min_loss_scale > a.initial_loss_scale)
    fail<ConfigError>("--min-loss-scale=", a.min_loss_scale, " is above --initial-loss-scale=", a.initial_loss_scale,
                      "; lower --min-loss-scale");
}

// A message of the library's validation (models::validate, the pipeline split) with the names of
// ModelConfig's fields replaced by the flags that set them, so the trainer's errors name flags.
inline std::string with_flag_names(std::string message) {
  static constexpr std::pair<const char*, const char*> kNames[] = {
      {"moe capacity_factor", "--moe-expert-capacity-factor"},
      {"moe pad_to_capacity", "--moe-pad-expert-input-to-capacity"},
      {"capacity_factor", "--moe-expert-capacity-factor"},
      {"pad_to_capacity", "--moe-pad-expert-input-to-capacity"},
      {"moe topk", "--moe-router-topk"},
      {"moe shared_expert_ffn_hidden_size", "--moe-shared-expert-intermediate-size"},
      {"moe router scaling_factor", "--moe-router-topk-scaling-factor"},
      {"moe aux_loss_coeff", "--moe-aux-loss-coeff"},
      {"moe z_loss_coeff", "--moe-z-loss-coeff"},
      {"moe expert_bias_update_rate", "--moe-router-bias-update-rate"},
      {"num_experts", "--num-experts"},
      {"first_stage_layers", "--decoder-first-pipeline-num-layers"},
      {"last_stage_layers", "--decoder-last-pipeline-num-layers"},
      {"num_layers", "--num-layers"},
  };
  const auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; };
  for (const auto& [name, flag] : kNames) {
    const std::string from = name;
    for (std::size_t at = message.find(from); at != std::string::npos; at = message.find(from, at)) {
      const std::size_t end = at + from.size();
      if ((at > 0 && word(message[at - 1])) || (end < message.size() && std::isalnum(static_cast<unsigned char>(message[end])))) {
        at = end;
        continue;
      }
      message.replace(at, from.size(), flag);
      at += std::string(flag).size();
    }
  }
  // The pipeline split's own pointer to Megatron's flags is now a repetition.
  const std::string repeated = " (Megatron's --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers)";
  if (const auto at = message.find(repeated); at != std::string::npos) message.erase(at, repeated.size());
  return message;
}

// Context parallelism: the group divides the world with tp and pp; ring (p2p) or all-to-all (a2a)
// attention on CPU threads or GPUs, without experts, so far.
inline void check_context_parallel_args(const TrainArgs& a) {
  const int cp = a.context_parallel_size, tp = a.tensor_model_parallel_size, pp = a.pipeline.pipeline_model_parallel_size;
  if (a.cp_comm_type != "p2p" && a.cp_comm_type != "a2a" && a.cp_comm_type != "allgather" && a.cp_comm_type != "a2a+p2p")
    fail<ConfigError>("--cp-comm-type ", a.cp_comm_type, " is not one of p2p, a2a, allgather, a2a+p2p (Megatron's choices)");
  if (a.world_size % (std::int64_t{tp} * pp * cp) != 0)
    fail<ConfigError>("--context-parallel-size=", cp, " x --tensor-model-parallel-size=", tp,
                      " x --pipeline-model-parallel-size=", pp, " does not divide --world-size=", a.world_size,
                      "; the world is tensor x context x data x pipeline parallel");
  const auto& sizes = a.hierarchical_cp_sizes;
  if (!sizes.empty() && a.cp_comm_type != "a2a+p2p")
    fail<ConfigError>("--hierarchical-context-parallel-sizes is given with --cp-comm-type ", a.cp_comm_type,
                      "; the sizes are for --cp-comm-type a2a+p2p only");
  if (a.cp_comm_type == "a2a+p2p") {
    if (sizes.size() != 2)
      fail<ConfigError>("--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes with two sizes (the all-to-all "
                        "groups, then the ring across them), got ", sizes.size());
    if (sizes[0] < 1 || sizes[1] < 1 || std::int64_t{sizes[0]} * sizes[1] != cp)
      fail<ConfigError>("--hierarchical-context-parallel-sizes ", sizes[0], " ", sizes[1], ": their product must be "
                        "--context-parallel-size ", cp);
  }
  if (cp == 1) return;
  const int a2a_size = a.cp_comm_type == "a2a" ? cp : a.cp_comm_type == "a2a+p2p" ? sizes[0] : 1;
  if (a2a_size > 1 && tp > 0) {
    const int groups_total = a.model.num_query_groups == 0 ? a.model.num_attention_heads : a.model.num_query_groups;
    const int heads = a.model.num_attention_heads / tp, groups = groups_total / tp;
    if (heads % a2a_size != 0 || groups % a2a_size != 0)
      fail<ConfigError>("--cp-comm-type ", a.cp_comm_type, " with --context-parallel-size ", cp, ": each tensor-parallel "
                        "rank has ", heads, " query heads and ", groups, " key/value heads, which ", a2a_size,
                        " does not divide; all-to-all attention gives each rank of its group whole heads, so use "
                        "--cp-comm-type p2p, more --num-query-groups, or a smaller cp or tp");
  }
  if (a.sample_tokens > 0)
    fail<ConfigError>("--sample-tokens ", a.sample_tokens, " with --context-parallel-size ", cp,
                      ": sampling runs whole sequences on one rank; use --sample-tokens 0 and sample from the saved "
                      "checkpoint with --context-parallel-size 1");
}

// Checks everything that can be checked before a thread starts or a byte is allocated.
inline void validate(const TrainArgs& a) {
  check_integer_flags(a);  // the layout (tp, pp, world) first
  check_real_flags(a);
  const int pp = a.pipeline.pipeline_model_parallel_size;
  check_context_parallel_args(a);
  const int dp = data_parallel_size_of(a);
  const std::int64_t per_step = checked_mul(a.micro_batch_size, dp, "--micro-batch-size x data-parallel size");
  if (a.global_batch_size % per_step != 0)
    fail<ConfigError>(a.step_batch_size_schedule.empty() ? "--global-batch-size=" : "the final batch of --step-batch-size-schedule, ",
                      a.global_batch_size, " is not a multiple of micro-batch-size x data-parallel = ",
                      a.micro_batch_size, " x ", dp, " = ", per_step);
  if (!a.refused.empty()) fail<ConfigError>(a.refused.front());
  (void)fp8_options_of(a);
  if (!a.fp8_format.empty() && a.device == "cuda") check_fp8_gpu_shapes(a);
  if (a.fp8_format.empty() &&
      (a.first_last_layers_bf16 || a.fp8_recipe != "delayed" || a.fp8_param_gather || a.fp8_recast_attention_output))
    fail<ConfigError>(a.first_last_layers_bf16        ? "--first-last-layers-bf16"
                      : a.fp8_param_gather            ? "--fp8-param-gather"
                      : a.fp8_recast_attention_output ? "--fp8-recast-attention-output"
                                                      : "--fp8-recipe " + a.fp8_recipe,
                      " without --fp8-format: nothing runs in FP8; add --fp8-format e4m3 or hybrid");
  if (a.fp8_param_gather) {
    if (!a.use_distributed_optimizer)
      fail<ConfigError>("--fp8-param-gather: the distributed optimizer casts each rank's shard of the weights and gathers "
                        "the codes, as Megatron asserts; add --use-distributed-optimizer or drop the flag");
    if (a.fp8_recipe == "blockwise")
      fail<ConfigError>("--fp8-param-gather with --fp8-recipe blockwise: a weight's 128 x 128 tiles would straddle the "
                        "data-parallel shards the ranks cast; use --fp8-recipe delayed or tensorwise, or drop the flag");
    if (a.fp8_weight_cache == "none" || !a.fp8_cache_weights)
      fail<ConfigError>("--fp8-param-gather keeps each weight's gathered codes for the step, which --fp8-weight-cache "
                        "none forbids; drop one of them");
  }
  if (a.fp8_recast_attention_output && a.fp8_recipe == "blockwise")
    fail<ConfigError>("--fp8-recast-attention-output with --fp8-recipe blockwise: the blockwise layers keep their input "
                      "itself and cast it again already; the flag is for delayed and tensorwise");
  if (a.fp8_recast_attention_output && a.model.multi_latent_attention)
    fail<ConfigError>("--fp8-recast-attention-output with --multi-latent-attention: the latent attention's output "
                      "projection keeps its own codes; drop the flag");
  const BatchSchedule batches = batch_schedule_of(a);
  for (const int b : batches.sizes())
    if (b % per_step != 0)
      fail<ConfigError>(batches.constant()                     ? "--global-batch-size="
                        : a.step_batch_size_schedule.empty() ? "the global batch of --rampup-batch-size "
                                                             : "the global batch of --step-batch-size-schedule ",
                        b,
                        " is not a multiple of micro-batch-size x data-parallel = ", a.micro_batch_size, " x ", dp, " = ", per_step);
  if (a.train_samples > 0 && (a.lr_decay_iters > 0 || a.lr_warmup_iters > 0))
    fail<ConfigError>("--train-samples counts the schedule in samples: use --lr-decay-samples and --lr-warmup-samples (or "
                      "--lr-warmup-fraction), not --lr-decay-iters / --lr-warmup-iters, as Megatron");
  if (a.train_samples <= 0 && (a.lr_decay_samples > 0 || a.lr_warmup_samples > 0))
    fail<ConfigError>("--lr-decay-samples and --lr-warmup-samples go with --train-samples; with --train-iters use "
                      "--lr-decay-iters and --lr-warmup-iters, as Megatron");
  if (a.lr_warmup_fraction >= 0 && (a.lr_warmup_iters > 0 || a.lr_warmup_samples > 0))
    fail<ConfigError>("--lr-warmup-fraction and ", a.lr_warmup_iters > 0 ? "--lr-warmup-iters" : "--lr-warmup-samples",
                      " both set the warmup; give one, as Megatron");
  if (a.decoupled_min_lr >= 0 && a.decoupled_lr < 0)
    fail<ConfigError>("--decoupled-min-lr ", a.decoupled_min_lr, " needs --decoupled-lr (the peak it decays from)");
  if (a.decoupled_lr >= 0) {
    check_real("--decoupled-lr", a.decoupled_lr, 0, std::numeric_limits<double>::max(), "the embedding and output layer's peak learning rate");
    if (a.decoupled_min_lr > a.decoupled_lr)
      fail<ConfigError>("--decoupled-min-lr=", a.decoupled_min_lr, " is above --decoupled-lr=", a.decoupled_lr, "; lower it");
  }
  const LrSchedule schedule = schedule_of(a);
  if (schedule.warmup_iters > schedule.effective_decay_iters())
    fail<ConfigError>("the warmup (", schedule.warmup_iters, " samples, from ",
                      a.lr_warmup_fraction >= 0 ? "--lr-warmup-fraction" : a.train_samples > 0 ? "--lr-warmup-samples" : "--lr-warmup-iters",
                      ") is longer than the decay (", schedule.effective_decay_iters(), " samples, from ",
                      a.train_samples > 0 ? (a.lr_decay_samples > 0 ? "--lr-decay-samples" : "--train-samples")
                                          : (a.lr_decay_iters > 0 ? "--lr-decay-iters" : "--train-iters"),
                      "); warmup must end before the learning rate decays");
  if (a.exit_interval < 0) fail<ConfigError>("--exit-interval=", a.exit_interval, " must be >= 0 (0: none)");
  check_real("--exit-duration-in-mins", a.exit_duration_in_mins, 0, std::numeric_limits<double>::max(), "0: none");
  check_real("--distributed-timeout-minutes", a.distributed_timeout_minutes, 0, 1e6,
             "minutes a collective may wait; 0 = the communicator's default");
  check_real("--progress-timeout-minutes", a.progress_timeout_minutes, 0, 1e6,
             "minutes without a finished iteration before the run ends; 0 = off");
  check_range("--straggler-minmax-count", a.straggler_minmax_count, 1, 1 << 20, "how many slowest and fastest ranks to name");
  data::parse_split(a.split);
  if (a.save_interval > 0 && a.save.empty()) fail<ConfigError>("--save-interval needs --save <directory>");
  if (a.ckpt_step >= 0 && a.load.empty()) fail<ConfigError>("--ckpt-step needs --load <directory>");
  if (a.finetune && a.load.empty()) fail<ConfigError>("--finetune needs --load <directory>");
  if (a.async_save && a.save.empty()) fail<ConfigError>("--async-save needs --save <directory>");
  if (a.overlap_param_gather && (!a.use_distributed_optimizer || !a.overlap_grad_reduce))
    fail<ConfigError>("--overlap-param-gather overlaps the distributed optimizer's parameter all-gather with the next "
                      "forward: it needs --use-distributed-optimizer and --overlap-grad-reduce (as Megatron asserts); add ",
                      !a.use_distributed_optimizer ? "--use-distributed-optimizer" : "--overlap-grad-reduce", " or drop it");
  for (auto [flag, value] : {std::pair{"--wandb-project", &a.wandb_project}, std::pair{"--wandb-exp-name", &a.wandb_exp_name},
                             std::pair{"--wandb-save-dir", &a.wandb_save_dir}})
    if (!value->empty())
      fail<ConfigError>(flag, " ", *value, ": strata does not log to Weights & Biases, which needs a network; "
                        "--tensorboard-dir <dir> writes the same scalars as TensorBoard event files");
  if (a.ckpt_format != "strata")
    fail<ConfigError>("--ckpt-format ", a.ckpt_format, ": strata saves and loads its own sharded format (--ckpt-format strata), "
                      "which loads into any parallel layout; Megatron's torch and torch_dist formats are not read. Exchange "
                      "weights with other stacks through Hugging Face's format (--load-hf, --save-hf)");
  if (!a.save_hf.empty() && a.pipeline.pipeline_model_parallel_size > 1 && a.save.empty())
    fail<ConfigError>("--save-hf with --pipeline-model-parallel-size ", a.pipeline.pipeline_model_parallel_size,
                      " needs --save <directory>: the export reads the final checkpoint, which holds every stage");
  if (a.model.mtp_num_layers > 0 && (!a.load_hf.empty() || !a.save_hf.empty()))
    fail<ConfigError>(!a.load_hf.empty() ? "--load-hf" : "--save-hf", " with --mtp-num-layers ", a.model.mtp_num_layers,
                      ": the Hugging Face classes strata maps (Llama, Qwen, Mistral) hold no multi-token prediction layers; "
                      "train without --mtp-num-layers to exchange weights with them");
  if (a.model.mtp_num_layers > 0 && a.model_kind == "gpt")
    fail<ConfigError>("--mtp-num-layers ", a.model.mtp_num_layers, " is built for the Llama set (RoPE, with or without "
                      "--num-experts) so far; GPT-2's learned positions would need their own rule for the depths' shifted tokens");
  if (a.model_kind != resolve_architecture(a.architecture, a.model))
    fail<ConfigError>("the architecture flags select ", resolve_architecture(a.architecture, a.model), ", but this run builds ",
                      a.model_kind, " (", a.model_kind == "gpt" ? "train_gpt is that preset; " : a.model_kind == "llama" ? "train_llama is that preset; " : "",
                      "pretrain_gpt chooses by the flags)");
  if (!a.model.moe.enabled() && (!a.load_hf.empty() || !a.save_hf.empty())) {
    // GPT-2, Llama, Mistral, Qwen2, Qwen3: what none of them can express is refused before training, not at the export
    try {
      (void)hf::hf_architecture(a.model_kind == "gpt" ? hf::Architecture::gpt2 : hf::Architecture::llama, a.model);
    } catch (const ConfigError& e) {
      fail<ConfigError>(!a.load_hf.empty() ? "--load-hf" : "--save-hf", ": ", e.what(),
                        " (save and load strata checkpoints instead: --save, --load)");
    }
  }
  if (a.model.moe.enabled()) {
    if (!a.load_hf.empty() || !a.save_hf.empty()) {  // Hugging Face's MoE classes: what they cannot express is refused now
      try {
        (void)hf::hf_architecture(hf::Architecture::mixtral, a.model);
      } catch (const ConfigError& e) {
        fail<ConfigError>(!a.load_hf.empty() ? "--load-hf" : "--save-hf", " with --num-experts maps the model to Hugging "
                          "Face's MixtralForCausalLM (Qwen3MoeForCausalLM with --qk-layernorm, Qwen2MoeForCausalLM with "
                          "--add-qkv-bias and a gated shared expert, DeepseekV3ForCausalLM with "
                          "--multi-latent-attention, GptOssForCausalLM without --disable-bias-linear): ", e.what(),
                          " (save and load strata checkpoints instead: --save, --load)");
      }
    }
    check_range("--expert-model-parallel-size", a.expert_model_parallel_size, 1, a.world_size / pp,
                "ranks of a pipeline stage the experts are spread over");
    check_range("--expert-tensor-parallel-size", a.expert_tensor_parallel_size, 0, a.world_size / pp,
                "ranks each expert is split over; 0 = --tensor-model-parallel-size");
    if (models::parse_recompute_granularity(a.recompute_granularity) == models::RecomputeGranularity::full &&
        a.model.moe.force_load_balancing)
      fail<ConfigError>("--recompute-granularity full with --moe-router-force-load-balancing: the forced balance draws "
                        "new random router logits at each forward, so a recomputed MoE layer would route its tokens "
                        "differently from its forward; use --recompute-granularity selective (--recompute-modules moe "
                        "recomputes the MoE block with the same random logits), or drop the forced balance");
  } else if (a.expert_model_parallel_size != 1) {
    fail<ConfigError>("--expert-model-parallel-size ", a.expert_model_parallel_size,
                      " needs a mixture-of-experts model (--num-experts); a dense model has no experts to spread");
  }
  ParallelConfig stage = parallel_config_of(a);  // one pipeline stage's ranks (the pipeline is checked below)
  stage.pp = 1;
  try {
    models::validate(a.model, stage, a.sequence_parallel, a.world_size / pp);
    for (const int b : batches.sizes())  // every number of micro-batches the batch schedule makes
      check_pipeline_args(a.pipeline, a.model, a.world_size, a.tensor_model_parallel_size, static_cast<int>(b / per_step),
                          a.sample_tokens > 0);
  } catch (const ConfigError& e) {
    throw ConfigError(with_flag_names(e.what()));
  }
  schedule.validate();
}

// The flags' defaults of a trainer: Megatron's, with the architecture of the preset (kind "gpt":
// GPT-2's set, Megatron's defaults; "llama": the Llama set; "mixtral": the Llama set with 8 experts).
inline TrainArgs command_line_defaults(const std::string& kind) {
  TrainArgs a;
  a.model_kind = kind;
  if (kind == "llama" || kind == "mixtral") a.architecture = ArchitectureArgs::llama();
  if (kind == "mixtral") a.model.moe.num_experts = 8;
  return a;
}

// The run-time building blocks from their flags (ModelConfig's fields), with the checks that need
// the flags themselves: RoPE's options without RoPE change nothing (a note, as Megatron ignores
// them); the clamp and offset apply to gated activations.
// --window-size and --window-attn-skip-freq into ModelConfig's window_size and window_layers.
inline void resolve_sliding_window(TrainArgs& a) {
  models::ModelConfig& m = a.model;
  m.window_size = -1;
  m.window_layers.clear();
  if (a.window_size.empty()) {
    if (!a.window_attn_skip_freq.empty())
      a.notes.emplace_back("--window-attn-skip-freq " + a.window_attn_skip_freq + ": without --window-size every layer has "
                           "full attention, so it changes nothing (as in Megatron)");
    return;
  }
  std::string t;
  for (const char c : a.window_size)
    if (c != ' ' && c != '(' && c != ')') t += c;
  const std::size_t comma = t.find(',');
  long left = 0, right = 0;
  try {
    std::size_t used = 0;
    const std::string l = t.substr(0, comma);
    left = std::stol(l, &used);
    if (used != l.size()) throw std::invalid_argument("left");
    if (comma != std::string::npos) {
      const std::string r = t.substr(comma + 1);
      right = std::stol(r, &used);
      if (used != r.size()) throw std::invalid_argument("right");
    }
  } catch (const std::exception&) {
    fail<ConfigError>("--window-size ", a.window_size, ": not Megatron's (left,right) tuple of integers, e.g. (4095,0)");
  }
  if (right != 0 && right != -1)
    fail<ConfigError>("--window-size ", a.window_size, ": the right bound must be 0, since attention is causal (a query "
                      "sees no later key)");
  if (left < -1 || left > std::numeric_limits<int>::max())
    fail<ConfigError>("--window-size ", a.window_size, ": the left bound must be -1 (no window) or a number of keys >= 0");
  if (left == -1) return;
  m.window_size = static_cast<int>(left);
  if (a.window_attn_skip_freq.empty()) return;
  const std::string& f = a.window_attn_skip_freq;
  if (std::all_of(f.begin(), f.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; })) {
    const long every = f.size() <= 7 ? std::stol(f) : 0;
    if (every < 1)
      fail<ConfigError>("--window-attn-skip-freq ", f, ": must be >= 1 (N: one full-attention layer after N - 1 windowed ones)");
    for (int l = 0; l < m.num_layers; ++l) m.window_layers.push_back(l % every == every - 1 ? 0 : 1);
  } else {
    m.window_layers = parse_layer_pattern("--window-attn-skip-freq", f);
    if (static_cast<int>(m.window_layers.size()) != m.num_layers)
      fail<ConfigError>("--window-attn-skip-freq ", f, ": ", m.window_layers.size(), " entries for --num-layers ",
                        m.num_layers, "; give one 1 (window) or 0 (full attention) per layer");
  }
}

// --position-embedding-type yarn and its parameters into ModelConfig's yarn fields (RoPE with YaRN's
// frequencies and attention factor, backend/rope_options.hpp); without it the YaRN flags are noted
// as changing nothing, as in Megatron.
inline void resolve_yarn(const CLI::App& app, TrainArgs& a) {
  const ArchitectureArgs& x = a.architecture;
  models::ModelConfig& m = a.model;
  static constexpr const char* kFlags[] = {"--rotary-scaling-factor", "--yarn-original-max-position-embeddings",
                                           "--yarn-beta-fast", "--yarn-beta-slow", "--mscale", "--mscale-all-dim",
                                           "--yarn-correction-range-round-to-int"};
  // Megatron's multi-latent attention turns its RoPE part with YaRN unless --rope-type rope (with
  // --rotary-scaling-factor's default of 1, YaRN's frequencies are RoPE's).
  const bool latent_yarn = m.multi_latent_attention && x.rope_type != "rope";
  if (x.enable_gpt_oss) {  // Megatron sets these over whatever the flags gave
    a.notes.emplace_back("--enable-gpt-oss: YaRN with gpt-oss's values (--rotary-scaling-factor 32, "
                         "--yarn-original-max-position-embeddings 131072, --yarn-beta-fast 32, --yarn-beta-slow 1, --mscale 1, "
                         "--mscale-all-dim 0, --no-yarn-correction-range-round-to-int), over the flags' own");
    ArchitectureArgs& y = a.architecture;
    y.position_embedding_type = "yarn";
    y.rotary_scaling_factor = 32.0;
    y.yarn_original_max_position_embeddings = 131072;
    y.yarn_beta_fast = 32.0, y.yarn_beta_slow = 1.0;
    y.mscale = 1.0, y.mscale_all_dim = 0.0;
    y.yarn_correction_range_round_to_int = false;
  }
  if (x.position_embedding_type != "yarn" && !latent_yarn) {
    for (const char* flag : kFlags)
      if (app.count(flag) > 0)
        a.notes.push_back(std::string(flag) + ": without --position-embedding-type yarn (or --multi-latent-attention with "
                          "--rope-type yarn) there is no YaRN, so it changes nothing");
    m.yarn_scaling_factor = 0;
    return;
  }
  if (!(std::isfinite(x.rotary_scaling_factor) && x.rotary_scaling_factor > 0))
    fail<ConfigError>("--rotary-scaling-factor ", x.rotary_scaling_factor,
                      " must be a finite number > 0 (YaRN's context extension; gpt-oss: 32, 1 changes nothing)");
  if (!(std::isfinite(x.yarn_original_max_position_embeddings) && x.yarn_original_max_position_embeddings >= 1))
    fail<ConfigError>("--yarn-original-max-position-embeddings ", x.yarn_original_max_position_embeddings,
                      " must be a positive number of positions (the context the model was trained at; gpt-oss: 4096)");
  if (!(std::isfinite(x.yarn_beta_fast) && std::isfinite(x.yarn_beta_slow) && x.yarn_beta_slow > 0 &&
        x.yarn_beta_fast > x.yarn_beta_slow))
    fail<ConfigError>("--yarn-beta-fast ", x.yarn_beta_fast, " and --yarn-beta-slow ", x.yarn_beta_slow,
                      " must be finite with 0 < beta-slow < beta-fast (Megatron's defaults: 32 and 1)");
  if (!(std::isfinite(x.mscale) && std::isfinite(x.mscale_all_dim)) ||
      !(rope_yarn_mscale(x.rotary_scaling_factor, x.mscale_all_dim) > 0))
    fail<ConfigError>("--mscale ", x.mscale, " and --mscale-all-dim ", x.mscale_all_dim,
                      " must be finite, with 0.1 x mscale-all-dim x ln(--rotary-scaling-factor) + 1 > 0 (defaults: 1 and 0)");
  if (x.use_rope_scaling)
    fail<ConfigError>("--use-rope-scaling (Llama 3.1's frequencies) with --position-embedding-type yarn: each rescales "
                      "the rotary frequencies; give one of them");
  if (m.rotary_interleaved && !m.multi_latent_attention)
    fail<ConfigError>("--rotary-interleaved with --position-embedding-type yarn: Megatron's YaRN turns the halves of each "
                      "head (rotate-half), not interleaved pairs; drop --rotary-interleaved");
  m.yarn_scaling_factor = x.rotary_scaling_factor;
  m.yarn_original_max_positions = x.yarn_original_max_position_embeddings;
  m.yarn_beta_fast = x.yarn_beta_fast;
  m.yarn_beta_slow = x.yarn_beta_slow;
  m.yarn_mscale = x.mscale;
  m.yarn_mscale_all_dim = x.mscale_all_dim;
  m.yarn_round_to_int = x.yarn_correction_range_round_to_int;
}

// --multi-latent-attention and its sizes; --rope-type, which Megatron reads for it alone.
inline void resolve_latent_attention(const CLI::App& app, TrainArgs& a) {
  models::ModelConfig& m = a.model;
  constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
  if (!m.multi_latent_attention) {
    for (const char* flag : {"--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--rope-type"})
      if (app.count(flag) > 0)
        a.notes.push_back(std::string(flag) + ": without --multi-latent-attention it changes nothing (as in Megatron)");
    return;
  }
  check_range("--q-lora-rank", m.q_lora_rank, 0, kIntMax, "rank of the queries' latent; 0 = none");
  check_range("--kv-lora-rank", m.kv_lora_rank, 1, kIntMax, "rank of the keys' and values' latent");
  check_range("--qk-head-dim", m.qk_head_dim, 1, kIntMax, "query/key head dimensions without RoPE");
  check_range("--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim, 2, kIntMax, "query/key head dimensions with RoPE (even)");
  check_range("--v-head-dim", m.v_head_dim, 1, kIntMax, "value head dimensions");
  // YaRN unless --rope-type rope: resolve_yarn.
  // Megatron's multi-latent attention turns interleaved pairs (it de-interleaves before rotating halves,
  // as DeepSeek's rope_interleave does); --rotary-interleaved on top would rotate another pairing.
  if (app.count("--rotary-interleaved") > 0)
    fail<ConfigError>("--rotary-interleaved with --multi-latent-attention: Megatron's multi-latent attention already turns "
                      "interleaved pairs (DeepSeek's rope_interleave); drop --rotary-interleaved");
  m.rotary_interleaved = true;
  if (app.count("--kv-channels") > 0)
    a.notes.emplace_back("--kv-channels: multi-latent attention's heads are --qk-head-dim + --qk-pos-emb-head-dim wide "
                         "(queries and keys) and --v-head-dim (values), so it changes nothing, as in Megatron");
}

// --recompute-modules, Megatron's names: read with --recompute-granularity selective only (a note
// otherwise). strata recomputes core_attn (the attention core), moe_act (the routed experts'
// activation function) and moe (the whole MoE block); a list with none of them recomputes nothing, and
// the other modules keep their activations, which a note names.
inline void resolve_recompute_modules(TrainArgs& a) {
  if (a.recompute_modules.empty()) return;
  static constexpr const char* kKnown[] = {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"};
  std::istringstream in(a.recompute_modules);
  std::string kept;
  for (std::string name; in >> name;) {
    if (std::find_if(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return name == k; }) == std::end(kKnown))
      fail<ConfigError>("--recompute-modules ", name, ": not one of Megatron's modules core_attn, moe_act, layernorm, "
                        "mla_up_proj, mlp, moe, shared_experts");
    if (name != "core_attn" && name != "moe_act" && name != "moe") kept += (kept.empty() ? "" : ", ") + name;
  }
  if (a.recompute_granularity != "selective") {
    a.notes.emplace_back("--recompute-modules " + a.recompute_modules +
                         ": read with --recompute-granularity selective only, as in Megatron; it changes nothing here");
    return;
  }
  const bool core_attn = names_recompute_module(a.recompute_modules, "core_attn");
  const bool moe_act = names_recompute_module(a.recompute_modules, "moe_act");
  const bool moe = names_recompute_module(a.recompute_modules, "moe");
  if ((moe_act || moe) && a.model.moe.num_experts == 0)
    a.notes.emplace_back("--recompute-modules " + std::string(moe ? "moe" : "moe_act") +
                         ": the model has no experts, so there is no MoE block to recompute");
  if (!core_attn && !moe_act && !moe) a.recompute_granularity.clear();  // selective without a module strata recomputes
  if (!kept.empty())
    a.notes.emplace_back("--recompute-modules " + a.recompute_modules +
                         ": strata recomputes the attention core (core_attn), the experts' activation (moe_act) and the "
                         "MoE block (moe)" +
                         (core_attn || moe_act || moe ? "" : ", which this list leaves out, so nothing is recomputed") +
                         "; " + kept + " keep their activations: the same numbers as Megatron's, more activation memory");
}

inline void resolve_building_blocks(const CLI::App& app, TrainArgs& a) {
  resolve_sliding_window(a);
  ArchitectureArgs& x = a.architecture;
  models::ModelConfig& m = a.model;
  // The preset's SwiGLU (train_llama, train_mixtral) yields to an activation the command line names;
  // --swiglu given with another is refused below (resolve_architecture).
  if (x.swiglu && app.count("--swiglu") == 0 && (x.quick_geglu || x.squared_relu)) x.swiglu = false;
  m.activation = x.squared_relu ? MlpActivation::squared_relu
                 : x.quick_geglu ? MlpActivation::quick_geglu
                 : MlpActivation::preset;
  if (x.use_rope_scaling) {
    if (!(std::isfinite(x.rope_scaling_factor) && x.rope_scaling_factor > 0))
      fail<ConfigError>("--rope-scaling-factor ", x.rope_scaling_factor, " must be a finite number > 0 (Llama 3.1: 8)");
    m.rope_scaling_factor = x.rope_scaling_factor;
  } else if (app.count("--rope-scaling-factor") > 0) {
    a.notes.emplace_back("--rope-scaling-factor without --use-rope-scaling: no scaling, the factor changes nothing (as in Megatron)");
  }
  resolve_yarn(app, a);
  m.softmax_type = x.softmax_type == "off-by-one" ? SoftmaxType::off_by_one
                   : x.softmax_type == "learnable" ? SoftmaxType::learnable
                                                   : SoftmaxType::vanilla;
  if (app.count("--rotary-percent") > 0 && !(m.rotary_percent > 0 && m.rotary_percent <= 1))
    fail<ConfigError>("--rotary-percent ", m.rotary_percent, " must be in (0, 1]: the share of each head's dimensions RoPE turns");
  if (x.position_embedding_type != "rope" && x.position_embedding_type != "yarn") {
    for (const char* flag : {"--rotary-percent", "--rotary-interleaved", "--use-rope-scaling", "--rotary-base"})
      if (app.count(flag) > 0)
        a.notes.push_back(std::string(flag) + ": without --position-embedding-type rope there is no RoPE, so it changes nothing");
    m.rotary_percent = 1.0, m.rotary_interleaved = false, m.rope_scaling_factor = 0;
  }
  resolve_latent_attention(app, a);
  if ((app.count("--activation-func-clamp-value") > 0 || app.count("--glu-linear-offset") > 0) && !x.gated())
    fail<ConfigError>("--activation-func-clamp-value and --glu-linear-offset apply to a gated MLP (--swiglu or --quick-geglu); "
                      "add one of them or drop the flag");
}

// After parsing, what Megatron's validate_args settles from what was given: without
// --group-query-attention every head has its own keys and values; an absent --ffn-hidden-size is
// 4 x hidden, or with --swiglu 2/3 of that rounded down to a multiple of 64; an absent
// --global-batch-size is micro-batch x data parallel (0 here, resolve_run settles it); --train-iters
// and --train-samples exclude each other. Also the architecture (ConfigError when no compiled model
// matches).
inline void finish_command_line(const CLI::App& app, TrainArgs& a) {
  if (app.count("--train-iters") > 0 && app.count("--train-samples") > 0)
    fail<ConfigError>("--train-iters and --train-samples both set the run's length; give one, as Megatron");
  if (app.count("--global-batch-size") == 0) a.global_batch_size = 0;
  else check_range("--global-batch-size", a.global_batch_size, 1, std::numeric_limits<int>::max(), "sequences per iteration");
  if (app.count("--kv-channels") > 0)
    check_range("--kv-channels", a.model.kv_channels, 1, std::numeric_limits<int>::max(),
                "head size; without it --hidden-size / --num-attention-heads");
  resolve_building_blocks(app, a);
  resolve_recompute_modules(a);
  if (a.num_distributed_optimizer_instances != 1)
    fail<ConfigError>("--num-distributed-optimizer-instances ", a.num_distributed_optimizer_instances,
                      ": several copies of the distributed optimizer (Megatron's partial sharding over data parallelism) are "
                      "not available; give 1 (the default: each data-parallel rank holds one shard)");
  if (const auto seed = app.get_option("--seed")->results(); !seed.empty() && !seed.back().empty() && seed.back().front() == '-')
    fail<ConfigError>("--seed ", seed.back(), " is negative: the seed must be an integer >= 0 (Megatron seeds numpy's "
                      "generator with it, which refuses negative seeds)");
  // Flags whose default (-1) means "not given": a given one must be a real value.
  constexpr double kMax = std::numeric_limits<double>::max();
  if (app.count("--lr-warmup-fraction") > 0)
    check_real("--lr-warmup-fraction", a.lr_warmup_fraction, 0, 1, "the warmup as a fraction of the decay length");
  if (app.count("--decoupled-lr") > 0)
    check_real("--decoupled-lr", a.decoupled_lr, 0, kMax, "the embedding and output layer's peak learning rate");
  if (app.count("--decoupled-min-lr") > 0)
    check_real("--decoupled-min-lr", a.decoupled_min_lr, 0, kMax, "the embedding and output layer's minimum learning rate");
  // One parameter type: --fp16, --bf16 and --dtype must not disagree.
  const std::string dtype_flag = app.count("--dtype") > 0 ? app.get_option("--dtype")->as<std::string>() : std::string();
  if (app.count("--fp16") > 0 && (app.count("--bf16") > 0 || (!dtype_flag.empty() && dtype_flag != "fp16")))
    fail<ConfigError>("--fp16 asks for fp16 parameters, but ", app.count("--bf16") > 0 ? std::string("--bf16") : "--dtype " + dtype_flag,
                      " asks for another type; give one of them");
  if (app.count("--bf16") > 0 && !dtype_flag.empty() && dtype_flag != "bf16")
    fail<ConfigError>("--bf16 asks for bf16 parameters, but --dtype ", dtype_flag, " asks for another type; give one of them");
  if (a.no_load_optim && a.load.empty())
    a.notes.emplace_back("--no-load-optim without --load: there is nothing to load, so the flag changes nothing (as in Megatron)");
  if (a.no_load_rng)
    a.notes.emplace_back("--no-load-rng: every random draw is a function of --seed and the iteration, so there is no generator "
                         "state to load or skip");
  if (app.count("--step-batch-size-schedule") > 0 && app.count("--global-batch-size") > 0)
    fail<ConfigError>("--step-batch-size-schedule sets the global batch; drop --global-batch-size, as Megatron");
  if (!a.rampup_batch_size.empty() && app.count("--global-batch-size") == 0)
    fail<ConfigError>("--rampup-batch-size grows the global batch up to --global-batch-size: give it");
  if (!a.architecture.group_query_attention) {
    if (app.count("--num-query-groups") > 0 && a.model.num_query_groups != 0 && a.model.num_query_groups != a.model.num_attention_heads)
      a.notes.push_back(::strata::detail::concat("--num-query-groups ", a.model.num_query_groups,
                                                 ": ignored without --group-query-attention (every head has its own keys "
                                                 "and values), as in Megatron"));
    a.model.num_query_groups = 0;
  }
  if (a.model.ffn_hidden_size == 0 && a.architecture.swiglu) {
    a.model.ffn_hidden_size = static_cast<int>(4.0 * a.model.hidden_size * 2.0 / 3.0 / 64.0) * 64;
    if (a.model.ffn_hidden_size == 0)
      fail<ConfigError>("--swiglu with --hidden-size ", a.model.hidden_size, " makes Megatron's default MLP width ",
                        "(2/3 x 4 x hidden, rounded down to 64) zero; pass --ffn-hidden-size");
  }
  if (app.count("--sample-tokens") == 0 && (a.pipeline.pipeline_model_parallel_size > 1 || a.context_parallel_size > 1))
    a.sample_tokens = 0;  // whole model and whole sequences only
  resolve_moe_flags(a);
  if (app.count("--tokenizer-type") == 0 && !a.tokenizer.vocab_file.empty() && !a.tokenizer.merge_file.empty()) {
    a.tokenizer.type = "GPT2BPETokenizer";  // Megatron's GPT examples give the files alone
    a.notes.emplace_back("--vocab-file and --merge-file without --tokenizer-type: GPT2BPETokenizer");
  }
  a.model_kind = resolve_architecture(a.architecture, a.model);
  // The Llama block without --disable-bias-linear: Megatron's default biases (GPT-2 always has them).
  a.model.add_bias_linear = a.model_kind != "gpt" && !a.architecture.disable_bias_linear;
}

// Parses `flags` over a trainer's defaults (CLI::ParseError and ConfigError as thrown).
inline TrainArgs parse_flags(const std::string& kind, std::vector<std::string> flags) {
  TrainArgs a = command_line_defaults(kind);
  CLI::App app;
  add_options(app, a);
  std::reverse(flags.begin(), flags.end());  // CLI11 takes a vector in reverse order
  app.parse(flags);
  finish_command_line(app, a);
  return a;
}

// What is left to settle before validation, once the device and world size are known: the
// tokenizer (its files read and checked) and the model's vocabulary from it (NullTokenizer: its
// --vocab-size ids and the end-of-document id; another: the tokenizer's, or --vocab-size when
// larger), the global batch when not given (micro-batch x data parallel), the iterations of
// --train-samples, and sequence parallelism off with a note when tensor parallel is 1 (Megatron).
inline data::Tokenizer resolve_run(TrainArgs& a) {
  data::Tokenizer tokenizer = data::make_tokenizer(tokenizer_options_of(a));
  if (a.tokenizer.type == "NullTokenizer") {
    a.model.vocab_size = static_cast<int>(tokenizer.vocab_size());
  } else if (a.tokenizer.vocab_size > 0) {
    if (a.tokenizer.vocab_size < tokenizer.vocab_size())
      fail<ConfigError>("--vocab-size ", a.tokenizer.vocab_size, " is smaller than the ", tokenizer.name(), "'s ",
                        tokenizer.vocab_size(), " ids; drop --vocab-size or raise it");
    a.model.vocab_size = static_cast<int>(std::min<std::int64_t>(a.tokenizer.vocab_size, std::numeric_limits<int>::max()));
  } else {
    a.model.vocab_size = static_cast<int>(std::max<std::int64_t>(a.model.vocab_size, tokenizer.vocab_size()));
  }
  const int pp = a.pipeline.pipeline_model_parallel_size;
  const int model_parallel = a.tensor_model_parallel_size * pp * std::max(1, a.context_parallel_size);
  if (a.global_batch_size == 0 && model_parallel > 0 && a.world_size % model_parallel == 0) {
    a.global_batch_size = static_cast<int>(
        checked_int(checked_mul(a.micro_batch_size, a.world_size / model_parallel, "--micro-batch-size x data parallel"),
                    "the global batch"));
    if (!a.step_batch_size_schedule.empty()) a.global_batch_size = batch_schedule_of(a).final_batch;
  }
  if (a.train_samples > 0 && a.global_batch_size > 0) {
    const std::int64_t iterations = iterations_of(a, batch_schedule_of(a));
    if (iterations < 1 || iterations > std::numeric_limits<int>::max())
      fail<ConfigError>("--train-samples ", a.train_samples, " makes ", iterations, " iterations of global batches of ",
                        a.global_batch_size, "; it must make at least one");
    a.train_iters = static_cast<int>(iterations);
  }
  if (a.sample_tokens > 0 && a.tokenizer.type == "NullTokenizer" && a.sample_prompt == TrainArgs{}.sample_prompt)
    a.sample_prompt.clear();  // NullTokenizer reads ids, not text: the sample starts after an end of document
  if (a.sample_tokens > 0 && !a.sample_prompt.empty()) {  // refused now, not after training
    try {
      (void)tokenizer.encode(a.sample_prompt);
    } catch (const Error& e) {
      fail<ConfigError>("--sample-prompt \"", a.sample_prompt, "\" does not encode with ", tokenizer.name(), ": ", e.what());
    }
  }
  if (a.tp_comm_overlap && a.tensor_model_parallel_size > 1 && !a.sequence_parallel)
    fail<ConfigError>("--tp-comm-overlap: tensor-parallel communication overlaps the GEMMs only under sequence "
                      "parallelism (as in Megatron); add --sequence-parallel");
  if (a.sequence_parallel && a.tensor_model_parallel_size == 1) {
    a.sequence_parallel = false;
    a.notes.emplace_back("--sequence-parallel: disabled because tensor parallelism is 1, as in Megatron");
  }
  if (a.tp_comm_overlap && a.tensor_model_parallel_size == 1)
    a.notes.emplace_back("--tp-comm-overlap: nothing to overlap with tensor parallelism 1");
  if (!a.tp_comm_overlap) {  // the flags that refine --tp-comm-overlap mean nothing without it
    const auto refines = [](const auto&... flag) {
      fail<ConfigError>(flag..., " refines --tp-comm-overlap, which is off: add --tp-comm-overlap, or drop the flag");
    };
    if (a.disable_tp_comm_overlap_ag) refines("--disable-tp-comm-overlap-ag");
    if (a.disable_tp_comm_overlap_rs) refines("--disable-tp-comm-overlap-rs");
    if (a.tp_comm_overlap_gather != "copy-engines") refines("--tp-comm-overlap-gather ", a.tp_comm_overlap_gather);
    if (a.tp_comm_overlap_sm_margin > 0) refines("--tp-comm-overlap-sm-margin ", a.tp_comm_overlap_sm_margin);
  }
  return tokenizer;
}

}  // namespace trainer
