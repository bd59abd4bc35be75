// Hugging Face import and export of Llama with grouped-query attention: the mapping covers every
// parameter; q/k/v_proj and gate/up_proj hold strata's group-major qkv and stacked fc1 rows where
// transformers expects them; a transformers-style forward (repeat_kv, rotate_half RoPE) over the
// exported files gives the model's logits; export-then-import is bit for bit exact in float and
// bf16 at tp=1, tp=2 and tp=2 x pp=2; a tied lm_head (tie_word_embeddings) loads into the output
// layer; settings strata cannot express are refused.
#include <gtest/gtest.h>

#include "huggingface_helpers.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_huggingface_llama_cases {

namespace {

using namespace strata;
using strata_test::expect_error;
using strata_test::TempDirectory;

models::ModelConfig tiny_llama() {
  models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;  // head dim 8
  c.num_query_groups = 2;     // 2 query heads per key/value head
  c.ffn_hidden_size = 24;
  c.vocab_size = 37;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 7;
  c.rope_base = 500.0;  // fast rotation, so a position mix-up shows
  c.norm_epsilon = 1e-6;
  c.init_method_std = 0.2;
  return c;
}

const std::vector<std::int32_t> kTokens = {3, 17, 36, 0, 11, 29, 5};

TEST(HuggingFaceMapping, CoversEveryParameterOfLlama) {
  for (int tp : {1, 2}) {
    inprocess::run(tp, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
      models::Llama<strata_test::TestPolicy<float, false>> model(ctx, tiny_llama());
      std::map<std::string, Shape> parameters, mapped;
      model.for_each_parameter([&](auto& p) { parameters.emplace(p.name, p.global_shape); });
      for (const auto& m : hf::tensor_mappings(hf::Architecture::llama, tiny_llama(),
                                               hf::MappingOptions{.padded_vocab = tiny_llama().padded_vocab(tp)}))
        mapped.emplace(m.strata_name, m.strata_shape);
      EXPECT_EQ(mapped, parameters);
    });
  }
}

// strata's qkv rows, group-major: for group g, [query heads g*H/G ... | k_g | v_g], d rows each;
// transformers' q_proj row h*d + j, k_proj and v_proj rows g*d + j; fc1 = [gate; up].
TEST(HuggingFaceLayout, LlamaQkvGroupsAndGateUp) {
  TempDirectory dir("hf_llama_layout");
  const auto c = tiny_llama();
  const index_t h = c.hidden_size, heads = c.num_attention_heads, groups = c.num_query_groups, d = h / heads,
                per_group = heads / groups, ffn = c.ffn();
  std::map<std::string, double> ids;
  auto code = [&](const std::string& name, index_t element) { return ids.at(name) * 1e6 + static_cast<double>(element); };
  for (const auto& m : hf::tensor_mappings(hf::Architecture::llama, c)) ids.emplace(m.strata_name, static_cast<double>(ids.size() + 1));
  hf::save_hf(dir.path(), hf::Architecture::llama, c, [&](const std::string& name, const Shape& shape) {
    Tensor<double> t(shape);
    for (index_t i = 0; i < t.numel(); ++i) t[i] = code(name, i);
    return t;
  });
  const SafetensorsDirectory files(dir.path());
  const auto q = files.read_tensor<double>("model.layers.1.self_attn.q_proj.weight");
  const auto k = files.read_tensor<double>("model.layers.1.self_attn.k_proj.weight");
  const auto v = files.read_tensor<double>("model.layers.1.self_attn.v_proj.weight");
  ASSERT_EQ(q.shape(), (Shape{heads * d, h}));
  ASSERT_EQ(k.shape(), (Shape{groups * d, h}));
  ASSERT_EQ(v.shape(), (Shape{groups * d, h}));
  const std::string qkv = "layers.1.attention.qkv.weight";
  for (index_t g = 0; g < groups; ++g)
    for (index_t j = 0; j < d; ++j)
      for (index_t in = 0; in < h; ++in) {
        const index_t group_row = g * (per_group + 2) * d;
        for (index_t s = 0; s < per_group; ++s)
          EXPECT_EQ(q[((g * per_group + s) * d + j) * h + in], code(qkv, (group_row + s * d + j) * h + in));
        EXPECT_EQ(k[(g * d + j) * h + in], code(qkv, (group_row + per_group * d + j) * h + in));
        EXPECT_EQ(v[(g * d + j) * h + in], code(qkv, (group_row + (per_group + 1) * d + j) * h + in));
      }
  const auto gate = files.read_tensor<double>("model.layers.0.mlp.gate_proj.weight");
  const auto up = files.read_tensor<double>("model.layers.0.mlp.up_proj.weight");
  for (index_t i = 0; i < ffn * h; ++i) {
    EXPECT_EQ(gate[i], code("layers.0.mlp.fc1.weight", i));
    EXPECT_EQ(up[i], code("layers.0.mlp.fc1.weight", ffn * h + i));
  }
  const auto head = files.read_tensor<double>("lm_head.weight");
  ASSERT_EQ(head.shape(), (Shape{c.vocab_size, h}));
  for (index_t i = 0; i < head.numel(); ++i) EXPECT_EQ(head[i], code("output.weight", i));
  const auto down = files.read_tensor<double>("model.layers.0.mlp.down_proj.weight");
  for (index_t i = 0; i < down.numel(); ++i) EXPECT_EQ(down[i], code("layers.0.mlp.fc2.weight", i));
  const hf::HfConfig config = hf::read_config(dir.path());
  EXPECT_EQ(config.architecture, hf::Architecture::llama);
  EXPECT_EQ(config.config.num_query_groups, groups);
  EXPECT_EQ(config.config.ffn(), ffn);
  EXPECT_EQ(config.config.rope_base, 500.0);
  EXPECT_EQ(config.config.norm_epsilon, 1e-6);
  EXPECT_EQ(config.config.seq_length, c.seq_length);
  EXPECT_FALSE(config.tie_word_embeddings);
  EXPECT_EQ(config.torch_dtype, "float64");
}

TEST(HuggingFaceExport, LlamaFilesGiveTheModelsLogitsInAnIndependentForward) {
  TempDirectory dir("hf_llama_reference");
  const auto exported = strata_test::export_model<models::Llama, double>(tiny_llama(), dir.path(), kTokens);
  const auto reference = strata_test::HfReference(dir.path(), hf::Architecture::llama).logits(kTokens);
  EXPECT_LE(strata_test::logits_error(exported.logits, reference), 1e-12);
}

TEST(HuggingFaceRoundTrip, LlamaFloatIsExactAtTp1AndTp2AndTp2Pp2) {
  TempDirectory dir("hf_llama_float");
  const auto c = tiny_llama();
  const auto exported = strata_test::export_model<models::Llama, float>(c, dir.path(), kTokens);
  const auto tp1 = strata_test::import_model<models::Llama, float>(c, dir.path(), kTokens, 1);
  strata_test::expect_same_values(tp1, exported, c.vocab_size, "tp=1");
  EXPECT_EQ(tp1.logits, exported.logits);
  const auto tp2 = strata_test::import_model<models::Llama, float>(c, dir.path(), kTokens, 2);
  strata_test::expect_same_values(tp2, exported, c.vocab_size, "tp=2");
  EXPECT_LE(strata_test::logits_error(tp2.logits, exported.logits), 1e-5);
  const auto tp2_pp2 = strata_test::import_model<models::Llama, float>(c, dir.path(), kTokens, 2, 2);
  strata_test::expect_same_values(tp2_pp2, exported, c.vocab_size, "tp=2 pp=2");
}

TEST(HuggingFaceRoundTrip, LlamaBf16IsExactAtTp1AndTp2) {
  TempDirectory dir("hf_llama_bf16");
  const auto c = tiny_llama();
  const auto exported = strata_test::export_model<models::Llama, bf16>(c, dir.path(), kTokens);
  const auto tp1 = strata_test::import_model<models::Llama, bf16>(c, dir.path(), kTokens, 1);
  strata_test::expect_same_values(tp1, exported, c.vocab_size, "tp=1");
  EXPECT_EQ(tp1.logits, exported.logits);
  const auto tp2 = strata_test::import_model<models::Llama, bf16>(c, dir.path(), kTokens, 2);
  strata_test::expect_same_values(tp2, exported, c.vocab_size, "tp=2");
  EXPECT_LE(strata_test::logits_error(tp2.logits, exported.logits), 2e-2);
}

// Sharded export of the GQA model, imported at tp=2 (every rank reads only the rows it holds).
TEST(HuggingFaceRoundTrip, LlamaShardedImportsAtTp2) {
  TempDirectory dir("hf_llama_shards");
  const auto c = tiny_llama();
  hf::SaveOptions options;
  options.max_shard_bytes = 6000;
  const auto exported = strata_test::export_model<models::Llama, float>(c, dir.path(), kTokens, options);
  EXPECT_GT(SafetensorsDirectory(dir.path()).files().size(), 2u);
  const auto tp2 = strata_test::import_model<models::Llama, float>(c, dir.path(), kTokens, 2);
  strata_test::expect_same_values(tp2, exported, c.vocab_size, "sharded tp=2");
}

// tie_word_embeddings: true (as transformers saves a tied Llama, without lm_head.weight) is
// refused, naming the key: strata's Llama would train and export it untied. With the config
// untied on purpose, files without lm_head.weight start the output layer from the embedding,
// padding rows zero.
TEST(HuggingFaceImport, LlamaTiedConfigIsRefusedAndAnUntiedOneWithoutLmHeadStartsFromTheEmbedding) {
  TempDirectory dir("hf_llama_tied");
  const auto c = tiny_llama();
  const auto exported = strata_test::export_model<models::Llama, float>(c, dir.path(), kTokens);
  const auto config = dir.path() / "config.json";
  strata_test::write_text(config, strata_test::replaced(strata_test::read_text(config), "\"tie_word_embeddings\": false",
                                                        "\"tie_word_embeddings\": true"));
  {
    const SafetensorsFile original(dir.path() / "model.safetensors");
    std::vector<Tensor<float>> keep;
    keep.reserve(original.entries().size());
    SafetensorsWriter w;
    for (const auto& e : original.entries()) {
      if (e.name == "lm_head.weight") continue;
      keep.push_back(original.read_tensor<float>(e.name));
      w.add(e.name, keep.back());
    }
    w.set_metadata("format", "pt");
    w.write(dir.path() / "model.safetensors");
  }
  expect_error<ConfigError>(
      [&] {
        inprocess::run(1, [&](inprocess::communicator& world) {
          auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
          models::Llama<strata_test::TestPolicy<float, false>> model(ctx, c);
          hf::load_hf(ctx, dir.path(), model);
        });
      },
      {"config.json", "tie_word_embeddings = true", "--untie-embeddings-and-output-weights", "\"tie_word_embeddings\": false"});
  strata_test::write_text(config, strata_test::replaced(strata_test::read_text(config), "\"tie_word_embeddings\": true",
                                                        "\"tie_word_embeddings\": false"));
  const auto imported = strata_test::import_model<models::Llama, float>(c, dir.path(), kTokens, 2);
  const auto embedding = strata_test::without_padding(exported, c.vocab_size).at("embedding.word.weight");
  EXPECT_TRUE(strata_test::same_bytes(imported.values.at("output.weight"), embedding));
  EXPECT_TRUE(strata_test::same_bytes(imported.values.at("embedding.word.weight"), embedding));
  const auto reference = strata_test::HfReference(dir.path(), hf::Architecture::llama).logits(kTokens);
  EXPECT_LE(strata_test::logits_error(imported.logits, reference), 1e-5);
}

// An export carries the source's bos_token_id, eos_token_id (a list included) and Llama's
// max_position_embeddings through, rather than dropping them or writing --seq-length.
TEST(HuggingFaceExport, TokenIdsAndMaxPositionsOfTheSourceAreCarriedThrough) {
  TempDirectory dir("hf_llama_carry");
  const auto c = tiny_llama();
  strata_test::export_model<models::Llama, float>(c, dir.path(), kTokens);
  const auto config = dir.path() / "config.json";
  std::string text = strata_test::read_text(config);
  text = strata_test::replaced(text, "\"max_position_embeddings\": 7", "\"max_position_embeddings\": 4096");
  text = strata_test::replaced(text, "\"tie_word_embeddings\": false",
                               "\"bos_token_id\": 1, \"eos_token_id\": [2, 36], \"tie_word_embeddings\": false");
  strata_test::write_text(config, text);
  const hf::HfConfig source = hf::read_config(dir.path());
  EXPECT_EQ(source.bos_token_id, "1");
  EXPECT_EQ(source.eos_token_id, "[2, 36]");
  EXPECT_EQ(source.max_position_embeddings, 4096);
  hf::SaveOptions options;
  hf::carry_settings(source, options);
  const json::Value written = json::parse(hf::config_json(hf::Architecture::llama, c, SafetensorsDtype::float32, options), "config");
  EXPECT_EQ(written.find("bos_token_id")->text(), "1");
  ASSERT_TRUE(written.find("eos_token_id")->is_array());
  EXPECT_EQ(written.find("eos_token_id")->items().size(), 2u);
  EXPECT_EQ(written.find("max_position_embeddings")->text(), "4096");
  // The round trip through the files: what was read is what is written again.
  const hf::HfConfig again = hf::read_config(dir.path());
  EXPECT_EQ(again.eos_token_id, "[2, 36]");
  // Without a source, Llama's ids are left out and max_position_embeddings is the model's.
  const json::Value plain = json::parse(hf::config_json(hf::Architecture::llama, c, SafetensorsDtype::float32), "config");
  EXPECT_EQ(plain.find("bos_token_id"), nullptr);
  EXPECT_EQ(plain.find("max_position_embeddings")->text(), "7");
  // A token id that is not an id is refused naming the field.
  strata_test::write_text(config, strata_test::replaced(text, "\"bos_token_id\": 1", "\"bos_token_id\": \"<s>\""));
  expect_error<FileError>([&] { hf::read_config(dir.path()); }, {"config.json", "bos_token_id", "not a token id"});
}

TEST(HuggingFaceImport, LlamaMismatchesAndUnsupportedSettingsAreRefused) {
  TempDirectory dir("hf_llama_refused");
  const auto c = tiny_llama();
  strata_test::export_model<models::Llama, float>(c, dir.path(), kTokens);
  auto load = [&](const models::ModelConfig& m, int tp = 1) {
    inprocess::run(tp, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
      models::Llama<strata_test::TestPolicy<float, false>> model(ctx, m);
      hf::load_hf(ctx, dir.path(), model);
    });
  };
  auto with = [&](auto change) {
    auto other = c;
    change(other);
    return other;
  };
  expect_error<ConfigError>([&] { load(with([](auto& m) { m.num_query_groups = 4; })); },
                            {"num_key_value_heads is 2", "num_query_groups=4"});
  expect_error<ConfigError>([&] { load(with([](auto& m) { m.num_query_groups = 0; })); },
                            {"num_key_value_heads is 2", "num_query_groups=4"});  // 0 means one group per head
  expect_error<ConfigError>([&] { load(with([](auto& m) { m.rope_base = 10000.0; })); }, {"rope_theta is 500", "rope_base=10000"});
  expect_error<ConfigError>([&] { load(with([](auto& m) { m.norm_epsilon = 1e-5; })); }, {"rms_norm_eps is 1e-06", "norm_epsilon=1e-05"});
  expect_error<ConfigError>([&] { load(with([](auto& m) { m.ffn_hidden_size = 32; })); }, {"intermediate_size is 24", "ffn_hidden_size=32"});
  load(with([](auto& m) { m.seq_length = 12; }), 2);  // max_position_embeddings is no weight shape

  const auto config = dir.path() / "config.json";
  const std::string original = strata_test::read_text(config);
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act = \"gelu\""},
      {"\"rope_theta\": 500.0,", "\"rope_theta\": 500.0, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0},",
       "rope_scaling.type = linear"},
      {"\"rope_theta\": 500.0,", "\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500.0},",
       "rope_parameters.rope_type = llama3"},
      {"\"rope_theta\": 500.0,", "\"rope_theta\": 500.0, \"rope_parameters\": {\"rope_theta\": 400.0},",
       "rope_parameters.rope_theta = 400.0 cannot be imported: rope_theta says 500"},
      {"\"attention_bias\": false", "\"attention_bias\": true", "attention_bias"},
      {"\"mlp_bias\": false", "\"mlp_bias\": true", "mlp_bias"},
      {"\"head_dim\": 8", "\"head_dim\": 16", "head_dim is 16 but the strata model has kv_channels=8"},
  };
  for (const auto& [from, to, expected] : cases) {
    strata_test::write_text(config, strata_test::replaced(original, from, to));
    expect_error<ConfigError>([&] { load(c); }, {"config.json", expected});
  }
  // transformers 5: the theta inside rope_parameters (and no rope_theta); a default rope_scaling is no scaling.
  strata_test::write_text(config, strata_test::replaced(original, "\"rope_theta\": 500.0,",
                                                        "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500.0}, "
                                                        "\"rope_scaling\": {\"rope_type\": \"default\"},"));
  EXPECT_EQ(hf::read_config(dir.path()).config.rope_base, 500.0);
  load(c, 2);
  strata_test::write_text(config, strata_test::replaced(original, "\"rope_theta\": 500.0,", ""));
  expect_error<ConfigError>([&] { load(c); }, {"rope_theta is 10000", "rope_base=500"});  // transformers' default
  strata_test::write_text(config, original);
  load(c, 2);
}

}  // namespace
}  // namespace test_huggingface_llama_cases
