// Compile-only: models::Gpt and models::Llama instantiated (forward, backward, AdamW step, gradient
// clipping) with a backend and a communicator whose memory space is space::cuda. Their entry points
// are declared and never defined (this object is never linked): it compiles only if no layer,
// model or optimizer code touches an element of a device tensor on the host (operator[], span()
// and fill() do not exist for space::cuda).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <strata/layers.hpp>
#include <strata/models.hpp>
#include <strata/optim.hpp>

namespace {

using strata::index_t;
namespace space = strata::space;

struct mock_device_backend {
  using space = strata::space::cuda;
  template <class X> void fill(X* x, index_t n, double value);
  template <class X> void copy(const X* src, index_t n, X* dst);
  template <class X> void copy_to_host(const X* src, index_t n, X* host);
  template <class X> void copy_from_host(const X* host, index_t n, X* dst);
  template <class X> void transpose(const X* in, index_t rows, index_t cols, X* out);
  void synchronize();
  template <class From, class To> void convert(const From* src, index_t n, To* dst);
  template <class X> void add(const X* a, const X* b, index_t n, X* out);
  template <class X> void scale(X* x, index_t n, double factor);
  template <class X> void scale_by(X* x, index_t n, const double* factor);
  template <class T, class C = T>
  void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, const T* b, C* c, bool accumulate,
            const T* bias = nullptr);
  template <class T> void bias_add(T* y, const T* bias, index_t rows, index_t cols);
  template <class T, class A = strata::accumulate_t<T>> void bias_grad(const T* dy, index_t rows, index_t cols, A* dbias);
  template <class T> void slice_columns(const T* in, index_t rows, index_t cols, index_t begin, index_t width, T* out);
  template <class T> void copy_columns(const T* in, index_t in_cols, index_t rows, index_t width, T* out, index_t out_cols);
  template <class T> void unstack_columns(const T* stacked, index_t parts, index_t rows, index_t width, T* out);
  template <class T> void qkv_split(const T* qkv, index_t rows, index_t groups, index_t hpg, index_t d, T* q, T* k, T* v);
  template <class T>
  void qkv_merge(const T* dq, const T* dk, const T* dv, index_t rows, index_t groups, index_t hpg, index_t d, T* dqkv);
  template <class T, class A = strata::accumulate_t<T>>
  void layernorm_forward(const T* x, const T* g, const T* b, index_t rows, index_t h, A eps, T* y, A* mean, A* rstd,
                         const T* residual = nullptr, T* sum = nullptr, A weight_offset = A(0));
  template <class T, class A = strata::accumulate_t<T>>
  void layernorm_backward(const T* dy, const T* x, const T* g, const A* mean, const A* rstd, index_t rows, index_t h,
                          T* dx, A* dg, A* db, const T* dresidual = nullptr, bool accumulate = false,
                          A* dresidual_sums = nullptr, A weight_offset = A(0));
  template <class T, class A = strata::accumulate_t<T>>
  void rmsnorm_forward(const T* x, const T* g, index_t rows, index_t h, A eps, T* y, A* rstd, const T* residual = nullptr,
                       T* sum = nullptr, A weight_offset = A(0));
  template <class T, class A = strata::accumulate_t<T>>
  void rmsnorm_backward(const T* dy, const T* x, const T* g, const A* rstd, index_t rows, index_t h, T* dx, A* dg,
                        const T* dresidual = nullptr, bool accumulate = false, A weight_offset = A(0));
  template <class T> void gelu_forward(const T* x, index_t n, T* y);
  template <class T>
  void gemm_gelu(bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, const T* b, const T* bias, T* pre, T* out);
  template <class T>
  void gemm_gelu_backward(bool ta, bool tb, index_t m, index_t n, index_t k, const T* a, const T* b, const T* pre, T* out);
  template <class T> void gelu_backward(const T* dy, const T* x, index_t n, T* dx);
  template <class T> void swiglu_forward(const T* gu, index_t rows, index_t f, T* y);
  template <class T> void swiglu_backward(const T* dy, const T* gu, index_t rows, index_t f, T* dgu);
  template <class T>
  void glu_forward(const T* gu, index_t rows, index_t f, strata::GluActivation activation, T* y);
  template <class T>
  void glu_backward(const T* dy, const T* gu, index_t rows, index_t f, strata::GluActivation activation, T* dgu);
  template <class T> void squared_relu_forward(const T* x, index_t n, T* y);
  template <class T> void squared_relu_backward(const T* dy, const T* x, index_t n, T* dx);
  template <class T>
  void rope_forward(T* x, index_t s, index_t n, index_t d, double base, index_t offset, strata::RopeOptions options = {});
  template <class T>
  void rope_backward(T* dx, index_t s, index_t n, index_t d, double base, index_t offset, strata::RopeOptions options = {});
  template <class T, class A = strata::accumulate_t<T>>
  void attention_forward(const T* q, const T* k, const T* v, index_t s, index_t b, index_t heads, index_t groups,
                         index_t d, A scale, T* out, A* lse, strata::AttentionOptions options = {});
  template <class T, class A = strata::accumulate_t<T>>
  void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out, const A* lse, index_t s,
                          index_t b, index_t heads, index_t groups, index_t d, A scale, T* dq, T* dk, T* dv,
                          strata::AttentionOptions options = {});
  template <class T>
  void prepare_attention(index_t s, index_t b, index_t heads, index_t groups, index_t d, bool backward,
                         strata::AttentionOptions options = {});
  template <class T, class A = strata::accumulate_t<T>>
  void attention_merge(T* out, A* lse, const T* block_out, const A* block_lse, index_t s, index_t b, index_t heads,
                       index_t d);
  template <class T>
  void embedding_forward(const std::int32_t* tokens, index_t n, const T* weight, index_t row_begin, index_t rows_local,
                         index_t h, T* out);
  template <class T, class A = strata::accumulate_t<T>>
  void embedding_backward(const std::int32_t* tokens, index_t n, const T* dout, index_t row_begin, index_t rows_local,
                          index_t h, A* dweight);
  template <class T> void position_add(T* x, const T* weight, index_t s, index_t b, index_t h, index_t first);
  template <class T, class A = strata::accumulate_t<T>>
  void position_grad(const T* dy, index_t s, index_t b, index_t h, index_t first, A* dweight);
  template <class T, class A = strata::accumulate_t<T>>
  void cross_entropy_max(const T* logits, index_t rows, index_t local, index_t used, A* row_max);
  template <class T, class A = strata::accumulate_t<T>>
  void cross_entropy_sums(const T* logits, index_t rows, index_t local, index_t used, const A* row_max,
                          const std::int32_t* labels, index_t begin, A* sums);
  template <class A>
  void cross_entropy_loss(const A* sums, const A* row_max, index_t rows, index_t vocab, A smoothing, A* loss, A* lse);
  template <class T, class A = strata::accumulate_t<T>>
  void cross_entropy_backward(const T* logits, const A* lse, const std::int32_t* labels, index_t begin, index_t rows,
                              index_t local, index_t used, index_t vocab, A smoothing, const A* dloss, T* dlogits);
  template <class T, class A = strata::accumulate_t<T>>
  void cross_entropy_forward_backward(T* logits, const std::int32_t* labels, index_t rows, index_t local, index_t used,
                                      index_t vocab, A smoothing, const A* dloss, A* loss);
  template <class A> void masked_loss_sum(const A* loss, const A* mask, index_t n, double* out);
  template <class T> void dropout_forward(T* x, index_t n, strata::GlobalIndexMap map, double p, std::uint64_t key);
  template <class T> void dropout_backward(T* dy, index_t n, strata::GlobalIndexMap map, double p, std::uint64_t key);
  template <class T> void init_normal(T* x, index_t n, strata::ShardIndexMap map, std::uint64_t key, double stddev);
  template <class T, class A = strata::accumulate_t<T>>
  void adamw_step(A* main, A* exp_avg, A* exp_avg_sq, const A* grad, T* value, index_t n, const strata::AdamWStep<A>& step);
  template <class X> void sum_of_squares(const X* x, index_t n, double* accumulator);
  void clip_factor(const double* square_sum, double max_norm, double* norm, double* factor);
};
static_assert(strata::check_backend<mock_device_backend>());

template <class T>
using dspan = strata::device_span<T>;

struct mock_device_communicator {
  using space = strata::space::cuda;
  using default_device = mock_device_backend;
  int rank() const;
  int size() const;
  std::string_view name() const;
  template <class T> void all_reduce(dspan<T> buffer, strata::ReduceOp op);
  template <class T> void all_gather(dspan<const T> in, dspan<T> out);
  template <class T> void all_gather_v(dspan<const T> in, dspan<T> out, std::span<const std::size_t> counts);
  template <class T> void reduce_scatter(dspan<const T> in, dspan<T> out, strata::ReduceOp op);
  template <class T>
  void reduce_scatter_v(dspan<const T> in, dspan<T> out, std::span<const std::size_t> counts, strata::ReduceOp op);
  template <class T> void broadcast(dspan<T> buffer, int root);
  template <class T> void send(dspan<const T> buffer, int peer);
  template <class T> void recv(dspan<T> buffer, int peer);
  template <class T>
  void all_to_all(dspan<const T> in, std::span<const std::size_t> send_counts, dspan<T> out,
                  std::span<const std::size_t> recv_counts);
  void barrier();
  mock_device_communicator split(int color, int key);
  mock_device_communicator split(int color, int key, std::string name);
};
static_assert(strata::check_communicator<mock_device_communicator>());

template <class Element, bool SequenceParallel>
struct DevicePolicy {
  using element = Element;
  using backend = mock_device_backend;
  using comm = mock_device_communicator;
  static constexpr bool sequence_parallel = SequenceParallel;
};

template <class Model, class Policy>
[[maybe_unused]] void train_one_step(mock_device_communicator world, const strata::models::ModelConfig& config,
                                     const strata::Tensor<std::int32_t>& tokens,
                                     const strata::Tensor<std::int32_t>& labels, const strata::Tensor<float>& mask) {
  using Space = strata::space_t<Policy>;
  static_assert(std::is_same_v<Space, space::cuda>);
  auto ctx = strata::context_t<Policy>::create(world, strata::ParallelConfig{.tp = 2});
  Model model(ctx, config);
  model.init(ctx, 1234);
  strata::AdamW<typename Policy::element, Space> optimizer(ctx.device, model);
  strata::zero_gradients(ctx.device, model);
  auto [loss, saved] = model.forward(ctx, tokens, labels, mask, 7);
  static_assert(std::is_same_v<decltype(loss.sum), strata::Tensor<double, space::cuda>>,
                "The loss sum stays on the device.");
  model.backward(ctx, saved, 1.0 / loss.tokens);
  strata::all_reduce_gradients(ctx.dp, model);
  auto norm = strata::clip_grad_norm_device(ctx, model, 1.0);
  static_assert(std::is_same_v<decltype(norm), strata::Tensor<double, space::cuda>>, "The gradient norm stays on the device.");
  optimizer.step(ctx.device, model, 1e-3);
  // the training step through the fused chunked classifier, and the forward-only evaluation
  auto [fused_loss, fused_saved] = model.forward(ctx, tokens, labels, mask, 8, strata::models::FusedLoss{0.5});
  static_assert(std::is_same_v<decltype(fused_saved.final_norm_output_gradient.tensor),
                               strata::Tensor<typename Policy::element, space::cuda>>,
                "The fused path keeps the final norm's output gradient on the device.");
  model.backward(ctx, fused_saved, 0.5);
  auto evaluated = model.evaluate(ctx, tokens, labels, mask);
  static_assert(std::is_same_v<decltype(evaluated.sum), strata::Tensor<double, space::cuda>>,
                "The evaluated loss sum stays on the device.");
  (void)fused_loss;
  (void)model.next_token_logits(ctx, tokens, 0);
}

// The pipeline path on the device space: a stage of each model, one step of every schedule (the
// executor's batched send/recv, the split backward, the tied-embedding gradient sum), the
// pipelined evaluation, clipping and the optimizer step.
struct DeviceBatch {
  strata::Tensor<std::int32_t> tokens, labels;
  strata::Tensor<float> loss_mask;
};

template <template <class> class Model, class Policy>
[[maybe_unused]] void pipeline_step(mock_device_communicator world, const strata::models::ModelConfig& config,
                                    std::span<const DeviceBatch> batches, std::span<const std::uint64_t> keys) {
  using Space = strata::space_t<Policy>;
  auto ctx = strata::context_t<Policy>::create(world, strata::ParallelConfig{.tp = 2, .pp = 2});
  strata::models::PipelineModel<Model, Policy> model(ctx, config, {2, -1, -1});
  model.init(ctx, 1234);
  strata::AdamW<typename Policy::element, Space> optimizer(ctx.device, model);
  for (auto kind : {strata::pipeline::ScheduleKind::gpipe, strata::pipeline::ScheduleKind::one_f_one_b,
                    strata::pipeline::ScheduleKind::interleaved, strata::pipeline::ScheduleKind::zero_bubble}) {
    auto result = model.train_step(ctx, kind, batches, keys, 0.5);
    static_assert(std::is_same_v<decltype(result.loss_sum), strata::Tensor<double, space::cuda>>,
                  "The pipeline's loss sum stays on the device.");
  }
  auto evaluated = model.evaluate(ctx, batches);
  static_assert(std::is_same_v<decltype(evaluated.sum), strata::Tensor<double, space::cuda>>,
                "The pipelined evaluation's loss sum stays on the device.");
  (void)strata::clip_grad_norm_device(ctx, model, 1.0);
  optimizer.step(ctx.device, model, 1e-3);
}

template void pipeline_step<strata::models::Gpt, DevicePolicy<strata::bf16, true>>(mock_device_communicator,
                                                                                   const strata::models::ModelConfig&,
                                                                                   std::span<const DeviceBatch>,
                                                                                   std::span<const std::uint64_t>);
template void pipeline_step<strata::models::Llama, DevicePolicy<float, false>>(mock_device_communicator,
                                                                               const strata::models::ModelConfig&,
                                                                               std::span<const DeviceBatch>,
                                                                               std::span<const std::uint64_t>);

template void train_one_step<strata::models::Gpt<DevicePolicy<strata::bf16, true>>, DevicePolicy<strata::bf16, true>>(
    mock_device_communicator, const strata::models::ModelConfig&, const strata::Tensor<std::int32_t>&,
    const strata::Tensor<std::int32_t>&, const strata::Tensor<float>&);
template void train_one_step<strata::models::Gpt<DevicePolicy<float, false>>, DevicePolicy<float, false>>(
    mock_device_communicator, const strata::models::ModelConfig&, const strata::Tensor<std::int32_t>&,
    const strata::Tensor<std::int32_t>&, const strata::Tensor<float>&);
template void train_one_step<strata::models::Llama<DevicePolicy<strata::bf16, true>>, DevicePolicy<strata::bf16, true>>(
    mock_device_communicator, const strata::models::ModelConfig&, const strata::Tensor<std::int32_t>&,
    const strata::Tensor<std::int32_t>&, const strata::Tensor<float>&);
template void train_one_step<strata::models::Llama<DevicePolicy<double, false>>, DevicePolicy<double, false>>(
    mock_device_communicator, const strata::models::ModelConfig&, const strata::Tensor<std::int32_t>&,
    const strata::Tensor<std::int32_t>&, const strata::Tensor<float>&);

}  // namespace
