// The trainers' command line against Megatron's (megatron/training/arguments.py): each test names
// the Megatron behaviour it checks. Parsing only (examples/trainer/args.hpp): nothing trains here.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "trainer/args.hpp"

namespace {

using trainer::parse_flags;
using trainer::TrainArgs;

// Throws a ConfigError whose message holds every one of `parts`.
template <class F>
void expect_config_error(F&& f, std::vector<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no ConfigError";
  } catch (const strata::ConfigError& e) {
    const std::string m = e.what();
    for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  }
}

// Megatron's defaults for the flags that carry its names.
// Multi-token prediction's flags: Megatron's names and default weight; what it is not built for is
// refused before training with the flag named.
TEST(MegatronFlags, MultiTokenPrediction) {
  TrainArgs a = parse_flags("llama", {"--mtp-num-layers", "2", "--seq-length", "32"});
  EXPECT_EQ(a.model.mtp_num_layers, 2);
  EXPECT_EQ(a.model.mtp_loss_scaling_factor, 0.1);
  EXPECT_EQ(parse_flags("llama", {"--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3"}).model.mtp_loss_scaling_factor, 0.3);
  auto refused = [](const std::string& kind, std::vector<std::string> flags, std::vector<std::string> parts) {
    flags.insert(flags.end(), {"--mtp-num-layers", "1", "--global-batch-size", "8"});
    const TrainArgs args = parse_flags(kind, flags);
    expect_config_error([&] { trainer::validate(args); }, std::move(parts));
  };
  refused("gpt", {}, {"--mtp-num-layers 1", "Llama set"});
  refused("llama", {"--save-hf", "/tmp/x"}, {"--save-hf with --mtp-num-layers 1", "no multi-token prediction layers"});
  refused("llama", {"--mtp-loss-scaling-factor", "-1"}, {"mtp_loss_scaling_factor=-1"});
}

TEST(MegatronFlags, MultiLatentAttention) {
  const TrainArgs a = parse_flags("llama", {"--multi-latent-attention", "--q-lora-rank", "24", "--kv-lora-rank", "16",
                                            "--qk-head-dim", "12", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "10",
                                            "--rope-type", "rope"});
  EXPECT_TRUE(a.model.multi_latent_attention);
  EXPECT_EQ(a.model.q_lora_rank, 24);
  EXPECT_EQ(a.model.kv_lora_rank, 16);
  EXPECT_EQ(a.model.qk_head_dim, 12);
  EXPECT_EQ(a.model.qk_pos_emb_head_dim, 8);
  EXPECT_EQ(a.model.v_head_dim, 10);
  const TrainArgs defaults = parse_flags("llama", {"--multi-latent-attention"});  // Megatron's defaults
  EXPECT_EQ(defaults.model.q_lora_rank, 0);
  EXPECT_EQ(defaults.model.kv_lora_rank, 32);
  EXPECT_EQ(defaults.model.qk_head_dim, 128);
  EXPECT_EQ(defaults.model.qk_pos_emb_head_dim, 64);
  EXPECT_EQ(defaults.model.v_head_dim, 128);
  auto noted = [](const TrainArgs& args, const std::string& text) {
    for (const std::string& n : args.notes)
      if (n.find(text) != std::string::npos) return true;
    return false;
  };
  // Megatron's RoPE of multi-latent attention: YaRN (factor 1 by default: RoPE's frequencies) on
  // interleaved pairs; --rope-type rope without YaRN
  EXPECT_TRUE(defaults.model.rotary_interleaved);
  EXPECT_EQ(defaults.model.yarn_scaling_factor, 1.0);
  const TrainArgs deepseek = parse_flags("llama", {"--multi-latent-attention", "--rotary-scaling-factor", "40", "--mscale",
                                                   "1.0", "--mscale-all-dim", "1.0"});
  EXPECT_EQ(deepseek.model.yarn_scaling_factor, 40.0);
  EXPECT_EQ(deepseek.model.yarn_mscale_all_dim, 1.0);
  EXPECT_EQ(a.model.yarn_scaling_factor, 0.0);  // --rope-type rope
  EXPECT_TRUE(a.model.rotary_interleaved);
  EXPECT_TRUE(noted(parse_flags("llama", {"--kv-lora-rank", "16"}), "--kv-lora-rank: without --multi-latent-attention"));
  EXPECT_FALSE(parse_flags("llama", {"--kv-lora-rank", "16"}).model.multi_latent_attention);
  expect_config_error([] { parse_flags("llama", {"--multi-latent-attention", "--rotary-interleaved"}); },
                      {"--rotary-interleaved with --multi-latent-attention", "interleaved pairs"});
  // Hugging Face's class of multi-latent attention is DeepSeek-V3's, a mixture of experts; its router is refused
  // where DeepseekV3ForCausalLM cannot express it.
  expect_config_error(
      [] {
        trainer::validate(parse_flags("llama", {"--multi-latent-attention", "--qk-layernorm", "--save-hf", "/tmp/x",
                                                "--global-batch-size", "8"}));
      },
      {"--save-hf", "multi-latent attention without experts"});
  expect_config_error(
      [] {
        trainer::validate(parse_flags("mixtral", {"--multi-latent-attention", "--qk-layernorm", "--save-hf", "/tmp/x", "--global-batch-size",
                                                  "8", "--num-experts", "4",
                                                  "--moe-shared-expert-intermediate-size", "32", "--moe-ffn-hidden-size", "32"}));
      },
      {"--save-hf", "DeepseekV3ForCausalLM", "sigmoid"});
  expect_config_error([] { parse_flags("llama", {"--multi-latent-attention", "--qk-pos-emb-head-dim", "0"}); },
                      {"--qk-pos-emb-head-dim=0"});
}

// The flags of Megatron's gpt-oss and DeepSeek-V3 example lines that strata answers with its own
// meaning: --lr-warmup-init, --recompute-modules, the flex dispatcher, forced balance, one optimizer
// instance, --enable-gpt-oss.
TEST(MegatronFlags, ExampleLineFlagsOfGptOssAndDeepSeek) {
  auto has_note = [](const TrainArgs& args, const std::string& text) {
    return std::any_of(args.notes.begin(), args.notes.end(), [&](const std::string& n) { return n.find(text) != std::string::npos; });
  };
  const TrainArgs warm = parse_flags("gpt", {"--lr-warmup-init", "3.9e-7", "--lr-warmup-iters", "4", "--train-iters", "10",
                                                "--global-batch-size", "2"});
  EXPECT_EQ(trainer::schedule_of(warm).warmup_init, 3.9e-7);
  EXPECT_EQ(trainer::schedule_of(warm).lr(0), 3.9e-7);

  // selective recompute is the attention core, the experts' activation and the MoE block: a list with
  // none of core_attn, moe_act, moe recomputes nothing
  const TrainArgs deepseek = parse_flags("mixtral", {"--recompute-granularity", "selective", "--recompute-modules", "mlp", "moe",
                                                     "mla_up_proj", "layernorm"});
  EXPECT_EQ(trainer::recompute_of(deepseek).granularity, strata::models::RecomputeGranularity::selective);
  EXPECT_TRUE(trainer::recompute_of(deepseek).moe_block);
  EXPECT_FALSE(trainer::recompute_of(deepseek).attention_core);
  EXPECT_TRUE(has_note(deepseek, "; mlp, mla_up_proj, layernorm keep their activations"));
  const TrainArgs none = parse_flags("llama", {"--recompute-granularity", "selective", "--recompute-modules", "mlp",
                                               "mla_up_proj", "layernorm"});
  EXPECT_EQ(trainer::recompute_of(none).granularity, strata::models::RecomputeGranularity::none);
  EXPECT_TRUE(has_note(none, "so nothing is recomputed"));
  // the MoE block recomputed draws forced balance's random logits again: accepted (Megatron's DeepSeek-V3 line)
  EXPECT_TRUE(trainer::recompute_of(parse_flags("mixtral", {"--recompute-activations", "--recompute-modules", "moe",
                                                            "--moe-router-force-load-balancing"})).moe_block);
  const TrainArgs core = parse_flags("llama", {"--recompute-activations", "--recompute-modules", "core_attn", "mlp"});
  EXPECT_EQ(trainer::recompute_of(core).granularity, strata::models::RecomputeGranularity::selective);
  EXPECT_TRUE(has_note(core, "mlp keep their activations"));
  EXPECT_TRUE(trainer::recompute_of(core).attention_core);
  EXPECT_FALSE(trainer::recompute_of(core).moe_activation);
  // moe_act alone: the experts' activation, not the attention core
  const TrainArgs moe_act = parse_flags("mixtral", {"--recompute-granularity", "selective", "--recompute-modules", "moe_act"});
  EXPECT_EQ(trainer::recompute_of(moe_act).granularity, strata::models::RecomputeGranularity::selective);
  EXPECT_FALSE(trainer::recompute_of(moe_act).attention_core);
  EXPECT_TRUE(trainer::recompute_of(moe_act).moe_activation);
  const TrainArgs both = parse_flags("mixtral", {"--recompute-activations", "--recompute-modules", "core_attn", "moe_act", "moe"});
  EXPECT_TRUE(trainer::recompute_of(both).attention_core);
  EXPECT_TRUE(trainer::recompute_of(both).moe_activation);
  EXPECT_TRUE(trainer::recompute_of(both).moe_block);
  EXPECT_FALSE(has_note(both, "keep their activations"));
  EXPECT_TRUE(has_note(parse_flags("llama", {"--recompute-activations", "--recompute-modules", "moe_act"}), "no experts"));
  // --recompute-activations alone: the attention core (Megatron's default list)
  EXPECT_TRUE(trainer::recompute_of(parse_flags("mixtral", {"--recompute-activations"})).attention_core);
  EXPECT_FALSE(trainer::recompute_of(parse_flags("mixtral", {"--recompute-activations"})).moe_activation);
  EXPECT_TRUE(has_note(parse_flags("llama", {"--recompute-modules", "core_attn"}), "selective only"));
  expect_config_error([] { parse_flags("llama", {"--recompute-activations", "--recompute-modules", "attention"}); },
                      {"--recompute-modules attention", "core_attn"});

  const TrainArgs flex = parse_flags("mixtral", {"--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep",
                                                 "--moe-router-force-load-balancing"});
  EXPECT_EQ(flex.model.moe.token_dispatcher, strata::MoeDispatcherType::alltoall);
  EXPECT_TRUE(has_note(flex, "--moe-flex-dispatcher-backend hybridep): strata's all-to-all dispatcher"));
  EXPECT_TRUE(flex.model.moe.force_load_balancing);
  EXPECT_TRUE(has_note(parse_flags("mixtral", {"--moe-flex-dispatcher-backend", "deepep"}), "flex only"));

  EXPECT_EQ(parse_flags("gpt", {"--num-distributed-optimizer-instances", "1"}).num_distributed_optimizer_instances, 1);
  expect_config_error([] { parse_flags("gpt", {"--num-distributed-optimizer-instances", "2"}); },
                      {"--num-distributed-optimizer-instances 2", "give 1"});

  // Megatron's --enable-gpt-oss sets YaRN with gpt-oss's values over the flags' own
  const TrainArgs oss = parse_flags("llama", {"--enable-gpt-oss", "--rotary-scaling-factor", "4"});
  EXPECT_EQ(oss.model.yarn_scaling_factor, 32.0);
  EXPECT_EQ(oss.model.yarn_original_max_positions, 131072.0);
  EXPECT_FALSE(oss.model.yarn_round_to_int);
  EXPECT_EQ(oss.model.yarn_mscale_all_dim, 0.0);
  EXPECT_TRUE(has_note(oss, "--enable-gpt-oss"));

  // gpt-oss's experts run quick GeGLU with the clamp and offset (a dense model's flags, now a MoE's too)
  const TrainArgs experts = parse_flags("mixtral", {"--quick-geglu", "--activation-func-clamp-value", "7", "--glu-linear-offset", "1"});
  EXPECT_EQ(experts.model.activation, strata::MlpActivation::quick_geglu);
  EXPECT_NO_THROW(strata::models::validate(experts.model, trainer::parallel_config_of(experts), false));
  EXPECT_TRUE(has_note(parse_flags("llama", {"--multi-latent-attention", "--kv-channels", "16"}), "--kv-channels: multi-latent"));
}

TEST(MegatronFlags, DefaultsAreMegatrons) {
  const TrainArgs a = parse_flags("gpt", {});
  EXPECT_EQ(a.tensor_model_parallel_size, 1);
  EXPECT_FALSE(a.sequence_parallel);
  EXPECT_EQ(a.model.hidden_dropout, 0.1);
  EXPECT_EQ(a.model.attention_dropout, 0.1);
  EXPECT_EQ(a.lr_warmup_iters, 0);
  EXPECT_EQ(a.min_lr, 0.0);
  EXPECT_EQ(a.lr_decay_style, "linear");
  EXPECT_EQ(a.weight_decay, 0.01);
  EXPECT_EQ(a.adam_beta1, 0.9);
  EXPECT_EQ(a.adam_beta2, 0.999);
  EXPECT_EQ(a.adam_eps, 1e-8);
  EXPECT_EQ(a.clip_grad, 1.0);
  EXPECT_EQ(a.model.init_method_std, 0.02);
  EXPECT_EQ(a.model.make_vocab_size_divisible_by, 128);
  EXPECT_EQ(a.model.rope_base, 10000.0);
  EXPECT_EQ(a.model.norm_epsilon, 1e-5);
  EXPECT_EQ(a.seed, 1234u);
  EXPECT_EQ(a.log_interval, 100);
  EXPECT_EQ(a.eval_iters, 100);
  EXPECT_EQ(a.eval_interval, 0);  // Megatron's None: evaluate at the end only
  EXPECT_EQ(a.distributed_timeout_minutes, 10);
  EXPECT_EQ(a.initial_loss_scale, 4294967296.0);
  EXPECT_EQ(a.loss_scale_window, 1000);
  EXPECT_EQ(a.hysteresis, 2);
  EXPECT_EQ(a.tokenizer.type, "ByteTokenizer");
  EXPECT_EQ(a.model_kind, "gpt");  // GPT-2's architecture set is Megatron's default
}

// --global-batch-size absent: micro-batch x data parallel (Megatron's validate_args).
TEST(MegatronFlags, GlobalBatchDefaultsToMicroBatchTimesDataParallel) {
  TrainArgs a = parse_flags("gpt", {"--world-size", "4", "--tensor-model-parallel-size", "2", "--micro-batch-size", "3"});
  EXPECT_EQ(a.global_batch_size, 0);
  (void)trainer::resolve_run(a);
  EXPECT_EQ(a.global_batch_size, 6);
  TrainArgs b = parse_flags("gpt", {"--micro-batch-size", "3", "--global-batch-size", "12"});
  (void)trainer::resolve_run(b);
  EXPECT_EQ(b.global_batch_size, 12);
}

// Megatron disables sequence parallelism when tensor parallelism is 1, with a warning.
TEST(MegatronFlags, SequenceParallelIsTurnedOffAtTensorParallelOne) {
  TrainArgs a = parse_flags("gpt", {"--sequence-parallel"});
  EXPECT_TRUE(a.sequence_parallel);
  (void)trainer::resolve_run(a);
  EXPECT_FALSE(a.sequence_parallel);
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_NE(a.notes[0].find("tensor parallelism is 1"), std::string::npos);
  TrainArgs b = parse_flags("gpt", {"--sequence-parallel", "--tensor-model-parallel-size", "2"});
  (void)trainer::resolve_run(b);
  EXPECT_TRUE(b.sequence_parallel);
}

// Megatron: "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism
// is enabled"; at tensor parallelism 1 there is nothing to overlap (a note).
TEST(MegatronFlags, TpCommOverlapNeedsSequenceParallelism) {
  TrainArgs a = parse_flags("gpt", {"--tp-comm-overlap", "--tensor-model-parallel-size", "2"});
  expect_config_error([&] { (void)trainer::resolve_run(a); }, {"--tp-comm-overlap", "--sequence-parallel"});
  TrainArgs b = parse_flags("gpt", {"--tp-comm-overlap", "--sequence-parallel", "--tensor-model-parallel-size", "2"});
  (void)trainer::resolve_run(b);
  EXPECT_TRUE(b.tp_comm_overlap);
  EXPECT_TRUE(b.refused.empty());
  TrainArgs c = parse_flags("gpt", {"--tp-comm-overlap"});
  (void)trainer::resolve_run(c);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_NE(c.notes[0].find("nothing to overlap"), std::string::npos);
  // Megatron's --disable-tp-comm-overlap-ag / -rs refine --tp-comm-overlap and mean nothing without it.
  TrainArgs d = parse_flags("gpt", {"--tp-comm-overlap", "--sequence-parallel", "--tensor-model-parallel-size", "2",
                                    "--disable-tp-comm-overlap-ag", "--disable-tp-comm-overlap-rs"});
  (void)trainer::resolve_run(d);
  EXPECT_TRUE(d.disable_tp_comm_overlap_ag);
  EXPECT_TRUE(d.disable_tp_comm_overlap_rs);
  TrainArgs e = parse_flags("gpt", {"--disable-tp-comm-overlap-rs", "--sequence-parallel", "--tensor-model-parallel-size", "2"});
  expect_config_error([&] { (void)trainer::resolve_run(e); }, {"--disable-tp-comm-overlap-rs", "--tp-comm-overlap"});
  // The SM margin of the GEMMs beside the collectives refines --tp-comm-overlap too, and is not negative.
  TrainArgs f = parse_flags("gpt", {"--tp-comm-overlap", "--sequence-parallel", "--tensor-model-parallel-size", "2",
                                    "--tp-comm-overlap-sm-margin", "16"});
  (void)trainer::resolve_run(f);
  EXPECT_EQ(f.tp_comm_overlap_sm_margin, 16);
  TrainArgs g = parse_flags("gpt", {"--tp-comm-overlap-sm-margin", "16", "--sequence-parallel", "--tensor-model-parallel-size", "2"});
  expect_config_error([&] { (void)trainer::resolve_run(g); }, {"--tp-comm-overlap-sm-margin", "--tp-comm-overlap"});
  // So does the way the overlapped all-gathers move their blocks.
  TrainArgs h = parse_flags("gpt", {"--tp-comm-overlap", "--sequence-parallel", "--tensor-model-parallel-size", "2",
                                    "--tp-comm-overlap-gather", "collective"});
  (void)trainer::resolve_run(h);
  EXPECT_EQ(h.tp_comm_overlap_gather, "collective");
  TrainArgs i = parse_flags("gpt", {"--tp-comm-overlap-gather", "collective", "--sequence-parallel", "--tensor-model-parallel-size", "2"});
  expect_config_error([&] { (void)trainer::resolve_run(i); }, {"--tp-comm-overlap-gather", "--tp-comm-overlap"});
  TrainArgs j = parse_flags("gpt", {"--tp-comm-overlap", "--sequence-parallel", "--tensor-model-parallel-size", "2",
                                    "--tp-comm-overlap-gather", "copy-engines"});
  (void)trainer::resolve_run(j);
  EXPECT_EQ(j.tp_comm_overlap_gather, "copy-engines");
  // copy-engines is the default (the fastest measured); ring is refused without --tp-comm-overlap too.
  EXPECT_EQ(parse_flags("gpt", {}).tp_comm_overlap_gather, "copy-engines");
  TrainArgs k = parse_flags("gpt", {"--tp-comm-overlap-gather", "ring", "--sequence-parallel", "--tensor-model-parallel-size", "2"});
  expect_config_error([&] { (void)trainer::resolve_run(k); }, {"--tp-comm-overlap-gather ring", "--tp-comm-overlap"});
}

// Megatron: --ffn-hidden-size absent is 4 x hidden, or with --swiglu int(4 h 2/3 / 64) x 64.
TEST(MegatronFlags, FfnDefaultFollowsMegatronsRule) {
  EXPECT_EQ(parse_flags("gpt", {"--hidden-size", "768", "--num-attention-heads", "12"}).model.ffn(), 3072);
  EXPECT_EQ(parse_flags("gpt", {"--hidden-size", "768", "--ffn-hidden-size", "1000"}).model.ffn(), 1000);
  EXPECT_EQ(parse_flags("gpt", {}).model.ffn(), 512);
  EXPECT_EQ(parse_flags("llama", {"--hidden-size", "4096", "--num-attention-heads", "32"}).model.ffn(), 10880);
  EXPECT_EQ(parse_flags("llama", {}).model.ffn(), 320);  // hidden 128: 341.3 -> 320
  expect_config_error([] { (void)parse_flags("llama", {"--hidden-size", "16", "--num-attention-heads", "2"}); },
                      {"--swiglu", "--ffn-hidden-size"});
}

// Megatron reads --num-query-groups only with --group-query-attention.
TEST(MegatronFlags, QueryGroupsOnlyWithGroupQueryAttention) {
  const TrainArgs without = parse_flags("llama", {"--num-query-groups", "2"});
  EXPECT_EQ(without.model.num_query_groups, 0);
  ASSERT_EQ(without.notes.size(), 1u);
  EXPECT_NE(without.notes[0].find("--group-query-attention"), std::string::npos);
  EXPECT_EQ(parse_flags("llama", {"--group-query-attention", "--num-query-groups", "2"}).model.num_query_groups, 2);
}

// --max-position-embeddings sizes the learned position table; --seq-length the samples.
TEST(MegatronFlags, MaxPositionEmbeddingsIsTheTableSeqLengthTheSample) {
  const TrainArgs a = parse_flags("gpt", {"--seq-length", "64", "--max-position-embeddings", "256"});
  EXPECT_EQ(a.model.seq_length, 64);
  EXPECT_EQ(a.model.positions(), 256);
  EXPECT_EQ(parse_flags("gpt", {"--seq-length", "64"}).model.positions(), 64);
  TrainArgs bad = parse_flags("gpt", {"--seq-length", "64", "--max-position-embeddings", "32"});
  (void)trainer::resolve_run(bad);
  expect_config_error([&] { trainer::validate(bad); }, {"--max-position-embeddings=32", "--seq-length=64"});
}

// pretrain_gpt.py chooses the architecture by flags: GPT-2's set (the defaults), the Llama set, and
// nothing else (strata names the flags the nearest compiled set still needs).
TEST(MegatronFlags, ArchitectureIsChosenByFlags) {
  EXPECT_EQ(parse_flags("gpt", {}).model_kind, "gpt");
  EXPECT_EQ(parse_flags("gpt", {"--use-mcore-models", "--position-embedding-type", "learned_absolute"}).model_kind, "gpt");
  const std::vector<std::string> llama = {"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                                          "--untie-embeddings-and-output-weights", "--disable-bias-linear"};
  EXPECT_EQ(parse_flags("gpt", llama).model_kind, "llama");
  EXPECT_FALSE(parse_flags("gpt", llama).model.add_bias_linear);
  EXPECT_EQ(parse_flags("llama", {}).model_kind, "llama");  // train_llama's preset
  EXPECT_FALSE(parse_flags("llama", {}).model.add_bias_linear);
  // without --disable-bias-linear, Megatron's default: the Llama block with every linear bias (gpt-oss)
  const std::vector<std::string> biased(llama.begin(), llama.end() - 1);
  EXPECT_EQ(parse_flags("gpt", biased).model_kind, "llama");
  EXPECT_TRUE(parse_flags("gpt", biased).model.add_bias_linear);
  EXPECT_FALSE(parse_flags("gpt", {}).model.add_bias_linear);  // GPT-2's biases are its own
  std::vector<std::string> mixed = llama;
  mixed[3] = "LayerNorm";
  expect_config_error([&] { (void)parse_flags("gpt", mixed); }, {"Llama", "--normalization RMSNorm"});
  expect_config_error([] { (void)parse_flags("gpt", {"--swiglu"}); }, {"GPT-2", "no --swiglu"});
  expect_config_error([] { (void)parse_flags("gpt", {"--group-query-attention", "--num-query-groups", "2"}); },
                      {"no --group-query-attention"});
  EXPECT_EQ(parse_flags("llama", {"--kv-channels", "32"}).model_kind, "llama");
  EXPECT_EQ(parse_flags("llama", {"--no-position-embedding"}).model_kind, "llama");
  expect_config_error([] { (void)parse_flags("gpt", {"--no-position-embedding"}); }, {"learned_absolute"});
}

// Megatron flags strata accepts without acting on them say so; those it lacks refuse the run.
TEST(MegatronFlags, UnavailableFeaturesAreNamedAndNoOpsAreNoted) {
  TrainArgs a = parse_flags("gpt", {"--attention-backend", "fused", "--cross-entropy-loss-fusion", "--manual-gc",
                                    "--context-parallel-size", "1"});
  EXPECT_EQ(a.notes.size(), 3u);  // --context-parallel-size is an option of its own, not a note
  EXPECT_TRUE(a.refused.empty());
  TrainArgs fp8_gather = parse_flags("gpt", {"--fp8-format", "hybrid", "--fp8-param-gather"});
  (void)trainer::resolve_run(fp8_gather);
  expect_config_error([&] { trainer::validate(fp8_gather); }, {"--fp8-param-gather", "--use-distributed-optimizer"});
  TrainArgs fp8_gathered = parse_flags("gpt", {"--fp8-format", "hybrid", "--fp8-param-gather", "--use-distributed-optimizer"});
  EXPECT_TRUE(fp8_gathered.fp8_param_gather);
  EXPECT_TRUE(fp8_gathered.refused.empty());
  expect_config_error([] { (void)parse_flags("gpt", {"--num-experts", "8"}); }, {"--num-experts 8", "Mixtral", "--swiglu"});
}

// Context parallelism: Megatron's flags and defaults; impossible layouts are refused naming the flags.
TEST(MegatronFlags, ContextParallelFlags) {
  TrainArgs cp = parse_flags("gpt", {"--context-parallel-size", "2", "--tensor-model-parallel-size", "1", "--world-size", "4"});
  EXPECT_EQ(cp.context_parallel_size, 2);
  EXPECT_EQ(cp.cp_comm_type, "p2p");  // Megatron's default
  EXPECT_EQ(cp.sample_tokens, 0);     // sampling needs whole sequences: off unless asked for
  (void)trainer::resolve_run(cp);
  EXPECT_NO_THROW(trainer::validate(cp));
  const auto parallel = trainer::parallel_config_of(cp);
  EXPECT_EQ(parallel.cp, 2);
  EXPECT_EQ(parallel.dp, 2);
  TrainArgs ulysses = parse_flags("gpt", {"--context-parallel-size", "2", "--tensor-model-parallel-size", "1",
                                          "--world-size", "2", "--cp-comm-type", "a2a"});
  (void)trainer::resolve_run(ulysses);
  EXPECT_NO_THROW(trainer::validate(ulysses));
  TrainArgs few_heads = parse_flags("llama", {"--context-parallel-size", "4", "--tensor-model-parallel-size", "1",
                                              "--world-size", "4", "--cp-comm-type", "a2a", "--group-query-attention",
                                              "--num-query-groups", "2"});
  (void)trainer::resolve_run(few_heads);
  expect_config_error([&] { trainer::validate(few_heads); }, {"--cp-comm-type a2a", "2 key/value heads"});
  // a2a+p2p (Megatron's hierarchical context parallelism): the two sizes, their product cp, the heads
  // over the all-to-all groups; the sizes without the comm type
  TrainArgs two_level = parse_flags("gpt", {"--context-parallel-size", "4", "--tensor-model-parallel-size", "1",
                                            "--world-size", "4", "--cp-comm-type", "a2a+p2p",
                                            "--hierarchical-context-parallel-sizes", "2", "2"});
  EXPECT_EQ(two_level.hierarchical_cp_sizes, (std::vector<int>{2, 2}));
  (void)trainer::resolve_run(two_level);
  EXPECT_NO_THROW(trainer::validate(two_level));
  EXPECT_EQ(trainer::context_parallel_comm_of(two_level), strata::ContextParallelComm::a2a_p2p);
  EXPECT_EQ(trainer::context_parallel_label(two_level), " a2a+p2p 2x2");
  auto two_level_with = [](std::vector<std::string> extra) {
    std::vector<std::string> flags = {"--context-parallel-size", "4", "--tensor-model-parallel-size", "1", "--world-size",
                                      "4"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    TrainArgs a = parse_flags("llama", flags);
    (void)trainer::resolve_run(a);
    return a;
  };
  const TrainArgs no_sizes = two_level_with({"--cp-comm-type", "a2a+p2p"});
  expect_config_error([&] { trainer::validate(no_sizes); }, {"--cp-comm-type a2a+p2p", "--hierarchical-context-parallel-sizes", "two sizes"});
  const TrainArgs product = two_level_with({"--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2", "3"});
  expect_config_error([&] { trainer::validate(product); }, {"--hierarchical-context-parallel-sizes 2 3", "--context-parallel-size 4"});
  const TrainArgs sizes_alone = two_level_with({"--hierarchical-context-parallel-sizes", "2", "2"});
  expect_config_error([&] { trainer::validate(sizes_alone); }, {"--hierarchical-context-parallel-sizes", "--cp-comm-type p2p"});
  const TrainArgs group_heads = two_level_with({"--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "4", "1",
                                                "--group-query-attention", "--num-query-groups", "2"});
  expect_config_error([&] { trainer::validate(group_heads); }, {"--cp-comm-type a2a+p2p", "2 key/value heads", "which 4"});
  TrainArgs unknown = parse_flags("gpt", {"--cp-comm-type", "ring"});
  (void)trainer::resolve_run(unknown);
  expect_config_error([&] { trainer::validate(unknown); }, {"--cp-comm-type ring"});
  TrainArgs uneven = parse_flags("gpt", {"--context-parallel-size", "3", "--tensor-model-parallel-size", "2", "--world-size", "8",
                                         "--global-batch-size", "8"});
  (void)trainer::resolve_run(uneven);
  expect_config_error([&] { trainer::validate(uneven); }, {"--context-parallel-size=3", "--world-size=8"});
  TrainArgs gpu = parse_flags("gpt", {"--context-parallel-size", "2", "--tensor-model-parallel-size", "1", "--device", "cuda"});
  gpu.sample_tokens = 0;
  (void)trainer::resolve_run(gpu);
  EXPECT_NO_THROW(trainer::check_context_parallel_args(gpu));  // ring attention runs on GPUs too
  TrainArgs pipeline = parse_flags("gpt", {"--context-parallel-size", "2", "--tensor-model-parallel-size", "1",
                                           "--pipeline-model-parallel-size", "2", "--world-size", "4"});
  (void)trainer::resolve_run(pipeline);
  EXPECT_NO_THROW(trainer::validate(pipeline));  // cp x pp
  TrainArgs length = parse_flags("gpt", {"--context-parallel-size", "2", "--tensor-model-parallel-size", "1",
                                         "--seq-length", "30"});
  (void)trainer::resolve_run(length);
  expect_config_error([&] { trainer::validate(length); }, {"2*cp=4", "seq_length=30"});
}

// Megatron's scheduler counts samples: with a constant batch the iteration schedule exactly.
TEST(MegatronFlags, LearningRateScheduleCountsSamples) {
  TrainArgs a = parse_flags("gpt", {"--global-batch-size", "8", "--train-iters", "100", "--lr-warmup-iters", "10",
                                    "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine"});
  (void)trainer::resolve_run(a);
  const strata::LrSchedule samples = trainer::schedule_of(a);
  const strata::LrSchedule iterations{.max_lr = 1e-3, .min_lr = 1e-4, .warmup_iters = 10, .decay_iters = 0,
                                      .style = strata::LrDecayStyle::cosine, .train_iters = 100};
  for (int it = 0; it <= 100; ++it) EXPECT_EQ(samples.lr(std::int64_t{it} * 8), iterations.lr(it)) << it;
  // --train-samples: iterations = samples / batch; warmup and decay in samples
  TrainArgs s = parse_flags("gpt", {"--global-batch-size", "8", "--train-samples", "800", "--lr-warmup-samples", "80",
                                    "--lr-decay-samples", "640"});
  (void)trainer::resolve_run(s);
  EXPECT_EQ(s.train_iters, 100);
  const strata::LrSchedule ss = trainer::schedule_of(s);
  EXPECT_EQ(ss.warmup_iters, 80);
  EXPECT_EQ(ss.effective_decay_iters(), 640);
  // --lr-warmup-fraction: that fraction of the decay
  TrainArgs f = parse_flags("gpt", {"--global-batch-size", "8", "--train-iters", "100", "--lr-warmup-fraction", "0.25"});
  (void)trainer::resolve_run(f);
  EXPECT_EQ(trainer::schedule_of(f).warmup_iters, 200);
  expect_config_error([] { (void)parse_flags("gpt", {"--train-iters", "5", "--train-samples", "40"}); }, {"give one"});
  // --decoupled-lr: the same warmup and decay between its own peak and minimum (else --min-lr)
  TrainArgs d = parse_flags("gpt", {"--global-batch-size", "8", "--train-iters", "100", "--lr-warmup-iters", "10", "--lr", "1e-3",
                                    "--min-lr", "1e-4", "--decoupled-lr", "5e-3", "--decoupled-min-lr", "5e-4"});
  (void)trainer::resolve_run(d);
  EXPECT_NO_THROW(trainer::validate(d));
  const auto ds = trainer::decoupled_schedule_of(d);
  ASSERT_TRUE(ds.has_value());
  EXPECT_DOUBLE_EQ(ds->lr(80), 5e-3);   // the end of warmup
  EXPECT_DOUBLE_EQ(ds->lr(800), 5e-4);  // the end of decay
  EXPECT_EQ(ds->warmup_iters, trainer::schedule_of(d).warmup_iters);
  EXPECT_FALSE(trainer::decoupled_schedule_of(parse_flags("gpt", {})).has_value());
  TrainArgs lonely = parse_flags("gpt", {"--decoupled-min-lr", "1e-5"});
  (void)trainer::resolve_run(lonely);
  expect_config_error([&] { trainer::validate(lonely); }, {"--decoupled-min-lr", "needs --decoupled-lr"});
  TrainArgs mixed = parse_flags("gpt", {"--global-batch-size", "8", "--train-samples", "800", "--lr-warmup-iters", "3"});
  (void)trainer::resolve_run(mixed);
  expect_config_error([&] { trainer::validate(mixed); }, {"--lr-warmup-samples"});
}

// --rampup-batch-size start increment samples (Megatron's older ramp-up) and
// --step-batch-size-schedule (thresholds in tokens): the batch of each iteration, the iterations of
// --train-samples.
TEST(MegatronFlags, BatchSizeSchedules) {
  TrainArgs r = parse_flags("gpt", {"--global-batch-size", "16", "--rampup-batch-size", "4", "4", "120", "--micro-batch-size",
                                    "2", "--train-iters", "40"});
  (void)trainer::resolve_run(r);
  const trainer::BatchSchedule ramp = trainer::batch_schedule_of(r);
  EXPECT_EQ(ramp.at(0), 4);
  EXPECT_EQ(ramp.at(39), 4);   // 3 increments over 120 samples: one every 40
  EXPECT_EQ(ramp.at(40), 8);
  EXPECT_EQ(ramp.at(80), 12);
  EXPECT_EQ(ramp.at(121), 16);
  EXPECT_NO_THROW(trainer::validate(r));
  TrainArgs s = parse_flags("gpt", {"--step-batch-size-schedule", "0:4 2K:8 4.5K:16", "--seq-length", "100",
                                    "--micro-batch-size", "2", "--train-samples", "200"});
  (void)trainer::resolve_run(s);
  const trainer::BatchSchedule steps = trainer::batch_schedule_of(s);
  EXPECT_EQ(s.global_batch_size, 16);
  EXPECT_EQ(steps.at(0), 4);
  EXPECT_EQ(steps.at(19), 4);  // 2000 tokens = 20 samples
  EXPECT_EQ(steps.at(20), 8);
  EXPECT_EQ(steps.at(45), 16);
  // 5 x 4 = 20, 4 x 8 = 52, then 16s: 68, 84, ..., 212 -> 5 + 4 + 10 iterations
  EXPECT_EQ(s.train_iters, 19);
  EXPECT_EQ(trainer::samples_of(steps, s.train_iters), 212);
  // samples_of sums the changing batches one by one and the settled batch in one product: equal to
  // adding every iteration's batch, at each count across the ramps' ends; and a billion iterations
  // are counted without a billion additions.
  for (const trainer::BatchSchedule* schedule : {&ramp, &steps}) {
    std::int64_t consumed = 0;
    for (std::int64_t iterations = 0; iterations <= 60; ++iterations) {
      EXPECT_EQ(trainer::samples_of(*schedule, iterations), consumed) << iterations << " iterations";
      consumed += schedule->at(consumed);
    }
  }
  EXPECT_EQ(trainer::samples_of(steps, 1'000'000'000), 212 - 16 * 19 + 16'000'000'000);
  // several arguments, as Megatron's GPT-3 example script passes them (its array expanded unquoted)
  EXPECT_EQ(parse_flags("gpt", {"--step-batch-size-schedule", "0:4", "2K:8", "4.5K:16", "--lr", "1e-3"}).step_batch_size_schedule,
            "0:4 2K:8 4.5K:16");
  TrainArgs odd = parse_flags("gpt", {"--step-batch-size-schedule", "0:3 1K:8", "--micro-batch-size", "2"});
  (void)trainer::resolve_run(odd);
  expect_config_error([&] { trainer::validate(odd); }, {"--step-batch-size-schedule 3", "micro-batch-size x data-parallel"});
  expect_config_error(
      [] {
        TrainArgs t = parse_flags("gpt", {"--step-batch-size-schedule", "1K:4"});
        (void)trainer::resolve_run(t);
      },
      {"first threshold must be 0"});
}

TEST(MegatronFlags, RepeatedFlagTakesTheLastValue) {
  const auto a = parse_flags("gpt", {"--lr", "1e-3", "--train-iters", "5", "--lr", "2e-3", "--train-iters", "7", "--quiet", "--quiet"});
  EXPECT_EQ(a.lr, 2e-3);
  EXPECT_EQ(a.train_iters, 7);
  EXPECT_TRUE(a.quiet);
  const auto b = parse_flags("gpt", {"--sequence-parallel", "--no-sequence-parallel"});
  EXPECT_FALSE(b.sequence_parallel);
}

// Megatron's launch lines: --data-path as several arguments (or one string), the last --data-path
// winning; --split with the quotes a script leaves in, and spaces.
TEST(MegatronFlags, DataPathTakesSeveralArgumentsAndSplitIgnoresQuotes) {
  const auto a = parse_flags("gpt", {"--data-path", "0.3", "corpus_a", "0.7", "corpus_b", "--lr", "1e-3"});
  EXPECT_EQ(a.data_path, "0.3 corpus_a 0.7 corpus_b");
  EXPECT_EQ(a.lr, 1e-3);
  EXPECT_EQ(parse_flags("gpt", {"--data-path", "0.5 x 0.5 y"}).data_path, "0.5 x 0.5 y");
  EXPECT_EQ(parse_flags("gpt", {"--data-path", "a", "--data-path", "0.1", "b", "0.9", "c"}).data_path, "0.1 b 0.9 c");
  for (const char* split : {"'99,1,0'", "\"99,1,0\"", "99, 1, 0", "99,1,0"})
    EXPECT_EQ(strata::data::parse_split(split), (std::vector<double>{0.99, 0.01, 0.0})) << split;
  EXPECT_THROW(strata::data::parse_split("'99,x,0'"), strata::ConfigError);
}

// The end-of-document id and the vocabulary come from the tokenizer (--eod-mask-loss masks that id).
TEST(MegatronFlags, VocabularyAndEndOfDocumentComeFromTheTokenizer) {
  TrainArgs byte = parse_flags("gpt", {});
  const strata::data::Tokenizer t = trainer::resolve_run(byte);
  EXPECT_EQ(t.eod(), 256);
  EXPECT_EQ(byte.model.vocab_size, 257);
  TrainArgs null = parse_flags("gpt", {"--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"});
  const strata::data::Tokenizer n = trainer::resolve_run(null);
  EXPECT_EQ(n.eod(), 999);  // Megatron's NullTokenizer: ids 0..N-1, end-of-document N - 1
  EXPECT_EQ(null.model.vocab_size, 1000);
  TrainArgs wider = parse_flags("gpt", {"--vocab-size", "50257"});  // a larger model vocabulary than the tokenizer's
  (void)trainer::resolve_run(wider);
  EXPECT_EQ(wider.model.vocab_size, 50257);
  EXPECT_EQ(null.sample_prompt, "");  // NullTokenizer reads ids: the default text prompt is dropped
  TrainArgs ids = parse_flags("gpt", {"--tokenizer-type", "NullTokenizer", "--vocab-size", "10", "--sample-prompt", "1 x"});
  expect_config_error([&] { (void)trainer::resolve_run(ids); }, {"--sample-prompt \"1 x\"", "NullTokenizer"});
  TrainArgs narrow = parse_flags("gpt", {"--vocab-size", "100"});
  expect_config_error([&] { (void)trainer::resolve_run(narrow); }, {"--vocab-size 100", "257"});
}

// --exit-interval, --exit-duration-in-mins, --distributed-timeout-minutes, --log-throughput are read.
TEST(MegatronFlags, RuntimeFlags) {
  const TrainArgs a = parse_flags("gpt", {"--exit-interval", "50", "--exit-duration-in-mins", "235", "--distributed-timeout-minutes",
                                          "60", "--log-throughput", "--recompute-activations"});
  EXPECT_EQ(a.exit_interval, 50);
  EXPECT_EQ(a.exit_duration_in_mins, 235);
  EXPECT_EQ(a.distributed_timeout_minutes, 60);
  EXPECT_TRUE(a.log_throughput);
  EXPECT_EQ(a.recompute_granularity, "selective");
  // GPT-2 124M: 6 x 123.5M matmul parameters (vocab padded to 50304) + 6 x 12 x 768 x 1024
  TrainArgs g = parse_flags("gpt", {"--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12", "--seq-length",
                                    "1024", "--vocab-size", "50257"});
  (void)trainer::resolve_run(g);
  EXPECT_NEAR(trainer::flops_per_token(g), 6.0 * (12 * 12 * 768.0 * 768 + 768.0 * 50304) + 6.0 * 12 * 768 * 1024, 1.0);
  // Multi-latent attention counted as Megatron counts it: the latents' projections (and norms), the
  // RoPE key part, the output; the core over q, k of qk + pe and values of v dimensions. Against the
  // plain attention of the same model (4 heads of 16, 2 layers, sequence 32):
  //   plain  projections 64 x 64 + 2 x 64 x 64 + 64 x 64 = 16384 per layer, core 4 x 16 = 64
  //   MLA    24 (64 + 4 x 20 + 1) + 16 (64 + 4 x 22 + 1) + 64 x 8 + 4 x 10 x 64 = 9000, core 4 x 30 / 2 = 60
  const std::vector<std::string> shape = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                          "--seq-length", "32"};
  std::vector<std::string> latent = shape;
  latent.insert(latent.end(), {"--multi-latent-attention", "--q-lora-rank", "24", "--kv-lora-rank", "16", "--qk-head-dim", "12",
                               "--qk-pos-emb-head-dim", "8", "--v-head-dim", "10", "--rope-type", "rope"});
  TrainArgs plain_args = parse_flags("llama", shape), latent_args = parse_flags("llama", latent);
  (void)trainer::resolve_run(plain_args);
  (void)trainer::resolve_run(latent_args);
  EXPECT_NEAR(trainer::flops_per_token(latent_args) - trainer::flops_per_token(plain_args),
              6.0 * 2 * (9000 - 16384) + 6.0 * 2 * 32 * (60 - 64), 1e-6);
}

// Megatron's straggler detector flags and strata's progress timer: parsed, defaults, bad values refused.
TEST(MegatronFlags, StragglerAndProgressFlags) {
  const TrainArgs d = parse_flags("gpt", {});
  EXPECT_FALSE(d.log_straggler);
  EXPECT_EQ(d.straggler_minmax_count, 1);  // Megatron's default
  EXPECT_FALSE(d.disable_straggler_on_startup);
  EXPECT_EQ(d.progress_timeout_minutes, 0);  // off
  const TrainArgs a = parse_flags("gpt", {"--log-straggler", "--straggler-minmax-count", "4", "--disable-straggler-on-startup",
                                          "--progress-timeout-minutes", "2.5"});
  EXPECT_TRUE(a.log_straggler);
  EXPECT_EQ(a.straggler_minmax_count, 4);
  EXPECT_TRUE(a.disable_straggler_on_startup);
  EXPECT_EQ(a.progress_timeout_minutes, 2.5);
  const auto validated = [](std::vector<std::string> flags) {
    TrainArgs b = parse_flags("gpt", std::move(flags));
    (void)trainer::resolve_run(b);
    trainer::validate(b);
  };
  validated({"--log-straggler", "--progress-timeout-minutes", "2.5"});
  expect_config_error([&] { validated({"--straggler-minmax-count", "0"}); }, {"--straggler-minmax-count=0"});
  expect_config_error([&] { validated({"--progress-timeout-minutes", "-1"}); }, {"--progress-timeout-minutes"});
  expect_config_error([&] { validated({"--progress-timeout-minutes", "nan"}); }, {"--progress-timeout-minutes"});
}

// Megatron's MoE flags (arguments.py, TransformerConfig): --num-experts on the Llama set selects
// Mixtral; each flag lands in ModelConfig::moe or the expert groups; the defaults are Megatron's
// (top-2, aux_loss with coefficient 0, the allgather dispatcher, expert tensor parallel = tp).
TEST(MegatronFlags, MoeFlagsSelectMixtralWithMegatronsDefaults) {
  const std::vector<std::string> llama = {"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                                          "--untie-embeddings-and-output-weights", "--disable-bias-linear"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> flags = llama;
    flags.insert(flags.end(), more.begin(), more.end());
    return parse_flags("gpt", flags);
  };
  const TrainArgs d = with({"--num-experts", "8", "--world-size", "4", "--tensor-model-parallel-size", "2"});
  EXPECT_EQ(d.model_kind, "mixtral");
  EXPECT_EQ(d.model.moe.num_experts, 8);
  EXPECT_EQ(d.model.moe.topk, 2);
  EXPECT_EQ(d.model.moe.aux_loss_coeff, 0.0);
  EXPECT_EQ(d.model.moe.z_loss_coeff, 0.0);
  EXPECT_EQ(d.model.moe.load_balancing, strata::MoeLoadBalancing::aux_loss);
  EXPECT_EQ(d.model.moe.token_dispatcher, strata::MoeDispatcherType::allgather);
  EXPECT_EQ(d.model.moe.routing.score, strata::MoeScore::softmax);
  EXPECT_EQ(d.model.moe.drop_policy, strata::MoeDropPolicy::probability);
  EXPECT_EQ(d.model.moe.capacity_factor, 0.0);
  EXPECT_EQ(d.model.moe.expert_bias_update_rate, 1e-3);
  EXPECT_EQ(trainer::parallel_config_of(d).ep, 1);
  EXPECT_EQ(trainer::parallel_config_of(d).etp, 2);  // Megatron: expert tensor parallel = tensor parallel
  EXPECT_EQ(parse_flags("llama", {}).model_kind, "llama");

  const TrainArgs m = with({"--num-experts", "16", "--moe-router-topk", "4", "--moe-ffn-hidden-size", "96",
                            "--moe-shared-expert-intermediate-size", "64", "--moe-shared-expert-gate",
                            "--moe-router-score-function", "sigmoid", "--moe-router-topk-scaling-factor", "2.5", "--moe-router-load-balancing-type", "seq_aux_loss",
                            "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3", "--moe-router-enable-expert-bias",
                            "--moe-router-bias-update-rate", "0.01", "--moe-expert-capacity-factor", "1.25",
                            "--moe-token-drop-policy", "position", "--moe-pad-expert-input-to-capacity",
                            "--moe-token-dispatcher-type", "alltoall", "--num-layers", "4", "--moe-layer-freq", "[1]*4", "--moe-grouped-gemm",
                            "--moe-router-num-groups", "4", "--moe-router-group-topk", "2",
                            "--world-size", "8", "--expert-model-parallel-size", "4", "--expert-tensor-parallel-size", "1"});
  EXPECT_EQ(m.model.moe.routing.num_groups, 4);
  EXPECT_EQ(m.model.moe.routing.group_topk, 2);
  EXPECT_EQ(m.model.moe.num_experts, 16);
  EXPECT_EQ(m.model.moe.topk, 4);
  EXPECT_EQ(m.model.moe.expert_ffn_hidden_size, 96);
  EXPECT_EQ(m.model.moe.shared_expert_ffn_hidden_size, 64);
  EXPECT_TRUE(m.model.moe.shared_expert_gate);
  EXPECT_FALSE(d.model.moe.shared_expert_gate);  // Megatron's default
  EXPECT_EQ(m.model.moe.routing.score, strata::MoeScore::sigmoid);
  EXPECT_EQ(m.model.moe.routing.scaling_factor, 2.5);
  EXPECT_EQ(m.model.moe.load_balancing, strata::MoeLoadBalancing::seq_aux_loss);
  EXPECT_EQ(m.model.moe.aux_loss_coeff, 1e-2);
  EXPECT_EQ(m.model.moe.z_loss_coeff, 1e-3);
  EXPECT_TRUE(m.model.moe.expert_bias);
  EXPECT_EQ(m.model.moe.expert_bias_update_rate, 0.01);
  EXPECT_EQ(m.model.moe.capacity_factor, 1.25);
  EXPECT_EQ(m.model.moe.drop_policy, strata::MoeDropPolicy::position);
  EXPECT_TRUE(m.model.moe.pad_to_capacity);
  EXPECT_EQ(m.model.moe.token_dispatcher, strata::MoeDispatcherType::alltoall);
  EXPECT_EQ(m.notes.size(), 1u);  // --moe-grouped-gemm: always grouped
  EXPECT_EQ(trainer::parallel_config_of(m).ep, 4);
  EXPECT_EQ(trainer::parallel_config_of(m).etp, 1);
  EXPECT_EQ(trainer::parallel_config_of(m).dp, 8);
  TrainArgs ok = m;
  (void)trainer::resolve_run(ok);
  trainer::validate(ok);

  TrainArgs groups = ok;  // 16 experts do not form 5 groups
  groups.model.moe.routing.num_groups = 5;
  expect_config_error([&] { trainer::validate(groups); }, {"--moe-router-num-groups=5", "--num-experts=16"});

  // What strata does not build or cannot lay out is refused naming the flag and the value.
  EXPECT_TRUE(m.model.moe.layers.empty()) << "a list of 1s is every layer, as 1";
  auto invalid = [&](std::vector<std::string> more, std::vector<std::string> parts) {
    TrainArgs a = with(more);
    (void)trainer::resolve_run(a);
    expect_config_error([&] { trainer::validate(a); }, parts);
  };
  invalid({"--num-experts", "6", "--world-size", "4", "--expert-model-parallel-size", "4"}, {"ep=4", "--num-experts=6"});
  invalid({"--num-experts", "8", "--world-size", "2", "--expert-model-parallel-size", "4"}, {"--expert-model-parallel-size=4"});
  invalid({"--num-experts", "8", "--world-size", "4", "--expert-model-parallel-size", "4", "--expert-tensor-parallel-size", "2"},
          {"etp=2", "ep=4"});
  invalid({"--num-experts", "8", "--recompute-granularity", "full", "--moe-router-force-load-balancing"},
          {"--recompute-granularity full", "--moe-router-force-load-balancing", "selective"});
  invalid({"--num-experts", "8", "--moe-shared-expert-intermediate-size", "64", "--save-hf", "out"},
          {"--save-hf", "MixtralForCausalLM", "shared experts"});
  invalid({"--num-experts", "8", "--num-layers", "2", "--moe-layer-freq", "[0,1]", "--load-hf", "in"},
          {"--load-hf", "MixtralForCausalLM", "--moe-layer-freq"});
  invalid({"--num-experts", "8", "--moe-router-topk", "9"}, {"topk=9", "--num-experts=8"});
  invalid({"--num-experts", "8", "--moe-shared-expert-gate"}, {"--moe-shared-expert-gate", "--moe-shared-expert-intermediate-size"});
  invalid({"--world-size", "2", "--expert-model-parallel-size", "2"}, {"--expert-model-parallel-size 2", "--num-experts"});
}

// Resolved and validated as a trainer does before anything runs.
TrainArgs checked(const std::string& kind, std::vector<std::string> flags) {
  TrainArgs a = parse_flags(kind, std::move(flags));
  (void)trainer::resolve_run(a);
  trainer::validate(a);
  return a;
}

// The Llama architecture flags with four experts (train_mixtral's preset).
std::vector<std::string> mixtral(std::vector<std::string> flags) {
  std::vector<std::string> out = {"--num-experts", "4", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                  "--seq-length", "32", "--micro-batch-size", "2"};
  out.insert(out.end(), flags.begin(), flags.end());
  return out;
}

// --fp16, --bf16 and --dtype each name the parameter type: two that disagree are refused.
TEST(MegatronFlags, ParameterTypesThatDisagreeAreRefused) {
  expect_config_error([] { (void)parse_flags("gpt", {"--dtype", "fp16", "--bf16"}); }, {"--bf16", "--dtype fp16", "give one"});
  expect_config_error([] { (void)parse_flags("gpt", {"--dtype", "double", "--bf16"}); }, {"--bf16", "--dtype double"});
  expect_config_error([] { (void)parse_flags("gpt", {"--bf16", "--dtype", "float"}); }, {"--bf16", "--dtype float"});
  expect_config_error([] { (void)parse_flags("gpt", {"--fp16", "--bf16"}); }, {"--fp16", "--bf16"});
  expect_config_error([] { (void)parse_flags("gpt", {"--fp16", "--dtype", "double"}); }, {"--fp16", "--dtype double"});
  EXPECT_EQ(parse_flags("gpt", {"--dtype", "bf16", "--bf16"}).dtype, "bf16");
  EXPECT_EQ(parse_flags("gpt", {"--dtype", "fp16", "--fp16"}).dtype, "fp16");
}

// A value the run's types cannot hold is refused naming the flag: a loss scale beyond fp32 (the
// gradients) or below its normal numbers, an initial std that rounds to zero weights, an Adam
// epsilon that is 0 in the optimizer's fp32 state.
TEST(MegatronFlags, ValuesTheTypesCannotHoldAreRefused) {
  for (const char* scale : {"1e308", "1e-320", "1e39"})
    expect_config_error([&] { (void)checked("gpt", {"--loss-scale", scale}); }, {"--loss-scale=", "cannot be represented", "fp32"});
  expect_config_error([] { (void)checked("gpt", {"--fp16", "--initial-loss-scale", "1e300"}); }, {"--initial-loss-scale="});
  for (const char* dtype : {"float", "bf16"})
    expect_config_error([&] { (void)checked("gpt", {"--dtype", dtype, "--init-method-std", "1e-50"}); },
                        {"--init-method-std=1e-50", "cannot be represented"});
  expect_config_error([] { (void)checked("gpt", {"--fp16", "--init-method-std", "1e-6"}); }, {"--init-method-std=1e-06", "fp16"});
  expect_config_error([] { (void)checked("gpt", {"--adam-eps", "1e-50"}); }, {"--adam-eps=1e-50", "optimizer"});
  EXPECT_NO_THROW((void)checked("gpt", {"--dtype", "double", "--adam-eps", "1e-50", "--init-method-std", "1e-50"}));
  EXPECT_NO_THROW((void)checked("gpt", {"--loss-scale", "65536", "--init-method-std", "1e-30", "--adam-eps", "1e-30"}));
}

// --lr-warmup-fraction, --decoupled-lr and --decoupled-min-lr take real values: NaN, infinities,
// negatives (and a fraction above 1) are refused naming the flag, from the command line or set directly.
TEST(MegatronFlags, WarmupFractionAndDecoupledRatesAreValidated) {
  for (const char* fraction : {"nan", "-inf", "inf", "1e308", "-0.5", "1.5"})
    expect_config_error([&] { (void)parse_flags("gpt", {"--lr-warmup-fraction", fraction}); }, {"--lr-warmup-fraction="});
  for (const char* rate : {"-5", "-inf", "nan"})
    expect_config_error([&] { (void)parse_flags("gpt", {"--decoupled-lr", rate}); }, {"--decoupled-lr="});
  expect_config_error([] { (void)parse_flags("gpt", {"--decoupled-lr", "1e-3", "--decoupled-min-lr", "nan"}); },
                      {"--decoupled-min-lr="});
  TrainArgs a = parse_flags("gpt", {});
  (void)trainer::resolve_run(a);
  a.lr_warmup_fraction = std::numeric_limits<double>::quiet_NaN();
  expect_config_error([&] { trainer::validate(a); }, {"--lr-warmup-fraction="});
  a.lr_warmup_fraction = -1;
  a.decoupled_lr = -std::numeric_limits<double>::infinity();
  expect_config_error([&] { trainer::validate(a); }, {"--decoupled-lr="});
  a.decoupled_lr = 1e-3;
  a.decoupled_min_lr = std::numeric_limits<double>::quiet_NaN();
  expect_config_error([&] { trainer::validate(a); }, {"--decoupled-min-lr="});
}

// Megatron's lr_warmup_steps = fraction x decay steps is a real number: the warmup is not rounded
// to whole samples.
TEST(MegatronFlags, WarmupFractionIsNotRounded) {
  const TrainArgs f = checked("gpt", {"--global-batch-size", "8", "--train-iters", "10", "--lr-warmup-fraction", "0.33",
                                      "--lr", "1e-3", "--micro-batch-size", "4"});
  const strata::LrSchedule s = trainer::schedule_of(f);
  EXPECT_DOUBLE_EQ(s.warmup(), 0.33 * 80);
  EXPECT_DOUBLE_EQ(s.lr(24), 1e-3 * 24 / (0.33 * 80));  // iteration 4's rate; rounded, 24 / 26
  EXPECT_DOUBLE_EQ(s.lr(32), 1e-3 * (1 - (32 - 0.33 * 80) / (80 - 0.33 * 80)));
}

// Flags Megatron refuses (or that make no run) are refused naming the flag, not accepted silently.
TEST(MegatronFlags, MeaninglessValuesAreRefused) {
  expect_config_error([] { (void)checked("gpt", {"--overlap-param-gather"}); },
                      {"--overlap-param-gather", "--use-distributed-optimizer"});
  expect_config_error([] { (void)checked("gpt", {"--overlap-param-gather", "--use-distributed-optimizer"}); },
                      {"--overlap-param-gather", "--overlap-grad-reduce"});
  EXPECT_NO_THROW((void)checked("gpt", {"--overlap-param-gather", "--use-distributed-optimizer", "--overlap-grad-reduce"}));
  expect_config_error([] { (void)checked("gpt", {"--num-layers-per-virtual-pipeline-stage", "-1"}); },
                      {"--num-layers-per-virtual-pipeline-stage=-1", "out of range"});
  expect_config_error([] { (void)parse_flags("gpt", {"--global-batch-size", "0"}); }, {"--global-batch-size=0", "out of range"});
  expect_config_error([] { (void)parse_flags("gpt", {"--kv-channels", "0"}); }, {"--kv-channels=0", "out of range"});
  expect_config_error([] { (void)parse_flags("gpt", {"--seed", "-1"}); }, {"--seed -1", ">= 0"});
  EXPECT_EQ(parse_flags("gpt", {"--seed", "0"}).seed, 0u);
}

// Megatron accepts --no-load-optim without --load and --moe-router-pre-softmax with sigmoid scores
// (its router reads pre-softmax with softmax only): accepted, each with a note.
TEST(MegatronFlags, FlagsMegatronIgnoresAreAcceptedWithANote) {
  const TrainArgs a = checked("gpt", {"--no-load-optim"});
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_NE(a.notes[0].find("--no-load-optim without --load"), std::string::npos) << a.notes[0];
  const TrainArgs m = checked("llama", mixtral({"--moe-router-pre-softmax", "--moe-router-score-function", "sigmoid"}));
  EXPECT_FALSE(m.model.moe.routing.pre_softmax);
  ASSERT_EQ(m.notes.size(), 1u);
  EXPECT_NE(m.notes[0].find("--moe-router-pre-softmax: ignored"), std::string::npos) << m.notes[0];
  EXPECT_TRUE(checked("llama", mixtral({"--moe-router-pre-softmax"})).model.moe.routing.pre_softmax);
  const TrainArgs rng = checked("gpt", {"--no-load-rng"});
  ASSERT_EQ(rng.notes.size(), 1u);
  EXPECT_NE(rng.notes[0].find("--no-load-rng"), std::string::npos);
  CLI::App app;
  TrainArgs h;
  trainer::add_options(app, h);
  EXPECT_NE(app.get_option("--vocab-size")->get_description().find("the last of them (N-1) the end of document"), std::string::npos);
}

// The layout is checked first, naming its flags; messages name flags, never the library's fields.
TEST(MegatronFlags, ErrorsNameTheFlagAtFault) {
  auto refused = [](std::vector<std::string> flags, std::vector<std::string> parts, std::vector<std::string> absent) {
    try {
      (void)checked(flags.size() > 1 && flags[0] == "--num-experts" ? "llama" : "gpt", flags);
      ADD_FAILURE() << "no ConfigError";
    } catch (const strata::ConfigError& e) {
      const std::string m = e.what();
      for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
      for (const std::string& p : absent) EXPECT_EQ(m.find(p), std::string::npos) << "'" << p << "' in: " << m;
    }
  };
  refused({"--world-size", "3", "--tensor-model-parallel-size", "2"}, {"--tensor-model-parallel-size=2", "--world-size=3"},
          {"--global-batch-size"});
  refused({"--pipeline-model-parallel-size", "0"}, {"--pipeline-model-parallel-size=0"}, {"--global-batch-size"});
  refused({"--world-size", "4", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "3"},
          {"--pipeline-model-parallel-size=3", "does not divide --world-size=4"}, {"--global-batch-size"});
  refused({"--step-batch-size-schedule", "0:2 320:6", "--micro-batch-size", "2"}, {"--step-batch-size-schedule", "6"},
          {"--global-batch-size"});
  refused({"--world-size", "2", "--pipeline-model-parallel-size", "2", "--num-layers", "4", "--decoder-first-pipeline-num-layers",
           "5", "--sample-tokens", "0"},
          {"--decoder-first-pipeline-num-layers=5"}, {"first_stage_layers"});
  refused({"--world-size", "2", "--pipeline-model-parallel-size", "2", "--num-layers", "3", "--sample-tokens", "0"},
          {"does not divide --num-layers=3", "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers"},
          {"num_layers", "Megatron's --decoder"});
  refused(mixtral({"--moe-pad-expert-input-to-capacity"}), {"--moe-pad-expert-input-to-capacity", "--moe-expert-capacity-factor"},
          {"capacity_factor", "pad_to_capacity"});
  refused(mixtral({"--moe-expert-capacity-factor", "-1"}), {"--moe-expert-capacity-factor=-1"}, {"moe capacity_factor"});
}

// --moe-layer-freq as Megatron reads it (moe_freq_type, and the layer pattern of its GPT layer
// specs): an int N makes layer l a MoE layer when l % N == 0; a Python list expression gives one 1
// (MoE) or 0 (dense MLP) per layer and must have --num-layers entries.
TEST(MegatronFlags, MoeLayerFreqIsMegatronsPattern) {
  auto pattern = [](std::string freq, std::string layers = "4") {
    return checked("llama", mixtral({"--num-layers", layers, "--moe-layer-freq", freq})).model.moe.layers;
  };
  EXPECT_EQ(pattern("2"), (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(pattern("3", "7"), (std::vector<int>{1, 0, 0, 1, 0, 0, 1}));
  EXPECT_EQ(pattern("([0]*1+[1]*3)"), (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(pattern("[0, 1,1,1]"), (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(pattern("[0]+[1]*3"), (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(pattern("2*[0,1]"), (std::vector<int>{0, 1, 0, 1}));
  // Megatron's own examples (its help text): "([1]*3+[0]*1)*3" and "([0]+[1]*23)"
  EXPECT_EQ(pattern("([1]*3+[0]*1)*3", "12"), (std::vector<int>{1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0}));
  const auto deepseek = pattern("([0]+[1]*23)", "24");
  ASSERT_EQ(deepseek.size(), 24u);
  EXPECT_EQ(deepseek[0], 0);
  EXPECT_EQ(std::count(deepseek.begin(), deepseek.end(), 1), 23);
  EXPECT_TRUE(pattern("1").empty()) << "1: every layer";
  EXPECT_TRUE(pattern("[1]*4").empty()) << "a list of 1s: every layer";
  const TrainArgs mixed = checked("llama", mixtral({"--num-layers", "4", "--moe-layer-freq", "[0]+[1]*3"}));
  EXPECT_FALSE(mixed.model.moe_layer(0));
  EXPECT_TRUE(mixed.model.moe_layer(3));
  EXPECT_EQ(mixed.model.moe_layer_count(), 3);
  EXPECT_EQ(mixed.model.moe_layer_count(0, 2), 1);
  // a dense model reads no MoE flag
  EXPECT_TRUE(checked("llama", {"--num-layers", "4", "--moe-layer-freq", "2"}).model.moe.layers.empty());

  auto refused = [](std::vector<std::string> flags, std::vector<std::string> parts) {
    expect_config_error([&] { (void)checked("llama", mixtral(flags)); }, parts);
  };
  // a length other than --num-layers, as Megatron's "Invalid length of moe_layer_pattern"
  refused({"--num-layers", "4", "--moe-layer-freq", "[0]+[1]*2"}, {"--moe-layer-freq [0]+[1]*2", "3 entries", "--num-layers 4"});
  refused({"--num-layers", "4", "--moe-layer-freq", "([1]*3+[0]*1)*3"}, {"12 entries", "--num-layers 4"});
  // what is not Megatron's syntax, or not 0 and 1
  for (const char* bad : {"[0,2,1,1]", "[0,1,1,1", "[0,1]*2]", "[0,1]+", "[]", "[0,1]*[1,0]", "([0,1]*2", "[0;1;1;1]", "x"})
    refused({"--num-layers", "4", "--moe-layer-freq", bad}, {std::string("--moe-layer-freq ") + bad});
  refused({"--num-layers", "4", "--moe-layer-freq", "[0,2,1,1]"}, {"list of 0 and 1"});
  refused({"--moe-layer-freq", "0"}, {"--moe-layer-freq 0", "whole number >= 1"});
  refused({"--moe-layer-freq", "1.5"}, {"--moe-layer-freq 1.5"});
  refused({"--num-layers", "4", "--moe-layer-freq", "[0]*4"}, {"--moe-layer-freq [0]*4", "every layer dense"});
  // the sliding-window pattern shares the parser
  EXPECT_EQ(checked("llama", {"--num-layers", "6", "--window-size", "8", "--window-attn-skip-freq", "([1]*2+[0])*2"}).model.window_layers,
            (std::vector<int>{1, 1, 0, 1, 1, 0}));
}

// --moe-router-dtype fp32 (Megatron's choices fp32, fp64): strata's router always computes in
// accumulate_t<T>, fp32 for bf16 / fp16 / float, so fp32 acts without a note; fp64 acts with --dtype
// double and is noted otherwise; anything else is refused by the parser, as Megatron's choices.
TEST(MegatronFlags, MoeRouterDtypeIsTheRoutersPrecision) {
  auto router_notes = [](const TrainArgs& a) {
    int n = 0;
    for (const auto& note : a.notes) n += note.find("--moe-router-dtype") != std::string::npos ? 1 : 0;
    return n;
  };
  const TrainArgs bf16 = parse_flags("llama", mixtral({"--bf16", "--moe-router-dtype", "fp32"}));
  EXPECT_EQ(bf16.moe_router_dtype, "fp32");
  EXPECT_EQ(router_notes(bf16), 0);
  EXPECT_EQ(router_notes(parse_flags("llama", mixtral({"--moe-router-dtype", "fp32"}))), 0);
  EXPECT_EQ(router_notes(parse_flags("llama", mixtral({"--dtype", "double", "--moe-router-dtype", "fp64"}))), 0);
  EXPECT_EQ(router_notes(parse_flags("llama", mixtral({"--dtype", "double", "--moe-router-dtype", "fp32"}))), 1);
  const TrainArgs wide = parse_flags("llama", mixtral({"--bf16", "--moe-router-dtype", "fp64"}));
  ASSERT_EQ(router_notes(wide), 1);
  EXPECT_EQ(router_notes(parse_flags("llama", {"--moe-router-dtype", "fp64"})), 0) << "a dense model has no router";
  EXPECT_THROW((void)parse_flags("llama", mixtral({"--moe-router-dtype", "fp16"})), CLI::ParseError);
}

// FLOPs of a MoE layer: each token's topk experts (and shared experts) and the router's logits.
TEST(MegatronFlags, MoeFlopsCountTheExpertsATokenGoesThrough) {
  TrainArgs a = parse_flags("llama", {"--num-experts", "8", "--moe-router-topk", "2", "--hidden-size", "64",
                                      "--ffn-hidden-size", "160", "--num-layers", "2", "--seq-length", "32"});
  TrainArgs dense = parse_flags("llama", {"--hidden-size", "64", "--ffn-hidden-size", "320", "--num-layers", "2",
                                          "--seq-length", "32"});
  (void)trainer::resolve_run(a);
  (void)trainer::resolve_run(dense);
  // top-2 of width 160 is the dense width 320's MLP, plus the router's 64 x 8 per layer
  EXPECT_NEAR(trainer::flops_per_token(a) - trainer::flops_per_token(dense), 6.0 * 2 * 64 * 8, 1e-6);
  // a dense layer (--moe-layer-freq 2 over 2 layers: MoE, dense) counts the dense MLP of --ffn-hidden-size
  TrainArgs mixed = parse_flags("llama", {"--num-experts", "8", "--moe-router-topk", "2", "--hidden-size", "64",
                                          "--ffn-hidden-size", "160", "--num-layers", "2", "--seq-length", "32",
                                          "--moe-layer-freq", "2"});
  (void)trainer::resolve_run(mixed);
  EXPECT_NEAR(trainer::flops_per_token(a) - trainer::flops_per_token(mixed), 6.0 * (3 * 64 * 160 + 64 * 8), 1e-6);
}

}  // namespace

// The building blocks of current open models are run-time fields of the compiled models: their
// flags keep the architecture's model and set ModelConfig.
TEST(MegatronFlags, BuildingBlocksAreRunTimeFieldsOfTheCompiledModels) {
  // Qwen3: qk norm and a head dimension unlike hidden / heads, still the Llama model.
  TrainArgs qwen3 = parse_flags("llama", {"--qk-layernorm", "--kv-channels", "64", "--group-query-attention",
                                          "--num-query-groups", "2"});
  EXPECT_EQ(qwen3.model_kind, "llama");
  EXPECT_TRUE(qwen3.model.qk_layernorm);
  EXPECT_EQ(qwen3.model.kv_channels, 64);
  EXPECT_EQ(qwen3.model.head_dim(), 64);
  (void)trainer::resolve_run(qwen3);
  EXPECT_NO_THROW(trainer::validate(qwen3));
  // Qwen2: biases on q, k, v only.
  TrainArgs qwen2 = parse_flags("llama", {"--add-qkv-bias"});
  EXPECT_EQ(qwen2.model_kind, "llama");
  EXPECT_TRUE(qwen2.model.add_qkv_bias);
  // GPT-3's example: zero-centred LayerNorm weights, the GPT model.
  TrainArgs gpt3 = parse_flags("gpt", {"--apply-layernorm-1p"});
  EXPECT_EQ(gpt3.model_kind, "gpt");
  EXPECT_TRUE(gpt3.model.apply_layernorm_1p);
  // Rotary variants and Llama 3.1's scaling.
  TrainArgs rope = parse_flags("llama", {"--rotary-percent", "0.5", "--rotary-interleaved", "--use-rope-scaling"});
  EXPECT_EQ(rope.model.rotary_percent, 0.5);
  EXPECT_TRUE(rope.model.rotary_interleaved);
  EXPECT_EQ(rope.model.rope_scaling_factor, 8.0);  // Megatron's default --rope-scaling-factor
  EXPECT_EQ(parse_flags("llama", {"--use-rope-scaling", "--rope-scaling-factor", "32"}).model.rope_scaling_factor, 32.0);
  TrainArgs unscaled = parse_flags("llama", {"--rope-scaling-factor", "32"});
  EXPECT_EQ(unscaled.model.rope_scaling_factor, 0.0);
  ASSERT_FALSE(unscaled.notes.empty());
  EXPECT_NE(unscaled.notes.back().find("--use-rope-scaling"), std::string::npos);
  expect_config_error([] { (void)parse_flags("llama", {"--rotary-percent", "1.5"}); }, {"--rotary-percent 1.5", "(0, 1]"});
  TrainArgs no_rope = parse_flags("gpt", {"--rotary-percent", "0.5"});
  EXPECT_EQ(no_rope.model.rotary_percent, 1.0);
  EXPECT_NE(no_rope.notes.back().find("without --position-embedding-type rope"), std::string::npos);
  // Activations: --squared-relu on GPT's set, --quick-geglu in place of --swiglu in Llama's set.
  TrainArgs nemotron = parse_flags("gpt", {"--squared-relu"});
  EXPECT_EQ(nemotron.model_kind, "gpt");
  EXPECT_EQ(nemotron.model.activation, strata::MlpActivation::squared_relu);
  const std::vector<std::string> gpt_oss = {"--position-embedding-type", "rope", "--normalization", "RMSNorm",
                                            "--quick-geglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                                            "--glu-linear-offset", "1.0", "--activation-func-clamp-value", "7.0"};
  TrainArgs oss = parse_flags("gpt", gpt_oss);
  EXPECT_EQ(oss.model_kind, "llama");
  EXPECT_EQ(oss.model.activation, strata::MlpActivation::quick_geglu);
  EXPECT_EQ(oss.model.activation_clamp, 7.0);
  EXPECT_EQ(oss.model.glu_linear_offset, 1.0);
  // train_llama's SwiGLU is a default of its preset: a named activation takes its place, as gpt-oss's
  // preset line does; --swiglu given beside it is still two activations.
  TrainArgs oss_preset = parse_flags("llama", {"--quick-geglu", "--glu-linear-offset", "1.0"});
  EXPECT_EQ(oss_preset.model_kind, "llama");
  EXPECT_FALSE(oss_preset.architecture.swiglu);
  EXPECT_EQ(oss_preset.model.activation, strata::MlpActivation::quick_geglu);
  EXPECT_EQ(parse_flags("llama", {"--squared-relu"}).model.activation, strata::MlpActivation::squared_relu);
  expect_config_error([] { (void)parse_flags("llama", {"--swiglu", "--quick-geglu"}); }, {"--swiglu, --quick-geglu", "give one"});
  expect_config_error([] { (void)parse_flags("gpt", {"--activation-func-clamp-value", "7"}); },
                      {"--activation-func-clamp-value", "gated"});
}

// YaRN: --position-embedding-type yarn is the Llama set's RoPE with YaRN's frequencies, its
// parameters under Megatron's names and defaults; without it they change nothing (a note).
TEST(MegatronFlags, YarnFlags) {
  const std::vector<std::string> llama_set = {"--normalization", "RMSNorm", "--swiglu", "--untie-embeddings-and-output-weights",
                                              "--disable-bias-linear"};
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.begin(), llama_set.begin(), llama_set.end());
    return parse_flags("gpt", flags);
  };
  const TrainArgs defaults = with({"--position-embedding-type", "yarn"});
  EXPECT_EQ(defaults.model_kind, "llama");
  EXPECT_EQ(defaults.model.yarn_scaling_factor, 1.0);  // Megatron's --rotary-scaling-factor default
  EXPECT_EQ(defaults.model.yarn_original_max_positions, 4096.0);
  EXPECT_EQ(defaults.model.yarn_beta_fast, 32.0);
  EXPECT_EQ(defaults.model.yarn_beta_slow, 1.0);
  EXPECT_EQ(defaults.model.yarn_mscale, 1.0);
  EXPECT_EQ(defaults.model.yarn_mscale_all_dim, 0.0);
  EXPECT_TRUE(defaults.model.yarn_round_to_int);
  // gpt-oss's line (Megatron's gpt-oss example)
  const TrainArgs oss = with({"--position-embedding-type", "yarn", "--rotary-base", "150000", "--rotary-scaling-factor", "32.0",
                              "--yarn-original-max-position-embeddings", "4096", "--yarn-beta-fast", "32.0", "--yarn-beta-slow",
                              "1.0", "--mscale", "1.0", "--mscale-all-dim", "0.0", "--no-yarn-correction-range-round-to-int",
                              "--softmax-type", "learnable"});
  EXPECT_EQ(oss.model.yarn_scaling_factor, 32.0);
  EXPECT_FALSE(oss.model.yarn_round_to_int);
  EXPECT_EQ(oss.model.rope_base, 150000.0);
  EXPECT_EQ(oss.model.softmax_type, strata::SoftmaxType::learnable);
  const TrainArgs deepseek = with({"--position-embedding-type", "yarn", "--rotary-scaling-factor", "40", "--mscale", "0.707",
                                   "--mscale-all-dim", "0.707", "--yarn-beta-fast", "24", "--yarn-beta-slow", "2",
                                   "--yarn-correction-range-round-to-int"});
  EXPECT_EQ(deepseek.model.yarn_mscale, 0.707);
  EXPECT_EQ(deepseek.model.yarn_mscale_all_dim, 0.707);
  EXPECT_EQ(deepseek.model.yarn_beta_fast, 24.0);
  EXPECT_EQ(deepseek.model.yarn_beta_slow, 2.0);
  EXPECT_TRUE(deepseek.model.yarn_round_to_int);
  TrainArgs plain = parse_flags("llama", {"--rotary-scaling-factor", "32", "--yarn-beta-fast", "16"});
  EXPECT_EQ(plain.model.yarn_scaling_factor, 0.0);
  ASSERT_GE(plain.notes.size(), 2u);
  EXPECT_NE(plain.notes.back().find("without --position-embedding-type yarn"), std::string::npos);
  expect_config_error([&] { (void)with({"--position-embedding-type", "yarn", "--rotary-scaling-factor", "0"}); },
                      {"--rotary-scaling-factor 0", "> 0"});
  expect_config_error([&] { (void)with({"--position-embedding-type", "yarn", "--yarn-beta-fast", "1", "--yarn-beta-slow", "2"}); },
                      {"--yarn-beta-fast 1", "beta-slow < beta-fast"});
  expect_config_error([&] { (void)with({"--position-embedding-type", "yarn", "--yarn-original-max-position-embeddings", "0"}); },
                      {"--yarn-original-max-position-embeddings 0"});
  expect_config_error([&] { (void)with({"--position-embedding-type", "yarn", "--use-rope-scaling"}); },
                      {"--use-rope-scaling", "give one"});
  expect_config_error([&] { (void)with({"--position-embedding-type", "yarn", "--rotary-interleaved"}); },
                      {"--rotary-interleaved", "rotate-half"});
  expect_config_error([] { (void)parse_flags("gpt", {"--position-embedding-type", "yarn"}); },
                      {"The nearest, GPT-2, also needs: --position-embedding-type learned_absolute"});
}

// Attention sinks: Megatron's --softmax-type vanilla | off-by-one | learnable, with any model.
TEST(MegatronFlags, SoftmaxTypeFlags) {
  EXPECT_EQ(parse_flags("llama", {}).model.softmax_type, strata::SoftmaxType::vanilla);
  EXPECT_EQ(parse_flags("llama", {"--softmax-type", "off-by-one"}).model.softmax_type, strata::SoftmaxType::off_by_one);
  EXPECT_EQ(parse_flags("gpt", {"--softmax-type", "learnable"}).model.softmax_type, strata::SoftmaxType::learnable);
  EXPECT_EQ(parse_flags("llama", {"--softmax-type", "vanilla"}).model.softmax_type, strata::SoftmaxType::vanilla);
  TrainArgs cp = parse_flags("llama", {"--softmax-type", "learnable", "--context-parallel-size", "2",
                                       "--tensor-model-parallel-size", "1"});
  (void)trainer::resolve_run(cp);
  EXPECT_NO_THROW(trainer::validate(cp));  // the ring gives the sink to its diagonal blocks
  // The GPU has the sinks too (cuda/kernels/attention_sink.cuh): --device cuda takes them.
  EXPECT_EQ(parse_flags("llama", {"--softmax-type", "learnable", "--device", "cuda"}).model.softmax_type,
            strata::SoftmaxType::learnable);
  EXPECT_ANY_THROW((void)parse_flags("llama", {"--softmax-type", "softmax1"}));  // not one of Megatron's three
}

// Sliding windows: Megatron's (left,right) tuple and its skip pattern (N, or a list expression).
TEST(MegatronFlags, SlidingWindowFlags) {
  const TrainArgs every = parse_flags("llama", {"--num-layers", "4", "--window-size", "(4095,0)"});
  EXPECT_EQ(every.model.window_size, 4095);
  EXPECT_TRUE(every.model.window_layers.empty());
  EXPECT_EQ(every.model.layer_window(3), 4095);
  const TrainArgs skip = parse_flags("llama", {"--num-layers", "4", "--window-size", "128,0", "--window-attn-skip-freq", "2"});
  EXPECT_EQ(skip.model.window_layers, (std::vector<int>{1, 0, 1, 0}));  // one full layer after each windowed one
  EXPECT_EQ(skip.model.layer_window(1), -1);
  const TrainArgs list = parse_flags("llama", {"--num-layers", "6", "--window-size", "(64, 0)", "--window-attn-skip-freq",
                                               "([1,1,0]*1+[0]*2+[1])"});
  EXPECT_EQ(list.model.window_layers, (std::vector<int>{1, 1, 0, 0, 0, 1}));
  EXPECT_EQ(parse_flags("llama", {"--window-size", "(-1,0)"}).model.window_size, -1);
  const TrainArgs unused = parse_flags("llama", {"--window-attn-skip-freq", "2"});
  ASSERT_FALSE(unused.notes.empty());
  EXPECT_NE(unused.notes.back().find("without --window-size"), std::string::npos);
  expect_config_error([] { (void)parse_flags("llama", {"--window-size", "(8,8)"}); }, {"--window-size (8,8)", "causal"});
  expect_config_error([] { (void)parse_flags("llama", {"--window-size", "wide"}); }, {"--window-size wide", "(left,right)"});
  expect_config_error([] { (void)parse_flags("llama", {"--num-layers", "4", "--window-size", "8", "--window-attn-skip-freq", "[1,0]*3"}); },
                      {"--window-attn-skip-freq [1,0]*3", "6 entries", "--num-layers 4"});
  expect_config_error([] { (void)parse_flags("llama", {"--window-size", "8", "--window-attn-skip-freq", "[1,2]"}); },
                      {"--window-attn-skip-freq [1,2]", "list of 0 and 1"});
  TrainArgs cp = parse_flags("llama", {"--window-size", "8", "--softmax-type", "learnable", "--context-parallel-size", "2",
                                       "--tensor-model-parallel-size", "1"});
  (void)trainer::resolve_run(cp);
  trainer::validate(cp);  // windows and sinks run under context parallelism (by global positions)
  // Hugging Face: a window on every layer is Mistral's; on some layers only it has no class, refused
  // before training rather than at the export.
  TrainArgs mistral = parse_flags("llama", {"--num-layers", "4", "--window-size", "(15,0)", "--save-hf", "out"});
  (void)trainer::resolve_run(mistral);
  trainer::validate(mistral);
  TrainArgs alternating = parse_flags("llama", {"--num-layers", "4", "--window-size", "(15,0)", "--window-attn-skip-freq", "2",
                                                "--save-hf", "out"});
  (void)trainer::resolve_run(alternating);
  expect_config_error([&] { trainer::validate(alternating); }, {"--save-hf", "--window-attn-skip-freq", "every layer"});
}

// Flags harmless in strata are noted; Megatron-FSDP's are refused pointing at the distributed optimizer.
TEST(MegatronFlags, HarmlessFlagsAreNotedAndFsdpPointsAtTheDistributedOptimizer) {
  const std::vector<std::string> harmless = {"--accumulate-allreduce-grads-in-fp32", "--logging-level", "20",
                                             "--log-num-zeros-in-grad", "--enable-experimental", "--moe-per-layer-logging",
                                             "--disable-bf16-reduced-precision-matmul", "--auto-detect-ckpt-format",
                                             "--dist-ckpt-strictness", "log_all"};
  TrainArgs a = parse_flags("gpt", harmless);
  EXPECT_EQ(a.notes.size(), 8u);
  EXPECT_TRUE(a.refused.empty());
  for (const std::vector<std::string>& fsdp : {std::vector<std::string>{"--use-megatron-fsdp"},
                                              {"--data-parallel-sharding-strategy", "optim_grads_params"},
                                              {"--init-model-with-meta-device"}}) {
    TrainArgs f = parse_flags("gpt", fsdp);
    ASSERT_EQ(f.refused.size(), 1u);
    EXPECT_NE(f.refused[0].find(fsdp[0]), std::string::npos) << f.refused[0];
    EXPECT_NE(f.refused[0].find("--use-distributed-optimizer"), std::string::npos) << f.refused[0];
  }
}

// FP8: Megatron's flags, names and defaults; what cannot run is refused naming the value.
TEST(MegatronFlags, Fp8Flags) {
  const TrainArgs off = parse_flags("gpt", {});
  EXPECT_FALSE(trainer::fp8_options_of(off).has_value());
  TrainArgs defaults = parse_flags("gpt", {"--fp8-format", "hybrid"});
  const auto d = trainer::fp8_options_of(defaults);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->format, strata::Fp8Formats::hybrid);
  EXPECT_EQ(d->recipe, strata::Fp8RecipeKind::delayed);  // Megatron's defaults
  EXPECT_EQ(d->margin, 0);
  EXPECT_EQ(d->amax_history_len, 1);
  EXPECT_EQ(d->amax_compute_algo, strata::Fp8AmaxAlgo::most_recent);
  EXPECT_FALSE(d->first_last_layers_bf16);
  EXPECT_EQ(d->num_layers_at_start_in_bf16, 1);
  EXPECT_EQ(d->num_layers_at_end_in_bf16, 1);
  EXPECT_EQ(d->format_of(strata::Fp8Role::grad_output), strata::Fp8Format::e5m2);
  EXPECT_EQ(d->format_of(strata::Fp8Role::input), strata::Fp8Format::e4m3);
  // the forward GEMM accumulates split by default; fast (Transformer Engine's fprop, torchao's forward) on request
  EXPECT_EQ(d->forward_accumulation, strata::Fp8Accumulation::split);
  EXPECT_EQ(trainer::fp8_options_of(parse_flags("gpt", {"--fp8-format", "hybrid", "--fp8-forward-accumulation", "fast"}))
                ->forward_accumulation,
            strata::Fp8Accumulation::fast);
  EXPECT_THROW((void)parse_flags("gpt", {"--fp8-format", "hybrid", "--fp8-forward-accumulation", "exact"}), CLI::ParseError);
  // --fp8-weight-cache auto: both layouts where a step runs a layer's forward more than once
  auto keeps = [](std::vector<std::string> more) {
    std::vector<std::string> flags = {"--fp8-format", "hybrid", "--micro-batch-size", "4", "--world-size", "1"};
    flags.insert(flags.end(), more.begin(), more.end());
    return trainer::fp8_options_of(parse_flags("gpt", flags))->cache_forward_weights;
  };
  EXPECT_FALSE(keeps({"--global-batch-size", "4"}));
  EXPECT_TRUE(keeps({"--global-batch-size", "8"}));
  EXPECT_TRUE(keeps({"--global-batch-size", "4", "--recompute-granularity", "full"}));
  // the MoE block recomputed: its experts' forward runs twice a micro-batch; moe_act's does not
  EXPECT_TRUE(keeps({"--global-batch-size", "4", "--recompute-granularity", "selective", "--recompute-modules", "moe"}));
  EXPECT_FALSE(keeps({"--global-batch-size", "4", "--recompute-granularity", "selective", "--recompute-modules", "moe_act"}));
  EXPECT_TRUE(keeps({"--global-batch-size", "4", "--fp8-weight-cache", "both"}));
  EXPECT_FALSE(keeps({"--global-batch-size", "8", "--fp8-weight-cache", "transposed"}));
  EXPECT_TRUE(trainer::fp8_options_of(parse_flags("gpt", {"--fp8-format", "hybrid"}))->cache_weights);
  EXPECT_FALSE(trainer::fp8_options_of(parse_flags("gpt", {"--fp8-format", "hybrid", "--fp8-weight-cache", "none"}))->cache_weights);
  const TrainArgs llama3 = parse_flags("gpt", {"--fp8-format", "e4m3", "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo",
                                               "max", "--fp8-margin", "2", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16",
                                               "--num-layers-at-start-in-bf16", "2", "--num-layers-at-end-in-bf16", "3"});
  const auto o = trainer::fp8_options_of(llama3);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->format, strata::Fp8Formats::e4m3);
  EXPECT_EQ(o->format_of(strata::Fp8Role::grad_output), strata::Fp8Format::e4m3);
  EXPECT_EQ(o->recipe, strata::Fp8RecipeKind::tensorwise);
  EXPECT_EQ(o->amax_history_len, 1024);
  EXPECT_EQ(o->amax_compute_algo, strata::Fp8AmaxAlgo::max);
  EXPECT_EQ(o->margin, 2);
  EXPECT_TRUE(o->first_last_layers_bf16);
  EXPECT_EQ(o->num_layers_at_start_in_bf16, 2);
  EXPECT_EQ(o->num_layers_at_end_in_bf16, 3);
  TrainArgs mx = parse_flags("gpt", {"--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"});
  (void)trainer::resolve_run(mx);
  expect_config_error([&] { trainer::validate(mx); }, {"--fp8-recipe mxfp8", "Blackwell"});
  TrainArgs block = parse_flags("gpt", {"--fp8-format", "hybrid", "--fp8-recipe", "blockwise", "--fp8-block-size", "16"});
  (void)trainer::resolve_run(block);
  EXPECT_NO_THROW(trainer::validate(block));
  EXPECT_EQ(trainer::fp8_options_of(block)->recipe, strata::Fp8RecipeKind::blockwise);
  EXPECT_EQ(trainer::fp8_options_of(block)->block, 16);
  EXPECT_EQ(parse_flags("gpt", {"--fp8-format", "hybrid", "--fp8-recipe", "blockwise"}).fp8_block_size, 128);  // DeepSeek-V3's
  TrainArgs no_block = parse_flags("gpt", {"--fp8-format", "hybrid", "--fp8-recipe", "blockwise", "--fp8-block-size", "0"});
  (void)trainer::resolve_run(no_block);
  expect_config_error([&] { trainer::validate(no_block); }, {"--fp8-recipe blockwise", "a block of 0"});
  TrainArgs block_gpu = parse_flags("gpt", {"--fp8-format", "hybrid", "--fp8-recipe", "blockwise", "--device", "cuda"});
  (void)trainer::resolve_run(block_gpu);
  EXPECT_NO_THROW(trainer::validate(block_gpu));  // cuBLASLt's block-scaled GEMM on Hopper
  TrainArgs history = parse_flags("gpt", {"--fp8-format", "hybrid", "--fp8-amax-history-len", "0"});
  (void)trainer::resolve_run(history);
  expect_config_error([&] { trainer::validate(history); }, {"--fp8-amax-history-len 0"});
  // On GPUs the GEMM sizes must suit cuBLASLt's FP8 GEMMs, checked before anything is allocated.
  TrainArgs narrow = parse_flags("gpt", {"--fp8-format", "hybrid", "--hidden-size", "72", "--num-attention-heads", "4",
                                         "--ffn-hidden-size", "128"});
  (void)trainer::resolve_run(narrow);
  narrow.device = "cuda";
  expect_config_error([&] { trainer::validate(narrow); }, {"--hidden-size is 72", "multiple of 16", "cuBLASLt"});
  narrow.device = "cpu";  // the CPU emulation takes any size
  trainer::validate(narrow);
  // MoE experts run FP8 under the delayed recipe (--no-fp8-experts keeps them in the element type), so
  // on GPUs their width must suit the FP8 GEMMs too; tensorwise leaves them in bf16.
  auto experts_of = [](std::vector<std::string> extra) {
    std::vector<std::string> flags = {"--fp8-format", "hybrid", "--num-experts", "4", "--moe-ffn-hidden-size", "72"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    TrainArgs a = parse_flags("mixtral", flags);
    (void)trainer::resolve_run(a);
    a.device = "cuda";
    return a;
  };
  EXPECT_TRUE(trainer::fp8_options_of(experts_of({}))->experts);
  EXPECT_FALSE(trainer::fp8_options_of(experts_of({"--no-fp8-experts"}))->experts);
  TrainArgs odd_experts = experts_of({});
  expect_config_error([&] { trainer::validate(odd_experts); }, {"expert width", "is 72", "multiple of 16"});
  EXPECT_NO_THROW(trainer::validate(experts_of({"--no-fp8-experts"})));
  EXPECT_NO_THROW(trainer::validate(experts_of({"--fp8-recipe", "tensorwise"})));
  TrainArgs alone = parse_flags("gpt", {"--first-last-layers-bf16"});
  (void)trainer::resolve_run(alone);
  expect_config_error([&] { trainer::validate(alone); }, {"--first-last-layers-bf16", "--fp8-format"});
  try {
    (void)parse_flags("gpt", {"--fp8-format", "e5m2"});
    ADD_FAILURE() << "--fp8-format e5m2 was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--fp8-format: e5m2 not in {e4m3,hybrid}"), std::string::npos) << e.what();
  }
}
