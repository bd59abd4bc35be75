// Hugging Face import and export of gpt-oss (models::Mixtral with every linear bias, quick GeGLU
// experts with a clamp and offset, learned attention sinks and alternating sliding windows;
// GptOssForCausalLM): the mapping names the stacked expert tensors (each expert a slice of one
// tensor, stored [in, out] with gate and up interleaved), the router's bias and the sinks;
// config.json carries the sizes, the clamp and the layer types, read back as the same
// configuration; export-then-import gives the model's logits in other layouts (tp, ep over dp);
// what GptOssForCausalLM cannot express is refused naming it, in both directions.
#include <gtest/gtest.h>

#include "huggingface_helpers.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_huggingface_gpt_oss_cases {

namespace {

using namespace strata;
using strata_test::expect_error;
using strata_test::TempDirectory;

models::ModelConfig tiny_gpt_oss() {
  models::ModelConfig c;
  c.num_layers = 3;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 12;  // 4 x 12 != 32, as gpt-oss's head_dim 64 with hidden 2880
  c.ffn_hidden_size = 16;  // one expert's width
  c.vocab_size = 37;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 8;
  c.rope_base = 500.0;
  c.norm_epsilon = 1e-5;
  c.init_method_std = 0.2;
  c.add_bias_linear = true;
  c.activation = MlpActivation::quick_geglu;
  c.activation_clamp = 0.5;
  c.glu_linear_offset = 1.0;
  c.softmax_type = SoftmaxType::learnable;
  c.window_size = 2;
  c.window_layers = {1, 0, 1};
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  return c;
}

const std::vector<std::int32_t> kTokens = {3, 17, 36, 0, 11, 29, 5, 8};

// One rank: the model with random biases (init leaves the experts' zero), exported to `dir`.
std::vector<std::vector<double>> export_gpt_oss(const models::ModelConfig& c, const std::filesystem::path& dir) {
  std::vector<std::vector<double>> logits;
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    models::Mixtral<strata_test::TestPolicy<float, false>> model(ctx, c);
    model.init(ctx, 2024);
    float value = -0.3f;
    model.for_each_parameter([&](auto& p) {
      if (p.name.ends_with(".bias"))
        for (index_t i = 0; i < p.value.numel(); ++i) p.value[i] = value = value > 0.3f ? -0.3f : value + 0.013f;
    });
    hf::save_hf_from_model(ctx, dir, model);
    logits = strata_test::all_logits(ctx, model, kTokens);
  });
  return logits;
}

std::vector<std::vector<double>> import_gpt_oss(const models::ModelConfig& c, const std::filesystem::path& dir,
                                                ParallelConfig layout) {
  std::vector<std::vector<double>> out;
  std::mutex mutex;
  inprocess::run(layout.world_size(), [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, layout);
    models::Mixtral<strata_test::TestPolicy<float, false>> model(ctx, c);
    model.init(ctx, 7);
    hf::load_hf(ctx, dir, model);
    auto logits = strata_test::all_logits(ctx, model, kTokens);
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      out = std::move(logits);
    }
  });
  return out;
}

}  // namespace

TEST(HuggingFaceMapping, GptOssNamesAndConfig) {
  const auto c = tiny_gpt_oss();
  std::map<std::string, std::vector<std::int64_t>> pieces;
  for (const auto& m : hf::tensor_mappings(hf::Architecture::mixtral, c))
    for (std::size_t k = 0; k < m.pieces.size(); ++k) pieces[m.pieces[k]] = m.piece_shapes[k];
  using Shape3 = std::vector<std::int64_t>;
  EXPECT_EQ(pieces["model.layers.0.mlp.experts.gate_up_proj"], (Shape3{4, 32, 32}));  // [experts, in, 2 x width]
  EXPECT_EQ(pieces["model.layers.0.mlp.experts.gate_up_proj_bias"], (Shape3{4, 32}));
  EXPECT_EQ(pieces["model.layers.2.mlp.experts.down_proj"], (Shape3{4, 16, 32}));  // [experts, width, out]
  EXPECT_EQ(pieces["model.layers.2.mlp.experts.down_proj_bias"], (Shape3{4, 32}));
  EXPECT_EQ(pieces["model.layers.1.mlp.router.bias"], (Shape3{4}));
  EXPECT_EQ(pieces["model.layers.1.self_attn.sinks"], (Shape3{4}));
  for (const char* name : {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.o_proj.bias",
                           "model.layers.0.mlp.router.weight"})
    EXPECT_TRUE(pieces.count(name)) << name;
  // Expert 1's fc1 row 2 (gate unit 2) is column 4 of its slice, row 16 + 2 (up unit 2) column 5.
  for (const auto& m : hf::tensor_mappings(hf::Architecture::mixtral, c)) {
    if (m.strata_name != "layers.0.mlp.experts.1.fc1.weight") continue;
    EXPECT_EQ(m.element_source(2 * 32 + 7).index, 1 * 32 * 32 + 7 * 32 + 4);
    EXPECT_EQ(m.element_source((16 + 2) * 32 + 7).index, 1 * 32 * 32 + 7 * 32 + 5);
  }
  TempDirectory dir("hf_gpt_oss_config");
  strata_test::write_text(dir.path() / "config.json", hf::config_json(hf::Architecture::mixtral, c, SafetensorsDtype::float32));
  const hf::HfConfig file = hf::read_config(dir.path());
  EXPECT_EQ(file.architecture, hf::Architecture::gpt_oss);
  const models::ModelConfig& r = file.config;
  EXPECT_TRUE(r.add_bias_linear);
  EXPECT_EQ(r.activation, MlpActivation::quick_geglu);
  EXPECT_EQ(r.activation_clamp, 0.5);
  EXPECT_EQ(r.glu_linear_offset, 1.0);
  EXPECT_EQ(r.softmax_type, SoftmaxType::learnable);
  EXPECT_EQ(r.window_size, 2);
  EXPECT_EQ(r.window_layers, (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(r.kv_channels, 12);
  EXPECT_EQ(r.expert_ffn(), 16);
  EXPECT_EQ(r.yarn_scaling_factor, 0.0) << "plain RoPE must not read back as GptOssConfig's default YaRN";
  hf::check_config(file, hf::Architecture::mixtral, c);  // no mismatch
  auto other = c;
  other.window_layers = {1, 1, 0};
  expect_error<ConfigError>([&] { hf::check_config(file, hf::Architecture::mixtral, other); }, {"layer_types", "layer 1"});
  other = c;
  other.activation_clamp = 7;
  expect_error<ConfigError>([&] { hf::check_config(file, hf::Architecture::mixtral, other); }, {"swiglu_limit"});
}

TEST(HuggingFaceRoundTrip, GptOssIsExactIntoOtherLayouts) {
  TempDirectory dir("hf_gpt_oss_round_trip");
  const auto c = tiny_gpt_oss();
  const auto exported = export_gpt_oss(c, dir.path());
  EXPECT_EQ(import_gpt_oss(c, dir.path(), ParallelConfig{}), exported);
  for (const ParallelConfig& layout : {ParallelConfig{.tp = 2}, ParallelConfig{.dp = 2, .ep = 2}, ParallelConfig{.tp = 2, .dp = 2, .ep = 2}})
    EXPECT_LE(strata_test::logits_error(import_gpt_oss(c, dir.path(), layout), exported), 1e-5)
        << "tp=" << layout.tp << " ep=" << layout.ep;
}

TEST(HuggingFaceExport, GptOssSettingsItCannotExpressAreRefused) {
  auto refused = [](models::ModelConfig c, std::initializer_list<std::string> parts) {
    expect_error<ConfigError>([&] { (void)hf::hf_architecture(hf::Architecture::mixtral, c); }, parts);
  };
  auto c = tiny_gpt_oss();
  c.softmax_type = SoftmaxType::vanilla;
  refused(c, {"no learnable attention sinks"});
  c = tiny_gpt_oss();
  c.activation = MlpActivation::swiglu;
  refused(c, {"another expert activation", "--quick-geglu"});
  c = tiny_gpt_oss();
  c.moe.shared_expert_ffn_hidden_size = 16;
  refused(c, {"another router"});
  c = tiny_gpt_oss();
  c.moe.layers = {0, 1, 1};
  refused(c, {"dense layers"});
  c = tiny_gpt_oss();
  c.moe = {};
  expect_error<ConfigError>([&] { (void)hf::hf_architecture(hf::Architecture::llama, c); }, {"linear biases without experts"});
}

TEST(HuggingFaceImport, GptOssSettingsItCannotExpressAreRefused) {
  TempDirectory dir("hf_gpt_oss_refused");
  const std::string config = hf::config_json(hf::Architecture::mixtral, tiny_gpt_oss(), SafetensorsDtype::float32);
  auto refused = [&](const std::string& from, const std::string& to, std::initializer_list<std::string> parts) {
    strata_test::expect_config_refused(dir.path(), config, from, to, parts);
  };
  refused("\"swiglu_alpha\": 1.702", "\"swiglu_alpha\": 1.5", {"swiglu_alpha", "1.702"});
  refused("\"attention_bias\": true", "\"attention_bias\": false", {"attention_bias"});
  refused("\"full_attention\"", "\"chunked_attention\"", {"layer_types", "chunked_attention"});
}

}  // namespace test_huggingface_gpt_oss_cases
