// tests/gpu/test_models.cu: models::Gpt and models::Llama on one GPU against the CPU fp32 path.
//
// Each case builds the same model (small odd shapes: hidden 96, seq 24, batch 3, vocab 257 / 300,
// 2 layers; Llama with GQA 4 heads / 2 groups, RoPE, SwiGLU) from the same seed on the CPU backend
// in float and on the CUDA backend (NCCL communicator of one rank, so the device policy is the one
// the trainers use) in bf16 or float, runs forward + backward + AdamW step, and compares
//   - the loss, every gradient (before clipping) and every parameter after the step, as
//     ||gpu - cpu|| / ||cpu|| per tensor: 1e-2 for bf16, 1e-5 for float (cuBLASLt float is FP32);
//   - with dropout too (masks are drawn from (key, global index), so both devices drop the same);
//   - determinism: a second identical GPU run gives bit-identical loss and gradients;
//   - the second training step makes no cudaMalloc (the caching allocator's counter);
//   - the fused chunked classifier (FusedLoss, blocks of 7 of the 72 rows) against the same CPU fp32
//     run of the unfused path, and its peak device memory against the unfused path's on a model
//     whose logits dominate (vocabulary 8192): lower by at least the whole logits.
// One line per check, `SUITE models: N passed, M failed` last, non-zero exit on a failure.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <strata/backend/cuda/backend.cuh>
#include <strata/comm/nccl.hpp>
#include <strata/models.hpp>
#include <strata/optim.hpp>
#include <strata/policy.hpp>

#include "check.hpp"

namespace {

using namespace strata;

template <class T, class Backend, class Comm>
struct DevicePolicy : default_policy {
  using element = T;
  using backend = Backend;
  using comm = Comm;
  static constexpr bool sequence_parallel = false;
};

struct Batch {
  Tensor<std::int32_t> tokens, labels;
  Tensor<float> mask;
};

Batch make_batch(int vocab, index_t b, index_t s, std::uint64_t key) {
  Batch batch{Tensor<std::int32_t>(Shape{b, s}), Tensor<std::int32_t>(Shape{b, s}), Tensor<float>(Shape{b, s})};
  for (index_t i = 0; i < b * s; ++i) {
    batch.tokens[i] = static_cast<std::int32_t>(rng::uniform(key, static_cast<std::uint64_t>(i)) * vocab);
    batch.labels[i] = static_cast<std::int32_t>(rng::uniform(key + 1, static_cast<std::uint64_t>(i)) * vocab);
    batch.mask[i] = (i % 7 == 3) ? 0.0f : 1.0f;  // some positions carry no loss
  }
  return batch;
}

// What one run produced: the first step's loss sum and gradients (host copies, as doubles), the
// parameters after its AdamW step, and the caching allocator's cudaMalloc calls during step 2.
struct RunResult {
  double loss_sum = 0;
  std::vector<std::string> names;
  std::vector<std::vector<double>> grads, params;
  std::vector<std::vector<unsigned char>> grad_bits;  // the raw gradient bytes (determinism)
  long long step2_mallocs = -1;
  long long last_malloc_bytes = 0;  // the size of the allocator's most recent cudaMalloc
  long long peak_bytes = -1;  // the caching allocator's peak bytes in use over the run
};

// How a run takes the output layer and the loss: unfused, or fused in blocks of `chunk_rows` rows.
struct LossPath {
  bool fused = false;
  index_t chunk_rows = 0;
};

template <class X>
std::vector<double> as_doubles(const Tensor<X>& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (index_t i = 0; i < t.numel(); ++i) out[static_cast<std::size_t>(i)] = gpu_test::as_double(t[i]);
  return out;
}

// Two training steps (zero, forward, backward, clip at 1.0, AdamW at lr 1e-3) of Model<Policy> on
// one rank; step 1 is recorded.
template <template <class> class Model, class T, class Comm, class Backend>
RunResult run_model(Comm& world, Backend device, const models::ModelConfig& config, const Batch& batch, LossPath path) {
  using Policy = DevicePolicy<T, Backend, Comm>;
  using Space = space_t<Policy>;
  auto ctx = context_t<Policy>::create(world, ParallelConfig{.tp = 1}, device);
  Model<Policy> model(ctx, config);
  model.init(ctx, 1234);
  // eps 1, not 1e-8: the first Adam step moves each element by about lr * g / (|g| + eps), which
  // for eps far below |g| is lr * sign(g). A bias that starts at zero then holds nothing but signs,
  // and the sign of a small gradient element is bf16 rounding noise on one device and not on the
  // other (gradients that are zero in exact arithmetic, such as the key part of the QKV bias, are
  // pure noise). With eps above every gradient element the step is lr * g / eps, linear in the
  // gradient, so the updated parameters compare as the gradients do (the AdamW kernel itself is
  // checked element by element against its CPU twin in test_kernels).
  AdamW<T, Space> optimizer(ctx.device, model, AdamWConfig{0.9, 0.95, 1.0, 0.1});
  RunResult r;
  long long mallocs_after_step1 = 0;
  for (int step = 0; step < 2; ++step) {
    if (step == 1 && std::getenv("STRATA_CUDA_MALLOC_TRACE")) std::fprintf(stderr, "--- step 2 begins\n");
    zero_gradients(ctx.device, model);
    {
      double tokens = 0;
      for (index_t i = 0; i < batch.mask.numel(); ++i) tokens += batch.mask[i];
      auto [loss, saved] = path.fused ? model.forward(ctx, batch.tokens, batch.labels, batch.mask, /*dropout key=*/4242,
                                                      models::FusedLoss{1.0 / tokens, {path.chunk_rows}})
                                      : model.forward(ctx, batch.tokens, batch.labels, batch.mask, /*dropout key=*/4242);
      model.backward(ctx, saved, 1.0 / tokens);
      if (step == 0) {
        r.loss_sum = loss.loss_sum();
        model.for_each_parameter([&](auto& p) {
          const auto grad = to_host(p.grad);
          r.names.push_back(p.name);
          r.grads.push_back(as_doubles(grad));
          const auto* bytes = reinterpret_cast<const unsigned char*>(grad.data());
          r.grad_bits.emplace_back(bytes, bytes + grad.bytes());
        });
      }
    }
    (void)clip_grad_norm_device(ctx, model, 1.0);
    optimizer.step(ctx.device, model, 1e-3);
    if (step == 0) {
      model.for_each_parameter([&](auto& p) { r.params.push_back(as_doubles(to_host(p.value))); });
      if constexpr (requires { ctx.device.memory_stats(); }) {
        ctx.device.synchronize();
        mallocs_after_step1 = static_cast<long long>(ctx.device.memory_stats().malloc_calls);
      }
    }
  }
  if constexpr (requires { ctx.device.memory_stats(); }) {
    ctx.device.synchronize();
    r.step2_mallocs = static_cast<long long>(ctx.device.memory_stats().malloc_calls) - mallocs_after_step1;
    r.last_malloc_bytes = static_cast<long long>(ctx.device.memory_stats().last_malloc_bytes);
    r.peak_bytes = static_cast<long long>(ctx.device.memory_stats().peak_bytes_in_use);
  }
  return r;
}

template <template <class> class Model, class T = float>
RunResult run_cpu(const models::ModelConfig& config, const Batch& batch) {
  RunResult r;
  inprocess::run(1, [&](inprocess::communicator& world) {
    r = run_model<Model, T>(world, cpu::backend{}, config, batch, LossPath{});
  });
  return r;
}

template <template <class> class Model, class T>
RunResult run_gpu(const models::ModelConfig& config, const Batch& batch, LossPath path = {}) {
  RunResult r;
  nccl::run(1, [&](nccl::communicator& world) {
    r = run_model<Model, T>(world, strata::cuda::backend(world.device(), world.stream()), config, batch, path);
  });
  return r;
}

double relative_error(const std::vector<double>& a, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    diff += (a[i] - ref[i]) * (a[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  if (a.size() != ref.size()) return INFINITY;
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Every tensor of `what` within tol of the CPU fp32 run; one line with the worst tensor.
//
// bf16 runs: a tensor that is a long reduction with cancellation (a norm weight's gradient sums
// dy * xhat over every token) can sit above 1e-2 from the fp32 run through bf16 rounding of the
// activations alone. `bf16_cpu` is the same model computed in bf16 on the CPU, whose kernels are
// the reference twins; a GPU tensor then passes when it is within tol of fp32 or no further from
// fp32 than twice the CPU bf16 tensor is (two implementations of the same bf16 arithmetic differ
// only in summation order, so their distances from fp32 are alike; a kernel bug shows as a
// distance many times the rounding's).
void compare_tensors(gpu_test::suite& s, const std::string& label, const char* what, const std::vector<std::string>& names,
                     const std::vector<std::vector<double>>& gpu, const std::vector<std::vector<double>>& cpu, double tol,
                     const std::vector<std::vector<double>>* bf16_cpu = nullptr) {
  double worst = 0, worst_base = 0;
  std::string worst_name = "(none)";
  int above_tol = 0;
  bool ok = gpu.size() == cpu.size() && !gpu.empty() && (!bf16_cpu || bf16_cpu->size() == cpu.size());
  for (std::size_t i = 0; i < gpu.size() && i < cpu.size(); ++i) {
    const double e = relative_error(gpu[i], cpu[i]);
    const double base = bf16_cpu && i < bf16_cpu->size() ? relative_error((*bf16_cpu)[i], cpu[i]) : 0.0;
    if (!(e <= worst)) {
      worst = e;
      worst_base = base;
      worst_name = names[i];
    }
    if (!(e <= tol)) {
      ++above_tol;
      if (!(bf16_cpu && e <= 2 * base)) ok = false;
    }
  }
  char line[640];
  if (bf16_cpu)
    std::snprintf(line, sizeof line,
                  "%s: %zu %s within %.0e of the CPU fp32 run, or within twice the CPU bf16 run's distance from it "
                  "(%d above %.0e; worst %s: %.3e, CPU bf16 %.3e)",
                  label.c_str(), gpu.size(), what, tol, above_tol, tol, worst_name.c_str(), worst, worst_base);
  else
    std::snprintf(line, sizeof line, "%s: %zu %s within %.0e of the CPU fp32 run (worst %s: %.3e)", label.c_str(), gpu.size(),
                  what, tol, worst_name.c_str(), worst);
  s.record(ok, line);
}

template <template <class> class Model, class T>
void model_case(gpu_test::suite& s, const std::string& model_name, models::ModelConfig config, double dropout,
                LossPath path = {}) {
  config.hidden_dropout = dropout;
  const Batch batch = make_batch(config.vocab_size, 3, config.seq_length, 77);
  const std::string label = model_name + " " + gpu_test::type_name<T>() + (dropout > 0 ? " dropout 0.1" : "") +
                            (path.fused ? " fused classifier (blocks of " + std::to_string(path.chunk_rows) + " rows)" : "");
  const double tol = gpu_test::tolerance<T>();
  try {
    const RunResult cpu = run_cpu<Model>(config, batch);
    RunResult bf16_cpu;
    if constexpr (std::is_same_v<T, bf16>) bf16_cpu = run_cpu<Model, bf16>(config, batch);
    const bool with_base = std::is_same_v<T, bf16>;
    const RunResult gpu = run_gpu<Model, T>(config, batch, path);
    const double loss_error = std::abs(gpu.loss_sum - cpu.loss_sum) / std::abs(cpu.loss_sum);
    char line[512];
    std::snprintf(line, sizeof line, "%s: loss sum %.6f on the GPU, %.6f on the CPU (relative error %.3e, tolerance %.0e)",
                  label.c_str(), gpu.loss_sum, cpu.loss_sum, loss_error, tol);
    s.record(loss_error <= tol, line);
    compare_tensors(s, label, "gradients", cpu.names, gpu.grads, cpu.grads, tol, with_base ? &bf16_cpu.grads : nullptr);
    compare_tensors(s, label, "parameters after the AdamW step", cpu.names, gpu.params, cpu.params, tol,
                    with_base ? &bf16_cpu.params : nullptr);
    std::snprintf(line, sizeof line, "%s: the second training step made %lld cudaMalloc calls (expected 0; the last one of %lld bytes)",
                  label.c_str(), gpu.step2_mallocs, gpu.last_malloc_bytes);
    s.record(gpu.step2_mallocs == 0, line);
    if (dropout > 0 || std::is_same_v<T, bf16>) {  // determinism: the same run again, bit for bit
      const RunResult again = run_gpu<Model, T>(config, batch, path);
      bool same = std::memcmp(&again.loss_sum, &gpu.loss_sum, sizeof(double)) == 0 && again.grad_bits == gpu.grad_bits;
      std::snprintf(line, sizeof line, "%s: a second identical GPU run gives bit-identical loss (%.17g vs %.17g) and %zu gradients",
                    label.c_str(), again.loss_sum, gpu.loss_sum, gpu.grad_bits.size());
      s.record(same, line);
    }
  } catch (const std::exception& e) {
    s.record(false, label + ": stopped: " + e.what());
  }
}

// The fused classifier's peak device memory against the unfused path's, GPT in bf16 with a
// vocabulary of 8192 (logits [4 x 64, 8192] = 4 MiB in bf16, their gradient as much; blocks of 16
// rows = 256 KiB): the fused run's peak is lower by at least the whole logits.
void fused_memory_case(gpu_test::suite& s) {
  models::ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 2;
  c.seq_length = 64;
  c.vocab_size = 8192;
  c.make_vocab_size_divisible_by = 128;
  const index_t b = 4;
  const Batch batch = make_batch(c.vocab_size, b, c.seq_length, 78);
  const long long logits_bytes = static_cast<long long>(b * c.seq_length * c.vocab_size * 2);
  try {
    const RunResult unfused = run_gpu<models::Gpt, bf16>(c, batch);
    const RunResult fused = run_gpu<models::Gpt, bf16>(c, batch, LossPath{true, 16});
    char line[512];
    std::snprintf(line, sizeof line,
                  "gpt bf16 vocabulary 8192: peak device memory %lld B fused (blocks of 16 rows), %lld B unfused; the "
                  "difference %lld B is at least the logits' %lld B",
                  fused.peak_bytes, unfused.peak_bytes, unfused.peak_bytes - fused.peak_bytes, logits_bytes);
    s.record(fused.peak_bytes > 0 && unfused.peak_bytes - fused.peak_bytes >= logits_bytes, line);
  } catch (const std::exception& e) {
    s.record(false, std::string("fused classifier memory: stopped: ") + e.what());
  }
}

}  // namespace

int main() {
  gpu_test::suite s("models");
  models::ModelConfig gpt;
  gpt.num_layers = 2;
  gpt.hidden_size = 96;
  gpt.num_attention_heads = 3;
  gpt.seq_length = 24;
  gpt.vocab_size = 257;
  models::ModelConfig llama = gpt;
  llama.num_attention_heads = 4;
  llama.num_query_groups = 2;
  llama.ffn_hidden_size = 160;
  llama.vocab_size = 300;
  for (double dropout : {0.0, 0.1}) {
    model_case<models::Gpt, bf16>(s, "gpt", gpt, dropout);
    model_case<models::Gpt, float>(s, "gpt", gpt, dropout);
    model_case<models::Llama, bf16>(s, "llama", llama, dropout);
    model_case<models::Llama, float>(s, "llama", llama, dropout);
  }
  const LossPath fused{true, 7};  // 72 rows: 10 blocks of 7 and one of 2
  model_case<models::Gpt, bf16>(s, "gpt", gpt, 0.0, fused);
  model_case<models::Gpt, float>(s, "gpt", gpt, 0.0, fused);
  model_case<models::Llama, bf16>(s, "llama", llama, 0.0, fused);
  model_case<models::Llama, float>(s, "llama", llama, 0.0, fused);
  // The run-time building blocks of current models on the GPU against the CPU path: Qwen2 (q/k/v
  // biases), Qwen3 (qk norms, head_dim 40: 4 x 40 != 96, the cuDNN / flash path at d = 40), Llama 3.1
  // scaling with partial interleaved RoPE and gpt-oss's clamped quick GeGLU, and GPT with squared
  // ReLU and zero-centred LayerNorms (GPT's qk LayerNorm is left out: without RoPE its key bias has
  // a gradient of zero up to rounding, which no relative tolerance compares).
  models::ModelConfig qwen2 = llama;
  qwen2.add_qkv_bias = true;
  models::ModelConfig qwen3 = llama;
  qwen3.qk_layernorm = true;
  qwen3.kv_channels = 40;
  models::ModelConfig variants = llama;
  variants.rope_scaling_factor = 8;
  variants.rope_original_max_positions = 16;
  variants.rotary_percent = 0.5;
  variants.rotary_interleaved = true;
  variants.activation = strata::MlpActivation::quick_geglu;
  variants.activation_clamp = 1.0;
  variants.glu_linear_offset = 1.0;
  models::ModelConfig gpt_variants = gpt;
  gpt_variants.activation = strata::MlpActivation::squared_relu;
  gpt_variants.apply_layernorm_1p = true;
  // gpt-oss's attention: learnable sinks (their gradient compared with every other one) and a
  // sliding window on every other layer; and GPT with off-by-one sinks.
  models::ModelConfig sinks = llama;
  sinks.softmax_type = strata::SoftmaxType::learnable;
  sinks.window_size = 5;
  sinks.window_layers = {1, 0};
  models::ModelConfig gpt_sinks = gpt;
  gpt_sinks.softmax_type = strata::SoftmaxType::off_by_one;
  model_case<models::Gpt, bf16>(s, "gpt off-by-one sinks", gpt_sinks, 0.0);
  model_case<models::Gpt, float>(s, "gpt off-by-one sinks", gpt_sinks, 0.0);
  for (const auto& [name, config] : std::vector<std::pair<std::string, models::ModelConfig>>{
           {"qwen2", qwen2}, {"qwen3", qwen3}, {"llama 3.1 rope, partial interleaved, clamped quick geglu", variants},
           {"learnable sinks, window on every other layer", sinks}}) {
    model_case<models::Llama, bf16>(s, name, config, 0.0);
    model_case<models::Llama, float>(s, name, config, 0.0);
  }
  model_case<models::Gpt, bf16>(s, "gpt squared relu, 1p norms", gpt_variants, 0.0);
  model_case<models::Gpt, float>(s, "gpt squared relu, 1p norms", gpt_variants, 0.0);
  fused_memory_case(s);
  return s.finish();
}
