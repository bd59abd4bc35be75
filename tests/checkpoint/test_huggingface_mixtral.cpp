// Hugging Face import and export of Mixtral (models::Mixtral, MixtralForCausalLM): the mapping
// covers every parameter; config.json carries the expert numbers (intermediate_size is one expert's
// width); a transformers-style forward (MixtralSparseMoeBlock: softmax over all experts, top-k,
// renormalized) over the exported files gives the model's logits; the files are the same exported
// from one rank or from tp x ep x etp ranks; export-then-import is bit for bit exact into tp x ep x
// etp x pp x dp layouts; what Mixtral cannot express is refused.
#include <gtest/gtest.h>

#include "huggingface_helpers.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_huggingface_mixtral_cases {

namespace {

using namespace strata;
using strata_test::expect_error;
using strata_test::TempDirectory;

template <class P>
using Mixtral = models::Mixtral<P>;

models::ModelConfig tiny_mixtral() {
  models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;  // head dim 8
  c.num_query_groups = 2;
  c.ffn_hidden_size = 24;
  c.vocab_size = 37;
  c.make_vocab_size_divisible_by = 4;
  c.seq_length = 7;
  c.rope_base = 500.0;
  c.norm_epsilon = 1e-6;
  c.init_method_std = 0.2;
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  c.moe.expert_ffn_hidden_size = 16;  // unlike ffn_hidden_size: config.json's intermediate_size is this one
  c.moe.aux_loss_coeff = 0.02;
  return c;
}

const std::vector<std::int32_t> kTokens = {3, 17, 36, 0, 11, 29, 5};

struct Layout {
  int tp = 1, pp = 1, dp = 1, ep = 1, etp = 1;
  int world() const { return tp * pp * dp; }
  std::string str() const {
    return "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp) + " ep=" + std::to_string(ep) +
           " etp=" + std::to_string(etp);
  }
};

// Collective over ctx: every parameter's global value, dense ones gathered over tp, experts over
// etp (each expert written by etp rank 0 of expert-dp rank 0 of the ep rank that holds it).
template <class T, class Context, class Model>
void gather_all(Context& ctx, Model& model, strata_test::ModelState<T>& state, std::mutex& mutex) {
  model.for_each_parameter([&](auto& p) {
    if (p.expert) {
      auto global = gather_global(ctx.expert_tp, p, p.value);
      if (ctx.expert_tp.rank() != 0 || ctx.expert_dp.rank() != 0) return;
      std::lock_guard lock(mutex);
      EXPECT_TRUE(state.values.emplace(p.name, std::move(global)).second) << p.name << " came from two ranks";
      return;
    }
    auto global = gather_global(ctx.tp, p, p.value);
    if (ctx.tp.rank() != 0 || ctx.coords.dp != 0) return;
    std::lock_guard lock(mutex);
    state.values.emplace(p.name, std::move(global));
  });
}

template <class T>
strata_test::ModelState<T> export_mixtral(const models::ModelConfig& c, const std::filesystem::path& dir, Layout l = {},
                                          hf::SaveOptions options = {}) {
  strata_test::ModelState<T> state;
  std::mutex mutex;
  inprocess::run(l.world(), [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = l.tp, .dp = l.dp, .ep = l.ep, .etp = l.etp});
    Mixtral<strata_test::TestPolicy<T, false>> model(ctx, c);
    model.init(ctx, 2024);
    hf::save_hf_from_model(ctx, dir, model, options);
    gather_all(ctx, model, state, mutex);
    if (l.tp == 1) {  // prompts of every length: a MoE layer splits the tokens over tp, which needs lengths it divides
      auto logits = strata_test::all_logits(ctx, model, kTokens);
      if (world.rank() == 0) state.logits = std::move(logits);
    }
  });
  return state;
}

template <class T>
strata_test::ModelState<T> import_mixtral(const models::ModelConfig& c, const std::filesystem::path& dir, Layout l) {
  strata_test::ModelState<T> state;
  std::mutex mutex;
  inprocess::run(l.world(), [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(
        world, ParallelConfig{.tp = l.tp, .pp = l.pp, .dp = l.dp, .ep = l.ep, .etp = l.etp});
    Mixtral<strata_test::TestPolicy<T, false>> model(ctx, c, pipeline::stage_layers_of(c.num_layers, l.pp, 1, ctx.pp.rank(), 0));
    model.init(ctx, 7);
    hf::load_hf(ctx, dir, model);
    gather_all(ctx, model, state, mutex);
    if (l.pp == 1 && l.tp == 1) {
      auto logits = strata_test::all_logits(ctx, model, kTokens);
      if (world.rank() == 0) state.logits = std::move(logits);
    }
  });
  return state;
}

TEST(HuggingFaceMapping, CoversEveryParameterOfMixtral) {
  inprocess::run(1, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
    Mixtral<strata_test::TestPolicy<float, false>> model(ctx, tiny_mixtral());
    std::map<std::string, Shape> parameters, mapped;
    model.for_each_parameter([&](auto& p) { parameters.emplace(p.name, p.global_shape); });
    for (const auto& m : hf::tensor_mappings(hf::Architecture::mixtral, tiny_mixtral())) {
      mapped.emplace(m.strata_name, m.strata_shape);
      if (m.strata_name == "layers.1.mlp.experts.3.fc1.weight") {
        EXPECT_EQ(m.pieces, (std::vector<std::string>{"model.layers.1.block_sparse_moe.experts.3.w1.weight",
                                                      "model.layers.1.block_sparse_moe.experts.3.w3.weight"}));
        EXPECT_EQ(m.row_source(15).piece, 0);  // gate rows, then up rows, 16 each
        EXPECT_EQ(m.row_source(16).piece, 1);
        EXPECT_EQ(m.row_source(16).index, 0);
      }
      if (m.strata_name == "layers.0.mlp.router.weight") {
        EXPECT_EQ(m.pieces, std::vector<std::string>{"model.layers.0.block_sparse_moe.gate.weight"});
      }
    }
    EXPECT_EQ(mapped, parameters);
  });
  constexpr auto architecture = hf::architecture_of<Mixtral<strata_test::TestPolicy<float, false>>>::value;
  EXPECT_EQ(architecture, hf::Architecture::mixtral);
  EXPECT_EQ(hf::parse_architecture("mixtral"), hf::Architecture::mixtral);
}

TEST(HuggingFaceExport, MixtralConfigCarriesTheExperts) {
  TempDirectory dir("hf_mixtral_config");
  (void)export_mixtral<float>(tiny_mixtral(), dir.path());
  const std::string text = strata_test::read_text(dir.path() / "config.json");
  for (const char* field : {"\"architectures\": [\"MixtralForCausalLM\"]", "\"model_type\": \"mixtral\"", "\"intermediate_size\": 16",
                            "\"num_local_experts\": 4", "\"num_experts_per_tok\": 2", "\"router_aux_loss_coef\": 0.02",
                            "\"sliding_window\": null", "\"router_jitter_noise\": 0", "\"rope_theta\": 500",
                            "\"num_key_value_heads\": 2", "\"tie_word_embeddings\": false"})
    EXPECT_NE(text.find(field), std::string::npos) << field << " not in\n" << text;
  const hf::HfConfig back = hf::read_config(dir.path());
  EXPECT_EQ(back.architecture, hf::Architecture::mixtral);
  EXPECT_EQ(back.config.moe.num_experts, 4);
  EXPECT_EQ(back.config.moe.topk, 2);
  EXPECT_EQ(back.config.expert_ffn(), 16);
  EXPECT_EQ(back.config.moe.aux_loss_coeff, 0.02);
  EXPECT_NO_THROW(hf::check_config(back, hf::Architecture::mixtral, tiny_mixtral()));
}

// The exported files read by transformers' equations (the router's softmax, top-k and
// renormalization; each expert's w2(silu(w1 x) * w3 x)) give the model's own logits.
TEST(HuggingFaceExport, MixtralFilesGiveTheModelsLogitsInAnIndependentForward) {
  TempDirectory dir("hf_mixtral_reference");
  const auto exported = export_mixtral<double>(tiny_mixtral(), dir.path());
  const auto reference = strata_test::HfReference(dir.path(), hf::Architecture::mixtral).logits(kTokens);
  EXPECT_LE(strata_test::logits_error(exported.logits, reference), 1e-12);
}

// One rank's export and one of a model spread over tp x ep x etp write the same bytes.
TEST(HuggingFaceExport, MixtralFilesAreTheSameFromEveryLayout) {
  TempDirectory one("hf_mixtral_one"), spread("hf_mixtral_spread"), experts("hf_mixtral_ep");
  const auto c = tiny_mixtral();
  const auto a = export_mixtral<float>(c, one.path());
  const auto b = export_mixtral<float>(c, spread.path(), Layout{.tp = 2, .dp = 2, .ep = 2, .etp = 2});
  const auto d = export_mixtral<float>(c, experts.path(), Layout{.tp = 1, .dp = 4, .ep = 4, .etp = 1});
  const std::string files = strata_test::read_text(one.path() / "model.safetensors");
  EXPECT_EQ(strata_test::read_text(spread.path() / "model.safetensors"), files);
  EXPECT_EQ(strata_test::read_text(experts.path() / "model.safetensors"), files);
  EXPECT_EQ(strata_test::read_text(spread.path() / "config.json"), strata_test::read_text(one.path() / "config.json"));
  EXPECT_EQ(b.values.size(), a.values.size());
}

// import(export(x)) == x, bit for bit, at every layout: tp, ep, etp, pp and dp, and back.
TEST(HuggingFaceRoundTrip, MixtralIsExactIntoEveryLayout) {
  TempDirectory dir("hf_mixtral_round_trip");
  const auto c = tiny_mixtral();
  const auto exported = export_mixtral<float>(c, dir.path());
  for (const Layout& l : {Layout{}, Layout{.tp = 2, .ep = 1, .etp = 2}, Layout{.tp = 2, .ep = 2, .etp = 1},
                          Layout{.tp = 1, .dp = 2, .ep = 2, .etp = 1}, Layout{.tp = 2, .dp = 2, .ep = 2, .etp = 2},
                          Layout{.tp = 1, .dp = 4, .ep = 4, .etp = 1}, Layout{.tp = 2, .pp = 2, .ep = 2, .etp = 1},
                          Layout{.tp = 1, .pp = 2, .dp = 2, .ep = 2, .etp = 1}}) {
    const auto imported = import_mixtral<float>(c, dir.path(), l);
    strata_test::expect_same_values(imported, exported, c.vocab_size, l.str());
    if (l.pp == 1 && l.tp == 1) {
      if (l.ep == 1) {
        EXPECT_EQ(imported.logits, exported.logits) << l.str();
      } else {
        EXPECT_LE(strata_test::logits_error(imported.logits, exported.logits), 1e-5) << l.str();
      }
    }
  }
  // and exported again from a spread import, the same files
  TempDirectory again("hf_mixtral_again");
  std::mutex mutex;
  inprocess::run(4, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = 2, .dp = 2, .ep = 2, .etp = 2});
    Mixtral<strata_test::TestPolicy<float, false>> model(ctx, c);
    model.init(ctx, 7);
    hf::load_hf(ctx, dir.path(), model);
    hf::save_hf_from_model(ctx, again.path(), model);
  });
  EXPECT_EQ(strata_test::read_text(again.path() / "model.safetensors"), strata_test::read_text(dir.path() / "model.safetensors"));
}

TEST(HuggingFaceRoundTrip, MixtralBf16AndShardedFilesAreExact) {
  TempDirectory dir("hf_mixtral_bf16");
  const auto c = tiny_mixtral();
  hf::SaveOptions options;
  options.max_shard_bytes = 6000;
  const auto exported = export_mixtral<bf16>(c, dir.path(), {}, options);
  EXPECT_GT(SafetensorsDirectory(dir.path()).files().size(), 2u);
  const auto imported = import_mixtral<bf16>(c, dir.path(), Layout{.tp = 2, .ep = 2, .etp = 1});
  strata_test::expect_same_values(imported, exported, c.vocab_size, "bf16 tp=2 ep=2");
}

// What MixtralForCausalLM cannot express is refused, naming it; so are config.json settings strata
// cannot reproduce, and a model whose expert numbers differ from the file's.
TEST(HuggingFaceImport, MixtralMismatchesAndUnsupportedSettingsAreRefused) {
  TempDirectory dir("hf_mixtral_refused");
  const auto c = tiny_mixtral();
  (void)export_mixtral<float>(c, dir.path());
  auto with = [&](auto change) {
    auto other = c;
    change(other);
    return other;
  };
  auto refused_export = [&](const models::ModelConfig& m, std::initializer_list<std::string> parts) {
    TempDirectory out("hf_mixtral_refused_export");
    expect_error<ConfigError>([&] { (void)export_mixtral<float>(m, out.path()); }, parts);
  };
  refused_export(with([](auto& m) { m.moe.shared_expert_ffn_hidden_size = 8; }), {"shared experts"});
  refused_export(with([](auto& m) { m.moe.layers = {0, 1}; }), {"--moe-layer-freq"});
  refused_export(with([](auto& m) { m.moe.routing.score = MoeScore::sigmoid; }), {"sigmoid"});
  refused_export(with([](auto& m) { m.moe.routing.pre_softmax = true; }), {"pre-softmax"});
  refused_export(with([](auto& m) { m.moe.routing.scaling_factor = 2.0; }), {"scaling factor"});
  refused_export(with([](auto& m) { m.moe.expert_bias = true; }), {"expert bias"});

  auto load = [&](const models::ModelConfig& m) {
    inprocess::run(1, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
      Mixtral<strata_test::TestPolicy<float, false>> model(ctx, m);
      hf::load_hf(ctx, dir.path(), model);
    });
  };
  expect_error<ConfigError>([&] { load(with([](auto& m) { m.moe.num_experts = 8; })); },
                            {"num_local_experts is 4", "num_experts=8"});
  expect_error<ConfigError>([&] { load(with([](auto& m) { m.moe.topk = 1; })); }, {"num_experts_per_tok is 2", "moe_router_topk=1"});
  expect_error<ConfigError>([&] { load(with([](auto& m) { m.moe.expert_ffn_hidden_size = 24; })); },
                            {"intermediate_size is 16", "moe_ffn_hidden_size=24"});
  load(with([](auto& m) { m.ffn_hidden_size = 48; }));  // no dense MLP in Mixtral: its width is no weight shape
  const auto config = dir.path() / "config.json";
  const std::string original = strata_test::read_text(config);
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"\"sliding_window\": null", "\"sliding_window\": 4096", "sliding_window (null: -1 here) is 4096"},
      {"\"router_jitter_noise\": 0.0", "\"router_jitter_noise\": 0.01", "router_jitter_noise"},
      {"\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 5", "num_experts_per_tok = 5"},
      {"\"model_type\": \"mixtral\"", "\"model_type\": \"llama\"", "model_type is \"llama\""},
  };
  for (const auto& [from, to, expected] : cases) {
    strata_test::write_text(config, strata_test::replaced(original, from, to));
    expect_error<ConfigError>([&] { load(c); }, {"config.json", expected});
  }
  strata_test::write_text(config, original);
  load(c);
  // a dense Llama's files have no place in Mixtral, and the other way round
  expect_error<ConfigError>(
      [&] {
        inprocess::run(1, [&](inprocess::communicator& world) {
          auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
          auto dense = c;
          dense.moe = {};
          models::Llama<strata_test::TestPolicy<float, false>> model(ctx, dense);
          hf::load_hf(ctx, dir.path(), model);
        });
      },
      {"model_type is \"mixtral\""});
}

// ---- Qwen3-MoE (Qwen3MoeForCausalLM): the MoE model with Qwen3's qk norms and head_dim ----

models::ModelConfig tiny_qwen3_moe() {
  models::ModelConfig c = tiny_mixtral();
  c.qk_layernorm = true;
  c.kv_channels = 12;  // 4 x 12 != 32
  c.num_layers = 4;
  c.moe.layers = {0, 1, 1, 1};  // mlp_only_layers [0]: a dense first layer of ffn_hidden_size
  return c;
}

TEST(HuggingFaceMapping, Qwen3MoeNamesAndConfig) {
  const auto c = tiny_qwen3_moe();
  EXPECT_EQ(hf::hf_architecture(hf::Architecture::mixtral, c), hf::Architecture::qwen3_moe);
  std::map<std::string, std::vector<std::string>> pieces;
  for (const auto& m : hf::tensor_mappings(hf::Architecture::mixtral, c)) pieces[m.strata_name] = m.pieces;
  EXPECT_EQ(pieces["layers.0.mlp.fc1.weight"], (std::vector<std::string>{"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"}));
  EXPECT_EQ(pieces["layers.1.mlp.router.weight"], std::vector<std::string>{"model.layers.1.mlp.gate.weight"});
  EXPECT_EQ(pieces["layers.2.mlp.experts.3.fc1.weight"],
            (std::vector<std::string>{"model.layers.2.mlp.experts.3.gate_proj.weight", "model.layers.2.mlp.experts.3.up_proj.weight"}));
  EXPECT_EQ(pieces["layers.2.mlp.experts.3.fc2.weight"], std::vector<std::string>{"model.layers.2.mlp.experts.3.down_proj.weight"});
  EXPECT_EQ(pieces["layers.1.attention.q_norm.weight"], std::vector<std::string>{"model.layers.1.self_attn.q_norm.weight"});

  TempDirectory dir("hf_qwen3_moe_config");
  (void)export_mixtral<float>(c, dir.path());
  const std::string text = strata_test::read_text(dir.path() / "config.json");
  for (const char* field : {"\"architectures\": [\"Qwen3MoeForCausalLM\"]", "\"model_type\": \"qwen3_moe\"", "\"intermediate_size\": 24",
                            "\"moe_intermediate_size\": 16", "\"num_experts\": 4", "\"num_experts_per_tok\": 2",
                            "\"norm_topk_prob\": true", "\"decoder_sparse_step\": 1", "\"mlp_only_layers\": [0]", "\"head_dim\": 12"})
    EXPECT_NE(text.find(field), std::string::npos) << field << " not in\n" << text;
  const hf::HfConfig back = hf::read_config(dir.path());
  EXPECT_EQ(back.architecture, hf::Architecture::qwen3_moe);
  EXPECT_EQ(back.config.moe.layers, (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(back.config.expert_ffn(), 16);
  EXPECT_EQ(back.config.ffn(), 24);
  EXPECT_TRUE(back.config.qk_layernorm);
  EXPECT_NO_THROW(hf::check_config(back, hf::Architecture::mixtral, c));
  // decoder_sparse_step 2: layers 1 and 3 are the sparse ones (Qwen's (layer + 1) % step == 0)
  strata_test::write_text(dir.path() / "config.json",
                          strata_test::replaced(strata_test::replaced(text, "\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2"),
                                                "\"mlp_only_layers\": [0]", "\"mlp_only_layers\": []"));
  EXPECT_EQ(hf::read_config(dir.path()).config.moe.layers, (std::vector<int>{0, 1, 0, 1}));
  // transformers 5 writes the expert count as num_local_experts
  strata_test::write_text(dir.path() / "config.json", strata_test::replaced(text, "\"num_experts\": 4", "\"num_local_experts\": 4"));
  EXPECT_EQ(hf::read_config(dir.path()).config.moe.num_experts, 4);
  EXPECT_NO_THROW(hf::check_config(hf::read_config(dir.path()), hf::Architecture::mixtral, c));
}

// The files read by transformers' equations (Qwen3MoeSparseMoeBlock, with and without
// norm_topk_prob, and the dense first layer) give the model's logits; the round trip is exact at
// tp x ep x etp x pp layouts.
TEST(HuggingFaceRoundTrip, Qwen3MoeIsExactAndMatchesAnIndependentForward) {
  for (bool pre_softmax : {false, true}) {
    auto c = tiny_qwen3_moe();
    c.moe.routing.pre_softmax = pre_softmax;  // norm_topk_prob = !pre_softmax
    TempDirectory reference_dir("hf_qwen3_moe_reference");
    const auto exported64 = export_mixtral<double>(c, reference_dir.path());
    const auto reference = strata_test::HfReference(reference_dir.path(), hf::Architecture::qwen3_moe).logits(kTokens);
    EXPECT_LE(strata_test::logits_error(exported64.logits, reference), 1e-12) << "pre_softmax " << pre_softmax;
    EXPECT_EQ(hf::read_config(reference_dir.path()).config.moe.routing.pre_softmax, pre_softmax);

    TempDirectory dir("hf_qwen3_moe_round_trip");
    const auto exported = export_mixtral<float>(c, dir.path());
    for (const Layout& l : {Layout{}, Layout{.tp = 2, .ep = 2, .etp = 1}, Layout{.tp = 2, .dp = 2, .ep = 2, .etp = 2},
                            Layout{.tp = 1, .pp = 2, .dp = 2, .ep = 2, .etp = 1}}) {
      const auto imported = import_mixtral<float>(c, dir.path(), l);
      strata_test::expect_same_values(imported, exported, c.vocab_size, l.str());
    }
  }
  // a Qwen3-MoE checkpoint is refused by a model that differs in its pattern or its routing
  TempDirectory dir("hf_qwen3_moe_refused");
  const auto c = tiny_qwen3_moe();
  (void)export_mixtral<float>(c, dir.path());
  auto load = [&](const models::ModelConfig& m) {
    inprocess::run(1, [&](inprocess::communicator& world) {
      auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{});
      Mixtral<strata_test::TestPolicy<float, false>> model(ctx, m);
      hf::load_hf(ctx, dir.path(), model);
    });
  };
  auto other = c;
  other.moe.layers = {1, 0, 1, 1};
  expect_error<ConfigError>([&] { load(other); }, {"mlp_only_layers", "--moe-layer-freq"});
  other = c;
  other.moe.routing.pre_softmax = true;
  expect_error<ConfigError>([&] { load(other); }, {"norm_topk_prob is true", "pre_softmax"});
  load(c);
}

// ---- Qwen2-MoE (Qwen2MoeForCausalLM): q, k, v biases, a gated shared expert, dense layers ----

models::ModelConfig tiny_qwen2_moe() {
  models::ModelConfig c = tiny_mixtral();
  c.add_qkv_bias = true;
  c.num_layers = 4;
  c.moe.layers = {0, 1, 1, 1};  // mlp_only_layers [0]
  c.moe.shared_expert_ffn_hidden_size = 20;
  c.moe.shared_expert_gate = true;
  c.moe.routing.pre_softmax = true;  // norm_topk_prob false, Qwen1.5-MoE's
  return c;
}

TEST(HuggingFaceMapping, Qwen2MoeNamesAndConfig) {
  const auto c = tiny_qwen2_moe();
  EXPECT_EQ(hf::hf_architecture(hf::Architecture::mixtral, c), hf::Architecture::qwen2_moe);
  std::map<std::string, std::vector<std::string>> pieces;
  for (const auto& m : hf::tensor_mappings(hf::Architecture::mixtral, c)) pieces[m.strata_name] = m.pieces;
  EXPECT_EQ(pieces["layers.1.attention.qkv.bias"],
            (std::vector<std::string>{"model.layers.1.self_attn.q_proj.bias", "model.layers.1.self_attn.k_proj.bias",
                                      "model.layers.1.self_attn.v_proj.bias"}));
  EXPECT_EQ(pieces["layers.2.mlp.shared_experts.fc1.weight"],
            (std::vector<std::string>{"model.layers.2.mlp.shared_expert.gate_proj.weight", "model.layers.2.mlp.shared_expert.up_proj.weight"}));
  EXPECT_EQ(pieces["layers.2.mlp.shared_experts.fc2.weight"], std::vector<std::string>{"model.layers.2.mlp.shared_expert.down_proj.weight"});
  EXPECT_EQ(pieces["layers.2.mlp.shared_experts.gate_weight"], std::vector<std::string>{"model.layers.2.mlp.shared_expert_gate.weight"});
  EXPECT_EQ(pieces["layers.2.mlp.experts.3.fc2.weight"], std::vector<std::string>{"model.layers.2.mlp.experts.3.down_proj.weight"});
  EXPECT_EQ(pieces.count("layers.0.mlp.shared_experts.gate_weight"), 0u) << "the dense first layer has no experts";

  TempDirectory dir("hf_qwen2_moe_config");
  (void)export_mixtral<float>(c, dir.path());
  const std::string text = strata_test::read_text(dir.path() / "config.json");
  for (const char* field : {"\"architectures\": [\"Qwen2MoeForCausalLM\"]", "\"model_type\": \"qwen2_moe\"",
                            "\"shared_expert_intermediate_size\": 20", "\"qkv_bias\": true", "\"norm_topk_prob\": false",
                            "\"mlp_only_layers\": [0]", "\"moe_intermediate_size\": 16"})
    EXPECT_NE(text.find(field), std::string::npos) << field << " not in\n" << text;
  const hf::HfConfig back = hf::read_config(dir.path());
  EXPECT_EQ(back.architecture, hf::Architecture::qwen2_moe);
  EXPECT_TRUE(back.config.add_qkv_bias);
  EXPECT_TRUE(back.config.moe.shared_expert_gate);
  EXPECT_EQ(back.config.moe.shared_expert_ffn_hidden_size, 20);
  EXPECT_TRUE(back.config.moe.routing.pre_softmax);
  EXPECT_NO_THROW(hf::check_config(back, hf::Architecture::mixtral, c));
  // what the class cannot be without: the gate, the shared expert, the biases
  auto no_gate = c;
  no_gate.moe.shared_expert_gate = false;
  expect_error<ConfigError>([&] { (void)hf::hf_architecture(hf::Architecture::mixtral, no_gate); },
                            {"no gated shared expert", "--moe-shared-expert-gate"});
  auto other_width = c;
  other_width.moe.shared_expert_ffn_hidden_size = 24;
  expect_error<ConfigError>([&] { hf::check_config(back, hf::Architecture::mixtral, other_width); },
                            {"shared_expert_intermediate_size is 20", "24"});
}

// The files read by transformers' equations (Qwen2MoeSparseMoeBlock: softmax top-k, with and without
// norm_topk_prob, plus the gated shared expert; the dense first layer; the attention's biases) give
// the model's logits; the round trip is exact at tp x ep x etp x pp layouts.
TEST(HuggingFaceRoundTrip, Qwen2MoeIsExactAndMatchesAnIndependentForward) {
  for (bool pre_softmax : {true, false}) {
    auto c = tiny_qwen2_moe();
    c.moe.routing.pre_softmax = pre_softmax;
    TempDirectory reference_dir("hf_qwen2_moe_reference");
    const auto exported64 = export_mixtral<double>(c, reference_dir.path());
    const auto reference = strata_test::HfReference(reference_dir.path(), hf::Architecture::qwen2_moe).logits(kTokens);
    EXPECT_LE(strata_test::logits_error(exported64.logits, reference), 1e-12) << "pre_softmax " << pre_softmax;

    TempDirectory dir("hf_qwen2_moe_round_trip");
    const auto exported = export_mixtral<float>(c, dir.path());
    for (const Layout& l : {Layout{}, Layout{.tp = 2, .ep = 2, .etp = 1}, Layout{.tp = 2, .dp = 2, .ep = 2, .etp = 2},
                            Layout{.tp = 1, .pp = 2, .dp = 2, .ep = 2, .etp = 1}}) {
      const auto imported = import_mixtral<float>(c, dir.path(), l);
      strata_test::expect_same_values(imported, exported, c.vocab_size, l.str());
    }
  }
}

}  // namespace
}  // namespace test_huggingface_mixtral_cases
