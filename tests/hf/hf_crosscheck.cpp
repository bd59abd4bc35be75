// hf_crosscheck: the strata side of the cross-check against Hugging Face transformers
// (tests/hf/check_transformers.py drives it on a machine with PyTorch).
//
//   hf_crosscheck export <dir> gpt2|llama|mistral|qwen2|qwen3|mixtral|qwen3_moe|qwen2_moe|deepseek_v3|gpt_oss [--seed N]
//       builds a tiny float32 model (Llama with grouped-query attention: 4 heads in 2 groups;
//       Mixtral: the same with 4 experts of width 48, top-2, in each layer; Qwen3-MoE: Qwen3's with a
//       dense first layer and such experts in the second; DeepSeek-V3: multi-latent attention, a dense first
//       layer, then 4 sigmoid-routed experts in 2 groups with an expert bias and a shared expert; gpt-oss:
//       every linear bias, 4 experts of width 48 running quick GeGLU clamped at 0.3, learned sinks, a
//       window of 6 keys on the first layer only, YaRN) on one
//       rank, initializes it with the seed, writes it to <dir> as a transformers checkpoint
//       (config.json + model.safetensors), the prompt it uses (tokens.json) and its logits
//   hf_crosscheck import <dir> gpt2|llama|mistral|qwen2|qwen3|mixtral|qwen3_moe|qwen2_moe|deepseek_v3|gpt_oss [--tp N]
//       loads the transformers checkpoint in <dir> (its config.json gives the sizes) into a float32
//       model on N tensor-parallel ranks (threads, default 2; Mixtral and Qwen3-MoE: N expert-parallel ranks) and
//       writes the logits of the prompt in <dir>/tokens.json
//   hf_crosscheck train <dir> <out> <architecture> [--steps N]
//       imports the transformers checkpoint in <dir> on one rank, trains it N AdamW steps (default 5)
//       on the prompt of <dir>/tokens.json (next-token loss), exports it to <out> with the trained
//       model's logits and its losses before and after (crosscheck.json "losses")
//   hf_crosscheck roundtrip <dir> gpt2|llama|mistral|qwen2|qwen3|mixtral|qwen3_moe|qwen2_moe|deepseek_v3|gpt_oss [--tp N]
//       export, then import from the same directory at tp=N, and compare the logits (exit 1 when
//       they differ by more than float rounding)
//
// Logits: <dir>/strata_logits.f32, float32 little-endian [positions, vocab_size], row p predicting
// the token after position p; <dir>/crosscheck.json describes it:
//   {"architecture": "gpt2", "mode": "export", "tp": 1, "tokens": [...], "logits_file": "strata_logits.f32",
//    "logits_shape": [16, 101], "logits_dtype": "float32"}
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <strata/checkpoint/huggingface.hpp>
#include <strata/models.hpp>
#include <strata/optim.hpp>
#include <strata/policy.hpp>

namespace {

using namespace strata;

struct Policy : default_policy {
  using element = float;
};

constexpr int kPromptLength = 16;

models::ModelConfig tiny_config(hf::Architecture architecture) {
  models::ModelConfig c;
  c.num_layers = 2;
  c.vocab_size = 101;
  c.make_vocab_size_divisible_by = 8;
  c.seq_length = kPromptLength;
  c.init_method_std = 0.1;
  c.norm_epsilon = 1e-5;
  if (architecture == hf::Architecture::gpt2) {
    c.hidden_size = 48;
    c.num_attention_heads = 4;
    c.ffn_hidden_size = 112;
  } else {
    c.hidden_size = 64;
    c.num_attention_heads = 4;
    c.num_query_groups = 2;
    c.ffn_hidden_size = 96;
    c.rope_base = 10000.0;
    c.add_qkv_bias = architecture == hf::Architecture::qwen2;  // Qwen2: biases on q, k and v
    if (architecture == hf::Architecture::qwen3) {  // Qwen3: RMSNorm per head of q and k, head_dim 24 (4 x 24 != 64)
      c.qk_layernorm = true;
      c.kv_channels = 24;
    }
    if (architecture == hf::Architecture::mistral) c.window_size = 5;  // Mistral: keys i-5 .. i (sliding_window 6 < 16)
    if (architecture == hf::Architecture::mixtral) {  // Mixtral: 4 experts of width 48, top-2, in every layer
      c.moe.num_experts = 4;
      c.moe.topk = 2;
      c.ffn_hidden_size = 48;
    }
    if (architecture == hf::Architecture::qwen3_moe) {  // Qwen3-MoE: Qwen3's attention, a dense first layer, then 4 experts of width 48
      c.qk_layernorm = true;
      c.kv_channels = 24;
      c.moe.num_experts = 4;
      c.moe.topk = 2;
      c.moe.expert_ffn_hidden_size = 48;
      c.moe.layers = {0, 1};
    }
    if (architecture == hf::Architecture::qwen2_moe) {  // Qwen2-MoE: Qwen2's biases, a dense first layer, 4 experts of width 48
      c.add_qkv_bias = true;                          // and a gated shared expert of width 40 on the MoE layer
      c.moe.num_experts = 4;
      c.moe.topk = 2;
      c.moe.expert_ffn_hidden_size = 48;
      c.moe.shared_expert_ffn_hidden_size = 40;
      c.moe.shared_expert_gate = true;
      c.moe.routing.pre_softmax = true;  // norm_topk_prob false
      c.moe.layers = {0, 1};
    }
    if (architecture == hf::Architecture::gpt_oss) {  // gpt-oss: biases, clamped quick GeGLU experts, sinks, alternating windows, YaRN
      c.add_bias_linear = true;
      c.moe.num_experts = 4;
      c.moe.topk = 2;
      c.ffn_hidden_size = 48;
      c.activation = MlpActivation::quick_geglu;
      c.activation_clamp = 0.3;  // bites at this initialization
      c.glu_linear_offset = 1.0;
      c.softmax_type = SoftmaxType::learnable;
      c.window_size = 5;
      c.window_layers = {1, 0};
      c.yarn_scaling_factor = 4.0;
      c.yarn_original_max_positions = 4;
      c.yarn_round_to_int = false;
    }
    if (architecture == hf::Architecture::deepseek_v3) {  // DeepSeek-V3: multi-latent attention, a dense first layer,
      c.multi_latent_attention = true;                    // then 4 sigmoid-routed experts of width 32 in 2 groups and
      c.qk_layernorm = true;                              // (the latents' norms)
      c.q_lora_rank = 24;                                 // a shared expert; interleaved RoPE on 8 of 20 dimensions
      c.kv_lora_rank = 16;
      c.qk_head_dim = 12;
      c.qk_pos_emb_head_dim = 8;
      c.v_head_dim = 10;
      c.rotary_interleaved = true;
      c.num_query_groups = 0;
      c.moe.num_experts = 4;
      c.moe.topk = 2;
      c.moe.expert_ffn_hidden_size = 32;
      c.moe.shared_expert_ffn_hidden_size = 32;
      c.moe.routing.score = MoeScore::sigmoid;
      c.moe.routing.scaling_factor = 2.5;
      c.moe.routing.num_groups = 2;
      c.moe.routing.group_topk = 1;
      c.moe.expert_bias = true;
      c.moe.layers = {0, 1};
    }
  }
  return c;
}

std::vector<std::int32_t> default_prompt(int vocab) {
  std::vector<std::int32_t> ids;
  for (int i = 0; i < kPromptLength; ++i) ids.push_back(static_cast<std::int32_t>((i * 37 + 11) % vocab));
  return ids;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail<FileError>("cannot open ", p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::int32_t> read_prompt(const std::filesystem::path& dir) {
  const auto path = dir / "tokens.json";
  const json::Value root = json::parse(read_file(path), detail::concat(path));
  const json::Value* tokens = root.is_object() ? root.find("tokens") : nullptr;
  if (!tokens || !tokens->is_array() || tokens->items().empty())
    fail<FileError>(path, " must be {\"tokens\": [id, ...]} with at least one id");
  std::vector<std::int32_t> ids;
  for (const json::Value& v : tokens->items()) {
    std::int64_t id = 0;
    if (!v.to_int64(id) || id < 0 || id > INT32_MAX) fail<FileError>(path, ": token ", v.text(), " is not a token id");
    ids.push_back(static_cast<std::int32_t>(id));
  }
  return ids;
}

std::string int_list(const std::vector<std::int32_t>& ids) {
  std::string s = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

template <class Context, class Model>
std::vector<std::vector<double>> logits_of(Context& ctx, const Model& model, const std::vector<std::int32_t>& ids) {
  const Tensor<std::int32_t> tokens(Shape{1, static_cast<index_t>(ids.size())}, ids);
  std::vector<std::vector<double>> out;
  for (index_t t = 0; t < tokens.size(1); ++t) out.push_back(model.next_token_logits(ctx, tokens, t));
  return out;
}

void write_logits(const std::filesystem::path& dir, hf::Architecture architecture, const char* mode, int tp,
                  const std::vector<std::int32_t>& ids, const std::vector<std::vector<double>>& logits) {
  std::vector<float> flat;
  for (const auto& row : logits)
    for (double v : row) flat.push_back(static_cast<float>(v));
  std::ofstream out(dir / "strata_logits.f32", std::ios::binary);
  out.write(reinterpret_cast<const char*>(flat.data()), static_cast<std::streamsize>(flat.size() * sizeof(float)));
  if (!out) fail<FileError>("cannot write ", dir / "strata_logits.f32");
  std::ofstream meta(dir / "crosscheck.json");
  meta << "{\n  \"architecture\": " << json::quote(hf::architecture_name(architecture)) << ",\n  \"mode\": \"" << mode
       << "\",\n  \"tp\": " << tp << ",\n  \"tokens\": " << int_list(ids) << ",\n  \"logits_file\": \"strata_logits.f32\",\n"
       << "  \"logits_shape\": [" << logits.size() << ", " << (logits.empty() ? 0 : logits[0].size())
       << "],\n  \"logits_dtype\": \"float32\"\n}\n";
  if (!meta) fail<FileError>("cannot write ", dir / "crosscheck.json");
}

template <template <class> class Model>
std::vector<std::vector<double>> export_model(const std::filesystem::path& dir, hf::Architecture architecture,
                                              std::uint64_t seed) {
  const models::ModelConfig config = tiny_config(architecture);
  const std::vector<std::int32_t> ids = default_prompt(config.vocab_size);
  std::vector<std::vector<double>> logits;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    Model<Policy> model(ctx, config);
    model.init(ctx, seed);
    // Norm weights and biases random too (init leaves them 1 and 0), so a misplaced one shows.
    std::mt19937_64 engine(seed);
    std::uniform_real_distribution<double> spread(-0.2, 0.2);
    model.for_each_parameter([&](auto& p) {
      if (p.name.find("norm") != std::string::npos || p.name.ends_with(".bias"))
        for (index_t i = 0; i < p.value.numel(); ++i) p.value[i] += static_cast<float>(spread(engine));
    });
    model.for_each_persistent_tensor([&](const std::string&, auto& tensor) {  // the routers' expert biases (DeepSeek-V3)
      auto handle = tensor;
      for (index_t i = 0; i < handle.numel(); ++i) handle[i] += spread(engine);
    });
    hf::save_hf_from_model(ctx, dir, model);
    logits = logits_of(ctx, model, ids);
  });
  std::ofstream(dir / "tokens.json") << "{\"tokens\": " << int_list(ids) << "}\n";
  write_logits(dir, architecture, "export", 1, ids, logits);
  return logits;
}

template <template <class> class Model>
std::vector<std::vector<double>> import_model(const std::filesystem::path& dir, hf::Architecture architecture, int tp) {
  hf::HfConfig file = hf::read_config(dir);
  if (file.architecture != architecture)
    fail<ConfigError>(dir / "config.json", " describes a ", hf::architecture_name(file.architecture), " model, not ",
                      hf::architecture_name(architecture));
  models::ModelConfig config = file.config;
  config.make_vocab_size_divisible_by = 8;  // some padding rows, which the import fills with zeros
  const std::vector<std::int32_t> ids = read_prompt(dir);
  if (static_cast<int>(ids.size()) > config.seq_length)
    fail<ConfigError>("the prompt of ", ids.size(), " tokens is longer than the model's ", config.seq_length, " positions");
  std::vector<std::vector<double>> logits;
  std::mutex mutex;
  // Mixtral: the N ranks hold the experts (ep = N, data parallel) rather than split the tensors: its
  // MoE layers split a prompt's tokens over tp, which needs lengths tp divides, and the prompts here
  // grow one token at a time.
  const ParallelConfig layout = hf::moe_family(architecture) ? ParallelConfig{.dp = tp, .ep = tp} : ParallelConfig{.tp = tp};
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, layout);
    Model<Policy> model(ctx, config);
    hf::load_hf(ctx, dir, model);
    auto mine = logits_of(ctx, model, ids);
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      logits = std::move(mine);
    }
  });
  write_logits(dir, architecture, "import", tp, ids, logits);
  return logits;
}

// Import <dir>, `steps` AdamW steps on the prompt's next-token loss (mean over its positions), export
// to <out>; returns the losses of each step and of the trained model.
template <template <class> class Model>
void train_model(const std::filesystem::path& dir, const std::filesystem::path& out, hf::Architecture architecture,
                 int steps) {
  hf::HfConfig file = hf::read_config(dir);
  if (file.architecture != architecture)
    fail<ConfigError>(dir / "config.json", " describes a ", hf::architecture_name(file.architecture), " model, not ",
                      hf::architecture_name(architecture));
  models::ModelConfig config = file.config;
  config.make_vocab_size_divisible_by = 8;
  const std::vector<std::int32_t> ids = read_prompt(dir);
  const index_t n = static_cast<index_t>(ids.size()) - 1;  // positions with a next token
  Tensor<std::int32_t> tokens(Shape{1, n}), labels(Shape{1, n});
  Tensor<float> mask(Shape{1, n});
  for (index_t i = 0; i < n; ++i) tokens[i] = ids[static_cast<std::size_t>(i)], labels[i] = ids[static_cast<std::size_t>(i + 1)], mask[i] = 1;
  std::vector<double> losses;
  std::vector<std::vector<double>> logits;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    Model<Policy> model(ctx, config);
    hf::load_hf(ctx, dir, model);
    AdamW<float> adamw(model, AdamWConfig{.weight_decay = 0.0});
    for (int step = 0; step <= steps; ++step) {
      zero_gradients(model);
      auto [loss, saved] = model.forward(ctx, tokens, labels, mask);
      losses.push_back(loss.loss_sum() / static_cast<double>(n));
      if (step == steps) break;  // the trained model's loss
      model.backward(ctx, saved, 1.0 / static_cast<double>(n));
      adamw.step(model, 1e-2);
    }
    hf::save_hf_from_model(ctx, out, model);
    logits = logits_of(ctx, model, ids);
  });
  std::ofstream(out / "tokens.json") << "{\"tokens\": " << int_list(ids) << "}\n";
  write_logits(out, architecture, "train", 1, ids, logits);
  std::string list = "[";
  for (std::size_t i = 0; i < losses.size(); ++i) list += (i ? ", " : "") + json::number(losses[i]);
  std::ofstream(out / "losses.json") << "{\"losses\": " << list << "]}\n";
  std::printf("%s: %d steps, loss %.6f -> %.6f\n", hf::architecture_name(architecture).data(), steps, losses.front(),
              losses.back());
}

int usage() {
  std::cerr << "usage: hf_crosscheck export <dir> gpt2|llama|mistral|qwen2|qwen3|mixtral|qwen3_moe|qwen2_moe|deepseek_v3|gpt_oss [--seed N]\n"
               "       hf_crosscheck import <dir> gpt2|llama|mistral|qwen2|qwen3|mixtral|qwen3_moe|qwen2_moe|deepseek_v3|gpt_oss [--tp N]\n"
               "       hf_crosscheck train <dir> <out> gpt2|llama|...|gpt_oss [--steps N]\n"
               "       hf_crosscheck roundtrip <dir> gpt2|llama|mistral|qwen2|qwen3|mixtral|qwen3_moe|qwen2_moe|deepseek_v3|gpt_oss [--tp N]\n"
               "(mixtral, qwen3_moe, qwen2_moe, deepseek_v3, gpt_oss: --tp N imports over N expert-parallel ranks)\n";
  return 2;
}

int run(int argc, char** argv) {
  if (argc < 4) return usage();
  const std::string mode = argv[1];
  const std::filesystem::path dir = argv[2];
  std::filesystem::path trained;
  if (mode == "train") {  // train <dir> <out> <architecture>
    if (argc < 5) return usage();
    trained = argv[3];
    ++argv, --argc;
  }
  const auto architecture = hf::parse_architecture(argv[3]);
  if (!architecture) {
    std::cerr << "hf_crosscheck: unknown architecture '" << argv[3] << "' (gpt2, llama, mistral, qwen2, qwen3, mixtral, qwen3_moe, qwen2_moe, deepseek_v3 or gpt_oss)\n";
    return 2;
  }
  int tp = 2, steps = 5;
  std::uint64_t seed = 1234;
  for (int i = 4; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return usage();
    if (flag == "--tp") tp = std::atoi(argv[++i]);
    else if (flag == "--steps") steps = std::atoi(argv[++i]);
    else if (flag == "--seed") seed = std::strtoull(argv[++i], nullptr, 10);
    else return usage();
  }
  if (tp < 1) return usage();
  const hf::Architecture a = *architecture;
  auto export_any = [&] {
    return a == hf::Architecture::gpt2      ? export_model<models::Gpt>(dir, a, seed)
           : hf::moe_family(a)              ? export_model<models::Mixtral>(dir, a, seed)
                                            : export_model<models::Llama>(dir, a, seed);
  };
  auto import_any = [&] {
    return a == hf::Architecture::gpt2      ? import_model<models::Gpt>(dir, a, tp)
           : hf::moe_family(a)              ? import_model<models::Mixtral>(dir, a, tp)
                                            : import_model<models::Llama>(dir, a, tp);
  };
  if (mode == "train") {
    if (steps < 1) return usage();
    if (a == hf::Architecture::gpt2) train_model<models::Gpt>(dir, trained, a, steps);
    else if (hf::moe_family(a)) train_model<models::Mixtral>(dir, trained, a, steps);
    else train_model<models::Llama>(dir, trained, a, steps);
  } else if (mode == "export") {
    export_any();
  } else if (mode == "import") {
    import_any();
  } else if (mode == "roundtrip") {
    const auto exported = export_any();
    const auto imported = import_any();
    double diff = 0, norm = 0, max_abs = 0;
    for (std::size_t t = 0; t < exported.size(); ++t)
      for (std::size_t v = 0; v < exported[t].size(); ++v) {
        const double d = imported.at(t).at(v) - exported[t][v];
        diff += d * d;
        norm += exported[t][v] * exported[t][v];
        max_abs = std::max(max_abs, std::abs(d));
      }
    const double relative = std::sqrt(diff / norm);
    std::printf("%s: export at tp=1, import at tp=%d: max |difference| %.3g, relative %.3g over %zu x %zu logits\n",
                argv[3], tp, max_abs, relative, exported.size(), exported.empty() ? std::size_t{0} : exported[0].size());
    if (!(relative <= 1e-5)) {
      std::fprintf(stderr, "hf_crosscheck: the imported model's logits differ from the exported model's\n");
      return 1;
    }
  } else {
    return usage();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "hf_crosscheck: " << e.what() << "\n";
    return 1;
  }
}
