// Hugging Face import and export, GPT-2 and what both architectures share: the mapping covers
// every parameter; the files have transformers' names and layouts (Conv1D transposes, [q | k | v]
// columns, the real vocabulary only); a transformers-style forward pass over the exported files
// gives the model's logits; export-then-import is bit for bit exact in float, bf16 and double, at
// tp=1, tp=2 and tp=2 x pp=2, with the logits of the exporting model; shards with an index; and
// every mismatch between config.json, the files and the model is refused with a named error.
// (Llama: test_huggingface_llama.cpp.)
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <optional>
#include <set>

#include "huggingface_helpers.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_huggingface_cases {

namespace {

using namespace strata;
using strata_test::expect_error;
using strata_test::TempDirectory;

models::ModelConfig tiny_gpt() {
  models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 24;
  c.num_attention_heads = 4;  // head dim 6
  c.ffn_hidden_size = 40;
  c.vocab_size = 37;  // padded to 40 (multiple of 4 x tp)
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 7;
  c.init_method_std = 0.2;  // large enough that the logits differ clearly between positions
  return c;
}

const std::vector<std::int32_t> kTokens = {3, 17, 36, 0, 11, 29, 5};

// ---- the mapping ----

template <template <class> class Model>
void expect_mapping_covers_every_parameter(hf::Architecture architecture, const models::ModelConfig& config, int tp) {
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    Model<strata_test::TestPolicy<float, false>> model(ctx, config);
    std::map<std::string, Shape> parameters;
    model.for_each_parameter([&](auto& p) { parameters.emplace(p.name, p.global_shape); });
    const auto mappings =
        hf::tensor_mappings(architecture, config, hf::MappingOptions{.padded_vocab = config.padded_vocab(tp)});
    std::map<std::string, Shape> mapped;
    std::set<std::string> pieces;
    for (const auto& m : mappings) {
      mapped.emplace(m.strata_name, m.strata_shape);
      for (const auto& piece : m.pieces) EXPECT_TRUE(pieces.insert(piece).second) << piece << " is mapped twice";
    }
    EXPECT_EQ(mapped.size(), mappings.size());
    EXPECT_EQ(mapped, parameters);
  });
}

TEST(HuggingFaceMapping, CoversEveryParameterOfGpt) {
  expect_mapping_covers_every_parameter<models::Gpt>(hf::Architecture::gpt2, tiny_gpt(), 1);
  expect_mapping_covers_every_parameter<models::Gpt>(hf::Architecture::gpt2, tiny_gpt(), 2);
}

// strata's group-major qkv rows against GPT-2's c_attn columns, element by element, from the
// layout each side documents: strata head h's rows [q_h | k_h | v_h] (d each); c_attn's columns
// [q of all heads | k | v], head h at h*d. Exported through save_hf with values that encode
// (parameter, element), so every element is checked where it landed.
TEST(HuggingFaceLayout, Gpt2ConvOneDAndQkvColumns) {
  TempDirectory dir("hf_layout");
  const auto c = tiny_gpt();
  const index_t h = c.hidden_size, d = h / c.num_attention_heads, ffn = c.ffn(), vocab = c.vocab_size;
  std::map<std::string, double> ids;
  auto code = [&](const std::string& name, index_t element) { return ids.at(name) * 1e6 + static_cast<double>(element); };
  for (const auto& m : hf::tensor_mappings(hf::Architecture::gpt2, c)) ids.emplace(m.strata_name, static_cast<double>(ids.size() + 1));
  hf::save_hf(dir.path(), hf::Architecture::gpt2, c, [&](const std::string& name, const Shape& shape) {
    Tensor<double> t(shape);
    for (index_t i = 0; i < t.numel(); ++i) t[i] = code(name, i);
    return t;
  });
  const SafetensorsDirectory files(dir.path());
  const auto wte = files.read_tensor<double>("transformer.wte.weight");
  ASSERT_EQ(wte.shape(), (Shape{vocab, h}));  // the real vocabulary: no padding rows
  for (index_t i = 0; i < wte.numel(); ++i) EXPECT_EQ(wte[i], code("embedding.word.weight", i));
  const auto attn = files.read_tensor<double>("transformer.h.1.attn.c_attn.weight");  // [in, 3h]
  const auto bias = files.read_tensor<double>("transformer.h.1.attn.c_attn.bias");
  ASSERT_EQ(attn.shape(), (Shape{h, 3 * h}));
  for (index_t head = 0; head < c.num_attention_heads; ++head)
    for (index_t part = 0; part < 3; ++part)  // q, k, v
      for (index_t j = 0; j < d; ++j) {
        const index_t column = part * h + head * d + j, strata_row = head * 3 * d + part * d + j;
        EXPECT_EQ(bias[column], code("layers.1.attention.qkv.bias", strata_row));
        for (index_t in = 0; in < h; ++in)
          EXPECT_EQ(attn[in * 3 * h + column], code("layers.1.attention.qkv.weight", strata_row * h + in));
      }
  const auto fc = files.read_tensor<double>("transformer.h.0.mlp.c_fc.weight");  // [h, ffn]
  ASSERT_EQ(fc.shape(), (Shape{h, ffn}));
  for (index_t in = 0; in < h; ++in)
    for (index_t out = 0; out < ffn; ++out) EXPECT_EQ(fc[in * ffn + out], code("layers.0.mlp.fc1.weight", out * h + in));
  const auto proj = files.read_tensor<double>("transformer.h.0.mlp.c_proj.weight");  // [ffn, h]
  ASSERT_EQ(proj.shape(), (Shape{ffn, h}));
  for (index_t in = 0; in < ffn; ++in)
    for (index_t out = 0; out < h; ++out) EXPECT_EQ(proj[in * h + out], code("layers.0.mlp.fc2.weight", out * ffn + in));
  EXPECT_FALSE(files.has("lm_head.weight"));  // tied: transformers' own files leave it out
  EXPECT_EQ(files.file_of("transformer.ln_f.bias").metadata().at("format"), "pt");
}

// ---- exported files against a transformers-style forward ----

TEST(HuggingFaceExport, GptFilesGiveTheModelsLogitsInAnIndependentForward) {
  TempDirectory dir("hf_gpt_reference");
  const auto exported = strata_test::export_model<models::Gpt, double>(tiny_gpt(), dir.path(), kTokens);
  const auto reference = strata_test::HfReference(dir.path(), hf::Architecture::gpt2).logits(kTokens);
  EXPECT_LE(strata_test::logits_error(exported.logits, reference), 1e-12);
  EXPECT_EQ(hf::read_config(dir.path()).config.vocab_size, tiny_gpt().vocab_size);
}

// ---- round trips ----

TEST(HuggingFaceRoundTrip, GptFloatIsExactAtTp1AndTp2AndTp2Pp2) {
  TempDirectory dir("hf_gpt_float");
  const auto c = tiny_gpt();
  const auto exported = strata_test::export_model<models::Gpt, float>(c, dir.path(), kTokens);
  const auto tp1 = strata_test::import_model<models::Gpt, float>(c, dir.path(), kTokens, 1);
  strata_test::expect_same_values(tp1, exported, c.vocab_size, "tp=1");
  EXPECT_EQ(tp1.logits, exported.logits);  // same model, same ranks: the same numbers
  const auto tp2 = strata_test::import_model<models::Gpt, float>(c, dir.path(), kTokens, 2);
  strata_test::expect_same_values(tp2, exported, c.vocab_size, "tp=2");
  EXPECT_LE(strata_test::logits_error(tp2.logits, exported.logits), 1e-5);
  const auto tp2_pp2 = strata_test::import_model<models::Gpt, float>(c, dir.path(), kTokens, 2, 2);
  strata_test::expect_same_values(tp2_pp2, exported, c.vocab_size, "tp=2 pp=2");
}

TEST(HuggingFaceRoundTrip, GptBf16IsExactAtTp1AndTp2) {
  TempDirectory dir("hf_gpt_bf16");
  const auto c = tiny_gpt();
  const auto exported = strata_test::export_model<models::Gpt, bf16>(c, dir.path(), kTokens);
  EXPECT_EQ(SafetensorsDirectory(dir.path()).entry("transformer.wte.weight").dtype, SafetensorsDtype::bfloat16);
  EXPECT_NE(strata_test::read_text(dir.path() / "config.json").find("\"torch_dtype\": \"bfloat16\""), std::string::npos);
  const auto tp1 = strata_test::import_model<models::Gpt, bf16>(c, dir.path(), kTokens, 1);
  strata_test::expect_same_values(tp1, exported, c.vocab_size, "tp=1");
  EXPECT_EQ(tp1.logits, exported.logits);
  const auto tp2 = strata_test::import_model<models::Gpt, bf16>(c, dir.path(), kTokens, 2);
  strata_test::expect_same_values(tp2, exported, c.vocab_size, "tp=2");
  EXPECT_LE(strata_test::logits_error(tp2.logits, exported.logits), 2e-2);
}

// The initialization does not depend on tp, and save_hf_from_model gathers the shards: an export at
// tp=2 writes the very bytes of one at tp=1.
TEST(HuggingFaceExport, ExportAtTp2WritesTheBytesOfTp1) {
  TempDirectory one("hf_gpt_tp1"), two("hf_gpt_tp2");
  strata_test::export_model<models::Gpt, float>(tiny_gpt(), one.path(), kTokens, {}, 1);
  strata_test::export_model<models::Gpt, float>(tiny_gpt(), two.path(), kTokens, {}, 2);
  EXPECT_EQ(strata_test::read_text(one.path() / "model.safetensors"), strata_test::read_text(two.path() / "model.safetensors"));
  EXPECT_EQ(strata_test::read_text(one.path() / "config.json"), strata_test::read_text(two.path() / "config.json"));
}

// Shards and an index, then back to one file in the same directory (the stale files go).
TEST(HuggingFaceExport, ShardsWithAnIndexLoadLikeOneFile) {
  TempDirectory dir("hf_gpt_shards");
  const auto c = tiny_gpt();
  hf::SaveOptions options;
  options.max_shard_bytes = 8000;
  const auto exported = strata_test::export_model<models::Gpt, float>(c, dir.path(), kTokens, options);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "model.safetensors"));
  const SafetensorsDirectory files(dir.path());
  ASSERT_GT(files.files().size(), 2u);
  EXPECT_TRUE(files.file_of("transformer.wte.weight").path().filename().string().starts_with("model-00001-of-"));
  const std::string index = strata_test::read_text(files.index_path());
  EXPECT_NE(index.find("\"total_size\""), std::string::npos);
  EXPECT_NE(index.find("\"transformer.h.1.mlp.c_proj.bias\": \"model-"), std::string::npos);
  const auto imported = strata_test::import_model<models::Gpt, float>(c, dir.path(), kTokens, 2);
  strata_test::expect_same_values(imported, exported, c.vocab_size, "sharded, tp=2");

  strata_test::export_model<models::Gpt, float>(c, dir.path(), kTokens);  // one file again
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "model.safetensors.index.json"));
  for (const auto& item : std::filesystem::directory_iterator(dir.path()))
    EXPECT_FALSE(item.path().filename().string().starts_with("model-")) << item.path();
}

// A float model written as BF16 comes back rounded to bf16; as F64, exactly.
TEST(HuggingFaceExport, OtherDtypesConvert) {
  const auto c = tiny_gpt();
  for (SafetensorsDtype dtype : {SafetensorsDtype::bfloat16, SafetensorsDtype::float16, SafetensorsDtype::float64}) {
    TempDirectory dir("hf_gpt_dtype");
    const auto exported = strata_test::export_model<models::Gpt, float>(c, dir.path(), kTokens, hf::SaveOptions{.dtype = dtype});
    EXPECT_EQ(SafetensorsDirectory(dir.path()).entry("transformer.h.0.ln_1.weight").dtype, dtype);
    const auto imported = strata_test::import_model<models::Gpt, float>(c, dir.path(), kTokens, 2);
    for (const auto& [name, value] : exported.values) {
      const auto& back = imported.values.at(name);
      for (index_t i = 0; i < value.numel(); ++i) {
        const float expected = dtype == SafetensorsDtype::bfloat16  ? static_cast<float>(bf16(value[i]))
                               : dtype == SafetensorsDtype::float16 ? static_cast<float>(fp16(value[i]))
                                                                    : value[i];
        const bool padding = name == "embedding.word.weight" && i >= c.vocab_size * c.hidden_size;
        ASSERT_EQ(back[i], padding ? 0.0f : expected) << safetensors_dtype_code(dtype) << " " << name << "[" << i << "]";
      }
    }
  }
}

// Files saved from GPT2Model (no "transformer." prefix) with the causal-mask buffers and a tied
// lm_head.weight, as older transformers wrote them, load the same.
TEST(HuggingFaceImport, GptWithoutPrefixAndWithBuffersLoads) {
  TempDirectory dir("hf_gpt_prefix");
  const auto c = tiny_gpt();
  const auto exported = strata_test::export_model<models::Gpt, float>(c, dir.path(), kTokens);
  {
    const SafetensorsFile original(dir.path() / "model.safetensors");
    std::vector<Tensor<float>> keep;
    keep.reserve(original.entries().size() + 3);
    SafetensorsWriter w;
    for (const auto& e : original.entries()) {
      keep.push_back(original.read_tensor<float>(e.name));
      w.add(e.name.substr(std::string("transformer.").size()), keep.back());
    }
    keep.push_back(original.read_tensor<float>("transformer.wte.weight"));
    w.add("lm_head.weight", keep.back());
    keep.push_back(Tensor<float>::zeros(Shape{1, 1, c.seq_length, c.seq_length}));
    w.add("h.0.attn.bias", keep.back());
    keep.push_back(Tensor<float>::zeros(Shape{}));
    w.add("h.0.attn.masked_bias", keep.back());
    w.set_metadata("format", "pt");
    w.write(dir.path() / "model.safetensors");
  }
  const auto imported = strata_test::import_model<models::Gpt, float>(c, dir.path(), kTokens, 2);
  strata_test::expect_same_values(imported, exported, c.vocab_size, "no prefix");
}

// ---- refused ----

// An lm_head.weight that differs from the embedding (an untied model under a tied config) is
// refused, never dropped; non-finite weights are refused naming the file and the tensor.
TEST(HuggingFaceImport, GptUntiedLmHeadOrNonFiniteWeightsAreRefused) {
  TempDirectory dir("hf_gpt_untied");
  const auto c = tiny_gpt();
  strata_test::export_model<models::Gpt, float>(c, dir.path(), kTokens);
  const auto file = dir.path() / "model.safetensors";
  // Rewrites the file with `change` applied to the tensors, plus an lm_head.weight when `head` is set.
  auto rewrite = [&](const std::function<void(const std::string&, Tensor<float>&)>& change, std::optional<float> head_shift) {
    std::vector<Tensor<float>> keep;
    {
      const SafetensorsFile original(file);
      keep.reserve(original.entries().size() + 1);
      for (const auto& e : original.entries())
        if (e.name != "lm_head.weight") {
          keep.push_back(original.read_tensor<float>(e.name));
          change(e.name, keep.back());
        }
      if (head_shift) {
        keep.push_back(original.read_tensor<float>("transformer.wte.weight"));
        keep.back()[5] += *head_shift;
      }
    }
    SafetensorsWriter w;
    const SafetensorsFile names(file);
    std::size_t k = 0;
    for (const auto& e : names.entries())
      if (e.name != "lm_head.weight") w.add(e.name, keep[k++]);
    if (head_shift) w.add("lm_head.weight", keep[k]);
    w.set_metadata("format", "pt");
    w.write(file);
  };
  auto load = [&] {
    inprocess::run(2, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = 2});
      models::Gpt<strata_test::TestPolicy<float, false>> model(ctx, c);
      hf::load_hf(ctx, dir.path(), model);
    });
  };
  rewrite([](const std::string&, Tensor<float>&) {}, 0.0f);  // lm_head.weight equal to wte: ignored
  EXPECT_NO_THROW(load());
  rewrite([](const std::string&, Tensor<float>&) {}, 0.5f);
  expect_error<ConfigError>(load, {"model.safetensors", "lm_head.weight", "differs from transformer.wte.weight"});
  rewrite(
      [](const std::string& name, Tensor<float>& t) {
        if (name == "transformer.h.1.mlp.c_fc.weight") t[7] = std::numeric_limits<float>::infinity();
      },
      std::nullopt);
  expect_error<FileError>(load, {"model.safetensors", "'transformer.h.1.mlp.c_fc.weight'", "non-finite"});
}

template <template <class> class Model>
void load_into(const models::ModelConfig& c, const std::filesystem::path& dir, int tp = 1) {
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    Model<strata_test::TestPolicy<float, false>> model(ctx, c);
    hf::load_hf(ctx, dir, model);
  });
}

TEST(HuggingFaceImport, ConfigMismatchesNameTheFieldAndBothValues) {
  TempDirectory dir("hf_gpt_mismatch");
  const auto c = tiny_gpt();
  strata_test::export_model<models::Gpt, float>(c, dir.path(), kTokens);
  auto with = [&](auto change) {
    auto other = c;
    change(other);
    return other;
  };
  expect_error<ConfigError>([&] { load_into<models::Gpt>(with([](auto& m) { m.hidden_size = 32; }), dir.path()); },
                            {"config.json", "n_embd is 24", "hidden_size=32"});
  expect_error<ConfigError>([&] { load_into<models::Gpt>(with([](auto& m) { m.vocab_size = 38; }), dir.path()); },
                            {"vocab_size is 37", "vocab_size=38"});
  expect_error<ConfigError>([&] { load_into<models::Gpt>(with([](auto& m) { m.num_layers = 3; }), dir.path()); },
                            {"n_layer is 2", "num_layers=3"});
  expect_error<ConfigError>([&] { load_into<models::Gpt>(with([](auto& m) { m.ffn_hidden_size = 48; }), dir.path()); },
                            {"n_inner is 40", "ffn_hidden_size=48"});
  expect_error<ConfigError>([&] { load_into<models::Gpt>(with([](auto& m) { m.seq_length = 8; }), dir.path()); },
                            {"n_positions is 7", "max_position_embeddings=8"});  // the table's rows: seq_length here
  expect_error<ConfigError>([&] { load_into<models::Gpt>(with([](auto& m) { m.norm_epsilon = 1e-6; }), dir.path()); },
                            {"layer_norm_epsilon is 1e-05", "norm_epsilon=1e-06"});
  expect_error<ConfigError>([&] { load_into<models::Llama>(with([](auto& m) { m.num_query_groups = 4; }), dir.path()); },
                            {"model_type is \"gpt2\"", "strata model is llama"});
  // A different padding of the vocabulary is no mismatch: padding rows are zeros either way.
  load_into<models::Gpt>(with([](auto& m) { m.make_vocab_size_divisible_by = 16; }), dir.path(), 2);
}

TEST(HuggingFaceImport, SettingsStrataCannotExpressAreRefused) {
  TempDirectory dir("hf_gpt_settings");
  const auto c = tiny_gpt();
  strata_test::export_model<models::Gpt, float>(c, dir.path(), kTokens);
  const auto config = dir.path() / "config.json";
  const std::string original = strata_test::read_text(config);
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"\"gelu_new\"", "\"relu\"", "activation_function = \"relu\""},
      {"\"scale_attn_by_inverse_layer_idx\": false", "\"scale_attn_by_inverse_layer_idx\": true", "scale_attn_by_inverse_layer_idx"},
      {"\"scale_attn_weights\": true", "\"scale_attn_weights\": false", "scale_attn_weights"},
      {"\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false", "tie_word_embeddings"},
      {"\"model_type\": \"gpt2\"", "\"model_type\": \"bert\"", "model_type \"bert\""},
  };
  for (const auto& [from, to, expected] : cases) {
    strata_test::write_text(config, strata_test::replaced(original, from, to));
    expect_error<ConfigError>([&] { load_into<models::Gpt>(c, dir.path()); }, {"config.json", expected});
  }
  strata_test::write_text(config, strata_test::replaced(original, "\"n_embd\": 24", "\"n_embd\": \"24\""));
  expect_error<FileError>([&] { load_into<models::Gpt>(c, dir.path()); }, {"\"n_embd\" is a string 24, not an integer"});
  strata_test::write_text(config, strata_test::replaced(original, "\"n_embd\": 24,", "\"n_embd\": 24,,"));
  expect_error<FileError>([&] { load_into<models::Gpt>(c, dir.path()); }, {"config.json", "not valid JSON"});
  std::filesystem::remove(config);
  expect_error<FileError>([&] { load_into<models::Gpt>(c, dir.path()); }, {"config.json", "does not exist"});
  // Without the check, the weights alone load.
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    models::Gpt<strata_test::TestPolicy<float, false>> model(ctx, c);
    hf::load_hf(ctx, dir.path(), model, hf::LoadOptions{.check_config = false});
  });
}

// Rewrites model.safetensors through `edit(name, tensor) -> keep?`, plus `extra` tensors.
void rewrite(const std::filesystem::path& dir, const std::function<bool(const std::string&, Tensor<float>&)>& edit,
             const std::vector<std::pair<std::string, Shape>>& extra = {}) {
  const SafetensorsFile original(dir / "model.safetensors");
  std::vector<std::pair<std::string, Tensor<float>>> tensors;
  for (const auto& e : original.entries()) {
    Tensor<float> t = original.read_tensor<float>(e.name);
    if (edit(e.name, t)) tensors.emplace_back(e.name, std::move(t));
  }
  for (const auto& [name, shape] : extra) tensors.emplace_back(name, Tensor<float>::zeros(shape));
  SafetensorsWriter w;
  for (const auto& [name, t] : tensors) w.add(name, t);
  w.set_metadata("format", "pt");
  w.write(dir / "model.safetensors");
}

TEST(HuggingFaceImport, MissingExtraAndMisshapenTensorsAreRefused) {
  TempDirectory dir("hf_gpt_tensors");
  const auto c = tiny_gpt();
  strata_test::export_model<models::Gpt, float>(c, dir.path(), kTokens);
  const std::string saved = strata_test::read_text(dir.path() / "model.safetensors");
  auto restore = [&] { strata_test::write_text(dir.path() / "model.safetensors", saved); };

  rewrite(dir.path(), [](const std::string& name, Tensor<float>&) { return name != "transformer.h.1.ln_2.bias"; });
  expect_error<ConfigError>([&] { load_into<models::Gpt>(c, dir.path(), 2); },
                            {"model.safetensors", "has no tensor 'transformer.h.1.ln_2.bias'", "layers.1.norm2.bias"});
  restore();
  rewrite(dir.path(), [](const std::string&, Tensor<float>&) { return true; }, {{"transformer.h.2.ln_1.weight", Shape{24}}});
  expect_error<ConfigError>([&] { load_into<models::Gpt>(c, dir.path()); },
                            {"holds tensor 'transformer.h.2.ln_1.weight'", "no place in strata's gpt2"});
  restore();
  rewrite(dir.path(), [](const std::string& name, Tensor<float>&) { return name != "transformer.wpe.weight"; },
          {{"transformer.wpe.weight", Shape{8, 24}}});
  expect_error<ConfigError>([&] { load_into<models::Gpt>(c, dir.path()); },
                            {"tensor 'transformer.wpe.weight' has shape [8, 24]", "needs [7, 24]"});
  restore();
  // A corrupt file is a FileError naming it.
  std::filesystem::resize_file(dir.path() / "model.safetensors", saved.size() - 3);
  expect_error<FileError>([&] { load_into<models::Gpt>(c, dir.path()); }, {"model.safetensors", "corrupt"});
  restore();
  load_into<models::Gpt>(c, dir.path(), 2);
}

}  // namespace
}  // namespace test_huggingface_cases
