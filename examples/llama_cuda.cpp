// llama_cuda: a user's translation unit that defines a Llama from strata's policies and trains it on
// every visible GPU (tensor parallel over them, with sequence parallelism, one thread per GPU), built
// by the host compiler: it links strata::cuda_kernels (the CUDA kernels compiled once) and
// strata::nccl, and includes the CUDA backend as plain C++ (docs/DEVELOPING.md, "Compiled and
// header-only CUDA"; bench/build_times.sh times its build, row cuda-user).
//
//   llama_cuda [steps]     default 30
//
// The model (4 layers, hidden 256, 8 heads in 4 key/value groups, SwiGLU, RoPE, vocab 512) learns
// one fixed batch of random tokens in bf16 with AdamW; it prints the loss per step and exits 0 when
// the last loss is below half the first.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <strata/backend/cuda/backend.cuh>
#include <strata/comm/nccl.hpp>
#include <strata/models.hpp>
#include <strata/optim.hpp>
#include <strata/policy.hpp>

using namespace strata;

struct GpuPolicy : default_policy {
  using element = bf16;
  using backend = cuda::backend;
  using comm = nccl::communicator;
  static constexpr bool sequence_parallel = true;
};

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 30;
  const int gpus = cuda::device_count();
  if (gpus < 1 || steps < 1) {
    std::fprintf(stderr, "llama_cuda: needs a GPU (found %d) and a positive step count (got %d)\n", gpus, steps);
    return 2;
  }
  // tp must divide the heads (8) and the key/value groups (4): the largest such count of GPUs.
  const int tp = gpus >= 4 ? 4 : (gpus >= 2 ? 2 : 1);
  models::ModelConfig config;  // Megatron's names: --num-layers, --hidden-size, ...
  config.num_layers = 4;
  config.hidden_size = 256;
  config.num_attention_heads = 8;
  config.num_query_groups = 4;
  config.ffn_hidden_size = 704;
  config.vocab_size = 512;
  config.seq_length = 128;
  const index_t batch = 4, seq = 128;
  Tensor<std::int32_t> tokens(Shape{batch, seq}), labels(Shape{batch, seq});
  Tensor<float> mask(Shape{batch, seq});
  for (index_t i = 0; i < tokens.numel(); ++i) {
    tokens[i] = static_cast<std::int32_t>(rng::uniform(1, static_cast<std::uint64_t>(i)) * config.vocab_size);
    labels[i] = static_cast<std::int32_t>(rng::uniform(2, static_cast<std::uint64_t>(i)) * config.vocab_size);
    mask[i] = 1.0f;
  }
  const double scale = 1.0 / static_cast<double>(tokens.numel());
  std::vector<double> losses;
  nccl::run(tp, [&](nccl::communicator& world) {
    auto ctx = context_t<GpuPolicy>::create(world, ParallelConfig{.tp = tp}, cuda::backend(world.device(), world.stream()));
    models::Llama<GpuPolicy> model(ctx, config);
    model.init(ctx, 1234);
    AdamW<bf16, space::cuda> optimizer(ctx.device, model, AdamWConfig{0.9, 0.95, 1e-8, 0.0});
    for (int step = 0; step < steps; ++step) {
      zero_gradients(ctx.device, model);
      auto [loss, saved] = model.forward(ctx, tokens, labels, mask, /*dropout key=*/0, models::FusedLoss{scale});
      model.backward(ctx, saved, scale);
      (void)clip_grad_norm_device(ctx, model, 1.0);
      optimizer.step(ctx.device, model, 3e-3);
      if (world.rank() == 0) {
        losses.push_back(loss.loss_sum() * scale);
        std::printf("step %2d  loss %.4f\n", step + 1, losses.back());
      }
    }
  });
  const bool learned = losses.back() < 0.5 * losses.front();
  std::printf("Llama (%d layers, hidden %lld) on %d GPU%s (tp=%d + sequence parallel), bf16: loss %.4f -> %.4f: %s\n",
              config.num_layers, static_cast<long long>(config.hidden_size), tp, tp > 1 ? "s" : "", tp, losses.front(),
              losses.back(), learned ? "learned the batch" : "did NOT learn the batch");
  return learned ? 0 : 1;
}
