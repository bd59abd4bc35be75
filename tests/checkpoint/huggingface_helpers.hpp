// Shared body of the Hugging Face import/export tests: export a model (single rank or tp), import
// it into any tp x pp layout, gather what came back, and a plain transformers-style forward pass
// written from the Hugging Face equations (Conv1D, [q | k | v], repeat_kv, rotate_half), in double,
// that reads the exported files directly: an independent check of the name and layout mapping.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <strata/checkpoint/huggingface.hpp>
#include <strata/models.hpp>
#include <strata/pipeline.hpp>
#include <strata/policy.hpp>

#include "../common/equivalence.hpp"
#include "expect_error.hpp"
#include "temp_directory.hpp"

namespace strata_test {

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
inline void write_text(const std::filesystem::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }
// `text` with `from` replaced once by `to` (which must be there).
inline std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "'" << from << "' not in the text";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// read_config refuses `config` (a config.json's text) with `from` replaced once by `to`, written to
// <dir>/config.json, with a ConfigError naming every one of `parts`.
inline void expect_config_refused(const std::filesystem::path& dir, const std::string& config, const std::string& from,
                                  const std::string& to, std::initializer_list<std::string> parts) {
  write_text(dir / "config.json", replaced(config, from, to));
  expect_error<strata::ConfigError>([&] { (void)strata::hf::read_config(dir); }, parts);
}

inline strata::Tensor<std::int32_t> prompt(const std::vector<std::int32_t>& ids) {
  return strata::Tensor<std::int32_t>(strata::Shape{1, static_cast<strata::index_t>(ids.size())}, ids);
}

// What a run saw: every parameter's global value (host) and the logits at every position.
template <class T>
struct ModelState {
  std::map<std::string, strata::Tensor<T>> values;
  std::vector<std::vector<double>> logits;  // [position][vocab]
};

template <class Context, class Model>
std::vector<std::vector<double>> all_logits(Context& ctx, const Model& model, const std::vector<std::int32_t>& tokens) {
  std::vector<std::vector<double>> out;
  const auto ids = prompt(tokens);
  for (strata::index_t t = 0; t < ids.size(1); ++t) out.push_back(model.next_token_logits(ctx, ids, t));
  return out;
}

// Collective over ctx: gathers every parameter over tp into `state` (tp rank 0 of each stage writes;
// a parameter two stages hold, the tied embedding, must come back the same from both).
template <class T, class Context, class Model>
void gather_values(Context& ctx, Model& model, ModelState<T>& state, std::mutex& mutex) {
  model.for_each_parameter([&](auto& p) {
    auto global = strata::gather_global(ctx.tp, p, p.value);
    if (ctx.tp.rank() != 0 || ctx.coords.dp != 0) return;
    std::lock_guard lock(mutex);
    auto [it, inserted] = state.values.emplace(p.name, std::move(global));
    if (!inserted) {
      EXPECT_TRUE(same_bytes(it->second, global)) << "the two copies of " << p.name << " differ";
    }
  });
}

// Builds a model on `tp` ranks, initializes it with `seed`, exports it to `dir` (save_hf_from_model)
// and returns its values and logits.
template <template <class> class Model, class T>
ModelState<T> export_model(const strata::models::ModelConfig& config, const std::filesystem::path& dir,
                           const std::vector<std::int32_t>& tokens, strata::hf::SaveOptions options = {}, int tp = 1,
                           std::uint64_t seed = 2024) {
  using namespace strata;
  ModelState<T> state;
  std::mutex mutex;
  inprocess::run(tp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp});
    Model<TestPolicy<T, false>> model(ctx, config);
    model.init(ctx, seed);
    hf::save_hf_from_model(ctx, dir, model, options);
    gather_values(ctx, model, state, mutex);
    auto logits = all_logits(ctx, model, tokens);
    if (world.rank() == 0) state.logits = std::move(logits);
  });
  return state;
}

// Builds a model on tp x pp ranks (pipeline stages as pipeline::stage_layers_of splits them),
// initializes it with another seed (so every value must come from the files), loads `dir` and
// returns the gathered values, and the logits when pp = 1.
template <template <class> class Model, class T, bool SP = false>
ModelState<T> import_model(const strata::models::ModelConfig& config, const std::filesystem::path& dir,
                           const std::vector<std::int32_t>& tokens, int tp, int pp = 1) {
  using namespace strata;
  ModelState<T> state;
  std::mutex mutex;
  inprocess::run(tp * pp, [&](inprocess::communicator& world) {
    auto ctx = ParallelContext<inprocess::communicator>::create(world, ParallelConfig{.tp = tp, .pp = pp});
    Model<TestPolicy<T, SP>> model(ctx, config, pipeline::stage_layers_of(config.num_layers, pp, 1, ctx.pp.rank(), 0));
    model.init(ctx, 7);
    hf::load_hf(ctx, dir, model);
    gather_values(ctx, model, state, mutex);
    if (pp == 1) {
      auto logits = all_logits(ctx, model, tokens);
      if (world.rank() == 0) state.logits = std::move(logits);
    }
  });
  return state;
}

// The values an import of `exported` must give: the same, with the vocabulary padding rows (which
// the files do not hold) zero.
template <class T>
std::map<std::string, strata::Tensor<T>> without_padding(const ModelState<T>& exported, strata::index_t vocab_size) {
  std::map<std::string, strata::Tensor<T>> out;
  for (const auto& [name, value] : exported.values) {
    strata::Tensor<T> copy = value.clone();
    if (name == "embedding.word.weight" || name == "output.weight")
      for (strata::index_t i = vocab_size * value.shape()[1]; i < value.numel(); ++i) copy[i] = T(0.0f);
    out.emplace(name, std::move(copy));
  }
  return out;
}

// Every value of `imported` is bit for bit the exported one (but for the vocabulary padding, zero).
template <class T>
void expect_same_values(const ModelState<T>& imported, const ModelState<T>& exported, strata::index_t vocab_size,
                        const std::string& what) {
  const auto expected = without_padding(exported, vocab_size);
  EXPECT_EQ(imported.values.size(), expected.size()) << what;
  for (const auto& [name, value] : expected) {
    auto it = imported.values.find(name);
    if (it == imported.values.end()) {
      ADD_FAILURE() << what << ": " << name << " did not come back";
      continue;
    }
    EXPECT_TRUE(same_bytes(it->second, value)) << what << ": " << name << " differs";
  }
}

inline double logits_error(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  Values flat_a, flat_b;
  for (const auto& row : a) flat_a.insert(flat_a.end(), row.begin(), row.end());
  for (const auto& row : b) flat_b.insert(flat_b.end(), row.begin(), row.end());
  EXPECT_EQ(flat_a.size(), flat_b.size());
  return relative_error(flat_a, flat_b);
}

// ---- a transformers-style forward pass, written from the Hugging Face equations ----

class HfReference {
 public:
  HfReference(const std::filesystem::path& dir, strata::hf::Architecture architecture)
      : files_(dir), architecture_(architecture), config_(strata::hf::read_config(dir).config),
        sliding_window_(raw_sliding_window(dir / "config.json")) {}

  // Logits [position][vocab] of the whole prompt.
  std::vector<std::vector<double>> logits(const std::vector<std::int32_t>& tokens) const {
    return architecture_ == strata::hf::Architecture::gpt2 ? gpt2(tokens) : llama(tokens);
  }

 private:
  using Rows = std::vector<std::vector<double>>;

  std::vector<double> tensor(const std::string& name) const {
    std::vector<double> v(static_cast<std::size_t>(files_.entry(name).numel));
    files_.read<double>(name, std::span<double>(v));
    return v;
  }
  // x [n][in] @ W, W stored [in, out] (Conv1D), + b [out]
  static Rows conv1d(const Rows& x, const std::vector<double>& w, const std::vector<double>& b) {
    const std::size_t in = x[0].size(), out = b.size();
    Rows y(x.size(), std::vector<double>(out));
    for (std::size_t t = 0; t < x.size(); ++t)
      for (std::size_t o = 0; o < out; ++o) {
        double s = b[o];
        for (std::size_t i = 0; i < in; ++i) s += x[t][i] * w[i * out + o];
        y[t][o] = s;
      }
    return y;
  }
  // x [n][in] @ W^T, W stored [out, in] (nn.Linear, no bias)
  static Rows linear(const Rows& x, const std::vector<double>& w) {
    const std::size_t in = x[0].size(), out = w.size() / in;
    Rows y(x.size(), std::vector<double>(out));
    for (std::size_t t = 0; t < x.size(); ++t)
      for (std::size_t o = 0; o < out; ++o) {
        double s = 0;
        for (std::size_t i = 0; i < in; ++i) s += x[t][i] * w[o * in + i];
        y[t][o] = s;
      }
    return y;
  }
  static Rows layer_norm(const Rows& x, const std::vector<double>& g, const std::vector<double>& b, double eps) {
    Rows y = x;
    for (auto& row : y) {
      double mean = 0, var = 0;
      for (double v : row) mean += v;
      mean /= static_cast<double>(row.size());
      for (double v : row) var += (v - mean) * (v - mean);
      var /= static_cast<double>(row.size());
      for (std::size_t i = 0; i < row.size(); ++i) row[i] = (row[i] - mean) / std::sqrt(var + eps) * g[i] + b[i];
    }
    return y;
  }
  static Rows rms_norm(const Rows& x, const std::vector<double>& g, double eps) {
    Rows y = x;
    for (auto& row : y) {
      double ms = 0;
      for (double v : row) ms += v * v;
      ms /= static_cast<double>(row.size());
      for (std::size_t i = 0; i < row.size(); ++i) row[i] = row[i] / std::sqrt(ms + eps) * g[i];
    }
    return y;
  }
  // config.json's "sliding_window" as transformers reads it (0: none, null or absent), taken from
  // the file itself rather than from strata's reading of it.
  static std::size_t raw_sliding_window(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    const strata::json::Value root = strata::json::parse(text.str(), "config.json");
    const strata::json::Value* w = root.find("sliding_window");
    std::int64_t keys = 0;
    return w != nullptr && !w->is_null() && w->to_int64(keys) ? static_cast<std::size_t>(keys) : 0;
  }
  // Causal attention; query head h reads key/value head h / (heads / kv_heads) (repeat_kv).
  // q [n][heads*d] at columns q_at + h*d, k and v [n][kv_heads*d] at k_at / v_at + g*d. With a
  // sliding window W (transformers' masking_utils: key u is seen from query t when u > t - W), the
  // keys before that are masked.
  static Rows attention(const Rows& q, std::size_t q_at, const Rows& k, std::size_t k_at, const Rows& v, std::size_t v_at,
                        int heads, int kv_heads, int d, std::size_t window = 0) {
    const std::size_t n = q.size();
    Rows out(n, std::vector<double>(static_cast<std::size_t>(heads * d)));
    for (int h = 0; h < heads; ++h) {
      const int g = h / (heads / kv_heads);
      for (std::size_t t = 0; t < n; ++t) {
        std::vector<double> score(t + 1);
        double top = -1e300;
        std::vector<bool> seen(t + 1);
        for (std::size_t u = 0; u <= t; ++u) {
          seen[u] = window == 0 || u + window > t;
          double s = 0;
          for (int j = 0; j < d; ++j) s += q[t][q_at + h * d + j] * k[u][k_at + g * d + j];
          score[u] = s / std::sqrt(static_cast<double>(d));
          if (seen[u]) top = std::max(top, score[u]);
        }
        double total = 0;
        for (std::size_t u = 0; u <= t; ++u) total += (score[u] = seen[u] ? std::exp(score[u] - top) : 0.0);
        for (std::size_t u = 0; u <= t; ++u)
          for (int j = 0; j < d; ++j) out[t][h * d + j] += score[u] / total * v[u][v_at + g * d + j];
      }
    }
    return out;
  }
  static void add(Rows& x, const Rows& y) {
    for (std::size_t t = 0; t < x.size(); ++t)
      for (std::size_t i = 0; i < x[t].size(); ++i) x[t][i] += y[t][i];
  }
  // Logits against a [vocab, hidden] matrix.
  static Rows unembed(const Rows& x, const std::vector<double>& w) { return linear(x, w); }

  Rows gpt2(const std::vector<std::int32_t>& tokens) const {
    const auto& c = config_;
    const int h = c.hidden_size, heads = c.num_attention_heads, d = h / heads;
    const auto wte = tensor("transformer.wte.weight"), wpe = tensor("transformer.wpe.weight");
    Rows x(tokens.size(), std::vector<double>(static_cast<std::size_t>(h)));
    for (std::size_t t = 0; t < tokens.size(); ++t)
      for (int i = 0; i < h; ++i) x[t][i] = wte[tokens[t] * h + i] + wpe[t * h + i];
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      const Rows a = layer_norm(x, tensor(p + "ln_1.weight"), tensor(p + "ln_1.bias"), c.norm_epsilon);
      const Rows qkv = conv1d(a, tensor(p + "attn.c_attn.weight"), tensor(p + "attn.c_attn.bias"));  // [q | k | v]
      const Rows context = attention(qkv, 0, qkv, static_cast<std::size_t>(h), qkv, static_cast<std::size_t>(2 * h), heads, heads, d);
      add(x, conv1d(context, tensor(p + "attn.c_proj.weight"), tensor(p + "attn.c_proj.bias")));
      const Rows m = layer_norm(x, tensor(p + "ln_2.weight"), tensor(p + "ln_2.bias"), c.norm_epsilon);
      Rows f = conv1d(m, tensor(p + "mlp.c_fc.weight"), tensor(p + "mlp.c_fc.bias"));
      for (auto& row : f)
        for (double& v : row) v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));  // gelu_new
      add(x, conv1d(f, tensor(p + "mlp.c_proj.weight"), tensor(p + "mlp.c_proj.bias")));
    }
    return unembed(layer_norm(x, tensor("transformer.ln_f.weight"), tensor("transformer.ln_f.bias"), c.norm_epsilon), wte);
  }

  // transformers' inverse frequency, with rope_type "llama3" (Llama 3.1) when config.json has it:
  // wavelengths beyond original / low_freq_factor slowed by factor, below original / high_freq_factor
  // kept, and a smooth mix between.
  // With rope_type "yarn", _compute_yarn_parameters written out: the correction range of beta_fast
  // and beta_slow over the original context, the linear ramp between, interpolation beyond.
  double inverse_frequency(int i, int d) const {
    const double freq = 1.0 / std::pow(config_.rope_base, 2.0 * i / d);
    const auto& c = config_;
    if (c.yarn_scaling_factor > 0) {
      auto correction_dim = [&](double rotations) {
        return d * std::log(c.yarn_original_max_positions / (rotations * 2 * M_PI)) / (2 * std::log(c.rope_base));
      };
      double low = correction_dim(c.yarn_beta_fast), high = correction_dim(c.yarn_beta_slow);
      if (c.yarn_round_to_int) low = std::floor(low), high = std::ceil(high);
      low = std::max(low, 0.0), high = std::min(high, d - 1.0);
      if (low == high) high += 0.001;
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0), extrapolation = 1 - ramp;
      const double interpolated = 1.0 / (c.yarn_scaling_factor * std::pow(c.rope_base, 2.0 * i / d));
      return interpolated * (1 - extrapolation) + freq * extrapolation;
    }
    if (!(c.rope_scaling_factor > 0)) return freq;
    const double wavelength = 2 * M_PI / freq, original = c.rope_original_max_positions;
    if (wavelength < original / c.rope_high_freq_factor) return freq;
    if (wavelength > original / c.rope_low_freq_factor) return freq / c.rope_scaling_factor;
    const double smooth = (original / wavelength - c.rope_low_freq_factor) / (c.rope_high_freq_factor - c.rope_low_freq_factor);
    return (1 - smooth) * freq / c.rope_scaling_factor + smooth * freq;
  }
  // YaRN's attention factor on cos and sin: mscale / mscale_all_dim's when both are set, else
  // 0.1 ln(factor) + 1 (transformers' get_mscale), 1 without YaRN.
  double attention_factor() const {
    const auto& c = config_;
    if (!(c.yarn_scaling_factor > 0)) return 1.0;
    auto get_mscale = [&](double k) { return c.yarn_scaling_factor <= 1 ? 1.0 : 0.1 * k * std::log(c.yarn_scaling_factor) + 1.0; };
    if (c.yarn_mscale != 0 && c.yarn_mscale_all_dim != 0) return get_mscale(c.yarn_mscale) / get_mscale(c.yarn_mscale_all_dim);
    return get_mscale(c.yarn_mscale);  // mscale 1 unless an attention_factor was read into it
  }
  // q*cos + rotate_half(q)*sin, rotate_half(x) = [-x2, x1], cos/sin of cat(freqs, freqs) (times YaRN's factor)
  void rope(Rows& x, int heads, int d) const {
    const double m = attention_factor();
    for (std::size_t t = 0; t < x.size(); ++t)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < d / 2; ++i) {
          const double inv_freq = inverse_frequency(i, d);
          const double angle = static_cast<double>(t) * inv_freq;
          double& a = x[t][h * d + i];
          double& b = x[t][h * d + i + d / 2];
          const double ra = m * (a * std::cos(angle) - b * std::sin(angle));
          const double rb = m * (b * std::cos(angle) + a * std::sin(angle));
          a = ra;
          b = rb;
        }
  }

  Rows llama(const std::vector<std::int32_t>& tokens) const {
    const auto& c = config_;
    const int h = c.hidden_size, heads = c.num_attention_heads, kv = c.num_query_groups, d = c.head_dim();
    const bool qwen2 = architecture_ == strata::hf::Architecture::qwen2 || architecture_ == strata::hf::Architecture::qwen2_moe,
               qwen3 = architecture_ == strata::hf::Architecture::qwen3 || architecture_ == strata::hf::Architecture::qwen3_moe;
    const auto embed = tensor("model.embed_tokens.weight");
    Rows x(tokens.size(), std::vector<double>(static_cast<std::size_t>(h)));
    for (std::size_t t = 0; t < tokens.size(); ++t)
      for (int i = 0; i < h; ++i) x[t][i] = embed[tokens[t] * h + i];
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const Rows a = rms_norm(x, tensor(p + "input_layernorm.weight"), c.norm_epsilon);
      Rows q = linear(a, tensor(p + "self_attn.q_proj.weight"));
      Rows k = linear(a, tensor(p + "self_attn.k_proj.weight"));
      Rows v = linear(a, tensor(p + "self_attn.v_proj.weight"));
      if (qwen2) {  // Qwen2Attention: q, k, v projections with bias
        add_bias(q, tensor(p + "self_attn.q_proj.bias"));
        add_bias(k, tensor(p + "self_attn.k_proj.bias"));
        add_bias(v, tensor(p + "self_attn.v_proj.bias"));
      }
      if (qwen3) {  // Qwen3Attention: RMSNorm over each head's head_dim features, before RoPE
        q = per_head_rms_norm(q, heads, d, tensor(p + "self_attn.q_norm.weight"), c.norm_epsilon);
        k = per_head_rms_norm(k, kv, d, tensor(p + "self_attn.k_norm.weight"), c.norm_epsilon);
      }
      rope(q, heads, d);
      rope(k, kv, d);
      add(x, linear(attention(q, 0, k, 0, v, 0, heads, kv, d, sliding_window_), tensor(p + "self_attn.o_proj.weight")));
      const Rows m = rms_norm(x, tensor(p + "post_attention_layernorm.weight"), c.norm_epsilon);
      if (architecture_ == strata::hf::Architecture::mixtral) {
        add(x, sparse_moe(m, p + "block_sparse_moe.", "w1", "w3", "w2", true));
        continue;
      }
      if (architecture_ == strata::hf::Architecture::qwen3_moe && c.moe_layer(l)) {  // Qwen3MoeSparseMoeBlock
        add(x, sparse_moe(m, p + "mlp.", "gate_proj", "up_proj", "down_proj", !c.moe.routing.pre_softmax));
        continue;
      }
      if (architecture_ == strata::hf::Architecture::qwen2_moe && c.moe_layer(l)) {  // Qwen2MoeSparseMoeBlock
        add(x, sparse_moe(m, p + "mlp.", "gate_proj", "up_proj", "down_proj", !c.moe.routing.pre_softmax));
        // the shared expert, times sigmoid(shared_expert_gate(x)) per token
        Rows gate = linear(m, tensor(p + "mlp.shared_expert.gate_proj.weight"));
        const Rows up = linear(m, tensor(p + "mlp.shared_expert.up_proj.weight"));
        for (std::size_t t = 0; t < gate.size(); ++t)
          for (std::size_t i = 0; i < gate[t].size(); ++i) gate[t][i] = gate[t][i] / (1.0 + std::exp(-gate[t][i])) * up[t][i];
        Rows shared = linear(gate, tensor(p + "mlp.shared_expert.down_proj.weight"));
        const Rows logit = linear(m, tensor(p + "mlp.shared_expert_gate.weight"));
        for (std::size_t t = 0; t < shared.size(); ++t)
          for (double& v : shared[t]) v *= 1.0 / (1.0 + std::exp(-logit[t][0]));
        add(x, shared);
        continue;
      }
      Rows gate = linear(m, tensor(p + "mlp.gate_proj.weight"));
      const Rows up = linear(m, tensor(p + "mlp.up_proj.weight"));
      for (std::size_t t = 0; t < gate.size(); ++t)
        for (std::size_t i = 0; i < gate[t].size(); ++i) gate[t][i] = gate[t][i] / (1.0 + std::exp(-gate[t][i])) * up[t][i];
      add(x, linear(gate, tensor(p + "mlp.down_proj.weight")));
    }
    const bool tied = !files_.has("lm_head.weight");
    return unembed(rms_norm(x, tensor("model.norm.weight"), c.norm_epsilon),
                   tensor(tied ? "model.embed_tokens.weight" : "lm_head.weight"));
  }

  // MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock: router logits = gate(x); probabilities softmax
  // over all experts; the top-k of them (ties to the lower index, as torch.topk here), divided by
  // their sum when `renormalize` (Mixtral always, Qwen3-MoE with norm_topk_prob); each chosen
  // expert's down(silu(gate x) * up x) weighted by it.
  Rows sparse_moe(const Rows& x, const std::string& p, const std::string& gate_name, const std::string& up_name,
                  const std::string& down_name, bool renormalize) const {
    const int experts = config_.moe.num_experts, k = config_.moe.topk;
    const Rows logits = linear(x, tensor(p + "gate.weight"));
    Rows out(x.size(), std::vector<double>(x[0].size(), 0.0));
    for (std::size_t t = 0; t < x.size(); ++t) {
      double top = logits[t][0];
      for (int e = 1; e < experts; ++e) top = std::max(top, logits[t][e]);
      std::vector<double> prob(static_cast<std::size_t>(experts));
      double sum = 0;
      for (int e = 0; e < experts; ++e) sum += prob[e] = std::exp(logits[t][e] - top);
      for (double& q : prob) q /= sum;
      std::vector<int> order(static_cast<std::size_t>(experts));
      for (int e = 0; e < experts; ++e) order[e] = e;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
      double chosen = 0;
      for (int j = 0; j < k; ++j) chosen += prob[order[j]];
      if (!renormalize) chosen = 1;
      for (int j = 0; j < k; ++j) {
        const std::string e = p + "experts." + std::to_string(order[j]) + ".";
        const Rows row{x[t]};
        Rows gate = linear(row, tensor(e + gate_name + ".weight"));
        const Rows up = linear(row, tensor(e + up_name + ".weight"));
        for (std::size_t i = 0; i < gate[0].size(); ++i) gate[0][i] = gate[0][i] / (1.0 + std::exp(-gate[0][i])) * up[0][i];
        const Rows y = linear(gate, tensor(e + down_name + ".weight"));
        for (std::size_t i = 0; i < y[0].size(); ++i) out[t][i] += prob[order[j]] / chosen * y[0][i];
      }
    }
    return out;
  }

  static void add_bias(Rows& x, const std::vector<double>& b) {
    for (auto& row : x)
      for (std::size_t i = 0; i < row.size(); ++i) row[i] += b[i];
  }
  static Rows per_head_rms_norm(const Rows& x, int heads, int d, const std::vector<double>& g, double eps) {
    Rows y = x;
    for (auto& row : y)
      for (int h = 0; h < heads; ++h) {
        double ms = 0;
        for (int j = 0; j < d; ++j) ms += row[h * d + j] * row[h * d + j];
        ms /= d;
        for (int j = 0; j < d; ++j) row[h * d + j] = row[h * d + j] / std::sqrt(ms + eps) * g[j];
      }
    return y;
  }

  strata::SafetensorsDirectory files_;
  strata::hf::Architecture architecture_;
  strata::models::ModelConfig config_;
  std::size_t sliding_window_ = 0;
};

}  // namespace strata_test
