// Hugging Face import and export of DeepSeek-V3 (models::Mixtral with multi-latent attention,
// DeepseekV3ForCausalLM): the mapping names the latent attention's and the router's tensors
// (e_score_correction_bias is strata's expert bias) and config.json carries every size and routing
// setting, read back as the same configuration; export-then-import gives the model's logits and
// expert biases in other layouts (tp with its expert tensor parallelism, ep over dp); what
// DeepseekV3ForCausalLM cannot express is refused naming it, in both directions.
#include <gtest/gtest.h>

#include "huggingface_helpers.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_huggingface_deepseek_cases {

namespace {

using namespace strata;
using strata_test::expect_error;
using strata_test::TempDirectory;

models::ModelConfig tiny_deepseek() {
  models::ModelConfig c;
  c.num_layers = 3;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 40;  // the dense first layer
  c.vocab_size = 37;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 8;
  c.rope_base = 500.0;
  c.norm_epsilon = 1e-6;
  c.init_method_std = 0.2;
  c.multi_latent_attention = true;
  c.qk_layernorm = true;  // the latents' RMSNorms
  c.q_lora_rank = 12;
  c.kv_lora_rank = 10;
  c.qk_head_dim = 6;
  c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 5;
  c.rotary_interleaved = true;
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  c.moe.expert_ffn_hidden_size = 16;
  c.moe.shared_expert_ffn_hidden_size = 32;  // two shared experts of the experts' width
  c.moe.routing.score = MoeScore::sigmoid;
  c.moe.routing.scaling_factor = 2.5;
  c.moe.routing.num_groups = 2;
  c.moe.routing.group_topk = 1;
  c.moe.expert_bias = true;
  c.moe.layers = {0, 1, 1};
  return c;
}

const std::vector<std::int32_t> kTokens = {3, 17, 36, 0, 11, 29, 5, 8};

struct Exported {
  std::vector<std::vector<double>> logits;
  std::vector<std::vector<double>> biases;  // each router's expert bias
};

template <class Model>
std::vector<std::vector<double>> biases_of(Model& model) {
  std::vector<std::vector<double>> out;
  model.for_each_persistent_tensor([&](const std::string&, auto& tensor) { out.emplace_back(tensor.begin(), tensor.end()); });
  return out;
}

// One rank: the model with random expert biases (init leaves them zero), exported to `dir`.
Exported export_deepseek(const models::ModelConfig& c, const std::filesystem::path& dir) {
  Exported out;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    models::Mixtral<strata_test::TestPolicy<float, false>> model(ctx, c);
    model.init(ctx, 2024);
    float value = -0.3f;
    model.for_each_persistent_tensor([&](const std::string&, auto& tensor) {
      auto handle = tensor;
      for (index_t i = 0; i < handle.numel(); ++i) handle[i] = value += 0.07f;
    });
    hf::save_hf_from_model(ctx, dir, model);
    out.logits = strata_test::all_logits(ctx, model, kTokens);
    out.biases = biases_of(model);
  });
  return out;
}

Exported import_deepseek(const models::ModelConfig& c, const std::filesystem::path& dir, ParallelConfig layout) {
  Exported out;
  std::mutex mutex;
  inprocess::run(layout.world_size(), [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, layout);
    models::Mixtral<strata_test::TestPolicy<float, false>> model(ctx, c);
    model.init(ctx, 7);
    hf::load_hf(ctx, dir, model);
    auto logits = strata_test::all_logits(ctx, model, kTokens);
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      out.logits = std::move(logits);
      out.biases = biases_of(model);
    }
  });
  return out;
}

}  // namespace

TEST(HuggingFaceMapping, DeepseekV3NamesAndConfig) {
  const auto c = tiny_deepseek();
  std::set<std::string> pieces;
  for (const auto& m : hf::tensor_mappings(hf::Architecture::mixtral, c))
    for (const auto& p : m.pieces) pieces.insert(p);
  for (const char* name : {"model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.q_a_layernorm.weight",
                           "model.layers.0.self_attn.q_b_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                           "model.layers.0.self_attn.kv_a_layernorm.weight", "model.layers.0.self_attn.kv_b_proj.weight",
                           "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                           "model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
                           "model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.2.mlp.shared_experts.up_proj.weight"})
    EXPECT_TRUE(pieces.count(name)) << name;
  EXPECT_FALSE(pieces.count("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(pieces.count("model.layers.0.mlp.gate.weight"));  // the dense first layer has no router
  // config.json carries the sizes and the routing, and reads back as the same configuration
  TempDirectory dir("hf_deepseek_config");
  strata_test::write_text(dir.path() / "config.json", hf::config_json(hf::Architecture::mixtral, c, SafetensorsDtype::float32));
  const hf::HfConfig file = hf::read_config(dir.path());
  EXPECT_EQ(file.architecture, hf::Architecture::deepseek_v3);
  const models::ModelConfig& r = file.config;
  EXPECT_TRUE(r.multi_latent_attention);
  EXPECT_TRUE(r.qk_layernorm);
  EXPECT_EQ(r.q_lora_rank, 12);
  EXPECT_EQ(r.kv_lora_rank, 10);
  EXPECT_EQ(r.qk_head_dim, 6);
  EXPECT_EQ(r.qk_pos_emb_head_dim, 4);
  EXPECT_EQ(r.v_head_dim, 5);
  EXPECT_TRUE(r.rotary_interleaved);
  EXPECT_EQ(r.kv_channels, 0);
  EXPECT_EQ(r.ffn(), 40);
  EXPECT_EQ(r.expert_ffn(), 16);
  EXPECT_EQ(r.moe.shared_expert_ffn_hidden_size, 32);
  EXPECT_EQ(r.moe.routing.score, MoeScore::sigmoid);
  EXPECT_EQ(r.moe.routing.scaling_factor, 2.5);
  EXPECT_EQ(r.moe.routing.num_groups, 2);
  EXPECT_EQ(r.moe.routing.group_topk, 1);
  EXPECT_TRUE(r.moe.expert_bias);
  EXPECT_EQ(r.moe.layers, (std::vector<int>{0, 1, 1}));
  hf::check_config(file, hf::Architecture::mixtral, c);  // no mismatch
  auto other = c;
  other.v_head_dim = 6;
  expect_error<ConfigError>([&] { hf::check_config(file, hf::Architecture::mixtral, other); }, {"v_head_dim", "6"});
}

TEST(HuggingFaceRoundTrip, DeepseekV3IsExactIntoOtherLayouts) {
  TempDirectory dir("hf_deepseek_round_trip");
  const auto c = tiny_deepseek();
  const Exported exported = export_deepseek(c, dir.path());
  ASSERT_EQ(exported.biases.size(), 2u);  // the two MoE layers' routers
  const Exported alone = import_deepseek(c, dir.path(), ParallelConfig{});
  EXPECT_EQ(alone.logits, exported.logits);
  EXPECT_EQ(alone.biases, exported.biases);
  for (const ParallelConfig& layout : {ParallelConfig{.tp = 2}, ParallelConfig{.dp = 2, .ep = 2}, ParallelConfig{.tp = 2, .dp = 2, .ep = 2}}) {
    const Exported imported = import_deepseek(c, dir.path(), layout);
    EXPECT_LE(strata_test::logits_error(imported.logits, exported.logits), 1e-5) << "tp=" << layout.tp << " ep=" << layout.ep;
    EXPECT_EQ(imported.biases, exported.biases) << "tp=" << layout.tp << " ep=" << layout.ep;
  }
}

TEST(HuggingFaceExport, DeepseekV3SettingsItCannotExpressAreRefused) {
  auto refused = [](models::ModelConfig c, std::initializer_list<std::string> parts) {
    expect_error<ConfigError>([&] { (void)hf::hf_architecture(hf::Architecture::mixtral, c); }, parts);
  };
  auto c = tiny_deepseek();
  c.moe.routing.score = MoeScore::softmax;
  refused(c, {"softmax routing", "sigmoid"});
  c = tiny_deepseek();
  c.moe.expert_bias = false;
  refused(c, {"no expert bias", "e_score_correction_bias"});
  c = tiny_deepseek();
  c.moe.shared_expert_ffn_hidden_size = 0;
  refused(c, {"shared experts"});
  c = tiny_deepseek();
  c.moe.routing.num_groups = 2;
  c.moe.routing.group_topk = 2;  // top-2 of 2 groups: strata scores a group by its top 1, DeepSeek by its top 2
  refused(c, {"topk / group_topk other than 2"});
  c = tiny_deepseek();
  c.qk_layernorm = false;
  refused(c, {"without its latent norms", "--qk-layernorm"});
  c = tiny_deepseek();
  c.moe.layers = {1, 0, 1};
  refused(c, {"dense layer after a MoE layer"});
  c = tiny_deepseek();
  c.moe = {};
  expect_error<ConfigError>([&] { (void)hf::hf_architecture(hf::Architecture::llama, c); }, {"multi-latent attention without experts"});
}

TEST(HuggingFaceImport, DeepseekV3SettingsItCannotExpressAreRefused) {
  TempDirectory dir("hf_deepseek_refused");
  const auto c = tiny_deepseek();
  const std::string config = hf::config_json(hf::Architecture::mixtral, c, SafetensorsDtype::float32);
  auto refused = [&](const std::string& from, const std::string& to, std::initializer_list<std::string> parts) {
    strata_test::expect_config_refused(dir.path(), config, from, to, parts);
  };
  refused("\"norm_topk_prob\": true", "\"norm_topk_prob\": false", {"norm_topk_prob", "divides the weights by their sum"});
  refused("\"topk_group\": 1", "\"topk_group\": 2", {"n_group, topk_group", "2 x topk_group"});
  refused("\"n_shared_experts\": 2", "\"n_shared_experts\": 0", {"n_shared_experts", "shared experts"});
  refused("\"first_k_dense_replace\": 1", "\"first_k_dense_replace\": 4", {"first_k_dense_replace", "num_hidden_layers=3"});
}

}  // namespace test_huggingface_deepseek_cases
