// custom_model: a model that is neither GPT nor Llama, written by a user from strata's public
// layers. GPT-J's and PaLM's parallel block,
//
//   y = x + attention(norm(x)) + mlp(norm(x))        (one norm; the two branches side by side)
//
// stacked four times, trained for a few AdamW steps on CPU threads at tp=2 with sequence parallelism
// (the residual stream split over the sequence), and checked against the same model on one rank:
// losses and every gathered parameter after training agree to rounding (double). docs/USER_MODELS.md
// walks through it. Built with STRATA_CUSTOM_MODEL_CUDA (target custom_model_cuda, the host compiler
// against strata::cuda_kernels), the same file trains on 2 GPUs over NCCL.
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <strata/optim.hpp>
#include <strata/strata.hpp>
#if defined(STRATA_CUSTOM_MODEL_CUDA)
#include <strata/backend/cuda/backend.cuh>
#include <strata/comm/nccl.hpp>
#endif

using namespace strata;

// The CPU build trains on threads with the in-process communicator; the CUDA build
// (STRATA_CUSTOM_MODEL_CUDA, docs/USER_MODELS.md section 5) on GPUs with the NCCL one. Nothing else
// in this file depends on which.
#if defined(STRATA_CUSTOM_MODEL_CUDA)
using DeviceBackend = cuda::backend;
using WorldComm = nccl::communicator;
#else
using DeviceBackend = cpu::backend;
using WorldComm = inprocess::communicator;
#endif

template <bool SequenceParallel>
struct Policy : default_policy {
  using element = double;
  using backend = DeviceBackend;
  using comm = WorldComm;
  static constexpr bool sequence_parallel = SequenceParallel;
};

// The block: its layers, its forward and backward, and its parameters for the optimizer. The
// residual stream's layout (replicated, or sequence-sharded under sequence parallelism) is the
// policy's, so the same code serves both.
template <class P>
class ParallelBlock {
 public:
  using T = typename P::element;
  using Context = context_t<P>;
  using Attention = SelfAttention<P, rope, gqa>;
  using Feedforward = Mlp<P, gelu>;
  using Stream = Activation<T, residual_layout_t<P>, space_t<P>>;  // (s, b, hidden), or (s / tp, b, hidden)

  struct Saved {
    typename LayerNorm<P>::Saved norm;
    typename Attention::Saved attention;
    typename Feedforward::Saved mlp;
  };

  ParallelBlock(Context& ctx, const std::string& name, index_t hidden, int heads, int groups)
      : norm_(ctx, name + ".norm", hidden),
        attention_(ctx, name + ".attention", AttentionConfig{hidden, heads, groups}),
        mlp_(ctx, name + ".mlp", MlpConfig{hidden, 4 * hidden}) {}

  void init(Context& ctx, std::uint64_t seed) {
    attention_.init(ctx, seed, 0.02, 0.01);
    mlp_.init(ctx, seed + 1, 0.02, 0.01);
  }

  std::pair<Stream, Saved> forward(Context& ctx, const Stream& x) const {
    auto [h, norm] = norm_.forward(ctx, x);
    auto [a, attention] = attention_.forward(ctx, h);
    auto [y, mlp] = mlp_.forward(ctx, h, &x);                                      // y = x + mlp(h)
    ctx.device.template add<T>(y.data(), a.data(), y.tensor.numel(), y.data());  // y += attention(h)
    return {std::move(y), Saved{std::move(norm), std::move(attention), std::move(mlp)}};
  }

  // dx = dy + norm'(d attention + d mlp); the gradients of the parameters accumulate.
  Stream backward(Context& ctx, const Saved& saved, const Stream& dy) {
    Stream dh = attention_.backward(ctx, saved.attention, dy);
    Stream dm = mlp_.backward(ctx, saved.mlp, dy);
    ctx.device.template add<T>(dh.data(), dm.data(), dh.tensor.numel(), dh.data());
    return norm_.backward(ctx, saved.norm, dh, &dy);
  }

  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    norm_.for_each_parameter(visit);
    attention_.for_each_parameter(visit);
    mlp_.for_each_parameter(visit);
  }

 private:
  LayerNorm<P> norm_;
  Attention attention_;
  Feedforward mlp_;
};

// The model: blocks in a row, with a loss of 0.5 |y|^2 / (elements) on the last output.
template <class P>
struct Model {
  using Block = ParallelBlock<P>;
  std::vector<Block> blocks;

  Model(context_t<P>& ctx, int layers, index_t hidden, int heads, int groups) {
    blocks.reserve(static_cast<std::size_t>(layers));
    for (int l = 0; l < layers; ++l) blocks.emplace_back(ctx, "blocks." + std::to_string(l), hidden, heads, groups);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    for (auto& b : blocks) b.for_each_parameter(visit);
  }
};

struct Trained {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> parameters;  // every parameter, gathered whole
};

constexpr index_t kSeq = 16, kBatch = 2, kHidden = 32;
constexpr int kHeads = 4, kGroups = 2, kLayers = 4, kSteps = 5;

// Trains on `tp` ranks (threads, one per GPU in the CUDA build); sequence parallelism when SP.
template <bool SP>
Trained train(int tp) {
  using P = Policy<SP>;
  using Space = space_t<P>;
  using Stream = typename ParallelBlock<P>::Stream;
  Trained result;
  std::mutex mutex;
  const auto rank_main = [&](WorldComm& world, DeviceBackend device) {
    auto ctx = context_t<P>::create(world, ParallelConfig{.tp = tp}, device);
    Model<P> model(ctx, kLayers, kHidden, kHeads, kGroups);
    for (int l = 0; l < kLayers; ++l) model.blocks[static_cast<std::size_t>(l)].init(ctx, 1000 + 10 * l);
    AdamW<double, Space> adamw(ctx.device, model, AdamWConfig{});
    // The same input on every rank: (s, b, hidden), deterministic, made on the host.
    Tensor<double> host(Shape{kSeq, kBatch, kHidden});
    for (index_t i = 0; i < host.numel(); ++i) host[i] = rng::normal(7, static_cast<std::uint64_t>(i));
    Tensor<double, Space> whole = [&] {
      if constexpr (std::is_same_v<Space, space::host>) return host;
      else return to_device(host);
    }();
    Stream x = [&] {
      if constexpr (SP) return scatter_to_sequence_parallel(ctx.device, ctx.tp, Activation<double, layout::replicated, Space>(whole));
      else return Stream(whole);
    }();
    const double elements = static_cast<double>(whole.numel());
    for (int step = 0; step < kSteps; ++step) {
      zero_gradients(ctx.device, model);
      std::vector<typename ParallelBlock<P>::Saved> saved;
      Stream y = x;
      for (auto& block : model.blocks) {
        auto [out, s] = block.forward(ctx, y);
        y = std::move(out);
        saved.push_back(std::move(s));
      }
      // loss = 0.5 |y|^2 / elements, summed over the sequence shards; dy = y / elements. Both on the
      // backend, so the same lines run on the host and on a GPU.
      auto square_sum = Tensor<double, Space>::zeros(Shape{1});
      ctx.device.sum_of_squares(y.data(), y.tensor.numel(), square_sum.data());
      if constexpr (SP) ctx.tp.all_reduce(span_t<double, Space>(square_sum.data(), 1), ReduceOp::sum);
      Stream dy(y.tensor.clone());
      ctx.device.scale(dy.data(), dy.tensor.numel(), 1.0 / elements);
      for (int l = kLayers - 1; l >= 0; --l) dy = model.blocks[static_cast<std::size_t>(l)].backward(ctx, saved[static_cast<std::size_t>(l)], dy);
      adamw.step(ctx.device, model, 1e-2);
      if (world.rank() == 0) result.losses.push_back(0.5 * to_host(square_sum)[0] / elements);
    }
    model.for_each_parameter([&](auto& p) {
      auto whole_parameter = gather_global(ctx.tp, p, p.value);
      if (world.rank() == 0) {
        std::lock_guard lock(mutex);
        result.parameters[p.name].assign(whole_parameter.data(), whole_parameter.data() + whole_parameter.numel());
      }
    });
  };
#if defined(STRATA_CUSTOM_MODEL_CUDA)
  nccl::run(tp, [&](nccl::communicator& world) { rank_main(world, cuda::backend(world.device(), world.stream())); });
#else
  inprocess::run(tp, [&](inprocess::communicator& world) { rank_main(world, cpu::backend{}); });
#endif
  return result;
}

double relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0, n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    n += b[i] * b[i];
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

int main() {
#if defined(STRATA_CUSTOM_MODEL_CUDA)
  if (cuda::device_count() < 2) {
    std::fprintf(stderr, "custom_model_cuda: tp=2 needs 2 GPUs, %d visible\n", cuda::device_count());
    return 2;
  }
#endif
  const Trained one = train<false>(1);
  const Trained two = train<true>(2);  // tp=2 + sequence parallelism
  double worst = relative_difference(two.losses, one.losses);
  for (const auto& [name, values] : one.parameters) worst = std::max(worst, relative_difference(two.parameters.at(name), values));
  std::printf("parallel-block model, %d layers, %d AdamW steps: loss %.6f -> %.6f on one rank, %.6f -> %.6f at tp=2 + SP\n",
              kLayers, kSteps, one.losses.front(), one.losses.back(), two.losses.front(), two.losses.back());
  std::printf("largest relative difference over the losses and %zu parameters: %.3g\n", one.parameters.size(), worst);
  const bool same = worst <= 1e-12 && one.losses.back() < one.losses.front();
  std::printf("%s\n", same ? "tp=2 + sequence parallel trains the same model as one rank" : "MISMATCH");
  return same ? 0 : 1;
}
